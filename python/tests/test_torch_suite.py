"""Cases of PyTorch's own ``DistributedTest`` (reduce, gather, scatter, send/recv) on the ``symm`` backend,
3 ranks, CPU tensors: see torch_suite.py. Every named case must run (none skipped) and pass.
Skipped where PyTorch or its test dependency ``expecttest`` is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

SUITE = Path(__file__).with_name("torch_suite.py")
#: The cases torch_suite.CASES names (counted here too, so that an emptied list fails).
CASES = 16


def test_pytorch_distributed_test_cases_pass_on_symm() -> None:
    here = str(SUITE.parent)
    env = dict(
        os.environ,
        BACKEND="symm",
        WORLD_SIZE="3",
        SYMM_BACKEND="host",
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(p for p in [here, os.environ.get("PYTHONPATH", "")] if p),
    )
    done = subprocess.run([sys.executable, str(SUITE)], env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    summary = f"symm DistributedTest: ran {CASES} of {CASES}, skipped 0, failures 0, errors 0"
    assert done.returncode == 0 and summary in output, output[-8000:]
