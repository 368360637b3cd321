"""Every collective x data type x operator on 2, 3 and 4 ranks, at odd counts, in place and out
of place, checked bit for bit against the references of ``references.py``."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from references import ALL_TYPES, OPS, STORAGE, random_inputs, reduce

import symm

RANKS = [2, 3, 4]
#: (count, in place, how the buffers are passed)
CASES = [(1, False, "buffer"), (37, True, "numpy"), (4099, False, "int")]


def rng_for(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def aligned(nbytes: int) -> int:
    return (nbytes + 255) // 256 * 256


def operand(world, rank: int, offset: int, count: int, dtype: str, form: str):
    """The buffer at ``offset`` of rank ``rank``'s window, passed as ``form``."""
    buf = world.bufs[rank]
    if form == "buffer" and offset == 0:
        return buf
    if form == "numpy":
        # The array's own type: NumPy's float16/32/64, and the bit patterns for bfloat16 and
        # float8 (NumPy has no such types).
        return buf.numpy(symm.numpy_dtype(dtype), count, offset)
    return buf.ptr + offset


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_all_reduce(world, dtype: str, op: str, nranks: int) -> None:
    w = world(nranks)
    size = np.dtype(STORAGE[dtype]).itemsize
    rng = rng_for("all_reduce", dtype, op, nranks)
    for count, in_place, form in CASES:
        inputs = random_inputs(dtype, op, nranks, count, rng)
        send_offset = 0
        recv_offset = send_offset if in_place else aligned(count * size)
        for r in range(nranks):
            w.bufs[r].numpy(STORAGE[dtype], count, send_offset)[:] = inputs[r]
            if not in_place:
                w.bufs[r].numpy(np.uint8, count * size, recv_offset)[:] = 0xA5
        with symm.group():
            for r, comm in enumerate(w.comms):
                send = operand(w, r, send_offset, count, dtype, form)
                recv = operand(w, r, recv_offset, count, dtype, form)
                comm.all_reduce(send, recv, count, dtype, op)
        expected = reduce(dtype, op, inputs)
        for r in range(nranks):
            got = w.bufs[r].numpy(STORAGE[dtype], count, recv_offset)
            np.testing.assert_array_equal(got, expected, err_msg=f"rank {r}, count {count}, in place {in_place}")


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_reduce(world, dtype: str, op: str, nranks: int) -> None:
    """Reduce to every root in turn; the other ranks pass None as recv, and their buffers stay
    as they were."""
    w = world(nranks)
    size = np.dtype(STORAGE[dtype]).itemsize
    rng = rng_for("reduce", dtype, op, nranks)
    for k, (count, in_place, form) in enumerate(CASES):
        root = k % nranks
        inputs = random_inputs(dtype, op, nranks, count, rng)
        send_offset = 0
        recv_offset = send_offset if in_place else aligned(count * size)
        for r in range(nranks):
            w.bufs[r].numpy(STORAGE[dtype], count, send_offset)[:] = inputs[r]
            if not in_place:
                w.bufs[r].numpy(np.uint8, count * size, recv_offset)[:] = 0xA5
        with symm.group():
            for r, comm in enumerate(w.comms):
                send = operand(w, r, send_offset, count, dtype, form)
                recv = operand(w, r, recv_offset, count, dtype, form) if r == root else None
                comm.reduce(send, recv, count, dtype, op, root)
        expected = reduce(dtype, op, inputs)
        got = w.bufs[root].numpy(STORAGE[dtype], count, recv_offset)
        np.testing.assert_array_equal(got, expected, err_msg=f"root {root}, count {count}, in place {in_place}")
        for r in range(nranks):
            if r != root:
                np.testing.assert_array_equal(w.bufs[r].numpy(STORAGE[dtype], count, send_offset), inputs[r])
                if not in_place:
                    assert (w.bufs[r].numpy(np.uint8, count * size, recv_offset) == 0xA5).all(), f"rank {r}"


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_reduce_scatter(world, dtype: str, op: str, nranks: int) -> None:
    w = world(nranks)
    size = np.dtype(STORAGE[dtype]).itemsize
    rng = rng_for("reduce_scatter", dtype, op, nranks)
    for count, in_place, form in CASES:
        total = count * nranks
        inputs = random_inputs(dtype, op, nranks, total, rng)
        send_offset = 0
        recv_base = aligned(total * size)
        for r in range(nranks):
            w.bufs[r].numpy(STORAGE[dtype], total, send_offset)[:] = inputs[r]
        with symm.group():
            for r, comm in enumerate(w.comms):
                # In place: rank r's result lands on its own segment of the send buffer.
                recv_offset = send_offset + r * count * size if in_place else recv_base
                send = operand(w, r, send_offset, total, dtype, form)
                recv = operand(w, r, recv_offset, count, dtype, "int" if in_place else form)
                comm.reduce_scatter(send, recv, count, dtype, op)
        expected = reduce(dtype, op, inputs)
        for r in range(nranks):
            recv_offset = send_offset + r * count * size if in_place else recv_base
            got = w.bufs[r].numpy(STORAGE[dtype], count, recv_offset)
            np.testing.assert_array_equal(
                got, expected[r * count : (r + 1) * count], err_msg=f"rank {r}, count {count}, in place {in_place}"
            )


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_all_gather(world, dtype: str, nranks: int) -> None:
    w = world(nranks)
    size = np.dtype(STORAGE[dtype]).itemsize
    storage = STORAGE[dtype]
    rng = rng_for("all_gather", dtype, nranks)
    for count, in_place, form in CASES:
        # Raw bit patterns: all-gather moves bytes, NaN patterns included.
        inputs = [rng.integers(0, 256, count * size, dtype=np.uint8).view(storage) for _ in range(nranks)]
        recv_offset = 0
        send_base = aligned(count * size * nranks)
        for r in range(nranks):
            send_offset = recv_offset + r * count * size if in_place else send_base
            w.bufs[r].numpy(np.uint8, count * size * nranks, recv_offset)[:] = 0x5A
            w.bufs[r].numpy(storage, count, send_offset)[:] = inputs[r]
        with symm.group():
            for r, comm in enumerate(w.comms):
                send_offset = recv_offset + r * count * size if in_place else send_base
                send = operand(w, r, send_offset, count, dtype, form)
                recv = operand(w, r, recv_offset, count * nranks, dtype, form)
                comm.all_gather(send, recv, count, dtype)
        expected = np.concatenate(inputs)
        for r in range(nranks):
            got = w.bufs[r].numpy(storage, count * nranks, recv_offset)
            np.testing.assert_array_equal(got, expected, err_msg=f"rank {r}, count {count}, in place {in_place}")


