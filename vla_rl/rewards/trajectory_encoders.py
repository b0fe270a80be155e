"""Trajectory encoders: fixed-size embeddings of variable-length trajectories, registered by
name in ``TRAJECTORY_ENCODERS``, for trajectory-level rewards such as SRPO's progress reward.

Every encoder is a callable ``encoder(trajectories, lengths, num_points) -> (batch, dim)``:
``trajectories`` ``(batch, time, ...)`` padded to a common ``time``, ``lengths`` ``(batch,)``
int64 valid steps. A registry entry is either such a function or a class whose instances are,
registered with its config class (:class:`StateEncoderConfig`, :class:`FrameEncoderConfig`,
:class:`VJEPA2EncoderConfig`; a template sets it as ``algorithm.<name>``);
:func:`build_trajectory_encoder` turns a name, its config and the run's objects into an
encoder. Encoders of camera frames (uint8 ``(batch, time, H, W, 3)``) have the attribute
``reads_frames = True`` and a :class:`FrameEncoderConfig` (which camera); the others read state
vectors.

- ``"state_resample"`` (function): a low-dimensional stand-in for SRPO's world-model video
  embedding. SRPO (Fei et al. 2025, arXiv 2511.15605) embeds each episode with V-JEPA 2 from
  frames sampled uniformly over the whole episode (siiRL's ``VideoEmbeddingModel.get_embeddings``
  takes 64 frames at ``linspace(0, T - 1)`` and cycles through shorter episodes, see
  :func:`srpo_frame_indices`); here the states themselves are resampled uniformly, by linear
  interpolation (short episodes included), and flattened.
- ``"vjepa2"`` (:class:`VJEPA2TrajectoryEncoder`): SRPO's encoder, a frozen V-JEPA 2 video model
  (Assran et al. 2025, arXiv 2506.09985) from a local directory: ``num_points`` frames chosen
  by siiRL's rule (:func:`srpo_frame_indices`), encoded as one clip, tokens mean-pooled.
- ``"policy_backbone"`` (:class:`BackboneTrajectoryEncoder`): the policy's own vision backbone
  applied to frames sampled the same way, per-frame features concatenated in time order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor

from vla_rl_core.registry import Registry


class EncoderTraits(BaseModel):
    """What a trajectory encoder declares when it registers (checked then, by pydantic).

    Attributes:
        runtime: what its builder takes from the worker beside its settings:
            ``"frame_features"`` (the live policy's vision backbone), ``"device"`` (the worker's
            device, for a model of its own).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: tuple[Literal["frame_features", "device"], ...] = ()


TRAJECTORY_ENCODERS: Registry[Callable[..., Any]] = Registry("trajectory encoder", traits=EncoderTraits,
                                                              calls=(("trajectories", "lengths"), ("num_points",)))
"""Encoder functions ``(trajectories, lengths, num_points) -> (batch, dim)``, or classes whose
instances are such functions (build them with :func:`build_trajectory_encoder`)."""


@dataclass(frozen=True)
class StateEncoderConfig:
    """Settings of an encoder of state trajectories.

    Attributes:
        points: samples taken uniformly over each episode (>= 2).

    Raises:
        ValueError: from ``__post_init__`` when ``points`` < 2.
    """

    points: int = 16

    def __post_init__(self) -> None:
        if self.points < 2:
            raise ValueError(f"points must be >= 2 to span an episode's start and end (got {self.points})")


@dataclass(frozen=True)
class FrameEncoderConfig(StateEncoderConfig):
    """Settings of an encoder of camera frames.

    Attributes:
        camera: the camera whose ``<camera>_image`` observations it reads (it must be among the
            simulator's ``cameras``).
    """

    camera: str = "agentview"


