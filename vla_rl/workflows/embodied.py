"""The embodied workflow: a robot policy acting in simulator pools (``run.workflow: embodied``).

Resources: ``simulator_pool`` (the worker's Ray simulator actors, sized for its training and
evaluation episodes) and ``env_spec`` (the simulator's ``obs_dim``, ``act_dim``, ``horizon``);
the policy is built from ``policy`` with the simulator's sizes.
"""

from __future__ import annotations

import math

from vla_rl.data import keys
from vla_rl.data.key_sizes import StepShape, observation_leaves
from vla_rl.trainers.actor import embodied_forward
from vla_rl.workers.resources import register_resource
from vla_rl.workflows import WORKFLOWS
from vla_rl.workflows.base import Workflow


class EmbodiedWorkflow(Workflow):
    """Robot policies on simulators (see the module docstring)."""

    name = "embodied"
    policy_keys = (keys.OBS, keys.ACTIONS)
    policy_needs = ("env_spec",)

    def build_policy(self, res):
        from policies import make_policy

        spec = res.env_spec
        sizes = {"obs_dim": spec["obs_dim"], "action_dim": spec["act_dim"]}
        if "num_tasks" in spec:  # a task set: policies that declare num_tasks condition on the task id
            sizes["num_tasks"] = spec["num_tasks"]
        config = res.config.policy.policy_config(**sizes)
        if res.config.policy.allow_partial_load and hasattr(config, "allow_partial_load"):
            config.allow_partial_load = True  # the policies that load a pretrained checkpoint declare the field
        return make_policy(res.config.policy.name, config).to(res.device)

    def batch_forward(self, model, batch):
        return embodied_forward(model, batch)

    def build_critic(self, res):
        """A value network over the flat state with the policy's observation normalisation.

        Raises:
            ValueError: camera observations or a task set, or a policy without state normalisation.
        """
        from vla_rl.trainers.critic import CriticTrainer, ValueNetwork

        res.ensure(["env_spec"])
        policy, critic = res.policy, res.config.critic
        if "images" in res.env_spec or "num_tasks" in res.env_spec or not hasattr(policy, "obs_mean"):
            raise ValueError("critic nodes need flat state observations of one task and a policy with state "
                             "normalisation (the MLP): the value network reads the normalised state vector; remove "
                             "the critic nodes, simulator.env.cameras or simulator.tasks")
        network = ValueNetwork(res.env_spec["obs_dim"], critic.hidden_sizes, policy.obs_mean, policy.obs_std)
        return CriticTrainer(network.to(res.device), critic.lr, group=res.group)

    def warm_starts(self, config) -> bool:
        return config.warm_start.num_demos > 0

    def groups_per_step(self, config) -> int:
        return config.data.init_states_per_step

    def step_shape(self, config) -> StepShape:
        """Episodes of ``ceil(horizon / chunk)`` decisions with the simulator's observations
        (the sizes its config declares: ``state_dim``, ``action_dim``; unknown ones stay None)."""
        from vla_rl.data.observations import INSTRUCTION_BYTES

        env = config.simulator.env_config()
        state_dim, action_dim = getattr(env, "state_dim", None), getattr(env, "action_dim", None)
        sizes = {name: value for name, value in (("obs_dim", state_dim), ("action_dim", action_dim)) if value}
        policy = config.policy.policy_config(**sizes)
        chunk = int(getattr(policy, "chunk_size", 1))
        cameras = tuple(getattr(env, "cameras", ()))
        return StepShape(groups=config.data.init_states_per_step, group_size=config.data.group_size,
                         decisions=math.ceil(env.horizon / chunk), chunk=chunk, action_dim=action_dim,
                         obs=observation_leaves(state_dim, cameras, getattr(env, "camera_size", 0), INSTRUCTION_BYTES))

    def build_evaluation(self, res):
        from vla_rl.evaluation.embodied import EmbodiedEvaluation

        res.ensure(["policy", "simulator_pool"])
        return EmbodiedEvaluation(res)


WORKFLOWS.register("embodied")(EmbodiedWorkflow())


@register_resource("simulator_pool", close=lambda pool: pool.close())
def build_simulator_pool(res):
    """This worker's simulator pool (Ray actors on the worker's own node), sized for its training and
    evaluation episodes; with ``simulator.tasks``, a pool of the task set."""
    from simulators.pool import SimulatorPool
    from vla_rl.workers.placement import same_node_strategy

    sim = res.config.simulator
    capacity = max(res.episodes_per_step, res.eval_episodes, 1)
    options = {"num_cpus": sim.num_cpus_per_actor, "scheduling_strategy": same_node_strategy()}
    return SimulatorPool(sim.name, sim.task_envs() if sim.multi_task else sim.env, num_actors=sim.actors_per_worker,
                         envs_per_actor=math.ceil(capacity / sim.actors_per_worker), actor_options=options,
                         step_timeout_s=sim.step_timeout_s)


@register_resource("env_spec", needs=("simulator_pool",))
def build_env_spec(res) -> dict:
    """``obs_dim``, ``act_dim`` and ``horizon`` of the simulator (and ``images`` with cameras)."""
    return res.simulator_pool.spec()
