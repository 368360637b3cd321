"""Compile tests of Triton kernels that call symm's device functions: no GPU needed.

For every target (sm_80, sm_90, sm_100a) the kernels are compiled by ``triton.compile`` with
the library linked, then the PTX is checked: no unresolved external function, the device
function's code is there, and ptxas (the one Triton bundles) reports no spills and no stack
frame. Also what ``symm.triton`` does around a launch (linking, ``maxnreg``, the co-residency
check), with Triton's launcher replaced by a fake. CI runs this file under the oldest supported
Triton (3.5) and the newest.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import symm  # noqa: E402
import symm.triton as st  # noqa: E402

CAPABILITIES = [80, 90, 100]
# The every-dtype-and-op matrix's targets (all by default). CI compiles each target's matrix
# under one Triton: sm_80 and sm_100a under the newest, sm_90 under the oldest (every other
# test still covers every target under both).
MATRIX_CAPABILITIES = [
    int(c) for c in os.environ.get("SYMM_TRITON_MATRIX_CAPABILITIES", "80,90,100").split(",")
]
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "bfloat16", "float8e4m3", "float8e5m2"]
OPS = ["sum", "prod", "max", "min", "avg"]


#: Compile for real: a private, empty Triton cache (conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_triton_cache")


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


@pytest.mark.parametrize("capability", MATRIX_CAPABILITIES)
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


#: An H100 SXM's limits (`st.device_limits` on one): 132 SMs, 64 Ki registers, 2048 threads,
#: 32 programs and 228 KiB of shared memory per SM, 1 KiB of it reserved per program.
H100 = st.DeviceLimits(
    multiprocessors=132,
    registers_per_multiprocessor=65536,
    max_threads_per_multiprocessor=2048,
    max_blocks_per_multiprocessor=32,
    shared_memory_per_multiprocessor=228 * 1024,
    reserved_shared_memory_per_block=1024,
)


class FakeCompiled:
    """Stands for Triton's ``CompiledKernel``: what the co-residency check reads."""

    def __init__(self, n_regs, shared, num_warps):
        self.name = "fake_kernel"
        self.metadata = SimpleNamespace(shared=shared, num_warps=num_warps)
        self._n_regs = n_regs

    def _init_handles(self):
        # As Triton's: loading the module is what gives the register count.
        self.n_regs = self._n_regs


class FakeJit:
    """Stands for a ``JITFunction``: ``run`` compiles (a :class:`FakeCompiled` that uses
    ``n_regs`` registers, or ``maxnreg`` if lower, and ``shared`` bytes) and, unless warming up,
    launches; every call is recorded."""

    def __init__(self, n_regs=255, shared=0):
        self.n_regs, self.shared = n_regs, shared
        self.calls = []

        def signature(ctx, n, BLOCK=128):
            pass

        self.signature = inspect.signature(signature)

    def run(self, *args, grid, warmup, **kwargs):
        self.calls.append(("compile" if warmup else "launch", grid, args, kwargs))
        n_regs = min(self.n_regs, kwargs.get("maxnreg") or 255)
        return FakeCompiled(n_regs, self.shared, kwargs.get("num_warps") or 4)

    def warmup(self, *args, **kwargs):
        self.calls.append(("warmup", None, args, kwargs))

    def launches(self):
        return [call for call in self.calls if call[0] == "launch"]


@pytest.fixture
def h100(monkeypatch):
    """Launches see device 0, an H100 (no GPU is touched)."""
    monkeypatch.setattr(st, "_current_device", lambda: 0)
    monkeypatch.setattr(st, "device_limits", lambda device: H100)


def test_the_decorator_links_the_library_on_every_launch(h100):
    fake = FakeJit()
    kernel = st.requires_symm(fake)
    kernel[(4,)](1, 2, num_warps=4, extern_libs={"mine": "/x.bc"})
    kernel.warmup(3, grid=(1,))
    kernel[(2,)](5, num_warps=16)
    kernel[(2,)](6, maxnreg=None)
    kernel[(2,)](7, maxnreg=96)
    calls = [(grid, args, kwargs) for what, grid, args, kwargs in fake.calls if what != "compile"]
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


