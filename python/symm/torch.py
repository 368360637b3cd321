"""A ``torch.distributed`` backend named ``"symm"``.

``import symm.torch`` registers it; then, under ``torchrun`` (or with ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` set)::

    import torch.distributed as dist
    import symm.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("symm")
    dist.all_reduce(tensor)                      # every ReduceOp symm has: SUM, PRODUCT, MIN, MAX, AVG
    dist.all_gather_into_tensor(output, tensor)
    dist.reduce_scatter_tensor(output, tensors)
    dist.broadcast(tensor, src=0)
    dist.reduce(tensor, dst=0)                 # every ReduceOp above; the result on dst only
    dist.gather(tensor, parts, dst=0)          # parts: a list of world-size tensors on the root
    dist.scatter(output, parts, src=0)
    dist.all_to_all_single(output, tensor)     # split sizes too
    dist.barrier()

    dist.send(tensor, dst=1); dist.recv(tensor, src=0)   # isend/irecv, batch_isend_irecv too

Sends and receives pair in call order per pair of ranks, as in NCCL (tags are not matched;
``recv`` from any source raises symm's ``UnsupportedError``). They are queued and run when a
work object is waited for (``dist.send``/``recv`` wait at once) or before the group's next
collective: every queued operation in one launch, so the sends and receives of one
``batch_isend_irecv`` may go in any order between the ranks.

Each process group is one symm communicator. Its unique id travels through the group's store
(rank 0 makes it; when ``MASTER_ADDR`` names another host than this one's loopback, the root
listens on ``MASTER_ADDR``, as torchrun's store does). A collective on tensors that do not lie
in a registered window of the group is passed to the library as it is, which stages it through
its communicator's staging window (``SYMM_STAGING_BYTES``): copied in, run there, copied out —
correct for any tensor, slower than a tensor already in a window, which the collective uses in
place (the window path); ``all_to_all_vdev`` likewise (staged whole). A group's communicator
makes its staging window 32 MiB when ``SYMM_STAGING_BYTES`` is unset, so that large staged
collectives run in few chunks. Sends and receives of such tensors need no copy on the host: the
library's kernel sends them through a ring in the staging window, of any size, and receives
into them in place. ``SYMM_DEBUG=INFO`` says which path each kind of call took the first time,
``SYMM_DEBUG=TRACE`` every time.

CPU tensors run on the host backend, CUDA tensors on the cuda backend, on PyTorch's current
stream. Calls complete before they return (stream-ordered on a GPU): ``async_op=True`` returns
a completed work object, and ``wait()`` returns at once.

Tensors in windows, as ``torch.distributed._symmetric_memory`` offers them::

    pool = symm.torch.mem_pool(group)          # a torch.cuda.MemPool over symmMemAlloc
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(n, device="cuda")      # or t = symm.torch.empty(n) (any backend)
    handle = symm.torch.rendezvous(t, group)   # collective: registers the window over t's allocation
    dist.all_reduce(t, group=group)            # in place in the window: no copy
    kernel[grid](handle.device_context, handle.offset, ...)   # symm.triton's ctx, byte_offset

:func:`rendezvous` returns a :class:`SymmetricMemory` handle (window, device context, offset,
rank, world size, every rank's window). On the host backend (no GPU) :func:`empty` makes CPU
tensors over ``comm.alloc`` memory, which rendezvous the same way.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import math
import os
import socket
import struct
import sys
import threading
import weakref
import zlib
from collections import Counter
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from . import _core
from ._convert import resolve_dtype, resolve_op
from ._lib import check, lib
from .errors import InvalidArgumentError, InvalidUsageError, SymmError, UnsupportedError

__all__ = [
    "BACKEND_NAME",
    "STAGING_BYTES",
    "SymmProcessGroup",
    "SymmetricMemory",
    "adopt",
    "all_to_all_vdev",
    "empty",
    "mem_pool",
    "rendezvous",
    "wait_bound_ms",
]

#: The name ``dist.init_process_group`` takes.
BACKEND_NAME = "symm"
#: The staging window of a group's communicator when ``SYMM_STAGING_BYTES`` is unset (the
#: library's default is 4 MiB): a collective on tensors outside windows runs in chunks of it.
STAGING_BYTES = 32 << 20
#: The store key of a group's unique id.
_UID_KEY = "symm/unique_id"


# The C ABI's codes of the torch dtypes and operator names seen so far: each is resolved once, on
# the path from a torch call to the C call.
_DTYPE_CODES: dict[torch.dtype, int] = {}
_OP_CODES: dict[str, int] = {}


# -- logging, in the library's line format ------------------------------------------------------

_LEVELS = {"WARN": 1, "INFO": 2, "TRACE": 3}


def _log_level() -> int:
    return _LEVELS.get(os.environ.get("SYMM_DEBUG", "").strip().upper(), 0)


def _log(rank: int, level: str, message: str) -> None:
    """One line ``host:pid:tid [rank] symm LEVEL torch: message`` on stderr, as the library's."""
    line = f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()} [{rank}] symm {level} torch: {message}\n"
    sys.stderr.write(line)
    sys.stderr.flush()


# -- reduction operators ------------------------------------------------------------------------


def _op_name(op: Any) -> str:
    """symm's name of a ``dist.ReduceOp``."""
    for name, symm_name in (
        ("SUM", "sum"),
        ("PRODUCT", "prod"),
        ("MIN", "min"),
        ("MAX", "max"),
        ("AVG", "avg"),
    ):
        if op == getattr(dist.ReduceOp, name):
            return symm_name
    name = next((n for n in ("BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED") if op == getattr(dist.ReduceOp, n, None)), op)
    raise UnsupportedError(f"ReduceOp {name} is not one symm has (SUM, PRODUCT, MIN, MAX, AVG)")


def _op_of(opts: Any) -> str:
    """symm's operator of a collective's options (``SUM`` without options)."""
    return "sum" if opts is None else _op_name(opts.reduceOp)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s elements as one dimension (a copy when it is not contiguous)."""
    return tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)


class _PeerOp:
    """A queued send or receive of a group (see ``SymmProcessGroup.send``)."""

    def __init__(self, send: bool, tensor: torch.Tensor, peer: int, code: int | None) -> None:
        self.send = send
        self.tensor = tensor
        self.peer = peer
        self.code = code
        """The C ABI's data type, or None: moved as bytes (a dtype symm does not reduce, such as
        ``torch.bool``: both sides of a pair move it alike)."""
        self.done = False
        self.error: SymmError | None = None


class _PeerWork(dist.Work):
    """The work object of a queued send or receive: ``wait()`` runs the group's queue (this
    operation and every one queued with it) and raises the operation's error, if any."""

    def __init__(self, group: SymmProcessGroup, op: _PeerOp) -> None:
        super().__init__()
        self._group = group
        self._op = op

    def _finish(self) -> None:
        if not self._op.done:
            self._group._flush_peer_ops()
        if self._op.error is not None:
            raise self._op.error

    def wait(self, timeout: Any = None) -> bool:
        self._finish()
        return True

    def is_completed(self) -> bool:
        return self._op.done

    def is_success(self) -> bool:
        return self._op.done and self._op.error is None

    def result(self) -> Any:
        self._finish()
        return [self._op.tensor]

    def get_future(self) -> Future:
        future: Future = Future()
        try:
            self._finish()
            future.set_result([self._op.tensor])
        except SymmError as error:
            future.set_exception(error)
        return future


class _CompletedWork(dist.Work):
    """The work object of a call that completed before it returned (every call of this
    backend): ``wait()`` returns at once, ``result()`` gives the call's tensors, as gloo's."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._result = result
        self._future: Future = Future()
        self._future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result

    def get_future(self) -> Future:
        return self._future


def _rows_of_one_tensor(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The one contiguous run of elements that ``parts`` (flat, of one size and type) are the
    consecutive pieces of, in order (the rows of one tensor, ``t.unbind(0)``): a view of all of
    them, which a call may use without a copy; ``None`` when they are not."""
    if not parts or any(not p.is_contiguous() for p in parts):
        return None
    first, n = parts[0], parts[0].numel()
    element = first.element_size()
    for index, part in enumerate(parts):
        if (
            part.dtype != first.dtype
            or part.device != first.device
            or part.numel() != n
            or part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
            or part.data_ptr() != first.data_ptr() + index * n * element
        ):
            return None
    return torch.as_strided(first, (len(parts) * n,), (1,))


def _done(result: Any) -> Any:
    return _CompletedWork(result)