@dataclass(frozen=True)
class VJEPA2EncoderConfig(FrameEncoderConfig):
    """Settings of ``"vjepa2"``.

    Attributes:
        points: frames per episode, 64 as SRPO's reference code (siiRL's
            ``num_frames_for_embedding``) and the 64-frame V-JEPA 2 checkpoints.
        model_dir: directory of a saved ``VJEPA2Model`` (nothing is downloaded); required.
        batch_size: episodes encoded per forward pass (bounds memory), >= 1.
    """

    points: int = 64
    model_dir: str = ""
    batch_size: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model_dir:
            raise ValueError("model_dir is required: the directory of a saved VJEPA2Model "
                             "(algorithm.vjepa2.model_dir=/path/to/vjepa2)")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def build_trajectory_encoder(name: str, config: StateEncoderConfig | None = None, **runtime: Any
                             ) -> Callable[..., Tensor]:
    """The encoder registered as ``name``: the function itself, or an instance of the class built
    from its ``config`` and the run's objects.

    Args:
        name: registered encoder name (``"state_resample"``, ``"vjepa2"``, ``"policy_backbone"``).
        config: its config (see :data:`TRAJECTORY_ENCODERS`' config classes); None: the defaults.
        runtime: what a class entry needs from the run (``device`` for ``"vjepa2"``,
            ``frame_features`` for ``"policy_backbone"``); ignored by function entries.

    Returns:
        A callable ``(trajectories, lengths, num_points) -> (batch, dim)`` tensor.

    Raises:
        RegistryError: if ``name`` is unknown (the message lists the known encoders).
    """
    entry = TRAJECTORY_ENCODERS.get(name)
    if not isinstance(entry, type):
        return entry
    config = config if config is not None else TRAJECTORY_ENCODERS.config_class(name)()
    return entry(config, **runtime)


def _check_lengths(lengths: Tensor, batch: int, time: int) -> None:
    if lengths.shape != (batch,) or lengths.dtype != torch.int64:
        raise ValueError(f"lengths must be a ({batch},) int64 tensor; got {lengths.dtype} of "
                         f"shape {tuple(lengths.shape)}")
    if batch and (lengths.min() < 1 or lengths.max() > time):
        raise ValueError(f"every length must be in [1, {time}]; got min {int(lengths.min())}, "
                         f"max {int(lengths.max())}")


def srpo_frame_indices(lengths: Tensor, num_frames: int) -> Tensor:
    """Steps of the ``num_frames`` frames SRPO takes from each trajectory's valid prefix.

    siiRL's rule (``siirl/utils/embodied/video_emb.py``, ``VideoEmbeddingModel.get_embeddings``),
    for a trajectory of ``L`` valid steps:

    - ``L >= num_frames``: ``numpy.linspace(0, L - 1, num=num_frames, dtype=int)``, i.e. frame
      ``k`` is step ``floor(k * ((L - 1) / (num_frames - 1)))`` computed in float64 exactly as
      numpy does, so a product that rounds just below an integer floors one step low as it does
      in siiRL (``L = 154``, 64 frames: frame 21 is step 50, though ``21 * 153 / 63 = 51``),
      and the last frame is step ``L - 1``;
    - ``L < num_frames``: cyclic padding, ``numpy.resize(numpy.arange(L), num_frames)``: steps
      ``0, 1, ..., L - 1, 0, 1, ...`` truncated to ``num_frames`` (frame ``k`` is step
      ``k mod L``), not a repetition of each step.

    Args:
        lengths: (batch,) int64, valid steps per trajectory, each >= 1.
        num_frames: frames per trajectory, >= 2.

    Returns:
        (batch, num_frames) int64 step indices, each in [0, lengths[i] - 1], on ``lengths``'
        device.

    Raises:
        ValueError: if ``num_frames`` < 2 or a length is < 1.
    """
    if num_frames < 2:
        raise ValueError(f"num_frames must be >= 2 (got {num_frames}) to span start and end")
    if lengths.dim() != 1 or (lengths.numel() and lengths.min() < 1):
        raise ValueError(f"lengths must be a (batch,) tensor of values >= 1, got {lengths.tolist()}")
    lengths = lengths.long()
    frame = torch.arange(num_frames, device=lengths.device)  # (P,)
    # numpy.linspace: step = (stop - start) / (num - 1) in float64, y = arange(num) * step, y[-1] = stop.
    step = (lengths - 1).to(torch.float64) / (num_frames - 1)  # (B,)
    spread = (frame.to(torch.float64)[None, :] * step[:, None]).floor().long()  # (B, P)
    spread[:, -1] = lengths - 1
    cyclic = frame[None, :] % lengths[:, None]  # (B, P), numpy.resize(arange(L), P)
    return torch.where((lengths >= num_frames)[:, None], spread, cyclic)  # (B, P)


