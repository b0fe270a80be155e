"""Observation keys of the OpenVLA policies and the prompt → ``input_ids`` encoding.

Observations are a ``tensordict.TensorDict`` with batch size ``(batch,)`` holding:

- :data:`IMAGES`: uint8 ``(batch, num_cameras, H, W, 3)`` RGB (any ``H, W``: each vision tower
  resizes to its own size);
- :data:`INPUT_IDS`: int64 ``(batch, prompt_len)`` tokenized prompts, BOS in column 0 and
  padding *after* BOS (``[BOS, PAD, ..., PAD, text...]``), so that every prompt ends in the last
  column and the image patches go right after BOS as Prismatic inserts them;
- :data:`ATTENTION_MASK`: int64/bool ``(batch, prompt_len)``, 0 on the padding;
- :data:`PROPRIO` (OpenVLA-OFT with a proprio projector only): float ``(batch, proprio_dim)``.

The prompt is OpenVLA's ``"In: What action should the robot take to {instruction}?\\nOut:"``
(``experiments/robot/openvla_utils.py``: ``get_vla_action``, instruction lower-cased), followed
by the empty token ``"▁"`` (id 29871 in Llama-2's tokenizer) that ``predict_action`` appends when
the tokenizer has it.

:class:`SimulatorObservationProcessor` builds these inputs from what the engine's simulators give
(a TensorDict of ``state``, ``<camera>_image`` uint8 and the UTF-8 encoded ``instruction``, see
:mod:`vla_rl_core.observations`): camera images in the configured order, the prompt of each
distinct instruction tokenized once and cached, and the first ``proprio_dim`` state features as
proprio. Camera images may first be resized and centre-cropped as OpenVLA-OFT's
``prepare_images_for_vla`` does (``experiments/robot/openvla_utils.py``; see
:mod:`policies.openvla.image_preprocessing`); each distinct frame is prepared once per process
(:class:`PreparedFrames`), not in every forward pass that reads it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from policies.image_resize import frame_keys
from policies.openvla.image_preprocessing import center_crop, resize_image_for_policy
from vla_rl_core import keys
from vla_rl_core.observations import decode_instruction

IMAGES = "images"
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
PROPRIO = "proprio"
#: SentencePiece's word-boundary token that OpenVLA appends after ``"Out:"``.
EMPTY_TOKEN = "▁"
#: Frames :data:`PREPARED_FRAMES` keeps: a training step's camera frames on one worker (episodes x
#: decisions x cameras; e.g. 16 LIBERO-10 episodes of 65 decisions from 2 cameras: 2,080) fit,
#: so that the update's passes and the reference's find the rollout's. At 224 x 224 x 3 uint8,
#: 150 KB a frame: at most 600 MB of host memory per worker process.
PREPARED_FRAMES_CAPACITY = 4096


def openvla_prompt(instruction: str) -> str:
    """OpenVLA's prompt for one task instruction."""
    return f"In: What action should the robot take to {instruction.lower()}?\nOut:"


def encode_prompts(tokenizer: PreTrainedTokenizerBase, instructions: list[str]) -> tuple[Tensor, Tensor]:
    """Tokenize instructions into the BOS-then-padding layout the policies read.

    Args:
        tokenizer: the checkpoint's tokenizer; it must add a BOS token.
        instructions: one task instruction per row.

    Returns:
        ``input_ids`` and ``attention_mask``, int64 ``(batch, prompt_len)``.

    Raises:
        ValueError: no instructions, or the tokenizer does not start sequences with BOS.
    """
    if not instructions:
        raise ValueError("encode_prompts needs at least one instruction")
    return pad_prompts([prompt_token_ids(tokenizer, instruction) for instruction in instructions], tokenizer)


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, instruction: str) -> list[int]:
    """Token ids of one instruction's OpenVLA prompt: BOS first, the empty token ``▁`` last when
    the vocabulary has it.

    Raises:
        ValueError: the tokenizer does not start sequences with BOS.
    """
    ids = tokenizer(openvla_prompt(instruction))["input_ids"]
    if not ids or ids[0] != tokenizer.bos_token_id:
        raise ValueError("the tokenizer must add a BOS token first (Prismatic inserts image patches after it)")
    empty_id = tokenizer.convert_tokens_to_ids(EMPTY_TOKEN) if EMPTY_TOKEN in tokenizer.get_vocab() else None
    if empty_id is not None and ids[-1] != empty_id:
        ids = ids + [empty_id]
    return ids


