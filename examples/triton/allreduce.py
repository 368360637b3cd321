"""All-reduce from inside a Triton kernel, across the ranks of one GPU.

Run on a machine with a GPU, PyTorch and Triton (3.5 or newer), with the symm package
installed (``pip install ./python`` or the wheel from ``cargo xtask wheel``)::

    python examples/triton/allreduce.py --ranks 2

Each rank is a communicator on GPU 0; each launches the kernel on its own stream. Every rank
fills its buffer with ``rank + 1``, the kernel all-reduces it in place, and every element must
then be ``1 + 2 + ... + ranks``. CI compiles ``all_reduce_kernel`` for sm_80, sm_90 and sm_100a
without a GPU (python/tests/test_triton_compile.py).
"""

from __future__ import annotations

import argparse

import triton
import triton.language as tl

import symm.triton as st


@st.jit
def all_reduce_kernel(ctx, n, status_ptr, DTYPE: tl.constexpr):
    # Every thread of every program calls it, with the same arguments, on every rank.
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, DTYPE)
    tl.store(status_ptr + tl.program_id(0), status)


def main() -> None:
    import torch

    import symm

    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--count", type=int, default=1 << 16)
    parser.add_argument("--programs", type=int, default=8)
    args = parser.parse_args()

    comms = symm.Comm.init_all([0] * args.ranks)
    buffers = [comm.alloc(args.count, "float32") for comm in comms]
    with symm.group():  # one thread registers every rank's window
        windows = [comm.register(buf) for comm, buf in zip(comms, buffers)]
    tensors = [torch.as_tensor(buf, device="cuda") for buf in buffers]
    statuses = [torch.zeros(args.programs, dtype=torch.int32, device="cuda") for _ in comms]
    streams = [torch.cuda.Stream() for _ in comms]
    for rank, tensor in enumerate(tensors):
        tensor.fill_(rank + 1.0)
    torch.cuda.synchronize()
    for window, status, stream in zip(windows, statuses, streams):
        with torch.cuda.stream(stream):
            all_reduce_kernel[(args.programs,)](
                window.device_context, args.count, status, st.FLOAT32, num_warps=4
            )
    torch.cuda.synchronize()
    expected = args.ranks * (args.ranks + 1) / 2
    for rank, (tensor, status) in enumerate(zip(tensors, statuses)):
        assert bool((status == st.SUCCESS.value).all()), f"rank {rank}: status {status.tolist()}"
        assert bool((tensor == expected).all()), f"rank {rank}: {tensor[:8].tolist()}"
    print(f"triton all-reduce: {args.ranks} ranks x {args.count} float32 = {expected} everywhere")
    for window in windows:
        window.deregister()
    for comm in comms:
        comm.destroy()


if __name__ == "__main__":
    main()
