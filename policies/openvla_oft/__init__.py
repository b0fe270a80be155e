"""OpenVLA-OFT policy: parallel decoding of an action chunk over empty placeholders, with
discrete bins (RL) or the L1-regression head (supervised).

``OpenVLAOFTPolicyConfig`` imports without torch; ``OpenVLAOFTPolicy`` is imported on first
access.
"""

from __future__ import annotations

from typing import Any

from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig

__all__ = ["OpenVLAOFTPolicy", "OpenVLAOFTPolicyConfig"]


def __getattr__(name: str) -> Any:
    if name == "OpenVLAOFTPolicy":
        from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

        return OpenVLAOFTPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
