"""Benchmarks: named lists of evaluation tasks, each a registered simulator with its settings.

A benchmark is registered as a function ``config -> list[EvalTask]`` (``config`` is the run
config, for settings such as the horizon the tasks share). Built in: ``robosuite`` (Lift, Stack,
PickPlaceCan, Door on the Panda), MetaWorld's MT10 and ML10, and the LIBERO suites
(``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``, ``libero_90``: every task of
the suite, as OpenVLA-OFT's ``run_libero_eval.py`` runs them). A simulator package adds its
suites the same way.
Without a benchmark (``eval.benchmark: null``) the tasks are the run's own: its simulator's one
task, or every task of its task set (``simulator.tasks``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulators.registry import same_env
from vla_rl_core.registry import Registry


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

    def env_config(self) -> Any:
        """The task's typed simulator config (the registered simulator's ``config_class`` built
        from ``env``), e.g. for :meth:`policies.base.Policy.use_tasks`.

        Raises:
            ComponentConfigError: an unknown simulator or settings its config rejects.
        """
        from simulators.registry import SIMULATORS
        from vla_rl_core.components import build_config

        return build_config(SIMULATORS.get(self.simulator).config_class, self.env, f"the env of task {self.name}")


BENCHMARKS: Registry[Callable[[Any], list[EvalTask]]] = Registry("benchmark", calls=(("config",), ()))

ROBOSUITE_TASKS = ("Lift", "Stack", "PickPlaceCan", "Door")


@BENCHMARKS.register("robosuite")
def robosuite_benchmark(config) -> list[EvalTask]:
    """The robosuite tasks with default state keys; the run's ``simulator.env`` (horizon, robot,
    controller, ...) applies to each, except its ``task`` and ``obs_keys``."""
    shared = {k: v for k, v in config.simulator.env.items() if k not in ("task", "obs_keys")}
    return [EvalTask(task, "robosuite", {**shared, "task": task}) for task in ROBOSUITE_TASKS]


def _metaworld_tasks(config, tasks: tuple[str, ...]) -> list[EvalTask]:
    """One ``metaworld`` task per name; the run's ``simulator.env`` (horizon, goal_observable,
    cameras, ...) applies to each, except its ``task`` and ``instruction``."""
    shared = {k: v for k, v in config.simulator.env.items() if k not in ("task", "instruction")}
    return [EvalTask(task, "metaworld", {**shared, "task": task}) for task in tasks]


@BENCHMARKS.register("metaworld_mt10")
def metaworld_mt10_benchmark(config) -> list[EvalTask]:
    """MetaWorld's MT10 tasks (``simulators.metaworld_env.MT10_TASKS``)."""
    from simulators.metaworld_env import MT10_TASKS

    return _metaworld_tasks(config, MT10_TASKS)


@BENCHMARKS.register("metaworld_ml10_train")
def metaworld_ml10_train_benchmark(config) -> list[EvalTask]:
    """The 10 training tasks of MetaWorld's ML10 (``ML10_TRAIN_TASKS``)."""
    from simulators.metaworld_env import ML10_TRAIN_TASKS

    return _metaworld_tasks(config, ML10_TRAIN_TASKS)


@BENCHMARKS.register("metaworld_ml10_test")
def metaworld_ml10_test_benchmark(config) -> list[EvalTask]:
    """The 5 held-out test tasks of MetaWorld's ML10 (``ML10_TEST_TASKS``)."""
    from simulators.metaworld_env import ML10_TEST_TASKS

    return _metaworld_tasks(config, ML10_TEST_TASKS)


