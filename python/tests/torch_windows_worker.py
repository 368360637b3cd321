"""One rank of the symmetric-tensor tests (test_torch_windows.py), started by torchrun: tensors
in symm memory (``symm.torch.empty``, ``comm.alloc`` buffers, the pool allocator's
allocations), ``symm.torch.rendezvous`` and its handle, collectives on such tensors taking the
window path (no copy), bit for bit, and the refusals: a tensor not in symm memory, ranks whose
tensors differ. With ``--cuda`` (one GPU per rank, or ranks sharing GPUs), the same on CUDA
tensors from ``symm.torch.mem_pool``. Prints "rank R: N checks OK"."""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as dist

import symm
import symm.torch as st

CUDA = "--cuda" in sys.argv


def expect_error(kind: type, text: str, call: object) -> str:
    """Run ``call()``; it must raise ``kind`` with ``text`` in its message."""
    try:
        call()  # type: ignore[operator]
    except kind as error:
        assert text in str(error), f"{kind.__name__} without {text!r}: {error}"
        return str(error)
    raise AssertionError(f"no {kind.__name__} ({text!r})")


def main() -> None:
    if CUDA:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("symm")
    rank, size = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()
    comm = group.comm
    device = torch.device("cuda", comm.device) if CUDA else torch.device("cpu")
    assert comm.backend == ("cuda" if CUDA else "host"), comm.backend
    state = st._state(comm)
    checks = 0

    def window_path(kind: str, call: object) -> None:
        """``call()`` makes exactly one collective of ``kind``, on the window path."""
        before = Counter(group.path_counts)
        call()  # type: ignore[operator]
        assert group.path_counts[kind, "window"] == before[kind, "window"] + 1, (kind, group.path_counts)
        assert group.path_counts[kind, "staged"] == before[kind, "staged"], (kind, group.path_counts)

    # -- a tensor from empty(), its handle ------------------------------------------------------
    n = 1000
    t = st.empty(n, dtype=torch.float32)
    assert t.device == device and t.shape == (n,) and t.dtype == torch.float32
    windows = len(comm._windows)
    handle = st.rendezvous(t)
    assert len(comm._windows) == windows + 2  # and the communicator's rendezvous window, the first time
    assert handle.rank == rank and handle.world_size == size and handle.group is group
    assert handle.offset == 0 and handle.window.registered and handle.window in comm._windows
    assert handle.buffer_ptr == t.data_ptr() == handle.window.base
    assert handle.buffer_size >= n * 4 and (CUDA or handle.buffer_size == n * 4), handle.buffer_size
    assert handle.device == device
    ctx = handle.device_context
    assert ctx != 0 and ctx == handle.window.device_context
    backend, version, ctx_rank, ctx_world, local_base, window_size, _ = st._CONTEXT_HEAD.unpack(
        st._read(comm, ctx, st._CONTEXT_HEAD.size)
    )
    assert (backend, version, ctx_rank, ctx_world) == (0, 1, rank, size)
    assert local_base == handle.buffer_ptr and window_size == handle.buffer_size
    ptrs = handle.buffer_ptrs
    assert len(ptrs) == size and ptrs[rank] == handle.buffer_ptr and all(ptrs), ptrs
    checks += 1

    # -- collectives on it: the window path, exact -----------------------------------------------
    t.fill_(rank + 1.0)
    window_path("all_reduce", lambda: dist.all_reduce(t))
    assert bool((t == size * (size + 1) / 2).all()), t[:8]
    t.copy_(torch.arange(n, dtype=torch.float32, device=device) * (rank + 1))
    window_path("all_reduce", lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX))
    assert torch.equal(t, torch.arange(n, dtype=torch.float32, device=device) * size)
    checks += 2

    # -- every rank's window through get_buffer ------------------------------------------------
    t.fill_(float(rank))
    dist.barrier()
    for peer in range(size):
        assert bool((handle.get_buffer(peer, (n,), torch.float32) == peer).all()), peer
        assert bool((handle.get_buffer(peer, (2, 5), torch.float32, storage_offset=10) == peer).all())
    dist.barrier()
    # The window is the whole allocation under the tensor (on CUDA a pool segment of at least
    # the allocation granularity, far past the tensor's n elements): a view up to its end is
    # valid, one element more overruns it.
    whole = handle.buffer_size // 4
    assert whole >= n, (whole, n)
    assert handle.get_buffer(size - 1, (whole,), torch.float32).numel() == whole
    expect_error(symm.InvalidArgumentError, "overrun", lambda: handle.get_buffer(0, (whole + 1,), torch.float32))
    expect_error(
        symm.InvalidArgumentError, "overrun", lambda: handle.get_buffer(0, (1,), torch.float32, storage_offset=whole)
    )
    checks += 1

    # -- a view of a rendezvous'd allocation: the same window, no communication ----------------
    seq = state.seq
    view = st.rendezvous(t[10:20])
    assert view.window is handle.window and view.offset == 40 and state.seq == seq
    checks += 1

    # -- all-gather, in and out of place; reduce-scatter; broadcast ----------------------------
    count = 37
    part = st.empty(count, dtype=torch.int32)
    whole = st.empty(size * count, dtype=torch.int32)
    st.rendezvous(part)
    st.rendezvous(whole)
    part.copy_(torch.arange(count, dtype=torch.int32, device=device) + 1000 * rank)
    expected = torch.cat([torch.arange(count, dtype=torch.int32) + 1000 * r for r in range(size)]).to(device)
    window_path("all_gather", lambda: dist.all_gather_into_tensor(whole, part))
    assert torch.equal(whole, expected), whole
    whole.zero_()
    mine = whole[rank * count : (rank + 1) * count]
    mine.copy_(torch.arange(count, dtype=torch.int32, device=device) + 1000 * rank)
    assert st.rendezvous(mine).offset == rank * count * 4  # the ranks' offsets differ: cached, no exchange
    window_path("all_gather", lambda: dist.all_gather_into_tensor(whole, mine))
    assert torch.equal(whole, expected), whole
    whole.copy_(torch.arange(size * count, dtype=torch.int32, device=device) * (rank + 1))
    window_path("reduce_scatter", lambda: dist.reduce_scatter_tensor(part, whole))
    total = size * (size + 1) // 2
    assert torch.equal(part, torch.arange(rank * count, (rank + 1) * count, dtype=torch.int32, device=device) * total)
    part.fill_(rank * 7)
    window_path("broadcast", lambda: dist.broadcast(part, src=size - 1))
    assert bool((part == (size - 1) * 7).all()), part
    checks += 4

    # -- a tensor over a comm.alloc buffer, rendezvous'd on the communicator itself -------------
    buffer = comm.alloc(64, "float64")
    x = torch.from_numpy(buffer.numpy()) if not CUDA else torch.as_tensor(buffer, device=device)
    x_handle = st.rendezvous(x, comm)
    assert x_handle.window.buffer is buffer and x_handle.group is None and x_handle.offset == 0
    x.fill_(0.5 * (rank + 1))
    window_path("all_reduce", lambda: dist.all_reduce(x, op=dist.ReduceOp.SUM))
    assert bool((x == 0.5 * size * (size + 1) / 2).all()), x
    checks += 1

    # -- refusals: not symm memory, on every rank or on one -------------------------------------
    windows = len(comm._windows)
    plain = torch.zeros(8, device=device)
    expect_error(symm.InvalidArgumentError, "not in memory from symm", lambda: st.rendezvous(plain))
    y = st.empty(8)
    if rank == 0:
        expect_error(symm.InvalidArgumentError, "not in memory from symm", lambda: st.rendezvous(plain))
    else:
        expect_error(symm.InvalidUsageError, "rank 0: its tensor is not in memory from symm", lambda: st.rendezvous(y))
    expect_error(symm.InvalidArgumentError, "rendezvous takes a torch.Tensor", lambda: st.rendezvous([1.0]))
    if not CUDA:
        expect_error(symm.InvalidArgumentError, "on cpu", lambda: st.rendezvous(torch.zeros(2, device="meta")))
    assert len(comm._windows) == windows  # nothing registered
    checks += 3

    # -- the ranks' tensors differ (order mismatch, offsets): detected on every rank ------------
    a, b = st.empty(256), st.empty(512)
    if size > 1:
        first = a if rank % 2 == 0 else b
        message = expect_error(symm.InvalidUsageError, "the ranks' tensors differ", lambda: st.rendezvous(first))
        assert "256 elements" in message and "512 elements" in message, message
        c = st.empty(64)
        shifted = c[8:16] if rank % 2 else c[0:8]
        message = expect_error(symm.InvalidUsageError, "the ranks' tensors differ", lambda: st.rendezvous(shifted))
        # The allocation is the tensor's own on the host; on CUDA the pool segment holding it.
        sizes = re.findall(r"at byte (0|32) of a (\d+)-byte allocation", message)
        assert {at for at, _ in sizes} == {"0", "32"}, message
        assert len({nbytes for _, nbytes in sizes}) == 1, message
        assert CUDA or sizes[0][1] == "256", message
    assert len(comm._windows) == windows
    # In the same order on every rank, they register, and the communicator is healthy.
    a_handle, b_handle = st.rendezvous(a), st.rendezvous(b)
    # On the host each has its own allocation; on CUDA both may lie in one pool segment, which
    # then has one window.
    registered = len({id(a_handle.window), id(b_handle.window)})
    assert (CUDA or registered == 2) and len(comm._windows) == windows + registered
    a.fill_(1.0)
    window_path("all_reduce", lambda: dist.all_reduce(a))
    assert bool((a == size).all())
    checks += 3

    # -- the pool's allocator -------------------------------------------------------------------
    if not CUDA:
        expect_error(symm.UnsupportedError, "host backend", lambda: st.mem_pool(group))
        # Its C functions, as torch calls them, on the host backend's memory.
        allocator = st._PoolAllocator(comm)
        state.allocator = allocator
        alloc = st._ALLOC_FN(allocator.alloc_pointer)
        free = st._FREE_FN(allocator.free_pointer)
        ptr = alloc(8192, 0, None)
        assert ptr and allocator.segments == {ptr: 8192}
        pooled = torch.frombuffer((ctypes.c_char * 8192).from_address(ptr), dtype=torch.float32)
        pooled_handle = st.rendezvous(pooled[256:], group)
        assert pooled_handle.window.base == ptr and pooled_handle.buffer_size == 8192
        assert pooled_handle.offset == 1024 and pooled_handle.window.buffer is None
        pooled.fill_(rank + 2.0)
        window_path("all_reduce", lambda: dist.all_reduce(pooled))
        assert bool((pooled == sum(r + 2.0 for r in range(size))).all())
        dist.barrier()  # every rank is done with the window before one frees its memory
        del pooled
        free(ptr, 8192, 0, None)
        assert not pooled_handle.window.registered and allocator.segments == {}
        assert alloc(0, 0, None) is None  # symmMemAlloc refuses 0 bytes: NULL, and a WARN line
        state.allocator = None
    else:
        pool = st.mem_pool(group)
        assert st.mem_pool() is pool and st.mem_pool(comm) is pool
        with torch.cuda.use_mem_pool(pool):
            z = torch.empty(3000, device="cuda")
        assert st._state(comm).allocator.segment_of(z.data_ptr(), z.numel() * 4) is not None
        z_handle = st.rendezvous(z)
        z.fill_(rank + 1.0)
        window_path("all_reduce", lambda: dist.all_reduce(z))
        assert bool((z == size * (size + 1) / 2).all())
        torch.cuda.synchronize()
        checks += 1
        assert z_handle.buffer_size >= 3000 * 4
    checks += 1

    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {checks} checks OK", flush=True)


