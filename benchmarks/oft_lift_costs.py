"""Where the time of an OpenVLA-OFT camera run on robosuite Lift goes, piece by piece, in one
process (no Ray, no engine): simulation without a camera, and with the agentview camera at each
size rendered every control step (the baseline) or once per chunk (what the simulator workers do:
``step_unobserved`` between observations), the tiny policy's rollout forward, and its training
forward + backward + Adam step, and the memory of ``--memory-envs`` camera environments in one
process. Prints a table (with each camera setting's speed against 128x128
rendered every step) and writes JSON.

    flock /tmp/vla_heavy.lock python benchmarks/oft_lift_costs.py --out benchmarks/oft_lift_costs.json

Settings follow dag_templates/embodied_srpo_oft_lift.yaml: OSC_POSE, agentview with
``fast_rendering``, the tiny OFT preset at image size 56, chunks of 8 actions, proprio 5.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

import numpy as np


def env_steps_per_s(config: dict, steps: int, observe_every: int = 1) -> float:
    """Control steps per second of one Lift environment under random actions (resets excluded),
    building the observation (rendering the cameras) every ``observe_every`` steps, as a simulator
    worker does for chunks of that many actions (``step_unobserved`` in between)."""
    from simulators import make_env

    env = make_env("robosuite_lift", config)
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=0)
        elapsed = 0.0
        for step in range(steps):
            action = rng.uniform(-1, 1, env.action_dim)
            start = time.perf_counter()
            if (step + 1) % observe_every == 0:
                _, _, terminated, truncated, _ = env.step(action)
            else:
                _, terminated, truncated, _ = env.step_unobserved(action)
            elapsed += time.perf_counter() - start
            if terminated or truncated:
                env.reset(seed=1)
        return steps / elapsed
    finally:
        env.close()


def camera_env_memory_mb(count: int) -> dict:
    """Resident memory (MiB) of ``count`` Lift environments with the 128x128 agentview camera in
    a fresh process, each reset and rendered once: after the first and after all, and the
    increment per environment beyond the first (what one more environment in a simulator actor
    costs; the first also brings the process's shared renderer)."""
    import psutil

    from simulators import make_env

    process = psutil.Process()
    start = process.memory_info().rss
    envs, after = [], {}
    for index in range(count):
        env = make_env("robosuite_lift", {"horizon": 80, "cameras": ["agentview"], "camera_size": 128,
                                          "fast_rendering": True})
        env.reset(seed=index)
        envs.append(env)
        after[index + 1] = (process.memory_info().rss - start) / 2**20
    for env in envs:
        env.close()
    return {"environments": count, "first_mb": after[1], "all_mb": after[count],
            "per_additional_env_mb": (after[count] - after[1]) / max(count - 1, 1)}


def policy_costs(batch: int, minibatch: int, repeats: int, threads: int) -> dict:
    """Seconds of one rollout call (``batch`` observations) and one training minibatch of
    ``minibatch`` observations (forward, backward and Adam) of the template's tiny OFT."""
    import torch
    from tensordict import TensorDict

    from policies.openvla_oft import OpenVLAOFTPolicy, OpenVLAOFTPolicyConfig
    from vla_rl_core.observations import encode_instruction

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
    parser.add_argument("--camera-sizes", type=int, nargs="+", default=[128, 64],
                        help="agentview sizes, pixels (128: the baseline, rendered every step)")
    parser.add_argument("--chunk", type=int, default=8, help="actions per chunk: steps per observation")
    parser.add_argument("--memory-envs", type=int, default=16, help="camera environments in the memory measurement")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the JSON record there (default: none; the tables are printed)")
    args = parser.parse_args()

    state = env_steps_per_s({"horizon": 10_000}, args.env_steps)
    cameras = {}  # (camera size, steps per observation) -> control steps/s
    for size in args.camera_sizes:
        for every in (1, args.chunk):
            cameras[size, every] = env_steps_per_s({"horizon": 10_000, "cameras": ["agentview"], "camera_size": size,
                                                    "fast_rendering": True}, args.env_steps, every)
    with multiprocessing.get_context("spawn").Pool(1) as pool:  # a fresh process: its own RSS
        memory = pool.apply(camera_env_memory_mb, (args.memory_envs,))
    policy = policy_costs(args.batch, args.minibatch, args.repeats, args.threads)
    baseline = cameras.get((128, 1))
    result = {
        "lift_state_steps_per_s": state,
        "physics_ms_per_step": 1000 / state,
        "camera_steps_per_s": [
            {"camera_size": size, "steps_per_observation": every, "steps_per_s": rate,
             "rendering_ms_per_step": 1000 * (1 / rate - 1 / state),
             "vs_128_every_step": rate / baseline if baseline else None}
            for (size, every), rate in cameras.items()
        ],
        "camera_env_memory": memory,
        **{f"policy_{k}": v for k, v in policy.items()},
        "policy_sample_ms_per_observation": 1000 * policy["sample_s"] / args.batch,
        "settings": vars(args) | {"out": str(args.out)},
    }
    rows = [("Lift, state only (one process)", f"{state:.1f} steps/s", f"{1000 / state:.1f} ms/step", "")]
    for entry in result["camera_steps_per_s"]:
        ratio = entry["vs_128_every_step"]
        size, every = entry["camera_size"], entry["steps_per_observation"]
        rows.append((f"Lift, agentview {size}x{size}, fast rendering, observed every {every} step(s)",
                     f"{entry['steps_per_s']:.1f} steps/s",
                     f"{entry['rendering_ms_per_step']:.1f} ms/step rendering", f"{ratio:.2f}x" if ratio else ""))
    rows.append((f"Lift with a 128x128 camera: memory of {memory['environments']} environments in one process",
                 f"{memory['all_mb']:.0f} MiB", f"{memory['per_additional_env_mb']:.0f} MiB per additional env", ""))
    rows += [
        (f"tiny OFT ({policy['parameters']:,} params): sample a chunk for {args.batch} obs", "",
         f"{1000 * policy['sample_s']:.1f} ms ({result['policy_sample_ms_per_observation']:.1f} ms/obs)", ""),
        (f"tiny OFT: train minibatch of {args.minibatch} obs (fwd+bwd+Adam)", "",
         f"{1000 * policy['train_minibatch_s']:.1f} ms", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'':<{width}}  {'rate':>14}  {'cost':>30}  {'vs 128 every step':>17}")
    for name, rate, cost, ratio in rows:
        print(f"{name:<{width}}  {rate:>14}  {cost:>30}  {ratio:>17}")
    if args.out is None:
        print("no JSON record written (give --out FILE to keep one)")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
