"""Fixtures of the DAG tests; importing the helpers registers the dummy node functions."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from vla_rl.dag.registry import NODE_FUNCTIONS

from . import helpers  # registers the dummy node functions


@pytest.fixture
def write_template(tmp_path: Path) -> Callable[..., Path]:
    """``write_template(nodes=..., config=..., name="t.yaml", **top)`` writes a template file;
    ``text=...`` writes the given text verbatim."""

    def write(
        nodes: list[dict[str, Any]] | None = None,
        config: dict[str, Any] | None = None,
        name: str = "t.yaml",
        text: str | None = None,
        **top: Any,
    ) -> Path:
        path = tmp_path / name
        if text is None:
            data: dict[str, Any] = {"name": Path(name).stem, **top}
            if config is not None:
                data["config"] = config
            if nodes is not None:
                data["nodes"] = nodes
            text = yaml.safe_dump(data, sort_keys=False)
        path.write_text(text)
        return path

    return write


@pytest.fixture(autouse=True)
def no_builtin_nodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Keep the planner from importing :mod:`vla_rl.nodes` (torch, simulators): the DAG tests use
    the dummy functions only. Returns a list that grows by one entry per skipped import."""
    calls: list[int] = []
    monkeypatch.setattr(NODE_FUNCTIONS, "load_builtins", lambda: calls.append(1))
    return calls


@pytest.fixture
def settings_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dummy functions of :func:`helpers.register_settings_readers`, registered for one test:
    into a copy of the registry's entries, which the original replaces afterwards."""
    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))
    helpers.register_settings_readers()
