"""Triton kernels that call symm's device functions and an engine's (NCCL's, NVSHMEM's), linked
with that engine's device bitcode next to symm's library, compiled for sm_90 without a GPU:
NCCL's newest bitcode, and NVSHMEM's newest that the installed Triton's LLVM reads; bitcode too
new for it refused with a clear error before Triton's own ("Failed to parse library"); and the
module initialization a launch of an NVSHMEM-linked kernel needs.

The bitcode files come from ``$SYMM_TEST_ENGINE_BITCODE`` (``cargo xtask triton-test`` reads
them out of the engines' wheels into ``target/engine-bitcode/<package>-<version>/``); without it
the tests that need them are skipped, which CI never does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton.language import core  # noqa: E402

import symm  # noqa: E402
import symm.triton as st  # noqa: E402

BITCODE = os.environ.get("SYMM_TEST_ENGINE_BITCODE")
needs_bitcode = pytest.mark.skipif(not BITCODE, reason="SYMM_TEST_ENGINE_BITCODE is not set")
NCCL = "nvidia-nccl-cu13-2.32.3/libnccl_device.bc"
#: NVSHMEM's bitcode files, newest first.
NVSHMEM = [
    "nvidia-nvshmem-cu13-3.8.0/libnvshmem_device_sm_90.bc",
    "nvidia-nvshmem-cu13-3.7.2/libnvshmem_device_sm_90.bc",
    "nvidia-nvshmem-cu12-3.3.20/libnvshmem_device.bc",
]


#: Compile for real: a private, empty Triton cache (conftest.py).
pytestmark = pytest.mark.usefixtures("fresh_triton_cache")


def bitcode(name: str) -> str:
    path = Path(BITCODE) / name
    assert path.is_file(), f"{path} is missing: run cargo xtask triton-test"
    return str(path)


@core.extern
def nvshmem_my_pe(_semantic=None):
    return core.extern_elementwise("", "", [], {(): ("nvshmem_my_pe", core.int32)}, is_pure=True, _semantic=_semantic)


@core.extern
def nccl_lsa_pointer(window, offset, peer, _semantic=None):
    args = [core.cast(window, core.int64, _semantic=_semantic), core.cast(offset, core.int64, _semantic=_semantic),
            core.cast(peer, core.int32, _semantic=_semantic)]
    return core.extern_elementwise(
        "", "", args, {(core.int64, core.int64, core.int32): ("ncclGetLsaPointer", core.int64)},
        is_pure=True, _semantic=_semantic,
    )


@st.jit(engines=("nvshmem",))
def with_nvshmem(ctx, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32)
    tl.store(status_ptr + tl.program_id(0), status + nvshmem_my_pe())


@st.jit(engines=("nccl",))
def with_nccl(ctx, window, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32)
    peer = nccl_lsa_pointer(window, 0, 1)
    tl.store(status_ptr + tl.program_id(0), status + (peer != 0).to(tl.int32))


@st.jit(engines=("nvshmem",))
def nvshmem_only(ctx, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32, st.BACKEND_NVSHMEM)
    status |= st.all_gather(ctx, 0, 64, n, st.BACKEND_NVSHMEM)
    status |= st.barrier(ctx, st.BACKEND_NVSHMEM)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit(engines=("nvshmem",))
def dispatching(ctx, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32)
    status |= st.all_gather(ctx, 0, 64, n)
    status |= st.barrier(ctx)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit(engines=("nvshmem",))
def native_only_beside_nvshmem(ctx, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32, st.BACKEND_NATIVE)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit
def nvshmem_hint_without_nvshmem(ctx, n, status_ptr):
    tl.store(status_ptr, st.barrier(ctx, st.BACKEND_NVSHMEM))


@st.jit
def nccl_hint_without_nccl(ctx, n, status_ptr):
    tl.store(status_ptr, st.barrier(ctx, st.BACKEND_NCCL))


@st.jit(engines=("nccl",))
def nccl_only(ctx, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32, st.BACKEND_NCCL)
    status |= st.all_gather(ctx, 0, 64, n, st.BACKEND_NCCL)
    status |= st.barrier(ctx, st.BACKEND_NCCL)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit(engines=("nccl",))
def dispatching_nccl(ctx, n, status_ptr):
    status = st.all_reduce(ctx, 0, 0, n, st.SUM, st.FLOAT32)
    status |= st.barrier(ctx)
    tl.store(status_ptr + tl.program_id(0), status)


@st.jit(engines=("nccl",))
def native_only_beside_nccl(ctx, n, status_ptr):
    tl.store(status_ptr, st.barrier(ctx, st.BACKEND_NATIVE))


@st.jit(engines=("nccl", "nvshmem"))
def default_beside_both_engines(ctx, n, status_ptr):
    tl.store(status_ptr, st.barrier(ctx))


SIGNATURE = {"ctx": "i64", "n": "i64", "status_ptr": "*i32"}
#: In the PTX of a kernel whose calls reach NCCL's GIN: its put's implementation (namespace
#: ``nccl::gin``, named by the assertions it keeps).
GIN_MARKER = "_ZN4nccl3gin"


def linked(kernel) -> str:
    """The kernel's PTX, checked: every function resolved, a cubin, symm's collective there
    (its cross-rank waits are system-scope acquire loads)."""
    ptx = kernel.asm["ptx"]
    # PTX's system calls (NVSHMEM's assertions and prints) are the driver's, not unresolved.
    unresolved = [
        line for line in re.findall(r"\.extern \.func[^\n]*", ptx)
        if not re.search(r"\b(vprintf|__assertfail|malloc|free)\s*$", line)
    ]
    assert not unresolved, unresolved
    assert kernel.asm.get("cubin"), "no cubin"
    assert "ld.acquire.sys" in ptx or "ld.global.acquire.sys" in ptx
    return ptx


def readable(path: str) -> bool:
    made_by = st.bitcode_llvm_version(path)
    return made_by is not None and made_by[:2] <= st.triton_llvm_version()[:2]


def test_the_llvm_versions_are_read() -> None:
    reader = st.triton_llvm_version()
    assert reader[0] >= 20, reader
    expected = {"3.5.0": (22, 0), "3.9.0": (24, 0)}.get(triton.__version__)
    if expected:
        assert reader[:2] == expected, (triton.__version__, reader)


@needs_bitcode
def test_a_kernel_links_symm_and_nccl_s_device_bitcode() -> None:
    assert st.bitcode_llvm_version(bitcode(NCCL)) == (20, 1, 8)
    kernel = st.compile(
        with_nccl,
        signature={"ctx": "i64", "window": "i64", "n": "i64", "status_ptr": "*i32"},
        capability=90,
        engines={"nccl": bitcode(NCCL)},
    )
    ptx = linked(kernel)
    # NCCL's LSA pointer arithmetic is there, inlined: the window's lsaFlatBase and stride.
    assert "ncclGetLsaPointer" not in re.findall(r"\.extern[^\n]*", ptx).__str__()


@needs_bitcode
def test_a_kernel_links_symm_and_the_newest_nvshmem_this_triton_reads() -> None:
    versions = {name: st.bitcode_llvm_version(bitcode(name)) for name in NVSHMEM}
    assert versions == {NVSHMEM[0]: (22, 1, 8), NVSHMEM[1]: (21, 1, 0), NVSHMEM[2]: (18, 1, 1)}, versions
    newest = next(name for name in NVSHMEM if readable(bitcode(name)))
    # What CI's Tritons read: 3.9's LLVM 24 the newest NVSHMEM, 3.5's LLVM 22.0 not 3.8's 22.1.
    expected = {"3.5.0": NVSHMEM[1], "3.9.0": NVSHMEM[0]}.get(triton.__version__)
    if expected:
        assert newest == expected, (triton.__version__, newest)
    kernel = st.compile(
        with_nvshmem,
        signature={"ctx": "i64", "n": "i64", "status_ptr": "*i32"},
        capability=90,
        engines={"nvshmem": bitcode(newest)},
    )
    ptx = linked(kernel)
    # NVSHMEM's device state, which nvshmemx_cumodule_init fills at load time, is in the module.
    assert "nvshmemi_device_state_d" in ptx


@needs_bitcode
def test_bitcode_too_new_for_this_triton_is_refused_clearly(tmp_path: Path) -> None:
    too_new = [name for name in NVSHMEM if not readable(bitcode(name))]
    if too_new:  # Triton 3.5: NVSHMEM 3.8's LLVM 22.1 bitcode
        path = bitcode(too_new[0])
        with pytest.raises(symm.UnsupportedError, match=r"newer than the LLVM .* of Triton"):
            st.engine_library("nvshmem", path)
        # Without the check, Triton's own error does not say why.
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        with pytest.raises(Exception, match="Failed to parse library"):
            triton.compile(
                ASTSource(fn=with_nvshmem.fn, signature={"ctx": "i64", "n": "i64", "status_ptr": "*i32"}),
                target=GPUTarget("cuda", 90, 32),
                options={"extern_libs": (("symm", st.library()), ("libnvshmem_device", path))},
            )
    # Bitcode from a future LLVM, whatever the Triton: refused before compiling, by name.
    future = tmp_path / "libnvshmem_device.bc"
    future.write_bytes(b"BC\xc0\xde" + b"\0" * 64 + b"clang version 99.1.0" + b"\0" * 64)
    with pytest.raises(symm.UnsupportedError, match=r"made by LLVM 99\.1\.0, newer than .* or a newer Triton") as error:
        st.compile(with_nvshmem, signature={"ctx": "i64", "n": "i64", "status_ptr": "*i32"}, capability=90,
                   engines={"nvshmem": str(future)})
    assert str(future) in str(error.value)


def test_engine_libraries_are_found_or_refused_by_name(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(symm.InvalidArgumentError, match="engine 'gin'"):
        st.engine_library("gin")
    with pytest.raises(symm.InvalidArgumentError, match="engine 'gin'"):
        st.requires_symm(with_nccl.fn, engines=("gin",))
    with pytest.raises(symm.InvalidArgumentError, match="no such file"):
        st.engine_library("nccl", str(tmp_path / "absent.bc"))
    old = tmp_path / "libnccl_device.bc"
    old.write_bytes(b"BC\xc0\xde" + b"clang version 18.1.1")
    monkeypatch.setenv("SYMM_NCCL_DEVICE_LIBRARY", str(old))
    assert st.engine_library("nccl") == str(old)
    libs = st.extern_libs(("nccl",))
    assert libs["libnccl_device"] == str(old)
    # symm's NCCL functions are linked beside its native library, and only with NCCL.
    assert libs["symm"] == st.library() and libs["symm_nccl"] == st.library("nccl")
    assert Path(libs["symm_nccl"]).name == "symm_triton_nccl.ll"
    assert st.extern_libs() == {"symm": st.library()}
    # A library named by SYMM_TRITON_LIBRARY brings its engines' libraries from its folder.
    alone = tmp_path / "alone" / "symm_triton.ll"
    alone.parent.mkdir()
    shutil.copyfile(st.library(), alone)
    monkeypatch.setenv("SYMM_TRITON_LIBRARY", str(alone))
    assert st.extern_libs() == {"symm": str(alone)}
    with pytest.raises(FileNotFoundError, match=r"no symm_triton_nccl\.ll beside it"):
        st.extern_libs(("nccl",))


def test_an_nvshmem_kernel_s_module_is_initialized_once(tmp_path: Path, monkeypatch) -> None:
    """``nvshmemx_cumodule_init`` on the module before the first launch, once per module,
    through the host library this process loaded (here a stand-in that records the call)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        pytest.skip("no C compiler")
    source = Path(__file__).resolve().parents[2] / "tests" / "fakes" / "fake_engines.c"
    library = tmp_path / "libfake_engines.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
    monkeypatch.setenv("SYMM_NVSHMEM_LIBRARY", str(library))
    import ctypes

    fake = ctypes.CDLL(str(library), mode=os.RTLD_GLOBAL)
    fake.fake_engine_last_module.restype = ctypes.c_void_p
    compiled = SimpleNamespace(module=0x5EED, name="k", _init_handles=lambda: None)
    st._NVSHMEM_MODULES.discard(0x5EED)
    st._init_nvshmem_module(compiled)
    st._init_nvshmem_module(compiled)
    assert fake.fake_engine_module_inits() == 1 and fake.fake_engine_last_module() == 0x5EED
    failing = SimpleNamespace(module=0xBAD, name="k", _init_handles=lambda: None)
    monkeypatch.setenv("FAKE_ENGINE_MODULE_INIT_FAILS", "1")
    with pytest.raises(symm.UnsupportedError, match="nvshmemx_cumodule_init of k's module returned 7"):
        st._init_nvshmem_module(failing)


