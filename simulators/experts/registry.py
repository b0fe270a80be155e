"""The scripted-expert registry, keyed by ``(simulator, task)``.

An expert class is constructed from the environment's ``obs_layout`` (``{key: slice}``) and has
``reset()`` and ``act(obs (obs_dim,)) -> action (act_dim,) float32``; it reads the flat state.
A task is named as the simulator's config names it (:func:`simulators.registry.task_name`:
``"Lift"``, ``"Stack"`` for robosuite), so one expert class serves every simulator name that
hosts its task::

    @register_expert(("robosuite", "robosuite_lift"), "Lift")
    class LiftExpert: ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from vla_rl.utils.registry import Registry

EXPERTS: Registry[type] = Registry("scripted expert")
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
                            f"{having}); demonstrations cannot be generated: set warm_start.num_demos=0 or "
                            "pick a task with an expert")
    return EXPERTS.get((simulator, task))


def make_expert(simulator: str, task: str, obs_layout: Mapping[str, slice]):
    """A new expert for ``task`` on ``simulator`` reading observations laid out as ``obs_layout``.

    Raises:
        NoExpertError: as :func:`expert_class`.
        ValueError: the observation lacks a key the expert reads.
    """
    return expert_class(simulator, task)(obs_layout)
