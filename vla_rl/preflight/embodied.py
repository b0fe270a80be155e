"""Pre-flight checks of an embodied run's inputs: its task set, its simulator settings, its
policy's pretrained checkpoint and its trajectory encoder (:mod:`vla_rl.preflight`)."""

from __future__ import annotations

import json
from pathlib import Path

from vla_rl.preflight.errors import PreflightError, with_field_hint

TASK_SET_SIZES = ("state_dim", "action_dim", "horizon")
"""What the tasks of a task set must share, as far as their configs declare it (a config may not
know a size before its environment is built: then the pool's ``spec()`` finds a difference)."""


def _check_task_set(config) -> None:
    """The tasks of ``simulator.tasks`` declare the same state size, action size and horizon (robosuite
    Lift's 15 state values and Stack's 20 are not one task set): otherwise every worker stops once
    its simulators have started."""
    simulator = config.simulator
    if not simulator.multi_task:
        return
    from simulators.registry import SIMULATORS
    from vla_rl_core.components import build_config

    config_class = SIMULATORS.get(simulator.name).config_class
    names = simulator.task_names()
    tasks = [build_config(config_class, env, f"simulator.tasks[{i}]") for i, env in enumerate(simulator.task_envs())]
    for size in TASK_SET_SIZES:
        values = [getattr(task, size, None) for task in tasks]
        for name, value in zip(names[1:], values[1:]):
            if None not in (value, values[0]) and value != values[0]:
                raise PreflightError(f"the tasks of a task set must share their observation and action layout and "
                                     f"horizon, but {name!r} differs from {names[0]!r} in {size}: {value} vs "
                                     f"{values[0]}", field="simulator.tasks")


def simulator_unavailable(name: str) -> str | None:
    """Why simulator ``name`` cannot run on this Python (its optional extra is missing: the
    class's ``unavailable_reason``, LIBERO's), or None."""
    from simulators.registry import SIMULATORS

    unavailable = getattr(SIMULATORS.get(name), "unavailable_reason", None)
    return unavailable() if unavailable is not None else None


def check_simulator(config) -> None:
    """The simulator settings only the simulator library can check (the class's ``check_config``,
    :func:`simulators.registry.check_env`: robosuite's observation keys and cameras), for every
    task of the run, with the camera of its evaluation videos when it records any. Run on the
    driver before Ray starts: a typo found by the workers comes as a Ray traceback once they and
    their simulators have started (measured: 23 s on the 2-core machine for
    ``simulator.env.obs_keys``). Not checked for a run that joins a cluster, whose driver may lack
    the simulator library, nor by ``vla-rl plan``; an unavailable simulator is
    :func:`check_local_packages`' to report.

    Raises:
        PreflightError: naming the field (``simulator.env.obs_keys``, ``simulator.env.cameras``,
            ``eval.video_camera``) and the names the task has.
    """
    from simulators.registry import check_env
    from vla_rl.evaluation.video import renders_videos, video_camera
    from vla_rl.utils.ray_utils import cluster_address
    from vla_rl_core.components import ComponentConfigError

    simulator = config.simulator
    if (config.run.workflow != "embodied" or cluster_address(config.workers.ray_address) is not None
            or simulator_unavailable(simulator.name) is not None):
        return
    camera = video_camera(config, simulator.name)
    videos = config.eval.video_episodes > 0 and config.eval.num_episodes > 0 and renders_videos(simulator.name)
    for env in simulator.task_envs():
        try:  # the run's own settings (its render_camera too: the videos' camera replaces it only there)
            check_env(simulator.name, env)
        except ComponentConfigError as err:
            raise PreflightError(err.message, field=err.field) from None
        _check_encoder_camera(config, env)
        if videos:
            try:
                check_env(simulator.name, {**env, "render_camera": camera})
            except ComponentConfigError as err:
                raise PreflightError(f"the evaluation videos' camera {camera!r}: {err.message}",
                                     field="eval.video_camera") from None


def _check_encoder_camera(config, env) -> None:
    """A trajectory encoder of camera frames (``reads_frames``: ``policy_backbone``, ``vjepa2``)
    reads ``<camera>_image`` observations, which the task's ``simulator.env.cameras`` must render;
    the workers' first reward found it before, after the warm start and a rollout, as a Ray
    traceback. A simulator config without ``cameras`` is not checked.

    Raises:
        PreflightError: naming ``algorithm.<encoder>.camera`` and the cameras the task renders.
    """
    from simulators.registry import build_env_config
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    algorithm = config.algorithm
    name = algorithm.trajectory_encoder
    if not algorithm.embeds_trajectories() or not getattr(TRAJECTORY_ENCODERS.get(name), "reads_frames", False):
        return
    cameras = getattr(build_env_config(config.simulator.name, env), "cameras", None)
    camera = algorithm.options("trajectory_encoder").camera
    if cameras is not None and camera not in cameras:
        rendered = f"renders {', '.join(cameras)}" if cameras else "renders no camera (state observations)"
        raise PreflightError(f"trajectory encoder {name!r} reads the {camera!r} camera's frames, and "
                             f"simulator.env.cameras {rendered}: add it there, or set algorithm.{name}.camera to a "
                             "camera it renders", field=f"algorithm.{name}.camera")


