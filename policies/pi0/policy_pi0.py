"""π0 as an RL policy (issue 19): the flow-matching model of :mod:`policies.pi0.modeling_pi0` on
simulator camera observations, sampled by πRL's stochastic denoising chains
(:mod:`policies.pi0.flow_sampling`) so that its actions have exact log-probabilities.

Executed prefix: the model predicts ``P`` actions (its ``chunk_size``, openpi's ``action_horizon``
50); the engine executes the first ``n = executed_actions`` of them (openpi's LIBERO
``replan_steps`` 5) and asks again: the policy's :attr:`PI0Policy.chunk_size` is ``n`` (``P``
without ``executed_actions``). ``n`` must divide ``P``; ``m = P / n``.

Own actions (what :meth:`PI0Policy.sample_actions` returns, the rollout stores and the RL loss
scores) are the whole denoising chain of every model position, packed and scored as
:mod:`policies.pi0.own_actions` describes.

Normalisation (``normalization``) and state-relative actions (``delta_action_mask``) mirror openpi's
transforms (:mod:`policies.pi0.transforms_pi0`): environment action = ``AbsoluteActions(
Unnormalize(model action), raw state)``, then the optional LIBERO gripper post-processing; the
inverse (demonstrations) subtracts the raw state before normalising.

Stochastic steps: every step (``stochastic_steps="all"``); RLinf's single drawn step is refused by
the config, because the stored chain does not say which step was drawn.

Greedy (:meth:`PI0Policy.predict_action_chunk`, ``sample_actions(greedy=True)``): the Euler ODE
from ``x_1 = 0``, the mode of the noise prior, so that it is deterministic (openpi's evaluation
starts the ODE from random noise instead); its log-probs are the stochastic sampler's density of
that chain.

Export (:meth:`PI0Policy.save_pretrained`, what ``vla-rl export`` writes): a checkpoint directory
that ``model_path`` loads back, in LeRobot's layout with ``pi0_architecture.json``, the set
statistics as openpi's ``norm_stats.json``, the tokenizer's files and, with Flow-Noise, the noise
head as ``pi0_noise_head.safetensors`` (read back when ``sampler: flow_noise``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import Tensor

from policies import register_policy
from policies.action_normalization import libero_gripper_postprocess
from policies.base import FSDPGroup, Policy, enable_transformers_checkpointing, transformer_blocks
from policies.checkpoint_files import staged_directory
from policies.normalization import ActionStatistics, MeanStdStatistics
from policies.pi0.backbone_pi0 import JOINT_FORWARD
from policies.pi0.checkpoint_pi0 import (
    Layout,
    load_noise_head,
    load_pi0_checkpoint,
    read_checkpoint_config,
    write_noise_head,
    write_pi0_checkpoint,
)
from policies.pi0.checks_pi0 import check_fit, check_pretrained, load_checked_tokenizer, load_model_tokenizer
from policies.pi0.configuration_pi0 import PI0PolicyConfig
from policies.pi0.flow_noise import FlowNoiseSampler, NoiseHead
from policies.pi0.flow_sampling import FlowODESampler, FlowSampler, FlowSDESampler
from policies.pi0.modeling_pi0 import PI0Inputs, PI0Model
from policies.pi0.own_actions import chain_to_own, own_to_chain
from policies.pi0.processor_pi0 import (
    IMAGE_MASKS,
    IMAGES,
    LANG_MASKS,
    LANG_TOKENS,
    PROPRIO,
    PI0ObservationProcessor,
)
from policies.pi0.transforms_pi0 import (
    NORM_STATS_FILE,
    buffered_statistics,
    delta_offset,
    fit_statistics,
    load_statistics,
    norm_stats_of,
    raw_state,
    register_statistics,
)


@register_policy
class PI0Policy(Policy):
    """π0 (Black et al. 2024, arXiv 2410.24164) fine-tuned by RL as in πRL (arXiv 2510.25889): see
    the module docstring for the greedy protocol, :mod:`policies.pi0.own_actions` for the own
    actions and the scored elements.

    Attributes:
        model: the :class:`PI0Model`.
        tokenizer, processor: the prompt tokenizer and the :class:`PI0ObservationProcessor`.
        sampler: the RL sampler (:class:`FlowSDESampler` or :class:`FlowNoiseSampler`, whose noise
            head trains with the policy; with ``model_path``, loaded from its
            ``pi0_noise_head.safetensors`` when there is one, else newly initialised).
        num_steps: denoising steps.
        model_chunk_size: the model's chunk (``P``); :attr:`chunk_size` the executed prefix (``n``).

    Args:
        config: the policy's :class:`PI0PolicyConfig`.
        device: where the policy is built (None: the CPU): a checkpoint's weights are read
            straight onto it, one tensor at a time (a GPU worker's host never holds the model);
            what is initialised instead is built on the CPU and moved.

    Raises:
        TypeError: ``config`` is not a :class:`PI0PolicyConfig`.
        FileNotFoundError, ValueError: the checkpoint or tokenizer cannot be read, the model
            does not fit ``action_dim`` / ``proprio_dim`` / ``executed_actions`` / the tokenizer's
            vocabulary, or the checkpoint's noise head does not fit the Flow-Noise settings.
    """

    name = "pi0"
    config_class = PI0PolicyConfig
    batch_invariant = False  # transformers kernels, as the OpenVLA policies
    builds_on_device = True

    def __init__(self, config: PI0PolicyConfig, device: torch.device | str | None = None) -> None:
        if not isinstance(config, PI0PolicyConfig):
            raise TypeError(f"PI0Policy needs a PI0PolicyConfig, got {type(config).__name__}")
        super().__init__()
        self.config = config
        dtype = getattr(torch, config.dtype)
        if config.model_path is not None:
            tokenizer = load_model_tokenizer(config)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                model = load_pi0_checkpoint(config.model_path, dtype=dtype, device=device)
        else:
            if config.is_tiny_preset:
                from policies.openvla.tiny import build_tiny_tokenizer

                tokenizer = build_tiny_tokenizer()
            else:
                tokenizer = load_checked_tokenizer(config.tokenizer_path)
            model_config = config.model_config(len(tokenizer))
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                model = PI0Model(model_config)
                model.cast_parameters(dtype)  # openpi's dtypes; the rotary frequencies stay float32
        check_fit(config, model.config, len(tokenizer))
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
        if config.model_path is not None and isinstance(self.sampler, FlowNoiseSampler):
            load_noise_head(self.sampler.noise_head, config.model_path, config.noise_min_std, config.noise_max_std)
        self.ode = FlowODESampler()
        register_statistics(self, config.normalization, config.action_dim, config.proprio_dim or 0)
        load_statistics(self, config)
        self.to(device)
        self.eval()

    # ----------------------------------------------------------------------------- sizes
    @property
    def model_chunk_size(self) -> int:
        """Actions the model predicts per observation (``P``, its ``chunk_size``)."""
        return self.model.config.chunk_size

    @property
    def chunk_size(self) -> int:
        """Actions executed per observation (``n``): ``config.executed_actions``, default the model's
        whole chunk."""
        return self.config.executed_actions or self.model_chunk_size

    @property
    def chunk_groups(self) -> int:
        """Model positions per own-action slot, ``m = P / n`` (:mod:`policies.pi0.own_actions`)."""
        return self.model_chunk_size // self.chunk_size

    @property
    def bc_chunk_size(self) -> int:
        """The model's whole chunk: :meth:`bc_loss` fits all ``P`` predicted actions (openpi's
        training), not only the executed prefix."""
        return self.model_chunk_size

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
        """``m * (num_steps + 1) * max_action_dim``: the whole denoising chains of the ``m`` model
        positions packed in each executed slot (the layout: :mod:`policies.pi0.own_actions`)."""
        return self.chunk_groups * (self.num_steps + 1) * self.max_action_dim

    @classmethod
    def planned_action_sizes(cls, config: PI0PolicyConfig) -> tuple[int | None, int | None]:
        """``(chunk_size, own_action_dim)``: the executed prefix ``n`` and ``(P / n) * (num_steps +
        1) * max_action_dim`` of the config's architecture, or of the checkpoint's config file with
        ``model_path`` (``(None, None)`` when it cannot be read or ``executed_actions`` does not
        divide its chunk)."""
        model = config.model_config()
        if model is None:
            try:
                model = read_checkpoint_config(config.model_path)
            except (OSError, ValueError):
                return None, None
        executed = config.executed_actions or model.chunk_size
        if model.chunk_size % executed:
            return None, None
        num_steps = config.num_steps if config.num_steps is not None else model.num_steps
        return executed, model.chunk_size // executed * (num_steps + 1) * model.max_action_dim

    @classmethod
    def unscored_own_elements(cls, config: PI0PolicyConfig) -> str | None:
        """π0's own actions hold the initial noise block, the padded values and the positions past
        the executed prefix, never scored."""
        return ("scores only the executed values of the denoising steps of the executed positions in its own actions "
                "(the initial noise, the padded values and the unexecuted positions are always-zero elements)")

    @property
    def device(self) -> torch.device:
        return self.model.action_out_proj.weight.device

    # ----------------------------------------------------------------------------- large-scale training
    def fsdp_units(self) -> list[torch.nn.Module | FSDPGroup]:
        """SigLIP's blocks (called through their ``forward``), and per depth of
        the joint stack the VLM's and the action expert's decoder layers as one
        :class:`~policies.base.FSDPGroup` entered through the depth's joint forward: the two
        streams attend jointly, so the policy runs the layers' submodules itself and neither
        layer's ``forward`` is ever called (a unit of its own would never be unsharded)."""
        backbone = self.model.paligemma_with_expert
        pairs = backbone.depth_layers()
        # The projector (one linear layer) stays in the root unit: FSDP warns about its view output.
        left_out = {id(layer) for pair in pairs for layer in pair} | {id(backbone.paligemma.model.multi_modal_projector)}
        called = [block for block in transformer_blocks(self) if id(block) not in left_out]
        return [*called, *(FSDPGroup(pair, JOINT_FORWARD) for pair in pairs)]

    def checkpoint_activations(self) -> int:
        """SigLIP's layers through transformers' own checkpointing, and every depth of the joint
        stack (:meth:`~policies.pi0.backbone_pi0.PaliGemmaWithExpert.checkpoint_layers`).

        Returns:
            the number of checkpointed blocks (SigLIP layers + depths).
        """
        backbone = self.model.paligemma_with_expert
        vision = enable_transformers_checkpointing(backbone.paligemma.model.vision_tower)
        return vision + backbone.checkpoint_layers()

    # ----------------------------------------------------------------------------- inputs
    def model_inputs(self, obs: TensorDict) -> PI0Inputs:
        """The model's inputs of simulator observations: the processor's images and prompts, and
        the state: the first ``proprio_dim`` features normalised with :attr:`proprio_statistics`
        (when set; openpi normalises the state before padding it) and zero-padded to
        ``max_state_dim`` (all zeros without ``proprio_dim``).

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

    def model_ready_observations(self, obs: TensorDict, mask: Tensor | None = None) -> TensorDict:
        """``obs`` with each camera's frames resized and padded to SigLIP's input once
        (:meth:`PI0ObservationProcessor.model_ready`); see ``Policy.model_ready_observations``."""
        return self.processor.model_ready(obs, mask)

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
            own actions ``(batch, chunk_size, own_action_dim)`` float32 (the packed chains, module
            docstring) and ``log_probs`` ``(batch, chunk_size)`` float32: per executed action the
            sum over steps and the first ``action_dim`` values of its transition log-densities.

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
        return chain_to_own(chain, self.chunk_size), self._own_layout(per_step).sum(dim=-1)

    @torch.no_grad()
    def predict_action_chunk(self, obs: TensorDict) -> Tensor:
        """The greedy chain (Euler ODE from ``x_1 = 0``) without its log-probs.

        Returns:
            own actions ``(batch, chunk_size, own_action_dim)`` float32 (feed :meth:`env_actions`).
        """
        inputs = self.model_inputs(obs)
        return chain_to_own(self._ode_chain(self._velocity_fn(inputs), inputs.batch_size), self.chunk_size)

    def _ode_chain(self, velocity, batch: int) -> Tensor:
        """``(batch, num_steps + 1, P, max_action_dim)``: the ODE chain from zero noise."""
        noise = torch.zeros(batch, self.model_chunk_size, self.max_action_dim, device=self.device)
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
            action_dim - 1`` of blocks ``1 .. num_steps`` of group 0, the executed position) and
            its entropy ``log(std) + log(2 pi e) / 2`` (Flow-SDE: the fixed sigma's; Flow-Noise:
            the noise head's std); 0 on block 0, on the padded values and on the groups of the
            unexecuted positions. ``log_probs.sum(-1)`` equals the sampled log-probs.

        Raises:
            ValueError: malformed ``obs`` or ``actions``, or a bad temperature.
        """
        temperature = self._temperature(temperature)
        self._check_own_actions(actions, obs.batch_size[0] if isinstance(obs, TensorDict) else None)
        inputs = self.model_inputs(obs)
        chain = own_to_chain(actions.to(self.device, torch.float32), self.num_steps, self.chunk_groups)
        log_probs, entropy = self.sampler.log_prob_and_entropy_of_chain(self._velocity_fn(inputs), chain,
                                                                        temperature=temperature)
        return self._own_layout(log_probs), self._own_layout(entropy)

    def _own_layout(self, per_step: Tensor) -> Tensor:
        """Per-step values ``(batch, num_steps, P, max_action_dim)`` → own layout ``(batch, n,
        own_action_dim)``: the padded values and the unexecuted positions zeroed, a zero block 0 in
        front."""
        device = per_step.device
        executed = torch.arange(self.model_chunk_size, device=device) < self.chunk_size  # (P,)
        values = torch.arange(self.max_action_dim, device=device) < self.action_dim  # (D,)
        scored = executed[:, None] & values[None, :]  # (P, D)
        per_step = torch.where(scored, per_step, torch.zeros_like(per_step))
        return chain_to_own(torch.cat([torch.zeros_like(per_step[:, :1]), per_step], dim=1), self.chunk_size)

    def env_actions(self, actions: Tensor, obs: TensorDict | None = None) -> Tensor:
        """Own actions → environment actions: the executed positions' (group 0's) last block's
        first ``action_dim`` values, de-normalised with the action statistics (when set;
        ``normalization``), the state added back with ``delta_action_mask`` (openpi's
        ``Unnormalize`` then ``AbsoluteActions``), then the LIBERO gripper post-processing with
        ``gripper_postprocess="libero"``.

        Args:
            actions: ``(batch, chunk_size, own_action_dim)``.
            obs: the observations the actions were sampled from, batch ``batch`` (needed with
                ``delta_action_mask``: their raw ``state``).

        Returns:
            float32 ``(batch, chunk_size, action_dim)``.

        Raises:
            ValueError: wrong shape, or no ``obs`` with ``delta_action_mask``.
        """
        self._check_own_actions(actions)
        last = self.num_steps * self.max_action_dim  # block num_steps of group 0
        normalized = actions[..., last : last + self.action_dim].float()
        statistics = self.action_statistics
        raw = normalized if statistics is None else statistics.denormalize(normalized)
        if self.config.delta_action_mask is not None:
            state = raw_state(obs, len(self.config.delta_action_mask), actions.shape[0], "env_actions").to(raw.device)
            raw = raw + delta_offset(state, self.config.delta_action_mask, self.action_dim)
        return libero_gripper_postprocess(raw) if self.config.gripper_postprocess == "libero" else raw

    def actions_from_env(self, env_actions: Tensor, obs: TensorDict | None = None) -> Tensor:
        """Demonstrated environment actions → the normalised actions :meth:`bc_loss` takes (not own
        actions: a demonstration has no denoising chain): the LIBERO gripper post-processing undone
        with ``gripper_postprocess="libero"``, the raw state subtracted with ``delta_action_mask``
        (openpi's ``DeltaActions``), then normalised when the action statistics are set.

        Args:
            env_actions: ``(..., action_dim)``; ``(batch, chunk, action_dim)`` with
                ``delta_action_mask``.
            obs: the observations the actions were taken in, batch ``batch`` (needed with
                ``delta_action_mask``).

        Returns:
            float32, same shape.

        Raises:
            ValueError: no ``obs`` (or a wrong shape) with ``delta_action_mask``.
        """
        raw = env_actions.float()
        if self.config.gripper_postprocess == "libero":
            raw = raw.clone()
            raw[..., -1] = (1 - raw[..., -1]) / 2
        if self.config.delta_action_mask is not None:
            if raw.ndim != 3:
                raise ValueError(f"env_actions must be (batch, chunk, action_dim) with delta_action_mask, got "
                                 f"{tuple(raw.shape)}")
            state = raw_state(obs, len(self.config.delta_action_mask), raw.shape[0], "actions_from_env").to(raw.device)
            raw = raw - delta_offset(state, self.config.delta_action_mask, self.action_dim)
        statistics = self.action_statistics
        return raw if statistics is None else statistics.normalize(raw)

    # ----------------------------------------------------------------------------- training
    def bc_loss(self, obs: TensorDict, expert_actions: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """π0's flow-matching loss on demonstrated chunks (openpi: the squared velocity error
        averaged over batch, chunk and all ``max_action_dim`` values, the padded ones' targets 0).

        Args:
            obs: simulator observations, batch ``batch``.
            expert_actions: ``(batch, P, action_dim)`` normalised actions (:meth:`actions_from_env`)
                of the model's whole chunk (:attr:`bc_chunk_size`).
            generator: random generator of the noise and flow times; the global one if None.

        Returns:
            a differentiable scalar.

        Raises:
            ValueError: malformed ``obs`` or ``expert_actions``.
        """
        batch = obs.batch_size[0] if isinstance(obs, TensorDict) else None
        expected = (batch, self.model_chunk_size, self.action_dim)
        if tuple(expert_actions.shape) != expected or not expert_actions.is_floating_point():
            raise ValueError(f"expert_actions must be floating {expected}, got {tuple(expert_actions.shape)} "
                             f"{expert_actions.dtype}")
        inputs = self.model_inputs(obs)
        padded = torch.zeros(*expected[:2], self.max_action_dim, device=self.device)
        padded[..., : self.action_dim] = expert_actions.to(self.device, torch.float32)
        return self.model.flow_matching_loss(inputs, padded, generator=generator).mean()

    # ----------------------------------------------------------------------------- statistics
    @property
    def action_statistics(self) -> ActionStatistics | MeanStdStatistics | None:
        """The action statistics of ``normalization`` (q01/q99/mask or mean/std), or None: actions
        stay in the simulator's units."""
        return buffered_statistics(self, "action", self.config.normalization)

    @property
    def proprio_statistics(self) -> ActionStatistics | MeanStdStatistics | None:
        """The proprio statistics of ``normalization`` (every feature normalised), or None: the
        state stays raw."""
        return buffered_statistics(self, "proprio", self.config.normalization) if self.config.proprio_dim else None

    def fit_observation_normalization(self, obs: TensorDict) -> None:
        """Set the proprio statistics from the observations' proprio (:func:`fit_statistics`:
        1st / 99th percentiles for bounds_q99 as OpenVLA-OFT, mean / population std for mean_std);
        no-op without ``proprio_dim``.

        Args:
            obs: simulator observations, batch size ``(batch,)``.
        """
        if self.config.proprio_dim:
            fit_statistics(self, "proprio", self.processor.proprio(obs), self.config.normalization)

    # ----------------------------------------------------------------------------- export
    def save_pretrained(self, out_dir: str | Path, layout: Layout = "lerobot") -> Path:
        """Write the policy as a checkpoint directory that ``model_path`` loads back (the other
        settings, ``action_dim``, ``proprio_dim``, ``normalization``, ``sampler``, ..., come from
        the loading config, as for any checkpoint), atomically (a half-written directory is never
        visible):

        - the model (:func:`~policies.pi0.checkpoint_pi0.write_pi0_checkpoint`: ``model.safetensors``
          in ``layout``, LeRobot's by default, and ``pi0_architecture.json``);
        - the set statistics as openpi's ``norm_stats.json`` (``{"norm_stats": {"actions": ...,
          "state": ...}}``): the fields of ``normalization`` (``mean``/``std`` or ``q01``/``q99``
          plus the action ``mask``), ``action_dim`` / ``proprio_dim`` values; no file when none is
          set;
        - the tokenizer's files (also the tiny in-process one, and the ``tokenizer_path`` one);
        - with ``sampler: flow_noise``, the noise head as ``pi0_noise_head.safetensors``
          (:func:`~policies.pi0.checkpoint_pi0.write_noise_head`; openpi and LeRobot ignore it).

        π0 has no LoRA adapters: nothing to merge.

        Args:
            out_dir: a new directory.
            layout: ``"lerobot"`` or ``"openpi"`` (names of ``model.safetensors``).

        Returns:
            ``out_dir``.

        Raises:
            FileExistsError: ``out_dir`` exists (nothing is written).
            ValueError: an unknown layout.
        """
        with staged_directory(out_dir) as staging:
            write_pi0_checkpoint(self.model, staging, layout)
            stats = norm_stats_of(self, self.config.normalization)
            if stats:
                (staging / NORM_STATS_FILE).write_text(json.dumps({"norm_stats": stats}, indent=2) + "\n")
            self.tokenizer.save_pretrained(str(staging))
            if isinstance(self.sampler, FlowNoiseSampler):
                write_noise_head(self.sampler.noise_head, staging, self.config.noise_min_std, self.config.noise_max_std)
        return Path(out_dir)

    # ----------------------------------------------------------------------------- checks
    @classmethod
    def check_pretrained(cls, config: PI0PolicyConfig) -> None:
        """:func:`policies.pi0.checks_pi0.check_pretrained`: ``model_path`` and ``tokenizer_path``
        checked as this constructor loads them, without reading weights (the run's pre-flight)."""
        check_pretrained(config)

    def _temperature(self, temperature: float | None) -> float:
        temperature = self.config.temperature if temperature is None else temperature
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
                or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0 (it scales the transition stds), got "
                             f"{temperature!r}")
        return float(temperature)

    def _check_own_actions(self, actions: Tensor, batch: int | None = None) -> None:
        if not isinstance(actions, Tensor):
            raise ValueError(f"actions must be a tensor of own actions, got a {type(actions).__name__}")  # noqa: TRY004
        expected = (actions.shape[0] if batch is None else batch, self.chunk_size, self.own_action_dim)
        if tuple(actions.shape) != expected or not actions.is_floating_point():
            raise ValueError(f"actions must be floating own actions (batch, chunk_size, own_action_dim = "
                             f"chunk_groups * (num_steps + 1) * max_action_dim) = {expected}, "
                             f"got {tuple(actions.shape)}")
