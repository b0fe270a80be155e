"""Configuration of the causal language-model policy (no torch import: configs stay light)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.config_checks import is_int

#: Parameter dtypes the policy loads models in.
DTYPES = ("float32", "bfloat16", "float16")
#: Attention implementations of transformers that run on every device.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
#: How prompts become text: ``"chat"``, the tokenizer's chat template with the generation prompt;
#: ``"raw"``, the messages' contents as they are (base models without a chat template).
PROMPT_FORMATS = ("chat", "raw")
#: Arguments of ``apply_chat_template`` the processor sets itself (not chat-template variables).
RESERVED_CHAT_TEMPLATE_KWARGS = ("conversation", "tokenize", "add_generation_prompt", "continue_final_message",
                                 "return_dict", "tools", "documents", "chat_template")


def check_chat_template_kwargs(kwargs: object, owner: str) -> dict:
    """``kwargs`` as a dict of extra chat-template variables (``{"enable_thinking": False}`` for
    Qwen3), checked.

    Raises:
        ValueError: not a mapping with string keys, or a key the processor sets itself
            (:data:`RESERVED_CHAT_TEMPLATE_KWARGS`); the message names ``owner``.
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        raise ValueError(f"{owner} must be a mapping of chat-template variables such as "
                         f"{{enable_thinking: false}}, got {kwargs!r}")
    reserved = [key for key in kwargs if key in RESERVED_CHAT_TEMPLATE_KWARGS]
    if reserved:
        raise ValueError(f"{owner} sets {', '.join(reserved)}, which the prompt encoding sets itself; give only "
                         "the chat template's own variables (e.g. enable_thinking)")
    return dict(kwargs)


@dataclass
class CausalLMConfig:
    """Settings of :class:`policies.causal_lm.modeling_causal_lm.CausalLMPolicy`.

    Attributes:
        model_path: a local Hugging Face model directory (``config.json``, safetensors weights,
            tokenizer files with a chat template), or a ``.gguf`` file. Never a hub id: nothing
            is downloaded.
        gguf_file: the name of a GGUF file inside the directory ``model_path`` (alternative to a
            ``.gguf`` ``model_path``); its weights are dequantised on load.
        dtype: parameter dtype, one of ``DTYPES``. Log-probabilities are computed in float32
            whatever the parameters' dtype.
        attn_implementation: transformers attention backend, one of ``ATTN_IMPLEMENTATIONS``.
        max_prompt_length: prompt length in tokens (after the chat template) that encoded
            prompts are left-padded to; a longer prompt is an error.
        max_response_length: the most tokens sampled per response; responses are right-padded
            to it.
        temperature: sampling temperature; log-probabilities for the RL loss are computed at the
            same temperature (``log_softmax(logits / temperature)``).
        prompt_format: ``"chat"`` (prompts through the tokenizer's chat template, which must
            exist) or ``"raw"`` (the messages' contents encoded as they are: base models).
        chat_template_kwargs: extra variables of the chat template (``apply_chat_template``'s
            keyword arguments, as TRL's ``chat_template_kwargs`` and verl's
            ``apply_chat_template_kwargs``), e.g. ``{"enable_thinking": False}`` for Qwen3;
            ``prompt_format="chat"`` only.
        allow_pickle: accept ``pytorch_model.bin`` weights (torch's pickle format, which can run
            code when loaded) when the directory has no safetensors.
        allow_partial_load: accept weights whose names or shapes do not match the architecture
            of ``config.json``; the parameters they do not cover keep their initialisation.
            Off: such a checkpoint is an error naming the first few tensors.
    """

    model_path: str
    gguf_file: str | None = None
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    max_prompt_length: int = 256
    max_response_length: int = 128
    temperature: float = 1.0
    prompt_format: str = "chat"
    chat_template_kwargs: dict | None = None
    allow_pickle: bool = False
    allow_partial_load: bool = False

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        if not isinstance(self.model_path, str) or not self.model_path:
            raise ValueError(
                f"CausalLMConfig.model_path must be a local model directory or .gguf file, got {self.model_path!r}"
            )
        if self.gguf_file is not None and self.model_path.endswith(".gguf"):
            raise ValueError(
                "CausalLMConfig: give either a .gguf model_path or a directory with gguf_file, not both"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"CausalLMConfig.dtype {self.dtype!r} is unknown; use one of {', '.join(DTYPES)}")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(
                f"CausalLMConfig.attn_implementation {self.attn_implementation!r} is unknown; use one of "
                f"{', '.join(ATTN_IMPLEMENTATIONS)}"
            )
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(
                f"CausalLMConfig.prompt_format {self.prompt_format!r} is unknown; use one of {', '.join(PROMPT_FORMATS)}"
            )
        self.chat_template_kwargs = check_chat_template_kwargs(self.chat_template_kwargs,
                                                               "CausalLMConfig.chat_template_kwargs")
        if self.chat_template_kwargs and self.prompt_format != "chat":
            raise ValueError("CausalLMConfig.chat_template_kwargs needs prompt_format 'chat' (raw prompts have no "
                             "chat template)")
        for field in ("allow_pickle", "allow_partial_load"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"CausalLMConfig.{field} must be true or false, got {getattr(self, field)!r}")
        for field in ("max_prompt_length", "max_response_length"):
            value = getattr(self, field)
            if not is_int(value) or value < 1:
                raise ValueError(f"CausalLMConfig.{field} must be a positive int, got {value!r}")
        temperature = self.temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(
                f"CausalLMConfig.temperature must be a number > 0, got {self.temperature!r} "
                "(greedy decoding is a generate() argument, not a temperature of 0)"
            )
