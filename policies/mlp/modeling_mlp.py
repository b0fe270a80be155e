"""MLP policy: a diagonal Gaussian over actions with a state-independent learnable log-std.

Actions are in [-1, 1] units. The Gaussian is not squashed: samples may leave [-1, 1] and the
environment clips them. Log-probabilities are those of the *unclipped* sampled action, so the
recomputed log-prob in the RL loss is exactly the one of the sample (a clipped action would have
a probability mass, not a density, at the bound).

The mean network's layers are :class:`BatchInvariantLinear`: each row's product with the weight
is computed on its own, so a sample's log-prob is bit-identical in the rollout (one row per
running environment) and in the trainer (minibatches of whole episodes), as the policy contract
requires. A plain ``nn.Linear`` on the whole batch is not: CPU BLAS picks other kernels, with
other summation orders, for other batch sizes, and even a row's position in the batch matters.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model, save_model
from tensordict import TensorDict
from torch import Tensor, nn

from policies import register_policy
from policies.base import Policy
from policies.checkpoint_files import (
    FieldError,
    compare_shapes,
    read_safetensors_header,
    staged_directory,
)
from policies.mlp.configuration_mlp import MLPPolicyConfig
from policies.normalization import fit_mean_std, mean_std_normalize
from policies.sampling import draw

#: Observation keys of task-set runs (those of :mod:`vla_rl_core.keys`; policies do not import the engine).
STATE_KEY, TASK_ID_KEY = "state", "task_id"
#: Smallest state scale :meth:`MLPPolicy.fit_observation_normalization` sets (units of the state),
#: as the flat-state warm start does: a feature the demonstrations leave constant must not blow up.
STATE_STD_FLOOR = 0.01

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
#: Files of a saved MLP policy (:meth:`MLPPolicy.save_pretrained`).
MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE = "config.json", "model.safetensors"


def _saved_fields(model_dir: Path) -> dict:
    """The :class:`MLPPolicyConfig` fields of a directory :meth:`MLPPolicy.save_pretrained` wrote.

    Raises:
        FileNotFoundError: ``config.json`` or ``model.safetensors`` is missing.
        ValueError: ``config.json`` is not valid JSON, not an MLP policy's, or lacks a required
            field or has one :class:`MLPPolicyConfig` does not (another version's, hand-edited).
    """
    for name in (MODEL_CONFIG_FILE, MODEL_WEIGHTS_FILE):
        if not (model_dir / name).is_file():
            raise FileNotFoundError(f"{model_dir / name} is missing (an MLP policy directory holds "
                                    f"{MODEL_CONFIG_FILE} and {MODEL_WEIGHTS_FILE}, as vla-rl export writes it)")
    try:
        fields = json.loads((model_dir / MODEL_CONFIG_FILE).read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{model_dir / MODEL_CONFIG_FILE}: not valid JSON ({error})") from None
    if not isinstance(fields, dict) or fields.pop("policy", None) != MLPPolicy.name:
        raise ValueError(f"{model_dir / MODEL_CONFIG_FILE} is not an MLP policy's configuration")
    fields.pop("model_path", None)
    known = {field.name for field in dataclasses.fields(MLPPolicyConfig)} - {"model_path"}
    required = [field.name for field in dataclasses.fields(MLPPolicyConfig)
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
    unknown, missing = sorted(set(fields) - known), [name for name in required if name not in fields]
    if unknown or missing:
        raise ValueError(f"{model_dir / MODEL_CONFIG_FILE}: "
                         + "; ".join(([f"fields an MLP policy's configuration does not have: {unknown}"] if unknown
                                      else []) + ([f"lacks {missing}"] if missing else []))
                         + f" (an MLP policy's fields are {sorted(known)}; re-export the run with vla-rl export)")
    return fields


class _RowwiseLinearFunction(torch.autograd.Function):
    """``y = x W^T + b`` with a forward that treats every row as its own matrix product.

    The forward is a batched product of ``(1, in)`` rows with the shared weight, so each output
    row comes from the same computation whatever the batch holds. The backward needs no such
    guarantee and uses plain matrix products (a batched backward would materialise one weight
    gradient per row).

    Under ``torch.autocast`` the product runs in autocast's dtype, as ``nn.Linear``'s would, and
    the backward pass in that dtype too (autocast is not active in the backward pass: torch's
    ``custom_fwd``/``custom_bwd`` recipe); the gradients are returned in the dtypes of ``x``,
    ``weight`` and ``bias`` (float32 master weights under mixed precision).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        device_type = x.device.type
        autocasting = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
        if autocasting:
            dtype = torch.get_autocast_dtype(device_type)
            x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
        ctx.save_for_backward(x, weight)
        rows = x.shape[0]
        # Written into a (B, out) tensor through a (B, 1, out) view of it: the output is no view
        # (FSDP2 warns of a module that returns one: an in-place op on it would skip its all-gather).
        out = x.new_empty(rows, weight.shape[0])
        with torch.autocast(device_type, enabled=False) if autocasting else contextlib.nullcontext():
            torch.baddbmm(bias.expand(rows, 1, -1), x.unsqueeze(1), weight.t().expand(rows, -1, -1),
                          out=out.unsqueeze(1))
        return out  # (B, out)

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, weight = ctx.saved_tensors
        grad_out = grad_out.to(x.dtype)  # autograd casts each gradient back to its input's dtype
        return grad_out @ weight, grad_out.t() @ x, grad_out.sum(dim=0)


class BatchInvariantLinear(nn.Linear):
    """``nn.Linear`` (same parameters and state-dict keys) whose output rows are bit-identical
    whatever else shares the batch; inputs are ``(batch, in_features)``."""

    def forward(self, x: Tensor) -> Tensor:
        return _RowwiseLinearFunction.apply(x, self.weight, self.bias)


@register_policy
class MLPPolicy(Policy):
    """Gaussian MLP policy over flat state, one action per observation (``chunk_size == 1``).

    ``mean = MLP((obs - obs_mean) / obs_std)`` and ``std = max(exp(log_std), min_std)`` with
    ``log_std`` of shape ``(action_dim,)`` shared by all states. ``obs_mean`` and ``obs_std``
    are buffers (saved in the state dict) set from demonstration statistics with
    :meth:`set_obs_normalization`; they default to the identity.

    Task sets (``config.num_tasks > 0``): observations are TensorDicts ``{"state": (batch,
    obs_dim), "task_id": (batch,) int64, ...}`` and the network reads ``[(state - obs_mean) /
    obs_std, one_hot(task_id)]``: the one-hot is appended after the normalisation, which never
    touches it. Other policies read a task's instruction instead.

    Args:
        config: the policy's :class:`MLPPolicyConfig`.

    Raises:
        TypeError: ``config`` is not an :class:`MLPPolicyConfig`.
    """

    name = "mlp"
    config_class = MLPPolicyConfig

    def __init__(self, config: MLPPolicyConfig) -> None:
        if not isinstance(config, MLPPolicyConfig):
            raise TypeError(f"MLPPolicy needs an MLPPolicyConfig, got {type(config).__name__}")
        super().__init__()
        self.config = config
        layers: list[nn.Module] = []
        in_features = config.obs_dim + config.num_tasks
        for width in config.hidden_sizes:
            layers += [BatchInvariantLinear(in_features, width), _ACTIVATIONS[config.activation]()]
            in_features = width
        layers.append(BatchInvariantLinear(in_features, config.action_dim))
        self.mean_net = nn.Sequential(*layers)
        log_std = torch.full((config.action_dim,), math.log(config.init_std))
        if config.learn_std:
            self.log_std = nn.Parameter(log_std)
        else:
            self.register_buffer("log_std", log_std)
        self.register_buffer("obs_mean", torch.zeros(config.obs_dim))
        self.register_buffer("obs_std", torch.ones(config.obs_dim))
        if config.model_path is not None:
            self.check_pretrained(config, sizes=True)
            self._load_weights(Path(config.model_path))

    @property
    def chunk_size(self) -> int:
        """Always 1: one action per observation."""
        return 1

    def fsdp_units(self) -> list[nn.Module]:
        """The mean network's linear layers (FSDP2 shards each; ``log_std`` stays with the root)."""
        return [layer for layer in self.mean_net if isinstance(layer, BatchInvariantLinear)]

    @property
    def action_dim(self) -> int:
        """Number of action values per step (``config.action_dim``)."""
        return self.config.action_dim

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write the policy as a model directory: ``config.json`` (``{"policy": "mlp", <the
        MLPPolicyConfig fields>}``) and ``model.safetensors`` (its state dict: weights, log-std,
        observation statistics). The directory appears atomically (written next to it, then renamed).

        Raises:
            FileExistsError: ``out_dir`` exists.
        """
        with staged_directory(out_dir) as staging:
            config = {"policy": self.name, **dataclasses.asdict(self.config)}
            del config["model_path"]  # where this policy came from, not what it is
            config["hidden_sizes"] = list(config["hidden_sizes"])
            (staging / MODEL_CONFIG_FILE).write_text(json.dumps(config, indent=2))
            save_model(self, str(staging / MODEL_WEIGHTS_FILE))
        return Path(out_dir)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> MLPPolicy:
        """Load a directory written by :meth:`save_pretrained`, strictly.

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: ``config.json`` is not an MLP policy's, or the weights do not fit it.
        """
        return cls(MLPPolicyConfig(**_saved_fields(Path(model_dir)), model_path=str(model_dir)))

    #: The fields of a saved policy that ``model_path`` must match (they shape its tensors): the
    #: template's, and the sizes the simulator gives (checked when the policy is built).
    ARCHITECTURE_FIELDS = ("hidden_sizes", "activation", "learn_std")
    SIZE_FIELDS = ("obs_dim", "action_dim", "num_tasks")

    @classmethod
    def check_pretrained(cls, config: MLPPolicyConfig, sizes: bool = False) -> None:
        """Check ``config.model_path`` without loading its weights (the pre-flight's check, which
        knows no simulator sizes yet; ``sizes``: the simulator's too, when the policy is built).

        Raises:
            FileNotFoundError: a file of the directory is missing.
            ValueError: ``config.json`` is not an MLP policy's, or ``model.safetensors`` is damaged,
                truncated (its header read: :func:`~policies.checkpoint_files.read_safetensors_header`)
                or holds other tensors than that configuration's (names or shapes).
            FieldError: an architecture field of ``config`` differs from the saved one (its
                ``field`` names it; the message gives both values), or (``sizes``, ``field``
                ``"model_path"``) the directory was saved for other observation, action or
                task-set sizes than the simulator's.
        """
        saved = _saved_fields(Path(config.model_path))
        weights, config_file = Path(config.model_path) / MODEL_WEIGHTS_FILE, Path(config.model_path) / MODEL_CONFIG_FILE
        with torch.device("meta"):  # the saved configuration's tensors, shapes only
            expected = cls(MLPPolicyConfig(**saved)).state_dict()
        found = {name: shape for name, (_, shape) in read_safetensors_header(weights).items()}
        mismatch = compare_shapes({name: tuple(tensor.shape) for name, tensor in expected.items()}, found)
        if mismatch:
            raise ValueError(f"{weights} does not hold the weights {config_file} describes: {mismatch.describe()}")
        for field in cls.ARCHITECTURE_FIELDS + (cls.SIZE_FIELDS if sizes else ()):
            ours = getattr(config, field)
            theirs = tuple(saved[field]) if field == "hidden_sizes" else saved.get(field)
            if ours == theirs:
                continue
            if field in cls.SIZE_FIELDS:  # the model directory does not fit the simulator: name model_path
                raise FieldError(f"{config.model_path} holds an MLP policy for {field} {theirs!r}, the simulator "
                                 f"gives {ours!r}: it was trained on another task or observation layout",
                                 "model_path")
            raise FieldError(f"{config.model_path} holds an MLP policy with {field} {theirs!r}, the config "
                             f"gives {ours!r}: set {field} to {theirs!r}", field)

    def _load_weights(self, model_dir: Path) -> None:
        """The weights, log-std and observation statistics of ``model_dir``, strictly.

        Raises:
            ValueError: the weights do not fit the policy.
        """
        missing, unexpected = load_model(self, str(model_dir / MODEL_WEIGHTS_FILE), strict=False)
        if missing or unexpected:
            raise ValueError(f"{model_dir / MODEL_WEIGHTS_FILE} does not fit the configuration: missing {missing}, "
                             f"unexpected {unexpected}")

    def set_obs_normalization(self, mean: Tensor | np.ndarray, std: Tensor | np.ndarray) -> None:
        """Set the observation normalisation from demonstration statistics.

        Args:
            mean: ``(obs_dim,)`` per-feature mean.
            std: ``(obs_dim,)`` per-feature standard deviation, all entries finite and > 0
                (floor constant features yourself, e.g. ``std.clip(1e-2)``).

        Raises:
            ValueError: wrong shape, non-finite values or a non-positive std.
        """
        mean_t = torch.as_tensor(mean, dtype=self.obs_mean.dtype)
        std_t = torch.as_tensor(std, dtype=self.obs_std.dtype)
        expected = (self.config.obs_dim,)
        if mean_t.shape != expected or std_t.shape != expected:
            raise ValueError(
                f"observation mean/std must have shape {expected}, got "
                f"{tuple(mean_t.shape)} and {tuple(std_t.shape)}"
            )
        if not (torch.isfinite(mean_t).all() and torch.isfinite(std_t).all()):
            raise ValueError("observation mean/std must be finite")
        if not (std_t > 0).all():
            bad = torch.nonzero(std_t <= 0).flatten().tolist()
            raise ValueError(
                f"observation std must be > 0; features {bad} are not (floor them, e.g. "
                "std.clip(1e-2), before calling)"
            )
        with torch.no_grad():
            self.obs_mean.copy_(mean_t)
            self.obs_std.copy_(std_t)

    def action_std(self) -> Tensor:
        """Standard deviation of the Gaussian: ``(action_dim,)``, action units."""
        return self.log_std.clamp(min=math.log(self.config.min_std)).exp()

    def fit_observation_normalization(self, obs: TensorDict) -> None:
        """Set the state normalisation from the ``state`` of observation TensorDicts (a task set's):
        per-feature mean and standard deviation, the scale floored at :data:`STATE_STD_FLOOR`.

        Args:
            obs: TensorDict of batch size ``(batch,)`` with ``state`` ``(batch, obs_dim)``.
        """
        state = obs[STATE_KEY].to(self.obs_mean.device, self.obs_mean.dtype)
        self.set_obs_normalization(*fit_mean_std(state, STATE_STD_FLOOR))

    def action_mean(self, obs: Tensor | TensorDict) -> Tensor:
        """Mean action of each observation.

        Args:
            obs: ``(batch, obs_dim)`` floating observations (cast to the parameters' dtype); with
                ``config.num_tasks > 0`` a TensorDict of ``state`` ``(batch, obs_dim)`` and
                ``task_id`` ``(batch,)`` int64 in ``[0, num_tasks)``.

        Returns:
            ``(batch, action_dim)`` mean actions in [-1, 1] units (not clipped), each row
            independent of the others bit for bit.

        Raises:
            ValueError: ``obs`` is not ``(batch, obs_dim)`` floating, or the task ids are missing
                or out of range.
        """
        state = obs[STATE_KEY] if isinstance(obs, TensorDict) else obs
        if state.ndim != 2 or state.shape[1] != self.config.obs_dim or not state.is_floating_point():
            raise ValueError(
                f"obs must be floating (batch, {self.config.obs_dim}), got "
                f"{tuple(state.shape)} {state.dtype}"
            )
        inputs = mean_std_normalize(state.to(self.obs_mean.device, self.obs_mean.dtype), self.obs_mean, self.obs_std)
        if self.config.num_tasks:
            inputs = torch.cat([inputs, self._task_one_hot(obs, len(state)).to(inputs.dtype)], dim=-1)
        return self.mean_net(inputs.to(self.mean_net[0].weight.dtype))  # a bfloat16 network's too

    def _task_one_hot(self, obs: Tensor | TensorDict, batch: int) -> Tensor:
        """``(batch, num_tasks)`` one-hot of the observations' task ids."""
        task_ids = obs.get(TASK_ID_KEY, None) if isinstance(obs, TensorDict) else None
        if task_ids is None:
            raise ValueError(f"this policy is conditioned on {self.config.num_tasks} tasks (num_tasks): its "
                             f"observations must be TensorDicts with {TASK_ID_KEY!r}, as a task set's pool gives them")
        task_ids = task_ids.reshape(batch).to(device=self.obs_mean.device, dtype=torch.int64)
        if task_ids.numel() and not (0 <= int(task_ids.min()) and int(task_ids.max()) < self.config.num_tasks):
            raise ValueError(f"task ids must lie in [0, {self.config.num_tasks}), got {sorted(set(task_ids.tolist()))}")
        return nn.functional.one_hot(task_ids, self.config.num_tasks)

    @torch.no_grad()
    def sample_actions(
        self,
        obs: Tensor,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor]:
        """Sample ``mean + temperature * std * N(0, 1)`` (or the mean if ``greedy``) without gradients.

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            greedy: return the mean action.
            generator: random generator (on any device: :func:`policies.sampling.draw`); the global
                one if ``None``.
            temperature: > 0, scales the Gaussian's standard deviation (1.0: the trained policy).

        Returns:
            ``actions`` ``(batch, 1, action_dim)`` float32, unclipped (the environment clips),
            and their ``log_probs`` ``(batch, 1)`` float32, summed over action dimensions: at
            temperature 1 the per-dimension log-densities of :meth:`log_prob_and_entropy_per_dim`,
            otherwise those of the tempered Gaussian ``N(mean, (temperature * std)^2)``.

        Raises:
            ValueError: ``obs`` is not ``(batch, obs_dim)`` floating, or ``temperature <= 0``.
        """
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        mean = self.action_mean(obs).float()  # (B, A)
        std = temperature * self.action_std().float()  # (A,); exact at temperature 1
        if greedy:
            actions = mean
        else:
            noise = draw("normal", tuple(mean.shape), generator, mean.dtype, mean.device)
            actions = mean + std * noise
        actions = actions.unsqueeze(1)  # (B, 1, A)
        return actions, self._log_prob_per_dim(actions, mean.unsqueeze(1), std).sum(dim=-1)

    def log_prob_and_entropy_per_dim(self, obs: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Gaussian log-density and entropy of each action dimension.

        ``log_prob_d = -(a_d - mu_d)^2 / (2 std_d^2) - log std_d - log sqrt(2 pi)`` of the
        unclipped action; ``entropy_d = 1/2 + log sqrt(2 pi) + log std_d`` (independent of the
        state, broadcast over the batch).

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            actions: ``(batch, 1, action_dim)`` unclipped actions.

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, 1, action_dim)`` float32, differentiable.

        Raises:
            ValueError: ``obs`` or ``actions`` has the wrong shape.
        """
        mean = self.action_mean(obs).unsqueeze(1)  # (B, 1, A)
        self._check_actions(actions, mean.shape[0], "actions")
        std = self.action_std().float()  # (A,)
        # (B, 1, A), a copy: contiguous() of the broadcast is still a view when B = 1 (FSDP2 warns)
        entropy = (0.5 + _LOG_SQRT_2PI + std.log()).expand(mean.shape).clone(memory_format=torch.contiguous_format)
        return self._log_prob_per_dim(actions.to(mean.device, torch.float32), mean.float(), std), entropy

    def bc_loss(self, obs: Tensor, expert_actions: Tensor) -> Tensor:
        """Mean squared error between the mean action and the expert's.

        Only the mean network learns: ``log_std`` gets no gradient, so behaviour cloning keeps
        ``init_std`` of exploration for RL instead of collapsing it.

        Args:
            obs: ``(batch, obs_dim)`` floating observations.
            expert_actions: ``(batch, 1, action_dim)`` demonstrated actions.

        Returns:
            scalar loss averaged over batch and action dimensions.

        Raises:
            ValueError: ``obs`` or ``expert_actions`` has the wrong shape.
        """
        mean = self.action_mean(obs).unsqueeze(1)  # (B, 1, A)
        self._check_actions(expert_actions, mean.shape[0], "expert_actions")
        return torch.mean((mean - expert_actions.to(mean.device, mean.dtype)) ** 2)

    @staticmethod
    def _log_prob_per_dim(actions: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """``(B, 1, A)`` actions and means, ``(A,)`` std, float32 (whatever dtype the network
        computed the mean in: under bfloat16 mixed precision too) -> ``(B, 1, A)`` Gaussian
        log-densities."""
        z = (actions - mean) / std
        return -0.5 * z**2 - std.log() - _LOG_SQRT_2PI

    def _check_actions(self, actions: Tensor, batch: int, what: str) -> None:
        expected = (batch, 1, self.config.action_dim)
        if tuple(actions.shape) != expected:
            raise ValueError(f"{what} must have shape {expected}, got {tuple(actions.shape)}")
