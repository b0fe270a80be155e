"""Policies: one folder per policy (``configuration_<name>.py``, ``modeling_<name>.py``), a
registry of policy classes and the factory :func:`make_policy`.

Importing this package stays light (no torch): the registry imports a built-in policy's module
when a lookup first names it, and all of them for a listing or an unknown name
(:class:`vla_rl_core.registry.Registry`, ``builtins``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from vla_rl_core.registry import Registry

if TYPE_CHECKING:
    import torch

    from policies.base import Policy

PolicyT = TypeVar("PolicyT", bound="type[Policy]")

#: Each built-in policy's module, imported when a lookup first names it (an MLP run never imports
#: transformers for the VLA policies).
POLICIES: Registry[type[Policy]] = Registry("policy", builtins={
    "mlp": "policies.mlp.modeling_mlp",
    "openvla": "policies.openvla.modeling_openvla",
    "openvla_oft": "policies.openvla_oft.modeling_openvla_oft",
    "pi0": "policies.pi0.policy_pi0",
})


def register_policy(cls: PolicyT) -> PolicyT:
    """Class decorator registering a :class:`~policies.base.Policy` subclass under ``cls.name``.

    Raises:
        vla_rl_core.registry.RegistryError: the name is already registered.
    """
    POLICIES.register(cls.name)(cls)
    return cls


def available_policies() -> list[str]:
    """Names of the registered policies (built-ins included), sorted."""
    return [str(name) for name in POLICIES.names()]


def make_policy(name: str, config: Any, device: torch.device | str | None = None) -> Policy:
    """Build the policy registered as ``name`` from its config.

    Args:
        name: registered policy name: ``"mlp"``, ``"openvla"``, ``"openvla_oft"``, ``"pi0"``.
        config: an instance of that policy's ``config_class``.
        device: where the policy is put (None: the CPU). A policy that ``builds_on_device``
            (OpenVLA, OpenVLA-OFT, π0) reads a checkpoint's weights straight onto it; any other
            is built on the CPU and moved.

    Raises:
        vla_rl_core.registry.RegistryError: ``name`` is unknown; the message lists the known names.
        TypeError: ``config`` is not an instance of the policy's ``config_class``.
    """
    cls = POLICIES.get(name)
    if not isinstance(config, cls.config_class):
        raise TypeError(
            f"policy {name!r} needs a {cls.config_class.__name__}, got {type(config).__name__}"
        )
    if device is None:
        return cls(config)
    return cls(config, device=device) if cls.builds_on_device else cls(config).to(device)
