"""The evaluation of a causal LM policy: answer accuracy on held-out prompts (:class:`TextEvaluation`).

Each worker reads only its own row groups of the test file (as training does) and evaluates the
first :func:`eval_quotas` rows of its shard once per protocol (greedy decoding, or sampling at
the policy's temperature with :func:`~vla_rl.evaluation.session.evaluation_generator`'s noise,
never the training's), scored by the rule verifiers of the rows'
``data_source``; one prompt counts as one episode, its length is the response's tokens.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from vla_rl.data.prompt_dataset import PromptFile
from vla_rl.evaluation.session import EvaluationSession, evaluation_generator
from vla_rl.rewards.verifiers import verify
from vla_rl.trainers.strategy import autocast
from vla_rl.utils.collectives import all_gather_small_objects
from vla_rl_core import keys

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


class TextEvaluation(EvaluationSession):
    """One worker's evaluation of its causal LM on the held-out prompts (see the module docstring).

    Building it is collective: the workers exchange their shard sizes (one int each, no rows).

    Args:
        res: the worker's resources (``text_assets``, ``policy``).
    """

    def __init__(self, res) -> None:
        super().__init__(res, ["test"], [None], keys.UID)
        rows = PromptFile(res.text_assets.test_file).read_shard(res.rank, res.world_size)
        sizes = all_gather_small_objects(len(rows), res.group, tag="evaluation")
        self.rows = {row.index: row for row in rows[: eval_quotas(res.config.eval.num_episodes, sizes)[res.rank]]}
        self.flexible = res.config.text.answer_extraction == "flexible"

    def shard_items(self, dp_rank: int, dp_size: int) -> np.ndarray:
        """This worker's rows (each worker evaluates its own shard of the file, whatever the DP layout)."""
        return np.fromiter(self.rows, dtype=np.int64, count=len(self.rows))

    def rollout(self, batch: TensorDict) -> tuple[TensorDict, int]:
        t, _, p = self.group_of(batch)
        greedy = self.protocols[p].greedy
        policy = self.res.policy.eval()
        rows = [self.rows[i] for i in batch[keys.UID].tolist()]
        generator = evaluation_generator(self.res.config.run.seed, t, p, rows[0].index)
        success, lengths = [], []
        for start in range(0, len(rows), EVAL_BATCH_SIZE):
            chunk = rows[start : start + EVAL_BATCH_SIZE]
            input_ids, attention_mask = policy.processor.encode_prompts([r.prompt for r in chunk],
                                                                        policy.config.max_prompt_length)
            with autocast(self.res.config.trainer, self.res.device):  # the policy computes as in training
                generation = policy.generate(input_ids, attention_mask, greedy=greedy, generator=generator)
            texts = policy.processor.decode_responses(generation.responses, generation.response_mask)
            success += [verify(r.data_source, text, r.ground_truth, self.flexible).correct for r, text in zip(chunk, texts)]
            lengths.append(generation.response_mask.sum(-1).cpu())
        episodes = batch.clone()
        episodes.set(keys.SUCCESS, torch.tensor(success, dtype=torch.bool))
        episodes.set(keys.FINISH_STEP, torch.cat(lengths).long())
        return episodes, 0
