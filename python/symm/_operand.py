"""What a collective's send or receive argument is: its address, how many bytes it holds, its
element type and whether its extent is exact (an array) or a capacity (an allocation), read
from whichever protocol the object speaks — a symm :class:`~symm.Buffer`, :class:`~symm.Window`
or :class:`~symm.CudaArrayView`, a NumPy array, a PyTorch tensor, ``__cuda_array_interface__``
(CuPy, Numba), DLPack (``__dlpack__``: JAX, CuPy, NumPy, ...), ``__array_interface__``, or a
bare integer address — and the call's ``count`` and ``dtype`` that follow from both operands.

The rules (see ``docs/PYTHON.md``):

* an array's element type is its word: a ``dtype`` argument that names another type is refused
  (a ``uint16`` array holding bfloat16 bit patterns, or a ``uint8`` one holding float8, agrees
  with ``bfloat16`` / ``float8*``, since that is how NumPy holds them);
* an array's extent is exact: a ``count`` that does not match it is refused (pass a slice);
* a :class:`~symm.Buffer` or :class:`~symm.Window` is an allocation: a ``count`` may use a
  prefix of it; a buffer allocated with a ``dtype`` is typed like an array, one without is raw
  bytes of any type;
* an integer address has neither: ``count`` and ``dtype`` are required.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._abi import DataType
from ._convert import DTypeLike, contiguous_extent, dtype_size, numpy_dtype, resolve_dtype
from .errors import InvalidArgumentError

__all__ = ["Operand", "describe", "resolve_call", "torch_stream"]


@dataclass(frozen=True)
class Operand:
    """A send or receive argument, described."""

    #: Address of its first byte.
    ptr: int
    #: Bytes it holds (None: unknown, a bare address).
    nbytes: int | None
    #: The name of its element type (``"float32"``, ``"torch.bfloat16"``, ``"uint16"``), None
    #: for untyped memory.
    dtype: str | None
    #: Bytes per element of ``dtype`` (0 when untyped).
    itemsize: int
    #: True for an array, whose extent is its data; False for an allocation (a capacity).
    exact: bool
    #: What it is, for messages ("a float64 NumPy array").
    kind: str
    #: ``"cpu"``, ``"cuda"`` or None (unknown) — where the memory lives, when the object says.
    device: str | None = None
    #: The device index of a PyTorch CUDA tensor (whose current stream a call given no stream
    #: uses), else None.
    torch_device_index: int | None = None
    #: True when the object says its memory must not be written (a read-only NumPy array, such
    #: as one over ``bytes``; an array interface whose data tuple says so): never a receive.
    readonly: bool = False

    def elements(self) -> int | None:
        """Elements of ``dtype`` it holds (None: untyped or unknown size)."""
        if self.nbytes is None or self.itemsize == 0:
            return None
        return self.nbytes // self.itemsize


def _kind(dtype: str, what: str) -> str:
    article = "an" if dtype[:1] in "aeiou" and not dtype.startswith("uint") else "a"
    return f"{article} {dtype} {what}"


def symm_operand(ptr: int, nbytes: int, dtype: DataType | None, what: str, *, typed_view: bool = False) -> Operand:  # type: ignore[valid-type]
    """The :class:`Operand` of one of symm's own objects (``what``: "Buffer", "Window",
    "CudaArrayView"): ``nbytes`` at ``ptr``, of ``dtype`` (None: raw bytes); ``typed_view``
    when its type is its own rather than the memory's."""
    if dtype is None:
        return Operand(ptr, nbytes, None, 0, False, "a raw Buffer" if what == "Buffer" else f"a {what}")
    name = _symm_name(dtype)
    return Operand(ptr, nbytes, name, dtype_size(dtype), typed_view, _kind(name, what))


def describe(obj: Any, name: str) -> Operand:
    """The :class:`Operand` of ``obj`` (``name``: "send" or "recv", for messages).

    Raises:
        InvalidArgumentError: not a buffer, address or array symm can use (not contiguous,
            memory of the other backend, an unknown object).
    """
    # symm's own objects (Buffer, Window, CudaArrayView) describe themselves.
    own = getattr(type(obj), "_symm_operand", None)
    if own is not None:
        return own(obj)  # type: ignore[no-any-return]
    if isinstance(obj, bool):
        raise InvalidArgumentError(f"{name} must be a buffer, an array or an address, not a bool")
    if isinstance(obj, int):
        if obj < 0 or obj >= 1 << 64:
            raise InvalidArgumentError(f"{name} address {obj} is not a pointer value")
        return Operand(obj, None, None, 0, False, "an address")
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            raise InvalidArgumentError(f"{name} is not a C-contiguous array")
        return Operand(
            int(obj.__array_interface__["data"][0]),
            int(obj.nbytes),
            obj.dtype.name,
            obj.dtype.itemsize,
            True,
            _kind(obj.dtype.name, "NumPy array"),
            "cpu",
            readonly=not obj.flags.writeable,
        )
    if _is_torch_tensor(obj):
        return _torch_operand(obj, name)
    interface = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(interface, dict):
        return _interface_operand(interface, name, "cuda", type(obj).__name__)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _dlpack_operand(obj, name)
    interface = getattr(obj, "__array_interface__", None)
    if isinstance(interface, dict):
        return _interface_operand(interface, name, "cpu", type(obj).__name__)
    raise InvalidArgumentError(
        f"{name} must be a symm Buffer or Window, an integer address, a NumPy array, a PyTorch "
        f"tensor, or an object with __cuda_array_interface__, __dlpack__ or __array_interface__, "
        f"not {type(obj).__name__}"
    )


