"""The causal LM policy on the tiny Qwen2-style model: padding, sampling, log-probs, SFT loss."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig

from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from policies.causal_lm.modeling_causal_lm import _scaled_log_softmax, decode_step_mask
from policies.causal_lm.processor_causal_lm import CausalLMProcessor

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "Answer after ####."}, {"role": "user", "content": "What is 41 - 17?"}],
    [{"role": "user", "content": "What is 12 * 7?"}],
]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def policy(tiny_lm_dir, request, device):
    """The policy on the test device under both attention implementations (each has its own
    decoding-step mask)."""
    return CausalLMPolicy.from_pretrained(
        CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=40, max_response_length=12,
                       attn_implementation=request.param)
    ).to(device)


@pytest.fixture(scope="module")
def prompts(policy):
    return policy.processor.encode_prompts(PROMPTS, max_length=40)


def test_config_validation():
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        CausalLMConfig(model_path="m", temperature=0)
    with pytest.raises(ValueError, match="dtype 'float64' is unknown"):
        CausalLMConfig(model_path="m", dtype="float64")
    with pytest.raises(ValueError, match="either a .gguf model_path or a directory with gguf_file"):
        CausalLMConfig(model_path="m.gguf", gguf_file="m.gguf")
    with pytest.raises(ValueError, match="max_prompt_length must be a positive int"):
        CausalLMConfig(model_path="m", max_prompt_length=0)


def test_prompts_follow_the_chat_template_left_padded(policy, prompts):
    input_ids, attention_mask = prompts
    assert input_ids.shape == attention_mask.shape == (3, 40) and input_ids.dtype == torch.int64
    tokenizer = policy.tokenizer
    for row, messages in enumerate(PROMPTS):
        valid = input_ids[row][attention_mask[row].bool()]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(valid) == rendered
        assert attention_mask[row, -len(valid) :].all() and not attention_mask[row, : -len(valid)].any()
    assert tokenizer.decode(input_ids[0][attention_mask[0].bool()]).endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match=r"prompt 0 has 16 tokens after the chat template, .* max_prompt_length=8"):
        policy.processor.encode_prompts(PROMPTS, max_length=8)


#: Qwen3's switch (its chat template's ``enable_thinking``), on a ChatML template.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def test_chat_template_kwargs_reach_the_template(policy):
    """TRL's chat_template_kwargs / verl's apply_chat_template_kwargs: {enable_thinking: false}
    makes Qwen3's template close an empty think block in every prompt."""
    tokenizer = copy.deepcopy(policy.tokenizer)
    tokenizer.chat_template = THINKING_TEMPLATE
    plain = CausalLMProcessor(tokenizer)
    no_thinking = CausalLMProcessor(tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert plain.render_prompt(PROMPTS[0]).endswith("<|im_start|>assistant\n")
    rendered = no_thinking.render_prompt(PROMPTS[0])
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    input_ids, attention_mask = no_thinking.encode_prompts(PROMPTS, max_length=60)
    assert tokenizer.decode(input_ids[0][attention_mask[0].bool()]) == rendered


@pytest.mark.parametrize(("fields", "match"), [
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "sets add_generation_prompt, which the prompt"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "must be a mapping of chat-template variables"),
    ({"chat_template_kwargs": {"enable_thinking": False}, "prompt_format": "raw"}, "needs prompt_format 'chat'"),
])
def test_chat_template_kwargs_are_checked(fields, match):
    with pytest.raises(ValueError, match=match):
        CausalLMConfig(model_path="m", **fields)


def test_encode_responses_appends_eos_and_decodes_back(policy):
    processor = policy.processor
    responses, mask = processor.encode_responses(["2 + 3 = 5\n#### 5", ""], max_length=16)
    assert responses.shape == mask.shape == (2, 16) and mask.dtype == torch.bool
    lengths = mask.sum(1)
    assert responses[0, lengths[0] - 1] == responses[1, 0] == processor.eos_token_ids[0]
    assert processor.decode_responses(responses, mask) == ["2 + 3 = 5\n#### 5", ""]
    with pytest.raises(ValueError, match="more than max_response_length=4"):
        processor.encode_responses(["2 + 3 = 5"], max_length=4)


