"""DDP's mixed precision (``trainer.mixed_precision``: ``auto`` on CUDA/NPU, ``bf16``): float32
weights and Adam state, every forward pass of the policy, the reference and the critic in
``torch.autocast(bfloat16)``, the old log-probs rescored by the trainer so that the first ratio
is 1.

On an accelerator test device (``VLA_RL_TEST_DEVICE=cuda``) the tests run there, as a CUDA
worker computes. On the CPU they run in the "bf16 emulation" (the ``bf16_device`` fixture): the
CPU admitted as an accelerator (``strategy.ACCELERATORS`` patched), so that ``auto`` resolves to
bfloat16 as on a CUDA worker and CPU autocast runs the bfloat16 kernels. CUDA's autocast casts
more ops to float32 than the CPU's (softmax, layer norms, reductions), so on the CPU these tests
cover the dtype flow of the backward pass and the contexts' reach, not CUDA's op lists.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict
from test_actor import TINY_CONFIGS, RandomWalkPool, rollout_batch, spy_on_losses, update_config

import vla_rl.trainers.strategy as strategy
from policies import make_policy
from vla_rl.config import AlgorithmSection, CriticSection, TrainerSection
from vla_rl.nodes.inference import compute_ref_log_probs, compute_values
from vla_rl.nodes.rollout import rollout_groups
from vla_rl.trainers.actor import ActorTrainer, embodied_forward, text_forward
from vla_rl.trainers.critic import CriticTrainer, ValueNetwork
from vla_rl.trainers.strategy import autocast
from vla_rl_core import keys

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


class LinearDtypes:
    """The dtypes the ``nn.Linear`` layers of ``module`` computed their outputs in since the last
    :meth:`take` (peft's LoRA layers wrap ``nn.Linear`` base layers, which are counted)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seen: set[torch.dtype] = set()
        self.handles = [m.register_forward_hook(self._record) for m in module.modules()
                        if isinstance(m, torch.nn.Linear)]
        assert self.handles

    def _record(self, module, inputs, output) -> None:
        self.seen.add(output.dtype)

    def take(self) -> set[torch.dtype]:
        seen, self.seen = self.seen, set()
        return seen


def _section(**fields) -> TrainerSection:
    return TrainerSection(**{"ppo_epochs": 1, "ppo_mini_batch_size": 8, "max_grad_norm": 1.0, **fields})


def _embodied(name: str, lora: bool = False):
    torch.manual_seed(0)
    policy = make_policy(name, TINY_CONFIGS[name]())
    if lora:
        policy.apply_lora(rank=4)  # float32 adapters over the tiny model's float32 base
    return policy, lambda: rollout_batch(policy), embodied_forward, update_config("ppo_clip", "action")[0]


def _text(lm_dir):
    from fsdp_harness import _text_batch

    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    torch.manual_seed(0)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(lm_dir), max_prompt_length=32,
                                                           max_response_length=8))
    algorithm = AlgorithmSection(policy_loss="ppo_clip", ratio_granularity="action", loss_agg_mode="token-mean")
    return policy, lambda: _text_batch(policy, 0), text_forward, algorithm


