"""``text.rollout_backend: vllm``: training responses sampled by a vLLM engine that lives in the
worker's process, beside the trainer, on the same device.

- **Start**: the model's ``config.json`` and tokenizer are written to a worker-local directory; a
  ``vllm.LLM`` builds the model from it with placeholder weights (``load_format="dummy"``) and
  the weight sync below loads the policy's current weights at once. (Writing the weights with
  ``save_pretrained`` instead does not work on every worker: transformers 5 writes a model's
  files on torch.distributed rank 0 only.) The engine core runs in-process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode does), so the sync hands vLLM
  the trainer's tensors without serialising them.
- **Sampling**: one request per prompt with ``SamplingParams(n=group_size)`` at the policy's
  temperature over the whole vocabulary (top-k 0, top-p 1, no penalties; the checkpoint's
  ``generation_config.json`` is ignored with ``generation_config="vllm"``), stopping at the
  processor's EOS ids; ``logprobs=0`` returns the sampled token's log-probability, taken after
  the temperature (``logprobs_mode="processed_logprobs"``). Each request gets a seed drawn from
  the worker's generator, so runs replay.
- **Weight sync**: the backend hooks the actor's optimizer (``register_step_post_hook``); after
  a step, the next :meth:`VLLMTextRollout.sample` first reloads the engine's weights in place
  from the policy's ``state_dict`` (Hugging Face names, checkpoint format) with the worker's
  ``reload_weights`` RPC (``LLM.collective_rpc``; vLLM 0.32's layerwise reload, which maps
  the names onto vLLM's fused layers and redoes the kernel-specific weight processing that a
  bare ``model.load_weights`` after start-up would skip — on CPU that fails). Under LoRA
  (``policy.lora``) the engine loads the merged weights, ``W + alpha / r * B A`` under the base
  layers' names, computed out of place (TRL also hands vLLM merged weights, merging in place).

- **Precision**: the engine computes in its own dtype (``text.dtype``), as an engine in another
  process would: the rollout node calls :meth:`VLLMTextRollout.sample` inside the trainer's
  ``torch.autocast`` (bfloat16 under DDP's mixed precision on GPUs), and since the engine core runs
  in the caller's thread, that context would otherwise reach vLLM's own linear layers (bfloat16
  outputs into its float32 layers and kernels) and the weight sync. ``sample`` turns autocast off.

vLLM's kernels differ numerically from the trainer's forward, so its log-probs are close to but
not exactly the trainer's: ``exact_log_probs`` is False and the rollout node recomputes
``old_log_probs`` with the trainer's policy (as verl's ``actor.compute_log_prob`` does).
vLLM is imported here only, when this backend is built.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from policies.causal_lm.modeling_causal_lm import CausalLMPolicy, Generation
from vla_rl.rollout.token_lists import generation_from_token_lists, unpad_prompts

GiB = 1 << 30


def vllm_missing_message(error: object) -> str:
    """What to do when ``text.rollout_backend: vllm`` finds no vllm package (``error``: why)."""
    return (f"text.rollout_backend is 'vllm' but the vllm package cannot be imported ({error}); install it as "
            "docs/llm.md ('vLLM rollout') says, or set text.rollout_backend=hf")


def import_vllm() -> Any:
    """The ``vllm`` module, in-process engine mode set.

    Raises:
        ModuleNotFoundError: vllm is not installed; the message names ``text.rollout_backend``.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        import vllm
    except ImportError as error:
        raise ModuleNotFoundError(vllm_missing_message(error)) from error
    return vllm


def sampled_log_probs(token_ids: list[int], logprobs: list[dict[int, Any]] | None) -> list[float]:
    """The log-probability of each sampled token from a vLLM completion's ``logprobs``.

    Args:
        token_ids: the completion's sampled ids.
        logprobs: per position, vLLM's ``{token_id: Logprob}`` (with ``logprobs=0`` it holds the
            sampled token only).

    Raises:
        ValueError: ``logprobs`` is missing or does not cover every sampled token.
    """
    if logprobs is None or len(logprobs) != len(token_ids):
        raise ValueError("vLLM returned no log-prob for some sampled tokens; sample with SamplingParams(logprobs=0)")
    return [float(position[token].logprob) for token, position in zip(token_ids, logprobs)]


def write_model_description(policy: CausalLMPolicy, directory: Path) -> Path:
    """The model's ``config.json`` and its tokenizer files in ``directory`` (created), no weights.

    Not ``save_pretrained`` of the model: transformers 5 writes its files on torch.distributed
    rank 0 only, and every DAG worker needs its own copy.
    """
    policy.model.config.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)
    return directory


