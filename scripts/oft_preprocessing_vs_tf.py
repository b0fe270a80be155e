"""OpenVLA-OFT's LIBERO image preparation here (policies/openvla/image_preprocessing.py) against
TensorFlow's own (``resize_image_for_policy`` then ``center_crop_image`` of moojink/openvla-oft's
``experiments/robot/openvla_utils.py``), on robosuite camera frames and a noise image, stage by
stage: the JPEG round trip, the Lanczos-3 resize and the centre crop each from TensorFlow's input,
then the whole chain. TensorFlow is not a dependency; install it beside the project::

    .venv/bin/pip install --target /tmp/tf_site tensorflow-cpu==2.21.0
    PYTHONPATH=/tmp/tf_site .venv/bin/python scripts/oft_preprocessing_vs_tf.py \
        --out outputs/oft_preprocessing_vs_tf.json

Prints, per image and stage, the largest and mean absolute difference (levels of 255) and the
share of pixels that differ; writes the same as JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.openvla.image_preprocessing import (  # noqa: E402
    CENTER_CROP_SCALE,
    JPEG_QUALITY,
    center_crop,
    jpeg_round_trip,
    lanczos_resize,
)

SIZE = 224  # OPENVLA_IMAGE_SIZE


def robosuite_frames(seeds: int, size: int) -> dict[str, np.ndarray]:
    """Agentview and wrist frames of robosuite's Lift after 5 random steps, one scene per seed,
    rows flipped upright as LIBERO's observations are."""
    import robosuite

    frames = {}
    for seed in range(seeds):
        env = robosuite.make("Lift", robots="Panda", has_renderer=False, has_offscreen_renderer=True,
                             use_camera_obs=True, camera_names=["agentview", "robot0_eye_in_hand"],
                             camera_heights=size, camera_widths=size, seed=seed)
        env.reset()
        rng = np.random.default_rng(seed)
        for _ in range(5):
            obs, *_ = env.step(rng.uniform(-1, 1, env.action_dim))
        frames[f"lift_seed{seed}_agentview"] = obs["agentview_image"][::-1].copy()
        frames[f"lift_seed{seed}_wrist"] = obs["robot0_eye_in_hand_image"][::-1].copy()
        env.close()
    return frames


def tensorflow_stages(image: np.ndarray) -> dict[str, np.ndarray]:
    """The reference's three stages, each on the previous one's output."""
    import tensorflow as tf

    jpeg = tf.io.decode_image(tf.image.encode_jpeg(image, quality=JPEG_QUALITY), expand_animations=False,
                              dtype=tf.uint8)
    resized = tf.image.resize(jpeg, (SIZE, SIZE), method="lanczos3", antialias=True)
    resized = tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
    floats = tf.image.convert_image_dtype(resized, tf.float32)[None]
    side = tf.reshape(tf.clip_by_value(tf.sqrt(CENTER_CROP_SCALE), 0, 1), (1,))
    offset = (1 - side) / 2
    boxes = tf.stack([offset, offset, offset + side, offset + side], axis=1)
    cropped = tf.image.crop_and_resize(floats, boxes, tf.range(1), (SIZE, SIZE))[0]
    cropped = tf.image.convert_image_dtype(tf.clip_by_value(cropped, 0, 1), tf.uint8, saturate=True)
    return {"jpeg": jpeg.numpy(), "resize": resized.numpy(), "crop": cropped.numpy()}


def difference(ours: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    gap = np.abs(ours.astype(np.int64) - reference.astype(np.int64))
    return {"max": int(gap.max()), "mean": round(float(gap.mean()), 4),
            "pixels_differing_pct": round(float(np.mean(gap.max(axis=-1) > 0) * 100), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="robosuite scenes (2 cameras each)")
    parser.add_argument("--camera-size", type=int, default=256, help="rendered side (LIBERO's reference: 256)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file of the results")
    args = parser.parse_args()
    # rendered in a process of their own: TensorFlow and MuJoCo's renderer in one process segfault
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        images = pool.submit(robosuite_frames, args.seeds, args.camera_size).result()
    import tensorflow as tf
    images["noise"] = np.random.default_rng(0).integers(0, 256, (args.camera_size, args.camera_size, 3), np.uint8)
    results = {}
    for name, image in images.items():
        ref = tensorflow_stages(image)
        results[name] = {
            "jpeg": difference(jpeg_round_trip(image), ref["jpeg"]),
            "resize": difference(lanczos_resize(ref["jpeg"], SIZE), ref["resize"]),
            "crop": difference(center_crop(ref["resize"]), ref["crop"]),
            "whole": difference(center_crop(lanczos_resize(jpeg_round_trip(image), SIZE)), ref["crop"]),
        }
    print(f"{'image':28s} " + " ".join(f"{stage:>26s}" for stage in ("jpeg", "resize", "crop", "whole")))
    for name, stages in results.items():
        cells = [f"max {s['max']:3d} mean {s['mean']:.4f} {s['pixels_differing_pct']:6.2f}%" for s in stages.values()]
        print(f"{name:28s} " + " ".join(f"{cell:>26s}" for cell in cells))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"tensorflow": tf.__version__, "camera_size": args.camera_size,
                                        "results": results}, indent=1))


if __name__ == "__main__":
    main()
