"""An evaluation's episode stores are matched to its tasks by their whole settings (every field of
the simulator's validated config, defaults included), with the form of the record versioned."""

from __future__ import annotations

import numpy as np
import pytest

from simulators.registry import SETTINGS_FORMAT, canonical_env
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.evaluation.episode_store import check_task_settings, task_dir


def write_store(eval_dir, attrs: dict) -> None:
    path = task_dir(eval_dir, "lift") / "rank0.zarr"
    path.parent.mkdir(parents=True, exist_ok=True)
    TrajectoryStore.create(path, {"obs": ((3,), np.float32)}, max_steps=4, attrs={"task": "lift", **attrs})


def test_a_store_of_the_same_settings_is_continued_written_out_or_not(tmp_path):
    write_store(tmp_path, {"simulator": "robosuite_lift", "env": canonical_env("robosuite_lift", {"horizon": 40}),
                           "settings_format": SETTINGS_FORMAT})
    check_task_settings(tmp_path, "lift", "robosuite_lift", {"horizon": 40})
    check_task_settings(tmp_path, "lift", "robosuite_lift", {"horizon": 40, "control_freq": 20.0})


def test_an_earlier_store_is_completed_with_todays_defaults(tmp_path):
    write_store(tmp_path, {"simulator": "robosuite_lift", "env": {"horizon": 40}})  # no settings_format
    check_task_settings(tmp_path, "lift", "robosuite_lift", {"horizon": 40, "robot": "Panda"})


@pytest.mark.parametrize(("recorded", "message"), [
    ({"env": {"horizon": 40}, "simulator": "robosuite"},
     r"holds episodes of task 'lift' with other settings \(simulator: robosuite in the store, robosuite_lift here\)"),
    ({"env": {**canonical_env("robosuite_lift", {"horizon": 40}), "control_freq": 10.0},  # a default since changed
      "simulator": "robosuite_lift"}, r"with other settings \(simulator.env.control_freq: 10.0 in the store, 20.0 "
     r"here\);"),
    ({"env": {"horizon": 30, "robot": "Panda", "camera_size": 64}, "simulator": "robosuite_lift"},  # each one named
     r"\(simulator.env.camera_size: 64 in the store, 128 here; simulator.env.horizon: 30 in the store, 40 here\);"),
    ({"env": {"horizon": 40, "retired_field": 1}, "simulator": "robosuite_lift"},  # a field this version lacks
     r"\(simulator.env.retired_field: 1 in the store, unset here\);"),
    ({"env": {"horizon": 40}, "simulator": "robosuite_lift", "settings_format": SETTINGS_FORMAT + 1},
     "newer than this vla-rl's"),
])
def test_a_store_of_other_settings_is_refused_naming_both(tmp_path, recorded, message):
    write_store(tmp_path, recorded)
    with pytest.raises(ValueError, match=message) as error:
        check_task_settings(tmp_path, "lift", "robosuite_lift", {"horizon": 40})
    assert "rank0.zarr" in str(error.value)


def test_a_rank_store_is_made_out_of_the_readers_sight_and_appears_whole(tmp_path, monkeypatch):
    """The driver reads the stores while the workers write them (vla-rl eval's report): a store it
    found half made (its directory, not yet its attributes) read as damaged and stopped the
    evaluation."""
    import fnmatch

    from vla_rl.evaluation.episode_store import STORE_PATTERN, open_rank_store, stored_keys
    from vla_rl_core.env_spec import EnvSpec

    made, create = [], TrajectoryStore.create.__func__

    def watched(cls, path, *args, **kwargs):
        made.append(path.name)
        store = create(cls, path, *args, **kwargs)
        assert stored_keys(tmp_path, "lift") == set()  # what the driver reads meanwhile: nothing yet
        return store

    monkeypatch.setattr(TrajectoryStore, "create", classmethod(watched))
    store = open_rank_store(tmp_path, "lift", 0, EnvSpec(obs_dim=3, action_dim=2, horizon=4), 1,
                            {"task": "lift", "simulator": "s", "env": {}}, log_probs=False)
    assert len(made) == 1 and not fnmatch.fnmatch(made[0], STORE_PATTERN)
    assert store.path == task_dir(tmp_path, "lift") / "rank0.zarr" and len(store) == 0
    assert sorted(p.name for p in task_dir(tmp_path, "lift").iterdir()) == ["rank0.zarr"]
    assert open_rank_store(tmp_path, "lift", 0, EnvSpec(obs_dim=3, action_dim=2, horizon=4), 1, {}, False).attrs[
        "task"] == "lift"  # the second call opens it


def test_a_rank_store_holds_every_decision_of_a_chunked_horizon(tmp_path):
    from vla_rl.evaluation.episode_store import open_rank_store
    from vla_rl_core.env_spec import EnvSpec

    # a horizon of 6 control steps in chunks of 4: a second, partial chunk is a decision too
    store = open_rank_store(tmp_path, "lift", 0, EnvSpec(obs_dim=3, action_dim=2, horizon=6), 4, {}, False)
    assert store.max_steps == 2


def test_a_store_left_half_made_by_a_crash_is_made_anew(tmp_path):
    from vla_rl.evaluation.episode_store import open_rank_store
    from vla_rl_core.env_spec import EnvSpec

    left = task_dir(tmp_path, "lift") / ".rank0.zarr.creating"
    left.mkdir(parents=True)
    (left / "zarr.json").write_text("{")  # cut short
    store = open_rank_store(tmp_path, "lift", 0, EnvSpec(obs_dim=3, action_dim=2, horizon=4), 1, {"task": "lift"},
                            False)
    assert len(store) == 0 and store.attrs["task"] == "lift"
    assert sorted(p.name for p in task_dir(tmp_path, "lift").iterdir()) == ["rank0.zarr"]


def stored_episode(tmp_path, with_env_actions: bool = True):
    import torch
    from tensordict import TensorDict

    from vla_rl.evaluation.episode_store import append_episodes, open_rank_store
    from vla_rl_core import keys
    from vla_rl_core.env_spec import EnvSpec

    store = open_rank_store(tmp_path, "lift", 0, EnvSpec(obs_dim=2, action_dim=1, horizon=4), 1, {}, False)
    episodes = {keys.OBS: torch.arange(10, dtype=torch.float32).reshape(1, 5, 2),
                keys.ACTIONS: torch.ones(1, 4, 1, 1), keys.FINISH_STEP: torch.tensor([3]),
                keys.SUCCESS: torch.tensor([True]), keys.TRUNCATED: torch.tensor([False]),
                keys.INIT_STATE_ID: torch.tensor([7])}
    if with_env_actions:
        episodes[keys.ENV_ACTIONS] = torch.ones(1, 4, 1, 1)
    append_episodes(store, TensorDict(episodes, batch_size=[1]), 2, True, 0.0, {"cpu": "test"})
    return store


def test_an_episodes_next_observations_are_its_observations_one_step_on(tmp_path):
    episode = stored_episode(tmp_path).read_episode(0)
    assert episode["obs"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert episode["next_obs"].tolist() == [[2, 3], [4, 5], [6, 7]]  # the last: the terminal observation


def test_episodes_without_the_simulators_actions_are_refused(tmp_path):
    with pytest.raises(ValueError, match="stores the simulator's actions of each episode"):
        stored_episode(tmp_path, with_env_actions=False)
