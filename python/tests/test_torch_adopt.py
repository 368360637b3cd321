"""``symm.torch.adopt``: PyTorch symmetric tensors as symm windows, under torchrun, 2 and 3
processes on the host backend, with fake_symm_mem.py standing in for PyTorch's CUDA symmetric
memory (see torch_adopt_worker.py). Skipped where PyTorch is not installed."""

from __future__ import annotations

import pytest

from test_torch_windows import HERE, torchrun

torch = pytest.importorskip("torch")

WORKER = HERE / "torch_adopt_worker.py"


@pytest.mark.parametrize(("nprocs", "flags"), [(2, ()), (3, ()), (2, ("--symm-group",))])
def test_adopted_tensors_run_symm_collectives_in_place(tmp_path: object, nprocs: int, flags: tuple[str, ...]) -> None:
    output = torchrun(nprocs, WORKER, *flags, SYMM_BACKEND="host", FAKE_SYMM_MEM_DIR=str(tmp_path))
    for rank in range(nprocs):
        assert f"rank {rank}: " in output and "checks OK" in output, output[-6000:]
