"""Rank programs run in spawned processes by test_lifecycle.py (a module of their own, so the
children import nothing but symm and NumPy)."""

from __future__ import annotations

import numpy as np

import symm


def rank_input(rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s all-reduce input."""
    return (np.arange(count, dtype=np.float64) * 0.25 + rank * 1000.0).astype(np.float32)


def all_reduce_rank(uid: symm.UniqueId, nranks: int, rank: int, count: int) -> np.ndarray:
    """Join the communicator, all-reduce :func:`rank_input` in place, return the result."""
    with symm.Comm(nranks, uid, rank) as comm:
        assert comm.backend == "host"
        buf = comm.alloc(count * 4)
        with comm.register(buf):
            buf.numpy("float32")[:] = rank_input(rank, count)
            comm.all_reduce(buf, buf, count, "float32", "sum")
            result = buf.numpy("float32").copy()
        buf.free()
    return result


def from_env_rank(environ: dict[str, str], count: int) -> tuple[int, int, np.ndarray]:
    """Join with :meth:`symm.Comm.from_env` reading ``environ`` (as torchrun sets it),
    all-reduce :func:`rank_input` out of place with count and dtype from the arrays, pass a
    barrier, return (rank, nranks, result)."""
    with symm.Comm.from_env(environ) as comm:
        buf = comm.alloc(2 * count, "float32")
        with comm.register(buf):
            send, recv = buf.numpy()[:count], buf.numpy()[count:]
            send[:] = rank_input(comm.rank, count)
            comm.all_reduce(send, recv)
            comm.barrier()
            result = recv.copy()
        buf.free()
        return comm.rank, comm.nranks, result
