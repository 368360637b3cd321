#!/usr/bin/env python3
"""PyTorch baseline for symm-perf on one GPU: the same collectives, computed with torch ops
over W buffers that live on the same device (what W ranks sharing one GPU would exchange).

    python3 bench/torch_baseline.py all_reduce -g 8 -b 8 -e 1G -f 2 -d float -n 20 -w 5

all_reduce: out[r] = sum_k buf[k] for every r (torch.stack + sum, then a copy into each
output, as W ranks would each hold the result). all_gather: out[r] = cat(buf[k]) for every r.
reduce_scatter: out[r] = sum_k buf[k][r-th segment]. Each point is the median of CUDA-event
timings of CUDA-graph replays (the same method as symm-perf on the cuda backend); the result is
checked against a float64 reference on the first iteration. Prints one line per size, in the
same units as symm-perf (size in bytes of the whole result, time in microseconds).
"""
import argparse
import statistics

import torch

DTYPES = {
    "float": torch.float32,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "double": torch.float64,
    "int32": torch.int32,
}


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def make_op(kind, bufs, outs, world):
    if kind == "all_reduce":
        def op():
            total = torch.stack(bufs).sum(0)
            for o in outs:
                o.copy_(total)
    elif kind == "all_gather":
        def op():
            gathered = torch.cat(bufs)
            for o in outs:
                o.copy_(gathered)
    else:
        def op():
            total = torch.stack(bufs).sum(0)
            for r, o in enumerate(outs):
                o.copy_(total.chunk(world)[r])
    return op


def main():
    p = argparse.ArgumentParser()
    p.add_argument("op", choices=["all_reduce", "all_gather", "reduce_scatter"])
    p.add_argument("-g", type=int, default=8)
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="128M")
    p.add_argument("-f", type=int, default=2)
    p.add_argument("-d", default="float", choices=sorted(DTYPES))
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    a = p.parse_args()
    dtype, world = DTYPES[a.d], a.g
    elt = torch.tensor([], dtype=dtype).element_size()
    dev = torch.device("cuda")
    print(f"# torch baseline {a.op}: {world} buffers on {torch.cuda.get_device_name(dev)}, "
          f"{a.d}, torch {torch.__version__}, median of {a.n} CUDA-graph replays")
    print(f"# {'size(B)':>12} {'count':>12} {'time(us)':>10} {'algbw(GB/s)':>12} {'check':>6}")
    size = parse_size(a.b)
    while size <= parse_size(a.e):
        if a.op == "all_reduce":
            count = size // elt
            in_count, out_count = count, count
        else:
            per = size // (elt * world)
            count = per * world
            in_count, out_count = (per, count) if a.op == "all_gather" else (count, per)
        if count == 0:
            size *= a.f
            continue
        bufs = [(torch.arange(in_count, device=dev) % 3 + k + 1).to(dtype) for k in range(world)]
        outs = [torch.empty(out_count, device=dev, dtype=dtype) for _ in range(world)]
        op = make_op(a.op, bufs, outs, world)
        op()
        torch.cuda.synchronize()
        ref = [b.double() for b in bufs]
        if a.op == "all_reduce":
            want = sum(ref)
            got = outs[-1].double()
        elif a.op == "all_gather":
            want = torch.cat(ref)
            got = outs[-1].double()
        else:
            want = sum(ref).chunk(world)[world - 1]
            got = outs[-1].double()
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
        ok = torch.allclose(got, want, rtol=tol, atol=0)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(max(a.w, 1)):
                op()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            op()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(a.n + 1)]
        events[0].record()
        for e in events[1:]:
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        times = [1e3 * events[i].elapsed_time(events[i + 1]) for i in range(a.n)]
        us = statistics.median(times)
        nbytes = count * elt
        print(f"  {nbytes:>12} {count:>12} {us:>10.2f} {nbytes / (us * 1e3):>12.2f} "
              f"{'OK' if ok else 'WRONG':>6}")
        del bufs, outs, graph
        size *= a.f


if __name__ == "__main__":
    main()
