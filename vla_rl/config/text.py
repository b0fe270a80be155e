"""The ``text`` section of the run config: the text workflow's causal LM, prompts, rule rewards
and supervised warm start."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from vla_rl.config.base import _Section
from vla_rl_core.components import ComponentConfigError


class TextSection(_Section):
    """The text workflow (``run.workflow: text``): the causal LM, its prompts, the rule rewards
    and the supervised warm start. Prompt files are verl/siiRL-format parquet or JSONL
    (``prompt``, ``data_source``, ``reward_model.ground_truth``); each worker reads only its own
    row groups."""

    model_path: str | None = Field(
        None, description="Local HF model directory or .gguf file; null: a tiny Qwen2 built in the run dir."
    )
    gguf_file: str | None = Field(None, description="GGUF file name inside the directory model_path.")
    prompt_format: Literal["chat", "raw"] = Field(
        "chat", description="'chat': prompts go through the tokenizer's chat template (which must exist); 'raw': "
        "the messages' contents are encoded as they are (base models without a chat template)."
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra variables of the chat template, passed to every "
        "apply_chat_template call (TRL's chat_template_kwargs, verl's apply_chat_template_kwargs), e.g. "
        "{enable_thinking: false} for Qwen3; prompt_format 'chat' only."
    )
    allow_pickle: bool = Field(
        False, description="Accept pytorch_model.bin weights (torch's pickle format, which can run code when "
        "loaded) in model_path when it has no safetensors; off: such a directory is refused."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Parameter dtype.")
    tiny_hidden_size: int = Field(64, ge=8, le=1024, description="Tiny model (model_path null): residual width "
                                  "(at most 1024: a larger model is a model_path's).")
    tiny_num_layers: int = Field(2, ge=1, le=32, description="Tiny model (model_path null): transformer blocks "
                                 "(at most 32).")
    train_file: str | None = Field(
        None, description="Training prompts (.parquet/.jsonl); null: arithmetic problems generated in the run dir."
    )
    test_file: str | None = Field(
        None, description="Held-out prompts for evaluation (verl's data.val_files); null: the generated arithmetic "
        "test split (refused beside a train_file of your own while the run evaluates)."
    )
    num_generated_train: int = Field(4000, ge=1, description="Rows of the generated arithmetic train split.")
    num_generated_test: int = Field(256, ge=1, description="Rows of the generated arithmetic test split.")
    arithmetic_levels: list[Literal["add_small", "add_2x1digit", "add_2digit", "sub_2digit"]] | None = Field(
        None, description="Levels of vla_rl_core.arithmetic.LEVELS the generated splits draw from (null: all "
        "four); e.g. [add_small] (sums up to 20 + 9, 210 problems) for a model that misses the harder ones."
    )
    prompts_per_step: int = Field(16, ge=1, description="Prompts per step over all workers (groups per step).")
    max_prompt_length: int = Field(64, ge=1, description="Prompt tokens after the chat template (left-padded).")
    max_response_length: int = Field(24, ge=1, description="Most tokens sampled per response.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature; the loss scores at the same one.")
    rollout_backend: Literal["hf", "vllm"] = Field(
        "hf", description="What samples the training responses: 'hf', the policy's own KV-cache decoding; "
        "'vllm', a vLLM engine on the worker's device with the trainer's weights loaded after every update "
        "(needs the vllm package, see docs/llm.md). Evaluation always decodes with the policy."
    )
    vllm_memory_fraction: float = Field(
        0.3, gt=0, le=1, description="rollout_backend 'vllm' on a GPU: share of GPU memory vLLM may take "
        "(weights + KV cache; the trainer shares the device)."
    )
    vllm_kv_cache_gib: float = Field(
        1.0, gt=0, description="rollout_backend 'vllm' on CPU: memory of the KV cache in GiB."
    )
    correct_score: float = Field(1.0, description="Reward of a correct final answer.")
    format_score: float = Field(0.0, description="Reward added for a well-formatted final answer.")
    answer_extraction: Literal["strict", "flexible"] = Field(
        "strict",
        description="'strict': only a final answer in the data source's format counts; 'flexible': a "
        "response without a '####' answer is judged by its last number, for the GSM8K-style sources "
        "(the others stay strict; verl's method='flexible' always takes the last number), in training "
        "rewards and evaluation alike.",
    )
    sft_steps: int = Field(0, ge=0, description="Supervised warm-start steps on the train split (0: none).")
    sft_lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the warm start.")
    sft_batch_size: int = Field(32, ge=1, description="Examples per warm-start step.")
    sft_response_column: str = Field(
        "extra_info.answer", min_length=1, description="Column holding the warm start's target responses."
    )

    def unread_settings(self) -> dict[str, str]:
        """``{dotted setting: why}`` of the settings a text run never reads under the others: the
        tiny model's with a ``model_path``, a ``gguf_file`` or ``allow_pickle`` without one, the
        generated splits' with both prompt files given, vLLM's under the ``hf`` backend, and the
        supervised warm start's without its steps (:meth:`vla_rl.config.RunConfig.unread_settings`)."""
        unread = {}
        if self.model_path is not None:
            unread |= dict.fromkeys(("text.tiny_hidden_size", "text.tiny_num_layers"), (
                f"read only to build the tiny model of a run without text.model_path, which is {self.model_path!r}: "
                "drop the override"))
        else:
            unread |= dict.fromkeys(("text.gguf_file", "text.allow_pickle"), (
                "read only with text.model_path, which is null (the run builds a tiny model): set it too, or drop the "
                "override"))
        if self.train_file is not None and self.test_file is not None:
            unread |= dict.fromkeys(("text.num_generated_train", "text.num_generated_test", "text.arithmetic_levels"), (
                "read only to generate the arithmetic splits of a run without text.train_file or text.test_file, and "
                "both are given: drop the override"))
        if self.rollout_backend == "hf":
            unread |= dict.fromkeys(("text.vllm_memory_fraction", "text.vllm_kv_cache_gib"), (
                "read only with text.rollout_backend=vllm, and it is 'hf': set it too, or drop the override"))
        if self.sft_steps == 0:
            unread |= dict.fromkeys(("text.sft_lr", "text.sft_batch_size"), (
                "read only by the supervised warm start of the RL text templates, and text.sft_steps is 0: set "
                "text.sft_steps too on such a template, or drop the override (llm_sft's own fine-tuning takes "
                "trainer.lr and trainer.ppo_mini_batch_size)"))
        return unread

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables_only(cls, value: dict[str, Any]) -> dict[str, Any]:
        from policies.causal_lm.configuration_causal_lm import check_chat_template_kwargs

        return check_chat_template_kwargs(value, "text.chat_template_kwargs")

    @model_validator(mode="after")
    def _generated_rows_exist(self) -> TextSection:
        """The generated splits (a null ``train_file`` or ``test_file``) hold distinct problems of
        ``arithmetic_levels``, of which there are only so many (210 sums up to 20 + 9)."""
        from vla_rl_core.arithmetic import LEVELS

        if self.train_file is not None and self.test_file is not None:
            return self
        levels = [level for level in LEVELS if self.arithmetic_levels is None or level.name in self.arithmetic_levels]
        available = sum(level.pool_size() for level in levels)
        if self.num_generated_train + self.num_generated_test > available:
            field = "num_generated_test" if self.num_generated_test >= available else "num_generated_train"
            raise ComponentConfigError(
                f"text.{field}", f"the generated splits ask for {self.num_generated_train} + {self.num_generated_test} "
                f"distinct problems, and the levels {[level.name for level in levels]} (text.arithmetic_levels) hold "
                f"{available}; ask for fewer rows or add levels")
        return self

    @model_validator(mode="after")
    def _template_variables_need_a_chat_template(self) -> TextSection:
        if self.chat_template_kwargs and self.prompt_format != "chat":
            raise ValueError("text.chat_template_kwargs needs text.prompt_format 'chat' (raw prompts have no chat "
                             "template)")
        return self
