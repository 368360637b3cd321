"""Communicators, symmetric buffers, windows, collectives and groups over ``libsymm.so``.

Object lifetimes follow the C library's, with Python's conveniences:

* a :class:`Comm` is destroyed by :meth:`Comm.destroy`, at the end of a ``with`` block, or when
  it is garbage-collected; destroying it frees its buffers and windows, and every later use of
  them raises :class:`~symm.InvalidUsageError` naming what happened;
* a :class:`Buffer` is freed by :meth:`Buffer.free` or when it is garbage-collected (its
  communicator is kept alive while it exists);
* a :class:`Window` belongs to its communicator (it stays registered while the communicator
  lives, whether or not Python keeps a reference) until :meth:`Window.deregister` or the end of
  its ``with`` block; it keeps the :class:`Buffer` it was registered from alive.

Destroying, freeing or deregistering twice raises :class:`~symm.InvalidUsageError`.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Union

import numpy as np

from . import _lib
from ._abi import UNIQUE_ID_BYTES, WIN_COLL_SYMMETRIC, DataType, Result
from ._convert import (
    DTypeLike,
    OpLike,
    StreamLike,
    contiguous_extent,
    dtype_size,
    numpy_dtype,
    resolve_dtype,
    resolve_op,
    resolve_stream,
)
from ._lib import check, lib
from .errors import InvalidArgumentError, InvalidUsageError, SymmError, make_error

__all__ = [
    "Buffer",
    "BufferLike",
    "Comm",
    "CudaArrayView",
    "UniqueId",
    "Window",
    "get_unique_id",
    "group",
    "version",
]

#: What a send or receive argument may be: a :class:`Buffer`, a :class:`Window` (its base), an
#: integer address, an object with ``__cuda_array_interface__`` (CuPy, Numba, PyTorch) or
#: ``data_ptr()`` (a PyTorch tensor), or, on the host backend, a C-contiguous NumPy array.
BufferLike = Union["Buffer", "Window", int, np.ndarray, Any]


def version() -> tuple[int, int, int]:
    """The loaded library's version, ``(major, minor, patch)`` (``symmGetVersion``)."""
    code = ctypes.c_int()
    check(lib.symmGetVersion(ctypes.byref(code)))
    return code.value // 10000, code.value // 100 % 100, code.value % 100


class UniqueId:
    """A ``symmUniqueId``: names a communicator being created by :class:`Comm` on every rank.

    Made by :func:`get_unique_id` on one rank and sent to the others: it pickles, and converts
    to and from bytes (``bytes(uid)``, ``UniqueId(raw)``) and hex (``uid.hex()``,
    ``UniqueId.from_hex(text)``).
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes | bytearray | memoryview) -> None:
        """Wrap the id's raw bytes (``SYMM_UNIQUE_ID_BYTES`` of them).

        Raises:
            InvalidArgumentError: the wrong number of bytes.
        """
        data = bytes(raw)
        if len(data) != UNIQUE_ID_BYTES:
            raise InvalidArgumentError(f"a unique id has {UNIQUE_ID_BYTES} bytes, not {len(data)}")
        self._raw = data

    @classmethod
    def from_hex(cls, text: str) -> UniqueId:
        """The id whose :meth:`hex` is ``text``."""
        try:
            return cls(bytes.fromhex(text))
        except ValueError as error:
            raise InvalidArgumentError(f"not a hex unique id: {error}") from None

    def hex(self) -> str:
        """The id as a hex string (for environment variables, files, command lines)."""
        return self._raw.hex()

    def __bytes__(self) -> bytes:
        return self._raw

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UniqueId) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def __reduce__(self) -> tuple[type[UniqueId], tuple[bytes]]:
        return (UniqueId, (self._raw,))

    def __repr__(self) -> str:
        return f"UniqueId({self._raw[:8].hex()}...)"

    def _struct(self) -> _lib.UniqueIdStruct:
        struct = _lib.UniqueIdStruct()
        ctypes.memmove(ctypes.byref(struct), self._raw, UNIQUE_ID_BYTES)
        return struct


def get_unique_id() -> UniqueId:
    """A new :class:`UniqueId` (``symmGetUniqueId``): starts the bootstrap root in this process
    (which must live until every rank joined), or, with ``SYMM_COMM_ID=host:port`` set, the id of
    that address."""
    struct = _lib.UniqueIdStruct()
    check(lib.symmGetUniqueId(ctypes.byref(struct)))
    return UniqueId(ctypes.string_at(ctypes.addressof(struct), UNIQUE_ID_BYTES))


def _as_unique_id(uid: UniqueId | bytes | bytearray | str) -> UniqueId:
    if isinstance(uid, UniqueId):
        return uid
    if isinstance(uid, str):
        return UniqueId.from_hex(uid)
    if isinstance(uid, (bytes, bytearray, memoryview)):
        return UniqueId(uid)
    raise InvalidArgumentError(f"uid must be a UniqueId, bytes or a hex string, not {type(uid).__name__}")


#: Largest value of a C ``int`` argument.
_INT_MAX = 2**31 - 1
#: Largest value of a C ``size_t`` argument.
_SIZE_MAX = 2**64 - 1


def _as_int(value: Any, name: str, minimum: int = 0, maximum: int = _SIZE_MAX) -> int:
    """``value`` as an int in ``[minimum, maximum]`` (integers only, no floats or bools)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{name} must be an integer, not {type(value).__name__}")
    number = value.__index__()
    if not minimum <= number <= maximum:
        raise InvalidArgumentError(f"{name} must be in [{minimum}, {maximum}], not {number}")
    return number


