"""Action protocols of an evaluation: greedy (the policy's mode) and sampled at a temperature."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Protocol:
    """How actions are chosen during an evaluation episode.

    Attributes:
        name: ``"greedy"`` or ``"sampled"``.
        greedy: take the policy's mode.
        temperature: the sampling temperature (``0.0`` for greedy, where it plays no part).
    """

    name: str
    greedy: bool
    temperature: float

    @property
    def label(self) -> str:
        """``greedy`` or ``sampled@T``, as reports show it."""
        return "greedy" if self.greedy else f"sampled@{self.temperature:g}"


def eval_protocols(eval_config) -> list[Protocol]:
    """The protocols of an ``eval`` config section, in its order (``sampled`` at ``eval.temperature``)."""
    return [Protocol("greedy", True, 0.0) if name == "greedy" else Protocol("sampled", False, eval_config.temperature)
            for name in eval_config.protocols]


class ProtocolPolicy:
    """A policy acting under a protocol, for :func:`vla_rl.rollout.embodied.rollout_episodes`.

    ``sample_actions(obs, greedy, generator)`` forwards to the wrapped policy with the protocol's
    temperature (the ``greedy`` argument of the caller is ignored: the protocol decides); a policy
    without an action distribution acts through ``predict_action_chunk`` under the greedy protocol
    only (:func:`~vla_rl.rollout.embodied.rollout_episodes` is called with ``greedy=protocol.greedy``).

    Args:
        policy: a :class:`policies.base.Policy`.
        protocol: the protocol.
    """

    def __init__(self, policy, protocol: Protocol) -> None:
        self.policy = policy
        self.protocol = protocol

    @property
    def chunk_size(self) -> int:
        return self.policy.chunk_size

    @property
    def own_action_dim(self) -> int:
        """Values per own action of the wrapped policy (``policy.own_action_dim``)."""
        return self.policy.own_action_dim

    @property
    def device(self):
        """The wrapped policy's device."""
        return self.policy.device

    def eval(self) -> ProtocolPolicy:
        """Put the wrapped policy in eval mode (as the rollout does with any policy)."""
        self.policy.eval()
        return self

    @property
    def has_action_distribution(self) -> bool:
        """Whether the wrapped policy samples and scores actions."""
        return self.policy.has_action_distribution

    def env_actions(self, actions: Tensor, obs=None) -> Tensor:
        """The wrapped policy's simulator actions for ``actions`` sampled from ``obs``."""
        return self.policy.env_actions(actions, obs)

    def predict_action_chunk(self, obs: Tensor) -> Tensor:
        """The wrapped policy's deterministic chunk ``(batch, chunk, own_action_dim)`` (the rollout
        asks for it under the greedy protocol, from a policy without an action distribution)."""
        return self.policy.predict_action_chunk(obs)

    def sample_actions(self, obs: Tensor, greedy: bool = False,
                       generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Observations (``(batch, obs_dim)`` or a camera TensorDict) -> own actions ``(batch,
        chunk, own_action_dim)`` and log-probs ``(batch, chunk)``."""
        if self.protocol.greedy:
            return self.policy.sample_actions(obs, greedy=True, generator=generator)
        return self.policy.sample_actions(obs, greedy=False, generator=generator,
                                          temperature=self.protocol.temperature)
