"""Camera image preprocessing of OpenVLA(-OFT)'s LIBERO evaluation, in numpy and PIL (no TensorFlow).

Sources (moojink/openvla-oft, ``experiments/robot/openvla_utils.py``):

- ``prepare_images_for_vla``: every input image that is not already ``OPENVLA_IMAGE_SIZE`` (224)
  square is resized with ``resize_image_for_policy``, then, with ``cfg.center_crop``, cropped
  with ``center_crop_image``;
- ``resize_image_for_policy``: ``tf.image.encode_jpeg`` (TensorFlow's defaults: quality 95,
  4:2:0 chroma subsampling) and ``tf.io.decode_image``, then ``tf.image.resize(method="lanczos3",
  antialias=True)``, rounded (half to even) and clipped to uint8 — the resizing of the RLDS
  dataset builder the models were trained on;
- ``center_crop_image`` / ``crop_and_resize``: the image as float in [0, 1] (``x / 255``), the
  centred box of ``crop_scale = 0.9`` of the area (side ``sqrt(0.9)`` of the image's, in
  normalised coordinates) resampled bilinearly back to the full size by
  ``tf.image.crop_and_resize``, then ``tf.image.convert_image_dtype(..., uint8, saturate=True)``
  (``floor(x * 255.5)``): the test-time counterpart of the random-crop augmentation.

Here the JPEG round trip encodes with PIL (quality 95, its default 4:2:0 subsampling: the same
libjpeg encoding as TensorFlow's) and decodes with simplejpeg (libjpeg-turbo) using the fast
integer inverse DCT, ``JDCT_IFAST``, and fancy upsampling, as ``tf.io.decode_image`` does: the
round trip equals TensorFlow 2.21's bit for bit on 6 robosuite frames and a noise image (256 px;
PIL's own decoder, the accurate DCT, left 81-93% of their pixels off by up to 23 levels, 1 on
average). The Lanczos-3 resize is PIL's ``LANCZOS`` filter on float32 planes (the same
antialiased kernel ``sinc(x) sinc(x / 3)`` at pixel centres, without the intermediate 8-bit
rounding of PIL's uint8 path: 0.01-0.11% of the pixels 1 level off TensorFlow's), and
``crop_and_resize`` follows the arithmetic of TensorFlow's CPU kernel (``crop_and_resize_op.cc``)
in float32 (equal to TensorFlow's on those frames). The whole chain: 0.01-0.11% of the pixels 1
level off (86-97% before, up to 19 levels). Measured by ``scripts/oft_preprocessing_vs_tf.py``
with ``tensorflow-cpu`` 2.21.0 installed beside the project (not a dependency);
tests/policies/test_image_preprocessing.py keeps TensorFlow's round trip of a 64-pixel scene.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

#: ``experiments/robot/openvla_utils.py``: ``center_crop_image``'s ``crop_scale`` (area fraction).
CENTER_CROP_SCALE = 0.9
#: Quality of ``tf.image.encode_jpeg``'s default, used by ``resize_image_for_policy``.
JPEG_QUALITY = 95


def _check_image(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        shape = getattr(image, "shape", None)
        raise ValueError(f"image must be a uint8 numpy array (H, W, 3), got {type(image).__name__} {shape}")


def jpeg_round_trip(image: np.ndarray, quality: int = JPEG_QUALITY) -> np.ndarray:
    """Encode ``image`` as JPEG and decode it again (``tf.image.encode_jpeg`` then
    ``tf.io.decode_image`` in ``resize_image_for_policy``).

    Args:
        image: uint8 ``(H, W, 3)`` RGB.
        quality: JPEG quality, 1-100.

    Returns:
        uint8 ``(H, W, 3)``: the image with JPEG's compression losses.

    Raises:
        ValueError: ``image`` is not uint8 ``(H, W, 3)``.
    """
    import simplejpeg  # here, not at the top: only this round trip needs it (an offline GPU host may lack it)

    _check_image(image)
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=quality)
    # tf.io.decode_image's defaults: the fast integer inverse DCT, fancy upsampling
    return simplejpeg.decode_jpeg(buffer.getvalue(), colorspace="RGB", fastdct=True, fastupsample=False)


def lanczos_resize(image: np.ndarray, size: int) -> np.ndarray:
    """Resize to ``size x size`` with the antialiased Lanczos-3 kernel, rounding half to even
    (``tf.image.resize(method="lanczos3", antialias=True)``, ``tf.round``, clip to [0, 255]).

    Args:
        image: uint8 ``(H, W, 3)``.
        size: output side in pixels.

    Returns:
        uint8 ``(size, size, 3)``.

    Raises:
        ValueError: ``image`` is not uint8 ``(H, W, 3)`` or ``size`` < 1.
    """
    _check_image(image)
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    planes = [
        np.asarray(Image.fromarray(image[..., c].astype(np.float32), mode="F").resize(
            (size, size), Image.Resampling.LANCZOS))
        for c in range(3)
    ]
    return np.clip(np.rint(np.stack(planes, axis=-1)), 0, 255).astype(np.uint8)


def resize_image_for_policy(image: np.ndarray, size: int) -> np.ndarray:
    """OpenVLA-OFT's ``resize_image_for_policy``: JPEG round trip, then Lanczos-3 to ``size``.

    Args:
        image: uint8 ``(H, W, 3)`` RGB.
        size: output side in pixels (OpenVLA: 224).

    Returns:
        uint8 ``(size, size, 3)``.

    Raises:
        ValueError: ``image`` is not uint8 ``(H, W, 3)``.
    """
    return lanczos_resize(jpeg_round_trip(image), size)


def center_crop_box(crop_scale: float = CENTER_CROP_SCALE) -> tuple[float, float]:
    """The normalised box of ``crop_and_resize``: ``(offset, side)`` with ``side = sqrt(crop_scale)``
    and ``offset = (1 - side) / 2`` (float32, as TensorFlow computes them); the box is
    ``[offset, offset + side]`` in both axes.

    Raises:
        ValueError: ``crop_scale`` not in (0, 1].
    """
    if not 0.0 < crop_scale <= 1.0:
        raise ValueError(f"crop_scale must be in (0, 1], got {crop_scale}")
    side = np.sqrt(np.float32(crop_scale))
    return float((np.float32(1) - side) / np.float32(2)), float(side)


def _bilinear_axis(length: int, y1: np.float32, y2: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source rows (or columns) of ``crop_and_resize`` resampling box ``[y1, y2]`` of an axis of
    ``length`` pixels to ``length`` pixels, in float32 as TensorFlow's CPU kernel: ``in_y = y1 (L - 1)
    + i scale`` with ``scale = (y2 - y1) (L - 1) / (L - 1)``. Returns (``floor(in_y)``,
    ``ceil(in_y)``, ``in_y - floor(in_y)``), each ``(length,)``."""
    if length == 1:
        position = np.zeros(1, dtype=np.float32)  # the kernel's 0.5 (y1 + y2) (L - 1)
    else:
        extent = np.float32(length - 1)
        scale = (y2 - y1) * extent / extent
        position = y1 * extent + np.arange(length, dtype=np.float32) * scale
    low = np.floor(position)
    return low.astype(np.int64), np.ceil(position).astype(np.int64), (position - low).astype(np.float32)


