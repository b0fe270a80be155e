"""A resumed actor (the policy's weights and the optimizer's state as a checkpoint holds them,
through the checkpoint parts a worker saves and loads) makes the next update of the uninterrupted
one, bit for bit, for every policy, π0 and OpenVLA-OFT included: their engine runs from a random
tiny model earn no reward, so an end-to-end resume of them compares updates that move nothing."""

from __future__ import annotations

import types

import pytest
import torch
from test_actor import TINY_CONFIGS, rollout_batch, update_config

from policies import make_policy
from vla_rl.checkpoints import files as checkpoint
from vla_rl.trainers.actor import ActorTrainer
from vla_rl.workers.checkpointing import ACTOR_CHECKPOINT
from vla_rl_core import keys


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


def _update(trainer: ActorTrainer, batch, seed: int) -> dict:
    return trainer.update(batch, *update_config("ppo_clip", "action"), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("policy_name", sorted(TINY_CONFIGS))
def test_a_resumed_actor_makes_the_next_update_of_the_uninterrupted_one(process_group, tmp_path, policy_name):
    torch.manual_seed(0)
    policy = make_policy(policy_name, TINY_CONFIGS[policy_name]())
    batch = rollout_batch(policy)
    trainer = ActorTrainer(policy, lr=1e-2)
    _update(trainer, batch, 1)  # Adam's moments are not zero: a resume that lost them would differ
    directory = tmp_path / "step_1"
    directory.mkdir()
    checkpoint.save_model(directory, policy)
    ACTOR_CHECKPOINT.save(types.SimpleNamespace(actor=trainer, rank=0), directory)

    torch.manual_seed(1)  # other initial weights, as a new worker's
    resumed_policy = make_policy(policy_name, TINY_CONFIGS[policy_name]())
    resumed = ActorTrainer(resumed_policy, lr=1e-2)
    checkpoint.load_policy_weights(directory, resumed_policy)
    ACTOR_CHECKPOINT.load(types.SimpleNamespace(actor=resumed, rank=0), directory, {})

    next_batch = batch.clone()
    next_batch.set(keys.ADVANTAGES, -batch[keys.ADVANTAGES])
    before = {name: value.clone() for name, value in policy.state_dict().items()}
    metrics = _update(trainer, next_batch, 2)
    resumed_metrics = _update(resumed, next_batch, 2)
    assert metrics == resumed_metrics
    moved = [name for name, value in policy.state_dict().items() if not torch.equal(value, before[name])]
    assert moved  # the update trained
    resumed_state = resumed_policy.state_dict()
    for name, value in policy.state_dict().items():
        torch.testing.assert_close(resumed_state[name], value, rtol=0, atol=0, msg=name)
