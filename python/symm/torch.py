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
    dist.barrier()

Each process group is one symm communicator. Its unique id travels through the group's store
(rank 0 makes it; when ``MASTER_ADDR`` names another host than this one's loopback, the root
listens on ``MASTER_ADDR``, as torchrun's store does). Every group owns a scratch window
(``SYMM_TORCH_SCRATCH_BYTES``, default 32 MiB): a tensor that does not lie in a registered
window of the group is copied into it, the collective runs there, and the result is copied back
— correct for any tensor, slower than a tensor already in a window, which the collective uses in
place (the window path). ``SYMM_DEBUG=INFO`` says which path each kind of collective took the
first time, ``SYMM_DEBUG=TRACE`` every time.

CPU tensors run on the host backend, CUDA tensors on the cuda backend, on PyTorch's current
stream. Calls complete before they return (stream-ordered on a GPU): ``async_op=True`` returns
a completed work object, and ``wait()`` returns at once.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from . import _core
from ._convert import resolve_dtype
from .errors import InvalidArgumentError, UnsupportedError

__all__ = ["BACKEND_NAME", "SymmProcessGroup", "scratch_bytes"]

#: The name ``dist.init_process_group`` takes.
BACKEND_NAME = "symm"
#: The store key of a group's unique id.
_UID_KEY = "symm/unique_id"


def scratch_bytes() -> int:
    """Bytes of each group's scratch window: ``SYMM_TORCH_SCRATCH_BYTES`` (at least 4096),
    default 32 MiB."""
    text = os.environ.get("SYMM_TORCH_SCRATCH_BYTES")
    if text is None:
        return 32 << 20
    try:
        value = int(text)
    except ValueError:
        raise InvalidArgumentError(f"SYMM_TORCH_SCRATCH_BYTES={text!r} is not an integer") from None
    if value < 4096:
        raise InvalidArgumentError(f"SYMM_TORCH_SCRATCH_BYTES={value}: at least 4096")
    return value


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
    raise UnsupportedError(f"ReduceOp {op} is not one symm has (SUM, PRODUCT, MIN, MAX, AVG)")


def _op_of(opts: Any) -> str:
    """symm's operator of a collective's options (``SUM`` without options)."""
    return "sum" if opts is None else _op_name(opts.reduceOp)


def _done(result: Any) -> Any:
    future: Future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


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
        self.comm = _core.Comm(size, uid, rank)
        """The group's communicator."""
        self._scratch = self.comm.alloc(scratch_bytes())
        self._scratch_window = self.comm.register(self._scratch)
        self._scratch_tensor: torch.Tensor | None = None
        self._logged: set[tuple[str, str]] = set()

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"SymmProcessGroup(rank {self._rank} of {self._size}, {self.comm.backend} backend)"

    # -- paths ---------------------------------------------------------------------------------

    def _device(self) -> torch.device:
        return torch.device("cpu") if self.comm.backend == "host" else torch.device("cuda", self.comm.device)

    def _scratch_bytes_tensor(self) -> torch.Tensor:
        """The scratch window as a uint8 tensor on the communicator's device."""
        if self._scratch_tensor is None:
            if self.comm.backend == "host":
                self._scratch_tensor = torch.from_numpy(self._scratch.numpy())
            else:
                self._scratch_tensor = torch.as_tensor(self._scratch, device=self._device())
        return self._scratch_tensor

    def _scratch_of(self, dtype: torch.dtype, offset: int, count: int) -> torch.Tensor:
        """``count`` elements of ``dtype`` at byte ``offset`` of the scratch window."""
        size = torch.empty((), dtype=dtype).element_size()
        return self._scratch_bytes_tensor()[offset : offset + count * size].view(dtype)

    def _in_window(self, *tensors: torch.Tensor) -> bool:
        """Whether every tensor lies, contiguous and on the communicator's device, in a window
        of this group registered by the user (not the scratch window)."""
        for tensor in tensors:
            if not tensor.is_contiguous() or tensor.device != self._device():
                return False
            start = tensor.data_ptr()
            end = start + tensor.numel() * tensor.element_size()
            if not any(
                w is not self._scratch_window and w.registered and w.base <= start and end <= w.base + w.nbytes
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
                else "staged through the group's scratch window (the tensor is not in a registered window: correct, slower)"
            )
            _log(self._rank, "INFO", f"{kind} of {tensor.numel()} {tensor.dtype} {how}")
        self._logged.add((kind, path))

    def _chunk_elements(self, element_size: int, per_element: int) -> int:
        """Elements per chunk when each element needs ``per_element`` elements of scratch (and
        the receive region starts at the next 256-byte boundary)."""
        return max(1, (self._scratch.nbytes - 256) // (element_size * per_element))

    @staticmethod
    def _check(tensor: torch.Tensor) -> None:
        resolve_dtype(str(tensor.dtype))  # raises for a type symm has not
        if tensor.is_complex():
            raise UnsupportedError(f"{tensor.dtype}: symm has no complex types")

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
        self._check(tensor)
        if tensor.numel() == 0:
            return
        if self._in_window(tensor):
            self._note("all_reduce", "window", tensor)
            self.comm.all_reduce(tensor, op=op, stream=self._stream())
            return
        self._note("all_reduce", "staged", tensor)
        self._staged_in_place(tensor, lambda staged: self.comm.all_reduce(staged, op=op, stream=self._stream()))

    def _staged_in_place(self, tensor: torch.Tensor, run: Any, send: bool = True, receive: bool = True) -> None:
        """Run ``run(staged)`` on each chunk of ``tensor`` copied into the scratch window
        (when ``send``), and copy each result back (when ``receive``)."""
        flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor.contiguous().reshape(-1)
        chunk = self._chunk_elements(tensor.element_size(), 1)
        for start in range(0, flat.numel(), chunk):
            part = flat[start : start + chunk]
            staged = self._scratch_of(tensor.dtype, 0, part.numel())
            if send:
                staged.copy_(part)
            run(staged)
            if receive:
                part.copy_(staged)
        if not tensor.is_contiguous() and receive:
            tensor.copy_(flat.view(tensor.shape))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        self._all_gather(output, input)
        return _done([output])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:  # noqa: A002
        return self.all_gather_single(output, input, opts)

    def _all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:  # noqa: A002
        self._check(input)
        n, size = input.numel(), self._size
        if output.numel() != n * size or output.dtype != input.dtype:
            raise InvalidArgumentError(
                f"all_gather: output has {output.numel()} {output.dtype}, want {size} x {n} {input.dtype}"
            )
        if n == 0:
            return
        if self._in_window(output, input):
            self._note("all_gather", "window", input)
            self.comm.all_gather(input.reshape(-1), output.reshape(-1), stream=self._stream())
            return
        self._note("all_gather", "staged", input)
        flat_in = input.contiguous().reshape(-1)
        rows = torch.empty((size, n), dtype=input.dtype, device=output.device) if not output.is_contiguous() else output.view(size, n)
        chunk = self._chunk_elements(input.element_size(), 1 + size)
        element = input.element_size()
        for start in range(0, n, chunk):
            c = min(chunk, n - start)
            send = self._scratch_of(input.dtype, 0, c)
            recv_offset = (c * element + 255) // 256 * 256
            recv = self._scratch_of(input.dtype, recv_offset, c * size)
            send.copy_(flat_in[start : start + c])
            self.comm.all_gather(send, recv, stream=self._stream())
            rows[:, start : start + c].copy_(recv.view(size, c))
        if not output.is_contiguous():
            output.copy_(rows.view(output.shape))

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
        self._check(input)
        n, size = output.numel(), self._size
        if input.numel() != n * size or output.dtype != input.dtype:
            raise InvalidArgumentError(
                f"reduce_scatter: input has {input.numel()} {input.dtype}, want {size} x {n} {output.dtype}"
            )
        if n == 0:
            return
        if self._in_window(output, input):
            self._note("reduce_scatter", "window", output)
            self.comm.reduce_scatter(input.reshape(-1), output.reshape(-1), op=op, stream=self._stream())
            return
        self._note("reduce_scatter", "staged", output)
        rows = input.contiguous().view(size, n)
        flat_out = output.reshape(-1) if output.is_contiguous() else torch.empty(n, dtype=output.dtype, device=output.device)
        chunk = self._chunk_elements(input.element_size(), 1 + size)
        element = input.element_size()
        for start in range(0, n, chunk):
            c = min(chunk, n - start)
            send = self._scratch_of(input.dtype, 0, c * size)
            recv_offset = (c * size * element + 255) // 256 * 256
            recv = self._scratch_of(input.dtype, recv_offset, c)
            send.view(size, c).copy_(rows[:, start : start + c])
            self.comm.reduce_scatter(send, recv, op=op, stream=self._stream())
            flat_out[start : start + c].copy_(recv)
        if not output.is_contiguous():
            output.copy_(flat_out.view(output.shape))

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
        self._check(tensor)
        if tensor.numel() == 0:
            return
        if self._in_window(tensor):
            self._note("broadcast", "window", tensor)
            self.comm.broadcast(tensor, root=root, stream=self._stream())
            return
        self._note("broadcast", "staged", tensor)
        self._staged_in_place(
            tensor,
            lambda staged: self.comm.broadcast(staged, root=root, stream=self._stream()),
            send=self._rank == root,
            receive=self._rank != root,
        )

    def barrier(self, opts: Any = None) -> Any:
        self.comm.barrier(stream=self._stream())
        if self.comm.backend == "cuda":
            torch.cuda.current_stream(self.comm.device).synchronize()
        return _done(None)


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> SymmProcessGroup:
    return SymmProcessGroup(store, rank, size, timeout)


if BACKEND_NAME.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
