"""SRPO world-progress reward (Fei et al. 2025, "SRPO: Self-Referential Policy Optimization for
Vision-Language-Action Models", arXiv 2511.15605, §3 "World Progress Reward Modeling").

The policy's own successful trajectories in the current batch are the reference: a failed
trajectory is rewarded by how close its latent world representation (a V-JEPA 2 video embedding
in the paper; any trajectory embedding here) lies to those of the successes of the same task.
For each task in the batch:

1. successes get reward 1;
2. the successes' embeddings are standardised per feature and clustered with DBSCAN; each
   cluster's centre is the mean of its members in embedding space (DBSCAN noise points are no
   centre; if every success is noise, the one centre is the mean of all successes);
3. each failure's distance is its minimum L2 distance to the centres,
   ``d_i = min_c ||h_i - c||_2``;
4. distances are min-max normalised over the task's failures, ``n_i = (d_i - d_min) /
   (d_max - d_min)`` (``n_i = 0.5`` for all when ``d_max - d_min`` is below a tolerance), and
   mapped through a scaled sigmoid, ``r_i = s * sigmoid(k * (b - n_i))``, so the closest failure
   gets the most reward and every failure stays strictly between 0 and 1.

Failures of a task with no success in the batch have no reference and get 0 (the binary reward).

The batch may be split over workers (the reward node's DP shards): with :class:`SRPOShards` the
shards exchange their successes' embeddings (never their failures') and each task's nearest and
farthest failure distance, and every shard scores its own failures exactly as the whole batch
scored at once would.

Sources. The paper gives steps 1-4 (DBSCAN on successful embeddings, L2 distance to the nearest
centre, normalisation and an activation into (0, 1), trajectory-level reward); the constants
below and the standardisation, noise fallback, degenerate-range and no-success rules are those of
the authors' reference implementation, siiRL's ``siirl/utils/reward_score/embodied.py``
(``StandardScaler`` + ``DBSCAN(eps=0.5, min_samples=2)``, ``0.6 * expit(10 * (0.5 - n))``).
DBSCAN (Ester et al. 1996) is written here on scipy's connected components, as scikit-learn is
not a dependency; see ``dbscan_cluster_labels`` for the one place it can differ. One rule of
siiRL's is not taken: it treats an all-zero embedding as its encoder's failure value (reward 0,
left out of the clustering and of the min-max range); here every embedding is a point, since the
encoders of :mod:`vla_rl.rewards.trajectory_encoders` raise on failure rather than return zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import cdist
from scipy.special import expit
from torch import Tensor


@dataclass(frozen=True)
class SRPORewardConfig:
    """Settings of the SRPO progress reward; defaults are those of the SRPO reference code.

    Attributes:
        dbscan_eps: DBSCAN neighbourhood radius, in standardised embedding units when
            ``standardize_embeddings`` is set (raw units otherwise); > 0.
        dbscan_min_samples: neighbours (the point itself included) a success needs within
            ``dbscan_eps`` to be a DBSCAN core point; >= 1.
        standardize_embeddings: z-score each embedding feature over the task's successes before
            clustering (scikit-learn ``StandardScaler`` semantics: population std, constant
            features left unscaled). Distances to the centres are always measured in raw
            embedding space.
        sigmoid_steepness: ``k`` in ``s * sigmoid(k * (b - n))``; > 0.
        sigmoid_offset: ``b``, the normalised distance at which the reward is ``s / 2``; in [0, 1].
        failure_reward_scale: ``s``, the supremum of a failure's reward; in (0, 1) so that a
            failure always earns less than a success.
        degenerate_range_tolerance: when the failures' distances span at most this (in raw
            embedding units), every failure gets normalised distance 0.5; >= 0 (0: only a span
            of exactly 0, a single failure's or equal distances).
        reference_set: the successes a failure is compared with: ``"local"``, those of the reward
            node's own shard (at DP size 1 already the whole step, gathered by the re-shard);
            ``"step"``, those of every shard, their embeddings gathered worker to worker
            (all_gather) when the reward node runs at DP size > 1 (the reward node reads it; the
            reward function itself scores whatever reference it is given).

    Raises:
        ValueError: from ``__post_init__`` when a field is out of range, or when the settings
            would let a failure's float32 reward round to 0 or 1.
    """

    dbscan_eps: float = 0.5
    dbscan_min_samples: int = 2
    standardize_embeddings: bool = True
    sigmoid_steepness: float = 10.0
    sigmoid_offset: float = 0.5
    failure_reward_scale: float = 0.6
    degenerate_range_tolerance: float = 1e-6
    reference_set: Literal["local", "step"] = "local"

    def __post_init__(self) -> None:
        if not (np.isfinite(self.dbscan_eps) and self.dbscan_eps > 0):
            raise ValueError(f"dbscan_eps must be a finite number > 0 (got {self.dbscan_eps}); "
                             "the SRPO default is 0.5")
        if self.dbscan_min_samples < 1:
            raise ValueError(f"dbscan_min_samples must be >= 1 (got {self.dbscan_min_samples}); "
                             "the SRPO default is 2")
        if not (np.isfinite(self.sigmoid_steepness) and self.sigmoid_steepness > 0):
            raise ValueError(f"sigmoid_steepness must be a finite number > 0 "
                             f"(got {self.sigmoid_steepness}); the SRPO default is 10")
        if not 0.0 <= self.sigmoid_offset <= 1.0:
            raise ValueError(f"sigmoid_offset must be in [0, 1] (got {self.sigmoid_offset}); "
                             "the SRPO default is 0.5")
        if not 0.0 < self.failure_reward_scale < 1.0:
            raise ValueError(f"failure_reward_scale must be in (0, 1) "
                             f"(got {self.failure_reward_scale}) so failures earn less than "
                             "successes; the SRPO default is 0.6")
        if self.degenerate_range_tolerance < 0:
            raise ValueError(f"degenerate_range_tolerance must be >= 0 "
                             f"(got {self.degenerate_range_tolerance}); the SRPO default is 1e-6")
        lowest = np.float32(self.failure_reward_scale
                            * expit(-self.sigmoid_steepness * (1.0 - self.sigmoid_offset)))
        highest = np.float32(self.failure_reward_scale
                             * expit(self.sigmoid_steepness * self.sigmoid_offset))
        if not 0.0 < lowest <= highest < 1.0:
            raise ValueError(f"with these settings failure rewards span [{lowest}, {highest}] in "
                             "float32, touching 0 or 1; lower sigmoid_steepness or "
                             "failure_reward_scale")


def standardize_features(points: np.ndarray) -> np.ndarray:
    """Z-score each column of ``points`` (population std), as scikit-learn's ``StandardScaler``.

    A column is constant, and only centred, when its std is within rounding of 0:
    ``std <= n * eps * |mean|`` (scikit-learn's ``_is_constant_feature`` rule).

    Args:
        points: (n, dim) float64, n >= 1.

    Returns:
        (n, dim) float64.
    """
    mean = points.mean(axis=0)  # (dim,)
    std = points.std(axis=0)  # (dim,)
    is_constant = std <= points.shape[0] * np.finfo(np.float64).eps * np.abs(mean)  # (dim,)
    return (points - mean) / np.where(is_constant, 1.0, std)


def dbscan_cluster_labels(points: np.ndarray, eps: float, min_samples: int) -> np.ndarray:
    """DBSCAN (Ester et al. 1996) cluster label of each point; -1 marks noise.

    A point is a core point when at least ``min_samples`` points (itself included) lie within
    Euclidean distance ``eps`` (inclusive, as scikit-learn). Clusters are the connected
    components of the core points under the ``eps``-neighbourhood relation; a non-core point
    within ``eps`` of a core point is a border point and joins the cluster of its nearest core
    point (scikit-learn joins the first cluster that reaches it, which depends on point order;
    the two agree unless a border point is within ``eps`` of two clusters' cores). Other points
    are noise.

    Args:
        points: (n, dim) float64.
        eps: neighbourhood radius, > 0.
        min_samples: core-point threshold, >= 1.

    Returns:
        (n,) int64 labels in ``{-1, 0, 1, ..., num_clusters - 1}``.
    """
    pairwise = cdist(points, points, "euclidean")  # (n, n)
    is_neighbour = pairwise <= eps  # (n, n), diagonal set
    is_core = is_neighbour.sum(axis=1) >= min_samples  # (n,)

    core_links = is_neighbour & is_core[:, None] & is_core[None, :]  # (n, n)
    _, component = connected_components(csr_matrix(core_links), directed=False)  # (n,)
    labels = np.full(points.shape[0], -1, dtype=np.int64)
    _, labels[is_core] = np.unique(component[is_core], return_inverse=True)

    if is_core.any():
        distance_to_core = np.where(is_core[None, :], pairwise, np.inf)  # (n, n)
        nearest_core = distance_to_core.argmin(axis=1)  # (n,)
        is_border = ~is_core & (distance_to_core.min(axis=1) <= eps)  # (n,)
        labels[is_border] = labels[nearest_core[is_border]]
    return labels


def success_cluster_centres(success_embeddings: np.ndarray, config: SRPORewardConfig) -> np.ndarray:
    """Reference centres of one task's successful embeddings (step 2 of the module docstring).

    Args:
        success_embeddings: (num_success, dim) float64, num_success >= 1.
        config: clustering settings.

    Returns:
        (num_centres, dim) float64: the mean of each DBSCAN cluster (found in standardised
        space, averaged in raw space), or the mean of all successes when DBSCAN finds only noise.
    """
    if config.standardize_embeddings:
        clustered_space = standardize_features(success_embeddings)
    else:
        clustered_space = success_embeddings
    labels = dbscan_cluster_labels(clustered_space, config.dbscan_eps, config.dbscan_min_samples)
    cluster_ids = np.unique(labels[labels >= 0])
    if cluster_ids.size == 0:
        return success_embeddings.mean(axis=0, keepdims=True)  # (1, dim)
    return np.stack([success_embeddings[labels == c].mean(axis=0) for c in cluster_ids])


def progress_rewards(failure_distances: np.ndarray, config: SRPORewardConfig,
                     span: tuple[float, float] | None = None) -> np.ndarray:
    """Map one task's failure-to-success distances to rewards in (0, 1) (step 4).

    Args:
        failure_distances: (num_failures,) float64, raw embedding units, num_failures >= 1.
        config: normalisation and activation settings.
        span: the (nearest, farthest) distance over all of the task's failures (other shards'
            included); None: those of ``failure_distances``.

    Returns:
        (num_failures,) float64: ``s * sigmoid(k * (b - n))`` with ``n`` the min-max normalised
        distance (0.5 everywhere when the distances span at most the tolerance).
    """
    nearest, farthest = span if span is not None else (failure_distances.min(), failure_distances.max())
    distance_range = farthest - nearest
    if distance_range <= config.degenerate_range_tolerance:  # 0 / 0 at a tolerance of 0 with one failure
        normalized = np.full_like(failure_distances, 0.5)
    else:
        normalized = (failure_distances - nearest) / distance_range
    activation = expit(config.sigmoid_steepness * (config.sigmoid_offset - normalized))
    return config.failure_reward_scale * activation


@dataclass(frozen=True)
class SRPOShards:
    """How the shards of a batch split over workers share what SRPO needs of each other.

    Attributes:
        gather_successes: ``(points (S, dim) float64, tasks (S,) int64) -> (points, tasks)`` of
            every shard's successes, shards in order (so that the reference set is the batch's,
            in the batch's order).
        reduce_spans: ``{task: (nearest, farthest)}`` of this shard's failures -> the same over
            every shard (tasks without a failure here included).
    """

    gather_successes: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    reduce_spans: Callable[[dict[int, tuple[float, float]]], dict[int, tuple[float, float]]]


def compute_srpo_rewards(
    embeddings: Tensor,
    success: Tensor,
    task_ids: Tensor,
    config: SRPORewardConfig,
    shards: SRPOShards | None = None,
) -> Tensor:
    """SRPO trajectory rewards: 1 for successes, a world-progress reward for failures.

    See the module docstring for the method (Fei et al. 2025, §3) and its sources. Each task id
    is handled on its own: a failure is compared only with the successes of its own task in this
    batch, and the normalisation in step 4 runs over that task's failures only.

    Args:
        embeddings: (batch, dim) float, one latent trajectory embedding per trajectory (e.g. a
            V-JEPA 2 video embedding, or ``vla_rl.rewards.trajectory_encoders`` output).
        success: (batch,) bool, whether each trajectory reached the goal.
        task_ids: (batch,) int64, the task of each trajectory.
        config: reward settings.
        shards: when ``embeddings`` is one shard of a batch split over workers, how the shards
            exchange successes and failure-distance spans (the module docstring); None: the
            batch is whole here.

    Returns:
        (batch,) float32 on ``success``' device (the batch's; the encoder may run elsewhere): exactly 1.0 for successes; for failures a
        value strictly inside (0, 1), larger for failures nearer the task's successes; exactly
        0.0 for failures of a task without any success in the batch.

    Raises:
        ValueError: on mismatched shapes or dtypes, or non-finite embeddings.
    """
    if embeddings.dim() != 2 or not embeddings.is_floating_point():
        raise ValueError(f"embeddings must be a (batch, dim) float tensor; got {embeddings.dtype} "
                         f"of shape {tuple(embeddings.shape)}")
    batch = embeddings.shape[0]
    if success.shape != (batch,) or success.dtype != torch.bool:
        raise ValueError(f"success must be a ({batch},) bool tensor; got {success.dtype} of shape "
                         f"{tuple(success.shape)}")
    if task_ids.shape != (batch,) or task_ids.dtype != torch.int64:
        raise ValueError(f"task_ids must be a ({batch},) int64 tensor; got {task_ids.dtype} of "
                         f"shape {tuple(task_ids.shape)}")
    if not torch.isfinite(embeddings).all():
        raise ValueError("embeddings contain NaN or inf; check the trajectory encoder")

    points = embeddings.detach().cpu().to(torch.float64).numpy()  # (B, dim)
    is_success = success.cpu().numpy()  # (B,)
    tasks = task_ids.cpu().numpy()  # (B,)
    rewards = np.where(is_success, 1.0, 0.0)  # (B,)
    reference_points, reference_tasks = points[is_success], tasks[is_success]  # (S, dim), (S,)
    if shards is not None:
        reference_points, reference_tasks = shards.gather_successes(reference_points, reference_tasks)
    distances: dict[int, np.ndarray] = {}  # task -> (F,) distances of this shard's failures
    for task in np.unique(tasks[~is_success]):
        reference = reference_points[reference_tasks == task]
        if len(reference):
            centres = success_cluster_centres(reference, config)  # (C, dim)
            distances[int(task)] = cdist(points[~is_success & (tasks == task)], centres, "euclidean").min(axis=1)
    spans = {task: (float(d.min()), float(d.max())) for task, d in distances.items()}
    if shards is not None:
        spans = shards.reduce_spans(spans)
    for task, task_distances in distances.items():
        rewards[~is_success & (tasks == task)] = progress_rewards(task_distances, config, spans[task])
    return torch.from_numpy(rewards).to(dtype=torch.float32, device=success.device)
