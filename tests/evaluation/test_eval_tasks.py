"""`vla-rl eval` over several tasks, end to end (Ray on loopback, one DAG worker, simulator actors):
a task-set checkpoint is evaluated on each of its tasks with the overall rate; an evaluation that
crashes in its second task leaves the report of the first (the last one written before the crash,
untouched by it), and the same command then finishes without redoing it; a single-task Lift
checkpoint on the robosuite benchmark reports the tasks whose observation layout it cannot read as
skipped, with the reason, before any rollout; a MetaWorld run's videos come from MetaWorld's
camera."""

from __future__ import annotations

import json

import pytest
import torch
from devices import device_overrides

import vla_rl.workers.group as group_module
from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.checkpoints import files as checkpoint
from vla_rl.cli import main
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.driver import prepare_run_dir
from vla_rl.eval_driver import evaluate, prepare_eval_dir

EVAL = [*device_overrides(num_workers=1), "workers.num_workers=1", "eval.num_episodes=2", "eval.video_episodes=0",
        "simulator.env.horizon=6", "simulator.num_cpus_per_actor=0"]
TASKS = ["reach-v3", "push-v3"]


def write_run(out, template: str, overrides: list[str], config: MLPPolicyConfig, steps=(1,), seed: int = 0):
    """A run directory as `vla-rl train` leaves it: its resolved template and checkpoints of
    ``config`` (step N's weights drawn from the seed ``seed + N``)."""
    run, _, _ = prepare_run_dir(template, [f"run.output_dir={out}", "run.name=run", *overrides], resume=None)
    run.close()
    policy = make_policy("mlp", config)
    for step in steps:
        torch.manual_seed(seed + step)
        for parameter in policy.parameters():
            torch.nn.init.normal_(parameter, std=0.3)
        checkpoint.save_checkpoint(run.path / "checkpoints", step, rank=0, model=policy)
        checkpoint.finalize_checkpoint(run.path / "checkpoints", step)
    return run.path


@pytest.fixture(scope="module")
def task_set_run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("outputs"), "embodied_srpo_mt10",
                     [f"simulator.tasks=[{','.join(TASKS)}]", "data.init_states_per_step=2",
                      "policy.config.hidden_sizes=[8]"],
                     MLPPolicyConfig(obs_dim=39, action_dim=4, hidden_sizes=(8,), num_tasks=2))


def stored(eval_dir, task: str) -> int:
    path = eval_dir / "episodes" / task / "rank0.zarr"
    return len(TrajectoryStore.open(path, read_only=True)) if path.exists() else 0


@pytest.mark.xdist_group("test_eval_tasks.task_set_run")
def test_a_crash_in_a_task_keeps_the_finished_ones_then_the_evaluation_finishes(ray_on_loopback, task_set_run,
                                                                                monkeypatch):
    eval_dir = task_set_run / "eval"
    run_evaluation = group_module.run_evaluation

    reports = []  # the report files as the crash found them

    def crash_in_the_third_pass(workers, step, tag, video, progress=None):
        passes = []

        def watch(metrics):  # pass 1: reach-v3 greedy, 2: reach-v3 sampled, 3: push-v3 greedy
            progress(metrics)
            passes.append(metrics)
            if len(passes) == 3:
                reports.append([(eval_dir / name).read_bytes() for name in ("report.json", "report.md")])
                raise RuntimeError("injected crash in task push-v3")

        return run_evaluation(workers, step, tag, video, progress=watch)

    monkeypatch.setattr(group_module, "run_evaluation", crash_in_the_third_pass)
    with pytest.raises(RuntimeError, match="injected crash"):
        evaluate([str(task_set_run)], EVAL)
    assert reports == [[(eval_dir / name).read_bytes() for name in ("report.json", "report.md")]]  # not rewritten
    report = json.loads((eval_dir / "report.json").read_text())
    assert report["task_status"] == {"reach-v3": "complete", "push-v3": "incomplete"}
    assert [(r["task"], r["protocol"], r["episodes"]) for r in report["results"]] == [
        ("reach-v3", "greedy", 2), ("reach-v3", "sampled@1", 2)]
    assert (eval_dir / "results" / "reach-v3.json").exists() and not (eval_dir / "results" / "push-v3.json").exists()
    assert "**not finished**: push-v3" in (eval_dir / "report.md").read_text()
    assert (stored(eval_dir, "reach-v3"), stored(eval_dir, "push-v3")) == (4, 2)

    monkeypatch.setattr(group_module, "run_evaluation", run_evaluation)
    assert main(["eval", str(task_set_run), *EVAL]) == 0
    report = json.loads((eval_dir / "report.json").read_text())
    assert report["task_status"] == {"reach-v3": "complete", "push-v3": "complete"} and report["skipped"] == []
    rows = {(r["task"], r["protocol"]): r for r in report["results"]}
    assert set(rows) == {(task, protocol) for task in [*TASKS, "overall"] for protocol in ("greedy", "sampled@1")}
    assert all(rows[(task, "greedy")]["episodes"] == 2 for task in TASKS) and rows[("overall", "greedy")]["episodes"] == 4
    assert (stored(eval_dir, "reach-v3"), stored(eval_dir, "push-v3")) == (4, 4)  # reach-v3 was not redone


