"""Communicators, buffers and windows from creation to teardown, one thread or process per rank,
and every misuse: the right exception with a useful message, never a crash."""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import threading

import mp_worker
import numpy as np
import pytest

import symm
from symm._core import window_of_device_context


def register_all(comms: list[symm.Comm], bufs: list[symm.Buffer]) -> list[symm.Window]:
    with symm.group():
        return [comm.register(buf) for comm, buf in zip(comms, bufs)]


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_init_all_end_to_end(nranks: int) -> None:
    comms = symm.Comm.init_all(nranks)
    assert [c.rank for c in comms] == list(range(nranks))
    assert {c.nranks for c in comms} == {nranks}
    assert {c.backend for c in comms} == {"host"}
    assert all(c.async_error() is None for c in comms)
    bufs = [c.alloc(1000, dtype="float64") for c in comms]
    assert all(b.nbytes == 8000 and b.count == 1000 and b.ptr % 16 == 0 for b in bufs)
    wins = register_all(comms, bufs)
    assert all(w.base == b.ptr and w.nbytes == 8000 and w.device_context != 0 for w, b in zip(wins, bufs))
    for r, buf in enumerate(bufs):
        buf.numpy()[:] = np.arange(1000) * (r + 1)
    with symm.group():
        for comm, buf in zip(comms, bufs):
            comm.all_reduce(buf)  # count, dtype from the typed buffer; in place
    for buf in bufs:
        assert np.asarray(buf).dtype == np.float64
        np.testing.assert_array_equal(np.asarray(buf), np.arange(1000) * (nranks * (nranks + 1) // 2))
    for w in wins:
        w.deregister()
    for b in bufs:
        b.free()
    for c in comms:
        c.destroy()
        assert c.destroyed


def test_init_all_with_a_device_list() -> None:
    comms = symm.Comm.init_all([0, 0, 0])
    assert [c.rank for c in comms] == [0, 1, 2]
    assert [c.device for c in comms] == [0, 0, 0]
    for c in comms:
        c.destroy()


def test_ranks_of_this_process_per_device() -> None:
    """What symm.triton's co-residency check counts: the live ranks of one communicator that this
    process created on a device, and the window a device context belongs to."""
    comms = symm.Comm.init_all([0, 0, 1, 0])
    others = symm.Comm.init_all([0, 0])
    assert [comms[0]._process_ranks_on_device(d) for d in (0, 1, 2)] == [3, 1, 0]
    assert [comms[2]._process_ranks_on_device(d) for d in (0, 1)] == [3, 1]
    assert others[0]._process_ranks_on_device(0) == 2  # another communicator: counted apart
    bufs = [c.alloc(256) for c in comms]
    wins = register_all(comms, bufs)
    contexts = [w.device_context for w in wins]
    assert all(window_of_device_context(c) is w for c, w in zip(contexts, wins))
    assert window_of_device_context(contexts[0] + 1) is None
    wins[0].deregister()
    assert window_of_device_context(contexts[0]) is None
    comms[1].destroy()
    assert comms[0]._process_ranks_on_device(0) == 2
    assert window_of_device_context(contexts[1]) is None  # destroying the comm dropped it
    for c in [comms[0], *comms[2:], *others]:
        c.destroy()


def test_ranks_of_this_process_joined_with_one_unique_id() -> None:
    nranks = 3
    uid = symm.get_unique_id()
    together = threading.Barrier(nranks)
    counts: list[int] = []
    failures: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            with symm.Comm(nranks, uid, rank) as comm:
                together.wait(timeout=60)
                counts.append(comm._process_ranks_on_device(comm.device))
                together.wait(timeout=60)
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    assert counts == [nranks] * nranks


def test_one_thread_per_rank_with_a_unique_id() -> None:
    nranks, count = 3, 5001
    uid = symm.get_unique_id()
    results: list[np.ndarray | None] = [None] * nranks
    failures: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            with symm.Comm(nranks, uid.hex(), rank) as comm:
                assert (comm.rank, comm.nranks) == (rank, nranks)
                buf = comm.alloc(count * 4 * nranks * 2)
                with comm.register(buf) as win:
                    assert win.device_context != 0
                    data = buf.numpy("int32", count * nranks)
                    data[:] = np.arange(count * nranks) + rank
                    comm.all_reduce(buf, buf, count, "int32", "max")
                    gathered = buf.ptr + count * 4 * nranks
                    comm.all_gather(buf, gathered, count, "int32")
                    results[rank] = buf.numpy("int32", count * nranks, count * 4 * nranks).copy()
                buf.free()
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    expected = np.tile(np.arange(count) + nranks - 1, nranks)
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_one_process_per_rank() -> None:
    """Ranks in separately spawned processes (the host backend shares windows through memfds);
    the id is made here and pickled to them."""
    nranks, count = 2, 777
    uid = symm.get_unique_id()
    context = multiprocessing.get_context("spawn")
    with context.Pool(nranks) as pool:
        results = pool.starmap(mp_worker.all_reduce_rank, [(uid, nranks, r, count) for r in range(nranks)])
    expected = sum(mp_worker.rank_input(r, count) for r in range(nranks))
    for rank, result in enumerate(results):
        np.testing.assert_array_equal(result, expected, err_msg=f"rank {rank}")


def test_buffer_views_and_array_interface() -> None:
    with symm.Comm.init_all(1)[0] as comm:
        buf = comm.alloc(32, dtype="bf16")
        assert buf.nbytes == 64 and len(buf) == 32
        assert not hasattr(buf, "__cuda_array_interface__")  # host memory: no device interface
        assert buf.numpy().dtype == np.uint16 and np.asarray(buf).shape == (32,)  # bf16 bit patterns
        view = buf.view("float32", count=4, offset=16)
        interface = view.__cuda_array_interface__
        assert interface["version"] == 3
        assert interface["data"] == (buf.ptr + 16, False)
        assert interface["shape"] == (4,) and interface["typestr"] == "<f4"
        assert buf.view("bfloat16").__cuda_array_interface__["typestr"] == "<u2"
        arr = buf.numpy("uint8")
        arr[:] = np.arange(64)
        assert buf.numpy("uint32", 1, 4)[0] == int.from_bytes(bytes([4, 5, 6, 7]), "little")
        with pytest.raises(symm.InvalidArgumentError, match="exceed"):
            buf.numpy("float64", 9)
        with pytest.raises(symm.InvalidArgumentError, match="exceed"):
            buf.view("uint8", 1, 64)
        # The view keeps the buffer object alive after the last reference to it goes.
        del buf
        gc.collect()
        assert arr[63] == 63


def test_window_offsets() -> None:
    (comm,) = symm.Comm.init_all(1)
    buf = comm.alloc(4096)
    with comm.register(buf) as win:
        assert win.offset(buf) == 0
        assert win.offset(buf.ptr + 100) == 100
        assert win.offset(buf.numpy("uint8")[256:]) == 256
        with pytest.raises(symm.InvalidArgumentError, match="not inside the window"):
            win.offset(buf.ptr + 4096)
    assert not win.registered
    comm.destroy()


def test_use_after_destroy_raises() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(256) for c in comms]
    wins = register_all(comms, bufs)
    view = bufs[0].numpy("float32")
    comms[0].destroy()
    with pytest.raises(symm.InvalidUsageError, match="destroyed"):
        comms[0].destroy()
    with pytest.raises(symm.InvalidUsageError, match="destroyed"):
        comms[0].alloc(64)
    with pytest.raises(symm.InvalidUsageError, match="destroyed"):
        comms[0].all_reduce(bufs[0], bufs[0], 4, "float32", "sum")
    with pytest.raises(symm.InvalidUsageError, match="destroyed"):
        comms[0].async_error()
    with pytest.raises(symm.InvalidUsageError, match="communicator was destroyed"):
        _ = wins[0].device_context
    with pytest.raises(symm.InvalidUsageError, match="communicator was destroyed"):
        wins[0].deregister()
    with pytest.raises(symm.InvalidUsageError, match="destroyed, which freed it"):
        bufs[0].free()
    with pytest.raises(symm.InvalidUsageError, match="destroyed, which freed it"):
        bufs[0].numpy("float32")
    with pytest.raises(symm.InvalidUsageError, match="gone"):
        comms[1].all_reduce(bufs[0], bufs[1], 4, "float32", "sum")
    assert bufs[0].freed and not wins[0].registered
    assert view.size == 64  # the array object stays valid Python; its memory is gone
    # The surviving rank tears down normally.
    wins[1].deregister()
    bufs[1].free()
    comms[1].destroy()


def test_abort_from_another_thread_ends_a_waiting_call_and_fails_the_peers() -> None:
    """Rank 0 all-reduces while rank 1 makes no call; another thread aborts rank 0: the call
    raises at once, the abort frees rank 0, and rank 1's next call raises naming the abort."""
    import time

    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(256) for c in comms]
    register_all(comms, bufs)
    outcome: list[BaseException | None] = []

    def waiting_call() -> None:
        try:
            comms[0].all_reduce(bufs[0], bufs[0], 4, "float32", "sum")
        except symm.SymmError as error:
            outcome.append(error)
        else:
            outcome.append(None)

    caller = threading.Thread(target=waiting_call)
    caller.start()
    time.sleep(0.3)
    started = time.monotonic()
    comms[0].abort()
    caller.join(timeout=5)
    assert not caller.is_alive() and time.monotonic() - started < 3
    assert isinstance(outcome[0], symm.SymmError), outcome
    assert comms[0].destroyed and bufs[0].freed
    with pytest.raises(symm.SymmError, match="symmCommAbort"):
        comms[1].all_reduce(bufs[1], bufs[1], 4, "float32", "sum")
    comms[1].destroy()


