"""All-reduce across 4 ranks driven by one thread: the README's Python example.

    python3 examples/python/allreduce.py

Runs on GPU 0 (cuda backend; filling and reading the buffers then needs PyTorch) or, without a
GPU, on the host backend (CPU threads, NumPy views of the buffers).
"""

import numpy as np

import symm


def fill(buf: symm.Buffer, value: float) -> None:
    """Set every float32 of ``buf``: a NumPy view on the host backend, PyTorch on a GPU."""
    if buf.comm.backend == "host":
        buf.numpy()[:] = value
    else:
        import torch

        torch.as_tensor(buf, device="cuda").fill_(value)


def read(buf: symm.Buffer) -> np.ndarray:
    """The float32 contents of ``buf`` as a NumPy array."""
    if buf.comm.backend == "host":
        return buf.numpy().copy()
    import torch

    return torch.as_tensor(buf, device="cuda").cpu().numpy()


# -- as in the README --
n, count = 4, 1 << 16
comms = symm.Comm.init_all([0] * n)  # 4 ranks on GPU 0 (CPU threads on the host backend)
bufs = [c.alloc(count, "float32") for c in comms]  # typed: count and dtype go with them
with symm.group():  # one thread drives all ranks: group their calls
    wins = [c.register(b) for c, b in zip(comms, bufs)]
for r, b in enumerate(bufs):
    fill(b, r + 1)
with symm.group():
    for c, b in zip(comms, bufs):
        c.all_reduce(b, op="sum")  # in place, all `count` float32
assert (read(bufs[0]) == n * (n + 1) // 2).all()
# -- end --

print(f"all-reduce of {count} float32 over {n} ranks on the {comms[0].backend} backend: {read(bufs[0])[0]}")
for c in comms:
    c.destroy()
