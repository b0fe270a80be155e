"""A tiny Qwen2-style causal LM with a byte-level BPE tokenizer trained in-process: the model of
the tests and CI (no hub, no downloads).

The tokenizer is a real ``Qwen2Tokenizer`` (Qwen2's NFC normaliser, its pre-tokenizer that
splits digits one by one, byte-level BPE), retrained on the project's arithmetic corpus with
``train_new_from_iterator``, with ChatML special tokens and a ChatML chat template. Saved next to
the model it reloads with ``AutoTokenizer`` to the same class and the same token ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

from policies.causal_lm.loading import save_pretrained
from vla_rl_core.arithmetic import sample_problems

PAD_TOKEN = "<|endoftext|>"
BOS_OF_TURN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
#: ChatML, as Qwen2 formats chats, without a default system prompt (prompts stay short).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyQwen2Spec:
    """Size of the tiny model (defaults: about 0.1 M parameters, 2 layers of width 64).

    The defaults learn two-digit addition from the arithmetic dataset by supervised
    fine-tuning in a few thousand steps of 32 examples (about 0.04 s each on one CPU thread).

    Attributes:
        hidden_size, intermediate_size: widths of the residual stream and of the MLP.
        num_hidden_layers: transformer blocks.
        num_attention_heads, num_key_value_heads: query heads and (grouped) key/value heads.
        max_position_embeddings: longest sequence (prompt + response) in tokens.
        vocab_size: BPE vocabulary target (the trained vocabulary may be smaller).
    """

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    vocab_size: int = 512


def arithmetic_corpus(num_problems: int = 4000, seed: int = 0) -> list[str]:
    """Texts to train the tokenizer on: arithmetic questions and solutions, and the chat roles."""
    texts = ["system", "user", "assistant"]
    for problem in sample_problems(num_problems, seed):
        texts += [problem.question, problem.solution]
    return texts


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512) -> Qwen2Tokenizer:
    """Train a Qwen2-style byte-level BPE tokenizer on ``texts``.

    Args:
        texts: the training corpus.
        vocab_size: target vocabulary size, special tokens and the 256 byte symbols included.

    Returns:
        A ``Qwen2Tokenizer`` with ``<|im_end|>`` as EOS, ``<|endoftext|>`` as padding,
        ``<|im_start|>`` as a special token and :data:`CHAT_TEMPLATE`; every byte sequence
        encodes (no unknown token).
    """
    base = Qwen2Tokenizer(eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, additional_special_tokens=[BOS_OF_TURN])
    tokenizer = base.train_new_from_iterator(texts, vocab_size=vocab_size, show_progress=False)  # no blank lines on stdout
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_qwen2(
    tokenizer: Qwen2Tokenizer, spec: TinyQwen2Spec = TinyQwen2Spec(), seed: int = 0
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM sized by ``spec`` for ``tokenizer``.

    Input and output embeddings are tied; EOS and padding ids come from the tokenizer, so that
    ``generation_config`` stops on ``<|im_end|>``.

    Args:
        tokenizer: from :func:`train_tokenizer`.
        spec: the model size.
        seed: seed of the initialisation (the global torch RNG is left untouched).
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).eval()


def write_tiny_checkpoint(
    out_dir: str | Path,
    spec: TinyQwen2Spec = TinyQwen2Spec(),
    seed: int = 0,
    corpus: Iterable[str] | None = None,
) -> Path:
    """Train the tokenizer, build the model and save both as a Hugging Face directory.

    Args:
        out_dir: the checkpoint directory (created).
        spec: the model size.
        seed: seed of the model initialisation.
        corpus: tokenizer training texts (default: :func:`arithmetic_corpus`).

    Returns:
        ``out_dir``, loadable with :func:`policies.causal_lm.loading.load_pretrained`.
    """
    tokenizer = train_tokenizer(arithmetic_corpus() if corpus is None else corpus, spec.vocab_size)
    return save_pretrained(build_tiny_qwen2(tokenizer, spec, seed), tokenizer, out_dir)