@needs_bitcode
def test_backend_hints_compile_the_paths_they_name() -> None:
    """BACKEND_NVSHMEM compiles the engine protocol (calls into NVSHMEM's put-with-signal); the
    default hint with NVSHMEM linked compiles both protocols and dispatches on the tag;
    BACKEND_NATIVE beside NVSHMEM's bitcode calls none of NVSHMEM's functions."""
    newest = bitcode(next(name for name in NVSHMEM if readable(bitcode(name))))
    engines = {"nvshmem": newest}
    put = "nvshmemi_transfer_put_signal"  # NVSHMEM's internal function (3.7 and 3.8 names)
    engine_path = linked(st.compile(nvshmem_only, signature=SIGNATURE, capability=90, engines=engines))
    assert put in engine_path
    both = linked(st.compile(dispatching, signature=SIGNATURE, capability=90, engines=engines))
    assert put in both and len(both) > len(engine_path)
    native = linked(st.compile(native_only_beside_nvshmem, signature=SIGNATURE, capability=90, engines=engines))
    assert put not in native and "call" not in re.sub(r"//[^\n]*", "", native)


@needs_bitcode
def test_nccl_hints_compile_the_gin_path() -> None:
    """BACKEND_NCCL compiles the engine protocol through NCCL's GIN (its put and signal calls
    resolved in NCCL's bitcode, the kernel a cubin); the default hint with NCCL linked compiles
    both protocols; BACKEND_NATIVE beside NCCL's bitcode calls none of GIN."""
    engines = {"nccl": bitcode(NCCL)}
    engine_path = linked(st.compile(nccl_only, signature=SIGNATURE, capability=90, engines=engines))
    assert GIN_MARKER in engine_path
    both = linked(st.compile(dispatching_nccl, signature=SIGNATURE, capability=90, engines=engines))
    assert GIN_MARKER in both
    native = linked(st.compile(native_only_beside_nccl, signature=SIGNATURE, capability=90, engines=engines))
    assert GIN_MARKER not in native


def test_hints_that_cannot_compile_are_refused_by_name() -> None:
    with pytest.raises(Exception, match=r"BACKEND_NVSHMEM needs NVSHMEM's device bitcode linked"):
        st.compile(nvshmem_hint_without_nvshmem, signature=SIGNATURE, capability=90)
    with pytest.raises(Exception, match=r"BACKEND_NCCL needs NCCL's device bitcode linked"):
        st.compile(nccl_hint_without_nccl, signature=SIGNATURE, capability=90)


@needs_bitcode
def test_the_default_hint_beside_two_engines_is_refused() -> None:
    newest = bitcode(next(name for name in NVSHMEM if readable(bitcode(name))))
    with pytest.raises(Exception, match=r"links the device bitcode of nccl and nvshmem; .* pass BACKEND_NVSHMEM or BACKEND_NCCL"):
        st.compile(default_beside_both_engines, signature=SIGNATURE, capability=90,
                   engines={"nccl": bitcode(NCCL), "nvshmem": newest})
