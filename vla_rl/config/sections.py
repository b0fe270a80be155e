"""The small sections of the run config: where a run writes and how it is seeded (``run``), the
DAG workers (``workers``), the initial states and group size (``data``) and evaluation (``eval``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from simulators.base import MAX_IMAGE_SIZE
from vla_rl.config.base import _Section

#: torch.distributed backends a worker group may be created with.
_COLLECTIVE_BACKENDS = ("gloo", "nccl", "hccl", "mpi", "ucc")


#: The largest ``run.seed`` (numpy's legacy seed range): the workers' derived seeds
#: (``seed * 1_000_003 + rank``) stay inside torch's 64-bit generator seeds (a larger one planned
#: and failed in every worker, "Overflow when unpacking long long"); the vLLM engine takes its
#: derived seed modulo 2**32 (``vla_rl.rollout.vllm_backend``).
MAX_SEED = 2**32 - 1


class RunSection(_Section):
    """Where a run writes and how it is seeded."""

    output_dir: str = Field("outputs", description="Parent directory of run directories.")
    name: str | None = Field(None, description="Run directory name, one directory under output_dir; default: "
                             "<template>_<timestamp>.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Global seed; each worker derives its own from it.")
    imports: list[str] = Field(
        default_factory=list,
        description="Python modules imported before the template is validated, on the driver and on every worker: "
        "they register components of your own (advantage estimators, policy losses, rewards, trajectory encoders, "
        "nodes, resources; docs/extending.md). Each must be importable there (installed, or on PYTHONPATH).",
    )
    workflow: Literal["embodied", "text"] = Field(
        "embodied",
        description="'embodied': a robot policy in simulator pools (sections simulator, data, policy, "
        "warm_start); 'text': a causal LM on prompts (section text). Picks the model each worker builds "
        "and how the actor scores a batch; the template's nodes pick the node functions (fn: text).",
    )


    @field_validator("name")
    @classmethod
    def _one_directory(cls, name: str | None) -> str | None:
        """``../x`` made the run beside output_dir, ``a/b`` failed at mkdir, ``""`` named output_dir."""
        if name is not None and (name in ("", ".", "..") or "/" in name or "\0" in name):
            raise ValueError(f"{name!r} is not one directory name under run.output_dir (no '/', not '', '.' or '..')")
        return name


MAX_WORKERS = 4096
"""The most DAG workers a run plans for: planning 8,192 took 31 s and 1.5 GB on the 2-core machine
(each rank's task chain and the re-shard estimate), and 10**30 never ended."""


class WorkersSection(_Section):
    """The DAG workers: one Ray actor per device slot."""

    num_workers: int = Field(2, ge=1, le=MAX_WORKERS, description="World size: number of DAG workers (at most 4096).")
    device: Literal["cpu", "cuda", "npu", "auto"] = Field(
        "cpu", description="Device kind of each worker; 'auto': the accelerator present (CUDA, then Ascend NPU), "
        "else the CPU.")
    num_cpus_per_worker: float = Field(1.0, gt=0, description="Ray CPU resource per DAG worker.")
    gpus_per_worker: float = Field(
        1.0, gt=0, le=1, description="Accelerator share of each worker (CUDA GPUs, Ascend NPUs); below 1 lets workers "
        "share one (tests on a single GPU).")
    collective_backend: str | None = Field(
        None, description="torch.distributed backend of the workers' process group; null: gloo on the CPU, "
        "'cpu:gloo,cuda:nccl' on CUDA, 'cpu:gloo,npu:hccl' on Ascend. 'gloo' lets several workers share one GPU "
        "(NCCL refuses two ranks on one device): with gpus_per_worker below 1.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement-group strategy of the workers' bundles: PACK fills a node first, SPREAD "
        "puts the workers on as many nodes as it can.")
    placement_timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for the cluster to place the workers.")
    ray_address: str | None = Field(
        None, description="Address of an existing Ray cluster to join ('auto', 'host:6379', 'ray://...'); null: the "
        "RAY_ADDRESS environment variable if set, else a local Ray on 127.0.0.1 (docs/cluster.md).")
    torch_threads: int = Field(1, ge=1, le=1024, description="torch intra-op threads in each worker.")

    def accelerator_sharing_problem(self, device: str, world_size: int) -> str | None:
        """Why ``world_size`` workers on ``device`` cannot run: ``gpus_per_worker`` below 1 puts
        several ranks on one accelerator, which its own backend (NCCL, HCCL) refuses; None when
        they can."""
        backend = self.tensor_backend(device) or ""
        if device not in ("cuda", "npu") or world_size < 2 or self.gpus_per_worker >= 1 or backend not in (
                "nccl", "hccl"):
            return None
        return (f"workers.gpus_per_worker={self.gpus_per_worker} lets {world_size} workers share an accelerator, "
                f"which {backend} refuses (two ranks on one device); set workers.collective_backend=gloo to share "
                "one, or give each worker a whole accelerator")

    def tensor_backend(self, device: str) -> str | None:
        """The backend the workers' collectives use on ``device`` tensors (``cpu``, ``cuda``,
        ``npu``): ``collective_backend``'s entry for that device, a plain backend (``gloo``) for
        every device, and when ``collective_backend`` is null the default's (``nccl`` on CUDA,
        ``hccl`` on Ascend, ``gloo`` on the CPU); None where it names none for the device."""
        if self.collective_backend is None:
            return {"cuda": "nccl", "npu": "hccl"}.get(device, "gloo")
        entries = dict(part.rpartition(":")[::2] for part in self.collective_backend.split(","))
        return entries.get(device, entries.get(""))

    @field_validator("collective_backend")
    @classmethod
    def _known_backend(cls, value: str | None) -> str | None:
        """'gloo', or per-device 'cpu:gloo,cuda:nccl' (torch.distributed's syntax); CPU tensors must
        have gloo: the engine's own collectives (advantages, group filters, evaluation, re-shards)
        exchange CPU tensors, which NCCL and HCCL refuse."""
        if value is None:
            return value
        backends: dict[str, str] = {}
        for part in value.split(","):
            device, _, backend = part.rpartition(":")
            if backend not in _COLLECTIVE_BACKENDS or device not in ("", "cpu", "cuda", "npu"):
                raise ValueError(f"{value!r} is not a torch.distributed backend: use one of "
                                 f"{sorted(_COLLECTIVE_BACKENDS)}, or device:backend pairs such as 'cpu:gloo,cuda:nccl'")
            backends[device or "cpu"] = backend
        if backends.get("cpu") != "gloo":
            raise ValueError(f"{value!r} leaves CPU tensors without gloo, and the engine's collectives (advantages, group "
                             "filters, evaluation, re-shards) exchange CPU tensors: use 'cpu:gloo,cuda:nccl' (the default "
                             "on CUDA), 'cpu:gloo,npu:hccl' (Ascend) or 'gloo'")
        return value
    max_restarts: int = Field(
        1, ge=0, description="Times a run restarts its workers after one died (killed, out of memory, crashed): "
        "a fresh group resumes from the last checkpoint that verifies. 0: the run ends at the first death, "
        "with the command that resumes it.",
    )


class DataSection(_Section):
    """The task list (initial-state ids, sharded across workers) and the group size of both workflows."""

    num_train_init_states: int = Field(
        100_000, ge=1, description="Training initial states are ids 0..N-1 (each id seeds a reset)."
    )
    init_states_per_step: int = Field(8, ge=1, description="Groups per step (global, all workers).")
    group_size: int = Field(
        8, ge=1, description="Rollouts per group: episodes per initial state, or responses per prompt (text).")


class EvalSection(_Section):
    """Evaluation on held-out initial states: before and after training, and by ``vla-rl eval``
    (the ``eval_rollout`` template; docs/evaluation.md)."""

    num_episodes: int = Field(50, ge=0, description="Episodes per protocol and task (0: no evaluation).")
    every_steps: int | None = Field(
        None, ge=1, description="Training runs: also evaluate after every k-th step, so the plot shows a "
        "held-out curve (null: only before and after training)."
    )
    protocols: list[Literal["greedy", "sampled"]] = Field(
        default_factory=lambda: ["greedy", "sampled"], min_length=1,
        description="Action protocols evaluated, each once (no evaluation: num_episodes=0)."
    )
    @field_validator("protocols")
    @classmethod
    def _each_protocol_once(cls, protocols: list[str]) -> list[str]:
        if len(set(protocols)) < len(protocols):
            raise ValueError(f"{protocols}: a protocol listed twice (each is evaluated once)")
        return protocols

    temperature: float = Field(
        1.0, gt=0, description="Temperature of the 'sampled' protocol (MLP policy: scales the Gaussian's std)."
    )
    benchmark: str | None = Field(
        None, description="vla-rl eval: registered benchmark (task list); null: the run's own simulator only."
    )
    tasks: list[str] | None = Field(None, description="vla-rl eval: the benchmark's tasks to run (null: all).")
    checkpoints: list[str] = Field(
        default_factory=list, description="vla-rl eval: checkpoint directories (filled in by the command); empty: "
        "the live policy of a training run."
    )
    store_episodes: bool = Field(
        False, description="Append every evaluation episode to zarr stores (vla-rl eval: on, which lets an "
        "interrupted evaluation continue and its videos replay stored episodes); off in training runs."
    )
    init_state_offset: int = Field(
        1_000_000_000, ge=0, description="Evaluation initial-state ids start here (never trained on)."
    )
    video_episodes: int = Field(
        3, ge=0, description="Episodes recorded to the evaluation video (vla-rl eval: successes and as many "
        "failures per task and protocol of the last checkpoint)."
    )
    video_camera: str = Field("agentview", description="Simulator camera the videos are rendered from.")
    video_size: int = Field(128, ge=16, le=MAX_IMAGE_SIZE, description="Video frame height and width in pixels.")
    video_fps: int = Field(20, ge=1, description="Video frame rate in Hz; unset (not given, or deleted with "
                           "~eval.video_fps; null is no rate): the simulator's control frequency (one frame per "
                           "control step, real time), this default where the simulator states none.")
