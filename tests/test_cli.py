"""The ``vla-rl`` command line: ``plan`` output, exit statuses, and one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vla_rl.cli import main
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node
from vla_rl.errors import ResumeRefused, RunStopped

# The arithmetic splits that text runs generate: written once per session (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("generated_prompts_once")

REPO_ROOT = Path(__file__).resolve().parents[1]
CLI_FN = "test_cli_dummy"
BUILTIN_PIPELINE = [
    ("tasks", "data", "data_load", []),
    ("rollout", "rollout", "env_interact", ["tasks"]),
    ("reward", "reward", "compute", ["rollout"]),
    ("adv", "advantage", "compute", ["reward"]),
    ("filter", "filter", "compute", ["adv"]),
    ("actor", "actor", "model_train", ["filter"]),
]

for _, _role, _type, _ in BUILTIN_PIPELINE:
    register_node(_role, _type, CLI_FN)(lambda ctx, batch: NodeOutput(batch=batch))


def _write(tmp_path: Path, fn: str, reward_role: str = "reward", **reward_fields) -> Path:
    nodes = [
        {"id": node_id, "role": role, "type": type, "fn": fn, "deps": deps}
        for node_id, role, type, deps in BUILTIN_PIPELINE
    ]
    nodes[2].update(role=reward_role, **reward_fields)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "pipeline", "nodes": nodes}, sort_keys=False))
    return path


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "vla_rl.cli", *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def no_builtin_nodes(monkeypatch):
    """Plan with the test's own functions, without importing vla_rl.nodes (torch)."""
    monkeypatch.setattr(NODE_FUNCTIONS, "load_builtins", lambda: None)


def test_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "plan" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["plan", "--help"])
    assert info.value.code == 0
    assert "--world-size" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "missing"), [
    (["plan"], "TEMPLATE"), (["serve"], "CHECKPOINT_OR_EXPORT"), (["remote-env"], "simulator"),
    (["export", "outputs/run"], "OUT"),
])
def test_a_missing_argument_is_named_alone(argv, missing, capsys):
    """`vla-rl export RUN` said "required: OUT, KEY=DIR", the optional KEY=DIR listed as required."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"error: the following arguments are required: {missing}")


def test_plan_prints_chains(tmp_path, capsys, no_builtin_nodes):
    path = _write(tmp_path, CLI_FN)
    assert main(["plan", str(path), "nodes.reward.dp_size=1", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "worker 0:" in out and "worker 1:" in out
    assert "rollout (dp 2) -> reward (dp 1)" in out
    assert re.search(rf"run reward +reward/compute/{CLI_FN} +dp_rank 0/1 <- rollout", out)


def test_plan_takes_overrides_before_the_template_as_train_does(tmp_path, capsys, no_builtin_nodes):
    """``vla-rl plan ~x TEMPLATE`` looked for a template named ``~x``; a deletion after the
    command's own override under that key is refused (it would discard it)."""
    path = _write(tmp_path, CLI_FN)
    assert main(["plan", "nodes.reward.dp_size=1", str(path), "--world-size", "2"]) == 0
    assert "rollout (dp 2) -> reward (dp 1)" in capsys.readouterr().out
    assert main(["plan", str(path), "trainer.total_steps=3", "~trainer"]) == 2
    assert "override '~trainer' would delete 'trainer.total_steps=3', given before it" in capsys.readouterr().err
    assert main(["plan", str(path), str(path)]) == 2
    assert "name one template before or after the overrides" in capsys.readouterr().err


