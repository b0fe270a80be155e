"""openpi's wire format: msgpack with numpy arrays, as ``openpi_client.msgpack_numpy`` packs them.

An array travels as the map ``{"__ndarray__": True, "data": <raw bytes>, "dtype": <dtype.str>,
"shape": [...]}`` and a numpy scalar as ``{"__npgeneric__": True, "data": <item>, "dtype": ...}``
(map keys as msgpack binaries); object, void and complex arrays and scalars are refused (openpi
refuses such arrays so that nothing falls back to pickle; a void scalar's size is its data: a
message of 40 bytes made one of 20 MB). Written here rather than imported from ``openpi-client``, whose
package pins ``numpy < 2``; tests/vla_rl_core/test_wire.py checks both directions against
``openpi_client.msgpack_numpy`` itself.

Source: Physical-Intelligence/openpi, ``packages/openpi-client/src/openpi_client/msgpack_numpy.py``
(adapted there from lebedov/msgpack-numpy).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

_REFUSED_KINDS = ("V", "O", "c")


def _pack_array(obj: Any) -> Any:
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in _REFUSED_KINDS:
        raise ValueError(f"arrays of dtype {obj.dtype} cannot be sent (object, void and complex dtypes are refused)")
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str,
                b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


_ARRAY_FIELDS = (b"data", b"dtype", b"shape")
_SCALAR_FIELDS = (b"data", b"dtype")


def _unpack_array(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        _require(obj, "an array map (__ndarray__)", _ARRAY_FIELDS)
        dtype = np.dtype(obj[b"dtype"])
        if dtype.kind in _REFUSED_KINDS:
            raise ValueError(f"arrays of dtype {dtype} are refused")
        return np.ndarray(buffer=obj[b"data"], dtype=dtype, shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        _require(obj, "a numpy scalar map (__npgeneric__)", _SCALAR_FIELDS)
        dtype = np.dtype(obj[b"dtype"])
        if dtype.kind in _REFUSED_KINDS:  # np.void(20_000_000) is 20 MB of zeros from a 40-byte message
            raise ValueError(f"scalars of dtype {dtype} are refused")
        return dtype.type(obj[b"data"])
    return obj


def _require(obj: dict, what: str, fields: tuple[bytes, ...]) -> None:
    """ValueError naming the first of ``fields`` that ``obj`` (``what``) lacks."""
    missing = next((field for field in fields if field not in obj), None)
    if missing is not None:
        raise ValueError(f"{what} has no {missing.decode()!r} field (it needs "
                         f"{', '.join(repr(field.decode()) for field in fields)})")


def describe(value: Any) -> str:
    """A received value as an error message shows it, in a few characters whatever its size: a
    number, bool or None as itself, an array as its dtype and shape, a string as its first 40
    characters, anything else as its type (the repr of a 64 MiB list or string would make a log
    line, and a reply, of as much)."""
    if value is None or isinstance(value, (bool, int, float, np.bool_, np.number)):
        text = repr(value.item() if isinstance(value, np.generic) else value)
        return text if len(text) <= 40 else f"an int of {len(text)} digits"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"
    return f"a {type(value).__name__}"


def packb(obj: Any) -> bytes:
    """``obj`` (dicts, lists, numbers, strings, numpy arrays and scalars) as one msgpack message.

    Raises:
        ValueError: an object, void or complex array.
        TypeError: a value msgpack cannot encode.
    """
    return msgpack.packb(obj, default=_pack_array)


def unpackb(data: bytes) -> Any:
    """One msgpack message as Python objects, arrays as read-only numpy arrays over the message.

    Raises:
        ValueError: the bytes are not one msgpack message, or an array or scalar in it is malformed
            (a missing ``data``, ``dtype`` or ``shape`` field, data that does not fill its shape, a
            refused dtype, a value its dtype cannot hold); the only error it raises.
    """
    try:
        return msgpack.unpackb(data, object_hook=_unpack_array)
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as err:
        reason = str(err) or "malformed msgpack data"  # msgpack's FormatError has no message
        raise ValueError(f"not a msgpack-numpy message ({type(err).__name__}: {reason})") from err
