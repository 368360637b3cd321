//! The Python package (`python/`): `cargo xtask wheel` and `cargo xtask pytest`.
//!
//! * `wheel` builds `libsymm.so` in release, then a platform wheel of the package carrying it,
//!   `ffi-headers/symm.h` and the Triton library (`ptx-out/symm_triton.ll.gz`, decompressed), into `<target>/wheels/` (cargo's
//!   target directory: `target/` unless `CARGO_TARGET_DIR` says otherwise). A machine without
//!   Rust installs it with `pip install symm-*.whl`.
//! * `pytest` creates a virtual environment in `<target>/python-venv` (once), installs the package
//!   from `python/` (which builds `libsymm.so` through cargo), NumPy and pytest, and runs
//!   `python/tests` on the host backend; then, in `<target>/torch-venv` (once) with PyTorch, the
//!   torch.distributed backend's tests and the array tests that use PyTorch tensors.
//!
//! The interpreter is `$PYTHON`, else `python3`.

use crate::{cargo, root, run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Python interpreter that builds and tests the package.
pub fn python() -> Command {
    Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string()))
}

/// Build `libsymm.so` in release; return its path (cargo's own report, so `CARGO_TARGET_DIR`
/// is honoured).
pub(crate) fn build_library() -> Result<PathBuf, String> {
    let output = cargo()
        .args(["build", "--release", "-p", "symm-c"])
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start cargo build: {e}"))?;
    if !output.status.success() {
        return Err(format!("building libsymm.so failed: {}", output.status));
    }
    shared_library(&String::from_utf8_lossy(&output.stdout), "symm")
        .ok_or_else(|| "cargo reported no libsymm.so".to_string())
}

/// The shared library (`.so`) of library target `name` in cargo's JSON messages.
pub fn shared_library(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .filter_map(|m| m["filenames"].as_array().cloned())
        .flatten()
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.extension().is_some_and(|e| e == "so"))
}

/// Cargo's target directory, from the path of a release artifact in it.
fn target_dir(library: &Path) -> Result<PathBuf, String> {
    library
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("{library:?} is not inside a target directory"))
}

/// `cargo xtask wheel`.
pub fn wheel() -> Result<(), String> {
    let library = build_library()?;
    let wheels = target_dir(&library)?.join("wheels");
    std::fs::create_dir_all(&wheels).map_err(|e| format!("creating {wheels:?}: {e}"))?;
    for old in wheel_files(&wheels)? {
        std::fs::remove_file(&old).map_err(|e| format!("removing {old:?}: {e}"))?;
    }
    run(python()
        .args(["-m", "pip", "wheel", "./python", "--no-deps", "--wheel-dir"])
        .arg(&wheels)
        .env("SYMM_LIBRARY", &library))?;
    let built = wheel_files(&wheels)?;
    let [wheel] = built.as_slice() else {
        return Err(format!("expected one wheel in {wheels:?}, found {built:?}"));
    };
    let mut expected = vec![
        "symm/lib/libsymm.so".to_string(),
        "symm/lib/symm.h".to_string(),
        "symm/py.typed".to_string(),
    ];
    // The Triton-linkable device libraries (from `ptx-out/`).
    for (file, _) in crate::ptx::TRITON_LIBRARIES {
        expected.push(format!("symm/lib/{file}"));
    }
    // List the wheel (a zip) with the standard library's zipfile and check what it carries.
    let listing = python()
        .args([
            "-c",
            "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
        ])
        .arg(wheel)
        .output()
        .map_err(|e| format!("cannot list {wheel:?}: {e}"))?;
    let names = String::from_utf8_lossy(&listing.stdout);
    for file in &expected {
        if !names.lines().any(|line| line == file) {
            return Err(format!("{wheel:?} lacks {file}"));
        }
    }
    let bytes = std::fs::metadata(wheel).map(|m| m.len()).unwrap_or(0);
    println!(
        "wheel: {} ({:.1} MiB), carrying {}",
        wheel.display(),
        bytes as f64 / (1 << 20) as f64,
        expected.join(", ")
    );
    Ok(())
}

/// The `symm-*.whl` files in `dir`.
fn wheel_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {dir:?}: {e}"))?;
    let mut wheels: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("symm-") && n.ends_with(".whl"))
        })
        .collect();
    wheels.sort();
    Ok(wheels)
}

