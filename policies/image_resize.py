"""PIL's resize of 8-bit camera images, on any device: what the policies' reference processors do.

OpenVLA's image processor resizes the PIL image (``Image.resize(..., BICUBIC)`` through
torchvision's ``Resize``) before it converts it to float; openpi's clients resize with padding
in PIL (``openpi_client/image_tools.py``: ``resize_with_pad``, ``Image.BILINEAR``) and send uint8
frames. PIL's resampling of an 8-bit image is antialiased (the filter's support scales with the
reduction), separable (a horizontal pass, then a vertical one) and rounds and clips to 8 bits
after each pass (``libImaging/Resample.c``). :func:`resize_uint8` gives the same result:

- on the CPU, torch's uint8 kernel of ``F.interpolate(..., antialias=True)`` on channels-last
  frames (torchvision's PIL-matching path; measured here against PIL on noise and smooth images
  from 128 px to 42-224 px: at most 2 of 255 apart, on average 0.08), 11 to 15 times faster on
  one thread than the same interpolation in float32;
- on an accelerator, whose kernels have no uint8 variant (CUDA's ``_upsample_*2d_aa`` dispatches
  floating types only), the two passes in float32 with PIL's rounding and clipping after each
  (also at most 2 of 255 from PIL; at most 2 from the CPU kernel). Without that rounding a float
  bicubic enlargement differs from PIL by up to 23 of 255 on noise (the overshoot of the first
  pass is not clipped).

Either way a frame is resized where it is: a GPU worker's frames stay on its GPU.
:func:`with_model_frames` prepares the frames of many observations once (``Policy.model_ready_observations``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import Tensor

from vla_rl_core import keys

#: PIL's filters available here, by ``F.interpolate``'s mode name.
MODES = ("bilinear", "bicubic")


def resize_uint8(images: Tensor, height: int, width: int, mode: str) -> Tensor:
    """Resize 8-bit images as PIL's ``Image.resize`` does (see the module docstring).

    Args:
        images: uint8 ``(n, 3, H, W)`` (any memory layout), on any device.
        height, width: the output size in pixels, each at least 1.
        mode: ``"bilinear"`` (PIL's ``BILINEAR``) or ``"bicubic"`` (``BICUBIC``, ``a = -0.5``).

    Returns:
        uint8 ``(n, 3, height, width)`` on ``images``' device (``images`` itself when it already
        has that size).

    Raises:
        ValueError: ``images`` is not uint8 ``(n, 3, H, W)``, ``mode`` is not one of
            :data:`MODES`, or a size is below 1.
    """
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be uint8 (n, 3, H, W), got {tuple(images.shape)} {images.dtype}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if height < 1 or width < 1:
        raise ValueError(f"the output size must be positive, got {height} x {width}")
    if tuple(images.shape[-2:]) == (height, width):
        return images
    if images.device.type == "cpu":
        frames = images.contiguous(memory_format=torch.channels_last)
        return F.interpolate(frames, size=(height, width), mode=mode, antialias=True)
    return resize_uint8_in_float(images, height, width, mode)


def resize_uint8_in_float(images: Tensor, height: int, width: int, mode: str) -> Tensor:
    """:func:`resize_uint8`'s path on accelerators (their interpolation kernels take floating
    types only): PIL's two passes, horizontal then vertical, in float32, each rounded and clipped to
    8 bits. Arguments and result as :func:`resize_uint8` (not checked here)."""
    pixels = images.float()
    pixels = F.interpolate(pixels, size=(pixels.shape[-2], width), mode=mode, antialias=True, align_corners=False)
    pixels = pixels.round_().clamp_(0, 255)  # PIL's 8-bit intermediate image
    pixels = F.interpolate(pixels, size=(height, width), mode=mode, antialias=True, align_corners=False)
    return pixels.round_().clamp_(0, 255).to(torch.uint8)


def frame_keys(obs_keys: Collection[str], cameras: Sequence[str]) -> list[str]:
    """The key each camera's frames are read from: ``<camera>_model_image`` when the observation
    holds it (:func:`with_model_frames`), else ``<camera>_image``."""
    out = []
    for camera in cameras:
        model_key = f"{camera}{keys.OBS_MODEL_IMAGE_SUFFIX}"
        out.append(model_key if model_key in obs_keys else f"{camera}{keys.OBS_IMAGE_SUFFIX}")
    return out


def with_model_frames(obs: TensorDict, cameras: Sequence[str], prepare: Callable[[Tensor], Tensor],
                      mask: Tensor | None = None, chunk: int = 256) -> TensorDict:
    """Observations whose camera frames are prepared once as a policy's model reads them: each
    camera's ``<camera>_image`` becomes ``<camera>_model_image`` (``Policy.model_ready_observations``).

    Args:
        obs: TensorDict of any batch shape; cameras without frames in it are left as they are.
        cameras: the policy's camera names.
        prepare: uint8 ``(n, H, W, 3)`` → uint8 ``(n, S, S', 3)``, the policy's preparation; it
            picks where it runs (the result is brought back to the frames' device).
        mask: optional bool of ``obs``' batch shape: only those observations are prepared (the
            others' model frames are 0).
        chunk: frames per ``prepare`` call (the resize's float intermediates of a whole update's
            frames at once would not fit next to a large model).

    Returns:
        A new TensorDict (``obs`` is not modified) holding uint8 ``(..., S, S', 3)`` model frames
        on the frames' device.
    """
    ready = obs.copy()
    present = set(obs.keys())
    for camera in cameras:
        key = f"{camera}{keys.OBS_IMAGE_SUFFIX}"
        if key in present:
            ready[f"{camera}{keys.OBS_MODEL_IMAGE_SUFFIX}"] = _prepare_once(obs[key], prepare, mask, chunk)
            del ready[key]
    return ready


def _prepare_once(frames: Tensor, prepare: Callable[[Tensor], Tensor], mask: Tensor | None, chunk: int) -> Tensor:
    """uint8 ``(..., H, W, 3)`` → ``(..., S, S', 3)`` (see :func:`with_model_frames`)."""
    flat = frames.reshape(-1, *frames.shape[-3:])  # (N, H, W, 3)
    if mask is None:
        rows = torch.arange(flat.shape[0], device=flat.device)
    else:
        rows = mask.reshape(-1).nonzero().squeeze(1).to(flat.device)  # found where the mask is
    out = None
    for start in range(0, rows.numel(), chunk):
        index = rows[start:start + chunk]
        part = prepare(flat[index]).to(flat.device)
        if out is None:
            out = flat.new_zeros(flat.shape[0], *part.shape[1:])
        out[index] = part
    if out is None:  # nothing to prepare: the shape of one prepared frame (of the raw one when there is none)
        shape = prepare(flat[:1]).shape[1:] if flat.shape[0] else flat.shape[1:]
        out = flat.new_zeros(flat.shape[0], *shape)
    return out.reshape(*frames.shape[:-3], *out.shape[1:])
