"""OpenVLA-OFT's LIBERO image preprocessing (``experiments/robot/openvla_utils.py``) against
hand-computed values: the centre-crop box and its bilinear resampling (``tf.image.crop_and_resize``
arithmetic), the antialiased Lanczos-3 kernel; and the JPEG round trip before it against
TensorFlow's (tests/fixtures/openvla/)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from policies.openvla.image_preprocessing import (
    CENTER_CROP_SCALE,
    center_crop,
    center_crop_box,
    jpeg_round_trip,
    lanczos_resize,
    resize_image_for_policy,
)


def row_ramp(size: int, step: int) -> np.ndarray:
    """uint8 ``(size, size, 3)`` whose row ``r`` holds ``r * step`` in every pixel and channel."""
    return np.repeat(np.repeat((np.arange(size) * step).astype(np.uint8)[:, None, None], size, 1), 3, 2)


def test_center_crop_box_keeps_0_9_of_the_area():
    offset, side = center_crop_box()
    assert CENTER_CROP_SCALE == 0.9
    assert side == pytest.approx(0.9486833, abs=1e-7) and side**2 == pytest.approx(0.9, abs=1e-6)
    assert offset == pytest.approx(0.0256583, abs=1e-7) and offset + side / 2 == pytest.approx(0.5, abs=1e-7)
    with pytest.raises(ValueError, match="crop_scale"):
        center_crop_box(1.5)


def test_center_crop_of_a_224_image_samples_rows_5_72_to_217_28():
    # Row r holds r: bilinear sampling of a linear ramp returns the source position itself, so
    # the output rows are floor(position * 255.5 / 255) with position = 0.0256583 * 223 + i * 0.9486833.
    out = center_crop(row_ramp(224, 1))
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert out[0, 0, 0] == 5  # 5.7218 -> 5.7330
    assert out[112, 0, 0] == 112  # 111.9743 -> 112.1939
    assert out[223, 0, 0] == 217  # 217.2782 -> 217.7042
    assert np.all(out == out[:, :1])  # the ramp has no column dependence: neither has its crop


def test_center_crop_of_a_10_pixel_ramp_matches_the_hand_computed_rows():
    out = center_crop(row_ramp(10, 20))[:, 3, 0]
    expected = [math.floor(20 * (0.0256583 * 9 + i * 0.9486833) * 255.5 / 255) for i in range(10)]
    assert out.tolist() == expected
    assert expected[0] == 4 and expected[5] == 99 and expected[9] == 175
    columns = center_crop(np.ascontiguousarray(row_ramp(10, 20).transpose(1, 0, 2)))
    assert columns[3, :, 0].tolist() == expected  # the same box along the columns


def test_center_crop_keeps_a_uniform_image_and_each_value():
    for value in (0, 1, 128, 254, 255):
        image = np.full((12, 12, 3), value, dtype=np.uint8)
        assert np.array_equal(center_crop(image), image)  # floor(v / 255 * 255.5) == v


def lanczos3(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < 3, np.sinc(x) * np.sinc(x / 3), 0.0)


def test_lanczos_resize_is_the_antialiased_lanczos3_of_tf_image_resize():
    # Downscaling 16 -> 8 rows: output row y samples source position (y + 0.5) * 2 with the kernel
    # stretched by 2 (antialias), weights normalised over the rows inside the image.
    values = np.array([0, 0, 0, 10, 200, 250, 30, 30, 90, 160, 255, 255, 0, 40, 80, 120], dtype=np.float64)
    image = np.repeat(np.repeat(values.astype(np.uint8)[:, None, None], 16, 1), 3, 2)
    expected = []
    for y in range(8):
        weights = lanczos3((np.arange(16) + 0.5 - (y + 0.5) * 2) / 2)
        expected.append(np.clip(np.rint(weights @ values / weights.sum()), 0, 255))
    out = lanczos_resize(image, 8)
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    assert out[:, 4, 0].tolist() == expected
    assert np.all(out == out[:, :1, :1])  # constant along the columns and over the channels


def test_jpeg_round_trip_keeps_gray_and_loses_detail_on_noise():
    gray = np.full((32, 32, 3), 100, dtype=np.uint8)
    assert np.array_equal(jpeg_round_trip(gray), gray)
    # Gray noise (no chroma to subsample): quality 95 keeps it within a few levels, not exactly.
    noise = np.repeat(np.random.default_rng(0).integers(0, 256, (32, 32, 1), dtype=np.uint8), 3, 2)
    decoded = jpeg_round_trip(noise)
    error = np.abs(decoded.astype(int) - noise)
    assert decoded.shape == noise.shape and decoded.dtype == np.uint8
    assert 0.5 < error.mean() < 3 and error.max() <= 16


def test_jpeg_round_trip_is_tensorflows_bit_for_bit():
    """tf.io.decode_image decodes with libjpeg's fast integer DCT; PIL's decoder (the accurate
    one, used before) differed from TensorFlow on most pixels of this scene."""
    fixtures = Path(__file__).parents[1] / "fixtures" / "openvla"
    scene = np.asarray(Image.open(fixtures / "scene_64.png"))
    expected = np.asarray(Image.open(fixtures / "scene_64_tf_jpeg_round_trip.png"))
    assert scene.shape == expected.shape == (64, 64, 3)
    assert np.array_equal(jpeg_round_trip(scene), expected)


def test_resize_image_for_policy_is_jpeg_then_lanczos():
    image = np.random.default_rng(1).integers(0, 256, (40, 40, 3), dtype=np.uint8)
    resized = resize_image_for_policy(image, 28)
    assert resized.shape == (28, 28, 3)
    assert np.array_equal(resized, lanczos_resize(jpeg_round_trip(image), 28))
    assert not np.array_equal(resized, lanczos_resize(image, 28))  # the JPEG round trip matters


@pytest.mark.parametrize("bad", [np.zeros((4, 4, 3), dtype=np.float32), np.zeros((4, 4), dtype=np.uint8)])
def test_bad_images_are_refused(bad):
    with pytest.raises(ValueError, match="uint8"):
        center_crop(bad)
    with pytest.raises(ValueError, match="uint8"):
        resize_image_for_policy(bad, 8)
