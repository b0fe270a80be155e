"""Is this GPU node ready for vla-rl? Runs each part below in its own process group with its own
timeout (a hang costs that part only), then prints a pass/fail table and writes one JSON report.
When a part times out, its group gets SIGTERM, then SIGKILL after 15 s (:func:`end_group`;
what a part that ended leaves behind, after 5 s); stopped itself (SIGTERM, SIGHUP, Ctrl-C), the
check ends its running parts' groups and writes the report with them (``stopped_while_running``).
A training part passes when its metrics show the update it should have made, a benchmark when
its JSON measured every part (the benchmarks record an out-of-memory part and exit 0).
``--deadline`` counts from the start and keeps the 15 s grace in hand.

    bash scripts/gpu_check.sh                       # every part, report in outputs/gpu_check/
    bash scripts/gpu_check.sh --parts egl suite     # some parts
    bash scripts/gpu_check.sh --out /tmp/check      # report, logs and runs elsewhere

Parts, in the order they start (each has its own timeout; the whole check is sized to end within
8 minutes): ``suite`` runs beside all the others; ``env``, ``egl`` and the two timed benchmarks
run alone, one after another; then the training runs, ``--lanes`` at a time (:func:`run_parts`).

| part | what |
| --- | --- |
| ``env`` | torch, CUDA, the GPU's name and memory, TF32 flags, the machine's record (as runs write it) and where its host name resolves |
| ``egl`` | MuJoCo EGL rendering on the GPU (the GL renderer's name: the GPU's, not llvmpipe) and one robosuite Lift camera frame |
| ``suite`` | the suite's tests that run on the test device, end-to-end runs included (``-m 'not slow' --device-tests-only``; the others check the same on every device) with ``VLA_RL_TEST_DEVICE=cuda``, on pytest-xdist workers, the tests sharing a module's run on one worker, longest with shortest (:func:`xdist_options`) |
| ``pi0_full_size`` | ``benchmarks/pi0_full_size.py --device cuda`` (3.2 B π0, bf16) |
| ``oft_full_size`` | ``benchmarks/openvla_oft_full_size.py --device cuda`` (7.5 B OpenVLA-OFT LoRA update) |
| ``pi0_fsdp`` | tiny π0 SRPO, one step with FSDP and bf16 mixed precision, every group kept |
| ``embodied_srpo`` | ``vla-rl train embodied_srpo`` for 2 steps with ``workers.device=cuda`` |
| ``oft_backbone`` | tiny OpenVLA-OFT SRPO, one step with ``algorithm.trajectory_encoder=policy_backbone`` |
| ``llm_grpo`` | ``vla-rl train llm_grpo`` for 2 steps with ``workers.device=cuda`` |
| ``llm_ppo_fsdp`` | ``llm_ppo``, one step with FSDP, bf16 and micro-batches: the critic sharded too |

With one GPU the runs use one DAG worker (``workers.num_workers=1``); with more, two. Before the
parts, the check names the project's requirements this interpreter cannot import
(:func:`missing_requirements`, also ``missing_requirements`` in the report): the H200 image lacks
websockets and openpi-client, whose tests are then skipped (``scripts/gpu_kit_wheels.sh`` adds
their wheels to the offline kit), and import-linter (the import contracts' test is skipped).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_ENV_PY = r"""
import json, socket, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
assert info["available"], f"torch.cuda.is_available() is False: {info}"
from vla_rl.utils.device import bind_device
from vla_rl.utils.host import host_record
device = bind_device("cuda")  # as a DAG worker binds its GPU
p = torch.cuda.get_device_properties(0)
info.update(devices=torch.cuda.device_count(), name=p.name, memory_gib=round(p.total_memory / 2**30, 1),
            capability=f"{p.major}.{p.minor}", bf16=torch.cuda.is_bf16_supported(),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32, tf32_cudnn=torch.backends.cudnn.allow_tf32)
# where the host name resolves: gloo and NCCL listen there unless pinned to an interface (the
# engine's workers pin them to lo), so a suite failure of the loopback-listener test reads with it
try:
    resolves = sorted({address[4][0] for address in socket.getaddrinfo(socket.gethostname(), None)})
except OSError as error:
    resolves = f"does not resolve: {error}"