def test_finalize_then_only_teardown() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(256) for c in comms]
    wins = register_all(comms, bufs)
    with symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, b, 4, "float32", "sum")
    for c in comms:
        c.finalize()
    with pytest.raises(symm.InvalidUsageError, match="symmCommFinalize"):
        comms[0].all_reduce(bufs[0], bufs[0], 4, "float32", "sum")
    for w, b, c in zip(wins, bufs, comms):
        w.deregister()
        b.free()
        c.destroy()


def test_split_all_into_halves_that_sum_apart() -> None:
    comms = symm.Comm.init_all(4)
    # Even and odd ranks apart, each half in reverse order; rank 3 joins none.
    children = symm.Comm.split_all(comms, [0, 1, 0, None], keys=[2, 0, 1, 0])
    assert children[3] is None
    assert [(c.rank, c.nranks) for c in children[:3]] == [(1, 2), (0, 1), (0, 2)]
    half = [children[0], children[2]]
    bufs = [c.alloc(64, dtype="float64") for c in half]
    wins = register_all(half, bufs)
    for value, buf in zip([1.0, 10.0], bufs):
        buf.numpy()[:] = value
    with symm.group():
        for c, b in zip(half, bufs):
            c.all_reduce(b)
    for buf in bufs:
        np.testing.assert_array_equal(np.asarray(buf), np.full(64, 11.0))
    for w, b, c in zip(wins, bufs, half):
        w.deregister()
        b.free()
        c.destroy()
    children[1].destroy()
    for c in comms:
        c.destroy()


