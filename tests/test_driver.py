"""End-to-end runs of the embodied templates on tiny settings, through the real engine: Ray on
loopback, two DAG workers with a gloo process group, simulator actors, re-shards every step."""

from __future__ import annotations

import json
import re

import pytest
import torch
from devices import TEST_DEVICE_KIND, device_overrides
from listeners import ListenerWatch, is_loopback
from safetensors.torch import load_file

from vla_rl.driver import WorkerGroup, train
from vla_rl.errors import RunStopped
from vla_rl.utils.host import cpu_model

TINY = [
    "trainer.total_steps=3",
    "trainer.save_every=1",
    "trainer.ppo_mini_batch_size=4",
    "trainer.ppo_epochs=2",
    "data.init_states_per_step=2",
    "data.group_size=3",
    "simulator.env.horizon=40",
    "eval.num_episodes=4",
    "eval.video_episodes=1",
    "eval.video_size=32",
    "warm_start.bc_steps=30",
    "policy.config.hidden_sizes=[32,32]",
    *device_overrides(),
]
#: On top of TINY: a warm start that succeeds now and then, and every group kept, so that the steps
#: update the policy (with TINY alone no group has a success, SRPO's rewards are all 0 and no step
#: trains: a resume test would pass whatever was restored).
TRAINS = ["simulator.env.horizon=100", "warm_start.bc_steps=1500", "data.group_size=4",
          "algorithm.filter_groups.success_rate_band=null"]


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    return tmp_path_factory.mktemp("demos") / "lift_demos.zarr"


@pytest.fixture(scope="module")
def srpo_run(ray_on_loopback, tmp_path_factory, demo_store):
    out = tmp_path_factory.mktemp("runs")
    with ListenerWatch() as watch:
        summary = train("embodied_srpo", [*TINY, f"run.output_dir={out}", "run.name=full",
                                          f"warm_start.demo_store={demo_store}"])
    return summary, out / "full", watch


@pytest.mark.xdist_group("test_driver.srpo_run")
def test_run_leaves_every_artifact(srpo_run):
    summary, run_dir, _ = srpo_run
    for name in ("template.yaml", "metrics.jsonl", "success_rate.png", "summary.json",
                 "videos/warm_start.mp4", "videos/final.mp4"):
        assert (run_dir / name).stat().st_size > 0, name
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    # How each rank's simulator actors render (simulators/rendering.py), in the summary file too.
    rendering = json.loads((run_dir / "summary.json").read_text())["rendering"]
    assert rendering == summary["rendering"] and len(rendering) == 2
    assert all(rank and {"backend", "device_id", "gpu", "gl_renderer"} <= set(rank[0]) for rank in rendering)
    # The machine of each rank (vla_rl/utils/host.py), as the workers saw it: this one, and on CUDA its GPU.
    hosts = json.loads((run_dir / "summary.json").read_text())["hosts"]
    gpu = torch.cuda.get_device_name(0) if TEST_DEVICE_KIND == "cuda" else None
    assert hosts == summary["hosts"] and len(hosts) == 2
    assert all((h["cpu"], h["cpu_flags"]) == cpu_model() and h["gpu"] == gpu and h["torch"] == torch.__version__
               for h in hosts)
    # every start of the workers' machines (one start here; a resume on another machine would add its own)
    assert (summary["run_hosts"], summary["hosts_unrecorded"]) == ([hosts[0]], False)
    assert [json.loads(line)["hosts"] for line in (run_dir / "hosts.jsonl").read_text().splitlines()] == [hosts]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if "rollout/success_rate" in r]
    assert train_steps == [1, 2, 3]
    # every step says how many updates it made, 0 too (TINY's filter keeps few groups: a step that
    # kept none lost actor/num_updates); evaluations log no training rollout time (an audit saw
    # timing/env_interact twice at a step, the evaluation's beside the step's)
    assert all("actor/num_updates" in r for r in records if "rollout/success_rate" in r)
    assert not [r["step"] for r in records if "timing/env_interact" in r and "rollout/success_rate" not in r]
    step = next(r for r in records if "rollout/success_rate" in r)
    # Every node ran, the kept episodes were rebalanced before the update (the only re-shard: every
    # node runs at DP 2), and the rollout really stepped the simulator.
    for key in ("timing/tasks", "timing/rollout", "timing/env_interact", "timing/reward", "timing/advantage",
                "timing/group_filter", "timing/actor_update", "timing/reshard_group_filter_to_actor_update"):
        assert key in step, key
    assert step["rollout/env_steps_per_s"] == pytest.approx(step["rollout/env_steps"] / step["timing/env_interact"])
    assert not [key for key in step if key.startswith("timing/reshard_") and "actor_update" not in key]
    # What the step's collectives moved (the SRPO reference set among them) and what reached the driver.
    assert step["comm/collectives"] >= 5 and step["comm/srpo_reference/collectives"] == 3
    assert 0 < step["comm/bytes_received"] <= step["comm/bytes_received_max"]
    assert 0 < step["driver/bytes"] < 8_000
    assert 1 <= step["rollout/episode_length"] <= 40
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert ckpts == ["step_00000002", "step_00000003"]  # keep_last=2
    latest = run_dir / "checkpoints" / "step_00000003"
    assert {"model.safetensors", "optimizer.safetensors", "rng_rank0.safetensors", "rng_rank1.safetensors"} <= {
        p.name for p in latest.iterdir()}
    for tag in ("warm_start_eval", "final_eval"):
        ev = summary[tag]
        assert ev["eval/greedy/episodes"] == 4
        assert 0 <= ev["eval/greedy/ci_low"] <= ev["eval/greedy/success_rate"] <= ev["eval/greedy/ci_high"] <= 1