#: case -> (policy, trainer fields): activation checkpointing recomputes blocks in the backward
#: pass (torch.utils.checkpoint restores the forward's autocast state), micro-batches accumulate.
CASES = {"mlp": ("mlp", {}), "pi0": ("pi0", {}), "openvla_oft": ("openvla_oft", {}), "lm": ("lm", {}),
         "openvla_oft_lora": ("openvla_oft", {}), "pi0_checkpointing": ("pi0", {"gradient_checkpointing": True}),
         "lm_checkpointing": ("lm", {"gradient_checkpointing": True}),
         "lm_micro_checkpointing": ("lm", {"micro_batch_size": 2, "gradient_checkpointing": True})}


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_mixed_precision_keeps_float32_weights_and_computes_in_bfloat16(process_group, bf16_device,
                                                                           monkeypatch, tiny_lm_dir, case):
    """Under bfloat16 mixed precision (on the accelerator, or in the emulation): the rollout and
    the update compute in bfloat16 (every linear layer's output), the weights, their gradients and
    Adam's state stay float32, and the first minibatch's ratio is exactly 1 (the trainer rescored
    the rollout's actions; on an accelerator, within bfloat16's rounding for micro-batches).
    Regression: the MLP's batch-invariant linear layer (a custom autograd function) returned
    bfloat16 outputs under autocast and its backward multiplied them with the float32 weight
    ("expected m1 and m2 to have the same dtype"). Regression: the causal LM with gradient
    checkpointing was rescored on the shared-prompt cache path and updated in one pass, which
    bfloat16 rounds apart (first log-probs 4.8e-4 off)."""
    name, fields = CASES[case]
    policy, roll_out, forward, algorithm = _text(tiny_lm_dir) if name == "lm" else _embodied(name, "lora" in case)
    policy.to(bf16_device)
    section = _section(**fields)
    linear = LinearDtypes(policy)
    with autocast(section, bf16_device):  # as the rollout node runs it
        batch = roll_out()
    assert linear.take() == {torch.bfloat16}
    trainer = ActorTrainer(policy, lr=1e-3, forward=forward, trainer=section)
    assert trainer.parallel.autocast_dtype == torch.bfloat16 and trainer.parallel.recomputes_old_log_probs
    assert (trainer.parallel.checkpointed_blocks > 0) == section.gradient_checkpointing
    before = {name: p.detach().clone() for name, p in policy.named_parameters() if p.requires_grad}
    calls = spy_on_losses(monkeypatch)
    metrics = trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10))
    assert linear.take() == {torch.bfloat16}
    assert metrics["actor/num_updates"] == 1.0 and metrics["actor/skipped_updates"] == 0.0
    log_probs, old_log_probs, mask, first = calls[0]
    assert log_probs.dtype == torch.float32
    if bf16_device.type == "cpu" or section.micro_batch_size is None:
        # the minibatch is the batch rescored, in another row order: the same shapes
        assert torch.equal(log_probs[mask], old_log_probs[mask]) and first["ratio_mean"] == 1.0
    else:  # micro-batches of other rows than the rescoring's: a causal LM trims other padding
        # columns, and an accelerator's bfloat16 kernels may round otherwise for other shapes
        torch.testing.assert_close(log_probs[mask], old_log_probs[mask], rtol=0, atol=5e-2)
        assert abs(first["ratio_mean"] - 1.0) < 1e-2
    # the rollout computed in the same context: its log-probs are the trainer's up to bfloat16
    # kernels choosing otherwise for other batch shapes (the MLP is batch-invariant: exactly;
    # the CPU's bfloat16 kernels are row by row: 0 for every policy here). On an accelerator a
    # π0 chain's log-prob sums 28 Gaussian terms whose means bfloat16 rounds: a looser bound.
    gap = metrics["actor/old_log_prob_max_diff"]
    assert gap == 0.0 if case == "mlp" else gap < (0.05 if bf16_device.type == "cpu" else 1.0)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    assert {p.dtype for p in trainable} == {torch.float32}
    assert {p.grad.dtype for p in trainable if p.grad is not None} == {torch.float32}
    assert {s["exp_avg"].dtype for s in trainer.optimizer.state.values()} == {torch.float32}
    assert any(not torch.equal(before[name], p) for name, p in policy.named_parameters() if p.requires_grad)


def test_on_the_cpu_or_without_mixed_precision_ddp_computes_in_the_policys_dtypes(process_group, monkeypatch):
    """CPU workers (``auto``) and ``none`` keep float32 throughout, the rollout's log-probs
    unrescored; FSDP casts its parameters rather than autocasting."""
    policy, roll_out, _, algorithm = _embodied("mlp")
    section = _section()
    assert strategy.autocast_dtype(section, CPU) is None
    linear = LinearDtypes(policy)
    with autocast(section, CPU):
        batch = roll_out()
    trainer = ActorTrainer(policy, lr=1e-3, trainer=section)
    trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10))
    assert linear.take() == {torch.float32}
    assert trainer.parallel.autocast_dtype is None and not trainer.parallel.recomputes_old_log_probs
    monkeypatch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, "cpu"))
    assert strategy.autocast_dtype(_section(mixed_precision="none"), CPU) is None
    assert strategy.autocast_dtype(_section(strategy="fsdp"), CPU) is None
    assert strategy.policy_dtype(_section(strategy="fsdp"), CPU) == torch.bfloat16
    assert strategy.autocast_dtype(_section(), torch.device("meta")) is None  # not an accelerator


def test_bfloat16_weights_without_autocast_rescore_the_rollouts_tokens(process_group, monkeypatch, tiny_lm_dir):
    """A LoRA causal LM over bfloat16 weights under DDP without mixed precision (the CPU's
    ``auto``; ``text.dtype: bfloat16``): its token-by-token decoding rounds otherwise than the
    trainer's one forward pass, so the trainer rescores the rollout's tokens before its first
    update (verl's ``compute_log_prob``) and the first minibatch's ratio is exactly 1."""
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    torch.manual_seed(0)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), dtype="bfloat16",
                                                           max_prompt_length=32, max_response_length=16))
    policy.apply_lora(rank=4)  # float32 adapters: DDP trains them
    prompts = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 12 + 39 - 7?"}]]
    ids, mask = policy.processor.encode_prompts(prompts, max_length=32)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    generation = policy.generate(ids, mask, generator=torch.Generator().manual_seed(0))  # 16 tokens at most
    advantages = torch.linspace(-1.0, 1.0, 8)[:, None] * generation.response_mask
    batch = TensorDict({keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.RESPONSES: generation.responses,
                        keys.RESPONSE_MASK: generation.response_mask,
                        keys.OLD_LOG_PROBS: generation.log_probs[..., None], keys.ADVANTAGES: advantages},
                       batch_size=[8])
    section = _section(mixed_precision="none")
    trainer = ActorTrainer(policy, lr=1e-3, forward=text_forward, trainer=section)
    assert trainer.parallel.autocast_dtype is None and trainer.parallel.recomputes_old_log_probs
    calls = spy_on_losses(monkeypatch)
    algorithm = AlgorithmSection(policy_loss="ppo_clip", ratio_granularity="action", loss_agg_mode="token-mean")
    metrics = trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10))
    log_probs, old_log_probs, mask, first = calls[0]
    assert torch.equal(log_probs[mask], old_log_probs[mask]) and first["ratio_mean"] == 1.0
    assert metrics["actor/old_log_prob_max_diff"] > 1e-4  # the decoding's log-probs really differ


