"""A stand-in for ``torch.distributed._symmetric_memory`` on CPU tensors, for the tests of
``symm.torch.adopt`` on the host backend (PyTorch's own needs CUDA): every allocation is a file
that every rank's process maps, at an address of its own, as PyTorch maps its peers' GPU memory.
Like PyTorch's CUDA allocations, each has a signal pad of its own in front of the data (here
``PAD_BYTES`` bytes), which must still be zero after symm's calls."""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import time
from pathlib import Path
from typing import Any

import torch

#: Bytes of the owner's own signal pad in front of every allocation's data.
PAD_BYTES = 256


class Handle:
    """What ``rendezvous`` returns: the attributes of PyTorch's handle that ``adopt`` reads."""

    def __init__(self, buffer_ptrs: list[int], rank: int, world_size: int, buffer_size: int, pads: list[int]) -> None:
        self.buffer_ptrs = buffer_ptrs
        self.signal_pad_ptrs = pads
        self.rank = rank
        self.world_size = world_size
        self.buffer_size = buffer_size


class FakeSymmMem:
    """``empty`` and ``rendezvous`` over files in ``directory`` (one job's)."""

    def __init__(self, directory: str | Path, rank: int, world_size: int, timeout_s: float = 60.0) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.count = 0
        self.maps: list[mmap.mmap] = []
        # Each allocation of this rank: (data address, data bytes, number).
        self.allocations: list[tuple[int, int, int]] = []

    def _path(self, number: int, rank: int) -> Path:
        return self.directory / f"alloc{number}-rank{rank}"

    def _map(self, path: Path, nbytes: int) -> tuple[mmap.mmap, int]:
        with open(path, "r+b") as file:
            mapped = mmap.mmap(file.fileno(), PAD_BYTES + nbytes)
        self.maps.append(mapped)
        return mapped, ctypes.addressof(ctypes.c_char.from_buffer(mapped))

    def empty(self, *size: Any, dtype: torch.dtype | None = None, device: Any = None) -> torch.Tensor:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
        dtype = dtype or torch.float32
        nbytes = max(math.prod(shape) * torch.empty((), dtype=dtype).element_size(), 1)
        number = self.count
        self.count += 1
        path = self._path(number, self.rank)
        temporary = path.with_suffix(".new")
        with open(temporary, "wb") as file:
            file.truncate(PAD_BYTES + nbytes)
        os.rename(temporary, path)
        mapped, address = self._map(path, nbytes)
        self.allocations.append((address + PAD_BYTES, nbytes, number))
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=PAD_BYTES)
        return flat.view(dtype).view(shape)

    def rendezvous(self, tensor: torch.Tensor, group: Any = None) -> Handle:
        ptr = tensor.data_ptr()
        found = [a for a in self.allocations if a[0] <= ptr < a[0] + a[1]]
        assert found, f"tensor at {ptr:#x} is not from this FakeSymmMem"
        base, nbytes, number = found[0]
        deadline = time.monotonic() + self.timeout_s
        bases, pads = [], []
        for rank in range(self.world_size):
            if rank == self.rank:
                bases.append(base)
                pads.append(base - PAD_BYTES)
                continue
            path = self._path(number, rank)
            while not path.exists():
                assert time.monotonic() < deadline, f"rank {rank} never made allocation {number}"
                time.sleep(0.01)
            _, address = self._map(path, nbytes)
            bases.append(address + PAD_BYTES)
            pads.append(address)
        return Handle(bases, self.rank, self.world_size, nbytes, pads)

    def owner_pad_is_zero(self) -> bool:
        """Every allocation's own signal pad, this rank's and its peers' as mapped here, is
        still all zero (symm never wrote into the owner's pads)."""
        return all(bytes(m[:PAD_BYTES]) == bytes(PAD_BYTES) for m in self.maps)
