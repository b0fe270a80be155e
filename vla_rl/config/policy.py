"""The policy sections of the run config: the embodied policy and its typed config (``policy``),
its LoRA adapters (``policy.lora``) and the behaviour-cloning warm start (``warm_start``); the
policy registry is imported lazily."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from pydantic import Field, field_validator, model_validator

from vla_rl.config.base import _check_name, _Section
from vla_rl_core.components import ComponentConfigError, build_config

ENV_DERIVED_POLICY_FIELDS: tuple[str, ...] = ("obs_dim", "action_dim", "num_tasks")
"""Policy config fields set from the simulator: its observation and action spaces, and the number
of tasks of its task set (``simulator.tasks``; 0 without one)."""


class LoraSection(_Section):
    """LoRA adapters (Hu et al. 2021, arXiv:2106.09685) injected with peft into the policy's linear
    layers when the policy is built: only the adapters (and ``trainable_modules``) train.

    Supported by the OpenVLA and OpenVLA-OFT policies and the text workflow's causal LM; the
    parameters a policy freezes itself (the vision towers' unused last block) get no adapter.
    """

    rank: int = Field(32, ge=1, description="LoRA rank r (OpenVLA's fine-tuning uses 32); at most the largest "
                      "min(in_features, out_features) of the layers it adapts.")
    alpha: float | None = Field(
        None, gt=0, description="LoRA scaling numerator: the update is (alpha / rank) * B A (null: min(rank, 16), "
        "OpenVLA's choice).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: list[str] | None = Field(
        None, min_length=1,
        description="Names (last component, e.g. q_proj) of the linear layers that get an adapter, each of which "
        "must name a trainable linear layer of the policy (a name that names none is an error, found before the run "
        "starts where the policy's architecture is known then). null: the policy's default, every attention and MLP "
        "projection it has (q_proj, k_proj, v_proj, o_proj, out_proj, gate_proj, up_proj, down_proj).")
    trainable_modules: list[str] = Field(
        default_factory=list, description="Submodules of the policy trained fully besides the adapters, by attribute "
        "name (e.g. [proprio_projector] for OpenVLA-OFT's proprio projector); everything else is frozen.")

    @field_validator("target_modules", "trainable_modules")
    @classmethod
    def _check_names(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return None
        bad = [name for name in names if not name or not name.replace("_", "").replace(".", "").isalnum()]
        if bad:
            raise ValueError(f"module names must be non-empty identifiers such as q_proj, got {bad}")
        return names

    def apply_arguments(self) -> dict[str, Any]:
        """The keyword arguments of a policy's ``apply_lora`` for these settings."""
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "target_modules": None if self.target_modules is None else tuple(self.target_modules),
                "trainable_modules": tuple(self.trainable_modules)}


class PolicySection(_Section):
    """The policy: a registered name and the fields of its config class."""

    name: str = Field("mlp", description="Registered policy name.")
    config: dict[str, Any] = Field(
        default_factory=dict, description="Fields of the policy's config class; its observation and action "
        f"sizes ({', '.join(ENV_DERIVED_POLICY_FIELDS)}) come from the simulator.",
    )
    allow_partial_load: bool = Field(
        False, description="Accept a pretrained checkpoint (policy.config.model_path, text.model_path) whose weight "
        "names or shapes do not match the architecture: the parameters it does not cover keep their "
        "initialisation. Off: such a checkpoint is an error naming the first few tensors.",
    )
    lora: LoraSection | None = Field(
        None, description="LoRA adapters for the policy (OpenVLA, OpenVLA-OFT, the text workflow's causal LM); null: "
        "every parameter trains (docs/large_policies.md).")

    @model_validator(mode="after")
    def _check_config(self) -> PolicySection:
        self.policy_config()
        return self

    def policy_config(self, **from_env: int) -> Any:
        """The policy's typed config (its ``config_class``) built from ``config``.

        Args:
            from_env: the simulator's sizes (``obs_dim``, ``action_dim``, ``num_tasks``) for the
                fields of :data:`ENV_DERIVED_POLICY_FIELDS` the config class declares; omitted (when
                a template loads, before any simulator exists) they take the field's default, or 1.

        Raises:
            ComponentConfigError: an unknown policy or one whose class leaves abstract methods of
                :class:`policies.base.Policy` undefined, an ``env``-derived field set in ``config``,
                or a ``config`` the config class rejects (the error names the field).
        """
        from policies import POLICIES
        from vla_rl_core.components import config_fields

        _check_name(POLICIES, self.name, "policy.name")
        policy_class = POLICIES.get(self.name)
        if inspect.isabstract(policy_class):  # a plug-in's class that would fail only when a worker builds it
            raise ComponentConfigError("policy.name", f"{self.name!r} ({policy_class.__module__}."
                                       f"{policy_class.__qualname__}) does not define "
                                       f"{', '.join(sorted(policy_class.__abstractmethods__))} of policies.base.Policy")
        config_class = policy_class.config_class
        declared = config_fields(config_class)
        for field in ENV_DERIVED_POLICY_FIELDS:
            if field in self.config and field in declared:
                raise ComponentConfigError(f"policy.config.{field}", "is set from the simulator's spaces; remove it")
        defaults = {f.name: f.default for f in dataclasses.fields(config_class)
                    if f.default is not dataclasses.MISSING}
        sizes = {field: from_env.get(field, defaults.get(field, 1))
                 for field in ENV_DERIVED_POLICY_FIELDS if field in declared}
        return build_config(config_class, {**sizes, **self.config}, "policy.config")

    def without_action_distribution(self) -> tuple[str, str] | None:
        """Why the policy has no distribution over its actions (a deterministic head: no sampling,
        no log-probs), or None when it has one (:meth:`policies.base.Policy.without_action_distribution`).

        Returns:
            ``("policy.config.<field>", reason)`` or None.
        """
        from policies import POLICIES

        policy_config = self.policy_config()
        problem = POLICIES.get(self.name).without_action_distribution(policy_config)
        return None if problem is None else (f"policy.config.{problem[0]}", problem[1])


