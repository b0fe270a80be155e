"""The generator of a worker's device in its checkpoints (vla_rl/checkpoints/files.py, ``save_rng``
and ``restore_rng``): dropout on a GPU (LoRA's, a model's) draws from the device's default
generator, so a resume restores it; a CPU worker never touches an accelerator, even in a process
that sees some (Ray leaves ``CUDA_VISIBLE_DEVICES`` alone for an actor without GPUs, so the CPU
workers of a run on a GPU machine see every GPU). On the test device (``VLA_RL_TEST_DEVICE=cuda``:
``scripts/gpu_check.sh``'s suite part), and on a CPU test device with a CPU generator standing in
for a GPU's."""

from __future__ import annotations

import types

import pytest
import torch
from devices import device_under_test

from vla_rl.checkpoints import files as ckpt
from vla_rl.workers.checkpointing import WorkerCheckpointer


def _stand_in_cuda(monkeypatch) -> tuple[torch.device, list, object]:
    """A CUDA device whose device module (``torch.get_device_module("cuda")``) is a CPU generator:
    the device, the devices its ``get_rng_state``/``set_rng_state`` were asked for, and a draw."""
    stand_in, asked = torch.Generator().manual_seed(3), []
    module = types.SimpleNamespace(
        get_rng_state=lambda device: asked.append(device) or stand_in.get_state(),
        set_rng_state=lambda state, device: asked.append(device) or stand_in.set_state(state))
    real = torch.get_device_module
    monkeypatch.setattr(torch, "get_device_module", lambda kind=None: module if kind == "cuda" else real(kind))
    return torch.device("cuda", 1), asked, lambda: torch.rand(4, generator=stand_in)


def test_a_workers_device_generator_is_restored_on_resume(tmp_path, process_group, monkeypatch):
    """Through the worker's checkpointer: what the device draws after the resume is what it drew
    after the save."""
    device = device_under_test()
    if device.type == "cpu":
        device, asked, draw = _stand_in_cuda(monkeypatch)
    else:
        asked, draw = None, lambda: torch.rand(4, device=device)
    resources = types.SimpleNamespace(rank=0, device=device, generator=torch.Generator().manual_seed(0),
                                      save_checkpoint=lambda directory: {}, load_checkpoint=None)
    checkpointer = WorkerCheckpointer(tmp_path, resources)
    draw()
    checkpointer.save(1, keep_last=2)
    expected = draw()
    draw()
    assert ckpt.load_rng(tmp_path / "step_00000001", rank=0)["torch_accelerator"] is not None
    checkpointer.restore_rng(tmp_path / "step_00000001")
    torch.testing.assert_close(draw(), expected, rtol=0, atol=0)
    if asked is not None:  # the worker's own device, not the process's current one
        assert asked == [device, device]


def test_a_cpu_worker_leaves_the_gpus_it_sees_alone(tmp_path, monkeypatch):
    """A CPU worker in a process that sees a GPU saves and restores no accelerator generator (reading
    one initialises CUDA in every CPU worker of the run)."""

    def touched(*args, **kwargs):
        raise AssertionError("a CPU worker touched an accelerator's generator")

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_rng_state", touched)
    monkeypatch.setattr(torch.cuda, "set_rng_state", touched)
    for device in (torch.device("cpu"), None):
        root = tmp_path / str(device)
        ckpt.save_checkpoint(root, 2, rank=0, device=device)
        state = ckpt.load_rng(ckpt.finalize_checkpoint(root, 2), rank=0)
        assert state["torch_accelerator"] is None
        ckpt.restore_rng(state, device=device)


def test_a_gpu_checkpoint_resumed_on_a_cpu_worker_keeps_only_the_cpu_generators(tmp_path, monkeypatch):
    """A run moved from GPU workers to CPU workers resumes: the GPU's generator state is not
    applied anywhere, the CPU's is."""
    device, asked, draw = _stand_in_cuda(monkeypatch)
    ckpt.save_checkpoint(tmp_path, 1, rank=0, device=device)
    state = ckpt.load_rng(ckpt.finalize_checkpoint(tmp_path, 1), rank=0)
    assert state["torch_accelerator"] is not None and asked == [device]
    expected = torch.rand(3)
    ckpt.restore_rng(state, device=torch.device("cpu"))
    assert asked == [device]
    torch.testing.assert_close(torch.rand(3), expected, rtol=0, atol=0)


@pytest.mark.parametrize("device", [torch.device("cpu"), None])
def test_a_cpu_checkpoint_resumed_on_a_gpu_leaves_its_generator_as_seeded(tmp_path, monkeypatch, device):
    """A run moved from CPU workers to GPU workers resumes: the checkpoint holds no GPU generator,
    so the GPU's is left as it is."""
    ckpt.save_checkpoint(tmp_path, 1, rank=0, device=device)
    state = ckpt.load_rng(ckpt.finalize_checkpoint(tmp_path, 1), rank=0)
    gpu, asked, _ = _stand_in_cuda(monkeypatch)
    ckpt.restore_rng(state, device=gpu)
    assert asked == []
