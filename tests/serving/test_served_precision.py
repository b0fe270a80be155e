"""``vla-rl serve`` computes as the run's rollouts did on the serving device (vla_rl/serving/policy.py,
"Precision"), on the test device when it is an accelerator, else on the CPU in the bf16 emulation
of the trainer tests (the CPU admitted as an accelerator, CPU autocast's bfloat16 kernels): a DDP
run's float32 policy acts in ``torch.autocast(bfloat16)``, an FSDP run's with bfloat16
parameters; a ``bf16`` run served on a real CPU acts in float32; an MLP export, which records no
training settings, in its own dtype."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_export import make_run, write_checkpoint

from vla_rl.dag.registry import WORKFLOWS
from vla_rl.serving.policy import load_served_policy
from vla_rl.trainers import strategy
from vla_rl_core.observations import to_torch

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def trained_run(tmp_path, *overrides: str):
    """A Lift run directory (the main job's template and ``overrides``) with one checkpoint of a
    random MLP, and that policy."""
    run_dir, config = make_run(tmp_path, "embodied_srpo", "policy.config.hidden_sizes=[32]", *overrides)
    policy = WORKFLOWS.get("embodied").standalone_policy(config, run_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    write_checkpoint(run_dir, 1, model=policy)
    return run_dir, config, policy.eval()


def states(n: int = 6) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(n, 15)).astype(np.float32)


def linear_output_dtypes(policy) -> tuple[list[torch.dtype], object]:
    """The output dtypes of ``policy``'s linear layers in the next forward passes, and the hooks' handles."""
    seen: list[torch.dtype] = []
    handles = [module.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
               for module in policy.modules() if isinstance(module, torch.nn.Linear)]
    return seen, handles


def rollout_greedy(policy, trainer, obs: np.ndarray) -> np.ndarray:
    """The greedy actions the run's rollout computes (its autocast context on the policy's device)."""
    tensors = to_torch(obs)
    with torch.no_grad(), strategy.autocast(trainer, policy.device):
        actions = policy.sample_actions(tensors, greedy=True)[0]
    return lift_executed(policy.env_actions(actions, tensors).float().cpu().numpy())


def lift_executed(actions) -> np.ndarray:
    """Actions as Lift executes them (clipped to its action space), as the server sends them."""
    return np.clip(np.asarray(actions), -1.0, 1.0)


def test_a_ddp_run_is_served_in_its_rollouts_autocast(tmp_path, bf16_device):
    run_dir, config, trained = trained_run(tmp_path)
    assert (config.trainer.strategy, config.trainer.mixed_precision) == ("ddp", "auto")
    served = load_served_policy(run_dir, device=str(bf16_device))
    trained.to(bf16_device)
    seen, handles = linear_output_dtypes(served.policy)
    actions = served.act(list(states()), sample=False)
    for handle in handles:
        handle.remove()
    assert seen and set(seen) == {torch.bfloat16}  # every matrix product in bfloat16 ...
    assert {p.dtype for p in served.policy.parameters()} == {torch.float32}  # ... on float32 weights
    np.testing.assert_array_equal(actions, rollout_greedy(trained, config.trainer, states()))
    float32 = trained.env_actions(trained.sample_actions(to_torch(states()), greedy=True)[0], to_torch(states()))
    assert not np.array_equal(actions, lift_executed(float32.cpu().numpy()))  # bfloat16 changed something


def test_an_fsdp_run_is_served_with_its_rollouts_bfloat16_parameters(tmp_path, bf16_device):
    run_dir, _, _ = trained_run(tmp_path, "trainer.strategy=fsdp")
    served = load_served_policy(run_dir, device=str(bf16_device))
    assert served.policy.device.type == bf16_device.type
    assert {p.dtype for p in served.policy.parameters()} == {torch.bfloat16}
    seen, handles = linear_output_dtypes(served.policy)
    actions = served.act(list(states()), sample=True)
    for handle in handles:
        handle.remove()
    assert set(seen) == {torch.bfloat16} and actions.dtype == np.float32 and np.isfinite(actions).all()


def test_on_a_real_cpu_every_run_is_served_in_float32(tmp_path):
    """No emulation: ``auto`` is float32 on the CPU, and a ``bf16`` run (trained on GPUs) is served
    in float32 there instead of being refused as a CPU worker would refuse it."""
    for name, overrides in (("auto", ()), ("bf16", ("workers.device=cuda", "trainer.mixed_precision=bf16"))):
        run_dir, _, trained = trained_run(tmp_path / name, *overrides)
        served = load_served_policy(run_dir, device="cpu")
        seen, handles = linear_output_dtypes(served.policy)
        actions = served.act(list(states()), sample=False)
        for handle in handles:
            handle.remove()
        assert set(seen) == {torch.float32}, name
        expected = trained.env_actions(trained.sample_actions(to_torch(states()), greedy=True)[0], to_torch(states()))
        np.testing.assert_array_equal(actions, lift_executed(expected.numpy()))


def test_an_mlp_export_is_served_in_its_own_dtype(tmp_path, bf16_device):
    _, _, trained = trained_run(tmp_path)
    export = trained.save_pretrained(tmp_path / "export")
    served = load_served_policy(export, device=str(bf16_device))
    assert served.trainer is None
    assert served.action_bounds is None and served.metadata()["action_low"] is None  # it records no simulator
    seen, handles = linear_output_dtypes(served.policy)
    served.act(list(states()), sample=False)
    for handle in handles:
        handle.remove()
    assert set(seen) == {torch.float32}


def test_a_policy_served_on_cuda_computes_in_tf32_as_the_runs_workers(tmp_path, device, tf32_off):
    """``vla-rl serve`` turns TF32 on where a DAG worker does (``bind_device``): a float32 run's
    products then round alike in the rollouts and in the server (on the test device; on a CPU,
    the flags stay as they were)."""
    run_dir, _, _ = trained_run(tmp_path, "trainer.mixed_precision=none")
    load_served_policy(run_dir, device=str(device))
    on = device.type == "cuda"
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (on, on)