class WarmStartSection(_Section):
    """Behaviour cloning from scripted demonstrations before RL (0 demos: no warm start)."""

    num_demos: int = Field(2, ge=0, description="Demonstrations used for behaviour cloning.")
    demo_init_state_offset: int = Field(
        2_000_000_000, ge=0, description="Demonstration initial-state ids start here (disjoint from training)."
    )
    bc_steps: int = Field(1500, ge=0, description="Gradient steps of behaviour cloning.")
    bc_lr: float = Field(1e-3, gt=0, description="Adam learning rate for behaviour cloning.")
    bc_batch_size: int = Field(256, ge=1, description="Transitions per behaviour-cloning minibatch.")
    norm_init_states: int = Field(
        0, ge=0,
        description="First observations of this many training initial states join the demonstrations "
        "in the observation-normalisation statistics (0: demonstrations only), so that features a "
        "few demonstrations leave nearly constant (e.g. the cube's y) get the scale they vary by.",
    )
    obs_std_floor: float = Field(
        0.1, gt=0,
        description="Smallest per-feature scale of the flat-state normalisation (units of the state: metres, "
        "unitless for quaternions), for the MLP's warm start and the critic. Features two demonstrations "
        "leave nearly constant (the hand's orientation, the cube's y) are scaled by at most 1/floor; 0.01 "
        "made them 10x more sensitive and left RL on Lift a lottery over seeds (docs/seeds/embodied_srpo).",
    )
    demo_store: str | None = Field(
        None, description="zarr store of demonstrations (created if missing); default: in the run dir."
    )
    dataset: str | None = Field(
        None, description="A LeRobot dataset (format v3.0, a local root directory) whose first num_demos episodes "
        "are cloned instead of the scripted expert's demonstrations (docs/datasets.md).",
    )
    dataset_keys: dict[str, str] = Field(
        default_factory=lambda: {"observation.state": "state", "action": "actions"},
        description="warm_start.dataset's features -> what the policy reads: 'state', 'actions', "
        "'<camera>_image' (e.g. observation.images.agentview: agentview_image).",
    )


def takes_lora(policy_name: str) -> bool:
    """Whether the embodied policy ``policy_name`` takes LoRA adapters (``policy.lora``)."""
    from policies import POLICIES

    return callable(getattr(POLICIES.get(policy_name), "apply_lora", None))


def _check_lora_support(policy_name: str) -> None:
    """Raise naming ``policy.lora`` when the embodied policy ``policy_name`` cannot take LoRA adapters."""
    from policies import POLICIES

    if not takes_lora(policy_name):
        supported = sorted(name for name in POLICIES.names() if takes_lora(name))
        raise ComponentConfigError("policy.lora", f"the {policy_name!r} policy takes no LoRA adapters; policies that "
                                   f"do: {', '.join(supported)} (and the text workflow's causal LM)")
