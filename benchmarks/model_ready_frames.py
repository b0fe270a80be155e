"""Seconds of π0's behaviour cloning and RL update with the camera frames prepared once
(``Policy.model_ready_observations``) against the baseline of the same run: the frames resized
and padded in every pass that reads them (the policy's ``model_ready_observations`` replaced by
the identity, as before).

Parts (the tiny π0 of the π0 Lift templates, ``dag_templates/bases/pi0_lift.yaml``; one camera;
each the median of ``--repeats`` calls after one untimed call):

- ``pi0_lift_behaviour_cloning``: ``behaviour_cloning`` on ``--transitions`` demonstrated
  transitions of 128 px frames (the template: about 450), ``--bc-steps`` steps of 32 (the
  template: 600 steps; each step reads 32 frames);
- ``pi0_lift_update``: ``ActorTrainer.update`` of ``--episodes`` episodes of ``--decisions``
  decisions, 128 px frames -> 56 px, the template's trainer (2 epochs of minibatches of 8
  episodes, action ratios);
- ``pi0_libero_frames_update``: the same update with 256 px frames and a 224 px SigLIP input
  (a LIBERO checkpoint's sizes, the tiny model's widths).

    python benchmarks/model_ready_frames.py --out benchmarks/model_ready_frames.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tensordict import TensorDict

from policies import make_policy
from policies.base import Policy
from policies.pi0 import PI0PolicyConfig
from policies.pi0.policy_pi0 import PI0Policy
from vla_rl.config import AlgorithmSection, TrainerSection
from vla_rl.trainers.actor import ActorTrainer
from vla_rl.trainers.warm_start import behaviour_cloning
from vla_rl_core import keys
from vla_rl_core.observations import encode_instruction

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline_table import parse_arguments, report, seconds  # noqa: E402  (after the path above)

#: The π0 Lift templates' tiny π0 (dag_templates/bases/pi0_lift.yaml); ``image_size`` per part.
VISION = {"patch_size": 14, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}


def pi0(image_size: int) -> PI0Policy:
    torch.manual_seed(0)
    architecture = {"preset": "tiny", "max_action_dim": 7, "max_state_dim": 11, "chunk_size": 8,
                    "vision": {**VISION, "image_size": image_size}}
    return make_policy("pi0", PI0PolicyConfig(architecture=architecture, cameras=("agentview",), proprio_dim=11,
                                              action_dim=7, sampler="flow_sde", noise_level=0.3))


def observations(shape: tuple[int, ...], size: int) -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    count = int(np.prod(shape))
    codes = torch.from_numpy(np.stack([encode_instruction("lift the cube")] * count)).unflatten(0, shape)
    return TensorDict({keys.OBS_STATE: torch.randn(*shape, 15, generator=generator),
                       f"agentview{keys.OBS_IMAGE_SUFFIX}": torch.randint(0, 256, (*shape, size, size, 3),
                                                                          dtype=torch.uint8, generator=generator),
                       keys.OBS_INSTRUCTION: codes}, batch_size=list(shape))


def update_batch(policy: PI0Policy, episodes: int, decisions: int, size: int) -> TensorDict:
    """A rollout's batch: every episode runs all ``decisions`` (the response mask all True) and
    every action of them."""
    obs = observations((episodes, decisions + 1), size)
    with torch.no_grad():
        actions, log_probs = policy.sample_actions(obs[:, :-1].reshape(-1), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(episodes, decisions, dtype=torch.bool)
    return TensorDict({keys.OBS: obs, keys.ACTIONS: actions.unflatten(0, (episodes, decisions)),
                       keys.OLD_LOG_PROBS: log_probs.unflatten(0, (episodes, decisions)), keys.RESPONSE_MASK: mask,
                       keys.CONTROL_STEPS: torch.full((episodes,), decisions * policy.chunk_size),
                       keys.ADVANTAGES: torch.randn(episodes, decisions, generator=torch.Generator().manual_seed(2)),
                       keys.UID: torch.arange(episodes) // 4}, batch_size=[episodes])


def both(call, repeats: int) -> dict[str, list[float]]:
    """``call`` timed with the frames resized in every pass (baseline), then prepared once."""
    out = {}
    prepared = PI0Policy.model_ready_observations
    try:
        PI0Policy.model_ready_observations = Policy.model_ready_observations  # the identity
        out["every_pass"] = seconds(call, repeats)
    finally:
        PI0Policy.model_ready_observations = prepared
    out["prepared_once"] = seconds(call, repeats)
    return out


def behaviour_cloning_part(args) -> dict[str, list[float]]:
    policy = pi0(56)
    obs = observations((args.transitions,), 128)
    actions = torch.rand(args.transitions, policy.bc_chunk_size, 7, generator=torch.Generator().manual_seed(3))
    return both(lambda: behaviour_cloning(policy, obs, actions, steps=args.bc_steps, lr=1e-4, batch_size=32, seed=0,
                                          obs_std_floor=0.1), args.repeats)


def update_part(args, frame_size: int, image_size: int) -> dict[str, list[float]]:
    policy = pi0(image_size)
    batch = update_batch(policy, args.episodes, args.decisions, frame_size)
    algorithm = AlgorithmSection(policy_loss="ppo_clip", ratio_granularity="action", entropy_coeff=0.0,
                                 use_kl_loss=False)
    trainer_section = TrainerSection(ppo_epochs=2, ppo_mini_batch_size=8, max_grad_norm=1.0)
    trainer = ActorTrainer(policy, lr=1e-6)
    return both(lambda: trainer.update(batch, algorithm, trainer_section, torch.Generator().manual_seed(4)),
                args.repeats)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=450)
    parser.add_argument("--bc-steps", type=int, default=60)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--decisions", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a DAG worker on 2 cores: 1)")
    parser.add_argument("--out", type=Path, default=None)
    args = parse_arguments(parser, argv, ("transitions", "bc_steps", "episodes", "decisions", "repeats", "threads"))
    torch.set_num_threads(args.threads)
    # a one-process group on loopback, as a local run's DAG worker's (a file store: no socket of its
    # own; gloo's listener pinned to lo, else it listens where GLOO_SOCKET_IFNAME or the host name says)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    with tempfile.TemporaryDirectory() as scratch:
        dist.init_process_group("gloo", store=dist.FileStore(f"{scratch}/store", 1), rank=0, world_size=1)
        try:
            parts = {"pi0_lift_behaviour_cloning": behaviour_cloning_part(args),
                     "pi0_lift_update": update_part(args, 128, 56),
                     "pi0_libero_frames_update": update_part(args, 256, 224)}
        finally:
            dist.destroy_process_group()
    return report(parts, "every_pass", "frames",
                  f"π0 camera frames prepared once vs in every pass, median of {args.repeats} calls, "
                  f"{torch.get_num_threads()} torch thread(s)", args)


if __name__ == "__main__":
    main()
