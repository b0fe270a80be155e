"""The DAG worker: one Ray actor per device slot, running its own task chains.

Multi-controller: the driver hands each worker only the template path, the overrides, its rank
and the run directory. Each worker loads and plans the template itself, binds its device, joins
the workers' torch.distributed process group, builds the resources its chains declare
(:mod:`vla_rl.workers.resources`) and runs a phase's chain whenever the driver asks: the
``warm_start`` phase once during :meth:`DAGWorker.setup`, the ``train`` phase every step, the
``evaluate`` phase whenever the run evaluates. Batches move between workers with collectives
(:func:`vla_rl.data.reshard.reshard`); the driver receives only scalar metrics, from rank 0
(every worker holds the same reduced figures), so what reaches it does not grow with the number
of workers. Each training step also reports what the step's collectives moved on the workers
(:func:`comm_metrics`).
"""

from __future__ import annotations

import numbers
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict, TensorDictBase

from vla_rl.checkpoints.files import load_run_state
from vla_rl.config import RunConfig
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import Reshard, RunNode, Task, plan
from vla_rl.dag.registry import NodeOutput, get_node_function
from vla_rl.data.reshard import reshard
from vla_rl.errors import RunStopped
from vla_rl.utils.code_location import check_same_code
from vla_rl.utils.collectives import COUNTERS, CommCounters, TagCounts
from vla_rl.utils.device import bind_device, collective_backend
from vla_rl.utils.ray_utils import LOOPBACK, rendezvous_address
from vla_rl.workers.checkpointing import WorkerCheckpointer
from vla_rl.workers.context import NodeContext
from vla_rl.workers.metrics import (
    Metric,
    as_metric,
    maximum,
    mean,
    reduce_metrics,
    reduction_cost,
)
from vla_rl.workers.resources import Resources
from vla_rl_core import keys
from vla_rl_core.run_layout import CHECKPOINTS_DIR

ROLLOUT_TIMING = "timing/env_interact"
"""Seconds this step's rollout nodes (type ``env_interact``) took, whatever their ids: the run loop
divides the step's environment steps by it."""


