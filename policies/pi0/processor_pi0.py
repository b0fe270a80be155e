"""Simulator observations → π0 model inputs (images, prompt tokens, raw proprio).

The engine's simulators give a TensorDict of ``state`` float ``(batch, obs_dim)``,
``<camera>_image`` uint8 ``(batch, H, W, 3)`` and the UTF-8 encoded ``instruction`` uint8
``(batch, INSTRUCTION_BYTES)`` (:mod:`vla_rl_core.observations`). π0 reads, as openpi prepares
them (``src/openpi/models/model.py``, ``preprocess_observation``; ``src/openpi/shared/image_tools.py``,
``resize_with_pad``; ``src/openpi/models/tokenizer.py``, ``PaligemmaTokenizer.tokenize``):

- each camera image resized to the SigLIP input side keeping its aspect ratio and padded evenly
  with black, in 8 bits as openpi's clients do before they send it (``openpi_client/image_tools.py``,
  ``resize_with_pad``: PIL's bilinear; here :func:`policies.image_resize.resize_uint8`, at most 2
  of 255 from PIL), then scaled from ``[0, 255]`` to ``[-1, 1]`` (``x / 255 * 2 - 1``);
- the instruction cleaned (``strip``, ``_`` and newlines → spaces), tokenised with BOS and a
  final ``"\\n"``, truncated to ``max_length`` tokens and right-padded (mask False on padding);
- the first ``proprio_dim`` state features, raw (the policy normalises and pads them).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import Tensor

from policies.image_resize import frame_keys, resize_uint8, with_model_frames
from vla_rl_core import keys
from vla_rl_core.observations import decode_instruction

logger = logging.getLogger(__name__)

IMAGES = "images"  # (batch, num_cameras, 3, S, S) float32 in [-1, 1]
IMAGE_MASKS = "image_masks"  # (batch, num_cameras) bool
LANG_TOKENS = "lang_tokens"  # (batch, max_length) int64
LANG_MASKS = "lang_masks"  # (batch, max_length) bool
PROPRIO = "proprio"  # (batch, proprio_dim) float32, raw units


def clean_instruction(instruction: str) -> str:
    """openpi's prompt cleaning: ``strip``, underscores and newlines become spaces."""
    return instruction.strip().replace("_", " ").replace("\n", " ")


def resize_with_pad_uint8(images: Tensor, side: int) -> Tensor:
    """Resize to ``side`` x ``side`` keeping the aspect ratio and pad evenly with black, in 8 bits
    (openpi's client ``resize_with_pad``; the resize: :func:`~policies.image_resize.resize_uint8`).

    Args:
        images: uint8 ``(n, H, W, 3)``, on any device (resized there).
        side: the output side.

    Returns:
        uint8 ``(n, side, side, 3)``, contiguous (``images``' values when already that size).
    """
    frames = images.permute(0, 3, 1, 2)  # (n, 3, H, W) uint8
    height, width = frames.shape[-2:]
    if (height, width) != (side, side):
        ratio = max(height / side, width / side)
        new_h, new_w = int(height / ratio), int(width / ratio)
        frames = resize_uint8(frames, new_h, new_w, "bilinear")
        pad_h, pad_w = side - new_h, side - new_w
        frames = F.pad(frames, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0)
    return frames.permute(0, 2, 3, 1).contiguous()


def resize_with_pad(images: Tensor, side: int) -> Tensor:
    """:func:`resize_with_pad_uint8`, then scaled from ``[0, 255]`` to ``[-1, 1]``.

    Args:
        images: uint8 ``(n, H, W, 3)``, on any device (resized there).
        side: the output side.

    Returns:
        float32 ``(n, 3, side, side)`` in ``[-1, 1]`` (padding -1).
    """
    return resize_with_pad_uint8(images, side).permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0