/// `cargo xtask pytest`.
pub fn pytest() -> Result<(), String> {
    let library = build_library()?;
    let venv = target_dir(&library)?.join("python-venv");
    let venv_python = venv.join("bin/python");
    if !venv_python.is_file() {
        run(python().args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(&venv_python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "./python",
        "pytest",
        "numpy",
    ]))?;
    run(Command::new(&venv_python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "python/tests",
        ])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_HOST_MODE", "fast"))?;
    discard_venv_if_asked(&venv)?;
    torch_tests(&library)
}

/// PyTorch of the torch.distributed backend's tests. PyPI's Linux wheel is built for CUDA and
/// brings NVIDIA's runtime wheels (about 5 GiB installed); its CPU tensors run on the host
/// backend here.
const TORCH: &str = "torch==2.15.0";

/// The torch.distributed backend's tests (`python/tests/test_torch.py`,
/// `test_torch_windows.py` and `test_torch_adopt.py`: torchrun with 2 to 4 processes; `test_torch_suite.py`: cases of
/// PyTorch's own `DistributedTest`) in `<target>/torch-venv`, made once with PyTorch, NumPy,
/// pytest and expecttest; the package
/// is installed into it from `python/` with the library just built.
fn torch_tests(library: &Path) -> Result<(), String> {
    let venv = target_dir(library)?.join("torch-venv");
    let venv_python = venv.join("bin/python");
    if !venv_python.is_file() {
        run(python().args(["-m", "venv"]).arg(&venv))?;
    }
    let has_torch = Command::new(&venv_python)
        .args(["-c", "import torch, expecttest"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_torch {
        run(Command::new(&venv_python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            // About 5 GiB installed: no second copy in pip's cache.
            "--no-cache-dir",
            TORCH,
            "numpy",
            "pytest",
            // PyTorch's own distributed test suite imports it (`test_torch_suite.py`).
            "expecttest",
        ]))?;
    }
    run(Command::new(&venv_python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--force-reinstall",
            "./python",
        ])
        .env("SYMM_LIBRARY", library))?;
    run(Command::new(&venv_python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "python/tests/test_torch.py",
            "python/tests/test_torch_suite.py",
            "python/tests/test_torch_windows.py",
            "python/tests/test_torch_adopt.py",
            "python/tests/test_arrays.py",
        ])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_HOST_MODE", "fast"))?;
    discard_venv_if_asked(&venv)
}

/// With `SYMM_DISCARD_VENVS=1` (set by CI, whose clean clone reuses nothing), remove the virtual
/// environment `venv` once its tests passed, so that the torch environment (about 5 GiB) and
/// the Triton ones (about 0.9 GiB each) do not all sit on the disk for the rest of the run.
pub fn discard_venv_if_asked(venv: &Path) -> Result<(), String> {
    if std::env::var_os("SYMM_DISCARD_VENVS").is_some_and(|v| v == "1") {
        std::fs::remove_dir_all(venv).map_err(|e| format!("removing {venv:?}: {e}"))?;
        println!("removed {} (SYMM_DISCARD_VENVS=1)", venv.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_shared_library_in_cargo_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"symm_device","kind":["lib"]},"filenames":["/w/target/release/libsymm_device.rlib"]}
{"reason":"compiler-artifact","target":{"name":"symm","kind":["staticlib","cdylib","rlib"]},"filenames":["/w/target/release/libsymm.a","/w/target/release/libsymm.so","/w/target/release/libsymm.rlib"]}
{"reason":"build-finished","success":true}"#;
        let library = shared_library(messages, "symm");
        assert_eq!(library, Some(PathBuf::from("/w/target/release/libsymm.so")));
        assert_eq!(
            target_dir(&library.unwrap()).unwrap(),
            PathBuf::from("/w/target")
        );
        assert_eq!(shared_library(messages, "symm_device"), None);
    }

    #[test]
    fn the_package_sources_exist() {
        for file in [
            "python/pyproject.toml",
            "python/setup.py",
            "python/symm/__init__.py",
        ] {
            assert!(root().join(file).is_file(), "{file} is missing");
        }
    }
}
