"""The ``simulator`` section of the run config: the simulator pool, its typed ``env`` config and
its task set (``simulator.tasks``), checked against the simulator registry (imported lazily)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from vla_rl.config.base import _check_name, _Section
from vla_rl_core.components import ComponentConfigError, build_config


class SimulatorSection(_Section):
    """The simulator pool that each worker's ``env_interact`` node drives."""

    name: str = Field("robosuite_lift", description="Registered simulator name.")
    env: dict[str, Any] = Field(
        default_factory=dict, description="Fields of the simulator's config dataclass (e.g. horizon)."
    )
    tasks: list[str] | str | None = Field(
        None, description="A task set: one policy trained over several tasks (each task's config is env with its "
        "'task' field set; env must not set task). A list of task names, or a task set the simulator names "
        "(metaworld: mt10, mt50, ml10_train, ml10_test). Every step draws initial states of every task, each "
        "environment is reset into its episode's task, observations carry the task id (obs/task_id) and the "
        "MLP policy a one-hot of it (docs/simulators.md). null: the one task of env.",
    )
    actors_per_worker: int = Field(1, ge=1, description="Simulator actors (processes) per DAG worker; at most "
                                   "the environments of a worker's pool (vla-rl plan refuses more).")
    num_cpus_per_actor: float = Field(1.0, ge=0, description="Ray CPU resource per simulator actor.")
    pipeline_stages: int = Field(
        1, ge=1, description="Groups of each worker's environments pipelined against the policy: while one "
        "group simulates, the policy computes the next action chunk of another (1: lockstep). Greedy rollouts "
        "do not depend on it; sampled ones are reproducible for a fixed value (docs/simulators.md).",
    )
    step_timeout_s: float = Field(
        120.0, gt=0, description="Seconds to wait for an action chunk of the simulator actors; an actor that "
        "has not answered by then is killed and restarted, and its running episodes are dropped as lost.",
    )

    @model_validator(mode="after")
    def _check_env(self) -> SimulatorSection:
        self.env_config()
        return self

    def env_config(self) -> Any:
        """The simulator's typed config (its ``config_class``) built from ``env``; with a task
        set, the first task's.

        Raises:
            ComponentConfigError: an unknown simulator (or one without ``config_class``), or an
                ``env`` the config class rejects (the error names the field, e.g.
                ``simulator.env.task``), or a bad task set.
        """
        from simulators.registry import SIMULATORS, check_declared_sizes

        _check_name(SIMULATORS, self.name, "simulator.name")
        config_class = getattr(SIMULATORS.get(self.name), "config_class", None)
        if config_class is None:  # a plug-in's class that lacks part of simulators/vector.py's contract
            raise ComponentConfigError("simulator.name", f"simulator {self.name!r} ({SIMULATORS.get(self.name)!r}) has "
                                       "no config_class, the dataclass of its simulator.env settings "
                                       "(docs/extending.md)")
        if self.tasks is None:
            configs = [build_config(config_class, self.env, "simulator.env")]
        else:
            configs = [_task_config(config_class, env, i) for i, env in enumerate(self.task_envs())]
        for config in configs:
            check_declared_sizes(config)
        return configs[0]

    @property
    def multi_task(self) -> bool:
        """Whether the simulator hosts a task set (``tasks`` is set)."""
        return self.tasks is not None

    def task_names(self) -> list[str]:
        """The tasks: the task set's names in order, or the one task of ``env`` (its config's
        ``task_name``, e.g. ``Lift``)."""
        if self.tasks is None:
            return [self.env_config().task_name]
        return list(_resolve_task_set(self.name, self.tasks))

    def task_envs(self) -> list[dict[str, Any]]:
        """One ``env`` mapping per task of the task set: ``env`` with ``task`` set (``[env]`` without one).

        Raises:
            ComponentConfigError: ``tasks`` names an unknown task set, is empty or repeats a task;
                ``env`` sets ``task`` (or ``instruction``) beside a task set; or the simulator's
                config has no ``task`` field.
        """
        if self.tasks is None:
            return [dict(self.env)]
        from simulators.registry import SIMULATORS
        from vla_rl_core.components import config_fields

        config_class = SIMULATORS.get(self.name).config_class
        if "task" not in config_fields(config_class):
            raise ComponentConfigError("simulator.tasks", f"simulator {self.name!r} has no 'task' setting "
                                       f"({config_class.__name__}), so it cannot host a task set")
        for field in ("task", "instruction"):
            if field in self.env:
                raise ComponentConfigError(f"simulator.env.{field}", "each task of simulator.tasks sets its own; "
                                           f"remove simulator.env.{field} (or simulator.tasks)")
        return [{**self.env, "task": task} for task in _resolve_task_set(self.name, self.tasks)]


def _task_config(config_class: type, env: dict[str, Any], index: int) -> Any:
    """The config of task ``index`` of a task set (``env``: ``simulator.env`` with its ``task``).

    Raises:
        ComponentConfigError: naming where the user wrote the setting at fault: the task,
            ``simulator.tasks[index]``; any other, ``simulator.env.<setting>`` (shared by the tasks).
    """
    try:
        return build_config(config_class, env, f"simulator.tasks[{index}]")
    except ComponentConfigError as err:
        at = f"simulator.tasks[{index}]"
        field = at if err.field == f"{at}.task" else err.field.replace(f"{at}.", "simulator.env.", 1)
        raise ComponentConfigError(field, err.message) from None


def _resolve_task_set(simulator: str, tasks: list[str] | str) -> tuple[str, ...]:
    """The task names of ``simulator.tasks``: the list itself, or the named set of the simulator
    (its class's ``task_sets``)."""
    from simulators.registry import SIMULATORS

    if isinstance(tasks, str):
        sets = getattr(SIMULATORS.get(simulator), "task_sets", {})
        if tasks not in sets:
            raise ComponentConfigError("simulator.tasks", f"unknown task set {tasks!r} of simulator {simulator!r} "
                                       f"(known: {', '.join(sets) or 'none'}); or give a list of task names")
        return tuple(sets[tasks])
    if not tasks or len(set(tasks)) != len(tasks):
        raise ComponentConfigError("simulator.tasks", f"must name at least one task, each once; got {tasks}")
    return tuple(tasks)
