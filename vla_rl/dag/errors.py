"""The one error type of the DAG layer, and the mapping of pydantic errors onto it.

Every rejection of a template (by the loader or the planner) is a :class:`TemplateError` that names
the file, the node and the field at fault, so the command line can print one line that says where
to look::

    dag_templates/x.yaml: node 'reward': field 'dp_size': must divide the world size 2 (got 3)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ValidationError


class TemplateError(Exception):
    """A template, an override or a plan that cannot be accepted.

    Args:
        message: what is wrong and, where possible, how to fix it.
        file: the template file at fault (``None`` when the error is not tied to a file).
        node: the id of the node at fault (``None`` for template-level errors).
        field: the field at fault, dotted for nested fields (``trainer.total_steps``,
            ``config.lr``); ``None`` when the error concerns the whole file or node.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | os.PathLike[str] | None = None,
        node: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = Path(file) if file is not None else None
        self.node = node
        self.field = field

    def __str__(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(_display_path(self.file))
        if self.node is not None:
            parts.append(f"node {self.node!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ": ".join([*parts, self.message])


def _display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def dotted(loc: Sequence[str | int]) -> str:
    """Join a pydantic error location into a dotted field path (``nodes[2].deps[0]`` style)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation_error(
    exc: ValidationError,
    *,
    model: type[BaseModel] | None = None,
    file: str | os.PathLike[str] | None = None,
    node: str | None = None,
    strip: int = 0,
    prefix: Sequence[str | int] = (),
) -> TemplateError:
    """Turn the first error of a pydantic ``ValidationError`` into a :class:`TemplateError`.

    Args:
        exc: the validation error.
        model: the model that the located part of the input was validated against (after
            ``strip``); when given, an unknown key is reported with the keys its section accepts.
        file: the template file, for the error.
        node: the node id, for the error.
        strip: leading parts of the error location to drop (e.g. 2 for ``("nodes", 3)``, which
            ``node`` already names).
        prefix: prepended to the error location to form the field path (e.g. ``("config",)`` for
            a node's ``config:`` mapping).
    """
    from vla_rl_core.components import ComponentConfigError

    errors = exc.errors()
    first = errors[0]
    loc = tuple(first["loc"])[strip:]
    field = dotted((*prefix, *loc)) or None
    kind = first["type"]
    cause = first.get("ctx", {}).get("error")
    if kind == "value_error" and isinstance(cause, ComponentConfigError):  # names its own field, from the root
        return TemplateError(cause.message, file=file, node=node, field=dotted((*prefix, cause.field)))
    if kind == "extra_forbidden":
        message = "unknown key"
        allowed = _allowed_keys(model, loc[:-1]) if model is not None else None
        if allowed:
            message += f"; allowed: {', '.join(allowed)}"
    elif kind == "missing":
        message = "required but missing"
    elif kind == "literal_error":
        message = f"must be one of: {first['ctx']['expected']} (got {first['input']!r})"
    elif kind == "value_error":  # a validator's own message, which says what is wrong
        message = str(first["ctx"]["error"])
    else:
        msg = first["msg"]
        message = f"{msg[:1].lower()}{msg[1:]} (got {first['input']!r})"
    if len(errors) > 1:
        message += f" [+{len(errors) - 1} more error{'s' if len(errors) > 2 else ''}]"
    return TemplateError(message, file=file, node=node, field=field)


def _allowed_keys(model: type[BaseModel], loc: Sequence[str | int]) -> list[str] | None:
    """The field names of the (nested) pydantic model found by following ``loc`` from ``model``."""
    current: type[BaseModel] = model
    for part in loc:
        info = current.model_fields.get(part) if isinstance(part, str) else None
        annotation = info.annotation if info is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        current = annotation
    return sorted(current.model_fields)
