"""symm on PyTorch's own symmetric tensors, one process per rank under torchrun, all ranks on
one GPU when there is one (``TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1``):

1. check: a ``torch.distributed._symmetric_memory`` tensor, 64 elements into its allocation,
   adopted as a symm window (``symm.torch.adopt``); symm's all-reduce, all-gather, broadcast and
   reduce-scatter on it exact, 20 rounds; then PyTorch's own ``barrier`` and
   ``one_shot_all_reduce`` on the same memory (its signal pads must still be zero, or its barrier
   hangs) exact; prints ``checks OK``.
2. bench: symm's all-reduce against PyTorch SymmMem's ``one_shot_all_reduce_out`` and
   ``two_shot_all_reduce_`` on the same tensor, same GPU, same ranks, same sizes, each timed as a
   CUDA graph of ``--iters`` calls replayed ``--reps`` times; rank 0 prints a Markdown table
   with the time per call and the ratio to symm's (``--sizes``, bytes of float32 or bfloat16).

    torchrun --nproc-per-node=2 bench/gpu/torch_symm.py check
    torchrun --nproc-per-node=2 bench/gpu/torch_symm.py bench --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

import symm
import symm.torch as st

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def setup() -> tuple[int, int, torch.device]:
    os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    # gloo: NCCL before 2.30 refuses two ranks on one GPU; PyTorch's symmetric memory
    # exchanges its handles through the group's store either way.
    dist.init_process_group("gloo")
    if hasattr(symm_mem, "set_backend"):
        try:
            symm_mem.set_backend("CUDA")
        except Exception as error:  # noqa: BLE001 (report and go on with the default)
            print(f"set_backend('CUDA'): {error}", flush=True)
    return dist.get_rank(), dist.get_world_size(), device


def value(rank: int, index: torch.Tensor, round_: int) -> torch.Tensor:
    """Small integers: every sum is exact in float32."""
    return ((rank * 7 + index * 3 + round_ * 11) % 64).to(torch.float32)


def check(rank: int, size: int, device: torch.device) -> None:
    group = dist.group.WORLD
    n = 4099
    allocation = symm_mem.empty(n * (size + 1) + 64, dtype=torch.float32, device=device)
    t = allocation[64 : 64 + n]
    out = allocation[64 + n : 64 + n + n * size]
    handle = st.adopt(t, group)
    gathered = st.adopt(out, group)
    comm = handle.comm
    assert handle.buffer_ptrs[rank] == t.data_ptr(), (handle.buffer_ptrs, t.data_ptr())
    index = torch.arange(n, device=device)
    stream = torch.cuda.current_stream()
    for round_ in range(20):
        t.copy_(value(rank, index, round_))
        comm.all_reduce(t)
        want = sum(value(r, index, round_).double() for r in range(size))
        assert torch.equal(t.double(), want), f"all-reduce round {round_}"
        comm.all_gather(t, out)
        assert torch.equal(out.double(), want.repeat(size)), f"all-gather round {round_}"
        t.copy_(-value(rank, index, round_))
        comm.broadcast(t, root=size - 1)
        assert torch.equal(t, -value(size - 1, index, round_)), f"broadcast round {round_}"
        out.copy_(value(rank, torch.arange(n * size, device=device), round_))
        comm.reduce_scatter(out, t)
        segment = torch.arange(rank * n, (rank + 1) * n, device=device)
        assert torch.equal(t.double(), sum(value(r, segment, round_).double() for r in range(size))), round_
    stream.synchronize()
    print(f"rank {rank}: symm's collectives on PyTorch's tensor exact", flush=True)
    # PyTorch's own operations on the same memory: its barrier needs its pads at zero.
    torch_handle = symm_mem.rendezvous(allocation, group)
    torch_handle.barrier(channel=0)
    t.copy_(value(rank, index, 99))
    result = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group.group_name)
    torch.cuda.synchronize()
    want = sum(value(r, index, 99).double() for r in range(size))
    assert torch.equal(result.double(), want), "PyTorch's one-shot after symm's calls"
    torch_handle.barrier(channel=0)
    handle.window.deregister()
    gathered.window.deregister()
    print(f"rank {rank}: PyTorch's barrier and one_shot_all_reduce after symm's: checks OK", flush=True)


def graph_time(call, iters: int, reps: int) -> float:
    """Microseconds per call: ``iters`` calls captured in one CUDA graph, replayed ``reps``
    times between two events (after a warm-up outside the graph and one replay)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            call()
    graph.replay()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / (iters * reps)


def bench(rank: int, size: int, device: torch.device, args: argparse.Namespace) -> None:
    group = dist.group.WORLD
    dtype = getattr(torch, args.dtype)
    item = torch.empty((), dtype=dtype).element_size()
    rows = []
    for nbytes in args.sizes:
        n = nbytes // item
        t = symm_mem.empty(n, dtype=dtype, device=device)
        out = symm_mem.empty(n, dtype=dtype, device=device)
        symm_mem.rendezvous(t, group)
        symm_mem.rendezvous(out, group)
        handle = st.adopt(t, group)
        comm = handle.comm
        t.fill_(1)
        times = {}
        for name, call in [
            ("symm", lambda: comm.all_reduce(t)),
            ("one_shot", lambda: torch.ops.symm_mem.one_shot_all_reduce_out(t, "sum", group.group_name, out)),
            ("two_shot", lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group.group_name)),
        ]:
            t.fill_(1)
            try:
                times[name] = graph_time(call, args.iters, args.reps)
            except Exception as error:  # noqa: BLE001 (record it and go on: the table says so)
                times[name] = float("nan")
                print(f"rank {rank}: {name} at {nbytes} bytes: {type(error).__name__}: {error}", flush=True)
        handle.window.deregister()
        rows.append((nbytes, times))
        if rank == 0:
            print(f"{nbytes} bytes: {times}", flush=True)
    if rank == 0:
        print(f"\n{size} ranks, {args.dtype}, {torch.cuda.get_device_name(device)}, PyTorch {torch.__version__}, "
              f"CUDA graphs of {args.iters} calls x {args.reps} replays\n")
        print("| bytes | symm µs | one_shot µs | two_shot µs | one_shot / symm | two_shot / symm |")
        print("|---:|---:|---:|---:|---:|---:|")
        for nbytes, times in rows:
            s, o, w = times["symm"], times["one_shot"], times["two_shot"]
            print(f"| {nbytes} | {s:.1f} | {o:.1f} | {w:.1f} | {o / s:.2f} | {w / s:.2f} |")
        print("bench done", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["check", "bench"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    rank, size, device = setup()
    began = time.time()
    if args.what == "check":
        check(rank, size, device)
    else:
        bench(rank, size, device, args)
    print(f"rank {rank}: {args.what} took {time.time() - began:.1f} s", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