@pytest.mark.xdist_group("test_eval_tasks.task_set_run")
def test_a_task_set_checkpoint_runs_only_its_own_tasks_of_a_benchmark(ray_on_loopback, task_set_run, tmp_path,
                                                                         capsys):
    assert main(["eval", str(task_set_run), *EVAL, "eval.benchmark=metaworld_mt10",
                 "eval.tasks=[push-v3,pick-place-v3]", "eval.protocols=[greedy]", "--output", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["task_status"] == {"push-v3": "complete", "pick-place-v3": "skipped"}
    assert report["skipped"][0]["reason"].startswith("the policy takes a one-hot of its 2 training tasks")
    assert [r["task"] for r in report["results"]] == ["push-v3"]
    # none of them runs: it reported an empty table and exited 0
    out = tmp_path / "none"
    assert main(["eval", str(task_set_run), *EVAL, "eval.benchmark=metaworld_mt10",
                 "eval.tasks=[pick-place-v3,drawer-close-v3]", "--output", str(out)]) == 2
    assert "error: none of the 2 tasks of the evaluation can run with the policy (each skipped, above, saying why)" \
        in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_an_mt10_run_prepares_its_evaluation_of_every_task(tmp_path):
    run_dir = write_run(tmp_path, "embodied_srpo_mt10", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=39, action_dim=4, hidden_sizes=(8,), num_tasks=10))
    _, loaded, _ = prepare_eval_dir([str(run_dir)], ["eval.num_episodes=3"])
    config = loaded.config
    assert config.simulator.tasks == "mt10" and config.policy.policy_config().num_tasks == 0  # set from the pool
    assert config.data.init_states_per_step == 10  # the eval template's 2 is no multiple of the 10 tasks


@pytest.mark.xdist_group("test_eval_tasks.task_set_run")
@pytest.mark.parametrize("override", [f"simulator.tasks=[{TASKS[1]},{TASKS[0]}]", f"simulator.tasks=[{TASKS[0]}]",
                                      f"simulator.tasks=[{','.join(TASKS)},drawer-close-v3]",
                                      "simulator.name=robosuite_lift", "~simulator.tasks"])
def test_an_override_of_the_runs_task_set_is_refused(task_set_run, override, tmp_path, capsys):
    """A reordered set evaluated each task with another task's one-hot, silently; a set of
    another size failed on data.init_states_per_step, which the user never set, or with a
    traceback from the workers."""
    out = tmp_path / "eval"
    assert main(["eval", str(task_set_run), *EVAL, override, "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    key = override.removeprefix("~").split("=")[0]
    assert err == (f"error: {key}: vla-rl eval of a run evaluates the tasks its checkpoints were trained on, the "
                   f"task set {TASKS} in this order (its task one-hot); evaluate other tasks with eval.benchmark "
                   "(and eval.tasks)"), err
    assert not out.exists()
    prepare_eval_dir([str(task_set_run)], ["eval.num_episodes=2", f"simulator.tasks=[{','.join(TASKS)}]"],
                     output=str(out))  # the run's own set, given again


def test_the_cluster_is_asked_for_a_second_simulator_pool_only_for_tasks_other_than_the_runs(tmp_path):
    """Two pools per worker were asked of the cluster for every evaluation: a single-task one was
    refused on the cluster that had trained it, naming simulator.actors_per_worker, already 1."""
    from vla_rl.eval_driver import simulator_pools_per_worker

    lift = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                     MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    _, own, _ = prepare_eval_dir([str(lift)], ["eval.num_episodes=3"])
    assert simulator_pools_per_worker(own.config) == 1
    _, benchmark, _ = prepare_eval_dir([str(lift)], ["eval.num_episodes=3", "eval.benchmark=robosuite"],
                                       output=str(tmp_path / "eval_benchmark"))
    assert simulator_pools_per_worker(benchmark.config) == 2  # Lift in its own pool, Stack, ... in another


@pytest.fixture(scope="module")
def lift_run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("outputs"), "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                     MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))


def test_a_lift_checkpoint_on_the_robosuite_benchmark_skips_the_tasks_it_cannot_read(ray_on_loopback, lift_run):
    assert main(["eval", str(lift_run), *EVAL, "eval.benchmark=robosuite", "eval.protocols=[greedy]"]) == 0
    eval_dir = lift_run / "eval"
    report = json.loads((eval_dir / "report.json").read_text())
    assert report["task_status"] == {"Lift": "complete", "Stack": "skipped", "PickPlaceCan": "skipped",
                                     "Door": "skipped"}
    assert [(r["task"], r["episodes"]) for r in report["results"]] == [("Lift", 2)]
    reasons = {s["task"]: s["reason"] for s in report["skipped"]}
    assert "(20 values) is not the policy's [robot0_eef_pos 3, robot0_gripper_qpos 2, cube_pos 3, " \
           "gripper_to_cube_pos 3, robot0_eef_quat 4] (15 values)" in reasons["Stack"]
    assert "door_pos 3" in reasons["Door"] and "Can_pos 3" in reasons["PickPlaceCan"]
    assert sorted(p.name for p in (eval_dir / "episodes").iterdir()) == ["Lift"]  # nothing else was rolled out
    assert "## Skipped tasks" in (eval_dir / "report.md").read_text()


def test_a_metaworld_run_is_evaluated_with_videos_from_metaworld_s_camera(ray_on_loopback, tmp_path):
    """A run that sets no eval.video_camera: its videos come from the simulator's own camera
    (MetaWorld's corner; robosuite's agentview is no MetaWorld camera), on the run's own task."""
    run_dir = write_run(tmp_path, "embodied_srpo", ["simulator.name=metaworld", "simulator.env={horizon: 60}",
                                                    "policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=39, action_dim=4, hidden_sizes=(8,)))
    assert main(["eval", str(run_dir), *EVAL, "eval.video_episodes=1", "eval.video_size=32",
                 "eval.protocols=[greedy]"]) == 0
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["task_status"] == {"metaworld": "complete"}
    videos = report["videos"]
    assert videos and all((run_dir / "eval" / v["file"]).stat().st_size > 0 for v in videos)
    import imageio.v3 as iio

    # in real time: one frame per control step of MetaWorld's 80 Hz (eval.video_fps's default is 20)
    assert {iio.immeta(run_dir / "eval" / v["file"])["fps"] for v in videos} == {80.0}


@pytest.mark.parametrize(("run_overrides", "eval_overrides", "camera"), [
    ([], [], "corner"),  # MetaWorld's own camera (eval.video_camera's default, agentview, is robosuite's)
    (["eval.video_camera=corner2"], [], "corner2"),  # the run's camera
    (["eval.video_camera=corner2"], ["eval.video_camera=topview"], "topview"),  # the evaluation's override
])
def test_the_video_camera_is_the_run_s_else_the_simulator_s(run_overrides, eval_overrides, camera, tmp_path):
    from vla_rl.evaluation.video import video_camera

    run_dir = write_run(tmp_path, "embodied_srpo", ["simulator.name=metaworld", "simulator.env={horizon: 60}",
                                                    "policy.config.hidden_sizes=[8]", *run_overrides],
                        MLPPolicyConfig(obs_dim=39, action_dim=4, hidden_sizes=(8,)))
    _, loaded, _ = prepare_eval_dir([str(run_dir)], eval_overrides)
    assert video_camera(loaded.config, "metaworld") == camera


@pytest.mark.parametrize(("run_overrides", "eval_overrides", "fps"), [
    ([], [], 80.0),  # MetaWorld's control frequency (eval.video_fps's default is 20)
    (["eval.video_fps=10"], [], 10.0),  # the run's
    (["eval.video_fps=10"], ["eval.video_fps=40"], 40.0),  # the evaluation's override
])
def test_videos_play_at_the_run_s_frame_rate_else_in_real_time(run_overrides, eval_overrides, fps, tmp_path):
    from vla_rl.evaluation.video import video_fps

    run_dir = write_run(tmp_path, "embodied_srpo", ["simulator.name=metaworld", "simulator.env={horizon: 60}",
                                                    "policy.config.hidden_sizes=[8]", *run_overrides],
                        MLPPolicyConfig(obs_dim=39, action_dim=4, hidden_sizes=(8,)))
    _, loaded, _ = prepare_eval_dir([str(run_dir)], eval_overrides)
    sim = loaded.config.simulator
    assert video_fps(loaded.config, sim.name, sim.env) == fps


def test_robosuite_videos_play_at_its_control_frequency():
    from vla_rl.dag.loader import load_template
    from vla_rl.evaluation.video import video_fps

    config = load_template("embodied_srpo").config
    assert video_fps(config, "robosuite_lift", {}) == 20.0
    assert video_fps(config, "robosuite_lift", {"control_freq": 10}) == 10.0
    assert video_fps(config, "remote", {"state_dim": 3, "action_dim": 2}) == 20.0  # it states none: the default


def test_a_robosuite_run_keeps_agentview():
    from vla_rl.dag.loader import load_template
    from vla_rl.evaluation.video import video_camera

    assert video_camera(load_template("embodied_srpo").config, "robosuite_lift") == "agentview"
    assert video_camera(load_template("embodied_srpo_mt10").config, "metaworld") == "corner"  # the template's


def test_a_remote_environment_records_no_videos():
    """Its clients send observations, never renders: the remote training recipe of docs/remote.md
    was refused for the evaluation videos' camera (tests/test_docs_recipes.py runs it)."""
    from vla_rl.evaluation.video import renders_videos

    assert all(renders_videos(name) for name in ("robosuite_lift", "metaworld", "libero"))
    assert not renders_videos("remote")


def test_a_run_whose_simulator_cannot_render_says_it_records_no_videos():
    """A remote or plug-in environment without ``render_camera`` recorded no video silently though
    ``eval.video_episodes`` asked for some; the driver prints this line."""
    from vla_rl.dag.loader import load_template
    from vla_rl.evaluation.video import no_videos_note

    remote = ["simulator.name=remote", "simulator.env.state_dim=15", "simulator.env.action_dim=7"]
    note = no_videos_note(load_template("embodied_srpo", remote).config)
    assert note is not None and "eval.video_episodes=3" in note and "remote simulator" in note
    assert "render_camera" in note
    assert no_videos_note(load_template("embodied_srpo", [*remote, "eval.video_episodes=0"]).config) is None
    assert no_videos_note(load_template("embodied_srpo").config) is None  # robosuite renders
    assert no_videos_note(load_template("llm_grpo").config) is None


def test_an_evaluation_from_a_camera_robosuite_lacks_is_refused_before_it_starts(tmp_path, capsys):
    """robosuite's config does not know its cameras: the camera was found by the simulator actors
    at the first video before; now the driver asks robosuite (its ``check_config``) and the
    command is one line naming eval.video_camera, exit status 2, nothing evaluated."""
    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    assert main(["eval", str(run_dir), *EVAL, "eval.video_episodes=1", "eval.video_camera=sideveiw"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert ("eval.video_camera: task robosuite_lift cannot render videos from camera 'sideveiw' "
            "(['sideveiw'] not a camera of Lift; available: ['frontview',") in error
    assert not (run_dir / "eval" / "report.json").exists()


def _stored_lift_evaluation(tmp_path, horizon: int):
    """A Lift run with an earlier evaluation in its eval/: the resolved template, one stored episode
    of ``simulator.env.horizon=horizon`` (attributes as the workers record them) and its report."""
    from simulators.registry import SETTINGS_FORMAT, canonical_env
    from vla_rl.evaluation.benchmarks import resolve_tasks
    from vla_rl.evaluation.episode_store import open_rank_store
    from vla_rl_core.env_spec import EnvSpec

    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    eval_dir, loaded, _ = prepare_eval_dir([str(run_dir)], [f"simulator.env.horizon={horizon}"])
    (task,) = resolve_tasks(loaded.config)
    open_rank_store(eval_dir, task.name, 0, EnvSpec(obs_dim=15, action_dim=7, horizon=horizon), 1,
                    {"task": task.name, "simulator": task.simulator, "env": canonical_env(task.simulator, task.env),
                     "settings_format": SETTINGS_FORMAT}, True)
    (eval_dir / "report.json").write_text('{"earlier": "report"}')
    return run_dir, eval_dir


#: EVAL without its horizon
EVAL_ANY_HORIZON = [o for o in EVAL if not o.startswith("simulator.env.horizon=")]


def test_an_evaluation_that_changes_the_stored_tasks_settings_is_refused_before_it_writes(tmp_path, capsys):
    """A store holds episodes of horizon 6; the same evaluation at horizon 30 is one line naming the
    store and both settings, exit status 2, before any worker starts: the earlier template and
    report are as they were (the workers found it before, after the driver had rewritten both)."""
    run_dir, eval_dir = _stored_lift_evaluation(tmp_path, 6)
    template = (eval_dir / "template.yaml").read_text()
    assert main(["eval", str(run_dir), *EVAL_ANY_HORIZON, "simulator.env.horizon=30"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "rank0.zarr holds episodes of task 'robosuite_lift' with other settings (simulator.env.horizon: 6 in " \
           "the store, 30 here); evaluate into another directory" in error and "Traceback" not in error
    assert (eval_dir / "template.yaml").read_text() == template
    assert (eval_dir / "report.json").read_text() == '{"earlier": "report"}'


def test_an_evaluation_of_no_episodes_is_refused(tmp_path, capsys):
    run_dir, eval_dir = _stored_lift_evaluation(tmp_path, 6)
    # without the video setting, which no evaluation of no episodes would read (refused as such)
    no_video = [o for o in EVAL_ANY_HORIZON if not o.startswith("eval.video_episodes=")]
    assert main(["eval", str(run_dir), *no_video, "simulator.env.horizon=6", "eval.num_episodes=0"]) == 2
    assert "eval.num_episodes=0: an evaluation runs at least one episode of each task" in capsys.readouterr().err
    assert (eval_dir / "report.json").read_text() == '{"earlier": "report"}'


@pytest.mark.parametrize(("override", "field"), [("eval.num_episodez=6", "eval.num_episodez"),
                                                 ("eval.protocols=[foo]", "eval.protocols[0]")])
def test_a_bad_override_is_named_as_typed_not_as_a_template_file(override, field, tmp_path, capsys):
    """It was blamed on `<eval dir>/template.yaml`, a file the user never wrote (and that a new
    evaluation directory never holds after the error)."""
    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    assert main(["eval", str(run_dir), "--output", str(tmp_path / "ev"), override]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(f"error: field '{field}': ") and f"(override '{override}')" in err, err
    assert "template.yaml" not in err and not (tmp_path / "ev").exists()


def test_a_benchmark_of_a_simulator_not_installed_here_is_refused_before_it_starts(tmp_path, capsys):
    """``eval.benchmark=libero_spatial`` of a robosuite run without LIBERO's extra: one line naming
    the field and the install command, exit status 2, no evaluation directory (the run's own check
    did not see the benchmark's simulator: the workers raised it after Ray had started)."""
    from vla_rl.preflight import simulator_unavailable

    if simulator_unavailable("libero") is None:
        pytest.skip("LIBERO is installed here")
    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    assert main(["eval", str(run_dir), *EVAL, "eval.benchmark=libero_spatial"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, errors
    assert "eval.benchmark: the tasks of simulator 'libero' cannot run here: LIBERO is not installed" in errors[0]
    assert not (run_dir / "eval").exists()


def test_an_evaluation_stopped_before_ray_starts_leaves_no_directory(tmp_path, capsys, monkeypatch):
    """A cluster that refuses the driver (no token) stops ``vla-rl eval`` in one line; the
    evaluation directory it had just made, holding only its template, is removed (it was left
    behind), while a directory holding an earlier evaluation keeps everything."""
    import vla_rl.workers.group as workers_group
    from vla_rl.errors import RunStopped

    def refused(*args, **kwargs):
        raise RunStopped("the Ray cluster at 127.0.0.1:6390 refused this driver's token")

    monkeypatch.setattr(workers_group, "start_ray", refused)
    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    assert main(["eval", str(run_dir), *EVAL, "--output", str(tmp_path / "eval1")]) == 1
    assert "refused this driver's token" in capsys.readouterr().err
    assert not (tmp_path / "eval1").exists()
    earlier, _, _ = prepare_eval_dir([str(run_dir)], EVAL, output=str(tmp_path / "eval2"))
    (earlier / "report.json").write_text('{"earlier": "report"}')
    assert main(["eval", str(run_dir), *EVAL, "--output", str(earlier)]) == 1
    assert (earlier / "report.json").read_text() == '{"earlier": "report"}' and (earlier / "template.yaml").exists()


def test_an_evaluation_of_other_checkpoints_or_protocols_does_not_replace_the_earlier_report(tmp_path):
    """`vla-rl eval RUN` then `vla-rl eval RUN/checkpoints/step_3 eval.protocols=[greedy]` into the
    same eval/ replaced the report of steps 1 and 2 (both protocols) by step 3's greedy row alone,
    silently; now the second is refused before anything is written, and the same selection
    continues the first."""
    from vla_rl.evaluation.targets import EvalInputError

    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)), steps=(1, 2, 3))
    eval_dir, _, _ = prepare_eval_dir([str(run_dir)], ["eval.num_episodes=2"], steps=[1, 2])
    written = (eval_dir / "template.yaml").read_text()
    with pytest.raises(EvalInputError, match=r"holds an evaluation of step_00000001, step_00000002 \(greedy, "
                                             r"sampled@1\), and this one evaluates step_00000003 \(greedy\): its "
                                             r"report would drop rows of that one's; name another --output"):
        prepare_eval_dir([str(run_dir / "checkpoints" / "step_00000003")], ["eval.protocols=[greedy]"])
    with pytest.raises(EvalInputError, match=r"this one evaluates step_00000001, step_00000002 \(greedy, sampled@0.5"):
        prepare_eval_dir([str(run_dir)], ["eval.temperature=0.5"], steps=[1, 2])
    with pytest.raises(EvalInputError, match=r"this one evaluates step_00000002, step_00000003 \(greedy, sampled@1"):
        prepare_eval_dir([str(run_dir)], [], steps=[2, 3])
    assert (eval_dir / "template.yaml").read_text() == written
    prepare_eval_dir([str(run_dir)], ["eval.num_episodes=4"], steps=[1, 2])  # the same rows: it continues
    prepare_eval_dir([str(run_dir)], [])  # every checkpoint, after training went on: it adds step 3's rows
    other, _, _ = prepare_eval_dir([str(run_dir / "checkpoints" / "step_00000003")], ["eval.protocols=[greedy]"],
                                   output=str(tmp_path / "step3"))
    assert other == tmp_path / "step3"
    # training on pruned step 1 (trainer.keep_last): the refusal says so (it named only the steps)
    import shutil

    shutil.rmtree(run_dir / "checkpoints" / "step_00000001")
    with pytest.raises(EvalInputError, match=r"this one evaluates step_00000002, step_00000003 \(greedy, sampled@1\) "
                                             r"\(step_00000001 no longer in .*checkpoints: training on pruned it, "
                                             r"trainer.keep_last; raise trainer.keep_last before training on"):
        prepare_eval_dir([str(run_dir)], [])
    from vla_rl.eval_output import _covers  # a template's policy (no checkpoint) is a row checkpoints do not hold
    assert not _covers((("step_00000003",), ("greedy",), None, None), ((), ("greedy",), None, None), ("Lift",))
    assert _covers(((), ("greedy", "sampled@1"), None, None), ((), ("greedy",), None, None), ("Lift",))


def test_an_evaluation_of_another_runs_checkpoints_of_the_same_names_is_refused(tmp_path):
    """`vla-rl eval RUN_B --output RUN_A/eval` found every planned episode stored (by RUN_A's
    step_00000001 and step_00000002, of the same names) and reported RUN_A's success rates as
    RUN_B's, exit 0. Checkpoints are now told apart by their files; a copy of RUN_A is RUN_A."""
    import shutil

    from vla_rl.evaluation.targets import EvalInputError

    mlp = ("embodied_srpo", ["policy.config.hidden_sizes=[8]"], MLPPolicyConfig(obs_dim=15, action_dim=7,
                                                                                 hidden_sizes=(8,)))
    run_a = write_run(tmp_path / "a", *mlp, steps=(1, 2))
    run_b = write_run(tmp_path / "b", *mlp, steps=(1, 2), seed=10)
    eval_dir, _, _ = prepare_eval_dir([str(run_a)], ["eval.num_episodes=2"])
    written = (eval_dir / "template.yaml").read_text()
    def another(evaluated) -> str:
        return (rf"--output {eval_dir} holds an evaluation of another step_00000001 \({evaluated}/checkpoints/"
                rf"step_00000001, whose files differ from those of {run_b}/checkpoints/step_00000001\): its episodes "
                r"would be reported as this one's; name another --output")

    with pytest.raises(EvalInputError, match=another(run_a)):
        prepare_eval_dir([str(run_b)], ["eval.num_episodes=2"], output=str(eval_dir))
    assert (eval_dir / "template.yaml").read_text() == written
    copy = shutil.copytree(run_a, tmp_path / "copy")  # the same checkpoints elsewhere: the same evaluation
    prepare_eval_dir([str(copy)], ["eval.num_episodes=2"], output=str(eval_dir))
    (eval_dir / "checkpoints.json").unlink()  # an evaluation before the record: the checkpoints its template names
    with pytest.raises(EvalInputError, match=another(copy)):
        prepare_eval_dir([str(run_b)], ["eval.num_episodes=2"], output=str(eval_dir))
    run_c = write_run(tmp_path / "c", *mlp, steps=(1,))  # step 1 as run A's: it names where they are, no pruning
    with pytest.raises(EvalInputError, match=rf"evaluates step_00000001 \(greedy, sampled@1\) \(that one's "
                                             rf"checkpoints are in {copy}/checkpoints; this one's in "
                                             rf"{run_c}/checkpoints\): its report would drop rows"):
        prepare_eval_dir([str(run_c)], ["eval.num_episodes=2"], output=str(eval_dir))


def test_an_evaluation_directory_in_use_is_refused_before_anything_is_written(tmp_path):
    """Two evaluations into one directory both wrote its report, stores and videos."""
    import os

    from vla_rl.eval_driver import _lock_evaluation
    from vla_rl.evaluation.targets import EvalInputError
    from vla_rl_core.dir_lock import unlock_directory

    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    eval_dir, _, _ = prepare_eval_dir([str(run_dir)], ["eval.num_episodes=2"])
    lock = _lock_evaluation(eval_dir, False)  # the first evaluation, running
    written = (eval_dir / "template.yaml").read_text()
    in_use = rf"{eval_dir} is in use by another evaluation \(pid {os.getpid()}\)"
    with pytest.raises(EvalInputError, match=in_use):
        prepare_eval_dir([str(run_dir)], ["eval.num_episodes=4"])
    with pytest.raises(EvalInputError, match=in_use):
        _lock_evaluation(eval_dir, False)
    assert (eval_dir / "template.yaml").read_text() == written
    unlock_directory(lock)
    prepare_eval_dir([str(run_dir)], ["eval.num_episodes=4"])  # once it ended


def test_an_output_directory_holding_other_files_is_refused(tmp_path):
    """`vla-rl eval RUN --output lift_eval`, a LeRobot dataset, ran 200 episodes into it, its
    videos among the dataset's."""
    from vla_rl.evaluation.targets import EvalInputError

    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    dataset = tmp_path / "lift_eval"
    (dataset / "meta").mkdir(parents=True)
    (dataset / "meta" / "info.json").write_text("{}")
    with pytest.raises(EvalInputError, match=rf"^--output {dataset} holds files but no evaluation \(no template.yaml, "
                                             r"episodes/ or report\)"):
        prepare_eval_dir([str(run_dir)], [], output=str(dataset))
    assert sorted(p.name for p in dataset.iterdir()) == ["meta"]
    (tmp_path / "empty").mkdir()
    assert prepare_eval_dir([str(run_dir)], [], output=str(tmp_path / "empty"))[0] == tmp_path / "empty"


def test_a_benchmark_evaluation_of_all_tasks_continues_with_them_named(tmp_path):
    """An evaluation of ``eval.benchmark=robosuite`` (``eval.tasks`` null: all four) then the same
    with the four named was refused as dropping rows; one of fewer tasks still is, naming them."""
    from vla_rl.evaluation.benchmarks import ROBOSUITE_TASKS
    from vla_rl.evaluation.targets import EvalInputError

    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    benchmark = ["eval.benchmark=robosuite", "eval.num_episodes=2"]
    prepare_eval_dir([str(run_dir)], benchmark)
    prepare_eval_dir([str(run_dir)], [*benchmark, f"eval.tasks=[{','.join(ROBOSUITE_TASKS)}]"])
    with pytest.raises(EvalInputError, match=r"holds an evaluation of step_00000001 \(greedy, sampled@1, benchmark "
                                             r"robosuite\), and this one evaluates step_00000001 \(greedy, sampled@1, "
                                             r"benchmark robosuite, tasks \['Lift', 'Door'\]\)"):
        prepare_eval_dir([str(run_dir)], [*benchmark, "eval.tasks=[Lift,Door]"])
    own = tmp_path / "own"  # the run's own task, named, is all of its tasks; the robosuite benchmark's are others
    prepare_eval_dir([str(run_dir)], ["eval.num_episodes=2", "eval.tasks=[robosuite_lift]"], output=str(own))
    with pytest.raises(EvalInputError, match=r"holds an evaluation of step_00000001 \(greedy, sampled@1, tasks "
                                             r"\['robosuite_lift'\]\), and this one evaluates step_00000001 \(greedy, "
                                             r"sampled@1, benchmark robosuite\)"):
        prepare_eval_dir([str(run_dir)], benchmark, output=str(own))


def test_an_evaluation_of_a_remote_run_says_how_many_clients_it_needs(ray_on_loopback, tmp_path, capsys):
    """The training command printed it; vla-rl eval waited for clients without saying how many."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run_dir = write_run(tmp_path, "embodied_srpo", ["simulator.name=remote", "simulator.env.state_dim=15",
                                                    "simulator.env.action_dim=7", f"simulator.env.port={port}",
                                                    "simulator.env.connect_timeout_s=2", "warm_start.num_demos=0",
                                                    "policy.config.hidden_sizes=[8]"],
                        MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    assert main(["eval", str(run_dir), *EVAL, "eval.num_episodes=3", "eval.protocols=[greedy]"]) == 1
    out, err = capsys.readouterr()
    assert f"remote environments: connect at least 3 clients to ws://127.0.0.1:{port} (the evaluation" in \
        " ".join(out.split())
    assert "error: no remote environment was free within simulator.env.connect_timeout_s=2 s" in err


def test_ctrl_c_during_an_evaluation_kills_its_workers_at_once(ray_on_loopback, lift_run, monkeypatch, tmp_path):
    """They were shut down gracefully: a worker still setting up held the command 30 s after Ctrl-C."""
    calls = []

    class Workers:
        max_reply_bytes = 0

        def start_process_group(self) -> None:
            pass

        def call(self, method: str, *args) -> None:
            calls.append(method)

        def kill(self) -> None:
            calls.append("kill")

        def shutdown(self) -> None:
            calls.append("shutdown")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(group_module.WorkerGroup, "launch", staticmethod(lambda *args, **kwargs: Workers()))
    monkeypatch.setattr(group_module, "run_evaluation", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate([str(lift_run)], EVAL, output=str(tmp_path / "evaluation"))
    assert calls == ["setup", "kill"]