class VLLMTextRollout:
    """A vLLM engine sampling the training responses of one worker.

    Args:
        policy: the worker's causal LM policy (the trainer's module; its weights are the source).
        text_config: the run's ``text`` section: ``max_prompt_length``, ``max_response_length``,
            ``temperature``, ``dtype``, ``vllm_memory_fraction`` (GPU), ``vllm_kv_cache_gib`` (CPU).
        seed: the engine's seed (any integer >= 0: the engine gets it modulo 2**32, as vLLM seeds
            numpy's legacy generator, ``np.random.seed``, which takes no larger one).
        work_dir: directory for the model's config and tokenizer the engine starts from (worker-local).
        optimizer: the actor's optimizer; each of its steps marks the engine's weights stale.

    Raises:
        ModuleNotFoundError: vllm is not installed (see :func:`import_vllm`).
    """

    exact_log_probs = False

    def __init__(self, policy: CausalLMPolicy, text_config, seed: int, work_dir: Path,
                 optimizer: torch.optim.Optimizer | None) -> None:
        vllm = import_vllm()
        self.policy = policy
        self.temperature = text_config.temperature
        self.max_response_length = text_config.max_response_length
        self._sampling_params = vllm.SamplingParams
        self._tokens_prompt = vllm.inputs.TokensPrompt
        checkpoint = write_model_description(policy, Path(work_dir) / "vllm_model")
        memory = ({"kv_cache_memory_bytes": int(text_config.vllm_kv_cache_gib * GiB)} if policy.device.type == "cpu"
                  else {"gpu_memory_utilization": text_config.vllm_memory_fraction})
        self.llm = vllm.LLM(
            model=str(checkpoint),
            dtype=text_config.dtype,
            seed=seed % 2**32,
            max_model_len=text_config.max_prompt_length + text_config.max_response_length,
            enforce_eager=True,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            load_format="dummy",
            **memory,
        )
        self.sync_weights()
        if optimizer is not None:
            optimizer.register_step_post_hook(self._mark_stale)

    def _mark_stale(self, optimizer, args, kwargs) -> None:
        self.stale = True

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Load the policy's current parameters into the engine's model, in place; LoRA adapters
        folded into their base weights (:func:`policies.lora.merged_weights`: the engine's model
        has no adapters), one merged weight at a time; then empty the engine's prefix cache.

        Raises:
            RuntimeError: the engine could not reset its prefix cache.
        """
        from policies.lora import merged_weights

        weights = merged_weights(self.policy.model)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        # The prefix cache (on by default) keeps the KV blocks of prompts it has seen, computed with
        # the weights of then: the chat template's shared preamble would stay at the first step's
        # weights for the whole run (TRL's colocated vLLM resets it after each load, as here).
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after the weight sync (requests still running): "
                               "its cached prompt blocks hold the previous weights' keys and values")
        self.stale = False

    def close(self) -> None:
        """Shut the engine down. vLLM then also destroys torch.distributed's default group (the
        one it joined or created), so call this last, when the worker leaves its process group."""
        self.llm.llm_engine.engine_core.shutdown()

    def sample(self, input_ids: Tensor, attention_mask: Tensor, group_size: int,
               generator: torch.Generator) -> Generation:
        """``group_size`` responses per prompt, after a weight sync if the optimizer stepped.

        Args:
            input_ids, attention_mask: ``(g, P)`` left-padded prompts.
            group_size: responses per prompt.
            generator: draws the requests' seeds.

        Returns:
            :class:`Generation` of ``g * group_size`` rows (groups contiguous), ``(n, R)`` with
            ``R = text.max_response_length``; ``log_probs`` are vLLM's.
        """
        with torch.autocast(self.policy.device.type, enabled=False):  # the engine's own dtype (module docstring)
            return self._sample(input_ids, attention_mask, group_size, generator)

    def _sample(self, input_ids: Tensor, attention_mask: Tensor, group_size: int,
                generator: torch.Generator) -> Generation:
        if self.stale:
            self.sync_weights()
        prompts = unpad_prompts(input_ids, attention_mask)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=generator).tolist()
        # top_k left at vLLM's default, which keeps every token in each version (-1 in older ones,
        # which refused top_k=0: vllm-project/vllm#17553); the full distribution, as the trainer scores it
        params = [
            self._sampling_params(
                n=group_size, temperature=self.temperature, top_p=1.0, max_tokens=self.max_response_length,
                stop_token_ids=list(self.policy.processor.eos_token_ids), logprobs=0, seed=seed,
            )
            for seed in seeds
        ]
        requests = [self._tokens_prompt(prompt_token_ids=ids) for ids in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        completions = [completion for output in outputs for completion in output.outputs]
        token_ids = [list(completion.token_ids) for completion in completions]
        log_probs = [sampled_log_probs(ids, completion.logprobs) for ids, completion in zip(token_ids, completions)]
        return generation_from_token_lists(token_ids, log_probs, self.max_response_length,
                                           self.policy.processor.pad_token_id)
