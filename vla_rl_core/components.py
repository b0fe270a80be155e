"""Typed configs of the pluggable components, built from a template's mappings.

A component (a simulator, a policy, an advantage estimator, a policy loss, a reward, a trajectory
encoder) owns its settings as one config class — a frozen dataclass validated in
``__post_init__``, or a pydantic model — registered with it. A template names the component and
gives the settings as a mapping (``simulator.env``, ``policy.config``, ``algorithm.<name>``);
:func:`build_config` turns the mapping into the typed config when the template loads, so that
``vla-rl plan`` rejects a bad value before anything starts, and the runtime reads that same
object: there is no second schema and each setting has one default.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError


class ComponentConfigError(ValueError):
    """A component's settings that cannot be accepted.

    Args:
        field: the dotted path of the offending setting (``simulator.env.task``).
        message: what is wrong and, where possible, how to fix it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # pickled with its two arguments: it crosses processes (Ray) intact
        return type(self), (self.field, self.message)


def config_fields(config_class: type) -> list[str]:
    """The settings ``config_class`` accepts, in declaration order."""
    if isinstance(config_class, type) and issubclass(config_class, BaseModel):
        return list(config_class.model_fields)
    return [f.name for f in dataclasses.fields(config_class) if f.init]


def admits_bool(annotation: Any) -> bool:
    """Whether a setting's type takes a boolean: ``bool`` itself, ``Any``, or a union holding one.

    pydantic reads ``true`` as 1 for an int or float setting (``trainer.total_steps=true`` ran one
    step): a boolean is refused wherever this is False.
    """
    if annotation is bool or annotation is Any:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(admits_bool(arg) for arg in typing.get_args(annotation))
    return False


def _annotations(config_class: type) -> dict[str, Any]:
    if isinstance(config_class, type) and issubclass(config_class, BaseModel):
        return {name: info.annotation for name, info in config_class.model_fields.items()}
    return typing.get_type_hints(config_class)


@functools.lru_cache(maxsize=None)
def _adapter(config_class: type) -> TypeAdapter:
    return TypeAdapter(config_class)


def build_config(config_class: type, options: Mapping[str, Any] | None, field: str) -> Any:
    """Validate ``options`` into an instance of ``config_class``.

    Args:
        config_class: a dataclass (validated by pydantic, then by its ``__post_init__``) or a
            pydantic model.
        options: the settings as written (None: all defaults).
        field: the dotted path of the mapping in the template, for errors (``policy.config``).

    Returns:
        The typed config.

    Raises:
        ComponentConfigError: ``config_class`` is neither a dataclass nor a pydantic model (a
            plug-in's registration), an unknown key (naming it and the accepted ones), a non-finite
            number (written as one, or as text pydantic reads as one: ``nan``, ``inf``; also inside
            lists and mappings), a boolean for a setting that takes none, a value of the wrong type, or a
            value the class's own validation rejects (a ``ComponentConfigError`` it raises names
            its setting: ``field.<setting>``).
    """
    if not (dataclasses.is_dataclass(config_class) and isinstance(config_class, type)) and not (
            isinstance(config_class, type) and issubclass(config_class, BaseModel)):  # a plug-in's mistake
        raise ComponentConfigError(field, f"the component's config class {config_class!r} is neither a dataclass nor "
                                   "a pydantic model (docs/extending.md)")
    options = dict(options or {})
    for key, value in options.items():
        _refuse_non_finite(f"{field}.{key}", value)
    allowed = config_fields(config_class)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ComponentConfigError(f"{field}.{unknown[0]}", f"unknown key for {config_class.__name__}; "
                                   f"allowed: {', '.join(allowed) or 'none'}")
    annotations = _annotations(config_class)
    for key, value in options.items():
        if isinstance(value, bool) and not admits_bool(annotations[key]):
            raise ComponentConfigError(f"{field}.{key}", f"{str(value).lower()} is a boolean; this setting takes "
                                       f"no boolean")
    try:
        config = _adapter(config_class).validate_python(options)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(part) for part in error["loc"])
        if error["type"] == "value_error":
            cause = error["ctx"]["error"]
            if isinstance(cause, ComponentConfigError):  # the class's own check names its setting
                raise ComponentConfigError(f"{field}.{cause.field}", cause.message) from None
            message = str(cause)
        elif error["type"] == "missing":
            message = "required but missing"
        else:
            message = f"{error['msg'][:1].lower()}{error['msg'][1:]} (got {error['input']!r})"
        raise ComponentConfigError(f"{field}.{loc}" if loc else field, message) from None
    for key, value in options.items():  # text pydantic reads as a float: nan, inf, -Infinity, ...
        found = _non_finite(getattr(config, key))
        if found is not None:
            raise ComponentConfigError(f"{field}.{key}{found[0]}", f"must be a finite number (got {value!r})")
    return config


def _refuse_non_finite(field: str, value: Any) -> None:
    found = _non_finite(value)
    if found is not None:
        raise ComponentConfigError(f"{field}{found[0]}", f"must be a finite number (got {found[1]})")


def _non_finite(value: Any) -> tuple[str, float] | None:
    """The first NaN or infinite float ``value`` is or holds (in a list, tuple, set, mapping,
    dataclass or pydantic model), with its path below ``value`` (``""``, ``.key``, ``[2]``); None
    if none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else ("", value)
    if isinstance(value, (list, tuple)):
        items = ((f"[{i}]", item) for i, item in enumerate(value))
    elif isinstance(value, (set, frozenset)):
        items = (("", item) for item in value)
    elif isinstance(value, Mapping):
        items = ((f".{key}", item) for key, item in value.items())
    elif isinstance(value, BaseModel):
        items = ((f".{name}", getattr(value, name)) for name in type(value).model_fields)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f".{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    else:
        return None
    for path, item in items:
        found = _non_finite(item)
        if found is not None:
            return path + found[0], found[1]
    return None