@pytest.mark.xdist_group("test_driver.srpo_run")
def test_driver_receives_only_small_scalar_replies(srpo_run):
    summary, run_dir, _ = srpo_run
    # A step's batch (2 groups x 3 episodes x 41 x 19 observations alone) is far bigger than this.
    assert 0 < summary["driver_max_reply_bytes"] < 8_000


@pytest.mark.xdist_group("test_driver.srpo_run")
def test_every_listener_of_the_run_is_on_loopback(srpo_run):
    _, _, watch = srpo_run
    assert any(name.startswith("gcs_server") for name, _, _ in watch.seen), watch.seen
    assert any("DAGWorker" in name for name, _, _ in watch.seen), watch.seen  # the TCP store
    outside = [(*s, watch.owners.get(s[1:])) for s in watch.seen if not is_loopback(s[1])]
    assert not outside, f"listening outside 127.0.0.0/8: {outside}"


def test_resume_continues_exactly(ray_on_loopback, tmp_path, demo_store, capsys):
    """Two steps, then resume for the third: same step counter, same weights as the
    uninterrupted run (the rollout, minibatch RNG and optimizer state are all restored), although
    the cut run also evaluated after every step (evaluations draw their own noise, never the
    training's: before, an evaluation before a checkpoint changed the streams it saved)."""
    common = [*TINY, *TRAINS, f"run.output_dir={tmp_path}", f"warm_start.demo_store={tmp_path / 'demos.zarr'}"]
    full_summary = train("embodied_srpo", [*common, "run.name=full"])
    full_dir = tmp_path / "full"
    train("embodied_srpo", [*common, "run.name=cut", "trainer.total_steps=2", "eval.every_steps=1"])
    summary = train("ignored", ["trainer.total_steps=3"], resume=str(tmp_path / "cut"))
    assert summary["start_step"] == 2 and summary["steps_run"] == 1
    # The summary keeps the run's warm-start evaluation, logged before the resume (a seed sweep's
    # report reads it), and the improvement over it.
    figures = [{k: v for k, v in ev.items() if not k.startswith("timing/")}
               for ev in (summary["warm_start_eval"], full_summary["warm_start_eval"])]
    assert figures[0] == figures[1] and "eval/greedy/success_rate" in figures[0]
    assert "improvement_points/greedy" in summary
    # Recorded once the workers had loaded the checkpoint with them (a later resume applies them).
    resumes = [json.loads(line) for line in (tmp_path / "cut" / "resumes.jsonl").read_text().splitlines()]
    assert [r["overrides"] for r in resumes] == [["trainer.total_steps=3"]]
    records = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "rollout/success_rate" in r] == [1, 2, 3]
    # The environment-step count carries over the interruption.
    full = [json.loads(line) for line in (full_dir / "metrics.jsonl").read_text().splitlines()]
    total_env_steps = [[r["rollout/total_env_steps"] for r in rs if "rollout/total_env_steps" in r] for rs in (records, full)]
    assert total_env_steps[0] == total_env_steps[1] and total_env_steps[0][0] < total_env_steps[0][-1]
    weights = {step: load_file(str(full_dir / "checkpoints" / f"step_0000000{step}" / "model.safetensors"))
               for step in (2, 3)}
    assert any(not torch.equal(weights[2][name], weights[3][name]) for name in weights[3])  # step 3 trained
    resumed = load_file(str(tmp_path / "cut" / "checkpoints" / "step_00000003" / "model.safetensors"))
    for name, value in weights[3].items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)
    # The checkpoint records the count, which a resume continues from: metric lines lost (a machine
    # crash after the checkpoint was synced) undercounted it silently, from metrics.jsonl's last line.
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    assert state["metadata"]["run"] == {"env_steps": total_env_steps[0][-1]}
    metrics_file = tmp_path / "cut" / "metrics.jsonl"
    metrics_file.write_text("".join(line + "\n" for line in metrics_file.read_text().splitlines()
                                    if json.loads(line)["step"] < 2))
    capsys.readouterr()
    train("ignored", ["trainer.total_steps=4"], resume=str(tmp_path / "cut"))
    assert re.search(r"gives \d+ environment steps by step 3, its checkpoint \d+: metric lines were lost",
                     " ".join(capsys.readouterr().out.split())), "no warning of the lost lines"
    [fourth] = [json.loads(line) for line in metrics_file.read_text().splitlines()
                if json.loads(line)["step"] == 4 and "rollout/total_env_steps" in json.loads(line)]
    assert fourth["rollout/total_env_steps"] == total_env_steps[0][-1] + fourth["rollout/env_steps"]


