"""What every section of the run config shares: the pydantic base model (unknown keys and
non-finite numbers refused) and the check of a registered name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from vla_rl_core.components import ComponentConfigError, admits_bool


class _Section(BaseModel):
    # Non-finite numbers (inf, nan) are refused everywhere: no setting means anything with them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A boolean is refused wherever the field's type takes none (:func:`admits_bool`)."""
        if isinstance(value, bool) and info.field_name is not None:
            if not admits_bool(cls.model_fields[info.field_name].annotation):
                raise ValueError(f"{str(value).lower()} is a boolean; this setting takes no boolean")
        return value


def _check_name(registry, name: str, field: str) -> None:
    if name not in registry:
        raise ComponentConfigError(field, f"unknown {registry.kind} {name!r}; known: "
                                   f"{', '.join(str(n) for n in registry.names())}")