def test_supervised_targets_end_as_the_chat_template_ends_the_assistants_turn(policy):
    """ChatML (the tiny tokenizer): ``<|im_end|>``, its EOS. A Gemma-style template closes turns
    with ``<end_of_turn>``, which the model stops on beside the tokenizer's ``<eos>``: supervised
    targets end with it, as the template renders the assistant's turn (TRL's SFT), not with
    ``<eos>``, which the model would otherwise learn to end its turns with."""
    import copy

    from policies.causal_lm.processor_causal_lm import CausalLMProcessor

    chatml = policy.processor
    assert chatml.tokenizer.convert_ids_to_tokens(chatml.end_of_turn_id) == "<|im_end|>"
    tokenizer = copy.deepcopy(policy.tokenizer)
    tokenizer.add_special_tokens({"eos_token": "<eos>",
                                  "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tokenizer.chat_template = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
                               "m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
                               "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    gemma = CausalLMProcessor(tokenizer, [tokenizer.eos_token_id, end_of_turn])
    responses, mask = gemma.encode_responses(["2 + 3 = 5"], max_length=16)
    assert responses[0, int(mask.sum()) - 1] == end_of_turn == gemma.end_of_turn_id
    # the model does not stop on <end_of_turn> (not an EOS id): the EOS ends targets
    assert CausalLMProcessor(tokenizer).end_of_turn_id == tokenizer.eos_token_id
    assert CausalLMProcessor(tokenizer, prompt_format="raw").end_of_turn_id == tokenizer.eos_token_id


def test_generate_shapes_and_masks(policy, prompts):
    out = policy.generate(*prompts, generator=torch.Generator().manual_seed(0))
    assert out.responses.shape == out.response_mask.shape == out.log_probs.shape == (3, 12)
    assert out.responses.dtype == torch.int64 and out.response_mask.dtype == torch.bool
    assert out.log_probs.dtype == torch.float32 and (out.log_probs[out.response_mask] < 0).all()
    assert (out.log_probs[~out.response_mask] == 0).all()


def test_response_mask_ends_at_the_first_eos(policy, prompts):
    processor = policy.processor
    original = processor.eos_token_ids
    processor.eos_token_ids = tuple(range(0, len(policy.tokenizer), 2))  # every even id ends a response
    try:
        out = policy.generate(*prompts, max_new_tokens=30, generator=torch.Generator().manual_seed(1))
    finally:
        processor.eos_token_ids = original
    for tokens, mask in zip(out.responses, out.response_mask):
        length = int(mask.sum())
        assert mask[:length].all() and not mask[length:].any()  # right-padded
        assert tokens[length - 1] % 2 == 0 and (tokens[: length - 1] % 2 == 1).all()  # EOS included, once
        assert (tokens[length:] == processor.pad_token_id).all()
    assert (out.response_mask.sum(1) < 30).all()


def test_recomputed_log_probs_equal_sampled_ones(policy, prompts):
    """On-policy, the PPO ratio exp(log_prob - old_log_prob) is 1."""
    for temperature in (1.0, 0.7):
        out = policy.generate(*prompts, temperature=temperature, generator=torch.Generator().manual_seed(2))
        log_probs, entropy = policy.log_probs_and_entropy(*prompts, out.responses, out.response_mask, temperature)
        torch.testing.assert_close(log_probs, out.log_probs, rtol=0, atol=1e-5)
        ratio = torch.exp(log_probs - out.log_probs)[out.response_mask]
        torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-5)
        assert log_probs.requires_grad and entropy.shape == (3, 12)
        assert (entropy[out.response_mask] > 0).all() and (entropy[~out.response_mask] == 0).all()
        vocab = torch.tensor(float(len(policy.tokenizer)))
        assert (entropy <= vocab.log() + 1e-4).all()
        torch.testing.assert_close(policy.log_probs(*prompts, out.responses, out.response_mask, temperature), log_probs)


def test_sampled_tensors_enter_a_training_graph(policy, prompts):
    """Decoding runs in inference mode; what it returns must still serve a loss's backward pass
    (the gather of the response ids saves them for backward)."""
    out = policy.generate(*prompts, generator=torch.Generator().manual_seed(3))
    assert not any(t.is_inference() for t in (out.responses, out.response_mask, out.log_probs))
    log_probs, _ = policy.log_probs_and_entropy(*prompts, out.responses, out.response_mask)
    ((log_probs - out.log_probs) * out.response_mask).sum().backward()
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    policy.model.zero_grad(set_to_none=True)


def _saved_bytes(call):
    """Bytes of the distinct storages autograd saves for the backward pass while ``call()`` runs."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = call()
    return sum(storages.values()), result


def test_the_entropy_keeps_nothing_more_for_the_backward_pass_and_has_its_gradient(policy, prompts):
    """The entropy's probabilities (batch x response x vocabulary float32) are recomputed in the
    backward pass, not kept (before 2026-12-03 they were, even for a loss without an entropy
    term); its gradient is the plain formula's."""
    out = policy.generate(*prompts, generator=torch.Generator().manual_seed(4))
    args = (*prompts, out.responses, out.response_mask)
    both, (_, entropy) = _saved_bytes(lambda: policy.log_probs_and_entropy(*args))
    alone, _ = _saved_bytes(lambda: policy.log_probs(*args))
    vocab_tensor = out.responses.numel() * policy.model.config.vocab_size * 4
    assert both - alone < vocab_tensor // 8, (both, alone, vocab_tensor)
    entropy.sum().backward()
    checkpointed = [p.grad.clone() for p in policy.model.parameters()]
    policy.model.zero_grad(set_to_none=True)
    log_softmax = _scaled_log_softmax(policy._response_logits(*args, policy.config.temperature)[0],
                                      policy.config.temperature)
    policy._pad_to(-(log_softmax.exp() * log_softmax).sum(-1), out.response_mask).sum().backward()
    for mine, plain in zip(checkpointed, [p.grad for p in policy.model.parameters()]):
        torch.testing.assert_close(mine, plain, rtol=1e-4, atol=1e-6)
    policy.model.zero_grad(set_to_none=True)


def test_no_grad_log_probs_take_the_log_softmax_one_row_at_a_time(policy, prompts):
    """Without gradients (the reference's and the old policy's scoring) no log-softmax covers more
    than one row's ``(response_len, vocab)``; with them, the batch's. The values are the batched
    pass's, bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestLogSoftmax(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._log_softmax.default:
                self.numel = max(self.numel, out.numel())
            return out

    out = policy.generate(*prompts, generator=torch.Generator().manual_seed(4))
    args = (*prompts, out.responses, out.response_mask)
    kept = int(out.response_mask.any(0).nonzero().max()) + 1
    vocab = policy.model.config.vocab_size
    with torch.no_grad(), LargestLogSoftmax() as rows:
        scored = policy.log_probs(*args)
    with LargestLogSoftmax() as batched:
        trained = policy.log_probs(*args)
    assert rows.numel == kept * vocab and batched.numel == len(out.responses) * kept * vocab > rows.numel
    assert torch.equal(scored, trained.detach())


def test_shared_prompts_give_the_log_probs_and_gradients_of_separate_passes(policy, prompts):
    """Groups of 3 responses per prompt: the shared-prompt passes (each prompt encoded once, in
    decoding and in scoring) agree with scoring every row alone (no repeat: one plain pass),
    values and parameter gradients."""
    input_ids, attention_mask = (t.repeat_interleave(3, dim=0) for t in prompts)
    out = policy.generate(input_ids, attention_mask, generator=torch.Generator().manual_seed(4))
    shared, _ = policy.log_probs_and_entropy(input_ids, attention_mask, out.responses, out.response_mask)
    alone = torch.cat([policy.log_probs_and_entropy(input_ids[i : i + 1], attention_mask[i : i + 1],
                                                    out.responses[i : i + 1], out.response_mask[i : i + 1])[0]
                       for i in range(len(input_ids))])
    torch.testing.assert_close(shared, alone, rtol=0, atol=1e-5)
    torch.testing.assert_close(shared, out.log_probs, rtol=0, atol=1e-5)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    shared_grads = torch.autograd.grad(shared.sum(), params)
    alone_grads = torch.autograd.grad(alone.sum(), params)
    for got, want in zip(shared_grads, alone_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_greedy_matches_transformers_generate(policy, prompts):
    ours = policy.generate(*prompts, greedy=True)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=12,
        eos_token_id=list(policy.processor.eos_token_ids),
        pad_token_id=policy.processor.pad_token_id,
    )
    input_ids, attention_mask = prompts
    reference = policy.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    reference = reference[:, input_ids.shape[1] :]
    width = reference.shape[1]
    assert torch.equal(ours.responses[:, :width].cpu(), reference.cpu())


def test_padding_does_not_change_a_prompt_results(policy, prompts):
    input_ids, attention_mask = prompts
    batch = policy.generate(input_ids, attention_mask, greedy=True)
    alone_ids, alone_mask = policy.processor.encode_prompts(PROMPTS[:1], max_length=40)
    alone = policy.generate(alone_ids, alone_mask, greedy=True)
    assert torch.equal(alone.responses[0], batch.responses[0])
    torch.testing.assert_close(alone.log_probs[0], batch.log_probs[0], rtol=0, atol=1e-5)


def test_generator_makes_sampling_reproducible(policy, prompts):
    first = policy.generate(*prompts, generator=torch.Generator().manual_seed(5))
    second = policy.generate(*prompts, generator=torch.Generator().manual_seed(5))
    assert torch.equal(first.responses, second.responses)


def test_sft_loss_scores_response_tokens_only(policy, prompts):
    responses, mask = policy.processor.encode_responses(["5", "24", "84"], max_length=12)
    loss = policy.sft_loss(*prompts, responses, mask)
    assert loss.ndim == 0 and loss.requires_grad
    log_probs = policy.log_probs(*prompts, responses, mask, temperature=1.0)
    torch.testing.assert_close(loss, -log_probs[mask].mean())
    loss.backward()
    assert policy.model.model.embed_tokens.weight.grad is not None
    policy.model.zero_grad(set_to_none=True)


def test_bad_padding_is_rejected(policy, prompts):
    input_ids, attention_mask = prompts
    with pytest.raises(ValueError, match="left-padded"):
        policy.generate(input_ids, attention_mask.flip(1))
    responses, mask = policy.processor.encode_responses(["5", "24", "84"], max_length=12)
    with pytest.raises(ValueError, match="right-padded"):
        policy.log_probs_and_entropy(input_ids, attention_mask, responses, mask.flip(1))
    with pytest.raises(ValueError, match=r"responses and response_mask must both be \(3, response_len\)"):
        policy.log_probs_and_entropy(input_ids, attention_mask, responses[:2], mask[:2])


def test_decode_step_mask_layouts():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    sdpa = decode_step_mask(mask, "sdpa", torch.float32)
    assert sdpa.shape == (2, 1, 1, 3) and sdpa.dtype == torch.bool
    assert sdpa[:, 0, 0].tolist() == [[False, True, True], [True, True, True]]
    eager = decode_step_mask(mask, "eager", torch.bfloat16)
    assert eager.dtype == torch.bfloat16
    assert eager[0, 0, 0].tolist() == [torch.finfo(torch.bfloat16).min, 0.0, 0.0] and (eager[1] == 0).all()
    with pytest.raises(ValueError, match="flash_attention_2"):
        decode_step_mask(mask, "flash_attention_2", torch.float32)


@pytest.mark.parametrize("window", [8, 30])
def test_sliding_window_models_decode_as_their_plain_forward_scores(tiny_lm_dir, window):
    """A sliding-window layer's cache keeps only the window's keys: the one-token decoding mask,
    as wide as the sequence, failed once prompt and response passed the window ("The size of
    tensor a (8) must match the size of tensor b (40)"), at 30 in the middle of the responses.
    Each response's sampled log-probs are those of the model's plain forward on the unpadded
    sequence."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_lm_dir)
    config = AutoConfig.from_pretrained(tiny_lm_dir)
    config.use_sliding_window, config.sliding_window = True, window
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers  # Qwen2's with max_window_layers=0
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_dir, config=config).eval()
    policy = CausalLMPolicy(model, tokenizer, CausalLMConfig(model_path=str(tiny_lm_dir), max_prompt_length=40,
                                                             max_response_length=12))
    ids, mask = policy.processor.encode_prompts(PROMPTS, max_length=40)
    out = policy.generate(ids, mask, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for row in range(len(PROMPTS)):
            prompt, length = ids[row][mask[row].bool()], int(out.response_mask[row].sum())
            sequence = torch.cat([prompt, out.responses[row, :length]])[None]
            logits = model(sequence).logits[0, len(prompt) - 1:len(prompt) - 1 + length].float()
            expected = logits.log_softmax(-1).gather(-1, out.responses[row, :length, None]).squeeze(-1)
            torch.testing.assert_close(out.log_probs[row, :length], expected, rtol=0, atol=1e-5)
    assert int(mask.sum(1).max()) + int(out.response_mask.sum(1).max()) > window  # the window was passed