info.update(hostname=socket.gethostname(), hostname_resolves_to=resolves, host=host_record(device))
print(json.dumps(info))
assert info["tf32_matmul"] and info["tf32_cudnn"], "a DAG worker's GPU should have TF32 on"
"""

_EGL_PY = r"""
import json
from simulators.rendering import probe_backend, rendering_report
probe = probe_backend("egl", cuda=0)
print("probe", json.dumps(probe))
assert probe["ok"], probe["error"]
report = rendering_report()
print("rendering_report", json.dumps(report))
import robosuite
env = robosuite.make("Lift", robots="Panda", has_renderer=False, has_offscreen_renderer=True, use_camera_obs=True,
                     camera_names=["agentview"], camera_heights=128, camera_widths=128)
obs = env.reset()
image = obs["agentview_image"]
print("frame", image.shape, image.dtype, "mean", float(image.mean()))
assert image.shape == (128, 128, 3) and image.std() > 0, "blank frame"
renderer = probe["gl_renderer"] or ""
assert "llvmpipe" not in renderer.lower(), f"EGL rendered on the CPU ({renderer})"
"""


@dataclass
class Part:
    """One check: a command, its timeout, extra environment, and for a training run the run
    directory and the least value its metrics must reach (a step that updated nothing passes
    silently otherwise: every group filtered, say); for a benchmark its JSON ``report``, whose
    parts must all have been measured (a benchmark records a part that ran out of memory and
    exits 0). ``beside`` parts (the training runs) may run beside one another (``--lanes``); the
    others run alone, first."""

    name: str
    command: list[str]
    timeout_s: int
    env: dict[str, str] = field(default_factory=dict)
    run_dir: Path | None = None
    expect: dict[str, float] = field(default_factory=dict)
    beside: bool = False
    report: Path | None = None


#: An update ran and its gradient was not 0. The runs' rewards may all be 0 (a tiny warm start
#: seldom succeeds; the tiny LM answers no sum right), and with them the advantages: on one H200
#: (2026-12-04) four of the five runs updated with a gradient norm of exactly 0, so a backward
#: pass of zeros passed the check. Hence the entropy bonus and the format reward below.
UPDATED = {"actor/num_updates": 1.0, "actor/grad_norm": 1e-12}
#: ... and the trainer rescored the rollout's log-probs: DDP's bfloat16 autocast ran (``mixed_precision: auto``).
DDP_AUTOCAST = {**UPDATED, "actor/old_log_prob_max_diff": 0.0}


def _train(name: str, template: str, workers: list[str], runs: Path, overrides: list[str], timeout_s: int,
           expect: dict[str, float] = UPDATED) -> Part:
    run_dir = runs / name
    command = [sys.executable, "-m", "vla_rl.cli", "train", template, *workers, f"run.output_dir={run_dir}",
               "workers.device=cuda", *overrides]
    return Part(name, command, timeout_s, run_dir=run_dir, expect=dict(expect), beside=True)


def unmet_expectations(part: Part) -> list[str]:
    """What the part's run did not reach: each ``expect`` metric's largest value over the run's
    ``metrics.jsonl`` against its least allowed value."""
    files = sorted(part.run_dir.glob("*/metrics.jsonl")) if part.run_dir is not None else []
    if part.expect and not files:
        return [f"no metrics.jsonl under {part.run_dir}"]
    best: dict[str, float] = {}
    for line in (files[-1].read_text().splitlines() if files else []):
        for key, value in json.loads(line).items():
            if key in part.expect and isinstance(value, (int, float)):
                best[key] = max(best.get(key, value), value)
    return [f"{key}: {best.get(key)} (want >= {least})" for key, least in part.expect.items()
            if best.get(key, float("-inf")) < least]


def build_parts(out: Path, gpus: int, workers_xdist: int, native_bfloat16: bool = True) -> list[Part]:
    """The check's parts, in the order they run. Without ``native_bfloat16`` (a GPU before
    Ampere: ``trainer.mixed_precision: auto`` keeps float32 there) the DDP runs are expected to
    update without rescoring their old log-probs."""
    ddp_auto = DDP_AUTOCAST if native_bfloat16 else UPDATED
    runs = out / "runs"
    workers = ["workers.num_workers=1"] if gpus < 2 else ["workers.num_workers=2"]
    small_eval = ["eval.num_episodes=4", "eval.video_episodes=0"]
    # 2 initial states x 4 rollouts a step, every group kept (no success-rate band, no zero-variance
    # filter): the update runs whatever the rewards (checked in the run's metrics: actor/num_updates)
    small_step = ["data.init_states_per_step=2", "data.group_size=4", "algorithm.filter_groups.success_rate_band=null",
                  "algorithm.filter_groups.zero_variance=false"]
    camera_warm_start = ["warm_start.num_demos=2", "warm_start.bc_steps=5"]
    # a gradient whatever the rewards: the entropy bonus (a policy whose entropy its parameters set);
    # text: a reward for the answer's format, which the tiny LM meets in some responses only
    entropy = ["algorithm.entropy_coeff=0.01"]
    text_reward = ["text.format_score=0.1", *entropy]
    # -v: each test's result in the log as it ends, so that a suite cut by its timeout still says
    # which tests passed and failed (the JUnit XML is written only when pytest finishes)
    # -m 'not slow': the device's end-to-end runs too (the default run leaves out the e2e ones)
    # --continue-on-collection-errors: a test module this host cannot import (a package it lacks) is
    # reported as an error, and the other tests still run (pytest would otherwise run none of them)
    suite = [sys.executable, "-m", "pytest", "-v", "-rfE", "--timeout=300", "-m", "not slow", "--device-tests-only",
             "--continue-on-collection-errors", f"--junitxml={out / 'suite.xml'}", "tests"]
    if workers_xdist > 1:
        suite[3:3] = xdist_options(workers_xdist)
    return [
        Part("env", [sys.executable, "-c", _ENV_PY], 60),
        Part("egl", [sys.executable, "-c", _EGL_PY], 90),
        # beside the other parts: it may take the whole deadline without lengthening the check
        Part("suite", suite, 480, {"VLA_RL_TEST_DEVICE": "cuda"}),
        # the timed benchmarks alone, before the training runs share the GPU
        Part("pi0_full_size", [sys.executable, "benchmarks/pi0_full_size.py", "--device", "cuda",
                               "--out", str(out / "pi0_full_size.json")], 150, report=out / "pi0_full_size.json"),
        Part("oft_full_size", [sys.executable, "benchmarks/openvla_oft_full_size.py", "--device", "cuda",
                               "--warmup", "1", "--repeats", "2", "--out", str(out / "openvla_oft_full_size.json")],
             240, report=out / "openvla_oft_full_size.json"),
        # the training runs, --lanes at a time, the longest first (one H200, 2026-12-04, one at a
        # time beside the suite: 104, 93, 73 and 54 s; embodied_srpo alone: 94 s)
        # Flow-Noise: its learned noise head on the action expert's features sets the entropy,
        # so the bonus's gradient reaches the checkpointed FSDP blocks (Flow-SDE's fixed noise does not)
        _train("pi0_fsdp", "embodied_srpo_pi0_lift", workers, runs,
               ["trainer.total_steps=1", "trainer.strategy=fsdp", "trainer.mixed_precision=bf16",
                "trainer.gradient_checkpointing=true", "policy.config.sampler=flow_noise", *camera_warm_start,
                *small_step, *small_eval, *entropy], 180,
               # the bfloat16 copy rescored the float32 rollout's actions (the first ratio is 1)
               expect={**UPDATED, "actor/checkpointed_blocks": 1.0, "actor/old_log_prob_max_diff": 0.0}),
        _train("embodied_srpo", "embodied_srpo", workers, runs,
               ["trainer.total_steps=2", *small_step, *small_eval, *entropy], 180, expect=ddp_auto),
        _train("oft_backbone", "embodied_srpo_oft_lift", workers, runs,
               ["trainer.total_steps=1", "algorithm.trajectory_encoder=policy_backbone", *camera_warm_start,
                *small_step, *small_eval, *entropy], 180, expect=ddp_auto),
        # DDP (the default strategy) under mixed_precision auto: bfloat16 autocast, the old log-probs
        # rescored by the trainer (the metric exists only then)
        _train("llm_grpo", "llm_grpo", workers, runs,
               ["trainer.total_steps=2", "text.sft_steps=20", "eval.num_episodes=16",
                "algorithm.filter_groups.zero_variance=false", *text_reward], 150, expect=ddp_auto),
        _train("llm_ppo_fsdp", "llm_ppo", workers, runs,
               ["trainer.total_steps=1", "text.sft_steps=20", "eval.num_episodes=0", "trainer.strategy=fsdp",
                "trainer.mixed_precision=bf16", "trainer.micro_batch_size=8", *text_reward], 150,
               expect={**UPDATED, "critic/num_updates": 1.0, "critic/grad_norm": 1e-12,
                       "actor/old_log_prob_max_diff": 0.0}),
    ]


def benchmark_errors(part: Part) -> list[str]:
    """What the part's benchmark ``report`` did not measure: each part it records an ``error`` for
    (out of memory), or the report itself missing or measuring nothing."""
    if part.report is None:
        return []
    try:
        measured = json.loads(part.report.read_text()).get("parts") or {}
    except (OSError, ValueError) as error:
        return [f"no benchmark report at {part.report} ({error})"]
    if not measured:
        return [f"{part.report} measured no part"]
    return [f"{name}: {entry['error']}" for name, entry in measured.items() if "error" in entry]


#: Seconds a part's process group gets between SIGTERM and SIGKILL at its timeout (Ray's
#: shutdown, a CLI's graceful stop) ...
KILL_GRACE_S = 15.0
#: ... and what a part that ended by itself left in its group (normally nothing: no wait).
LEFTOVER_GRACE_S = 5.0

#: The parts' processes still running, with their parts' names (their groups are ended if the
#: check itself is stopped).
_LIVE: dict[subprocess.Popen, str] = {}
_LIVE_LOCK = threading.Lock()


def end_group(process: subprocess.Popen, grace_s: float | None = None) -> None:
    """End what is left of ``process``'s process group (the part's session: its children, Ray's
    processes): SIGTERM, then SIGKILL to whatever is still there after ``grace_s``, whether or not
    the leader has exited (a CLI child turns SIGTERM into a graceful stop of up to 30 s). Reaps
    the leader. ``grace_s``: None, :data:`KILL_GRACE_S`."""
    grace_s = KILL_GRACE_S if grace_s is None else grace_s
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        process.wait()
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        process.poll()  # reap the leader: a zombie still counts as a member of its group
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def run_part(part: Part, log_dir: Path, timeout_s: float) -> dict:
    """Run one part in its own session for at most ``timeout_s`` seconds; then end its whole
    process group (Ray's processes included), whether it timed out or ended (:func:`end_group`)."""
    log = log_dir / f"{part.name}.log"
    start = time.monotonic()
    with open(log, "w") as handle:
        process = subprocess.Popen(part.command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **part.env}, start_new_session=True)
        with _LIVE_LOCK:
            _LIVE[process] = part.name
        try:
            returncode = process.wait(timeout=timeout_s)
            status = "pass" if returncode == 0 else "fail"
        except subprocess.TimeoutExpired:
            returncode, status = None, "timeout"
        end_group(process, KILL_GRACE_S if status == "timeout" else LEFTOVER_GRACE_S)
        with _LIVE_LOCK:
            _LIVE.pop(process, None)
    seconds = round(time.monotonic() - start, 1)
    tail = log.read_text(errors="replace").splitlines()[-25:]
    if status == "pass" and (unmet := unmet_expectations(part)):
        status, tail = "fail", [f"the run ended but did not do its job: {problem}" for problem in unmet]
    if status == "pass" and (errors := benchmark_errors(part)):
        status, tail = "fail", [f"the benchmark ended but did not measure: {problem}" for problem in errors]
    return {"part": part.name, "status": status, "returncode": returncode, "seconds": seconds,
            "timeout_s": round(timeout_s, 1), "log": str(log), "tail": tail}


