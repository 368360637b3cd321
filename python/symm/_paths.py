"""Where the package's files are: ``libsymm.so``, ``symm.h`` and the Triton device libraries.

An installed package carries them in ``symm/lib/``. Two environment variables override the
packaged files:

* ``SYMM_LIBRARY``: path of the ``libsymm.so`` to load;
* ``SYMM_HEADER``: path of the ``symm.h`` whose constants the package uses.

Run from a source checkout (``PYTHONPATH=python``), the header falls back to the checkout's
``ffi-headers/symm.h`` and the Triton library to ``ptx-out/symm_triton.ll.gz``, decompressed
once into ``target/python-data/`` (or the temporary directory when the checkout is read-only).
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import struct
import tempfile
import zlib
from pathlib import Path

__all__ = [
    "HEADER_ENV",
    "HEADER_NAME",
    "LIBRARY_ENV",
    "LIBRARY_NAME",
    "TRITON_LIBRARY_NAME",
    "data_dir",
    "data_file",
    "header_path",
    "library_path",
    "package_dir",
    "triton_library_name",
    "triton_library_path",
]

#: Environment variable naming the ``libsymm.so`` to load instead of the packaged one.
LIBRARY_ENV = "SYMM_LIBRARY"
#: Environment variable naming the ``symm.h`` to read instead of the packaged one.
HEADER_ENV = "SYMM_HEADER"
#: File name of the shared library inside the data directory.
LIBRARY_NAME = "libsymm.so"
#: File name of the C header inside the data directory.
HEADER_NAME = "symm.h"
#: File name of the Triton-linkable device library of symm's native functions (textual LLVM IR,
#: one for every target); each engine's is ``symm_triton_<engine>.ll``.
TRITON_LIBRARY_NAME = "symm_triton.ll"


def package_dir() -> Path:
    """The directory of the installed ``symm`` package."""
    return Path(__file__).resolve().parent


def data_dir() -> Path:
    """The directory holding the packaged ``libsymm.so``, ``symm.h`` and Triton libraries."""
    return package_dir() / "lib"


def _checkout_root() -> Path | None:
    """The repository root when the package is imported from a source checkout, else None."""
    root = package_dir().parent.parent
    if (root / "Cargo.toml").is_file() and (root / "ffi-headers").is_dir():
        return root
    return None


def data_file(name: str) -> Path:
    """The path of the packaged file ``name`` (e.g. ``"symm.h"``, ``"symm_triton.ll"``).

    In a source checkout without packaged files, ``symm.h`` is taken from ``ffi-headers/`` and
    the Triton library from ``ptx-out/`` (its compressed copy, see :func:`_decompressed`).

    Raises:
        FileNotFoundError: the file is neither packaged nor in the checkout.
    """
    packaged = data_dir() / name
    if packaged.is_file():
        return packaged
    root = _checkout_root()
    if root is not None:
        # The compressed copy is what the checkout tracks: a plain one next to it may be stale.
        compressed = root / "ptx-out" / f"{name}.gz"
        if compressed.is_file():
            return _decompressed(compressed, [root / "target" / "python-data", _temporary_dir()])
        for candidate in (root / "ffi-headers" / name, root / "ptx-out" / name):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        f"{name} is not part of this installation of symm (looked in {data_dir()}); "
        "reinstall the package with `pip install ./python` or a wheel from `cargo xtask wheel`"
        + (f", or set {HEADER_ENV} to the path of the symm.h that goes with your libsymm" if name == "symm.h" else "")
    )


def _temporary_dir() -> Path:
    """A directory of this user's in the system's temporary directory (see :func:`_private`)."""
    return Path(tempfile.gettempdir()) / f"symm-python-data-{os.getuid()}"


def _private(directory: Path) -> bool:
    """Create ``directory`` (mode 0700) if missing; whether it is a real directory that only
    this user can write (not a link or a directory another user planted in a shared place)."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _decompressed(compressed: Path, directories: list) -> Path:
    """The text of the gzip file ``compressed``, as a file named like it without ``.gz`` in the
    first of ``directories`` that can hold it (a directory this user alone can write).

    The file is written once and carries the compressed file's modification time; it is
    written again when that time or the gzip trailer's size differs (a rebuilt or checked-out
    library). Processes that start at once (one per rank) each write their own temporary file
    and rename it into place, so none reads a partial file.

    Raises:
        FileNotFoundError: no directory could hold it, or ``compressed`` is not a gzip file.
    """
    name = compressed.name[: -len(".gz")]
    try:
        source_time = compressed.stat().st_mtime_ns
        with open(compressed, "rb") as f:
            f.seek(-4, os.SEEK_END)
            (size_mod_4g,) = struct.unpack("<I", f.read(4))
    except (OSError, struct.error) as error:
        raise FileNotFoundError(f"cannot read {compressed}: {error}") from error
    failures = []
    for directory in directories:
        if not _private(directory):
            failures.append(f"{directory}: not a private directory of this user")
            continue
        target = directory / name
        try:
            st = target.stat()
            if st.st_mtime_ns == source_time and st.st_size % (1 << 32) == size_mod_4g:
                return target
        except OSError:
            pass
        partial = None
        try:
            handle, partial_name = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".partial")
            partial = Path(partial_name)
            with gzip.open(compressed, "rb") as source, os.fdopen(handle, "wb") as out:
                shutil.copyfileobj(source, out)
            os.utime(partial, ns=(source_time, source_time))
            os.replace(partial, target)
            partial = None
            return target
        except (OSError, EOFError, zlib.error) as error:
            failures.append(f"{directory}: {error}")
        finally:
            if partial is not None:
                try:
                    partial.unlink()
                except OSError:
                    pass
    raise FileNotFoundError(f"cannot decompress {compressed}: {'; '.join(failures)}")


def library_path() -> Path:
    """The ``libsymm.so`` to load: ``$SYMM_LIBRARY`` when set, else the packaged one.

    Raises:
        FileNotFoundError: ``$SYMM_LIBRARY`` names no file, or nothing is packaged.
    """
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{LIBRARY_ENV}={override} is not a file")
        return path
    packaged = data_dir() / LIBRARY_NAME
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(
        f"{LIBRARY_NAME} is not packaged in {data_dir()}: install the package with "
        f"`pip install ./python` (which builds it), or set {LIBRARY_ENV} to a built libsymm.so"
    )


def header_path() -> Path:
    """The ``symm.h`` whose constants are used: ``$SYMM_HEADER`` when set, else the packaged one.

    Raises:
        FileNotFoundError: ``$SYMM_HEADER`` names no file, or no header is found.
    """
    override = os.environ.get(HEADER_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{HEADER_ENV}={override} is not a file")
        return path
    return data_file(HEADER_NAME)


def triton_library_path(engine: str | None = None) -> Path:
    """The Triton-linkable device library, packaged or in the checkout: symm's native functions
    (``symm_triton.ll``), or with ``engine`` (``"nvshmem"``, ``"nccl"``) that engine's functions
    (``symm_triton_<engine>.ll``, linked beside the native one).

    Raises:
        FileNotFoundError: it is neither packaged nor in the checkout.
    """
    return data_file(triton_library_name(engine))


def triton_library_name(engine: str | None = None) -> str:
    """The file name of the Triton library of ``engine`` (None: the native one)."""
    return TRITON_LIBRARY_NAME if engine is None else f"symm_triton_{engine}.ll"
