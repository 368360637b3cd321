"""Build hook of the symm package: puts ``libsymm.so``, ``symm.h`` and the Triton device
libraries into ``symm/lib/`` of the build, and tags the wheel for this platform.

Where the files come from:

* ``libsymm.so``: ``$SYMM_LIBRARY`` when set (a prebuilt library), else
  ``cargo build --release -p symm-c`` in the repository (``$SYMM_SOURCE_DIR``, default: the parent
  of this directory), honouring ``CARGO_TARGET_DIR``;
* ``symm.h``: the repository's ``ffi-headers/symm.h``;
* the Triton-linkable device libraries, decompressed from ``ptx-out/symm_triton*.ll.gz``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
DATA_DIR = Path("symm") / "lib"
#: The Triton-linkable device libraries: symm's native functions, and those of each engine.
TRITON_LIBRARY_NAMES = ("symm_triton.ll", "symm_triton_nvshmem.ll", "symm_triton_nccl.ll")


def source_dir() -> Path:
    """The repository root (``$SYMM_SOURCE_DIR`` or this directory's parent)."""
    root = Path(os.environ.get("SYMM_SOURCE_DIR") or HERE.parent).resolve()
    if not (root / "Cargo.toml").is_file() or not (root / "ffi-headers" / "symm.h").is_file():
        raise RuntimeError(
            f"{root} is not a symm repository (no Cargo.toml or ffi-headers/symm.h): build the "
            "package from a checkout (`pip install ./python`) or set SYMM_SOURCE_DIR"
        )
    return root


def cargo_build(root: Path) -> Path:
    """``cargo build --release -p symm-c`` in ``root``; the path of the ``libsymm.so`` it made."""
    cargo = os.environ.get("CARGO", "cargo")
    command = [cargo, "build", "--release", "-p", "symm-c", "--message-format=json-render-diagnostics"]
    print("symm: running", " ".join(command), "in", root, flush=True)
    try:
        result = subprocess.run(command, cwd=root, stdout=subprocess.PIPE, text=True, check=False)
    except FileNotFoundError:
        raise RuntimeError(
            "cargo was not found: install Rust (rustup), or set SYMM_LIBRARY to a built libsymm.so"
        ) from None
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with status {result.returncode}")
    for line in result.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("reason") == "compiler-artifact" and message.get("target", {}).get("name") == "symm":
            for filename in message.get("filenames", []):
                if filename.endswith(".so"):
                    return Path(filename)
    raise RuntimeError("cargo build finished without producing libsymm.so")


class BuildWithLibrary(build_py):
    """``build_py`` that also copies the native library, the header and the Triton libraries."""

    def run(self) -> None:
        super().run()
        root = source_dir()
        prebuilt = os.environ.get("SYMM_LIBRARY")
        if prebuilt:
            library = Path(prebuilt)
            if not library.is_file():
                raise RuntimeError(f"SYMM_LIBRARY={prebuilt} is not a file")
        else:
            library = cargo_build(root)
        target = Path(self.build_lib) / DATA_DIR
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        files = [(library, "libsymm.so"), (root / "ffi-headers" / "symm.h", "symm.h")]
        for source, name in files:
            shutil.copyfile(source, target / name)
            print(f"symm: packaged {source} as {DATA_DIR / name}", flush=True)
        for name in TRITON_LIBRARY_NAMES:
            compressed = root / "ptx-out" / f"{name}.gz"
            with gzip.open(compressed, "rb") as source, open(target / name, "wb") as out:
                shutil.copyfileobj(source, out)
            print(f"symm: packaged {compressed} as {DATA_DIR / name}", flush=True)
        (target / "libsymm.so").chmod(0o755)


class BinaryDistribution(Distribution):
    """The package carries a native library: install it as platform-specific."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """Tag the wheel ``py3-none-<platform>``: any Python 3 (ctypes, no extension module), but
    only this platform (it carries libsymm.so)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        return "py3", "none", platform


setup(
    cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
