"""The error of the pre-flight checks, and the field hint their loaders' messages share."""

from __future__ import annotations

from vla_rl.dag.errors import TemplateError


class PreflightError(TemplateError):
    """An input file of the run that cannot be used. ``field`` is the config field that names it
    (``text.train_file``, ``policy.config.model_path``, ...), ``node`` the node whose layout it
    does not fit (if any); the message starts with the file at fault."""


def with_field_hint(message: str, pickle_field: str) -> str:
    """``message`` with the loaders' generic ``allow_pickle`` advice naming the template field."""
    return message.replace("set allow_pickle: true", f"set {pickle_field}: true")
