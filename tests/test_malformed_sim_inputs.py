"""Simulator settings and evaluation inputs that used to plan and fail late, through ``vla-rl``:
each is refused with one red line naming the field or file, exit status 2, no traceback, and
nothing written (issue 29, items 9, 11 and 12). ``train`` refuses at plan time, before Ray starts:
the output directory stays empty. ``eval`` refuses a damaged episode store before it writes
anything: the evaluation directory (its last good report included) stays byte for byte as it was.
(Malformed templates and overrides in general: tests/test_malformed_inputs.py.)"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from test_malformed_inputs import refused

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.checkpoints import files as checkpoint
from vla_rl.driver import prepare_run_dir
from vla_rl.evaluation.episode_store import append_episodes, open_rank_store
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

#: (case, CLI arguments (``{out}``: an empty directory), text the error line must contain)
PLAN_CASES = [
    ("unknown robot", ["plan", "embodied_srpo", "simulator.env.robot=NoSuchRobot"],
     "robot must be a single-arm robosuite robot, one of IIWA, Jaco, Kinova3, Panda"),
    ("two-arm robot", ["plan", "embodied_srpo", "simulator.env.robot=Baxter"], "single-arm robosuite robot"),
    ("horizon below the PickPlaceCan expert",
     ["train", "embodied_srpo", "simulator.env.task=PickPlaceCan", "simulator.env.horizon=30", "run.output_dir={out}"],
     "simulator.env.horizon=30 is too short for the scripted expert of PickPlaceCan with robot Panda"),
    ("horizon below the Lift expert on a Sawyer",
     ["train", "embodied_srpo", "simulator.env.robot=Sawyer", "simulator.env.horizon=30", "run.output_dir={out}"],
     "simulator.env.horizon=30 is too short for the scripted expert of Lift with robot Sawyer"),
    ("horizon below an ml10_test expert",
     ["train", "embodied_srpo_mt10", "simulator.tasks=ml10_test", "simulator.env.horizon=30", "run.output_dir={out}"],
     "simulator.env.horizon=30 is too short for the scripted expert of drawer-open-v3"),
    ("robot the expert makes no demonstration with",
     ["train", "embodied_srpo", "simulator.env.robot=Jaco", "run.output_dir={out}"],
     "the scripted expert of Lift made no demonstration with robot Jaco"),
    # A camera the policy reads and the simulator does not render: found at the first rollout,
    # 2.6 minutes into embodied_srpo_pi0_lift on this machine, before this check.
    ("π0 camera the simulator does not render",
     ["train", "embodied_srpo_pi0_lift", "policy.config.cameras=[agentview,robot0_eye_in_hand]",
      "run.output_dir={out}"],
     "field 'policy.config.cameras': the policy reads ['robot0_eye_in_hand'], which the simulator does not render "
     "(simulator.env.cameras: ['agentview'])"),
    # More simulator actors than a worker's environments: the idle ones held a CPU each (a cluster
    # that could run the job was refused as too small, or the job waited for CPUs).
    ("more simulator actors than environments", ["plan", "embodied_srpo", "simulator.actors_per_worker=33"],
     "field 'simulator.actors_per_worker': 33 simulator actors per worker, but a worker's pool runs 32 "
     "environment(s) at once"),
    ("more simulator actors than evaluation environments",
     ["train", "embodied_grpo", "data.init_states_per_step=2", "data.group_size=2", "eval.num_episodes=6",
      "simulator.actors_per_worker=4", "run.output_dir={out}"], "use at most 3"),
    ("OFT camera and no camera rendered",
     ["train", "embodied_srpo_oft_lift", "simulator.env.cameras=[]", "run.output_dir={out}"],
     "field 'policy.config.cameras': the policy reads ['agentview'], which the simulator does not render"),
]


@pytest.mark.parametrize(("case", "args", "expected"), PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_simulator_settings_that_would_fail_late_are_refused_at_plan_time(case, args, expected, tmp_path, capsys):
    out = tmp_path / "outputs"
    out.mkdir()
    refused(capsys, [a.format(out=out) for a in args], expected)
    assert not any(out.iterdir())  # refused before the run directory (and Ray)


REMOTE = ["simulator.name=remote", "simulator.env.state_dim=15", "simulator.env.action_dim=7", "warm_start.num_demos=0"]


def test_a_remote_run_whose_hub_port_is_taken_is_refused_before_it_starts(tmp_path, capsys):
    """The hub's port in use was found by the first worker's simulator pool: 155 lines of Ray
    traceback and C++ stack, exit status 1, nothing naming the setting."""
    import socket

    out = tmp_path / "outputs"
    out.mkdir()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        refused(capsys, ["train", "embodied_srpo", *REMOTE, f"simulator.env.port={port}", f"run.output_dir={out}"],
                f"field 'simulator.env.port': the remote environment hub cannot listen on 127.0.0.1:{port} "
                "(Address already in use): another program or run listens there; give this run another "
                "simulator.env.port")
    assert not any(out.iterdir())


# ------------------------------------------------------------------ vla-rl eval


def snapshot(directory: Path) -> dict[str, str]:
    """Every file below ``directory`` and a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