def test_the_rollout_reference_and_critic_nodes_compute_in_the_trainers_context(process_group, bf16_device):
    """The nodes outside the trainers enter the trainer's autocast context: the rollout samples,
    the reference scores and the critic values in bfloat16, the critic's weights stay float32 and
    its update computes in bfloat16 too."""
    policy, _, _, _ = _embodied("mlp")
    policy.to(bf16_device)
    section = _section()
    config = SimpleNamespace(trainer=section)
    linear = LinearDtypes(policy)
    tasks = TensorDict({keys.INIT_STATE_ID: torch.arange(4), keys.TASK_ID: torch.zeros(4, dtype=torch.long),
                        keys.UID: torch.arange(4)}, batch_size=[4])
    resources = SimpleNamespace(policy=policy, simulator_pool=RandomWalkPool([3, 5, 2, 4, 1, 6, 2, 3]),
                                generator=torch.Generator().manual_seed(0), config=config, device=bf16_device)
    episodes, _ = rollout_groups(resources, 2, tasks, greedy=False, pipeline_stages=1)
    assert len(episodes) == 8 and linear.take() == {torch.bfloat16}

    workflow = SimpleNamespace(batch_forward=embodied_forward)
    ctx = SimpleNamespace(config=SimpleNamespace(trainer=section),
                          resources=SimpleNamespace(reference=policy, workflow=workflow, device=bf16_device))
    ref_log_probs = compute_ref_log_probs(ctx, episodes).batch[keys.REF_LOG_PROBS]
    assert ref_log_probs.dtype == torch.float32 and linear.take() == {torch.bfloat16}

    obs_dim = episodes[keys.OBS].shape[-1]
    network = ValueNetwork(obs_dim, [8], torch.zeros(obs_dim), torch.ones(obs_dim)).to(bf16_device)
    critic = CriticTrainer(network, lr=1e-2, trainer=section)
    critic_linear = LinearDtypes(network)
    ctx.resources.critic = critic
    values = compute_values(ctx, episodes).batch[keys.VALUES]
    assert values.dtype == torch.float32 and critic_linear.take() == {torch.bfloat16}
    episodes.set(keys.VALUES, values)
    episodes.set(keys.RETURNS, torch.randn(values.shape))
    metrics = critic.update(episodes, CriticSection(), section, torch.Generator().manual_seed(0))
    assert metrics["critic/num_updates"] == 1.0 and critic_linear.take() == {torch.bfloat16}
    assert {p.dtype for p in network.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in network.parameters() if p.grad is not None} == {torch.float32}


def test_auto_computes_in_bfloat16_only_on_gpus_with_native_bfloat16(monkeypatch):
    """``auto`` on a GPU before Ampere (V100: 7.0, T4: 7.5), where torch emulates bfloat16, is
    float32; from compute capability 8.0 on (A100, H100), bfloat16. ``bf16`` asked explicitly stays
    bfloat16. The capability is that of the worker's device (no CUDA here: torch's query is
    replaced, so nothing touches a GPU)."""
    asked = []

    def capability(device):
        asked.append(device)
        return capabilities[device.index]

    capabilities = {0: (7, 0), 1: (7, 5), 2: (8, 0), 3: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    dtypes = {index: strategy.compute_dtype("auto", torch.device("cuda", index)) for index in capabilities}
    assert dtypes == {0: None, 1: None, 2: torch.bfloat16, 3: torch.bfloat16}
    assert [device.index for device in asked] == [0, 1, 2, 3]
    assert strategy.compute_dtype("bf16", torch.device("cuda", 0)) == torch.bfloat16
    assert strategy.autocast_dtype(_section(), torch.device("cuda", 1)) is None
    assert strategy.policy_dtype(_section(strategy="fsdp"), torch.device("cuda", 3)) == torch.bfloat16
