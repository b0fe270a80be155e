"""Simulator registry, config building and validation: no simulator is created here."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from simulators import SIMULATORS, RobosuiteEnvConfig, build_env_config, make_env
from simulators.registry import check_spec_against_config
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.env_spec import EnvSpec
from vla_rl_core.registry import RegistryError

REPO_ROOT = Path(__file__).resolve().parents[2]


def _run_python(code: str, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter at the repository root; return its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_importing_simulators_and_pool_imports_no_simulator_library_nor_torch():
    code = (
        "import sys, simulators, simulators.pool, simulators.experts\n"
        "print(sorted(m for m in ('robosuite', 'mujoco', 'torch') if m in sys.modules))"
    )
    assert _run_python(code) == "[]"


def test_robosuite_lift_is_registered_with_a_config_class():
    assert "robosuite_lift" in SIMULATORS
    assert SIMULATORS.get("robosuite_lift").config_class is RobosuiteEnvConfig


def test_unknown_simulator_error_lists_known_names():
    with pytest.raises(RegistryError, match="robosuite_lift"):
        make_env("no_such_simulator", None)


def test_build_env_config_from_none_mapping_and_instance():
    assert build_env_config("robosuite_lift") == RobosuiteEnvConfig()
    config = build_env_config("robosuite_lift", {"horizon": 50, "obs_keys": ["cube_pos", "robot0_eef_pos"]})
    assert config.horizon == 50 and config.obs_keys == ("cube_pos", "robot0_eef_pos")
    assert build_env_config("robosuite_lift", config) is config


def test_build_env_config_rejects_unknown_fields_and_types():
    with pytest.raises(ValueError, match="horizn"):
        build_env_config("robosuite_lift", {"horizn": 50})
    with pytest.raises(TypeError, match="mapping"):
        build_env_config("robosuite_lift", 50)


@pytest.mark.parametrize(
    "field, value",
    [
        ("horizon", 0),
        ("horizon", 10.5),
        ("control_freq", 0),
        ("controller", "OSC"),
        ("task", ""),
        ("obs_keys", ()),
        ("obs_keys", ("cube_pos", "cube_pos")),
        ("obs_keys", "cube_pos"),
        ("render_camera", ""),
        ("render_size", 4),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RobosuiteEnvConfig(**{field: value})


@pytest.mark.parametrize("simulator, field, value", [
    ("robosuite_lift", "horizon", 0),
    ("robosuite_lift", "render_size", 4),
    ("robosuite_lift", "camera_size", 0),
    ("robosuite_lift", "instruction", " "),
    ("metaworld", "task", "reach-v2"),
    ("metaworld", "horizon", -3),
    ("metaworld", "cameras", ["agentview"]),
    ("metaworld", "render_camera", "agentview"),
    ("libero", "suite", "libero_nothing"),
    ("libero", "task_id", 99),
    ("libero", "cameras", ["a", "a"]),
    ("remote", "state_dim", 0),
    ("remote", "port", 70000),
    ("remote", "step_timeout_s", 0),
])
def test_a_template_names_the_simulator_setting_at_fault(simulator, field, value):
    """These named only ``simulator.env`` (their classes raised plain ValueErrors), where
    robosuite's task, controller and obs_keys errors named the setting."""
    settings = {"state_dim": 2, "action_dim": 1} if simulator == "remote" else {}
    with pytest.raises(ComponentConfigError) as raised:
        build_env_config(simulator, {**settings, field: value})
    assert raised.value.field == f"simulator.env.{field}"


def test_headless_rendering_defaults_to_egl_and_keeps_user_choice():
    code = (
        "import os; from simulators.rendering import setup_headless_rendering as s\n"
        "print(s(), os.environ['MUJOCO_GL'], os.environ['PYOPENGL_PLATFORM'])"
    )
    base_env = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    assert _run_python(code, base_env) == "egl egl egl"
    assert _run_python(code, {**base_env, "MUJOCO_GL": "osmesa"}) == "osmesa osmesa osmesa"


