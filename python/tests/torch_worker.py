"""One rank of the torch.distributed tests (test_torch.py), started by torchrun: every
collective of the "symm" backend, every dtype torch and symm share, every ReduceOp, in place and
not, at odd sizes (the library's staging window is SYMM_STAGING_BYTES=262144 in this job, so
the largest staged collectives run in chunks, and the largest sends pass it several times over
through a ring), checked bit
for bit against references.py; then the window path, async work, barrier and the object
collectives built on all_gather and broadcast. Prints "rank R: N calls OK"."""

from __future__ import annotations

import os
import sys
import time
import zlib

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from references import ALL_TYPES, OPS, STORAGE, random_inputs, reduce  # noqa: E402

import symm.torch  # noqa: E402,F401  (registers the backend)

TORCH_TYPES = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "uint32": torch.uint32,
    "int64": torch.int64,
    "uint64": torch.uint64,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float8e4m3": torch.float8_e4m3fn,
    "float8e5m2": torch.float8_e5m2,
}
STORAGE_TORCH = {np.uint8: torch.uint8, np.uint16: torch.uint16, np.uint32: torch.uint32, np.uint64: torch.uint64}
REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "avg": dist.ReduceOp.AVG,
}
COUNTS = [1, 37, 4099]


def rng_for(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def tensor_of(bits: np.ndarray, dtype: str) -> torch.Tensor:
    """A tensor of ``dtype`` holding the bit patterns ``bits``."""
    return torch.from_numpy(np.array(bits, copy=True)).view(TORCH_TYPES[dtype])


def bits_of(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    storage = np.dtype(STORAGE[dtype])
    unsigned = np.dtype(f"uint{storage.itemsize * 8}")
    return tensor.contiguous().view(STORAGE_TORCH[unsigned.type]).numpy().view(storage)


def check(got: torch.Tensor, expected: np.ndarray, dtype: str, what: str) -> None:
    np.testing.assert_array_equal(bits_of(got, dtype), expected, err_msg=what)


def main() -> None:
    dist.init_process_group("symm")
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "symm", dist.get_backend()
    calls = 0
    for dtype in ALL_TYPES:
        for op in OPS:
            for count in COUNTS:
                inputs = random_inputs(dtype, op, size, count, rng_for("ar", dtype, op, count))
                tensor = tensor_of(inputs[rank], dtype)
                dist.all_reduce(tensor, op=REDUCE_OPS[op])
                check(tensor, reduce(dtype, op, inputs), dtype, f"all_reduce {dtype} {op} {count}")
                inputs = random_inputs(dtype, op, size, size * count, rng_for("rs", dtype, op, count))
                output = torch.empty(count, dtype=TORCH_TYPES[dtype])
                dist.reduce_scatter_tensor(output, tensor_of(inputs[rank], dtype), op=REDUCE_OPS[op])
                expected = reduce(dtype, op, inputs)[rank * count : (rank + 1) * count]
                check(output, expected, dtype, f"reduce_scatter {dtype} {op} {count}")
                root = (count + len(op)) % size
                inputs = random_inputs(dtype, op, size, count, rng_for("reduce", dtype, op, count))
                tensor = tensor_of(inputs[rank], dtype)
                dist.reduce(tensor, dst=root, op=REDUCE_OPS[op])
                # Off the root the tensor is the input, unchanged.
                expected = reduce(dtype, op, inputs) if rank == root else inputs[rank]
                check(tensor, expected, dtype, f"reduce {dtype} {op} {count} to {root}")
                calls += 3
        for count in COUNTS:
            inputs = random_inputs(dtype, "sum", size, count, rng_for("ag", dtype, count))
            expected = np.concatenate(inputs)
            output = torch.empty(size * count, dtype=TORCH_TYPES[dtype])
            dist.all_gather_into_tensor(output, tensor_of(inputs[rank], dtype))
            check(output, expected, dtype, f"all_gather {dtype} {count}")
            # In place: the input is this rank's part of the output.
            output = tensor_of(np.zeros_like(expected), dtype)
            output[rank * count : (rank + 1) * count].copy_(tensor_of(inputs[rank], dtype))
            dist.all_gather_into_tensor(output, output[rank * count : (rank + 1) * count])
            check(output, expected, dtype, f"in-place all_gather {dtype} {count}")
            root = count % size
            tensor = tensor_of(inputs[rank], dtype)
            dist.broadcast(tensor, src=root)
            check(tensor, inputs[root], dtype, f"broadcast {dtype} {count} from {root}")
            calls += 3
    # Gather, scatter and all-to-all (the byte movers), from every root, bit for bit.
    for dtype in ["int8", "bfloat16", "float32", "float64"]:
        for count in COUNTS:
            torch_type = TORCH_TYPES[dtype]
            inputs = random_inputs(dtype, "sum", size, size * count, rng_for("a2a", dtype, count))
            output = torch.empty(size * count, dtype=torch_type)
            dist.all_to_all_single(output, tensor_of(inputs[rank], dtype))
            expected = np.concatenate([inputs[r][rank * count : (rank + 1) * count] for r in range(size)])
            check(output, expected, dtype, f"all_to_all_single {dtype} {count}")
            calls += 1
            for root in range(size):
                mine = tensor_of(inputs[rank][:count], dtype)
                # Even roots: the parts are the rows of one tensor (gathered in place); odd
                # roots: separate tensors.
                rows = torch.empty((size, count), dtype=torch_type)
                separate = [torch.empty(count, dtype=torch_type) for _ in range(size)]
                parts = (list(rows.unbind(0)) if root % 2 == 0 else separate) if rank == root else None
                dist.gather(mine, parts, dst=root)
                if rank == root:
                    for r, part in enumerate(parts):
                        check(part, inputs[r][:count], dtype, f"gather {dtype} {count} to {root} from {r}")
                received = torch.empty(count, dtype=torch_type)
                whole = tensor_of(inputs[root][: size * count], dtype)
                # Even roots: the pieces are consecutive parts of one tensor; odd roots: copies.
                pieces = [whole[r * count : (r + 1) * count] for r in range(size)]
                if root % 2 == 1:
                    pieces = [piece.clone() for piece in pieces]
                dist.scatter(received, pieces if rank == root else None, src=root)
                check(received, inputs[root][rank * count : (rank + 1) * count], dtype, f"scatter {dtype} {count} from {root}")
                calls += 2
    # The list all-to-all, of equal and of different sizes.
    outs = [torch.empty(2, 3) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2, 3), float(rank * 10 + r)) for r in range(size)])
    assert all((o == r * 10 + rank).all() for r, o in enumerate(outs)), outs
    outs = [torch.empty(r + rank + 1) for r in range(size)]
    dist.all_to_all(outs, [torch.full((rank + r + 1,), float(rank * 10 + r)) for r in range(size)])
    assert all((o == r * 10 + rank).all() for r, o in enumerate(outs)), outs
    calls += 2
    # all_to_all_single with split sizes: random per pair (zeros included), rows of 3 elements;
    # every rank derives every pair's count from one seed.
    for trial in range(4):
        pairs = np.random.default_rng(trial).integers(0, 5, size=(size, size))
        if trial == 0:
            pairs[:] = 0
        sends, receives = [int(n) for n in pairs[rank]], [int(n) for n in pairs[:, rank]]
        source = torch.cat([torch.full((n, 3), float(rank * 100 + p)) for p, n in enumerate(sends)] + [torch.empty(0, 3)])
        output = torch.full((sum(receives), 3), -1.0)
        dist.all_to_all_single(output, source, receives, sends)
        expected = torch.cat([torch.full((n, 3), float(p * 100 + rank)) for p, n in enumerate(receives)] + [torch.empty(0, 3)])
        assert torch.equal(output, expected), (trial, output, expected)
        calls += 1
    # Ranks may pass split sizes or none, and lists whose sizes are equal on one rank only:
    # every rank takes the same path (a rank deciding alone returned wrong data or hung).
    sends = [1] * size
    sends[0] = 2
    receives = [2 if rank == 0 else 1 for _ in range(size)]
    source = torch.cat([torch.full((n,), float(rank * 10 + p)) for p, n in enumerate(sends)])
    output = torch.full((sum(receives),), -1.0)
    dist.all_to_all_single(output, source, receives, sends)
    expected = torch.cat([torch.full((n,), float(p * 10 + rank)) for p, n in enumerate(receives)])
    assert torch.equal(output, expected), (output, expected)
    even = torch.arange(size * 2, dtype=torch.float32) + 100 * rank
    output = torch.empty(size * 2)
    if rank == 0:
        dist.all_to_all_single(output, even, [2] * size, [2] * size)
    else:
        dist.all_to_all_single(output, even)
    expected = torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * p for p in range(size)])
    assert torch.equal(output, expected), (output, expected)
    # Lists: rank 0's tensors all of one size, the others' not (rank r sends r + p + 1
    # elements to p); then every tensor of rank 0 empty.
    for extra in (1, 0):
        lengths = [(extra if rank == 0 else rank + p + 1) for p in range(size)]
        outs = [torch.full(((extra if p == 0 else p + rank + 1),), -1.0) for p in range(size)]
        dist.all_to_all(outs, [torch.full((n,), float(rank * 10 + p)) for p, n in enumerate(lengths)])
        assert all((o == p * 10 + rank).all() for p, o in enumerate(outs)), (extra, outs)
    calls += 4
    # Split sizes that do not add up on one rank: every rank raises, and the group lives on.
    try:
        bad = [1] * size if rank != 0 else [2] * size
        dist.all_to_all_single(torch.empty(size), torch.ones(size), [1] * size, bad)
    except Exception as error:  # noqa: BLE001 (torch wraps the backend's error)
        said = str(error)
        assert ("do not split" if rank == 0 else "refused on every rank") in said, said
    else:
        raise AssertionError(f"rank {rank}: split sizes that do not add up were not refused")
    dist.all_reduce(torch.ones(1))
    # Split sizes that disagree between two ranks fail on every rank, naming the disagreement.
    receives = [1] * size
    if rank == 0:
        receives[size - 1] = 2
    try:
        dist.all_to_all_single(torch.empty(sum(receives)), torch.ones(size), receives, [1] * size)
    except Exception as error:  # noqa: BLE001 (torch wraps the backend's error)
        assert "refused on every rank" in str(error), str(error)
    else:
        raise AssertionError(f"rank {rank}: split sizes that disagree were not refused")
    # A list all-gather and a reduce-scatter of a 2-D tensor.
    parts = [torch.empty(3, 5) for _ in range(size)]
    dist.all_gather(parts, torch.full((3, 5), float(rank)))
    assert all((p == r).all() for r, p in enumerate(parts))
    matrix = torch.arange(size * 6, dtype=torch.float32).reshape(size * 2, 3)
    out = torch.empty(2, 3)
    dist.reduce_scatter_tensor(out, matrix)
    assert torch.equal(out, matrix[rank * 2 : rank * 2 + 2] * size)
    # Async work objects complete; barrier; the object collectives.
    tensor = torch.full((10,), float(rank + 1))
    work = dist.all_reduce(tensor, async_op=True)
    assert work.wait() and work.is_completed()
    assert (tensor == size * (size + 1) / 2).all()
    # As gloo's: the result is the call's tensors, and the future gives them too.
    assert work.result()[0] is tensor and work.get_future().wait()[0] is tensor
    dist.barrier()
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    assert objects == [{"rank": r, "name": f"r{r}"} for r in range(size)], objects
    sent = [{"from": 0, "list": list(range(100))}, "text"] if rank == 0 else [None, None]
    dist.broadcast_object_list(sent, src=0)
    assert sent == [{"from": 0, "list": list(range(100))}, "text"], sent
    calls += 7
    # The window path: a tensor in a window registered on the group's communicator is used in
    # place (no staging).
    group = dist.distributed_c10d._get_default_group()
    comm = group.comm
    buffer = comm.alloc(1000, "float32")
    window = comm.register(buffer)
    tensor = torch.from_numpy(buffer.numpy())
    tensor.fill_(rank + 1.0)
    dist.all_reduce(tensor)
    assert (tensor == size * (size + 1) / 2).all()
    assert ("all_reduce", "window") in group._logged
    # All-to-all in the window: the input in the first half, the output in the second.
    send, recv = tensor[: 4 * size], tensor[500 : 500 + 4 * size]
    send.copy_(torch.arange(4 * size, dtype=torch.float32) + 100 * rank)
    dist.all_to_all_single(recv, send)
    expected = torch.cat([torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float32) + 100 * r for r in range(size)])
    assert torch.equal(recv, expected), recv
    assert ("all_to_all", "window") in group._logged
    window.deregister()
    buffer.free()
    calls += 1
    # Send and receive: blocking pairs, isend/irecv, and batch_isend_irecv rings both ways,
    # every size class (empty, odd, large), bit for bit.
    for dtype in ["int8", "bfloat16", "float32", "float64"]:
        torch_type = TORCH_TYPES[dtype]
        for count in COUNTS:
            inputs = random_inputs(dtype, "sum", size, count, rng_for("p2p", dtype, count))
            mine = tensor_of(inputs[rank], dtype)
            right, left = (rank + 1) % size, (rank - 1) % size
            received = [torch.empty(count, dtype=torch_type) for _ in range(2)]
            ops = [
                dist.P2POp(dist.isend, mine, right),
                dist.P2POp(dist.irecv, received[0], left),
                dist.P2POp(dist.irecv, received[1], right),
                dist.P2POp(dist.isend, mine, left),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            check(received[0], inputs[left], dtype, f"batch_isend_irecv {dtype} {count} from {left}")
            check(received[1], inputs[right], dtype, f"batch_isend_irecv {dtype} {count} from {right}")
            # Blocking: even ranks send first, odd ranks receive first (rank 0 with itself when
            # the ring is odd is covered by the batch above).
            if size % 2 == 0:
                got = torch.empty(count, dtype=torch_type)
                if rank % 2 == 0:
                    dist.send(mine, right)
                    dist.recv(got, left)
                else:
                    dist.recv(got, left)
                    dist.send(mine, right)
                check(got, inputs[left], dtype, f"send/recv {dtype} {count} from {left}")
            calls += 2
    # isend/irecv with a wait per request, a non-contiguous receive, and a send to oneself.
    if rank == 0:
        requests = [dist.irecv(t, src) for src, t in [(src, torch.empty(4, 3).t()) for src in range(1, size)]]
        outputs = [request for request in requests]
        for src, request in zip(range(1, size), outputs):
            request.wait()
            assert request.is_completed()
    else:
        dist.isend(torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank, 0).wait()
    own = torch.empty(5)
    ops = [dist.P2POp(dist.isend, torch.arange(5.0), rank), dist.P2POp(dist.irecv, own, rank)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(own, torch.arange(5.0)), own
    # A message three times the staging window, through its ring.
    big = torch.arange(100_003, dtype=torch.float64) + rank
    got = torch.empty_like(big)
    ops = [dist.P2POp(dist.isend, big, (rank + 1) % size), dist.P2POp(dist.irecv, got, (rank - 1) % size)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got, big - rank + (rank - 1) % size), got
    # A ring both ways of many tensors: thirty-two staged messages per rank in one batch.
    right, left = (rank + 1) % size, (rank - 1) % size
    sent = [torch.arange(700, dtype=torch.float32) + 1000 * rank + k for k in range(8)]
    from_left = [torch.empty(700) for _ in range(8)]
    from_right = [torch.empty(700) for _ in range(8)]
    ops = []
    for k in range(8):
        ops += [
            dist.P2POp(dist.isend, sent[k], right),
            dist.P2POp(dist.irecv, from_left[k], left),
            dist.P2POp(dist.isend, sent[k], left),
            dist.P2POp(dist.irecv, from_right[k], right),
        ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    for k in range(8):
        assert torch.equal(from_left[k], torch.arange(700.0) + 1000 * left + k), (k, from_left[k])
        assert torch.equal(from_right[k], torch.arange(700.0) + 1000 * right + k), (k, from_right[k])
    # Dtypes symm does not reduce travel as bytes (as gloo moves them): bool, int16, complex.
    for dtype in (torch.bool, torch.int16, torch.complex64):
        mine = (torch.arange(13) * (rank + 3)).to(dtype) if dtype != torch.bool else torch.arange(13) % (rank + 2) == 0
        got = torch.zeros_like(mine)
        ops = [dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, got, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        want = (torch.arange(13) * (left + 3)).to(dtype) if dtype != torch.bool else torch.arange(13) % (left + 2) == 0
        assert torch.equal(got, want), (dtype, got)
    calls += 4
    # All-to-all-v with the splits in device memory (PyTorch SymmMem's all_to_all_vdev): three
    # symmetric tensors (each its own window: no copy), then plain tensors (staged through the
    # library's staging window); new splits each round, zeros among them; bit for bit.
    import symm.torch as st

    pg = dist.distributed_c10d._get_default_group()
    for symmetric in (True, False):
        cap_in, cap_out = 40 * size + 1, 60 * size + 3
        if symmetric:
            inp, out = st.empty(cap_in, dtype=torch.float32), st.empty(cap_out, dtype=torch.float32)
            splits = st.empty(3, size, dtype=torch.int64)
            for t in (inp, out, splits):
                st.rendezvous(t)
        else:
            inp, out = torch.empty(cap_in), torch.empty(cap_out)
            splits = torch.empty(3, size, dtype=torch.int64)
        for round_ in range(3):
            rng = rng_for("a2av", symmetric, round_)
            matrix = rng.integers(0, 41, (size, size))
            matrix[rng.random((size, size)) < 0.3] = 0
            sent = [rng.standard_normal(cap_in).astype(np.float32) for _ in range(size)]
            inp.copy_(torch.from_numpy(sent[rank]))
            out.fill_(-7.0)
            splits.zero_()
            splits[0].copy_(torch.from_numpy(matrix[rank]))
            st.all_to_all_vdev(inp, out, splits)
            parts = [sent[p][matrix[p, :rank].sum() : matrix[p, : rank + 1].sum()] for p in range(size)]
            want = np.concatenate(parts)
            assert np.array_equal(out[: len(want)].numpy(), want), f"all_to_all_vdev round {round_}"
            assert (out[len(want) :] == -7.0).all(), "all_to_all_vdev wrote past the segments"
            assert splits[1].tolist() == matrix[:, rank].tolist(), splits
            assert splits[2].tolist() == [int(matrix[:q, rank].sum()) for q in range(size)], splits
            calls += 1
    assert pg.path_counts["all_to_all_vdev", "window"] == 3, pg.path_counts
    assert pg.path_counts["all_to_all_vdev", "staged"] == 3, pg.path_counts
    # Splits of the wrong dtype on one rank only: every rank's call fails at once (the others
    # naming the refusal), not at the wait bound.
    doomed_v = dist.new_group(list(range(size)))
    splits = torch.zeros(3, size, dtype=torch.int32 if rank == 1 else torch.int64)
    started = time.monotonic()
    try:
        st.all_to_all_vdev(torch.zeros(8), torch.zeros(8), splits, group=doomed_v)
    except Exception as error:  # noqa: BLE001 (torch may wrap the backend's error)
        said = str(error)
        assert ("want torch.int64" if rank == 1 else "refused") in said, said
    else:
        raise AssertionError(f"rank {rank}: all_to_all_vdev with bad splits on rank 1 succeeded")
    took = time.monotonic() - started
    assert took < 2.0, f"rank {rank}: the refusal took {took:.1f} s"
    calls += 1
    # A sub-group of the even ranks is a communicator of its own.
    evens = dist.new_group([r for r in range(size) if r % 2 == 0])
    if rank % 2 == 0:
        tensor = torch.tensor([float(rank)])
        dist.all_reduce(tensor, group=evens)
        assert tensor.item() == sum(range(0, size, 2)), tensor
        calls += 1
    dist.barrier()
    # A root whose gather arguments only it can see are wrong: it raises, and every other rank
    # fails at once naming the refusal (not at the wait bound). The failure ends that group's
    # communicator only.
    doomed = dist.new_group(list(range(size)))
    started = time.monotonic()
    try:
        if rank == 0:
            dist.gather(torch.ones(5), [torch.empty(5)], dst=0, group=doomed)
        else:
            dist.gather(torch.ones(5), None, dst=0, group=doomed)
    except Exception as error:  # noqa: BLE001 (torch may wrap the backend's error)
        said = str(error)
        assert ("output tensors" if rank == 0 else "refused") in said, said
    else:
        raise AssertionError(f"rank {rank}: a gather with bad root arguments succeeded")
    took = time.monotonic() - started
    assert took < 2.0, f"rank {rank}: the refusal took {took:.1f} s"
    calls += 1
    dist.barrier()
    group = dist.distributed_c10d._get_default_group()
    dist.destroy_process_group()
    # destroy_process_group shuts the group down: its communicator is destroyed.
    assert group.comm.destroyed, "the default group's communicator outlived destroy_process_group"
    print(f"rank {rank}: {calls} calls OK", flush=True)


if __name__ == "__main__":
    main()
