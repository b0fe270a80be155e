"""MLP Gaussian policy over low-dimensional state.

``MLPPolicyConfig`` imports without torch; ``MLPPolicy`` is imported on first access.
"""

from __future__ import annotations

from typing import Any

from policies.mlp.configuration_mlp import MLPPolicyConfig

__all__ = ["MLPPolicy", "MLPPolicyConfig"]


def __getattr__(name: str) -> Any:
    if name == "MLPPolicy":
        from policies.mlp.modeling_mlp import MLPPolicy

        return MLPPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