def test_count_zero_is_a_no_op(world) -> None:
    w = world(2)
    before = [buf.numpy(np.uint8, 64).copy() for buf in w.bufs]
    with symm.group():
        for comm, buf in zip(w.comms, w.bufs):
            comm.all_reduce(buf, buf, 0, "float32", "sum")
            comm.all_gather(buf, buf, 0, "float32")
            comm.reduce_scatter(buf, buf, 0, "float32", "sum")
    for buf, old in zip(w.bufs, before):
        np.testing.assert_array_equal(buf.numpy(np.uint8, 64), old)


def test_single_rank_needs_no_group() -> None:
    (comm,) = symm.Comm.init_all(1)
    with comm:
        buf = comm.alloc(4096)
        with comm.register(buf):
            data = buf.numpy("float64", 100)
            data[:] = np.arange(100) * 0.5
            comm.all_reduce(buf, buf.ptr + 2048, 100, np.float64, "avg")
            np.testing.assert_array_equal(buf.numpy("float64", 100, 2048), np.arange(100) * 0.5)


def test_many_calls_on_one_window_with_changing_shapes(world) -> None:
    """A long random sequence of collectives, sizes and algorithms on the same windows, each
    result checked: state kept across calls (epochs, low-latency lines) must stay right."""
    w = world(3)
    nranks = w.nranks
    rng = rng_for("sequence")
    for step in range(120):
        kind = rng.choice(["all_reduce", "all_gather", "reduce_scatter"])
        count = int(rng.choice([1, 2, 7, 64, 255, 1000, 5000, 20000]))
        values = [rng.integers(-1000, 1000, count * nranks).astype(np.int32) for _ in range(nranks)]
        for r in range(nranks):
            w.bufs[r].numpy(np.int32, count * nranks)[:] = values[r]
        recv_offset = aligned(count * nranks * 4)
        with symm.group():
            for comm, buf in zip(w.comms, w.bufs):
                recv = buf.ptr + recv_offset
                if kind == "all_reduce":
                    comm.all_reduce(buf, recv, count, "int32", "sum")
                elif kind == "all_gather":
                    comm.all_gather(buf, recv, count, "int32")
                else:
                    comm.reduce_scatter(buf, recv, count, "int32", "max")
        for r in range(nranks):
            if kind == "all_reduce":
                expected = sum(v[:count].astype(np.int64) for v in values).astype(np.int32)
                got = w.bufs[r].numpy(np.int32, count, recv_offset)
            elif kind == "all_gather":
                expected = np.concatenate([v[:count] for v in values])
                got = w.bufs[r].numpy(np.int32, count * nranks, recv_offset)
            else:
                expected = np.max(np.stack([v[r * count : (r + 1) * count] for v in values]), axis=0)
                got = w.bufs[r].numpy(np.int32, count, recv_offset)
            np.testing.assert_array_equal(got, expected, err_msg=f"step {step}: {kind} of {count}")


