"""The critic (PPO with GAE) under each ``trainer.strategy``, with micro-batches and activation
checkpointing, on two gloo workers (spawned processes, loopback) with shards of 5 and 3 episodes,
and its sharded checkpoint (``critic_sharded/``) resumed: the harness and helpers of
tests/trainers/fsdp_harness.py, one spawn for every scenario here."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from fsdp_harness import (
    MLP_SPLIT,
    WORLD,
    _max_abs,
    _max_loss_gap,
    _Patch,
    _text_batch,
    _trainer_section,
    _weights,
    spawn_workers,
)
from tensordict import TensorDict


def _critics(rank: int, lm_dir: str, ckpt_root: str) -> dict:
    """The critic's update under each strategy: the state-vector value network on shards of 5
    and 3 episodes (whole minibatches, micro-batches of one episode, activation checkpointing),
    a sharded critic checkpoint resumed, and the causal LM's value model; two updates each."""
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from policies.causal_lm.value_causal_lm import CausalLMValueModel
    from vla_rl.config import CriticSection
    from vla_rl.trainers.critic import CriticTrainer, ValueNetwork, text_values
    from vla_rl_core import keys

    torch.manual_seed(0)
    n, steps, obs_dim = 8, 6, 4
    obs = torch.randn(n, steps + 1, obs_dim)
    mask = torch.arange(steps)[None, :] < torch.tensor([6, 1, 4, 3, 6, 2, 5, 4])[:, None]
    batch = TensorDict({keys.OBS: obs, keys.RETURNS: 2.0 * obs[:, :-1, 0] - obs[:, :-1, 1],
                        keys.VALUES: 0.1 * torch.randn(n, steps), keys.RESPONSE_MASK: mask}, batch_size=[n])
    start = sum(MLP_SPLIT[:rank])
    shard = batch[start:start + MLP_SPLIT[rank]]
    critic = CriticSection(cliprange_value=0.5, loss_agg_mode="token-mean")

    def fresh_network():
        torch.manual_seed(1)
        return ValueNetwork(obs_dim, [8, 8], torch.full((obs_dim,), 0.1), torch.full((obs_dim,), 2.0))

    def train(trainer, section, data, updates=2, first=0):
        losses = [trainer.update(data, critic, section, torch.Generator().manual_seed(20 + first + i))["critic/vf_loss"]
                  for i in range(updates)]
        return {"losses": losses, "weights": _weights(trainer.network), "sharded": trainer.sharded,
                "checkpointed_blocks": trainer.parallel.checkpointed_blocks}

    out = {}
    for name, fields in {"ddp": {}, "ddp_micro": {"micro_batch_size": 1}, "fsdp": {"strategy": "fsdp"},
                         "fsdp_micro": {"strategy": "fsdp", "micro_batch_size": 1},
                         "ddp_gc": {"gradient_checkpointing": True},
                         "fsdp_gc": {"strategy": "fsdp", "gradient_checkpointing": True}}.items():
        section = _trainer_section(**fields)
        out[name] = train(CriticTrainer(fresh_network(), lr=1e-2, trainer=section), section, shard)

    # One minibatch of all 8 episodes (31 decision steps: 20 on worker 0, 11 on worker 1), and on
    # worker 0 alone in a process group of its own, the whole of it.
    alone = [dist.new_group([r]) for r in range(WORLD)]  # collective: every worker makes both
    for name, fields in {"global_ddp": {}, "global_fsdp_micro": {"strategy": "fsdp", "micro_batch_size": 2}}.items():
        section = _trainer_section(ppo_mini_batch_size=8, **fields)
        out[name] = train(CriticTrainer(fresh_network(), lr=1e-2, trainer=section), section, shard, updates=1)
    if rank == 0:
        section = _trainer_section(ppo_mini_batch_size=8)
        out["global_one_worker"] = train(CriticTrainer(fresh_network(), lr=1e-2, group=alone[0], trainer=section),
                                         section, batch, updates=1)

    section = _trainer_section(strategy="fsdp")
    straight = CriticTrainer(fresh_network(), lr=1e-2, trainer=section)
    train(straight, section, shard, updates=1)
    directory = os.path.join(ckpt_root, "critic")
    os.makedirs(directory, exist_ok=True)
    straight.save_sharded(directory)
    dist.barrier()
    resumed = CriticTrainer(ValueNetwork(obs_dim, [8, 8], torch.zeros(obs_dim), torch.ones(obs_dim)), lr=1e-2,
                            trainer=section)
    resumed.load_sharded(directory)
    out["resume"] = {"straight": train(straight, section, shard, updates=1, first=1),
                     "resumed": train(resumed, section, shard, updates=1, first=1),
                     "files": sorted(os.listdir(os.path.join(directory, "critic_sharded")))}

    torch.manual_seed(0)
    lm = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=lm_dir, max_prompt_length=32, max_response_length=8))
    text_batch = _text_batch(lm, rank)
    response_mask = text_batch[keys.RESPONSE_MASK]
    text_batch.set(keys.VALUES, torch.zeros(response_mask.shape))
    text_batch.set(keys.RETURNS, torch.where(response_mask, torch.linspace(-1.0, 1.0, response_mask.shape[1]), 0.0))
    for name, fields in {"lm_ddp": {}, "lm_fsdp": {"strategy": "fsdp", "micro_batch_size": 1}}.items():
        section = _trainer_section(**fields)
        torch.manual_seed(2)
        trainer = CriticTrainer(CausalLMValueModel(lm), lr=1e-3, forward=text_values, trainer=section)
        out[name] = train(trainer, section, text_batch)
    out["lm_after_actor"] = _text_critic_after_the_actor(lm_dir)
    return out


