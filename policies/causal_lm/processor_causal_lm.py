"""Text ↔ token tensors for the causal LM policy: chat templates, padding and masks.

Layout of a text batch (one row per sample, as verl lays it out):

- prompts are **left**-padded: ``input_ids`` ``(batch, prompt_len)`` with ``attention_mask`` 1 on
  the prompt's tokens, which end at the last column, where generation continues;
- responses are **right**-padded: ``responses`` ``(batch, response_len)`` with
  ``response_mask`` True on the response's tokens, up to and including its EOS token.

So ``cat([input_ids, responses], 1)`` with ``cat([attention_mask, response_mask], 1)`` is the full
sequence of every sample, and response token ``t`` is predicted by the logits at column
``prompt_len - 1 + t``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from policies.causal_lm.configuration_causal_lm import PROMPT_FORMATS, check_chat_template_kwargs

Messages = Sequence[Mapping[str, str]]


class CausalLMProcessor:
    """Encodes chat prompts and responses and decodes responses with a model's tokenizer.

    Args:
        tokenizer: the model's tokenizer; it must have an EOS token, and a chat template when
            ``prompt_format`` is ``"chat"``.
        eos_token_ids: the token ids that end a response (default: the tokenizer's EOS). Chat
            models often stop on several (e.g. ``<|im_end|>`` and ``<|endoftext|>``).
        prompt_format: one of :data:`PROMPT_FORMATS`. ``"raw"`` encodes the prompt text as is:
            the messages' contents joined by newlines (usually one user message), no chat
            template, with the special tokens the tokenizer adds (a BOS for Llama, Mistral and
            Gemma tokenizers), as TRL's GRPO trainer encodes non-conversational prompts
            (``processing_class(text=prompts)``).
        chat_template_kwargs: extra variables passed to every ``apply_chat_template`` call
            (``{"enable_thinking": False}`` for Qwen3), as TRL's ``chat_template_kwargs``.

    Raises:
        ValueError: an unknown ``prompt_format``, chat prompts with a tokenizer without a chat
            template, no EOS token and no ``eos_token_ids`` given, or ``chat_template_kwargs``
            not a mapping of the template's own variables.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Iterable[int] = (),
                 prompt_format: str = "chat", chat_template_kwargs: Mapping[str, object] | None = None) -> None:
        self.chat_template_kwargs = check_chat_template_kwargs(
            dict(chat_template_kwargs) if isinstance(chat_template_kwargs, Mapping) else chat_template_kwargs,
            "chat_template_kwargs")
        if prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"unknown prompt_format {prompt_format!r}; use one of {', '.join(PROMPT_FORMATS)}")
        if prompt_format == "chat" and tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat template and prompts are chat messages; "
                             "use prompt_format='raw' to encode the prompt text as is")
        ids = [*([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []), *eos_token_ids]
        if not ids:
            raise ValueError("the tokenizer has no EOS token; pass eos_token_ids")
        self.tokenizer = tokenizer
        self.prompt_format = prompt_format
        #: Token ids that end a response, the tokenizer's EOS first.
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in ids))
        #: Id written in padded positions (never attended to, never scored).
        self.pad_token_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        #: Id that ends a supervised target (:meth:`encode_responses`): the token the chat template
        #: closes an assistant turn with when it is one of ``eos_token_ids`` (Gemma's
        #: ``<end_of_turn>``, ChatML's ``<|im_end|>``), else the first of ``eos_token_ids``.
        self.end_of_turn_id: int = self._end_of_turn_id()

    def _end_of_turn_id(self) -> int:
        """The first token the chat template writes after an assistant message's content, if it
        ends a response; else ``eos_token_ids[0]`` (raw prompts, templates without assistant
        turns). TRL's SFT trains on the template's rendering of the assistant turn, which ends so."""
        if self.prompt_format != "chat":
            return self.eos_token_ids[0]
        from jinja2 import TemplateError  # transformers renders chat templates with jinja2

        probe = "vla-rl-end-of-turn-probe"
        try:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": "?"},
                                                       {"role": "assistant", "content": probe}], tokenize=False,
                                                      **self.chat_template_kwargs)
        except TemplateError:
            return self.eos_token_ids[0]
        after = text.split(probe, 1)[1] if probe in text else ""
        ids = self.tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
        return ids[0] if ids and ids[0] in self.eos_token_ids else self.eos_token_ids[0]

    def render_prompt(self, messages: Messages) -> str:
        """The prompt text: the chat template applied with the generation prompt appended, or
        (``prompt_format="raw"``) the messages' contents joined by newlines."""
        if self.prompt_format == "raw":
            return "\n".join(message["content"] for message in messages)
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                                  **self.chat_template_kwargs)

    def prompt_token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of rendered prompts (:meth:`render_prompt`): a chat template's text already
        holds the special tokens it needs, so none are added; raw text gets the tokenizer's own
        (its BOS, if it adds one)."""
        return self.tokenizer(list(texts), add_special_tokens=self.prompt_format == "raw")["input_ids"] if texts else []

    def encode_prompts(self, prompts: Sequence[Messages], max_length: int) -> tuple[Tensor, Tensor]:
        """Apply the chat template (or take the raw text) and tokenize (:meth:`prompt_token_ids`),
        left-padding to ``max_length``.

        Args:
            prompts: ``batch`` conversations, each a list of ``{"role", "content"}`` messages.
            max_length: the padded length (a fixed width lets batches from several workers be
                concatenated); the policy skips the all-padding columns when it runs.

        Returns:
            ``input_ids`` ``(batch, max_length)`` int64 and ``attention_mask``
            ``(batch, max_length)`` int64 (1 on prompt tokens).

        Raises:
            ValueError: a prompt is longer than ``max_length`` tokens (the message gives its
                index and length).
        """
        input_ids = torch.full((len(prompts), max_length), self.pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros((len(prompts), max_length), dtype=torch.int64)
        texts = [self.render_prompt(messages) for messages in prompts]
        for row, ids in enumerate(self.prompt_token_ids(texts)):
            if len(ids) > max_length:
                raise ValueError(
                    f"prompt {row} has {len(ids)} tokens after the chat template, more than max_prompt_length="
                    f"{max_length}; raise max_prompt_length or filter long prompts out of the dataset"
                )
            if ids:
                input_ids[row, -len(ids) :] = torch.tensor(ids, dtype=torch.int64)
                attention_mask[row, -len(ids) :] = 1
        return input_ids, attention_mask

    def encode_responses(self, texts: Sequence[str], max_length: int) -> tuple[Tensor, Tensor]:
        """Tokenize target responses and end each with :attr:`end_of_turn_id` (the token the chat
        template closes the assistant's turn with, when it ends a response; else the EOS),
        right-padding to ``max_length``.

        Used for supervised targets: the result has the layout of sampled responses.

        Args:
            texts: ``batch`` response texts (without any end-of-turn token).
            max_length: the padded length.

        Returns:
            ``responses`` ``(batch, max_length)`` int64 and ``response_mask``
            ``(batch, max_length)`` bool (True on the response's tokens and its EOS).

        Raises:
            ValueError: a response with its EOS is longer than ``max_length`` tokens.
        """
        responses = torch.full((len(texts), max_length), self.pad_token_id, dtype=torch.int64)
        response_mask = torch.zeros((len(texts), max_length), dtype=torch.bool)
        encoded = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
        for row, text_ids in enumerate(encoded):
            ids = [*text_ids, self.end_of_turn_id]
            if len(ids) > max_length:
                raise ValueError(
                    f"response {row} has {len(ids)} tokens with its EOS, more than max_response_length={max_length}"
                )
            responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
            response_mask[row, : len(ids)] = True
        return responses, response_mask

    def decode_responses(self, responses: Tensor, response_mask: Tensor) -> list[str]:
        """The texts of right-padded responses, special tokens (EOS included) left out.

        Args:
            responses: ``(batch, response_len)`` int64 token ids.
            response_mask: ``(batch, response_len)`` bool, True on valid tokens.
        """
        return [
            self.tokenizer.decode(ids[mask].tolist(), skip_special_tokens=True)
            for ids, mask in zip(responses, response_mask.bool())
        ]
