"""The flow samplers of policies/pi0/flow_sampling.py: transition densities against hand
computations, exact recomputation of recorded chains, the Flow-SDE marginals on a 1-D flow whose
velocity is known in closed form, generator control, and input errors."""

from __future__ import annotations

import math

import pytest
import torch
from devices import device_under_test
from torch import Tensor, nn

from policies.pi0.flow_noise import FlowNoiseSampler, NoiseHead
from policies.pi0.flow_sampling import (
    FlowChain,
    FlowODESampler,
    FlowSDESampler,
    denoising_times,
    gaussian_log_density,
)

CHUNK, ACTION_DIM, FEATURES = 3, 2, 8


class TinyVelocity(nn.Module):
    """A small conditional velocity network ``(x_t, t) -> v`` and per-action features."""

    def __init__(self, with_features: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Sequential(nn.Linear(ACTION_DIM + 1, FEATURES), nn.Tanh())
        self.out = nn.Linear(FEATURES, ACTION_DIM)
        self.with_features = with_features

    def forward(self, x_t: Tensor, t: Tensor):
        t_col = t[:, None, None].expand(*x_t.shape[:2], 1)  # (B, chunk, 1)
        features = self.hidden(torch.cat([x_t, t_col], dim=-1))  # (B, chunk, F)
        velocity = self.out(features)
        return (velocity, features) if self.with_features else velocity


def gaussian_toy_velocity(mu: float, s: float):
    """The exact marginal velocity ``E[noise - data | x_t = x]`` of the path
    ``x_t = t * noise + (1 - t) * data`` for ``noise ~ N(0, 1)``, ``data ~ N(mu, s^2)``:
    ``x_t`` and ``noise - data`` are jointly Gaussian with ``Cov = t - (1 - t) s^2`` and
    ``Var(x_t) = t^2 + (1 - t)^2 s^2``, so
    ``v(x, t) = -mu + (t - (1 - t) s^2) / (t^2 + (1 - t)^2 s^2) * (x - (1 - t) mu)``."""

    def coefficients(t: float) -> tuple[float, float]:
        slope = (t - (1 - t) * s * s) / (t * t + (1 - t) ** 2 * s * s)
        return slope, -mu - slope * (1 - t) * mu  # v = slope * x + offset

    def velocity(x_t: Tensor, t: Tensor) -> Tensor:
        t3 = t[:, None, None].double()
        slope = (t3 - (1 - t3) * s * s) / (t3 * t3 + (1 - t3) ** 2 * s * s)
        return (-mu + slope * (x_t.double() - (1 - t3) * mu)).float()

    return velocity, coefficients


def sde_moments(num_steps: int, a: float, coefficients, stochastic_step: int | None = None):
    """Mean and variance of the discrete Flow-SDE chain at every grid time, by hand, for a linear
    velocity ``v = slope * x + offset``: each step is ``x' = A x + B + std * eps`` with
    ``A = 1 - d*slope - d*sig^2/(2t)*(1 + (1-t)*slope)``, ``B = -d*offset - d*sig^2/(2t)*(1-t)*offset``,
    ``std^2 = sig^2 * d``, ``sig = a*sqrt(t/(1-t))`` (``t_1`` in the denominator at ``t = 1``); a
    deterministic step is the Euler step ``A = 1 - d*slope``, ``B = -d*offset``."""
    times = [1 - k / num_steps for k in range(num_steps + 1)]
    mean, var, out = 0.0, 1.0, [(0.0, 1.0)]
    for k in range(num_steps):
        t, d = times[k], times[k] - times[k + 1]
        slope, offset = coefficients(t)
        if a == 0 or (stochastic_step is not None and k != stochastic_step):
            scale, shift, noise_var = 1 - d * slope, -d * offset, 0.0
        else:
            sig2 = a * a * t / (1 - (times[1] if t == 1 else t))
            scale = 1 - d * slope - d * sig2 / (2 * t) * (1 + (1 - t) * slope)
            shift = -d * offset - d * sig2 / (2 * t) * (1 - t) * offset
            noise_var = sig2 * d
        mean, var = scale * mean + shift, scale * scale * var + noise_var
        out.append((mean, var))
    return out


def noise(batch: int, device: torch.device, seed: int = 1) -> Tensor:
    return torch.randn(batch, CHUNK, ACTION_DIM, generator=torch.Generator().manual_seed(seed)).to(device)


# (a) one transition against the Gaussian formula by hand -----------------------------------------


def test_gaussian_log_density_is_the_normal_formula():
    x, mean, std = torch.tensor([0.3, -1.2]), torch.tensor([0.1, 0.5]), torch.tensor([0.2, 1.5])
    expected = [-math.log(s) - 0.5 * math.log(2 * math.pi) - 0.5 * ((xi - m) / s) ** 2
                for xi, m, s in zip(x.tolist(), mean.tolist(), std.tolist(), strict=True)]
    assert gaussian_log_density(x, mean, std).tolist() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("num_steps", [1, 4])
def test_first_flow_sde_transition_matches_a_hand_computation(num_steps):
    # One row, one element, a constant velocity v = 0.7: the first step starts at t = 1 (sigma
    # uses t_1 in its denominator) and the chain's second state is the Gaussian sample.
    a, v = 0.5, 0.7
    sampler = FlowSDESampler(noise_level=a)
    x0 = torch.tensor([[[0.4]]])
    out = sampler.sample_chain(lambda x, t: torch.full_like(x, v), x0, num_steps,
                               torch.Generator().manual_seed(3))
    t, t1 = 1.0, 1 - 1 / num_steps
    delta = t - t1
    sigma = a * math.sqrt(t / (1 - t1))  # = a * sqrt(num_steps)
    mean = 0.4 - delta * v - delta * sigma**2 / (2 * t) * (0.4 + (1 - t) * v)
    std = sigma * math.sqrt(delta)
    assert std == pytest.approx(a)  # the first step's std is exactly the noise level
    x1 = out.chain[0, 1, 0, 0].item()
    expected = -math.log(std) - 0.5 * math.log(2 * math.pi) - 0.5 * ((x1 - mean) / std) ** 2
    assert out.log_probs[0, 0, 0, 0].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    # A later step (t < 1) uses sigma = a * sqrt(t / (1 - t)).
    if num_steps > 1:
        k = 2
        t, t_next = 1 - k / num_steps, 1 - (k + 1) / num_steps
        delta, xk = t - t_next, out.chain[0, k, 0, 0].item()
        sigma = a * math.sqrt(t / (1 - t))
        mean = xk - delta * v - delta * sigma**2 / (2 * t) * (xk + (1 - t) * v)
        std = sigma * math.sqrt(delta)
        xn = out.chain[0, k + 1, 0, 0].item()
        expected = -math.log(std) - 0.5 * math.log(2 * math.pi) - 0.5 * ((xn - mean) / std) ** 2
        assert out.log_probs[0, k, 0, 0].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_flow_noise_transition_matches_a_hand_computation():
    head = NoiseHead(ACTION_DIM + 1, ACTION_DIM, hidden_dims=(4,), min_std=0.08, max_std=0.16)
    sampler = FlowNoiseSampler(head)
    x0 = noise(1, torch.device("cpu"))
    out = sampler.sample_chain(lambda x, t: 0.5 * x, x0, 2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        raw = head.mlp(torch.cat([x0, torch.ones(1, CHUNK, 1)], dim=-1))
    log_std = math.log(0.08) + (math.log(0.16) - math.log(0.08)) * (torch.tanh(raw) + 1) / 2
    std, mean = log_std.exp(), x0 - 0.5 * (0.5 * x0)  # Euler step of length 1/2
    expected = -log_std - 0.5 * math.log(2 * math.pi) - 0.5 * ((out.chain[:, 1] - mean) / std) ** 2
    torch.testing.assert_close(out.log_probs[:, 0], expected, rtol=1e-5, atol=1e-6)
    assert bool(((std >= 0.08 - 1e-7) & (std <= 0.16 + 1e-7)).all())


def test_noise_head_is_bounded():
    head = NoiseHead(in_dim=5, action_dim=ACTION_DIM, min_std=0.08, max_std=0.16)
    log_std = head(1e3 * torch.randn(4, CHUNK, 5)).detach()
    assert log_std.shape == (4, CHUNK, ACTION_DIM)
    assert float(log_std.min()) >= math.log(0.08) - 1e-6 and float(log_std.max()) <= math.log(0.16) + 1e-6


def test_ode_sampler_is_the_euler_integration():
    x0 = noise(2, torch.device("cpu"))
    out = FlowODESampler().sample_chain(lambda x, t: x * t[:, None, None], x0, 4)
    x = x0.clone()
    for t in (1.0, 0.75, 0.5, 0.25):
        x = x - 0.25 * t * x
    torch.testing.assert_close(out.actions, x)
    assert not bool(out.stochastic.any()) and bool((out.log_probs == 0).all())


def test_time_grid():
    assert denoising_times(4).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert denoising_times(10).dtype == torch.float32


# (b) recomputed log-probs equal the recorded ones exactly ------------------------------------------


def samplers():
    return {
        "sde_all": (FlowSDESampler(0.5), False),
        "sde_one": (FlowSDESampler(0.5, stochastic_steps="one"), False),
        "sde_one_not_last": (FlowSDESampler(0.4, stochastic_steps="one", exclude_last_step=True), False),
        "noise_features": (FlowNoiseSampler(NoiseHead(FEATURES, ACTION_DIM)), True),
        "noise_state_time": (FlowNoiseSampler(NoiseHead(ACTION_DIM + 1, ACTION_DIM)), False),
        "ode": (FlowODESampler(), False),
    }


@pytest.mark.parametrize("name", list(samplers()))
def test_recomputed_log_probs_equal_the_recorded_ones(name):
    device = device_under_test()
    sampler, with_features = samplers()[name]
    sampler.to(device)
    velocity = TinyVelocity(with_features).to(device)
    out = sampler.sample_chain(velocity, noise(6, device), 5, torch.Generator().manual_seed(7))
    assert isinstance(out, FlowChain)
    assert out.chain.shape == (6, 6, CHUNK, ACTION_DIM) and out.chain.dtype == torch.float32
    assert out.log_probs.shape == (6, 5, CHUNK, ACTION_DIM) and out.log_probs.dtype == torch.float32
    assert out.stochastic.shape == (6, 5) and out.num_steps == 5
    assert torch.equal(out.chain[:, 0], noise(6, device))
    log_probs, entropy = sampler.log_prob_and_entropy_of_chain(velocity, out.chain, out.stochastic)
    assert torch.equal(log_probs, out.log_probs)  # the first ratio is exactly 1
    assert torch.equal(torch.exp(log_probs - out.log_probs), torch.ones_like(log_probs))
    assert bool((log_probs[~out.stochastic] == 0).all()) and bool((entropy[~out.stochastic] == 0).all())
    if name.startswith("sde_one"):
        assert bool((out.stochastic.sum(1) == 1).all())
        if name == "sde_one_not_last":
            assert not bool(out.stochastic[:, -1].any())
    if name != "ode":
        assert bool(out.stochastic.any())
        (log_probs.sum() + entropy.sum()).backward()  # differentiable in the policy's parameters
        assert velocity.out.weight.grad is not None and velocity.out.weight.grad.abs().sum() > 0
        if isinstance(sampler, FlowNoiseSampler):
            assert sampler.noise_head.mlp[0].weight.grad is not None


@pytest.mark.parametrize("name", ["sde_all", "noise_features"])
def test_temperature_multiplies_the_transition_std(name):
    sampler, with_features = samplers()[name]
    velocity = TinyVelocity(with_features)
    cold = sampler.sample_chain(velocity, noise(4, torch.device("cpu")), 3, torch.Generator().manual_seed(3))
    hot = sampler.sample_chain(velocity, noise(4, torch.device("cpu")), 3, torch.Generator().manual_seed(3),
                               temperature=2.0)
    # Same draws, the first step's mean unchanged: its deviation from the mean doubles.
    mean = 2 * cold.chain[:, 1] - hot.chain[:, 1]
    torch.testing.assert_close(hot.chain[:, 1] - mean, 2 * (cold.chain[:, 1] - mean))
    log_probs, entropy = sampler.log_prob_and_entropy_of_chain(velocity, hot.chain, temperature=2.0)
    assert torch.equal(log_probs, hot.log_probs)
    _, entropy_cold = sampler.log_prob_and_entropy_of_chain(velocity, hot.chain)
    torch.testing.assert_close(entropy, entropy_cold + math.log(2.0))
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="temperature"):
            sampler.sample_chain(velocity, noise(4, torch.device("cpu")), 3, temperature=bad)
        with pytest.raises(ValueError, match="temperature"):
            sampler.log_prob_of_chain(velocity, hot.chain, temperature=bad)


def test_one_stochastic_step_per_row_is_drawn_per_row():
    sampler = FlowSDESampler(0.5, stochastic_steps="one")
    x0 = noise(64, torch.device("cpu"))
    out = sampler.sample_chain(TinyVelocity(), x0, 5, torch.Generator().manual_seed(0))
    assert len(set(out.stochastic.float().argmax(1).tolist())) > 1
    # The deterministic steps are the Euler steps of the ODE.
    row, step = 0, int((~out.stochastic[0]).nonzero()[0])
    t = denoising_times(5)[step]
    x = out.chain[row : row + 1, step]
    euler = x - 0.2 * TinyVelocity()(x, t.reshape(1))
    torch.testing.assert_close(out.chain[row : row + 1, step + 1], euler.detach())


# (c) Flow-SDE marginals on a 1-D Gaussian flow with a closed-form velocity ------------------------


def test_flow_sde_sampler_follows_its_transition_moments():
    # Monte Carlo moments of the sampler at every step against the same chain's moments by hand.
    mu, s, a, steps, n = 1.5, 0.5, 0.5, 10, 100_000
    velocity, coefficients = gaussian_toy_velocity(mu, s)
    x0 = torch.randn(n, 1, 1, generator=torch.Generator().manual_seed(0))
    out = FlowSDESampler(a).sample_chain(velocity, x0, steps, torch.Generator().manual_seed(1))
    for k, (mean, var) in enumerate(sde_moments(steps, a, coefficients)):
        xs = out.chain[:, k, 0, 0].double()
        assert float(xs.mean()) == pytest.approx(mean, abs=5 * math.sqrt(var / n))
        assert float(xs.var()) == pytest.approx(var, rel=5 * math.sqrt(2 / n))


@pytest.mark.parametrize("stochastic_steps", ["all", "one"])
def test_flow_sde_samples_match_the_data_and_the_ode(stochastic_steps):
    mu, s, steps, n = 1.5, 0.5, 200, 10_000
    velocity, coefficients = gaussian_toy_velocity(mu, s)
    x0 = torch.randn(n, 1, 1, generator=torch.Generator().manual_seed(0))
    sde = FlowSDESampler(0.5, stochastic_steps=stochastic_steps).sample_chain(
        velocity, x0, steps, torch.Generator().manual_seed(2)).actions.double()
    ode = FlowODESampler().sample_chain(velocity, x0, steps).actions.double()
    for samples in (sde, ode):
        assert float(samples.mean()) == pytest.approx(mu, abs=0.015)
        assert float(samples.var()) == pytest.approx(s * s, rel=0.05)
    assert float(sde.mean()) == pytest.approx(float(ode.mean()), abs=0.015)
    assert float(sde.var()) == pytest.approx(float(ode.var()), rel=0.05)
    # By hand: the discrete Flow-SDE chain stays near the path's marginals N((1-t) mu, t^2 + (1-t)^2 s^2).
    times = [1 - k / steps for k in range(steps + 1)]
    for t, (mean, var) in zip(times, sde_moments(steps, 0.5, coefficients), strict=True):
        assert mean == pytest.approx((1 - t) * mu, abs=1e-9)
        assert var == pytest.approx(t * t + (1 - t) ** 2 * s * s, abs=0.04)


# (d) generators ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", [FlowSDESampler(0.5, stochastic_steps="one"),
                                     FlowNoiseSampler(NoiseHead(ACTION_DIM + 1, ACTION_DIM))])