def test_split_one_thread_per_rank() -> None:
    comms = symm.Comm.init_all(2)
    results: list[tuple[int, int] | None] = [None, None]
    failures: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            with comms[rank].split(color=5, key=-rank) as child:
                results[rank] = (child.rank, child.nranks)
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    assert results == [(1, 2), (0, 2)]
    for c in comms:
        c.destroy()


def test_revoke_then_split_continues() -> None:
    comms = symm.Comm.init_all(2)
    for c in comms:
        c.revoke()
    bufs = [c.alloc(64, dtype="float32") for c in comms]
    wins = register_all(comms, bufs)
    with pytest.raises(symm.InvalidUsageError, match="revoked"):
        comms[0].all_reduce(bufs[0])
    children = symm.Comm.split_all(comms, [0, 0])
    child_bufs = [c.alloc(64, dtype="float32") for c in children]
    child_wins = register_all(children, child_bufs)
    for value, buf in zip([1.0, 2.0], child_bufs):
        buf.numpy()[:] = value
    with symm.group():
        for c, b in zip(children, child_bufs):
            c.all_reduce(b)
    for buf in child_bufs:
        np.testing.assert_array_equal(np.asarray(buf), np.full(64, 3.0, dtype=np.float32))
    for w, b, c in zip(child_wins + wins, child_bufs + bufs, children + comms):
        w.deregister()
        b.free()
        c.destroy()


def test_shrink_keeps_the_buffers_and_their_data() -> None:
    comms = symm.Comm.init_all(3)
    results: list[np.ndarray | None] = [None, None, None]
    failures: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            buf = comms[rank].alloc(64, dtype="float32")
            buf.numpy()[:] = rank + 1
            child = comms[rank].shrink([0], abort=True)
            assert (child.rank, child.nranks) == (rank - 1, 2)
            assert buf.comm is child
            np.testing.assert_array_equal(buf.numpy(), np.full(64, rank + 1, dtype=np.float32))
            with child.register(buf):
                child.all_reduce(buf)
                results[rank] = buf.numpy().copy()
            buf.free()
            child.destroy()
        except BaseException as error:  # noqa: BLE001  (reported by the main thread)
            failures.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failures, failures
    for rank in (1, 2):
        np.testing.assert_array_equal(results[rank], np.full(64, 5.0, dtype=np.float32))
    with pytest.raises(symm.InvalidArgumentError, match="holds this rank"):
        comms[0].shrink([0])
    with symm.group(), pytest.raises(symm.InvalidUsageError, match="inside symm.group"):
        comms[0].split(0)
    for c in comms:
        c.destroy()


