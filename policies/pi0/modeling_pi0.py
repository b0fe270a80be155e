"""The π0 model (Black et al. 2024, arXiv 2410.24164): a flow-matching action expert on a PaliGemma
backbone. This module is the network and its flow-matching maths; the RL policy around it (the
processor, the policy contract, stochastic samplers) lives elsewhere.

Sources: openpi ``src/openpi/models_pytorch/pi0_pytorch.py`` (``PI0Pytorch``: ``embed_prefix``,
``embed_suffix``, ``forward``, ``sample_actions``, ``denoise_step``, ``make_att_2d_masks``,
``create_sinusoidal_pos_embedding``, ``sample_time``) and LeRobot
``src/lerobot/policies/pi0/modeling_pi0.py`` (its port, same names).

Flow convention (openpi; paper Sec. 3, eq. 1 with τ = 1 - t): a noisy chunk is
``x_t = t * noise + (1 - t) * actions``, the target velocity ``u = noise - actions``, so actions are
reached at ``t = 0`` by integrating ``dx/dt = v(x_t, t)`` from ``t = 1`` (pure noise) with Euler
steps ``x_{t + dt} = x_t + dt * v``, ``dt = -1 / num_steps``.

Token layout and attention (openpi's block-causal ``att_masks`` over ``[prefix | state | actions]``):

- prefix: ``num_cameras * num_patches`` image tokens then ``lang_len`` language tokens, through the
  PaliGemma weights, attending each other bidirectionally (padding excluded);
- state: one token through the expert's weights, attending the prefix and itself;
- actions: ``chunk_size`` tokens through the expert's weights, attending everything (prefix,
  state, each other); nothing before them attends them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from policies.pi0.backbone_pi0 import PaliGemmaWithExpert, PrefixCache
from policies.pi0.configuration_pi0 import PI0ModelConfig
from policies.sampling import draw

__all__ = ["PI0Inputs", "PI0Model", "PrefixCache", "make_att_2d_masks", "ode_times", "sinusoidal_time_embedding"]


@dataclass
class PI0Inputs:
    """One batch of model inputs (already preprocessed: resized, normalised, tokenised, padded).

    Attributes:
        images: ``(batch, num_cameras, 3, image_size, image_size)`` float pixels in [-1, 1].
        image_masks: ``(batch, num_cameras)`` bool, False for a missing camera (its tokens are
            padding).
        lang_tokens: ``(batch, lang_len)`` int64 prompt token ids.
        lang_masks: ``(batch, lang_len)`` bool, False at padding.
        state: ``(batch, max_state_dim)`` float robot state, zero-padded.
    """

    images: Tensor
    image_masks: Tensor
    lang_tokens: Tensor
    lang_masks: Tensor
    state: Tensor

    @property
    def batch_size(self) -> int:
        """Rows in the batch."""
        return self.state.shape[0]


def make_att_2d_masks(pad_masks: Tensor, att_masks: Tensor) -> Tensor:
    """Which token attends which (openpi ``pi0_pytorch.py``, ``make_att_2d_masks``, from
    big_vision): token ``i`` attends token ``j`` when both are real and ``cumsum(att)[j] <=
    cumsum(att)[i]``; an ``att`` of 1 starts a block that earlier tokens cannot see.

    Args:
        pad_masks: ``(batch, seq)`` bool, True at real tokens.
        att_masks: ``(batch, seq)`` bool/int, 1 where a new causal block starts.

    Returns:
        ``(batch, seq, seq)`` bool, ``[b, query, key]``.
    """
    if pad_masks.ndim != 2 or att_masks.ndim != 2:
        raise ValueError(f"pad_masks and att_masks must be (batch, seq), got {tuple(pad_masks.shape)} and "
                         f"{tuple(att_masks.shape)}")
    blocks = torch.cumsum(att_masks.long(), dim=1)  # (B, N)
    causal = blocks[:, None, :] <= blocks[:, :, None]  # (B, N_query, N_key)
    real = pad_masks[:, None, :] & pad_masks[:, :, None]
    return causal & real


def sinusoidal_time_embedding(time: Tensor, dimension: int, min_period: float, max_period: float) -> Tensor:
    """Sine-cosine embedding of flow times (openpi ``create_sinusoidal_pos_embedding``): with
    ``f = linspace(0, 1, dimension / 2)`` and ``period = min_period * (max_period / min_period) ** f``,
    ``[sin(2π t / period), cos(2π t / period)]``, computed in float64 (float32 on MPS).

    Args:
        time: ``(batch,)`` flow times.
        dimension: even embedding width (the expert width).
        min_period, max_period: the shortest and longest periods (π0: 4e-3 and 4.0).

    Returns:
        ``(batch, dimension)`` in ``time``'s dtype.
    """
    if dimension % 2:
        raise ValueError(f"dimension ({dimension}) must be even")
    if time.ndim != 1:
        raise ValueError(f"time must be (batch,), got {tuple(time.shape)}")
    dtype = torch.float32 if time.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, dimension // 2, dtype=dtype, device=time.device)
    period = min_period * (max_period / min_period) ** fraction  # (D/2,)
    angle = (2 * math.pi / period)[None, :] * time.to(dtype)[:, None]  # (B, D/2)
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).to(time.dtype)


def ode_times(num_steps: int, device: torch.device | str = "cpu") -> Tensor:
    """The flow times at which the Euler sampler evaluates the velocity: ``1, 1 + dt, ...`` with
    ``dt = -1 / num_steps``, accumulated in float32 as openpi's ``sample_actions`` does
    (``time += dt``), so the numbers match it bit for bit.

    Returns:
        ``(num_steps,)`` float32.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=device)
    time = torch.tensor(1.0, dtype=torch.float32, device=device)
    times = []
    for _ in range(num_steps):
        times.append(time)
        time = time + dt
    return torch.stack(times)


