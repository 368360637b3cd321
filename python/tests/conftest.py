"""Shared setup: the host backend (no GPU needed), and communicators reused across tests so
that many calls run in sequence on the same windows."""

from __future__ import annotations

import os

# As tests/src/lib.rs::use_host_backend: the library reads the backend when a communicator is
# created, so this must be set before any is.
os.environ["SYMM_BACKEND"] = "host"

from collections.abc import Callable, Iterator

import pytest

import symm

#: Bytes of each rank's buffer in a shared world.
WORLD_BYTES = 1 << 20


class World:
    """``nranks`` ranks made by ``Comm.init_all``, each with one registered buffer."""

    def __init__(self, nranks: int, nbytes: int = WORLD_BYTES) -> None:
        self.nranks = nranks
        self.comms = symm.Comm.init_all(nranks)
        self.bufs = [comm.alloc(nbytes) for comm in self.comms]
        with symm.group():
            self.wins = [comm.register(buf) for comm, buf in zip(self.comms, self.bufs)]

    def close(self) -> None:
        for comm in self.comms:
            comm.destroy()


@pytest.fixture(scope="session")
def world() -> Iterator[Callable[[int], World]]:
    """``world(n)``: the session's ``n``-rank world (made on first use, destroyed at the end)."""
    worlds: dict[int, World] = {}

    def get(nranks: int) -> World:
        if nranks not in worlds:
            worlds[nranks] = World(nranks)
        return worlds[nranks]

    yield get
    for made in worlds.values():
        made.close()


@pytest.fixture(scope="module")
def fresh_triton_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compile for real: a private, empty Triton cache for the module's tests (the Triton
    compile tests use it)."""
    previous = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    yield
    if previous is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = previous
