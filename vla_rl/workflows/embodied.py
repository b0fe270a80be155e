"""The embodied workflow: a robot policy acting in simulator pools (``run.workflow: embodied``).

Resources: ``simulator_pool`` (the worker's Ray simulator actors, sized for its training and
evaluation episodes) and ``env_spec`` (the simulator's :class:`~vla_rl_core.env_spec.EnvSpec`);
the policy is built from ``policy`` with the simulator's sizes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from vla_rl.dag.registry import WORKFLOWS
from vla_rl.data.key_sizes import StepShape, observation_leaves
from vla_rl.trainers.actor import embodied_forward
from vla_rl.utils.console import worker_bars
from vla_rl.workers.resources import register_resource
from vla_rl.workflows.base import Workflow
from vla_rl_core import keys
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.env_spec import EnvSpec

if TYPE_CHECKING:
    import torch


class EmbodiedWorkflow(Workflow):
    """Robot policies on simulators (see the module docstring)."""

    name = "embodied"
    policy_keys = (keys.OBS, keys.ACTIONS, keys.CONTROL_STEPS)
    policy_needs = ("env_spec",)

    def build_policy(self, res):
        """The policy for the worker's simulator sizes.

        Raises:
            ComponentConfigError: ``policy.config.<field>`` does not fit them (a model directory
                saved for another observation layout: the policy's
                :class:`~policies.checkpoint_files.FieldError`), reported by the driver in one line.
        """
        from policies.checkpoint_files import FieldError

        try:
            return robot_policy(res.config, res.env_spec, res.device).to(res.device)
        except FieldError as error:  # known only once a simulator gave the sizes
            raise ComponentConfigError(f"policy.config.{error.field}", str(error)) from None

    def standalone_policy(self, config, run_dir):
        """The policy, its observation and action sizes read from one environment of the run's
        simulator made in this process (as a simulator actor would)."""
        from vla_rl.workflows.base import apply_lora

        policy = robot_policy(config, simulator_spec(config))
        if config.policy.lora is not None:
            apply_lora(policy, config.policy.lora, config.run.seed)
        return policy

    def batch_forward(self, model, batch, with_entropy=True):
        return embodied_forward(model, batch, with_entropy)

    def build_critic(self, res):
        """A value network over the state vector (the flat observation, or the ``state`` of camera
        observations), normalised with :func:`critic_state_normalization`.

        Raises:
            ValueError: a task set (``simulator.tasks``): a state's value depends on its task, which
                the value network does not read.
        """
        from vla_rl.trainers.critic import CriticTrainer, ValueNetwork

        res.ensure(["env_spec"])
        if res.env_spec.num_tasks is not None:
            raise ValueError("critic nodes do not support a task set (simulator.tasks): the value network reads the "
                             "state vector alone, not the task; remove simulator.tasks, or the critic nodes (an "
                             "advantage estimator without a critic, e.g. algorithm.adv_estimator=grpo)")
        mean, std = critic_state_normalization(res)
        network = ValueNetwork(res.env_spec.obs_dim, res.config.critic.hidden_sizes, mean, std)
        return CriticTrainer(network.to(res.device), res.config.critic.lr, group=res.group, trainer=res.config.trainer)

    def warm_starts(self, config) -> bool:
        return config.warm_start.num_demos > 0

    def groups_per_step(self, config) -> int:
        return config.data.init_states_per_step

    def step_shape(self, config) -> StepShape:
        """Episodes of ``ceil(horizon / chunk)`` decisions with the simulator's observations
        (the sizes its config declares: ``state_dim``, ``action_dim``; unknown ones stay None) and
        the policy's own actions (:meth:`policies.base.Policy.planned_action_sizes`)."""
        from policies import POLICIES
        from vla_rl_core.observations import INSTRUCTION_BYTES

        env = config.simulator.env_config()
        state_dim, action_dim = getattr(env, "state_dim", None), getattr(env, "action_dim", None)
        sizes = {name: value for name, value in (("obs_dim", state_dim), ("action_dim", action_dim)) if value}
        policy = config.policy.policy_config(**sizes)
        chunk, own_action_dim = POLICIES.get(config.policy.name).planned_action_sizes(policy)
        if action_dim is None:  # the policy's sizes may derive from a placeholder action_dim, not the simulator's
            own_action_dim = None
        chunk = chunk or 1
        cameras = tuple(getattr(env, "cameras", ()))
        return StepShape(groups=config.data.init_states_per_step, group_size=config.data.group_size,
                         decisions=math.ceil(env.horizon / chunk), chunk=chunk, action_dim=action_dim,
                         own_action_dim=own_action_dim,
                         obs=observation_leaves(state_dim, cameras, getattr(env, "camera_size", 0), INSTRUCTION_BYTES))

    def build_evaluation(self, res):
        from vla_rl.evaluation.embodied import EmbodiedEvaluation

        res.ensure(["policy", "simulator_pool"])
        return EmbodiedEvaluation(res)