def center_crop(image: np.ndarray, crop_scale: float = CENTER_CROP_SCALE) -> np.ndarray:
    """OpenVLA-OFT's ``center_crop_image``: the centred ``crop_scale`` of the area, resampled
    bilinearly back to the image's size (``tf.image.crop_and_resize``; OFT's images are 224 square
    by then).

    Args:
        image: uint8 ``(H, W, 3)``.
        crop_scale: area fraction kept (OFT: 0.9).

    Returns:
        uint8 ``(H, W, 3)``.

    Raises:
        ValueError: ``image`` is not uint8 ``(H, W, 3)`` or ``crop_scale`` not in (0, 1].
    """
    _check_image(image)
    offset, side = (np.float32(v) for v in center_crop_box(crop_scale))
    y1, y2 = offset, offset + side  # the bounding box crop_and_resize builds
    pixels = image.astype(np.float32) * np.float32(1.0 / 255)  # convert_image_dtype(uint8 -> float32)
    top, bottom, y_weight = _bilinear_axis(image.shape[0], y1, y2)
    left, right, x_weight = _bilinear_axis(image.shape[1], y1, y2)
    x_weight = x_weight[None, :, None]
    upper = pixels[top][:, left] + (pixels[top][:, right] - pixels[top][:, left]) * x_weight
    lower = pixels[bottom][:, left] + (pixels[bottom][:, right] - pixels[bottom][:, left]) * x_weight
    cropped = upper + (lower - upper) * y_weight[:, None, None]  # (H, W, 3)
    # convert_image_dtype(float32 -> uint8, saturate=True): scale by 255.5, then truncate.
    return (np.clip(cropped, 0.0, 1.0) * np.float32(255.5)).astype(np.uint8)
