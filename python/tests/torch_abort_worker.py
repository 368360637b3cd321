"""One rank of test_torch_windows.py's abort test, under torchrun with 2 processes on the host
backend: rank 0's all-reduce waits for rank 1, which does not call; another thread of rank 0
aborts the group through PyTorch (``_abort_process_group``), which ends that wait at once; rank
1's next call fails at once naming the abort, and its ``destroy_process_group`` frees its rank
(the abort freed rank 0's)."""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist

import symm
import symm.torch as st  # noqa: F401  (registers the backend)


def group_comm() -> symm.Comm:
    """The default group's communicator (the group is symm's ProcessGroup)."""
    return dist.distributed_c10d._get_default_group().comm


def main() -> None:
    dist.init_process_group("symm")
    rank = dist.get_rank()
    ones = torch.ones(1000)
    dist.all_reduce(ones)
    assert torch.equal(ones, torch.full((1000,), 2.0))
    comm = group_comm()
    if rank == 0:
        outcome: dict[str, object] = {}

        def pending() -> None:
            started = time.monotonic()
            try:
                dist.all_reduce(torch.ones(1000))
                outcome["error"] = None
            except symm.SymmError as error:
                outcome["error"] = error
            outcome["took"] = time.monotonic() - started

        waiting = threading.Thread(target=pending)
        waiting.start()
        time.sleep(0.5)
        started = time.monotonic()
        dist.distributed_c10d._abort_process_group()
        aborted_in = time.monotonic() - started
        waiting.join(30)
        error, took = outcome["error"], outcome["took"]
        assert isinstance(error, symm.InvalidUsageError) and "symmCommAbort" in str(error), error
        assert aborted_in < 5 and took < 6, (aborted_in, took)
        assert comm.destroyed
        print(f"rank 0: the abort returned in {aborted_in:.2f} s; the waiting all_reduce ended after {took:.2f} s", flush=True)
    else:
        time.sleep(1.5)
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1000))
            raise AssertionError("rank 1's all_reduce after the abort succeeded")
        except symm.RemoteError as error:
            took = time.monotonic() - started
            assert "rank 0 called symmCommAbort" in str(error), error
            assert took < 5, took
            print(f"rank 1: its next all_reduce failed after {took:.3f} s, naming the abort", flush=True)
        assert not comm.destroyed
        # PyTorch forgot the aborted group; here it is still to be destroyed.
        dist.destroy_process_group()
    assert comm.destroyed
    print(f"rank {rank}: destroyed", flush=True)


if __name__ == "__main__":
    main()
