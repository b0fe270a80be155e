"""Benchmarks: named lists of evaluation tasks, each a registered simulator with its settings.

A benchmark is registered as a function ``config -> list[EvalTask]`` (``config`` is the run
config, for settings such as the horizon the tasks share). Built in: ``robosuite`` (Lift, Stack,
PickPlaceCan, Door on the Panda). A simulator package adds its suites the same way, e.g.
``@BENCHMARKS.register("libero_spatial")`` returning one task per LIBERO task of the suite.
Without a benchmark (``eval.benchmark: null``) the only task is the run's own simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vla_rl.utils.registry import Registry


@dataclass(frozen=True)
class EvalTask:
    """One evaluation task.

    Attributes:
        name: the task's name in reports and store paths (letters, digits, ``_``, ``-``).
        simulator: registered simulator name.
        env: fields of the simulator's config.
    """

    name: str
    simulator: str
    env: dict[str, Any] = field(default_factory=dict)


BENCHMARKS: Registry[Callable[[Any], list[EvalTask]]] = Registry("benchmark")

ROBOSUITE_TASKS = ("Lift", "Stack", "PickPlaceCan", "Door")


@BENCHMARKS.register("robosuite")
def robosuite_benchmark(config) -> list[EvalTask]:
    """The robosuite tasks with default state keys; the run's ``simulator.env`` (horizon, robot,
    controller, ...) applies to each, except its ``task`` and ``obs_keys``."""
    shared = {k: v for k, v in config.simulator.env.items() if k not in ("task", "obs_keys")}
    return [EvalTask(task, "robosuite", {**shared, "task": task}) for task in ROBOSUITE_TASKS]


def resolve_tasks(config) -> list[EvalTask]:
    """The tasks an evaluation runs: ``eval.benchmark``'s (selected by ``eval.tasks``), or the
    run's own simulator.

    Raises:
        RegistryError: unknown benchmark (the message lists the known ones).
        ValueError: ``eval.tasks`` names a task the benchmark does not have, or selects none.
    """
    ev = config.eval
    if ev.benchmark is None:
        sim = config.simulator
        tasks = [EvalTask(str(sim.env.get("task", sim.name)), sim.name, dict(sim.env))]
    else:
        tasks = BENCHMARKS.get(ev.benchmark)(config)
    if ev.tasks is None:
        return tasks
    known = [t.name for t in tasks]
    unknown = [name for name in ev.tasks if name not in known]
    if unknown or not ev.tasks:
        raise ValueError(f"eval.tasks {ev.tasks} must select tasks of benchmark {ev.benchmark!r}: {', '.join(known)}")
    return [t for t in tasks if t.name in ev.tasks]