def sample_frames(frames: Tensor, lengths: Tensor, num_frames: int) -> Tensor:
    """Gather the :func:`srpo_frame_indices` frames of each episode.

    Args:
        frames: (batch, time, height, width, 3) uint8 RGB, episodes padded to a common ``time``.
        lengths: (batch,) int64, valid steps per episode, each in [1, time].
        num_frames: frames per episode, >= 2.

    Returns:
        (batch, num_frames, height, width, 3) uint8, in time order; only valid steps are read.

    Raises:
        ValueError: on bad shapes or dtypes, a length outside [1, time], or num_frames < 2.
    """
    if frames.dim() != 5 or frames.shape[-1] != 3 or frames.dtype != torch.uint8:
        raise ValueError(f"frames must be a (batch, time, height, width, 3) uint8 tensor; got "
                         f"{frames.dtype} of shape {tuple(frames.shape)}")
    batch, time = frames.shape[:2]
    _check_lengths(lengths, batch, time)
    steps = srpo_frame_indices(lengths.to(frames.device), num_frames)  # (B, P)
    return frames[torch.arange(batch, device=frames.device)[:, None], steps]  # (B, P, H, W, 3)


@TRAJECTORY_ENCODERS.register("state_resample", config=StateEncoderConfig)
def encode_state_trajectories(states: Tensor, lengths: Tensor, num_points: int = 16) -> Tensor:
    """Resample each trajectory's valid prefix at ``num_points`` uniformly spaced times.

    For trajectory ``i`` with ``L = lengths[i]`` valid steps, sample point ``k`` sits at the
    fractional step ``t_k = k * (L - 1) / (num_points - 1)`` (first and last valid states are
    always included) and is the linear interpolation
    ``(1 - w) * states[i, floor(t_k)] + w * states[i, min(floor(t_k) + 1, L - 1)]`` with
    ``w = t_k - floor(t_k)``. Only steps ``< L`` are ever read, so values past a trajectory's
    end (padding, garbage, NaN) cannot influence its embedding. A length-1 trajectory repeats
    its one state.

    Args:
        states: (batch, time, state_dim) float, trajectories padded to a common ``time``.
        lengths: (batch,) int64, valid steps per trajectory, each in [1, time].
        num_points: samples per trajectory, >= 2.

    Returns:
        (batch, num_points * state_dim), ``states``' dtype and device; sample-major layout
        (the ``state_dim`` values of sample 0, then of sample 1, ...).

    Raises:
        ValueError: on bad shapes or dtypes, a length outside [1, time], or num_points < 2.
    """
    if states.dim() != 3 or not states.is_floating_point():
        raise ValueError(f"states must be a (batch, time, state_dim) float tensor; got "
                         f"{states.dtype} of shape {tuple(states.shape)}")
    batch, time, state_dim = states.shape
    _check_lengths(lengths, batch, time)
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2 (got {num_points}) to span start and end")

    lengths = lengths.to(states.device)
    last_step = (lengths - 1).to(torch.float64)  # (B,)
    fractions = torch.linspace(0.0, 1.0, num_points, dtype=torch.float64, device=states.device)
    sample_times = last_step[:, None] * fractions[None, :]  # (B, P)
    lower_step = sample_times.floor().long()  # (B, P), <= lengths - 1
    upper_step = torch.minimum(lower_step + 1, (lengths - 1)[:, None])  # (B, P)
    upper_weight = (sample_times - lower_step.to(torch.float64)).to(states.dtype)  # (B, P)

    def gather_steps(steps: Tensor) -> Tensor:  # (B, P) -> (B, P, state_dim)
        return torch.gather(states, 1, steps[:, :, None].expand(-1, -1, state_dim))

    lower_states = gather_steps(lower_step)  # (B, P, D)
    upper_states = gather_steps(upper_step)  # (B, P, D)
    weight = upper_weight[:, :, None]  # (B, P, 1)
    resampled = (1.0 - weight) * lower_states + weight * upper_states  # (B, P, D)
    return resampled.reshape(batch, num_points * state_dim)  # (B, P * D)