def test_programs_per_sm_from_registers_warps_and_threads():
    # 255 registers (default_maxnreg up to 8 warps, all used): 8192 per warp, 2 warps in each
    # of the SM's four 16 Ki-register sub-partitions, so 8 warps per SM.
    assert st.programs_per_multiprocessor(255, 0, 4, H100).programs_per_multiprocessor == 2
    eight = st.programs_per_multiprocessor(255, 0, 8, H100)
    assert eight.programs_per_multiprocessor == 1
    assert eight.limited_by.startswith("registers: 255 per thread, 8192 per warp: 8 warps")
    # Rounding: 100 registers take 3328 (13 units of 256) per warp, so 4 warps per
    # sub-partition, not 5.
    assert st.programs_per_multiprocessor(100, 0, 4, H100).programs_per_multiprocessor == 4
    # Sub-partitions: 200 registers (6400 per warp) fit 2 warps in each 16 Ki quarter, so 8 per
    # SM, not the 10 the whole register file would hold.
    assert st.programs_per_multiprocessor(200, 0, 2, H100).programs_per_multiprocessor == 4
    # Few registers: the SM's 2048 threads bound it, then its 32 programs.
    threads = st.programs_per_multiprocessor(24, 0, 4, H100)
    assert threads == (16, "threads: 128 per program, of the SM's 2048")
    assert st.programs_per_multiprocessor(16, 0, 1, H100) == (32, "at most 32 programs per SM")


def test_programs_per_sm_from_shared_memory():
    # 64 registers at 4 warps leave room for 8 programs; 100 KiB of shared memory (plus the
    # 1 KiB reserve) for 2, 150 KiB for 1.
    assert st.programs_per_multiprocessor(64, 0, 4, H100).programs_per_multiprocessor == 8
    shared = st.programs_per_multiprocessor(64, 100 * 1024, 4, H100)
    assert shared.programs_per_multiprocessor == 2
    assert shared.limited_by == "shared memory: 102400 bytes per program plus 1024 reserved, of the SM's 233472"
    assert st.programs_per_multiprocessor(64, 150 * 1024, 4, H100).programs_per_multiprocessor == 1
    # Two programs of 114 KiB would fit the SM's 228 KiB, but not with 1 KiB reserved for each.
    assert st.programs_per_multiprocessor(64, 114 * 1024, 4, H100).programs_per_multiprocessor == 1
    # 4 ranks x 66 programs fit the 264 slots; 67 do not, though registers alone would allow it.
    st.check_co_residency(66, 4, 64, 100 * 1024, 4, H100)
    st.check_co_residency(67, 4, 64, 0, 4, H100)
    with pytest.raises(symm.CoResidencyError, match=r"132 SMs x 2 per SM = 264 fit \(shared memory"):
        st.check_co_residency(67, 4, 64, 100 * 1024, 4, H100)


def test_co_residency_refuses_what_cannot_all_be_resident():
    # The review's case: 4 ranks x 64 programs at 8 warps and 255 registers need 256 SMs.
    with pytest.raises(symm.CoResidencyError) as refused:
        st.check_co_residency(64, 4, 255, 0, 8, H100, kernel="all_reduce_kernel on device 0")
    error = refused.value
    assert isinstance(error, symm.InvalidUsageError) and error.code == symm.Result.symmInvalidUsage
    message = str(error)
    for part in ("all_reduce_kernel on device 0", "64 programs per rank x 4 ranks on this GPU = 256",
                 "132 SMs x 1 per SM = 132 fit", "registers: 255 per thread", "SYMM_TIMEOUT_MS",
                 "Launch at most 33 programs per rank", "num_warps", "maxnreg", "shared memory"):
        assert part in message, (part, message)
    # Up to the limit it is accepted: 4 x 33 at 8 warps, and 8 ranks x 8 programs at 4 warps.
    st.check_co_residency(33, 4, 255, 0, 8, H100)
    with pytest.raises(symm.CoResidencyError):
        st.check_co_residency(34, 4, 255, 0, 8, H100)
    st.check_co_residency(8, 8, 255, 0, 4, H100)
    # One rank alone on the GPU: its own programs must fit too.
    st.check_co_residency(64, 1, 255, 0, 8, H100)
    with pytest.raises(symm.CoResidencyError, match="Put at most 132 ranks on this GPU"):
        st.check_co_residency(1, 133, 255, 0, 8, H100)
    with pytest.raises(symm.CoResidencyError, match="Not one program fits on an SM"):
        st.check_co_residency(1, 1, 255, 0, 16, H100)


