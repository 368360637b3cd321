//! `cargo xtask triton-test`: the Triton compile tests (`python/tests/test_triton_compile.py`,
//! and `test_triton_engines.py` with NCCL's and NVSHMEM's device bitcode) under the oldest
//! supported Triton and the newest, each in its own virtual environment under `target/triton/`
//! (created once; PyPI wheels bundle ptxas, no GPU or torch needed). The engines' bitcode files
//! are read out of their wheels on PyPI with range requests, not the wheels downloaded
//! (`xtask/scripts/fetch_wheel_members.py`), into `target/engine-bitcode/` (once).

use crate::{root, run};
use std::path::Path;
use std::process::Command;

/// The Triton versions CI compiles against: the oldest supported (what PyTorch 2.9–2.11 ship
/// is 3.5 / 3.6) and the newest on PyPI when this list was last updated.
pub const TRITON_VERSIONS: [&str; 2] = ["3.5.0", "3.9.0"];

/// The engines' device bitcode the engine tests link, as `package==version:member`: NCCL's
/// newest, and NVSHMEM's newest for each LLVM the Tritons of [`TRITON_VERSIONS`] hold (3.8.0's
/// is LLVM 22.1, which Triton 3.9's LLVM 24 reads and Triton 3.5's LLVM 22.0 does not; 3.7.2's
/// is LLVM 21.1) and the oldest with bitcode of one file (3.3.20, LLVM 18).
pub const ENGINE_BITCODE: [&str; 4] = [
    "nvidia-nccl-cu13==2.32.3:nvidia/nccl/lib/libnccl_device.bc",
    "nvidia-nvshmem-cu13==3.8.0:nvidia/nvshmem/lib/libnvshmem_device_sm_90.bc",
    "nvidia-nvshmem-cu13==3.7.2:nvidia/nvshmem/lib/libnvshmem_device_sm_90.bc",
    "nvidia-nvshmem-cu12==3.3.20:nvidia/nvshmem/lib/libnvshmem_device.bc",
];

/// Read [`ENGINE_BITCODE`]'s files out of their wheels into `target/engine-bitcode/` (kept
/// between runs); the folder.
fn fetch_engine_bitcode() -> Result<std::path::PathBuf, String> {
    let out = root().join("target/engine-bitcode");
    run(crate::python::python()
        .arg(root().join("xtask/scripts/fetch_wheel_members.py"))
        .arg(&out)
        .args(ENGINE_BITCODE))?;
    Ok(out)
}

/// Run the compile tests under every version of [`TRITON_VERSIONS`].
pub fn test() -> Result<(), String> {
    // Importing the package loads libsymm (the compile tests themselves need only the header
    // and the Triton library, which the package decompresses from ptx-out/symm_triton*.ll.gz).
    let library = crate::python::build_library()?;
    let bitcode = fetch_engine_bitcode()?;
    for version in TRITON_VERSIONS {
        let venv = root().join("target/triton").join(version);
        let python = venv.join("bin/python");
        ensure_venv(&venv, &python, version)?;
        println!("== Triton {version}: compile tests");
        // Each test compiles Triton kernels that link the library (one core each): the tests
        // run on every core (pytest-xdist).
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let mut pytest = Command::new(&python);
        // The every-dtype-and-op matrix (most of the compile time) covers every target once:
        // sm_80 and sm_100a under the newest Triton, sm_90 under the older ones (the other
        // tests still compile for every target under every version).
        let newest = version == TRITON_VERSIONS[TRITON_VERSIONS.len() - 1];
        pytest.env(
            "SYMM_TRITON_MATRIX_CAPABILITIES",
            if newest { "80,100" } else { "90" },
        );
        run(pytest
            .args(["-m", "pytest", "-q", "-n", &workers.to_string()])
            .arg("python/tests/test_triton_compile.py")
            .arg("python/tests/test_triton_engines.py")
            .env("SYMM_TEST_ENGINE_BITCODE", &bitcode)
            // The package from the checkout, with the library just built.
            .env("PYTHONPATH", root().join("python"))
            .env("SYMM_LIBRARY", &library)
            .env("TRITON_CACHE_DIR", venv.join("cache")))?;
        crate::python::discard_venv_if_asked(&venv)?;
    }
    Ok(())
}

/// What a ready environment holds besides Triton (recorded in its `.ready` marker, so that an
/// environment made before this list changed is completed).
const PACKAGES: [&str; 3] = ["pytest", "pytest-xdist", "numpy"];

/// A virtual environment at `venv` with `triton==version` and [`PACKAGES`].
fn ensure_venv(venv: &Path, python: &Path, version: &str) -> Result<(), String> {
    let ready = venv.join(".ready");
    let marker = format!("{version} {}", PACKAGES.join(" "));
    if std::fs::read_to_string(&ready).is_ok_and(|held| held == marker) {
        return Ok(());
    }
    let system_python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    run(Command::new(system_python).args(["-m", "venv"]).arg(venv))?;
    run(Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            // About 0.9 GiB installed: no second copy in pip's cache.
            "--no-cache-dir",
            &format!("triton=={version}"),
        ])
        .args(PACKAGES))?;
    std::fs::write(&ready, marker).map_err(|e| format!("writing {ready:?}: {e}"))
}