@TRAJECTORY_ENCODERS.register("vjepa2", config=VJEPA2EncoderConfig, runtime=("device",))
class VJEPA2TrajectoryEncoder:
    """SRPO's world-model trajectory embedding with a frozen V-JEPA 2 encoder.

    Per episode: :func:`sample_frames` picks ``num_points`` frames by siiRL's rule (uniformly
    over its valid steps, or cycling through an episode shorter than ``num_points``); they are preprocessed as transformers' ``VJEPA2VideoProcessor`` does (bilinear resize
    of the shortest edge to ``int(crop_size * 256 / 224)``, centre crop to ``crop_size``, scale to
    [0, 1], normalise with the ImageNet mean and std), encoded as one clip by
    ``VJEPA2Model.get_vision_features`` (``(num_tokens, hidden_size)``, ``num_tokens =
    num_points / tubelet_size * (crop_size / patch_size)²``), and the tokens are averaged (SRPO,
    Fei et al. 2025, §3: mean-pooled V-JEPA 2 tokens).

    Args:
        config: ``model_dir``, the directory of a saved ``VJEPA2Model`` (``config.json`` +
            weights, e.g. from ``save_pretrained``; nothing is downloaded), and ``batch_size``,
            the episodes encoded per forward pass (bounds memory).
        device: torch device the model runs on.

    Raises:
        FileNotFoundError: if ``model_dir`` has no ``config.json``.
    """

    reads_frames = True

    def __init__(self, config: VJEPA2EncoderConfig, device: str | torch.device = "cpu") -> None:
        from transformers import VJEPA2Model

        self.check_config(config)
        model = VJEPA2Model.from_pretrained(config.model_dir, local_files_only=True, trust_remote_code=False)
        self.model = model.to(device).eval().requires_grad_(False)
        self.device = torch.device(device)
        self.batch_size = config.batch_size

    @staticmethod
    def check_config(config: VJEPA2EncoderConfig) -> None:
        """The files the encoder reads, without loading them (the run's pre-flight calls it on
        the driver, before Ray starts).

        Raises:
            FileNotFoundError: ``model_dir`` has no ``config.json``.
            ValueError: ``points`` is no multiple of the model's ``tubelet_size`` (its config.json;
                2 where it says none, as transformers' ``VJEPA2Config``), or the file is no JSON
                mapping.
        """
        path = Path(config.model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"algorithm.vjepa2.model_dir {config.model_dir!r} has no config.json: save a "
                                    "VJEPA2Model there with save_pretrained")
        try:
            model_config = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not JSON ({err})") from None
        if not isinstance(model_config, dict):
            raise ValueError(f"{path} holds no mapping of the model's settings")
        tubelet = model_config.get("tubelet_size", 2)
        if isinstance(tubelet, int) and tubelet > 0 and config.points % tubelet:
            raise ValueError(f"algorithm.vjepa2.points {config.points} is no multiple of the model's tubelet_size "
                             f"{tubelet} ({path}): the frames enter it {tubelet} at a time")

    @property
    def embedding_dim(self) -> int:
        """Length of each embedding: the model's ``hidden_size``."""
        return self.model.config.hidden_size

    def preprocess(self, frames: Tensor) -> Tensor:
        """VJEPA2VideoProcessor's preprocessing of clips (see the class docstring).

        Args:
            frames: (batch, num_frames, height, width, 3) uint8 RGB.

        Returns:
            (batch, num_frames, 3, crop_size, crop_size) float32 on the model's device.
        """
        from transformers.utils.constants import (
            IMAGENET_DEFAULT_MEAN,
            IMAGENET_DEFAULT_STD,
        )

        batch, num_frames, height, width, _ = frames.shape
        crop = self.model.config.crop_size
        shortest = int(crop * 256 / 224)
        scale = shortest / min(height, width)
        resized_hw = (max(crop, round(height * scale)), max(crop, round(width * scale)))
        images = frames.to(self.device).reshape(batch * num_frames, height, width, 3).permute(0, 3, 1, 2)
        images = torch.nn.functional.interpolate(images.float(), size=resized_hw, mode="bilinear",
                                                 align_corners=False, antialias=True)  # (B*P, 3, h, w)
        top, left = (resized_hw[0] - crop) // 2, (resized_hw[1] - crop) // 2
        images = images[:, :, top:top + crop, left:left + crop] / 255.0  # (B*P, 3, crop, crop)
        mean = torch.tensor(IMAGENET_DEFAULT_MEAN, device=self.device)[None, :, None, None]
        std = torch.tensor(IMAGENET_DEFAULT_STD, device=self.device)[None, :, None, None]
        images = (images - mean) / std
        return images.reshape(batch, num_frames, 3, crop, crop)

    @torch.no_grad()
    def __call__(self, frames: Tensor, lengths: Tensor, num_points: int = 64) -> Tensor:
        """Embed episodes.

        Args:
            frames: (batch, time, height, width, 3) uint8 RGB, padded to a common ``time``.
            lengths: (batch,) int64, valid steps per episode, each in [1, time].
            num_points: frames sampled per episode (SRPO: 64), a multiple of the model's
                ``tubelet_size`` (2).

        Returns:
            (batch, hidden_size) float32 on the model's device.

        Raises:
            ValueError: on bad shapes or dtypes, a length outside [1, time], or a ``num_points``
                that is < 2 or not a multiple of ``tubelet_size``.
        """
        tubelet = self.model.config.tubelet_size
        if num_points % tubelet:
            raise ValueError(f"num_points must be a multiple of V-JEPA 2's tubelet_size {tubelet}, got {num_points}")
        clips = sample_frames(frames, lengths, num_points)  # (B, P, H, W, 3)
        embeddings = []
        for start in range(0, clips.shape[0], self.batch_size):
            pixels = self.preprocess(clips[start:start + self.batch_size])  # (b, P, 3, S, S)
            tokens = self.model.get_vision_features(pixels)  # (b, num_tokens, hidden)
            embeddings.append(tokens.float().mean(dim=1))  # (b, hidden)
        if not embeddings:
            return torch.zeros(0, self.embedding_dim, device=self.device)
        return torch.cat(embeddings)  # (B, hidden)


