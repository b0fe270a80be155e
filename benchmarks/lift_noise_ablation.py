"""Held-out Lift success of a trained MLP policy with its Gaussian noise on chosen action
dimensions only: greedy (no noise), every dimension, position and gripper, rotation only. Tells
how much of the gap between sampled and greedy success comes from noise the compact state cannot
observe (the gripper's orientation). One process, one environment (issue 26,
docs/seeds/embodied_srpo/diagnosis.md).

    python benchmarks/lift_noise_ablation.py RUN/checkpoints/step_00000040 --states 30

Initial states are the held-out evaluation's first ids (``eval.init_state_offset``'s default,
1,000,000,000 on); the noise is the policy's own std per dimension, drawn from ``--seed``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

HELD_OUT_OFFSET = 1_000_000_000
MASKS = {  # OSC_POSE: 3 position deltas, 3 rotation deltas, the gripper
    "greedy": [0, 0, 0, 0, 0, 0, 0],
    "every dimension": [1, 1, 1, 1, 1, 1, 1],
    "position and gripper": [1, 1, 1, 0, 0, 0, 1],
    "rotation only": [0, 0, 0, 1, 1, 1, 0],
}


def success_rate(policy, env, states: list[int], mask: np.ndarray, rng: np.random.Generator) -> float:
    """Fraction of ``states`` whose episode succeeds with the policy's mean action plus its noise
    on the dimensions where ``mask`` is 1."""
    std = policy.action_std().detach().numpy()
    successes = 0
    for state in states:
        obs, _ = env.reset(seed=state)
        while True:
            with torch.no_grad():
                mean = policy.action_mean(torch.as_tensor(obs[None], dtype=torch.float32))[0].numpy()
            obs, _, terminated, truncated, info = env.step(mean + std * rng.standard_normal(len(mean)) * mask)
            if info.get("success") or terminated or truncated:
                successes += bool(info.get("success"))
                break
    return successes / len(states)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint directory holding model.safetensors")
    parser.add_argument("--states", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    from safetensors.torch import load_file

    from policies.mlp import MLPPolicy, MLPPolicyConfig
    from simulators.robosuite_env import RobosuiteEnv, RobosuiteEnvConfig

    weights = load_file(args.checkpoint / "model.safetensors")
    layers = sorted((int(name.split(".")[1]), w.shape[0]) for name, w in weights.items()
                    if name.startswith("mean_net.") and name.endswith(".weight"))
    hidden = tuple(width for _, width in layers[:-1])
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=weights["obs_mean"].shape[0], action_dim=weights["log_std"].shape[0],
                                       hidden_sizes=hidden))
    policy.load_state_dict(weights)
    policy.eval()
    env = RobosuiteEnv(RobosuiteEnvConfig())
    rng = np.random.default_rng(args.seed)
    states = list(range(HELD_OUT_OFFSET, HELD_OUT_OFFSET + args.states))
    rates = {name: success_rate(policy, env, states, np.asarray(mask, dtype=np.float32), rng)
             for name, mask in MASKS.items()}
    for name, rate in rates.items():
        print(f"{name:>22}: {rate:.0%} of {args.states}")
    if args.out is not None:
        args.out.write_text(json.dumps({"checkpoint": str(args.checkpoint), "states": args.states, "rates": rates},
                                       indent=1))


if __name__ == "__main__":
    main()
