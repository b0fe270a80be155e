"""policies/image_resize.py against PIL itself (the resize of OpenVLA's processor and of openpi's
clients), on both of its paths: the CPU's uint8 kernel and the accelerators' float passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from policies.image_resize import resize_uint8, resize_uint8_in_float

PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
#: (height, width) of the outputs, from 128 x 96 frames: reductions, an enlargement, a square.
SIZES = ((56, 42), (100, 75), (224, 168), (224, 224))


def frames(kind: str) -> np.ndarray:
    """uint8 ``(6, 128, 96, 3)``: uniform noise (the worst case for overshoot) or smooth images."""
    rng = np.random.default_rng(0)
    if kind == "noise":
        return rng.integers(0, 256, (6, 128, 96, 3), dtype=np.uint8)
    return np.clip(np.cumsum(rng.normal(0, 8, (6, 128, 96, 3)), axis=1) + 128, 0, 255).astype(np.uint8)


def pil_resize(images: np.ndarray, height: int, width: int, mode: str) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(image).resize((width, height), resample=PIL_FILTERS[mode]))
                     for image in images])


@pytest.mark.parametrize("kind", ["noise", "smooth"])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("resize", [resize_uint8, resize_uint8_in_float], ids=["cpu-kernel", "float-passes"])
def test_both_paths_resize_as_pil(resize, mode, kind):
    images = frames(kind)
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    for height, width in SIZES:
        out = resize(nchw, height, width, mode)
        assert out.dtype == torch.uint8 and out.shape == (6, 3, height, width)
        difference = np.abs(out.permute(0, 2, 3, 1).numpy().astype(int) - pil_resize(images, height, width, mode))
        assert difference.max() <= 2 and difference.mean() < 0.15, (height, width, difference.max(), difference.mean())


def test_the_float_passes_round_between_them_as_pil():
    """Without PIL's 8-bit intermediate image a bicubic enlargement of noise overshoots: the
    rounding between the passes is what keeps the accelerators' path at PIL's values."""
    images = frames("noise")
    nchw = torch.from_numpy(images).permute(0, 3, 1, 2)
    one_pass = torch.nn.functional.interpolate(nchw.float(), size=(224, 168), mode="bicubic", antialias=True)
    one_pass = one_pass.round().clamp(0, 255).permute(0, 2, 3, 1).numpy().astype(int)
    reference = pil_resize(images, 224, 168, "bicubic")
    assert np.abs(one_pass - reference).max() > 10
    two_passes = resize_uint8_in_float(nchw, 224, 168, "bicubic").permute(0, 2, 3, 1).numpy().astype(int)
    assert np.abs(two_passes - reference).max() <= 2


def test_frames_are_resized_on_their_device_and_kept_when_already_that_size():
    images = torch.randint(0, 256, (2, 3, 40, 30), dtype=torch.uint8)
    assert resize_uint8(images, 40, 30, "bicubic") is images
    on_meta = resize_uint8(images.to("meta"), 28, 21, "bilinear")  # meta: no copy to the CPU can pass
    assert on_meta.device.type == "meta" and on_meta.dtype == torch.uint8 and on_meta.shape == (2, 3, 28, 21)


@pytest.mark.parametrize("images, mode, size, message", [
    (torch.zeros(2, 3, 8, 8), "bilinear", 4, "uint8"),
    (torch.zeros(2, 8, 8, 3, dtype=torch.uint8), "bilinear", 4, r"\(n, 3, H, W\)"),
    (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), "nearest", 4, "mode"),
    (torch.zeros(2, 3, 8, 8, dtype=torch.uint8), "bicubic", 0, "positive"),
])
def test_bad_input_is_refused(images, mode, size, message):
    with pytest.raises(ValueError, match=message):
        resize_uint8(images, size, size, mode)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_frames_on_the_test_device_are_resized_there_as_pil(mode, device):
    """On the test device (``VLA_RL_TEST_DEVICE``): the CPU's kernel, or an accelerator's float
    passes, which no other test runs there."""
    images = frames("smooth")
    out = resize_uint8(torch.from_numpy(images).permute(0, 3, 1, 2).to(device), 100, 75, mode)
    assert out.device == device and out.dtype == torch.uint8
    difference = np.abs(out.cpu().permute(0, 2, 3, 1).numpy().astype(int) - pil_resize(images, 100, 75, mode))
    assert difference.max() <= 2 and difference.mean() < 0.15
