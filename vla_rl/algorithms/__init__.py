"""vla_rl.algorithms: pure RL algorithm functions, each family behind a registry.

- ``advantages``: ``ADVANTAGE_ESTIMATORS`` (``"grpo"``, with Dr. GRPO as ``norm_by_std=False``).
- ``aggregation``: ``LOSS_AGG_MODES``, ``aggregate_loss``, ``masked_mean``.
- ``policy_loss``: ``POLICY_LOSSES`` (``"ppo_clip"`` with DAPO clip-higher).
- ``srpo``: SRPO world-progress reward (``SRPORewardConfig``, ``compute_srpo_rewards``).
- ``rewards``: ``EMBODIED_REWARDS`` (``"success"``, ``"srpo"``).

Modules are imported where used; importing this package loads none of them.
"""
