"""``policy.lora`` checked on the policy the workers would build, on the ``meta`` device from the
run's config alone (no weights read), with its adapters injected as the workers inject them: a
``target_modules`` name that names no trainable linear layer (a typo) and a ``trainable_modules``
entry that is no submodule are refused before Ray and the workers start, not after each worker has
loaded the model."""

from __future__ import annotations

from pathlib import Path

from vla_rl.preflight.errors import PreflightError


def check_lora(config) -> None:
    """Inject ``policy.lora``'s adapters into the policy built on the ``meta`` device
    (``apply_lora``, as :func:`vla_rl.workflows.base.apply_lora` does in the workers), where
    the config alone gives the architecture: a text model directory's ``config.json``, the tiny
    text model the run generates (``text.model_path: null``), an OpenVLA/OpenVLA-OFT
    ``model_path`` or ``architecture``. Otherwise (a GGUF file) each worker checks the same when
    it builds the policy and stops the run in one line. Nothing to check without ``policy.lora``.

    Raises:
        PreflightError: field ``policy.lora.target_modules`` (the names that match no trainable
            linear layer, and the names the model's linear layers have) or
            ``policy.lora.trainable_modules`` (an entry that is no submodule, and those there are).
    """
    import torch

    from vla_rl_core.components import ComponentConfigError

    lora = config.policy.lora
    if lora is None:
        return
    policy = _text_policy(config) if config.run.workflow == "text" else _robot_policy(config)
    if policy is None:
        return
    try:
        with torch.device("meta"):
            policy.apply_lora(**lora.apply_arguments())
    except ComponentConfigError as error:
        raise PreflightError(error.message, field=f"policy.lora.{error.field}") from None


def _text_policy(config):
    """The causal LM policy of ``text.model_path``, or the tiny model the run generates, on the
    ``meta`` device; None for a GGUF file."""
    from vla_rl.workflows.text import meta_causal_lm_policy, meta_tiny_causal_lm_policy

    if config.text.model_path is None:
        return meta_tiny_causal_lm_policy(config)
    return meta_causal_lm_policy(config, Path(config.text.model_path))


def _robot_policy(config):
    """The robot policy on the ``meta`` device, where its class can build it from the config alone
    (``meta_policy``: OpenVLA, OpenVLA-OFT); None otherwise."""
    from policies import POLICIES

    build = getattr(POLICIES.get(config.policy.name), "meta_policy", None)
    return None if build is None else build(config.policy.policy_config())
