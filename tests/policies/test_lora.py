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


class Block(nn.Module):
    """q_proj trainable, k_proj frozen (as a policy freezes the towers' unused last block)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.k_proj = nn.Linear(8, 8).requires_grad_(False)


def _adapters(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters() if "lora_" in name]


@pytest.mark.parametrize(("targets", "match"), [
    (["q_proj", "v_prj"], r"\['v_prj'\] name no trainable linear layer of the policy; its linear layers are named "
                          r"\['k_proj', 'q_proj'\]"),
    (["q_proj", "k_proj"], r"\['k_proj'\] name no trainable linear layer of the policy \(\['k_proj'\]: only layers "
                           r"the policy freezes itself\)"),
    (["v_prj"], r"\['v_prj'\] name no trainable linear layer"),
])
def test_a_listed_target_that_names_no_trainable_layer_is_refused_and_nothing_is_injected(targets, match):
    """peft refuses only a list that matches no layer at all: beside a valid q_proj, a typo
    trained fewer adapters than asked for, silently."""
    from vla_rl_core.components import ComponentConfigError

    model = Block()
    with pytest.raises(ComponentConfigError, match=match) as raised:
        inject_lora(model, rank=4, alpha=None, dropout=0.0, target_modules=targets)
    assert raised.value.field == "target_modules" and _adapters(model) == []


class Wide(nn.Module):
    """A trainable 6 -> 12 layer (full rank 6), a trainable 4 -> 2 one (2), a frozen 16 -> 16 one."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(6, 12)
        self.v_proj = nn.Linear(4, 2)
        self.k_proj = nn.Linear(16, 16).requires_grad_(False)


@pytest.mark.parametrize(("targets", "largest"), [(["q_proj", "v_proj"], 6), (["v_proj"], 2)])
def test_a_rank_above_every_adapted_layers_full_rank_is_refused_before_anything_is_allocated(targets, largest):
    """rank=1e12 allocated the factors (256 TB on the tiny text model) and died with the allocator's
    traceback; a rank up to the largest adapted layer's min(in, out) is accepted (over-complete on
    the smaller layers, as tiny test models are)."""
    from vla_rl_core.components import ComponentConfigError

    with torch.device("meta"):
        model = Wide()
    with pytest.raises(ComponentConfigError, match=rf"{largest + 1} is above the full rank of every layer it adapts "
                                                   rf"\(the largest: {largest}, of {targets[0]}\): use at most "
                                                   rf"{largest}") as raised:
        inject_lora(model, rank=largest + 1, alpha=None, dropout=0.0, target_modules=targets)
    assert raised.value.field == "rank" and _adapters(model) == []
    with pytest.raises(ComponentConfigError, match="above the full rank"):
        inject_lora(model, rank=10**12, alpha=None, dropout=0.0, target_modules=targets)
    assert len(inject_lora(model, rank=largest, alpha=None, dropout=0.0, target_modules=targets)) == len(targets)


def test_a_default_list_adapts_the_layers_it_names_that_the_model_has():
    model = Block()
    assert inject_lora(model, rank=4, alpha=None, dropout=0.0, target_modules=["q_proj", "k_proj", "out_proj"],
                       every_target=False) == ["q_proj"]
    with pytest.raises(ValueError, match=r"no layer matches \['out_proj'\]"):
        inject_lora(Block(), rank=4, alpha=None, dropout=0.0, target_modules=["out_proj"], every_target=False)


def test_a_policy_adapts_its_default_layers_and_refuses_a_listed_name_it_lacks(tmp_path):
    """The causal LM (Qwen2: no out_proj) with the default list (None), and with a list naming
    out_proj; a trainable_modules entry that is no submodule names its argument."""
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from policies.causal_lm.tiny import TinyQwen2Spec, write_tiny_checkpoint
    from vla_rl_core.components import ComponentConfigError

    directory = write_tiny_checkpoint(tmp_path, TinyQwen2Spec(), seed=0)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(directory)))
    adapted = {name.split(".lora_")[0].rpartition(".")[2] for name in policy.apply_lora(rank=2)}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    fresh = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(directory)))
    with pytest.raises(ComponentConfigError, match=r"\['out_proj'\] name no trainable linear layer") as raised:
        fresh.apply_lora(rank=2, target_modules=["q_proj", "out_proj"])
    assert raised.value.field == "target_modules"
    with pytest.raises(ComponentConfigError, match="no submodule 'proj'") as raised:
        fresh.apply_lora(rank=2, target_modules=["q_proj"], trainable_modules=["proj"])
    assert raised.value.field == "trainable_modules"
