"""scripts/gpu_check.py on the CPU: its parts' training commands plan, the suite part collects on
a host without the packages the GPU image lacks (and the check names them), the recorded durations
that order the suite part name its tests, a hanging part is killed at its timeout with its whole
process group, and the deadline skips what no longer fits; scripts/gpu_kit_wheels.sh fetches those
packages' wheels for the offline kit."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
from child_env import child_env

from vla_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


def test_every_training_part_plans(gpu_check, tmp_path, capsys):
    parts = gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=1)
    trains = [p for p in parts if p.command[1:4] == ["-m", "vla_rl.cli", "train"]]
    assert {p.name for p in trains} == {"llm_grpo", "embodied_srpo", "pi0_fsdp", "oft_backbone", "llm_ppo_fsdp"}
    for part in trains:
        assert "workers.device=cuda" in part.command and "workers.num_workers=1" in part.command
        assert main(["plan", *part.command[4:]]) == 0, (part.name, capsys.readouterr().err)
    for part in parts:
        scripts = [word for word in part.command if word.endswith(".py")]
        assert all((ROOT / script).is_file() for script in scripts), part.name


def test_the_suite_part_runs_the_tests_of_the_test_device(gpu_check, tmp_path, collected_as_on_the_gpu_image):
    """The suite part runs the tests that put something on VLA_RL_TEST_DEVICE (tests/conftest.py,
    ``--device-tests-only``): a unit test taking the ``device`` fixture and an end-to-end run with
    ``device_overrides`` are collected; a test of the CLI's messages and one of the cluster, which
    run on CPU workers whatever the device, are not."""
    import subprocess

    suite = next(part for part in gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=1) if part.name == "suite")
    assert "--device-tests-only" in suite.command and suite.env == {"VLA_RL_TEST_DEVICE": "cuda"}
    options = suite.command[suite.command.index("pytest") + 1:]
    assert options[options.index("-m") + 1] == "not slow"  # the end-to-end runs on the device too
    files = ["tests/trainers/test_actor.py", "tests/test_templates.py", "tests/test_cli.py", "tests/test_cluster.py"]
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-m", "not slow", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    every = [line for line in listed.stdout.splitlines() if "::" in line]
    on_device = [node_id.split("@")[0] for node_id in collected_as_on_the_gpu_image[1]
                 if node_id.split("::")[0] in files]
    assert {line.split("::")[0] for line in on_device} == {"tests/trainers/test_actor.py", "tests/test_templates.py"}
    # per test, not per module: the actor's tests without the device fixture are left out
    actor = [line for line in every if line.startswith("tests/trainers/test_actor.py::")]
    assert 0 < sum(line in actor for line in on_device) < len(actor) and set(on_device) < set(every)


def test_the_suite_parts_xdist_workers_run_a_groups_tests_together_longest_first(gpu_check, tmp_path):
    """With pytest-xdist (a test requirement) the suite part runs its workers under
    ``--dist loadgroup`` (the tests sharing a module's run on one worker) in the order of
    ``--order-by-durations``, which ``--no-loadscope-reorder`` keeps (benchmarks/suite_schedule.py,
    tests/test_durations.py). Two real workers run tests with the part's options (both workers
    order the tests alike: xdist refuses workers whose collections differ)."""
    import subprocess

    assert gpu_check._has_xdist()
    suite = next(part for part in gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=2) if part.name == "suite")
    options = suite.command[suite.command.index("pytest") + 1:]
    assert options[options.index("-n") + 1] == "2" and options[options.index("--dist") + 1] == "loadgroup"
    assert "--no-loadscope-reorder" in options
    assert options[options.index("--order-by-durations") + 1] == str(ROOT / "tests" / "device_test_durations.json")
    serial = next(part for part in gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=1) if part.name == "suite")
    assert "-n" not in serial.command and "--dist" not in serial.command
    assert "--order-by-durations" not in serial.command
    ran = subprocess.run([sys.executable, "-m", "pytest", *gpu_check.xdist_options(2), "-v", "-p", "no:cacheprovider",
                          "tests/test_suite_schedule_benchmark.py", "-k", "few_tests_run_at_once"], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=300)
    output = ran.stdout
    workers = {line.split()[0] for line in output.splitlines() if line.startswith("[gw") and " PASSED " in line}
    assert ran.returncode == 0 and workers == {"[gw0]", "[gw1]"} and "4 passed" in output, output[-3000:]


def test_a_module_using_the_test_device_by_any_import_is_a_device_test():
    """``from tests.devices import ...`` loads a second module object of tests/devices.py: its
    helpers count as ``from devices import ...``'s do (tests/policies/test_flow_sampling.py's
    tests were left out of the GPU check so), and a module without them does not."""
    import importlib
    import types

    import conftest

    def item(**attributes):
        module = types.ModuleType("probe")
        vars(module).update(attributes)
        return types.SimpleNamespace(fixturenames=("tmp_path",), module=module)

    other_copy = importlib.import_module("tests.devices")
    assert conftest.uses_test_device(item(device_under_test=other_copy.device_under_test))
    assert conftest.uses_test_device(item(devices=other_copy))
    assert conftest.uses_test_device(item(device_overrides=importlib.import_module("devices").device_overrides))
    assert not conftest.uses_test_device(item(TEST_DEVICE_KIND=other_copy.TEST_DEVICE_KIND, json=importlib))
    assert conftest.uses_test_device(types.SimpleNamespace(fixturenames=("device",), module=None))


#: Packages of the project (dependencies, extras) that the H200 image (/opt/torch/.venv, 2026-11) and
#: the offline kit of ../shared/gpu lack, and what they bring in (openpi-client's dm-tree, import-linter's grimp);
#: simplejpeg, added since, was not looked for there and is treated as absent.
GPU_IMAGE_LACKS = ("websockets", "simplejpeg", "openpi_client", "tree", "importlinter", "grimp", "trl", "datasets",
                   "vllm", "lerobot", "libero")


@pytest.fixture(scope="module")
def collected_as_on_the_gpu_image(gpu_check, tmp_path_factory) -> tuple[str, list[str]]:
    """The suite part's own collection (benchmarks/suite_schedule.py's ``suite_part_options``: its
    options but ``-v``, ``--continue-on-collection-errors`` and ``--junitxml``; ``-rs``) on a host
    without the packages the GPU image lacks, listed by ``collect_device_tests`` from outside the
    checkout: pytest's output, and the node ids (``@group`` for a test of an ``xdist_group``).
    One collection of the whole suite (about 20 s here) for the three tests that take it."""
    import subprocess

    tmp_path = tmp_path_factory.mktemp("gpu_image")
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for module in GPU_IMAGE_LACKS:  # shadows the installed package: importing it fails as on the host
        (blocked / f"{module}.py").write_text(f"raise ModuleNotFoundError({module!r}, name={module!r})\n")
    suite = next(part for part in gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=1) if part.name == "suite")
    assert "--continue-on-collection-errors" in suite.command  # a future import error costs its module only
    listing = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import suite_schedule; "
               "options = suite_schedule.suite_part_options(); "
               "print(json.dumps([options, suite_schedule.collect_device_tests([*options, '-rs'], quiet=False)]))")
    listed = subprocess.run([sys.executable, "-c", listing], cwd=tmp_path, env=child_env(blocked),
                            capture_output=True, text=True, timeout=300)
    output = listed.stdout + listed.stderr
    assert listed.returncode == 0 and "ERROR collecting" not in output, output[-3000:]
    options, node_ids = json.loads(listed.stdout.splitlines()[-1])
    # the part's selection and paths, none of its output options
    assert options[options.index("-m") + 1] == "not slow" and {"--device-tests-only", "tests"} <= set(options)
    assert not {"-v", "--continue-on-collection-errors", "-n"} & set(options), options
    assert not any(option.startswith("--junitxml") for option in options), options
    return output, node_ids


def test_the_suite_part_collects_on_a_host_without_the_optional_packages(collected_as_on_the_gpu_image):
    """On the GPU image (no websockets, no openpi-client) the suite part's collection must not stop
    at the modules that import them: before, three modules' ImportErrors interrupted the collection
    and the part ran no test at all. Each such module is skipped, naming the package."""
    output, listed = collected_as_on_the_gpu_image
    skipped = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert any("test_served_lift_episode.py" in line and "websockets is not installed" in line for line in skipped)
    assert any("test_wire.py" in line and "openpi-client is not installed" in line for line in skipped), skipped
    assert len(listed) > 100  # the rest of the device's tests are there
    assert not any(node_id.startswith("tests/serving/test_served_lift_episode.py::") for node_id in listed)


def test_the_recorded_durations_name_most_of_the_device_tests(collected_as_on_the_gpu_image):
    """tests/device_test_durations.json (the suite part's order) names at least 90% of the tests
    the suite part runs on the GPU image; when it does not, refresh it from a run's suite.xml
    (tests/durations.py). The tests sharing a module's run carry their group (tests/test_driver.py's
    SRPO run among them)."""
    import durations

    _, listed = collected_as_on_the_gpu_image
    srpo_run = [node_id for node_id in listed if node_id.endswith("@test_driver.srpo_run")]
    assert len(srpo_run) == 3 and all(node_id.startswith("tests/test_driver.py::") for node_id in srpo_run)
    recorded = durations.load(ROOT / "tests" / "device_test_durations.json")
    device_tests = [durations.junit_key(node_id.split("@")[0]) for node_id in listed]
    named = sum(key in recorded for key in device_tests)
    assert len(device_tests) > 300 and named >= 0.9 * len(device_tests), (named, len(device_tests))


def test_the_missing_requirements_are_named(gpu_check, tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('''[project]
dependencies = ["torch>=2.11,<2.14", "pyyaml>=6", "imageio-ffmpeg>=0.5,<0.9", "no-such-distribution-vla==1.0"]
[project.optional-dependencies]
test = ["pytest>=8", "openpi-client==0.1.2", "also-missing-vla[extra]; python_version >= '3.8'"]
''')
    assert gpu_check.missing_requirements(pyproject) == ["no-such-distribution-vla", "also-missing-vla"]
    assert gpu_check.missing_requirements() == []  # the project's own, in this environment


def test_a_hanging_part_is_killed_with_its_children_at_its_timeout(gpu_check, tmp_path):
    marker = tmp_path / "child_alive"
    child = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('x')"
    hang = gpu_check.Part("hang", [sys.executable, "-c",
                                   f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
                                   "time.sleep(60)"], 60)
    start = time.monotonic()
    result = gpu_check.run_part(hang, tmp_path, timeout_s=1.0)
    assert result["status"] == "timeout" and time.monotonic() - start < 20
    time.sleep(4)
    assert not marker.exists()  # the grandchild went with the group


def _leaves_a_child(gpu_check, tmp_path, name: str, sleep: float):
    """A part whose leader starts a child that ignores SIGTERM and writes a marker after 4 s, marks
    its start, then sleeps ``sleep`` s (0: it ends, leaving the child); the part, the marker and
    the start mark."""
    marker, started = tmp_path / f"{name}.child_wrote", tmp_path / f"{name}.started"
    child = ("import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(4); "
             f"pathlib.Path({str(marker)!r}).write_text('x')")
    code = (f"import pathlib, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
            f"time.sleep(0.5); pathlib.Path({str(started)!r}).write_text('x'); time.sleep({sleep})")
    return gpu_check.Part(name, [sys.executable, "-c", code], 60), marker, started


@pytest.mark.parametrize("sleep, status", [(60, "timeout"), (0, "pass")])
def test_what_a_part_leaves_is_killed_after_the_grace_whether_its_leader_exited_or_not(gpu_check, tmp_path,
                                                                                     monkeypatch, sleep, status):
    """At a timeout the part's leader may exit at SIGTERM at once (pytest does) while a member
    holds on (a CLI child stopping gracefully); and a part may end leaving processes behind. The
    group was SIGKILLed only if the leader outlived the grace: these members kept running (and
    holding the GPU) beside the next parts."""
    monkeypatch.setattr(gpu_check, "KILL_GRACE_S", 1.0)
    monkeypatch.setattr(gpu_check, "LEFTOVER_GRACE_S", 1.0)
    part, marker, _ = _leaves_a_child(gpu_check, tmp_path, "leaves", sleep)
    result = gpu_check.run_part(part, tmp_path, timeout_s=2.0)
    assert result["status"] == status
    time.sleep(5)
    assert not marker.exists()  # SIGKILLed after the grace, before it could write


def test_a_benchmark_that_measured_nothing_or_ran_out_of_memory_fails(gpu_check, tmp_path):
    """The benchmarks record a part that runs out of GPU memory in their JSON and exit 0: such a
    part passed the check."""
    report = tmp_path / "bench.json"
    write = f"import json, pathlib; pathlib.Path({str(report)!r}).write_text(json.dumps({{DATA}}))"
    cases = [({"parts": {"sample": {"total_s": 1.0}, "update": {"error": "out of memory: tried to allocate"}}},
              "fail", "update: out of memory"),
             ({"parts": {}}, "fail", "measured no part"),
             ({"parts": {"sample": {"total_s": 1.0}}}, "pass", None)]
    for data, status, why in cases:
        part = gpu_check.Part("bench", [sys.executable, "-c", write.replace("{DATA}", repr(data))], 60, report=report)
        result = gpu_check.run_part(part, tmp_path, timeout_s=30)
        assert result["status"] == status, (data, result)
        assert why is None or why in " ".join(result["tail"])
    report.unlink()
    part = gpu_check.Part("bench", [sys.executable, "-c", "pass"], 60, report=report)
    assert "no benchmark report" in " ".join(gpu_check.run_part(part, tmp_path, timeout_s=30)["tail"])


_STOPPED_CHECK = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gpu_check", {script!r})
gpu_check = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gpu_check
spec.loader.exec_module(gpu_check)
part = gpu_check.Part("sleepy", [sys.executable, "-c", {code!r}], 60)
gpu_check.build_parts = lambda *args, **kwargs: [part]
sys.exit(gpu_check.main(["--out", {out!r}, "--deadline", "120"]))
"""


