"""The DAG worker: one Ray actor per device slot, running its own task chain every step.

Multi-controller: the driver hands each worker only the template path, the overrides, its rank
and the run directory. Each worker loads and plans the template itself, binds its device, joins
the workers' torch.distributed process group, builds its resources, and then executes its chain
for every step the driver asks for. Batches move between workers with collectives
(:func:`vla_rl.data.reshard.reshard`); the driver receives only scalar metrics.
"""

from __future__ import annotations

import copy
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tensordict import TensorDict

from vla_rl.algorithms.kl import make_kl_controller
from vla_rl.config import RunConfig
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import Reshard, RunNode, plan
from vla_rl.dag.registry import get_node_function
from vla_rl.data import keys
from vla_rl.data.reshard import reshard
from vla_rl.utils.device import bind_device, collective_backend
from vla_rl.utils.ray_utils import LOOPBACK
from vla_rl.workers.checkpointing import WorkerCheckpointer
from vla_rl.workers.context import NodeContext
from vla_rl.workers.metrics import reduce_metrics
from vla_rl.workers.resources import WorkerResources


class DAGWorker:
    """Executes one rank's task chain.

    Args:
        rank: this worker's rank in ``[0, world_size)``.
        world_size: number of DAG workers.
        template: template path (or name under ``dag_templates/``).
        overrides: dotted overrides applied to the template.
        run_dir: the run directory (shared file system).
    """

    def __init__(self, rank: int, world_size: int, template: str, overrides: list[str], run_dir: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.template = load_template(template, overrides)
        self.config: RunConfig = self.template.config
        self.plan = plan(self.template, world_size)
        self.chain = self.plan.chains[rank]
        self.run_dir = Path(run_dir)
        torch.set_num_threads(self.config.workers.torch_threads)
        # The same seed on every worker: identical policy initialisation and warm start.
        torch.manual_seed(self.config.run.seed)
        self.device = bind_device(self.config.workers.device)
        self.resources: WorkerResources | None = None
        self.checkpointer: WorkerCheckpointer | None = None

    # ----------------------------------------------------------------------------- set-up
    def host_rendezvous(self) -> int:
        """Start the process group's TCP store on 127.0.0.1 (rank 0) and return its port.

        ``TCPStore`` alone would listen on every interface; handing it a socket already bound
        to loopback (``master_listen_fd``) keeps the store on 127.0.0.1.
        """
        self._store_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._store_socket.bind((LOOPBACK, 0))
        self._store_socket.listen(128)
        port = int(self._store_socket.getsockname()[1])
        self._store = dist.TCPStore(LOOPBACK, port, self.world_size, is_master=True,
                                    master_listen_fd=self._store_socket.fileno(), wait_for_workers=False)
        return port

    def init_process_group(self, port: int) -> None:
        """Join the workers' process group through the store rank 0 hosts on 127.0.0.1:port."""
        if self.rank != 0:
            self._store = dist.TCPStore(LOOPBACK, port, self.world_size, is_master=False)
        dist.init_process_group(collective_backend(self.config.workers.device), store=self._store,
                                rank=self.rank, world_size=self.world_size)

    def setup(self, resume: bool) -> dict[str, float]:
        """Build the simulator pool and policy; warm-start it, or restore the last checkpoint.

        Also builds what the template's nodes need besides the actor: a frozen reference copy
        of the warm-start policy (a ``reference`` node), a critic (``critic`` nodes), and the
        KL-in-reward coefficient controller.

        Returns:
            ``start_step`` and the warm-start metrics (scalars).
        """
        from vla_rl.trainers.actor import ActorTrainer

        rollout_dp = next((t.dp_size for t in self.chain if isinstance(t, RunNode) and t.type == "env_interact"),
                          self.world_size)
        roles = {t.role for t in self.chain if isinstance(t, RunNode)}
        self.resources = WorkerResources(self.config, self.rank, self.world_size, self.run_dir, self.device,
                                         rollout_dp)
        self.checkpointer = WorkerCheckpointer(self.run_dir / "checkpoints", self.rank, self.resources)
        if self.config.run.workflow == "text":
            self._prepare_text_assets()
        metrics: dict[str, float] = {}
        if resume:
            start_step = self.checkpointer.restore_policy()
        else:
            metrics = self._warm_start()
            start_step = 0
        resources = self.resources
        if "reference" in roles:  # on resume, its warm-start weights are restored below
            resources.reference = copy.deepcopy(resources.policy).requires_grad_(False).eval()
        resources.actor = ActorTrainer(resources.policy, self.config.trainer.lr, forward=resources.batch_forward)
        if "critic" in roles:
            resources.critic = self._make_critic()
        resources.kl_ctrl = make_kl_controller(self.config.algorithm.kl_ctrl)
        if resume:
            self.checkpointer.restore_optimizer_and_rng()
        metrics["start_step"] = float(start_step)
        return metrics

    def _make_critic(self):
        """A critic with the policy's observation normalisation, or for text a copy of the warm
        started LM body with a zero value head (DDP starts every worker from rank 0's initial
        weights)."""
        from vla_rl.trainers.critic import VALUE_FORWARDS, CriticTrainer, ValueNetwork

        policy, critic = self.resources.policy, self.config.critic
        if self.config.run.workflow == "text":
            from policies.causal_lm.value_causal_lm import CausalLMValueModel

            return CriticTrainer(CausalLMValueModel(policy).to(self.device), critic.lr, forward=VALUE_FORWARDS["text"])
        if "images" in self.resources.env_spec or not hasattr(policy, "obs_mean"):
            raise ValueError("critic nodes need flat state observations and a policy with state normalisation "
                             "(the MLP): the value network reads the normalised state vector; remove the critic "
                             "nodes or simulator.env.cameras")
        network = ValueNetwork(self.resources.env_spec["obs_dim"], critic.hidden_sizes, policy.obs_mean,
                               policy.obs_std).to(self.device)
        return CriticTrainer(network, critic.lr)

    def _prepare_text_assets(self) -> None:
        """Rank 0 generates the tiny model and arithmetic prompts the run needs (if any)."""
        from vla_rl.workers.text_assets import ensure_text_assets

        if self.rank == 0:
            ensure_text_assets(self.config, self.run_dir)
        dist.barrier()

    def _warm_start(self) -> dict[str, float]:
        if self.config.run.workflow == "text":
            from vla_rl.trainers.sft import sft_warm_start

            return sft_warm_start(self.resources.policy, self.resources.text_assets.train_file, self.config.text,
                                  seed=self.config.run.seed)
        from vla_rl.trainers.warm_start import behaviour_cloning, ensure_demonstrations, initial_observations

        ws = self.config.warm_start
        if ws.num_demos == 0:
            return {}
        store_path = Path(ws.demo_store) if ws.demo_store else self.run_dir / "demos.zarr"
        env_attrs = {"name": self.config.simulator.name, **self.config.simulator.env}
        if self.rank == 0:
            ensure_demonstrations(self.resources.simulator_pool, store_path, ws.num_demos,
                                  ws.demo_init_state_offset, env_attrs)
        dist.barrier()
        from vla_rl.data.trajectory_store import TrajectoryStore

        store = TrajectoryStore.open(store_path)
        init_obs = initial_observations(self.resources.simulator_pool, ws.norm_init_states)
        return behaviour_cloning(self.resources.policy, store, ws.num_demos, ws.bc_steps, ws.bc_lr,
                                 ws.bc_batch_size, seed=self.config.run.seed, extra_norm_obs=init_obs,
                                 progress=self.rank == 0)

    # ----------------------------------------------------------------------------- steps
    def run_step(self, step: int) -> dict[str, float]:
        """Run this worker's chain once and return the step's metrics, reduced over workers."""
        outputs: dict[str, TensorDict | None] = {}
        edge_inputs: dict[tuple[str, str], TensorDict] = {}
        local: list[tuple[str, float, float]] = []
        timings: dict[str, float] = {}
        for task in self.chain:
            start = time.perf_counter()
            if isinstance(task, Reshard):
                edge_inputs[(task.src, task.dst)] = reshard(outputs[task.src], task.src_dp_size, task.dst_dp_size,
                                                            group_key=keys.UID if task.whole_groups else None)
                timings[f"timing/reshard_{task.src}_to_{task.dst}"] = time.perf_counter() - start
                continue
            batch = self._node_input(task, outputs, edge_inputs)
            fn = get_node_function(task.role, task.type, task.fn).fn
            ctx = NodeContext(task.node_id, step, self.rank, self.world_size, task.dp_rank, task.dp_size,
                              self.config, self.plan.node_configs[task.node_id], self.resources)
            result = fn(ctx, batch)
            outputs[task.node_id] = result.batch
            # A node's metrics describe the batch it was given (a filter's kept fraction too), so
            # they are weighted by its input size; nodes without input by their output's.
            weighed = batch if batch is not None else result.batch
            size = len(weighed) if weighed is not None else 1
            weight = size / ctx.replicas
            local.extend((k, float(v), weight) for k, v in result.metrics.items())
            timings[f"timing/{task.node_id}"] = time.perf_counter() - start
        metrics = reduce_metrics(local)
        metrics.update(timings)
        return metrics

    @staticmethod
    def _node_input(task: RunNode, outputs, edge_inputs) -> TensorDict | None:
        inputs = [edge_inputs.get((dep, task.node_id), outputs[dep]) for dep in task.deps]
        inputs = [b for b in inputs if b is not None]
        if not inputs:
            return None
        merged = inputs[0]
        for other in inputs[1:]:
            merged = merged.clone(recurse=False).update(other)
        return merged

    # ----------------------------------------------------------------------------- evaluation & checkpoints
    def evaluate(self, tag: str, video: bool) -> dict[str, float]:
        """Evaluate on the held-out initial states (text: prompts); rank 0 also writes
        ``videos/{tag}.mp4`` (embodied runs)."""
        from vla_rl.rollout.evaluation import evaluate_distributed

        res = self.resources
        if self.config.run.workflow == "text":
            from vla_rl.rollout.text_evaluation import evaluate_text_distributed

            return evaluate_text_distributed(res.policy, res.text_assets.test_file, self.config, self.rank,
                                             self.world_size, res.generator)
        pool = res.simulator_pool
        metrics = evaluate_distributed(res.policy, pool, self.config, self.rank, self.world_size, pool.capacity,
                                       res.generator)
        if video and self.rank == 0 and self.config.eval.video_episodes > 0:
            metrics.update(self._record_video(tag))
        return metrics

    def _record_video(self, tag: str) -> dict[str, float]:
        import numpy as np

        from simulators.pool import SimulatorPool
        from vla_rl.rollout.evaluation import record_video

        ev, sim = self.config.eval, self.config.simulator
        env = {**sim.env, "render_camera": ev.video_camera, "render_size": ev.video_size}
        pool = SimulatorPool(sim.name, env, num_actors=1, envs_per_actor=ev.video_episodes,
                             actor_options={"num_cpus": 0}, step_timeout_s=sim.step_timeout_s)
        try:
            ids = ev.init_state_offset + np.arange(ev.video_episodes, dtype=np.int64)
            out = record_video(self.resources.policy, pool, ids, self.run_dir / "videos" / f"{tag}.mp4",
                               ev.video_fps, self.resources.generator)
        finally:
            pool.close()
        return {f"video/{tag}_successes": float(out["video_successes"])}

    def save_checkpoint(self, step: int) -> None:
        """Write this worker's part of the checkpoint of ``step``; rank 0 finalises it atomically."""
        self.checkpointer.save(step, keep_last=self.config.trainer.keep_last)

    def shutdown(self) -> None:
        """Stop the simulator actors and leave the process group."""
        if self.resources is not None:
            self.resources.close()
        if dist.is_initialized():
            dist.destroy_process_group()
