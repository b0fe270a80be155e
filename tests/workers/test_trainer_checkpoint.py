"""A trainer's checkpoint restores its optimizer's state, not its hyperparameters: a resume's
``trainer.lr=...`` (which the run's messages advise after a diverged update) applies."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch

from vla_rl.workers.checkpointing import ACTOR_CHECKPOINT

sys.path.insert(0, str(Path(__file__).parents[1]))


def adam_trainer(lr: float) -> types.SimpleNamespace:
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    return types.SimpleNamespace(sharded=False, optimizer=torch.optim.Adam(module.parameters(), lr=lr), module=module)


def test_a_resume_keeps_the_runs_learning_rate_and_the_checkpoints_moments(tmp_path):
    saved = adam_trainer(lr=3e-4)
    saved.module(torch.ones(4, 3)).sum().backward()
    saved.optimizer.step()
    ACTOR_CHECKPOINT.save(types.SimpleNamespace(actor=saved, rank=0), tmp_path)
    resumed = adam_trainer(lr=1e-12)  # the resume's trainer.lr=1e-12
    ACTOR_CHECKPOINT.load(types.SimpleNamespace(actor=resumed, rank=0), tmp_path, {})
    assert resumed.optimizer.param_groups[0]["lr"] == 1e-12  # it was 3e-4, the checkpoint's
    for parameter, twin in zip(saved.module.parameters(), resumed.module.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(resumed.optimizer.state[twin][key], saved.optimizer.state[parameter][key])


def test_an_fsdp_resume_keeps_the_runs_learning_rate(process_group, tmp_path, monkeypatch):
    from test_export import _fsdp_mlp_checkpoint

    from vla_rl.trainers.actor import ActorTrainer

    sys.path.insert(0, str(Path(__file__).parents[1] / "trainers"))
    from test_actor import update_config

    _, _, policy, _, trainer, checkpoint = _fsdp_mlp_checkpoint(tmp_path, monkeypatch)
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-2
    section = update_config("ppo_clip", "action")[1].model_copy(update={"strategy": "fsdp"})
    resumed = ActorTrainer(policy, lr=1e-5, trainer=section)
    ACTOR_CHECKPOINT.load(types.SimpleNamespace(actor=resumed, rank=0), checkpoint, {})
    assert {group["lr"] for group in resumed.optimizer.param_groups} == {1e-5}
