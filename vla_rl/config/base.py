"""What every section of the run config shares: the pydantic base model (unknown keys and
non-finite numbers refused) and the check of a registered name."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from vla_rl_core.components import ComponentConfigError


class _Section(BaseModel):
    # Non-finite numbers (inf, nan) are refused everywhere: no setting means anything with them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _check_name(registry, name: str, field: str) -> None:
    if name not in registry:
        raise ComponentConfigError(field, f"unknown {registry.kind} {name!r}; known: "
                                   f"{', '.join(str(n) for n in registry.names())}")