def test_a_start_that_fails_in_the_workers_leaves_no_run_directory(ray_on_loopback, tmp_path, capsys, monkeypatch):
    """The workers' setup fails after the run directory exists (a robosuite observation key that
    does not exist, found when the simulator builds its environments: the driver's own check of
    it, tests/test_preflight.py, is left out here): nothing was written that a resume could use,
    so the directory goes and the same command (the same run.name) is not refused
    (tests/test_run_dir.py runs it twice)."""
    monkeypatch.setattr("vla_rl.driver.check_simulator", lambda config: None)
    # one line naming the worker and the field (the simulator actor's error, through its worker)
    with pytest.raises(RunStopped, match=r"^worker \d: simulator.env.obs_keys: \['no_such_key'\] not an observation of "
                       r"Lift; available: \['cube_pos', [^\n]*\]$"):
        train("embodied_srpo", [*TINY, "simulator.env.obs_keys=[no_such_key]", f"run.output_dir={tmp_path}",
                                "run.name=again", *device_overrides()])
    assert not (tmp_path / "again").exists()
    assert "removed the run directory" in " ".join(capsys.readouterr().out.split())


def test_grpo_template_runs_until_the_env_step_budget(ray_on_loopback, tmp_path, demo_store):
    """3 steps asked, but the budget of 1 environment step ends training after the first."""
    no_eval = [o for o in TINY if not o.startswith("eval.")]  # the video settings: never read without episodes
    summary = train("embodied_grpo", [*no_eval, "trainer.total_steps=3", "trainer.total_env_steps=1",
                                      "eval.num_episodes=0", f"run.output_dir={tmp_path}", "run.name=grpo",
                                      f"warm_start.demo_store={demo_store}"])
    assert summary["steps_run"] == 1 and summary["last_step"] == 1 and summary["env_steps"] >= 1
    assert (tmp_path / "grpo" / "checkpoints" / "step_00000001").is_dir()
    resolved = (tmp_path / "grpo" / "template.yaml").read_text()
    assert "reward: success" in resolved
    # Killed during its final evaluation (no summary.json): the resume ends it without training a
    # step past the budget (it trained one more, and logged a second final evaluation).
    (tmp_path / "grpo" / "summary.json").unlink()
    resumed = train("ignored", [], resume=str(tmp_path / "grpo"))
    assert resumed["steps_run"] == 0 and resumed["last_step"] == 1 and resumed["env_steps"] == summary["env_steps"]
    assert not (tmp_path / "grpo" / "checkpoints" / "step_00000002").exists()


