"""The OpenVLA-OFT templates end to end with the tiny model, through the real engine (Ray on
loopback, two DAG workers, gloo, simulator actors rendering cameras): camera observations from
the simulator actors through the rollout, the re-shards and the reward node to the data-parallel
update, a behaviour-cloning warm start on camera demonstrations, and the LIBERO templates
(OpenVLA-OFT's and π0's) with the suite chosen by override (skipped without the LIBERO extra)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from devices import device_overrides
from safetensors.torch import load_file
from template_runs import run_one_step

from simulators.libero_env import LiberoEnv
from simulators.rendering import egl_unavailable_reason
from vla_rl.data.trajectory_store import TrajectoryStore

TINY = [
    "trainer.total_steps=1",
    "trainer.ppo_epochs=1",
    "trainer.ppo_mini_batch_size=2",
    "data.init_states_per_step=2",
    "data.group_size=2",
    "simulator.env.camera_size=32",
    "eval.num_episodes=0",
    "policy.config.architecture.image_size=28",
    "policy.config.chunk_size=4",
    *device_overrides(),
]


@pytest.fixture(autouse=True)
def _needs_egl():
    reason = egl_unavailable_reason()
    if reason is not None:
        pytest.skip(f"camera templates need headless EGL rendering: {reason}")


def run(template: str, out, *overrides: str) -> tuple[dict, object]:
    """One training step of ``template`` on the tiny settings: its step metrics and its run directory."""
    return run_one_step(template, TINY, out, *overrides)


def test_srpo_oft_lift_runs_with_the_policy_backbone_encoder(ray_on_loopback, tmp_path):
    """SRPO scoring trajectories with the policy's own vision backbone, from the random tiny model."""
    step, _ = run("embodied_srpo_oft_lift", tmp_path, "simulator.env.horizon=16", "warm_start.num_demos=0",
                  "algorithm.trajectory_encoder=policy_backbone", "algorithm.policy_backbone.points=4")
    for key in ("timing/rollout", "timing/rollout_policy", "timing/rollout_env", "timing/reward",
                "timing/actor_update", "reward/mean"):
        assert key in step, key
    assert step["rollout/env_steps_per_episode"] == 16.0 and step["rollout/episode_length"] == 4.0  # 4 chunks of 4


@pytest.mark.slow
def test_srpo_oft_lift_warm_starts_on_camera_demonstrations(ray_on_loopback, tmp_path):
    """Behaviour cloning on one camera demonstration (horizon 48: the scripted expert needs about
    40 steps) before SRPO: the demonstration store holds uint8 images and the checkpoint keeps the
    warm start's proprio statistics of the template's ``proprio_dim`` (5) state features."""
    step, run_dir = run("embodied_srpo_oft_lift", tmp_path, "simulator.env.horizon=48", "warm_start.num_demos=1",
                        "warm_start.bc_steps=4", "warm_start.bc_batch_size=8")
    assert 1 <= step["rollout/episode_length"] <= 12  # decisions of 4 actions within 48 control steps
    store = TrajectoryStore.open(run_dir / "demos.zarr", read_only=True)
    assert store.fields["agentview_image"] == ((32, 32, 3), np.dtype(np.uint8))
    model = load_file(str(run_dir / "checkpoints" / "step_00000001" / "model.safetensors"))
    assert bool(model["proprio_statistics_set"]) and model["proprio_q01"].shape == (5,)
    assert (model["proprio_q99"] > model["proprio_q01"]).any()


def test_grpo_oft_lift_runs_from_the_random_tiny_model(ray_on_loopback, tmp_path):
    step, run_dir = run("embodied_grpo_oft_lift", tmp_path, "simulator.env.horizon=16", "warm_start.num_demos=0")
    assert step["rollout/success_rate"] == 0.0 and step["rollout/env_steps_per_episode"] == 16.0
    assert "reward: success" in (run_dir / "template.yaml").read_text()


#: The π0 templates' tiny settings: TINY without the OpenVLA-OFT fields; chunks of 4 actions of the
#: tiny π0 on 28 px images (the templates use 56).
TINY_PI0 = [override for override in TINY if not override.startswith("policy.config.")] + [
    "policy.config.architecture.chunk_size=4",
    "policy.config.architecture.vision.image_size=28",
]


@pytest.mark.parametrize(("template", "tiny"), [("embodied_srpo_oft_libero", TINY), ("embodied_grpo_oft_libero", TINY),
                                                ("embodied_srpo_pi0_libero", TINY_PI0),
                                                ("embodied_grpo_pi0_libero", TINY_PI0)])
def test_libero_templates_run_the_suite_given_by_override(ray_on_loopback, tmp_path, template, tiny):
    reason = LiberoEnv.unavailable_reason()
    if reason is not None:
        pytest.skip(f"LIBERO is not installed: {reason}")
    step, run_dir = run_one_step(template, tiny, tmp_path, "simulator.env.suite=libero_goal",
                                 "simulator.env.horizon=16")
    assert step["rollout/env_steps_per_episode"] <= 16.0
    assert "suite: libero_goal" in (run_dir / "template.yaml").read_text()


