"""`vla-rl eval` evaluates checkpoints in the precision the run's rollouts had: the evaluation
template takes the run's ``trainer.strategy`` and ``trainer.mixed_precision`` (before, its own
defaults: an FSDP bfloat16 run was evaluated in float32 weights under autocast, a ``none`` run in
bfloat16 autocast on GPUs), and under FSDP's mixed precision the evaluated policy acts with
bfloat16 parameters; on the test device when it is an accelerator, else on the CPU in the bf16
emulation of the trainer tests (the CPU admitted as an accelerator)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from test_eval_tasks import write_run

from policies import make_policy
from policies.mlp import MLPPolicyConfig
from vla_rl.eval_driver import prepare_eval_dir
from vla_rl.evaluation.benchmarks import resolve_tasks
from vla_rl.evaluation.embodied import EmbodiedEvaluation
from vla_rl.trainers import strategy

LIFT_MLP = MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(8,))


@pytest.mark.parametrize(("run_overrides", "eval_overrides", "expected"), [
    ([], [], ("ddp", "auto")),
    (["trainer.strategy=fsdp"], [], ("fsdp", "auto")),
    (["trainer.mixed_precision=none"], [], ("ddp", "none")),
    # trained on GPUs in bf16: auto is the same there, and float32 on CPU workers instead of refused
    (["workers.device=cuda", "trainer.mixed_precision=bf16"], [], ("ddp", "auto")),
    (["trainer.mixed_precision=none"], ["trainer.mixed_precision=auto"], ("ddp", "auto")),  # an override wins
])
def test_the_evaluation_takes_the_runs_precision(tmp_path, run_overrides, eval_overrides, expected):
    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]", *run_overrides], LIFT_MLP)
    _, loaded, _ = prepare_eval_dir([str(run_dir)], ["eval.num_episodes=3", *eval_overrides])
    assert (loaded.config.trainer.strategy, loaded.config.trainer.mixed_precision) == expected


def test_an_fsdp_runs_checkpoint_is_evaluated_with_bfloat16_parameters(tmp_path, bf16_device, monkeypatch):
    run_dir = write_run(tmp_path, "embodied_srpo", ["policy.config.hidden_sizes=[8]", "trainer.strategy=fsdp"],
                        LIFT_MLP)
    _, loaded, _ = prepare_eval_dir([str(run_dir)], ["eval.num_episodes=3"])
    checkpoint = run_dir / "checkpoints" / "step_00000001"
    trained = make_policy("mlp", LIFT_MLP)
    from vla_rl.checkpoints import files as ckpt

    ckpt.load_policy_weights(checkpoint, trained)
    session = EmbodiedEvaluation.__new__(EmbodiedEvaluation)  # the worker's session, without its simulators
    session.res = SimpleNamespace(policy=make_policy("mlp", LIFT_MLP).to(bf16_device), device=bf16_device,
                                  env_spec=None)
    session.config, session.tasks = loaded.config, resolve_tasks(loaded.config)
    session.checkpoints, session._loaded = [checkpoint], None
    policy = session.policy(0, 0)
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in policy.parameters()} == {bf16_device.type}
    for (name, evaluated), checkpointed in zip(policy.named_parameters(), trained.parameters()):
        assert torch.equal(evaluated.cpu(), checkpointed.to(torch.bfloat16)), name
    session._loaded = None
    monkeypatch.setattr(strategy, "ACCELERATORS", tuple(a for a in strategy.ACCELERATORS if a != "cpu"))  # a real CPU
    session.res.policy, session.res.device = make_policy("mlp", LIFT_MLP), torch.device("cpu")
    assert {p.dtype for p in session.policy(0, 0).parameters()} == {torch.float32}
