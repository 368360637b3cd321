#!/usr/bin/env python3
"""torch.distributed on CPU tensors: the "symm" backend (host backend) against gloo, side by
side in one torchrun, so that both see the same machine at the same moment.

    torchrun --nproc-per-node=2 bench/torch_cpu_vs_gloo.py [--rounds 5] [--iters 20] [--warmup 3]
        [--back-to-back]

Every process joins one gloo group and one symm group of the same ranks. For each collective
(all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast; with `--ops`, also
all_to_all_single, gather, scatter, reduce, and send_recv: a ring exchange through
batch_isend_irecv) and size (1 KiB to 16 MiB of float32 per rank), the two backends take turns, `--rounds` times each (interleaved:
gloo, symm, gloo, symm, ...), each turn `--warmup` untimed calls then `--iters` timed ones with
a gloo barrier before each call, so that a busy moment of the machine does not decide the ratio.
A call's time is the slowest rank's; the table shows each backend's median over all timed
calls and gloo's median divided by symm's (> 1: symm is faster). The first call's result of
each turn is checked against the other backend's (the data are small integers, so every sum is
exact whatever the order of the additions).

Prints a Markdown table on rank 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import symm.torch  # noqa: F401  (registers the "symm" backend)

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20]
OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"]


def size_name(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def make_call(op: str, group: dist.ProcessGroup, count: int, world: int, rank: int):
    """A closure running one call of ``op`` on ``group``, and the tensor holding its result."""
    if op == "all_reduce":
        data = torch.full((count,), float(rank + 1))

        def call() -> None:
            dist.all_reduce(data, group=group)

        return call, data
    if op == "all_gather_into_tensor":
        send = torch.full((count,), float(rank + 1))
        recv = torch.empty(count * world)

        def call() -> None:
            dist.all_gather_into_tensor(recv, send, group=group)

        return call, recv
    if op == "reduce_scatter_tensor":
        # Small integers: every sum is exact whatever the order of the additions.
        send = (torch.arange(count * world) % 997 + rank).to(torch.float32)
        recv = torch.empty(count)

        def call() -> None:
            dist.reduce_scatter_tensor(recv, send, group=group)

        return call, recv
    if op == "all_to_all_single":
        send = (torch.arange(count * world) % 997 + rank * 1000).to(torch.float32)
        recv = torch.empty(count * world)

        def call() -> None:
            dist.all_to_all_single(recv, send, group=group)

        return call, recv
    if op == "reduce":
        data = torch.full((count,), float(rank + 1))

        def call() -> None:
            dist.reduce(data, dst=0, group=group)

        # Only the root's result is defined (gloo may leave partial sums in the others').
        return call, data if rank == 0 else torch.empty(0)
    if op == "send_recv":
        # A ring exchange: every rank sends to the next and receives from the previous one,
        # in one batch_isend_irecv.
        send = torch.full((count,), float(rank + 1))
        recv = torch.empty(count)

        def call() -> None:
            ops = [
                dist.P2POp(dist.isend, send, (rank + 1) % world, group=group),
                dist.P2POp(dist.irecv, recv, (rank - 1) % world, group=group),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return call, recv
    if op == "gather":
        send = torch.full((count,), float(rank + 1))
        # The root's parts are rows of one tensor, the result compared between the backends.
        gathered = torch.empty((world, count))
        parts = list(gathered.unbind(0)) if rank == 0 else None

        def call() -> None:
            dist.gather(send, parts, dst=0, group=group)

        return call, gathered if rank == 0 else send
    if op == "scatter":
        parts = [torch.full((count,), float(r + 1)) for r in range(world)] if rank == 0 else None
        recv = torch.empty(count)

        def call() -> None:
            dist.scatter(recv, parts, src=0, group=group)

        return call, recv
    data = torch.full((count,), float(rank + 1))

    def call() -> None:
        dist.broadcast(data, src=0, group=group)

    return call, data


def turn(op: str, group: dist.ProcessGroup, barrier_group: dist.ProcessGroup, count: int, args) -> tuple[list[float], torch.Tensor]:
    world, rank = dist.get_world_size(), dist.get_rank()
    call, result = make_call(op, group, count, world, rank)
    call()
    first = result.clone()
    for _ in range(args.warmup):
        call()
    times = []
    if args.back_to_back:
        # The calls follow each other with nothing between them: each sample is the mean of
        # `--iters` calls, on the rank that took longest.
        dist.barrier(group=barrier_group)
        start = time.perf_counter()
        for _ in range(args.iters):
            call()
        times.append((time.perf_counter() - start) / args.iters)
    else:
        for _ in range(args.iters):
            dist.barrier(group=barrier_group)
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
    # The slowest rank's time of each call.
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=barrier_group)
    return slowest.tolist(), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES), help="bytes per rank")
    parser.add_argument(
        "--back-to-back",
        action="store_true",
        help="time --iters calls in a row (no barrier between them) as one sample: throughput, "
        "where the default times each call after a barrier",
    )
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    symm_group = dist.new_group(backend="symm")
    rows = []
    for op in args.ops.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            count = size // 4
            samples: dict[str, list[float]] = {"gloo": [], "symm": []}
            for _ in range(args.rounds):
                results = {}
                for name, group in (("gloo", gloo), ("symm", symm_group)):
                    times, first = turn(op, group, gloo, count, args)
                    samples[name].extend(times)
                    results[name] = first
                if not torch.equal(results["gloo"], results["symm"]):
                    raise SystemExit(f"rank {rank}: {op} of {size} bytes: symm's result differs from gloo's")
            gloo_ms = statistics.median(samples["gloo"]) * 1e3
            symm_ms = statistics.median(samples["symm"]) * 1e3
            rows.append((op, size, gloo_ms, symm_ms))
    if rank == 0:
        mode = os.environ.get("SYMM_HOST_MODE", "fast (default)")
        method = (
            f"median of {args.rounds} turns of {args.iters} calls back to back per backend (after "
            f"{args.warmup} warm-up per turn), slowest rank's mean per call"
            if args.back_to_back
            else f"median of {args.rounds} x {args.iters} calls per backend (after {args.warmup} warm-up "
            "per turn), slowest rank per call"
        )
        print(
            f"\n{world} processes, {os.cpu_count()} CPUs, torch {torch.__version__}, SYMM_HOST_MODE={mode}; "
            f"{method}\n"
        )
        print("| op | size per rank | gloo (ms) | symm (ms) | gloo / symm |")
        print("|---|---|---|---|---|")
        for op, size, gloo_ms, symm_ms in rows:
            print(f"| {op} | {size_name(size)} | {gloo_ms:.3f} | {symm_ms:.3f} | {gloo_ms / symm_ms:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