def _text_critic_after_the_actor(lm_dir: str) -> dict:
    """The text workflow's critic built after an FSDP actor in the bf16 emulation (the CPU
    admitted as an accelerator), as the vLLM rollout orders them: the actor has cast the policy
    to bfloat16. Records the critic's master weights against the float32 body it should start
    from, and what a copy of the cast policy would have started from."""
    from types import SimpleNamespace

    import vla_rl.trainers.strategy as strategy
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from policies.causal_lm.value_causal_lm import CausalLMValueModel
    from vla_rl.config import CriticSection
    from vla_rl.trainers.actor import ActorTrainer, text_forward
    from vla_rl.workflows.text import TextWorkflow

    def body(named) -> dict[str, torch.Tensor]:
        return {name.removeprefix("body."): tensor.detach().float().clone() for name, tensor in named
                if name.startswith("body.")}

    lm = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=lm_dir, max_prompt_length=32, max_response_length=8))
    float32_body = {name: tensor.detach().clone() for name, tensor in lm.model.get_decoder().named_parameters()}
    patch = _Patch()
    patch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, "cpu"))
    try:
        section = _trainer_section(strategy="fsdp")
        actor = ActorTrainer(lm, lr=1e-3, forward=text_forward, trainer=section)
        res = SimpleNamespace(policy=lm, actor=actor, device=torch.device("cpu"), group=None,
                              config=SimpleNamespace(critic=CriticSection(lr=1e-3), trainer=section),
                              built=lambda: ["policy", "actor"])
        critic = TextWorkflow().build_critic(res)
        masters = body(critic.parallel.master_parameters())
    finally:
        patch.undo()
    return {"masters": masters, "float32_body": float32_body,
            "policy_dtypes": {p.dtype for p in lm.parameters()},
            "copy_of_the_cast_policy": body(CausalLMValueModel(lm).named_parameters())}


@pytest.fixture(scope="module")
def runs(tiny_lm_dir, tmp_path_factory):
    """Every scenario's records, by worker: ``runs[rank][scenario]``."""
    return spawn_workers(_critics, tiny_lm_dir, tmp_path_factory.mktemp("critic_checkpoints"))


@pytest.mark.parametrize("case", ["ddp_micro", "fsdp", "fsdp_micro", "ddp_gc", "fsdp_gc"])
def test_the_critic_trains_under_fsdp_and_micro_batches_as_under_ddp(runs, case):
    """The critic followed neither ``trainer.strategy`` nor ``trainer.micro_batch_size`` (it
    always trained whole minibatches in DDP): the same two updates under each, on unequal shards."""
    for rank in range(WORLD):
        ddp, other = runs[rank]["ddp"], runs[rank][case]
        assert other["sharded"] is case.startswith("fsdp")
        assert other["checkpointed_blocks"] == (3 if case.endswith("_gc") else 0)  # the three linear layers
        assert _max_loss_gap(ddp, other) < 1e-5
        assert _max_abs(ddp["weights"], other["weights"]) < 1e-5
        assert _max_abs(other["weights"], runs[1 - rank][case]["weights"]) == 0.0  # workers agree


def test_the_critic_of_the_causal_lm_trains_under_fsdp_as_under_ddp(runs):
    for rank in range(WORLD):
        ddp, fsdp = runs[rank]["lm_ddp"], runs[rank]["lm_fsdp"]
        assert fsdp["sharded"] is True
        assert ddp["losses"][0] > 0 and _max_loss_gap(ddp, fsdp) < 1e-5
        assert _max_abs(ddp["weights"], fsdp["weights"]) < 1e-5


def test_a_sharded_critic_checkpoint_resumes_bit_identically(runs):
    """A fresh critic (other initial weights and state statistics) restored from
    ``critic_sharded/`` makes the same next update as the critic that wrote it."""
    for rank in range(WORLD):
        record = runs[rank]["resume"]
        assert ".metadata" in record["files"] and any(f.endswith(".distcp") for f in record["files"])
        assert record["resumed"]["losses"] == record["straight"]["losses"]
        assert _max_abs(record["resumed"]["weights"], record["straight"]["weights"]) == 0.0


def test_the_text_critic_built_after_the_actor_starts_from_its_float32_master_weights(runs):
    """With the vLLM rollout the actor is built first; under FSDP's mixed precision it casts the
    policy to bfloat16, and the critic copied that rounded body into its float32 masters."""
    for rank in range(WORLD):
        record = runs[rank]["lm_after_actor"]
        assert record["policy_dtypes"] == {torch.bfloat16}  # the actor did cast the policy
        assert _max_abs(record["copy_of_the_cast_policy"], record["float32_body"]) > 1e-4  # what it would start from
        assert _max_abs(record["masters"], record["float32_body"]) == 0.0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp_micro"])
def test_two_critic_workers_update_as_one_on_the_whole_minibatch(runs, strategy):
    """The value loss is normalised by the global minibatch (20 + 11 decision steps), as the
    actor's: the same loss and weights as one worker holding all 31."""
    whole = runs[0]["global_one_worker"]
    for rank in range(WORLD):
        split = runs[rank][f"global_{strategy}"]
        assert _max_loss_gap(split, whole) < 1e-6
        assert _max_abs(split["weights"], whole["weights"]) < 1e-6

