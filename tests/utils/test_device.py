"""vla_rl/utils/device.py: TF32 on CUDA only, set without touching the GPU."""

from __future__ import annotations

import torch

from vla_rl.utils.device import use_tf32


def tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_tf32_is_turned_on_for_cuda_devices_only(tf32_off):
    for other in ("cpu", "meta"):
        use_tf32(torch.device(other))
        assert tf32_flags() == (False, False), other
    use_tf32(torch.device("cuda", 1))
    assert tf32_flags() == (True, True)
    assert not torch.cuda.is_initialized()  # flags only: no CUDA context made