WORKFLOWS.register("embodied")(EmbodiedWorkflow())


def robot_policy(config, spec: EnvSpec, device: torch.device | None = None):
    """The ``policy`` section's policy for a simulator of ``spec``'s sizes (``obs_dim``,
    ``action_dim``, and ``num_tasks`` for a task set: the policies that declare ``num_tasks``
    condition on the task id), built on ``device`` (None: the CPU; a checkpoint's weights are
    read straight onto it), prepared for the run's own tasks
    (:func:`~vla_rl.evaluation.benchmarks.use_run_tasks`: e.g. the LIBERO suite's dataset statistics)."""
    from policies import make_policy
    from vla_rl.evaluation.benchmarks import use_run_tasks

    sizes = {"obs_dim": spec.obs_dim, "action_dim": spec.action_dim}
    if spec.num_tasks is not None:
        sizes["num_tasks"] = spec.num_tasks
    policy_config = config.policy.policy_config(**sizes)
    if config.policy.allow_partial_load and hasattr(policy_config, "allow_partial_load"):
        policy_config.allow_partial_load = True  # the policies that load a pretrained checkpoint declare the field
    policy = make_policy(config.policy.name, policy_config, device)
    use_run_tasks(policy, config)
    return policy


def critic_state_normalization(res) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and scale, two float32 ``(obs_dim,)`` tensors, with which the critic normalises
    the state (fixed for the run; buffers of the value network, so checkpoints restore them).

    - A policy with its own state normalisation (``obs_mean``/``obs_std``: the MLP): its statistics,
      which the warm start fitted.
    - Any other policy (π0, OpenVLA-OFT: their statistics cover the proprio features at most): the
      statistics the MLP's warm start would fit, computed the same way from the same states: the
      per-feature mean and standard deviation, floored at ``warm_start.obs_std_floor``, of every
      state of the first ``warm_start.num_demos`` demonstrations of the run's store (the warm
      start wrote it before the critic is built) and of the first observations of ``warm_start.norm_init_states``
      training initial states. Every worker reads the same store and resets the same seeded
      states, so the statistics agree across the workers, as DDP needs. Without either (no
      demonstrations, ``norm_init_states: 0``): mean 0 and scale 1, the raw state (as an MLP that
      was not warm-started).

    Raises:
        FileNotFoundError: ``warm_start.num_demos > 0`` but the demonstration store does not exist.
    """
    import torch

    from policies.normalization import fit_mean_std
    from vla_rl.trainers.warm_start import demonstration_states, initial_observations
    from vla_rl_core.run_layout import demo_store_path

    policy, ws, obs_dim = res.policy, res.config.warm_start, res.env_spec.obs_dim
    if hasattr(policy, "obs_mean"):
        return policy.obs_mean.detach().float().cpu(), policy.obs_std.detach().float().cpu()
    states = []
    if ws.num_demos > 0 and ws.dataset is not None:
        from vla_rl.data.lerobot_demonstrations import dataset_states

        states.append(torch.as_tensor(dataset_states(ws.dataset, ws.dataset_keys, ws.num_demos)))
    elif ws.num_demos > 0:
        from vla_rl.data.trajectory_store import TrajectoryStore

        path = demo_store_path(res.config.warm_start.demo_store, res.run_dir)
        if not (path / "zarr.json").exists():
            raise FileNotFoundError(f"{path} holds no demonstrations: the critic normalises the state with the "
                                    "statistics of the warm start's demonstrations (warm_start.num_demos > 0), which "
                                    "the warm_start phase writes there")
        states.append(demonstration_states(TrajectoryStore.open(path, read_only=True), ws.num_demos))
    if ws.norm_init_states > 0:
        obs = initial_observations(res.simulator_pool, ws.norm_init_states)
        state = obs[keys.OBS_STATE] if isinstance(obs, dict) else obs
        states.append(torch.as_tensor(state, dtype=torch.float32))
    if not states:
        return torch.zeros(obs_dim), torch.ones(obs_dim)
    return fit_mean_std(torch.cat(states), ws.obs_std_floor)


def simulator_spec(config) -> EnvSpec:
    """The spec of the run's simulator as a simulator worker of one environment made and closed in
    this process reads it (seconds: the simulator loads its assets); with a task set
    (``simulator.tasks``: its tasks share one layout), its first task's, with ``num_tasks``."""
    from simulators.worker import SimulatorWorker

    worker = SimulatorWorker(config.simulator.name, config.simulator.env_config(), 1)
    try:
        spec = worker.spec()
    finally:
        worker.close()
    return spec.with_tasks(len(config.simulator.task_names())) if config.simulator.multi_task else spec


