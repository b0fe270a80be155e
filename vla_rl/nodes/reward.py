"""``(reward, compute)``: the episode reward — binary success, or SRPO's progress reward that
scores failures by their trajectory embedding's distance to the batch's successes — and the
``trajectory_encoder`` resource of the rewards that embed episodes."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

from vla_rl.algorithms.rewards import EMBODIED_REWARDS, overlong_penalty
from vla_rl.algorithms.srpo import SRPOShards
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.utils.collectives import all_gather_objects, all_gather_small_objects
from vla_rl.workers.metrics import mean
from vla_rl.workers.resources import register_resource
from vla_rl_core import keys


def embeds_trajectories(config) -> bool:
    """Whether the run's reward scores trajectory embeddings (``embeddings=True`` in its registry)."""
    return config.algorithm.embeds_trajectories()


@register_resource("trajectory_encoder", needs=("policy",))
def build_trajectory_encoder_resource(res):
    """The trajectory encoder of ``algorithm.trajectory_encoder`` with its settings, built once,
    given what its registered traits ask of the worker (:class:`~vla_rl.rewards.trajectory_encoders.EncoderTraits`:
    the live policy's vision backbone, ``frame_features``, for ``policy_backbone``; this worker's
    device for ``vjepa2``, which loads its model there).

    Raises:
        ValueError: an encoder that reads the policy's vision backbone, with a policy without one.
    """
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS, build_trajectory_encoder

    algo = res.config.algorithm
    wants = TRAJECTORY_ENCODERS.traits(algo.trajectory_encoder).runtime
    runtime = {}
    if "frame_features" in wants:
        if not hasattr(res.policy, "frame_features"):
            raise ValueError(f"algorithm.trajectory_encoder {algo.trajectory_encoder!r} needs a policy with a vision "
                             f"backbone (frame_features); policy {res.config.policy.name!r} has none")
        runtime["frame_features"] = res.policy.frame_features
    if "device" in wants:
        runtime["device"] = res.device
    return build_trajectory_encoder(algo.trajectory_encoder, algo.options("trajectory_encoder"), **runtime)


def _reward_reads(config, node_config) -> tuple[str, ...]:
    base = (keys.SUCCESS, keys.TASK_ID, keys.FINISH_STEP, keys.RESPONSE_MASK)
    return (*base, keys.OBS) if embeds_trajectories(config) else base


def _reward_resources(config, node_config) -> tuple[str, ...]:
    return ("trajectory_encoder",) if embeds_trajectories(config) else ()


def reward_fits(config, node_config, dp_size: int, world_size: int):
    """Plan-time: the trajectory encoder fits the policy (:func:`encoder_fits_policy`), and the
    overlong buffer the episodes' budget (:func:`overlong_buffer_fits`)."""
    return encoder_fits_policy(config) or overlong_buffer_fits(config, node_config, dp_size, world_size)


def encoder_fits_policy(config):
    """Plan-time: an encoder that reads the policy's vision backbone (``frame_features``, as
    ``policy_backbone`` does) needs a policy class that has one; the workers found it at their
    first step before, as a Ray traceback."""
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    name = config.algorithm.trajectory_encoder
    if not embeds_trajectories(config) or "frame_features" not in TRAJECTORY_ENCODERS.traits(name).runtime:
        return None
    from policies import POLICIES

    if hasattr(POLICIES.get(config.policy.name), "frame_features"):
        return None
    return "algorithm.trajectory_encoder", (f"{name!r} embeds episodes with the policy's vision backbone "
                                            f"(frame_features); policy {config.policy.name!r} has none: use "
                                            "state_resample, or vjepa2 for camera observations")


def overlong_buffer_fits(config, node_config, dp_size: int, world_size: int):
    """Plan-time: DAPO's overlong buffer (``algorithm.overlong_buffer.len``) fits in a sample's
    budget, the ``max_length`` of :func:`~vla_rl.algorithms.rewards.overlong_penalty`: an episode's
    decision steps (``ceil(horizon / actions per decision)``) or ``text.max_response_length``
    tokens; the reward refuses a longer one, which it would find at the first step."""
    length = config.algorithm.overlong_buffer.len
    if length == 0:
        return None
    from vla_rl.dag.registry import WORKFLOWS

    budget = WORKFLOWS.get(config.run.workflow).step_shape(config).decisions
    if length <= budget:
        return None
    unit = ("tokens (text.max_response_length)" if config.run.workflow == "text" else
            "decision steps of an episode (simulator.env.horizon over the policy's actions per decision)")
    return "algorithm.overlong_buffer.len", (f"algorithm.overlong_buffer.len={length} is longer than the {budget} "
                                             f"{unit}; the buffer is the last part of that budget")


@register_node("reward", "compute", reads=_reward_reads, writes=(keys.REWARDS,), resources=_reward_resources,
               check=reward_fits)
