"""Symmetric collectives inside Triton kernels.

The device functions of ``ptx-out/symm_triton.ll.gz`` (packaged as ``symm/lib/symm_triton.ll``)
are called from ``@triton.jit`` code through ``extern_elementwise``; the library is linked when
the kernel compiles, by passing it in Triton's ``extern_libs`` option. :func:`jit` (or
:func:`requires_symm` on an existing ``@triton.jit`` function) does that for every launch::

    import triton, triton.language as tl
    import symm.triton as st

    @st.jit
    def all_reduce_kernel(ctx, n, status_ptr):
        status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32)
        tl.store(status_ptr + tl.program_id(0), status)

    all_reduce_kernel[(4,)](window.device_context, n, status)

Rules (the device functions synchronize with every rank): every thread of every program calls
with the same arguments, not under a branch that differs between programs or ranks; the grid
is one-dimensional with at most :data:`MAX_PROGRAMS` programs; every rank launches the same
kernel with the same grid, on the stream it uses for the window's other collectives. Program
``p`` synchronizes with program ``p`` of every rank (there is no grid-wide barrier). A status
other than :data:`SUCCESS` is one of the ``STATUS_*`` codes; a timeout also marks the window as
aborted, and the host then reports ``symmTimeout``. The codes are ``tl.constexpr`` values for
use inside kernels: on the host compare a status tensor with ``SUCCESS.value`` (a tensor compared
with a constexpr gives a constexpr, not a tensor).

:func:`jit` and :func:`compile` also set ``maxnreg`` (see :func:`default_maxnreg`) unless the
caller does, so that ptxas does not spill the collective's registers to raise occupancy.

Since program ``p`` of a rank waits for program ``p`` of every other rank, every program of
every rank that shares a GPU must be resident on it at once. A launch through :func:`jit`
checks that first (:func:`check_co_residency`, from the compiled kernel's registers, shared
memory and warps, and the GPU's limits) and raises :class:`symm.CoResidencyError` instead of
launching a grid that would time out.

Supported: Triton 3.5 (PyTorch 2.9–2.11) to the newest, on sm_80 and newer (one library
serves every target: Triton replaces its triple and data layout when linking).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import triton
import triton.language as tl
from triton.language import core

from . import _abi, _core, _paths
from ._convert import resolve_dtype, resolve_op
from .errors import CoResidencyError, InvalidArgumentError, UnhandledCudaError, UnsupportedError

__all__ = [
    "MAX_PROGRAMS",
    "SUCCESS",
    "STATUS_NAMES",
    "all_reduce",
    "all_gather",
    "barrier",
    "BACKEND_DEFAULT",
    "BACKEND_NATIVE",
    "BACKEND_NVSHMEM",
    "BACKEND_NCCL",
    "library",
    "extern_libs",
    "ENGINES",
    "engine_library",
    "bitcode_llvm_version",
    "triton_llvm_version",
    "requires_symm",
    "jit",
    "compile",
    "dtype_code",
    "op_code",
    "default_maxnreg",
    "DeviceLimits",
    "Occupancy",
    "device_limits",
    "programs_per_multiprocessor",
    "check_co_residency",
]

#: Oldest Triton whose LLVM reads the library.
OLDEST_TRITON: Tuple[int, int] = (3, 5)
#: Most programs (blocks) of a grid that calls the device functions.
MAX_PROGRAMS = 64
#: The name under which the library is passed in ``extern_libs``.
LIBRARY_NAME = "symm"
#: Registers of one SM's register file (every target from sm_80 on).
_REGISTER_FILE = 65536
#: Most registers one thread may use.
_MAX_THREAD_REGISTERS = 255
#: Registers are allocated to a warp in units of this many (every target from sm_80 on).
_REGISTER_UNIT = 256
#: An SM's register file is split evenly among this many sub-partitions (one scheduler each),
#: and a warp's registers come from one of them.
_SUB_PARTITIONS = 4
#: Shared memory is allocated to a program in units of this many bytes.
_SHARED_UNIT = 128
_WARP_SIZE = 32


def default_maxnreg(num_warps: int = 4) -> int:
    """The ``maxnreg`` option :func:`jit` and :func:`compile` give a kernel that sets none:
    every register a thread of a ``num_warps``-warp program can have.

    Triton declares each kernel's block size (``.reqntid``), and ptxas then trades registers
    for occupancy: it caps a kernel at a register count of its own choosing (40 for 4 warps)
    and spills what does not fit, which puts the collective's addresses and status in local
    memory. An explicit ``maxnreg`` turns that trade off, so the collective runs without
    spills (the compile tests check it). Pass ``maxnreg=None`` to get ptxas's trade back, or a
    number of your own; pass ``None`` too for warp-specialized kernels
    (``tl.range(..., warp_specialize=True)``), whose extra worker warps this default does not
    count.
    """
    per_thread = _REGISTER_FILE // (32 * max(int(num_warps), 1))
    return min(_MAX_THREAD_REGISTERS, per_thread)


@functools.lru_cache(maxsize=None)
def _header_enums() -> Dict[str, int]:
    """Every enumerator of the package's ``symm.h`` (``symmFloat32``, ``symmSum``,
    ``symmDeviceTimeout``...), by name."""
    enums = _abi.parse_enums(_abi.HEADER.read_text(encoding="utf-8"))
    return {name: value for members in enums.values() for name, value in members.items()}


def _enum(name: str) -> int:
    try:
        return _header_enums()[name]
    except KeyError:
        raise RuntimeError(f"symm.h has no enumerator {name}") from None


# Operators and data types, as `symmRedOp_t` / `symmDataType_t` in the header (Triton
# constants, so that kernels can use them directly).
SUM = tl.constexpr(_enum("symmSum"))
PROD = tl.constexpr(_enum("symmProd"))
MAX = tl.constexpr(_enum("symmMax"))
MIN = tl.constexpr(_enum("symmMin"))
AVG = tl.constexpr(_enum("symmAvg"))
INT8 = tl.constexpr(_enum("symmInt8"))
UINT8 = tl.constexpr(_enum("symmUint8"))
INT32 = tl.constexpr(_enum("symmInt32"))
UINT32 = tl.constexpr(_enum("symmUint32"))
INT64 = tl.constexpr(_enum("symmInt64"))
UINT64 = tl.constexpr(_enum("symmUint64"))
FLOAT16 = tl.constexpr(_enum("symmFloat16"))
FLOAT32 = tl.constexpr(_enum("symmFloat32"))
FLOAT64 = tl.constexpr(_enum("symmFloat64"))
BFLOAT16 = tl.constexpr(_enum("symmBfloat16"))
FLOAT8E4M3 = tl.constexpr(_enum("symmFloat8e4m3"))
FLOAT8E5M2 = tl.constexpr(_enum("symmFloat8e5m2"))

# Device statuses (`symmDeviceStatus_t`).
SUCCESS = tl.constexpr(_enum("symmDeviceSuccess"))
STATUS_NULL_CONTEXT = tl.constexpr(_enum("symmDeviceNullContext"))
STATUS_UNKNOWN_BACKEND = tl.constexpr(_enum("symmDeviceUnknownBackend"))
STATUS_UNSUPPORTED_OP = tl.constexpr(_enum("symmDeviceUnsupportedOp"))
STATUS_UNSUPPORTED_DTYPE = tl.constexpr(_enum("symmDeviceUnsupportedDtype"))
STATUS_TIMEOUT = tl.constexpr(_enum("symmDeviceTimeout"))
STATUS_INVALID_ARGUMENT = tl.constexpr(_enum("symmDeviceInvalidArgument"))
#: Status code → name, for error messages on the host.
STATUS_NAMES: Dict[int, str] = {
    v: k[len("symmDevice"):] for k, v in _header_enums().items() if k.startswith("symmDevice")
}

def dtype_code(dtype: Any) -> int:
    """The ``symmDataType_t`` of ``dtype``: a name (``"bf16"``), a NumPy or torch dtype, or a
    ``symm.DataType`` (the package's own spellings)."""
    return int(resolve_dtype(dtype))  # an unknown one raises InvalidArgumentError (a ValueError)


def op_code(op: Any) -> int:
    """The ``symmRedOp_t`` of ``op``: ``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"`` or
    a ``symm.RedOp``."""
    return int(resolve_op(op))


def _triton_version() -> Tuple[int, int]:
    major, minor = (int(part) for part in re.findall(r"\d+", triton.__version__)[:2])
    return major, minor


def library(engine: Optional[str] = None) -> str:
    """Path of the Triton-linkable library for the installed Triton: symm's native functions,
    or with ``engine`` (``"nvshmem"``, ``"nccl"``) that engine's functions, linked beside the
    native library into a kernel that links the engine's device bitcode too.
    ``SYMM_TRITON_LIBRARY`` names the native library to use instead of the packaged one; the
    engines' libraries are then taken from its directory (``symm_triton_<engine>.ll``). Raises
    if the installed Triton is older than 3.5, whose LLVM cannot read it.
    """
    if _triton_version() < OLDEST_TRITON:
        raise RuntimeError(
            f"Triton {triton.__version__} is too old for symm's device library "
            f"(needs {OLDEST_TRITON[0]}.{OLDEST_TRITON[1]} or newer)"
        )
    override = os.environ.get("SYMM_TRITON_LIBRARY")
    if not override:
        return str(_paths.triton_library_path(engine))
    if engine is None:
        return override
    beside = Path(override).parent / _paths.triton_library_name(engine)
    if not beside.is_file():
        raise FileNotFoundError(
            f"SYMM_TRITON_LIBRARY={override}: no {beside.name} beside it, where the {engine} "
            "engine's device functions are taken from when it is set"
        )
    return str(beside)


def _engine_paths(engines: Any) -> Dict[str, Optional[str]]:
    """``engines`` (names, or a dict of name to path or None) as a dict of name to path or None,
    each name checked."""
    chosen = dict(engines) if isinstance(engines, dict) else {e: None for e in engines}
    for engine in chosen:
        if engine not in ENGINES:
            raise InvalidArgumentError(f"engine {engine!r} is not one of {sorted(ENGINES)}")
    return chosen


def extern_libs(engines: Any = (), capability: int = 90) -> Dict[str, str]:
    """Triton's ``extern_libs`` option that links the library, and the device bitcode of each
    of ``engines`` (names, or a dict of name to path or None; see :func:`engine_library`)."""
    chosen = _engine_paths(engines)
    # Triton links the libraries in this order, each only for what the kernel needs so far:
    # the engines' symm functions come first, since they call the native ones, and each
    # engine's bitcode after them.
    libs = {f"{LIBRARY_NAME}_{engine}": library(engine) for engine in chosen}
    libs[LIBRARY_NAME] = library()
    for engine, path in chosen.items():
        libs[ENGINES[engine][0]] = engine_library(engine, path, capability)
    return libs


#: Engines whose device bitcode a kernel can link next to symm's library (``engines=`` of
#: :func:`jit`, :func:`requires_symm`, :func:`compile` and :func:`extern_libs`), each with the
#: name it is linked under and the environment variable that names its file.
ENGINES: Dict[str, Tuple[str, str]] = {
    "nccl": ("libnccl_device", "SYMM_NCCL_DEVICE_LIBRARY"),
    "nvshmem": ("libnvshmem_device", "SYMM_NVSHMEM_DEVICE_LIBRARY"),
}


@functools.lru_cache(maxsize=None)
def triton_llvm_version() -> Tuple[int, int, int]:
    """The version of the LLVM inside the installed Triton (read from ``libtriton.so``):
    bitcode made by a newer LLVM is not readable by it."""
    import mmap

    library = Path(triton.__file__).resolve().parent / "_C" / "libtriton.so"
    with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        found, at = None, data.find(b"LLVM version ")
        while found is None and at >= 0:
            found = re.match(rb"LLVM version (\d+)\.(\d+)\.(\d+)", data[at : at + 40])
            at = data.find(b"LLVM version ", at + 1)
    if found is None:
        raise RuntimeError(f"{library} does not say which LLVM it holds")
    return tuple(int(v) for v in found.groups())  # type: ignore[return-value]


def bitcode_llvm_version(path: str) -> Optional[Tuple[int, int, int]]:
    """The version of the LLVM that made the bitcode file ``path`` (its ``clang version`` or
    ``LLVM`` producer string), or None when the file does not say."""
    data = Path(path).read_bytes()
    found = re.search(rb"clang version (\d+)\.(\d+)\.(\d+)", data) or re.search(rb"LLVM(\d+)\.(\d+)\.(\d+)", data)
    return tuple(int(v) for v in found.groups()) if found else None  # type: ignore[return-value]


def _installed_engine_file(engine: str, capability: int) -> Optional[Path]:
    """The engine's device bitcode in its installed wheel (``nvidia-nccl-cu*``,
    ``nvidia-nvshmem-cu*``), if any."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(f"nvidia.{engine}")
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        lib = Path(folder) / "lib"
        names = (["libnccl_device.bc"] if engine == "nccl"
                 else [f"libnvshmem_device_sm_{capability}.bc", "libnvshmem_device.bc"])
        for name in names:
            if (lib / name).is_file():
                return lib / name
    return None


def engine_library(engine: str, path: Optional[str] = None, capability: int = 90) -> str:
    """The device bitcode of ``engine`` (``"nccl"`` or ``"nvshmem"``) to link next to symm's
    library, checked readable by the installed Triton's LLVM: ``path``, else the file named by
    ``SYMM_NCCL_DEVICE_LIBRARY`` / ``SYMM_NVSHMEM_DEVICE_LIBRARY``, else the one in the
    installed ``nvidia-nccl-cu*`` / ``nvidia-nvshmem-cu*`` wheel (NVSHMEM's for
    ``capability``). NCCL's needs NCCL 2.30 or newer (2.29 ships none); symm's functions on NCCL
    engine windows (``BACKEND_NCCL``) call GIN entry points of NCCL 2.32.

    Raises:
        InvalidArgumentError: an unknown engine, or no such file.
        UnsupportedError: the bitcode was made by a newer LLVM than the installed Triton's,
            which cannot read it (Triton would only say it failed to parse the library).
    """
    if engine not in ENGINES:
        raise InvalidArgumentError(f"engine {engine!r} is not one of {sorted(ENGINES)}")
    variable = ENGINES[engine][1]
    chosen = path or os.environ.get(variable) or _installed_engine_file(engine, capability)
    if not chosen:
        raise InvalidArgumentError(
            f"no {engine} device bitcode: pass its path, set {variable}, or install the engine's wheel "
            f"({'nvidia-nccl-cu13 2.30 or newer' if engine == 'nccl' else 'nvidia-nvshmem-cu13'})"
        )
    if not Path(chosen).is_file():
        raise InvalidArgumentError(f"{engine} device bitcode {chosen}: no such file")
    _check_readable(engine, str(chosen), Path(chosen).stat().st_mtime_ns)
    return str(chosen)


@functools.lru_cache(maxsize=None)
def _check_readable(engine: str, chosen: str, mtime_ns: int) -> None:
    """Raise unless the installed Triton's LLVM reads ``chosen`` (once per file and version of
    it: a launch checks again without reading the file)."""
    made_by = bitcode_llvm_version(chosen)
    reader = triton_llvm_version()
    if made_by is not None and made_by[:2] > reader[:2]:
        raise UnsupportedError(
            f"{chosen} was made by LLVM {'.'.join(map(str, made_by))}, newer than the LLVM "
            f"{'.'.join(map(str, reader))} of Triton {triton.__version__}, which cannot read it: use "
            f"{engine} bitcode made by LLVM {reader[0]}.{reader[1]} or older (an older {engine} release), "
            "or a newer Triton"
        )


def _i64(value: Any, _semantic: Any) -> Any:
    return core.cast(value, core.int64, _semantic=_semantic)


def _i32(value: Any, _semantic: Any) -> Any:
    return core.cast(value, core.int32, _semantic=_semantic)


def _call(symbol: str, args: list, types: tuple, _semantic: Any) -> Any:
    return core.extern_elementwise(
        "", "", args, {types: (symbol, core.int32)}, is_pure=False, _semantic=_semantic
    )


#: Backend hints, the last argument of :func:`all_reduce`, :func:`all_gather` and
#: :func:`barrier` (a ``tl.constexpr``). ``BACKEND_DEFAULT`` dispatches at run time on the
#: context's tag among the protocols the kernel links: native windows always, and the engine
#: windows of the one engine whose device bitcode the kernel links (``engines=("nvshmem",)``
#: or ``engines=("nccl",)``; a kernel linking both names its engine with a hint). A constant
#: hint compiles one path: ``BACKEND_NATIVE`` native windows only, ``BACKEND_NVSHMEM`` NVSHMEM
#: engine windows only, ``BACKEND_NCCL`` NCCL engine windows only (GIN; a context of another
#: tag returns :data:`STATUS_UNKNOWN_BACKEND`).
BACKEND_DEFAULT = tl.constexpr(-1)
BACKEND_NATIVE = tl.constexpr(0)
BACKEND_NVSHMEM = tl.constexpr(1)
BACKEND_NCCL = tl.constexpr(2)

#: The engine of each engine hint, and the engine's name in its functions' symbols.
_HINT_ENGINES = {BACKEND_NVSHMEM.value: ("nvshmem", "NVSHMEM"), BACKEND_NCCL.value: ("nccl", "NCCL")}


def _linked_engines(_semantic: Any) -> Optional[set]:
    """The engines whose bitcode the kernel being compiled links (from Triton's
    ``extern_libs`` option), or None when this Triton does not say."""
    options = getattr(getattr(_semantic, "builder", None), "options", None)
    libs = getattr(options, "extern_libs", None)
    if libs is None:
        return None
    names = {name for name, _ in (libs.items() if isinstance(libs, dict) else libs)}
    return {engine for engine, (name, _) in ENGINES.items() if name in names}


def _symbol(function: str, backend: Any, _semantic: Any) -> str:
    """The library symbol of ``function`` for the backend hint ``backend``."""
    hint = backend.value if isinstance(backend, core.constexpr) else backend
    if not isinstance(hint, int) or isinstance(hint, bool):
        raise InvalidArgumentError(
            f"symm.triton.{function}: the backend hint must be a tl.constexpr "
            f"(BACKEND_DEFAULT, BACKEND_NATIVE, BACKEND_NVSHMEM, BACKEND_NCCL), not {backend!r}"
        )
    known = _linked_engines(_semantic)
    linked = known or set()
    if hint == BACKEND_DEFAULT.value:
        engines = sorted(engine for engine, _ in _HINT_ENGINES.values() if engine in linked)
        if len(engines) > 1:
            raise InvalidArgumentError(
                f"symm.triton.{function}: the kernel links the device bitcode of "
                f"{' and '.join(engines)}; BACKEND_DEFAULT dispatches to one engine: pass "
                "BACKEND_NVSHMEM or BACKEND_NCCL"
            )
        return f"symm_dispatch_{engines[0]}_{function}" if engines else f"symm_{function}"
    if hint == BACKEND_NATIVE.value:
        return f"symm_{function}"
    if hint in _HINT_ENGINES:
        engine, name = _HINT_ENGINES[hint]
        if known is not None and engine not in linked:
            raise InvalidArgumentError(
                f"symm.triton.{function} with BACKEND_{name} needs {name}'s device bitcode "
                f"linked: compile the kernel with engines=(\"{engine}\",) or "
                f"engines={{\"{engine}\": path}} (symm.triton.jit, requires_symm, compile)"
            )
        return f"symm_{engine}_{function}"
    raise InvalidArgumentError(
        f"symm.triton.{function}: unknown backend hint {hint} (BACKEND_DEFAULT = -1, "
        "BACKEND_NATIVE = 0, BACKEND_NVSHMEM = 1, BACKEND_NCCL = 2)"
    )


@core.extern
def all_reduce(ctx, local_ptr, byte_offset, n, op, dtype, backend=BACKEND_DEFAULT, _semantic=None):
    """In-place all-reduce of ``n`` elements of ``dtype`` at ``byte_offset`` of the window whose
    device context is ``ctx``, with ``op``. ``local_ptr`` is this rank's window base, or 0.
    ``backend`` is a backend hint (:data:`BACKEND_DEFAULT`). Returns an int32 status
    (:data:`SUCCESS` = 0)."""
    args = [_i64(ctx, _semantic), _i64(local_ptr, _semantic), _i64(byte_offset, _semantic),
            _i64(n, _semantic), _i32(op, _semantic), _i32(dtype, _semantic)]
    i64, i32 = core.int64, core.int32
    return _call(_symbol("all_reduce", backend, _semantic), args, (i64, i64, i64, i64, i32, i32), _semantic)


@core.extern
def all_gather(ctx, send_byte_offset, recv_byte_offset, n_bytes, backend=BACKEND_DEFAULT, _semantic=None):
    """All-gather within one window: this rank's ``n_bytes`` at ``send_byte_offset`` land at
    ``recv_byte_offset + rank * n_bytes`` of every rank's window. ``backend`` is a backend hint
    (:data:`BACKEND_DEFAULT`). Returns an int32 status."""
    args = [_i64(ctx, _semantic), _i64(send_byte_offset, _semantic),
            _i64(recv_byte_offset, _semantic), _i64(n_bytes, _semantic)]
    i64 = core.int64
    return _call(_symbol("all_gather", backend, _semantic), args, (i64, i64, i64, i64), _semantic)


@core.extern
def barrier(ctx, backend=BACKEND_DEFAULT, _semantic=None):
    """Program ``p`` of this rank waits for program ``p`` of every rank; their earlier stores
    (and, on an engine window, their puts) are visible afterwards. ``backend`` is a
    backend hint (:data:`BACKEND_DEFAULT`). Returns an int32 status."""
    return _call(_symbol("barrier", backend, _semantic), [_i64(ctx, _semantic)], (core.int64,), _semantic)


def _is_tuner(fn: Any) -> bool:
    """Whether ``fn`` is ``triton.autotune`` / ``triton.heuristics`` around a kernel: its
    configurations (``num_warps``, ``maxnreg``) are only known inside it, so no default
    ``maxnreg`` is added on its behalf (put ``@triton.autotune`` above ``@symm.triton.jit``
    instead: then each configuration gets its own default)."""
    try:
        from triton.runtime.autotuner import Autotuner, Heuristics
    except ImportError:  # pragma: no cover - every supported Triton has them
        return False
    return isinstance(fn, (Autotuner, Heuristics))


@dataclass(frozen=True)
class DeviceLimits:
    """What bounds the programs (blocks) a GPU keeps resident at once: CUDA device attributes,
    which :func:`device_limits` reads. An H100 SXM is
    ``DeviceLimits(132, 65536, 2048, 32, 233472, 1024)``."""

    #: Streaming multiprocessors (SMs).
    multiprocessors: int
    #: 32-bit registers of one SM.
    registers_per_multiprocessor: int
    #: Most threads resident on one SM.
    max_threads_per_multiprocessor: int
    #: Most programs resident on one SM.
    max_blocks_per_multiprocessor: int
    #: Bytes of shared memory of one SM (the largest carveout).
    shared_memory_per_multiprocessor: int
    #: Bytes of shared memory the driver reserves for each program.
    reserved_shared_memory_per_block: int


class Occupancy(NamedTuple):
    """How many programs of one kernel an SM holds at once, and what stops it holding more."""

    #: Programs resident on one SM at once (0: not even one fits).
    programs_per_multiprocessor: int
    #: The resource(s) that give that number, in words, for error messages.
    limited_by: str


def programs_per_multiprocessor(
    n_regs: int, shared_bytes: int, num_warps: int, limits: DeviceLimits
) -> Occupancy:
    """How many programs of a kernel fit on one SM at once, as the CUDA occupancy calculator
    counts them: ``n_regs`` registers per thread (allocated per warp, in units of 256, from one
    of the SM's four sub-partitions), ``shared_bytes`` of shared memory per program (plus the
    driver's reserve, in units of 128 bytes), ``num_warps`` warps per program, and the SM's
    thread and program limits. Assumes the largest shared-memory carveout.

    With ``maxnreg=255`` (:func:`default_maxnreg` up to 8 warps) and a kernel that uses them
    all, that is 2 programs per SM at 4 warps and 1 at 8.
    """
    warps = max(int(num_warps), 1)
    bounds = []
    if n_regs > 0:
        per_warp = -(-int(n_regs) * _WARP_SIZE // _REGISTER_UNIT) * _REGISTER_UNIT
        per_partition = limits.registers_per_multiprocessor // _SUB_PARTITIONS
        resident_warps = per_partition // per_warp * _SUB_PARTITIONS
        bounds.append((
            resident_warps // warps,
            f"registers: {n_regs} per thread, {per_warp} per warp: {resident_warps} warps fit in "
            f"the SM's {limits.registers_per_multiprocessor} registers, and a program has {warps}",
        ))
    per_program = shared_bytes + limits.reserved_shared_memory_per_block
    if per_program > 0:
        allocated = -(-per_program // _SHARED_UNIT) * _SHARED_UNIT
        bounds.append((
            limits.shared_memory_per_multiprocessor // allocated,
            f"shared memory: {shared_bytes} bytes per program plus "
            f"{limits.reserved_shared_memory_per_block} reserved, of the SM's "
            f"{limits.shared_memory_per_multiprocessor}",
        ))
    threads = warps * _WARP_SIZE
    bounds.append((
        limits.max_threads_per_multiprocessor // threads,
        f"threads: {threads} per program, of the SM's {limits.max_threads_per_multiprocessor}",
    ))
    bounds.append((
        limits.max_blocks_per_multiprocessor,
        f"at most {limits.max_blocks_per_multiprocessor} programs per SM",
    ))
    fit = min(count for count, _ in bounds)
    return Occupancy(fit, "; ".join(why for count, why in bounds if count == fit))


def check_co_residency(
    programs: int,
    ranks_on_device: int,
    n_regs: int,
    shared_bytes: int,
    num_warps: int,
    limits: DeviceLimits,
    kernel: str = "kernel",
) -> None:
    """Raise :class:`symm.CoResidencyError` unless ``programs`` programs of each of
    ``ranks_on_device`` ranks sharing one GPU can all be resident at once
    (``programs * ranks_on_device <= limits.multiprocessors *`` programs per SM, see
    :func:`programs_per_multiprocessor`).

    Program ``p`` of a rank spins until program ``p`` of every other rank arrives: if some
    programs cannot become resident while the others spin, every rank reports
    ``STATUS_TIMEOUT`` after ``SYMM_TIMEOUT_MS`` and the window is aborted. ``kernel`` names the
    kernel in the message.
    """
    occupancy = programs_per_multiprocessor(n_regs, shared_bytes, num_warps, limits)
    per_sm = occupancy.programs_per_multiprocessor
    resident = limits.multiprocessors * per_sm
    ranks = max(int(ranks_on_device), 1)
    if programs * ranks <= resident:
        return
    if per_sm == 0:
        outcome, remedy = "the launch would fail", "Not one program fits on an SM"
    else:
        outcome = "it would time out after SYMM_TIMEOUT_MS on every rank and abort the window"
        remedy = (
            f"Put at most {resident} ranks on this GPU" if resident < ranks
            else f"Launch at most {resident // ranks} programs per rank"
        )
    raise CoResidencyError(
        f"{kernel}: {programs} programs per rank x {ranks} rank{'s' if ranks > 1 else ''} on "
        f"this GPU = {programs * ranks} programs must be resident at once (program p of each "
        f"rank waits for program p of every other rank), but {limits.multiprocessors} SMs x "
        f"{per_sm} per SM = {resident} fit ({occupancy.limited_by}); launched, {outcome}. "
        f"{remedy}; to fit more programs "
        f"on an SM, use fewer warps (num_warps), fewer registers (a lower maxnreg) or less "
        f"shared memory (smaller blocks, fewer num_stages)"
    )


# The `CUdevice_attribute` (cuda.h) of each field of `DeviceLimits`.
_DEVICE_ATTRIBUTES = {
    "multiprocessors": 16,  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    "registers_per_multiprocessor": 82,  # CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR
    "max_threads_per_multiprocessor": 39,  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
    "max_blocks_per_multiprocessor": 106,  # CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR
    "shared_memory_per_multiprocessor": 81,  # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    "reserved_shared_memory_per_block": 111,  # CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK
}


@functools.lru_cache(maxsize=None)
def device_limits(device: int) -> DeviceLimits:
    """The :class:`DeviceLimits` of CUDA device ``device`` (an ordinal), from the CUDA driver
    (``cuDeviceGetAttribute``)."""
    driver = ctypes.CDLL("libcuda.so.1")

    def call(name: str, *args: Any) -> None:
        result = getattr(driver, name)(*args)
        if result != 0:
            raise UnhandledCudaError(f"{name} failed with CUresult {result} (device {device})")

    call("cuInit", 0)
    handle = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(handle), int(device))
    values = {}
    for field, attribute in _DEVICE_ATTRIBUTES.items():
        value = ctypes.c_int()
        call("cuDeviceGetAttribute", ctypes.byref(value), attribute, handle)
        values[field] = value.value
    return DeviceLimits(**values)


def _current_device() -> int:
    """The CUDA device Triton launches on."""
    return triton.runtime.driver.active.get_current_device()


def _grid_programs(fn: Any, grid: Any, args: tuple, kwargs: Dict[str, Any]) -> int:
    """Programs of ``grid`` (a tuple, or a callable of the bound arguments, as Triton takes)."""
    if callable(grid):
        signature = fn.signature  # the kernel's `inspect.Signature`
        bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
        bound.apply_defaults()
        grid = grid(dict(bound.arguments))
    return math.prod(int(size) for size in grid)


def _ranks_on_device(args: tuple, kwargs: Dict[str, Any], device: int) -> int:
    """Ranks whose kernels share ``device``: for each argument that is a window's
    ``device_context``, how many ranks of its communicator this process created on the device
    (the most of them); 1 if no argument is one."""
    ranks = [
        window.comm._process_ranks_on_device(device)
        for value in (*args, *kwargs.values())
        if isinstance(value, int) and not isinstance(value, bool)
        for window in (_core.window_of_device_context(value),)
        if window is not None
    ]
    return max([1, *ranks])


def _check_launch(fn: Any, compiled: Any, grid: Any, args: tuple, kwargs: Dict[str, Any]) -> None:
    """:func:`check_co_residency` for launching ``compiled`` (``fn`` compiled for ``args``)."""
    compiled._init_handles()  # loads the module, which gives its registers (as a launch does)
    device = _current_device()
    check_co_residency(
        _grid_programs(fn, grid, args, kwargs),
        _ranks_on_device(args, kwargs, device),
        compiled.n_regs,
        compiled.metadata.shared,
        compiled.metadata.num_warps,
        device_limits(device),
        kernel=f"{compiled.name} on device {device}",
    )


class SymmKernel:
    """A ``@triton.jit`` function whose launches, warm-ups and compiles link the library (and,
    unless the call gives ``maxnreg``, set :func:`default_maxnreg`), and whose launches first
    check that every program of every rank on the GPU can be resident at once
    (:func:`check_co_residency`)."""

    def __init__(self, fn: Any, engines: Any = ()) -> None:
        self.fn = fn
        self.engines = _engine_paths(engines)
        """The engines whose device bitcode is linked too (name to path, or None: found as
        :func:`engine_library` finds it)."""
        functools.update_wrapper(self, fn, updated=())

    def _options(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        libs = dict(kwargs.pop("extern_libs", None) or {})
        capability = 90
        if self.engines:
            capability = int(triton.runtime.driver.active.get_current_target().arch)
        libs.update(extern_libs(self.engines, capability))
        kwargs["extern_libs"] = libs
        if "maxnreg" not in kwargs and not _is_tuner(self.fn):
            kwargs["maxnreg"] = default_maxnreg(kwargs.get("num_warps") or 4)
        return kwargs

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            return self.run(*args, grid=grid, warmup=False, **kwargs)

        return launch

    def warmup(self, *args: Any, **kwargs: Any) -> Any:
        """As ``JITFunction.warmup``, with the library linked."""
        return self.fn.warmup(*args, **self._options(kwargs))

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        """As ``JITFunction.run``, with the library linked. A launch (``warmup=False``) compiles
        the kernel first (or takes it from Triton's cache) and raises
        :class:`symm.CoResidencyError`, launching nothing, when ``grid``'s programs times the
        ranks sharing the GPU do not fit on it at once (:func:`check_co_residency`; the ranks
        are those this process created of the communicator of the window whose
        ``device_context`` is an argument, else 1). Triton's pre-run hooks therefore run twice
        per launch. Not checked: a kernel wrapped in ``triton.autotune`` /
        ``triton.heuristics`` inside :func:`jit` (put those above it)."""
        kwargs = self._options(kwargs)
        if not warmup and not _is_tuner(self.fn):
            compiled = self.fn.run(*args, grid=grid, warmup=True, **kwargs)
            if compiled is not None:  # None: a `jit_cache_hook` took the compile over
                if hasattr(compiled, "result"):  # compiled under `triton.AsyncCompileMode`
                    compiled = compiled.result()
                _check_launch(self.fn, compiled, grid, args, kwargs)
                if "nvshmem" in self.engines:
                    _init_nvshmem_module(compiled)
        return self.fn.run(*args, grid=grid, warmup=warmup, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)


def requires_symm(fn: Any, engines: Any = ()) -> SymmKernel:
    """Decorate a ``@triton.jit`` function so that it links symm's device library, and the
    device bitcode of each of ``engines`` (``"nccl"``, ``"nvshmem"``; or a dict of name to
    path), for a kernel that also calls that engine's device functions."""
    return SymmKernel(fn, engines)


def jit(fn: Any = None, engines: Any = (), **jit_options: Any) -> Any:
    """``triton.jit`` that also links symm's device library (usable as ``@jit`` or
    ``@jit(...)``), and the device bitcode of ``engines`` (see :func:`requires_symm`).

    A kernel linked with NVSHMEM's device bitcode has its module initialized for NVSHMEM
    (``nvshmemx_cumodule_init``, with the NVSHMEM host library this process loaded, else the
    one ``SYMM_NVSHMEM_LIBRARY`` names) before its first launch: without it NVSHMEM's device
    functions read an uninitialized state. Not done for a kernel wrapped in
    ``triton.autotune`` / ``triton.heuristics`` inside :func:`jit`, nor one a
    ``jit_cache_hook`` compiles: initialize those modules yourself."""
    if fn is None:
        return lambda f: requires_symm(triton.jit(f, **jit_options), engines)
    return requires_symm(triton.jit(fn, **jit_options), engines)


#: The modules initialized for NVSHMEM so far (CUmodule handles).
_NVSHMEM_MODULES: set = set()


def _init_nvshmem_module(compiled: Any) -> None:
    """``nvshmemx_cumodule_init`` on ``compiled``'s module, once per module."""
    compiled._init_handles()
    module = int(compiled.module)
    if module in _NVSHMEM_MODULES:
        return
    name = os.environ.get("SYMM_NVSHMEM_LIBRARY") or "libnvshmem_host.so.3"
    try:
        host = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        host = ctypes.CDLL(name, mode=os.RTLD_GLOBAL)
    init = host.nvshmemx_cumodule_init
    init.argtypes = [ctypes.c_void_p]
    init.restype = ctypes.c_int
    result = init(ctypes.c_void_p(module))
    if result != 0:
        raise UnsupportedError(
            f"nvshmemx_cumodule_init of {getattr(compiled, 'name', 'the kernel')}'s module returned {result}: "
            "is NVSHMEM initialized in this process, and is its device bitcode the host library's version?"
        )
    _NVSHMEM_MODULES.add(module)


def compile(  # noqa: A001 - mirrors triton.compile
    kernel: Any,
    signature: Dict[str, str],
    capability: int,
    constexprs: Optional[Dict[Any, Any]] = None,
    options: Optional[Dict[str, Any]] = None,
    engines: Any = (),
) -> Any:
    """Compile ``kernel`` for compute capability ``capability`` (80, 90, 100...) without a GPU,
    with the library linked, and the device bitcode of ``engines`` (see :func:`requires_symm`;
    a :class:`SymmKernel`'s own engines too): ``triton.compile`` on an ``ASTSource``. Without a
    ``maxnreg`` in ``options``, :func:`default_maxnreg` is used."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel.fn if isinstance(kernel, SymmKernel) else kernel
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {})
    opts = dict(options or {})
    libs = dict(opts.pop("extern_libs", None) or {})
    chosen = dict(kernel.engines) if isinstance(kernel, SymmKernel) else {}
    chosen.update(_engine_paths(engines))
    libs.update(extern_libs(chosen, capability))
    opts["extern_libs"] = tuple(libs.items())
    if "maxnreg" not in opts:
        opts["maxnreg"] = default_maxnreg(opts.get("num_warps") or 4)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=opts)