def test_plan_error_is_one_line_with_status_2(tmp_path, capsys, no_builtin_nodes):
    path = _write(tmp_path, CLI_FN, dp_size=3)
    assert main(["plan", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        f"error: {path}: node 'reward': field 'dp_size': must divide the world size 2 (got 3)"
    )


def test_bad_world_size_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", str(_write(tmp_path, CLI_FN)), "--world-size", "0"])
    assert info.value.code == 2
    assert "positive integer" in capsys.readouterr().err


def test_a_world_size_that_contradicts_workers_num_workers_is_refused(capsys):
    """`plan --world-size 2 workers.num_workers=3` planned for 2 workers and exited 0, though the
    run (3 workers) is refused: 8 initial states do not split over 3."""
    assert main(["plan", "embodied_srpo", "--world-size", "2", "workers.num_workers=3"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --world-size 2 and workers.num_workers=3 disagree: give one "
                                               "(the run trains with workers.num_workers)")
    assert main(["plan", "embodied_srpo", "--world-size", "2", "workers.num_workers=2"]) == 0


def test_subprocess_malformed_template_exits_2_in_red(tmp_path):
    path = _write(tmp_path, "default", reward_role="rewarder")
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    result = _cli("plan", str(path), env={**env, "FORCE_COLOR": "1"})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "\x1b[1;31m" in result.stderr  # bold red
    assert len(result.stderr.strip().splitlines()) == 1
    assert "node 'reward': field 'role': must be one of" in result.stderr


def test_subprocess_plans_builtin_nodes(tmp_path):
    result = _cli("plan", str(_write(tmp_path, "default")), "nodes.reward.dp_size=1", "--world-size", "2")
    if result.returncode == 2 and "no node function" in result.stderr:
        pytest.skip(f"vla_rl.nodes lacks a function of the pipeline: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for rank in (0, 1):
        assert f"worker {rank}:" in result.stdout
    assert "reshard rollout -> reward: dp 2 -> 1, shard 1 -> 0" in result.stdout
    assert "run actor" in result.stdout


NO_EXPERT_TASK = ["simulator.name=robosuite", "simulator.env.task=NutAssemblySquare",
                  "simulator.env.obs_keys=[robot0_eef_pos]", "simulator.env.instruction=fit the nut"]


@pytest.mark.parametrize(("overrides", "message"), [
    (NO_EXPERT_TASK, ("no scripted expert for task 'NutAssemblySquare' of simulator 'robosuite' "
                      "(tasks with one: Door, Lift, PickPlaceCan, Stack)")),
    (["simulator.env.task=Stak"], "task must be a single-arm robosuite task, one of Door, Lift,"),
])
def test_train_refuses_a_task_before_ray_starts(tmp_path, capsys, monkeypatch, overrides, message):
    """A misspelt task, or a warm start from demonstrations of a task without a scripted expert,
    is a one-line error (status 2) before Ray starts and before a run directory is written."""

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr("vla_rl.driver.start_ray", no_ray)
    status = main(["train", "embodied_srpo", f"run.output_dir={tmp_path}", *overrides])
    assert status == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("template", "args", "field"), [
    ("embodied_srpo", ["--world-size", "3"], "data.init_states_per_step"),
    ("embodied_srpo_oft_lift", ["--world-size", "8"], "data.init_states_per_step"),
    ("llm_grpo", ["--world-size", "3"], "text.prompts_per_step"),
])
def test_plan_refuses_a_step_the_workers_cannot_split(capsys, template, args, field):
    """``--world-size`` runs the checks the run would: 4 initial states over 8 workers (the 7.5 B
    recipe's shape) is refused at plan time, naming the field, not after the models have loaded."""
    assert main(["plan", template, *args]) == 2
    err = capsys.readouterr().err
    assert f"field '{field}'" in err and f"DP size {args[1]}" in err and len(err.strip().splitlines()) == 1


def test_train_refuses_a_step_the_workers_cannot_split_before_ray_starts(tmp_path, capsys, monkeypatch):
    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr("vla_rl.driver.start_ray", no_ray)
    assert main(["train", "embodied_srpo", f"run.output_dir={tmp_path}", "workers.num_workers=3"]) == 2
    assert "data.init_states_per_step=8 must be a multiple of the data node's DP size 3" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("template", "overrides", "field"), [
    ("eval_rollout", ["simulator.name=robosuite_lift", "policy.name=mlp"], "eval.store_episodes"),
    ("embodied_srpo", ["eval.checkpoints=[/tmp/some_run/checkpoints/step_00000001]"], "eval.checkpoints"),
])
def test_train_refuses_the_settings_of_vla_rl_eval_before_ray_starts(template, overrides, field, tmp_path, capsys,
                                                                     monkeypatch):
    """``vla-rl train eval_rollout`` (vla-rl eval's template, listed by ``train --help``) ran, then
    ended in a KeyError traceback: its final evaluation found every episode stored by the first."""

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr("vla_rl.driver.start_ray", no_ray)
    assert main(["train", template, f"run.output_dir={tmp_path}", *overrides]) == 2
    err = capsys.readouterr().err
    assert f"field '{field}': a setting of vla-rl eval" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override", ["eval.checkpoints=[/tmp/some_run/checkpoints/step_00000001]",
                                      "eval.store_episodes=true"])
