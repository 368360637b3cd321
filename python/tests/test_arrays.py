"""The array's word: collectives take ``count`` and ``dtype`` from what they are given (NumPy,
DLPack, ``__array_interface__``, typed buffers, PyTorch when installed) and refuse a ``dtype``
or ``count`` that disagrees with it before anything is copied (the refusal is the rank's call,
as the library's own refusals are, so ranks that all refuse it stay in step); typed
allocation; ``Comm.barrier``; ``Comm.from_env``."""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time

import mp_worker
import numpy as np
import pytest

import symm


@pytest.fixture
def pair():
    """Two ranks of one thread, each with a raw 4 KiB window."""
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(4096) for c in comms]
    with symm.group():
        wins = [c.register(b) for c, b in zip(comms, bufs)]
    yield comms, bufs
    for w in wins:
        w.deregister()
    for c in comms:
        c.destroy()


def assert_healthy(comms: list[symm.Comm]) -> None:
    """No communicator failed, and the ranks are still in step: a barrier (an all-reduce)
    agrees."""
    assert all(c.async_error() is None for c in comms)
    with symm.group():
        for c in comms:
            c.barrier()
    assert all(c.async_error() is None for c in comms)


def refused_on_every_rank(comms: list[symm.Comm], bufs: list, match: str, call) -> None:
    """``call(comm, buf)`` refused on every rank with a message matching ``match``: the refusal
    is each rank's call, so the ranks stay in step."""
    for comm, buf in zip(comms, bufs):
        with pytest.raises(symm.InvalidArgumentError, match=match):
            call(comm, buf)


class DLPackOnly:
    """An object that speaks only DLPack (as a JAX array does), over a NumPy array."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class ArrayInterfaceOnly:
    """An object that speaks only ``__array_interface__``."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.__array_interface__ = array.__array_interface__


@pytest.mark.parametrize("form", ["numpy", "dlpack", "array_interface"])
def test_count_and_dtype_come_from_the_arrays(pair, form: str) -> None:
    comms, bufs = pair
    wrap = {"numpy": lambda a: a, "dlpack": DLPackOnly, "array_interface": ArrayInterfaceOnly}[form]
    # All-reduce of 37 float64, out of place, then in place (recv left out).
    for r, buf in enumerate(bufs):
        buf.numpy("float64", 37)[:] = np.arange(37) + 100 * r
    with symm.group():
        for buf, comm in zip(bufs, comms):
            comm.all_reduce(wrap(buf.numpy("float64", 37)), wrap(buf.numpy("float64", 37, 512)), op="max")
    for buf in bufs:
        np.testing.assert_array_equal(buf.numpy("float64", 37, 512), np.arange(37) + 100)
    with symm.group():
        for buf, comm in zip(bufs, comms):
            comm.all_reduce(wrap(buf.numpy("float64", 37)))
    for buf in bufs:
        np.testing.assert_array_equal(buf.numpy("float64", 37), 2 * np.arange(37) + 100)
    # All-gather of 5 int32 per rank into 10; reduce-scatter of 2 x 3 int64 into 3.
    for r, buf in enumerate(bufs):
        buf.numpy("int32", 5, 1024)[:] = r + 1
    with symm.group():
        for buf, comm in zip(bufs, comms):
            comm.all_gather(wrap(buf.numpy("int32", 5, 1024)), wrap(buf.numpy("int32", 10, 2048)))
    for buf in bufs:
        np.testing.assert_array_equal(buf.numpy("int32", 10, 2048), [1] * 5 + [2] * 5)
    for r, buf in enumerate(bufs):
        buf.numpy("int64", 6, 1024)[:] = np.arange(6) * (r + 1)
    with symm.group():
        for buf, comm in zip(bufs, comms):
            comm.reduce_scatter(wrap(buf.numpy("int64", 6, 1024)), wrap(buf.numpy("int64", 3, 2048)))
    for r, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf.numpy("int64", 3, 2048), (np.arange(6) * 3)[3 * r : 3 * r + 3])
    assert_healthy(comms)