def test_a_generator_makes_chains_reproducible_on_any_device(sampler):
    device = device_under_test()
    sampler.to(device)
    velocity = TinyVelocity().to(device)
    x0 = noise(4, device)

    def run(seed: int) -> FlowChain:
        return sampler.sample_chain(velocity, x0, 4, torch.Generator().manual_seed(seed))  # CPU generator

    first, again, other = run(5), run(5), run(6)
    assert first.chain.device.type == device.type
    assert torch.equal(first.chain, again.chain) and torch.equal(first.log_probs, again.log_probs)
    assert torch.equal(first.stochastic, again.stochastic)
    assert not torch.equal(first.chain, other.chain)
    # The CPU generator draws the same numbers whatever the velocity's device: same chain as on CPU
    # up to the velocity's rounding there.
    cpu = sampler.to("cpu").sample_chain(velocity.to("cpu"), x0.cpu(), 4, torch.Generator().manual_seed(5))
    torch.testing.assert_close(cpu.chain, first.chain.cpu(), rtol=1e-4, atol=1e-5)
    assert torch.equal(cpu.stochastic, first.stochastic.cpu())


def test_global_generator_of_the_data_device_by_default():
    torch.manual_seed(11)
    first = FlowSDESampler(0.5).sample_chain(TinyVelocity(), noise(2, torch.device("cpu")), 3)
    torch.manual_seed(11)
    again = FlowSDESampler(0.5).sample_chain(TinyVelocity(), noise(2, torch.device("cpu")), 3)
    assert torch.equal(first.chain, again.chain)


