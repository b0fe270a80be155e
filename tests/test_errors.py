"""out_of_memory_message tells a device running out of memory from the other errors, on the real
errors of torch's CPU allocator and of Python, and on CUDA's message."""

from __future__ import annotations

import pickle

import pytest
import torch

from vla_rl.errors import out_of_memory_message


def test_the_cpu_allocators_error_loses_its_source_location():
    with pytest.raises(RuntimeError) as err:
        torch.empty(10**14, dtype=torch.uint8)  # 100 TB: refused at once
    message = out_of_memory_message(err.value)
    assert message.startswith("DefaultCPUAllocator: can't allocate memory: you tried to allocate 100000000000000 "
                              "bytes"), message
    assert out_of_memory_message(pickle.loads(pickle.dumps(err.value))) == message  # as Ray hands it on


def test_python_and_cuda_out_of_memory():
    with pytest.raises(MemoryError) as err:
        bytearray(2**62)
    assert out_of_memory_message(err.value) == (str(err.value).splitlines() or ["MemoryError"])[0]
    assert out_of_memory_message(MemoryError()) == "MemoryError"
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nSee the documentation")
    assert out_of_memory_message(cuda) == "CUDA out of memory. Tried to allocate 2.00 GiB."


@pytest.mark.parametrize("error", [RuntimeError("shape mismatch"), RuntimeError(""), ValueError("out of memory"),
                                   RuntimeError("[gloo] Connection closed by peer")], ids=repr)
def test_other_errors_are_not_out_of_memory(error):
    assert out_of_memory_message(error) is None
