"""Tests for vla_rl.trainers.checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vla_rl.trainers import checkpoint as ckpt


def make_model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model.register_buffer("obs_mean", torch.randn(4))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.99))


def train_step(model, optimizer, seed: int) -> None:
    batch = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 4, generator=batch), torch.randn(16, 2, generator=batch)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x - model.obs_mean), y).backward()
    optimizer.step()


def save_and_finalize(root, step, **kwargs):
    ckpt.save_checkpoint(root, step, **kwargs)
    return ckpt.finalize_checkpoint(root, step)


def test_model_and_adam_resume_gives_identical_next_update(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    for seed in range(3):
        train_step(model, optimizer, seed)
    path = save_and_finalize(tmp_path, 3, model=model, optimizer=optimizer, metadata={"lr": 1e-2})
    assert path == tmp_path / "step_00000003"
    assert {p.name for p in path.iterdir()} == {
        "model.safetensors", "optimizer.safetensors", "optimizer.json",
        "rng_rank0.safetensors", "rng_rank0.json", "trainer_state.json",
    }

    restored_model, restored_optimizer = make_model_and_optimizer(1)  # different initial weights
    ckpt.load_model(path, restored_model)
    ckpt.load_optimizer(path, restored_optimizer)
    saved_state = optimizer.state_dict()
    restored_state = restored_optimizer.state_dict()
    assert restored_state["param_groups"] == saved_state["param_groups"]  # tuples kept as tuples
    for key, state in saved_state["state"].items():
        for name, value in state.items():
            torch.testing.assert_close(restored_state["state"][key][name], value, rtol=0, atol=0)

    train_step(model, optimizer, 99)
    train_step(restored_model, restored_optimizer, 99)
    resumed_state = restored_model.state_dict()
    for name, continued in model.state_dict().items():
        torch.testing.assert_close(resumed_state[name], continued, rtol=0, atol=0)
    assert ckpt.load_trainer_state(path) == {"step": 3, "metadata": {"lr": 1e-2}}


def test_rng_round_trip_reproduces_random_numbers(tmp_path):
    torch.manual_seed(5)
    generator = torch.Generator().manual_seed(11)
    np_rng = np.random.default_rng(13)
    torch.rand(3), torch.rand(3, generator=generator), np_rng.random(3)  # advance all three
    for rank in (0, 1):
        ckpt.save_checkpoint(tmp_path, 7, rank=rank, generator=generator, np_rng=np_rng)
    path = ckpt.finalize_checkpoint(tmp_path, 7)
    expected = (torch.rand(4), torch.rand(4, generator=generator), np_rng.random(4))

    torch.manual_seed(0)
    fresh_generator = torch.Generator().manual_seed(0)
    fresh_np_rng = np.random.default_rng(0)
    ckpt.restore_rng(ckpt.load_rng(path, rank=1), generator=fresh_generator, np_rng=fresh_np_rng)
    torch.testing.assert_close(torch.rand(4), expected[0], rtol=0, atol=0)
    resumed_draw = torch.rand(4, generator=fresh_generator)
    torch.testing.assert_close(resumed_draw, expected[1], rtol=0, atol=0)
    np.testing.assert_array_equal(fresh_np_rng.random(4), expected[2])

    with pytest.raises(FileNotFoundError, match="rng_rank2.json"):
        ckpt.load_rng(path, rank=2)


def test_restore_rng_without_saved_generator_raises(tmp_path):
    path = save_and_finalize(tmp_path, 1)
    state = ckpt.load_rng(path, rank=0)
    assert state["torch_generator"] is None and state["numpy"] is None
    with pytest.raises(ValueError, match="no torch.Generator state"):
        ckpt.restore_rng(state, generator=torch.Generator())
    with pytest.raises(ValueError, match="no numpy Generator state"):
        ckpt.restore_rng(state, np_rng=np.random.default_rng())


def test_latest_ignores_leftover_staging_dir(tmp_path):
    assert ckpt.latest_checkpoint(tmp_path) is None
    assert ckpt.latest_checkpoint(tmp_path / "missing") is None
    save_and_finalize(tmp_path, 10)
    ckpt.save_checkpoint(tmp_path, 20)  # crashed before finalize: staging dir only
    assert (tmp_path / ".step_00000020.tmp").is_dir()
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000010"
    assert (tmp_path / "latest").read_text().strip() == "step_00000010"


def test_latest_falls_back_to_scanning(tmp_path):
    save_and_finalize(tmp_path, 10)
    save_and_finalize(tmp_path, 20)
    (tmp_path / "latest").unlink()
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000020"
    (tmp_path / "latest").write_text("step_00000010\n")  # stale pointer: a crash before its update
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000020"
    (tmp_path / "latest").write_text("garbage\n")
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000020"


def test_keep_last_prunes_old_checkpoints_and_stale_staging(tmp_path):
    ckpt.save_checkpoint(tmp_path, 1)  # a crashed save of an earlier step
    for step in (2, 4, 6, 8):
        ckpt.save_checkpoint(tmp_path, step)
        ckpt.finalize_checkpoint(tmp_path, step, keep_last=2)
    remaining = sorted(p.name for p in tmp_path.iterdir())
    assert remaining == ["latest", "step_00000006", "step_00000008"]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000008"


def test_finalize_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"\.step_00000003\.tmp"):
        ckpt.finalize_checkpoint(tmp_path, 3)
    ckpt.save_checkpoint(tmp_path, 3, rank=1)  # rank 0 never saved
    with pytest.raises(FileNotFoundError, match="trainer_state.json is missing"):
        ckpt.finalize_checkpoint(tmp_path, 3)
    ckpt.save_checkpoint(tmp_path, 3, rank=0)
    ckpt.finalize_checkpoint(tmp_path, 3)
    ckpt.save_checkpoint(tmp_path, 3, rank=0)
    with pytest.raises(FileExistsError, match="step_00000003 already exists"):
        ckpt.finalize_checkpoint(tmp_path, 3)
    with pytest.raises(ValueError, match="keep_last"):
        ckpt.finalize_checkpoint(tmp_path, 3, keep_last=0)
    with pytest.raises(ValueError, match="step must be a non-negative int"):
        ckpt.save_checkpoint(tmp_path, -1)


def test_load_errors_name_the_file(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    path = save_and_finalize(tmp_path, 1, model=model)
    with pytest.raises(FileNotFoundError, match="optimizer.json is missing"):
        ckpt.load_optimizer(path, optimizer)
    with pytest.raises(RuntimeError, match="model.safetensors"):
        ckpt.load_model(path, torch.nn.Linear(4, 2))

    ckpt.save_optimizer(path, optimizer)
    wrong_optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match="optimizer.json does not match the optimizer"):
        ckpt.load_optimizer(path, wrong_optimizer)

    ckpt_json = json.loads((path / "optimizer.json").read_text())
    assert ckpt_json["state_dict"]["param_groups"][0]["betas"] == {"__tuple__": [0.8, 0.99]}


def test_unstorable_metadata_raises_with_file(tmp_path):
    with pytest.raises(TypeError, match="trainer_state.json"):
        ckpt.save_checkpoint(tmp_path, 1, metadata={"bad": object()})
