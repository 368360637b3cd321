"""One rank of the tests of ``symm.torch.adopt`` (test_torch_adopt.py), started by torchrun on
the host backend: tensors of another owner of symmetric memory (fake_symm_mem.py, which maps
every rank's allocation into each process at addresses of its own, as PyTorch's CUDA symmetric
memory does) adopted as symm windows, at a non-zero offset of their allocations; symm's
collectives on them exact; the owner's own signal pads still zero after; the device context's
peer table the owner's addresses; ranks whose tensors lie at different offsets refused on every
rank. The default group is gloo (a user's job whose group is not symm's), or ``"symm"`` with
``--symm-group``, where ``dist.all_reduce`` itself takes the window path. Prints "rank R: N
checks OK"."""

from __future__ import annotations

import os
import sys
from collections import Counter

import torch
import torch.distributed as dist

import symm
import symm.torch as st
from fake_symm_mem import FakeSymmMem

SYMM_GROUP = "--symm-group" in sys.argv


def expect_error(kind: type, text: str, call: object) -> str:
    try:
        call()  # type: ignore[operator]
    except kind as error:
        assert text in str(error), f"{kind.__name__} without {text!r}: {error}"
        return str(error)
    raise AssertionError(f"no {kind.__name__} ({text!r})")


def value(rank: int, i: torch.Tensor, round_: int) -> torch.Tensor:
    """Small integers: their sums are exact in float32."""
    return ((rank * 7 + i * 3 + round_ * 11) % 64).to(torch.float32)


def main() -> None:
    dist.init_process_group("symm" if SYMM_GROUP else "gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    fake = FakeSymmMem(os.environ["FAKE_SYMM_MEM_DIR"], rank, size)
    checks = 0

    # -- a tensor 64 elements into its allocation -------------------------------------------------
    n = 4099
    allocation = fake.empty(n + 64, dtype=torch.float32)
    t = allocation[64:]
    handle = st.adopt(t, symm_mem=fake)
    comm = handle.comm
    assert comm.backend == "host" and comm.nranks == size and comm.rank == rank, comm
    assert handle.offset == 0 and handle.window.nbytes == 4 * n, handle
    # The device context's peer table is the owner's addresses, as this process maps them.
    owner = handle.window.owner_objects[1]
    assert handle.buffer_ptrs == [p + 4 * 64 for p in owner.buffer_ptrs], (handle.buffer_ptrs, owner.buffer_ptrs)
    assert handle.buffer_ptrs[rank] == t.data_ptr()
    assert handle.device_context != 0
    checks += 2
    # Adopting it again: the same window, no communication.
    again = st.adopt(t, symm_mem=fake)
    assert again.window is handle.window
    checks += 1

    # -- every collective, rounds of mixed calls on the one window --------------------------------
    index = torch.arange(n)
    other = fake.empty(size * n + 16, dtype=torch.float32)[16:]
    gathered = st.adopt(other, symm_mem=fake)
    assert gathered.comm is comm
    for round_ in range(12):
        t.copy_(value(rank, index, round_))
        comm.all_reduce(t)
        want = sum(value(r, index, round_).to(torch.float64) for r in range(size))
        assert torch.equal(t.to(torch.float64), want), f"all-reduce round {round_}"
        comm.all_gather(t, other)
        for r in range(size):
            assert torch.equal(other[r * n : (r + 1) * n].to(torch.float64), want), f"all-gather round {round_}"
        t.copy_(-value(rank, index, round_))
        comm.broadcast(t, root=size - 1)
        assert torch.equal(t, -value(size - 1, index, round_)), f"broadcast round {round_}"
        segments = torch.arange(size * n)
        other.copy_(value(rank, segments, round_))
        comm.reduce_scatter(other, t)
        want = sum(value(r, segments[rank * n : (rank + 1) * n], round_).to(torch.float64) for r in range(size))
        assert torch.equal(t.to(torch.float64), want), f"reduce-scatter round {round_}"
        checks += 4
    # symm wrote no byte of the owner's own pads (PyTorch's barrier needs them at zero).
    assert fake.owner_pad_is_zero(), "an owner's signal pad was written"
    checks += 1

    # -- the "symm" process group adopt made over the gloo group: its all-reduce in place --------
    if not SYMM_GROUP:
        over = handle.group
        assert over is not None and over.comm is comm, over
        before = Counter(over.path_counts)
        t.fill_(rank + 1)
        over.allreduce([t]).wait()
        assert torch.equal(t, torch.full((n,), float(size * (size + 1) // 2))), t[:4]
        assert over.path_counts["all_reduce", "window"] == before["all_reduce", "window"] + 1, over.path_counts
        checks += 2

    # -- through the "symm" process group: dist.all_reduce takes the window path ------------------
    if SYMM_GROUP:
        group = dist.distributed_c10d._get_default_group()
        before = Counter(group.path_counts)
        t.fill_(rank + 1)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((n,), float(size * (size + 1) // 2))), t[:4]
        assert group.path_counts["all_reduce", "window"] == before["all_reduce", "window"] + 1, group.path_counts
        assert group.path_counts["all_reduce", "staged"] == before["all_reduce", "staged"], group.path_counts
        checks += 2

    # -- ranks whose tensors lie at different offsets of their allocations: refused on all -------
    shifted = fake.empty(256, dtype=torch.float32)
    view = shifted[4 * (1 + rank % 2) :][:128]
    message = expect_error(symm.InvalidArgumentError, "every rank", lambda: st.adopt(view, symm_mem=fake))
    assert "PyTorch symmetric memory at offset" in message, message
    checks += 1
    # A tensor that is not contiguous: refused before any communication, on every rank alike.
    expect_error(symm.InvalidArgumentError, "not contiguous", lambda: st.adopt(allocation[::2], symm_mem=fake))
    checks += 1
    # The communicator still works after the refusals.
    t.fill_(1.0)
    comm.all_reduce(t)
    assert torch.equal(t, torch.full((n,), float(size)))
    checks += 1

    # -- deregistration releases the owner's objects ----------------------------------------------
    handle.window.deregister()
    gathered.window.deregister()
    assert handle.window.owner_objects is None
    checks += 1
    assert fake.owner_pad_is_zero()
    print(f"rank {rank}: {checks} checks OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