def libero_suite_tasks(config, suite: str) -> list[EvalTask]:
    """Every task of a LIBERO suite, named ``<suite>_<task_id>``, with the suite's own horizon
    (``run_libero_eval.py``'s ``TASK_MAX_STEPS``); a LIBERO run's other ``simulator.env``
    settings (cameras, camera size, state keys, ...) apply to each.

    Raises:
        ValueError: ``eval.init_state_offset`` is not a multiple of 50, or ``eval.num_episodes``
            exceeds 50: the reference runs trial ``i < 50`` from the task's initial state ``i``
            (``run_libero_eval.run_task``).
    """
    from simulators.libero_env import NUM_TRIALS_PER_TASK, SUITE_NUM_TASKS

    ev = config.eval
    if ev.init_state_offset % NUM_TRIALS_PER_TASK:
        raise ValueError(f"eval.init_state_offset must be a multiple of {NUM_TRIALS_PER_TASK} on LIBERO, so that "
                         f"trial i starts from the task's initial state i; got {ev.init_state_offset}")
    if ev.num_episodes > NUM_TRIALS_PER_TASK:
        raise ValueError(f"eval.num_episodes must be at most {NUM_TRIALS_PER_TASK} on LIBERO (its initial states "
                         f"per task; more would repeat them), got {ev.num_episodes}")
    sim = config.simulator
    shared = ({k: v for k, v in sim.env.items() if k not in ("suite", "task_id", "horizon")}
              if sim.name == "libero" else {})
    return [EvalTask(f"{suite}_{task_id}", "libero", {**shared, "suite": suite, "task_id": task_id})
            for task_id in range(SUITE_NUM_TASKS[suite])]


for _suite in ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"):
    BENCHMARKS.register(_suite)(functools.partial(libero_suite_tasks, suite=_suite))


def run_tasks(config) -> list[EvalTask]:
    """The run's own tasks: one per task of its task set (``simulator.tasks``, in order, each
    named after its task), or the one task of its simulator."""
    sim = config.simulator
    if sim.multi_task:
        return [EvalTask(name, sim.name, env) for name, env in zip(sim.task_names(), sim.task_envs())]
    return [EvalTask(str(sim.env.get("task", sim.name)), sim.name, dict(sim.env))]


def use_run_tasks(policy, config) -> None:
    """Prepare ``policy`` to act in the run's own tasks (:func:`run_tasks`; see
    :meth:`policies.base.Policy.use_tasks`): when it is built, and after an evaluation task.

    Raises:
        ValueError: the policy cannot act in them (see ``use_tasks``).
    """
    tasks = run_tasks(config)
    policy.use_tasks(tasks[0].simulator, [task.env_config() for task in tasks])


def run_task_index(config, task: EvalTask) -> int | None:
    """The position of ``task`` among the run's own tasks (:func:`run_tasks`: same simulator and
    settings), or None when the run has no such task."""
    for index, own in enumerate(run_tasks(config)):
        if same_env(own.simulator, own.env, task.simulator, task.env):
            return index
    return None


def candidate_tasks(config) -> list[EvalTask]:
    """The tasks ``eval.tasks`` selects from: ``eval.benchmark``'s, or the run's own (:func:`run_tasks`).

    Raises:
        RegistryError: unknown benchmark (the message lists the known ones).
    """
    ev = config.eval
    return run_tasks(config) if ev.benchmark is None else BENCHMARKS.get(ev.benchmark)(config)


def resolve_tasks(config) -> list[EvalTask]:
    """The tasks an evaluation runs: :func:`candidate_tasks` selected by ``eval.tasks`` (None: all).

    Raises:
        RegistryError: unknown benchmark (the message lists the known ones).
        ValueError: ``eval.tasks`` names a task the benchmark does not have, or selects none.
    """
    ev = config.eval
    tasks = candidate_tasks(config)
    if ev.tasks is None:
        return tasks
    known = [t.name for t in tasks]
    unknown = [name for name in ev.tasks if name not in known]
    if unknown or not ev.tasks:
        source = f"benchmark {ev.benchmark!r}" if ev.benchmark is not None else "the run's simulator"
        raise ValueError(f"eval.tasks {ev.tasks} must select tasks of {source}: {', '.join(known)}")
    return [t for t in tasks if t.name in ev.tasks]