class PI0Model(nn.Module):
    """π0: PaliGemma + action expert (``paligemma_with_expert``) and the flow-matching
    projections ``state_proj``, ``action_in_proj``, ``action_time_mlp_in``,
    ``action_time_mlp_out``, ``action_out_proj`` (openpi ``PI0Pytorch``, π0 variant: not π0.5).

    Velocities are float32. :meth:`cast_parameters` gives the parameters openpi's dtypes (not
    ``Module.to``, which would round the float32 rotary frequencies too).
    """

    def __init__(self, config: PI0ModelConfig) -> None:
        super().__init__()
        self.config = config
        width = config.expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        self.state_proj = nn.Linear(config.max_state_dim, width)
        self.action_in_proj = nn.Linear(config.max_action_dim, width)
        self.action_time_mlp_in = nn.Linear(2 * width, width)
        self.action_time_mlp_out = nn.Linear(width, width)
        self.action_out_proj = nn.Linear(width, config.max_action_dim)

    # ----------------------------------------------------------------------------- precision
    def parameter_dtypes(self, dtype: torch.dtype) -> dict[str, torch.dtype]:
        """Each floating parameter's dtype when the model runs in ``dtype`` as openpi runs π0
        (``PaliGemmaWithExpertModel.to_bfloat16_for_selected_params``): the backbone's parameters
        in ``dtype`` but for those openpi keeps in float32
        (:meth:`~policies.pi0.backbone_pi0.PaliGemmaWithExpert.float32_parameters`: SigLIP's patch
        and position embeddings, the RMSNorm weights), and the flow-matching projections in
        float32 (openpi builds them after the cast). With float32, all float32.

        Returns:
            ``{parameter name: dtype}`` (the names of ``named_parameters``).
        """
        backbone = self.paligemma_with_expert
        kept = {id(parameter) for parameter in backbone.float32_parameters()}
        cast = {id(parameter) for parameter in backbone.parameters()} - kept
        return {name: dtype if id(parameter) in cast else torch.float32
                for name, parameter in self.named_parameters() if parameter.is_floating_point()}

    @torch.no_grad()
    def cast_parameters(self, dtype: torch.dtype) -> None:
        """Give the floating parameters, in place and one at a time, their dtypes of
        :meth:`parameter_dtypes` (the same ``nn.Parameter`` objects); buffers keep theirs (the
        rotary frequencies stay float32, as openpi's JAX π0 computes its angles)."""
        dtypes = self.parameter_dtypes(dtype)
        for name, parameter in self.named_parameters():
            if name in dtypes and parameter.dtype != dtypes[name]:
                parameter.data = parameter.data.to(dtypes[name])

    # ----------------------------------------------------------------------------- embeddings
    def embed_prefix(self, images: Tensor, image_masks: Tensor, lang_tokens: Tensor,
                     lang_masks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Image and language embeddings (openpi ``PI0Pytorch.embed_prefix``).

        Args:
            images: ``(batch, num_cameras, 3, image_size, image_size)`` pixels in [-1, 1].
            image_masks: ``(batch, num_cameras)`` bool.
            lang_tokens: ``(batch, lang_len)`` int64.
            lang_masks: ``(batch, lang_len)`` bool.

        Returns:
            ``embs`` ``(batch, prefix_len, vlm.width)`` with ``prefix_len = num_cameras *
            num_patches + lang_len`` (camera 0's patches, camera 1's, ..., then the prompt);
            ``pad_masks`` ``(batch, prefix_len)`` bool; ``att_masks`` ``(batch, prefix_len)`` bool,
            all False (one bidirectional block).
        """
        batch, cameras = image_masks.shape
        if images.ndim != 5 or images.shape[:2] != (batch, cameras):
            raise ValueError(f"images must be (batch, num_cameras, 3, H, W) matching image_masks "
                             f"{tuple(image_masks.shape)}, got {tuple(images.shape)}")
        if lang_tokens.shape != lang_masks.shape or lang_tokens.shape[0] != batch:
            raise ValueError(f"lang_tokens {tuple(lang_tokens.shape)} and lang_masks {tuple(lang_masks.shape)} must "
                             f"both be (batch={batch}, lang_len)")
        backbone = self.paligemma_with_expert
        image_embs = backbone.embed_images(images.flatten(0, 1))  # (B * C, P, W)
        patches = image_embs.shape[1]
        image_embs = image_embs.reshape(batch, cameras * patches, -1)  # (B, C * P, W)
        lang_embs = backbone.embed_language(lang_tokens)  # (B, L, W)
        embs = torch.cat([image_embs, lang_embs.to(image_embs.dtype)], dim=1)
        image_pad = image_masks.bool()[:, :, None].expand(batch, cameras, patches).reshape(batch, -1)
        pad_masks = torch.cat([image_pad, lang_masks.bool()], dim=1)
        att_masks = torch.zeros_like(pad_masks)
        return embs, pad_masks, att_masks

    def embed_suffix(self, state: Tensor, x_t: Tensor, time: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """State token and action tokens mixed with the flow time (openpi
        ``PI0Pytorch.embed_suffix``, π0 branch): ``state_proj(state)``; per action
        ``action_time_mlp_out(swish(action_time_mlp_in([action_in_proj(x_t), time_emb])))``.

        Args:
            state: ``(batch, max_state_dim)``.
            x_t: ``(batch, chunk_size, max_action_dim)`` noisy actions.
            time: ``(batch,)`` flow times.

        Returns:
            ``embs`` ``(batch, 1 + chunk_size, expert.width)`` (float32 projections);
            ``pad_masks`` ``(batch, 1 + chunk_size)`` all True; ``att_masks`` ``(batch, 1 +
            chunk_size)`` bool, True at the state and at the first action (two new blocks).
        """
        config = self.config
        batch = state.shape[0]
        if state.shape != (batch, config.max_state_dim):
            raise ValueError(f"state must be (batch, max_state_dim={config.max_state_dim}), got {tuple(state.shape)}")
        if x_t.shape != (batch, config.chunk_size, config.max_action_dim):
            raise ValueError(f"x_t must be (batch={batch}, chunk_size={config.chunk_size}, max_action_dim="
                             f"{config.max_action_dim}), got {tuple(x_t.shape)}")
        state_emb = self.state_proj(state.to(self.state_proj.weight.dtype))  # (B, We)
        action_emb = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))  # (B, H, We)
        time_emb = sinusoidal_time_embedding(time, config.expert.width, config.min_period, config.max_period)
        time_emb = time_emb.to(action_emb.dtype)[:, None, :].expand_as(action_emb)  # (B, H, We)
        action_time = self.action_time_mlp_in(torch.cat([action_emb, time_emb], dim=2))  # (B, H, We)
        action_time = self.action_time_mlp_out(F.silu(action_time))
        embs = torch.cat([state_emb[:, None, :], action_time], dim=1)  # (B, 1 + H, We)
        pad_masks = torch.ones(batch, 1 + config.chunk_size, dtype=torch.bool, device=embs.device)
        att_masks = torch.zeros_like(pad_masks)
        att_masks[:, :2] = True  # the state starts a block, the first action another
        return embs, pad_masks, att_masks

    # ----------------------------------------------------------------------------- velocity
    def prefix_cache(self, inputs: PI0Inputs) -> PrefixCache:
        """Run the prefix through the PaliGemma layers once and keep every layer's keys and values
        (openpi ``sample_actions``: the ``use_cache=True`` prefix pass).

        Returns:
            a :class:`PrefixCache` of ``depth`` layers, ``(batch, num_kv_heads, prefix_len,
            head_dim)`` each.
        """
        embs, pad_masks, att_masks = self.embed_prefix(inputs.images, inputs.image_masks, inputs.lang_tokens,
                                                       inputs.lang_masks)
        allowed = make_att_2d_masks(pad_masks, att_masks)  # (B, P, P)
        position_ids = torch.cumsum(pad_masks.long(), dim=1) - 1
        _, _, keys, values = self.paligemma_with_expert.forward_layers(embs, None, allowed, position_ids)
        return PrefixCache(keys, values, pad_masks)

    def velocity(self, cache: PrefixCache, x_t: Tensor, time: Tensor | float, state: Tensor) -> Tensor:
        """The predicted velocity ``v(x_t, t)`` given a prefix cache: what a sampler calls at every
        denoising step (openpi ``PI0Pytorch.denoise_step``). The suffix attends the cached real
        prefix tokens and, block-causally, itself; its positions continue the prefix's.

        Args:
            cache: from :meth:`prefix_cache` (not modified).
            x_t: ``(batch, chunk_size, max_action_dim)`` noisy actions.
            time: ``(batch,)`` flow times in [0, 1], or one time for every row (float or 0-d).
            state: ``(batch, max_state_dim)``.

        Returns:
            ``(batch, chunk_size, max_action_dim)`` float32.
        """
        return self.velocity_and_features(cache, x_t, time, state)[0]

    def velocity_and_features(self, cache: PrefixCache, x_t: Tensor, time: Tensor | float,
                              state: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`velocity` and the action expert's last hidden states at the action tokens (the
        features a Flow-Noise noise head reads, as RLinf feeds its ``ExploreNoiseNet`` the expert's
        ``suffix_out``).

        Returns:
            ``velocity`` ``(batch, chunk_size, max_action_dim)`` float32 and ``features``
            ``(batch, chunk_size, expert.width)`` float32.
        """
        time = self._batch_times(time, x_t)
        embs, pad_masks, att_masks = self.embed_suffix(state, x_t, time)
        batch, suffix_len = pad_masks.shape
        prefix_len = cache.pad_mask.shape[1]
        to_prefix = cache.pad_mask[:, None, :].expand(batch, suffix_len, prefix_len)  # (B, S, P)
        allowed = torch.cat([to_prefix, make_att_2d_masks(pad_masks, att_masks)], dim=2)  # (B, S, P + S)
        position_ids = cache.num_valid[:, None] + torch.cumsum(pad_masks.long(), dim=1) - 1  # (B, S)
        _, suffix_out, _, _ = self.paligemma_with_expert.forward_layers(None, embs, allowed, position_ids, cache)
        features = suffix_out[:, -self.config.chunk_size:].to(torch.float32)  # (B, H, We)
        return self._project_actions(suffix_out), features

    def velocity_uncached(self, inputs: PI0Inputs, x_t: Tensor, time: Tensor | float) -> Tensor:
        """The velocity from one joint forward pass over prefix and suffix (openpi
        ``PI0Pytorch.forward``, the training path); equal to :meth:`velocity` with a fresh cache up
        to float rounding.

        Args:
            inputs: the observation batch.
            x_t: ``(batch, chunk_size, max_action_dim)`` noisy actions.
            time: ``(batch,)`` flow times, or one for every row.

        Returns:
            ``(batch, chunk_size, max_action_dim)`` float32, differentiable.
        """
        time = self._batch_times(time, x_t)
        prefix, prefix_pad, prefix_att = self.embed_prefix(inputs.images, inputs.image_masks, inputs.lang_tokens,
                                                           inputs.lang_masks)
        suffix, suffix_pad, suffix_att = self.embed_suffix(inputs.state, x_t, time)
        pad_masks = torch.cat([prefix_pad, suffix_pad], dim=1)  # (B, P + S)
        allowed = make_att_2d_masks(pad_masks, torch.cat([prefix_att, suffix_att], dim=1))
        position_ids = torch.cumsum(pad_masks.long(), dim=1) - 1
        _, suffix_out, _, _ = self.paligemma_with_expert.forward_layers(prefix, suffix, allowed, position_ids)
        return self._project_actions(suffix_out)

    def _project_actions(self, suffix_out: Tensor) -> Tensor:
        """``action_out_proj`` of the last ``chunk_size`` suffix outputs, in float32."""
        actions_out = suffix_out[:, -self.config.chunk_size:].to(torch.float32)  # (B, H, We)
        return self.action_out_proj(actions_out.to(self.action_out_proj.weight.dtype)).to(torch.float32)

    @staticmethod
    def _batch_times(time: Tensor | float, x_t: Tensor) -> Tensor:
        time = torch.as_tensor(time, dtype=torch.float32, device=x_t.device)
        if time.ndim == 0:
            return time.expand(x_t.shape[0])
        if time.shape != (x_t.shape[0],):
            raise ValueError(f"time must be (batch={x_t.shape[0]},) or a scalar, got {tuple(time.shape)}")
        return time

    # ----------------------------------------------------------------------------- training
    def sample_noise(self, batch: int, generator: torch.Generator | None = None,
                     device: torch.device | str | None = None) -> Tensor:
        """Standard normal noise ``(batch, chunk_size, max_action_dim)`` float32 (openpi
        ``sample_noise``), from ``generator`` on its own device (:func:`policies.sampling.draw`)."""
        device = torch.device(device) if device is not None else self.action_out_proj.weight.device
        shape = (batch, self.config.chunk_size, self.config.max_action_dim)
        return draw("normal", shape, generator, torch.float32, device)

    def sample_time(self, batch: int, generator: torch.Generator | None = None,
                    device: torch.device | str | None = None) -> Tensor:
        """Training flow times ``Beta(alpha, 1) * time_scale + time_offset`` (openpi
        ``sample_time``: Beta(1.5, 1) * 0.999 + 0.001; paper Sec. 3 and App. B). Beta(alpha, 1) has
        CDF ``x ** alpha``, so it is drawn by inversion, ``u ** (1 / alpha)`` for uniform ``u``,
        which lets a ``torch.Generator`` drive it.

        Returns:
            ``(batch,)`` float32 in ``[time_offset, time_offset + time_scale]``.
        """
        config = self.config
        device = torch.device(device) if device is not None else self.action_out_proj.weight.device
        uniform = draw("uniform", (batch,), generator, torch.float32, device)
        beta = uniform ** (1.0 / config.time_beta_alpha)
        return beta * config.time_scale + config.time_offset

    def flow_matching_loss(self, inputs: PI0Inputs, actions: Tensor, noise: Tensor | None = None,
                           time: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Per-element flow-matching loss ``(u - v(x_t, t))^2`` with ``x_t = t * noise + (1 - t) *
        actions`` and ``u = noise - actions`` (openpi ``PI0Pytorch.forward``; paper eq. 1).

        Args:
            inputs: the observation batch.
            actions: ``(batch, chunk_size, max_action_dim)`` target actions, zero-padded.
            noise: ``(batch, chunk_size, max_action_dim)``; default :meth:`sample_noise`.
            time: ``(batch,)`` flow times; default :meth:`sample_time`.
            generator: random generator of the defaults.

        Returns:
            ``(batch, chunk_size, max_action_dim)`` float32, differentiable (reduce it yourself,
            e.g. over the real action dimensions only).
        """
        batch = actions.shape[0]
        actions = actions.to(torch.float32)
        noise = self.sample_noise(batch, generator, actions.device) if noise is None else noise.to(torch.float32)
        time = self.sample_time(batch, generator, actions.device) if time is None else time.to(torch.float32)
        if noise.shape != actions.shape:
            raise ValueError(f"noise {tuple(noise.shape)} and actions {tuple(actions.shape)} must have one shape")
        t = time[:, None, None]  # (B, 1, 1)
        x_t = t * noise + (1 - t) * actions
        target = noise - actions
        predicted = self.velocity_uncached(inputs, x_t, time)
        return F.mse_loss(predicted, target, reduction="none")

    # ----------------------------------------------------------------------------- sampling
    @torch.no_grad()
    def sample_actions_ode(self, inputs: PI0Inputs, noise: Tensor | None = None, num_steps: int | None = None,
                           generator: torch.Generator | None = None) -> Tensor:
        """Deterministic actions: Euler integration of the flow ODE from ``x_1 = noise`` at ``t = 1``
        to ``t = 0``, ``x <- x + dt * v(x, t)`` with ``dt = -1 / num_steps`` at the times of
        :func:`ode_times` (openpi ``PI0Pytorch.sample_actions``; paper Sec. 3, "forward Euler").

        Args:
            inputs: the observation batch.
            noise: ``(batch, chunk_size, max_action_dim)`` starting point; default
                :meth:`sample_noise` from ``generator``.
            num_steps: Euler steps; default ``config.num_steps``.
            generator: random generator of the default noise.

        Returns:
            ``(batch, chunk_size, max_action_dim)`` float32 actions (normalised, padded).
        """
        num_steps = self.config.num_steps if num_steps is None else num_steps
        state = inputs.state
        x_t = self.sample_noise(state.shape[0], generator, state.device) if noise is None else noise.to(torch.float32)
        cache = self.prefix_cache(inputs)
        dt = -1.0 / num_steps
        for time in ode_times(num_steps, state.device):
            x_t = x_t + dt * self.velocity(cache, x_t, time, state)
        return x_t