def wait_bound_ms(timeout: timedelta | None) -> int:
    """The bound of every wait on another rank of a process group made with ``timeout``
    (``init_process_group``'s): the timeout, at least 1 ms, or ``SYMM_TIMEOUT_MS`` when that is
    set and shorter. With no timeout, ``SYMM_TIMEOUT_MS`` (default 10 s)."""
    configured = os.environ.get("SYMM_TIMEOUT_MS")
    limit: int | None = None
    if configured is not None:
        try:
            limit = int(configured.strip())
        except ValueError:
            limit = None
        if limit is not None and limit <= 0:
            limit = None
        if limit is None:
            raise InvalidArgumentError(f"SYMM_TIMEOUT_MS={configured!r} is not a positive number of milliseconds")
    if timeout is None:
        return limit if limit is not None else 10_000
    bound = max(1, math.ceil(timeout.total_seconds() * 1000))
    return bound if limit is None else min(bound, limit)


def _bootstrap_address() -> str | None:
    """``SYMM_SOCKET_ADDR`` for rank 0's root when the user set none: ``MASTER_ADDR`` when it
    names an address other ranks can reach (not loopback), resolved to an IP address."""
    if os.environ.get("SYMM_SOCKET_ADDR") or not os.environ.get("MASTER_ADDR"):
        return None
    try:
        address = socket.gethostbyname(os.environ["MASTER_ADDR"])
    except OSError:
        return None
    return None if ipaddress.ip_address(address).is_loopback else address


