"""Compile tests of Triton kernels that call symm's device functions: no GPU needed.

For every target (sm_80, sm_90, sm_100a) the kernels are compiled by ``triton.compile`` with
the library linked, then the PTX is checked: no unresolved external function, the device
function's code is there, and ptxas (the one Triton bundles) reports no spills and no stack
frame. CI runs this file under the oldest supported Triton (3.5) and the newest.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import symm.triton as st  # noqa: E402

CAPABILITIES = [80, 90, 100]
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "bfloat16", "float8e4m3", "float8e5m2"]
OPS = ["sum", "prod", "max", "min", "avg"]


@pytest.fixture(autouse=True, scope="module")
def fresh_cache(tmp_path_factory):
    """Compile for real: a private, empty Triton cache."""
    previous = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    yield
    if previous is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = previous


@st.jit
def all_reduce_kernel(ctx, local, offset, n, op: tl.constexpr, dtype: tl.constexpr, status_ptr):
    status = st.all_reduce(ctx, local, offset, n, op, dtype)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit
def gather_then_scale_kernel(ctx, base_ptr, send, recv, n_bytes, status_ptr, BLOCK: tl.constexpr):
    # A gather next to the kernel's own compute (compiled only: which elements a program may
    # touch after the gather is the caller's business, see symm.triton's rules).
    status = st.all_gather(ctx, send, recv, n_bytes)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(base_ptr + recv // 4 + offsets)
    tl.store(base_ptr + recv // 4 + offsets, values * 2.0)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit
def barrier_kernel(ctx, status_ptr):
    status = st.barrier(ctx)
    tl.store(status_ptr + tl.program_id(0), status)


def ptxas_path(capability: int) -> str:
    """The ptxas Triton itself uses for `capability` (newer Tritons take the architecture)."""
    import inspect

    from triton.backends.nvidia import compiler as nvidia_compiler

    get_ptxas = nvidia_compiler.get_ptxas
    if inspect.signature(get_ptxas).parameters:
        return get_ptxas(capability).path
    return get_ptxas().path


def arch(capability: int) -> str:
    return f"sm_{capability}{'a' if capability >= 90 else ''}"


# The collective's path runs in registers: no spill, no stack frame, nothing in local memory.
# Two things make it so: a device-function call keeps its one task descriptor by value (no
# pointer into a stack copy), and `symm.triton` gives each kernel an explicit `maxnreg`
# (`default_maxnreg`), without which ptxas caps a 4-warp kernel at 40 registers and parks a few
# scalars (the status, a barrier slot's address) in local memory to get there
# (measured with Triton 3.5; `maxnreg=None` opts out).
MAX_SPILL_BYTES = 0
MAX_STACK_BYTES = 0
MAX_LOCAL_BYTES = 0
SPILLING: list = []
CHECKED: list = []


@pytest.fixture(autouse=True, scope="module")
def spill_report():
    yield
    print(f"\nTriton {triton.__version__}: {len(CHECKED)} kernels linked, "
          f"{len(SPILLING)} with ptxas spills or a stack frame: "
          f"{sorted(SPILLING)[:12]}{' ...' if len(SPILLING) > 12 else ''}")


def check_linked(kernel, capability: int, symbol_hint: str) -> str:
    ptx = kernel.asm["ptx"]
    # What LLVM put in local memory: nothing.
    local = sum(int(v) for v in re.findall(r"\.local \.align \d+ \.b8 \s*\w+\[(\d+)\]", ptx))
    assert local <= MAX_LOCAL_BYTES, f"{symbol_hint}: {local} bytes of local memory"
    assert ".extern .func" not in ptx, "an external function is left unresolved"
    assert "symm_" not in re.findall(r"\.extern[^\n]*", ptx).__str__()
    assert kernel.asm.get("cubin"), "no cubin"
    target = re.search(r"^\.target\s+(\S+)", ptx, re.M).group(1)
    assert target.rstrip(",") == arch(capability)
    # The collective's path is there: its cross-rank waits are acquire loads at system scope.
    assert "ld.acquire.sys" in ptx or "ld.global.acquire.sys" in ptx, symbol_hint
    out = subprocess.run(
        [ptxas_path(capability), "-v", f"-arch={arch(capability)}", "-o", os.devnull, "-"],
        input=ptx.encode(), capture_output=True, check=True,
    )
    log = (out.stdout + out.stderr).decode()
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", log)]
    frames = [int(v) for v in re.findall(r"(\d+) bytes stack frame", log)]
    assert spills and frames, log
    CHECKED.append((capability, symbol_hint))
    if any(spills) or any(frames):
        SPILLING.append((capability, symbol_hint, sum(spills), max(frames)))
    assert sum(spills) <= MAX_SPILL_BYTES, f"{symbol_hint}: spills: {log}"
    assert max(frames) <= MAX_STACK_BYTES, f"{symbol_hint}: stack frame: {log}"
    # No panic path: nothing calls into `core::panicking` (a trap that would poison the
    # context). Calls among the library's own functions are allowed.
    assert "panicking" not in ptx, f"{symbol_hint}: a panic path remains"
    return ptx


@pytest.mark.parametrize("capability", CAPABILITIES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_every_dtype_and_op(capability, dtype):
    for op in OPS:
        kernel = st.compile(
            all_reduce_kernel,
            signature={"ctx": "i64", "local": "i64", "offset": "i64", "n": "i64",
                       "op": "constexpr", "dtype": "constexpr", "status_ptr": "*i32"},
            capability=capability,
            constexprs={"op": st.op_code(op), "dtype": st.dtype_code(dtype)},
        )
        check_linked(kernel, capability, f"{dtype} {op}")


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_all_gather_fused_with_compute(capability):
    kernel = st.compile(
        gather_then_scale_kernel,
        signature={"ctx": "i64", "base_ptr": "*fp32", "send": "i64", "recv": "i64",
                   "n_bytes": "i64", "status_ptr": "*i32", "BLOCK": "constexpr"},
        capability=capability,
        constexprs={"BLOCK": 128},
    )
    check_linked(kernel, capability, "all_gather")


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_barrier(capability):
    kernel = st.compile(
        barrier_kernel,
        signature={"ctx": "i64", "status_ptr": "*i32"},
        capability=capability,
    )
    ptx = check_linked(kernel, capability, "barrier")
    assert "st.release.sys" in ptx or "st.global.release.sys" in ptx


def test_constants_come_from_the_header():
    header = (Path(st.__file__).resolve().parent / "lib" / "symm.h")
    if not header.is_file():
        header = Path(st.__file__).resolve().parents[2] / "ffi-headers" / "symm.h"
    text = header.read_text()
    assert re.search(rf"symmFloat32 = {st.FLOAT32.value},", text)
    assert re.search(rf"symmAvg = {st.AVG.value},", text)
    assert re.search(rf"symmDeviceTimeout = {st.STATUS_TIMEOUT.value},", text)
    assert st.dtype_code("bf16") == st.BFLOAT16.value
    assert st.op_code("max") == st.MAX.value
    with pytest.raises(ValueError):
        st.dtype_code("complex64")
    with pytest.raises(ValueError):
        st.op_code("xor")


def test_the_decorator_links_the_library_on_every_launch():
    calls = []

    class FakeJit:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

        def warmup(self, *args, **kwargs):
            calls.append(("warmup", args, kwargs))

    kernel = st.requires_symm(FakeJit())
    kernel[(4,)](1, 2, num_warps=4, extern_libs={"mine": "/x.bc"})
    kernel.warmup(3, grid=(1,))
    kernel[(2,)](5, num_warps=16)
    kernel[(2,)](6, maxnreg=None)
    kernel[(2,)](7, maxnreg=96)
    assert calls[0][0] == (4,) and calls[0][1] == (1, 2)
    assert calls[0][2]["extern_libs"] == {"mine": "/x.bc", "symm": st.library()}
    assert calls[0][2]["num_warps"] == 4
    assert calls[1][2]["extern_libs"] == {"symm": st.library()}
    # Every register a thread can have, unless the caller chose (None: ptxas's own cap).
    assert calls[0][2]["maxnreg"] == 255 and calls[1][2]["maxnreg"] == 255
    assert calls[2][2]["maxnreg"] == 128
    assert calls[3][2]["maxnreg"] is None
    assert calls[4][2]["maxnreg"] == 96


def test_no_default_maxnreg_around_an_autotuner():
    # An autotuner's configurations carry their own num_warps / maxnreg: a default added
    # outside it would clash with them (`maxnreg` passed twice).
    calls = []

    @triton.jit
    def kernel(x):
        pass

    tuner = triton.autotune(configs=[triton.Config({}, num_warps=16, maxnreg=64)], key=[])(kernel)
    tuner.run = lambda *args, **kwargs: calls.append(kwargs)
    st.requires_symm(tuner).run(1, grid=(1,))
    assert "maxnreg" not in calls[0] and calls[0]["extern_libs"] == {"symm": st.library()}


def test_default_maxnreg_fills_the_register_file():
    assert [st.default_maxnreg(w) for w in (1, 2, 4, 8, 16, 32)] == [255, 255, 255, 255, 128, 64]


@pytest.mark.parametrize("capability", [80, 90])
def test_the_default_maxnreg_reaches_the_ptx_and_none_opts_out(capability):
    # With `maxnreg=None` the caller gets ptxas's own register cap back: no `.maxnreg`, and
    # (measured with Triton 3.5's ptxas, not asserted, since it is ptxas's heuristic) up to
    # 68 bytes of spills in some (type, operator, target) kernels.
    constexprs = {"op": st.op_code("sum"), "dtype": st.dtype_code("int32")}
    signature = {"ctx": "i64", "local": "i64", "offset": "i64", "n": "i64",
                 "op": "constexpr", "dtype": "constexpr", "status_ptr": "*i32"}
    capped = st.compile(all_reduce_kernel, signature=signature, capability=capability,
                        constexprs=constexprs, options={"maxnreg": None})
    assert ".maxnreg" not in capped.asm["ptx"]
    default = st.compile(all_reduce_kernel, signature=signature, capability=capability,
                         constexprs=constexprs)
    assert re.search(r"^\.maxnreg 255$", default.asm["ptx"], re.M)
    check_linked(default, capability, "int32 sum (default maxnreg)")


def test_library_is_textual_ir_without_the_attribute_old_triton_refuses():
    text = Path(st.library()).read_text()
    assert "nocreateundeforpoison" not in text
    assert '"target-cpu"' not in text
    for symbol in ("symm_all_reduce", "symm_all_gather", "symm_barrier"):
        assert re.search(rf"^define .*@{symbol}\(", text, re.M), symbol


def test_the_triton_example_compiles_for_every_target():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "triton" / "allreduce.py"
    spec = importlib.util.spec_from_file_location("triton_allreduce_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    for capability in CAPABILITIES:
        kernel = st.compile(
            example.all_reduce_kernel,
            signature={"ctx": "i64", "n": "i32", "status_ptr": "*i32", "DTYPE": "constexpr"},
            capability=capability,
            constexprs={"DTYPE": st.FLOAT32.value},
        )
        check_linked(kernel, capability, "Triton example")