def test_a_check_stopped_by_sigterm_ends_its_running_parts_and_writes_its_report(gpu_check, tmp_path):
    """An outer timeout's SIGTERM killed the check alone: every running part (its own session)
    went on holding the GPU, and the report lacked them."""
    import signal
    import subprocess

    part, marker, started = _leaves_a_child(gpu_check, tmp_path, "sleepy", 60)
    script = _STOPPED_CHECK.format(script=str(ROOT / "scripts" / "gpu_check.py"), code=part.command[-1],
                                   out=str(tmp_path / "out"))
    check = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.monotonic() + 120
    while not started.exists() and check.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not started.exists():
        check.kill()
        pytest.fail(f"the part never started; the check said: {check.communicate()[0]}")
    check.send_signal(signal.SIGTERM)
    out, _ = check.communicate(timeout=30)
    assert check.returncode == 128 + signal.SIGTERM, out
    assert "ended the parts still running: sleepy" in out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stopped_while_running"] == ["sleepy"] and report["results"] == []
    time.sleep(5)
    assert not marker.exists()  # the part's child, which ignores SIGTERM, went too


def test_the_env_part_names_the_gpu_the_machine_and_where_its_host_name_resolves(gpu_check, monkeypatch, capsys):
    """The ``env`` part's script, run against a stand-in H200 (torch.cuda's queries answered as
    one would): its JSON line holds the GPU's properties, the machine's record as a run's
    ``summary.json`` holds it, and the addresses the host name resolves to (where gloo and NCCL
    listen unless pinned to an interface), so that a GPU check's report says them."""
    import socket
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(
        name="NVIDIA H200", total_memory=150_000_000_000, major=9, minor=0))
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        exec(gpu_check._ENV_PY, {})
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (info["name"], info["memory_gib"], info["capability"], info["tf32_matmul"]) == ("NVIDIA H200", 139.7, "9.0", True)
    assert info["host"]["gpu"] == "NVIDIA H200" and info["host"]["torch"] == torch.__version__
    assert info["hostname"] == socket.gethostname()
    expected = sorted({address[4][0] for address in socket.getaddrinfo(socket.gethostname(), None)})
    assert info["hostname_resolves_to"] == expected and expected