def test_nested_groups_run_at_the_outermost_end(world) -> None:
    w = world(2)
    for r, buf in enumerate(w.bufs):
        buf.numpy("float32", 8)[:] = r + 1
    with symm.group():
        with symm.group():
            w.comms[0].all_reduce(w.bufs[0], w.bufs[0], 8, "float32", "sum")
        # The inner end ran nothing: rank 0's part waits for rank 1's.
        np.testing.assert_array_equal(w.bufs[0].numpy("float32", 8), 1)
        w.comms[1].all_reduce(w.bufs[1], w.bufs[1], 8, "float32", "sum")
    for buf in w.bufs:
        np.testing.assert_array_equal(buf.numpy("float32", 8), 3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8e4m3", "float8e5m2"])
def test_avg_of_neighbours_rounds_ties_to_even(world, dtype: str) -> None:
    """The average of two neighbouring values is exactly between them: the result must be the
    one whose code is even (round to nearest, ties to even), once, from the float32 sum."""
    w = world(2)
    storage = STORAGE[dtype]
    # Positive codes from 0x10 up: normal numbers, small enough to stay clear of the maximum.
    low = np.arange(0x10, 0x70, dtype=storage)
    high = low + 1
    expected = np.where(low % 2 == 0, low, high).astype(storage)
    np.testing.assert_array_equal(reduce(dtype, "avg", [low, high]), expected)
    count = low.size
    w.bufs[0].numpy(storage, count)[:] = low
    w.bufs[1].numpy(storage, count)[:] = high
    with symm.group():
        for comm, buf in zip(w.comms, w.bufs):
            comm.all_reduce(buf, buf, count, dtype, "avg")
    for buf in w.bufs:
        np.testing.assert_array_equal(buf.numpy(storage, count), expected)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("dtype", ["int8", "bfloat16", "float32", "float64"])
def test_all_to_all_gather_and_scatter(world, dtype: str, nranks: int) -> None:
    """The byte movers from every root, bit for bit (raw bit patterns, NaNs included); the
    ranks that do not use a buffer pass None for it; the receive buffers of the ranks a gather
    does not write stay as they were."""
    w = world(nranks)
    size = np.dtype(STORAGE[dtype]).itemsize
    storage = STORAGE[dtype]
    rng = rng_for("segments", dtype, nranks)
    for count, _, form in CASES:
        whole = count * nranks
        send_offset, recv_offset = 0, aligned(whole * size)

        def bits(n: int) -> np.ndarray:
            return rng.integers(0, 256, n * size, dtype=np.uint8).view(storage)

        def view(r: int, offset: int, n: int) -> np.ndarray:
            return w.bufs[r].numpy(storage, n, offset)

        # All-to-all: segment p of rank r's send lands at segment r of rank p's recv.
        inputs = [bits(whole) for _ in range(nranks)]
        for r in range(nranks):
            view(r, send_offset, whole)[:] = inputs[r]
        with symm.group():
            for r, comm in enumerate(w.comms):
                send = operand(w, r, send_offset, whole, dtype, form)
                recv = operand(w, r, recv_offset, whole, dtype, form)
                comm.all_to_all(send, recv, count, dtype)
        for p in range(nranks):
            expected = np.concatenate([inputs[r][p * count : (p + 1) * count] for r in range(nranks)])
            np.testing.assert_array_equal(view(p, recv_offset, whole), expected, err_msg=f"all_to_all rank {p}")

        for root in range(nranks):
            # Gather: every rank's send lands at its segment of the root's recv.
            inputs = [bits(count) for _ in range(nranks)]
            stale = [bits(whole) for _ in range(nranks)]
            for r in range(nranks):
                view(r, send_offset, count)[:] = inputs[r]
                view(r, recv_offset, whole)[:] = stale[r]
            with symm.group():
                for r, comm in enumerate(w.comms):
                    send = operand(w, r, send_offset, count, dtype, form)
                    recv = operand(w, r, recv_offset, whole, dtype, form) if r == root else None
                    comm.gather(send, recv, count, dtype, root)
            for r in range(nranks):
                expected = np.concatenate(inputs) if r == root else stale[r]
                np.testing.assert_array_equal(view(r, recv_offset, whole), expected, err_msg=f"gather root {root} rank {r}")

            # Scatter: segment r of the root's send lands in rank r's recv.
            source = bits(whole)
            view(root, send_offset, whole)[:] = source
            with symm.group():
                for r, comm in enumerate(w.comms):
                    send = operand(w, r, send_offset, whole, dtype, form) if r == root else None
                    recv = operand(w, r, recv_offset, count, dtype, form)
                    comm.scatter(send, recv, count, dtype, root)
            for r in range(nranks):
                np.testing.assert_array_equal(
                    view(r, recv_offset, count), source[r * count : (r + 1) * count], err_msg=f"scatter root {root} rank {r}"
                )


def test_unused_buffers_off_the_root_are_not_checked(world) -> None:
    """A gather's recv and a scatter's send are not used off the root (as in NCCL): a rank
    there may pass any buffer, even one too small, and it is neither checked nor touched."""
    w = world(3)
    count, root = 5, 1
    send = [w.bufs[r].numpy(np.float32, count, 0) for r in range(3)]
    small = [w.bufs[r].numpy(np.float32, 1, 1024) for r in range(3)]
    recv = w.bufs[root].numpy(np.float32, 3 * count, 256)
    for r in range(3):
        send[r][:] = np.arange(count) + 10 * r
        small[r][:] = -1.0
    with symm.group():
        for r, comm in enumerate(w.comms):
            comm.gather(send[r], recv if r == root else small[r], count, root=root)
    np.testing.assert_array_equal(recv, np.concatenate([np.arange(count) + 10 * r for r in range(3)]).astype(np.float32))
    outs = [w.bufs[r].numpy(np.float32, count, 2048) for r in range(3)]
    source = w.bufs[root].numpy(np.float32, 3 * count, 4096)
    source[:] = np.arange(3 * count)
    with symm.group():
        for r, comm in enumerate(w.comms):
            comm.scatter(source if r == root else small[r], outs[r], count, root=root)
    for r in range(3):
        np.testing.assert_array_equal(outs[r], np.arange(r * count, (r + 1) * count, dtype=np.float32))
        assert small[r][0] == -1.0


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("dtype", ["int8", "bfloat16", "float32", "float64"])
def test_send_and_recv_rings_both_ways(world, dtype: str, nranks: int) -> None:
    """Every rank sends to the next and the previous rank and receives from both, in one group,
    buffers at different offsets on every rank; bit for bit. Then an empty message."""
    w = world(nranks)
    size = np.dtype(STORAGE[dtype]).itemsize
    storage = STORAGE[dtype]
    rng = rng_for("send_recv", dtype, nranks)
    for count, _, form in CASES:
        region = aligned(count * size)
        inputs = [[rng.integers(0, 256, count * size, dtype=np.uint8).view(storage) for _ in range(2)] for _ in range(nranks)]

        def at(r: int, k: int, receive: bool) -> int:
            # Send regions first, then the receive regions; each rank shifted by 16 * r bytes.
            return (2 * receive + k) * region + 16 * r

        for r in range(nranks):
            for k in range(2):
                w.bufs[r].numpy(storage, count, at(r, k, False))[:] = inputs[r][k]
                w.bufs[r].numpy(np.uint8, count * size, at(r, k, True))[:] = 0xA5
        with symm.group():
            for r, comm in enumerate(w.comms):
                for k, shift in enumerate([1, nranks - 1]):
                    to, frm = (r + shift) % nranks, (r - shift) % nranks
                    comm.send(operand(w, r, at(r, k, False), count, dtype, form), to, count, dtype)
                    comm.recv(operand(w, r, at(r, k, True), count, dtype, form), frm, count, dtype)
        for r in range(nranks):
            for k, shift in enumerate([1, nranks - 1]):
                frm = (r - shift) % nranks
                got = w.bufs[r].numpy(storage, count, at(r, k, True))
                np.testing.assert_array_equal(got, inputs[frm][k], err_msg=f"rank {r} from {frm}, count {count}")
    with symm.group():
        for r, comm in enumerate(w.comms):
            comm.send(w.bufs[r], (r + 1) % nranks, 0, dtype)
            comm.recv(w.bufs[r], (r - 1) % nranks, 0, dtype)


def test_send_and_recv_of_different_counts_fail_both() -> None:
    """A receive of fewer elements than the send refuses it: both ranks fail, the receiver
    naming the sender; nothing lands. (A communicator of its own: the failure is terminal.)"""
    comms = symm.Comm.init_all(2)
    try:
        bufs = [comm.alloc(4096) for comm in comms]
        with symm.group():
            for comm, buf in zip(comms, bufs):
                comm.register(buf)
        bufs[1].numpy(np.float32, 64)[:] = 3.0
        with pytest.raises(symm.SymmError) as failure:
            with symm.group():
                comms[0].send(bufs[0], 1, 64, "float32")
                comms[1].recv(bufs[1], 0, 32, "float32")
        message = str(failure.value)
        assert "from rank 0" in message or "failed" in message, message
        np.testing.assert_array_equal(bufs[1].numpy(np.float32, 64), np.full(64, 3.0, np.float32))
    finally:
        for comm in comms:
            comm.destroy()


def _ranks_on_threads(nranks: int, body) -> list:
    """Run ``body(rank, comm)`` on a thread per rank of a new communicator (of one
    ``symm.get_unique_id``); the results, or the exceptions raised, in rank order."""
    import threading

    uid = symm.get_unique_id()
    results: list = [None] * nranks

    def run(rank: int) -> None:
        comm = symm.Comm(nranks, uid, rank)
        try:
            results[rank] = body(rank, comm)
        except Exception as error:  # noqa: BLE001 - reported to the test
            results[rank] = error
        finally:
            comm.destroy()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(nranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("refusal", ["dtype", "count", "readonly"])
def test_a_receive_the_package_refuses_fails_its_sender_at_once(refusal: str) -> None:
    """Rank 1's receive is refused by the package before it reaches the library (an array of
    another type than ``dtype``, a ``count`` other than the array's, read-only memory): rank 0's
    matching send fails at once, naming it, instead of waiting until the timeout; nothing is
    written into rank 1's array."""
    import time

    def body(rank: int, comm: symm.Comm) -> tuple:
        start = time.monotonic()
        payload = np.arange(64, dtype=np.float32)
        try:
            if rank == 0:
                comm.send(payload, 1, 64, "float32")
            elif refusal == "dtype":
                comm.recv(np.zeros(64, np.int32), 0, 64, "float32")
            elif refusal == "count":
                comm.recv(np.zeros(80, np.float32), 0, 64, "float32")
            else:
                data = bytes(256)
                comm.recv(np.frombuffer(data, np.float32), 0, 64, "float32")
                assert data == bytes(256), "a refused receive wrote read-only memory"
        except symm.SymmError as error:
            return type(error).__name__, str(error), time.monotonic() - start
        return None, "", time.monotonic() - start

    outcomes = _ranks_on_threads(2, body)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), f"rank {rank}: {outcome!r}"
        kind, message, seconds = outcome
        assert kind is not None, f"rank {rank}: success for a refused pair"
        assert seconds < 5, f"rank {rank} failed after {seconds:.1f} s: {message}"
    assert outcomes[1][0] == "InvalidArgumentError", outcomes[1]
    want = {"dtype": "buffer is an int32 NumPy array", "count": "buffer is a float32 NumPy array of 80",
            "readonly": "buffer is a float32 NumPy array that is read-only"}[refusal]
    assert want in outcomes[1][1], outcomes[1][1]


@pytest.mark.parametrize("refusal", ["readonly", "count", "gather_root", "op", "all_to_all_v"])
def test_a_collective_the_package_refuses_on_one_rank_fails_its_peer_at_once(refusal: str) -> None:
    """Rank 1's collective is refused by the package before it reaches the library (read-only
    memory, a ``count`` other than the array's, a gather root without ``recv``, an unknown
    operator, an all-to-all-v table of the wrong type) while rank 0's is right: rank 0's call
    fails at once naming rank 1's reason, instead of waiting until the timeout."""
    import threading
    import time

    # Every rank's registration completes before any rank goes on (and later destroys).
    registered = threading.Barrier(2)

    def body(rank: int, comm: symm.Comm) -> tuple:
        buffer = comm.alloc(4096)
        comm.register(buffer)
        registered.wait()
        data = buffer.numpy(np.float32, 64, 0)
        start = time.monotonic()
        try:
            if refusal == "readonly":
                recv = np.frombuffer(bytes(256), np.float32) if rank == 1 else data
                comm.all_reduce(data, recv, 64, "float32", "sum")
            elif refusal == "count":
                comm.all_reduce(data, data, 80 if rank == 1 else 64, "float32", "sum")
            elif refusal == "gather_root":
                gathered = buffer.numpy(np.float32, 128, 1024)
                comm.gather(data, None if rank == 1 else gathered, 64, "float32", root=1)
            elif refusal == "op":
                comm.all_reduce(data, data, 64, "float32", "summ" if rank == 1 else "sum")
            else:
                table = buffer.numpy(np.int32 if rank == 1 else np.int64, 6, 2048)
                comm.all_to_all_v(data, buffer.numpy(np.float32, 64, 1024), table, 64, 64, "float32")
        except symm.SymmError as error:
            return type(error).__name__, str(error), time.monotonic() - start
        return None, "", time.monotonic() - start

    outcomes = _ranks_on_threads(2, body)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), f"rank {rank}: {outcome!r}"
        kind, message, seconds = outcome
        assert kind is not None, f"rank {rank}: success for a call refused on rank 1"
        assert seconds < 5, f"rank {rank} failed after {seconds:.1f} s: {message}"
    assert outcomes[1][0] == "InvalidArgumentError", outcomes[1]
    reason = {
        "readonly": "recv is a float32 NumPy array that is read-only",
        "count": "count",
        "gather_root": "recv is required on the root of a gather",
        "op": "summ",
        "all_to_all_v": "counts is an int32",
    }[refusal]
    assert reason in outcomes[1][1], outcomes[1][1]
    assert reason in outcomes[0][1], outcomes[0][1]


