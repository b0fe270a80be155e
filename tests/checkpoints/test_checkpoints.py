"""Tests for vla_rl.checkpoints.files and vla_rl.checkpoints.integrity."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import types

import numpy as np
import pytest
import torch
from safetensors import SafetensorError
from torch.distributed.checkpoint.api import CheckpointException

from vla_rl.checkpoints import files as ckpt
from vla_rl.checkpoints import integrity
from vla_rl.checkpoints.layout import CheckpointCorruptError, NonFiniteTensorError
from vla_rl.errors import ResumeRefused, RunStopped
from vla_rl.workers.checkpointing import WorkerCheckpointer
from vla_rl_core.dir_lock import hold_directory, release_directory


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
        "rng_rank0.safetensors", "rng_rank0.json", "trainer_state.json", "manifest.json",
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


def test_keep_last_keeps_a_checkpoint_an_evaluation_holds_until_a_later_prune(tmp_path, caplog):
    for step in (1, 2):
        ckpt.save_checkpoint(tmp_path, step)
        ckpt.finalize_checkpoint(tmp_path, step, keep_last=2)
    held = hold_directory(tmp_path / "step_00000001")  # `vla-rl eval` reads it
    ckpt.save_checkpoint(tmp_path, 3)
    with caplog.at_level(logging.WARNING, logger="vla_rl.checkpoints.files"):
        ckpt.finalize_checkpoint(tmp_path, 3, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001", "step_00000003"]
    assert "keeping checkpoint" in caplog.text and "step_00000001" in caplog.text
    assert ckpt.load_trainer_state(tmp_path / "step_00000001")["step"] == 1  # whole
    release_directory(held)
    ckpt.save_checkpoint(tmp_path, 4)
    ckpt.finalize_checkpoint(tmp_path, 4, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000004"]


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


# ----------------------------------------------------------------------------- manifests, corruption, fallback
def three_checkpoints(root):
    """Checkpoints of steps 1, 2, 3 (model, Adam, two ranks' RNG), as a 2-worker run writes them."""
    model, optimizer = make_model_and_optimizer(0)
    for step in (1, 2, 3):
        train_step(model, optimizer, step)
        ckpt.save_checkpoint(root, step, rank=1)
        ckpt.save_checkpoint(root, step, rank=0, model=model, optimizer=optimizer)
        ckpt.finalize_checkpoint(root, step)
    return model, optimizer


def truncate(file, keep=0.5):
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def flip_last_byte(file):
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF  # inside the tensor data: the file still parses
    file.write_bytes(bytes(data))


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    three_checkpoints(tmp_path)
    path = tmp_path / "step_00000003"
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {p.name for p in path.iterdir()} - {"manifest.json"}
    assert {"rng_rank0.json", "rng_rank1.safetensors", "model.safetensors"} <= set(manifest["files"])
    entry = manifest["files"]["model.safetensors"]
    assert entry["size"] == (path / "model.safetensors").stat().st_size and len(entry["sha256"]) == 64
    assert integrity.verify_checkpoint(path) is True


@pytest.mark.parametrize("damage, why", [(flip_last_byte, "altered bytes"), (lambda f: f.unlink(), "is missing")])
def test_the_manifest_covers_a_subdirectory_such_as_hf_model(tmp_path, damage, why):
    """A text run's hf_model/ (loaded by another run as text.model_path) was left out of the
    manifest: a damaged copy verified, and went into the next run silently."""
    from safetensors.torch import save_file

    model, optimizer = make_model_and_optimizer(0)
    ckpt.save_checkpoint(tmp_path, 1, rank=0, model=model, optimizer=optimizer)
    hf_model = ckpt.staging_dir(tmp_path, 1) / "hf_model"
    hf_model.mkdir()
    save_file({"w": torch.arange(4.0)}, hf_model / "model.safetensors")
    (hf_model / "config.json").write_text("{}")
    ckpt.finalize_checkpoint(tmp_path, 1)
    path = tmp_path / "step_00000001"
    assert {"hf_model/model.safetensors", "hf_model/config.json"} <= set(
        json.loads((path / "manifest.json").read_text())["files"])
    damage(path / "hf_model" / "model.safetensors")
    with pytest.raises(CheckpointCorruptError, match=re.escape(f"{path / 'hf_model' / 'model.safetensors'} {why}")
                       if why == "is missing" else "hf_model/model.safetensors does not match its sha256"):
        integrity.verify_checkpoint(path)


@pytest.mark.parametrize("name, damage, why", [
    ("model.safetensors", truncate, "truncated"),
    ("optimizer.safetensors", flip_last_byte, "altered bytes"),
    ("rng_rank1.json", truncate, "truncated"),
    ("trainer_state.json", lambda f: f.unlink(), "is missing"),
])
def test_verification_names_the_damaged_file(tmp_path, name, damage, why):
    three_checkpoints(tmp_path)
    path = tmp_path / "step_00000003"
    damage(path / name)
    with pytest.raises(CheckpointCorruptError, match=why) as err:
        integrity.verify_checkpoint(path)
    assert str(path / name) in str(err.value) and err.value.files == [path / name]


def test_loaders_name_the_corrupted_file(tmp_path):
    model, optimizer = three_checkpoints(tmp_path)
    path = tmp_path / "step_00000003"
    truncate(path / "model.safetensors")
    truncate(path / "optimizer.safetensors", keep=0.9)
    truncate(path / "rng_rank0.json")
    with pytest.raises(CheckpointCorruptError, match=f"{path / 'model.safetensors'} is corrupted or truncated"):
        ckpt.load_model(path, model)
    with pytest.raises(CheckpointCorruptError, match="optimizer.safetensors is corrupted or truncated"):
        ckpt.load_optimizer(path, optimizer)
    with pytest.raises(CheckpointCorruptError, match="rng_rank0.json is not valid JSON"):
        ckpt.load_rng(path, rank=0)


def test_latest_verified_skips_corrupted_checkpoints_and_logs_why(tmp_path, caplog):
    three_checkpoints(tmp_path)
    truncate(tmp_path / "step_00000003" / "model.safetensors")
    with caplog.at_level(logging.WARNING, logger="vla_rl.checkpoints.integrity"):
        path, skipped = integrity.latest_verified_checkpoint(tmp_path)
    assert path == tmp_path / "step_00000002"
    assert [p.name for p, _ in skipped] == ["step_00000003"] and "model.safetensors" in skipped[0][1]
    assert "skipping checkpoint" in caplog.text and "step_00000003/model.safetensors has" in caplog.text
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000003"  # complete, though not intact

    # Set aside (never deleted), the step can be saved again.
    assert integrity.reject_checkpoint(tmp_path / "step_00000003") == tmp_path / "step_00000003.rejected"
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000002"
    ckpt.save_checkpoint(tmp_path, 3)
    ckpt.finalize_checkpoint(tmp_path, 3, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000003", "step_00000003.rejected"]
    for n in (2, 3):  # set aside again: none of the earlier ones is overwritten
        assert integrity.reject_checkpoint(tmp_path / "step_00000003") == tmp_path / f"step_00000003.rejected.{n}"
        ckpt.save_checkpoint(tmp_path, 3)
        ckpt.finalize_checkpoint(tmp_path, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest", "step_00000003", "step_00000003.rejected", "step_00000003.rejected.2", "step_00000003.rejected.3"]
    assert all((tmp_path / name / "trainer_state.json").is_file() for name in os.listdir(tmp_path) if "rejected" in name)



def test_every_step_directory_is_tried_and_reported(tmp_path):
    three_checkpoints(tmp_path)
    (tmp_path / "step_00000003" / "trainer_state.json").unlink()  # no longer "complete": reported all the same
    path, skipped = integrity.latest_verified_checkpoint(tmp_path)
    assert path == tmp_path / "step_00000002" and "step_00000003/trainer_state.json is missing" in skipped[0][1]
    for step in (2, 1):  # nothing verifies: None, every one skipped
        (tmp_path / f"step_{step:08d}" / "manifest.json").unlink()
        (tmp_path / f"step_{step:08d}" / "trainer_state.json").write_text("{")
    path, skipped = integrity.latest_verified_checkpoint(tmp_path)
    assert path is None and [p.name for p, _ in skipped] == ["step_00000003", "step_00000002", "step_00000001"]
    assert "(no manifest) is corrupted" in skipped[1][1] and "trainer_state.json is unreadable" in skipped[1][1]


def test_checkpoint_without_manifest_still_loads(tmp_path):
    """Checkpoints written before manifests existed: accepted after their files open, loaded as before."""
    model, _ = three_checkpoints(tmp_path)
    path = tmp_path / "step_00000003"
    (path / "manifest.json").unlink()
    assert integrity.verify_checkpoint(path) is False
    assert integrity.latest_verified_checkpoint(tmp_path) == (path, [])
    restored, restored_optimizer = make_model_and_optimizer(1)
    ckpt.load_model(path, restored)
    ckpt.load_optimizer(path, restored_optimizer)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(restored.state_dict()[name], value, rtol=0, atol=0)
    truncate(path / "optimizer.safetensors")  # a truncated file is still seen (its header's extent)
    with pytest.raises(CheckpointCorruptError, match="no manifest.*optimizer.safetensors is unreadable"):
        integrity.verify_checkpoint(path)
    older = tmp_path / "step_00000002"  # one that lost its trainer_state.json: skipped for the one before
    (older / "manifest.json").unlink()
    (older / "trainer_state.json").unlink()
    with pytest.raises(CheckpointCorruptError, match=r"no manifest.*trainer_state.json is unreadable \(missing\)"):
        integrity.verify_checkpoint(older)
    assert integrity.latest_verified_checkpoint(tmp_path)[0] == tmp_path / "step_00000001"


def test_unreadable_manifest_fails_verification(tmp_path):
    three_checkpoints(tmp_path)
    manifest = tmp_path / "step_00000003" / "manifest.json"
    truncate(manifest)
    with pytest.raises(CheckpointCorruptError, match=f"its manifest {manifest} is unreadable"):
        integrity.verify_checkpoint(manifest.parent)


# ----------------------------------------------------------------------------- non-finite state
def test_non_finite_model_is_refused_before_it_is_written(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    save_and_finalize(tmp_path, 1, model=model, optimizer=optimizer)
    with torch.no_grad():
        model[2].weight[0, 3] = float("inf")
        model[2].bias[1] = float("nan")
    with pytest.raises(NonFiniteTensorError,
                       match=r"refusing to write .*step_00000002.tmp/model.safetensors: tensor '2.weight' \(2, 8\) "
                             r"holds 1 non-finite values \(inf/NaN\) of 16 \(and 1 more tensors\)"):
        ckpt.save_checkpoint(tmp_path, 2, model=model, optimizer=optimizer)
    assert not (tmp_path / ".step_00000002.tmp" / "model.safetensors").exists()
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000001"
    assert (tmp_path / "latest").read_text().strip() == "step_00000001"


def test_non_finite_optimizer_state_is_refused(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    train_step(model, optimizer, 0)
    optimizer.state[model[0].weight]["exp_avg_sq"][0, 0] = float("nan")
    with pytest.raises(NonFiniteTensorError,
                       match=r"optimizer.safetensors: tensor 'state_dict.state.0.exp_avg_sq'"):
        ckpt.save_optimizer(tmp_path, optimizer)
    assert not list(tmp_path.iterdir())


def one_rank_resources(model, optimizer):
    """What WorkerCheckpointer needs of a worker's Resources: rank 0 of one, saving a model and Adam."""
    def save(directory):
        ckpt.save_model(directory, model)
        ckpt.save_optimizer(directory, optimizer)
        return {}

    def load(directory, metadata, names):
        ckpt.load_model(directory, model)
        ckpt.load_optimizer(directory, optimizer)

    return types.SimpleNamespace(rank=0, device=torch.device("cpu"), generator=torch.Generator().manual_seed(0),
                                 save_checkpoint=save, load_checkpoint=load)


def test_worker_save_of_non_finite_weights_publishes_nothing(tmp_path, process_group):
    model, optimizer = make_model_and_optimizer(0)
    checkpointer = WorkerCheckpointer(tmp_path, one_rank_resources(model, optimizer))
    checkpointer.save(1, keep_last=2)
    with torch.no_grad():
        model[0].weight.mul_(1e30).mul_(1e30)  # overflows to inf, as with trainer.lr=1e30
    with pytest.raises(RunStopped, match=r"checkpoint of step 2 not written: refusing to write .*model.safetensors: "
                                         r"tensor '0.weight'.*the last checkpoint is still .*step_00000001"):
        checkpointer.save(2, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001"]  # staging removed


@pytest.mark.parametrize("failure", [
    lambda: SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
    lambda: OSError(errno.ENOSPC, "No space left on device"),
    lambda: CheckpointException("save", {0: (OSError(errno.ENOSPC, "No space left on device", "/x/__0_0.distcp"),
                                             None)}),  # FSDP's sharded state; a BaseException
], ids=["safetensors", "os-error", "distributed-checkpoint"])
def test_a_full_disk_during_a_save_is_one_line_that_says_how_to_resume(tmp_path, process_group, monkeypatch,
                                                                       failure):
    """A full disk stopped the run with safetensors' 60-line Ray traceback; now one line naming
    the reason, the checkpoint kept and the resume command; nothing is published."""
    model, optimizer = make_model_and_optimizer(0)
    checkpointer = WorkerCheckpointer(tmp_path / "checkpoints", one_rank_resources(model, optimizer))
    checkpointer.save(1, keep_last=2)

    def full_disk(directory, *args, **kwargs):
        raise failure()

    monkeypatch.setattr(ckpt, "save_model", full_disk)
    with pytest.raises(RunStopped, match=r"checkpoint of step 2 not written in .*checkpoints: No space left on "
                                         r"device\. Nothing was saved; the last checkpoint is still .*step_00000001\. .*"
                                         r"vla-rl train --resume " + re.escape(str(tmp_path))):
        checkpointer.save(2, keep_last=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]


def test_only_the_file_systems_refusals_are_called_so():
    """A timeout or a connection's error is an OSError too (and quoted as [Errno 110] ...): it was
    reported as "Free space there"."""
    from vla_rl.errors import file_system_error

    assert file_system_error(TimeoutError(errno.ETIMEDOUT, "Connection timed out")) is None
    assert file_system_error(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")) is None
    assert file_system_error(RuntimeError("gloo: [Errno 110] Connection timed out")) is None
    assert file_system_error(OSError(errno.EROFS, "Read-only file system")) == "Read-only file system"
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert file_system_error(wrapped) == "Disk quota exceeded"


def test_worker_resume_falls_back_and_sets_corrupted_checkpoints_aside(tmp_path, process_group):
    model, optimizer = three_checkpoints(tmp_path)
    ckpt.save_checkpoint(tmp_path, 4)  # an interrupted save
    flip_last_byte(tmp_path / "step_00000003" / "model.safetensors")
    checkpointer = WorkerCheckpointer(tmp_path, one_rank_resources(model, optimizer))
    assert checkpointer.latest() == tmp_path / "step_00000002"
    assert checkpointer.skipped == ["step_00000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest", "step_00000001", "step_00000002", "step_00000003.rejected"]
    assert (tmp_path / "latest").read_text().strip() == "step_00000002"
    assert checkpointer.restore(tmp_path / "step_00000002") == 2

    for step in (1, 2):
        truncate(tmp_path / f"step_{step:08d}" / "optimizer.json")
    # one line with exit status 2 through the command line (it was a worker's FileNotFoundError traceback)
    with pytest.raises(ResumeRefused, match=r"cannot resume: no checkpoint under .* verifies \(.*step_00000002/"
                                            r"optimizer.json has"):
        checkpointer.latest()
    assert (tmp_path / "step_00000002").is_dir()  # nothing to resume from: nothing set aside

