"""Send/receive with buffers outside every window (the kernel sends through a ring in the
staging window and receives in place) against buffers in windows, on the host backend: each
rank sends to the next and receives from the previous in one group, per size; median µs of
each, and their ratio. Run as

    SYMM_LIBRARY=target/release/libsymm.so PYTHONPATH=python SYMM_BACKEND=host \
        python bench/p2p_staged_vs_windows.py --procs 2

(the script starts its ranks itself, with torchrun's variables). Rank 0 prints the table."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB


def rank_main(iters: int, warmup: int, sizes: list[int]) -> None:
    import numpy as np

    import symm

    comm = symm.Comm.from_env()
    rank, world = comm.rank, comm.nranks
    right, left = (rank + 1) % world, (rank - 1) % world
    largest = max(sizes)
    buffer = comm.alloc(2 * largest)
    window = comm.register(buffer)
    in_window = np.asarray(buffer).view(np.uint8)
    own = np.zeros(2 * largest, dtype=np.uint8)
    rows = []
    for size in sizes:
        times = {}
        for name, memory in (("windows", in_window), ("outside", own)):
            send, recv = memory[:size], memory[largest : largest + size]
            send[:] = (np.arange(size) + rank) % 251
            samples = []
            for k in range(warmup + iters):
                comm.barrier()
                start = time.perf_counter()
                with symm.group():
                    comm.send(send, right)
                    comm.recv(recv, left)
                samples.append(time.perf_counter() - start)
                if k == 0:
                    want = (np.arange(size) + left) % 251
                    assert np.array_equal(recv, want), f"{name} {size}: wrong data"
            times[name] = statistics.median(samples[warmup:]) * 1e6
        rows.append((size, times["windows"], times["outside"]))
    if rank == 0:
        print(f"{world} ranks, {iters} iterations, median us (one group: send right, receive left)")
        print(f"{'bytes':>10} {'windows':>10} {'outside':>10} {'outside/windows':>16}")
        for size, w, o in rows:
            print(f"{size:>10} {w:>10.1f} {o:>10.1f} {o / w:>16.2f}")
    window.deregister()
    buffer.free()
    comm.destroy()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.iters, args.warmup, SIZES)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    children = []
    for rank in range(args.procs):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.procs), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        command = [sys.executable, __file__, "--rank", str(rank), "--iters", str(args.iters), "--warmup", str(args.warmup)]
        children.append(subprocess.Popen(command, env=env))
    codes = [child.wait() for child in children]
    if any(codes):
        sys.exit(f"ranks exited with {codes}")


if __name__ == "__main__":
    main()