def _symm_name(dtype: DataType | None) -> str:  # type: ignore[valid-type]
    """``"bfloat16"`` for ``DataType.symmBfloat16``."""
    return "untyped" if dtype is None else dtype.name[len("symm") :].lower()  # type: ignore[attr-defined]


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_operand(tensor: Any, name: str) -> Operand:
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"{name} is not a contiguous tensor")
    dtype = str(tensor.dtype)
    device = tensor.device.type
    if device not in ("cpu", "cuda"):
        raise InvalidArgumentError(f"{name} is a tensor on {tensor.device}; symm uses CPU or CUDA memory")
    return Operand(
        int(tensor.data_ptr()),
        int(tensor.numel()) * int(tensor.element_size()),
        dtype,
        int(tensor.element_size()),
        True,
        _kind(dtype.removeprefix("torch."), "CPU tensor" if device == "cpu" else "CUDA tensor"),
        device,
        tensor.device.index if device == "cuda" else None,
    )


def _interface_operand(interface: dict[str, Any], name: str, device: str, type_name: str) -> Operand:
    """An object with ``__cuda_array_interface__`` or ``__array_interface__``."""
    dtype = np.dtype(interface["typestr"])
    strides = interface.get("strides")
    extent = contiguous_extent(
        tuple(interface["shape"]), None if strides is None else tuple(strides), dtype.itemsize
    )
    if extent is None:
        raise InvalidArgumentError(f"{name} is not contiguous")
    return Operand(
        int(interface["data"][0]),
        extent,
        dtype.name,
        dtype.itemsize,
        True,
        _kind(dtype.name, f"array ({type_name})"),
        device,
        readonly=bool(interface["data"][1]),
    )


# -- DLPack ---------------------------------------------------------------------------------


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


