"""Where the time of an OpenVLA-OFT camera run on robosuite Lift goes, piece by piece, in one
process (no Ray, no engine): simulation with and without the 128x128 agentview camera, the tiny
policy's rollout forward, and its training forward + backward + Adam step. Prints a table and
writes JSON.

    flock /tmp/vla_heavy.lock python benchmarks/oft_lift_costs.py --out benchmarks/oft_lift_costs.json

Settings follow dag_templates/embodied_srpo_oft_lift.yaml: OSC_POSE, 128x128 agentview with
``fast_rendering``, the tiny OFT preset at image size 56, chunks of 8 actions, proprio 5.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def env_steps_per_s(config: dict, steps: int) -> float:
    """Control steps per second of one Lift environment under random actions (resets excluded)."""
    from simulators import make_env

    env = make_env("robosuite_lift", config)
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=0)
        elapsed = 0.0
        for _ in range(steps):
            start = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(rng.uniform(-1, 1, env.act_dim))
            elapsed += time.perf_counter() - start
            if terminated or truncated:
                env.reset(seed=1)
        return steps / elapsed
    finally:
        env.close()


def policy_costs(batch: int, minibatch: int, repeats: int, threads: int) -> dict:
    """Seconds of one rollout call (``batch`` observations) and one training minibatch of
    ``minibatch`` observations (forward, backward and Adam) of the template's tiny OFT."""
    import torch
    from tensordict import TensorDict

    from policies.openvla_oft import OpenVLAOFTPolicy, OpenVLAOFTPolicyConfig
    from vla_rl.data.observations import encode_instruction

    def camera_obs(n: int) -> TensorDict:  # simulator observations, random pixels and state
        code = torch.from_numpy(encode_instruction("lift the cube"))
        return TensorDict({"state": torch.randn(n, 11), "instruction": code.expand(n, -1).clone(),
                           "agentview_image": torch.randint(0, 256, (n, 128, 128, 3), dtype=torch.uint8)},
                          batch_size=[n])

    torch.set_num_threads(threads)
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "image_size": 56},
                                                     chunk_size=8, proprio_dim=5))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-4)
    timings = {"sample": [], "train": []}
    for repeat in range(repeats + 1):  # the first round warms up
        obs = camera_obs(batch)
        start = time.perf_counter()
        actions, _ = policy.sample_actions(obs)
        sample = time.perf_counter() - start
        train_obs = camera_obs(minibatch)
        train_actions, _ = policy.sample_actions(train_obs)
        start = time.perf_counter()
        log_probs, entropy = policy(train_obs, train_actions)
        (-(log_probs.sum()) - 0.01 * entropy.sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        train = time.perf_counter() - start
        if repeat:
            timings["sample"].append(sample)
            timings["train"].append(train)
    parameters = sum(p.numel() for p in policy.parameters())
    return {"parameters": parameters, "sample_s": float(np.median(timings["sample"])),
            "train_minibatch_s": float(np.median(timings["train"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="observations per rollout call")
    parser.add_argument("--minibatch", type=int, default=80, help="observations per training minibatch "
                        "(8 episodes x 10 decisions)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/oft_lift_costs.json"))
    args = parser.parse_args()

    state = env_steps_per_s({"horizon": 10_000}, args.env_steps)
    camera = env_steps_per_s({"horizon": 10_000, "cameras": ["agentview"], "camera_size": 128,
                              "fast_rendering": True}, args.env_steps)
    policy = policy_costs(args.batch, args.minibatch, args.repeats, args.threads)
    result = {
        "lift_state_steps_per_s": state,
        "lift_camera128_steps_per_s": camera,
        "rendering_ms_per_step": 1000 * (1 / camera - 1 / state),
        "physics_ms_per_step": 1000 / state,
        **{f"policy_{k}": v for k, v in policy.items()},
        "policy_sample_ms_per_observation": 1000 * policy["sample_s"] / args.batch,
        "settings": vars(args) | {"out": str(args.out)},
    }
    rows = [
        ("Lift, state only (one process)", f"{state:.1f} steps/s", f"{1000 / state:.1f} ms/step"),
        ("Lift, agentview 128x128, fast rendering", f"{camera:.1f} steps/s", f"{1000 / camera:.1f} ms/step"),
        ("  of which rendering", "", f"{result['rendering_ms_per_step']:.1f} ms/step"),
        (f"tiny OFT ({policy['parameters']:,} params): sample a chunk for {args.batch} obs", "",
         f"{1000 * policy['sample_s']:.1f} ms ({result['policy_sample_ms_per_observation']:.1f} ms/obs)"),
        (f"tiny OFT: train minibatch of {args.minibatch} obs (fwd+bwd+Adam)", "",
         f"{1000 * policy['train_minibatch_s']:.1f} ms"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, rate, cost in rows:
        print(f"{name:<{width}}  {rate:>14}  {cost:>22}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
