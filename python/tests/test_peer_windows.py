"""``Comm.register_peers``: windows over memory another owner allocated and mapped (here NumPy
arrays of this process, one per rank, the window 64 bytes into each), one thread driving the
ranks in a group on the host backend; the collectives exact on them, the bytes around them
untouched, and the descriptions the library or the package refuses."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

import symm
from symm import _lib

OFFSET = 64


def _padded(nbytes: int) -> int:
    return (nbytes + 15) // 16 * 16


def owner_memory(nbytes: int, pad_bytes: int) -> np.ndarray:
    """One rank's allocation: guard, window, pad, guard; 16-byte aligned pieces."""
    raw = np.full(OFFSET + _padded(nbytes) + pad_bytes + 64 + 16, 0xA5, dtype=np.uint8)
    start = (-raw.ctypes.data) % 16
    return raw[start:]


def addresses(memory: list[np.ndarray], nbytes: int) -> tuple[list[int], list[int]]:
    bases = [m.ctypes.data + OFFSET for m in memory]
    return bases, [b + _padded(nbytes) for b in bases]


def test_the_description_struct_matches_the_header() -> None:
    assert ctypes.sizeof(_lib.PeerWindowStruct) == 72
    assert symm.Owner.symmOwnerTorch == symm._abi.OWNER_NAMES["torch"]


@pytest.mark.parametrize("nranks", [2, 3])
def test_collectives_on_memory_another_owner_mapped(nranks: int) -> None:
    comms = symm.Comm.init_all([0] * nranks)
    count = 1001
    nbytes = 4 * count * nranks
    pad = comms[0].signal_pad_bytes
    memory = [owner_memory(nbytes, pad) for _ in comms]
    bases, pads = addresses(memory, nbytes)
    with symm.group():
        windows = [
            c.register_peers(bases[r], nbytes, bases, pads, pad, owner="user", owner_offset=OFFSET, keep=memory[r])
            for r, c in enumerate(comms)
        ]
    views = [m[OFFSET : OFFSET + nbytes].view(np.float32) for m in memory]
    for round_ in range(5):
        for r, v in enumerate(views):
            v[:count] = (np.arange(count) * (r + 1) + round_) % 97
        with symm.group():
            for c, v in zip(comms, views):
                c.all_reduce(v[:count])
        want = sum((np.arange(count, dtype=np.float64) * (r + 1) + round_) % 97 for r in range(nranks))
        for v in views:
            np.testing.assert_array_equal(v[:count].astype(np.float64), want)
        for r, v in enumerate(views):  # in place: each rank's part at its own segment
            v[r * count : (r + 1) * count] = v[:count].copy()
        with symm.group():
            for r, (c, v) in enumerate(zip(comms, views)):
                c.all_gather(v[r * count : (r + 1) * count], v)
        for v in views:
            for r in range(nranks):
                np.testing.assert_array_equal(v[r * count : (r + 1) * count].astype(np.float64), want)
    assert all(w.owner_objects is memory[r] for r, w in enumerate(windows))
    for w in windows:
        w.deregister()
        assert w.owner_objects is None
    for m in memory:
        assert (m[:OFFSET] == 0xA5).all() and (m[OFFSET + _padded(nbytes) + pad :] == 0xA5).all()
    for c in comms:
        c.destroy()


def refused_on_every_rank(comms: list, calls: list) -> list[str]:
    """Run ``calls[r](comms[r])`` for every rank in one group (a registration is collective);
    every one must raise ``InvalidArgumentError``: their messages."""
    messages = []
    try:
        with symm.group():
            for comm, call in zip(comms, calls):
                with pytest.raises(symm.InvalidArgumentError) as error:
                    call(comm)
                messages.append(str(error.value))
    except symm.SymmError as error:  # the group's end reports the peers' failed registrations
        messages.append(str(error))
    return messages


def test_bad_descriptions_are_refused_by_name() -> None:
    comms = symm.Comm.init_all([0, 0])
    pad = comms[0].signal_pad_bytes
    memory = [owner_memory(256, pad) for _ in comms]
    bases, pads = addresses(memory, 256)
    c = comms[0]
    # The package's own checks, before the library is called (no collective started).
    with pytest.raises(symm.InvalidArgumentError, match="owner 'mine'"):
        c.register_peers(bases[0], 256, bases, pads, pad, owner="mine")
    with pytest.raises(symm.InvalidArgumentError, match="2 ranks"):
        c.register_peers(bases[0], 256, bases[:1], pads, pad)
    # The library's: every rank passes the same bad tables, every rank refuses.
    for needle, peer_bases, peer_pads, pad_bytes in [
        (r"peerBuffs\[1\] is NULL", [bases[0], 0], pads, pad),
        ("signalPadBytes", bases, pads, 16),
        ("16-byte aligned", bases, [pads[0], pads[1] + 4], pad),
        ("overlaps|is not buff", [bases[0], bases[0]], pads, pad),
    ]:
        calls = [
            (lambda comm, r=r: comm.register_peers(bases[r], 256, peer_bases, peer_pads, pad_bytes))
            for r in range(2)
        ]
        messages = refused_on_every_rank(comms, calls)
        assert len(messages) >= 2 and all(re.search(needle, m) for m in messages[:2]), messages
    for comm in comms:
        comm.destroy()
