"""LoRA injection (policies/lora.py) on a low-precision base, and its merge."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

from policies.lora import inject_lora, merge_lora, merged_weights


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8)


def test_adapters_on_a_bfloat16_base_are_float32_and_the_output_keeps_the_base_dtype():
    """Adam updates the adapters in their own dtype: bfloat16 adapters would have no float32
    master weights under DDP."""
    torch.manual_seed(0)
    model = Attention().to(torch.bfloat16)
    assert inject_lora(model, rank=4, alpha=None, dropout=0.0, target_modules=["q_proj"]) == ["q_proj"]
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["q_proj.lora_A.default.weight"] == dtypes["q_proj.lora_B.default.weight"] == torch.float32
    assert dtypes["q_proj.base_layer.weight"] == torch.bfloat16
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        model.q_proj.lora_B.default.weight.fill_(0.1)
        adapted = model.q_proj(x)
    assert adapted.dtype == torch.bfloat16
    merge_lora(model)
    assert model.q_proj.weight.dtype == torch.bfloat16
    torch.testing.assert_close(model.q_proj(x), adapted, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("dtype", "under_autocast"), [(torch.float32, False), (torch.bfloat16, False),
                                                       (torch.float32, True)])
def test_merged_weights_are_what_merging_writes_and_leave_the_model_adapted(tmp_path, dtype, under_autocast):
    """What the vLLM rollout engine loads under LoRA (text.rollout_backend=vllm): the weights of
    the model without adapters, equal bit for bit to peft's merge, the model untouched; also when
    taken inside bfloat16 autocast, as the weight sync is (inside the rollout's context under DDP's
    mixed precision: before, ``B @ A`` was then rounded to bfloat16)."""
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from policies.causal_lm.tiny import TinyQwen2Spec, write_tiny_checkpoint

    directory = write_tiny_checkpoint(tmp_path, TinyQwen2Spec(), seed=0)
    plain = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(directory))).to(dtype)
    policy = copy.deepcopy(plain)
    torch.manual_seed(1)
    policy.apply_lora(rank=4)
    with torch.no_grad():  # B = 0 at injection: give the adapters an effect
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.1)
    before = {name: tensor.clone() for name, tensor in policy.model.state_dict().items()}

    context = torch.autocast("cpu", dtype=torch.bfloat16) if under_autocast else contextlib.nullcontext()
    with context:
        merged = dict(merged_weights(policy.model))

    assert list(merged) == list(plain.model.state_dict())
    after = policy.model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[name], before[name]) for name in before)
    reference = copy.deepcopy(policy)
    assert merge_lora(reference.model) > 0
    for name, tensor in reference.model.state_dict().items():
        assert merged[name].dtype == tensor.dtype == dtype, name
        assert torch.equal(merged[name], tensor), name
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q_proj], plain.model.state_dict()[q_proj])  # the adapters are in it


def test_merged_weights_of_a_model_without_adapters_are_its_state_dict():
    model = Attention()
    merged = dict(merged_weights(model))
    assert list(merged) == ["q_proj.weight", "q_proj.bias"]
    assert all(torch.equal(merged[name], tensor) for name, tensor in model.state_dict().items())