# (e) bad inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"noise_level": 0.0}, "noise_level"),
    ({"noise_level": float("nan")}, "noise_level"),
    ({"noise_level": True}, "noise_level"),
    ({"stochastic_steps": "some"}, "stochastic_steps"),
    ({"exclude_last_step": True}, "exclude_last_step"),
])
def test_bad_flow_sde_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FlowSDESampler(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"in_dim": 0, "action_dim": 2}, "ints >= 1"),
    ({"in_dim": 3, "action_dim": 2, "hidden_dims": (0,)}, "ints >= 1"),
    ({"in_dim": 3, "action_dim": 2, "min_std": 0.2, "max_std": 0.1}, "min_std"),
    ({"in_dim": 3, "action_dim": 2, "min_std": 0.0}, "min_std"),
])
def test_bad_noise_head_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NoiseHead(**kwargs)


def test_bad_inputs_raise_clear_errors():
    sde, x0 = FlowSDESampler(0.5), noise(2, torch.device("cpu"))
    velocity = TinyVelocity()
    with pytest.raises(ValueError, match="num_steps"):
        sde.sample_chain(velocity, x0, 0)
    with pytest.raises(ValueError, match="num_steps"):
        sde.sample_chain(velocity, x0, 2.0)
    with pytest.raises(ValueError, match="noise must be"):
        sde.sample_chain(velocity, x0[0], 2)
    with pytest.raises(ValueError, match="noise must be"):
        sde.sample_chain(velocity, x0.long(), 2)
    with pytest.raises(ValueError, match="velocity function returned shape"):
        sde.sample_chain(lambda x, t: x[..., :1], x0, 2)
    with pytest.raises(TypeError, match="floating tensor"):
        sde.sample_chain(lambda x, t: x.numpy(), x0, 2)
    with pytest.raises(ValueError, match="features"):
        sde.sample_chain(lambda x, t: (x, x[0]), x0, 2)
    with pytest.raises(ValueError, match="exclude_last_step needs num_steps >= 2"):
        FlowSDESampler(0.5, "one", exclude_last_step=True).sample_chain(velocity, x0, 1)
    out = sde.sample_chain(velocity, x0, 3)
    with pytest.raises(ValueError, match="chain must be"):
        sde.log_prob_of_chain(velocity, out.chain[:, :1])
    with pytest.raises(ValueError, match="chain must be"):
        sde.log_prob_of_chain(velocity, out.chain[0])
    with pytest.raises(ValueError, match="stochastic must be"):
        sde.log_prob_of_chain(velocity, out.chain, out.stochastic[:, :2])
    with pytest.raises(ValueError, match="stochastic must be"):
        sde.log_prob_of_chain(velocity, out.chain, out.stochastic.long())
    mixed = out.stochastic.clone()
    mixed[0, 0] = False
    with pytest.raises(ValueError, match="same number of stochastic steps"):
        sde.log_prob_of_chain(velocity, out.chain, mixed)
    one = FlowSDESampler(0.5, stochastic_steps="one")
    with pytest.raises(ValueError, match="FlowChain.stochastic"):
        one.log_prob_of_chain(velocity, out.chain)
    with pytest.raises(ValueError, match="no stochastic steps"):
        FlowODESampler().log_prob_of_chain(velocity, out.chain, out.stochastic)
    with pytest.raises(ValueError, match="in_dim"):
        FlowNoiseSampler(NoiseHead(5, ACTION_DIM)).sample_chain(velocity, x0, 2)
    with pytest.raises(ValueError, match="action_dim must be"):
        FlowNoiseSampler(NoiseHead(ACTION_DIM + 1, ACTION_DIM + 1)).sample_chain(velocity, x0, 2)
    with pytest.raises(TypeError, match="NoiseHead"):
        FlowNoiseSampler(nn.Linear(3, 2))