def test_split_refuses_bad_colors_and_keys() -> None:
    comms = symm.Comm.init_all(2)
    # The library refuses a bad color on the rank that passed it and tells its peer at once.
    with pytest.raises(symm.InvalidArgumentError, match="color = -3"):
        symm.Comm.split_all(comms, [-3, 0])
    assert "rank 0 refused its split" in comms[1].last_error()
    with pytest.raises(symm.InvalidArgumentError, match="key"):
        comms[0].split(0, key=2**31)
    with pytest.raises(symm.InvalidArgumentError, match="one of each per comm"):
        symm.Comm.split_all(comms, [0])
    with pytest.raises(symm.InvalidArgumentError, match="maxCTAs"):
        symm.Comm.split_all(comms, [0, 0], min_ctas=4, max_ctas=2)
    # NCCL's NOCOLOR value and None are the same; a configured bound is accepted.
    children = symm.Comm.split_all(comms, [symm.SPLIT_NOCOLOR, 0], max_ctas=1)
    assert children[0] is None and children[1] is not None and children[1].nranks == 1
    children[1].destroy()
    comms[1].destroy()
    with pytest.raises(symm.InvalidUsageError, match=r"comms\[1\] \(rank 1\) was destroyed"):
        symm.Comm.split_all(comms, [0, 0])
    comms[0].destroy()


def test_double_free_and_double_deregister_raise() -> None:
    with symm.Comm.init_all(1)[0] as comm:
        buf = comm.alloc(128)
        win = comm.register(buf)
        with pytest.raises(symm.InvalidUsageError, match="still registered"):
            buf.free()
        win.deregister()
        with pytest.raises(symm.InvalidUsageError, match="deregistered"):
            win.deregister()
        with pytest.raises(symm.InvalidUsageError, match="deregistered"):
            _ = win.device_context
        buf.free()
        with pytest.raises(symm.InvalidUsageError, match="already freed|it was freed"):
            buf.free()
        with pytest.raises(symm.InvalidUsageError, match="it was freed"):
            comm.all_reduce(buf, buf, 1, "int8", "sum")
        with comm.alloc(16) as scoped:
            pass
        assert scoped.freed
    assert comm.destroyed


