"""π0-family flow-matching policies (issue 19). :mod:`policies.pi0.flow_sampling` holds the
model-agnostic denoising samplers with exact per-step log-densities (πRL's Flow-SDE and
Flow-Noise, and the deterministic ODE)."""