def test_a_dtype_that_disagrees_with_the_array_is_refused(pair) -> None:
    """A float64 array called float32 (the wrong width: garbage, were it passed on), or float16
    (the same width as nothing), or a uint32 array called float32 (the same width: still not
    the array's type) is refused, naming both; nothing is copied."""
    comms, bufs = pair
    for buf in bufs:
        buf.numpy("float64", 16)[:] = 7.0
    refused_on_every_rank(
        comms, bufs, r"send is a float64 NumPy array but dtype is float32",
        lambda comm, buf: comm.all_reduce(buf.numpy("float64", 16), buf.numpy("float64", 16), 16, "float32"),
    )
    refused_on_every_rank(
        comms, bufs, "float64 NumPy array but dtype is float32",
        lambda comm, buf: comm.all_reduce(buf.numpy("float64", 16), dtype="float32"),
    )
    refused_on_every_rank(
        comms, bufs, "uint32 NumPy array but dtype is float32",
        lambda comm, buf: comm.all_reduce(buf.numpy("uint32", 16), dtype="float32"),
    )
    refused_on_every_rank(
        comms, bufs, "recv is an int64 DLPack tensor",
        lambda comm, buf: comm.all_gather(buf.numpy("int32", 4), DLPackOnly(buf.numpy("int64", 4, 512))),
    )
    refused_on_every_rank(
        comms, bufs, "their element types differ",
        lambda comm, buf: comm.all_reduce(buf.numpy("float32", 4), buf.numpy("int32", 4, 512)),
    )
    # NumPy holds bfloat16 and float8 as their bit patterns: those agree, and symm has no
    # uint16 to infer.
    refused_on_every_rank(
        comms, bufs, "no uint16 type.*bfloat16", lambda comm, buf: comm.all_reduce(buf.numpy("uint16", 8))
    )
    for buf in bufs:
        assert (buf.numpy("float64", 16) == 7.0).all(), "a refused call wrote"
    assert_healthy(comms)


def test_a_count_that_disagrees_with_the_array_is_refused(pair) -> None:
    comms, bufs = pair
    refused_on_every_rank(
        comms, bufs, "send is a float32 NumPy array of 100 elements but the call has count 50",
        lambda comm, buf: comm.all_reduce(buf.numpy("float32", 100), buf.numpy("float32", 100), 50),
    )
    refused_on_every_rank(
        comms, bufs, "count 200", lambda comm, buf: comm.all_reduce(buf.numpy("float32", 100), count=200)
    )
    refused_on_every_rank(
        comms, bufs, r"recv .* of 100 elements .*2 x 100 = 200",
        lambda comm, buf: comm.all_gather(buf.numpy("float32", 100), buf.numpy("float32", 100, 1024)),
    )
    refused_on_every_rank(
        comms, bufs, "not a whole number of 2 x count",
        lambda comm, buf: comm.reduce_scatter(buf.numpy("float32", 7), buf.numpy("float32", 3, 1024)),
    )
    refused_on_every_rank(comms, bufs, "dtype is required", lambda comm, buf: comm.all_reduce(buf.ptr, buf.ptr, 4))
    refused_on_every_rank(
        comms, bufs, "count is required", lambda comm, buf: comm.all_reduce(buf.ptr, buf.ptr, dtype="float32")
    )
    # A raw buffer has no element type.
    refused_on_every_rank(comms, bufs, "dtype is required", lambda comm, buf: comm.all_reduce(buf))
    assert_healthy(comms)


def test_typed_buffers_are_arrays() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1000, "float32") for c in comms]
    raw = [c.alloc(64) for c in comms]
    with symm.group():
        wins = [c.register(b) for c, b in zip(comms, bufs)] + [c.register(b) for c, b in zip(comms, raw)]
    for r, buf in enumerate(bufs):
        assert buf.count == 1000 and buf.nbytes == 4000 and buf.dtype == symm.DataType.symmFloat32
        array = np.asarray(buf)
        assert array.dtype == np.float32 and array.shape == (1000,)
        array[:] = r + 0.5
    # A whole typed buffer (count inferred), a prefix of one (count given), its window.
    with symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b)
    assert (np.asarray(bufs[0]) == 2.0).all()
    with symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, b, 10)
    assert (bufs[1].numpy()[:10] == 4.0).all() and (bufs[1].numpy()[10:] == 2.0).all()
    with symm.group():
        for c, w in zip(comms, wins[:2]):
            c.all_reduce(w, op="min")
    assert (np.asarray(bufs[0])[:3] == 4.0).all()
    refused_on_every_rank(
        comms, bufs, "float32 Buffer but dtype is float64", lambda comm, buf: comm.all_reduce(buf, dtype="float64")
    )
    refused_on_every_rank(comms, bufs, "send holds 4000 bytes", lambda comm, buf: comm.all_reduce(buf, count=1001))
    # A raw buffer is any type.
    for r, b in enumerate(raw):
        b.numpy("int16")[:] = r + 1
    with symm.group():
        for c, b in zip(comms, raw):
            c.all_reduce(b, b, 16, "int32", "prod")
    # Each int32 is two int16 of r + 1: 0x00010001 x 0x00020002, modulo 2^32.
    assert raw[0].numpy().dtype == np.uint8 and (raw[0].numpy("int32") == 0x00040002).all()
    assert_healthy(comms)
    for w in wins:
        w.deregister()
    for c in comms:
        c.destroy()


