"""The wire format is openpi's: what ``openpi_client.msgpack_numpy`` packs, vla-rl reads, and back."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

# absent on hosts without it (the GPU image lacks it): the module is skipped, not a collection error
pytest.importorskip("openpi_client", reason="openpi-client is not installed (the test extra: pip install -e '.[test]')")
from openpi_client import msgpack_numpy

from vla_rl_core import wire

MESSAGE = {
    "observation/state": np.arange(8, dtype=np.float64) / 3,
    "observation/image": np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3),
    "prompt": "pick up the black bowl",
    "nested": {"ids": np.array([[1, -2], [3, 4]], dtype=np.int64), "flag": np.bool_(True), "x": np.float32(0.5)},
    "plain": [1, 2.5, None, "s"],
}


def assert_same(got, want) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want)
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
    elif isinstance(want, np.generic):
        assert type(got) is type(want) and got == want
    else:
        assert got == want


def test_openpi_messages_read_as_sent_and_ours_read_by_openpi():
    assert_same(wire.unpackb(msgpack_numpy.packb(MESSAGE)), MESSAGE)
    assert_same(msgpack_numpy.unpackb(wire.packb(MESSAGE)), MESSAGE)
    assert wire.packb(MESSAGE) == msgpack_numpy.packb(MESSAGE)  # byte for byte the same encoding


def test_a_non_contiguous_array_travels_as_its_values():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    assert np.array_equal(msgpack_numpy.unpackb(wire.packb({"a": array}))["a"], array)


def test_a_fortran_ordered_array_travels_in_row_major_order():
    array = np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))
    got = wire.unpackb(wire.packb({"a": array}))["a"]
    assert got.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("array", [np.array([object()]), np.zeros(2, dtype=np.complex64)])
def test_object_and_complex_arrays_are_refused(array):
    with pytest.raises(ValueError, match="cannot be sent"):
        wire.packb({"a": array})


@pytest.mark.parametrize("data", [b"\xc1", msgpack.packb({"a": 1}) + b"\x01",
                                  msgpack.packb({b"__ndarray__": True, b"data": b"\0" * 3, b"dtype": "<f4",
                                                 b"shape": [2]})])
def test_malformed_messages_are_one_value_error(data):
    with pytest.raises(ValueError, match="not a msgpack-numpy message") as error:
        wire.unpackb(data)
    assert not str(error.value).endswith(": )")  # msgpack's FormatError has no message of its own


@pytest.mark.parametrize("data, field", [
    ({b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4"}, "shape"),
    ({b"__ndarray__": True, b"data": b"\0" * 8, b"shape": [2]}, "dtype"),
    ({b"__ndarray__": True, b"dtype": "<f4", b"shape": [2]}, "data"),
    ({b"__npgeneric__": True, b"data": 1.0}, "dtype"),
    ({b"__npgeneric__": True, b"dtype": "<f4"}, "data"),
    ({b"__ndarray__": True}, "data"),  # the first of the fields it lacks
])
def test_an_array_map_missing_a_field_is_a_value_error_naming_it(data, field):
    """It was a KeyError, which the server's and the hub's handling of ValueError let through."""
    with pytest.raises(ValueError, match=f"not a msgpack-numpy message.*has no '{field}' field"):
        wire.unpackb(msgpack.packb({"state": data}))


def test_a_scalar_that_overflows_its_dtype_is_a_value_error():
    with pytest.raises(ValueError, match="not a msgpack-numpy message"):
        wire.unpackb(msgpack.packb({b"__npgeneric__": True, b"data": 2**64 - 1, b"dtype": "<i1"}))


@pytest.mark.parametrize("dtype", ["|V16", "<c16"])
def test_void_and_complex_arrays_received_are_refused(dtype):
    with pytest.raises(ValueError, match=r"not a msgpack-numpy message \(ValueError: arrays of dtype"):
        wire.unpackb(msgpack.packb({"a": {b"__ndarray__": True, b"data": b"\0" * 16, b"dtype": dtype, b"shape": [1]}}))


@pytest.mark.parametrize("dtype", ["|V8", "|O", "<c16"])
def test_object_void_and_complex_scalars_are_refused(dtype):
    """A void scalar's size is its data: a 40-byte message made a 20 MB ``np.void``, which the
    policy server's refusal then printed into an 80 MB log line and reply."""
    with pytest.raises(ValueError, match=r"not a msgpack-numpy message \(ValueError: scalars of dtype"):
        wire.unpackb(msgpack.packb({"sample": {b"__npgeneric__": True, b"data": 20_000_000, b"dtype": dtype}}))


@pytest.mark.parametrize("value, shown", [
    (True, "True"), (3, "3"), (np.float32(0.5), "0.5"), (None, "None"), (10**100, "an int of 101 digits"),
    ("yes", "'yes'"), ("x" * 10**6, "'" + "x" * 40 + "'... (1000000 characters)"),
    (np.zeros((2, 3), np.uint8), "a uint8 array of shape (2, 3)"), ([0.0] * 10**6, "a list"),
    (b"\0" * 10**6, "a bytes"),
    (10**39, "1" + "0" * 39), ("y" * 40, "'" + "y" * 40 + "'"),  # 40 characters are still shown whole
])
def test_a_received_value_is_described_in_a_few_characters(value, shown):
    assert wire.describe(value) == shown
