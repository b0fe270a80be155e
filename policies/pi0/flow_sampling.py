"""Denoising samplers of a flow-matching action expert with exact log-densities of the chain.

A π0-style policy (openpi) turns noise into an action chunk by integrating a learned velocity
field. Conventions (openpi's): ``x_t = t * noise + (1 - t) * actions``, so ``t = 1`` is pure noise
and ``t = 0`` the data; the model's velocity approximates ``noise - actions``; sampling takes
``num_steps`` Euler steps from ``t = 1`` to ``t = 0``. The deterministic chain has no density, so
RL needs a stochastic one. πRL (Chen et al., "πRL: Online RL Fine-tuning for Flow-based
Vision-Language-Action Models", arXiv 2510.25889) gives two, both Markov chains of Gaussian
transitions whose log-densities are exact:

- **Flow-SDE** (:class:`FlowSDESampler`): the ODE is turned into an SDE with the same marginals
  (the conversion of Flow-GRPO, Liu et al., arXiv 2505.05470, sec. "From ODE to SDE"), discretised
  by Euler-Maruyama;
- **Flow-Noise** (:class:`policies.pi0.flow_noise.FlowNoiseSampler`): the Euler step of the ODE plus Gaussian noise whose
  scale a small learned network predicts (:class:`policies.pi0.flow_noise.NoiseHead`; ReinFlow, Zhang et al.,
  arXiv 2505.22094);
- and the deterministic ODE (:class:`FlowODESampler`) for greedy evaluation.

Each sampler's :meth:`FlowSampler.sample_chain` records the whole chain ``x_{t_0} = noise, ...,
x_{t_N}`` (the last entry is the action chunk) with every transition's per-element log-density;
:meth:`FlowSampler.log_prob_of_chain` recomputes them for a recorded chain (what the RL update
calls), bit for bit the recorded values when the velocity function is deterministic, so the first
ratio of an update is exactly 1. The initial noise's density (a standard normal) is left out: it
does not depend on the policy and cancels in every ratio. Deterministic transitions contribute 0.

Reference implementation read: RLinf (github.com/RLinf/RLinf, commit
a3816b596478dcd8a5c69a6ec1468c9519f77b5b), ``rlinf/models/embodiment/openpi/
openpi_action_model.py``: ``OpenPi0ForRLActionPrediction._get_timesteps``,
``sample_mean_var_val`` (the transition means and stds), ``_sample_actions_with_prefix_cache``
(sampling), ``get_log_prob_value`` (recomputation), ``get_logprob_norm`` and
``gaussian_entropy``; ``rlinf/models/embodiment/modules/explore_noise_net.py``:
``ExploreNoiseNet`` (Flow-Noise's noise network). The formulas below are written out in full;
this module is our own code, not a copy.

The velocity function is any callable ``velocity(x_t, t)`` with ``x_t`` ``(batch, chunk,
action_dim)`` float32 and ``t`` ``(batch,)`` float32 (one time per row: the recomputation
evaluates different rows at different steps) returning the velocity ``(batch, chunk,
action_dim)`` (any floating dtype, used as float32), or a pair ``(velocity, features)`` with
``features`` ``(batch, chunk, feature_dim)``: per-action hidden states, which Flow-Noise's noise
head reads (RLinf feeds it the action expert's output tokens) and the other samplers ignore.
Random numbers come from :func:`policies.sampling.draw`, so one generator on any device serves a
velocity on any device.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from policies.sampling import draw

#: ``velocity(x_t (batch, chunk, action_dim), t (batch,)) -> velocity`` or ``(velocity, features)``.
VelocityFn = Callable[[Tensor, Tensor], Tensor | tuple[Tensor, Tensor]]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_HALF_LOG_2PI_E = 0.5 * math.log(2.0 * math.pi * math.e)


def denoising_times(num_steps: int, device: torch.device | str | None = None) -> Tensor:
    """The time grid ``t_k = 1 - k / num_steps``, ``k = 0 .. num_steps``: from noise (1) to data (0).

    The same grid as RLinf's ``_get_timesteps`` (``linspace(1, 1/N, N)`` then ``0``), computed in
    float64 and rounded once to float32 (openpi's own loop accumulates ``t += dt`` in float32,
    which differs by rounding only). Step ``k`` goes from ``t_k`` to ``t_{k+1}``, of length
    ``delta_k = t_k - t_{k+1} = 1 / num_steps`` (openpi's ``dt = -1 / num_steps``).

    Returns:
        ``(num_steps + 1,)`` float32, decreasing, ``[1, ..., 0]``.

    Raises:
        ValueError: ``num_steps`` is not an int >= 1.
    """
    _check_num_steps(num_steps)
    steps = torch.arange(num_steps + 1, dtype=torch.float64, device=device)
    return (1.0 - steps / num_steps).to(torch.float32)


def gaussian_log_density(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Per-element log-density of ``N(mean, std^2)`` at ``x``:
    ``-log(std) - log(2 pi) / 2 - ((x - mean) / std)^2 / 2`` (RLinf's ``get_logprob_norm``).

    Args:
        x, mean, std: broadcastable floating tensors, ``std > 0``.

    Returns:
        the broadcast shape, differentiable in ``mean`` and ``std``.
    """
    z = (x - mean) / std
    return -torch.log(std) - _LOG_SQRT_2PI - 0.5 * z * z


@dataclasses.dataclass(frozen=True)
class FlowChain:
    """One sampled denoising chain per row.

    Attributes:
        chain: ``(batch, num_steps + 1, chunk, action_dim)`` float32: ``x`` at ``t_0 = 1`` (the
            initial noise) ... ``t_N = 0`` (the action chunk), on the grid of
            :func:`denoising_times`.
        log_probs: ``(batch, num_steps, chunk, action_dim)`` float32: entry ``k`` is the
            log-density of ``chain[:, k + 1]`` under step ``k``'s Gaussian transition from
            ``chain[:, k]``, per element; 0 where the step is deterministic. The initial noise's
            density is left out (it does not depend on the policy).
        stochastic: ``(batch, num_steps)`` bool: which transitions are stochastic (the others are
            Euler steps of the ODE); pass it back to :meth:`FlowSampler.log_prob_of_chain`.
    """

    chain: Tensor
    log_probs: Tensor
    stochastic: Tensor

    @property
    def actions(self) -> Tensor:
        """``(batch, chunk, action_dim)`` float32: the chain's last state, at ``t = 0``."""
        return self.chain[:, -1]

    @property
    def num_steps(self) -> int:
        """Number of denoising steps."""
        return self.log_probs.shape[1]


class FlowSampler(nn.Module, abc.ABC):
    """A Markov chain of Gaussian transitions from noise to an action chunk, driven by a velocity.

    Step ``k`` (from ``t = t_k`` to ``t_{k+1}``, ``delta = t_k - t_{k+1}``) draws
    ``x_{t_{k+1}} ~ N(mean_k(x_{t_k}), std_k^2 I)`` when it is stochastic, and is the Euler step
    ``x_{t_{k+1}} = x_{t_k} - delta * v(x_{t_k}, t_k)`` of the ODE otherwise. Subclasses give the
    stochastic transition (:meth:`_stochastic_transition`) and which steps are stochastic
    (:meth:`_draw_stochastic_steps`). Samplers are modules so that a learned noise head's
    parameters belong to the policy that holds the sampler.
    """

    @abc.abstractmethod
    def _stochastic_transition(
        self, x_t: Tensor, velocity: Tensor, features: Tensor | None, t: Tensor, delta: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Mean and std of a stochastic step.

        Args:
            x_t: ``(batch, chunk, action_dim)`` float32, the state at ``t``.
            velocity: ``(batch, chunk, action_dim)`` float32, ``v(x_t, t)``.
            features: ``(batch, chunk, feature_dim)`` or None, as the velocity function gave them.
            t: ``(batch, 1, 1)`` float32 step start times, in ``(0, 1]``.
            delta: ``(batch, 1, 1)`` float32 step lengths, > 0.

        Returns:
            ``mean`` and ``std``, each ``(batch, chunk, action_dim)`` float32, ``std > 0``.
        """

    def _draw_stochastic_steps(
        self, batch: int, num_steps: int, generator: torch.Generator | None, device: torch.device
    ) -> Tensor:
        """Which steps of each row's chain are stochastic: all of them by default.

        Returns:
            ``(batch, num_steps)`` bool on ``device``.
        """
        return torch.ones(batch, num_steps, dtype=torch.bool, device=device)

    def _check_stochastic(self, stochastic: Tensor | None, batch: int, num_steps: int,
                          device: torch.device) -> Tensor:
        """The mask :meth:`log_prob_of_chain` scores with: ``stochastic``, or every step when None."""
        if stochastic is None:
            return torch.ones(batch, num_steps, dtype=torch.bool, device=device)
        if stochastic.dtype != torch.bool or tuple(stochastic.shape) != (batch, num_steps):
            raise ValueError(
                f"stochastic must be a bool tensor of shape (batch, num_steps) = {(batch, num_steps)}"
                f" (FlowChain.stochastic), got {stochastic.dtype} {tuple(stochastic.shape)}"
            )
        return stochastic.to(device)

    def _transition(self, velocity_fn: VelocityFn, x_t: Tensor, step: Tensor, times: Tensor,
                    stochastic_rows: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
        """Mean and std of step ``step[b]`` from ``x_t[b]`` for every row ``b``.

        Args:
            velocity_fn: the velocity function (module docstring).
            x_t: ``(batch, chunk, action_dim)`` float32.
            step: ``(batch,)`` int64 step indices in ``[0, num_steps)``.
            times: ``(num_steps + 1,)`` float32, :func:`denoising_times`.
            stochastic_rows: ``(batch,)`` bool, whether each row's step is stochastic.
            temperature: > 0, multiplies the std of the stochastic transitions (the means stay).

        Returns:
            ``mean`` and ``std``, each ``(batch, chunk, action_dim)`` float32; ``std`` is 0 on
            deterministic rows, whose mean is the Euler step.
        """
        t = times[step]  # (B,)
        delta = t - times[step + 1]  # (B,)
        velocity, features = _evaluate_velocity(velocity_fn, x_t, t)
        t3, delta3 = t[:, None, None], delta[:, None, None]  # (B, 1, 1)
        ode_mean = x_t - delta3 * velocity
        if not bool(stochastic_rows.any()):
            return ode_mean, torch.zeros_like(ode_mean)
        mean, std = self._stochastic_transition(x_t, velocity, features, t3, delta3)
        if temperature != 1.0:
            std = std * temperature
        rows = stochastic_rows[:, None, None]  # (B, 1, 1)
        return torch.where(rows, mean, ode_mean), torch.where(rows, std, torch.zeros_like(std))

    @torch.no_grad()
    def sample_chain(self, velocity: VelocityFn, noise: Tensor, num_steps: int,
                     generator: torch.Generator | None = None, temperature: float = 1.0) -> FlowChain:
        """Sample each row's denoising chain from ``noise`` and record its transition log-densities.

        Runs without tracking gradients (a rollout); :meth:`log_prob_of_chain` gives the
        differentiable values.

        Args:
            velocity: the velocity function (module docstring).
            noise: ``(batch, chunk, action_dim)`` floating, the chain's start ``x_{t=1}``
                (usually ``N(0, I)``; used as float32).
            num_steps: number of denoising steps, >= 1.
            generator: random generator (any device, :func:`policies.sampling.draw`); the global
                one of ``noise``'s device if None.
            temperature: > 0, multiplies the std of every stochastic transition (means
                unchanged); the log-densities are those of the tempered transitions.

        Returns:
            the :class:`FlowChain`.

        Raises:
            ValueError: ``noise`` is not a 3-D floating tensor, ``num_steps`` is not an int >= 1,
                ``temperature`` is not a finite number > 0, the velocity function returns a wrong
                shape, or the sampler's settings do not fit ``num_steps``.
            TypeError: the velocity function returns something other than a tensor or a pair.
        """
        _check_num_steps(num_steps)
        _check_temperature(temperature)
        _check_actions("noise", noise)
        x_t = noise.to(torch.float32)
        batch, device = x_t.shape[0], x_t.device
        times = denoising_times(num_steps, device)
        stochastic = self._draw_stochastic_steps(batch, num_steps, generator, device)  # (B, N)
        states, log_probs = [x_t], []
        for k in range(num_steps):
            step = torch.full((batch,), k, dtype=torch.long, device=device)
            rows = stochastic[:, k]
            mean, std = self._transition(velocity, x_t, step, times, rows, temperature)
            if bool(rows.any()):
                eps = draw("normal", tuple(x_t.shape), generator, torch.float32, device)
                x_next = mean + std * eps
            else:
                x_next = mean
            log_probs.append(_masked_log_density(x_next, mean, std, rows))
            states.append(x_next)
            x_t = x_next
        return FlowChain(
            chain=torch.stack(states, dim=1),  # (B, N + 1, chunk, D)
            log_probs=torch.stack(log_probs, dim=1),  # (B, N, chunk, D)
            stochastic=stochastic,
        )

    def log_prob_and_entropy_of_chain(self, velocity: VelocityFn, chain: Tensor, stochastic: Tensor | None = None,
                                      temperature: float = 1.0) -> tuple[Tensor, Tensor]:
        """Transition log-densities and entropies of recorded chains, differentiable.

        Only the stochastic steps are evaluated: each row's ``j``-th stochastic step is gathered
        into one velocity call (rows at different steps are evaluated together, with their own
        times), so a chain with one stochastic step costs one call, as in RLinf's
        ``get_log_prob_value``. Every row must have the same number of stochastic steps.

        Args:
            velocity: the velocity function (module docstring).
            chain: ``(batch, num_steps + 1, chunk, action_dim)`` floating, ``FlowChain.chain``.
            stochastic: ``(batch, num_steps)`` bool, ``FlowChain.stochastic``; None: every step.
            temperature: the one the chain was sampled at (multiplies every transition std).

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, num_steps, chunk, action_dim)``
            float32; the entropy of a Gaussian step is ``log(std) + log(2 pi e) / 2`` per
            element (RLinf's ``gaussian_entropy``). Both are 0 on deterministic steps.

        Raises:
            ValueError: bad ``chain`` or ``stochastic`` shapes, rows with different numbers of
                stochastic steps, or a wrong velocity output shape.
        """
        if not (isinstance(chain, Tensor) and chain.is_floating_point() and chain.dim() == 4
                and chain.shape[1] >= 2):
            raise ValueError(
                "chain must be a floating tensor (batch, num_steps + 1, chunk, action_dim) with "
                f"num_steps >= 1 (FlowChain.chain), got "
                f"{_describe(chain)}"
            )
        _check_temperature(temperature)
        chain = chain.to(torch.float32)
        batch, num_steps, device = chain.shape[0], chain.shape[1] - 1, chain.device
        stochastic = self._check_stochastic(stochastic, batch, num_steps, device)
        counts = stochastic.sum(dim=1)  # (B,)
        if batch and bool((counts != counts[0]).any()):
            raise ValueError(
                "every row of stochastic must mark the same number of stochastic steps, got "
                f"{counts.tolist()}"
            )
        times = denoising_times(num_steps, device)
        log_probs = chain.new_zeros(batch, num_steps, *chain.shape[2:])
        entropy = torch.zeros_like(log_probs)
        if batch == 0:
            return log_probs, entropy
        steps = torch.arange(num_steps, device=device).expand(batch, num_steps)
        order = torch.where(stochastic, steps, steps + num_steps).sort(dim=1).values  # (B, N)
        rows = torch.arange(batch, device=device)
        all_rows = torch.ones(batch, dtype=torch.bool, device=device)
        for j in range(int(counts[0])):
            step = order[:, j]  # (B,), each row's j-th stochastic step
            mean, std = self._transition(velocity, chain[rows, step], step, times, all_rows, temperature)
            step_log_prob = gaussian_log_density(chain[rows, step + 1], mean, std)
            log_probs = log_probs.index_put((rows, step), step_log_prob)
            entropy = entropy.index_put((rows, step), torch.log(std) + _HALF_LOG_2PI_E)
        return log_probs, entropy

    def log_prob_of_chain(self, velocity: VelocityFn, chain: Tensor, stochastic: Tensor | None = None,
                          temperature: float = 1.0) -> Tensor:
        """Transition log-densities of recorded chains: ``log_prob_and_entropy_of_chain(...)[0]``.

        Returns:
            ``(batch, num_steps, chunk, action_dim)`` float32, differentiable; equal to the
            ``FlowChain.log_probs`` of :meth:`sample_chain` bit for bit for a deterministic
            velocity function that gives each row the same numbers whatever the batch holds.
        """
        return self.log_prob_and_entropy_of_chain(velocity, chain, stochastic, temperature)[0]


class FlowODESampler(FlowSampler):
    """The deterministic Euler integration of the flow ODE (openpi's sampler; greedy evaluation):
    ``x_{t - delta} = x_t - delta * v(x_t, t)``. Every step is deterministic, so every
    log-density is 0 and no random number is drawn."""

    def _stochastic_transition(self, x_t, velocity, features, t, delta):
        raise AssertionError("the ODE sampler has no stochastic steps")

    def _draw_stochastic_steps(self, batch, num_steps, generator, device):
        return torch.zeros(batch, num_steps, dtype=torch.bool, device=device)

    def _check_stochastic(self, stochastic, batch, num_steps, device):
        if stochastic is None:
            return torch.zeros(batch, num_steps, dtype=torch.bool, device=device)
        mask = super()._check_stochastic(stochastic, batch, num_steps, device)
        if bool(mask.any()):
            raise ValueError("the ODE sampler has no stochastic steps; stochastic must be all False")
        return mask


class FlowSDESampler(FlowSampler):
    """πRL's Flow-SDE: the flow ODE turned into an SDE with the same marginals, Euler-Maruyama.

    For the linear path ``x_t = t * noise + (1 - t) * actions`` the score is
    ``grad log p_t(x) = -E[noise | x_t = x] / t`` and ``E[noise | x_t = x] = x + (1 - t) v(x, t)``
    (from ``x = t E[noise] + (1 - t) E[actions]`` and ``v = E[noise - actions]``). The
    reverse-time SDE with the ODE's marginals, run from ``t = 1`` down to 0, is (Flow-GRPO's
    ODE-to-SDE conversion, which πRL's Flow-SDE section adopts)::

        dx = [v(x, t) + sigma_t^2 / (2 t) * (x + (1 - t) v(x, t))] dt + sigma_t dW,  dt < 0,
        sigma_t = a * sqrt(t / (1 - t)),

    and one Euler-Maruyama step of length ``delta`` (``dt = -delta``) is the Gaussian transition::

        mean = x_t - delta * v - delta * sigma_t^2 / (2 t) * (x_t + (1 - t) v),
        std  = sigma_t * sqrt(delta),

    which is RLinf's ``sample_mean_var_val`` branch ``flow_sde`` (there written as
    ``x0_pred * (1 - t + delta) + x1_pred * (t - delta - sigma^2 delta / (2 t))`` with
    ``x0_pred = x_t - t v``, ``x1_pred = x_t + (1 - t) v``; the two forms are equal).

    Endpoint: ``sigma_t`` is infinite at ``t = 1``. RLinf (and Flow-GRPO's code) evaluate the
    first step with ``t_1`` in the denominator instead: ``sigma_{t_0} = a * sqrt(1 / (1 - t_1))``
    (``= a * sqrt(N)`` on the uniform grid, so the first step's std is exactly ``a``); this
    sampler does the same. With ``num_steps = 1``, ``t_1 = 0`` and ``sigma = a``. The last step
    starts at ``t_{N-1} = 1 / N > 0``, so ``1 / t`` stays finite.

    Stochastic steps (RLinf's ``joint_logprob``/``ignore_last``): ``"all"`` makes every step
    stochastic; ``"one"`` makes one uniformly drawn step per chain stochastic and the others ODE
    steps (RLinf's default for Flow-SDE: a two-layer MDP in which only that step is an action),
    never the last one when ``exclude_last_step``. RLinf draws one index for the whole batch with
    Python's ``random``; here each row draws its own from ``generator``.

    Args:
        noise_level: ``a`` > 0 (RLinf's default 0.5; its noise annealing schedules ``a`` across
            training steps, which a caller does by building samplers with other levels).
        stochastic_steps: ``"all"`` or ``"one"``.
        exclude_last_step: with ``"one"``, draw the stochastic step among the first
            ``num_steps - 1`` (needs ``num_steps >= 2``).

    Raises:
        ValueError: ``noise_level`` is not a finite number > 0, ``stochastic_steps`` is unknown, or
            ``exclude_last_step`` is set without ``"one"``.
    """

    def __init__(self, noise_level: float = 0.5, stochastic_steps: Literal["all", "one"] = "all",
                 exclude_last_step: bool = False) -> None:
        super().__init__()
        if isinstance(noise_level, bool) or not isinstance(noise_level, (int, float)) \
                or not math.isfinite(noise_level) or noise_level <= 0:
            raise ValueError(
                f"noise_level must be a finite number > 0 (the Flow-SDE noise scale a; use "
                f"FlowODESampler for no noise), got {noise_level!r}"
            )
        if stochastic_steps not in ("all", "one"):
            raise ValueError(f"stochastic_steps must be 'all' or 'one', got {stochastic_steps!r}")
        if exclude_last_step and stochastic_steps != "one":
            raise ValueError("exclude_last_step needs stochastic_steps='one'")
        self.noise_level = float(noise_level)
        self.stochastic_steps = stochastic_steps
        self.exclude_last_step = bool(exclude_last_step)

    def sigma(self, t: Tensor, t_next_of_first: Tensor) -> Tensor:
        """``sigma_t = a * sqrt(t / (1 - t'))`` with ``t' = t_1`` where ``t == 1`` (the endpoint
        rule above) and ``t' = t`` elsewhere.

        Args:
            t: step start times in ``(0, 1]``, any shape.
            t_next_of_first: ``t_1``, the grid's second time, broadcastable to ``t``.

        Returns:
            ``t``'s shape, float32.
        """
        denominator_time = torch.where(t == 1.0, t_next_of_first, t)
        return self.noise_level * torch.sqrt(t / (1.0 - denominator_time))

    def _stochastic_transition(self, x_t, velocity, features, t, delta):
        # Only the first step starts at t = 1, and there 1 - delta is t_1 exactly (Sterbenz).
        sigma = self.sigma(t, 1.0 - delta)  # (B, 1, 1)
        predicted_noise = x_t + (1.0 - t) * velocity  # E[noise | x_t]; score = -predicted_noise / t
        mean = x_t - delta * velocity - delta * sigma * sigma / (2.0 * t) * predicted_noise
        std = (sigma * torch.sqrt(delta)).expand_as(mean)
        return mean, std

    def _draw_stochastic_steps(self, batch, num_steps, generator, device):
        if self.stochastic_steps == "all":
            return super()._draw_stochastic_steps(batch, num_steps, generator, device)
        choices = num_steps - 1 if self.exclude_last_step else num_steps
        if choices < 1:
            raise ValueError("exclude_last_step needs num_steps >= 2 (one step must stay stochastic)")
        uniform = draw("uniform", (batch,), generator, torch.float64, device)
        index = (uniform * choices).long().clamp_(max=choices - 1)  # (B,)
        return torch.nn.functional.one_hot(index, num_steps).bool()

    def _check_stochastic(self, stochastic, batch, num_steps, device):
        if stochastic is None and self.stochastic_steps == "one":
            raise ValueError(
                "this sampler makes one step per chain stochastic: pass the chain's "
                "FlowChain.stochastic to score it"
            )
        return super()._check_stochastic(stochastic, batch, num_steps, device)


def _masked_log_density(x: Tensor, mean: Tensor, std: Tensor, rows: Tensor) -> Tensor:
    """:func:`gaussian_log_density` on rows where ``rows`` (``(batch,)`` bool) is True, else 0."""
    if not bool(rows.any()):
        return torch.zeros_like(mean)
    safe_std = torch.where(rows[:, None, None], std, torch.ones_like(std))
    return torch.where(rows[:, None, None], gaussian_log_density(x, mean, safe_std), torch.zeros_like(mean))


def _evaluate_velocity(velocity_fn: VelocityFn, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor | None]:
    """Call the velocity function and check what it returns: ``(velocity float32, features)``."""
    out = velocity_fn(x_t, t)
    features = None
    if isinstance(out, tuple):
        if len(out) != 2:
            raise TypeError(
                "the velocity function must return a tensor or a (velocity, features) pair, "
                f"got a {len(out)}-tuple"
            )
        out, features = out
    if not isinstance(out, Tensor) or not out.is_floating_point():
        raise TypeError(f"the velocity function must return a floating tensor, got {_describe(out)}")
    if out.shape != x_t.shape:
        raise ValueError(
            f"the velocity function returned shape {tuple(out.shape)} for x_t of shape "
            f"{tuple(x_t.shape)}; it must be (batch, chunk, action_dim) like x_t"
        )
    if features is not None and (not isinstance(features, Tensor) or features.dim() != 3
                                 or features.shape[:2] != x_t.shape[:2]):
        raise ValueError(
            f"the velocity function's features must be (batch, chunk, feature_dim) = "
            f"({x_t.shape[0]}, {x_t.shape[1]}, ...), got {_describe(features)}"
        )
    return out.to(torch.float32), features


def _check_temperature(temperature: float) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0 (it multiplies the transition stds), got "
                         f"{temperature!r}")


def _check_num_steps(num_steps: int) -> None:
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")


def _check_actions(name: str, x: Tensor) -> None:
    if not (isinstance(x, Tensor) and x.is_floating_point() and x.dim() == 3):
        raise ValueError(f"{name} must be a floating tensor (batch, chunk, action_dim), got {_describe(x)}")


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
