"""The text workflow: a causal language model on prompts (``run.workflow: text``).

Resources: ``text_assets`` (the model and prompt files; with none configured, rank 0 generates a
tiny model and arithmetic prompts in the run directory when the run prepares), ``prompt_loaders``
(each DP shard's :class:`~vla_rl.data.prompt_dataset.ShardedPromptLoader`, reading only its row
groups) and ``text_rollout`` (the sampler of ``text.rollout_backend``). A response token is a
decision step whose action chunk and dimension are 1, so the advantage, filter, reference and
update nodes are the embodied ones.
"""

from __future__ import annotations

from pathlib import Path

from vla_rl.dag.registry import WORKFLOWS
from vla_rl.data.key_sizes import StepShape
from vla_rl.trainers.actor import text_forward
from vla_rl.utils.collectives import cpu_barrier
from vla_rl.workers.resources import register_resource
from vla_rl.workflows.base import Workflow
from vla_rl_core import keys

#: Directory of a text run's checkpoint holding the policy as a Hugging Face model.
HF_MODEL_DIR = "hf_model"


class TextWorkflow(Workflow):
    """Causal language models on prompts (see the module docstring)."""

    name = "text"
    policy_keys = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.RESPONSES)
    policy_needs = ("text_assets",)

    def prepare(self, res) -> None:
        """Rank 0 generates the tiny model and arithmetic prompts the run needs (if any)."""
        from vla_rl.workflows.text_assets import ensure_text_assets

        if res.rank == 0:
            ensure_text_assets(res.config, res.run_dir)
        cpu_barrier(res.group)

    def build_policy(self, res):
        return causal_lm_policy(res.config, res.text_assets.model_path, res.device).to(res.device)

    def standalone_policy(self, config, run_dir):
        from vla_rl.workflows.base import apply_lora
        from vla_rl.workflows.text_assets import TextAssets

        policy = causal_lm_policy(config, TextAssets.resolve(config, run_dir).model_path)
        if config.policy.lora is not None:
            apply_lora(policy, config.policy.lora, config.run.seed)
        return policy

    def batch_forward(self, model, batch, with_entropy=True):
        return text_forward(model, batch, with_entropy=with_entropy)

    def build_critic(self, res):
        """A copy of the warm-started LM body with a zero value head (DDP starts every worker from
        rank 0's initial weights). Built after the actor (the vLLM rollout needs the actor
        first), it copies the actor's master weights (collective): FSDP's mixed precision has
        cast the policy to bfloat16 by then, and the critic's float32 weights would start
        rounded."""
        from policies.causal_lm.value_causal_lm import CausalLMValueModel
        from vla_rl.trainers.critic import CriticTrainer, text_values

        weights = res.actor.parallel.master_parameters() if "actor" in res.built() else None
        return CriticTrainer(CausalLMValueModel(res.policy, weights).to(res.device), res.config.critic.lr,
                             group=res.group, forward=text_values, trainer=res.config.trainer)

    def warm_starts(self, config) -> bool:
        return config.text.sft_steps > 0

    def groups_per_step(self, config) -> int:
        return config.text.prompts_per_step

    def step_shape(self, config) -> StepShape:
        """Responses of ``text.max_response_length`` one-token actions to prompts of
        ``text.max_prompt_length`` tokens."""
        text = config.text
        return StepShape(groups=text.prompts_per_step, group_size=config.data.group_size,
                         decisions=text.max_response_length, chunk=1, action_dim=1, own_action_dim=1, obs={},
                         prompt_len=text.max_prompt_length)

    def build_evaluation(self, res):
        from vla_rl.evaluation.text import TextEvaluation

        res.ensure(["text_assets"])
        return TextEvaluation(res)

    def save_policy(self, policy, directory) -> None:
        """``model.safetensors``, and the policy as a Hugging Face directory (``hf_model/``,
        loadable as ``text.model_path``; not with LoRA adapters: ``vla-rl export`` merges them)."""
        from policies.lora import has_lora

        super().save_policy(policy, directory)
        if not has_lora(policy):
            policy.save_pretrained(directory / HF_MODEL_DIR)


WORKFLOWS.register("text")(TextWorkflow())


def causal_lm_policy(config, model_path, device=None):
    """The :class:`~policies.causal_lm.modeling_causal_lm.CausalLMPolicy` of a text run's ``text``
    settings, loaded from ``model_path`` onto ``device`` (None: the CPU)."""
    from policies.causal_lm.configuration_causal_lm import CausalLMConfig
    from policies.causal_lm.modeling_causal_lm import CausalLMPolicy

    text = config.text
    policy_config = CausalLMConfig(
        model_path=str(model_path), gguf_file=text.gguf_file, dtype=text.dtype,
        max_prompt_length=text.max_prompt_length, max_response_length=text.max_response_length,
        temperature=text.temperature, prompt_format=text.prompt_format,
        chat_template_kwargs=dict(text.chat_template_kwargs), allow_pickle=text.allow_pickle,
        allow_partial_load=config.policy.allow_partial_load)
    return CausalLMPolicy.from_pretrained(policy_config, device)


