"""The DAG worker actors seen from the driver: launched together, called together, replies checked.

Both entry points that run a template on the workers — training (:mod:`vla_rl.driver`) and
``vla-rl eval`` (:mod:`vla_rl.eval_driver`) — start Ray with :func:`start_ray` and the
workers with :meth:`WorkerGroup.launch`, then call worker methods on all of them at once.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

from vla_rl.errors import RunStopped, file_system_error, out_of_memory_message
from vla_rl.utils.ray_utils import init_ray
from vla_rl.utils.signals import raise_if_terminated
from vla_rl_core.auth import REMOTE_TOKEN_ENV
from vla_rl_core.components import ComponentConfigError

DEATH_GRACE_S = 5.0
"""When a worker raises, how long :meth:`WorkerGroup.collect` waits for the others' replies to
learn whether one of them died: a worker whose peer dies fails in its next collective (gloo:
connection closed) and that error may reach the driver before Ray reports the death."""
TERMINATED_CHECK_S = 1.0
"""How often the driver, waiting for its workers' replies, checks for a SIGTERM whose exception was
swallowed (:func:`~vla_rl.utils.signals.raise_if_terminated`)."""
KILL_TIMEOUT_S = 10.0
"""How long :meth:`WorkerGroup.kill` waits for Ray to kill the workers before it gives up."""
KILL_POLL_S = 0.2
"""How often :meth:`WorkerGroup.kill`, waiting, checks whether the local Ray instance has died."""

logger = logging.getLogger(__name__)


class WorkerDiedError(RuntimeError):
    """A DAG worker actor's process ended (killed, out of memory, crashed) during a call.

    Not raised for an actor whose constructor raised (that error is re-raised as it is).

    Attributes:
        rank: the dead worker's rank.
        method: the worker method it was running.
        reason: Ray's account of the death, in one line.
    """

    def __init__(self, rank: int, method: str, reason: str) -> None:
        super().__init__(f"DAG worker rank {rank} died during {method!r}: {reason}")
        self.rank, self.method, self.reason = rank, method, reason

    def __reduce__(self):
        return type(self), (self.rank, self.method, self.reason)


def start_ray(config, world_size: int, pools_per_worker: int = 1) -> str:
    """Start Ray — on loopback with the CPU resources a run reserves, or joined to the cluster of
    ``workers.ray_address`` / ``RAY_ADDRESS`` — and return the run's device kind
    (``workers.device``, with ``auto`` resolved from the cluster's resources).

    The local instance reserves, per worker, its own CPUs (``workers.num_cpus_per_worker``) and its
    simulator actors' (``pools_per_worker`` pools of ``simulator.actors_per_worker`` actors of
    ``simulator.num_cpus_per_actor``), plus one for the driver (rounded up to a whole number by
    :func:`~vla_rl.utils.ray_utils.init_ray`). Either is checked first
    (:func:`~vla_rl.workers.placement.check_cluster_fits`): one that can never hold the run (a
    local instance without the GPUs ``workers.device=cuda`` asks for) is refused; a joined cluster
    whose resources other jobs hold is waited for, which stderr says.

    Raises:
        RunStopped: the working directory holds another copy of the project's code, which the
            workers would import (:func:`~vla_rl.utils.code_location.check_launch_directory`);
            the cluster refused to be joined (address, authentication token).
        ClusterTooSmall: the cluster joined, or the local instance, cannot hold the run (one line
            naming what is missing).
    """
    import ray

    from vla_rl.utils.code_location import check_launch_directory
    from vla_rl.utils.ray_utils import cluster_address
    from vla_rl.workers.placement import (
        busy_note,
        check_cluster_fits,
        resolve_device,
        run_footprint,
    )

    check_launch_directory()
    sim = config.simulator
    per_worker = config.workers.num_cpus_per_worker + pools_per_worker * sim.actors_per_worker * sim.num_cpus_per_actor
    address = cluster_address(config.workers.ray_address)
    init_ray(num_cpus=world_size * per_worker + 1, address=address)
    device = resolve_device(config.workers.device, ray.cluster_resources())
    footprint = run_footprint(config, world_size, device, pools_per_worker)
    check_cluster_fits(footprint, [node["Resources"] for node in ray.nodes() if node.get("Alive")], address,
                       config.workers.placement_strategy, auto=config.workers.device == "auto")
    if address is not None:
        note = busy_note(footprint, ray.available_resources(), address)
        if note:
            print(note, file=sys.stderr, flush=True)
    return device


class PendingCall(NamedTuple):
    """A worker method started on every worker: its name and the replies' object references."""

    method: str
    refs: list