#: DLPack device types: kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged.
_DL_DEVICES = {1: "cpu", 2: "cuda", 3: "cpu", 13: "cuda"}
#: DLPack type codes symm has (kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLFloat8_e4m3fn,
#: kDLFloat8_e5m2), with the element names they map to by width.
_DL_TYPES = {
    (0, 8): "int8",
    (0, 16): "int16",
    (0, 32): "int32",
    (0, 64): "int64",
    (1, 8): "uint8",
    (1, 16): "uint16",
    (1, 32): "uint32",
    (1, 64): "uint64",
    (2, 16): "float16",
    (2, 32): "float32",
    (2, 64): "float64",
    (4, 16): "bfloat16",
    (10, 8): "float8e4m3",
    (12, 8): "float8e5m2",
}

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_operand(obj: Any, name: str) -> Operand:
    """An object with ``__dlpack__``: its tensor is read from the capsule, which is not
    consumed (the capsule's destructor returns it to the producer; ``obj`` keeps the memory)."""
    capsule = obj.__dlpack__()
    tensor = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    device = _DL_DEVICES.get(tensor.device.device_type)
    if device is None:
        raise InvalidArgumentError(f"{name} is a DLPack tensor on device type {tensor.device.device_type}")
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    dtype = _DL_TYPES.get((code, bits))
    if dtype is None or lanes != 1:
        raise InvalidArgumentError(f"{name} is a DLPack tensor of type code {code}, {bits} bits, {lanes} lanes")
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = None if not tensor.strides else tuple(tensor.strides[i] * bits // 8 for i in range(tensor.ndim))
    extent = contiguous_extent(shape, strides, bits // 8)
    if extent is None:
        raise InvalidArgumentError(f"{name} is not contiguous")
    return Operand(
        (tensor.data or 0) + tensor.byte_offset,
        extent,
        dtype,
        bits // 8,
        True,
        _kind(dtype, f"DLPack tensor ({type(obj).__name__})"),
        device,
    )


# -- the call ---------------------------------------------------------------------------------


def _agrees(operand: Operand, element: DataType) -> bool:  # type: ignore[valid-type]
    """Whether ``operand``'s element type is ``element``: the same type, or NumPy's holder of
    its bit patterns (``uint16`` for bfloat16, ``uint8`` for float8)."""
    assert operand.dtype is not None
    try:
        if resolve_dtype(operand.dtype) == element:
            return True
    except InvalidArgumentError:
        pass
    holder = numpy_dtype(element)
    # A PyTorch tensor's type is named ``torch.uint16``: the same holder.
    return holder.name != _symm_name(element) and operand.dtype.removeprefix("torch.") == holder.name


def _element_of(operand: Operand, name: str) -> DataType:  # type: ignore[valid-type]
    assert operand.dtype is not None
    try:
        return resolve_dtype(operand.dtype)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"{name} is {operand.kind}; symm has no {operand.dtype} type: pass dtype= to say what "
            "its elements are (uint16 arrays hold bfloat16 bit patterns: dtype='bfloat16')"
        ) from None


def resolve_call(
    send: Operand,
    recv: Operand,
    count: int | None,
    dtype: DTypeLike | None,
    send_ratio: int,
    recv_ratio: int,
    names: tuple[str, str] = ("send", "recv"),
) -> tuple[int, DataType]:  # type: ignore[valid-type]
    """The ``count`` and data type of a collective whose send holds ``send_ratio * count`` and
    whose receive holds ``recv_ratio * count`` elements (all-reduce 1 and 1, all-gather 1 and
    nranks, reduce-scatter nranks and 1), from the arguments and what the operands say.

    ``names`` name the two operands in messages; a send or receive passes its one buffer as
    both, under its own name.

    Raises:
        InvalidArgumentError: a ``dtype`` or ``count`` that disagrees with an operand, operands
            that disagree with each other, or nothing to infer them from.
    """
    one = send is recv and names[0] == names[1]
    operands = [(names[0], send, send_ratio)] + ([] if one else [(names[1], recv, recv_ratio)])
    if dtype is not None:
        element = resolve_dtype(dtype)
        for name, operand, _ in operands:
            if operand.dtype is not None and not _agrees(operand, element):
                raise InvalidArgumentError(
                    f"{name} is {operand.kind} but dtype is {_symm_name(element)}: pass an array of "
                    f"{_symm_name(element)}, or leave dtype out to use the array's"
                )
    else:
        typed = [(name, operand) for name, operand, _ in operands if operand.dtype is not None]
        if not typed:
            raise InvalidArgumentError(
                f"dtype is required: {names[0]} is {send.kind}, which has no element type"
                if one
                else f"dtype is required: {names[0]} is {send.kind} and {names[1]} is {recv.kind}, "
                "neither has an element type"
            )
        elements = {name: _element_of(operand, name) for name, operand in typed}
        element = elements[typed[0][0]]
        if len(set(elements.values())) > 1:
            raise InvalidArgumentError(
                f"{names[0]} is {send.kind} but {names[1]} is {recv.kind}: their element types differ"
            )
    size = dtype_size(element)

    if count is None:
        count = _infer_count(operands, size)
    for name, operand, ratio in operands:
        needed = ratio * count * size
        if operand.nbytes is None:
            continue
        if operand.exact and operand.nbytes != needed:
            held = operand.nbytes // size
            raise InvalidArgumentError(
                f"{name} is {operand.kind} of {held} elements but the call has count {count}"
                + (f" ({ratio} x {count} = {ratio * count} elements)" if ratio != 1 else "")
                + ": pass an array of exactly that many elements (a slice)"
            )
        if needed > operand.nbytes:
            raise InvalidArgumentError(
                f"{name} holds {operand.nbytes} bytes ({operand.kind}), the call needs {needed}"
            )
    return count, element


def refuse_readonly(operand: Operand, name: str) -> None:
    """Refuse a read-only ``operand`` as the buffer ``name`` a call writes.

    Raises:
        InvalidArgumentError: ``operand`` is read-only.
    """
    if operand.readonly:
        raise InvalidArgumentError(
            f"{name} is {operand.kind} that is read-only (over bytes, or flagged not writeable): "
            "a call writes it; pass a writable array"
        )


def _infer_count(operands: list[tuple[str, Operand, int]], size: int) -> int:
    """``count`` from the operands' extents: an array's (exact) first, else an allocation's."""
    for exact in (True, False):
        for name, operand, ratio in operands:
            if operand.nbytes is None or operand.exact != exact:
                continue
            elements = operand.nbytes // size
            if exact and (operand.nbytes % size or elements % ratio):
                raise InvalidArgumentError(
                    f"{name} is {operand.kind} of {operand.nbytes} bytes, not a whole number of "
                    f"{ratio} x count elements of {size} bytes"
                )
            return elements // ratio
    raise InvalidArgumentError("count is required: both operands are addresses, whose extent is unknown")


def torch_stream(operands: list[Operand]) -> int | None:
    """PyTorch's current stream of the device of the first CUDA tensor among ``operands``
    (None when there is none), for a call given ``stream=None``: the stream PyTorch's own
    kernels on those tensors run on."""
    for operand in operands:
        if operand.torch_device_index is not None:
            torch = sys.modules["torch"]
            return int(torch.cuda.current_stream(operand.torch_device_index).cuda_stream)
    return None
