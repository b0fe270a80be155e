"""The driver's console writes between Ray's progress bars (vla_rl.utils.console)."""

from __future__ import annotations

import sys

import pytest


class _Bars:
    """Stands in for Ray's bar manager: records what happens around a write."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def hide_bars(self) -> None:
        self.events.append("hide")

    def unhide_bars(self) -> None:
        self.events.append("draw")


class _Ray:
    def __init__(self, running: bool) -> None:
        self.running = running

    def is_initialized(self) -> bool:
        return self.running


@pytest.mark.parametrize("running", [True, False])
def test_each_line_is_written_with_rays_bars_cleared(running, capsys, monkeypatch):
    from ray.experimental import tqdm_ray

    from vla_rl.utils.console import driver_console

    events: list[str] = []
    monkeypatch.setitem(sys.modules, "ray", _Ray(running))
    monkeypatch.setattr(tqdm_ray, "instance", lambda: _Bars(events))
    monkeypatch.setattr(sys.stdout, "write", lambda text, write=sys.stdout.write: events.append("write") or write(text))
    console = driver_console()
    console.print("simulator rendering: egl")
    assert "simulator rendering: egl" in capsys.readouterr().out
    if running:
        assert events and events[0] == "hide" and events[-1] == "draw" and "write" in events
        assert events.count("hide") == events.count("draw")
    else:
        assert set(events) == {"write"}  # no Ray: no bars to clear


def test_a_long_path_stays_on_one_line_in_a_log_file(capsys, monkeypatch):
    from vla_rl.utils.console import driver_console

    monkeypatch.setenv("COLUMNS", "80")  # a log file's width (rich's default off a terminal)
    plot = "/home/someone/projects/robot-learning/vla-rl/outputs/embodied_srpo_20261201_175500/success_rate.png"
    console = driver_console()
    assert console.width == 80
    console.print(f"steps run 1, training time 31 s, 197 env steps/s during rollouts; plot {plot}")
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"steps run 1, training time 31 s, 197 env steps/s during rollouts; plot {plot}"]
