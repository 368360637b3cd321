"""Tensors in symmetric memory with the "symm" backend: allocate, rendezvous, and run
collectives on them in place (no copy), from PyTorch and from a Triton kernel.

    torchrun --nproc-per-node 2 examples/torch/symmetric_tensors.py

On GPUs each rank takes GPU ``LOCAL_RANK`` (modulo the GPUs there are), its tensors come from
``symm.torch.mem_pool()`` (a ``torch.cuda.MemPool`` whose allocator is ``symmMemAlloc``), and a
Triton kernel all-reduces through the window's device context when Triton is installed. On CPU
(symm's host backend: no GPU, or ``SYMM_BACKEND=host``) the tensors are CPU tensors over
``comm.alloc`` memory, made by ``symm.torch.empty``; the rest is the same.
"""

import os

import symm.torch as symm_torch  # registers the "symm" backend
import torch
import torch.distributed as dist

try:  # the device functions, for the Triton part (GPU only)
    import symm.triton as symm_triton
    import triton.language as tl
except ImportError:
    symm_triton = None

if symm_triton is not None:

    @symm_triton.jit
    def all_reduce_kernel(ctx, byte_offset, n, status_ptr, DTYPE: tl.constexpr):
        # Every thread of every program, on every rank, with the same arguments.
        status = symm_triton.all_reduce(ctx, 0, byte_offset, n, symm_triton.SUM, DTYPE)
        tl.store(status_ptr + tl.program_id(0), status)


gpu = torch.cuda.is_available() and os.environ.get("SYMM_BACKEND") != "host"
if gpu:
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
dist.init_process_group("symm")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.group.WORLD
n = 1 << 16

# 1. Allocate in symm memory: the same sizes in the same order on every rank.
if group.comm.backend == "cuda":
    pool = symm_torch.mem_pool()  # one pool per process group
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(n, device="cuda")
else:
    t = symm_torch.empty(n)  # works on both backends; a CPU tensor on the host backend

# 2. Rendezvous (collective, once per allocation): the window over t's allocation.
handle = symm_torch.rendezvous(t)
print(
    f"rank {rank}: window of {handle.buffer_size} bytes, t at byte {handle.offset}, "
    f"device context {handle.device_context:#x}",
    flush=True,
)

# 3. Collectives use t in place: SYMM_DEBUG=INFO logs "in its window (no copy)".
t.fill_(rank + 1.0)
dist.all_reduce(t)
assert bool((t == world * (world + 1) / 2).all())
assert group.path_counts["all_reduce", "window"] == 1 and group.path_counts["all_reduce", "staged"] == 0

# Every rank's window is mapped here: read the next rank's t.
dist.barrier()
peer = (rank + 1) % world
assert bool((handle.get_buffer(peer, (n,), torch.float32, handle.offset // 4) == t).all())
dist.barrier()

# 4. The same all-reduce from inside a Triton kernel: ctx is the handle's device context.
if group.comm.backend == "cuda" and symm_triton is not None:
    t.fill_(rank + 1.0)
    status = torch.zeros(8, dtype=torch.int32, device="cuda")
    all_reduce_kernel[(8,)](handle.device_context, handle.offset, n, status, symm_triton.FLOAT32, num_warps=4)
    torch.cuda.synchronize()
    assert bool((status == symm_triton.SUCCESS).all()), status.tolist()
    assert bool((t == world * (world + 1) / 2).all())
    print(f"rank {rank}: Triton all_reduce through the device context agrees", flush=True)

dist.barrier()
if rank == 0:
    print(f"{world} ranks: all_reduce in the window, no copy ({group.comm.backend} backend)", flush=True)
dist.destroy_process_group()