class WorkerGroup:
    """The DAG worker actors, called together.

    Every reply must be a flat dict of scalar metrics (names to int/float); anything else —
    tensors, arrays, nested objects — is refused, so no batch data or weights reach the driver.
    ``max_reply_bytes`` records the largest pickled reply seen, ``last_reply_bytes`` the pickled
    size of the last :meth:`collect`'s replies together (what the driver received for it).
    """

    def __init__(self, actors: list, placement_group=None) -> None:
        self.actors = actors
        self.placement_group = placement_group
        self.max_reply_bytes = 0
        self.last_reply_bytes = 0

    @classmethod
    def launch(cls, world_size: int, template: str, overrides: list[str], run_dir: Path, workers,
               device: str, simulator_cpus: float = 0.0) -> WorkerGroup:
        """Start one :class:`~vla_rl.workers.dag_worker.DAGWorker` actor per rank, each in its
        placement-group bundle with its CPUs and accelerator share (:mod:`vla_rl.workers.placement`).

        Args:
            world_size: the number of workers.
            template, overrides: the template file the workers load, and the overrides they apply.
            run_dir: the run (or evaluation) directory.
            workers: the run's ``workers`` section.
            device: the run's device kind (resolved: ``cpu``, ``cuda`` or ``npu``); the workers
                get it as the override ``workers.device``.
            simulator_cpus: the CPUs of each worker's simulator actors, which must fit on its node
                (:func:`~vla_rl.workers.placement.simulator_cpus_per_worker`; 0: not checked).

        Raises:
            ValueError: workers would share an accelerator under NCCL/HCCL
                (:func:`~vla_rl.workers.placement.check_accelerator_sharing`).
            RuntimeError: Ray cannot place the workers in time.
            ClusterTooSmall: a node got workers it has no CPUs for the simulator actors of.
        """
        import ray

        from vla_rl.utils.code_location import code_root
        from vla_rl.workers.dag_worker import DAGWorker
        from vla_rl.workers.placement import (
            check_accelerator_sharing,
            worker_actor_options,
        )

        check_accelerator_sharing(workers, device, world_size)
        overrides = [*overrides, f"workers.device={device}"]
        group, options = worker_actor_options(workers, device, world_size, simulator_cpus)
        actor_cls = ray.remote(max_restarts=0)(DAGWorker)
        driver_env = {REMOTE_TOKEN_ENV: os.environ.get(REMOTE_TOKEN_ENV, "")}  # passed in memory, never written
        return cls([actor_cls.options(**options[rank]).remote(rank, world_size, template, overrides, str(run_dir),
                                                              str(code_root()), driver_env)
                    for rank in range(world_size)], group)

    def node_ids(self) -> list[str]:
        """The Ray node of each rank's worker (the first call on the workers: a worker whose
        constructor stopped the run raises its :class:`~vla_rl.errors.RunStopped` here)."""
        return _get_replies([actor.node_id.remote() for actor in self.actors])

    def hosts(self) -> list[dict[str, object]]:
        """The machine of each rank's worker (:func:`vla_rl.utils.host.host_record`)."""
        return _get_replies([actor.host.remote() for actor in self.actors])

    def rendering(self) -> list[list[dict]]:
        """How each rank's simulator actors render (:meth:`DAGWorker.rendering
        <vla_rl.workers.dag_worker.DAGWorker.rendering>`): a few short strings per actor."""
        return _get_replies([actor.rendering.remote() for actor in self.actors])

    def call(self, method: str, *args) -> list[dict[str, float]]:
        """Call ``method(*args)`` on every worker at once and return their scalar replies
        (:meth:`submit`, then :meth:`collect`)."""
        return self.collect(self.submit(method, *args))

    def submit(self, method: str, *args) -> PendingCall:
        """Start ``method(*args)`` on every worker; :meth:`collect` waits for the replies."""
        return PendingCall(method, [getattr(actor, method).remote(*args) for actor in self.actors])

    def collect(self, call: PendingCall) -> list[dict[str, float]]:
        """Wait for the replies of a :meth:`submit` and check them.

        Fails fast: the first worker error is raised as soon as it happens (the other workers
        may be blocked in a collective waiting for the failed one); a worker's
        :class:`~vla_rl.errors.RunStopped` is re-raised as is, without the Ray traceback, and a
        :class:`~vla_rl_core.components.ComponentConfigError` (a setting the worker or its
        simulators found wrong, e.g. a robosuite observation key on a cluster, whose driver does
        not check it) as a ``RunStopped`` naming the worker and the field.

        Raises:
            Terminated: a SIGTERM came within the command and its exception was swallowed
                (:func:`~vla_rl.utils.signals.raise_if_terminated`), checked every
                :data:`TERMINATED_CHECK_S`.
            WorkerDiedError: a worker's process died; also when another worker's error came
                first but a worker turns out dead within :data:`DEATH_GRACE_S` (its peers fail
                in their collectives with it).
        """
        import ray

        method, refs = call
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=TERMINATED_CHECK_S)
            raise_if_terminated()  # a SIGTERM whose exception was swallowed before this wait
            if not done:
                continue
            try:
                ray.get(done)
            except ray.exceptions.RayActorError as error:
                if error.actor_init_failed:  # its constructor raised: not a death to restart from
                    raise _constructor_stop(error) or error from None
                raise WorkerDiedError(refs.index(done[0]), method, _death_reason(error)) from error
            except ray.exceptions.RayTaskError as error:
                died = _death_among(refs, pending, method)
                if died is not None:
                    raise died from error
                if isinstance(error.cause, RunStopped):  # a message for the user, not a traceback
                    raise error.cause from None
                if isinstance(error.cause, ComponentConfigError):  # a setting only a worker could check
                    raise RunStopped(f"worker {refs.index(done[0])}: {error.cause.field}: "
                                     f"{error.cause.message}") from None
                if (memory := out_of_memory_message(error.cause)) is not None:
                    raise RunStopped(_out_of_memory(refs.index(done[0]), method, error.cause, memory)) from None
                if (refused := file_system_error(error.cause)) is not None:
                    raise RunStopped(_refused_write(refs.index(done[0]), method, error.cause, refused)) from None
                if getattr(error.cause, "__notes__", None):  # in the worker's traceback above them
                    error.__notes__ = []  # (Ray's error class hands the cause's notes on: shown twice)
                raise
        replies = ray.get(refs)
        received = 0
        for reply in replies:
            size = len(pickle.dumps(reply))
            received += size
            if reply is None:
                continue
            if not isinstance(reply, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) for k, v in reply.items()
            ):
                raise TypeError(f"worker method {method!r} returned {type(reply).__name__}, not scalar metrics")
            self.max_reply_bytes = max(self.max_reply_bytes, size)
        self.last_reply_bytes = received
        return replies

    def start_process_group(self) -> None:
        import ray

        host, port = ray.get(self.actors[0].host_rendezvous.remote())
        self.call("init_process_group", host, port)

    def kill(self, timeout_s: float = KILL_TIMEOUT_S) -> bool:
        """Kill every worker at once (after one died: the others may be blocked in a collective
        with it, or Ctrl-C/SIGTERM). Their simulator actors, which they own, die with them.

        A signal sent to the whole process group (GNU ``timeout``, Slurm, systemd) also ends the
        local Ray instance's processes, and a Ray call then waits for them (a minute, after which
        Ray ended the process with status 1): nothing is killed once they are dead
        (:func:`~vla_rl.utils.ray_utils.local_ray_lost`), and the calls are given up when they die
        meanwhile, or after ``timeout_s``.

        Returns:
            Whether the workers and their placement group were released.
        """
        import ray

        from vla_rl.utils.ray_utils import local_ray_lost

        if local_ray_lost():
            return False
        released = threading.Event()

        def release() -> None:
            try:
                for actor in self.actors:
                    ray.kill(actor)
                if self.placement_group is not None:
                    ray.util.remove_placement_group(self.placement_group)
                released.set()
            except Exception as err:  # Ray itself going down: nothing left to release
                logger.debug("killing the workers: %s", err)

        killer = threading.Thread(target=release, name="kill-workers", daemon=True)
        killer.start()
        deadline = time.monotonic() + timeout_s
        while killer.is_alive() and time.monotonic() < deadline and not local_ray_lost():
            killer.join(KILL_POLL_S)  # Ray's processes may die meanwhile: nothing to wait for then
        return released.is_set()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Let the workers stop their simulators and leave the process group, then kill them and
        release their placement group."""
        import ray

        try:
            ray.wait([actor.shutdown.remote() for actor in self.actors], num_returns=len(self.actors),
                     timeout=timeout_s)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            if self.placement_group is not None:
                ray.util.remove_placement_group(self.placement_group)


def _get_replies(refs: list) -> list:
    """``ray.get(refs)``, a worker constructor's :class:`~vla_rl.errors.RunStopped` re-raised as
    one (:func:`_constructor_stop`)."""
    import ray

    try:
        return ray.get(refs)
    except ray.exceptions.RayActorError as error:
        if error.actor_init_failed:
            raise _constructor_stop(error) or error from None
        raise


def _where(method: str, cause: BaseException) -> str:
    """``in node 'rollout' (run_step)``: where a worker's error was raised (its node named when it
    was raised in one: :func:`~vla_rl.workers.dag_worker.run_node_function`'s note), else ``in its
    run_step call``."""
    node = next((match.group(1) for note in getattr(cause, "__notes__", None) or ()
                 if (match := re.match(r"raised in node ('[^']*')", note))), None)
    return f"in node {node} ({method})" if node else f"in its {method} call"


def _refused_write(rank: int, method: str, cause: BaseException, reason: str) -> str:
    """The one-line message of worker ``rank``'s write that the file system refused (a full disk,
    a read-only mount: :func:`~vla_rl.errors.file_system_error`'s ``reason``), naming the file."""
    file = getattr(cause, "filename", None)
    return (f"worker {rank}: the file system refused a write {_where(method, cause)}: {reason}"
            + (f" ({file})" if file else "") + ". Free space or fix the file system, then run the command again "
            "(a training run: vla-rl train --resume RUN_DIR continues from its last checkpoint)")


