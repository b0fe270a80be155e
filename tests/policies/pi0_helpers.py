"""Shared by the π0 policy tests: the tiny policy config and camera observations."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from policies.pi0 import PI0PolicyConfig
from vla_rl_core import keys
from vla_rl_core.observations import encode_instruction

ACTION_DIM, PROPRIO_DIM = 3, 4  # the tiny model pads to max_action_dim 5, max_state_dim 6
INSTRUCTIONS = ("lift the cube", "open the top drawer of the cabinet")
STATISTICS = {"q01": [-0.5, -1.0, 0.0], "q99": [0.5, 2.0, 1.0], "mask": [True, True, False]}
MEAN_STD = {"mean": [0.5, -1.0, 2.0], "std": [2.0, 0.5, 0.25]}


def camera_obs(batch: int, seed: int, height: int = 32, width: int = 32) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)
    codes = np.stack([encode_instruction(INSTRUCTIONS[row % 2]) for row in range(batch)])
    return TensorDict({
        keys.OBS_STATE: torch.randn(batch, 5, generator=generator),
        f"agentview{keys.OBS_IMAGE_SUFFIX}": torch.randint(0, 256, (batch, height, width, 3), generator=generator,
                                                          dtype=torch.uint8),
        keys.OBS_INSTRUCTION: torch.from_numpy(codes),
    }, batch_size=[batch])


def tiny_config(**overrides) -> PI0PolicyConfig:
    fields = {"architecture": "tiny", "action_dim": ACTION_DIM, "proprio_dim": PROPRIO_DIM}
    return PI0PolicyConfig(**{**fields, **overrides})