class DAGWorker:
    """Executes one rank's task chains.

    Args:
        rank: this worker's rank in ``[0, world_size)``.
        world_size: number of DAG workers.
        template: template path (or name under ``dag_templates/``).
        overrides: dotted overrides applied to the template.
        run_dir: the run directory (shared file system).
        driver_code_root: where the driver imported ``vla_rl`` from; the worker refuses to run
            other code (:func:`~vla_rl.utils.code_location.check_same_code`).
    """

    def __init__(self, rank: int, world_size: int, template: str, overrides: list[str], run_dir: str,
                 driver_code_root: str, driver_env: dict[str, str] | None = None) -> None:
        check_same_code(driver_code_root)
        # the driver's values of variables read in this process (VLA_RL_REMOTE_TOKEN), never the
        # ones of the environment the Ray it joined started in; "" unsets
        for name, value in (driver_env or {}).items():
            if value:
                os.environ[name] = value
            else:
                os.environ.pop(name, None)
        self.rank = rank
        self.world_size = world_size
        self.template = load_template(template, recorded=overrides)  # the driver's, checked there
        self.config: RunConfig = self.template.config
        self.plan = plan(self.template, world_size)
        self.run_dir = Path(run_dir)
        torch.set_num_threads(self.config.workers.torch_threads)
        # The same seed on every worker: identical policy initialisation and warm start.
        torch.manual_seed(self.config.run.seed)
        self.device = bind_device(self.config.workers.device)
        self.resources: Resources | None = None
        self.checkpointer: WorkerCheckpointer | None = None
        self._comm_carry = CommCounters()  # a metric reduction's bytes beyond the prediction, for the next step

    # ----------------------------------------------------------------------------- set-up
    def host_rendezvous(self) -> tuple[str, int]:
        """Start the process group's TCP store (rank 0) and return its address and port: on
        127.0.0.1 in a local run, on this node's address in a cluster
        (:func:`~vla_rl.utils.ray_utils.rendezvous_address`).

        ``TCPStore`` alone would listen on every interface; handing it a socket already bound
        to that one address (``master_listen_fd``) keeps the store there.
        """
        host = rendezvous_address()
        self._store_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._store_socket.bind((host, 0))
        self._store_socket.listen(128)
        port = int(self._store_socket.getsockname()[1])
        self._store = dist.TCPStore(host, port, self.world_size, is_master=True,
                                    master_listen_fd=self._store_socket.fileno(), wait_for_workers=False)
        return host, port

    def init_process_group(self, host: str, port: int) -> None:
        """Join the workers' process group through the store rank 0 hosts at host:port (gloo on
        loopback when that is where the store is: a local run, or a cluster of loopback nodes)."""
        if host == LOOPBACK:  # NCCL's bootstrap sockets too, else it picks the first interface
            os.environ["GLOO_SOCKET_IFNAME"] = "lo"
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
        if self.rank != 0:
            self._store = dist.TCPStore(host, port, self.world_size, is_master=False)
        backend = self.config.workers.collective_backend or collective_backend(self.config.workers.device)
        dist.init_process_group(backend, store=self._store,
                                rank=self.rank, world_size=self.world_size)

    def setup(self, resume: bool) -> dict[str, float]:
        """Prepare the workflow, then warm-start the policy (the ``warm_start`` phase) or restore
        it from the newest checkpoint that verifies (collective: rank 0 chooses, see
        :meth:`~vla_rl.workers.checkpointing.WorkerCheckpointer.latest`), then build the resources
        of the ``train`` phase (a frozen reference copies the policy as it is now) and, on
        resume, restore their state and this rank's RNG. The driver's restart after a worker died
        is such a resume, in a fresh group of workers.

        Returns:
            ``start_step``, on resume ``skipped_checkpoints`` (newer checkpoints that failed
            verification and were set aside) and, when the checkpoint records it (its
            ``trainer_state.json`` run state), ``env_steps``: the environment steps the run had
            simulated by then; and the warm start's metrics (scalars).
        """
        self.resources = Resources(self.config, self.rank, self.world_size, self.run_dir, self.device,
                                   self.plan.rollout_dp_size(self.rank))
        self.checkpointer = WorkerCheckpointer(self.run_dir / CHECKPOINTS_DIR, self.resources)
        self.resources.workflow.prepare(self.resources)
        metrics: dict[str, float] = {}
        if resume:
            path = self.checkpointer.latest()
            self.resources.ensure(["policy"])
            start_step = self.checkpointer.restore(path, names=["policy"])
        else:
            if "warm_start" in self.plan.phases:
                metrics = self.run_phase("warm_start", 0)
            start_step = 0
        self.resources.ensure(self._declared("train"))
        if resume:
            self.checkpointer.restore(path, names=[n for n in self.resources.built() if n != "policy"])
            self.checkpointer.restore_rng(path)
        metrics["start_step"] = float(start_step)
        if resume:
            metrics["skipped_checkpoints"] = float(len(self.checkpointer.skipped))
            run_state = load_run_state(path)
            if "env_steps" in run_state:
                metrics["env_steps"] = float(run_state["env_steps"])
        return metrics

    def _declared(self, phase: str) -> list[str]:
        """The resources the nodes of ``phase`` declare, in chain order."""
        names: list[str] = []
        for task in self.plan.phase(phase).chains[self.rank]:
            if isinstance(task, RunNode):
                names += [name for name in sorted(task.resources) if name not in names]
        return names

    # ----------------------------------------------------------------------------- phases
    def run_step(self, step: int) -> dict[str, float]:
        """Run the ``train`` phase's chain for training step ``step``; returns its metrics."""
        return self.run_phase("train", step)

    def run_phase(self, phase: str, step: int, tag: str = "", video: bool = False) -> dict[str, float]:
        """Run ``phase``'s chain once and return its metrics, reduced over the workers (timings:
        rank 0's), on rank 0; the other ranks return an empty dict.

        The ``train`` phase adds the step's communication figures (:func:`comm_metrics`): what its
        collectives moved, counted by :mod:`vla_rl.utils.collectives`, the metric reduction that
        carries them included.

        Args:
            phase: ``warm_start``, ``train`` or ``evaluate``.
            step: the training step (for an evaluation: the updates done).
            tag: the evaluation's name (``evaluate``: each tag is one evaluation, run until
                ``eval/remaining`` is 0).
            video: whether the evaluation records videos.
        """
        self.resources.ensure(self._declared(phase))
        chain = self.plan.phase(phase).chains[self.rank]
        before = COUNTERS.snapshot()
        _, _, local, timings = self._execute(chain, step, tag=tag, video=video, refill_round=0)
        if phase != "train":  # the training step's rollout time alone: an evaluation has timing/<its node>
            timings.pop(ROLLOUT_TIMING, None)
        if phase == "train":
            # The reduction below carries these figures, so its own collectives are counted ahead,
            # as they cost when every worker reports the same metric names (the usual case); what
            # it moves beyond that is counted in the next step.
            step_counts = COUNTERS.since(before).merged(self._comm_carry)
            step_counts.tags.setdefault("metrics", TagCounts())
            num_metrics = len(local) + len(comm_metrics(step_counts))
            reduction = CommCounters()
            for sent, received in reduction_cost(self.world_size, num_metrics):
                reduction.add("metrics", sent, received)
            local.extend((name, metric, 1) for name, metric in comm_metrics(step_counts.merged(reduction)).items())
            before_reduction = COUNTERS.snapshot()
        metrics = reduce_metrics(local)
        if phase == "train":
            self._comm_carry = COUNTERS.since(before_reduction).since(reduction)
        metrics.update(timings)
        return metrics if self.rank == 0 else {}

    def _execute(self, chain: tuple[Task, ...], step: int, tag: str, video: bool, refill_round: int):
        """Run ``chain``; returns the nodes' outputs, the re-sharded inputs by edge, the nodes'
        metrics as ``(name, metric, replicas)`` and the timings."""
        outputs: dict[str, TensorDict | None] = {}
        edge_inputs: dict[tuple[str, str], TensorDict] = {}
        local: list[tuple[str, Metric, int]] = []
        timings: dict[str, float] = {}
        refills: list[dict[str, float]] = []  # the timings of the rounds a node had re-run (dynamic sampling)
        for task in chain:
            start = time.perf_counter()
            if isinstance(task, Reshard):
                edge_inputs[(task.src, task.dst)] = reshard(outputs[task.src], task.src_dp_size, task.dst_dp_size,
                                                            group_key=keys.UID if task.whole_groups else None)
                timings[f"timing/reshard_{task.src}_to_{task.dst}"] = time.perf_counter() - start
                continue
            batch = self._node_input(task, outputs, edge_inputs)
            ctx = NodeContext(task.node_id, step, self.rank, self.world_size, task.dp_rank, task.dp_size,
                              self.config, self.plan.node_configs[task.node_id],
                              self.resources.view(task.node_id, task.resources), tag=tag, video=video,
                              refill_round=refill_round,
                              rerun_upstream=self._rerun_upstream(chain, task, step, tag, video, refills))
            result = run_node_function(task, ctx, batch)
            check_declared_writes(task, result.batch)
            outputs[task.node_id] = result.batch
            # A plain metric is a mean over the batch the node was given (a filter's kept fraction
            # too), so it is weighted by its input size; nodes without input by their output's.
            weighed = batch if batch is not None else result.batch
            size = len(weighed) if weighed is not None else 1
            local.extend((name, as_metric(value, size), ctx.replicas) for name, value in result.metrics.items())
            elapsed = time.perf_counter() - start
            timings[f"timing/{task.node_id}"] = elapsed
            if task.type == "env_interact":  # every rollout node's, whatever its id (the run loop's env steps/s)
                timings[ROLLOUT_TIMING] = timings.get(ROLLOUT_TIMING, 0.0) + elapsed
            for round_timings in refills:  # the re-run rounds' rollout seconds, as their env steps count
                if ROLLOUT_TIMING in round_timings:
                    timings[ROLLOUT_TIMING] = timings.get(ROLLOUT_TIMING, 0.0) + round_timings[ROLLOUT_TIMING]
            refills.clear()
        return outputs, edge_inputs, local, timings

    def _rerun_upstream(self, chain: tuple[Task, ...], node: RunNode, step: int, tag: str, video: bool,
                        refills: list[dict[str, float]]):
        """``refill_round -> (merged input of node, this worker's metrics of the round)``: re-runs
        the tasks of ``chain`` that lead to ``node``. Each round's timings are appended to
        ``refills``, whose rollout seconds :meth:`_execute` adds to the step's
        ``timing/env_interact`` once ``node`` returns (the env steps of the refill rounds count in
        the run's, ``filter/refill_env_steps``: the env steps per second divide both by their
        seconds). The round's metrics go to ``node`` alone (a step's ``rollout/*`` and ``reward/*``
        figures are its first round's: docs/algorithms.md)."""
        ancestors = self._ancestors(node)

        def rerun(refill_round: int):
            upstream = tuple(t for t in chain if (t.node_id in ancestors if isinstance(t, RunNode)
                                                  else t.dst in ancestors or t.dst == node.node_id))
            outputs, edge_inputs, local, timings = self._execute(upstream, step, tag, video, refill_round)
            refills.append(timings)
            return self._node_input(node, outputs, edge_inputs), {name: metric for name, metric, _ in local}

        return rerun

    def _ancestors(self, node: RunNode) -> set[str]:
        deps = {t.node_id: t.deps for chain in self.plan.phases.values() for t in chain.chains[self.rank]
                if isinstance(t, RunNode)}
        seen: set[str] = set()
        stack = list(node.deps)
        while stack:
            dep = stack.pop()
            if dep not in seen:
                seen.add(dep)
                stack.extend(deps[dep])
        return seen

    @staticmethod
    def _node_input(task: RunNode, outputs, edge_inputs) -> TensorDict | None:
        """The input batch of ``task``: its dependencies' outputs (re-sharded where an edge was),
        merged key by key, in a batch of its own (a shallow copy: the node may set and delete
        keys without changing what its dependencies hand the other nodes; a tensor changed in
        place changes for every node). Merged outputs must hold the same rows: as many, and
        equal values under every key two of them carry (the group ids
        :data:`~vla_rl_core.keys.UID` among them), so that no row is joined to another row's fields.

        Raises:
            RunStopped: two dependencies' outputs disagree, naming the node, both dependencies
                and the row count or the key.
        """
        inputs = [(dep, edge_inputs.get((dep, task.node_id), outputs[dep])) for dep in task.deps]
        inputs = [(dep, b) for dep, b in inputs if b is not None]
        if not inputs:
            return None
        first, merged = inputs[0]
        merged = merged.clone(recurse=False)
        for dep, other in inputs[1:]:
            if len(other) != len(merged):
                raise RunStopped(f"node {task.node_id}: its deps {first} and {dep} hold {len(merged)} and {len(other)} "
                                 "rows on this worker; a node's deps must output the same rows")
            for key in sorted(set(merged.keys()) & set(other.keys())):
                if not _same_values(merged.get(key), other.get(key)):
                    raise RunStopped(f"node {task.node_id}: its deps {first} and {dep} both output {key!r} with other "
                                     "values; a node's deps must output the same rows, and a key twice only if equal")
            merged.update(other)
        return merged

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, step: int, run_state: dict | None = None) -> None:
        """Write this worker's part of the checkpoint of ``step``; rank 0 finalises it atomically.
        ``run_state``: the driver's own state at ``step`` (``env_steps``), kept in the
        checkpoint's ``trainer_state.json`` metadata under ``run``."""
        self.checkpointer.save(step, keep_last=self.config.trainer.keep_last, run_state=run_state)

    def rendering(self) -> list[dict]:
        """How this worker's simulator actors render, by actor (:meth:`SimulatorPool.rendering
        <simulators.pool.SimulatorPool.rendering>`); [] when it has no simulator pool (yet)."""
        if self.resources is None or "simulator_pool" not in self.resources.built():
            return []
        return self.resources.simulator_pool.rendering()

    def host(self) -> dict[str, object]:
        """The machine this worker computes on (:func:`vla_rl.utils.host.host_record`)."""
        from vla_rl.utils.host import host_record

        return host_record(self.device)

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def shutdown(self) -> None:
        """Release the resources (simulator actors, engines) and leave the process group."""
        if self.resources is not None:
            self.resources.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _same_values(a, b) -> bool:
    """Whether two values of a batch key are equal: tensors (on any device) and nested batches
    element by element, anything else (non-tensor data) by ``==``."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b.to(a.device))
    if isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase):
        return set(a.keys()) == set(b.keys()) and all(_same_values(a.get(k), b.get(k)) for k in a.keys())
    return type(a) is type(b) and bool(a == b)


def comm_metrics(counts: CommCounters) -> dict[str, Metric]:
    """One worker's communication figures of a step, with their reduction rules: the bytes it
    sent and received (a mean over the workers, and the busiest worker's), the collectives it
    ran (the same on every worker: all of them take part in each), and the same by tag
    (``comm/<tag>/bytes_received``, ``comm/<tag>/collectives``; tags: ``reshard_rows``,
    ``reshard_meta``, ``metrics``, ``srpo_reference``, ...). Bytes count as the collectives'
    ring algorithms move them (:mod:`vla_rl.utils.collectives`); the gradient all-reduces of
    ``DistributedDataParallel`` are not among them."""
    metrics = {
        "comm/bytes_sent": mean(counts.bytes_sent, 1),
        "comm/bytes_received": mean(counts.bytes_received, 1),
        "comm/bytes_received_max": maximum(counts.bytes_received),
        "comm/collectives": maximum(counts.collectives),
    }
    for tag, tag_counts in sorted(counts.tags.items()):
        metrics[f"comm/{tag}/bytes_received"] = mean(tag_counts.bytes_received, 1)
        metrics[f"comm/{tag}/collectives"] = maximum(tag_counts.collectives)
    return metrics


def run_node_function(task: RunNode, ctx: NodeContext, batch: TensorDictBase | None) -> NodeOutput:
    """Call the node's function. An exception it raises carries a note naming the node, its
    function and the module that registered it (a plug-in's error came back as a Ray traceback
    that named neither), and anything but a :class:`NodeOutput` of a TensorDict (or None) and
    scalar metrics stops the run naming them (a dict batch or a tensor metric failed later, in
    the engine, with a traceback that named neither).

    Raises:
        RunStopped: the function returned something else: not a NodeOutput, a batch that is no
            TensorDict, metrics that are no mapping of names to scalars (:func:`metric_problem`),
            or, from a node of :data:`ROW_KEEPING_ROLES`, a batch of another length than its input.
        Exception: what the function raised, with the note added.
    """
    fn = get_node_function(task.role, task.type, task.fn).fn
    where = f"node {task.node_id!r} (function {task.fn!r} of ({task.role}, {task.type}), from {fn.__module__})"
    try:
        result = fn(ctx, batch)
    except Exception as err:
        err.add_note(f"raised in {where}")
        raise
    if not isinstance(result, NodeOutput):
        raise RunStopped(f"{where} returned a {type(result).__name__}; a node function returns "
                         "NodeOutput(batch, metrics) (vla_rl.dag.registry.NodeOutput)")
    if result.batch is not None and not isinstance(result.batch, TensorDictBase):
        raise RunStopped(f"{where} returned a NodeOutput whose batch is a {type(result.batch).__name__}; its batch "
                         "is a TensorDict (batch dimension first), or None for a node without output")
    if not isinstance(result.metrics, Mapping):
        raise RunStopped(f"{where} returned a NodeOutput whose metrics are a {type(result.metrics).__name__}; they "
                         "are a dict of names to scalars")
    for name, value in result.metrics.items():
        problem = "its name is no str" if not isinstance(name, str) else metric_problem(value)
        if problem is not None:
            raise RunStopped(f"{where} returned metric {name!r}: {problem}; a metric is a number, a one-element "
                             "tensor or array, or a vla_rl.workers.metrics.Metric")
    if (task.role in ROW_KEEPING_ROLES and task.type != "model_train" and batch is not None
            and result.batch is not None and len(result.batch) != len(batch)):
        raise RunStopped(f"{where} returned a batch of length {len(result.batch)} for an input of length "
                         f"{len(batch)}; a {task.role} node returns one row per row of its input (rollout and "
                         "filter nodes drop episodes and groups)")
    return result


ROW_KEEPING_ROLES = ("reward", "advantage", "reference", "critic")
"""Roles whose nodes (but model updates) return a row for each row of their input: a reward node
returning fewer rows trained the next nodes on them, silently."""


def metric_problem(value) -> str | None:
    """Why a node's metric ``value`` is not a scalar :func:`~vla_rl.workers.metrics.as_metric`
    takes (None: it is one: a :class:`Metric`, a real number, a one-element tensor or array)."""
    if isinstance(value, (Metric, numbers.Real)):
        return None
    if isinstance(value, (torch.Tensor, np.ndarray)):
        numeric = not value.dtype.is_complex if isinstance(value, torch.Tensor) else (
            np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_) and value.dtype.kind != "c"
        if not numeric:
            return f"a {type(value).__name__} of dtype {value.dtype}, not a real number"
        if value.size != 1 if isinstance(value, np.ndarray) else value.numel() != 1:
            return f"a {type(value).__name__} of shape {tuple(value.shape)}, not a scalar"
        return None
    return f"a {type(value).__name__}, not a number"


def check_declared_writes(task: RunNode, output: TensorDictBase | None) -> None:
    """Check that a node's output holds the keys its function declares it writes (the planner
    trusts them along the edges): a plug-in that declares a key it never writes stopped the run
    in the next node, with a KeyError that named neither.

    Raises:
        RunStopped: naming the node, its function and the missing keys.
    """
    if not task.writes:
        return
    if output is None:  # its dependents would fail on it, naming themselves
        raise RunStopped(f"node {task.node_id!r} (function {task.fn!r} of ({task.role}, {task.type})) declares it "
                         f"writes {sorted(task.writes)} and returned no batch (NodeOutput(None, ...)): return the "
                         "batch with them (an empty TensorDict for no rows), or declare no writes")
    if len(output) == 0:  # no rows to write
        return
    present = output.keys(include_nested=True)
    missing = sorted(key for key in task.writes if key not in present)
    if missing:
        raise RunStopped(f"node {task.node_id!r} (function {task.fn!r} of ({task.role}, {task.type})) declares it "
                         f"writes {missing}, which its output lacks: write them, or declare only what it writes "
                         "(register_node(writes=...))")
