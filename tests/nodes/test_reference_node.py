"""The ``reference`` resource: a frozen copy of the policy at the start of training that shares
the policy's frozen parameters (a LoRA run's base model) instead of copying them, in memory and
in its checkpoint file."""

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
from vla_rl.workers.checkpointing import SharedModuleCheckpoint

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


def _checkpoint_resources(policy, reference) -> SimpleNamespace:
    return SimpleNamespace(rank=0, policy=policy, reference=reference)


def test_the_reference_checkpoint_holds_the_adapters_and_restores_them(lora_policy, tmp_path):
    """Under LoRA, reference.safetensors holds the reference's own tensors (the adapters), not
    the base model it shares with the policy, whose checkpoint restores that."""
    from safetensors.torch import load_file

    policy = lora_policy
    reference = build_reference(_resources(policy))
    saver = SharedModuleCheckpoint("reference", "reference", owner="policy")
    resources = _checkpoint_resources(policy, reference)
    saver.save(resources, tmp_path)
    written = load_file(tmp_path / "reference.safetensors")
    adapters = {name for name, p in reference.named_parameters() if p is not policy.get_parameter(name)}
    buffers = set(reference.state_dict()) - {name for name, _ in reference.named_parameters(remove_duplicate=False)}
    assert adapters and set(written) == adapters | buffers
    saved = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
    base = {name: p.clone() for name, p in policy.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        for name in adapters:
            reference.get_parameter(name).zero_()
    saver.load(resources, tmp_path, {})
    assert all(torch.equal(tensor, saved[name]) for name, tensor in reference.state_dict().items())
    assert all(torch.equal(policy.get_parameter(name), tensor) for name, tensor in base.items())


def test_a_reference_checkpoint_written_whole_still_loads(lora_policy, tmp_path):
    """Checkpoints from before the reference shared the policy's parameters hold all of it: the
    reference's own tensors are read, the shared ones left to the policy's checkpoint."""
    from vla_rl.checkpoints.files import save_model

    policy = lora_policy
    reference = build_reference(_resources(policy))
    save_model(tmp_path, reference, name="reference")
    before = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
    with torch.no_grad():
        for parameter in policy.parameters():
            if not parameter.requires_grad:  # what the policy's own checkpoint would have restored
                parameter.add_(1.0)
        for name, parameter in reference.named_parameters():
            if "lora_" in name:
                parameter.zero_()
    SharedModuleCheckpoint("reference", "reference", owner="policy").load(
        _checkpoint_resources(policy, reference), tmp_path, {})
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, before[name]) is ("lora_" in name), name


def test_a_reference_checkpoint_that_misses_a_tensor_is_refused(lora_policy, tmp_path):
    from safetensors.torch import load_file, save_file

    policy = lora_policy
    reference = build_reference(_resources(policy))
    resources = _checkpoint_resources(policy, reference)
    saver = SharedModuleCheckpoint("reference", "reference", owner="policy")
    saver.save(resources, tmp_path)
    file = tmp_path / "reference.safetensors"
    tensors = load_file(file)
    dropped = sorted(tensors)[0]
    save_file({name: tensor for name, tensor in tensors.items() if name != dropped}, str(file))
    with pytest.raises(RuntimeError, match=rf"reference.safetensors: .*missing \['{dropped}'\]"):
        saver.load(resources, tmp_path, {})


def test_a_full_copy_with_tied_embeddings_round_trips(tiny_lm_dir, tmp_path):
    """Without frozen parameters nothing is shared: the whole reference is written, its tied
    input and output embeddings once."""
    from safetensors.torch import load_file

    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir)))
    reference = build_reference(_resources(policy))
    saver = SharedModuleCheckpoint("reference", "reference", owner="policy")
    resources = _checkpoint_resources(policy, reference)
    saver.save(resources, tmp_path)
    names = set(load_file(tmp_path / "reference.safetensors"))
    state = reference.state_dict()
    assert len(names) == len(state) - 1 and set(state) - names <= {"model.lm_head.weight"}
    saved = {name: tensor.clone() for name, tensor in state.items()}
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.zero_()
    saver.load(resources, tmp_path, {})
    assert all(torch.equal(tensor, saved[name]) for name, tensor in reference.state_dict().items())