def test_memory_of_the_other_backend_is_refused(pair) -> None:
    comms, _ = pair

    class DeviceArray:
        __cuda_array_interface__ = {"version": 3, "shape": (4,), "typestr": "<f4", "data": (1 << 40, False)}

    refused_on_every_rank(
        comms, [DeviceArray()] * 2, "device memory.*host backend needs host memory",
        lambda comm, array: comm.all_reduce(array),
    )
    assert_healthy(comms)


def test_torch_tensors_give_their_dtype() -> None:
    torch = pytest.importorskip("torch")
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(64, "bfloat16") for c in comms]
    with symm.group():
        wins = [c.register(b) for c, b in zip(comms, bufs)]
    tensors = [torch.from_numpy(b.numpy()).view(torch.bfloat16) for b in bufs]
    for r, t in enumerate(tensors):
        t.fill_(r + 1)
    with symm.group():
        for c, t in zip(comms, tensors):
            c.all_reduce(t)
    assert all((t == 3).all() for t in tensors)
    refused_on_every_rank(
        comms, tensors, "bfloat16 CPU tensor but dtype is float16", lambda comm, t: comm.all_reduce(t, dtype="float16")
    )
    # A uint16 tensor holding bfloat16 bit patterns (what torch.as_tensor makes of a CUDA
    # array interface, which cannot name bfloat16) agrees with dtype="bfloat16", as NumPy's does.
    holders = [t.view(torch.uint16) for t in tensors]
    with symm.group():
        for c, h in zip(comms, holders):
            c.all_reduce(h, dtype="bfloat16")
    assert all((t == 6).all() for t in tensors)
    refused_on_every_rank(comms, holders, r"no (torch\.)?uint16 type", lambda comm, h: comm.all_reduce(h))
    assert_healthy(comms)
    for w in wins:
        w.deregister()
    for c in comms:
        c.destroy()


def test_barrier_waits_for_every_rank() -> None:
    """Rank 1 reaches the barrier 0.3 s after rank 0, whose barrier returns no earlier; twice
    (the window registered by the first barrier is reused)."""
    nranks = 2
    uid = symm.get_unique_id()
    comms: list[symm.Comm | None] = [None] * nranks
    left: list[list[float]] = [[] for _ in range(nranks)]
    arrived: list[list[float]] = [[] for _ in range(nranks)]

    def rank(r: int) -> None:
        comm = symm.Comm(nranks, uid, r)
        comms[r] = comm
        for _ in range(2):
            if r == 1:
                time.sleep(0.3)
            arrived[r].append(time.monotonic())
            comm.barrier()
            left[r].append(time.monotonic())

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for round in range(2):
        assert left[0][round] >= arrived[1][round] - 0.01, f"round {round}: rank 0 left before rank 1 arrived"
    for comm in comms:
        assert comm is not None and comm.async_error() is None
        comm.destroy()


def test_barrier_of_one_thread_driving_every_rank() -> None:
    comms = symm.Comm.init_all(3)
    for _ in range(3):
        with symm.group():
            for c in comms:
                c.barrier()
    assert_healthy(comms)
    for c in comms:
        c.destroy()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_from_env_joins_as_torchrun_describes() -> None:
    """Three processes with torchrun's variables only (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT): they find each other, and the all-reduce is right."""
    nranks, count = 3, 301
    port = free_port()
    envs = [
        {"RANK": str(r), "WORLD_SIZE": str(nranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1)}
        for r in range(nranks)
    ]
    context = multiprocessing.get_context("spawn")
    with context.Pool(nranks) as pool:
        results = pool.starmap(mp_worker.from_env_rank, [(env, count) for env in envs])
    expected = sum(mp_worker.rank_input(r, count) for r in range(nranks))
    assert sorted(r for r, _, _ in results) == list(range(nranks))
    for rank, size, result in results:
        assert size == nranks
        np.testing.assert_array_equal(result, expected, err_msg=f"rank {rank}")


@pytest.mark.parametrize(
    "environ, message",
    [
        ({}, "the rank: none of RANK"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, r'RANK="x" is not an integer'),
        ({"RANK": "0"}, "the number of ranks"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "SYMM_COMM_ID=host:port, or MASTER_ADDR and MASTER_PORT"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, "MASTER_PORT is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, "not a port"),
        ({"RANK": "2", "WORLD_SIZE": "2", "SYMM_COMM_ID": "127.0.0.1:1"}, "rank = 2"),
    ],
)
def test_from_env_names_what_is_missing(environ: dict[str, str], message: str) -> None:
    with pytest.raises(symm.InvalidArgumentError, match=message):
        symm.Comm.from_env(environ)