def test_worker_group_refuses_non_scalar_replies(ray_on_loopback):
    import ray

    @ray.remote
    class Leaky:
        def run_step(self, step):
            return {"obs": torch.zeros(4)}

    group = WorkerGroup([Leaky.remote()])
    with pytest.raises(TypeError, match="not scalar metrics"):
        group.call("run_step", 0)


def test_a_remote_run_says_how_many_clients_it_needs():
    """The docs' 8 clients for the default embodied_srpo (64 episodes a step, 50 per evaluation)
    waited 300 s for clients that would never come: every environment of every worker's pool runs
    an episode at once and keeps its client. The driver now prints how many to connect."""
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan
    from vla_rl.workflows.embodied import remote_clients_note

    remote = ["simulator.name=remote", "simulator.env.state_dim=15", "simulator.env.action_dim=7",
              "warm_start.num_demos=0"]
    cases = [([], 64),  # 8 x 8 a step over 2 workers: 32 each (more than 25 evaluation episodes each)
             (["data.init_states_per_step=2", "data.group_size=4", "eval.num_episodes=8"], 8),
             (["data.init_states_per_step=2", "data.group_size=4", "eval.num_episodes=50"], 50),
             (["data.init_states_per_step=2", "data.group_size=4", "eval.num_episodes=5"], 8)]
    for overrides, needed in cases:
        template = load_template("embodied_srpo", [*remote, *overrides])
        note = remote_clients_note(template.config, plan(template))
        assert note.startswith(f"remote environments: connect at least {needed} clients to ws://127.0.0.1:8765"), \
            overrides
    assert remote_clients_note(load_template("embodied_srpo").config, plan(load_template("embodied_srpo"))) is None
    everywhere = load_template("embodied_srpo", [*remote, "simulator.env.host=0.0.0.0"])
    assert "to ws://<this machine>:8765" in remote_clients_note(everywhere.config, plan(everywhere))
    # vla-rl eval rolls out only its held-out episodes, all of a protocol's at once
    for overrides, needed in [([], 50), (["eval.num_episodes=5"], 5), (["eval.num_episodes=7"], 7)]:
        template = load_template("embodied_srpo", [*remote, *overrides])
        note = remote_clients_note(template.config, plan(template), evaluation=True)
        assert note.startswith(f"remote environments: connect at least {needed} clients"), overrides
        assert "the evaluation rolls out" in note


def test_settings_that_refuse_the_device_auto_resolves_to_stop_the_run_in_one_line(tmp_path):
    """bf16 with workers.device=auto on a machine without an accelerator: every worker refused it
    with a traceback (an ActorDiedError); the driver checks it once Ray says which device."""
    from vla_rl.driver import _check_resolved_device, prepare_run_dir

    run, _, worker_overrides = prepare_run_dir("embodied_grpo", [f"run.output_dir={tmp_path}", "run.name=bf16",
                                                                 "workers.device=auto", "trainer.mixed_precision=bf16"],
                                               resume=None)
    try:
        _check_resolved_device(run, worker_overrides, "auto", "cuda")  # what the settings are for
        with pytest.raises(RunStopped) as info:
            _check_resolved_device(run, worker_overrides, "auto", "cpu")
        assert str(info.value).startswith("workers.device auto resolves to cpu in this Ray cluster")
        assert "trainer.mixed_precision bf16 needs accelerator workers" in str(info.value)
        assert "\n" not in str(info.value)
    finally:
        run.close()
