"""Symmetric collectives inside Triton kernels.

The device functions of ``ptx-out/symm_triton.ll`` (packaged as ``symm/lib/symm_triton.ll``)
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
aborted, and the host then reports ``symmTimeout``.

:func:`jit` and :func:`compile` also set ``maxnreg`` (see :func:`default_maxnreg`) unless the
caller does, so that ptxas does not spill the collective's registers to raise occupancy.

Supported: Triton 3.5 (PyTorch 2.9–2.11) to the newest, on sm_80 and newer (one library
serves every target: Triton replaces its triple and data layout when linking).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Callable, Dict, Optional, Tuple

import triton
import triton.language as tl
from triton.language import core

from . import _abi, _paths
from ._convert import resolve_dtype, resolve_op

__all__ = [
    "MAX_PROGRAMS",
    "SUCCESS",
    "STATUS_NAMES",
    "all_reduce",
    "all_gather",
    "barrier",
    "library",
    "extern_libs",
    "requires_symm",
    "jit",
    "compile",
    "dtype_code",
    "op_code",
    "default_maxnreg",
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


def library() -> str:
    """Path of the Triton-linkable library for the installed Triton (``SYMM_TRITON_LIBRARY``
    overrides it). Raises if the installed Triton is older than 3.5, whose LLVM cannot read it.
    """
    if _triton_version() < OLDEST_TRITON:
        raise RuntimeError(
            f"Triton {triton.__version__} is too old for symm's device library "
            f"(needs {OLDEST_TRITON[0]}.{OLDEST_TRITON[1]} or newer)"
        )
    override = os.environ.get("SYMM_TRITON_LIBRARY")
    if override:
        return override
    return str(_paths.triton_library_path())


def extern_libs() -> Dict[str, str]:
    """Triton's ``extern_libs`` option that links the library."""
    return {LIBRARY_NAME: library()}


def _i64(value: Any, _semantic: Any) -> Any:
    return core.cast(value, core.int64, _semantic=_semantic)


def _i32(value: Any, _semantic: Any) -> Any:
    return core.cast(value, core.int32, _semantic=_semantic)


def _call(symbol: str, args: list, types: tuple, _semantic: Any) -> Any:
    return core.extern_elementwise(
        "", "", args, {types: (symbol, core.int32)}, is_pure=False, _semantic=_semantic
    )


@core.extern
def all_reduce(ctx, local_ptr, byte_offset, n, op, dtype, _semantic=None):
    """In-place all-reduce of ``n`` elements of ``dtype`` at ``byte_offset`` of the window whose
    device context is ``ctx``, with ``op``. ``local_ptr`` is this rank's window base, or 0.
    Returns an int32 status (:data:`SUCCESS` = 0)."""
    args = [_i64(ctx, _semantic), _i64(local_ptr, _semantic), _i64(byte_offset, _semantic),
            _i64(n, _semantic), _i32(op, _semantic), _i32(dtype, _semantic)]
    i64, i32 = core.int64, core.int32
    return _call("symm_all_reduce", args, (i64, i64, i64, i64, i32, i32), _semantic)


@core.extern
def all_gather(ctx, send_byte_offset, recv_byte_offset, n_bytes, _semantic=None):
    """All-gather within one window: this rank's ``n_bytes`` at ``send_byte_offset`` land at
    ``recv_byte_offset + rank * n_bytes`` of every rank's window. Returns an int32 status."""
    args = [_i64(ctx, _semantic), _i64(send_byte_offset, _semantic),
            _i64(recv_byte_offset, _semantic), _i64(n_bytes, _semantic)]
    i64 = core.int64
    return _call("symm_all_gather", args, (i64, i64, i64, i64), _semantic)


@core.extern
def barrier(ctx, _semantic=None):
    """Program ``p`` of this rank waits for program ``p`` of every rank; their earlier stores
    are visible afterwards. Returns an int32 status."""
    return _call("symm_barrier", [_i64(ctx, _semantic)], (core.int64,), _semantic)


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


class SymmKernel:
    """A ``@triton.jit`` function whose launches, warm-ups and compiles link the library (and,
    unless the call gives ``maxnreg``, set :func:`default_maxnreg`)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn, updated=())

    def _options(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        libs = dict(kwargs.pop("extern_libs", None) or {})
        libs.update(extern_libs())
        kwargs["extern_libs"] = libs
        if "maxnreg" not in kwargs and not _is_tuner(self.fn):
            kwargs["maxnreg"] = default_maxnreg(kwargs.get("num_warps") or 4)
        return kwargs

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launcher = self.fn[grid]

        def launch(*args: Any, **kwargs: Any) -> Any:
            return launcher(*args, **self._options(kwargs))

        return launch

    def warmup(self, *args: Any, **kwargs: Any) -> Any:
        """As ``JITFunction.warmup``, with the library linked."""
        return self.fn.warmup(*args, **self._options(kwargs))

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """As ``JITFunction.run``, with the library linked."""
        return self.fn.run(*args, **self._options(kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)


def requires_symm(fn: Any) -> SymmKernel:
    """Decorate a ``@triton.jit`` function so that it links symm's device library."""
    return SymmKernel(fn)


def jit(fn: Any = None, **jit_options: Any) -> Any:
    """``triton.jit`` that also links symm's device library (usable as ``@jit`` or
    ``@jit(...)``)."""
    if fn is None:
        return lambda f: requires_symm(triton.jit(f, **jit_options))
    return requires_symm(triton.jit(fn, **jit_options))


def compile(  # noqa: A001 - mirrors triton.compile
    kernel: Any,
    signature: Dict[str, str],
    capability: int,
    constexprs: Optional[Dict[Any, Any]] = None,
    options: Optional[Dict[str, Any]] = None,
) -> Any:
    """Compile ``kernel`` for compute capability ``capability`` (80, 90, 100...) without a GPU,
    with the library linked: ``triton.compile`` on an ``ASTSource``. Without a ``maxnreg``
    in ``options``, :func:`default_maxnreg` is used."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel.fn if isinstance(kernel, SymmKernel) else kernel
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs or {})
    opts = dict(options or {})
    libs = dict(opts.pop("extern_libs", None) or {})
    libs.update(extern_libs())
    opts["extern_libs"] = tuple(libs.items())
    if "maxnreg" not in opts:
        opts["maxnreg"] = default_maxnreg(opts.get("num_warps") or 4)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=opts)
