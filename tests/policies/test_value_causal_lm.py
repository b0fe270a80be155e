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


def test_a_bfloat16_body_is_read_by_the_float32_head_without_autocast(tiny_lm_dir):
    """``text.dtype: bfloat16`` scored outside autocast (``trainer.mixed_precision: none``, CPU
    workers): the body's bfloat16 states reach the float32 head, whose float32 values equal the
    head applied to those states in float32."""
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir), dtype="bfloat16",
                                                           max_prompt_length=16, max_response_length=4))
    model = CausalLMValueModel(policy)
    with torch.no_grad():
        model.head.weight.normal_(generator=torch.Generator().manual_seed(0))
    assert (next(model.body.parameters()).dtype, model.head.weight.dtype) == (torch.bfloat16, torch.float32)
    ids, mask = policy.processor.encode_prompts([[{"role": "user", "content": "1+1?"}]], 16)
    responses, response_mask = policy.processor.encode_responses(["2"], 4)
    with torch.no_grad():
        values = model(ids, mask, responses, response_mask)
        prompt = ids[:, mask[0].bool()]  # one row: its prompt without the left padding
        full = torch.cat([prompt, responses], dim=1)
        hidden = model.body(input_ids=full, use_cache=False).last_hidden_state
    assert values.dtype == torch.float32 and values.shape == responses.shape
    states = hidden[:, prompt.shape[1] - 1 : prompt.shape[1] - 1 + responses.shape[1]].float()
    expected = (states @ model.head.weight.T + model.head.bias).squeeze(-1).masked_fill(~response_mask.bool(), 0.0)
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)