def test_plan_refuses_the_settings_of_vla_rl_eval_on_a_training_template(override, capsys):
    """``vla-rl plan`` printed the plan of a training template with them; ``train`` refused it."""
    assert main(["plan", "embodied_srpo", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: dag_templates/embodied_srpo.yaml: field 'eval.") and "a setting of vla-rl eval" in err
    assert main(["plan", "eval_rollout", override]) == 0  # vla-rl eval's own template sets them


def test_a_write_the_file_system_refuses_the_driver_is_one_line(tmp_path, capsys, monkeypatch):
    """summary.json, metrics.jsonl or a plot on a full disk: a traceback; other OSErrors keep theirs."""
    import errno

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "summary.json.tmp"))

    monkeypatch.setattr("vla_rl.driver.start_ray", full_disk)
    assert main(["train", "embodied_srpo", f"run.output_dir={tmp_path}", "run.name=run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: the file system refused a write: No space left on device ({tmp_path}/run/summary"
                          ".json.tmp); free space or fix the file system, then run the command again")
    assert len(err.strip().splitlines()) == 1

    def refused(*args, **kwargs):
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    monkeypatch.setattr("vla_rl.driver.start_ray", refused)
    with pytest.raises(ConnectionRefusedError):  # not the file system's: a bug to trace
        main(["train", "embodied_srpo", f"run.output_dir={tmp_path}", "run.name=run2"])


def test_ctrl_c_is_one_line_and_status_130(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("vla_rl.cli.plan.preflight", interrupted)
    assert main(["plan", "embodied_srpo"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C)" in err and "Traceback" not in err


@pytest.mark.parametrize("error, status", [(ResumeRefused("cannot resume: no checkpoint under runs/x verifies"), 2),
                                           (RunStopped("the run stopped"), 1)])
def test_a_resume_the_workers_refuse_ends_as_a_user_error(error, status, capsys, monkeypatch):
    """The workers hash a checkpoint's files (the driver's check before Ray compares sizes): a
    resume none of whose checkpoints verifies ended in a worker's FileNotFoundError traceback,
    exit status 1; it is the user's input, as the driver's own refusals are."""
    def refused(*args, **kwargs):
        raise error

    monkeypatch.setattr("vla_rl.cli.plan.preflight", refused)
    assert main(["plan", "embodied_srpo"]) == status
    assert capsys.readouterr().err.strip() == f"error: {error}"


@pytest.mark.parametrize("command", ["train", "plan"])
def test_help_lists_the_shipped_templates_with_their_descriptions(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "shipped templates (dag_templates/):" in out
    assert "embodied_srpo " in out and "SRPO progress rewards" in out and "llm_grpo " in out
    assert "embodied_warm_start" not in out  # phases and bases are not runnable templates


class _Ray:
    """Stands in for the ray module: prints a worker's line when it shuts down (Ray's log thread)."""

    def __init__(self, running: bool) -> None:
        self.running, self.shutdowns = running, 0

    def is_initialized(self) -> bool:
        return self.running

    def shutdown(self) -> None:
        import sys

        self.shutdowns += 1
        self.running = False
        print("(DAGWorker pid=1) a worker's last words", file=sys.stderr)


@pytest.mark.parametrize("error", [RunStopped("the run stopped"), KeyboardInterrupt(), TemplateError("bad value")])
@pytest.mark.parametrize("running_before", [False, True])
def test_a_failure_ends_with_its_error_line(error, running_before, capsys, monkeypatch):
    """Ray prints its workers' output until it shuts down: the Ray this command started is shut
    down before the error line, so that the error is the console's last line; one it found
    running (a notebook's, a test session's) is left running."""
    import sys

    ray = _Ray(running=running_before)
    monkeypatch.setitem(sys.modules, "ray", ray)

    def fails(*args, **kwargs):
        ray.running = True  # the command started (or kept using) Ray
        raise error

    monkeypatch.setattr("vla_rl.cli.plan.preflight", fails)
    assert main(["plan", "embodied_srpo"]) != 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: ")
    assert ray.shutdowns == (0 if running_before else 1) and ray.running == running_before


def test_ctrl_c_waits_for_rays_shutdown_only_so_long(monkeypatch):
    """On Ctrl-C the command stops the Ray it started, but a shutdown that hangs is left behind
    after the timeout (the command then leaves without it) instead of holding the process."""
    import threading
    import types

    from vla_rl import cli

    release = threading.Event()
    hanging = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: release.wait(60))
    monkeypatch.setitem(sys.modules, "ray", hanging)
    try:
        assert cli._stop_ray_started_since(False, timeout_s=0.2) is False
    finally:
        release.set()
    calls = []
    quick = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: calls.append(1))
    monkeypatch.setitem(sys.modules, "ray", quick)
    assert cli._stop_ray_started_since(False, timeout_s=5) is True and calls == [1]
    assert cli._stop_ray_started_since(True, timeout_s=5) is True and calls == [1]  # a Ray it found: left alone


_EXITS_WITH = """
import atexit, sys
import vla_rl.cli as cli

class Collected:
    def __del__(self):
        print("finalized", flush=True)

left_for_the_last_collection = Collected()
atexit.register(print, "exit hook ran", flush=True)
cli.main = lambda argv=None: int(sys.argv[1])
cli.run()
"""


@pytest.mark.parametrize(("status", "finalized"), [(130, False), (143, False), (0, True), (2, True)])
def test_the_command_leaves_without_the_last_collection_after_an_interrupt(status, finalized):
    """After a Ray start that Ctrl-C or SIGTERM interrupted, the interpreter's last garbage
    collection could crash in Ray's objects (status 139 or 134 after the error line): after an
    interrupt the command runs its exit hooks and leaves without it; other exits are unchanged."""
    done = subprocess.run([sys.executable, "-c", _EXITS_WITH, str(status)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == status, done.stderr[-2000:]
    assert "exit hook ran" in done.stdout and ("finalized" in done.stdout) == finalized


def test_the_console_script_and_python_m_exit_through_run():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    assert tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]["vla-rl"] == "vla_rl.cli:run"
    assert "run()" in (root / "vla_rl" / "cli" / "__main__.py").read_text()
