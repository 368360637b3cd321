"""Tensors in windows (``symm.torch.empty``, ``mem_pool``, ``rendezvous``) under torchrun, 2
and 4 processes on the host backend (CPU tensors): see torch_windows_worker.py; on a machine
with GPUs, the same with CUDA tensors from ``symm.torch.mem_pool``. Skipped where PyTorch is
not installed (``cargo xtask test`` runs it in a virtual environment with PyTorch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).parent
WORKER = HERE / "torch_windows_worker.py"
ABORT_WORKER = HERE / "torch_abort_worker.py"
EXAMPLE = HERE.parents[1] / "examples" / "torch" / "symmetric_tensors.py"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nprocs: int, script: Path, *args: str, **env: str) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nprocs}",
        f"--master-port={free_port()}",
        str(script),
        *args,
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "SYMM_TIMEOUT_MS": "20000", **env}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]
    return output


@pytest.mark.parametrize("nprocs", [2, 4])
def test_rendezvous_and_collectives_in_windows(nprocs: int) -> None:
    output = torchrun(nprocs, WORKER, SYMM_BACKEND="host", SYMM_DEBUG="INFO")
    for rank in range(nprocs):
        assert f"rank {rank}: " in output and "checks OK" in output, output[-6000:]
    # SYMM_DEBUG=INFO: every collective on these tensors took the window path.
    assert "torch: all_reduce of 1000 torch.float32 in its window (no copy)" in output, output[-6000:]
    for kind in ("all_gather", "reduce_scatter", "broadcast"):
        assert f"torch: {kind} of 37 torch.int32 in its window (no copy)" in output, output[-6000:]
    assert "staged through the communicator's staging window" not in output, output[-6000:]
    # The pool allocator's refused allocation says why.
    assert "mem_pool: symmMemAlloc of 0 bytes on device 0 failed" in output


def test_ranks_whose_tensors_take_different_paths_fail_on_every_rank() -> None:
    """Rank 0's tensor in a window, rank 1's not: the window path on one rank and a staged call
    on the other, refused (or, for the rank that
    launched first, failed) on every rank with no tensor changed."""
    output = torchrun(2, WORKER, "--paths-disagree", SYMM_BACKEND="host", SYMM_TIMEOUT_MS="60000")
    lines = [line for line in output.splitlines() if "paths disagree:" in line]
    assert len(lines) == 2, output[-6000:]
    assert sorted(line.split(":", 1)[0] for line in lines) == ["rank 0", "rank 1"], lines
    assert any(
        "InvalidUsageError" in line and ("staged vs in windows" in line or "in windows vs staged" in line) for line in lines
    ), lines


def test_abort_through_pytorch_ends_every_rank_s_calls_and_destroy_frees() -> None:
    """``_abort_process_group`` on rank 0 while its all-reduce waits for rank 1 (bound 20 s):
    the wait ends and the abort returns at once, rank 1's next call fails at once naming the
    abort, and rank 1's ``destroy_process_group`` destroys its rank (torch_abort_worker.py)."""
    output = torchrun(2, ABORT_WORKER, SYMM_BACKEND="host")
    assert "rank 0: the abort returned in" in output, output[-6000:]
    assert "rank 1: its next all_reduce failed after" in output, output[-6000:]
    assert "rank 0: destroyed" in output and "rank 1: destroyed" in output, output[-6000:]


def test_the_wait_bound_is_the_groups_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    import symm
    import symm.torch as st

    monkeypatch.delenv("SYMM_TIMEOUT_MS", raising=False)
    assert st.wait_bound_ms(timedelta(minutes=30)) == 1_800_000
    assert st.wait_bound_ms(timedelta(milliseconds=1500)) == 1500
    assert st.wait_bound_ms(timedelta(microseconds=10)) == 1
    assert st.wait_bound_ms(None) == 10_000
    monkeypatch.setenv("SYMM_TIMEOUT_MS", "3000")
    assert st.wait_bound_ms(timedelta(minutes=30)) == 3000
    assert st.wait_bound_ms(timedelta(seconds=2)) == 2000
    assert st.wait_bound_ms(None) == 3000
    monkeypatch.setenv("SYMM_TIMEOUT_MS", "soon")
    with pytest.raises(symm.InvalidArgumentError, match="SYMM_TIMEOUT_MS"):
        st.wait_bound_ms(timedelta(seconds=2))