def test_a_read_only_receive_array_is_refused() -> None:
    """A collective's receive array over immutable memory (``bytes``) is refused by name, and
    nothing is written into it."""
    (comm,) = symm.Comm.init_all(1)
    try:
        buffer = comm.alloc(256)
        comm.register(buffer)
        data = bytes(32)
        with pytest.raises(symm.InvalidArgumentError, match="recv is a float32 NumPy array that is read-only"):
            comm.all_reduce(buffer.numpy(np.float32, 8, 0), np.frombuffer(data, np.float32), 8, "float32", "sum")
        assert data == bytes(32)
    finally:
        comm.destroy()


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("dtype", ["int8", "bfloat16", "float32", "float64"])
def test_all_to_all_v_with_device_counts(world, dtype: str, nranks: int) -> None:
    """Counts in the ranks' windows (zeros among them), a receive capacity larger than the send
    capacity; every rank's segments packed in rank order, rows 1 and 2 of the table written,
    bit for bit, for three rounds of new counts on one window."""
    w = world(nranks)
    storage = STORAGE[dtype]
    size = np.dtype(storage).itemsize
    rng = rng_for("all_to_all_v", dtype, nranks)
    send_cap, recv_cap = 60 * nranks + 1, 80 * nranks + 3
    send_at, recv_at = 0, aligned(send_cap * size)
    table_at = recv_at + aligned(recv_cap * size)
    for _ in range(3):
        counts = rng.integers(0, 60, (nranks, nranks))
        counts[rng.random((nranks, nranks)) < 0.25] = 0
        inputs = [rng.integers(0, 256, send_cap * size, dtype=np.uint8).view(storage) for _ in range(nranks)]
        for r in range(nranks):
            w.bufs[r].numpy(storage, send_cap, send_at)[:] = inputs[r]
            w.bufs[r].numpy(np.int64, nranks, table_at)[:] = counts[r]
        with symm.group():
            for r, comm in enumerate(w.comms):
                comm.all_to_all_v(
                    w.bufs[r].numpy(storage, send_cap, send_at),
                    w.bufs[r].numpy(storage, recv_cap, recv_at),
                    w.bufs[r].numpy(np.int64, 3 * nranks, table_at),
                    # The storage arrays say the element size (a byte mover); bfloat16 is held
                    # as uint16 and named.
                    dtype="bfloat16" if dtype == "bfloat16" else None,
                )
        for r in range(nranks):
            parts = [inputs[p][counts[p, :r].sum() : counts[p, : r + 1].sum()] for p in range(nranks)]
            want = np.concatenate(parts)
            got = w.bufs[r].numpy(storage, len(want), recv_at)
            np.testing.assert_array_equal(got, want, err_msg=f"rank {r}")
            table = w.bufs[r].numpy(np.int64, 3 * nranks, table_at).reshape(3, nranks)
            np.testing.assert_array_equal(table[1], counts[:, r])
            np.testing.assert_array_equal(table[2], np.concatenate([[0], np.cumsum(counts[:, r])[:-1]]))


