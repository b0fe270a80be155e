"""``policy.lora.target_modules`` checked on the model the policy would adapt, built on the
``meta`` device from the run's config alone (no weights read), so that a name no layer has (a
typo) is refused before Ray and the workers start, not after each worker has loaded the model."""

from __future__ import annotations

from pathlib import Path

from vla_rl.preflight.errors import PreflightError


def check_lora_targets(config) -> None:
    """Each name of ``policy.lora.target_modules`` names a trainable linear layer of the model
    (:func:`policies.lora.check_target_modules`). Checked where the architecture is known from the
    config: a text model directory's ``config.json``, an OpenVLA/OpenVLA-OFT ``model_path`` or
    ``architecture``; otherwise (the generated tiny text model, a GGUF file) the worker checks it
    when it builds the policy, and stops the run in one line. Nothing to check without
    ``policy.lora`` or with its default list (null: the projections the model has).

    Raises:
        PreflightError: field ``policy.lora.target_modules``: the names that match no layer, and
            the names the model's linear layers have.
    """
    from policies.lora import check_target_modules
    from vla_rl_core.components import ComponentConfigError

    lora = config.policy.lora
    if lora is None or lora.target_modules is None:
        return
    model = _text_model(config) if config.run.workflow == "text" else _robot_model(config)
    if model is None:
        return
    try:
        check_target_modules(model, lora.target_modules)
    except ComponentConfigError as error:
        raise PreflightError(error.message, field=f"policy.lora.{error.field}") from None


def _text_model(config):
    """The causal LM of ``text.model_path`` on the ``meta`` device; None for the generated tiny
    model and a GGUF file."""
    from transformers import AutoConfig

    from policies.causal_lm.loading import meta_model

    text = config.text
    if text.model_path is None or text.gguf_file is not None or not (Path(text.model_path) / "config.json").is_file():
        return None
    return meta_model(AutoConfig.from_pretrained(text.model_path, local_files_only=True, trust_remote_code=False))


def _robot_model(config):
    """The module a robot policy adapts, on the ``meta`` device, where its class can build it from
    the config alone (``meta_vla``: OpenVLA, OpenVLA-OFT); None otherwise."""
    from policies import POLICIES

    build = getattr(POLICIES.get(config.policy.name), "meta_vla", None)
    return None if build is None else build(config.policy.policy_config())