class SymmProcessGroup(dist.ProcessGroup):
    """A process group whose collectives are one symm communicator's (see the module docs)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        if rank == 0:
            address = _bootstrap_address()
            if address is not None:
                os.environ["SYMM_SOCKET_ADDR"] = address
                try:
                    uid = _core.get_unique_id()
                finally:
                    del os.environ["SYMM_SOCKET_ADDR"]
            else:
                uid = _core.get_unique_id()
            store.set(_UID_KEY, uid.hex())
        else:
            uid = _core.UniqueId.from_hex(store.get(_UID_KEY).decode())
        bound = wait_bound_ms(timeout)
        settings = {"SYMM_TIMEOUT_MS": str(bound)}
        if not os.environ.get("SYMM_STAGING_BYTES"):
            # Collectives on tensors outside windows run in chunks of the staging window.
            settings["SYMM_STAGING_BYTES"] = str(STAGING_BYTES)
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            self.comm = _core.Comm(size, uid, rank)
        finally:
            for name, value in saved.items():
                if value is None:
                    del os.environ[name]
                else:
                    os.environ[name] = value
        self.wait_bound_ms = bound
        """The bound of every wait on another rank, in milliseconds (:func:`wait_bound_ms`)."""
        """The group's communicator."""
        self._logged: set[tuple[str, str]] = set()
        self._pending: list[_PeerOp] = []
        self._scratch_bytes: torch.Tensor | None = None
        self.path_counts: Counter[tuple[str, str]] = Counter()
        """How many calls of each kind took each path: ``path_counts["all_reduce", "window"]``
        (in place in a window, no copy) and ``path_counts["all_reduce", "staged"]`` (copied
        through a staging window); kinds ``all_reduce``, ``all_gather``, ``reduce_scatter``,
        ``broadcast``, ``all_to_all``, ``gather``, ``scatter`` (the last two always staged),
        ``send``, ``recv``."""

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    def _get_backend(self, device: Any) -> Any:
        """The group's backend for ``device``: the group itself (``batch_isend_irecv`` asks; the
        group does not coalesce, so torch calls its ``isend``/``irecv`` one by one, which queue
        the operations for one launch: see :meth:`send`)."""
        return self

    def shutdown(self) -> None:
        """``destroy_process_group``: run the sends and receives still queued (an ``isend`` never
        waited for, whose receiver waits for it), then destroy the group's communicator
        (``symmCommDestroy``), which frees its windows and buffers (tensors from :func:`empty`
        or :func:`mem_pool` of this group lose their memory). Once only."""
        if self._pending and not self.comm.destroyed:
            _log(self._rank, "INFO", f"torch: running {len(self._pending)} queued send(s)/receive(s) before the group is destroyed")
            self._flush_peer_ops()
        if not self.comm.destroyed:
            self.comm.destroy()

    def abort(self) -> None:
        """Abort the group's communicator (``symmCommAbort``): it fails on every rank, naming
        this rank's abort, so that every rank's pending and later calls end at once; then it
        is freed. Callable while another thread's collective of this group waits."""
        if not self.comm.destroyed:
            self.comm.abort()

    def __repr__(self) -> str:
        return f"SymmProcessGroup(rank {self._rank} of {self._size}, {self.comm.backend} backend)"

    # -- paths ---------------------------------------------------------------------------------

    def _device(self) -> torch.device:
        return torch.device("cpu") if self.comm.backend == "host" else torch.device("cuda", self.comm.device)

    def _in_window(self, *tensors: torch.Tensor) -> bool:
        """Whether every tensor lies, contiguous and on the communicator's device, in a window
        of this group."""
        for tensor in tensors:
            if not tensor.is_contiguous() or tensor.device != self._device():
                return False
            start = tensor.data_ptr()
            end = start + tensor.numel() * tensor.element_size()
            if not any(
                w.registered and w.base <= start and end <= w.base + w.nbytes
                for w in list(self.comm._windows)
            ):
                return False
        return True

    def _note(self, kind: str, path: str, tensor: torch.Tensor) -> None:
        level = _log_level()
        first = (kind, path) not in self._logged
        if level >= _LEVELS["TRACE"] or (level >= _LEVELS["INFO"] and first):
            how = (
                "in its window (no copy)"
                if path == "window"
                else "staged through the communicator's staging window (the tensor is not in a registered window: correct, slower)"
            )
            _log(self._rank, "INFO", f"{kind} of {tensor.numel()} {tensor.dtype} {how}")
        self._logged.add((kind, path))
        self.path_counts[kind, path] += 1

    @staticmethod
    def _check(tensor: torch.Tensor) -> int:
        """The C ABI's code of ``tensor``'s dtype; raises for a type symm has not."""
        code = _DTYPE_CODES.get(tensor.dtype)
        if code is None:
            if tensor.is_complex():
                raise UnsupportedError(f"{tensor.dtype}: symm has no complex types")
            code = _DTYPE_CODES[tensor.dtype] = int(resolve_dtype(str(tensor.dtype)))
        return code

    @staticmethod
    def _op_code(op: str) -> int:
        code = _OP_CODES.get(op)
        if code is None:
            code = _OP_CODES[op] = int(resolve_op(op))
        return code

    def _call(self, function: Any, send: torch.Tensor, recv: torch.Tensor, count: int, code: int, *extra: int) -> None:
        """The C call ``function(send, recv, count, code, *extra, comm, stream)`` on tensors this
        group has checked already (contiguous, on its device: in a window of the group, or
        memory the library stages), after the sends and receives
        queued before it."""
        if self._pending:
            self._flush_peer_ops()
        arguments = [send.data_ptr(), recv.data_ptr(), count, code, *extra]
        check(function(*arguments, self.comm.handle, self._stream() or 0))

    def _stream(self) -> int | None:
        if self.comm.backend == "cuda":
            return int(torch.cuda.current_stream(self.comm.device).cuda_stream)
        return None

    # -- collectives ---------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        for tensor in tensors:
            self._all_reduce(tensor, _op_of(opts))
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def _all_reduce(self, tensor: torch.Tensor, op: str) -> None:
        code = self._check(tensor)
        if tensor.numel() == 0:
            return
        op_code = self._op_code(op)
        if self._in_window(tensor):
            self._note("all_reduce", "window", tensor)
            self._call(lib.symmAllReduce, tensor, tensor, tensor.numel(), code, op_code)
            return
        self._note("all_reduce", "staged", tensor)
        self._staged_in_place(tensor, lambda flat: self._call(lib.symmAllReduce, flat, flat, flat.numel(), code, op_code))

    def _staged_in_place(self, tensor: torch.Tensor, run: Any, receive: bool = True) -> None:
        """Run ``run(flat)`` in place on ``tensor`` as one contiguous run of elements on the
        communicator's device (a copy when it is not that, copied back when ``receive``): the
        library stages the call through the communicator's staging window (the tensor is in
        no window)."""
        local = self._local(tensor)
        run(local.view(-1))
        if receive:
            self._copy_back(tensor, local)

    def _local(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` contiguous on the communicator's device: itself, or a copy."""
        return tensor.to(self._device()).contiguous()

    def _scratch(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """``numel`` elements of ``dtype`` on the communicator's device for the copies a call
        needs. On the host, from a buffer the group keeps (and grows): a new tensor of that size
        at every call would cost its first touch (zeroed pages: about 0.5 ms per MiB, more than
        the call), and host calls complete before they return, so the next call may reuse it. On
        a GPU, a new tensor from PyTorch's caching allocator (no first touch; a buffer kept across
        calls could be overwritten on one stream while a call on another still reads it)."""
        if self._device().type != "cpu":
            return torch.empty(numel, dtype=dtype, device=self._device())
        nbytes = numel * dtype.itemsize
        if self._scratch_bytes is None or self._scratch_bytes.numel() < nbytes:
            self._scratch_bytes = torch.empty(nbytes, dtype=torch.uint8, device=self._device())
        return self._scratch_bytes[:nbytes].view(dtype)

    def _output(self, output: torch.Tensor) -> torch.Tensor:
        """A tensor to receive ``output``'s result into: itself when it is contiguous on the
        communicator's device, else a new one for :meth:`_copy_back`."""
        if output.is_contiguous() and output.device == self._device():
            return output
        return torch.empty(output.shape, dtype=output.dtype, device=self._device())

    @staticmethod
    def _copy_back(output: torch.Tensor, received: torch.Tensor) -> None:
        if received is not output:
            output.copy_(received.view(output.shape))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        self._all_gather(output, input)
        return _done([output])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        return self.all_gather_single(output, input, opts)

    def _all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
        code = self._check(input)
        n, size = input.numel(), self._size
        if output.numel() != n * size or output.dtype != input.dtype:
            raise InvalidArgumentError(
                f"all_gather: output has {output.numel()} {output.dtype}, want {size} x {n} {input.dtype}"
            )
        if n == 0:
            return
        if self._in_window(output, input):
            self._note("all_gather", "window", input)
            self._call(lib.symmAllGather, input, output, n, code)
            return
        self._note("all_gather", "staged", input)
        received = self._output(output)
        self._call(lib.symmAllGather, self._local(input), received, n, code)
        self._copy_back(output, received)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        for output_list, input in zip(outputs, inputs):  # noqa: A001
            gathered = torch.empty((self._size * input.numel(),), dtype=input.dtype, device=input.device)
            self._all_gather(gathered, input)
            for rank, out in enumerate(output_list):
                out.copy_(gathered[rank * input.numel() : (rank + 1) * input.numel()].view(out.shape))
        return _done(outputs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        self._reduce_scatter(output, input, _op_of(opts))
        return _done([output])

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        return self.reduce_scatter_single(output, input, opts)

    def _reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str) -> None:  # noqa: A002
        code = self._check(input)
        n, size = output.numel(), self._size
        if input.numel() != n * size or output.dtype != input.dtype:
            raise InvalidArgumentError(
                f"reduce_scatter: input has {input.numel()} {input.dtype}, want {size} x {n} {output.dtype}"
            )
        if n == 0:
            return
        if self._in_window(output, input):
            self._note("reduce_scatter", "window", output)
            self._call(lib.symmReduceScatter, input, output, n, code, self._op_code(op))
            return
        self._note("reduce_scatter", "staged", output)
        received = self._output(output)
        self._call(lib.symmReduceScatter, self._local(input), received, n, code, self._op_code(op))
        self._copy_back(output, received)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        for output, input_list in zip(outputs, inputs):
            self._reduce_scatter(output, torch.cat([t.reshape(-1) for t in input_list]), _op_of(opts))
        return _done(outputs)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for tensor in tensors:
            self._broadcast(tensor, root)
        return _done(tensors)

    def _broadcast(self, tensor: torch.Tensor, root: int) -> None:
        code = self._check(tensor)
        if tensor.numel() == 0:
            return
        if self._in_window(tensor):
            self._note("broadcast", "window", tensor)
            self._call(lib.symmBroadcast, tensor, tensor, tensor.numel(), code, root)
            return
        self._note("broadcast", "staged", tensor)
        self._staged_in_place(
            tensor,
            lambda flat: self._call(lib.symmBroadcast, flat, flat, flat.numel(), code, root),
            receive=self._rank != root,
        )

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for input in inputs:  # noqa: A001
            code = self._check(input)
            n, size = input.numel(), self._size
            if self._rank == root:
                problem = None
                if len(outputs) != 1 or len(outputs[0]) != size:
                    problem = f"gather: the root needs a list of {size} output tensors"
                else:
                    for out in outputs[0]:
                        if out.numel() != n or out.dtype != input.dtype:
                            problem = f"gather: an output has {out.numel()} {out.dtype}, want {n} {input.dtype}"
                if problem is not None:
                    self._refuse(lib.symmGather, n, problem)
            if n == 0:
                continue
            self._note("gather", "staged", input)
            flat_in = self._local(input).view(-1)
            gathered = None
            in_place = False
            if self._rank == root:
                # Outputs that are the rows of one tensor on the device receive in place.
                rows = _rows_of_one_tensor([out.reshape(-1) for out in outputs[0]])
                in_place = rows is not None and rows.device == self._device()
                gathered = rows if in_place else self._scratch(size * n, input.dtype)
            # The receive buffer is used on the root only; elsewhere the send buffer stands in.
            self._call(lib.symmGather, flat_in, gathered if gathered is not None else flat_in, n, code, root)
            if gathered is not None and not in_place:
                for r, out in enumerate(outputs[0]):
                    out.copy_(gathered[r * n : (r + 1) * n].view(out.shape))
        return _done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        for index, output in enumerate(outputs):
            code = self._check(output)
            n, size = output.numel(), self._size
            parts: list[torch.Tensor] = []
            if self._rank == root:
                problem = None
                if len(inputs) <= index or len(inputs[index]) != size:
                    problem = f"scatter: the root needs a list of {size} input tensors"
                else:
                    parts = [t.reshape(-1) for t in inputs[index]]
                    for part in parts:
                        if part.numel() != n or part.dtype != output.dtype:
                            problem = f"scatter: an input has {part.numel()} {part.dtype}, want {n} {output.dtype}"
                if problem is not None:
                    self._refuse(lib.symmScatter, n, problem)
            if n == 0:
                continue
            self._note("scatter", "staged", output)
            received = self._output(output)
            # The send buffer is used on the root only; elsewhere the receive buffer stands in.
            send = received
            if self._rank == root:
                rows = _rows_of_one_tensor(parts)
                if rows is not None:
                    send = self._local(rows)
                else:
                    send = torch.cat([self._local(p) for p in parts], out=self._scratch(size * n, output.dtype))
            self._call(lib.symmScatter, send, received.view(-1), n, code, root)
            self._copy_back(output, received)
        return _done(outputs)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: Any = None,
    ) -> Any:
        size = self._size
        counts: list[list[int]] = []
        problem: str | None = None
        row = 1
        for name, tensor, splits in (("input", input, input_split_sizes), ("output", output, output_split_sizes)):
            rows = tensor.shape[0] if tensor.dim() > 0 else 0
            row = math.prod(tensor.shape[1:]) if tensor.dim() > 0 else 1
            if splits and (len(splits) != size or sum(splits) != rows or min(splits) < 0):
                problem = problem or (
                    f"all_to_all_single: {name} split sizes {list(splits)} do not split its {rows} rows among {size} ranks"
                )
            elif not splits and rows % size:
                problem = problem or f"all_to_all_single: the {name}'s {rows} rows do not divide among {size} ranks"
            counts.append([s * row for s in splits] if splits and problem is None else [tensor.numel() // size] * size)
        # Every rank takes the same path whatever it passed (split sizes or none: a peer may
        # pass the other): the counts are always swapped and agreed on first.
        self._all_to_all_v(output, input, counts[1], counts[0], problem, row)
        return _done([output])

    def _all_to_all_v(
        self,
        output: torch.Tensor,
        input: torch.Tensor,  # noqa: A002
        out_counts: list[int],
        in_counts: list[int],
        problem: str | None = None,
        row: int = 1,
    ) -> None:
        """All-to-all of ``in_counts[p]`` elements of ``input`` to rank ``p`` (segments in rank
        order), ``out_counts[p]`` elements from rank ``p`` into ``output``. The ranks first swap
        their counts (an all-to-all of one integer per peer) and agree, by an all-reduce of the
        largest, on whether any rank found a problem — its own arguments (``problem``) or a
        pair whose counts disagree — (every rank then raises) and on the largest segment ``m``;
        the data then goes as an all-to-all of ``m`` elements per peer, each segment padded to
        ``m`` (no copy on a rank whose segments all hold ``m``). ``row``: elements per row of
        ``output``, for the messages."""
        self._check(input)
        size = self._size
        if output.dtype != input.dtype:
            problem = problem or f"all_to_all: output is {output.dtype}, input {input.dtype}: want one dtype"
        sent = torch.tensor(in_counts, dtype=torch.int64)
        announced = torch.empty(size, dtype=torch.int64)
        self._all_to_all(announced, sent)
        wrong = [] if problem else [p for p in range(size) if int(announced[p]) != out_counts[p]]
        flagged = 1 if (wrong or problem) else 0
        agreed = torch.tensor([flagged, max([*in_counts, *out_counts, 0])], dtype=torch.int64)
        self._all_reduce(agreed, "max")
        if problem:
            raise InvalidArgumentError(problem)
        if int(agreed[0]):

            def rows(n: int) -> str:
                return f"{n // row} rows" if row > 1 and n % row == 0 else f"{n} elements"

            detail = (
                "; ".join(f"rank {p} sends {rows(int(announced[p]))} to this rank, which expects {rows(out_counts[p])}" for p in wrong)
                if wrong
                else "another rank's arguments are wrong, or its split sizes disagree with its peer's"
            )
            raise InvalidArgumentError(f"all_to_all: refused on every rank ({detail})")
        most = int(agreed[1])
        if most == 0:
            return
        flat_in = input.contiguous().reshape(-1)
        if all(n == most for n in in_counts):
            padded_in = flat_in.view(size, most)
        else:
            padded_in = torch.zeros((size, most), dtype=input.dtype, device=input.device)
            start = 0
            for p, n in enumerate(in_counts):
                padded_in[p, :n].copy_(flat_in[start : start + n])
                start += n
        if all(n == most for n in out_counts) and output.is_contiguous():
            self._all_to_all(output.view(size, most).view(-1), padded_in.view(-1))
            return
        padded_out = torch.empty((size, most), dtype=output.dtype, device=output.device)
        self._all_to_all(padded_out.view(-1), padded_in.view(-1))
        flat_out = output.reshape(-1) if output.is_contiguous() else torch.empty(output.numel(), dtype=output.dtype, device=output.device)
        start = 0
        for p, n in enumerate(out_counts):
            flat_out[start : start + n].copy_(padded_out[p, :n])
            start += n
        if not output.is_contiguous():
            output.copy_(flat_out.view(output.shape))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> Any:
        size = self._size
        if len(inputs) != size or len(outputs) != size:
            raise InvalidArgumentError(f"all_to_all: want {size} input and {size} output tensors")
        gathered = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype, device=outputs[0].device)
        flat_in = torch.cat([t.reshape(-1) for t in inputs])
        # The same path on every rank whatever its sizes (a peer's may differ).
        self._all_to_all_v(gathered, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs])
        start = 0
        for out in outputs:
            out.copy_(gathered[start : start + out.numel()].view(out.shape))
            start += out.numel()
        return _done(outputs)

    def _all_to_all(self, output: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
        code = self._check(input)
        size = self._size
        if output.numel() != input.numel() or output.dtype != input.dtype or input.numel() % size:
            raise InvalidArgumentError(
                f"all_to_all_single: input has {input.numel()} {input.dtype}, output {output.numel()} "
                f"{output.dtype}: want the same number, a multiple of {size}, of one dtype"
            )
        n = input.numel() // size
        if n == 0:
            return
        if self._in_window(output, input):
            self._note("all_to_all", "window", input)
            self._call(lib.symmAlltoAll, input, output, n, code)
            return
        self._note("all_to_all", "staged", input)
        received = self._output(output)
        self._call(lib.symmAlltoAll, self._local(input), received, n, code)
        self._copy_back(output, received)

    def _refuse(self, function: Any, n: int, problem: str) -> None:
        """A root's arguments that its peers cannot see are wrong: the library counts the call
        as this rank's, refused, so that the peers' calls fail at once naming ``problem`` instead
        of waiting; then raise it."""
        if n != 0:
            # The peers make no call for an empty tensor either.
            self.comm._refuse_collective(function.__name__, problem)
        raise InvalidArgumentError(problem)

    def _not_in_symm(self, op: str) -> Any:
        raise UnsupportedError(
            f"{op}: the symm backend does not implement it yet (it has all_reduce, reduce, all_gather, "
            "reduce_scatter, broadcast, gather, scatter, all_to_all and barrier); run this call on "
            "a gloo group"
        )

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        root = opts.rootRank if opts is not None else 0
        op = _op_of(opts)
        for tensor in tensors:
            self._reduce(tensor, op, root)
        return _done(tensors)

    def _reduce(self, tensor: torch.Tensor, op: str, root: int) -> None:
        code = self._check(tensor)
        if tensor.numel() == 0:
            return
        op_code = self._op_code(op)
        if self._in_window(tensor):
            self._note("reduce", "window", tensor)
            self._call(lib.symmReduce, tensor, tensor, tensor.numel(), code, op_code, root)
            return
        self._note("reduce", "staged", tensor)
        self._staged_in_place(
            tensor,
            lambda flat: self._call(lib.symmReduce, flat, flat, flat.numel(), code, op_code, root),
            receive=self._rank == root,
        )

    # -- point to point ------------------------------------------------------------------------
    #
    # send/recv/isend/irecv queue the operation and return a work object; the queue runs when a
    # work is waited for (or the group's next collective starts): every queued operation in one
    # symm group, so a rank's sends and receives of one batch_isend_irecv are one launch, and
    # ranks may send to each other in any order. Operations pair in call order per pair of
    # ranks, as in NCCL (tags are not matched). A tensor outside the group's windows is sent
    # through a ring in the staging window, or received into in place, by the library.

    def send(self, tensors: list[torch.Tensor], dst_rank: int, tag: int) -> Any:
        return self._queue_peer_op(True, tensors, dst_rank)

    def recv(self, tensors: list[torch.Tensor], src_rank: int, tag: int) -> Any:
        return self._queue_peer_op(False, tensors, src_rank)

    def _queue_peer_op(self, send: bool, tensors: list[torch.Tensor], peer: int) -> Any:
        what = "send" if send else "recv"
        if len(tensors) != 1:
            raise InvalidArgumentError(f"{what}: one tensor per call (got {len(tensors)})")
        tensor = tensors[0]
        try:
            code: int | None = self._check(tensor)
        except SymmError:
            # Point to point moves bytes: a dtype symm does not reduce (bool, int16, complex)
            # travels as uint8.
            code = None
        if not 0 <= peer < self._size:
            raise InvalidArgumentError(f"{what}: peer {peer} is not a rank of this group (0 to {self._size - 1})")
        if tensor.device != self._device():
            raise InvalidArgumentError(f"{what}: the tensor is on {tensor.device}; this group's communicator is on {self._device()}")
        op = _PeerOp(send, tensor, peer, code)
        self._pending.append(op)
        return _PeerWork(self, op)

    def _flush_peer_ops(self) -> None:
        """Run every queued send and receive (see above); each operation records its outcome."""
        ops, self._pending = self._pending, []
        try:
            self._run_peer_ops(ops)
        except SymmError as error:
            for op in ops:
                if not op.done:
                    op.error = error
        for op in ops:
            op.done = True

    def _run_peer_ops(self, ops: list[_PeerOp]) -> None:
        stream = self._stream() or 0
        # The library stages a tensor outside this group's windows itself (whole); a tensor that
        # is not contiguous goes through a contiguous copy here.
        buffers = []
        for op in ops:
            tensor = op.tensor
            self._note("send" if op.send else "recv", "window" if self._in_window(tensor) else "staged", tensor)
            buffers.append(tensor if tensor.is_contiguous() else tensor.contiguous())
        byte_code = self._check(torch.empty(0, dtype=torch.uint8))
        with _core.group():
            for op, buffer in zip(ops, buffers):
                function = lib.symmSend if op.send else lib.symmRecv
                count, code = buffer.numel(), op.code
                if code is None:
                    count, code = count * buffer.element_size(), byte_code
                check(function(buffer.data_ptr(), count, code, op.peer, self.comm.handle, stream))
        for op, buffer in zip(ops, buffers):
            if not op.send and buffer is not op.tensor:
                op.tensor.copy_(buffer)
            op.done = True

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        return self._not_in_symm("recv from any source")

    def barrier(self, opts: Any = None) -> Any:
        if self._pending:
            self._flush_peer_ops()
        self.comm.barrier(stream=self._stream())
        if self.comm.backend == "cuda":
            torch.cuda.current_stream(self.comm.device).synchronize()
        return _done(None)


# -- tensors in windows: mem_pool, empty, rendezvous ---------------------------------------------
#
# Memory for symmetric tensors comes from symmMemAlloc on the group's communicator: on the cuda
# backend through a torch.cuda.MemPool whose allocator calls it (mem_pool), on the host backend
# as Comm.alloc buffers (empty). rendezvous(tensor) registers, collectively, a window over the
# whole allocation that holds the tensor (once per allocation), and returns a SymmetricMemory
# handle: the window, its device context (the Triton functions' ctx) and the tensor's offset.

#: ``void* alloc(size_t size, int device, cudaStream_t stream)``, as torch's pluggable allocator
#: calls it.
_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
#: ``void free(void* ptr, size_t size, int device, cudaStream_t stream)``.
_FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)

#: The first fields of a ``symmDeviceContext`` (symm.h): backend, version, rank, world_size,
#: local_base, window_size, peer_bases.
_CONTEXT_HEAD = struct.Struct("<IIIIQQQ")

#: int64 fields of one rank's rendezvous descriptor (see _exchange).
_FIELDS = 8
(_F_STATUS, _F_SEQ, _F_ALLOC, _F_OFFSET, _F_EXTENT, _F_ITEM, _F_NUMEL, _F_LAYOUT) = range(_FIELDS)
#: Why a rank could not take part in a rendezvous (the descriptor's status field).
_REFUSALS = {
    1: "its tensor is not in memory from symm on this communicator",
    2: "its tensor is on another device than the communicator's memory",
    3: "its tensor's allocation already has a window that does not cover the tensor",
    4: "its tensor has no storage (no elements)",
}

#: Set at interpreter exit: pool callbacks then leave memory to the process's end.
_exiting = False


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True


class _PoolAllocator:
    """The allocator behind :func:`mem_pool`: C function pointers (ctypes closures, as
    ``torch.cuda.memory._use_uvm`` makes its own) that call ``symmMemAlloc`` / ``symmMemFree``
    on one communicator, and the allocations (torch's segments) they made. Never freed: torch
    keeps the pointers, not the closures, and may call them until the process ends."""

    def __init__(self, comm: _core.Comm) -> None:
        self.comm = comm
        self.segments: dict[int, int] = {}
        self._lock = threading.Lock()
        self._alloc_fn = _ALLOC_FN(self._alloc)
        self._free_fn = _FREE_FN(self._free)
        #: The function pointers, for ``torch._C._cuda_customAllocator``.
        self.alloc_pointer: int = ctypes.cast(self._alloc_fn, ctypes.c_void_p).value or 0
        self.free_pointer: int = ctypes.cast(self._free_fn, ctypes.c_void_p).value or 0
        _immortal(self)

    def _comm_alive(self) -> bool:
        return self.comm._alive[0] and not self.comm.destroyed

    def _alloc(self, size: int, device: int, stream: int | None) -> int:
        comm = self.comm
        try:
            if _exiting or not self._comm_alive():
                raise InvalidUsageError("the pool's communicator was destroyed")
            if comm.backend == "cuda" and device != comm.device:
                raise InvalidArgumentError(
                    f"the pool belongs to a communicator on cuda:{comm.device}, asked for memory on "
                    f"cuda:{device}: torch.cuda.set_device({comm.device}) or "
                    f"use_mem_pool(pool, device={comm.device})"
                )
            ptr = ctypes.c_void_p()
            with comm._state_lock:
                check(lib.symmMemAlloc(comm.handle, ctypes.byref(ptr), size))
            address = ptr.value or 0
            with self._lock:
                self.segments[address] = size
            return address
        except BaseException as error:  # noqa: BLE001 (torch then raises its out-of-memory error)
            _log(comm.rank, "WARN", f"mem_pool: symmMemAlloc of {size} bytes on device {device} failed: {error}")
            return 0

    def _free(self, ptr: int | None, size: int, device: int, stream: int | None) -> None:
        try:
            with self._lock:
                known = self.segments.pop(ptr or 0, None)
            if known is None or _exiting or not self._comm_alive():
                return  # not ours, or the memory went with the communicator
            comm = self.comm
            for window in list(comm._windows):
                if window.registered and ptr <= window.base < ptr + known:  # type: ignore[operator]
                    window.deregister()  # local: deregistration is not collective
            with comm._state_lock:
                check(lib.symmMemFree(comm.handle, ptr))
        except BaseException as error:  # noqa: BLE001 (nothing can be raised into torch here)
            try:
                _log(self.comm.rank, "WARN", f"mem_pool: freeing {ptr:#x} failed: {error}")
            except BaseException:  # noqa: BLE001, S110 (interpreter shutdown)
                pass

    def segment_of(self, ptr: int, nbytes: int) -> tuple[int, int] | None:
        with self._lock:
            for base, size in self.segments.items():
                if base <= ptr and ptr + nbytes <= base + size:
                    return base, size
        return None


def _immortal(obj: object) -> None:
    """Keep ``obj`` alive until the process ends, through interpreter shutdown too (a pool
    destroyed at shutdown would call its allocator's closures while Python tears down)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class _TensorState:
    """What this module keeps per communicator: its pool, the small window rendezvous
    descriptors are exchanged in, and how many rendezvous registered windows."""

    def __init__(self, comm: _core.Comm) -> None:
        self.lock = threading.RLock()
        self.allocator: _PoolAllocator | None = None
        self.pool: Any = None
        self.check_buffer: _core.Buffer | None = None
        self.check_window: _core.Window | None = None
        self.seq = 0
        self.peer_bases: weakref.WeakKeyDictionary[_core.Window, list[int]] = weakref.WeakKeyDictionary()


def _state(comm: _core.Comm) -> _TensorState:
    state = comm.__dict__.get("_torch_state")
    if state is None:
        state = comm.__dict__.setdefault("_torch_state", _TensorState(comm))
    return state


def _resolve(group: Any) -> tuple[_core.Comm, SymmProcessGroup | None]:
    """The communicator of ``group``: a ``"symm"`` process group (default: the default group)
    or a :class:`symm.Comm`."""
    if isinstance(group, _core.Comm):
        group.handle  # noqa: B018 (raises when destroyed)
        return group, None
    if group is None:
        if not dist.is_initialized():
            raise InvalidUsageError('no process group: call dist.init_process_group("symm") first, or pass a symm.Comm')
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, SymmProcessGroup):
        return group.comm, group
    raise InvalidArgumentError(
        f"{group!r} is not a process group of the {BACKEND_NAME!r} backend (nor a symm.Comm): "
        f'make it with dist.init_process_group("symm") or dist.new_group(..., backend="symm")'
    )


def _memory_device(comm: _core.Comm) -> torch.device:
    return torch.device("cpu") if comm.backend == "host" else torch.device("cuda", comm.device)


def mem_pool(group: Any = None) -> Any:
    """A ``torch.cuda.MemPool`` whose allocator is ``symmMemAlloc`` on ``group``'s communicator
    (a ``"symm"`` process group, default the default group, or a :class:`symm.Comm`), as
    ``torch.distributed._symmetric_memory.get_mem_pool``::

        pool = symm.torch.mem_pool()
        with torch.cuda.use_mem_pool(pool):
            t = torch.empty(4096, device="cuda")   # in symm memory
        handle = symm.torch.rendezvous(t)          # collective: the window over t's allocation
        dist.all_reduce(t)                         # in its window: no copy

    One pool per communicator (the same object on every call), made like torch's own
    (``use_on_oom=False``, ``no_split=True``: each allocation is one tensor's, so one window
    and one signal pad serve one tensor). The pool, its allocator and its communicator live
    until the process ends; memory torch returns to it (``torch.cuda.empty_cache()``) leaves
    its window first. Allocate the same sizes in the same order on every rank.

    Raises:
        UnsupportedError: the communicator is on the host backend (host memory: PyTorch has no
            CPU memory pool; use :func:`empty`), or this PyTorch has no CUDA or no pluggable
            allocators.
    """
    comm, _ = _resolve(group)
    if comm.backend != "cuda":
        raise UnsupportedError(
            f"mem_pool: the communicator is on the {comm.backend} backend, whose memory is host "
            "memory, and PyTorch has no memory pool for CPU tensors: use symm.torch.empty(...) "
            "(or tensors over comm.alloc buffers) there"
        )
    if not torch.cuda.is_available():
        raise UnsupportedError(f"mem_pool: this PyTorch ({torch.__version__}) cannot use CUDA")
    custom = getattr(torch._C, "_cuda_customAllocator", None)
    pool_type = getattr(torch.cuda, "MemPool", None)
    if custom is None or pool_type is None or not hasattr(torch.cuda, "use_mem_pool"):
        raise UnsupportedError(
            f"mem_pool: PyTorch {torch.__version__} lacks torch.cuda.MemPool, use_mem_pool or "
            "pluggable allocators (PyTorch 2.8 or newer has them)"
        )
    state = _state(comm)
    with state.lock:
        if state.pool is None:
            allocator = _PoolAllocator(comm)
            options: dict[str, Any] = {}
            parameters = _parameters(pool_type)
            if "use_on_oom" in parameters:
                options["use_on_oom"] = False
            if "no_split" in parameters:
                options["no_split"] = True
            state.pool = pool_type(custom(allocator.alloc_pointer, allocator.free_pointer), **options)
            _immortal(state.pool)
            state.allocator = allocator
        return state.pool


def _parameters(function: Any) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return set()


def empty(*size: Any, dtype: torch.dtype | None = None, device: Any = None, group: Any = None) -> torch.Tensor:
    """Like ``torch.empty``, a tensor in symm memory of ``group``'s communicator (a ``"symm"``
    process group, default the default group, or a :class:`symm.Comm`), for
    :func:`rendezvous`, as ``torch.distributed._symmetric_memory.empty``: a CUDA tensor from
    :func:`mem_pool` on the cuda backend, a CPU tensor over a ``comm.alloc`` buffer on the host
    backend (zeroed, freed with the tensor unless a window holds it). ``device`` defaults to
    the communicator's, and must be it.
    """
    comm, _ = _resolve(group)
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    memory = _memory_device(comm)
    if device is not None:
        wanted = torch.device(device)
        if wanted.type == "cuda" and wanted.index is None and memory.type == "cuda":
            wanted = memory
        if wanted != memory:
            raise InvalidArgumentError(f"empty: the communicator's memory is on {memory}, not {wanted}")
    if comm.backend == "cuda":
        with torch.cuda.device(comm.device), torch.cuda.use_mem_pool(mem_pool(comm), device=comm.device):
            return torch.empty(shape, dtype=dtype, device=memory)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    buffer = comm.alloc(max(nbytes, 16))  # symmMemAlloc refuses 0 bytes
    flat = torch.from_numpy(buffer.numpy())[:nbytes]
    return flat.view(dtype).view(shape)


class _DeviceBytes:
    """``nbytes`` bytes of device memory at ``address`` as ``__cuda_array_interface__``, for
    ``torch.as_tensor`` (``keep`` stays alive with the tensor)."""

    def __init__(self, address: int, nbytes: int, keep: Any = None) -> None:
        self.keep = keep
        self.__cuda_array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "stream": None,
        }


def _bytes_tensor(comm: _core.Comm, address: int, nbytes: int, keep: Any) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of the communicator's memory at ``address`` (no copy)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=_memory_device(comm))
    if comm.backend == "host":
        raw = (ctypes.c_char * nbytes).from_address(address)
        raw._symm_keep = keep  # type: ignore[attr-defined]  # the tensor keeps its owner alive
        return torch.frombuffer(raw, dtype=torch.uint8)
    device = _memory_device(comm)
    construct = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if construct is not None:
        # On this device whatever the pointer's attributes say: a peer's window, mapped here, is
        # memory of the peer's GPU, which __cuda_array_interface__ would put the tensor on.
        storage = construct(address, device, nbytes)
        return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
    return torch.as_tensor(_DeviceBytes(address, nbytes, keep), device=device)


def _read(comm: _core.Comm, address: int, nbytes: int) -> bytes:
    """``nbytes`` of the communicator's memory at ``address`` (device memory is copied on
    PyTorch's current stream, which is synchronized)."""
    if comm.backend == "host":
        return ctypes.string_at(address, nbytes)
    return bytes(_bytes_tensor(comm, address, nbytes, None).cpu().numpy().tobytes())


class SymmetricMemory:
    """A tensor's place in a registered window, as :func:`rendezvous` returns it (the
    counterpart of ``torch.distributed._symmetric_memory``'s handle).

    Attributes: :attr:`window` (the :class:`symm.Window`), :attr:`device_context` (the ``ctx``
    argument of the Triton functions, :mod:`symm.triton`), :attr:`offset` (the tensor's byte
    offset in the window, the functions' ``byte_offset``), :attr:`rank`, :attr:`world_size`,
    :attr:`buffer_size`, :attr:`buffer_ptrs` and :meth:`get_buffer` (every rank's window).
    """

    def __init__(self, comm: _core.Comm, window: _core.Window, offset: int, group: SymmProcessGroup | None) -> None:
        self.comm = comm
        """The communicator."""
        self.group = group
        """The process group, or None when :func:`rendezvous` was given a communicator."""
        self.window = window
        """The registered :class:`symm.Window` holding the tensor."""
        self.offset = offset
        """Byte offset of the tensor's first element from the window's base (the same on every
        rank)."""
        self.rank: int = comm.rank
        """This rank."""
        self.world_size: int = comm.nranks
        """Number of ranks."""

    def __repr__(self) -> str:
        return (
            f"<symm.torch.SymmetricMemory rank {self.rank} of {self.world_size}: offset {self.offset} "
            f"of the {self.window.nbytes}-byte window at {self.window.base:#x}>"
        )

    @property
    def device_context(self) -> int:
        """Device address of the window's ``symmDeviceContext``: the ``ctx`` of
        ``symm.triton.all_reduce(ctx, ...)`` and the other device functions."""
        return self.window.device_context

    @property
    def device(self) -> torch.device:
        """Where the window's memory is (``cuda:N``, or ``cpu`` on the host backend)."""
        return _memory_device(self.comm)

    @property
    def buffer_size(self) -> int:
        """Bytes of the window (every rank's is as large)."""
        return self.window.nbytes

    @property
    def buffer_ptr(self) -> int:
        """Address of this rank's window."""
        self.window._check_live()
        return self.window.base

    @property
    def buffer_ptrs(self) -> list[int]:
        """Every rank's window, mapped in this process (``buffer_ptrs[rank]`` is
        :attr:`buffer_ptr`), read from the device context."""
        window = self.window
        window._check_live()
        state = _state(self.comm)
        with state.lock:
            bases = state.peer_bases.get(window)
            if bases is None:
                head = _CONTEXT_HEAD.unpack(_read(self.comm, window.device_context, _CONTEXT_HEAD.size))
                peer_table = head[6]
                raw = _read(self.comm, peer_table, 8 * self.world_size)
                bases = list(struct.unpack(f"<{self.world_size}Q", raw))
                state.peer_bases[window] = bases
            return list(bases)

    def get_buffer(self, rank: int, sizes: Any, dtype: torch.dtype, storage_offset: int = 0) -> torch.Tensor:
        """A tensor of ``sizes`` and ``dtype`` over rank ``rank``'s window, starting
        ``storage_offset`` elements from its base (as torch's ``get_buffer``; ``self.offset //
        itemsize`` is this tensor's place): loads and stores reach that rank's memory. Valid
        while the window is registered.

        Raises:
            InvalidArgumentError: a rank out of range, or the view overruns the window.
        """
        if not 0 <= rank < self.world_size:
            raise InvalidArgumentError(f"get_buffer: rank {rank} is not in [0, {self.world_size})")
        shape = tuple(sizes) if isinstance(sizes, (tuple, list, torch.Size)) else (sizes,)
        itemsize = torch.empty((), dtype=dtype).element_size()
        start = storage_offset * itemsize
        nbytes = math.prod(shape) * itemsize
        if storage_offset < 0 or start + nbytes > self.buffer_size:
            raise InvalidArgumentError(
                f"get_buffer: {nbytes} bytes at byte {start} overrun the {self.buffer_size}-byte window"
            )
        memory = _bytes_tensor(self.comm, self.buffer_ptrs[rank] + start, nbytes, self)
        return memory.view(dtype).view(shape)


def _extent(tensor: torch.Tensor) -> int:
    """Bytes from the tensor's first element to the end of its last."""
    if tensor.numel() == 0:
        return 0
    span = 1 + sum((n - 1) * stride for n, stride in zip(tensor.shape, tensor.stride()))
    return span * tensor.element_size()


def _allocation_of(comm: _core.Comm, ptr: int, nbytes: int) -> tuple[int, int, Any] | None:
    """The symm allocation of ``comm`` holding ``[ptr, ptr + nbytes)``: ``(base, size,
    owner)``, the owner being the :class:`symm.Buffer` or None for a pool segment."""
    state = _state(comm)
    for buffer in list(comm._buffers):
        if not buffer.freed and buffer.ptr <= ptr and ptr + nbytes <= buffer.ptr + buffer.nbytes:
            if buffer is state.check_buffer:
                continue
            return buffer.ptr, buffer.nbytes, buffer
    if state.allocator is not None:
        segment = state.allocator.segment_of(ptr, nbytes)
        if segment is not None:
            return segment[0], segment[1], None
    return None


def _describe(tensor: torch.Tensor) -> str:
    return f"a {str(tensor.dtype).removeprefix('torch.')} tensor of shape {tuple(tensor.shape)}"


def rendezvous(tensor: torch.Tensor, group: Any = None) -> SymmetricMemory:
    """The window holding ``tensor`` on ``group``'s communicator (a ``"symm"`` process group,
    default the default group, or a :class:`symm.Comm`), registered over the tensor's whole
    symm allocation if none holds it yet, as ``torch.distributed._symmetric_memory.rendezvous``.

    ``tensor`` must lie in memory from symm: :func:`empty`, a tensor allocated inside ``with
    torch.cuda.use_mem_pool(symm.torch.mem_pool(group))``, or a view of a ``comm.alloc``
    buffer (``torch.from_numpy(buf.numpy())`` on the host backend, ``torch.as_tensor(buf,
    device="cuda")``). Collectives of the group then use it in place (no copy).

    Collective the first time an allocation is rendezvous'd: every rank calls it, in the same
    order, with a tensor of the same shape and dtype at the same offset of an allocation of the
    same size; the ranks compare these first (over a small window the communicator's first
    rendezvous registers) and all raise together if they differ, or if a rank's tensor is not
    in symm memory. A tensor whose allocation has a window already gets its handle at once,
    with no communication (ranks must agree on that too: rendezvous a new allocation on every
    rank or none). Host-blocking; not for CUDA graph capture.

    Raises:
        InvalidArgumentError: this rank's tensor is not in symm memory of the communicator, on
            another device, or in an allocation with a window that does not cover it.
        InvalidUsageError: another rank refused its tensor, or the ranks' tensors differ (order
            mismatch).
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"rendezvous takes a torch.Tensor, not {type(tensor).__name__}")
    comm, pg = _resolve(group)
    state = _state(comm)
    with state.lock:
        ptr, extent = 0, _extent(tensor)
        status, reason, allocation, window = 0, "", None, None
        if tensor.device != _memory_device(comm):
            status = 2
            reason = f"{_describe(tensor)} on {tensor.device}; the communicator's memory is on {_memory_device(comm)}"
        elif (ptr := int(tensor.data_ptr())) == 0 or tensor.untyped_storage().nbytes() == 0:
            status, reason = 4, f"{_describe(tensor)} has no storage"
        else:
            windows = [w for w in list(comm._windows) if w.registered and w is not state.check_window]
            window = next((w for w in windows if w.base <= ptr and ptr + extent <= w.base + w.nbytes), None)
            if window is not None:  # rendezvous'd already (or registered by hand): no communication
                return SymmetricMemory(comm, window, ptr - window.base, pg)
            allocation = _allocation_of(comm, ptr, max(extent, 1))
            if allocation is None:
                status = 1
                reason = (
                    f"{_describe(tensor)} at {ptr:#x} is not in memory from symm on this communicator: make it "
                    "with symm.torch.empty(...), inside `with torch.cuda.use_mem_pool(symm.torch.mem_pool(group))`, "
                    "or over a comm.alloc buffer"
                )
        if allocation is not None:
            base, size, _ = allocation
            other = next((w for w in windows if w.base < base + size and base < w.base + w.nbytes), None)
            if other is not None:
                status = 3
                reason = (
                    f"{_describe(tensor)} at {ptr:#x} is in an allocation with a window at {other.base:#x} "
                    f"(+{other.nbytes}) that does not cover it: deregister that window first"
                )
        descriptor = [0] * _FIELDS
        descriptor[_F_STATUS] = status
        descriptor[_F_SEQ] = state.seq
        if allocation is not None:
            descriptor[_F_ALLOC] = allocation[1]
            descriptor[_F_OFFSET] = ptr - allocation[0]
        descriptor[_F_EXTENT] = extent
        descriptor[_F_ITEM] = tensor.element_size()
        descriptor[_F_NUMEL] = tensor.numel()
        layout = f"{tensor.dtype}{tuple(tensor.shape)}{tuple(tensor.stride())}".encode()
        descriptor[_F_LAYOUT] = zlib.crc32(layout)
        everyone = _exchange(comm, state, descriptor)
        state.seq += 1
        if status:
            raise InvalidArgumentError(f"rendezvous on rank {comm.rank}: {reason}")
        refused = [(r, d[_F_STATUS]) for r, d in enumerate(everyone) if d[_F_STATUS]]
        if refused:
            ranks = "; ".join(f"rank {r}: {_REFUSALS.get(code, f'status {code}')}" for r, code in refused)
            seq = descriptor[_F_SEQ]
            raise InvalidUsageError(f"rendezvous #{seq} on rank {comm.rank}: no window registered, {ranks}")
        if any(d[_F_SEQ :] != descriptor[_F_SEQ :] for d in everyone):
            table = "; ".join(
                f"rank {r}: rendezvous #{d[_F_SEQ]}, {d[_F_NUMEL]} elements of {d[_F_ITEM]} bytes (layout "
                f"{d[_F_LAYOUT]:08x}) at byte {d[_F_OFFSET]} of a {d[_F_ALLOC]}-byte allocation"
                for r, d in enumerate(everyone)
            )
            raise InvalidUsageError(
                f"rendezvous on rank {comm.rank}: the ranks' tensors differ ({table}): every rank must "
                "rendezvous the same tensors (shape, dtype, offset, allocation size) in the same order; "
                "no window was registered"
            )
        assert allocation is not None
        base, size, owner = allocation
        window = comm.register(owner) if owner is not None else comm.register(base, size)
        return SymmetricMemory(comm, window, ptr - window.base, pg)


# Groups of other backends that adopt() made a symm communicator over, by group.
_OVER_GROUPS: weakref.WeakKeyDictionary[Any, SymmProcessGroup] = weakref.WeakKeyDictionary()


def _symm_group_over(group: Any) -> tuple[_core.Comm, SymmProcessGroup | None]:
    """The symm communicator :func:`adopt` uses for ``group``: its own for a ``"symm"`` group
    or a :class:`symm.Comm`; for a group of another backend (NCCL, gloo), one symm
    communicator over the same ranks, made through the group's store the first time
    (collective) and kept with the group."""
    if group is None:
        if not dist.is_initialized():
            raise InvalidUsageError("no process group: call dist.init_process_group first, or pass a group or a symm.Comm")
        group = dist.distributed_c10d._get_default_group()
    if isinstance(group, (_core.Comm, SymmProcessGroup)):
        return _resolve(group)
    made = _OVER_GROUPS.get(group)
    if made is None:
        store = dist.distributed_c10d._world.pg_map[group][1]
        name = getattr(group, "group_name", "") or "default"
        # The group's own timeout bounds the waits, as for a "symm" group (capped by
        # SYMM_TIMEOUT_MS); where the group does not say, SYMM_TIMEOUT_MS or its default.
        timeout = getattr(getattr(group, "options", None), "_timeout", None)
        made = SymmProcessGroup(
            dist.PrefixStore(f"symm/adopt/{name}/", store),
            group.rank(),
            group.size(),
            timeout if isinstance(timeout, timedelta) else None,  # type: ignore[arg-type]
        )
        _OVER_GROUPS[group] = made
    return made.comm, made


def _peer_addresses(handle: Any, what: str, world: int) -> list[int]:
    """``handle.buffer_ptrs`` (every rank's allocation, mapped in this process) as ints, checked
    to hold ``world`` entries."""
    pointers = [int(p) for p in handle.buffer_ptrs]
    if len(pointers) != world:
        raise InvalidArgumentError(f"adopt: the {what}'s handle has {len(pointers)} buffer_ptrs for {world} ranks")
    return pointers


def adopt(tensor: torch.Tensor, group: Any = None, *, symm_mem: Any = None) -> SymmetricMemory:
    """A symm window over a PyTorch symmetric tensor (``torch.distributed._symmetric_memory``):
    symm's collectives, the ``"symm"`` backend's and ``symm.triton``'s device functions then run
    on the tensor in place, next to PyTorch's own symmetric-memory operations on it::

        import torch.distributed._symmetric_memory as symm_mem
        t = symm_mem.empty(n, device="cuda")
        handle = symm.torch.adopt(t, group)         # collective
        handle.comm.all_reduce(t)                   # symm's collectives, in place
        kernel[grid](handle.device_context, 0, ...) # symm.triton's ctx, byte_offset

    The window covers the tensor's bytes: every rank's, mapped by PyTorch
    (``symm_mem.rendezvous(tensor, group)``'s ``buffer_ptrs``, at the tensor's offset from its
    allocation's base, which need not be 0). symm's barriers do not use PyTorch's signal pads
    (PyTorch's own operations need them back at zero after each use): the window gets pads of
    its own, a small ``symm_mem.empty`` allocation rendezvous'd on the same group. The window
    keeps the tensor and both handles alive until it is deregistered
    (``handle.window.deregister()``, collective).

    Collective: every rank calls it, in the same order, with a tensor of the same size at the
    same offset of its allocation (the ranks compare them and all raise if they differ). A
    tensor adopted already gets its handle at once.

    Args:
        tensor: a contiguous tensor in PyTorch symmetric memory, 16-byte aligned.
        group: the group PyTorch's rendezvous takes (default: the default group). symm's
            communicator: the group's own for a ``"symm"`` group (or a :class:`symm.Comm`
            whose ranks are the group's), else one symm communicator over the group's ranks,
            made through its store the first time.
        symm_mem: the symmetric-memory module (default ``torch.distributed._symmetric_memory``):
            anything with its ``empty(*size, dtype=, device=)`` and ``rendezvous(tensor,
            group)``, whose handles have ``buffer_ptrs``, ``rank`` and ``world_size``.

    Raises:
        InvalidArgumentError: a tensor that is not contiguous, not inside its handle's buffer,
            or a handle whose ranks are not the communicator's; ranks whose tensors differ, or
            a peer out of reach (on every rank).
    """
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"adopt takes a torch.Tensor, not {type(tensor).__name__}")
    if symm_mem is None:
        import torch.distributed._symmetric_memory as symm_mem
    torch_group = group
    if isinstance(group, _core.Comm):
        torch_group = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
    comm, pg = _symm_group_over(group)
    if torch_group is None and dist.is_initialized():
        torch_group = dist.distributed_c10d._get_default_group()
    ptr, extent = int(tensor.data_ptr()), _extent(tensor)
    for window in list(comm._windows):
        if window.registered and window.owner_objects is not None and window.base <= ptr < window.base + window.nbytes:
            if ptr + extent <= window.base + window.nbytes:
                return SymmetricMemory(comm, window, ptr - window.base, pg)
    if not tensor.is_contiguous():
        raise InvalidArgumentError(f"adopt: {_describe(tensor)} is not contiguous")
    handle = symm_mem.rendezvous(tensor, torch_group)
    world = comm.nranks
    if int(handle.world_size) != world or int(handle.rank) != comm.rank:
        raise InvalidArgumentError(
            f"adopt: PyTorch's handle is rank {handle.rank} of {handle.world_size}, the symm communicator's rank "
            f"{comm.rank} of {world}: pass the group the tensor was rendezvous'd on"
        )
    bases = _peer_addresses(handle, "tensor", world)
    offset = ptr - bases[comm.rank]
    size = int(getattr(handle, "buffer_size", offset + extent))
    if offset < 0 or offset + extent > size:
        raise InvalidArgumentError(
            f"adopt: {_describe(tensor)} at {ptr:#x} is not inside its symmetric allocation "
            f"[{bases[comm.rank]:#x}, +{size}) on rank {comm.rank}"
        )
    pad_bytes = comm.signal_pad_bytes
    pad = symm_mem.empty(pad_bytes, dtype=torch.uint8, device=tensor.device)
    pad_handle = symm_mem.rendezvous(pad, torch_group)
    pad_bases = _peer_addresses(pad_handle, "signal pad", world)
    pad_offset = int(pad.data_ptr()) - pad_bases[comm.rank]
    if pad_offset != 0:
        raise InvalidArgumentError(
            f"adopt: symm_mem.empty returned a signal pad {pad_offset} bytes into its allocation; symm needs it at "
            "the allocation's start (the same place on every rank)"
        )
    window = comm.register_peers(
        ptr,
        max(extent, 1),
        [base + offset for base in bases],
        [base + pad_offset for base in pad_bases],
        pad_bytes,
        owner="torch",
        owner_offset=offset,
        keep=(tensor, handle, pad, pad_handle),
    )
    return SymmetricMemory(comm, window, 0, pg)


def _exchange(comm: _core.Comm, state: _TensorState, descriptor: list[int]) -> list[list[int]]:
    """Every rank's ``descriptor``, all-gathered in the communicator's rendezvous window
    (registered by its first rendezvous, collectively), on PyTorch's current stream."""
    n = comm.nranks
    if state.check_window is None:
        buffer = comm.alloc(_FIELDS * (1 + n), "int64")
        state.check_window = comm.register(buffer)
        state.check_buffer = buffer
    buffer = state.check_buffer
    assert buffer is not None
    if comm.backend == "host":
        words = torch.from_numpy(buffer.numpy())
    else:
        words = torch.as_tensor(buffer, device=_memory_device(comm))
    words[:_FIELDS].copy_(torch.tensor(descriptor, dtype=torch.int64))
    try:
        comm.all_gather(words[:_FIELDS], words[_FIELDS:])
    except SymmError as error:
        if hasattr(error, "add_note"):
            error.add_note(
                f"in symm.torch.rendezvous #{descriptor[_F_SEQ]}: every rank must rendezvous a new allocation "
                "(a rank that did not, or whose allocation had a window already, leaves the others waiting)"
            )
        raise
    return words[_FIELDS:].cpu().view(n, _FIELDS).tolist()


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> SymmProcessGroup:
    return SymmProcessGroup(store, rank, size, timeout)


if BACKEND_NAME.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


def _user_window_of(comm: _core.Comm, tensor: torch.Tensor) -> Any:
    """The window of ``comm`` registered by the user that holds ``tensor``
    (contiguous), or None."""
    if not tensor.is_contiguous():
        return None
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    for window in list(comm._windows):
        if window.registered and window.base <= start and end <= window.base + window.nbytes:
            return window
    return None


def all_to_all_vdev(input: torch.Tensor, out: torch.Tensor, in_out_splits: torch.Tensor, group: Any = None) -> None:  # noqa: A002
    """All-to-all-v whose split sizes are in device memory, as PyTorch SymmMem's
    ``torch.ops.symm_mem.all_to_all_vdev(input, out, in_out_splits, group_name)``: no host
    synchronization (the token dispatch of a mixture of experts), on PyTorch's current stream.

    ``in_out_splits`` is an int64 tensor of shape ``(3, world)``: row 0, written before the call
    (by a kernel, say), holds how many elements (first-dimension rows times the rest) this rank
    sends to each rank, its segments packed in rank order at the start of ``input``; the call
    writes row 1 (the elements received from each rank) and row 2 (where each rank's segment
    starts in ``out``, in elements), and the segments packed in rank order at the start of
    ``out``. ``input.numel()`` and ``out.numel()`` are the capacities (``sendcount`` and
    ``recvcount`` in the library's messages), the same on every rank; split sizes beyond them
    are refused on every rank before anything is copied, and the communicator fails with that
    cause (the kernel finds it after the call returned). Arguments refused here on some ranks
    only make the other ranks' calls fail at once too.

    Tensors in windows of the group (:func:`empty` then :func:`rendezvous`, or
    :func:`mem_pool`) are used in place, each in its own window or not. Otherwise the library
    stages the call whole through its communicator's staging window (on the stream: still no
    host synchronization), which must hold both capacities and the table
    (``SYMM_STAGING_BYTES``).

    Raises:
        InvalidArgumentError: tensors of different dtypes, ``in_out_splits`` not int64 of shape
            ``(3, world)``, a tensor on another device, or a staged call larger than the staging
            window.
    """
    comm, pg = _resolve(group)
    world = comm.nranks
    memory = _memory_device(comm)
    stream = int(torch.cuda.current_stream(comm.device).cuda_stream) if comm.backend == "cuda" else 0

    def refuse(problem: str) -> None:
        # The peers' calls would wait for this rank's: the library counts it as this rank's
        # call, refused, and theirs fail at once naming it.
        comm._refuse_collective("symmAlltoAllvDevice", f"all_to_all_vdev: {problem}")
        raise InvalidArgumentError(f"all_to_all_vdev: {problem}")

    for name, tensor in (("input", input), ("out", out), ("in_out_splits", in_out_splits)):
        if not isinstance(tensor, torch.Tensor):
            refuse(f"{name} must be a torch.Tensor, not {type(tensor).__name__}")
        if tensor.device != memory:
            refuse(f"{name} is on {tensor.device}; the communicator's memory is on {memory}")
    if input.dtype != out.dtype:
        refuse(f"input is {input.dtype}, out {out.dtype}: want one dtype")
    if in_out_splits.dtype != torch.int64 or tuple(in_out_splits.shape) != (3, world):
        refuse(f"in_out_splits is {in_out_splits.dtype} of shape {tuple(in_out_splits.shape)}: want torch.int64 of shape (3, {world})")
    try:
        code = SymmProcessGroup._check(input)
    except SymmError as error:
        refuse(str(error))
    if pg is not None and pg._pending:
        pg._flush_peer_ops()
    windows = [_user_window_of(comm, t) for t in (input, out, in_out_splits)]
    if all(w is not None for w in windows):
        if pg is not None:
            pg._note("all_to_all_vdev", "window", input)
        check(
            lib.symmAlltoAllvDevice(
                input.data_ptr(), input.numel(), out.data_ptr(), out.numel(), in_out_splits.data_ptr(), code, comm.handle, stream
            )
        )
        return
    if pg is not None:
        pg._note("all_to_all_vdev", "staged", input)
    # The library stages the call whole through its communicator's staging window.
    send = input.contiguous()
    recv = out if out.is_contiguous() else out.contiguous()
    table = in_out_splits if in_out_splits.is_contiguous() else in_out_splits.contiguous()
    check(
        lib.symmAlltoAllvDevice(send.data_ptr(), input.numel(), recv.data_ptr(), out.numel(), table.data_ptr(), code, comm.handle, stream)
    )
    if recv is not out:
        out.copy_(recv)
    if table is not in_out_splits:
        in_out_splits[1:].copy_(table[1:])
