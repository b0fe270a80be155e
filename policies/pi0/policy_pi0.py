"""π0 as an RL policy (issue 19): the flow-matching model of :mod:`policies.pi0.modeling_pi0` on
simulator camera observations, sampled by πRL's stochastic denoising chains
(:mod:`policies.pi0.flow_sampling`) so that its actions have exact log-probabilities.

Own actions (what :meth:`PI0Policy.sample_actions` returns, the rollout stores and the RL loss
scores) are the whole denoising chain, not only the action chunk: a chain's log-density is the sum
of its Gaussian transitions' log-densities, and recomputing them needs every state of the chain.
Layout, float32 ``(batch, chunk_size, own_action_dim)`` with ``own_action_dim = (num_steps + 1) *
max_action_dim``: at chunk position ``c``, block ``k`` (values ``k * max_action_dim .. (k + 1) *
max_action_dim - 1``) is ``x`` at flow time ``t_k = 1 - k / num_steps`` (block 0 the initial noise,
the last block the normalised, padded action), all ``max_action_dim`` values, because the padded
values are inputs of the velocity at the next step and so of the recomputed log-densities.
:meth:`PI0Policy.env_actions` reads the last block's first ``action_dim`` values and de-normalises
them.

Scored elements (RLinf keeps only the executed dimensions): the transition into block ``k >= 1``,
values ``0 .. action_dim - 1``. The initial noise block (a standard normal, independent of the
policy) and the padded values contribute 0. :meth:`PI0Policy.log_prob_and_entropy_per_dim` returns
per-element values in the own layout with those zeros, so that its ``.sum(-1)`` is, operation for
operation, the sum :meth:`PI0Policy.sample_actions` returns.

Stochastic steps: every step (``stochastic_steps="all"``); RLinf's single drawn step is refused by
the config, because the stored chain does not say which step was drawn.

Greedy (:meth:`PI0Policy.predict_action_chunk`, ``sample_actions(greedy=True)``): the Euler ODE
from ``x_1 = 0``, the mode of the noise prior, so that it is deterministic (openpi's evaluation
starts the ODE from random noise instead); its log-probs are the stochastic sampler's density of
that chain.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import Tensor

from policies import register_policy
from policies.action_normalization import ActionStatistics, libero_gripper_postprocess
from policies.base import Policy
from policies.checkpoint_files import check_tokenizer, load_tokenizer
from policies.pi0.checkpoint_pi0 import load_pi0_checkpoint, read_checkpoint_config
from policies.pi0.configuration_pi0 import PI0ModelConfig, PI0PolicyConfig
from policies.pi0.flow_sampling import (
    FlowNoiseSampler,
    FlowODESampler,
    FlowSampler,
    FlowSDESampler,
    NoiseHead,
)
from policies.pi0.modeling_pi0 import PI0Inputs, PI0Model
from policies.pi0.processor_pi0 import (
    IMAGE_MASKS,
    IMAGES,
    LANG_MASKS,
    LANG_TOKENS,
    PROPRIO,
    PI0ObservationProcessor,
)

#: openpi's normalisation statistics file in a checkpoint's assets (``{"norm_stats": {"actions":
#: {"q01", "q99", ...}, "state": {...}}}``).
NORM_STATS_FILE = "norm_stats.json"


def chain_to_own(chain: Tensor) -> Tensor:
    """``(batch, num_steps + 1, chunk, max_action_dim)`` chain → own actions ``(batch, chunk,
    (num_steps + 1) * max_action_dim)`` (block ``k`` of a position: the chain at ``t_k``)."""
    return chain.permute(0, 2, 1, 3).flatten(2)


def own_to_chain(own: Tensor, num_steps: int) -> Tensor:
    """Inverse of :func:`chain_to_own`: ``(batch, chunk, (num_steps + 1) * D)`` → ``(batch,
    num_steps + 1, chunk, D)``."""
    return own.unflatten(2, (num_steps + 1, -1)).permute(0, 2, 1, 3)


@register_policy
class PI0Policy(Policy):
    """π0 (Black et al. 2024, arXiv 2410.24164) fine-tuned by RL as in πRL (arXiv 2510.25889): see
    the module docstring for the own actions, the scored elements and the greedy protocol.

    Attributes:
        model: the :class:`PI0Model`.
        tokenizer, processor: the prompt tokenizer and the :class:`PI0ObservationProcessor`.
        sampler: the RL sampler (:class:`FlowSDESampler` or :class:`FlowNoiseSampler`, whose noise
            head trains with the policy).
        num_steps: denoising steps.

    Args:
        config: the policy's :class:`PI0PolicyConfig`.

    Raises:
        TypeError: ``config`` is not a :class:`PI0PolicyConfig`.
        FileNotFoundError, ValueError: the checkpoint or tokenizer cannot be read, or the model
            does not fit ``action_dim`` / ``proprio_dim`` / the tokenizer's vocabulary.
    """

    name = "pi0"
    config_class = PI0PolicyConfig
    batch_invariant = False  # transformers kernels, as the OpenVLA policies

    def __init__(self, config: PI0PolicyConfig) -> None:
        if not isinstance(config, PI0PolicyConfig):
            raise TypeError(f"PI0Policy needs a PI0PolicyConfig, got {type(config).__name__}")
        super().__init__()
        self.config = config
        dtype = getattr(torch, config.dtype)
        if config.model_path is not None:
            tokenizer = self._load_tokenizer(config.tokenizer_path or config.model_path)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                model = load_pi0_checkpoint(config.model_path, dtype=dtype)
        else:
            if config.is_tiny_preset:
                from policies.openvla.tiny import build_tiny_tokenizer

                tokenizer = build_tiny_tokenizer()
            else:
                tokenizer = self._load_tokenizer(config.tokenizer_path)
            model_config = config.model_config(len(tokenizer))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                model = PI0Model(model_config).to(dtype)
        self._check_model(model.config, len(tokenizer))
        for parameter in model.paligemma_with_expert.unused_parameters():
            parameter.requires_grad_(False)  # never reaches the actions (their gradient is always 0)
        self.model = model
        self.tokenizer = tokenizer
        model_config = model.config
        self.processor = PI0ObservationProcessor(tokenizer, config.cameras, config.proprio_dim,
                                                 model_config.vision.image_size, model_config.tokenizer_max_length)
        self.num_steps = config.num_steps if config.num_steps is not None else model_config.num_steps
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + 1)
            self.sampler: FlowSampler = (
                FlowSDESampler(config.noise_level) if config.sampler == "flow_sde"
                else FlowNoiseSampler(NoiseHead(model_config.expert.width, model_config.max_action_dim,
                                                config.noise_hidden_dims, config.noise_min_std, config.noise_max_std))
            )  # fmt: skip
        self.ode = FlowODESampler()
        # Statistics as buffers (training checkpoints keep them; every buffer stays finite).
        self.register_buffer("action_q01", torch.zeros(config.action_dim))
        self.register_buffer("action_q99", torch.zeros(config.action_dim))
        self.register_buffer("action_mask", torch.ones(config.action_dim, dtype=torch.bool))
        self.register_buffer("action_statistics_set", torch.tensor(False))
        proprio_shape = (config.proprio_dim or 0,)
        self.register_buffer("proprio_q01", torch.zeros(proprio_shape))
        self.register_buffer("proprio_q99", torch.zeros(proprio_shape))
        self.register_buffer("proprio_statistics_set", torch.tensor(False))
        self._load_statistics()
        self.eval()

    # ----------------------------------------------------------------------------- sizes
    @property
    def chunk_size(self) -> int:
        """Actions per observation (the model's ``chunk_size``)."""
        return self.model.config.chunk_size

    @property
    def action_dim(self) -> int:
        """The environment's values per action (``config.action_dim``)."""
        return self.config.action_dim

    @property
    def max_action_dim(self) -> int:
        """The model's (padded) action width."""
        return self.model.config.max_action_dim

    @property
    def own_action_dim(self) -> int:
        """``(num_steps + 1) * max_action_dim``: the whole denoising chain per chunk position (see
        the module docstring for the layout)."""
        return (self.num_steps + 1) * self.max_action_dim

    @classmethod
    def planned_action_sizes(cls, config: PI0PolicyConfig) -> tuple[int | None, int | None]:
        """``(chunk_size, own_action_dim)`` of the config's architecture, or of the checkpoint's
        config file with ``model_path`` (``(None, None)`` when it cannot be read)."""
        model = config.model_config()
        if model is None:
            try:
                model = read_checkpoint_config(config.model_path)
            except (OSError, ValueError):
                return None, None
        num_steps = config.num_steps if config.num_steps is not None else model.num_steps
        return model.chunk_size, (num_steps + 1) * model.max_action_dim

    @classmethod
    def unscored_own_elements(cls, config: PI0PolicyConfig) -> str | None:
        """π0's own actions hold the initial noise block and the padded values, never scored."""
        return ("scores only the executed values of the denoising steps of its own actions (the initial noise and "
                "the padded values are always-zero elements)")

    @property
    def device(self) -> torch.device:
        return self.model.action_out_proj.weight.device

    # ----------------------------------------------------------------------------- inputs
    def model_inputs(self, obs: TensorDict) -> PI0Inputs:
        """The model's inputs of simulator observations: the processor's images and prompts, and
        the state: the first ``proprio_dim`` features normalised with :attr:`proprio_statistics`
        (when set) and zero-padded to ``max_state_dim`` (all zeros without ``proprio_dim``).

        Raises:
            ValueError: a malformed observation (see :class:`PI0ObservationProcessor`).
        """
        processed = self.processor(obs)
        batch = processed.batch_size[0]
        state = torch.zeros(batch, self.model.config.max_state_dim)
        if self.config.proprio_dim:
            proprio = processed[PROPRIO]
            statistics = self.proprio_statistics
            state[:, : self.config.proprio_dim] = proprio if statistics is None else statistics.normalize(proprio)
        device = self.device
        return PI0Inputs(images=processed[IMAGES].to(device), image_masks=processed[IMAGE_MASKS].to(device),
                         lang_tokens=processed[LANG_TOKENS].to(device), lang_masks=processed[LANG_MASKS].to(device),
                         state=state.to(device))

    def _velocity_fn(self, inputs: PI0Inputs):
        """The velocity function of the samplers on one prefix cache: ``(x_t, t) -> (velocity,
        expert features)``."""
        cache = self.model.prefix_cache(inputs)

        def velocity(x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
            return self.model.velocity_and_features(cache, x_t, t, inputs.state)

        return velocity

    # ----------------------------------------------------------------------------- acting
    @torch.no_grad()
    def sample_actions(self, obs: TensorDict, greedy: bool = False, generator: torch.Generator | None = None,
                       temperature: float | None = None) -> tuple[Tensor, Tensor]:
        """Sample denoising chains with ``config.sampler`` (or the ODE chain from zero noise when
        ``greedy``) and their log-probs.

        Args:
            obs: simulator observations, batch ``batch``.
            greedy: the deterministic ODE chain from ``x_1 = 0``, scored under the sampler.
            generator: random generator (any device); the global one if None.
            temperature: default ``config.temperature``: multiplies every transition std (sampling
                and the returned log-probs); not used by the greedy chain itself.

        Returns:
            own actions ``(batch, chunk_size, own_action_dim)`` float32 (the chains, module
            docstring) and ``log_probs`` ``(batch, chunk_size)`` float32: per chunk position the
            sum over steps and the first ``action_dim`` values of the transition log-densities.

        Raises:
            ValueError: a malformed observation or temperature.
        """
        temperature = self._temperature(temperature)
        inputs = self.model_inputs(obs)
        velocity = self._velocity_fn(inputs)
        if greedy:
            chain = self._ode_chain(velocity, inputs.batch_size)
            per_step = self.sampler.log_prob_of_chain(velocity, chain, temperature=temperature)
        else:
            noise = self.model.sample_noise(inputs.batch_size, generator, self.device)
            flow = self.sampler.sample_chain(velocity, noise, self.num_steps, generator, temperature)
            chain, per_step = flow.chain, flow.log_probs
        return chain_to_own(chain), self._own_layout(per_step).sum(dim=-1)

    @torch.no_grad()
    def predict_action_chunk(self, obs: TensorDict) -> Tensor:
        """The greedy chain (Euler ODE from ``x_1 = 0``) without its log-probs.

        Returns:
            own actions ``(batch, chunk_size, own_action_dim)`` float32 (feed :meth:`env_actions`).
        """
        inputs = self.model_inputs(obs)
        return chain_to_own(self._ode_chain(self._velocity_fn(inputs), inputs.batch_size))

    def _ode_chain(self, velocity, batch: int) -> Tensor:
        """``(batch, num_steps + 1, chunk, max_action_dim)``: the ODE chain from zero noise."""
        noise = torch.zeros(batch, self.chunk_size, self.max_action_dim, device=self.device)
        return self.ode.sample_chain(velocity, noise, self.num_steps).chain

    def log_prob_and_entropy_per_dim(self, obs: TensorDict, actions: Tensor,
                                     temperature: float | None = None) -> tuple[Tensor, Tensor]:
        """Per-element transition log-densities and entropies of stored chains, recomputed.

        Args:
            obs: simulator observations, batch ``batch``.
            actions: own actions ``(batch, chunk_size, own_action_dim)`` from :meth:`sample_actions`.
            temperature: default ``config.temperature`` (the one of the sampling).

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, chunk_size, own_action_dim)`` float32,
            differentiable: the Gaussian log-density of each scored element (values ``0 ..
            action_dim - 1`` of blocks ``1 .. num_steps``) and its entropy ``log(std) + log(2 pi
            e) / 2`` (Flow-SDE: the fixed sigma's; Flow-Noise: the noise head's std); 0 on block 0
            and on the padded values. ``log_probs.sum(-1)`` equals the sampled log-probs.

        Raises:
            ValueError: malformed ``obs`` or ``actions``, or a bad temperature.
        """
        temperature = self._temperature(temperature)
        self._check_own_actions(actions, "actions", obs.batch_size[0] if isinstance(obs, TensorDict) else None)
        inputs = self.model_inputs(obs)
        chain = own_to_chain(actions.to(self.device, torch.float32), self.num_steps)
        log_probs, entropy = self.sampler.log_prob_and_entropy_of_chain(self._velocity_fn(inputs), chain,
                                                                        temperature=temperature)
        return self._own_layout(log_probs), self._own_layout(entropy)

    def _own_layout(self, per_step: Tensor) -> Tensor:
        """Per-step values ``(batch, num_steps, chunk, max_action_dim)`` → own layout ``(batch,
        chunk, own_action_dim)``: the padded values zeroed, a zero block 0 in front."""
        scored = torch.arange(self.max_action_dim, device=per_step.device) < self.action_dim  # (D,)
        per_step = torch.where(scored, per_step, torch.zeros_like(per_step))
        return chain_to_own(torch.cat([torch.zeros_like(per_step[:, :1]), per_step], dim=1))

    def env_actions(self, actions: Tensor) -> Tensor:
        """Own actions → environment actions: the last block's first ``action_dim`` values,
        de-normalised with the action statistics (when set; bounds_q99), then the LIBERO gripper
        post-processing with ``gripper_postprocess="libero"``.

        Args:
            actions: ``(batch, chunk_size, own_action_dim)``.

        Returns:
            float32 ``(batch, chunk_size, action_dim)``.

        Raises:
            ValueError: wrong shape.
        """
        self._check_own_actions(actions, "actions")
        normalized = actions[..., -self.max_action_dim:][..., : self.action_dim].float()
        statistics = self.action_statistics
        raw = normalized if statistics is None else statistics.denormalize(normalized)
        return libero_gripper_postprocess(raw) if self.config.gripper_postprocess == "libero" else raw

    def actions_from_env(self, env_actions: Tensor) -> Tensor:
        """Demonstrated environment actions → the normalised actions :meth:`bc_loss` takes (not own
        actions: a demonstration has no denoising chain): the LIBERO gripper post-processing undone
        with ``gripper_postprocess="libero"``, then bounds_q99 when the action statistics are set.

        Args:
            env_actions: ``(..., action_dim)``.

        Returns:
            float32, same shape.
        """
        raw = env_actions.float()
        if self.config.gripper_postprocess == "libero":
            raw = raw.clone()
            raw[..., -1] = (1 - raw[..., -1]) / 2
        statistics = self.action_statistics
        return raw if statistics is None else statistics.normalize(raw)

    # ----------------------------------------------------------------------------- training
    def bc_loss(self, obs: TensorDict, expert_actions: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """π0's flow-matching loss on demonstrated chunks (openpi: the squared velocity error
        averaged over batch, chunk and all ``max_action_dim`` values, the padded ones' targets 0).

        Args:
            obs: simulator observations, batch ``batch``.
            expert_actions: ``(batch, chunk_size, action_dim)`` normalised actions
                (:meth:`actions_from_env`).
            generator: random generator of the noise and flow times; the global one if None.

        Returns:
            a differentiable scalar.

        Raises:
            ValueError: malformed ``obs`` or ``expert_actions``.
        """
        batch = obs.batch_size[0] if isinstance(obs, TensorDict) else None
        expected = (batch, self.chunk_size, self.action_dim)
        if tuple(expert_actions.shape) != expected or not expert_actions.is_floating_point():
            raise ValueError(f"expert_actions must be floating {expected}, got {tuple(expert_actions.shape)} "
                             f"{expert_actions.dtype}")
        inputs = self.model_inputs(obs)
        padded = torch.zeros(*expected[:2], self.max_action_dim, device=self.device)
        padded[..., : self.action_dim] = expert_actions.to(self.device, torch.float32)
        return self.model.flow_matching_loss(inputs, padded, generator=generator).mean()

    # ----------------------------------------------------------------------------- statistics
    @property
    def action_statistics(self) -> ActionStatistics | None:
        """The action q01/q99/mask, or None: actions stay in the simulator's units."""
        if not bool(self.action_statistics_set):
            return None
        return ActionStatistics(self.action_q01, self.action_q99, self.action_mask)

    @property
    def proprio_statistics(self) -> ActionStatistics | None:
        """The proprio q01/q99 (every feature normalised), or None: the state stays raw."""
        if not bool(self.proprio_statistics_set) or self.proprio_q01.numel() == 0:
            return None
        return ActionStatistics(self.proprio_q01, self.proprio_q99, torch.ones_like(self.proprio_q01, dtype=torch.bool))

    def fit_observation_normalization(self, obs: TensorDict) -> None:
        """Set the proprio statistics to the 1st and 99th percentiles of the observations' proprio
        (as OpenVLA-OFT); no-op without ``proprio_dim``.

        Args:
            obs: simulator observations, batch size ``(batch,)``.
        """
        if not self.config.proprio_dim:
            return
        proprio = self.processor(obs)[PROPRIO].float()  # (B, proprio_dim)
        self.proprio_q01.copy_(torch.quantile(proprio, 0.01, dim=0))
        self.proprio_q99.copy_(torch.quantile(proprio, 0.99, dim=0))
        self.proprio_statistics_set.fill_(True)

    def _load_statistics(self) -> None:
        """The config's statistics, else the checkpoint's ``norm_stats.json`` (first ``action_dim``
        / ``proprio_dim`` values of its ``actions`` / ``state`` q01 and q99)."""
        config = self.config
        checkpoint = _read_norm_stats(config.model_path) if config.model_path is not None else {}
        action = config.action_statistics
        if action is None and "actions" in checkpoint:
            action = _truncate(checkpoint["actions"], config.action_dim, "actions")
        if action is not None:
            statistics = ActionStatistics.from_dict(action, "action statistics")
            self.action_q01.copy_(statistics.q01)
            self.action_q99.copy_(statistics.q99)
            self.action_mask.copy_(statistics.mask)
            self.action_statistics_set.fill_(True)
        proprio = config.proprio_statistics
        if proprio is None and config.proprio_dim and "state" in checkpoint:
            proprio = _truncate(checkpoint["state"], config.proprio_dim, "state")
        if proprio is not None:
            statistics = ActionStatistics.from_dict(proprio, "proprio statistics")
            self.proprio_q01.copy_(statistics.q01)
            self.proprio_q99.copy_(statistics.q99)
            self.proprio_statistics_set.fill_(True)

    # ----------------------------------------------------------------------------- checks
    def _check_model(self, model: PI0ModelConfig, vocab: int) -> None:
        config = self.config
        if config.action_dim > model.max_action_dim:
            raise ValueError(f"PI0PolicyConfig.action_dim ({config.action_dim}) exceeds the model's max_action_dim "
                             f"({model.max_action_dim})")
        if config.proprio_dim is not None and config.proprio_dim > model.max_state_dim:
            raise ValueError(f"PI0PolicyConfig.proprio_dim ({config.proprio_dim}) exceeds the model's max_state_dim "
                             f"({model.max_state_dim})")
        if vocab > model.vocab_size:
            raise ValueError(f"the tokenizer has {vocab} tokens, more than the model's vocab_size {model.vocab_size}: "
                             "use the checkpoint's tokenizer (PI0PolicyConfig.tokenizer_path)")

    def _temperature(self, temperature: float | None) -> float:
        temperature = self.config.temperature if temperature is None else temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0 (it scales the transition stds), got "
                             f"{temperature!r}")
        return float(temperature)

    def _check_own_actions(self, actions: Tensor, what: str, batch: int | None = None) -> None:
        expected = (actions.shape[0] if batch is None else batch, self.chunk_size, self.own_action_dim)
        if not isinstance(actions, Tensor) or tuple(actions.shape) != expected or not actions.is_floating_point():
            shape = tuple(actions.shape) if isinstance(actions, Tensor) else type(actions).__name__
            raise ValueError(f"{what} must be floating own actions (batch, chunk_size, own_action_dim = (num_steps + 1)"
                             f" * max_action_dim) = {expected}, got {shape}")

    @staticmethod
    def _load_tokenizer(directory: str):
        tokenizer = load_tokenizer(directory)
        check_tokenizer(tokenizer, directory, chat_template=False)
        return tokenizer


def _read_norm_stats(model_path: str) -> dict:
    """openpi's ``norm_stats.json`` of a checkpoint directory (``{"actions": ..., "state": ...}``),
    or ``{}`` without one."""
    path = Path(model_path) / NORM_STATS_FILE
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    stats = raw.get("norm_stats", raw) if isinstance(raw, dict) else None
    if not isinstance(stats, dict):
        raise ValueError(f"{path} must hold a JSON object {{'norm_stats': {{'actions': ..., 'state': ...}}}}")  # noqa: TRY004
    return stats


def _truncate(stats: dict, length: int, name: str) -> dict:
    """The first ``length`` q01/q99 values of a ``norm_stats.json`` entry."""
    if any(len(stats.get(key, ())) < length for key in ("q01", "q99")):
        raise ValueError(f"{NORM_STATS_FILE}: {name} statistics need q01 and q99 of at least {length} values")
    return {"q01": list(stats["q01"][:length]), "q99": list(stats["q99"][:length])}
