"""``warm_start.dataset``: a LeRobot dataset (here one LeRobot's own API wrote from the main job's
two scripted Lift demonstrations) becomes exactly the behaviour-cloning batch the scripted
demonstrations give; bad datasets and key maps are refused when the template is planned."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from videos import needs_av1

from vla_rl.cli import main
from vla_rl.config.policy import WarmStartSection
from vla_rl.data.lerobot_demonstrations import check_dataset, dataset_episodes
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.trainers.warm_start import demo_fields, demonstrations, episode_transitions
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.observations import decode_instruction

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
LIFT = FIXTURES / "lift_scripted_demos"
SPEC = EnvSpec(obs_dim=11, action_dim=7, horizon=100)
DEFAULT_DATASET_KEYS = WarmStartSection().dataset_keys  # LeRobot's usual state and action features


def test_the_dataset_gives_the_scripted_demonstrations_batch(tmp_path):
    """The same transitions, bit for bit, as a demonstration store holding the same episodes."""
    expected = np.load(FIXTURES / "lift_scripted_demos_expected.npz")
    store = TrajectoryStore.create(tmp_path / "demos.zarr", fields=demo_fields(SPEC), max_steps=100,
                                   attrs={"env": {"name": "robosuite_lift"}})
    for episode in range(2):
        store.append_episode({"obs": expected[f"episode_{episode}/observation.state"],
                              "actions": expected[f"episode_{episode}/action"]}, init_state_id=np.int64(episode))
    for chunk in (1, 4):
        obs, actions = episode_transitions(dataset_episodes(LIFT, DEFAULT_DATASET_KEYS, 2, SPEC), chunk)
        want_obs, want_actions = demonstrations(store, 2, chunk)
        assert obs.shape == (58, 11) and actions.shape == (58, chunk, 7)
        assert torch.equal(obs, want_obs) and torch.equal(actions, want_actions)


@needs_av1
def test_camera_features_map_onto_the_policys_images_and_the_task_is_the_instruction():
    keys = {"observation.state": "state", "action": "actions", "observation.images.agentview": "agentview_image"}
    spec = EnvSpec(obs_dim=2, action_dim=2, horizon=10, images={"agentview_image": (32, 32, 3)})
    obs, actions = episode_transitions(dataset_episodes(FIXTURES / "video_probe", keys, 2, spec), 1)
    assert obs["agentview_image"].shape == (10, 32, 32, 3) and obs["agentview_image"].dtype == torch.uint8
    assert [decode_instruction(code.numpy()) for code in obs["instruction"][[0, 5]]] == ["push the cube",
                                                                                         "lift the cube"]
    assert actions.shape == (10, 1, 2)
    with pytest.raises(ValueError, match=r"reads camera images \['agentview_image'\]; map dataset features"):
        dataset_episodes(FIXTURES / "video_probe", {"observation.state": "state", "action": "actions"}, 2, spec)


def test_a_dataset_of_other_sizes_is_refused_naming_the_feature():
    with pytest.raises(ValueError, match=r"feature 'observation.state' has shape \[11\], the simulator's 'state' "
                                         r"has \[10\]"):
        dataset_episodes(LIFT, DEFAULT_DATASET_KEYS, 2, dataclasses.replace(SPEC, obs_dim=10))


@pytest.mark.parametrize("keys, num_demos, message", [
    (DEFAULT_DATASET_KEYS, 3, "holds 2 episodes, fewer than warm_start.num_demos=3"),
    ({"observation.state": "state"}, 1, "exactly one feature to 'actions'"),
    ({"observation.state": "state", "action": "actions", "x": "gripper"}, 1, "'gripper' is not a policy input"),
    ({"observation.joints": "state", "action": "actions"}, 1, "has no feature 'observation.joints'"),
    ({"observation.state": "agentview_image", "action": "actions", "next.reward": "state"}, 1,
     "cannot be the policy's 'agentview_image'"),
])
def test_check_dataset_names_what_is_wrong(keys, num_demos, message):
    assert message in check_dataset(LIFT, keys, num_demos)


def test_the_planner_refuses_a_bad_dataset_before_anything_starts(tmp_path, capsys):
    """The fixture holds the 11-value Lift state recorded before the hand's orientation joined it:
    planned with those observation keys it is accepted, with the default 15-value state refused."""
    compact = "simulator.env.obs_keys=[robot0_eef_pos,robot0_gripper_qpos,cube_pos,gripper_to_cube_pos]"
    assert main(["plan", "embodied_srpo", f"warm_start.dataset={LIFT}", compact]) == 0
    capsys.readouterr()
    assert main(["plan", "embodied_srpo", f"warm_start.dataset={LIFT}"]) == 2
    assert ("field 'warm_start.dataset'" in (err := capsys.readouterr().err)
            and "feature 'observation.state' has shape [11], the simulator's 'state' has 15 values" in err)
    assert main(["plan", "embodied_srpo", f"warm_start.dataset={tmp_path}"]) == 2
    assert "field 'warm_start.dataset'" in capsys.readouterr().err
    # a camera policy's images unmapped: refused by the plan (it was, after Ray and the workers started)
    assert main(["plan", "embodied_srpo_pi0_lift", f"warm_start.dataset={LIFT}", "warm_start.num_demos=2"]) == 2
    assert "the policy reads camera images ['agentview_image']; map dataset features to them" in " ".join(
        capsys.readouterr().err.split())
    assert "reads camera images ['agentview_image']" in check_dataset(LIFT, DEFAULT_DATASET_KEYS, 2,
                                                                      images=["agentview_image"])
    assert check_dataset(LIFT, DEFAULT_DATASET_KEYS, 2, images=[]) is None


def test_a_nan_or_infinite_state_or_action_is_refused_naming_the_episode_and_frame(tmp_path):
    """Behaviour cloning ran its 1500 steps on NaN actions (bc_loss null) and the run stopped in
    the first evaluation with a worker traceback (an audit)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from vla_rl.data.lerobot_demonstrations import dataset_states

    root = tmp_path / "nan"
    shutil.copytree(LIFT, root)
    data = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    actions = table.column("action").to_pylist()
    episodes = table.column("episode_index").to_pylist()
    frames = table.column("frame_index").to_pylist()
    row = next(i for i in range(len(episodes)) if episodes[i] == 1 and frames[i] == 4)
    actions[row][2] = float("nan")
    column = pa.array(actions, table.schema.field("action").type)
    pq.write_table(table.set_column(table.column_names.index("action"), "action", column), data)
    with pytest.raises(ValueError, match=r"warm_start.dataset: .*: feature 'action' of episode 1 holds \[.*nan.*\] "
                                         r"at frame 4 \(1 frames with NaN or infinite values\)"):
        dataset_episodes(root, DEFAULT_DATASET_KEYS, 2, SPEC)
    assert len(dataset_episodes(root, DEFAULT_DATASET_KEYS, 1, SPEC)) == 1  # episode 0 is whole
    states = table.column("observation.state").to_pylist()
    states[row][0] = float("inf")
    column = pa.array(states, table.schema.field("observation.state").type)
    pq.write_table(table.set_column(table.column_names.index("observation.state"), "observation.state", column), data)
    with pytest.raises(ValueError, match=r"feature 'observation.state' of episode 1 holds .* at frame 4"):
        dataset_states(root, DEFAULT_DATASET_KEYS, 2)


def test_a_dataset_with_no_demonstrations_to_clone_is_refused_by_the_plan(tmp_path, capsys):
    """warm_start.num_demos=0 with a dataset cloned nothing, silently (an audit): an override of
    the dataset is never read, and a template that sets both is refused by the plan."""
    assert main(["plan", "embodied_srpo", f"warm_start.dataset={LIFT}", "warm_start.num_demos=0"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "field 'warm_start.dataset'" in err and "is never read: read only with demonstrations to clone" in err
    template = tmp_path / "both.yaml"
    template.write_text(f"extends: embodied_srpo\nconfig:\n  warm_start: {{dataset: {LIFT}, num_demos: 0}}\n")
    assert main(["plan", str(template)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "field 'warm_start.num_demos'" in err and "0 clones no episode of warm_start.dataset" in err