def test_bad_arguments_raise_the_right_class() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1024) for c in comms]
    register_all(comms, bufs)
    comm, buf = comms[0], bufs[0]
    # Checked by the package before the call.
    foreign = (ctypes.c_char * 4096)()
    cases: list[tuple[object, type[symm.SymmError], str]] = [
        (lambda: comm.all_reduce(buf, buf, 4, "float33", "sum"), symm.InvalidArgumentError, "dtype 'float33'"),
        (lambda: comm.all_reduce(buf, buf, 4, "float32", "median"), symm.InvalidArgumentError, "op 'median'"),
        (lambda: comm.all_reduce(buf, buf, -1, "float32", "sum"), symm.InvalidArgumentError, "count"),
        (
            lambda: comm.all_reduce(buf, buf, 2.0, "float32", "sum"),
            symm.InvalidArgumentError,
            "count must be an integer",
        ),
        (lambda: comm.all_reduce(buf, buf, 257, "float32", "sum"), symm.InvalidArgumentError, "send holds 1024 bytes"),
        (lambda: comm.all_gather(buf, buf, 200, "float32"), symm.InvalidArgumentError, "recv holds 1024 bytes"),
        (lambda: comm.reduce_scatter(buf, buf, 200, "float32", "sum"), symm.InvalidArgumentError, "send holds 1024"),
        (lambda: comm.all_reduce("buf", buf, 1, "float32", "sum"), symm.InvalidArgumentError, "send must be"),
        (lambda: comm.all_reduce(buf, True, 1, "float32", "sum"), symm.InvalidArgumentError, "recv must be"),
        (lambda: comm.all_reduce(buf, -8, 1, "float32", "sum"), symm.InvalidArgumentError, "not a pointer"),
        (lambda: comm.all_reduce(buf, buf, 1, "float32", "sum", stream="s"), symm.InvalidArgumentError, "stream"),
        (lambda: comm.all_reduce(buf.numpy("float32")[::2], buf, 1, "f32"), symm.InvalidArgumentError, "contiguous"),
        (lambda: comm.alloc(-1), symm.InvalidArgumentError, "size"),
        (lambda: comm.register(buf.ptr), symm.InvalidArgumentError, "nbytes is required"),
        (lambda: comm.register(buf, 2048), symm.InvalidArgumentError, "exceeds"),
        (lambda: symm.Comm.init_all(0), symm.InvalidArgumentError, "devices"),
        (lambda: symm.Comm.init_all([]), symm.InvalidArgumentError, "empty"),
        (lambda: symm.Comm.init_all("two"), symm.InvalidArgumentError, "devices"),
        (lambda: symm.Comm(0, symm.get_unique_id(), 0), symm.InvalidArgumentError, "nranks"),
        (lambda: symm.Comm(2, symm.get_unique_id(), -1), symm.InvalidArgumentError, "rank"),
        (lambda: symm.Comm(2, 12, 0), symm.InvalidArgumentError, "uid"),
        # Checked by the library: its message arrives in the exception.
        (lambda: comm.all_reduce(buf.ptr + 2, buf, 4, "float32", "sum"), symm.InvalidArgumentError, "element size"),
        # A buffer that overruns its window is refused (one outside every window is staged:
        # test_collectives.py).
        (lambda: comm.all_reduce(buf.ptr + 1020, buf, 4, "float32", "sum"), symm.InvalidArgumentError, "overruns"),
        (lambda: symm.Comm(2, symm.get_unique_id(), 2), symm.InvalidArgumentError, r"rank = 2"),
        (lambda: symm.Comm(2, bytes(128), 0), symm.InvalidArgumentError, "symmGetUniqueId"),
        # Process memory outside every allocation of the communicator (not an offset from buf,
        # which may land in the communicator's own staging window).
        (lambda: comm.register(ctypes.addressof(foreign), 16), symm.InvalidArgumentError, "symmMemAlloc"),
        (lambda: symm.Comm.init_all(2**40), symm.InvalidArgumentError, "devices"),
    ]
    for index, (call, cls, pattern) in enumerate(cases):
        with pytest.raises(cls, match=pattern):
            call()
        assert all(c.async_error() is None for c in comms), f"case {index} left an error behind"
    # The calls the library refused still count as rank 0's calls (only it made them), so the
    # ranks are out of step: their next collective fails the communicator, naming the refused
    # call, instead of pairing rank 0's call with another of rank 1's.
    for r, b in enumerate(bufs):
        b.numpy("int32")[:] = r
    # (InvalidUsage from the rank that finds the mismatch, RemoteError from its peer: the group
    # end reports whichever launch it looks at first.)
    with pytest.raises((symm.InvalidUsageError, symm.RemoteError), match="was refused"), symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, b, 256, "int32", "sum")
    for b, r in zip(bufs, range(2)):
        assert (b.numpy("int32") == r).all()
    assert all(c.async_error() is not None for c in comms)
    for c in comms:
        c.destroy()
    # A fresh pair that makes the same bad call on both ranks stays in step and works.
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1024) for c in comms]
    register_all(comms, bufs)
    with pytest.raises(symm.InvalidArgumentError, match="nothing of this group was launched"):
        with symm.group():
            for c, b in zip(comms, bufs):
                with pytest.raises(symm.InvalidArgumentError, match="multiple of the element size"):
                    c.all_reduce(b.ptr + 2, b.ptr + 2, 4, "int32", "sum")
    for r, b in enumerate(bufs):
        b.numpy("int32")[:] = r
    with symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, b, 256, "int32", "sum")
    for b in bufs:
        assert (b.numpy("int32") == 1).all()
    for c in comms:
        c.destroy()


def test_mismatched_group_parts_raise_invalid_usage_naming_the_ranks() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1024) for c in comms]
    register_all(comms, bufs)
    with pytest.raises(symm.InvalidUsageError, match="rank"), symm.group():
        comms[0].all_reduce(bufs[0], bufs[0], 4, "float32", "sum")
        comms[1].all_reduce(bufs[1], bufs[1], 8, "float32", "sum")
    for c in comms:
        c.destroy()


