"""Lean robosuite models (no visual meshes, no textures) for environments that never render."""

from __future__ import annotations

import numpy as np
import pytest

from simulators.robosuite_env import TASK_STATE_KEYS, RobosuiteEnv, RobosuiteEnvConfig
from simulators.robosuite_lean import lean_task_class, strip_rendering_assets

MJCF = """<mujoco>
  <asset>
    <texture name="wood" type="2d" file="wood.png"/>
    <material name="table" texture="wood" rgba="1 1 1 1"/>
    <mesh name="link_vis" file="link.obj"/>
    <mesh name="link_col" file="link_col.stl"/>
  </asset>
  <worldbody>
    <body name="link">
      <inertial pos="0 0 0" mass="1" diaginertia="0.1 0.1 0.1"/>
      <geom name="link_vis" type="mesh" mesh="link_vis" contype="0" conaffinity="0" group="1"/>
      <geom name="link_col" type="mesh" mesh="link_col"/>
      <geom name="table_top" type="box" size="0.1 0.1 0.1" material="table" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
</mujoco>"""


def test_strip_rendering_assets_on_a_hand_written_model():
    import xml.etree.ElementTree as ET

    root = ET.fromstring(strip_rendering_assets(MJCF))
    geoms = {g.get("name"): g.attrib for g in root.iter("geom")}
    # the visual mesh keeps its name as a tiny sphere; the collision mesh and the box are untouched
    assert geoms["link_vis"] == {"name": "link_vis", "type": "sphere", "size": "0.001", "contype": "0",
                                 "conaffinity": "0", "group": "1"}
    assert geoms["link_col"]["mesh"] == "link_col"
    assert geoms["table_top"]["type"] == "box"
    asset = root.find("asset")
    assert [m.get("name") for m in asset.iter("mesh")] == ["link_col"]
    assert list(asset.iter("texture")) == []
    assert asset.find("material").attrib == {"name": "table", "rgba": "1 1 1 1"}


def test_lean_task_class_is_a_subclass_kept_out_of_robosuites_registry():
    from robosuite.environments.base import REGISTERED_ENVS

    lean = lean_task_class("Lift")
    assert issubclass(lean, REGISTERED_ENVS["Lift"])
    assert lean is lean_task_class("Lift")
    assert not [name for name in REGISTERED_ENVS if "WithoutRenderingAssets" in name]
    with pytest.raises(ValueError, match="unknown robosuite task 'Lfit'"):
        lean_task_class("Lfit")


def _rollout(env: RobosuiteEnv, seed: int, actions: np.ndarray) -> np.ndarray:
    obs, _ = env.reset(seed=seed)
    observations = [obs]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        if terminated or truncated:
            break
    return np.stack(observations)


@pytest.mark.parametrize("task", sorted(TASK_STATE_KEYS))
def test_lean_environment_has_the_same_physics_and_a_fraction_of_the_model(task):
    """A rendering environment keeps the full model; the same task without rendering compiles
    a much smaller one and yields bit-identical observations under the same random actions."""
    lean = RobosuiteEnv(RobosuiteEnvConfig(task=task, horizon=40))
    full = RobosuiteEnv(RobosuiteEnvConfig(task=task, horizon=40, render_camera="agentview", render_size=16))
    try:
        lean_model, full_model = lean._env.sim.model._model, full._env.sim.model._model
        assert lean_model.nmeshvert < full_model.nmeshvert
        assert lean_model.ntexdata == 0 < full_model.ntexdata
        assert lean_model.nbuffer < 0.5 * full_model.nbuffer
        actions = np.random.default_rng(7).uniform(-1, 1, size=(40, lean.action_space.shape[0])).astype(np.float32)
        for seed in (0, 1):
            np.testing.assert_array_equal(_rollout(lean, seed, actions), _rollout(full, seed, actions))
    finally:
        lean.close()
        full.close()
