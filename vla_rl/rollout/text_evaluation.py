"""Held-out evaluation of a causal LM policy: answer accuracy on the test prompts.

Each worker reads only its own row groups of the test file (as training does), answers the
first :func:`eval_quotas` prompts of its shard once per protocol (greedy decoding, or sampling
at the policy's temperature), and scores them with the rule verifiers;
the counts are summed with ``all_reduce`` so every worker returns the same figures, under the
keys of the embodied evaluation (one prompt counts as one episode).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from vla_rl.data.prompt_dataset import PromptFile
from vla_rl.rewards.verifiers import verify
from vla_rl.utils.stats import wilson_interval

#: Prompts decoded together during evaluation (bounds the KV cache).
EVAL_BATCH_SIZE = 64


def eval_quotas(num_episodes: int, shard_sizes: list[int]) -> list[int]:
    """Prompts each worker evaluates: ``num_episodes`` dealt one at a time round-robin over the
    workers that still have unread rows, so shards of unequal size (row groups dealt over the
    workers) still give ``min(num_episodes, sum(shard_sizes))`` prompts in all.

    Args:
        num_episodes: prompts wanted in all (``eval.num_episodes``).
        shard_sizes: rows in each worker's shard, by rank.

    Returns:
        Quota per rank, each at most its shard size.
    """
    quotas = [0] * len(shard_sizes)
    remaining = min(num_episodes, sum(shard_sizes))
    while remaining:
        for rank, size in enumerate(shard_sizes):
            if remaining and quotas[rank] < size:
                quotas[rank] += 1
                remaining -= 1
    return quotas


def evaluate_text_distributed(
    policy, test_file: Path, config, rank: int, world_size: int, generator: torch.Generator,
    group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """Accuracy of ``policy`` on this worker's share of the held-out prompts, for every protocol
    of ``config.eval`` (answers extracted as ``config.text.answer_extraction`` says).

    Returns:
        Per protocol ``p``: ``eval/{p}/success_rate`` (accuracy), ``eval/{p}/ci_low``,
        ``eval/{p}/ci_high`` (Wilson 95%), ``eval/{p}/episodes`` (prompts) and
        ``eval/{p}/episode_length`` (mean response tokens); identical on all workers.
    """
    rows = PromptFile(test_file).read_shard(rank, world_size)
    sizes = [None] * world_size
    dist.all_gather_object(sizes, len(rows), group=group)  # one int per worker, no rows
    rows = rows[: eval_quotas(config.eval.num_episodes, sizes)[rank]]
    flexible = config.text.answer_extraction == "flexible"
    out: dict[str, float] = {}
    policy.eval()
    for protocol in config.eval.protocols:
        correct, lengths = 0, 0
        for start in range(0, len(rows), EVAL_BATCH_SIZE):
            chunk = rows[start : start + EVAL_BATCH_SIZE]
            input_ids, attention_mask = policy.processor.encode_prompts([r.prompt for r in chunk],
                                                                        policy.config.max_prompt_length)
            generation = policy.generate(input_ids, attention_mask, greedy=protocol == "greedy", generator=generator)
            texts = policy.processor.decode_responses(generation.responses, generation.response_mask)
            correct += sum(verify(r.data_source, text, r.ground_truth, flexible).correct for r, text in zip(chunk, texts))
            lengths += int(generation.response_mask.sum())
        totals = torch.tensor([correct, len(rows), lengths], dtype=torch.float64)
        dist.all_reduce(totals, group=group)
        successes, prompts, length_sum = int(totals[0]), int(totals[1]), float(totals[2])
        low, high = wilson_interval(successes, prompts)
        out.update({
            f"eval/{protocol}/success_rate": successes / max(prompts, 1),
            f"eval/{protocol}/ci_low": low,
            f"eval/{protocol}/ci_high": high,
            f"eval/{protocol}/episodes": float(prompts),
            f"eval/{protocol}/episode_length": length_sum / max(prompts, 1),
        })
    return out
