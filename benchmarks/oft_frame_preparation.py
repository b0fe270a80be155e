"""Seconds of OpenVLA-OFT's camera-frame preparation per forward pass: the simulator-observation
processor on ``--observations`` observations of ``--cameras`` cameras of ``--frame-size`` pixels,
with the OFT LIBERO recipe's settings (``image_resize: jpeg_lanczos3``, ``center_crop: true``:
JPEG round trip, Lanczos-3 resize to 224, centre crop; ``policies.openvla.image_preprocessing``).

Two parts, measured in the same run:

- ``every_pass`` (the baseline): the frames prepared in every call, as every forward pass of the
  policy did before the memo (the memo emptied before each call);
- ``memoised``: the frames prepared once already (``PreparedFrames``), as the rescoring, each
  epoch's passes and the reference's find them after the rollout's.

Prints a table with the memoised part's speed-up over the baseline, and writes JSON.

    python benchmarks/oft_frame_preparation.py --out benchmarks/oft_frame_preparation.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

import policies.openvla.processor_openvla as processor_module
from policies.openvla.processor_openvla import PREPARED_FRAMES_CAPACITY, PreparedFrames
from policies.openvla_oft import OpenVLAOFTPolicy, OpenVLAOFTPolicyConfig
from vla_rl_core.observations import encode_instruction

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.baseline_table import parse_arguments  # noqa: E402  (after the path above)

CAMERAS = ("agentview", "robot0_eye_in_hand")


def observations(count: int, cameras: int, size: int) -> TensorDict:
    """``count`` simulator observations of ``cameras`` random uint8 frames and one instruction."""
    generator = torch.Generator().manual_seed(0)
    frames = {f"{camera}_image": torch.randint(0, 256, (count, size, size, 3), dtype=torch.uint8, generator=generator)
              for camera in CAMERAS[:cameras]}
    codes = torch.from_numpy(np.stack([encode_instruction("put the bowl on the plate")] * count))
    return TensorDict({**frames, "instruction": codes}, batch_size=[count])


def seconds(call, repeats: int, before=None) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``call`` (``before()`` untimed before each)."""
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--observations", type=int, default=64)
    parser.add_argument("--cameras", type=int, choices=(1, 2), default=2)
    parser.add_argument("--frame-size", type=int, default=256, help="simulator frames' side in pixels")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a DAG worker on 2 cores: 1)")
    parser.add_argument("--out", type=Path, default=None)
    args = parse_arguments(parser, argv, ("observations", "frame_size", "repeats", "threads"))
    torch.set_num_threads(args.threads)
    config = OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "image_size": 224, "fused": False}, chunk_size=2,
                                    num_images=args.cameras, image_resize="jpeg_lanczos3", center_crop=True)
    process = OpenVLAOFTPolicy(config).processor
    obs = observations(args.observations, args.cameras, args.frame_size)

    def empty_memo() -> None:
        processor_module.PREPARED_FRAMES = PreparedFrames(PREPARED_FRAMES_CAPACITY)

    parts = {"every_pass": seconds(lambda: process(obs), args.repeats, before=empty_memo)}
    empty_memo()
    process(obs)  # the rollout's pass prepares them
    parts["memoised"] = seconds(lambda: process(obs), args.repeats)
    frames = args.observations * args.cameras
    result = {"settings": {**vars(args), "out": str(args.out) if args.out else None, "frames_per_call": frames,
                           "image_size": 224, "image_resize": "jpeg_lanczos3", "center_crop": True},
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "torch_threads": torch.get_num_threads()},
              "parts": {name: {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values),
                               "seconds": values} for name, values in parts.items()}}
    baseline = result["parts"]["every_pass"]["median_s"]
    result["parts"]["memoised"]["speedup_over_every_pass"] = baseline / result["parts"]["memoised"]["median_s"]
    print(f"OpenVLA-OFT frame preparation, {frames} frames of {args.frame_size} px per call, "
          f"median of {args.repeats} calls, {torch.get_num_threads()} torch thread(s)")
    print("| part | median s | min s | max s | ms per frame | speed-up |")
    print("|---|---|---|---|---|---|")
    for name, part in result["parts"].items():
        speedup = part.get("speedup_over_every_pass", 1.0)
        print(f"| {name} | {part['median_s']:.3f} | {part['min_s']:.3f} | {part['max_s']:.3f} | "
              f"{1e3 * part['median_s'] / frames:.2f} | {speedup:.1f}x |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
