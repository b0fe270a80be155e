"""The algorithm sections of the run config: rewards, advantages, filters and the policy objective
(``algorithm``, with the settings of its selected components), the group filters
(``algorithm.filter_groups``), DAPO's overlong shaping (``algorithm.overlong_buffer``), the KL
coefficient controller (``algorithm.kl_ctrl``) and the value network (``critic``). The component
registries are imported lazily, when a section is validated."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Literal

from pydantic import ConfigDict, Field, PositiveInt, field_validator, model_validator

from vla_rl.config.base import _check_name, _Section
from vla_rl_core.components import ComponentConfigError, build_config


class KLControlSection(_Section):
    """Coefficient of the KL penalty in the reward (Ziegler et al. 2019 for ``adaptive``)."""

    type: Literal["fixed", "adaptive"] = Field("fixed", description="Fixed or adaptive coefficient.")
    kl_coef: float = Field(0.001, ge=0, description="The (initial) coefficient beta.")
    target_kl: float = Field(0.1, gt=0, description="KL the adaptive controller steers towards.")
    horizon: int = Field(10_000, gt=0, description="Samples over which the adaptive controller corrects fully.")


class GroupFilterSection(_Section):
    """The filters of the group filter node (``algorithm.filter_groups``; verl's
    ``algorithm.filter_groups``): which groups of a step carry a learning signal, and how many
    extra rollout rounds dynamic sampling may run to find enough of them."""

    zero_variance: bool = Field(
        True, description="Drop groups whose `metric` is the same for all their samples (DAPO, Yu et al. 2025, "
        "§3.2, eq. 11).")
    metric: Literal["rewards", "success"] = Field(
        "rewards", description="What the zero-variance filter compares within a group (verl's "
        "algorithm.filter_groups.metric): rewards (seq_reward: all equal, every GRPO advantage is 0), or "
        "success (acc, DAPO's accuracy: all solved or all failed, whatever shaping such as the overlong "
        "penalty adds to the rewards).")
    success_rate_band: tuple[float, float] | None = Field(
        None,
        description="Keep only groups whose success rate lies in [low, high] (SimpleVLA-RL's and "
        "the SRPO recipe's accuracy filter, e.g. [0.1, 0.9]); None keeps every group.",
    )
    max_refill_rounds: int = Field(
        3, ge=0, description="Dynamic sampling: extra rollout rounds per step while too few groups are kept."
    )

    @field_validator("success_rate_band")
    @classmethod
    def _check_band(cls, band: tuple[float, float] | None) -> tuple[float, float] | None:
        if band is not None and not 0.0 <= band[0] <= band[1] <= 1.0:
            raise ValueError(f"must satisfy 0 <= low <= high <= 1, got [{band[0]}, {band[1]}]")
        return band

    @property
    def enabled(self) -> bool:
        """Whether any filter is on."""
        return self.zero_variance or self.success_rate_band is not None


class OverlongBufferSection(_Section):
    """DAPO's soft overlong punishment (``algorithm.overlong_buffer``; Yu et al. 2025, §3.4,
    eq. 13; verl's ``reward_model.overlong_buffer``): a penalty that ramps linearly over the last
    ``len`` decision steps of the budget to ``-penalty_factor`` at it."""

    len: int = Field(0, ge=0, description="Decision steps before the budget where the penalty ramps (0: off).")
    penalty_factor: float = Field(1.0, ge=0, description="The penalty at the budget.")


#: Flat ``algorithm`` keys of earlier versions and where each setting lives now: a run directory
#: written before the move still loads (with a FutureWarning naming the new key).
MOVED_ALGORITHM_KEYS: dict[str, tuple[str, str]] = {
    "filter_zero_variance_groups": ("filter_groups", "zero_variance"),
    "success_rate_band": ("filter_groups", "success_rate_band"),
    "max_refill_rounds": ("filter_groups", "max_refill_rounds"),
    "overlong_buffer_len": ("overlong_buffer", "len"),
    "overlong_penalty_factor": ("overlong_buffer", "penalty_factor"),
    "srpo_reference_set": ("srpo", "reference_set"),
}


def current_setting(key: str) -> str:
    """The dotted setting ``key`` names now: a moved flat key of :data:`MOVED_ALGORITHM_KEYS`
    (``algorithm.max_refill_rounds``) becomes its new place
    (``algorithm.filter_groups.max_refill_rounds``); any other key is returned unchanged."""
    section, _, name = key.partition(".")
    moved = MOVED_ALGORITHM_KEYS.get(name) if section == "algorithm" else None
    return f"algorithm.{moved[0]}.{moved[1]}" if moved else key


#: The ``algorithm`` fields that select a registered component, and where its registry lives.
#: Each component's settings are the mapping ``algorithm.<component name>`` (e.g.
#: ``algorithm.gae: {gamma: 0.99, lam: 0.95}``), validated by the config class registered with it.
ALGORITHM_COMPONENTS: dict[str, tuple[str, str]] = {
    "reward": ("vla_rl.algorithms.rewards", "EMBODIED_REWARDS"),
    "trajectory_encoder": ("vla_rl.rewards.trajectory_encoders", "TRAJECTORY_ENCODERS"),
    "adv_estimator": ("vla_rl.algorithms.advantages", "ADVANTAGE_ESTIMATORS"),
    "policy_loss": ("vla_rl.algorithms.policy_loss", "POLICY_LOSSES"),
}


def component_registry(kind: str):
    """The registry of an ``algorithm`` component kind (:data:`ALGORITHM_COMPONENTS`), imported lazily."""
    module, attribute = ALGORITHM_COMPONENTS[kind]
    return getattr(importlib.import_module(module), attribute)


class AlgorithmSection(_Section):
    """Rewards, advantages, group filters and the policy objective (names resolve in
    ``vla_rl.algorithms``; docs/algorithms.md lists them with their sources).

    The settings of the selected reward, trajectory encoder, advantage estimator and policy
    loss live with those components: ``algorithm.<name>`` is a mapping validated by the config
    class the component registered (``algorithm.ppo_clip.clip_ratio_high=0.28``,
    ``algorithm.gae.lam=0.95``, ``algorithm.srpo.dbscan_eps=0.5``); :meth:`options` returns it.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    reward: str = Field("srpo", description="Embodied reward: 'srpo' (progress) or 'success' (binary).")
    trajectory_encoder: str = Field(
        "state_resample",
        description="Trajectory encoder of rewards that embed episodes (SRPO): 'state_resample' (the simulator "
        "state), 'policy_backbone' (the policy's own vision backbone on camera frames) or 'vjepa2' (a V-JEPA 2 "
        "video model from a local directory: algorithm.vjepa2.model_dir).",
    )
    overlong_buffer: OverlongBufferSection = Field(default_factory=OverlongBufferSection)
    adv_estimator: str = Field("grpo", description="Registered advantage estimator.")
    filter_groups: GroupFilterSection = Field(default_factory=GroupFilterSection)
    policy_loss: str = Field("ppo_clip", description="Registered policy objective.")
    ratio_granularity: Literal["token", "action", "chunk"] = Field(
        "action", description="One importance ratio per action dimension, per action, or per chunk."
    )
    loss_agg_mode: str = Field("seq-mean-token-mean", description="Loss aggregation mode.")
    loss_agg_normalizer: float | None = Field(
        None, gt=0, description="Constant of 'seq-mean-token-sum-norm' (null: the padded length)."
    )
    mask_truncated_responses: bool = Field(
        False, description="Text workflows: leave the responses cut at text.max_response_length (their last token is "
        "no end-of-sequence token) out of the actor's loss, its policy-gradient, entropy and KL terms alike; their "
        "rewards still count in their groups' advantages (TRL's mask_truncated_completions; DAPO's overlong "
        "filtering, Yu et al. 2025, section 3.4).",
    )
    entropy_coeff: float = Field(0.0, ge=0, description="Weight of the entropy bonus (aggregated like the loss).")
    use_kl_loss: bool = Field(False, description="Add a KL(policy || reference) term to the actor loss.")
    kl_loss_coef: float = Field(0.001, ge=0, description="Weight of the KL loss term.")
    kl_loss_type: str = Field("k3", description="KL estimator of the loss term (k1, abs, k2, k3).")
    use_kl_in_reward: bool = Field(False, description="Subtract a KL penalty from the rewards.")
    kl_penalty: str = Field("k1", description="KL estimator of the reward penalty (k1, abs, k2, k3).")
    kl_ctrl: KLControlSection = Field(default_factory=KLControlSection)

    @model_validator(mode="before")
    @classmethod
    def _move_flat_keys(cls, data: Any) -> Any:
        """Read the flat keys of earlier versions (:data:`MOVED_ALGORITHM_KEYS`) into their sections."""
        if not isinstance(data, dict) or not any(key in data for key in MOVED_ALGORITHM_KEYS):
            return data
        data = dict(data)
        for old, (section, key) in MOVED_ALGORITHM_KEYS.items():
            if old not in data:
                continue
            target = data.get(section) or {}
            if not isinstance(target, dict):
                continue  # the section's own validation names the problem
            if key in target:
                raise ComponentConfigError(f"algorithm.{old}", f"moved to algorithm.{section}.{key}, which is also "
                                           "set (by the template, or an override); set only the new key, e.g. "
                                           f"override algorithm.{section}.{key}=VALUE")
            warnings.warn(f"algorithm.{old} is now algorithm.{section}.{key}", FutureWarning, stacklevel=2)
            data[section] = {**target, key: data.pop(old)}
        return data

    @model_validator(mode="after")
    def _check_components(self) -> AlgorithmSection:
        if self.loss_agg_normalizer is not None and self.loss_agg_mode != "seq-mean-token-sum-norm":
            raise ValueError("algorithm.loss_agg_normalizer is the constant of loss_agg_mode "
                             f"'seq-mean-token-sum-norm' (loss_agg_mode is {self.loss_agg_mode!r}); set it to null")
        registries = {kind: component_registry(kind) for kind in ALGORITHM_COMPONENTS}
        for kind, registry in registries.items():
            _check_name(registry, getattr(self, kind), f"algorithm.{kind}")
        for name in ("kl_loss_type", "kl_penalty"):
            _check_name(_kl_estimators(), getattr(self, name), f"algorithm.{name}")
        _check_name(_loss_agg_modes(), self.loss_agg_mode, "algorithm.loss_agg_mode")
        for name, options in (self.model_extra or {}).items():
            owners = [registry for registry in registries.values() if name in registry]
            if not owners:
                components = sorted(str(n) for registry in registries.values() for n in registry.names())
                raise ComponentConfigError(
                    f"algorithm.{name}", f"unknown key; allowed: {', '.join(type(self).model_fields)}, or the "
                    f"settings of a component: {', '.join(components)}")
            config_class = owners[0].config_class(name)
            if config_class is None:
                raise ComponentConfigError(f"algorithm.{name}", f"{owners[0].kind} {name!r} takes no settings")
            if not isinstance(options, dict):
                raise ComponentConfigError(f"algorithm.{name}", f"must be a mapping of {config_class.__name__} "
                                           f"settings, got {options!r}")
        # the selected components' settings, defaults included; an unselected one's are never read (an
        # override of them is refused as such: unselected_settings), and are validated once selected
        for kind in ALGORITHM_COMPONENTS:
            if kind != "trajectory_encoder" or self.embeds_trajectories():  # else never read (vjepa2's model_dir)
                self.options(kind)
        return self

    def embeds_trajectories(self) -> bool:
        """Whether :attr:`reward` scores trajectory embeddings (``embeddings=True`` in its registry:
        SRPO), the only reader of :attr:`trajectory_encoder` and its settings."""
        return component_registry("reward").traits(self.reward).embeddings

    def unselected_settings(self) -> dict[str, str]:
        """``{"algorithm.<setting>": why}`` for each component's settings this section holds while
        another component of its kind is selected (``algorithm.gae`` under ``adv_estimator: grpo``),
        the trajectory encoder's under a reward that embeds no episodes, and the overlong
        penalty's factor without an overlong buffer: a template may carry them (one that extends
        another and switches the reward), an override that sets them is refused
        (:meth:`vla_rl.config.RunConfig.unread_settings`)."""
        unused = {}
        for name in self.model_extra or {}:
            for kind in ALGORITHM_COMPONENTS:
                registry = component_registry(kind)
                if name in registry and getattr(self, kind) != name:
                    unused[f"algorithm.{name}"] = (
                        f"the settings of {registry.kind} {name!r}, which this run does not use (algorithm.{kind} is "
                        f"{getattr(self, kind)!r}): select it with algorithm.{kind}={name}, or drop the override")
        if not self.embeds_trajectories():
            why = (f"read only by a reward that embeds episodes (algorithm.reward=srpo), and algorithm.reward is "
                   f"{self.reward!r}: set algorithm.reward=srpo too, or drop the override")
            unused |= {"algorithm.trajectory_encoder": why, f"algorithm.{self.trajectory_encoder}": why}
        if self.overlong_buffer.len == 0:
            unused["algorithm.overlong_buffer.penalty_factor"] = (
                "read only with an overlong buffer (algorithm.overlong_buffer.len > 0), and its len is 0: set "
                "algorithm.overlong_buffer.len too, or drop the override")
        return unused

    def options(self, kind: str) -> Any:
        """The typed settings of the component selected for ``kind`` (``"adv_estimator"``,
        ``"policy_loss"``, ``"reward"``, ``"trajectory_encoder"``): its config class built from
        ``algorithm.<name>`` (defaults where absent); None for a component without settings."""
        name = getattr(self, kind)
        config_class = component_registry(kind).config_class(name)
        if config_class is None:
            return None
        return build_config(config_class, (self.model_extra or {}).get(name), f"algorithm.{name}")


def _kl_estimators():
    from vla_rl.algorithms.kl import KL_ESTIMATORS

    return KL_ESTIMATORS


def _loss_agg_modes():
    from vla_rl.algorithms.aggregation import LOSS_AGG_MODES

    return LOSS_AGG_MODES


class CriticSection(_Section):
    """The value network of templates with a critic (PPO with GAE)."""

    hidden_sizes: list[PositiveInt] = Field(default_factory=lambda: [256, 256],
                                            description="Hidden layer widths (none: a linear critic).")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate of the critic.")
    cliprange_value: float | None = Field(
        0.5, gt=0, description="Value clipping around the rollout-time values (null: plain squared error)."
    )
    loss_agg_mode: str = Field("token-mean", description="Aggregation of the value loss over decision steps.")

    @model_validator(mode="after")
    def _check_mode(self) -> CriticSection:
        _check_name(_loss_agg_modes(), self.loss_agg_mode, "critic.loss_agg_mode")
        return self
