"""OpenVLA policy: a Prismatic VLM (SigLIP/DINOv2 towers, MLP projector, Llama decoder) whose
actions are 256-bin tokens, with loading of published checkpoints.

The configs import without torch; ``OpenVLAPolicy`` is imported on first access.
"""

from __future__ import annotations

from typing import Any

from policies.openvla.configuration_openvla import (
    OpenVLAPolicyConfig,
    PrismaticArchitecture,
    VisionTowerConfig,
)

__all__ = ["OpenVLAPolicy", "OpenVLAPolicyConfig", "PrismaticArchitecture", "VisionTowerConfig"]


def __getattr__(name: str) -> Any:
    if name == "OpenVLAPolicy":
        from policies.openvla.modeling_openvla import OpenVLAPolicy

        return OpenVLAPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