@TRAJECTORY_ENCODERS.register("policy_backbone", config=FrameEncoderConfig, runtime=("frame_features",))
class BackboneTrajectoryEncoder:
    """Trajectory embedding from the policy's own vision backbone.

    The backbone interface (what a policy provides, e.g. OpenVLA's vision tower with its
    preprocessing): ``frame_features(frames) -> features`` with ``frames`` ``(n, height, width,
    3)`` uint8 RGB (the simulator's upright images) and ``features`` ``(n, feature_dim)`` float,
    one vector per frame (pool patch tokens inside the callable); it is called without gradients.

    Per episode, :func:`sample_frames` picks ``num_points`` frames as for ``"vjepa2"`` (uniformly
    over its valid steps; an episode shorter than ``num_points`` is cycled through, as siiRL
    pads V-JEPA 2 clips), and their features are concatenated in sample order (sample-major, as
    ``"state_resample"`` lays out states), so the embedding of an episode of at least
    ``num_points`` steps keeps the order of progress.

    Args:
        config: its settings (which camera, how many frames; read by the reward).
        frame_features: the backbone callable described above.

    Raises:
        TypeError: if ``frame_features`` is not callable.
    """

    reads_frames = True

    def __init__(self, config: FrameEncoderConfig, frame_features: Callable[[Tensor], Tensor]) -> None:
        if not callable(frame_features):
            raise TypeError("frame_features must be a callable frames -> features, got "
                            f"{type(frame_features).__name__}")
        self.frame_features = frame_features

    @torch.no_grad()
    def __call__(self, frames: Tensor, lengths: Tensor, num_points: int = 16) -> Tensor:
        """Embed episodes.

        Args:
            frames: (batch, time, height, width, 3) uint8 RGB, padded to a common ``time``.
            lengths: (batch,) int64, valid steps per episode, each in [1, time].
            num_points: frames sampled per episode, >= 2.

        Returns:
            (batch, num_points * feature_dim) float, the backbone's dtype and device.

        Raises:
            ValueError: on bad inputs (see :func:`sample_frames`), or if the backbone does not
                return ``(n, feature_dim)`` for ``n`` frames.
        """
        clips = sample_frames(frames, lengths, num_points)  # (B, P, H, W, 3)
        batch = clips.shape[0]
        features = self.frame_features(clips.reshape(batch * num_points, *clips.shape[2:]))  # (B*P, D)
        if features.dim() != 2 or features.shape[0] != batch * num_points:
            raise ValueError(f"frame_features must return (n, feature_dim) for n = {batch * num_points} frames; "
                             f"got shape {tuple(features.shape)}")
        return features.reshape(batch, num_points * features.shape[1])  # (B, P * D)
