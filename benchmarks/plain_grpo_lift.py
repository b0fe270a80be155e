"""The plain PPO/GRPO loop of ../shared/MACHINE_FACTS.md ("Learning on Lift"), written without the
engine, on the engine's own MLP policy, robosuite Lift environment and behaviour-cloning warm
start: the baseline that tells a learning problem of the recipe from one of the engine (issue 26).

One process, no Ray. Per step: ``--states`` initial states x 8 rollouts (horizon 100, an episode
ends at success), binary success rewards, groups without variance dropped, GRPO advantages
``(r - mean) / std`` (unbiased std, per group), the PPO clipped loss (0.2 / 0.28, dual-clip at 3
as verl's) at the action's ratio averaged per episode, 4 epochs x 4 minibatches, Adam 3e-4, gradient-norm clip 1.0. The
warm start is the engine's: :func:`vla_rl.trainers.warm_start.behaviour_cloning` on the first 2
demonstrations of a run's ``demos.zarr``, after ``torch.manual_seed(seed)``.

    python benchmarks/plain_grpo_lift.py --demos RUN_DIR/demos.zarr --seed 2 --steps 12 \
        [--fixed-states] --out /tmp/plain_grpo_lift.json

``--fixed-states``: the same initial states every step (ids 0 .. states - 1), a check that the
update improves the policy where it was trained. Prints one line per step (training success,
kept groups, approximate KL, policy std, seconds) and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

GROUP_SIZE, HORIZON, EPOCHS, MINIBATCHES = 8, 100, 4, 4
LR, CLIP_LOW, CLIP_HIGH, MAX_GRAD_NORM = 3e-4, 0.2, 0.28, 1.0
DUAL_CLIP_C = 3.0


def warm_start(demos: Path, seed: int, obs_std_floor: float):
    """The engine's warm start: an MLP policy cloned on the store's first 2 demonstrations, each
    state feature's scale floored at ``obs_std_floor`` (``warm_start.obs_std_floor``)."""
    from policies.mlp import MLPPolicy, MLPPolicyConfig
    from vla_rl.data.trajectory_store import TrajectoryStore
    from vla_rl.trainers.warm_start import behaviour_cloning, demonstrations

    obs, actions = demonstrations(TrajectoryStore.open(demos, read_only=True), 2, 1)
    torch.manual_seed(seed)
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=obs.shape[1], action_dim=actions.shape[-1]))
    behaviour_cloning(policy, obs, actions, steps=1500, lr=1e-3, batch_size=256, seed=seed,
                      obs_std_floor=obs_std_floor)
    return policy


def rollout_group(policy, envs, state_id: int, generator: torch.Generator):
    """``len(envs)`` sampled episodes from initial state ``state_id``: per episode its
    observations ``(T, obs_dim)``, actions ``(T, action_dim)`` and log-probs ``(T,)``, and the
    ``(len(envs),)`` bool successes."""
    obs = np.stack([env.reset(seed=state_id)[0] for env in envs])
    episodes = [([], [], []) for _ in envs]
    done = np.zeros(len(envs), dtype=bool)
    success = np.zeros(len(envs), dtype=bool)
    for _ in range(HORIZON):
        live = np.flatnonzero(~done)
        if len(live) == 0:
            break
        actions, log_probs = policy.sample_actions(torch.as_tensor(obs[live], dtype=torch.float32),
                                                   generator=generator)
        for row, i in enumerate(live):
            episodes[i][0].append(torch.tensor(obs[i], dtype=torch.float32))  # a copy: obs is overwritten
            episodes[i][1].append(actions[row, 0])
            episodes[i][2].append(log_probs[row, 0])
            obs[i], _, terminated, truncated, info = envs[i].step(actions[row, 0].numpy())
            success[i] = bool(info.get("success", False))
            done[i] = success[i] or terminated or truncated
    return [tuple(torch.stack(part) for part in episode) for episode in episodes], success


def episode_loss(policy, episode, advantage: float) -> tuple[torch.Tensor, float]:
    """The clipped loss of one episode (mean over its steps) and its approximate KL (k3, mean
    over its steps); ``episode`` is ``(obs (T, obs_dim), actions (T, action_dim), old_log_probs (T,))``."""
    obs, actions, old_log_probs = episode
    log_probs = policy.log_prob_and_entropy_per_dim(obs, actions[:, None, :])[0].sum(-1)[:, 0]  # (T,)
    log_ratio = log_probs - old_log_probs
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH)
    loss = torch.maximum(-advantage * ratio, -advantage * clipped)
    if advantage < 0:  # dual-clip: the loss is at most -A * c (verl's clip_ratio_c)
        loss = torch.clamp(loss, max=-advantage * DUAL_CLIP_C)
    loss = loss.mean()
    return loss, float((torch.expm1(log_ratio) - log_ratio).mean().detach())


def update(policy, optimizer, episodes, advantages, generator: torch.Generator) -> float:
    """4 epochs x 4 minibatches of the clipped loss, averaged per episode; the mean approximate
    KL (k3) of the minibatches."""
    kls = []
    for _ in range(EPOCHS):
        for minibatch in torch.tensor_split(torch.randperm(len(episodes), generator=generator), MINIBATCHES):
            if len(minibatch) == 0:
                continue
            losses = []
            for k in minibatch.tolist():
                loss, kl = episode_loss(policy, episodes[k], advantages[k])
                losses.append(loss)
                kls.append(kl)
            optimizer.zero_grad(set_to_none=True)
            torch.stack(losses).mean().backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), MAX_GRAD_NORM)
            optimizer.step()
    return float(np.mean(kls)) if kls else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", type=Path, required=True, help="a run directory's demos.zarr")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--states", type=int, default=8, help="initial states per step")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--obs-std-floor", type=float, default=0.1, help="warm_start.obs_std_floor")
    parser.add_argument("--fixed-states", action="store_true", help="the same initial states every step")
    parser.add_argument("--init-std", default=None,
                        help="comma-separated initial std per action dimension (default: the policy's 0.2 each)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from simulators.robosuite_env import RobosuiteEnv, RobosuiteEnvConfig

    torch.set_num_threads(1)
    policy = warm_start(args.demos, args.seed, args.obs_std_floor)
    if args.init_std is not None:
        with torch.no_grad():
            policy.log_std.copy_(torch.tensor([float(v) for v in args.init_std.split(",")]).log())
    envs = [RobosuiteEnv(RobosuiteEnvConfig(horizon=HORIZON)) for _ in range(GROUP_SIZE)]
    optimizer = torch.optim.Adam(policy.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    rows = []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        ids = np.arange(args.states) if args.fixed_states else rng.integers(0, 10**6, args.states)
        episodes, advantages, successes = [], [], 0
        for state_id in ids.tolist():
            group, success = rollout_group(policy, envs, state_id, generator)
            successes += int(success.sum())
            if success.min() == success.max():
                continue  # no variance: no signal
            rewards = success.astype(np.float64)
            advantages += ((rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)).tolist()
            episodes += group
        kl = update(policy, optimizer, episodes, advantages, generator)
        row = {"step": step, "success_rate": successes / (GROUP_SIZE * args.states),
               "kept_groups": len(episodes) // GROUP_SIZE, "approx_kl": kl,
               "action_std": float(policy.action_std().detach().mean()),
               "seconds": time.perf_counter() - start}
        rows.append(row)
        print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "steps": rows}, indent=1))


if __name__ == "__main__":
    main()