STORE = Path("eval/episodes/robosuite_lift/rank0.zarr")


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


#: (case, how the store is damaged, text the error line must contain besides the store's path)
DAMAGED_STORE_CASES = [
    ("truncated group zarr.json", lambda store: truncate(store / "zarr.json"), "its attributes (zarr.json)"),
    ("truncated array zarr.json", lambda store: truncate(store / "obs" / "zarr.json"), "array 'obs' (obs/zarr.json)"),
    ("truncated chunk", lambda store: truncate(store / "length" / "c" / "1"),
     "array 'length', episode 1 (chunk length/c/1)"),
    ("truncated step chunk", lambda store: truncate(store / "env_actions" / "c" / "2" / "0" / "0" / "0"),
     "array 'env_actions', episode 2 (chunk env_actions/c/2/0/0/0)"),
    ("missing chunk", lambda store: (store / "length" / "c" / "0").unlink(), "array 'length', episode 0"),
    ("missing array", lambda store: shutil.rmtree(store / "actions"), "array 'actions'"),
]


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A run directory with a checkpoint and an evaluation of it: one store of 3 episodes and the
    report it gave (as ``vla-rl eval`` leaves them; written here without Ray)."""
    out = tmp_path_factory.mktemp("outputs")
    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", "run.name=run",
                                                  "policy.config.hidden_sizes=[8]"], resume=None)
    run.close()
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,)))
    checkpoint.save_checkpoint(run.path / "checkpoints", 1, rank=0, model=policy)
    checkpoint.finalize_checkpoint(run.path / "checkpoints", 1)
    store = open_rank_store(run.path / "eval", "robosuite_lift", 0, EnvSpec(obs_dim=15, action_dim=7, horizon=8), 1,
                            {"task": "robosuite_lift", "simulator": "robosuite_lift", "env": {"horizon": 8}}, True)
    n, horizon = 3, 8
    append_episodes(store, TensorDict({
        keys.OBS: torch.randn(n, horizon + 1, 15), keys.ACTIONS: torch.randn(n, horizon, 1, 7),
        keys.ENV_ACTIONS: torch.randn(n, horizon, 1, 7), keys.OLD_LOG_PROBS: torch.randn(n, horizon, 1),
        keys.FINISH_STEP: torch.tensor([8, 5, 8]), keys.SUCCESS: torch.tensor([False, True, False]),
        keys.TRUNCATED: torch.tensor([True, False, True]),
        keys.INIT_STATE_ID: torch.tensor([10**9, 10**9 + 1, 10**9 + 2]),
    }, batch_size=[n]), 1, True, 0.0, {"cpu": "test"})
    (run.path / "eval" / "report.json").write_text('{"results": "the last good report"}\n')
    (run.path / "eval" / "report.md").write_text("# the last good report\n")
    return run.path


@pytest.mark.parametrize(("case", "damage", "expected"), DAMAGED_STORE_CASES, ids=[c[0] for c in DAMAGED_STORE_CASES])
def test_a_damaged_evaluation_store_is_named_with_the_way_out(case, damage, expected, evaluated_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(evaluated_run, run_dir)
    store = run_dir / STORE
    damage(store)
    before = snapshot(run_dir)
    err = refused(capsys, ["eval", str(run_dir), "eval.num_episodes=3"], expected)
    err = " ".join(err.split())
    assert f"evaluation store {store} is damaged" in err and f"mv {store} {store}.damaged" in err
    assert snapshot(run_dir) == before  # nothing written: the last good report is kept


def test_an_eval_video_camera_the_simulator_does_not_have_is_refused(tmp_path, capsys):
    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={tmp_path}", "run.name=run",
                                                  "simulator.name=metaworld", "simulator.env={horizon: 60}",
                                                  "policy.config.hidden_sizes=[8]"], resume=None)
    run.close()
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=39, action_dim=4, hidden_sizes=(8,)))
    checkpoint.save_checkpoint(run.path / "checkpoints", 1, rank=0, model=policy)
    checkpoint.finalize_checkpoint(run.path / "checkpoints", 1)
    refused(capsys, ["eval", str(run.path), "eval.video_camera=agentview"],
            "eval.video_camera: task metaworld cannot render videos from camera 'agentview' (render_camera must be a "
            "MetaWorld camera")