def test_device_limits_come_from_the_driver(monkeypatch):
    # A stand-in for libcuda: each CUdevice_attribute (numbers from cuda.h) as on an H100.
    attributes = {16: 132, 82: 65536, 39: 2048, 106: 32, 81: 233472, 111: 1024}

    class FakeDriver:
        bad_ordinal = 7

        def cuInit(self, flags):
            return 0

        def cuDeviceGet(self, device, ordinal):
            device._obj.value = ordinal
            return 101 if ordinal == self.bad_ordinal else 0  # CUDA_ERROR_INVALID_DEVICE

        def cuDeviceGetAttribute(self, value, attribute, device):
            value._obj.value = attributes[attribute]
            return 0

    monkeypatch.setattr(st.ctypes, "CDLL", lambda name: FakeDriver())
    read = st.device_limits.__wrapped__  # not the cache
    assert read(0) == H100
    with pytest.raises(symm.UnhandledCudaError, match="cuDeviceGet failed with CUresult 101"):
        read(FakeDriver.bad_ordinal)


def test_the_check_reads_what_triton_provides():
    # What `SymmKernel.run` and the check take from Triton, on a real compiled kernel (its
    # `n_regs` appears when `_init_handles` loads it on a GPU).
    for name in ("grid", "warmup"):
        assert inspect.signature(triton.JITFunction.run).parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(barrier_kernel.fn.signature.parameters) == ["ctx", "status_ptr"]
    kernel = st.compile(barrier_kernel, signature={"ctx": "i64", "status_ptr": "*i32"},
                        capability=90, options={"num_warps": 8})
    assert callable(kernel._init_handles) and kernel.name == "barrier_kernel"
    assert kernel.metadata.num_warps == 8 and kernel.metadata.shared >= 0


@pytest.fixture
def four_ranks_on_device_0():
    """The windows of a 4-rank communicator whose ranks this process created on device 0."""
    comms = symm.Comm.init_all([0, 0, 0, 0])
    buffers = [comm.alloc(4096) for comm in comms]
    with symm.group():
        windows = [comm.register(buffer) for comm, buffer in zip(comms, buffers)]
    yield windows
    for comm in comms:
        comm.destroy()


def test_a_launch_is_checked_before_it_runs(h100, four_ranks_on_device_0):
    ctx = four_ranks_on_device_0[0].device_context
    fake = FakeJit(n_regs=255)
    kernel = st.requires_symm(fake)
    # 4 ranks share device 0 (the window's communicator says so): 64 programs at 8 warps are
    # refused after the compile, and nothing is launched.
    with pytest.raises(symm.CoResidencyError, match="64 programs per rank x 4 ranks"):
        kernel[(64,)](ctx, 1, num_warps=8)
    assert [what for what, *_ in fake.calls] == ["compile"] and not fake.launches()
    # The context given by name, the grid as a function of the arguments: the same.
    with pytest.raises(symm.CoResidencyError, match="34 programs per rank x 4 ranks"):
        kernel[lambda meta: (meta["n"],)](n=34, ctx=ctx, num_warps=8)
    assert not fake.launches()
    # What fits is compiled, checked, then launched with the same arguments and options.
    kernel[(33,)](ctx, 1, num_warps=8)
    kernel[lambda meta: (meta["n"] // meta["BLOCK"],)](ctx, 33 * 128, num_warps=8)
    assert [what for what, *_ in fake.calls[-4:]] == ["compile", "launch", "compile", "launch"]
    assert fake.calls[-4][1:] == fake.calls[-3][1:]
    # Fewer registers per thread: more programs per SM (64 regs at 8 warps: 4 per SM).
    kernel[(64,)](ctx, 1, num_warps=8, maxnreg=64)
    # Without a window's context among the arguments, the rank is counted alone.
    kernel[(64,)](12345, 1, num_warps=8)
    assert len(fake.launches()) == 4
    # A warm-up only compiles: not checked.
    kernel.warmup(ctx, 1, grid=(64,), num_warps=8)


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
    native = Path(st.library()).read_text()
    engines = {engine: Path(st.library(engine)).read_text() for engine in ("nvshmem", "nccl")}
    for text in (native, *engines.values()):
        assert "nocreateundeforpoison" not in text
        assert '"target-cpu"' not in text
    for symbol in ("all_reduce", "all_gather", "barrier"):
        assert re.search(rf"^define .*@symm_{symbol}\(", native, re.M), symbol
        for engine, text in engines.items():
            # Each engine's library defines its own functions and none of the native ones,
            # so that a kernel links both libraries; its dispatching all-reduce calls the
            # native library's (the largest function, not copied).
            for name in (f"symm_{engine}_{symbol}", f"symm_dispatch_{engine}_{symbol}"):
                assert re.search(rf"^define .*@{name}\(", text, re.M), name
            assert not re.search(rf"^define .*@symm_{symbol}\(", text, re.M), (engine, symbol)
    for engine, text in engines.items():
        assert re.search(r"^declare .*@symm_all_reduce\(", text, re.M), engine


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