def pad_prompts(rows: list[list[int]], tokenizer: PreTrainedTokenizerBase) -> tuple[Tensor, Tensor]:
    """Lay out prompt ids as ``[BOS, PAD..., text...]`` rows of the longest prompt's length.

    Returns:
        ``input_ids`` and ``attention_mask``, int64 ``(len(rows), prompt_len)``.
    """
    length = max(len(ids) for ids in rows)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, 0] = ids[0]
        attention_mask[row, 0] = 1
        input_ids[row, length - len(ids) + 1 :] = torch.tensor(ids[1:], dtype=torch.long)
        attention_mask[row, length - len(ids) + 1 :] = 1
    return input_ids, attention_mask


def make_observation(
    images: Tensor, input_ids: Tensor, attention_mask: Tensor, proprio: Tensor | None = None
) -> TensorDict:
    """Assemble an observation TensorDict (batch dimension first) from its parts."""
    data = {IMAGES: images, INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}
    if proprio is not None:
        data[PROPRIO] = proprio
    return TensorDict(data, batch_size=[images.shape[0]])


def check_observation(obs: TensorDict, num_images: int, proprio_dim: int | None) -> None:
    """Validate an observation's keys, dtypes, shapes and prompt layout.

    Raises:
        ValueError: a key is missing or has the wrong dtype/shape, or the prompts are not
            ``[BOS, padding, text]`` with a valid last column; the message names the key.
    """
    if not isinstance(obs, TensorDict) or len(obs.batch_size) != 1:
        raise ValueError(f"obs must be a TensorDict with batch size (batch,), got {type(obs).__name__}")
    for key in (IMAGES, INPUT_IDS, ATTENTION_MASK):
        if key not in obs.keys():
            raise ValueError(f"obs has no {key!r} entry (keys: {sorted(obs.keys())})")
    images, input_ids, mask = obs[IMAGES], obs[INPUT_IDS], obs[ATTENTION_MASK]
    if images.dtype != torch.uint8 or images.ndim != 5 or images.shape[1] != num_images or images.shape[-1] != 3:
        raise ValueError(
            f"obs[{IMAGES!r}] must be uint8 (batch, {num_images}, H, W, 3), got {tuple(images.shape)} {images.dtype}"
        )
    if input_ids.ndim != 2 or input_ids.dtype != torch.long or mask.shape != input_ids.shape:
        raise ValueError(
            f"obs[{INPUT_IDS!r}] must be int64 (batch, prompt_len) and obs[{ATTENTION_MASK!r}] of the same shape, got "
            f"{tuple(input_ids.shape)} {input_ids.dtype} and {tuple(mask.shape)}"
        )
    valid = mask.bool()
    if not valid[:, 0].all() or not valid[:, -1].all() or (valid[:, 2:] < valid[:, 1:-1]).any():
        raise ValueError(
            f"obs[{ATTENTION_MASK!r}] must be 1 on BOS (column 0), then 0...0 1...1 (padding after BOS, "
            "prompt ending in the last column); build prompts with encode_prompts"
        )
    if proprio_dim is not None:
        proprio = obs.get(PROPRIO, None)
        if proprio is None or proprio.shape[1:] != (proprio_dim,) or not proprio.is_floating_point():
            raise ValueError(
                f"obs[{PROPRIO!r}] must be floating (batch, {proprio_dim}), got "
                f"{None if proprio is None else (tuple(proprio.shape), proprio.dtype)}"
            )


