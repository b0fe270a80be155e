"""LoRA injection (policies/lora.py) on a low-precision base."""

from __future__ import annotations

import torch
from torch import nn

from policies.lora import inject_lora, merge_lora


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