def _out_of_memory(rank: int, method: str, cause: BaseException, memory: str) -> str:
    """The one-line message of worker ``rank`` running out of memory in its ``method`` call,
    ``memory`` being :func:`~vla_rl.errors.out_of_memory_message`'s line."""
    where = _where(method, cause)
    return (f"worker {rank} ran out of memory {where}: {memory.rstrip('.')}. The run's sizes do not fit its device: "
            "lower the one behind this allocation (batch, group and chunk sizes, prompt and response lengths, "
            "image and video sizes, the policy's size; `vla-rl plan` prints what each step moves), or give the "
            "run more devices")


def _constructor_stop(error) -> RunStopped | None:
    """The :class:`~vla_rl.errors.RunStopped` a worker's constructor raised (the code-location
    check: a worker importing another copy of the project), or None. Ray keeps only the text of a
    constructor's exception (``ActorDiedError`` has no ``cause``): its last line, ``<module>.<class>:
    <message>``, of a RunStopped class."""
    names = set()
    pending = [RunStopped]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    last = next((line.strip() for line in reversed(str(error).splitlines()) if line.strip()), "")
    match = re.match(r"([\w.]+): (.+)$", last)
    if match is None or match.group(1).rpartition(".")[2] not in names:
        return None
    return RunStopped(match.group(2))