def report(line: str) -> None:
    """Writes ``line`` and its newline to the standard output in one write, so that it reaches
    the pipe the ranks share whole: a ``print`` may write the text and the newline apart, and
    another rank's line can land between them."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def paths_disagree() -> None:
    """``--paths-disagree``: rank 0's tensor is in a window (the window path), every other
    rank's is not (staged through the communicator's staging window). A staged call never pairs
    with a call in windows: every rank must refuse it, or fail on, instead of returning another
    rank's data: each rank raises a symm error, and no rank's tensor changes. Prints "rank R:
    paths disagree: <error class>: <message>"."""
    dist.init_process_group("symm", timeout=timedelta(seconds=2))
    rank = dist.get_rank()
    group = dist.distributed_c10d._get_default_group()
    # The group's timeout bounds its waits (SYMM_TIMEOUT_MS, set longer, does not).
    assert group.wait_bound_ms == 2000, group.wait_bound_ms
    in_window = st.empty(1000, dtype=torch.float32)
    st.rendezvous(in_window)
    plain = torch.empty(1000, dtype=torch.float32)
    tensor = in_window if rank == 0 else plain
    tensor.fill_(rank + 1.0)
    try:
        dist.all_reduce(tensor)
    except symm.SymmError as error:
        outcome = f"{type(error).__name__}: {error}"
    else:
        raise AssertionError(f"rank {rank}: success for ranks whose tensors are in different windows: {tensor[:4]}")
    assert bool((tensor == rank + 1.0).all()), f"rank {rank}: the refused call wrote {tensor[:4]}"
    path = "window" if rank == 0 else "staged"
    assert group.path_counts["all_reduce", path] == 1, group.path_counts
    report(f"rank {rank}: paths disagree: {outcome}")
    # The communicator has failed: only teardown remains.
    group.comm.destroy()


if __name__ == "__main__":
    if "--paths-disagree" in sys.argv:
        paths_disagree()
    else:
        main()
