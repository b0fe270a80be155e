"""Evaluation rollouts on held-out initial states, sharded over the DAG workers.

Evaluation ids ``eval.init_state_offset + i`` (``i < eval.num_episodes``) never overlap the
training ids. Worker ``r`` of ``W`` evaluates ``i ≡ r (mod W)``; success counts and episode
lengths are summed with ``all_reduce`` so every worker returns the same figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from ray.experimental import tqdm_ray

from vla_rl.data import keys
from vla_rl.evaluation.protocol import ProtocolPolicy, eval_protocols
from vla_rl.rollout.embodied import rollout_episodes
from vla_rl.utils.stats import wilson_interval
from vla_rl.utils.video import write_mp4


def evaluate_shard(
    policy, pool, init_state_ids: np.ndarray, capacity: int, generator: torch.Generator, pipeline_stages: int,
    bar=None,
) -> tuple[int, int, float]:
    """Roll out one episode per id (in pool-sized chunks).

    Args:
        policy: a policy, or a :class:`~vla_rl.evaluation.protocol.ProtocolPolicy` (it decides
            greedy or sampled).
        pipeline_stages: see :func:`vla_rl.rollout.embodied.rollout_episodes`.
        bar: a progress bar advanced by the episodes of each chunk, lost ones included (None: no
            progress shown).

    Returns:
        (successes, episodes, sum of episode lengths in decision steps); episodes lost to a
        simulator fault are not counted.
    """
    successes, episodes, length_sum = 0, 0, 0.0
    for start in range(0, len(init_state_ids), capacity):
        chunk_ids = init_state_ids[start : start + capacity]
        batch = rollout_episodes(policy, pool, chunk_ids, generator=generator, pipeline_stages=pipeline_stages).batch
        successes += int(batch[keys.SUCCESS].sum())
        episodes += len(batch)
        length_sum += float(batch[keys.FINISH_STEP].sum())
        if bar is not None:
            bar.update(len(chunk_ids))
    return successes, episodes, length_sum


def evaluate_distributed(
    policy, pool, config, rank: int, world_size: int, capacity: int, generator: torch.Generator,
    group: dist.ProcessGroup | None = None,
) -> dict[str, float]:
    """Evaluate every protocol of ``config.eval`` on this worker's share of the held-out ids.

    Protocols: ``greedy``, and ``sampled`` at ``config.eval.temperature``.

    Returns:
        Per protocol ``p``: ``eval/{p}/success_rate``, ``eval/{p}/ci_low``, ``eval/{p}/ci_high``
        (Wilson 95%), ``eval/{p}/episodes``, ``eval/{p}/episode_length``; identical on all workers.
    """
    ids = config.eval.init_state_offset + np.arange(config.eval.num_episodes, dtype=np.int64)
    mine = ids[rank::world_size]
    out: dict[str, float] = {}
    policy.eval()
    protocols = eval_protocols(config.eval)
    bar = (tqdm_ray.tqdm(total=len(mine) * len(protocols), desc="held-out evaluation (rank 0's episodes)",
                         unit="episode") if rank == 0 else None)
    for protocol in protocols:
        local = evaluate_shard(ProtocolPolicy(policy, protocol), pool, mine, capacity, generator=generator,
                               pipeline_stages=config.simulator.pipeline_stages, bar=bar)
        totals = torch.tensor(local, dtype=torch.float64)
        dist.all_reduce(totals, group=group)
        successes, episodes, length_sum = int(totals[0]), int(totals[1]), float(totals[2])
        low, high = wilson_interval(successes, episodes)
        out.update({
            f"eval/{protocol.name}/success_rate": successes / episodes,
            f"eval/{protocol.name}/ci_low": low,
            f"eval/{protocol.name}/ci_high": high,
            f"eval/{protocol.name}/episodes": float(episodes),
            f"eval/{protocol.name}/episode_length": length_sum / episodes,
        })
    if bar is not None:
        bar.close()
    return out


def record_video(policy, pool, init_state_ids: np.ndarray, path: Path, fps: int, generator: torch.Generator) -> dict:
    """Roll out greedy episodes with camera frames and write them one after another to ``path`` (mp4).

    Returns:
        ``{"video_successes": k, "video_episodes": n}``.
    """
    policy.eval()
    n = len(init_state_ids)
    result = rollout_episodes(policy, pool, init_state_ids, greedy=True, generator=generator,
                              render_indices=tuple(range(n)))
    frames = np.concatenate([result.frames[i] for i in range(n) if i in result.frames])
    write_mp4(path, frames, fps)
    return {"video_successes": int(result.batch[keys.SUCCESS].sum()), "video_episodes": n}
