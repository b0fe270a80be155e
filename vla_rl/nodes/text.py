"""The text workflow's own nodes (``fn: text``); advantages, filters, the reference and the actor
update are the embodied nodes, unchanged (a response token is a decision step whose action chunk
and dimension are 1).

- ``(data, data_load, text)``: this worker's prompts of the step (in a dynamic-sampling refill
  round, fresh rows of its shard), encoded with the chat template;
- ``(rollout, model_inference, text)``: ``data.group_size`` sampled responses per prompt, by the
  sampler of ``text.rollout_backend`` (:mod:`vla_rl.rollout.text_backends`);
- ``(reward, compute, text)``: rule rewards from the verifier of each row's ``data_source``;
- ``(data, data_load, sft)`` and ``(actor, model_train, sft)``: supervised fine-tuning on the
  rows' target responses (``llm_sft.yaml``), with the actor's DDP model and optimizer.

Strings do not travel through re-shards (batches are tensors): the reward node looks up the
ground truths of its samples, by ``uid`` (the row index), in the prompt rows this worker read.
It must therefore run at the data node's DP size, before any re-shard; it raises otherwise.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import Tensor

from vla_rl.algorithms.rewards import overlong_penalty
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.data.prompt_dataset import PromptRow
from vla_rl.nodes.reward import overlong_buffer_fits
from vla_rl.rewards.verifiers import RuleRewardConfig, score_responses
from vla_rl.trainers.actor import per_dim_log_probs, text_forward
from vla_rl.trainers.strategy import autocast
from vla_rl.workers.metrics import maximum, minimum
from vla_rl_core import keys

PROMPT_KEYS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.UID)
RESPONSE_KEYS = (keys.RESPONSES, keys.RESPONSE_MASK, keys.OLD_LOG_PROBS, keys.FINISH_STEP, keys.TRUNCATED)


def _shards_divide_the_prompts(config, node_config, dp_size: int, world_size: int):
    """Plan-time: every DP shard reads as many prompts per step (checked before any worker starts)."""
    per_step = config.text.prompts_per_step
    if per_step % dp_size:
        return "text.prompts_per_step", (f"text.prompts_per_step={per_step} must be a multiple of the data node's DP "
                                         f"size {dp_size} (with {world_size} workers): each worker reads its own prompts")
    return None


@register_node("data", "data_load", name="text", writes=PROMPT_KEYS, resources=("policy", "prompt_loaders"),
               check=_shards_divide_the_prompts)
def load_prompts(ctx, batch) -> NodeOutput:
    """Read shard ``ctx.dp_rank`` of the step's ``text.prompts_per_step`` prompts and encode them
    (in a refill round, :meth:`ShardedPromptLoader.rows_for_refill`).

    Returns:
        ``input_ids`` ``(g, max_prompt_length)`` int64 and ``attention_mask`` (same shape, 0/1),
        left-padded; ``uid`` ``(g,)`` int64, the row index in the prompt file (the group id);
        ``g = prompts_per_step // dp_size``.
    """
    loader = ctx.resources.prompt_loaders.get(ctx.dp_rank, ctx.dp_size)
    if ctx.refill_round:
        return NodeOutput(encode_rows(ctx.resources.policy, loader.rows_for_refill(ctx.step, ctx.refill_round)), {})
    prompts = encode_rows(ctx.resources.policy, loader.rows_for_step(ctx.step))
    return NodeOutput(prompts, {"data/epoch": float(ctx.step // loader.steps_per_epoch)})


def encode_rows(policy, rows: list[PromptRow]) -> TensorDict:
    """``input_ids``, ``attention_mask`` ``(g, max_prompt_length)`` and ``uid`` ``(g,)`` of ``rows``."""
    input_ids, attention_mask = policy.processor.encode_prompts([row.prompt for row in rows],
                                                                policy.config.max_prompt_length)
    return TensorDict({
        keys.INPUT_IDS: input_ids,
        keys.ATTENTION_MASK: attention_mask.long(),
        keys.UID: torch.tensor([row.index for row in rows], dtype=torch.int64),
    }, batch_size=[len(rows)])


def _vllm_on_every_worker(config, node_config, dp_size: int, world_size: int):
    """With ``text.rollout_backend: vllm`` the rollout node runs on every worker: each worker's
    engine joins torch.distributed's existing default group when it starts, which is collective
    (an engine started on only some workers waits for the others forever)."""
    if config.text.rollout_backend == "vllm" and dp_size != world_size:
        return "dp_size", (f"text.rollout_backend=vllm needs the rollout node on every worker: dp_size {dp_size} != "
                           f"workers.num_workers ({world_size}); remove its dp_size")
    return None


@register_node("rollout", "model_inference", name="text", reads=PROMPT_KEYS, writes=RESPONSE_KEYS,
               resources=("policy", "text_rollout"), check=_vllm_on_every_worker)
def generate_responses(ctx, batch) -> NodeOutput:
    """Sample ``data.group_size`` responses per prompt at ``text.temperature``.

    Args:
        batch: ``input_ids``, ``attention_mask`` ``(g, P)``, ``uid`` ``(g,)``.

    Returns:
        ``(g * group_size,)`` samples, groups contiguous: the prompt keys and ``uid``, plus
        ``responses`` ``(n, R)`` int64, ``response_mask`` ``(n, R)`` bool, ``old_log_probs``
        ``(n, R, 1)`` float32 (one-token actions), ``finish_step`` ``(n,)`` int64 (response
        lengths) and ``truncated`` ``(n,)`` bool (:func:`truncated_responses`), with
        ``R = text.max_response_length``.

    Metrics: ``rollout/response_length`` (mean; ``_max`` and ``_min`` over the step's responses,
    verl's ``response_length/max``, TRL's ``completions/max_length``), ``rollout/clip_ratio`` (the
    share of responses of length ``R``, verl's ``response_length/clip_ratio``) and
    ``rollout/truncated_ratio`` (the share without an end-of-sequence token, TRL's
    ``completions/clipped_ratio``).
    """
    samples, metrics = sample_groups(ctx.resources, ctx.config.data.group_size, batch)
    lengths = samples[keys.FINISH_STEP]
    metrics["rollout/response_length"] = float(lengths.float().mean())
    metrics["rollout/response_length_max"] = maximum(float(lengths.max()))
    metrics["rollout/response_length_min"] = minimum(float(lengths.min()))
    metrics["rollout/clip_ratio"] = float((lengths == samples[keys.RESPONSES].shape[1]).float().mean())
    metrics["rollout/truncated_ratio"] = float(samples[keys.TRUNCATED].float().mean())
    return NodeOutput(samples, metrics)


def truncated_responses(responses: Tensor, lengths: Tensor, eos_token_ids: list[int]) -> Tensor:
    """Which responses were cut by the length limit: their last token is no end-of-sequence token
    (TRL's ``is_truncated``; the samplers stop at the first one, or at ``text.max_response_length``).

    Args:
        responses: ``(n, R)`` int64, right-padded.
        lengths: ``(n,)`` int64, each response's tokens.
        eos_token_ids: the tokens that end a response (none: every response is cut).

    Returns:
        ``(n,)`` bool, on ``responses``' device; False for an empty response.
    """
    last = responses.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]  # (n,)
    ends = torch.isin(last, torch.tensor(eos_token_ids, dtype=responses.dtype, device=responses.device))
    return (lengths > 0) & ~ends


def sample_groups(resources, group_size: int, prompts: TensorDict) -> tuple[TensorDict, dict[str, float]]:
    """``group_size`` sampled responses per prompt of ``prompts`` (see :func:`generate_responses`)
    with ``resources.text_rollout``, and its metrics.

    When the sampler's log-probs are not the trainer's (vLLM), ``old_log_probs`` are recomputed
    with the trainer's policy before any update, as verl's ``actor.compute_log_prob`` does, and
    ``rollout/log_prob_max_diff`` / ``rollout/log_prob_mean_diff`` report the largest and mean
    absolute gap to the sampler's over the valid tokens.
    """
    rollout = resources.text_rollout
    with autocast(resources.config.trainer, resources.device):  # the policy computes as in the trainer
        generation = rollout.sample(prompts[keys.INPUT_IDS], prompts[keys.ATTENTION_MASK], group_size,
                                    resources.generator)
    samples = prompts.repeat_interleave(group_size, dim=0)
    samples.set(keys.RESPONSES, generation.responses.cpu())
    samples.set(keys.RESPONSE_MASK, generation.response_mask.cpu())
    samples.set(keys.OLD_LOG_PROBS, generation.log_probs.cpu()[..., None])  # (n, R, 1)
    lengths = generation.response_mask.sum(-1)  # (n,)
    samples.set(keys.FINISH_STEP, lengths.cpu())
    samples.set(keys.TRUNCATED, truncated_responses(generation.responses, lengths,
                                                    resources.policy.processor.eos_token_ids).cpu())
    if rollout.exact_log_probs:
        return samples, {}
    policy = resources.policy.eval()
    with autocast(resources.config.trainer, resources.device):
        trainer_log_probs = per_dim_log_probs(policy, samples, text_forward,  # (n, R, 1)
                                              resources.config.trainer.micro_batch_size)[..., 0].cpu()
    gap = (trainer_log_probs - samples[keys.OLD_LOG_PROBS])[samples[keys.RESPONSE_MASK]].abs()  # (valid, 1)
    samples.set(keys.OLD_LOG_PROBS, trainer_log_probs)
    has_tokens = gap.numel() > 0
    return samples, {"rollout/log_prob_max_diff": float(gap.max()) if has_tokens else 0.0,
                     "rollout/log_prob_mean_diff": float(gap.mean()) if has_tokens else 0.0}


@register_node("reward", "compute", name="text", reads=(keys.UID, *RESPONSE_KEYS), writes=(keys.REWARDS, keys.SUCCESS),
               resources=("policy", "prompt_loaders"), check=overlong_buffer_fits, local_to="data")
def score(ctx, batch) -> NodeOutput:
    """Set ``rewards`` ``(n,)`` float32 (``text.correct_score`` and ``text.format_score`` weights,
    plus DAPO's overlong penalty when ``algorithm.overlong_buffer.len > 0``) and ``success``
    ``(n,)`` bool (the final answer is correct).

    Metrics: ``reward/accuracy``, ``reward/format_rate``, ``reward/mean`` and
    ``rollout/success_rate`` (= accuracy, the training curve's key).

    Each row's answer is read from the prompts this worker's data node read (``local_to="data"``:
    the planner refuses a template that runs the two at different DP sizes).

    Raises:
        ValueError: a ``uid`` is not among the rows this worker read (a node between the two
            re-sharded unequal shards there and back).
    """
    return NodeOutput(batch, score_samples(ctx, batch))


def score_samples(ctx, batch: TensorDict) -> dict[str, float]:
    """Set ``rewards`` and ``success`` on ``batch`` in place (see :func:`score`); its metrics."""
    text, algo = ctx.config.text, ctx.config.algorithm
    rows = {row.index: row for row in ctx.resources.prompt_loaders.get(ctx.dp_rank, ctx.dp_size).rows}
    uids = batch[keys.UID].tolist()
    missing = [uid for uid in uids if uid not in rows]
    if missing:
        raise ValueError(f"node {ctx.node_id!r}: rows {missing[:5]} were read by another worker; the text reward "
                         "node must run at the data node's dp_size, before any re-shard (see vla_rl/nodes/text.py)")
    picked = [rows[uid] for uid in uids]
    texts = ctx.resources.policy.processor.decode_responses(batch[keys.RESPONSES], batch[keys.RESPONSE_MASK])
    sources = [row.data_source for row in picked]
    truths = [row.ground_truth for row in picked]
    flexible = text.answer_extraction == "flexible"
    rewards, success, metrics = score_responses(sources, texts, truths,
                                                RuleRewardConfig(text.correct_score, text.format_score, flexible))
    if algo.overlong_buffer.len > 0:
        penalty = overlong_penalty(batch[keys.FINISH_STEP], text.max_response_length, algo.overlong_buffer.len,
                                   algo.overlong_buffer.penalty_factor)
        rewards = rewards + penalty
        metrics["reward/overlong_penalty"] = float(penalty.mean())
    batch.set(keys.REWARDS, rewards)
    batch.set(keys.SUCCESS, success)
    metrics["reward/mean"] = float(rewards.mean())
    metrics["rollout/success_rate"] = metrics["reward/accuracy"]
    return metrics


SFT_KEYS = (*PROMPT_KEYS, keys.RESPONSES, keys.RESPONSE_MASK)


@register_node("data", "data_load", name="sft", writes=SFT_KEYS, resources=("policy", "prompt_loaders"),
               check=_shards_divide_the_prompts)
def load_sft_pairs(ctx, batch) -> NodeOutput:
    """This worker's prompt/target pairs of the step: ``text.prompts_per_step`` rows over all
    workers, targets from ``text.sft_response_column``.

    Returns:
        the keys of :func:`load_prompts` plus ``responses`` ``(g, max_response_length)`` int64
        and ``response_mask`` (same shape, bool), right-padded targets ending in EOS.
    """
    column = ctx.config.text.sft_response_column
    loader = ctx.resources.prompt_loaders.get(ctx.dp_rank, ctx.dp_size, extra_columns=(column,))
    rows = loader.rows_for_step(ctx.step)
    policy = ctx.resources.policy
    pairs = encode_rows(policy, rows)
    responses, response_mask = policy.processor.encode_responses([str(row.extra[column]) for row in rows],
                                                                 policy.config.max_response_length)
    pairs.set(keys.RESPONSES, responses)
    pairs.set(keys.RESPONSE_MASK, response_mask.bool())
    return NodeOutput(pairs, {"data/epoch": float(ctx.step // loader.steps_per_epoch)})


@register_node("actor", "model_train", name="sft", whole_groups=False, reads=SFT_KEYS, resources=("actor",))
def supervised_step(ctx, batch) -> NodeOutput:
    """``trainer.ppo_epochs`` passes of supervised minibatches (``trainer.ppo_mini_batch_size``
    pairs over all workers, or ``trainer.ppo_num_mini_batches`` of them) on this worker's pairs;
    returns the batch unchanged."""
    trainer = ctx.config.trainer
    metrics = ctx.resources.actor.supervised_update(batch, trainer.ppo_epochs, trainer.ppo_mini_batch_size,
                                                    trainer.max_grad_norm, ctx.resources.generator,
                                                    trainer.micro_batch_size, trainer.max_skipped_updates,
                                                    trainer.ppo_num_mini_batches)
    return NodeOutput(batch, metrics)
