"""The ``reference`` resource: a frozen copy of the policy at the start of training that shares
the policy's frozen parameters (a LoRA run's base model) instead of copying them."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from policies import make_policy
from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from policies.mlp import MLPPolicyConfig
from vla_rl.config.trainer import TrainerSection
from vla_rl.nodes.inference import build_reference

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 41 - 17?"}]]


def _resources(policy) -> SimpleNamespace:
    return SimpleNamespace(policy=policy, config=SimpleNamespace(trainer=TrainerSection()), device=torch.device("cpu"))


def _storages(module) -> set[int]:
    return {parameter.untyped_storage().data_ptr() for parameter in module.parameters()}


def _bytes(parameter) -> int:
    return parameter.numel() * parameter.element_size()


def _log_probs(policy, batch) -> torch.Tensor:
    with torch.no_grad():
        return policy.eval().log_probs(*batch)


@pytest.fixture
def lora_policy(tiny_lm_dir):
    torch.manual_seed(0)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=32,
                                                           max_response_length=6))
    policy.apply_lora(rank=4)
    return policy


def test_under_lora_the_reference_shares_the_base_and_copies_the_adapters(lora_policy):
    policy = lora_policy
    reference = build_reference(_resources(policy))
    trainable = {name for name, parameter in policy.named_parameters() if parameter.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    for name, parameter in policy.named_parameters():
        copied = reference.get_parameter(name)
        assert (copied is parameter) is (name not in trainable), name
        assert not copied.requires_grad and torch.equal(copied, parameter)
    own = _storages(reference) - _storages(policy)
    assert len(own) == len(trainable)  # the reference's own memory: the adapters, not a second model
    own_bytes = sum(_bytes(p) for p in reference.parameters() if p.untyped_storage().data_ptr() in own)
    policy_bytes = sum(_bytes(p) for p in policy.parameters())
    assert own_bytes < 0.2 * policy_bytes


def test_the_reference_scores_as_a_full_copy_after_the_policy_trains(lora_policy):
    """What the KL term needs: the policy's updates (Adam on the adapters) leave the reference's
    log-probs those of the policy it was built from, bit for bit as a full deep copy's."""
    policy = lora_policy
    reference = build_reference(_resources(policy))
    full_copy = copy.deepcopy(policy).requires_grad_(False).eval()
    input_ids, attention_mask = policy.processor.encode_prompts(PROMPTS, 32)
    generation = policy.eval().generate(input_ids, attention_mask, max_new_tokens=6,
                                        generator=torch.Generator().manual_seed(0))
    batch = (input_ids, attention_mask, generation.responses, generation.response_mask)
    before = _log_probs(reference, batch)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        loss = -policy.train().log_probs(*batch)[generation.response_mask].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert not torch.equal(_log_probs(policy, batch), before)
    assert torch.equal(_log_probs(reference, batch), before)
    assert torch.equal(_log_probs(full_copy, batch), before)


def test_without_frozen_parameters_the_reference_is_a_full_copy():
    torch.manual_seed(0)
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=5, action_dim=7, hidden_sizes=(16, 16)))
    reference = build_reference(_resources(policy))
    assert not _storages(reference) & _storages(policy)
    assert all(not p.requires_grad for p in reference.parameters())
    assert all(p.requires_grad for p in policy.parameters())