def _destroy_handle(handle: int, alive: list[bool]) -> None:
    """Finalizer of a garbage-collected :class:`Comm` (errors cannot be reported there).
    ``alive`` is shared with the comm's buffers' finalizers, which may run after this one when
    the comm and its buffers are collected together."""
    alive[0] = False
    lib.symmCommDestroy(handle)


def _free_memory(comm_handle: int, comm_alive: list[bool], ptr: int) -> None:
    """Finalizer of a garbage-collected :class:`Buffer`: frees it unless its comm is gone."""
    if comm_alive[0]:
        lib.symmMemFree(comm_handle, ptr)


class Comm:
    """One rank of a communicator.

    Create one rank per process or thread with ``Comm(nranks, uid, rank)``
    (``symmCommInitRank``, collective: returns once every rank joined), or every rank in this
    process with :meth:`Comm.init_all` (``symmCommInitAll``; one thread then drives them all
    inside :func:`group`). A context manager: ``with`` destroys it on exit.
    """

    def __init__(self, nranks: int, uid: UniqueId | bytes | str, rank: int) -> None:
        """Join rank ``rank`` of the ``nranks``-rank communicator named by ``uid``.

        Raises:
            InvalidArgumentError: a bad ``nranks``, ``rank`` or ``uid``.
            SymmTimeoutError: not every rank joined in time.
        """
        nranks = _as_int(nranks, "nranks", 1, _INT_MAX)
        rank = _as_int(rank, "rank", 0, _INT_MAX)
        struct = _as_unique_id(uid)._struct()
        handle = ctypes.c_void_p()
        check(lib.symmCommInitRank(ctypes.byref(handle), nranks, struct, rank))
        self._adopt(handle.value)

    @classmethod
    def init_all(cls, devices: int | Sequence[int]) -> list[Comm]:
        """Create every rank of a communicator in this process (``symmCommInitAll``).

        Args:
            devices: the number of ranks (rank ``i`` on device ``i``), or each rank's device
                (devices may repeat: several ranks on one GPU).

        Returns:
            The ranks, in rank order.
        """
        if isinstance(devices, (bool, str, bytes)) or (
            not hasattr(devices, "__index__") and not isinstance(devices, Sequence)
        ):
            raise InvalidArgumentError(f"devices must be a count or a list of devices, not {type(devices).__name__}")
        if not isinstance(devices, Sequence):
            count = _as_int(devices, "devices", 1, _INT_MAX)
            devlist = None
        else:
            device_list = [_as_int(d, "device", 0, _INT_MAX) for d in devices]
            count = len(device_list)
            if count == 0:
                raise InvalidArgumentError("devices is empty")
            devlist = (ctypes.c_int * count)(*device_list)
        handles = (ctypes.c_void_p * count)()
        check(lib.symmCommInitAll(handles, count, devlist))
        comms = []
        for handle in handles:
            comm = cls.__new__(cls)
            comm._adopt(handle)
            comms.append(comm)
        return comms

    def _adopt(self, handle: int | None) -> None:
        if not handle:
            raise make_error(Result["symmInternalError"], "the library returned a NULL comm")
        self._handle: int | None = handle
        self._state_lock = threading.Lock()
        self._buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._windows: set[Window] = set()
        self._alive = [True]
        self._finalizer = weakref.finalize(self, _destroy_handle, handle, self._alive)
        self.rank: int = self._query(lib.symmCommUserRank)
        """This rank."""
        self.nranks: int = self._query(lib.symmCommCount)
        """Number of ranks."""
        self.device: int = self._query(lib.symmCommCuDevice)
        """The CUDA device of this rank."""
        name = ctypes.c_char_p()
        check(lib.symmCommGetBackend(handle, ctypes.byref(name)))
        self.backend: str = (name.value or b"").decode()
        """``"cuda"`` or ``"host"``: where :meth:`alloc` memory lives."""

    def _query(self, function: Any) -> int:
        value = ctypes.c_int()
        check(function(self.handle, ctypes.byref(value)))
        return value.value

    @property
    def handle(self) -> int:
        """The ``symmComm_t`` (as an int), for C code.

        Raises:
            InvalidUsageError: the communicator was destroyed.
        """
        handle = self._handle
        if handle is None:
            raise InvalidUsageError("the communicator was destroyed")
        return handle

    @property
    def destroyed(self) -> bool:
        """Whether :meth:`destroy` ran."""
        return self._handle is None

    def destroy(self) -> None:
        """Destroy this rank (``symmCommDestroy``): frees its windows and buffers.

        Synchronize your streams first on the cuda backend.

        Raises:
            InvalidUsageError: destroyed already, or calls of it are queued in an open group.
        """
        with self._state_lock:
            handle = self.handle
            check(lib.symmCommDestroy(handle))
            self._handle = None
            self._alive[0] = False
            self._finalizer.detach()
            windows, self._windows = self._windows, set()
            buffers = list(self._buffers)
        for window in windows:
            window._invalidate("its communicator was destroyed")
        for buffer in buffers:
            buffer._invalidate("its communicator was destroyed, which freed it")

    def __enter__(self) -> Comm:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._handle is not None:
            self.destroy()

    def __repr__(self) -> str:
        state = "destroyed" if self._handle is None else f"backend={self.backend!r}, device={self.device}"
        return f"<symm.Comm rank {self.rank} of {self.nranks}, {state}>"

    def last_error(self) -> str:
        """``symmGetLastError(comm)``: the message of this rank's last failed call."""
        return _lib.last_error(self.handle)

    def async_error(self) -> SymmError | None:
        """The asynchronous state (``symmCommGetAsyncError``): None while healthy, else the
        error (not raised) that made the communicator refuse further collectives."""
        code = ctypes.c_int()
        check(lib.symmCommGetAsyncError(self.handle, ctypes.byref(code)))
        if code.value == Result["symmSuccess"]:
            return None
        return make_error(code.value, self.last_error() or "asynchronous error")

    # -- memory and windows -------------------------------------------------------------------

    def alloc(self, nbytes: int, dtype: DTypeLike = "uint8") -> Buffer:
        """Allocate ``nbytes`` of memory usable in a symmetric window (``symmMemAlloc``):
        device memory on the cuda backend, host memory on the host backend.

        Args:
            nbytes: size in bytes.
            dtype: the element type the buffer's ``__cuda_array_interface__`` reports.
        """
        nbytes = _as_int(nbytes, "nbytes")
        element = resolve_dtype(dtype)
        ptr = ctypes.c_void_p()
        with self._state_lock:
            check(lib.symmMemAlloc(self.handle, ctypes.byref(ptr), nbytes))
            buffer = Buffer(self, ptr.value or 0, nbytes, element)
            self._buffers.add(buffer)
        return buffer

    def register(self, buffer: BufferLike, nbytes: int | None = None, flags: int = WIN_COLL_SYMMETRIC) -> Window:
        """Register a window (``symmCommWindowRegister``). Collective: every rank registers,
        and one thread driving several ranks does it inside :func:`group`.

        Args:
            buffer: a :class:`Buffer`, or an address inside one ``symmMemAlloc`` allocation
                (any :data:`BufferLike`).
            nbytes: bytes to register; default: the whole buffer (required for an address).
            flags: window flags (``SYMM_WIN_COLL_SYMMETRIC``).
        """
        ptr, extent = self._address(buffer, "buffer")
        if nbytes is None:
            if extent is None:
                raise InvalidArgumentError("nbytes is required when registering an address")
            nbytes = extent
        nbytes = _as_int(nbytes, "nbytes")
        if extent is not None and nbytes > extent:
            raise InvalidArgumentError(f"nbytes {nbytes} exceeds the buffer's {extent} bytes")
        flags = _as_int(flags, "flags", 0, _INT_MAX)
        handle = ctypes.c_void_p()
        with self._state_lock:
            check(lib.symmCommWindowRegister(self.handle, ptr, nbytes, ctypes.byref(handle), flags))
            window = Window(self, handle.value or 0, ptr, nbytes, buffer if isinstance(buffer, Buffer) else None)
            self._windows.add(window)
        return window

    def _forget_window(self, window: Window) -> None:
        self._windows.discard(window)

    # -- collectives --------------------------------------------------------------------------

    def all_reduce(
        self,
        send: BufferLike,
        recv: BufferLike,
        count: int,
        dtype: DTypeLike,
        op: OpLike = "sum",
        stream: StreamLike = None,
    ) -> None:
        """All-reduce ``count`` elements of ``send`` into ``recv`` on every rank
        (``symmAllReduce``; in place when they are the same address). Both inside registered
        windows, at the same offsets on every rank."""
        count = _as_int(count, "count")
        element = resolve_dtype(dtype)
        operator = resolve_op(op)
        nbytes = count * dtype_size(element)
        send_ptr = self._operand(send, "send", nbytes)
        recv_ptr = self._operand(recv, "recv", nbytes)
        check(lib.symmAllReduce(send_ptr, recv_ptr, count, element, operator, self.handle, resolve_stream(stream)))

    def all_gather(
        self,
        send: BufferLike,
        recv: BufferLike,
        count: int,
        dtype: DTypeLike,
        stream: StreamLike = None,
    ) -> None:
        """All-gather (``symmAllGather``): rank ``r``'s ``count`` elements of ``send`` land at
        element ``r * count`` of every rank's ``recv`` (``nranks * count`` elements)."""
        count = _as_int(count, "count")
        element = resolve_dtype(dtype)
        nbytes = count * dtype_size(element)
        send_ptr = self._operand(send, "send", nbytes)
        recv_ptr = self._operand(recv, "recv", nbytes * self.nranks)
        check(lib.symmAllGather(send_ptr, recv_ptr, count, element, self.handle, resolve_stream(stream)))

    def reduce_scatter(
        self,
        send: BufferLike,
        recv: BufferLike,
        count: int,
        dtype: DTypeLike,
        op: OpLike = "sum",
        stream: StreamLike = None,
    ) -> None:
        """Reduce-scatter (``symmReduceScatter``): rank ``r``'s ``recv`` gets, in ``count``
        elements, the reduction of segment ``r`` of every rank's ``send`` (``nranks * count``
        elements)."""
        count = _as_int(count, "count")
        element = resolve_dtype(dtype)
        operator = resolve_op(op)
        nbytes = count * dtype_size(element)
        send_ptr = self._operand(send, "send", nbytes * self.nranks)
        recv_ptr = self._operand(recv, "recv", nbytes)
        check(lib.symmReduceScatter(send_ptr, recv_ptr, count, element, operator, self.handle, resolve_stream(stream)))

    def _operand(self, buffer: BufferLike, name: str, needed: int) -> int:
        ptr, extent = self._address(buffer, name)
        if extent is not None and needed > extent:
            raise InvalidArgumentError(f"{name} holds {extent} bytes, the call needs {needed}")
        return ptr

    def _address(self, buffer: BufferLike, name: str) -> tuple[int, int | None]:
        """The address of a :data:`BufferLike` and its size in bytes when known."""
        if isinstance(buffer, Buffer):
            buffer._check_live()
            return buffer.ptr, buffer.nbytes
        if isinstance(buffer, Window):
            return buffer.base, buffer.nbytes
        if isinstance(buffer, bool):
            raise InvalidArgumentError(f"{name} must be a buffer or an address, not a bool")
        if isinstance(buffer, int):
            if buffer < 0 or buffer >= 1 << 64:
                raise InvalidArgumentError(f"{name} address {buffer} is not a pointer value")
            return buffer, None
        interface = getattr(buffer, "__cuda_array_interface__", None)
        if isinstance(interface, dict):
            itemsize = np.dtype(interface["typestr"]).itemsize
            strides = interface.get("strides")
            extent = contiguous_extent(tuple(interface["shape"]), None if strides is None else tuple(strides), itemsize)
            if extent is None:
                raise InvalidArgumentError(f"{name} is not contiguous")
            return int(interface["data"][0]), extent
        if isinstance(buffer, np.ndarray):
            if self.backend != "host":
                raise InvalidArgumentError(
                    f"{name} is a NumPy array (host memory); the {self.backend} backend needs device "
                    "memory from alloc()"
                )
            if not buffer.flags.c_contiguous:
                raise InvalidArgumentError(f"{name} is not a C-contiguous array")
            return int(buffer.__array_interface__["data"][0]), int(buffer.nbytes)
        data_ptr = getattr(buffer, "data_ptr", None)
        if callable(data_ptr):
            is_contiguous = getattr(buffer, "is_contiguous", None)
            if callable(is_contiguous) and not is_contiguous():
                raise InvalidArgumentError(f"{name} is not contiguous")
            extent = None
            numel, element_size = getattr(buffer, "numel", None), getattr(buffer, "element_size", None)
            if callable(numel) and callable(element_size):
                extent = int(numel()) * int(element_size())
            return int(data_ptr()), extent
        raise InvalidArgumentError(
            f"{name} must be a symm Buffer, an integer address, an object with "
            f"__cuda_array_interface__ or data_ptr(), or a NumPy array, not {type(buffer).__name__}"
        )


