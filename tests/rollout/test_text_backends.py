"""The backend-independent parts of the text rollout: list ↔ tensor layout, the backend factory,
and the rollout node's log-prob recomputation for samplers whose log-probs are not the trainer's."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from policies.causal_lm.modeling_causal_lm import Generation
from vla_rl.config import TrainerSection
from vla_rl.nodes.text import sample_groups, truncated_responses
from vla_rl.rollout.text_backends import PolicyTextRollout, make_text_rollout
from vla_rl.rollout.token_lists import generation_from_token_lists, unpad_prompts
from vla_rl_core import keys

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 41 - 17?"}]]


@pytest.fixture(scope="module")
def policy(tiny_lm_dir):
    return CausalLMPolicy.from_pretrained(
        CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=24, max_response_length=8)
    )


@pytest.fixture(scope="module")
def prompts(policy):
    input_ids, attention_mask = policy.processor.encode_prompts(PROMPTS, max_length=24)
    return input_ids, attention_mask.long()


def test_generation_from_token_lists_right_pads():
    generation = generation_from_token_lists([[5, 6, 7], [], [9]], [[-0.5, -1.0, -2.0], [], [-0.25]],
                                             max_new_tokens=4, pad_token_id=0)
    assert generation.responses.tolist() == [[5, 6, 7, 0], [0, 0, 0, 0], [9, 0, 0, 0]]
    assert generation.response_mask.tolist() == [[True, True, True, False], [False] * 4, [True, False, False, False]]
    assert generation.log_probs.tolist() == [[-0.5, -1.0, -2.0, 0.0], [0.0] * 4, [-0.25, 0.0, 0.0, 0.0]]
    assert generation.responses.dtype == torch.int64 and generation.log_probs.dtype == torch.float32


@pytest.mark.parametrize(
    ("token_ids", "log_probs", "message"),
    [
        ([[1, 2]], [[-1.0, -1.0], [-1.0]], "2 log-prob lists"),
        ([[1, 2]], [[-1.0]], "response 0: 2 tokens but 1 log-probs"),
        ([[1, 2, 3, 4, 5]], [[-1.0] * 5], "more than max_new_tokens=4"),
    ],
)
def test_generation_from_token_lists_rejects_bad_lists(token_ids, log_probs, message):
    with pytest.raises(ValueError, match=message):
        generation_from_token_lists(token_ids, log_probs, max_new_tokens=4, pad_token_id=0)


def test_unpad_prompts_drops_left_padding():
    input_ids = torch.tensor([[0, 0, 3, 4], [5, 6, 7, 8]])
    attention_mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert unpad_prompts(input_ids, attention_mask) == [[3, 4], [5, 6, 7, 8]]
    with pytest.raises(ValueError, match=r"prompts \[0\] have no token"):
        unpad_prompts(input_ids, torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))


def test_hf_backend_samples_groups_like_the_policy(policy, prompts):
    rollout = make_text_rollout("hf", policy, None, seed=0, work_dir=None, optimizer=None)
    assert isinstance(rollout, PolicyTextRollout) and rollout.exact_log_probs
    generation = rollout.sample(*prompts, group_size=3, generator=torch.Generator().manual_seed(1))
    input_ids, attention_mask = (tensor.repeat_interleave(3, dim=0) for tensor in prompts)
    expected = policy.generate(input_ids, attention_mask, generator=torch.Generator().manual_seed(1))
    assert generation.responses.shape == (6, 8)
    assert torch.equal(generation.responses, expected.responses)
    assert torch.equal(generation.log_probs, expected.log_probs)


def test_unknown_backend_is_rejected(policy):
    with pytest.raises(ValueError, match="text.rollout_backend must be 'hf' or 'vllm'"):
        make_text_rollout("sglang", policy, None, seed=0, work_dir=None, optimizer=None)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_backend_without_vllm_names_the_setting(policy, tmp_path):
    with pytest.raises(ModuleNotFoundError, match="text.rollout_backend is 'vllm'"):
        make_text_rollout("vllm", policy, None, seed=0, work_dir=tmp_path, optimizer=None)


class _OffsetRollout:
    """A sampler whose log-probs are the policy's plus a known offset (as an engine's may differ)."""

    exact_log_probs = False

    def __init__(self, policy, offset: float) -> None:
        self.policy, self.offset = policy, offset

    def sample(self, input_ids, attention_mask, group_size, generator):
        generation = PolicyTextRollout(self.policy).sample(input_ids, attention_mask, group_size, generator)
        shifted = (generation.log_probs + self.offset).masked_fill(~generation.response_mask, 0.0)
        return Generation(generation.responses, generation.response_mask, shifted)


def test_inexact_sampler_log_probs_are_recomputed_by_the_trainer(policy, prompts):
    input_ids, attention_mask = prompts
    prompt_batch = TensorDict({keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention_mask,
                               keys.UID: torch.arange(2)}, batch_size=[2])
    resources = SimpleNamespace(text_rollout=_OffsetRollout(policy, 0.25), policy=policy,
                                generator=torch.Generator().manual_seed(0), device=policy.device,
                                config=SimpleNamespace(trainer=TrainerSection(micro_batch_size=3)))  # 3 + 1 rows
    samples, metrics = sample_groups(resources, 2, prompt_batch)
    mask = samples[keys.RESPONSE_MASK]
    trainer = policy.log_probs(samples[keys.INPUT_IDS], samples[keys.ATTENTION_MASK], samples[keys.RESPONSES], mask)
    torch.testing.assert_close(samples[keys.OLD_LOG_PROBS][..., 0], trainer)
    assert metrics["rollout/log_prob_max_diff"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["rollout/log_prob_mean_diff"] == pytest.approx(0.25, abs=1e-5)
    assert samples[keys.UID].tolist() == [0, 0, 1, 1]


class _RecordingEngine:
    """Stands in for ``vllm.LLM``: records whether CPU autocast is on when the engine is asked to
    reload its weights (consuming them) and to generate, and answers with fixed completions."""

    def __init__(self, resets: bool = True) -> None:
        self.autocast_on: dict[str, bool] = {}
        self.calls: list[str] = []
        self.resets = resets

    def collective_rpc(self, method, kwargs):
        self.autocast_on[method] = torch.is_autocast_enabled("cpu")
        self.calls.append(method)
        list(kwargs["weights_iterator"])

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")
        return self.resets

    def generate(self, requests, params, use_tqdm):
        self.autocast_on["generate"] = torch.is_autocast_enabled("cpu")
        completion = SimpleNamespace(token_ids=[5, 6], logprobs=[{5: SimpleNamespace(logprob=-0.5)},
                                                                 {6: SimpleNamespace(logprob=-1.0)}])
        return [SimpleNamespace(outputs=[completion] * param["n"]) for param in params]


def test_the_vllm_engine_computes_outside_the_trainers_autocast(policy, prompts, monkeypatch):
    """Under DDP's mixed precision the rollout node samples inside ``torch.autocast(bfloat16)``; vLLM's
    in-process engine must neither generate nor reload its weights in it (its own ``text.dtype``).
    Shown in the CPU bf16 emulation (the CPU admitted as an accelerator), with a stand-in engine."""
    from vla_rl.rollout.vllm_backend import VLLMTextRollout
    from vla_rl.trainers import strategy

    monkeypatch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, "cpu"))
    rollout = VLLMTextRollout.__new__(VLLMTextRollout)  # no vllm here: the engine is the stand-in
    rollout.policy, rollout.llm, rollout.stale = policy, _RecordingEngine(), True
    rollout.temperature, rollout.max_response_length = 1.0, 8
    rollout._sampling_params, rollout._tokens_prompt = dict, dict
    input_ids, attention_mask = prompts
    prompt_batch = TensorDict({keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention_mask,
                               keys.UID: torch.arange(2)}, batch_size=[2])
    resources = SimpleNamespace(text_rollout=rollout, policy=policy, generator=torch.Generator().manual_seed(0),
                                device=policy.device, config=SimpleNamespace(trainer=TrainerSection()))
    with strategy.autocast(resources.config.trainer, policy.device):
        assert torch.is_autocast_enabled("cpu")  # the emulation puts the node's sampling in bfloat16 autocast
    samples, _ = sample_groups(resources, 3, prompt_batch)
    assert rollout.llm.autocast_on == {"reload_weights": False, "generate": False}
    assert samples[keys.RESPONSES].shape == (6, 8) and not rollout.stale


def test_a_weight_sync_empties_the_engines_prefix_cache(policy):
    """vLLM's prefix cache (on by default) keeps prompt blocks computed with the weights of their
    time: on a GPU (16-token blocks) the chat template's shared preamble stayed at the first
    step's weights. Not seen on vLLM's CPU backend, whose 128-token blocks the tests' prompts
    never fill. A stand-in engine."""
    from vla_rl.rollout.vllm_backend import VLLMTextRollout

    rollout = VLLMTextRollout.__new__(VLLMTextRollout)
    rollout.policy, rollout.llm, rollout.stale = policy, _RecordingEngine(), True
    rollout.sync_weights()
    assert rollout.llm.calls == ["reload_weights", "reset_prefix_cache"] and not rollout.stale
    rollout.llm, rollout.stale = _RecordingEngine(resets=False), True
    with pytest.raises(RuntimeError, match="did not reset its prefix cache"):
        rollout.sync_weights()
    assert rollout.stale


class _FixedRollout:
    """A sampler that answers with fixed responses."""

    exact_log_probs = True

    def __init__(self, responses: torch.Tensor, lengths: list[int]) -> None:
        mask = torch.arange(responses.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        self.generation = Generation(responses, mask, torch.where(mask, -0.5, 0.0))

    def sample(self, input_ids, attention_mask, group_size, generator):
        return self.generation


def test_responses_without_an_end_of_sequence_token_are_marked_truncated(policy, prompts):
    """``truncated``: the last token is no EOS (TRL's ``is_truncated``), also at the length limit."""
    eos, pad = policy.processor.eos_token_ids[0], 0
    responses = torch.tensor([[7, 8, eos, pad], [7, 8, 9, 10], [7, 8, 9, eos], [eos, pad, pad, pad]])
    input_ids, attention_mask = prompts
    prompt_batch = TensorDict({keys.INPUT_IDS: input_ids, keys.ATTENTION_MASK: attention_mask,
                               keys.UID: torch.arange(2)}, batch_size=[2])
    resources = SimpleNamespace(text_rollout=_FixedRollout(responses, [3, 4, 4, 1]), policy=policy,
                                generator=torch.Generator().manual_seed(0), device=policy.device,
                                config=SimpleNamespace(trainer=TrainerSection()))
    samples, _ = sample_groups(resources, 2, prompt_batch)
    assert samples[keys.TRUNCATED].tolist() == [False, True, False, False]
    assert samples[keys.FINISH_STEP].tolist() == [3, 4, 4, 1]
    # without end-of-sequence tokens every response that has a token is cut
    assert truncated_responses(responses, torch.tensor([3, 4, 4, 0]), []).tolist() == [True, True, True, False]