class PreparedFrames:
    """OpenVLA-OFT's frame preparation (``prepare_images_for_vla``: the JPEG round trip and
    Lanczos-3 resize of ``resize_image_for_policy``, then ``center_crop_image``), memoised by the
    frame's content: a least-recently-used map from (BLAKE2b-128 digest of the frame's bytes, its
    shape, the settings) to the prepared uint8 frame.

    The preparation runs in numpy/PIL on the CPU, 6.7 ms for a 256 px frame's resize on the 2-core
    development machine, and every forward pass of the policy reads its observations' frames:
    the rollout's sampling, the old log-probs' rescoring, each epoch's update, the reference's
    scoring. Memoised, a frame is prepared once (digesting it takes about 0.2 ms) and the
    forward passes get the same bytes they would have computed.

    Args:
        capacity: frames kept; the least recently used goes first.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.frames: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self.prepared = 0  # frames computed (misses), for tests and logs

    def get(self, image: np.ndarray, size: int, resize: bool, crop: bool) -> np.ndarray:
        """The prepared frame of uint8 ``(H, W, 3)`` ``image``: resized to ``size`` square when
        ``resize``, then centre-cropped when ``crop``. Do not modify the returned array."""
        key = (hashlib.blake2b(image.tobytes(), digest_size=16).digest(), image.shape, size, resize, crop)
        frame = self.frames.get(key)
        if frame is not None:
            self.frames.move_to_end(key)
            return frame
        frame = resize_image_for_policy(image, size) if resize else image.copy()
        frame = center_crop(frame) if crop else frame
        self.prepared += 1
        self.frames[key] = frame
        if len(self.frames) > self.capacity:
            self.frames.popitem(last=False)
        return frame


#: The process's prepared frames, shared by every processor (the policy's and the reference's).
PREPARED_FRAMES = PreparedFrames(PREPARED_FRAMES_CAPACITY)


class SimulatorObservationProcessor:
    """Simulator observations → the VLA's observation TensorDict (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer.
        cameras: camera names in the order of the model's images; camera ``c`` is read from
            the ``"<c>_image"`` entry.
        proprio_dim: number of leading state features given as ``proprio`` (OpenVLA-OFT's
            proprio token), or None.
        image_size: the vision tower's input side in pixels.
        image_resize: ``"jpeg_lanczos3"``: images whose size is not ``image_size`` are resized as
            OpenVLA-OFT's ``resize_image_for_policy``; ``"tower"``: left to the tower's resize.
        center_crop: then crop the centred 90% of the area and resize it back
            (``center_crop_image``).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, cameras: tuple[str, ...], proprio_dim: int | None,
                 image_size: int, image_resize: str, center_crop: bool) -> None:
        self.tokenizer = tokenizer
        self.cameras = tuple(cameras)
        self.proprio_dim = proprio_dim
        self.image_size = image_size
        self.image_resize = image_resize
        self.center_crop = center_crop
        self._prompt_ids: dict[bytes, list[int]] = {}  # encoded instruction -> prompt ids

    def __call__(self, obs: TensorDict) -> TensorDict:
        """Build the model inputs of a batch of simulator observations.

        Args:
            obs: TensorDict of batch size ``(batch,)`` with ``instruction`` uint8 ``(batch,
                INSTRUCTION_BYTES)``, ``<camera>_image`` uint8 ``(batch, H, W, 3)`` for every
                configured camera (or, prepared by the policy's ``model_ready_observations``,
                ``<camera>_model_image``, read as they are) and, with ``proprio_dim``, ``state``
                float ``(batch, >= proprio_dim)``.

        Returns:
            ``images`` uint8 ``(batch, len(cameras), H, W, 3)``, ``input_ids``/``attention_mask``
            int64 ``(batch, prompt_len)`` and, with ``proprio_dim``, ``proprio`` float32.

        Raises:
            ValueError: a key is missing (the message lists the observation's keys), only some
                cameras have model frames, or the state has fewer than ``proprio_dim`` features.
        """
        present = set(obs.keys())
        image_keys = frame_keys(present, self.cameras)
        needed = [keys.OBS_INSTRUCTION, *image_keys, *([keys.OBS_STATE] if self.proprio_dim else [])]
        missing = [key for key in needed if key not in present]
        if missing:
            raise ValueError(
                f"the simulator observation has no {missing} entries (keys: {sorted(present)}); set the "
                "simulator's cameras to the policy's cameras (simulator.env.cameras, policy.config.cameras)"
            )
        prepared = [key == f"{camera}{keys.OBS_MODEL_IMAGE_SUFFIX}" for camera, key in zip(self.cameras, image_keys,
                                                                                            strict=True)]
        if any(prepared) and not all(prepared):
            raise ValueError(f"the observation holds model frames of some cameras only ({image_keys}): prepare all "
                             "of them with the policy's model_ready_observations")
        images = torch.stack([obs[key] for key in image_keys], dim=1)  # (B, I, H, W, 3)
        if not all(prepared):
            images = self.preprocess_images(images)
        input_ids, attention_mask = self.encode_instructions(obs[keys.OBS_INSTRUCTION])
        proprio = self.proprio(obs) if self.proprio_dim else None
        return make_observation(images, input_ids, attention_mask, proprio)

    def proprio(self, obs: TensorDict) -> Tensor:
        """The first ``proprio_dim`` state features: float32 ``(batch, proprio_dim)``.

        Raises:
            ValueError: the state has fewer than ``proprio_dim`` features.
        """
        state = obs[keys.OBS_STATE]
        if state.shape[-1] < self.proprio_dim:
            raise ValueError(f"obs[{keys.OBS_STATE!r}] has {state.shape[-1]} features, fewer than the policy's "
                             f"proprio_dim {self.proprio_dim}")
        return state[:, : self.proprio_dim].float()

    def preprocess_images(self, images: Tensor) -> Tensor:
        """OpenVLA-OFT's ``prepare_images_for_vla`` on simulator images: each image that is not
        ``image_size`` square is resized (``image_resize="jpeg_lanczos3"``), then centre-cropped
        (``center_crop``).

        Args:
            images: uint8 ``(batch, num_images, H, W, 3)``.

        Returns:
            uint8 ``(batch, num_images, H', W', 3)`` on the CPU (``images`` itself when nothing
            applies), ``H' = W' = image_size`` when resized. Each distinct frame is prepared once
            per process (:data:`PREPARED_FRAMES`).
        """
        resize = self.image_resize == "jpeg_lanczos3" and images.shape[2:4] != (self.image_size, self.image_size)
        if not (resize or self.center_crop):
            return images
        frames = images.cpu().numpy().reshape(-1, *images.shape[2:])  # (B * I, H, W, 3)
        rows = [PREPARED_FRAMES.get(image, self.image_size, resize, self.center_crop) for image in frames]
        return torch.from_numpy(np.stack(rows)).unflatten(0, images.shape[:2])

    def encode_instructions(self, codes: Tensor) -> tuple[Tensor, Tensor]:
        """Prompts of UTF-8 encoded instructions, each distinct one tokenized once.

        Args:
            codes: uint8 ``(batch, INSTRUCTION_BYTES)``.

        Returns:
            ``input_ids`` and ``attention_mask``, int64 ``(batch, prompt_len)``.
        """
        rows = np.ascontiguousarray(codes.cpu().numpy())
        ids = []
        for row in rows:
            key = row.tobytes()
            if key not in self._prompt_ids:
                self._prompt_ids[key] = prompt_token_ids(self.tokenizer, decode_instruction(row))
            ids.append(self._prompt_ids[key])
        return pad_prompts(ids, self.tokenizer)
