"""A few steps of each algorithm template on robosuite Lift on tiny settings, through the real
engine (Ray on loopback, two DAG workers, gloo, simulator actors); see tests/test_driver.py for
the SRPO and GRPO templates."""

from __future__ import annotations

import json
import textwrap

import pytest
from devices import TEST_DEVICE_KIND, device_overrides
from metric_docs import undocumented

from vla_rl.dag.loader import TEMPLATE_DIR
from vla_rl.driver import train

TINY = [
    "trainer.total_steps=1",
    "trainer.ppo_mini_batch_size=3",
    "trainer.ppo_epochs=2",
    "data.init_states_per_step=2",
    "data.group_size=3",
    "simulator.env.horizon=40",
    "eval.num_episodes=0",
    "warm_start.bc_steps=30",
    "policy.config.hidden_sizes=[32,32]",
    *device_overrides(),
]


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    return tmp_path_factory.mktemp("demos") / "lift_demos.zarr"


def run(template: str, out, demo_store, *overrides: str) -> tuple[dict, object]:
    """One training step of ``template``: its metrics and its checkpoint directory."""
    summary = train(template, [*TINY, f"run.output_dir={out}", "run.name=run",
                               f"warm_start.demo_store={demo_store}", *overrides])
    run_dir = out / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "rollout/success_rate" in r]
    assert summary["steps_run"] == 1 and [r["step"] for r in steps] == [1]
    missing = undocumented(name for record in records for name in record)
    assert not missing, f"logged metrics docs/metrics.md does not document: {missing}"
    return steps[0], run_dir / "checkpoints" / "step_00000001"


def test_ppo_template_trains_a_critic(ray_on_loopback, tmp_path, demo_store):
    step, checkpoint = run("embodied_ppo", tmp_path, demo_store)
    for key in ("timing/values", "timing/critic_update", "critic/vf_loss", "critic/vf_clipfrac",
                "actor/pg_loss", "advantage/abs_mean"):
        assert key in step, key
    assert step["critic/values_mean"] == 0.0  # the value head starts at zero
    assert step["critic/num_updates"] == step["actor/num_updates"] == 4.0
    assert {"critic.safetensors", "critic_optimizer.safetensors"} <= {p.name for p in checkpoint.iterdir()}


def test_dapo_template_refills_with_dynamic_sampling(ray_on_loopback, tmp_path, demo_store):
    step, _ = run("embodied_dapo", tmp_path, demo_store, "algorithm.filter_groups.max_refill_rounds=1")
    assert 0 <= step["filter/refill_rounds"] <= 1
    assert 0.0 <= step["filter/kept_fraction"] <= 1.0
    assert step["filter/kept_groups"] <= 2
    assert (step["filter/refill_env_steps"] > 0) == (step["filter/refill_rounds"] > 0)
    assert "timing/group_filter" in step and step["filter/refill_lost_episodes"] == 0
    # the refill rounds' env steps over their seconds too (the first round's seconds alone made it 3x)
    env_steps = step["rollout/env_steps"] + step["filter/refill_env_steps"]
    assert step["rollout/env_steps_per_s"] == pytest.approx(env_steps / step["timing/env_interact"])
    if step["filter/refill_rounds"]:
        assert step["timing/env_interact"] > step["timing/rollout"]