def test_canonical_settings_hold_every_field_with_its_default():
    from simulators.registry import canonical_env, same_env

    settings = canonical_env("robosuite_lift", {"horizon": 40})
    assert settings["horizon"] == 40 and settings["control_freq"] == 20.0 and settings["robot"] == "Panda"
    assert settings["cameras"] == []  # JSON's form of the tuple, as a store reads it back
    assert settings == canonical_env("robosuite_lift", RobosuiteEnvConfig(horizon=40))
    # writing a default out is the same simulator; another value, another simulator, another name too
    assert same_env("robosuite_lift", {}, "robosuite_lift", {"horizon": RobosuiteEnvConfig().horizon})
    assert not same_env("robosuite_lift", {}, "robosuite_lift", {"horizon": 7})
    assert not same_env("robosuite_lift", {}, "robosuite", {})
    # a store that recorded the defaults of its time: a default that changed since tells them apart
    older = {**canonical_env("robosuite_lift", {}), "control_freq": 10.0}
    assert not same_env("robosuite_lift", older, "robosuite_lift", {})
    # a recorded setting the config no longer has: different, not an error
    assert not same_env("robosuite_lift", {"gone": 1}, "robosuite_lift", {})
    # a simulator this process does not know: equal as recorded, or different
    assert same_env("elsewhere", {"a": 1}, "elsewhere", {"a": 1})
    assert not same_env("elsewhere", {"a": 1}, "elsewhere", {"a": 2})


@dataclasses.dataclass
class _LineConfig:
    """A plug-in's config: a field (horizon) and a property (state_dim) declaring sizes."""

    horizon: int = 10
    width: int = 2

    @property
    def state_dim(self) -> int:
        return self.width


if "test_line" not in SIMULATORS:
    SIMULATORS.register("test_line")(type("Line", (), {"config_class": _LineConfig}))


@pytest.mark.parametrize("env, field, message", [
    ({"horizon": 0}, "simulator.env.horizon", re.escape("must be an integer >= 1 (got 0)")),
    ({"width": 0}, "simulator.env.state_dim", re.escape("must be an integer >= 1 (got 0)")),
])
def test_a_declared_size_below_one_is_refused_when_the_template_loads(env, field, message):
    """point_mass with horizon 0 planned and failed in every worker (an 83-line traceback:
    "EnvSpec.horizon must be a positive integer"); robosuite's own check refused it at plan."""
    from vla_rl.dag.errors import TemplateError
    from vla_rl.dag.loader import load_template

    with pytest.raises(ComponentConfigError, match=message) as raised:
        build_env_config("test_line", env)
    assert raised.value.field == field
    with pytest.raises(TemplateError, match=message) as loaded:
        load_template("embodied_srpo", ["simulator.name=test_line", f"simulator.env={env}"])
    assert loaded.value.field == field


def test_a_spec_that_disagrees_with_its_config_is_refused_naming_the_simulator():
    """A config declaring 3 state values where the environments give 2 planned and trained on
    silently (the planner's sizes and byte estimates read the config)."""
    config = build_env_config("test_line", {"width": 3})
    message = r"simulator 'test_line': its config \(_LineConfig\) declares state_dim 3, its environments' spec\(\) "
    message += "gives"
    with pytest.raises(ComponentConfigError, match=message + " obs_dim 2") as raised:
        check_spec_against_config("test_line", config, EnvSpec(obs_dim=2, action_dim=1, horizon=10))
    assert raised.value.field == "simulator.name"
    check_spec_against_config("test_line", config, EnvSpec(obs_dim=3, action_dim=1, horizon=10))


@pytest.mark.parametrize(("name", "env", "freq"), [
    ("robosuite_lift", {}, 20.0), ("robosuite_lift", {"control_freq": 10}, 10.0), ("metaworld", {}, 80.0),
    ("libero", {}, 20.0), ("remote", {"state_dim": 3, "action_dim": 2}, None)])
def test_the_control_frequency_is_the_simulator_s(name, env, freq):
    from simulators.registry import control_freq

    assert control_freq(name, env) == freq

