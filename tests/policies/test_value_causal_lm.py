"""The LM value model's starting weights: the policy's body, or the weights it is given (the
actor's float32 masters, tests/trainers/test_critic_fsdp.py)."""

from __future__ import annotations

import pytest
import torch

from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from policies.causal_lm.value_causal_lm import CausalLMValueModel

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def policy(tiny_lm_dir):
    return CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=16,
                                                         max_response_length=4))


def test_the_body_is_a_trainable_copy_of_the_policys_and_the_head_starts_at_zero(policy):
    model = CausalLMValueModel(policy)
    for (name, own), (_, source) in zip(model.body.named_parameters(), policy.model.get_decoder().named_parameters(),
                                        strict=True):
        assert own.requires_grad and torch.equal(own, source) and own.data_ptr() != source.data_ptr(), name
    assert not model.head.weight.any() and not model.head.bias.any()


def test_given_weights_replace_the_body_in_their_dtype(policy):
    """Weights named as in the policy (the decoder under ``model.model.``), float64 here so that
    the dtype they bring is visible; the policy's other parameters are passed over."""
    weights = [(name, torch.full_like(tensor, 0.5, dtype=torch.float64)) for name, tensor in policy.named_parameters()]
    model = CausalLMValueModel(policy, iter(weights))
    assert {p.dtype for p in model.body.parameters()} == {torch.float64}
    assert all(bool((p == 0.5).all()) and p.requires_grad for p in model.body.parameters())
    assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the policy is untouched


def test_weights_lacking_a_body_parameter_are_refused_by_name(policy):
    weights = [(name, tensor) for name, tensor in policy.named_parameters() if "layers.1." not in name]
    with pytest.raises(ValueError, match=r"lack \d+ of the body's parameters, first model\.model\.layers\.1\."):
        CausalLMValueModel(policy, weights)