class CudaArrayView:
    """A typed view of device memory exposing ``__cuda_array_interface__`` (version 3), for
    ``torch.as_tensor``, ``cupy.asarray`` or ``numba.cuda.as_cuda_array``. Keeps its buffer
    alive. bfloat16 and float8 are described as ``uint16`` / ``uint8`` (the interface has no
    type code for them): view the result as the real type (``tensor.view(torch.bfloat16)``)."""

    def __init__(self, buffer: Buffer, dtype: DataType, count: int, offset: int) -> None:  # type: ignore[valid-type]
        self.buffer = buffer
        """The buffer viewed."""
        self.dtype = dtype
        """The symm data type of the elements."""
        self.ptr = buffer.ptr + offset
        """Address of the first element."""
        self.count = count
        """Number of elements."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self.buffer._check_live()
        return {
            "version": 3,
            "shape": (self.count,),
            "typestr": numpy_dtype(self.dtype).str,
            "data": (self.ptr, False),
            "strides": None,
            "stream": None,
        }


class Buffer:
    """Memory from :meth:`Comm.alloc` (``symmMemAlloc``). Freed by :meth:`free` or when
    garbage-collected; a context manager (``with`` frees it on exit)."""

    def __init__(self, comm: Comm, ptr: int, nbytes: int, dtype: DataType) -> None:  # type: ignore[valid-type]
        self.comm = comm
        """The communicator the memory belongs to."""
        self.ptr = ptr
        """Address of the first byte."""
        self.nbytes = nbytes
        """Size in bytes."""
        self.dtype = dtype
        """Element type reported by ``__cuda_array_interface__`` (``alloc``'s ``dtype``)."""
        self._dead: str | None = None
        self._finalizer = weakref.finalize(self, _free_memory, comm.handle, comm._alive, ptr)

    def _check_live(self) -> None:
        if self._dead is not None:
            raise InvalidUsageError(f"the buffer at {self.ptr:#x} is gone: {self._dead}")

    def _invalidate(self, reason: str) -> None:
        self._finalizer.detach()
        self._dead = reason

    @property
    def freed(self) -> bool:
        """Whether the memory was freed (by :meth:`free` or with its communicator)."""
        return self._dead is not None

    def free(self) -> None:
        """Free the memory (``symmMemFree``). Deregister its windows first.

        Raises:
            InvalidUsageError: freed already, or its communicator was destroyed.
            InvalidArgumentError: a window still covers it.
        """
        comm = self.comm
        with comm._state_lock:
            self._check_live()
            check(lib.symmMemFree(comm.handle, self.ptr))
            self._invalidate("it was freed")
            comm._buffers.discard(self)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._dead is None:
            self.free()

    def __repr__(self) -> str:
        state = f", {self._dead}" if self._dead else ""
        return f"<symm.Buffer {self.nbytes} bytes at {self.ptr:#x} on rank {self.comm.rank}{state}>"

    def _element_range(self, dtype: DTypeLike, count: int | None, offset: int) -> tuple[np.dtype, int]:
        self._check_live()
        element = numpy_dtype(dtype)
        offset = _as_int(offset, "offset")
        available = max(self.nbytes - offset, 0) // element.itemsize
        count = available if count is None else _as_int(count, "count")
        if offset + count * element.itemsize > self.nbytes:
            raise InvalidArgumentError(
                f"{count} elements of {element.itemsize} bytes at offset {offset} exceed the buffer's {self.nbytes} bytes"
            )
        return element, count

    def numpy(self, dtype: DTypeLike = "uint8", count: int | None = None, offset: int = 0) -> np.ndarray:
        """A NumPy array over the buffer's memory, without a copy (host backend only).

        Args:
            dtype: element type (bfloat16 and float8 are viewed as their bit patterns, see
                :func:`symm.numpy_dtype`).
            count: number of elements; default: as many as fit after ``offset``.
            offset: byte offset of the first element.

        The array keeps the buffer object alive, but :meth:`free` or destroying the
        communicator releases the memory: do not use the array after that.

        Raises:
            InvalidUsageError: the cuda backend (device memory), or the buffer is gone.
        """
        if self.comm.backend != "host":
            raise InvalidUsageError(
                f"numpy() views host memory; on the {self.comm.backend} backend use "
                "__cuda_array_interface__ (cupy.asarray, torch.as_tensor)"
            )
        element, count = self._element_range(dtype, count, offset)
        if count == 0:
            return np.empty(0, dtype=element)
        raw = (ctypes.c_char * (count * element.itemsize)).from_address(self.ptr + offset)
        raw._symm_buffer = self  # type: ignore[attr-defined]  # the array's base keeps the buffer alive
        return np.frombuffer(raw, dtype=element)  # type: ignore[call-overload]

    def view(self, dtype: DTypeLike, count: int | None = None, offset: int = 0) -> CudaArrayView:
        """A typed :class:`CudaArrayView` of the buffer (cuda backend), e.g. for
        ``torch.as_tensor(buf.view("float32"), device="cuda")``."""
        element = resolve_dtype(dtype)
        _, count = self._element_range(element, count, offset)
        return CudaArrayView(self, element, count, offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) of the whole buffer as ``alloc``'s dtype.
        Only on the cuda backend (absent on the host backend, whose memory is not device
        memory)."""
        if self.comm.backend != "cuda":
            raise AttributeError("__cuda_array_interface__ is only offered on the cuda backend")
        return self.view(self.dtype).__cuda_array_interface__


class Window:
    """A registered window (``symmCommWindowRegister``). A context manager: ``with``
    deregisters it on exit."""

    def __init__(self, comm: Comm, handle: int, base: int, nbytes: int, buffer: Buffer | None) -> None:
        self.comm = comm
        """The communicator it is registered on."""
        self.handle = handle
        """The ``symmWindow_t`` (as an int), for C code."""
        self.base = base
        """Address of the window's first byte on this rank."""
        self.nbytes = nbytes
        """Size of the window in bytes."""
        self.buffer = buffer
        """The :class:`Buffer` it was registered from, if any (kept alive)."""
        self._dead: str | None = None
        self._device_context: int | None = None

    def _check_live(self) -> None:
        if self._dead is not None:
            raise InvalidUsageError(f"the window at {self.base:#x} is gone: {self._dead}")

    def _invalidate(self, reason: str) -> None:
        self._dead = reason

    @property
    def registered(self) -> bool:
        """Whether the window is still registered."""
        return self._dead is None

    @property
    def device_context(self) -> int:
        """Device address of the window's ``symmDeviceContext`` (``symmCommGetDeviceContext``),
        the ``ctx`` argument of the Triton and PTX device functions. Available once the
        registration completed (after the enclosing :func:`group`)."""
        self._check_live()
        if self._device_context is None:
            context = ctypes.c_void_p()
            check(lib.symmCommGetDeviceContext(self.comm.handle, self.handle, ctypes.byref(context)))
            self._device_context = context.value or 0
        return self._device_context

    def offset(self, buffer: BufferLike) -> int:
        """Byte offset of ``buffer`` (any :data:`BufferLike`) from the window's base, the
        ``byte_offset`` of the device functions.

        Raises:
            InvalidArgumentError: the address is not inside the window.
        """
        self._check_live()
        ptr, _ = self.comm._address(buffer, "buffer")
        if not self.base <= ptr < self.base + max(self.nbytes, 1):
            raise InvalidArgumentError(f"address {ptr:#x} is not inside the window at {self.base:#x}")
        return ptr - self.base

    def deregister(self) -> None:
        """Deregister the window (``symmCommWindowDeregister``). Synchronize your streams first
        on the cuda backend.

        Raises:
            InvalidUsageError: deregistered already, or its communicator was destroyed.
        """
        comm = self.comm
        with comm._state_lock:
            self._check_live()
            check(lib.symmCommWindowDeregister(comm.handle, self.handle))
            self._invalidate("it was deregistered")
            comm._forget_window(self)

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._dead is None:
            self.deregister()

    def __repr__(self) -> str:
        state = f", {self._dead}" if self._dead else ""
        return f"<symm.Window {self.nbytes} bytes at {self.base:#x} on rank {self.comm.rank}{state}>"


@contextmanager
def group() -> Iterator[None]:
    """``symmGroupStart`` / ``symmGroupEnd`` around a block: registrations and collectives of
    the block are deferred to its end, where the parts of each collective from several ranks
    become one launch. Nests (only the outermost end runs them). ``symmGroupEnd`` runs even when
    the block raises; its own error is then attached to the block's exception as a note."""
    check(lib.symmGroupStart())
    try:
        yield
    except BaseException as error:
        result = lib.symmGroupEnd()
        if result != Result["symmSuccess"]:
            error.add_note(f"symmGroupEnd then failed too: {make_error(result, _lib.last_error(None))}")
        raise
    check(lib.symmGroupEnd())
