"""The torch.distributed backend "symm" under torchrun, 2 and 4 processes on the host backend
(CPU tensors): see torch_worker.py. Skipped where PyTorch is not installed (``cargo xtask test``
runs it in a virtual environment with PyTorch)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

WORKER = Path(__file__).with_name("torch_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nprocs", [2, 4])
def test_torchrun_every_collective_dtype_and_op(nprocs: int) -> None:
    env = dict(os.environ, SYMM_BACKEND="host", SYMM_STAGING_BYTES="262144", SYMM_DEBUG="INFO", OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nprocs}",
        f"--master-port={free_port()}",
        str(WORKER),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    for rank in range(nprocs):
        assert f"rank {rank}: " in output and "calls OK" in output, output[-6000:]
    # SYMM_DEBUG=INFO says which path a call took, once per kind of call.
    assert "torch: all_reduce of" in output and "staged through the communicator's staging window" in output
    assert "in its window (no copy)" in output


def test_the_example_runs() -> None:
    example = Path(__file__).parents[2] / "examples" / "torch" / "train_step.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}"]
    done = subprocess.run(
        [*command, str(example)], env=dict(os.environ, SYMM_BACKEND="host"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert "2 ranks agree on the averaged gradients" in done.stdout


def test_unsupported_reduce_op_and_dtype_are_refused() -> None:
    import symm.torch as st

    with pytest.raises(symm_unsupported()):
        st._op_name(torch.distributed.ReduceOp.BAND)
    with pytest.raises(symm_invalid()):
        st.SymmProcessGroup._check(torch.zeros(2, dtype=torch.bool))


def symm_unsupported() -> type:
    import symm

    return symm.UnsupportedError


def symm_invalid() -> type:
    import symm

    return symm.InvalidArgumentError
