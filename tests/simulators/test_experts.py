"""The scripted robosuite experts of Stack, PickPlaceCan and Door: registered under both robosuite
simulator names, valid actions, and their success rate over seeded initial states (the
demonstration ids of ``warm_start.demo_init_state_offset``).

Measured (robosuite 1.5.2, MuJoCo 3.3.0): 50/50 successes on each task from ids 2_000_000_000 +
[0, 50) and from the evaluation ids 1_000_000_000 + [0, 50); mean episode lengths 61 (Stack),
110 (PickPlaceCan) and 82 (Door) control steps. The 50-state checks take about 90 s together,
so they are marked slow; a 3-state check per task runs by default.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulators import make_env
from simulators.experts import (
    DoorExpert,
    PickPlaceCanExpert,
    StackExpert,
    expert_class,
    make_expert,
)
from simulators.experts.scripting import quat_to_matrix, rotation_error

DEMO_OFFSET = 2_000_000_000
"""First demonstration initial-state id (``warm_start.demo_init_state_offset``)."""
HORIZONS = {"Stack": 200, "PickPlaceCan": 200, "Door": 150}
"""Time limit per task, control steps: above the longest expert episode measured (Stack 187 with
one regrasp, PickPlaceCan 131, Door 93)."""
MIN_SUCCESS_RATE = 0.94
"""Least success rate asserted over 50 initial states (47/50; 50/50 measured on every task)."""
EXPERTS = {"Stack": StackExpert, "PickPlaceCan": PickPlaceCanExpert, "Door": DoorExpert}


@pytest.fixture(scope="module", params=sorted(HORIZONS))
def task_env(request):
    task = request.param
    env = make_env("robosuite", {"task": task, "horizon": HORIZONS[task]})
    yield task, env
    env.close()


def _run_episode(env, expert, seed: int) -> tuple[bool, int]:
    """Run the expert from initial state ``seed``; checks every action. Returns (success, control steps)."""
    obs, _ = env.reset(seed=seed)
    expert.reset()
    while True:
        action = expert.act(obs)
        assert action.shape == (7,) and action.dtype == np.float32
        assert np.all(np.abs(action) <= 1.0), action
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info["success"], info["episode_step"]


@pytest.mark.parametrize("task", sorted(EXPERTS))
def test_expert_registered_under_both_robosuite_names(task):
    assert expert_class("robosuite", task) is EXPERTS[task]
    assert expert_class("robosuite_lift", task) is EXPERTS[task]


@pytest.mark.parametrize("task", sorted(EXPERTS))
def test_expert_names_missing_observation_keys(task):
    with pytest.raises(ValueError, match=rf"{EXPERTS[task].__name__} needs observation keys \[.*robot0_eef_pos"):
        make_expert("robosuite", task, {"robot0_gripper_qpos": slice(0, 2)})


def test_rotation_error_is_the_world_frame_axis_angle():
    current = quat_to_matrix(np.array([1.0, 0.0, 0.0, 0.0]))  # half a turn about x: pointing down
    np.testing.assert_allclose(current, np.diag([1.0, -1.0, -1.0]), atol=1e-12)
    angle = 0.3
    about_z = np.array([[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(rotation_error(about_z @ current, current), [0.0, 0.0, angle], atol=1e-12)
    np.testing.assert_allclose(rotation_error(current, current), np.zeros(3), atol=1e-12)


def test_expert_solves_three_initial_states(task_env):
    task, env = task_env
    expert = make_expert("robosuite", task, env.obs_layout)
    for seed in range(DEMO_OFFSET, DEMO_OFFSET + 3):
        success, steps = _run_episode(env, expert, seed)
        assert success, f"{task}: the expert failed from initial state {seed} ({steps} control steps)"


@pytest.mark.slow
def test_expert_success_rate_over_50_initial_states(task_env):
    task, env = task_env
    expert = make_expert("robosuite", task, env.obs_layout)
    results = [_run_episode(env, expert, seed) for seed in range(DEMO_OFFSET, DEMO_OFFSET + 50)]
    successes = sum(success for success, _ in results)
    assert successes / len(results) >= MIN_SUCCESS_RATE, (
        f"{task}: {successes}/50 successes; failed from {[DEMO_OFFSET + i for i, r in enumerate(results) if not r[0]]}"
    )


def test_every_expert_has_its_measured_steps():
    """With every robosuite robot a config accepts, and for every MetaWorld task (robot Sawyer)."""
    from simulators.experts import measured_steps
    from simulators.experts.measured_steps import METAWORLD_STEPS
    from simulators.metaworld_env import METAWORLD_V3_TASKS, MetaWorldEnvConfig
    from simulators.robosuite_env import SINGLE_ARM_ROBOTS, RobosuiteEnvConfig

    tables = [*(cls.measured_steps for cls in EXPERTS.values()),
              *({"Sawyer": steps} for steps in METAWORLD_STEPS.values())]
    for table in tables:
        for steps in table.values():
            assert steps.successes <= steps.episodes
            assert steps.successes == 0 or 0 < steps.fewest <= steps.median <= steps.most
    for task, cls in EXPERTS.items():
        assert set(cls.measured_steps) == set(SINGLE_ARM_ROBOTS), task
        assert measured_steps("robosuite", RobosuiteEnvConfig(task=task, robot="UR5e")) is cls.measured_steps["UR5e"]
    assert set(METAWORLD_STEPS) == set(METAWORLD_V3_TASKS)
    for task in METAWORLD_V3_TASKS:
        assert measured_steps("metaworld", MetaWorldEnvConfig(task=task)) is METAWORLD_STEPS[task]


@pytest.mark.parametrize(("simulator", "env"), [
    ("robosuite", {"task": "Lift"}), ("robosuite", {"task": "Lift", "robot": "Sawyer"}),
    ("metaworld", {"task": "reach-v3"})])
def test_the_measured_steps_hold(simulator, env):
    """The first two demonstration initial states again (the experts are deterministic)."""
    from simulators.experts import measured_steps
    from simulators.experts.measure import expert_episode_steps
    from simulators.registry import build_env_config

    steps = expert_episode_steps(simulator, {**env, "horizon": 200}, episodes=2)
    measured = measured_steps(simulator, build_env_config(simulator, env))
    assert all(measured.fewest <= s <= measured.most for s in steps if s is not None) and any(steps), steps


@pytest.mark.parametrize(("simulator", "env", "expected"), [
    ("robosuite", {"task": "PickPlaceCan", "horizon": 30}, ("simulator.env.horizon", "at least 131")),
    ("robosuite", {"task": "PickPlaceCan", "horizon": 89}, None),  # the fewest measured: some demonstrations
    ("robosuite", {"task": "Lift", "robot": "Sawyer", "horizon": 30}, ("simulator.env.horizon", "38-58 control steps")),
    ("robosuite", {"task": "Lift", "robot": "Jaco"}, ("simulator.env.robot", "no success in 5 episodes")),
    ("robosuite", {"task": "Lift", "robot": "PandaOmron"}, ("simulator.env.robot", "the PandaOmron takes 12")),
    ("robosuite", {"task": "Door", "robot": "Jaco"}, None),
    ("robosuite", {}, None),
    ("metaworld", {"task": "shelf-place-v3", "horizon": 75}, ("simulator.env.horizon", "76-252 control steps")),
    ("metaworld", {"task": "shelf-place-v3", "horizon": 150}, None),
])
def test_a_horizon_or_robot_the_expert_cannot_work_with_is_named(simulator, env, expected):
    from simulators.experts import horizon_problem
    from simulators.registry import build_env_config

    problem = horizon_problem(simulator, build_env_config(simulator, env))
    if expected is None:
        assert problem is None
    else:
        assert problem[0] == expected[0] and expected[1] in problem[1] and "warm_start.num_demos=0" in problem[1]


def test_an_expert_that_makes_too_few_demonstrations_names_the_horizon():
    from vla_rl.dag.loader import load_template
    from vla_rl.errors import RunStopped
    from vla_rl.nodes.warm_start import too_few_demonstrations

    for overrides, measured in [
        (["simulator.env.task=PickPlaceCan", "simulator.env.horizon=95"], "PickPlaceCan: 89-131 control steps"),
        (["simulator.tasks=[door-close-v3,shelf-place-v3]", "simulator.env.horizon=80"], "shelf-place-v3: 76-252"),
    ]:
        template = "embodied_srpo_mt10" if "tasks" in overrides[0] else "embodied_srpo"
        sim = load_template(template, [*overrides, "data.init_states_per_step=2"]).config.simulator
        error = too_few_demonstrations(RuntimeError("the scripted expert produced 0 of 2 demonstrations"), sim)
        assert isinstance(error, RunStopped)
        message = str(error)
        assert message.startswith("the scripted expert produced 0 of 2 demonstrations: each expert episode ends after "
                                  f"simulator.env.horizon={overrides[1].split('=')[1]} control steps")
        assert measured in message and "warm_start.num_demos=0" in message
