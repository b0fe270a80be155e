"""The error of a template that does not load or plan, for the config tests."""

from __future__ import annotations

import pytest

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan


def plan_error(template: str, *overrides: str) -> TemplateError:
    """The :class:`TemplateError` that loading and planning ``template`` with ``overrides`` raises
    (the test fails if none is)."""
    with pytest.raises(TemplateError) as info:
        plan(load_template(template, list(overrides)))
    return info.value
