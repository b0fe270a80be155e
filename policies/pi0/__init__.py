"""π0 (arXiv 2410.24164): a flow-matching action expert on a PaliGemma backbone (issue 19).

The configs import without torch; the model (``PI0Model``, ``PI0Inputs``) and the RL policy
(``PI0Policy``, registered as ``"pi0"``, :mod:`policies.pi0.policy_pi0`) are imported on first
access. :mod:`policies.pi0.flow_sampling` holds the model-agnostic denoising samplers with exact
per-step log-densities (πRL's Flow-SDE and the deterministic ODE; Flow-Noise's learned noise head
and sampler in :mod:`policies.pi0.flow_noise`);
:mod:`policies.pi0.transforms_pi0` openpi's mean/std normalisation and state-relative actions;
:mod:`policies.pi0.lerobot_stats_pi0` the statistics in a LeRobot checkpoint's processor files.
"""

from __future__ import annotations

from typing import Any

from policies.pi0.configuration_pi0 import (
    GEMMA_VARIANTS,
    MODEL_PRESETS,
    GemmaSpec,
    PI0ModelConfig,
    PI0PolicyConfig,
    SiglipSpec,
    pi0_model_preset,
    tiny_pi0_config,
)

__all__ = [
    "GEMMA_VARIANTS",
    "MODEL_PRESETS",
    "GemmaSpec",
    "PI0Inputs",
    "PI0Model",
    "PI0ModelConfig",
    "PI0Policy",
    "PI0PolicyConfig",
    "SiglipSpec",
    "pi0_model_preset",
    "tiny_pi0_config",
]


def __getattr__(name: str) -> Any:
    if name in ("PI0Model", "PI0Inputs"):
        from policies.pi0 import modeling_pi0

        return getattr(modeling_pi0, name)
    if name == "PI0Policy":
        from policies.pi0.policy_pi0 import PI0Policy

        return PI0Policy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
