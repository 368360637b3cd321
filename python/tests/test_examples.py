"""The Python example of the README runs, and is the code the README shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python" / "allreduce.py"
README = ROOT / "README.md"


@pytest.mark.skipif(not EXAMPLE.is_file(), reason="run from a source checkout")
def test_allreduce_example_runs() -> None:
    environment = dict(os.environ, SYMM_BACKEND="host")
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=environment, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "over 4 ranks on the host backend: 10.0" in result.stdout


@pytest.mark.skipif(not README.is_file(), reason="run from a source checkout")
def test_readme_shows_the_tested_example() -> None:
    """The README's all-reduce block is the example's code between its README markers."""
    example = EXAMPLE.read_text()
    tested = example.split("# -- as in the README --\n", 1)[1].split("# -- end --", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert any(tested.strip() in block for block in blocks), "README.md lacks the example's all-reduce block"
