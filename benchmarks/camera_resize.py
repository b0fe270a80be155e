"""Seconds of the camera frames' resize in every forward pass of π0 and OpenVLA, and of a tiny π0
update pass, with the 8-bit resize (``policies/image_resize.py``) against the float32 resize the
policies used before (the baseline, written out below), in the same run.

Parts (each the median of ``--repeats`` calls on ``--observations`` observations of one camera):

- ``pi0_resize_with_pad_<src>_to_<side>``: π0's ``resize_with_pad`` of ``src`` px frames: the
  π0 Lift templates' 128 -> 56 and a LIBERO checkpoint's 256 -> 224;
- ``openvla_towers_<src>_to_<side>``: the fused OpenVLA backbone's frames for its two towers
  (before: each tower resized them; now once for both), 256 -> 224;
- ``pi0_lift_update_pass``: the π0 Lift template's tiny policy (56 px SigLIP), log-probs and
  entropies of the observations and their backward pass, as an update's micro-batch runs them,
  with each resize in turn (the baseline patched into the processor).

Each part's ``float32`` row is the baseline; the ``uint8`` row gives its speed-up. The
accelerators' path (``resize_uint8_in_float``, two float passes) is not what runs on a CPU and is
not timed here.

    python benchmarks/camera_resize.py --out benchmarks/camera_resize.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict

import policies.pi0.processor_pi0 as processor_pi0
from policies import make_policy
from policies.image_resize import resize_uint8
from policies.pi0 import PI0PolicyConfig
from vla_rl_core import keys
from vla_rl_core.observations import encode_instruction

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline_table import parse_arguments, report, seconds  # noqa: E402  (after the path above)

#: The π0 Lift templates' tiny π0 (dag_templates/bases/pi0_lift.yaml).
PI0_LIFT = {"preset": "tiny", "max_action_dim": 7, "max_state_dim": 11, "chunk_size": 8,
            "vision": {"image_size": 56, "patch_size": 14, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                       "intermediate_size": 64}}


def float32_resize_with_pad(images: torch.Tensor, side: int) -> torch.Tensor:
    """The baseline: π0's ``resize_with_pad`` before the 8-bit resize (float32 interpolation)."""
    pixels = images.permute(0, 3, 1, 2).float() / 255.0
    height, width = pixels.shape[-2:]
    if (height, width) != (side, side):
        ratio = max(height / side, width / side)
        new_h, new_w = int(height / ratio), int(width / ratio)
        pixels = F.interpolate(pixels, size=(new_h, new_w), mode="bilinear", align_corners=False,
                               antialias=True).clamp(0.0, 1.0)
        pad_h, pad_w = side - new_h, side - new_w
        pixels = F.pad(pixels, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0.0)
    return pixels * 2.0 - 1.0


def float32_tower_frames(images: torch.Tensor, side: int, towers: int) -> list[torch.Tensor]:
    """The baseline: each of ``towers`` towers' float32 bicubic resize of the same frames."""
    pixels = images.permute(0, 3, 1, 2).float() / 255.0
    return [F.interpolate(pixels, size=(side, side), mode="bicubic", antialias=True).clamp(0.0, 1.0)
            for _ in range(towers)]


def uint8_tower_frames(images: torch.Tensor, side: int) -> torch.Tensor:
    """Now: one 8-bit resize for both towers, then the float conversion each tower normalises."""
    return resize_uint8(images.permute(0, 3, 1, 2), side, side, "bicubic").float() / 255.0


def frames(count: int, size: int) -> torch.Tensor:
    return torch.randint(0, 256, (count, size, size, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


def pi0_update_pass(count: int, repeats: int) -> dict[str, list[float]]:
    torch.manual_seed(0)
    policy = make_policy("pi0", PI0PolicyConfig(architecture=PI0_LIFT, cameras=("agentview",), proprio_dim=11,
                                                action_dim=7, sampler="flow_sde", noise_level=0.3))
    codes = torch.from_numpy(np.stack([encode_instruction("lift the cube")] * count))
    obs = TensorDict({keys.OBS_STATE: torch.randn(count, 15), f"agentview{keys.OBS_IMAGE_SUFFIX}": frames(count, 128),
                      keys.OBS_INSTRUCTION: codes}, batch_size=[count])
    with torch.no_grad():
        actions, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(0))

    def update_pass() -> None:
        log_probs, entropy = policy.log_prob_and_entropy(obs, actions)
        (log_probs.sum() + entropy.sum()).backward()

    out = {}
    for name, resize in (("float32", float32_resize_with_pad), ("uint8", processor_pi0.resize_with_pad)):
        saved = processor_pi0.resize_with_pad
        processor_pi0.resize_with_pad = resize
        try:
            out[name] = seconds(update_pass, repeats)
        finally:
            processor_pi0.resize_with_pad = saved
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observations", type=int, default=160,
                        help="observations per call (160: a π0 Lift step's 16 episodes of 10 decisions)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a DAG worker on 2 cores: 1)")
    parser.add_argument("--out", type=Path, default=None)
    args = parse_arguments(parser, argv, ("observations", "repeats", "threads"))
    torch.set_num_threads(args.threads)
    n = args.observations
    small, large = frames(n, 128), frames(n, 256)
    parts = {
        "pi0_resize_with_pad_128_to_56": {"float32": seconds(lambda: float32_resize_with_pad(small, 56), args.repeats),
                                          "uint8": seconds(lambda: processor_pi0.resize_with_pad(small, 56),
                                                           args.repeats)},
        "pi0_resize_with_pad_256_to_224": {"float32": seconds(lambda: float32_resize_with_pad(large, 224),
                                                              args.repeats),
                                           "uint8": seconds(lambda: processor_pi0.resize_with_pad(large, 224),
                                                            args.repeats)},
        "openvla_towers_256_to_224": {"float32": seconds(lambda: float32_tower_frames(large, 224, 2), args.repeats),
                                      "uint8": seconds(lambda: uint8_tower_frames(large, 224), args.repeats)},
        "pi0_lift_update_pass": pi0_update_pass(n, args.repeats),
    }
    return report(parts, "float32", "resize",
                  f"Camera resize per forward pass, {n} observations of one camera, median of {args.repeats} "
                  f"calls, {torch.get_num_threads()} torch thread(s)", args)


if __name__ == "__main__":
    main()