def test_all_to_all_v_counts_past_the_capacity_fail_every_rank() -> None:
    """Rank 1's counts sum past its send capacity: both ranks fail with the cause; nothing
    lands. (A communicator of its own: the failure is terminal.)"""
    comms = symm.Comm.init_all(2)
    try:
        bufs = [comm.alloc(4096) for comm in comms]
        with symm.group():
            for comm, buf in zip(comms, bufs):
                comm.register(buf)
        for r in range(2):
            bufs[r].numpy(np.float32, 64, 1024)[:] = -1.0
            bufs[r].numpy(np.int64, 2, 3072)[:] = [10, 10] if r == 0 else [40, 40]
        with pytest.raises(symm.SymmError) as failure:
            with symm.group():
                for r, comm in enumerate(comms):
                    comm.all_to_all_v(bufs[r].numpy(np.float32, 64, 0), bufs[r].numpy(np.float32, 64, 1024), bufs[r].numpy(np.int64, 6, 3072))
        assert "rank 1's counts sum to more elements than sendcount" in str(failure.value)
        # A table that is not int64 is refused before it reaches the kernel.
        with pytest.raises(symm.InvalidArgumentError, match="want 3 x 2 int64"):
            comms[0].all_to_all_v(bufs[0].numpy(np.float32, 64, 0), bufs[0].numpy(np.float32, 64, 1024), bufs[0].numpy(np.float64, 6, 3072))
        for r in range(2):
            assert (bufs[r].numpy(np.float32, 64, 1024) == -1.0).all()
    finally:
        for comm in comms:
            comm.destroy()


