"""The scripted-expert registry, keyed by ``(simulator, task)``.

An expert class is constructed from the environment's ``obs_layout`` (``{key: slice}``) and has
``reset()`` and ``act(obs (obs_dim,)) -> action (action_dim,) float32``; it reads the flat state.
A task is named as the simulator's config names it (:func:`simulators.registry.task_name`:
``"Lift"``, ``"Stack"`` for robosuite), so one expert class serves every simulator name that
hosts its task::

    @register_expert(("robosuite", "robosuite_lift"), "Lift")
    class LiftExpert: ...

An expert class may declare ``measured_steps`` (``{robot: ExpertSteps}``): how many control steps
its demonstrations take with each robot, measured (:mod:`simulators.experts.measure`). The planner
refuses a run whose horizon is shorter than any measured success, or whose robot the expert does
not succeed with (:func:`horizon_problem`), before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vla_rl_core.registry import Registry

EXPERTS: Registry[type] = Registry("scripted expert", builtins=(
    "simulators.experts.door", "simulators.experts.lift", "simulators.experts.metaworld",
    "simulators.experts.pick_place_can", "simulators.experts.stack"))
"""Expert classes keyed by ``(simulator name, task name)``."""


class NoExpertError(ValueError):
    """No scripted expert is registered for a simulator's task (the message lists the tasks that have one)."""


def register_expert(simulators: str | Sequence[str], *tasks: str) -> Callable[[type], type]:
    """Class decorator registering an expert for each ``(simulator, task)`` pair.

    Args:
        simulators: the simulator name, or names, that host the tasks.
        tasks: the task names the expert solves.

    Raises:
        RegistryError: a pair is already registered.
        ValueError: no task is given.
    """
    if not tasks:
        raise ValueError("register_expert needs at least one task name")
    names = (simulators,) if isinstance(simulators, str) else tuple(simulators)

    def decorator(cls: type) -> type:
        for simulator in names:
            for task in tasks:
                EXPERTS.register((simulator, task))(cls)
        return cls

    return decorator


def tasks_with_expert(simulator: str) -> list[str]:
    """The tasks of ``simulator`` that have a scripted expert, sorted."""
    return sorted(task for name, task in EXPERTS if name == simulator)


def expert_class(simulator: str, task: str) -> type:
    """The expert class of ``task`` on ``simulator``.

    Raises:
        NoExpertError: none is registered; the message names the task and the tasks that have one.
    """
    if (simulator, task) not in EXPERTS:
        having = ", ".join(tasks_with_expert(simulator)) or "none"
        raise NoExpertError(f"no scripted expert for task {task!r} of simulator {simulator!r} (tasks with one: "
                            f"{having}); demonstrations cannot be generated: warm-start from a LeRobot dataset "
                            "(warm_start.dataset), set warm_start.num_demos=0, or pick a task with an expert")
    return EXPERTS.get((simulator, task))


def make_expert(simulator: str, task: str, obs_layout: Mapping[str, slice]):
    """A new expert for ``task`` on ``simulator`` reading observations laid out as ``obs_layout``.

    Raises:
        NoExpertError: as :func:`expert_class`.
        ValueError: the observation lacks a key the expert reads.
    """
    return expert_class(simulator, task)(obs_layout)


@dataclass(frozen=True)
class ExpertSteps:
    """Control steps a scripted expert's successful episodes took, measured from the demonstration
    initial states (``warm_start.demo_init_state_offset + [0, episodes)``) with a horizon far
    above them.

    Attributes:
        successes: episodes that succeeded.
        episodes: episodes run.
        fewest, median, most: control steps of the successful ones (0 without a success).
        note: why the expert does not succeed, where known (e.g. an action layout it cannot give).
    """

    successes: int
    episodes: int
    fewest: int = 0
    median: int = 0
    most: int = 0
    note: str = ""

    def describe(self) -> str:
        """``"89-131 control steps (median 107; 20 of 20 measured episodes succeeded)"``."""
        if self.successes == 0:
            return self.note if self.episodes == 0 else (f"no success in {self.episodes} episodes"
                                                         + (f" ({self.note})" if self.note else ""))
        return (f"{self.fewest}-{self.most} control steps (median {self.median}; {self.successes} of "
                f"{self.episodes} measured episodes succeeded)")


def measured_steps(simulator: str, config: Any) -> ExpertSteps | None:
    """What the expert of ``config``'s task (``config.task_name``) measured with its robot
    (``config.robot``); None where it was not measured.

    Raises:
        NoExpertError: the task has no expert.
    """
    table: Mapping[str, ExpertSteps] = getattr(expert_class(simulator, config.task_name), "measured_steps", {})
    return table.get(getattr(config, "robot", None))


def config_problem(simulator: str, config: Any) -> tuple[str, str] | None:
    """Why the scripted expert of ``config``'s task cannot act in the environment ``config``
    describes (the expert class's own ``config_problem``, if it has one: e.g. MetaWorld's policies
    need the goal in the observation), as ``(field, why)``, or None.

    Raises:
        NoExpertError: the task has no expert.
    """
    check = getattr(expert_class(simulator, config.task_name), "config_problem", None)
    return None if check is None else check(config)


def horizon_problem(simulator: str, config: Any) -> tuple[str, str] | None:
    """Why the scripted expert cannot make demonstrations of ``config`` (a simulator config with
    ``task_name``, ``horizon`` and maybe ``robot``), as far as measurements tell, or None:
    ``("simulator.env.robot", ...)`` where the expert did not succeed with the robot,
    ``("simulator.env.horizon", ...)`` where the horizon is below its fewest measured steps.

    Raises:
        NoExpertError: the task has no expert.
    """
    steps = measured_steps(simulator, config)
    if steps is None:
        return None
    task, robot = config.task_name, getattr(config, "robot", None)
    with_robot = f" with robot {robot}" if robot else ""
    if steps.successes == 0:
        table = getattr(expert_class(simulator, task), "measured_steps", {})
        working = ", ".join(name for name, s in table.items() if s.successes)
        return "simulator.env.robot", (f"the scripted expert of {task} made no demonstration{with_robot} when "
                                       f"measured ({steps.describe()}): use a robot it succeeds with ({working}), "
                                       "or warm_start.num_demos=0")
    if config.horizon < steps.fewest:
        return "simulator.env.horizon", (f"simulator.env.horizon={config.horizon} is too short for the scripted "
                                         f"expert of {task}{with_robot}: its demonstrations took {steps.describe()}; "
                                         f"set simulator.env.horizon to at least {steps.most}, or "
                                         "warm_start.num_demos=0")
    return None