def test_grpo_pi0_lift_runs_from_the_random_tiny_model(ray_on_loopback, tmp_path):
    """The rollout stores π0's denoising chains (own actions of (3 + 1) * 7 values) and sends
    their last state to the simulator. Without group filters every group is kept (the random model
    never succeeds), so the update recomputes the chains' log-probs from the re-sharded batch: with
    all-zero advantages the weights do not move, and every ratio is 1 up to float rounding. Each
    worker's minibatch is its whole shard of 2 episodes: on an accelerator (bfloat16 autocast) the
    old log-probs are the trainer's rescoring of the shard in one pass, and a minibatch of another
    batch shape could round otherwise there (the ratio then 1 only within bfloat16's rounding)."""
    step, run_dir = run_one_step("embodied_grpo_pi0_lift", TINY_PI0, tmp_path, "simulator.env.horizon=16",
                                 "warm_start.num_demos=0", "algorithm.filter_groups.success_rate_band=null",
                                 "algorithm.filter_groups.zero_variance=false", "trainer.ppo_mini_batch_size=4")
    assert step["rollout/success_rate"] == 0.0 and step["rollout/env_steps_per_episode"] == 16.0
    assert step["rollout/episode_length"] == 4.0  # 4 chunks of 4 actions
    assert step["actor/num_updates"] == 1.0  # one minibatch: 4 episodes over the 2 workers
    assert abs(step["actor/ratio_mean"] - 1.0) < 1e-4 and step["actor/pg_clipfrac"] == 0.0
    assert "reward: success" in (run_dir / "template.yaml").read_text()
    model = load_file(str(run_dir / "checkpoints" / "step_00000001" / "model.safetensors"))
    assert model["model.action_in_proj.weight"].shape[1] == 7  # the template's max_action_dim
    assert not bool(model["proprio_statistics_set"])  # no warm start


@pytest.mark.slow
def test_srpo_pi0_lift_warm_starts_on_camera_demonstrations(ray_on_loopback, tmp_path):
    """Behaviour cloning (π0's flow-matching loss) on one camera demonstration before SRPO: the
    checkpoint keeps the warm start's proprio statistics of the first 11 state features (the
    template's ``policy.config.proprio_dim``; the 15-value Lift state without the hand's
    orientation)."""
    step, run_dir = run_one_step("embodied_srpo_pi0_lift", TINY_PI0, tmp_path, "simulator.env.horizon=48",
                                 "warm_start.num_demos=1", "warm_start.bc_steps=4", "warm_start.bc_batch_size=8")
    assert 1 <= step["rollout/episode_length"] <= 12  # decisions of 4 actions within 48 control steps
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in records if "warm_start/bc_loss" in r]
    assert len(warm) == 1 and np.isfinite(warm[0]["warm_start/bc_loss"]) and warm[0]["warm_start/transitions"] > 0
    model = load_file(str(run_dir / "checkpoints" / "step_00000001" / "model.safetensors"))
    assert bool(model["proprio_statistics_set"]) and model["proprio_q01"].shape == (11,)
    assert (model["proprio_q99"] > model["proprio_q01"]).any()


def test_ppo_pi0_lift_trains_a_critic_on_the_state(ray_on_loopback, tmp_path):
    """PPO with π0: the critic values the state of the camera observations (its head starts at
    zero), regresses on GAE's returns beside the actor update, and normalises the state with the
    statistics of the warm start's demonstration states (π0 has none of the whole state), each
    scale floored at warm_start.obs_std_floor, recomputed here from the run's store."""
    step, run_dir = run_one_step("embodied_ppo_pi0_lift", TINY_PI0, tmp_path, "simulator.env.horizon=48",
                                 "warm_start.num_demos=1", "warm_start.bc_steps=4", "warm_start.bc_batch_size=8",
                                 "critic.hidden_sizes=[16]",
                                 "warm_start.obs_std_floor=0.01")  # below most features' spread: the floor shows
    for key in ("timing/values", "timing/critic_update", "critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm",
                "actor/pg_loss", "advantage/abs_mean"):
        assert key in step and np.isfinite(step[key]), key
    assert step["critic/values_mean"] == 0.0  # the value head starts at zero
    assert step["critic/num_updates"] == step["actor/num_updates"] == 2.0  # 2 episodes per worker, minibatches of 2 over the 2 workers
    assert step["critic/skipped_updates"] == 0.0
    critic = load_file(str(run_dir / "checkpoints" / "step_00000001" / "critic.safetensors"))
    store = TrajectoryStore.open(run_dir / "demos.zarr", read_only=True)
    states = store.read_episode(0)["state"].astype(np.float64)  # (T, obs_dim)
    np.testing.assert_allclose(critic["obs_mean"].numpy(), states.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(critic["obs_std"].numpy(), np.maximum(states.std(0), 0.01), rtol=1e-5, atol=1e-6)
    assert critic["net.0.weight"].shape == (16, states.shape[1])