def test_the_deadline_skips_parts_that_no_longer_fit(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--parts", "env", "--deadline", "5", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "env: skipped (deadline)" in out and "| env | skipped | 0.0 |" in out
    report = json.loads((tmp_path / "report.json").read_text())  # written even when no part ran
    assert [r["status"] for r in report["results"]] == ["skipped"] and report["missing_requirements"] == []
    with pytest.raises(SystemExit):
        gpu_check.main(["--parts", "no_such_part", "--out", str(tmp_path)])


def _waiting_part(gpu_check, name: str, marks: Path, waits_for: str | None, beside: bool, patience_s: float = 30):
    """A stand-in part that marks its start, then waits up to ``patience_s`` for ``waits_for``'s
    start mark (exit 1 if it never comes), then marks its end."""
    code = (f"import pathlib, sys, time; marks = pathlib.Path({str(marks)!r}); "
            f"(marks / '{name}.start').write_text(str(time.monotonic())); "
            f"wanted = {waits_for!r}; deadline = time.monotonic() + {patience_s}\n"
            "while wanted and not (marks / f'{wanted}.start').exists() and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)\n"
            f"(marks / '{name}.end').write_text(str(time.monotonic())); "
            "sys.exit(0 if not wanted or (marks / f'{wanted}.start').exists() else 1)")
    return gpu_check.Part(name, [sys.executable, "-c", code], 60, beside=beside)


def test_training_runs_share_lanes_after_the_parts_that_run_alone(gpu_check, tmp_path):
    """The parts that run alone (the GPU's checks and the timed benchmarks) run first, one at a
    time; then the training runs, ``lanes`` at a time: two runs that each wait for the other's
    start both pass only if they ran side by side. On one H200, one at a time, they took 512 s of
    the check's 480 s deadline (2026-12-04)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    parts = [_waiting_part(gpu_check, "run_a", marks, "run_b", beside=True),
             _waiting_part(gpu_check, "bench", marks, None, beside=False),
             _waiting_part(gpu_check, "run_b", marks, "run_a", beside=True),
             _waiting_part(gpu_check, "run_c", marks, None, beside=True)]
    results = list(gpu_check.run_parts(parts, tmp_path, time.monotonic() + 120, lanes=2))
    assert [(r["part"], r["status"]) for r in results] == [("bench", "pass"), ("run_a", "pass"), ("run_b", "pass"),
                                                          ("run_c", "pass")]
    time_of = {mark.name: float(mark.read_text()) for mark in marks.iterdir()}
    assert time_of["bench.end"] < min(time_of[f"{run}.start"] for run in ("run_a", "run_b", "run_c"))
    assert time_of["run_c.start"] >= min(time_of["run_a.end"], time_of["run_b.end"])  # a lane freed first
    # one lane: run_a waits for run_b, which has not started yet, and fails
    (tmp_path / "one_lane").mkdir()
    one_lane = [_waiting_part(gpu_check, "run_a", tmp_path / "one_lane", "run_b", True, patience_s=2),
                _waiting_part(gpu_check, "run_b", tmp_path / "one_lane", None, True)]
    one = list(gpu_check.run_parts(one_lane, tmp_path, time.monotonic() + 120, lanes=1))
    assert [r["status"] for r in one] == ["fail", "pass"]
    # the deadline cuts lanes too: a run that would get under 20 s is skipped, not started
    late = list(gpu_check.run_parts(parts[2:], tmp_path, time.monotonic() + 10, lanes=2))
    assert [r["status"] for r in late] == ["skipped", "skipped"]


def test_on_a_gpu_without_native_bfloat16_the_ddp_runs_expect_no_autocast(gpu_check, tmp_path):
    """``auto`` keeps float32 on a V100 or T4: no autocast, no rescoring of the old log-probs to
    expect from the DDP runs (they failed the check for its missing metric); the FSDP runs ask
    for bf16 themselves and still rescore."""
    older = {part.name: part.expect for part in gpu_check.build_parts(tmp_path, 1, 1, native_bfloat16=False)}
    newer = {part.name: part.expect for part in gpu_check.build_parts(tmp_path, 1, 1)}
    rescored = "actor/old_log_prob_max_diff"
    assert {name for name, expect in newer.items() if rescored in expect} == {
        "pi0_fsdp", "embodied_srpo", "oft_backbone", "llm_grpo", "llm_ppo_fsdp"}
    assert {name for name, expect in older.items() if rescored in expect} == {"pi0_fsdp", "llm_ppo_fsdp"}
    assert older["embodied_srpo"] == gpu_check.UPDATED


def test_the_check_starts_the_benchmarks_before_the_training_runs(gpu_check, tmp_path):
    parts = gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=1)
    alone = [part.name for part in parts if not part.beside]
    assert alone == ["env", "egl", "suite", "pi0_full_size", "oft_full_size"]
    assert all(part.run_dir is not None for part in parts if part.beside)


@pytest.mark.slow
def test_the_training_parts_update_on_cpu_workers(gpu_check, tmp_path):
    """The training parts as the check runs them, on CPU workers (bf16 refused there: none): every
    run ends having updated its policy, and π0's update recomputes its checkpointed blocks (its
    float32 copy computes as the rollout: no rescoring of the old log-probs to expect)."""
    for part in gpu_check.build_parts(tmp_path, gpus=1, workers_xdist=1):
        if part.run_dir is None:
            continue
        part.command = [{"workers.device=cuda": "workers.device=cpu",
                         "trainer.mixed_precision=bf16": "trainer.mixed_precision=none"}.get(word, word)
                        for word in part.command]
        part.expect.pop("actor/old_log_prob_max_diff", None)
        result = gpu_check.run_part(part, tmp_path, timeout_s=600)
        assert result["status"] == "pass", (part.name, result["tail"])


def test_the_kit_wheels_need_a_kit(tmp_path):
    import subprocess

    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_kit_wheels.sh"), str(tmp_path / "no_kit")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "build the kit first (bash ../shared/gpu/pack.sh .)" in done.stderr
    assert not (tmp_path / "no_kit").exists()


@pytest.mark.slow
def test_the_kit_wheels_are_the_hosts_and_the_projects_versions(tmp_path):
    """Against the real package index: the four wheels for CPython 3.12 on x86-64 Linux, at the
    versions CI installs (websockets and simplejpeg from scripts/constraints-cpu.txt, openpi-client
    from the test extra)."""
    import subprocess

    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_kit_wheels.sh"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    wheels = sorted(path.name for path in (tmp_path / "wheels").glob("*.whl"))
    assert [name.split("-")[:2] for name in wheels] == [["dm_tree", "0.1.10"], ["openpi_client", "0.1.2"],
                                                        ["simplejpeg", "1.9.0"], ["websockets", "16.1.1"]]
    assert all("-cp312-" in name or name.endswith("-py3-none-any.whl") for name in wheels), wheels


def test_the_deadline_keeps_the_kill_grace_in_hand(gpu_check, tmp_path, monkeypatch, capsys):
    """A part's timeout is cut to the deadline less the SIGTERM-to-SIGKILL grace, counted from the
    check's start: a part killed at its timeout is gone by the deadline."""
    quick = gpu_check.Part("quick", [sys.executable, "-c", "pass"], 600)
    monkeypatch.setattr(gpu_check, "build_parts", lambda out, gpus, workers_xdist, native_bfloat16=True: [quick])
    assert gpu_check.main(["--out", str(tmp_path), "--deadline", "60"]) == 0
    timeout = float(capsys.readouterr().out.split("quick (timeout ")[1].split(" s)")[0])
    assert 60 - gpu_check.KILL_GRACE_S - 5 < timeout <= 60 - gpu_check.KILL_GRACE_S


def test_gpu_check_sh_uses_the_python_it_is_given(tmp_path):
    """An explicit PYTHON=... was overridden by .venv's python whenever the checkout had one."""
    import subprocess

    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"given python: $*\"\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--parts", "env"], capture_output=True,
                          text=True, timeout=60, env={**child_env(), "PYTHON": str(fake)})
    assert done.returncode == 0 and done.stdout.strip() == "given python: scripts/gpu_check.py --parts env"
