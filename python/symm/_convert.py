"""Turning Python arguments into the C ABI's: data types, operators, addresses and streams."""

from __future__ import annotations

import ctypes
import re
from typing import Any, Union

import numpy as np

from ._abi import DTYPE_NAMES, OP_NAMES, DataType, RedOp
from .errors import InvalidArgumentError

__all__ = [
    "DTypeLike",
    "OpLike",
    "StreamLike",
    "contiguous_extent",
    "dtype_size",
    "numpy_dtype",
    "resolve_dtype",
    "resolve_op",
    "resolve_stream",
]

#: What a data-type argument may be: a :class:`symm.DataType`, its integer value, a name
#: (``"float32"``, ``"bf16"``, ``"torch.bfloat16"``), a NumPy dtype or scalar type, or a torch
#: dtype (recognized by ``str(dtype)``; torch is never imported).
DTypeLike = Union[DataType, int, str, np.dtype, type, Any]  # type: ignore[valid-type]
#: What an operator argument may be: a :class:`symm.RedOp`, its integer value, or a name
#: (``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"``).
OpLike = Union[RedOp, int, str]  # type: ignore[valid-type]
#: What a stream argument may be: None (the default stream), an integer ``CUstream`` handle,
#: or an object with ``.cuda_stream`` (PyTorch), ``.handle`` (Numba) or ``.ptr`` (CuPy).
StreamLike = Union[None, int, Any]

# Other spellings of the header's data-type names (the header's own short names, e.g.
# "float32" or "float8e4m3", always work).
_DTYPE_ALIASES: dict[str, str] = {
    "float": "float32",
    "f32": "float32",
    "fp32": "float32",
    "half": "float16",
    "f16": "float16",
    "fp16": "float16",
    "double": "float64",
    "f64": "float64",
    "fp64": "float64",
    "bf16": "bfloat16",
    "i8": "int8",
    "u8": "uint8",
    "i32": "int32",
    "int": "int32",
    "u32": "uint32",
    "i64": "int64",
    "long": "int64",
    "u64": "uint64",
    "float8_e4m3": "float8e4m3",
    "float8_e4m3fn": "float8e4m3",
    "float8e4m3fn": "float8e4m3",
    "fp8e4m3": "float8e4m3",
    "f8e4m3": "float8e4m3",
    "e4m3": "float8e4m3",
    "float8_e5m2": "float8e5m2",
    "fp8e5m2": "float8e5m2",
    "f8e5m2": "float8e5m2",
    "e5m2": "float8e5m2",
}

_OP_ALIASES: dict[str, str] = {
    "add": "sum",
    "product": "prod",
    "mul": "prod",
    "maximum": "max",
    "minimum": "min",
    "average": "avg",
    "mean": "avg",
}


def _dtype_name(dtype: Any) -> str:
    """The name a dtype-like object goes by, without importing the library that made it."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, np.dtype):
        return dtype.name
    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        return np.dtype(dtype).name
    return str(dtype)


def resolve_dtype(dtype: DTypeLike) -> DataType:  # type: ignore[valid-type]
    """The :class:`symm.DataType` of ``dtype`` (see :data:`DTypeLike`).

    Raises:
        InvalidArgumentError: not a data type symm supports.
    """
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        try:
            return DataType(dtype)
        except ValueError:
            raise InvalidArgumentError(f"dtype {dtype} is not a symmDataType_t value") from None
    name = _dtype_name(dtype).strip().lower()
    for prefix in ("torch.", "numpy.", "np."):
        name = name.removeprefix(prefix)
    name = _DTYPE_ALIASES.get(name, name)
    if name in DTYPE_NAMES:
        return DTYPE_NAMES[name]
    known = ", ".join(sorted(DTYPE_NAMES))
    raise InvalidArgumentError(f"dtype {dtype!r} is not supported by symm (supported: {known})")


def resolve_op(op: OpLike) -> RedOp:  # type: ignore[valid-type]
    """The :class:`symm.RedOp` of ``op`` (see :data:`OpLike`).

    Raises:
        InvalidArgumentError: not an operator symm supports.
    """
    if isinstance(op, RedOp):
        return op
    if isinstance(op, int) and not isinstance(op, bool):
        try:
            return RedOp(op)
        except ValueError:
            raise InvalidArgumentError(f"op {op} is not a symmRedOp_t value") from None
    if isinstance(op, str):
        name = op.strip().lower()
        name = _OP_ALIASES.get(name, name)
        if name in OP_NAMES:
            return OP_NAMES[name]
    known = ", ".join(sorted(OP_NAMES))
    raise InvalidArgumentError(f"op {op!r} is not a reduction operator of symm (supported: {known})")


def dtype_size(dtype: DTypeLike) -> int:  # type: ignore[valid-type]
    """Bytes per element of ``dtype``, from the width in its header name (``symmBfloat16``: 2)."""
    resolved = resolve_dtype(dtype)
    width = re.search(r"\d+", resolved.name)
    if width is None:
        raise InvalidArgumentError(f"the width of {resolved.name} is not in its name")
    return int(width.group()) // 8


def numpy_dtype(dtype: DTypeLike) -> np.dtype:  # type: ignore[valid-type]
    """The NumPy dtype that holds ``dtype``'s elements.

    NumPy has no bfloat16 or float8: for those, the unsigned integer of the same width
    (``uint16``, ``uint8``), whose values are the elements' bit patterns. A NumPy dtype symm does
    not reduce (e.g. ``bool``) is returned as it is, for views of raw memory.
    """
    try:
        resolved = resolve_dtype(dtype)
    except InvalidArgumentError:
        try:
            return np.dtype(dtype)  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgumentError(f"dtype {dtype!r} is neither a symm nor a NumPy dtype") from None
    name = resolved.name[len("symm") :].lower()
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(f"uint{dtype_size(resolved) * 8}")


def resolve_stream(stream: StreamLike) -> int:
    """The ``CUstream`` handle of ``stream`` (see :data:`StreamLike`); 0 for None.

    Raises:
        InvalidArgumentError: not a stream.
    """
    if stream is None:
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        handle = stream
    elif isinstance(stream, ctypes.c_void_p):
        handle = stream.value or 0
    else:
        for attribute in ("cuda_stream", "handle", "ptr"):
            value = getattr(stream, attribute, None)
            if value is not None:
                return resolve_stream(value)
        raise InvalidArgumentError(
            f"stream {stream!r} is not a stream: pass an integer CUstream or an object with "
            ".cuda_stream, .handle or .ptr"
        )
    if handle < 0 or handle >= 1 << 64:
        raise InvalidArgumentError(f"stream handle {handle} is not a pointer value")
    return handle


def contiguous_extent(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> int | None:
    """Bytes of a C-contiguous array of ``shape`` (``strides`` None or C-contiguous), else None."""
    count = 1
    for extent in shape:
        count *= int(extent)
    if strides is not None and count > 0:
        expected = itemsize
        for extent, stride in zip(reversed(shape), reversed(strides)):
            if extent != 1 and stride != expected:
                return None
            expected *= extent
    return count * itemsize
