"""The Ray driver of a training run: plans, launches, watches and logs — never holds batch data.

It starts Ray on loopback, creates one :class:`~vla_rl.workers.dag_worker.DAGWorker` actor per
device slot, lets them form their process group, then asks every worker to run each step and
receives back only scalar metrics (checked by :class:`WorkerGroup`). Workers write checkpoints,
demonstrations and videos; the driver writes the run's config, metrics, plot and summary.
"""

from __future__ import annotations

import json
import pickle
import time
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import yaml

from vla_rl.config_checks import check_component_names, check_required_nodes, check_rollout_backend
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan
from vla_rl.utils.ray_utils import init_ray

RESOLVED_TEMPLATE = "template.yaml"


class PendingCall(NamedTuple):
    """A worker method started on every worker: its name and the replies' object references."""

    method: str
    refs: list


class WorkerGroup:
    """The DAG worker actors, called together.

    Every reply must be a flat dict of scalar metrics (names to int/float); anything else —
    tensors, arrays, nested objects — is refused, so no batch data or weights reach the driver.
    ``max_reply_bytes`` records the largest pickled reply seen.
    """

    def __init__(self, actors: list) -> None:
        self.actors = actors
        self.max_reply_bytes = 0

    @classmethod
    def launch(cls, world_size: int, template: str, overrides: list[str], run_dir: Path, num_cpus: float) -> WorkerGroup:
        """Start one :class:`~vla_rl.workers.dag_worker.DAGWorker` actor per rank."""
        import ray

        from vla_rl.workers.dag_worker import DAGWorker

        actor_cls = ray.remote(num_cpus=num_cpus, max_restarts=0)(DAGWorker)
        return cls([actor_cls.remote(rank, world_size, template, overrides, str(run_dir)) for rank in range(world_size)])

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
        may be blocked in a collective waiting for the failed one).
        """
        import ray

        method, refs = call
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
        replies = ray.get(refs)
        for reply in replies:
            if reply is None:
                continue
            if not isinstance(reply, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) for k, v in reply.items()
            ):
                raise TypeError(f"worker method {method!r} returned {type(reply).__name__}, not scalar metrics")
            self.max_reply_bytes = max(self.max_reply_bytes, len(pickle.dumps(reply)))
        return replies

    def start_process_group(self) -> None:
        import ray

        port = ray.get(self.actors[0].host_rendezvous.remote())
        self.call("init_process_group", port)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Let the workers stop their simulators and leave the process group, then kill them."""
        import ray

        try:
            ray.wait([actor.shutdown.remote() for actor in self.actors], num_returns=len(self.actors),
                     timeout=timeout_s)
        finally:
            for actor in self.actors:
                ray.kill(actor)


def prepare_run_dir(template_arg: str, overrides: list[str], resume: str | None) -> tuple[Path, object]:
    """Create (or reopen, on resume) the run directory and write the resolved template there.

    On resume the run's own resolved template is reloaded and ``overrides`` are applied on top
    (e.g. ``trainer.total_steps=40`` to train longer).

    Returns:
        (run directory, loaded template).
    """
    if resume:
        run_dir = Path(resume)
        template = load_template(run_dir / RESOLVED_TEMPLATE, overrides)
    else:
        template = load_template(template_arg, overrides)
    check_component_names(template.config, template.path)
    check_required_nodes(template.config, {node.role for node in template.nodes}, template.path)
    check_rollout_backend(template.config, template.nodes, template.path)
    plan(template)  # reject a bad graph before anything is written
    if not resume:
        name = template.config.run.name or f"{template.name}_{datetime.now():%Y%m%d_%H%M%S}"
        run_dir = Path(template.config.run.output_dir) / name
        run_dir.mkdir(parents=True, exist_ok=True)
    resolved = dict(template.raw)
    resolved.pop("extends", None)
    tmp = run_dir / (RESOLVED_TEMPLATE + ".tmp")
    tmp.write_text(yaml.safe_dump(resolved, sort_keys=False))
    tmp.replace(run_dir / RESOLVED_TEMPLATE)
    return run_dir, template


def train(template_arg: str, overrides: list[str], resume: str | None = None, console=None) -> dict:
    """Run a training workflow end to end.

    Args:
        template_arg: template name or path (ignored when resuming).
        overrides: dotted overrides.
        resume: a run directory to continue from its last complete checkpoint.
        console: a ``rich.console.Console`` for progress and the summary.

    Returns:
        The run summary (also written to ``<run_dir>/summary.json``).
    """
    from rich.console import Console

    from vla_rl.run_loop import RunLoop

    console = console or Console()
    run_dir, template = prepare_run_dir(template_arg, overrides, resume)
    config = template.config
    the_plan = plan(template)
    world = the_plan.world_size
    sim = config.simulator
    init_ray(num_cpus=world * (config.workers.num_cpus_per_worker + sim.actors_per_worker * sim.num_cpus_per_actor) + 1)
    console.print(f"[bold]run directory[/bold] {run_dir}")
    started = time.perf_counter()
    workers = WorkerGroup.launch(world, str(run_dir / RESOLVED_TEMPLATE), [], run_dir, config.workers.num_cpus_per_worker)
    try:
        workers.start_process_group()
        summary = RunLoop(workers, template, run_dir, console).run(resume=resume is not None)
    finally:
        workers.shutdown()
    summary["wall_time_s"] = time.perf_counter() - started
    summary["driver_max_reply_bytes"] = workers.max_reply_bytes
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    tmp.replace(run_dir / "summary.json")
    return summary
