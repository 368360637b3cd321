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
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Union

import numpy as np

from . import _lib
from ._abi import DEFINES, OWNER_NAMES, UNIQUE_ID_BYTES, WIN_COLL_SYMMETRIC, DataType, Result
from ._convert import (
    DTypeLike,
    OpLike,
    StreamLike,
    dtype_size,
    numpy_dtype,
    resolve_dtype,
    resolve_op,
    resolve_stream,
)
from ._lib import ConfigStruct, PeerWindowStruct, check, lib
from ._operand import Operand, describe, refuse_readonly, resolve_call, symm_operand, torch_stream
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

#: What a send or receive argument may be: a :class:`Buffer`, a :class:`Window` (its base), a
#: :class:`CudaArrayView`, an integer address, a PyTorch tensor, an object with
#: ``__cuda_array_interface__`` (CuPy, Numba), ``__dlpack__`` (JAX, ...) or
#: ``__array_interface__``, or a C-contiguous NumPy array — memory inside a registered window, on
#: the communicator's backend (CUDA memory on the cuda backend, host memory on the host backend).
BufferLike = Union["Buffer", "Window", "CudaArrayView", int, np.ndarray, Any]


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
_UINT64_MAX = 2**64 - 1
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


class _ProcessRanks:
    """The ranks of one communicator that this process created (held weakly): those of one
    :meth:`Comm.init_all`, or every ``Comm(nranks, uid, rank)`` of one unique id (one per
    thread). Ranks of other processes are not among them: nothing here knows their devices."""

    def __init__(self) -> None:
        self._comms: weakref.WeakSet[Comm] = weakref.WeakSet()

    def add(self, comm: Comm) -> None:
        self._comms.add(comm)

    def on_device(self, device: int) -> int:
        """How many of them (not destroyed) use CUDA device ``device``."""
        return sum(1 for comm in list(self._comms) if not comm.destroyed and comm.device == device)


#: The :class:`_ProcessRanks` of each unique id this process joined with ``Comm(...)``.
_RANKS_BY_UNIQUE_ID: weakref.WeakValueDictionary[bytes, _ProcessRanks] = weakref.WeakValueDictionary()
_RANKS_BY_UNIQUE_ID_LOCK = threading.Lock()
#: The :class:`_ProcessRanks` of each split's new communicators in this process, by the
#: parent's ranks, the split's number and the color.
_RANKS_BY_SPLIT: weakref.WeakValueDictionary[tuple[int, int, int], _ProcessRanks] = weakref.WeakValueDictionary()


#: ``SYMM_SPLIT_NOCOLOR``: the color of a rank that joins no new communicator.
SPLIT_NOCOLOR = -1


def _split_arguments(
    color: int | None, key: int, min_ctas: int | None, max_ctas: int | None
) -> tuple[int, int, Any]:
    """A split's color, key and configuration for C. Values C's ``int`` holds go to the
    library as given, which validates them (so that a bad one reaches the other ranks too);
    ``None`` is ``SYMM_SPLIT_NOCOLOR``; the configuration is ``None`` (NULL: the parent's)
    unless a bound is given."""
    color_value = SPLIT_NOCOLOR if color is None else _as_int(color, "color", -_INT_MAX - 1, _INT_MAX)
    key = _as_int(key, "key", -_INT_MAX - 1, _INT_MAX)
    if min_ctas is None and max_ctas is None:
        return color_value, key, None
    undef = -_INT_MAX - 1
    config = ConfigStruct(
        size=ctypes.sizeof(ConfigStruct),
        magic=DEFINES["SYMM_CONFIG_MAGIC"],
        version=DEFINES["SYMM_VERSION_CODE"],
        blocking=undef,
        minCTAs=undef if min_ctas is None else _as_int(min_ctas, "min_ctas", -_INT_MAX - 1, _INT_MAX),
        maxCTAs=undef if max_ctas is None else _as_int(max_ctas, "max_ctas", -_INT_MAX - 1, _INT_MAX),
    )
    return color_value, key, ctypes.byref(config)


#: Windows whose device context was read, by the context's address (see
#: :func:`window_of_device_context`).
_WINDOWS_BY_DEVICE_CONTEXT: weakref.WeakValueDictionary[int, Window] = weakref.WeakValueDictionary()