def test_the_example_runs_on_cpu() -> None:
    output = torchrun(2, EXAMPLE, SYMM_BACKEND="host")
    assert "2 ranks: all_reduce in the window, no copy" in output, output[-6000:]


def test_mem_pool_refuses_the_host_backend_and_a_torch_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import symm
    import symm.torch as st

    (comm,) = symm.Comm.init_all(1)
    try:
        with pytest.raises(symm.UnsupportedError, match="host backend.*symm.torch.empty"):
            st.mem_pool(comm)
        if not torch.cuda.is_available():
            monkeypatch.setattr(comm, "backend", "cuda")
            with pytest.raises(symm.UnsupportedError, match="cannot use CUDA"):
                st.mem_pool(comm)
        with pytest.raises(symm.InvalidArgumentError, match="not a process group of the 'symm' backend"):
            st.mem_pool(object())
    finally:
        comm.destroy()


def test_rendezvous_in_one_process() -> None:
    """One rank: a handle, a view of it, a refused tensor, the pool allocator's memory."""
    import ctypes

    import symm
    import symm.torch as st

    (comm,) = symm.Comm.init_all(1)
    try:
        t = st.empty(4, 8, dtype=torch.bfloat16, group=comm)
        assert t.shape == (4, 8) and t.dtype == torch.bfloat16 and bool((t == 0).all())
        handle = st.rendezvous(t, comm)
        assert (handle.rank, handle.world_size, handle.offset, handle.buffer_size) == (0, 1, 0, 64)
        assert handle.buffer_ptrs == [t.data_ptr()] and handle.device_context == handle.window.device_context
        assert st.rendezvous(t[1], comm).offset == 16
        with pytest.raises(symm.InvalidArgumentError, match="empty: the communicator's memory is on cpu"):
            st.empty(3, device="cuda:0", group=comm)
        with pytest.raises(symm.InvalidArgumentError, match="not in memory from symm"):
            st.rendezvous(torch.ones(3), comm)
        with pytest.raises(symm.InvalidUsageError, match="no process group"):
            st.rendezvous(t)
        # A window over part of an allocation that does not cover the tensor.
        buffer = comm.alloc(4096)
        comm.register(buffer, 1024)
        outside = torch.from_numpy(buffer.numpy())[2048:2064]
        with pytest.raises(symm.InvalidArgumentError, match="that does not cover it"):
            st.rendezvous(outside, comm)
        # The pool's allocator: what torch calls; freeing deregisters the window first.
        allocator = st._PoolAllocator(comm)
        st._state(comm).allocator = allocator
        ptr = st._ALLOC_FN(allocator.alloc_pointer)(1 << 16, 0, None)
        pooled = torch.frombuffer((ctypes.c_char * (1 << 16)).from_address(ptr), dtype=torch.int64)
        pooled_handle = st.rendezvous(pooled[8:], comm)
        assert pooled_handle.offset == 64 and pooled_handle.buffer_size == 1 << 16
        pooled.fill_(3)
        comm.all_reduce(pooled, op="prod")
        assert bool((pooled == 3).all())
        del pooled
        st._FREE_FN(allocator.free_pointer)(ptr, 1 << 16, 0, None)
        assert not pooled_handle.window.registered and allocator.segments == {}
    finally:
        comm.destroy()
    # Once its communicator is gone, the pool's allocator refuses (torch then raises OOM).
    assert st._ALLOC_FN(allocator.alloc_pointer)(4096, 0, None) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("nprocs", [2])
def test_cuda_tensors_from_the_mem_pool(nprocs: int) -> None:
    saved = os.environ.pop("SYMM_BACKEND", None)  # conftest.py chose the host backend
    try:
        output = torchrun(nprocs, WORKER, "--cuda", SYMM_DEBUG="INFO")
    finally:
        if saved is not None:
            os.environ["SYMM_BACKEND"] = saved
    assert "checks OK" in output and "staged through" not in output, output[-6000:]
    assert "torch: all_reduce of 1000 torch.float32 in its window (no copy)" in output, output[-6000:]
