"""Configuration of the OpenVLA-OFT policy (no torch import: configs stay light)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.config_checks import is_int
from policies.openvla.configuration_openvla import (
    OpenVLAPolicyConfig,
    resolve_cameras,
    validate_common_fields,
)

#: Action heads: 256-bin tokens from the LM head (RL), or OFT's L1-regression MLPResNet head.
ACTION_HEADS = ("discrete", "l1_regression")


@dataclass
class OpenVLAOFTPolicyConfig(OpenVLAPolicyConfig):
    """Settings of :class:`policies.openvla_oft.modeling_openvla_oft.OpenVLAOFTPolicy`: those of
    :class:`~policies.openvla.configuration_openvla.OpenVLAPolicyConfig` (give exactly one of
    ``model_path`` and ``architecture``; ``unnorm_key``, ``action_statistics``, ``temperature``,
    ``gripper_postprocess``, ``dtype``, ``attn_implementation``, ``seed``, ``action_dim``,
    ``allow_pickle``, ``allow_partial_load`` mean what they mean there), with OpenVLA-OFT's
    defaults where they differ and its own fields.

    Attributes:
        model_path: a local OpenVLA-OFT checkpoint directory in the published layout (plus
            ``action_head--*checkpoint.pt`` / ``proprio_projector--*checkpoint.pt`` when used; those
            are read with torch's weights-only unpickler whatever ``allow_pickle`` says).
        chunk_size: actions decoded per forward pass (OFT's ``NUM_ACTIONS_CHUNK``: 8 for LIBERO).
        num_images: camera images per observation (OFT's ``num_images_in_input``: 1 third-person
            view, 2 with the wrist camera).
        proprio_dim: proprio features (8 for LIBERO) fed through OFT's proprio projector as one
            extra token after the patches; None: no proprio input. From simulator observations,
            the first ``proprio_dim`` features of the state (robosuite Lift: 5 = end-effector
            position and finger joints; LIBERO: 8 = position, axis-angle and fingers, as OFT's).
        action_head: one of ``ACTION_HEADS``: ``"discrete"`` (bins; sampling and log-probs for
            RL, as SimpleVLA-RL and SRPO use OFT) or ``"l1_regression"`` (the published LIBERO
            checkpoints' head, no action distribution: :meth:`bc_loss` is L1,
            :meth:`predict_action_chunk` regresses actions; greedy evaluation, no sampling or RL).
        stop_token_id: id of the token after the action placeholders (OFT's ``STOP_INDEX``,
            Llama's ``</s>`` = 2).
        cameras: simulator cameras of the ``num_images`` images, in order (``"<camera>_image"``
            entries of simulator observations); default ``("agentview", "robot0_eye_in_hand")[:num_images]``.
        image_resize: default ``"jpeg_lanczos3"``, OpenVLA-OFT's ``resize_image_for_policy``
            (``experiments/robot/openvla_utils.py``).
        center_crop: default on, as ``run_libero_eval.py``'s ``center_crop`` for the published
            checkpoints (trained with random-crop augmentation).
    """

    image_resize: str = "jpeg_lanczos3"
    center_crop: bool = True
    chunk_size: int = 8
    num_images: int = 1
    proprio_dim: int | None = None
    action_head: str = "discrete"
    stop_token_id: int = 2

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        validate_common_fields(self, type(self).__name__)
        for name in ("chunk_size", "num_images"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"OpenVLAOFTPolicyConfig.{name} must be a positive int, got {value!r}")
        if self.proprio_dim is not None and (not is_int(self.proprio_dim) or self.proprio_dim < 1):
            raise ValueError(
                f"OpenVLAOFTPolicyConfig.proprio_dim must be None or a positive int, got {self.proprio_dim!r}"
            )
        if self.action_head not in ACTION_HEADS:
            raise ValueError(
                f"OpenVLAOFTPolicyConfig.action_head {self.action_head!r} is unknown; use one of {ACTION_HEADS}"
            )
        if not is_int(self.stop_token_id) or self.stop_token_id < 0:
            raise ValueError(f"OpenVLAOFTPolicyConfig.stop_token_id must be a token id, got {self.stop_token_id!r}")
        self.cameras = resolve_cameras(self.cameras, self.num_images, type(self).__name__)