def _check_policy_checkpoint(config) -> None:
    """``policy.config.model_path`` of a policy that loads a pretrained checkpoint (its class
    defines ``check_pretrained``, as :class:`~policies.openvla.policy_base.PrismaticPolicy` does)."""
    from policies import POLICIES
    from policies.checkpoint_files import FieldError

    policy_config = config.policy.policy_config()
    check = getattr(POLICIES.get(config.policy.name), "check_pretrained", None)
    if check is None or all(getattr(policy_config, name, None) is None for name in ("model_path", "tokenizer_path")):
        return
    _check_model_directory_kind(config.policy.name, getattr(policy_config, "model_path", None))
    if config.policy.allow_partial_load and hasattr(policy_config, "allow_partial_load"):
        policy_config.allow_partial_load = True  # as the embodied workflow builds it
    try:
        check(policy_config)
    except (OSError, ValueError) as error:
        field = error.field if isinstance(error, FieldError) else "model_path"
        raise PreflightError(with_field_hint(str(error), "policy.config.allow_pickle"),
                             field=f"policy.config.{field}") from None


def _check_model_directory_kind(policy: str, model_path: str | None) -> None:
    """A ``policy.config.model_path`` that is a training checkpoint (``trainer_state.json``: the
    run's format, not a model directory), or a model directory of another of our policies (its
    ``config.json`` names it, as ``vla-rl export`` of an MLP run writes), is refused naming what it
    is and what to do; the policy's own checks would only name a file it lacks.

    Raises:
        PreflightError: naming ``policy.config.model_path``.
    """
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE

    if model_path is None:
        return
    directory = Path(model_path)
    if (directory / TRAINER_STATE_FILE).is_file():
        raise PreflightError(f"{directory} is a training checkpoint ({TRAINER_STATE_FILE}), not a model directory: "
                             f"evaluate it with vla-rl eval {directory}, or write its model directory with vla-rl "
                             "export", field="policy.config.model_path")
    try:
        saved = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return  # no readable config.json: the policy's own check says what is wrong
    other = saved.get("policy") if isinstance(saved, dict) else None
    if isinstance(other, str) and other != policy:
        raise PreflightError(f"{directory} holds a {other!r} policy (its config.json), not a {policy!r} one: use a "
                             f"template of the {other} policy", field="policy.config.model_path")


def _check_trajectory_encoder(config) -> None:
    """The run's trajectory encoder, when its reward embeds episodes: its config's ``points``, and
    the files it reads (its class's ``check_config``: V-JEPA 2's ``model_dir``); found by the workers'
    first reward before, after the demonstrations and behaviour cloning (3 min 30 s on the 2-core
    machine), as a Ray traceback."""
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    name = config.algorithm.trajectory_encoder
    if not config.algorithm.embeds_trajectories():
        return
    options = config.algorithm.options("trajectory_encoder")
    if not isinstance(getattr(options, "points", None), int):
        raise PreflightError(f"trajectory encoder {name!r}: its config ({type(options).__name__}) has no integer "
                             "'points' field, the number of states a reward takes from each episode, which every "
                             "encoder's config carries (docs/extending.md)", field="algorithm.trajectory_encoder")
    check = getattr(TRAJECTORY_ENCODERS.get(name), "check_config", None)
    if check is None:
        return
    try:
        check(config.algorithm.options("trajectory_encoder"))
    except (OSError, ValueError) as error:
        raise PreflightError(str(error), field=f"algorithm.{name}") from None


def _check_simulator_actors(config, the_plan) -> None:
    """``simulator.actors_per_worker`` is at most the environments of the smallest worker's pool
    (:func:`vla_rl.workflows.embodied.simulator_pool_size`): an actor runs at least one environment,
    so the ones past that would sit idle holding their CPUs (``simulator.num_cpus_per_actor``)."""
    from vla_rl.workflows.embodied import simulator_pool_size

    actors = config.simulator.actors_per_worker
    environments = min(simulator_pool_size(config, the_plan.rollout_dp_size(rank), the_plan.world_size)
                       for rank in range(the_plan.world_size))
    if actors > environments:
        raise PreflightError(f"{actors} simulator actors per worker, but a worker's pool runs {environments} "
                             f"environment(s) at once (data.init_states_per_step / rollout DP size x "
                             f"data.group_size, or eval.num_episodes per worker): the actors past {environments} "
                             f"would sit idle holding their CPUs; use at most {environments}",
                             field="simulator.actors_per_worker")


def check_embodied_inputs(config, the_plan) -> None:
    """A task set's shared sizes, the simulator actors per worker, the policy's pretrained
    checkpoint and the trajectory encoder.

    Raises:
        PreflightError: the first problem found.
    """
    _check_task_set(config)
    _check_simulator_actors(config, the_plan)
    _check_policy_checkpoint(config)
    _check_trajectory_encoder(config)