def test_group_ends_even_when_its_block_raises() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1024) for c in comms]
    register_all(comms, bufs)
    for r, b in enumerate(bufs):
        b.numpy("float32")[:] = r + 1
    with pytest.raises(RuntimeError, match="inside the group"), symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, b, 4, "float32", "sum")
        raise RuntimeError("inside the group")
    # symmGroupEnd ran on the way out: the queued collective ran, and no group is open.
    for b in bufs:
        np.testing.assert_array_equal(b.numpy("float32", 4), 3)
    from symm._lib import lib

    assert lib.symmGroupEnd() == symm.Result.symmInvalidUsage
    for c in comms:
        c.destroy()


def test_teardown_inside_an_open_group_is_refused_then_works() -> None:
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1024) for c in comms]
    wins = register_all(comms, bufs)
    with symm.group():
        for c, b in zip(comms, bufs):
            c.all_reduce(b, b, 4, "float32", "sum")
        with pytest.raises(symm.InvalidUsageError, match="open group"):
            comms[0].destroy()
        with pytest.raises(symm.InvalidUsageError, match="open group"):
            bufs[0].free()
        with pytest.raises(symm.InvalidUsageError, match="open group"):
            wins[0].deregister()
    assert not comms[0].destroyed and wins[0].registered and not bufs[0].freed
    for c in comms:
        c.destroy()


def test_a_missing_peer_times_out_and_is_kept_as_the_async_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYMM_TIMEOUT_MS", "300")
    comms = symm.Comm.init_all(2)
    bufs = [c.alloc(1024) for c in comms]
    register_all(comms, bufs)
    # Rank 0 alone, outside a group: rank 1 never arrives.
    with pytest.raises(symm.SymmTimeoutError, match="did not arrive"):
        comms[0].all_reduce(bufs[0], bufs[0], 4, "float32", "sum")
    error = comms[0].async_error()
    assert isinstance(error, symm.SymmTimeoutError) and error.code == symm.Result.symmTimeout
    # The communicator has failed on rank 1 too (its next call would pair with rank 0's stale
    # one), naming rank 0 and the rank that did not arrive.
    remote = comms[1].async_error()
    assert isinstance(remote, symm.RemoteError) and "rank 1 did not arrive" in str(remote)
    with pytest.raises(symm.SymmTimeoutError, match="has failed"):
        comms[0].all_reduce(bufs[0], bufs[0], 4, "float32", "sum")
    for c in comms:
        c.destroy()


def test_garbage_collection_releases_everything() -> None:
    """Dropping every reference frees buffers and destroys communicators, also when they are
    collected together in one cycle (comm <-> window <-> buffer)."""
    import weakref

    from symm._lib import lib

    for _ in range(10):
        comms = symm.Comm.init_all(2)
        bufs = [c.alloc(1 << 16) for c in comms]
        register_all(comms, bufs)
        handles = [c.handle for c in comms]
        refs = [weakref.ref(c) for c in comms]
        temporary = comms[0].alloc(4096)
        temporary_ptr = temporary.ptr
        del temporary
        # The dropped buffer was freed: freeing it again is refused by the library.
        assert lib.symmMemFree(handles[0], temporary_ptr) == symm.Result.symmInvalidArgument
        del comms, bufs
        gc.collect()
        assert all(ref() is None for ref in refs)
        count = ctypes.c_int()
        for handle in handles:
            assert lib.symmCommCount(handle, ctypes.byref(count)) == symm.Result.symmInvalidArgument


class DeviceContextLayout(ctypes.Structure):
    """The head of ``symmDeviceContext`` as symm.h lays it out."""

    _fields_ = [
        ("backend", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("rank", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("local_base", ctypes.c_uint64),
        ("window_size", ctypes.c_uint64),
        ("peer_bases", ctypes.c_uint64),
    ]


def test_device_context_describes_the_window() -> None:
    """On the host backend the device context is host memory: it must describe this window."""
    comms = symm.Comm.init_all(3)
    bufs = [c.alloc(8192) for c in comms]
    with symm.group():
        wins = [c.register(b, 4096) for c, b in zip(comms, bufs)]
        with pytest.raises(symm.InvalidUsageError, match="not completed"):
            _ = wins[0].device_context
    for rank, (win, buf) in enumerate(zip(wins, bufs)):
        context = DeviceContextLayout.from_address(win.device_context)
        assert (context.rank, context.world_size) == (rank, 3)
        assert (context.local_base, context.window_size) == (buf.ptr, 4096)
        bases = (ctypes.c_uint64 * 3).from_address(context.peer_bases)
        assert bases[rank] == buf.ptr
    for c in comms:
        c.destroy()