def end_live_parts(grace_s: float = 2.0) -> list[str]:
    """End every part still running, with its process group (the check itself is being
    stopped); returns their names."""
    with _LIVE_LOCK:
        live = dict(_LIVE)
    for process in live:
        end_group(process, grace_s)
    return sorted(live.values())


def _stop(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _run_within(part: Part, log_dir: Path, ends: float) -> dict:
    """:func:`run_part` with the part's timeout cut to what is left until ``ends`` (a monotonic
    time); a part that would get under 20 s is reported as skipped."""
    timeout_s = min(part.timeout_s, ends - time.monotonic())
    if timeout_s < 20:
        print(f"[gpu_check] {part.name}: skipped (deadline)", flush=True)
        return {"part": part.name, "status": "skipped", "returncode": None, "seconds": 0.0, "timeout_s": 0.0,
                "log": None, "tail": ["less than 20 s left of the check's --deadline"]}
    print(f"[gpu_check] {part.name} (timeout {timeout_s:.0f} s) ...", flush=True)
    result = run_part(part, log_dir, timeout_s)
    print(f"[gpu_check] {part.name}: {result['status']} in {result['seconds']} s", flush=True)
    if result["status"] != "pass":
        print("\n".join("    " + line for line in result["tail"]), flush=True)
    return result


def run_parts(parts: list[Part], log_dir: Path, ends: float, lanes: int):
    """Run ``parts`` before the monotonic time ``ends``, yielding each one's result in their order:
    first the parts that run alone, one after another, then the ``beside`` ones, ``lanes`` at a
    time, each lane taking the next as it frees. The training runs spend most of their time
    starting (Ray, imports, simulators, the warm start) and little on the GPU (one H200,
    2026-12-04: the 9 parts one after another took 511 s, over the 480 s deadline)."""
    for part in parts:
        if not part.beside:
            yield _run_within(part, log_dir, ends)
    with concurrent.futures.ThreadPoolExecutor(max(1, lanes)) as pool:
        futures = [pool.submit(_run_within, part, log_dir, ends) for part in parts if part.beside]
        for future in futures:
            yield future.result()


#: Import names of the project's requirements whose module is not named after the distribution.
_MODULES = {"pyyaml": "yaml", "import-linter": "importlinter", "openpi-client": "openpi_client"}


def missing_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The distributions of pyproject.toml's ``dependencies`` and ``test`` extra that this
    interpreter cannot import (neither installed metadata nor a module found): on an offline host
    they are what to carry (``bash scripts/gpu_kit_wheels.sh``). Versions are not compared: a GPU
    image's own numpy 2 and torch stand in for CI's pins."""
    import importlib.metadata
    import importlib.util
    import re
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    missing = []
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()
        try:
            importlib.metadata.distribution(name)
            continue
        except importlib.metadata.PackageNotFoundError:
            pass
        if importlib.util.find_spec(_MODULES.get(name, name.replace("-", "_"))) is None:
            missing.append(name)
    return missing


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def _native_bfloat16() -> bool:
    """Whether GPU 0 computes bfloat16 natively (vla_rl.trainers.strategy.native_bfloat16); True
    without a GPU (the parts then fail on their own)."""
    import torch

    from vla_rl.trainers.strategy import native_bfloat16

    return not torch.cuda.is_available() or native_bfloat16(torch.device("cuda", 0))


#: Recorded durations of the device tests (tests/durations.py): the suite part runs them longest with shortest.
DURATIONS = ROOT / "tests" / "device_test_durations.json"


def xdist_options(processes: int) -> list[str]:
    """pytest-xdist's options for the suite (pytest-xdist >= 3.8): ``processes`` workers under
    ``--dist loadgroup``, which sends the tests of one ``xdist_group`` (those sharing a module's
    expensive run fixture, such as tests/test_driver.py's SRPO run) to one worker, so that the run
    is made once, and every other test alone; ``--no-loadscope-reorder`` keeps the order of
    ``--order-by-durations`` (tests/durations.py's :func:`loadgroup_order`: the workers start with
    the longest units, then take the shortest, then longest with shortest, by :data:`DURATIONS`).
    On the H200 (2026-12-04, second run) under ``load`` one test at a time, the three tests of
    that SRPO run landed on three workers and each made it (67-90 s apiece). Driven with that run's
    durations (benchmarks/suite_schedule_h200.json), xdist 3.8's own schedulers end between 284 s
    (the groups' repeated runs taken out, at most) and 333 s (all kept) this way, against 317 s for
    ``load`` one at a time longest with shortest (the options before); on pytest 9.2, where xdist
    3.8 does not group (tests/durations.py's ``xdist_groups_work``), in the same 317 s."""
    return ["-n", str(processes), "--dist", "loadgroup", "--no-loadscope-reorder", "--order-by-durations",
            str(DURATIONS)]


def _has_xdist() -> bool:
    """Whether pytest-xdist >= 3.8 (the first with ``--no-loadscope-reorder``) is installed."""
    try:
        import xdist
    except ImportError:
        return False
    major, minor = (int(part) for part in xdist.__version__.split(".")[:2])
    return (major, minor) >= (3, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "gpu_check", help="report, logs and runs")
    parser.add_argument("--parts", nargs="+", default=None, help="run only these parts (default: all)")
    parser.add_argument("--skip", nargs="+", default=[], help="parts not to run")
    parser.add_argument("--xdist", type=int, default=min(8, max(1, (os.cpu_count() or 2) // 2)),
                        help="pytest-xdist processes for the suite (1: none)")
    parser.add_argument("--lanes", type=int, default=min(3, max(1, (os.cpu_count() or 2) // 8)),
                        help="training runs at a time (default: one per 8 cores, at most 3; the suite's xdist "
                             "workers share the same cores)")
    parser.add_argument("--suite-alongside", action=argparse.BooleanOptionalAction, default=True,
                        help="run the suite beside the other parts (default) instead of first")
    parser.add_argument("--deadline", type=float, default=480.0,
                        help="seconds for the whole check: each part's timeout is cut to what is left, and parts "
                             "that would get under 20 s are reported as skipped")
    args = parser.parse_args(argv)
    # the deadline counts from here (CUDA's start in _gpu_count included) and leaves a part's
    # SIGTERM-to-SIGKILL grace, so that the check ends within --deadline even when a part times out
    ends = time.monotonic() + args.deadline - KILL_GRACE_S
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    xdist = _has_xdist()
    if not xdist and args.xdist > 1:
        print("[gpu_check] pytest-xdist >= 3.8 is not installed: the suite part runs its tests one after another and "
              "may not end within its timeout (pip install 'pytest-xdist>=3.8')", flush=True)
    parts = build_parts(out, _gpu_count(), args.xdist if xdist else 1, _native_bfloat16())
    known = {part.name for part in parts}
    for name in [*(args.parts or []), *args.skip]:
        if name not in known:
            parser.error(f"unknown part {name!r}; parts: {', '.join(sorted(known))}")
    by_name = {part.name: part for part in parts}
    chosen = [by_name[name] for name in (args.parts or by_name) if name not in args.skip]
    missing = missing_requirements()
    if missing:
        print(f"[gpu_check] not installed here: {', '.join(missing)} (their tests are skipped; "
              "offline hosts: bash scripts/gpu_kit_wheels.sh, then .gpu/setup.sh again)", flush=True)
    results, stopped = [], []

    def write_report() -> None:  # after each part, so that a check cut short still leaves one
        report = {"missing_requirements": missing, "results": results}
        if stopped:
            report["stopped_while_running"] = stopped
        (out / "report.json").write_text(json.dumps(report, indent=2))

    alongside = None
    # Stopped itself (SIGTERM from an outer timeout, Ctrl-C), the check ends its parts' process
    # groups (the suite's xdist workers, Ray's processes: they hold the GPU) and writes its report.
    previous = {number: signal.signal(number, _stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if args.suite_alongside and any(part.name == "suite" for part in chosen):
            # The suite's xdist workers use CPU cores, the runs mostly the GPU: run it beside them.
            suite = next(part for part in chosen if part.name == "suite")
            chosen = [part for part in chosen if part is not suite]
            timeout_s = min(suite.timeout_s, ends - time.monotonic())
            print(f"[gpu_check] suite (timeout {timeout_s:.0f} s) started beside the other parts", flush=True)
            alongside = concurrent.futures.ThreadPoolExecutor(1).submit(run_part, suite, out / "logs", timeout_s)
        for result in run_parts(chosen, out / "logs", ends, args.lanes):
            results.append(result)
            write_report()
        if alongside is not None:
            result = alongside.result()
            results.append(result)
            print(f"[gpu_check] suite: {result['status']} in {result['seconds']} s", flush=True)
            if result["status"] != "pass":
                print("\n".join("    " + line for line in result["tail"]), flush=True)
    except (KeyboardInterrupt, SystemExit):
        stopped.extend(end_live_parts())
        write_report()
        print(f"[gpu_check] stopped; ended the parts still running: {', '.join(stopped) or 'none'}", flush=True)
        raise
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    write_report()
    print("\n| part | status | seconds |\n| --- | --- | --- |")
    for result in results:
        print(f"| {result['part']} | {result['status']} | {result['seconds']} |")
    print(f"report: {out / 'report.json'}")
    return 0 if all(r["status"] == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