def simulator_pool_size(config, rollout_dp_size: int, world_size: int) -> int:
    """The environments of one worker's simulator pool: its training episodes per step
    (``data.init_states_per_step / rollout_dp_size x data.group_size``) or its held-out evaluation
    episodes per protocol (``eval.num_episodes`` dealt round-robin over the workers), whichever is
    more; at least 1. Every one runs an episode at once (a remote run needs a client for each)."""
    data = config.data
    return max(data.init_states_per_step // rollout_dp_size * data.group_size,
               math.ceil(config.eval.num_episodes / world_size), 1)


def remote_clients_note(config, the_plan, evaluation: bool = False) -> str | None:
    """For a run of remote environments (``simulator.name: remote``), how many clients it needs
    connected: one per environment of every worker's simulator pool, each running an episode at
    once (:func:`simulator_pool_size`); for ``vla-rl eval`` (``evaluation``), one per held-out
    episode of a protocol (``eval.num_episodes``, dealt round-robin to the workers, whose pools hold
    their share at once). None for other runs."""
    if config.run.workflow != "embodied" or config.simulator.name != "remote":
        return None
    needed = config.eval.num_episodes if evaluation else sum(
        simulator_pool_size(config, the_plan.rollout_dp_size(rank), the_plan.world_size)
        for rank in range(the_plan.world_size))
    env = config.simulator.env_config()
    host = "<this machine>" if env.host in ("0.0.0.0", "::") else env.host  # every interface: not an address
    why = ("eval.num_episodes per protocol" if evaluation else
           "data.init_states_per_step x data.group_size per step, eval.num_episodes per evaluation protocol")
    return (f"remote environments: connect at least {needed} clients to ws://{host}:{env.port} (the "
            f"{'evaluation' if evaluation else 'run'} rolls out up to {needed} episodes at once: {why})")


@register_resource("simulator_pool", close=lambda pool: pool.close())
def build_simulator_pool(res):
    """This worker's simulator pool (Ray actors on the worker's own node), sized for its training and
    evaluation episodes (:func:`simulator_pool_size`); with ``simulator.tasks``, a pool of the task set."""
    from simulators.pool import SimulatorPool
    from vla_rl.workers.placement import same_node_strategy

    sim = res.config.simulator
    capacity = simulator_pool_size(res.config, res.rollout_dp_size, res.world_size)
    options = {"num_cpus": sim.num_cpus_per_actor, "scheduling_strategy": same_node_strategy()}
    return SimulatorPool(sim.name, sim.task_envs() if sim.multi_task else sim.env, num_actors=sim.actors_per_worker,
                         envs_per_actor=math.ceil(capacity / sim.actors_per_worker), actor_options=options,
                         step_timeout_s=sim.step_timeout_s, progress=res.rank == 0 and worker_bars())


@register_resource("env_spec", needs=("simulator_pool",))
def build_env_spec(res) -> EnvSpec:
    """The simulator's spec, as its pool states it, checked against the sizes its config declares
    (:func:`simulators.registry.check_spec_against_config`: a plug-in's config saying 3 state
    values where its environments give 2 planned and trained on silently)."""
    from simulators.registry import check_spec_against_config

    spec = res.simulator_pool.spec()
    check_spec_against_config(res.config.simulator.name, res.config.simulator.env_config(), spec)
    return spec
