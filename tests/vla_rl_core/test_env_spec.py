"""EnvSpec: the typed seam between a simulator, the engine and the policy."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from vla_rl_core.env_spec import EnvSpec, info_success
from vla_rl_core.observations import empty_observations

LIFT = EnvSpec(obs_dim=15, action_dim=7, horizon=100, obs_layout={"robot0_eef_pos": [0, 3], "cube_pos": (5, 8)})


def test_fields_are_normalised_and_frozen():
    assert LIFT.obs_layout == {"robot0_eef_pos": (0, 3), "cube_pos": (5, 8)}
    camera = EnvSpec(obs_dim=8, action_dim=7, horizon=10, images={"agentview_image": np.array([4, 4, 3])})
    assert camera.images == {"agentview_image": (4, 4, 3)} and type(camera.images["agentview_image"][0]) is int
    with pytest.raises(AttributeError):
        LIFT.obs_dim = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(camera)) == camera  # it crosses Ray's actor boundary


@pytest.mark.parametrize(("fields", "message"), [
    ({"obs_dim": 0}, r"EnvSpec.obs_dim must be a positive integer, got 0"),
    ({"action_dim": True}, r"EnvSpec.action_dim must be a positive integer, got True"),
    ({"horizon": 2.0}, r"EnvSpec.horizon must be a positive integer"),
    ({"num_tasks": 0}, r"EnvSpec.num_tasks must be a positive integer"),
    ({"obs_layout": {"cube_pos": (5, 16)}}, r"EnvSpec.obs_layout\['cube_pos'\] must lie in the state of 15 values"),
    ({"obs_layout": {"cube_pos": (5, 5)}}, r"obs_layout\['cube_pos'\]"),
    ({"images": {"agentview_image": (4, 4)}}, r"EnvSpec.images\['agentview_image'\] must be an \(H, W, 3\) shape"),
])
def test_bad_fields_are_refused_naming_them(fields, message):
    with pytest.raises(ValueError, match=message):
        EnvSpec(**{"obs_dim": 15, "action_dim": 7, "horizon": 100, **fields})


def test_differences_and_task_sets():
    other = EnvSpec(obs_dim=15, action_dim=4, horizon=100, obs_layout={"robot0_eef_pos": (0, 3), "cube_pos": (6, 9)})
    assert LIFT.differences(other) == ["action_dim", "obs_layout"]
    assert LIFT.differences(LIFT) == []
    three = LIFT.with_tasks(3)
    assert three.num_tasks == 3 and LIFT.num_tasks is None and LIFT.differences(three) == ["num_tasks"]


@pytest.mark.parametrize(("spec", "layout"), [
    (LIFT, None),  # the bare state vector
    (LIFT.with_tasks(2), {"state": ((3, 15), np.float32), "task_id": ((3,), np.int64)}),
    (EnvSpec(obs_dim=15, action_dim=7, horizon=100, images={}), {"state": ((3, 15), np.float32),
                                                                  "instruction": ((3, 256), np.uint8)}),
    (EnvSpec(obs_dim=15, action_dim=7, horizon=100, images={"agentview_image": (4, 4, 3)}),
     {"state": ((3, 15), np.float32), "agentview_image": ((3, 4, 4, 3), np.uint8), "instruction": ((3, 256), np.uint8)}),
])
def test_empty_observations_follow_the_spec(spec, layout):
    obs = empty_observations(spec, 3)
    assert spec.dict_observations == (layout is not None)
    if layout is None:
        assert isinstance(obs, np.ndarray) and obs.shape == (3, 15) and obs.dtype == np.float32
    else:
        assert {key: (value.shape, value.dtype) for key, value in obs.items()} == layout


def test_success_is_read_from_either_key_and_its_absence_is_named():
    assert info_success({"success": True}) is True
    assert info_success({"success": np.bool_(False), "is_success": 1.0}) is False  # success first
    assert info_success({"is_success": 1.0}) is True  # gymnasium-robotics
    with pytest.raises(ValueError, match=re.escape("without 'success' or 'is_success' (it has ['distance', "
                                                   "'goal_reached'])")):
        info_success({"goal_reached": True, "distance": 0.1})