def compute_rewards(ctx, batch) -> NodeOutput:
    """Set ``rewards`` ``(n,)`` float32 from ``algorithm.reward``, plus DAPO's overlong penalty
    when ``algorithm.overlong_buffer.len > 0``.

    With SRPO the reference successes are, by ``algorithm.srpo.reference_set``, every success of
    the step (``step``: at DP size > 1 the shards exchange their successes' embeddings and a few
    distances, :func:`step_reference`, and score their failures as the whole step would) or only
    this node's shard's (``local``).
    """
    algo = ctx.config.algorithm
    encoder = ctx.resources.trajectory_encoder if embeds_trajectories(ctx.config) else None
    step_wide = EMBODIED_REWARDS.traits(algo.reward).step_reference and algo.options("reward").reference_set == "step"
    shards = step_reference(ctx) if step_wide and ctx.dp_size > 1 else None
    rewards, metrics = episode_rewards(algo, batch, encoder, shards)
    batch.set(keys.REWARDS, rewards)
    return NodeOutput(batch, metrics)


def trajectory_embeddings(algo, batch: TensorDict, encoder) -> Tensor:
    """Embed each episode's observations up to its terminal one (``finish_step + 1`` of them).

    State encoders read the state (the flat observation, or ``obs/state``); frame encoders
    (``encoder.reads_frames``) read the frames of their config's ``camera``
    (``<camera>_image``). The number of points is the encoder config's ``points``.

    Returns:
        ``(n, dim)`` embeddings.

    Raises:
        ValueError: a frame encoder on observations without that camera.
    """
    options = algo.options("trajectory_encoder")
    obs, lengths = batch[keys.OBS], batch[keys.FINISH_STEP] + 1
    if getattr(encoder, "reads_frames", False):
        image_key = f"{options.camera}{keys.OBS_IMAGE_SUFFIX}"
        if not isinstance(obs, TensorDict) or image_key not in obs.keys():
            found = sorted(obs.keys()) if isinstance(obs, TensorDict) else "a flat state"
            raise ValueError(f"algorithm.trajectory_encoder {algo.trajectory_encoder!r} reads {image_key!r} frames, "
                             f"but the observations hold {found}; add the camera to simulator.env.cameras or set "
                             f"algorithm.{algo.trajectory_encoder}.camera")
        return encoder(obs[image_key], lengths, num_points=options.points)
    states = obs[keys.OBS_STATE] if isinstance(obs, TensorDict) else obs
    return encoder(states, lengths, num_points=options.points)


def step_reference(ctx) -> SRPOShards:
    """How the reward node's DP shards share SRPO's reference set, the whole step's successes:
    every shard all-gathers its successes' embeddings and task ids (never its failures'; one
    replica per shard counts), and each task's nearest and farthest failure distance over every
    shard (a few numbers), so each shard scores its failures as the whole step would."""
    owners = ctx.world_size // ctx.dp_size  # rank k * owners holds shard k

    def gather_successes(points: np.ndarray, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        parts = all_gather_objects((points.astype(np.float32), tasks), ctx.group, tag="srpo_reference")
        shards = parts[::owners]
        return (np.concatenate([p for p, _ in shards]).astype(np.float64).reshape(-1, points.shape[1]),
                np.concatenate([t for _, t in shards]))

    def reduce_spans(spans: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
        merged: dict[int, tuple[float, float]] = {}
        for shard in all_gather_small_objects(spans, ctx.group, tag="srpo_reference")[::owners]:
            for task, (nearest, farthest) in shard.items():
                low, high = merged.get(task, (nearest, farthest))
                merged[task] = (min(low, nearest), max(high, farthest))
        return merged

    return SRPOShards(gather_successes, reduce_spans)


def episode_rewards(algo, batch: TensorDict, encoder=None, shards: SRPOShards | None = None
                    ) -> tuple[torch.Tensor, dict]:
    """The rewards ``(n,)`` float32 of the episodes of ``batch`` and their metrics.

    Args:
        algo: the run's ``algorithm`` section.
        batch: episodes with ``success``, ``task_id``, ``finish_step``, ``response_mask``, and
            ``obs`` for rewards that embed episodes.
        encoder: the trajectory encoder (the ``trajectory_encoder`` resource) of such rewards.
        shards: for rewards that compare an episode with the whole step, how this node's DP shards
            share what they need (:func:`step_reference`); None: the batch is the reference.

    Returns:
        The rewards, and ``reward/mean`` (the rewards trained on: with the overlong penalty),
        ``reward/failure_mean`` (the reward function's mean over the failures, before the
        overlong penalty: the partial credit a progress reward such as SRPO's gives them) and,
        with overlong shaping, ``reward/overlong_penalty``.
    """
    embeddings = None
    if encoder is not None:
        embeddings = trajectory_embeddings(algo, batch, encoder)
    reward_fn = EMBODIED_REWARDS.get(algo.reward)
    extra = {} if shards is None else {"shards": shards}
    rewards = reward_fn(embeddings, batch[keys.SUCCESS], batch[keys.TASK_ID], algo.options("reward"), **extra).float()
    failures = ~batch[keys.SUCCESS]
    metrics = {}
    if failures.any():
        metrics["reward/failure_mean"] = mean(rewards[failures].mean(), int(failures.sum()))
    if algo.overlong_buffer.len > 0:
        penalty = overlong_penalty(batch[keys.FINISH_STEP], batch[keys.RESPONSE_MASK].shape[1],
                                   algo.overlong_buffer.len, algo.overlong_buffer.penalty_factor)
        rewards = rewards + penalty
        metrics["reward/overlong_penalty"] = float(penalty.mean())
    metrics["reward/mean"] = float(rewards.mean())
    return rewards, metrics
