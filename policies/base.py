"""The policy contract every policy implements (sampling with log-probs, log-prob and entropy of
given actions, behaviour cloning), in the spirit of LeRobot's ``PreTrainedPolicy`` plus what RL
needs.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor


class Policy(torch.nn.Module, abc.ABC):
    """Base class of all policies.

    Subclasses set two class attributes, checked when the subclass is defined:

    - ``name``: the registry name (non-empty ``str``), e.g. ``"mlp"``;
    - ``config_class``: the dataclass type of the policy's config.

    An intermediate abstract base may skip the check with ``class Base(Policy, abstract=True)``.

    Shapes: ``batch`` observations of ``obs_dim`` features; actions come in chunks of
    ``chunk_size`` steps of ``action_dim`` values. Policies of camera observations (OpenVLA,
    OpenVLA-OFT) take a ``tensordict.TensorDict`` of batch size ``(batch,)`` instead of the flat
    tensor: the simulator's observation (state, uint8 camera images, encoded instruction; see
    :mod:`vla_rl_core.observations`), which their processor turns into model inputs.

    Actions: :meth:`sample_actions` returns the policy's own actions (what the RL loss scores);
    :meth:`env_actions` maps them to the simulator's units (identity by default), given the
    observations they were sampled from (π0's state-relative actions add the state back).

    Deterministic policies: a policy whose config gives it no distribution over actions
    (:meth:`without_action_distribution`, e.g. OpenVLA-OFT's L1-regression head) acts only
    through :meth:`predict_action_chunk`; its :meth:`sample_actions` and log-prob methods raise.
    It can be evaluated under the greedy protocol, not sampled or trained by RL (the planner
    refuses those templates).

    Every policy keeps its config as ``self.config``.

    Exact log-probs, so that the first ratio of an on-policy update is exactly 1 at every ratio
    granularity (see :mod:`vla_rl.algorithms.granularity`):

    - sampling and :meth:`log_prob_and_entropy_per_dim` use the same distribution, and the
      log-probs :meth:`sample_actions` returns equal ``log_prob_and_entropy_per_dim(obs,
      actions)[0].sum(-1)`` bit for bit; a policy whose sampling pass is computed otherwise than
      its training forward (OpenVLA decodes with a KV cache and scores its tokens in that pass,
      sparing a second forward) declares ``sampled_log_probs_recomputed = False``: equal up to
      float rounding;
    - every sample's values are batch-invariant: they do not depend on which other samples share
      its batch, so the rollout (a few running environments per call) and the trainer
      (minibatches of whole episodes) compute identical numbers. BLAS libraries choose kernels
      with different summation orders for different batch sizes (and a row's position in the
      batch can matter too), so a policy has to arrange this, e.g. by computing each row's
      matrix products on their own as the MLP policy's ``BatchInvariantLinear`` does. A policy
      that cannot (transformers models: ``batch_invariant = False``) gives values that differ
      across batch shapes by float rounding only, so the first ratio is 1 up to rounding.
    """

    name: ClassVar[str]
    config_class: ClassVar[type]
    #: Whether each row's log-probs are bit-identical whatever else shares its batch.
    batch_invariant: ClassVar[bool] = True
    #: Whether :meth:`sample_actions`'s log-probs are bit-identical to the training forward's.
    sampled_log_probs_recomputed: ClassVar[bool] = True
    #: Whether the constructor takes ``device`` and reads a checkpoint's weights straight onto
    #: it (:func:`policies.make_policy`); otherwise the policy is built on the CPU and moved.
    builds_on_device: ClassVar[bool] = False

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        """Check the required class attributes.

        Raises:
            TypeError: ``name`` is missing or not a non-empty str, or ``config_class`` is
                missing or not a dataclass type.
        """
        super().__init_subclass__(**kwargs)
        if abstract:
            return
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"policy class {cls.__qualname__} must set the class attribute `name` to a "
                f"non-empty str (its registry name), got {name!r}"
            )
        config_class = getattr(cls, "config_class", None)
        if not (isinstance(config_class, type) and dataclasses.is_dataclass(config_class)):
            raise TypeError(
                f"policy class {cls.__qualname__} must set the class attribute `config_class` "
                f"to its config dataclass, got {config_class!r}"
            )

    @property
    def device(self) -> torch.device:
        """The device of the policy's parameters (its inputs go there, its outputs come from there)."""
        return next(self.parameters()).device

    @classmethod
    def without_action_distribution(cls, config: Any) -> tuple[str, str] | None:
        """Why a policy of ``config`` has no distribution over its actions, or None when it has
        one (the default: every policy samples and scores actions).

        Args:
            config: an instance of ``config_class``.

        Returns:
            ``(field, reason)``: the field of ``config`` that makes the policy deterministic and
            why, a phrase that follows the field's name (the planner says
            ``policy.config.<field> <reason>``), or None.
        """
        return None

    @property
    def has_action_distribution(self) -> bool:
        """Whether :meth:`sample_actions` and the log-prob methods work (see
        :meth:`without_action_distribution`); False: act with :meth:`predict_action_chunk`."""
        return self.without_action_distribution(self.config) is None

    @torch.no_grad()
    def predict_action_chunk(self, obs: Tensor) -> Tensor:
        """The deterministic action chunk (the greedy protocol): the mode,
        ``sample_actions(obs, greedy=True)`` without its log-probs, by default; a policy without
        an action distribution overrides it.

        Args:
            obs: observations as :meth:`sample_actions` takes them, batch ``batch``.

        Returns:
            ``(batch, chunk_size, action_dim)`` float32 policy actions (feed :meth:`env_actions`).
        """
        return self.sample_actions(obs, greedy=True)[0]

    def use_tasks(self, simulator: str, env_configs: Sequence[Any]) -> None:
        """Prepare the policy to act in these tasks of a registered simulator (one batch of
        observations may mix them); nothing by default. The workers call it when the policy is
        built (the run's own tasks) and around each evaluation task's rollouts.

        Args:
            simulator: the registered simulator name (``"libero"``).
            env_configs: the tasks' typed simulator configs (its ``config_class``), at least one.

        Raises:
            ValueError: the policy cannot act in these tasks (the message says which setting to change).
        """

    def fsdp_units(self) -> list[torch.nn.Module | FSDPGroup]:
        """The blocks FSDP2 shards one by one (``fully_shard`` on each, then on the policy): their
        parameters are all-gathered just before their forward and freed after it, so every block
        must be *called* (its ``forward``, or an :class:`FSDPGroup`'s forward method), never only
        its submodules. Default: the transformer blocks of the transformers models inside the
        policy (:func:`transformer_blocks`); a policy of other modules, or one that runs a
        transformers block's submodules itself (π0's joint layers), overrides it."""
        return transformer_blocks(self)

    def checkpoint_activations(self) -> int | None:
        """Turn on activation checkpointing of the policy's own blocks, for a policy whose blocks
        the generic way (transformers' ``gradient_checkpointing_enable``, or torch's
        ``checkpoint_wrapper`` around :meth:`fsdp_units`) would miss because it never calls them
        through their ``forward`` (π0). Default: None, the generic way applies.

        Returns:
            the number of blocks that now recompute their activations in the backward pass, or
            None.
        """
        return None

    @property
    @abc.abstractmethod
    def chunk_size(self) -> int:
        """Number of future actions emitted per observation (1 for single-step policies)."""

    @property
    @abc.abstractmethod
    def action_dim(self) -> int:
        """Number of values per action."""

    @property
    def own_action_dim(self) -> int:
        """Values per chunk position of the policy's own actions: what :meth:`sample_actions` and
        :meth:`predict_action_chunk` return, the rollout stores and
        :meth:`log_prob_and_entropy_per_dim` scores, ``(batch, chunk_size, own_action_dim)``.
        ``action_dim`` by default; wider where the own actions carry more than the executed action
        (π0: its whole denoising chain, ``(num_steps + 1) * max_action_dim``), which
        :meth:`env_actions` maps to ``action_dim`` values."""
        return self.action_dim

    @property
    def bc_chunk_size(self) -> int:
        """Demonstrated actions per observation that :meth:`bc_loss` takes: ``chunk_size`` by
        default; a policy that executes only a prefix of what it predicts fits the whole prediction
        (π0 with ``executed_actions``: the model's chunk)."""
        return self.chunk_size

    @classmethod
    def planned_action_sizes(cls, config: Any) -> tuple[int | None, int | None]:
        """``(chunk_size, own_action_dim)`` of a policy of ``config``, without building it (``vla-rl
        plan``'s traffic estimate); None for a size only the built policy knows. Default: the
        config's ``chunk_size`` (1 without one) and its ``action_dim``.

        Args:
            config: an instance of ``config_class`` (its simulator-derived sizes filled in).
        """
        action_dim = getattr(config, "action_dim", None)
        return int(getattr(config, "chunk_size", 1)), None if action_dim is None else int(action_dim)

    @classmethod
    def unscored_own_elements(cls, config: Any) -> str | None:
        """Why some elements of this policy's own actions are never scored (their per-element
        log-probs and entropies are always exactly 0), or None when every element is (the
        default). Such zeros are exact in the sums of the ``action`` and ``chunk`` ratio
        granularities but would count as units of a ``token``-level mean, so the planner refuses
        that granularity for such a policy.

        Args:
            config: an instance of ``config_class``.

        Returns:
            a phrase that follows ``the <name> policy``, e.g. ``"scores only ... of its own actions"``.
        """
        return None

    @abc.abstractmethod
    def sample_actions(
        self,
        obs: Tensor,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """Sample action chunks and their log-probabilities, without tracking gradients.

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            greedy: return the most likely actions (the mode) instead of a sample.
            generator: random generator (on any device: :func:`policies.sampling.draw`); the global one if ``None``.
            temperature: > 0, how spread the sampling distribution is relative to the trained one
                (1.0: the trained distribution, which training always uses; ignored when
                ``greedy``). Each policy documents its meaning (Gaussian: the std is scaled by it;
                categorical: the logits are divided by it); the returned log-probs are those of
                the tempered distribution.

        Returns:
            ``actions`` ``(batch, chunk_size, action_dim)`` float32 and ``log_probs``
            ``(batch, chunk_size)`` float32: log-probability of each step's action (summed over
            action dimensions).

        Raises:
            ValueError: ``obs`` has the wrong shape, or ``temperature`` is not > 0.
        """

    @abc.abstractmethod
    def log_prob_and_entropy_per_dim(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probability and entropy of each action dimension under the sampling distribution.

        The dimensions of one action are independent given the observation (a factorised
        Gaussian, or one categorical per action token), so a step's log-probability and entropy
        are the sums over its dimensions.

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            actions: ``(batch, chunk_size, action_dim)`` actions as returned by
                :meth:`sample_actions`.

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, chunk_size, action_dim)`` float32,
            differentiable, batch-invariant.

        Raises:
            ValueError: ``obs`` or ``actions`` has the wrong shape.
        """

    def log_prob_and_entropy(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Log-probabilities and entropies of given actions, summed over action dimensions.

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            actions: ``(batch, chunk_size, action_dim)`` actions as returned by
                :meth:`sample_actions`.

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, chunk_size)`` float32, differentiable;
            ``log_probs`` equal the sampled ones bit for bit.

        Raises:
            ValueError: ``obs`` or ``actions`` has the wrong shape.
        """
        log_probs, entropy = self.log_prob_and_entropy_per_dim(obs, actions)
        return log_probs.sum(dim=-1), entropy.sum(dim=-1)

    def model_ready_observations(self, obs: Any, mask: Tensor | None = None) -> Any:
        """Observations with their per-observation preprocessing done once, for several passes
        over them (an update's epochs, behaviour cloning's steps): every method that reads
        observations reads the result as it reads ``obs``, with bit-identical outputs.

        Camera policies resize each configured ``<camera>_image`` frame to their vision input
        (π0, OpenVLA) and return it as ``<camera>_model_image`` in place of the frame; the
        default (state vectors) returns ``obs`` itself.

        Args:
            obs: observations as the policy reads them (a TensorDict of camera observations of
                any batch shape, e.g. ``(n, T + 1)``, or a flat tensor).
            mask: optional bool of ``obs``' batch shape: only those observations are prepared
                (the others' model frames are 0 and must not be read).

        Returns:
            A new TensorDict (``obs`` is not modified), or ``obs`` itself when there is nothing
            to prepare.
        """
        return obs

    def env_actions(self, actions: Tensor, obs: Any = None) -> Tensor:
        """The simulator's actions for the policy's actions (identity: the MLP acts in the
        simulator's units; OpenVLA de-normalises its bin values).

        Args:
            actions: ``(batch, chunk_size, own_action_dim)`` as returned by :meth:`sample_actions`.
            obs: the observations the actions were sampled from, batch ``batch`` (as
                :meth:`sample_actions` took them), or None. Only a policy whose actions are
                relative to the observation reads it (π0 with ``delta_action_mask``, which raises
                without it); the engine always passes it.

        Returns:
            float32 ``(batch, chunk_size, action_dim)`` in the simulator's units.
        """
        return actions

    @property
    def actions_are_env_actions(self) -> bool:
        """Whether the policy's actions are the simulator's: its class keeps the identity
        :meth:`env_actions` of this base class (the MLP). False for a policy that overrides it
        (OpenVLA, OpenVLA-OFT de-normalise), even where the override happens to change nothing."""
        return type(self).env_actions is Policy.env_actions

    def actions_from_env(self, env_actions: Tensor, obs: Any = None) -> Tensor:
        """The policy's actions for demonstrated simulator actions (the inverse of
        :meth:`env_actions`, for behaviour cloning; identity by default).

        Args:
            env_actions: ``(..., action_dim)`` in the simulator's units; ``(batch, chunk,
                action_dim)`` from the warm start.
            obs: the observations the actions were taken in, batch ``batch``, or None (read only by
                a policy whose actions are relative to the observation; the warm start passes them).

        Returns:
            float32, same shape.
        """
        return env_actions

    def fit_observation_normalization(self, obs: Any) -> None:
        """Set input statistics from observations before behaviour cloning (the warm start calls
        it with the demonstrations' camera observations); policies without such statistics
        ignore it. Flat-state policies get theirs from ``set_obs_normalization`` instead.

        Args:
            obs: a ``TensorDict`` of simulator observations, batch size ``(batch,)``.
        """

    @abc.abstractmethod
    def bc_loss(self, obs: Tensor, expert_actions: Tensor) -> Tensor:
        """Behaviour-cloning loss on demonstrations.

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            expert_actions: ``(batch, chunk_size, action_dim)`` demonstrated actions.

        Returns:
            a differentiable scalar (0-d) loss.

        Raises:
            ValueError: ``obs`` or ``expert_actions`` has the wrong shape.
        """

    def forward(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """The training forward pass: :meth:`log_prob_and_entropy_per_dim`.

        Going through ``forward`` lets ``DistributedDataParallel`` prepare its gradient
        all-reduce for the backward pass.
        """
        return self.log_prob_and_entropy_per_dim(obs, actions)


@dataclasses.dataclass(frozen=True)
class FSDPGroup:
    """Modules FSDP2 shards as one unit (``fully_shard(list(modules))``: one all-gather and one
    reduce-scatter for all of them), for blocks a policy runs jointly instead of through each
    module's ``forward``: the unit is entered through ``modules[0].<forward_method>``, which FSDP
    registers as a forward (``torch.distributed.fsdp.register_fsdp_forward_method``) so that it
    unshards the whole group before the method and reshards it after.

    Attributes:
        modules: the grouped modules, at least one.
        forward_method: the name of the callable attribute of ``modules[0]`` the policy calls.
    """

    modules: tuple[torch.nn.Module, ...]
    forward_method: str


def enable_transformers_checkpointing(model: torch.nn.Module) -> int:
    """Turn on a transformers model's own activation checkpointing (non-reentrant
    ``torch.utils.checkpoint`` around each of its layers, run when the layer is called in
    training mode).

    Args:
        model: a transformers ``PreTrainedModel`` with ``supports_gradient_checkpointing``.

    Returns:
        the number of its layers that now checkpoint.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return sum(1 for module in model.modules()
               if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing)


def transformer_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The blocks of the transformers models inside ``module``: submodules whose class is named in
    a containing ``PreTrainedModel``'s ``_no_split_modules`` (decoder layers, ViT layers,
    embeddings), in ``module.modules()`` order (outer before inner), as verl's FSDP wrap policy
    picks them (``verl/utils/fsdp_utils.py``, ``get_fsdp_wrap_policy``).

    Returns:
        the blocks; empty when ``module`` holds no transformers model.
    """
    names: set[str] = set()
    for submodule in module.modules():
        names |= set(getattr(submodule, "_no_split_modules", None) or ())
    return [submodule for submodule in module.modules() if type(submodule).__name__ in names]


def cast_parameters(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast ``module``'s floating parameters to ``dtype`` in place (the same ``nn.Parameter``
    objects, so hooks and references to them stay valid), one at a time (each old tensor is freed
    as its cast replaces it, unless something else holds it); buffers keep their dtype, as under
    FSDP's mixed precision and as ``transformers`` builds a model in a dtype: computed constants
    such as rotary frequencies (``inv_freq``) and image mean/std stay float32 (in bfloat16 the
    rotary angle at position 280 is off by 0.34 rad)."""
    for parameter in module.parameters():
        if parameter.is_floating_point() and parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: ``cumsum(mask) - 1``, 0 on padding (the causal LM's and
    OpenVLA's language model inputs).

    Args:
        attention_mask: ``(batch, seq_len)`` 0/1.

    Returns:
        ``(batch, seq_len)`` int64.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