def meta_causal_lm_policy(config, model_path: Path):
    """The text run's :class:`~policies.causal_lm.modeling_causal_lm.CausalLMPolicy` of the model
    directory ``model_path``, built on the ``meta`` device from its ``config.json`` (no weights
    read, no memory): its module names and shapes; None for a GGUF file (``text.gguf_file``) or
    a directory without ``config.json`` (the generated tiny model before it is written).

    Raises:
        ValueError: the directory names custom code (``auto_map``), or transformers has no causal
            LM for its config.
    """
    import torch
    from transformers import AutoConfig

    from policies.causal_lm.configuration_causal_lm import CausalLMConfig
    from policies.causal_lm.loading import meta_model
    from policies.causal_lm.modeling_causal_lm import CausalLMPolicy
    from policies.checkpoint_files import load_tokenizer, refuse_custom_code

    model_path = Path(model_path)
    if config.text.gguf_file is not None or not (model_path / "config.json").is_file():
        return None
    refuse_custom_code(model_path)
    architecture = AutoConfig.from_pretrained(model_path, local_files_only=True, trust_remote_code=False)
    policy_config = CausalLMConfig(model_path=str(model_path), prompt_format=config.text.prompt_format,
                                   chat_template_kwargs=dict(config.text.chat_template_kwargs))
    with torch.device("meta"):
        return CausalLMPolicy(meta_model(architecture), load_tokenizer(model_path), policy_config)


def meta_tiny_causal_lm_policy(config):
    """The :class:`~policies.causal_lm.modeling_causal_lm.CausalLMPolicy` a text run with
    ``text.model_path: null`` generates (:func:`vla_rl.workflows.text_assets.tiny_model_spec`, its
    tokenizer trained as the run trains it), built on the ``meta`` device: its module names and
    shapes, before the run has written it."""
    import torch

    from policies.causal_lm.configuration_causal_lm import CausalLMConfig
    from policies.causal_lm.modeling_causal_lm import CausalLMPolicy
    from policies.causal_lm.tiny import arithmetic_corpus, build_tiny_qwen2, train_tokenizer
    from vla_rl.workflows.text_assets import TINY_MODEL_DIR, tiny_model_spec

    spec = tiny_model_spec(config)
    tokenizer = train_tokenizer(arithmetic_corpus(), spec.vocab_size)
    policy_config = CausalLMConfig(model_path=TINY_MODEL_DIR, prompt_format=config.text.prompt_format,
                                   chat_template_kwargs=dict(config.text.chat_template_kwargs))
    with torch.device("meta"):
        return CausalLMPolicy(build_tiny_qwen2(tokenizer, spec), tokenizer, policy_config)


@register_resource("text_assets")
def build_text_assets(res):
    """The model and prompt files of the run (:class:`~vla_rl.workflows.text_assets.TextAssets`)."""
    from vla_rl.workflows.text_assets import TextAssets

    return TextAssets.resolve(res.config, res.run_dir)


class PromptLoaders:
    """The training prompt loader of each DP layout a worker's nodes read with (built once each)."""

    def __init__(self, res) -> None:
        self.res = res
        self._loaders: dict[tuple, object] = {}

    def get(self, dp_rank: int, dp_size: int, extra_columns: tuple[str, ...] = ()):
        """The :class:`~vla_rl.data.prompt_dataset.ShardedPromptLoader` of shard ``dp_rank`` of
        ``dp_size``, reading ``extra_columns`` too."""
        from vla_rl.data.prompt_dataset import ShardedPromptLoader

        key = (dp_rank, dp_size, extra_columns)
        if key not in self._loaders:
            self._loaders[key] = ShardedPromptLoader(
                self.res.text_assets.train_file, self.res.config.text.prompts_per_step, dp_rank, dp_size,
                seed=self.res.config.run.seed, extra_columns=extra_columns)
        return self._loaders[key]


@register_resource("prompt_loaders", needs=("text_assets",))
def build_prompt_loaders(res) -> PromptLoaders:
    """The worker's training prompt loaders, by DP layout."""
    return PromptLoaders(res)


@register_resource("text_rollout", needs=("policy",), close=lambda rollout: rollout.close())
def build_text_rollout(res):
    """The sampler of ``text.rollout_backend`` (:mod:`vla_rl.rollout.text_backends`); a vLLM engine
    reloads the actor's weights after each of its optimizer steps, so it is built after the actor."""
    from vla_rl.rollout.text_backends import make_text_rollout

    text = res.config.text
    if text.rollout_backend == "vllm":
        res.ensure(["actor"])
    return make_text_rollout(
        text.rollout_backend, res.policy, text, seed=res.config.run.seed * 1_000_003 + res.rank,
        work_dir=res.run_dir / "rollout" / f"rank{res.rank}",
        optimizer=res.actor.optimizer if "actor" in res.built() else None,
    )