class PI0ObservationProcessor:
    """Simulator observations → π0 inputs (see the module docstring).

    Args:
        tokenizer: a transformers tokenizer (PaliGemma's, or the tiny one), local.
        cameras: camera names in the model's image order (``"<camera>_image"`` entries).
        proprio_dim: leading state features to read, or None (no state).
        image_size: SigLIP's input side.
        max_length: prompt tokens (the model's ``tokenizer_max_length``).
    """

    def __init__(self, tokenizer, cameras: tuple[str, ...], proprio_dim: int | None, image_size: int,
                 max_length: int) -> None:
        self.tokenizer = tokenizer
        self.cameras = tuple(cameras)
        self.proprio_dim = proprio_dim
        self.image_size = image_size
        self.max_length = max_length
        self._prompt_ids: dict[bytes, list[int]] = {}  # encoded instruction -> token ids

    def __call__(self, obs: TensorDict) -> TensorDict:
        """Model inputs of a batch of simulator observations.

        Args:
            obs: TensorDict of batch size ``(batch,)`` with ``instruction``, every configured
                ``<camera>_image`` (or its ``<camera>_model_image``, :meth:`model_ready`) and,
                with ``proprio_dim``, ``state``.

        Returns:
            TensorDict of batch size ``(batch,)``: ``images`` float32 ``(batch, num_cameras, 3, S,
            S)`` on the device of the observation's images (resized there: on a GPU worker, whose
            rollout and update move observations to the GPU, not on its CPU), and on the CPU
            ``image_masks`` bool ``(batch, num_cameras)``, ``lang_tokens`` int64 / ``lang_masks``
            bool ``(batch, max_length)`` and, with ``proprio_dim``, ``proprio`` float32 ``(batch,
            proprio_dim)``.

        Raises:
            ValueError: ``obs`` is not a TensorDict of batch size ``(batch,)``, a key is missing
                (the message lists the observation's keys), or the state is too short.
        """
        if not isinstance(obs, TensorDict) or len(obs.batch_size) != 1:
            raise ValueError(f"obs must be a TensorDict of simulator observations with batch size (batch,), got "
                             f"{type(obs).__name__}")
        present = set(obs.keys())
        image_keys = frame_keys(present, self.cameras)
        needed = [keys.OBS_INSTRUCTION, *image_keys, *([keys.OBS_STATE] if self.proprio_dim else [])]
        missing = [key for key in needed if key not in present]
        if missing:
            raise ValueError(f"the simulator observation has no {missing} entries (keys: {sorted(present)}); set "
                             "the simulator's cameras to the policy's (simulator.env.cameras, policy.config.cameras)")
        batch = obs.batch_size[0]
        images = []
        for key in image_keys:
            image = obs[key]
            if image.dtype != torch.uint8 or image.ndim != 4 or image.shape[-1] != 3:
                raise ValueError(f"obs[{key!r}] must be uint8 (batch, H, W, 3), got {tuple(image.shape)} {image.dtype}")
            # Resized where the frames are (a GPU worker's GPU); a model frame is already the right size.
            images.append(resize_with_pad(image, self.image_size))
        data = {
            IMAGES: torch.stack(images, dim=1),  # (B, C, 3, S, S)
            IMAGE_MASKS: torch.ones(batch, len(self.cameras), dtype=torch.bool),
        }
        data[LANG_TOKENS], data[LANG_MASKS] = self.encode_instructions(obs[keys.OBS_INSTRUCTION])
        if self.proprio_dim:
            data[PROPRIO] = self.proprio(obs)
        return TensorDict(data, batch_size=[batch])

    def proprio(self, obs: TensorDict) -> Tensor:
        """The first ``proprio_dim`` state features, raw: float32 ``(batch, proprio_dim)`` on the CPU.

        Raises:
            ValueError: ``obs`` has no state, or one with fewer features.
        """
        state = obs.get(keys.OBS_STATE, None)
        if state is None or state.ndim != 2 or state.shape[-1] < self.proprio_dim:
            raise ValueError(f"obs[{keys.OBS_STATE!r}] must be (batch, >= proprio_dim={self.proprio_dim}), got "
                             f"{None if state is None else tuple(state.shape)}")
        return state[:, : self.proprio_dim].float().cpu()

    def model_ready(self, obs: TensorDict, mask: Tensor | None = None) -> TensorDict:
        """``obs`` with each camera's frames resized and padded once (:func:`resize_with_pad_uint8`,
        where the frames are, as :meth:`__call__` resizes them) as ``<camera>_model_image`` uint8
        ``(..., S, S, 3)`` in place of ``<camera>_image``; :meth:`__call__` reads them as it reads
        the frames, with the same result (see ``Policy.model_ready_observations``).

        Args:
            obs: TensorDict of any batch shape.
            mask: optional bool of ``obs``' batch shape: the observations to prepare.

        Returns:
            A new TensorDict (``obs`` is not modified); cameras without frames in ``obs`` are left
            as they are.
        """
        return with_model_frames(obs, self.cameras, lambda frames: resize_with_pad_uint8(frames, self.image_size), mask)

    def prompt_ids(self, instruction: str) -> list[int]:
        """Token ids of one instruction: BOS, the cleaned text, ``"\\n"`` tokenised on its own (openpi's
        ``PaligemmaTokenizer``: the "start of answer" token, never merged with the text's last
        characters); at most ``max_length``."""
        ids = [*self.tokenizer(clean_instruction(instruction))["input_ids"],
               *self.tokenizer("\n", add_special_tokens=False)["input_ids"]]
        bos = self.tokenizer.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        if len(ids) > self.max_length:
            logger.warning("the prompt of %r has %d tokens, more than tokenizer_max_length %d: truncated",
                           instruction, len(ids), self.max_length)
            ids = ids[: self.max_length]
        return ids

    def encode_instructions(self, codes: Tensor) -> tuple[Tensor, Tensor]:
        """Prompts of UTF-8 encoded instructions, each distinct one tokenised once.

        Args:
            codes: uint8 ``(batch, INSTRUCTION_BYTES)``.

        Returns:
            ``lang_tokens`` int64 and ``lang_masks`` bool, ``(batch, max_length)``, right-padded
            with the tokenizer's pad id (0 without one).
        """
        rows = np.ascontiguousarray(codes.cpu().numpy())
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        tokens = torch.full((len(rows), self.max_length), pad_id, dtype=torch.long)
        masks = torch.zeros((len(rows), self.max_length), dtype=torch.bool)
        for row, code in enumerate(rows):
            key = code.tobytes()
            if key not in self._prompt_ids:
                self._prompt_ids[key] = self.prompt_ids(decode_instruction(code))
            ids = self._prompt_ids[key]
            tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            masks[row, : len(ids)] = True
        return tokens, masks