def window_of_device_context(address: int) -> Window | None:
    """The registered :class:`Window` whose :attr:`Window.device_context` is ``address``, if
    this process read it; ``None`` otherwise (for ``symm.triton``, whose kernels get only the
    address)."""
    return _WINDOWS_BY_DEVICE_CONTEXT.get(address)


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
        unique_id = _as_unique_id(uid)
        handle = ctypes.c_void_p()
        check(lib.symmCommInitRank(ctypes.byref(handle), nranks, unique_id._struct(), rank))
        with _RANKS_BY_UNIQUE_ID_LOCK:
            ranks = _RANKS_BY_UNIQUE_ID.get(bytes(unique_id))
            if ranks is None:
                ranks = _RANKS_BY_UNIQUE_ID[bytes(unique_id)] = _ProcessRanks()
        self._adopt(handle.value, ranks)

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
        ranks = _ProcessRanks()
        comms = []
        for handle in handles:
            comm = cls.__new__(cls)
            comm._adopt(handle, ranks)
            comms.append(comm)
        return comms

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Comm:
        """Join the communicator a launcher describes in the environment, as
        ``torch.distributed``'s ``env://`` does: ``torchrun``, ``mpirun`` with the variables
        exported, Slurm scripts (``symmCommInitFromEnv``: the library reads them, so C, Rust
        and Python agree):

        * rank: ``RANK``, else ``SYMM_RANK``, else ``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK``;
        * number of ranks: ``WORLD_SIZE``, else ``SYMM_WORLD_SIZE``, else
          ``OMPI_COMM_WORLD_SIZE`` / ``PMI_SIZE``;
        * where rank 0 opens the bootstrap root: ``SYMM_COMM_ID`` (``host:port``) when set, else
          ``MASTER_ADDR`` at port ``MASTER_PORT + 1`` (``MASTER_PORT`` itself is the port of
          torchrun's own store); the secret is ``SYMM_COMM_SECRET`` when set (see
          ``docs/CONFIGURATION.md``: without it, anyone who reaches the address can join).

        The other ``SYMM_*`` variables apply as for every communicator. The CUDA device is the
        current one, as for ``symmCommInitRank``: select it first (``torch.cuda.set_device(
        int(os.environ["LOCAL_RANK"]))``).

        Args:
            environ: the variables to read instead of this process's environment (the other
                ``SYMM_*`` settings still come from the environment).

        Raises:
            InvalidArgumentError: a variable is missing or malformed (the message names it).
        """
        if environ is None:
            entries = None  # the library reads this process's environment
        else:
            pairs = [f"{name}={value}".encode() for name, value in environ.items()]
            entries = (ctypes.c_char_p * (len(pairs) + 1))(*pairs, None)
        handle = ctypes.c_void_p()
        check(lib.symmCommInitFromEnv(ctypes.byref(handle), entries))
        comm = cls.__new__(cls)
        comm._adopt(handle.value, _ProcessRanks())
        return comm

    def _adopt(self, handle: int | None, process_ranks: _ProcessRanks) -> None:
        if not handle:
            raise make_error(Result["symmInternalError"], "the library returned a NULL comm")
        self._handle: int | None = handle
        self._state_lock = threading.Lock()
        self._buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._windows: set[Window] = set()
        self._barrier_window: Window | None = None
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
        self._process_ranks = process_ranks
        self._splits = 0
        process_ranks.add(self)

    def _process_ranks_on_device(self, device: int) -> int:
        """How many live ranks of this communicator that this process created use CUDA device
        ``device`` (for ``symm.triton``'s co-residency check): the ranks of one
        :meth:`init_all`, or every ``Comm(nranks, uid, rank)`` of the same ``uid`` (one per
        thread). Ranks in other processes are not counted, even on the same GPU: their devices
        are not known here."""
        return self._process_ranks.on_device(device)

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
        """Destroy this rank (``symmCommDestroy``): frees its windows and buffers, after the
        collectives queued on its windows (on any stream) are done; a collective captured into
        a CUDA graph runs when the graph is launched: synchronize that first.

        Raises:
            InvalidUsageError: destroyed already, or calls of it are queued in an open group.
        """
        with self._state_lock:
            check(lib.symmCommDestroy(self.handle))
            self._forget_handle()

    def abort(self) -> None:
        """Abort this rank (``symmCommAbort``): the communicator fails on every rank, naming
        this rank's abort (every rank's pending collectives end promptly, later calls raise),
        and this rank's windows and buffers are freed as by :meth:`destroy`. May be called from
        another thread while a collective of this rank waits for a peer that hangs: that call
        raises first.

        Raises:
            InvalidUsageError: destroyed already, or calls of it are queued in this thread's
                open group.
        """
        check(lib.symmCommAbort(self.handle))
        with self._state_lock:
            self._forget_handle()

    def revoke(self) -> None:
        """Revoke this communicator (``symmCommRevoke``): its work stops on every rank and its
        later collectives raise (:class:`InvalidUsageError` here, :class:`RemoteError` on a peer
        until it revokes too); :meth:`split` (the way to continue) and teardown remain. Returns
        once this rank's work has ended; may be called from another thread while a collective
        of this rank waits."""
        check(lib.symmCommRevoke(self.handle, 0))

    def split(self, color: int | None, key: int = 0, *, min_ctas: int | None = None, max_ctas: int | None = None) -> Comm | None:
        """Split this communicator (``symmCommSplit``; every rank calls it, one thread per
        rank): the ranks that pass one ``color`` form a new communicator, ranked by ``key``
        (ties by their rank here). Ranks driven by one thread split with :meth:`split_all`.

        Args:
            color: a non-negative color, or ``None`` (or :data:`SPLIT_NOCOLOR`) to join no new
                communicator.
            key: this rank's place in the new communicator, relative to the other keys.
            min_ctas: fewest blocks per rank of the new communicator's kernels (``minCTAs``;
                default: this communicator's).
            max_ctas: most blocks per rank (``maxCTAs``; default: this communicator's).

        Returns:
            This rank of the new communicator, or ``None`` for no color.

        Raises:
            InvalidArgumentError: a bad color, key or bound (the library refuses it, so the
                other ranks' calls fail at once too, naming this rank).
            SymmTimeoutError: a rank did not call it in time.
        """
        _refuse_in_group("Comm.split")
        color_value, key, config = _split_arguments(color, key, min_ctas, max_ctas)
        handle = ctypes.c_void_p()
        check(lib.symmCommSplit(self.handle, color_value, key, ctypes.byref(handle), config))
        if not handle.value:
            return None
        return self._adopt_split(handle.value, color_value)

    def shrink(self, exclude: Sequence[int], *, abort: bool = False, min_ctas: int | None = None, max_ctas: int | None = None) -> Comm:
        """Shrink this communicator to the ranks not in ``exclude`` (``symmCommShrink``): only
        those ranks call it, each with the same list, one thread per rank. The new ranks
        follow this communicator's order. This rank's buffers from :meth:`alloc` move to the
        new communicator: register them, their data kept, there. It does not need this
        communicator's bootstrap root (whose process may be the one lost).

        Args:
            exclude: the ranks left out (a lost rank's).
            abort: revoke this communicator first (``SYMM_SHRINK_ABORT``): its in-flight work
                ends on every rank, as after a failure.
            min_ctas: fewest blocks per rank (default: this communicator's).
            max_ctas: most blocks per rank (default: this communicator's).

        Returns:
            This rank of the new communicator.
        """
        _refuse_in_group("Comm.shrink")
        ranks = [_as_int(r, "exclude rank", -_INT_MAX - 1, _INT_MAX) for r in exclude]
        _, _, config = _split_arguments(0, 0, min_ctas, max_ctas)
        handle = ctypes.c_void_p()
        array = (ctypes.c_int * max(len(ranks), 1))(*ranks)
        check(lib.symmCommShrink(self.handle, array, len(ranks), ctypes.byref(handle), config, 1 if abort else 0))
        child = self._adopt_split(handle.value, -2)
        # The buffers' memory now belongs to the new communicator.
        with self._state_lock:
            buffers = list(self._buffers)
        for buffer in buffers:
            buffer._move_to(child)
        return child

    @classmethod
    def split_all(
        cls,
        comms: Sequence[Comm],
        colors: Sequence[int | None],
        keys: Sequence[int] | None = None,
        *,
        min_ctas: int | None = None,
        max_ctas: int | None = None,
    ) -> list[Comm | None]:
        """Split several ranks that this thread drives (``symmCommSplit`` for each, in one
        group): ``colors[i]`` and ``keys[i]`` (default 0) for ``comms[i]``, as in :meth:`split`.

        Returns:
            The new ranks (``None`` for no color), in the order of ``comms``.
        """
        _refuse_in_group("Comm.split_all")
        keys = [0] * len(comms) if keys is None else list(keys)
        if len(colors) != len(comms) or len(keys) != len(comms):
            raise InvalidArgumentError(f"{len(comms)} comms, {len(colors)} colors and {len(keys)} keys: one of each per comm")
        # Every handle first: a destroyed one raises before the group starts.
        parents = []
        for index, comm in enumerate(comms):
            if comm.destroyed:
                raise InvalidUsageError(f"comms[{index}] (rank {comm.rank}) was destroyed")
            parents.append(comm.handle)
        arguments = [_split_arguments(c, k, min_ctas, max_ctas) for c, k in zip(colors, keys)]
        handles = [ctypes.c_void_p() for _ in comms]
        # Every rank's call is made, also after one is refused (the refusal then reaches the
        # others at the group's end instead of leaving them waiting); the first refusal raises.
        refusal: SymmError | None = None
        with group():
            for parent, (color, key, config), handle in zip(parents, arguments, handles):
                try:
                    check(lib.symmCommSplit(parent, color, key, ctypes.byref(handle), config))
                except SymmError as error:
                    refusal = refusal or error
        if refusal is not None:
            raise refusal
        return [
            comm._adopt_split(handle.value, color) if handle.value else None
            for comm, (color, _, _), handle in zip(comms, arguments, handles)
        ]

    def _adopt_split(self, handle: int, color: int) -> Comm:
        """The new rank ``handle`` of this rank's split of color ``color``: the ranks of one
        split of one color in this process share their :class:`_ProcessRanks`."""
        with _RANKS_BY_UNIQUE_ID_LOCK:
            self._splits += 1
            key = (id(self._process_ranks), self._splits, color)
            ranks = _RANKS_BY_SPLIT.get(key)
            if ranks is None:
                ranks = _RANKS_BY_SPLIT[key] = _ProcessRanks()
        comm = Comm.__new__(Comm)
        comm._adopt(handle, ranks)
        return comm

    def finalize(self) -> None:
        """Finalize this rank (``symmCommFinalize``): wait until its collectives are done, then
        refuse later collectives and registrations; :meth:`destroy` frees it.

        Raises:
            SymmError: the communicator failed (here or on another rank).
        """
        check(lib.symmCommFinalize(self.handle))

    def _forget_handle(self) -> None:
        """After the library freed this rank: invalidate it, its windows and its buffers (the
        caller holds the state lock)."""
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

    def alloc(self, size: int, dtype: DTypeLike | None = None) -> Buffer:
        """Allocate memory usable in a symmetric window (``symmMemAlloc``): device memory on the
        cuda backend, host memory on the host backend.

        Args:
            size: elements of ``dtype``; without a ``dtype``, bytes.
            dtype: the element type: the buffer is then an array of ``size`` elements
                (``np.asarray(buf)``, ``buf.numpy()``, ``torch.as_tensor(buf)`` are typed, and a
                collective given it infers its ``dtype`` and refuses another). Without one, the
                buffer is raw bytes, usable as any type.
        """
        size = _as_int(size, "size")
        element = None if dtype is None else resolve_dtype(dtype)
        nbytes = size if element is None else size * dtype_size(element)
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

    @property
    def signal_pad_bytes(self) -> int:
        """Bytes of the signal pad each rank's window needs (``symmWindowSignalPadBytes``):
        what :meth:`register_peers` takes as ``pad_bytes`` at least."""
        value = ctypes.c_size_t()
        check(lib.symmWindowSignalPadBytes(self.handle, ctypes.byref(value)))
        return value.value

    def register_peers(
        self,
        base: int,
        nbytes: int,
        peer_bases: Sequence[int],
        peer_pads: Sequence[int],
        pad_bytes: int,
        *,
        owner: str = "user",
        owner_offset: int = 0,
        keep: Any = None,
    ) -> Window:
        """Register memory another library owns as a window (``symmCommWindowRegisterPeers``):
        the owner mapped every rank's bytes and signal pad into this process, and symm's
        collectives and device functions run on them as on its own windows. Collective, as
        :meth:`register`. :func:`symm.torch.adopt` does this for PyTorch's symmetric tensors.

        Args:
            base: this rank's bytes (16-byte aligned; ``peer_bases[rank]``).
            nbytes: bytes of the window, the same on every rank.
            peer_bases: every rank's bytes, as this process addresses them (none 0: every peer
                must be reachable by loads and stores).
            peer_pads: every rank's signal pad, as this process addresses it: memory of the
                same owner that nothing else uses (never PyTorch's own signal pads), 16-byte
                aligned; each rank's registration zeroes its own.
            pad_bytes: bytes of each pad, at least :attr:`signal_pad_bytes`.
            owner: ``"user"``, ``"torch"``, ``"nccl"`` or ``"nvshmem"`` (named in messages; the
                same on every rank).
            owner_offset: where ``base`` lies in the owner's symmetric allocation, the same on
                every rank (the registration refuses ranks that differ).
            keep: objects the window keeps alive while registered (the owner's handles and
                tensors): the owner's memory must outlive the window.

        Raises:
            InvalidArgumentError: a bad table, a peer out of reach, pads too small, misaligned
                or overlapping the window, or ranks whose descriptions differ (on every rank).
        """
        n = self.nranks
        if owner not in OWNER_NAMES:
            raise InvalidArgumentError(f"owner {owner!r} is not one of {sorted(OWNER_NAMES)}")
        bases = [_as_int(b, "peer_bases[i]", 0, _UINT64_MAX) for b in peer_bases]
        pads = [_as_int(p, "peer_pads[i]", 0, _UINT64_MAX) for p in peer_pads]
        if len(bases) != n or len(pads) != n:
            raise InvalidArgumentError(
                f"peer_bases has {len(bases)} and peer_pads {len(pads)} entries: the communicator has {n} ranks"
            )
        desc = PeerWindowStruct(
            size=ctypes.sizeof(PeerWindowStruct),
            magic=DEFINES["SYMM_PEER_WINDOW_MAGIC"],
            version=DEFINES["SYMM_VERSION_CODE"],
            owner=int(OWNER_NAMES[owner]),
            buff=_as_int(base, "base", 0, _UINT64_MAX),
            bytes=_as_int(nbytes, "nbytes", 0, _UINT64_MAX),
            ownerOffset=_as_int(owner_offset, "owner_offset", 0, _UINT64_MAX),
            peerBuffs=(ctypes.c_void_p * n)(*bases),
            peerSignalPads=(ctypes.c_void_p * n)(*pads),
            signalPadBytes=_as_int(pad_bytes, "pad_bytes", 0, _UINT64_MAX),
        )
        handle = ctypes.c_void_p()
        with self._state_lock:
            check(lib.symmCommWindowRegisterPeers(self.handle, ctypes.byref(desc), ctypes.byref(handle)))
            window = Window(self, handle.value or 0, base, nbytes, None, keep=keep)
            self._windows.add(window)
        return window

    def register_nvshmem(self, address: int, nbytes: int, *, keep: Any = None) -> Window:
        """Register ``nbytes`` bytes at ``address``, a symmetric address of NVSHMEM's heap
        (``nvshmem_malloc``), as a window (``symmCommWindowRegisterNvshmem``), in a job whose
        PE ``r`` is this communicator's rank ``r``, NVSHMEM initialized. Collective over the
        job: every rank calls it from its own process, outside a group (the window's signal
        pads are an ``nvshmem_malloc`` allocation, freed when the window is deregistered).

        When every PE is reachable by loads and stores the window is like any other. When some
        rank has a PE NVSHMEM gives no address for (another machine), it is an NVSHMEM engine
        window on every rank: symm's collectives refuse it, and :mod:`symm.triton`'s device
        functions run on it in kernels compiled with ``engines=("nvshmem",)``, reaching every
        peer through NVSHMEM.

        Raises:
            InvalidArgumentError: a NULL address, 0 bytes, PEs that are not the ranks.
            InvalidUsageError: NVSHMEM not initialized, or a call inside a group.
        """
        handle = ctypes.c_void_p()
        address = _as_int(address, "address", 0, _UINT64_MAX)
        nbytes = _as_int(nbytes, "nbytes", 0, _UINT64_MAX)
        with self._state_lock:
            check(lib.symmCommWindowRegisterNvshmem(self.handle, address, nbytes, ctypes.byref(handle)))
            window = Window(self, handle.value or 0, address, nbytes, None, keep=keep)
            self._windows.add(window)
        return window

    def _forget_window(self, window: Window) -> None:
        self._windows.discard(window)

    # -- collectives --------------------------------------------------------------------------

    def all_reduce(
        self,
        send: BufferLike,
        recv: BufferLike | None = None,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        op: OpLike = "sum",
        stream: StreamLike = None,
    ) -> None:
        """All-reduce ``count`` elements of ``send`` into ``recv`` on every rank
        (``symmAllReduce``; in place when ``recv`` is None or the same address). Both inside
        registered windows, at the same offsets on every rank.

        ``count`` and ``dtype`` default to what the arrays say (see :data:`BufferLike`; a
        :class:`Buffer` allocated with a dtype counts as an array); given, they must agree with
        them. ``stream=None``: PyTorch's current stream for CUDA tensors, else the default
        stream.

        Raises:
            InvalidArgumentError: a ``dtype`` or ``count`` that disagrees with an array, or
                memory the library refuses (the message names it).
        """
        recv = send if recv is None else recv
        with self._checking("symmAllReduce"):
            code = resolve_op(op)
        self._collective(lib.symmAllReduce, send, recv, count, dtype, 1, 1, stream, code)

    def reduce(
        self,
        send: BufferLike,
        recv: BufferLike | None = None,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        op: OpLike = "sum",
        root: int = 0,
        stream: StreamLike = None,
    ) -> None:
        """Reduce (``symmReduce``): the reduction of every rank's ``count`` elements of ``send``
        lands in rank ``root``'s ``recv`` (in place when ``recv`` is None or the same address).
        ``send`` lies at the same offset on every rank; ``recv`` is used on the root only
        (elsewhere it is ignored and may be None). Data types and operators as
        :meth:`all_reduce`'s; ``count`` and ``dtype`` default to what the arrays say."""
        with self._checking("symmReduce"):
            root = _as_int(root, "root", 0, self.nranks - 1)
            code = resolve_op(op)
        if self.rank != root or recv is None:
            # Off the root recv is not used (as in NCCL): neither checked nor passed.
            used = self.rank == root
            self._collective(lib.symmReduce, send, send, count, dtype, 1, 1, stream, code, recv_used=used, root=root)
        else:
            self._collective(lib.symmReduce, send, recv, count, dtype, 1, 1, stream, code, root=root)

    def all_gather(
        self,
        send: BufferLike,
        recv: BufferLike,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        stream: StreamLike = None,
    ) -> None:
        """All-gather (``symmAllGather``): rank ``r``'s ``count`` elements of ``send`` land at
        element ``r * count`` of every rank's ``recv`` (``nranks * count`` elements).
        ``count`` and ``dtype`` default to what the arrays say (as for :meth:`all_reduce`)."""
        self._collective(lib.symmAllGather, send, recv, count, dtype, 1, self.nranks, stream)

    def reduce_scatter(
        self,
        send: BufferLike,
        recv: BufferLike,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        op: OpLike = "sum",
        stream: StreamLike = None,
    ) -> None:
        """Reduce-scatter (``symmReduceScatter``): rank ``r``'s ``recv`` gets, in ``count``
        elements, the reduction of segment ``r`` of every rank's ``send`` (``nranks * count``
        elements). ``count`` and ``dtype`` default to what the arrays say (as for
        :meth:`all_reduce`)."""
        with self._checking("symmReduceScatter"):
            code = resolve_op(op)
        self._collective(lib.symmReduceScatter, send, recv, count, dtype, self.nranks, 1, stream, code)

    def broadcast(
        self,
        send: BufferLike,
        recv: BufferLike | None = None,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        root: int = 0,
        stream: StreamLike = None,
    ) -> None:
        """Broadcast (``symmBroadcast``): rank ``root``'s ``count`` elements of ``send`` land in
        every rank's ``recv`` (in place when ``recv`` is None or the same address; the other
        ranks' ``send`` is not read). ``count`` and ``dtype`` default to what the arrays say (as
        for :meth:`all_reduce`)."""
        with self._checking("symmBroadcast"):
            root = _as_int(root, "root", 0, self.nranks - 1)
        recv = send if recv is None else recv
        self._collective(lib.symmBroadcast, send, recv, count, dtype, 1, 1, stream, root)

    def all_to_all(
        self,
        send: BufferLike,
        recv: BufferLike,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        stream: StreamLike = None,
    ) -> None:
        """All-to-all (``symmAlltoAll``): segment ``p`` of every rank's ``send`` (``count``
        elements at element ``p * count``) lands at element ``r * count`` of rank ``p``'s
        ``recv``, ``r`` being the sender. Both hold ``nranks * count`` elements and must not
        overlap; ``recv`` lies at the same offset on every rank. ``count`` (per peer) and
        ``dtype`` default to what the arrays say (as for :meth:`all_reduce`)."""
        self._collective(lib.symmAlltoAll, send, recv, count, dtype, self.nranks, self.nranks, stream)

    def all_to_all_v(
        self,
        send: BufferLike,
        recv: BufferLike,
        counts: BufferLike,
        send_count: int | None = None,
        recv_count: int | None = None,
        dtype: DTypeLike | None = None,
        stream: StreamLike = None,
    ) -> None:
        """All-to-all-v with the counts in device memory (``symmAlltoAllvDevice``; PyTorch
        SymmMem's ``all_to_all_vdev``): no host synchronization. ``counts`` holds ``3 * nranks``
        int64: row 0, written before the call (by a kernel on the stream, say), the elements
        this rank sends to each rank, its segments packed in rank order in ``send``; the call
        writes row 1 (the elements received from each rank) and row 2 (where each rank's
        segment starts in ``recv``, in elements).

        ``send_count`` and ``recv_count`` are the capacities of ``send`` and ``recv`` in elements,
        the same on every rank (default: what the arrays say): counts beyond them are refused on
        every rank before anything is copied, and the communicator fails with that cause.
        ``recv`` and ``counts`` lie in windows (one or two), each at the same offset of the
        same window on every rank."""
        with self._checking("symmAlltoAllvDevice"):
            send_operand = self._operand(send, "send")
            recv_operand = self._operand(recv, "recv")
            table = self._operand(counts, "counts")
            if send_count is not None:
                send_count = _as_int(send_count, "send_count")
            if recv_count is not None:
                recv_count = _as_int(recv_count, "recv_count")
            send_count, element = resolve_call(send_operand, send_operand, send_count, dtype, 1, 1)
            recv_count, recv_element = resolve_call(recv_operand, recv_operand, recv_count, dtype, 1, 1)
            if recv_element != element:
                raise InvalidArgumentError(f"send is {send_operand.kind} but recv is {recv_operand.kind}: their element types differ")
            needed = 3 * self.nranks * 8
            if table.dtype is not None and table.dtype.removeprefix("torch.") != "int64":
                raise InvalidArgumentError(f"counts is {table.kind}: want 3 x {self.nranks} int64")
            if table.nbytes is not None and table.nbytes < needed:
                raise InvalidArgumentError(
                    f"counts holds {table.nbytes} bytes ({table.kind}): want 3 x {self.nranks} int64 ({needed} bytes)"
                )
        if stream is None:
            stream_handle = torch_stream([send_operand, recv_operand, table]) or 0
        else:
            stream_handle = resolve_stream(stream)
        check(
            lib.symmAlltoAllvDevice(
                send_operand.ptr, send_count, recv_operand.ptr, recv_count, table.ptr, element, self.handle, stream_handle
            )
        )

    def gather(
        self,
        send: BufferLike,
        recv: BufferLike | None = None,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        root: int = 0,
        stream: StreamLike = None,
    ) -> None:
        """Gather (``symmGather``): every rank's ``count`` elements of ``send`` land on rank
        ``root``, rank ``r``'s at element ``r * count`` of its ``recv`` (``nranks * count``
        elements; in place when ``send`` is the root's own segment of it). ``send`` lies at the
        same offset on every rank; ``recv`` is used on the root only (elsewhere it is ignored and
        may be None).
        ``count`` and ``dtype`` default to what the arrays say (as for :meth:`all_reduce`)."""
        with self._checking("symmGather"):
            root = _as_int(root, "root", 0, self.nranks - 1)
            if self.rank == root and recv is None:
                raise InvalidArgumentError("recv is required on the root of a gather")
        if self.rank != root:
            # Not the root: recv is not used (as in NCCL), so it is neither checked nor passed.
            self._collective(lib.symmGather, send, send, count, dtype, 1, 1, stream, root, recv_used=False)
        else:
            self._collective(lib.symmGather, send, recv, count, dtype, 1, self.nranks, stream, root)

    def scatter(
        self,
        send: BufferLike | None,
        recv: BufferLike,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        root: int = 0,
        stream: StreamLike = None,
    ) -> None:
        """Scatter (``symmScatter``): the ``count`` elements at element ``r * count`` of rank
        ``root``'s ``send`` (``nranks * count`` elements) land in rank ``r``'s ``recv`` (in
        place when ``recv`` is the root's own segment of ``send``). ``recv`` lies at the same
        offset on every rank; ``send`` is used on the root only (elsewhere it is ignored and may
        be None). ``count``
        and ``dtype`` default to what the arrays say (as for :meth:`all_reduce`)."""
        with self._checking("symmScatter"):
            root = _as_int(root, "root", 0, self.nranks - 1)
            if self.rank == root and send is None:
                raise InvalidArgumentError("send is required on the root of a scatter")
        if self.rank != root:
            # Not the root: send is not used (as in NCCL), so it is neither checked nor passed.
            self._collective(lib.symmScatter, recv, recv, count, dtype, 1, 1, stream, root, send_used=False)
        else:
            self._collective(lib.symmScatter, send, recv, count, dtype, self.nranks, 1, stream, root)

    def barrier(self, stream: StreamLike = None) -> None:
        """Wait until every rank reached its barrier: an all-reduce of one integer in a small
        window that the first barrier registers (collectively, like every registration).
        Stream-ordered on the cuda backend (synchronize the stream to wait on the host); one
        thread driving several ranks calls it inside :func:`group`."""
        window = self._barrier_window
        if window is None:
            buffer = self.alloc(4, "int32")
            window = self.register(buffer)
            self._barrier_window = window
        self.all_reduce(window, window, 1, "int32", "sum", stream)

    def send(
        self,
        buffer: BufferLike,
        peer: int,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        stream: StreamLike = None,
    ) -> None:
        """Send (``symmSend``) ``count`` elements of ``buffer`` to rank ``peer``: pairs with
        ``peer``'s next :meth:`recv` from this rank, which must name the same count and data
        type (else both fail). ``buffer`` lies in a window of this communicator, at any offset,
        or outside every window: it then streams through a ring in the communicator's staging
        window, whatever its size (on the cuda backend it must be memory the GPU reaches:
        device memory, or pinned host memory; pageable host memory is refused).
        Inside :func:`group`, a rank's sends and receives run in one launch, so ranks may send
        to each other in any order (``batch_isend_irecv``); outside one, two ranks that both
        send first wait for each other until the timeout, as in NCCL. ``count`` and ``dtype``
        default to what the array says."""
        self._peer_call(lib.symmSend, buffer, "buffer", peer, count, dtype, stream)

    def recv(
        self,
        buffer: BufferLike,
        peer: int,
        count: int | None = None,
        dtype: DTypeLike | None = None,
        stream: StreamLike = None,
    ) -> None:
        """Receive (``symmRecv``) ``count`` elements from rank ``peer`` into ``buffer`` (in a
        window of this communicator, at any offset, or outside every window, written in place;
        on the cuda backend memory the GPU reaches): pairs with ``peer``'s next :meth:`send` to
        this rank (see there). ``count`` and ``dtype`` default to what the array says."""
        self._peer_call(lib.symmRecv, buffer, "buffer", peer, count, dtype, stream)

    def _peer_call(
        self,
        function: Any,
        buffer: BufferLike,
        name: str,
        peer: int,
        count: int | None,
        dtype: DTypeLike | None,
        stream: StreamLike,
    ) -> None:
        peer = _as_int(peer, "peer", 0, self.nranks - 1)
        try:
            operand = self._operand(buffer, name)
            if count is not None:
                count = _as_int(count, "count")
            if function is lib.symmRecv:
                refuse_readonly(operand, name)
            count, element = resolve_call(operand, operand, count, dtype, 1, 1, (name, name))
        except InvalidArgumentError:
            # The peer's matching call would wait for this one: make it with a NULL buffer, so
            # that the library refuses it as this rank's call to `peer`, which fails the
            # communicator on every rank at once, naming it.
            self._refused_call(function, [None, 1, DataType.symmInt8, peer], stream)
            raise
        if stream is None:
            stream_handle = torch_stream([operand]) or 0
        else:
            stream_handle = resolve_stream(stream)
        check(function(operand.ptr, count, element, peer, self.handle, stream_handle))

    def _refused_call(self, function: Any, arguments: list, stream: StreamLike) -> None:
        """Make a call the package refused, with NULL buffers, so that the library refuses it as
        this rank's call (peers whose arguments are right then fail at once, naming it, instead
        of waiting for it until the timeout); its own error is dropped for the package's."""
        try:
            stream_handle = 0 if stream is None else resolve_stream(stream)
        except SymmError:
            stream_handle = 0
        try:
            check(function(*arguments, self.handle, stream_handle))
        except SymmError:
            pass

    @contextmanager
    def _checking(self, call: str) -> Iterator[None]:
        """The package's checks of collective ``call``'s arguments: a refusal is counted as this
        rank's call (:meth:`_refuse_collective`) before it is raised."""
        try:
            yield
        except InvalidArgumentError as error:
            self._refuse_collective(call, str(error))
            raise

    def _refuse_collective(self, call: str, reason: str) -> None:
        """Count the collective ``call`` that the package refused with ``reason`` as this rank's
        call, refused (``symmCallRefused``): peers whose arguments are right then fail at once,
        naming ``reason``, instead of waiting for this rank until the timeout. Its own error is
        dropped for the package's."""
        try:
            check(lib.symmCallRefused(call.encode(), reason.encode(), self.handle))
        except SymmError:
            pass

    def _collective(
        self,
        function: Any,
        send: BufferLike,
        recv: BufferLike,
        count: int | None,
        dtype: DTypeLike | None,
        send_ratio: int,
        recv_ratio: int,
        stream: StreamLike,
        op_or_root: Any = None,
        send_used: bool = True,
        recv_used: bool = True,
        root: int | None = None,
    ) -> None:
        with self._checking(function.__name__):
            send_operand = self._operand(send, "send")
            recv_operand = self._operand(recv, "recv")
            if count is not None:
                count = _as_int(count, "count")
            if recv_used:
                refuse_readonly(recv_operand, "recv")
            count, element = resolve_call(send_operand, recv_operand, count, dtype, send_ratio, recv_ratio)
            if stream is None:
                stream_handle = torch_stream([send_operand, recv_operand]) or 0
            else:
                stream_handle = resolve_stream(stream)
        handle = self.handle
        # A buffer the call does not use on this rank (a gather's recv, a scatter's send off the
        # root) goes to the library as NULL; the other operand stood in for it above.
        arguments = [send_operand.ptr if send_used else None, recv_operand.ptr if recv_used else None, count, element]
        if op_or_root is not None:
            arguments.append(op_or_root)
        if root is not None:
            arguments.append(root)
        check(function(*arguments, handle, stream_handle))

    def _operand(self, buffer: BufferLike, name: str) -> Operand:
        """``buffer`` described, refused when its memory is the other backend's."""
        operand = describe(buffer, name)
        memory = "cpu" if self.backend == "host" else "cuda"
        if operand.device is not None and operand.device != memory:
            needs = "device memory" if memory == "cuda" else "host memory"
            raise InvalidArgumentError(
                f"{name} is {operand.kind} ({'host' if operand.device == 'cpu' else 'device'} memory); "
                f"the {self.backend} backend needs {needs} from alloc()"
            )
        return operand

    def _address(self, buffer: BufferLike, name: str) -> tuple[int, int | None]:
        """The address of a :data:`BufferLike` and its size in bytes when known."""
        operand = self._operand(buffer, name)
        return operand.ptr, operand.nbytes


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

    def _symm_operand(self) -> Operand:
        self.buffer._check_live()
        return symm_operand(self.ptr, self.count * dtype_size(self.dtype), self.dtype, "CudaArrayView", typed_view=True)

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

    def __init__(self, comm: Comm, ptr: int, nbytes: int, dtype: DataType | None) -> None:  # type: ignore[valid-type]
        self.comm = comm
        """The communicator the memory belongs to."""
        self.ptr = ptr
        """Address of the first byte."""
        self.nbytes = nbytes
        """Size in bytes."""
        self.dtype = dtype
        """Element type (``alloc``'s ``dtype``), or None for raw bytes."""
        self._dead: str | None = None
        self._finalizer = weakref.finalize(self, _free_memory, comm.handle, comm._alive, ptr)

    def _check_live(self) -> None:
        if self._dead is not None:
            raise InvalidUsageError(f"the buffer at {self.ptr:#x} is gone: {self._dead}")

    def _symm_operand(self) -> Operand:
        self._check_live()
        return symm_operand(self.ptr, self.nbytes, self.dtype, "Buffer")

    def _invalidate(self, reason: str) -> None:
        self._finalizer.detach()
        self._dead = reason

    def _move_to(self, comm: Comm) -> None:
        """The memory now belongs to ``comm`` (a shrink moved it): freed there."""
        if self._dead is not None:
            return
        self._finalizer.detach()
        with self.comm._state_lock:
            self.comm._buffers.discard(self)
        self.comm = comm
        self._finalizer = weakref.finalize(self, _free_memory, comm.handle, comm._alive, self.ptr)
        with comm._state_lock:
            comm._buffers.add(self)

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
        what = f"{self.count} x {self.dtype.name[4:].lower()}, " if self.dtype is not None else ""  # type: ignore[attr-defined]
        return f"<symm.Buffer {what}{self.nbytes} bytes at {self.ptr:#x} on rank {self.comm.rank}{state}>"

    @property
    def count(self) -> int:
        """Number of elements (of ``dtype``; bytes for a raw buffer)."""
        return self.nbytes // (1 if self.dtype is None else dtype_size(self.dtype))

    def __len__(self) -> int:
        return self.count

    def _default_dtype(self, dtype: DTypeLike | None) -> DTypeLike:
        if dtype is not None:
            return dtype
        return "uint8" if self.dtype is None else self.dtype

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

    def numpy(self, dtype: DTypeLike | None = None, count: int | None = None, offset: int = 0) -> np.ndarray:
        """A NumPy array over the buffer's memory, without a copy (host backend only).
        ``np.asarray(buf)`` is the same array of the whole buffer.

        Args:
            dtype: element type; default: the buffer's (``uint8`` for a raw buffer). bfloat16
                and float8 are viewed as their bit patterns, see :func:`symm.numpy_dtype`.
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
        element, count = self._element_range(self._default_dtype(dtype), count, offset)
        if count == 0:
            return np.empty(0, dtype=element)
        raw = (ctypes.c_char * (count * element.itemsize)).from_address(self.ptr + offset)
        raw._symm_buffer = self  # type: ignore[attr-defined]  # the array's base keeps the buffer alive
        return np.frombuffer(raw, dtype=element)  # type: ignore[call-overload]

    def view(self, dtype: DTypeLike | None = None, count: int | None = None, offset: int = 0) -> CudaArrayView:
        """A typed :class:`CudaArrayView` of the buffer (default: the buffer's type, ``uint8``
        for a raw buffer), e.g. ``torch.as_tensor(buf.view("float32", 1024), device="cuda")``:
        a collective given the view uses exactly its elements."""
        element = resolve_dtype(self._default_dtype(dtype))
        _, count = self._element_range(element, count, offset)
        return CudaArrayView(self, element, count, offset)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3) of the whole buffer as its dtype (``uint8``
        for a raw buffer). Only on the cuda backend (absent on the host backend, whose memory
        is not device memory)."""
        if self.comm.backend != "cuda":
            raise AttributeError("__cuda_array_interface__ is only offered on the cuda backend")
        return self.view().__cuda_array_interface__

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """The NumPy array interface (version 3) of the whole buffer as its dtype (``uint8``
        for a raw buffer), so that ``np.asarray(buf)`` is a typed array over its memory. Only
        on the host backend."""
        if self.comm.backend != "host":
            raise AttributeError("__array_interface__ is only offered on the host backend (host memory)")
        self._check_live()
        element = numpy_dtype(self._default_dtype(None))
        return {
            "version": 3,
            "shape": (self.nbytes // element.itemsize,),
            "typestr": element.str,
            "data": (self.ptr, False),
            "strides": None,
        }


class Window:
    """A registered window (``symmCommWindowRegister``). A context manager: ``with``
    deregisters it on exit."""

    def __init__(self, comm: Comm, handle: int, base: int, nbytes: int, buffer: Buffer | None, keep: Any = None) -> None:
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
        self.owner_objects = keep
        """What :meth:`Comm.register_peers` was asked to keep alive (another owner's handles
        and tensors), released once the window is deregistered."""
        self._dead: str | None = None
        self._device_context: int | None = None

    def _check_live(self) -> None:
        if self._dead is not None:
            raise InvalidUsageError(f"the window at {self.base:#x} is gone: {self._dead}")

    def _symm_operand(self) -> Operand:
        self._check_live()
        buffer = self.buffer
        typed = buffer is not None and buffer.dtype is not None and self.base == buffer.ptr
        return symm_operand(self.base, self.nbytes, buffer.dtype if typed else None, "Window")  # type: ignore[union-attr]

    def _invalidate(self, reason: str) -> None:
        self._dead = reason
        if self._device_context and _WINDOWS_BY_DEVICE_CONTEXT.get(self._device_context) is self:
            del _WINDOWS_BY_DEVICE_CONTEXT[self._device_context]

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
            if self._device_context:
                _WINDOWS_BY_DEVICE_CONTEXT[self._device_context] = self
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
        """Deregister the window (``symmCommWindowDeregister``), once the collectives queued on
        it (on any stream) are done; a collective captured into a CUDA graph runs when the graph
        is launched: synchronize that first.

        Raises:
            InvalidUsageError: deregistered already, or its communicator was destroyed.
        """
        comm = self.comm
        with comm._state_lock:
            self._check_live()
            check(lib.symmCommWindowDeregister(comm.handle, self.handle))
            self._invalidate("it was deregistered")
            comm._forget_window(self)
            self.owner_objects = None

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
    _GROUP.depth = getattr(_GROUP, "depth", 0) + 1
    try:
        yield
    except BaseException as error:
        _GROUP.depth -= 1
        result = lib.symmGroupEnd()
        if result != Result["symmSuccess"]:
            error.add_note(f"symmGroupEnd then failed too: {make_error(result, _lib.last_error(None))}")
        raise
    _GROUP.depth -= 1
    check(lib.symmGroupEnd())


#: This thread's depth of :func:`group` blocks.
_GROUP = threading.local()


def _refuse_in_group(what: str) -> None:
    """Refuse a call whose result the library gives only at the group's end."""
    if getattr(_GROUP, "depth", 0) > 0:
        raise InvalidUsageError(
            f"{what} inside symm.group(): its new communicator exists only at the group's end; "
            "use Comm.split_all, or call it outside the group"
        )
