"""Whether a policy can be evaluated on a task, decided before any rollout.

A policy is built for the observation and action layout of the simulator it was trained on (its
run's ``simulator`` section): the names, order and sizes of the state's parts (``obs_layout``:
robosuite Stack and Door both observe 20 values, but not the same ones), the camera images and the
action size. A policy conditioned on a one-hot of its task set (the MLP with ``num_tasks``) can
only act in the tasks of that set. :func:`incompatibility` compares a task's spec (the simulator
pool's ``spec()``) with the policy's and says why the task cannot be evaluated, or None;
:func:`check_tasks` does it for an evaluation's tasks on the driver, creating each environment
once in a Ray task (:func:`simulators.pool.probe_specs`), before any worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_rl.evaluation.benchmarks import EvalTask, run_task_index, run_tasks
from vla_rl_core.env_spec import EnvSpec


@dataclass(frozen=True)
class TaskVerdict:
    """A task of an evaluation and why it is skipped (``reason``), or None when it runs."""

    task: EvalTask
    reason: str | None


def one_hot_tasks(config) -> list[str] | None:
    """The tasks the run's policy takes a one-hot of (its task set, when the policy's config
    declares ``num_tasks``), or None for a policy that is not conditioned on a task index."""
    from policies import POLICIES
    from vla_rl_core.components import config_fields

    if not config.simulator.multi_task:
        return None
    if "num_tasks" not in config_fields(POLICIES.get(config.policy.name).config_class):
        return None
    return config.simulator.task_names()


def trained_on(config) -> str:
    """The run's own simulator and task(s), as the reasons name them: ``robosuite_lift`` for
    its default task, ``robosuite_lift task Door``, ``metaworld tasks reach-v3, push-v3``."""
    names = [task.name for task in run_tasks(config)]
    if names == [config.simulator.name]:
        return config.simulator.name
    return f"{config.simulator.name} task{'s' if len(names) > 1 else ''} {', '.join(names)}"


def _layout(spec: EnvSpec) -> str:
    parts = ", ".join(f"{key} {stop - start}" for key, (start, stop) in spec.obs_layout.items())
    return f"[{parts}] ({spec.obs_dim} values)"


def _images(spec: EnvSpec) -> str:
    return str({key: list(shape) for key, shape in spec.images.items()}) if spec.images else "none"


def incompatibility(task: EvalTask, task_spec: EnvSpec | None, policy_spec: EnvSpec | None, trained_on: str,
                    one_hot: list[str] | None, in_task_set: bool) -> str | None:
    """Why ``task`` cannot be evaluated with the policy, or None.

    Args:
        task: the evaluation task.
        task_spec: its simulator's ``spec()``; None for a task of the run's own task set (it
            shares the policy's spec).
        policy_spec: the spec of the simulator the policy was built for (read only with a ``task_spec``).
        trained_on: that simulator's name, for the message (the simulator the run trained on, or
            the one --policy-from's template builds the policy for).
        one_hot: the tasks of the policy's task one-hot (:func:`one_hot_tasks`), or None.
        in_task_set: whether ``task`` is one of the run's own tasks (:func:`run_task_index`).
    """
    if one_hot is not None and not in_task_set:
        return (f"the policy takes a one-hot of its {len(one_hot)} training tasks ({', '.join(one_hot)}); "
                f"task {task.name!r} ({task.simulator} with these settings) is not one of them")
    if task_spec is None or policy_spec is None:
        return None
    if task_spec.action_dim != policy_spec.action_dim:
        return (f"its actions have {task_spec.action_dim} values, the policy's {policy_spec.action_dim} "
                f"(the policy is built for {trained_on})")
    if task_spec.obs_layout != policy_spec.obs_layout or task_spec.obs_dim != policy_spec.obs_dim:
        return (f"its observation {_layout(task_spec)} is not the policy's {_layout(policy_spec)} "
                f"(the policy is built for {trained_on})")
    if task_spec.images != policy_spec.images:
        return (f"its camera images {_images(task_spec)} are not the policy's {_images(policy_spec)} "
                f"(the policy is built for {trained_on})")
    return None


def check_tasks(config, tasks: list[EvalTask]) -> list[TaskVerdict]:
    """The verdict of every task of an evaluation (``config`` holds the run's ``policy`` and
    ``simulator``). Tasks outside the run's own task set are created once each to read their spec
    (in parallel Ray tasks; Ray must be initialised), as is the run's own simulator when needed.
    """
    from simulators.pool import probe_specs

    one_hot = one_hot_tasks(config)
    own = [run_task_index(config, task) is not None for task in tasks]
    probed = [task for task, mine in zip(tasks, own) if not mine and one_hot is None]
    specs: dict[str, EnvSpec] = {}
    policy_spec: EnvSpec | None = None
    if probed:
        trained = run_tasks(config)[0]  # a task set's tasks share their spec (its pool checks it)
        policy_spec, *answers = probe_specs([(trained.simulator, trained.env), *((t.simulator, t.env) for t in probed)])
        specs = {task.name: spec for task, spec in zip(probed, answers)}
    return [TaskVerdict(task, None if mine else incompatibility(task, specs.get(task.name), policy_spec, trained_on(config),
                                                                one_hot, in_task_set=False))
            for task, mine in zip(tasks, own)]