@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_arrays_outside_windows_are_staged(nranks: int) -> None:
    """NumPy arrays of the process's own memory (in no window) work as buffers: each call is
    staged through the communicator's staging window, mixed with calls in the windows."""
    comms = symm.Comm.init_all(nranks)
    bufs = [c.alloc(1 << 16) for c in comms]
    with symm.group():
        windows = [c.register(b) for c, b in zip(comms, bufs)]
    rng = rng_for("staged", nranks)
    for round in range(3):
        count = [5, 300_000, 1000][round]
        inputs = [rng.integers(-50, 50, count).astype(np.float32) for _ in range(nranks)]
        sends = [x.copy() for x in inputs]
        recvs = [np.full(count, -1.0, np.float32) for _ in range(nranks)]
        with symm.group():
            for r, comm in enumerate(comms):
                comm.all_reduce(sends[r], recvs[r], count, "float32", "sum")
        for r in range(nranks):
            np.testing.assert_array_equal(recvs[r], np.sum(inputs, axis=0), err_msg=f"rank {r}")
        gathered = [np.zeros(nranks * count, np.float32) for _ in range(nranks)]
        with symm.group():
            for r, comm in enumerate(comms):
                comm.all_gather(sends[r], gathered[r], count, "float32")
        for r in range(nranks):
            np.testing.assert_array_equal(gathered[r], np.concatenate(inputs), err_msg=f"rank {r}")
        # A call in the windows between the staged ones.
        for r in range(nranks):
            bufs[r].numpy("float32", 16)[:] = r + 1
        with symm.group():
            for comm, buf in zip(comms, bufs):
                comm.all_reduce(buf, buf, 16, "float32", "sum")
        for r in range(nranks):
            np.testing.assert_array_equal(bufs[r].numpy("float32", 16), np.full(16, nranks * (nranks + 1) / 2))
    for w in windows:
        w.deregister()
    for c in comms:
        c.destroy()


def test_strict_windows_refuse_arrays_outside_windows() -> None:
    """``SYMM_STRICT_WINDOWS=1``: a buffer outside every window is refused, and says why."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, symm\n"
        "(c,) = symm.Comm.init_all(1)\n"
        "try:\n"
        "    c.all_reduce(np.zeros(4, np.float32), np.zeros(4, np.float32), 4, 'float32', 'sum')\n"
        "except symm.InvalidArgumentError as e:\n"
        "    assert 'SYMM_STRICT_WINDOWS=1' in str(e), str(e)\n"
        "    print('refused')\n"
    )
    env = dict(os.environ, SYMM_STRICT_WINDOWS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "refused" in out.stdout, out.stdout + out.stderr
