"""LoRA adapters on a policy's linear layers (Hu et al. 2021, arXiv:2106.09685), injected with
peft's ``inject_adapter_in_model`` (no ``PeftModel`` wrapper: module and parameter names keep
working), and folded back into the base weights for export.

Which parameters train afterwards: the adapters, plus the parameters of the policy's
``trainable_modules`` that were trainable before. A parameter the policy froze itself (the
vision towers' last block, which Prismatic's features never reach) stays frozen and its layer
gets no adapter: an adapter there would be a trainable parameter without a gradient, which DDP
refuses on the second minibatch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from vla_rl_core.components import ComponentConfigError

#: Marker of LoRA parameters in names (peft's ``lora_A`` / ``lora_B``).
LORA_MARKER = "lora_"


def inject_lora(model: nn.Module, rank: int, alpha: float | None, dropout: float,
                target_modules: Sequence[str], every_target: bool = True) -> list[str]:
    """Inject LoRA adapters into ``model``'s linear layers named in ``target_modules``, in place.

    Layers whose own parameters are all frozen get none. The adapters start as the identity
    (``B = 0``; ``A`` Gaussian, peft's ``init_lora_weights="gaussian"``) drawn from torch's global
    RNG: seed it identically on every worker. peft itself only refuses a list that matches no
    layer at all; with ``every_target`` (a list the user wrote) a name that matches none, a typo
    such as ``v_prj`` beside a valid ``q_proj``, is refused too, instead of training fewer
    adapters than asked for.

    Args:
        model: the module to adapt (a transformers model, the Prismatic VLM).
        rank: LoRA rank r >= 1.
        alpha: scaling numerator (the update is ``alpha / rank * B A``); None: ``min(rank, 16)``,
            OpenVLA's choice.
        dropout: dropout on the adapters' input, in [0, 1).
        target_modules: last name components of the layers to adapt (``q_proj``, ...).
        every_target: whether each name of ``target_modules`` must match a trainable linear
            layer (False for a default list covering several architectures).

    Returns:
        the names (relative to ``model``) of the adapted layers.

    Raises:
        ModuleNotFoundError: peft is not installed.
        vla_rl_core.components.ComponentConfigError: field ``target_modules``: no trainable
            linear layer of ``model`` matches it, or (``every_target``) one of its names (the
            message lists the names the linear layers have); field ``rank``: above every adapted
            layer's full rank ``min(in_features, out_features)``.
    """
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import cast_adapter_dtype

    frozen = [name for name, module in model.named_modules()
              if name and any(True for _ in module.parameters(recurse=False))
              and not any(p.requires_grad for p in module.parameters(recurse=False))]
    if every_target:
        check_target_modules(model, target_modules)
    _check_rank(model, rank, target_modules)
    config = LoraConfig(
        r=rank, lora_alpha=min(rank, 16) if alpha is None else alpha, lora_dropout=dropout,
        target_modules=list(target_modules), exclude_modules=frozen or None, init_lora_weights="gaussian",
    )  # fmt: skip
    try:
        inject_adapter_in_model(config, model)
    except ValueError as err:
        if "not found in the base model" not in str(err) and "no modules were" not in str(err).lower():
            raise
        raise ComponentConfigError("target_modules", f"no layer matches {list(target_modules)}; the policy's linear "
                                   f"layers are named {sorted(_linear_names(model))}") from err
    cast_adapter_dtype(model, "default")  # float32 adapters on a bfloat16 base: the optimizer's master weights
    return [name for name, module in model.named_modules() if isinstance(module, LoraLayer)]


def check_target_modules(model: nn.Module, target_modules: Sequence[str]) -> None:
    """Check that each name of ``target_modules`` is the last name component of a linear layer
    of ``model`` that has a trainable parameter, as :func:`inject_lora` adapts them; works on
    the ``meta`` device.

    Raises:
        vla_rl_core.components.ComponentConfigError: field ``target_modules``: the names that
            match no such layer, those matching only frozen layers, and the names the linear
            layers have.
    """
    trainable = {name.rpartition(".")[2] for name, module in model.named_modules()
                 if isinstance(module, nn.Linear) and any(p.requires_grad for p in module.parameters(recurse=False))}
    unmatched = [name for name in target_modules if name not in trainable]
    if unmatched:
        linear = _linear_names(model)
        frozen_only = [name for name in unmatched if name in linear]
        raise ComponentConfigError(
            "target_modules", f"{unmatched} name no trainable linear layer of the policy"
            + (f" ({frozen_only}: only layers the policy freezes itself)" if frozen_only else "")
            + f"; its linear layers are named {sorted(linear)}")


def _check_rank(model: nn.Module, rank: int, target_modules: Sequence[str]) -> None:
    """``rank`` is at most the largest full rank ``min(in_features, out_features)`` of the trainable
    linear layers ``target_modules`` names: above it, every adapter is over-complete, and a mistyped
    rank (10x, or 1e12) allocated factors larger than the model before any error.

    Raises:
        vla_rl_core.components.ComponentConfigError: field ``rank``.
    """
    layers = [(min(module.in_features, module.out_features), name) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and name.rpartition(".")[2] in target_modules
              and any(p.requires_grad for p in module.parameters(recurse=False))]
    if layers and rank > max(layers)[0]:
        full, name = max(layers)
        raise ComponentConfigError("rank", f"{rank} is above the full rank of every layer it adapts (the largest: "
                                   f"{full}, of {name}): use at most {full}")


def _linear_names(model: nn.Module) -> set[str]:
    """The last name components of ``model``'s linear layers."""
    return {name.rpartition(".")[2] for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def set_trainable(policy: nn.Module, trainable_modules: Sequence[str] = ()) -> list[str]:
    """Freeze everything of ``policy`` but its LoRA adapters and ``trainable_modules``.

    Args:
        policy: a policy holding injected adapters.
        trainable_modules: submodule paths of ``policy`` (``proprio_projector``) whose parameters
            keep training (those the policy froze itself stay frozen).

    Returns:
        the names of the trainable parameters.

    Raises:
        vla_rl_core.components.ComponentConfigError: field ``trainable_modules``: a name in it is
            not a submodule of ``policy`` (the message lists its submodules).
    """
    kept: set[int] = set()
    for path in trainable_modules:
        try:
            module = policy.get_submodule(path)
        except AttributeError:
            children = [name for name, child in policy.named_children() if child is not None]
            raise ComponentConfigError("trainable_modules", f"the policy has no submodule {path!r}; its submodules "
                                       f"are {children}") from None
        kept |= {id(p) for p in module.parameters() if p.requires_grad}
    trainable = []
    for name, parameter in policy.named_parameters():
        parameter.requires_grad_(LORA_MARKER in name or id(parameter) in kept)
        if parameter.requires_grad:
            trainable.append(name)
    return trainable


def merge_lora(model: nn.Module) -> int:
    """Fold ``model``'s LoRA adapters into their base layers and remove them (peft's
    ``LoraLayer.merge``, then the base layer takes the adapter layer's place): what is left has
    the names and shapes of the model without adapters.

    Returns:
        the number of merged layers (0 without adapters).
    """
    from peft.tuners.lora import LoraLayer

    merged = [(name, module) for name, module in model.named_modules() if isinstance(module, LoraLayer)]
    for name, module in merged:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, module.get_base_layer())
    return len(merged)


@torch.no_grad()
def merged_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state dict with its LoRA adapters folded into their base layers, the model
    left as it is: what :func:`merge_lora` would leave, without changing ``model``. An adapted
    layer's ``weight`` is ``W + alpha / r * B A`` (peft's ``get_delta_weight``), computed in the
    adapters' own dtype (float32, bfloat16 under FSDP's mixed precision; autocast off, whatever
    context the caller runs in) and cast to ``W``'s dtype, bit for bit what peft's
    ``LoraLayer.merge`` writes; its ``base_layer.`` names lose that component, the adapters' ``lora_`` entries are dropped.
    A model without adapters yields its state dict. Lazy: one merged weight at a time (TRL
    instead merges the adapters in place and unmerges them afterwards, which rounds a bfloat16
    base twice).

    Yields:
        ``(name, tensor)`` with the names of the model without adapters; tensors on the model's
        devices, in its dtypes.
    """
    from peft.tuners.lora import LoraLayer

    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    for name, tensor in model.state_dict().items():
        if LORA_MARKER in name:
            continue
        prefix, _, leaf = name.rpartition(".")
        owner = prefix.removesuffix(".base_layer")
        if owner == prefix or owner not in layers:
            yield name, tensor
            continue
        if leaf == "weight":
            with _no_autocast(tensor.device.type):
                delta = layers[owner].get_delta_weight("default")
            tensor = (tensor + delta).to(tensor.dtype)
        yield f"{owner}.{leaf}", tensor


def _no_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` off on ``device_type``: ``B @ A`` in the adapters' own dtype even when the
    caller runs under mixed precision (the vLLM weight sync runs inside the rollout's bfloat16
    autocast, which would round the delta to bfloat16 before it is added)."""
    if not torch.amp.is_autocast_available(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def has_lora(model: nn.Module) -> bool:
    """Whether ``model`` holds injected LoRA adapters."""
    return any(LORA_MARKER in name for name, _ in model.named_parameters())
