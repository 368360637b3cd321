"""``Comm.register_nvshmem`` in one process of one rank, against the stand-in for NVSHMEM's host
library (``tests/fakes/fake_engines.c``, built here): the window lies where NVSHMEM's heap put
it, the collectives run on it, the signal pad is NVSHMEM's allocation and freed with the window,
and bad arguments are refused by name. Several ranks, unreachable peers and engine windows are
tested in ``tests/tests/engine_windows.rs`` (a process per rank)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import symm

SOURCE = Path(__file__).resolve().parents[2] / "tests" / "fakes" / "fake_engines.c"


@pytest.fixture()
def fake_nvshmem(tmp_path: Path, monkeypatch):
    """The stand-in loaded into this process and initialized as PE 0 of 1 (its heap is mapped
    at a fixed address, so one per process: this test runs in a child process)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler")
    library = tmp_path / "libfake_engines.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(SOURCE)], check=True)
    monkeypatch.setenv("SYMM_NVSHMEM_LIBRARY", str(library))
    return library


CHILD = r"""
import ctypes, os, sys
import numpy as np
import symm
fake = ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)
assert fake.fake_engine_init(sys.argv[2].encode(), 0, 1) == 0
fake.nvshmem_malloc.restype = ctypes.c_void_p
fake.nvshmem_malloc.argtypes = [ctypes.c_size_t]
comm = symm.Comm.init_all([0])[0]
count = 1000
heap = fake.nvshmem_malloc(64 + 4 * count)
address = heap + 64
allocations = fake.fake_engine_live_allocations()
window = comm.register_nvshmem(address, 4 * count)
assert window.base == address and window.nbytes == 4 * count
assert fake.fake_engine_live_allocations() == allocations + 1, "the pad: one nvshmem_malloc"
data = np.ctypeslib.as_array((ctypes.c_float * count).from_address(address))
data[:] = np.arange(count, dtype=np.float32)
comm.all_reduce(data, op="max")
assert (data == np.arange(count, dtype=np.float32)).all()
window.deregister()
assert fake.fake_engine_live_allocations() == allocations, "the pad is freed"
for bad, needle in [(0, "symAddr is NULL")]:
    try:
        comm.register_nvshmem(bad, 16)
    except symm.InvalidArgumentError as error:
        assert needle in str(error), error
    else:
        raise AssertionError("a NULL address was registered")
try:
    comm.register_nvshmem(address, 0)
except symm.InvalidArgumentError as error:
    assert "bytes is 0" in str(error), error
else:
    raise AssertionError("0 bytes were registered")
comm.destroy()
print("register_nvshmem OK")
"""


def test_register_nvshmem_in_a_process(fake_nvshmem: Path, tmp_path: Path) -> None:
    heaps = tmp_path / "heaps"
    heaps.mkdir()
    result = subprocess.run(
        [os.sys.executable, "-c", CHILD, str(fake_nvshmem), str(heaps)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "SYMM_BACKEND": "host"},
    )
    assert result.returncode == 0 and "register_nvshmem OK" in result.stdout, result.stdout + result.stderr
