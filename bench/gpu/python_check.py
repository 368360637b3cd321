#!/usr/bin/env python3
"""Check the Python package and the Triton device functions on a GPU, and time them.

    python3 bench/gpu/python_check.py [--ranks 2 4] [--rounds 100] [--sizes 4K 1M 64M]

Every rank is a communicator on GPU 0 (``symm.Comm.init_all([0] * n)``), driven by one thread
inside ``symm.group()``, each rank on its own non-blocking PyTorch stream. Three parts, for
each rank count:

* ``collectives``: ``comm.all_reduce`` / ``all_gather`` / ``reduce_scatter`` on PyTorch
  tensors over symmetric memory (``torch.as_tensor`` of the buffers' ``__cuda_array_interface__``
  and tensors passed as operands), for several types, every operator, odd counts, in and out of
  place, compared element by element with a float64 reference computed here; then ``--rounds``
  mixed calls on one window, checked after each;
* ``triton``: a Triton kernel calling ``symm.triton.all_reduce`` for several types (every
  operator on float32, sum and max on the others), ``all_gather`` next to its own compute, ``barrier``, and the status of a 2-D grid
  and of too many programs (``STATUS_INVALID_ARGUMENT``, no hang);
* ``timing``: ``comm.all_reduce`` and the Triton kernel on float32 for each of ``--sizes``
  (CUDA events on rank 0's stream around a launch of every rank; median of ``--iters``);
* ``p2p``: sends and receives of buffers outside every window (plain PyTorch CUDA tensors; NumPy
  arrays on the host), each rank to the next and from the previous in one group, of sizes up to
  several times the staging window (they stream through a ring in it), with one message in a
  window beside them, checked byte for byte and timed against the same exchange in windows;
  on the cuda backend pageable host memory is refused by name.

Without a GPU (``SYMM_BACKEND=host``) the ``collectives`` part runs on NumPy views instead, so
the checks themselves can be tried anywhere. Prints one line per check; exit status 1 when any
check failed.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from typing import Any, Callable, List

import numpy as np

import symm

FAILURES: List[str] = []

# (name, NumPy type used for the reference values, bytes per element)
TYPES = [
    ("float32", np.float32, 4),
    ("float16", np.float16, 2),
    ("bfloat16", None, 2),
    ("float64", np.float64, 8),
    ("int32", np.int32, 4),
    ("int8", np.int8, 1),
    ("uint8", np.uint8, 1),
    ("int64", np.int64, 8),
]
OPS = ["sum", "prod", "max", "min", "avg"]


def report(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    if not ok:
        FAILURES.append(name)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def values(rank: int, count: int, op: str, unsigned: bool, salt: int = 0) -> np.ndarray:
    """Small integers (exact in every type, for every operator on up to 8 ranks)."""
    i = np.arange(count, dtype=np.int64)
    if op == "prod":
        return np.where((i + rank + salt) % 3 == 0, 2, 1).astype(np.float64)
    spread = (i * 7 + rank * 3 + salt * 5) % 9
    return (spread if unsigned else spread - 4).astype(np.float64)


def reference(inputs: List[np.ndarray], op: str, integer: bool) -> np.ndarray:
    stack = np.stack(inputs)
    if op == "sum":
        return stack.sum(0)
    if op == "prod":
        return stack.prod(0)
    if op == "max":
        return stack.max(0)
    if op == "min":
        return stack.min(0)
    mean = stack.sum(0) / len(inputs)
    return np.trunc(mean) if integer else mean


def to_bits(name: str, kind: Any, data: np.ndarray) -> np.ndarray:
    """`data` (float64) as the raw elements of type `name`."""
    if name == "bfloat16":
        return (data.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return data.astype(kind)


def from_bits(name: str, raw: np.ndarray) -> np.ndarray:
    if name == "bfloat16":
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return raw.astype(np.float64)


def raw_type(name: str, kind: Any) -> Any:
    return np.uint16 if name == "bfloat16" else kind


class Memory:
    """Reads and writes of a rank's buffer: PyTorch on the cuda backend, NumPy on the host."""

    def __init__(self, backend: str) -> None:
        self.cuda = backend != "host"
        if self.cuda:
            import torch

            self.torch = torch

    def tensor(self, buf: symm.Buffer, dtype: str, count: int, offset: int) -> Any:
        """A PyTorch tensor (cuda) or NumPy array (host) over `count` elements at `offset`."""
        if self.cuda:
            return self.torch.as_tensor(buf.view(dtype, count, offset), device="cuda")
        return buf.numpy(dtype, count, offset)

    def write(self, buf: symm.Buffer, dtype: str, offset: int, raw: np.ndarray) -> None:
        target = self.tensor(buf, dtype, raw.size, offset)
        if self.cuda:
            source = self.torch.from_numpy(raw.view(np.int16) if raw.dtype == np.uint16 else raw)
            target.view(source.dtype).copy_(source.to("cuda"))
        else:
            target.view(raw.dtype)[:] = raw

    def read(self, buf: symm.Buffer, dtype: str, offset: int, count: int, kind: Any) -> np.ndarray:
        source = self.tensor(buf, dtype, count, offset)
        if self.cuda:
            out = source.view(self.torch.int16 if kind == np.uint16 else source.dtype).cpu().numpy()
            return out.view(kind)
        return source.view(kind).copy()

    def synchronize(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def streams_for(memory: Memory, n: int) -> List[Any]:
    if memory.cuda:
        return [memory.torch.cuda.Stream() for _ in range(n)]
    return [None] * n


def check_collectives(n: int, rounds: int) -> None:
    comms = symm.Comm.init_all([0] * n)
    memory = Memory(comms[0].backend)
    streams = streams_for(memory, n)
    window_bytes = 4 << 20
    bufs = [comm.alloc(window_bytes) for comm in comms]
    with symm.group():
        windows = [comm.register(buf) for comm, buf in zip(comms, bufs)]
    recv_at = window_bytes // 2
    rng = np.random.default_rng(n)

    def run(kind: str, name: str, np_kind: Any, size: int, op: str, count: int, in_place: bool,
            salt: int) -> bool:
        integer = name.startswith(("int", "uint"))
        unsigned = name.startswith("uint")
        raw_kind = raw_type(name, np_kind)
        # Reduce-scatter sends a segment per rank; an in-place all-gather finds rank r's part at
        # segment r of its receive buffer.
        total = count * n if kind == "reduce_scatter" or (kind == "all_gather" and in_place) else count
        inputs = [values(r, total, op, unsigned, salt) for r in range(n)]
        for r in range(n):
            memory.write(bufs[r], name, 0, to_bits(name, np_kind, inputs[r]))
        memory.synchronize()
        recv = 0 if in_place else recv_at
        with symm.group():
            for r, comm in enumerate(comms):
                send_t = memory.tensor(bufs[r], name, total, 0)
                if in_place and kind == "all_gather":
                    recv_t = memory.tensor(bufs[r], name, count * n, 0)
                    send_t = memory.tensor(bufs[r], name, count, r * count * size)
                else:
                    recv_count = count * n if kind == "all_gather" else count
                    recv_t = memory.tensor(bufs[r], name, recv_count, recv)
                if kind == "all_reduce":
                    comm.all_reduce(send_t, recv_t, count, name, op, stream=streams[r])
                elif kind == "all_gather":
                    comm.all_gather(send_t, recv_t, count, name, stream=streams[r])
                else:
                    comm.reduce_scatter(send_t, recv_t, count, name, op, stream=streams[r])
        memory.synchronize()
        for r in range(n):
            if kind == "all_reduce":
                want = reference(inputs, op, integer)
                got = memory.read(bufs[r], name, recv, count, raw_kind)
            elif kind == "all_gather":
                if in_place:
                    # Rank q's segment was written at q * count of every rank's buffer.
                    want = np.concatenate([inputs[q][q * count:(q + 1) * count] for q in range(n)])
                else:
                    want = np.concatenate([inputs[q][:count] for q in range(n)])
                got = memory.read(bufs[r], name, recv, count * n, raw_kind)
            else:
                want = reference([x[r * count:(r + 1) * count] for x in inputs], op, integer)
                got = memory.read(bufs[r], name, recv, count, raw_kind)
            got = from_bits(name, got)
            want = from_bits(name, to_bits(name, np_kind, want))
            if not np.array_equal(got, want):
                bad = int(np.argmax(got != want))
                report(f"{n} ranks {kind} {name} {op} count {count} {'in' if in_place else 'out of'}"
                       f" place", False, f"rank {r} element {bad}: {got[bad]} != {want[bad]}")
                return False
        return True

    counts = [1, 7, 1000, 4097, 65539]
    for name, np_kind, size in TYPES:
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):
            ops = ["sum"] if kind == "all_gather" else OPS
            ok = True
            for op in ops:
                for count in counts:
                    if count * size * n > recv_at:
                        continue
                    for in_place in (False, True):
                        if in_place and kind == "reduce_scatter":
                            continue
                        ok &= run(kind, name, np_kind, size, op, count, in_place, 0)
            if ok:
                places = "out of place" if kind == "reduce_scatter" else "in and out of place"
                report(f"{n} ranks {kind} {name}", True, f"ops {','.join(ops)}, counts {counts}, {places}")
    # A long mixed sequence on the one window.
    ok = True
    started = time.perf_counter()
    for step in range(rounds):
        name, np_kind, size = TYPES[rng.integers(len(TYPES))]
        kind = ["all_reduce", "all_gather", "reduce_scatter"][rng.integers(3)]
        op = "sum" if kind == "all_gather" else OPS[rng.integers(len(OPS))]
        count = int(rng.integers(1, max(2, recv_at // (size * n * 8))))
        in_place = kind != "reduce_scatter" and bool(rng.integers(2))
        ok &= run(kind, name, np_kind, size, op, count, in_place, step)
        if not ok:
            break
    report(f"{n} ranks {rounds} mixed calls on one window", ok,
           f"{time.perf_counter() - started:.1f} s")
    for window in windows:
        window.deregister()
    for comm in comms:
        comm.destroy()


@functools.lru_cache(maxsize=None)
def triton_kernels() -> tuple:
    """The Triton kernels of the checks (Triton is imported only when they are needed)."""
    import triton.language as tl

    import symm.triton as st

    @st.jit
    def all_reduce_kernel(ctx, n_elements, OP: tl.constexpr, DTYPE: tl.constexpr, status_ptr):
        status = st.all_reduce(ctx, 0, 0, n_elements, OP, DTYPE)
        tl.store(status_ptr + tl.program_id(0) + tl.program_id(1) * tl.num_programs(0), status)

    @st.jit
    def gather_then_barrier(ctx, recv_offset, n_bytes, status_ptr):
        # Both calls on every thread (no branch); the barrier's status replaces a success.
        status = st.all_gather(ctx, 0, recv_offset, n_bytes)
        status = tl.where(status == 0, st.barrier(ctx), status)
        tl.store(status_ptr + tl.program_id(0), status)

    @st.jit
    def all_reduce_f32(ctx, n_elements, status_ptr):
        status = st.all_reduce(ctx, 0, 0, n_elements, st.SUM, st.FLOAT32)
        tl.store(status_ptr + tl.program_id(0), status)

    return all_reduce_kernel, gather_then_barrier, all_reduce_f32


def check_triton(n: int) -> None:
    import torch

    import symm.triton as st

    all_reduce_kernel, gather_then_barrier, _ = triton_kernels()

    comms = symm.Comm.init_all([0] * n)
    streams = [torch.cuda.Stream() for _ in range(n)]
    window_bytes = 4 << 20
    bufs = [comm.alloc(window_bytes) for comm in comms]
    with symm.group():
        windows = [comm.register(buf) for comm, buf in zip(comms, bufs)]
    memory = Memory("cuda")
    programs = 8

    def launch(kernel: Callable[..., Any], grid: tuple, *args: Any) -> List[Any]:
        statuses = [torch.full((grid[0] * (grid[1] if len(grid) > 1 else 1),), 99, dtype=torch.int32,
                               device="cuda") for _ in range(n)]
        torch.cuda.synchronize()
        for r in range(n):
            with torch.cuda.stream(streams[r]):
                kernel[grid](windows[r].device_context, *args, statuses[r])
        torch.cuda.synchronize()
        return statuses

    # Each (type, operator) is its own Triton compile (1-4 s): every operator on float32, and
    # sum and max on the other types (what differs between types is their loads, stores and
    # conversions; every pair is compiled for every target by the CI's Triton compile tests).
    for name, np_kind, size in [t for t in TYPES if t[0] in ("float32", "bfloat16", "float16", "int32", "int8")]:
        code = st.dtype_code(name)
        ok = True
        ops = OPS if name == "float32" else [op for op in OPS if op in ("sum", "max")]
        for op in ops:
            for count in (1, 4097, 262147):
                inputs = [values(r, count, op, False, 1) for r in range(n)]
                for r in range(n):
                    memory.write(bufs[r], name, 0, to_bits(name, np_kind, inputs[r]))
                statuses = launch(all_reduce_kernel, (programs,), count, st.op_code(op), code)
                want = from_bits(name, to_bits(name, np_kind, reference(inputs, op, name.startswith("int"))))
                for r in range(n):
                    if not bool((statuses[r] == st.SUCCESS.value).all()):
                        report(f"{n} ranks triton all_reduce {name} {op} {count}", False,
                               f"rank {r} status {statuses[r].tolist()}")
                        ok = False
                        break
                    got = from_bits(name, memory.read(bufs[r], name, 0, count, raw_type(name, np_kind)))
                    if not np.array_equal(got, want):
                        bad = int(np.argmax(got != want))
                        report(f"{n} ranks triton all_reduce {name} {op} {count}", False,
                               f"rank {r} element {bad}: {got[bad]} != {want[bad]}")
                        ok = False
                        break
        if ok:
            report(f"{n} ranks triton all_reduce {name}", True,
                   f"operators {', '.join(ops)}; counts 1, 4097, 262147")
    # all_gather then barrier in one kernel.
    n_bytes = 40000
    recv_offset = 1 << 20
    for r in range(n):
        memory.write(bufs[r], "uint8", 0, ((np.arange(n_bytes) + 31 * r) % 251).astype(np.uint8))
    statuses = launch(gather_then_barrier, (programs,), recv_offset, n_bytes)
    ok = all(bool((s == st.SUCCESS.value).all()) for s in statuses)
    want = np.concatenate([((np.arange(n_bytes) + 31 * q) % 251).astype(np.uint8) for q in range(n)])
    for r in range(n):
        ok &= np.array_equal(memory.read(bufs[r], "uint8", recv_offset, n_bytes * n, np.uint8), want)
    report(f"{n} ranks triton all_gather + barrier", ok, f"{n_bytes} bytes per rank")
    # Launches the device functions refuse: every rank gets the status, nothing hangs.
    for grid, label in (((2, 2), "2-D grid"), ((st.MAX_PROGRAMS + 1,), "too many programs")):
        started = time.perf_counter()
        statuses = launch(all_reduce_kernel, grid, 16, st.op_code("sum"), st.dtype_code("float32"))
        codes = sorted({v for s in statuses for v in s.tolist()})
        report(f"{n} ranks triton {label}", codes == [int(st.STATUS_INVALID_ARGUMENT.value)],
               f"statuses {codes} in {time.perf_counter() - started:.2f} s")
    for window in windows:
        window.deregister()
    for comm in comms:
        comm.destroy()


def time_all_reduce(n: int, sizes: List[int], iters: int) -> None:
    import torch

    import symm.triton as st

    _, _, all_reduce_f32 = triton_kernels()

    comms = symm.Comm.init_all([0] * n)
    streams = [torch.cuda.Stream() for _ in range(n)]
    largest = max(sizes)
    bufs = [comm.alloc(largest) for comm in comms]
    with symm.group():
        windows = [comm.register(buf) for comm, buf in zip(comms, bufs)]
    statuses = [torch.zeros(64, dtype=torch.int32, device="cuda") for _ in range(n)]

    def timed(launch_all: Callable[[], None]) -> float:
        for _ in range(3):
            launch_all()
        torch.cuda.synchronize()
        samples = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for s in streams:
                s.wait_stream(torch.cuda.current_stream())
            start.record(streams[0])
            launch_all()
            end.record(streams[0])
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1000.0)
        return statistics.median(samples)

    print(f"# {n} ranks on one GPU, float32 sum, median of {iters} (us; rank 0's stream)")
    print(f"# {'bytes':>10} {'comm.all_reduce':>16} {'triton kernel':>14}")
    for size in sizes:
        count = size // 4

        def abi() -> None:
            with symm.group():
                for r, comm in enumerate(comms):
                    comm.all_reduce(bufs[r], bufs[r], count, "float32", "sum", stream=streams[r])

        def kernel() -> None:
            for r in range(n):
                with torch.cuda.stream(streams[r]):
                    all_reduce_f32[(8,)](windows[r].device_context, count, statuses[r])

        abi_us = timed(abi)
        triton_us = timed(kernel)
        ok = all(bool((s[:8] == st.SUCCESS.value).all()) for s in statuses)
        print(f"  {size:>10} {abi_us:>16.1f} {triton_us:>14.1f}{'' if ok else '  (a Triton status failed)'}")
        if not ok:
            report(f"{n} ranks timing {size}", False, "a Triton status was not SUCCESS")
    for window in windows:
        window.deregister()
    for comm in comms:
        comm.destroy()


def check_send_recv_outside_windows(n: int) -> None:
    """The ``p2p`` part (see the module)."""
    comms = symm.Comm.init_all([0] * n)
    memory = Memory(comms[0].backend)
    streams = streams_for(memory, n)
    sizes = [1, 4099, (4 << 20) // 4 + 3, (20 << 20) // 4 + 1]  # float32 elements
    largest = max(sizes)
    bufs = [comm.alloc(8 * largest) for comm in comms]
    with symm.group():
        windows = [comm.register(buf) for comm, buf in zip(comms, bufs)]

    def plain(count: int) -> Any:
        if memory.cuda:
            return memory.torch.zeros(count, dtype=memory.torch.float32, device="cuda")
        return np.zeros(count, dtype=np.float32)

    def fill(target: Any, rank: int) -> None:
        values = (np.arange(target.shape[0], dtype=np.float32) % 65521) + 100000 * rank
        if memory.cuda:
            target.copy_(memory.torch.from_numpy(values).to("cuda"))
        else:
            target[:] = values

    def host(array: Any) -> np.ndarray:
        return array.cpu().numpy() if memory.cuda else np.asarray(array)

    for count in sizes:
        for where in ("outside", "windows"):
            if where == "outside":
                sends = [plain(count) for _ in range(n)]
                recvs = [plain(count) for _ in range(n)]
            else:
                sends = [memory.tensor(b, "float32", count, 0) for b in bufs]
                recvs = [memory.tensor(b, "float32", count, 4 * largest) for b in bufs]
            for r in range(n):
                fill(sends[r], r)
            memory.synchronize()
            times = []
            ok = True
            for k in range(3):
                start = time.perf_counter()
                with symm.group():
                    for r, comm in enumerate(comms):
                        comm.send(sends[r], (r + 1) % n, count, "float32", stream=streams[r])
                        comm.recv(recvs[r], (r - 1) % n, count, "float32", stream=streams[r])
                memory.synchronize()
                times.append(time.perf_counter() - start)
                if k == 0:
                    for r in range(n):
                        want = host(sends[(r - 1) % n])
                        ok = ok and np.array_equal(host(recvs[r]), want)
            report(f"{n} ranks send/recv {where} {4 * count} bytes", ok,
                   f"{statistics.median(times) * 1e6:.0f} us")
    if memory.cuda:
        pageable = np.zeros(16, dtype=np.float32)
        try:
            with symm.group():
                for r, comm in enumerate(comms):
                    comm.send(pageable, (r + 1) % n, 16, "float32", stream=streams[r])
                    comm.recv(pageable, (r - 1) % n, 16, "float32", stream=streams[r])
        except symm.SymmError as error:
            report(f"{n} ranks send/recv of pageable memory refused", "cannot reach" in str(error),
                   str(error)[:120])
        else:
            report(f"{n} ranks send/recv of pageable memory refused", False, "it returned success")
        for comm in comms:
            comm.destroy()
        return
    for w in windows:
        w.deregister()
    for b in bufs:
        b.free()
    for comm in comms:
        comm.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--sizes", nargs="+", default=["4K", "64K", "1M", "16M", "64M"])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--parts", nargs="+", default=["collectives", "triton", "timing", "p2p"])
    args = parser.parse_args()
    from symm import _paths

    print(f"symm {'.'.join(map(str, symm.version()))}, library {_paths.library_path()}")
    probe = symm.Comm.init_all([0])
    backend = probe[0].backend
    probe[0].destroy()
    print(f"backend {backend}")
    if backend != "host":
        import torch
        import triton

        import symm.triton as st

        print(f"torch {torch.__version__}, triton {triton.__version__}, "
              f"gpu {torch.cuda.get_device_name(0)}, triton library {st.library()}")
    for n in args.ranks:
        if "collectives" in args.parts:
            check_collectives(n, args.rounds)
        if backend != "host" and "triton" in args.parts:
            check_triton(n)
        if backend != "host" and "timing" in args.parts:
            time_all_reduce(n, [parse_size(s) for s in args.sizes], args.iters)
        if "p2p" in args.parts:
            check_send_recv_outside_windows(n)
    print(f"{len(FAILURES)} failed" + (f": {FAILURES}" if FAILURES else ""))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