def _death_among(refs: list, pending: list, method: str) -> WorkerDiedError | None:
    """Wait up to :data:`DEATH_GRACE_S` for the ``pending`` replies; the first worker found dead."""
    import ray

    deadline = time.monotonic() + DEATH_GRACE_S
    while pending and (left := deadline - time.monotonic()) > 0:
        done, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as error:
                if not error.actor_init_failed:
                    return WorkerDiedError(refs.index(ref), method, _death_reason(error))
            except ray.exceptions.RayError:
                continue
    return None


def _death_reason(error) -> str:
    """Ray's account of an actor's death in one line: its pid and the cause."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    pid = re.search(r"pid: (\d+)", str(error))
    cause = lines[-1] if lines else type(error).__name__
    return f"pid {pid.group(1)}, {cause}" if pid else cause


def run_evaluation(workers: WorkerGroup, step: int, tag: str, video: bool, progress=None) -> dict[str, float]:
    """Run the ``evaluate`` phase on every worker until no episode remains.

    Args:
        workers: the started worker group.
        step: the updates done (the live policy's training step).
        tag: the evaluation's name (``warm_start``, ``step_10``, ``final``, ``eval``).
        video: whether the evaluation records videos.
        progress: called with each pass's metrics (e.g. to advance a progress bar), or None.

    Returns:
        The evaluation's figures (the last pass's: ``eval/{protocol}/success_rate`` ...), with the
        figures each pass reports of its own episodes made the whole evaluation's
        (:class:`EvaluationTotals`: the last pass's alone were reported as the evaluation's).
    """
    totals = EvaluationTotals()
    while True:
        metrics = workers.call("run_phase", "evaluate", step, tag, video)[0]
        totals.add(metrics)
        if progress is not None:
            progress(metrics)
        if metrics["eval/remaining"] == 0:
            return totals.of(metrics)


class EvaluationTotals:
    """The figures an evaluation's passes each report of their own episodes, over all its passes:
    ``eval/recorded`` and ``eval/recorded_successes`` summed, ``eval/episode_length`` and
    ``eval/env_steps_per_episode`` averaged over the episodes (each pass's weighted by its
    ``eval/recorded``), ``timing/*`` summed."""

    SUMMED = ("eval/recorded", "eval/recorded_successes")
    AVERAGED = ("eval/episode_length", "eval/env_steps_per_episode")

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        """Count one pass's metrics."""
        episodes = metrics.get("eval/recorded", 0.0)
        for name, value in metrics.items():
            if name in self.AVERAGED:
                self.sums[name] = self.sums.get(name, 0.0) + value * episodes
                self.weights[name] = self.weights.get(name, 0.0) + episodes
            elif name in self.SUMMED or name.startswith("timing/"):
                self.sums[name] = self.sums.get(name, 0.0) + value

    def of(self, last: dict[str, float]) -> dict[str, float]:
        """``last`` (the last pass's metrics) with the totals of every pass counted."""
        totals = {name: total / self.weights[name] if name in self.weights else total
                  for name, total in self.sums.items() if self.weights.get(name, 1.0) > 0}
        return {**last, **totals}