def test_kl_to_a_frozen_reference(ray_on_loopback, tmp_path, demo_store):
    """A template composing a reference node into GRPO: KL in the loss and in the reward
    (adaptive coefficient), token-level ratios, the GSPO-token objective and an entropy bonus
    (with every group kept, the bonus moves the policy even when this weak warm start never
    succeeds and all advantages are 0)."""
    template = tmp_path / "grpo_kl.yaml"
    template.write_text(textwrap.dedent(f"""\
        name: grpo_kl
        extends: {TEMPLATE_DIR / "embodied_grpo.yaml"}
        config:
          algorithm:
            filter_groups: {{zero_variance: false, success_rate_band: null}}
            entropy_coeff: 0.01
            policy_loss: gspo_token
            ratio_granularity: token
            use_kl_loss: true
            kl_loss_coef: 0.1
            use_kl_in_reward: true
            kl_ctrl: {{type: adaptive, kl_coef: 0.05, target_kl: 0.01, horizon: 100}}
        nodes:
          - id: reference
            role: reference
            type: model_inference
            deps: [rollout]
          - id: reward
            deps: [reference]
        """))
    step, checkpoint = run(str(template), tmp_path, demo_store)
    # The rollout policy is still the reference: no penalty, and the first minibatch's KL loss
    # is 0; the three later minibatches see a moved policy. On the CPU the rollout, the reference
    # and the trainer score bit for bit alike; an accelerator's kernels, picked per batch shape,
    # round otherwise (an H200's penalty: 1.8e-8).
    rounding = pytest.approx(0.0, abs=0.0 if TEST_DEVICE_KIND == "cpu" else 1e-6)
    assert step["actor/reward_kl_penalty"] == rounding
    assert step["actor/reward_kl_penalty_coeff"] == pytest.approx(0.05)
    assert step["actor/kl_loss"] > 0.0
    assert step["actor/old_log_prob_max_diff"] == pytest.approx(0.0, abs=0.0 if TEST_DEVICE_KIND == "cpu" else 1e-4)
    # Below target the adaptive coefficient shrinks: x (1 - 0.2 * 6 episodes / horizon 100).
    kl_coef = json.loads((checkpoint / "trainer_state.json").read_text())["metadata"]["kl_coef"]
    assert kl_coef == pytest.approx(0.05 * (1 - 0.2 * 6 / 100))
    assert "reference.safetensors" in {p.name for p in checkpoint.iterdir()}


MT10_TINY = [
    "trainer.total_steps=1",
    "trainer.ppo_mini_batch_size=10",
    "trainer.ppo_epochs=1",
    "data.init_states_per_step=10",  # one of each task
    "data.group_size=2",
    "simulator.env.horizon=120",  # MetaWorld's experts take 40-120 steps (a few longer)
    "warm_start.num_demos=1",
    "warm_start.bc_steps=20",
    "policy.config.hidden_sizes=[16]",
    "eval.num_episodes=2",
    "eval.protocols=[greedy]",
    "eval.video_episodes=2",
    "eval.video_size=32",
    "algorithm.filter_groups.success_rate_band=null",
    "algorithm.filter_groups.zero_variance=false",
    *device_overrides(),
]


def test_mt10_template_trains_one_policy_over_the_ten_tasks(ray_on_loopback, tmp_path):
    """One step of embodied_srpo_mt10: demonstrations of every task, a policy with a 10-task
    one-hot, a rollout of every task, per-task metrics and a held-out evaluation of every task."""
    from safetensors.torch import load_file
    from template_runs import run_one_step

    from simulators.metaworld_env import MT10_TASKS
    from vla_rl.data.trajectory_store import TrajectoryStore

    step, run_dir = run_one_step("embodied_srpo_mt10", MT10_TINY, tmp_path)
    assert {f"rollout/success_rate/{task}" for task in MT10_TASKS} <= set(step)
    assert step["rollout/env_steps"] <= 10 * 2 * 120
    demos = TrajectoryStore.open(run_dir / "demos.zarr", read_only=True)
    assert sorted(demos.read_scalars()["task"].tolist()) == list(range(10))
    weights = load_file(run_dir / "checkpoints" / "step_00000001" / "model.safetensors")
    assert weights["mean_net.0.weight"].shape == (16, 39 + 10)  # the state, then the task one-hot
    summary = json.loads((run_dir / "summary.json").read_text())
    for tag in ("warm_start_eval", "final_eval"):
        evaluation = summary[tag]
        assert evaluation["eval/greedy/episodes"] == 20  # 2 of each task, pooled
        assert all(evaluation[f"eval/{task}/greedy/episodes"] == 2 for task in MT10_TASKS)
    assert (run_dir / "videos" / "final.mp4").stat().st_size > 0
