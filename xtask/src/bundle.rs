//! `cargo xtask gpu-bundle`: what a GPU machine without Rust needs, in one archive.
//!
//! Builds in release the GPU test set and the Rust example's tests as test binaries, `symm-perf`, `libsymm.so` and
//! `libsymm.a`; strips them; builds the C examples against `libsymm.so`; and packs them with
//! the header, the example sources and Makefile, `bench/torch_baseline.py`, `bench/gpu/run.sh`,
//! and, for the Python and Triton checks, the Python package's sources, the Triton library,
//! the Python and Triton examples and `bench/gpu/python_check.py` into
//! `target/gpu-bundle/symm-gpu.tar.xz`. The binaries each embed the
//! same PTX; `xz -9` (64 MiB window) stores it about once. The task fails when the archive is
//! larger than [`MAX_BUNDLE_BYTES`], the most a GPU machine is sent besides the checkout.
//! Beside the archive, where cargo-nextest is installed, it writes the GPU set as a
//! `cargo nextest archive` and the `cargo-nextest` binary (see [`fn@nextest_archive`]).
//!
//! Layout of the archive (top directory `symm-gpu/`):
//!
//! ```text
//! bin/gpu_collectives   tests/tests/gpu_collectives/ (libtest: --list --ignored, --exact …)
//! bin/example_kernels   examples/rust/app/tests/ring.rs: the Rust example's kernels from their
//!                       PTX (`--ignored` runs its `on_a_gpu_*` tests)
//! bin/symm-perf
//! lib/libsymm.so, its SONAME link, lib/libsymm.a
//! ffi-headers/symm.h
//! examples/c/           sources, Makefile, and the examples linked against ../../lib/libsymm.so
//! bench/torch_baseline.py, bench/gpu/run.sh, bench/gpu/python_check.py, torch_symm.py, and the probes
//!                       bench/gpu/floor_probe.cu, host_read_probe.cu and their probe.h
//!                       (run.sh builds them)
//! python/symm/          the package's sources (run.sh adds lib/: libsymm.so, symm.h, the
//!                       Triton library, as an installed package has them)
//! ptx-out/symm_triton.ll, symm_triton_nvshmem.ll, symm_triton_nccl.ll
//! examples/python/allreduce.py, examples/triton/allreduce.py, examples/torch/symmetric_tensors.py
//! python/tests/torch_windows_worker.py
//!                       tensors from symm.torch.mem_pool on CUDA under torchrun (run.sh python)
//! examples/cuda/, ffi-headers/symm_device.cuh, device-lib/symm_device.ptx
//!                       the CUDA C++ device API (run.sh builds the archive and the examples)
//! BUILD-INFO.txt        commit, toolchain, date, files
//! ```

use crate::{cargo, root, run};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Largest archive accepted, in bytes (20 MiB): a device run carries the checkout (about
/// 23 MiB, half of it `ptx-out/`) and the archive, 64 MiB in all ([`MAX_TRANSFER_BYTES`],
/// checked too). The shipped sm_90 SASS took the archive from 12.3 to 16.2 MiB (four binaries
/// embed libsymm); the sm_80 and sm_100a SASS would take it to 21.1 MiB, so the bundle's
/// binaries embed only what the GPU machines (H100, H200) load: [`SASS_ENV`].
pub const MAX_BUNDLE_BYTES: u64 = 20 << 20;
/// The bundle's builds embed the sm_90 SASS only (`SYMM_SASS_TARGETS`, see host-shim's
/// `build.rs`); every other build embeds every target's.
const SASS_ENV: (&str, &str) = ("SYMM_SASS_TARGETS", "sm_90");
/// Most bytes a device run is sent: the checkout (tracked files and untracked ones git does not
/// ignore) plus what it carries (the archive).
pub const MAX_TRANSFER_BYTES: u64 = 64 << 20;
/// Directory of the archive, relative to the workspace root (inside the git-ignored `target/`).
pub const BUNDLE_DIR: &str = "target/gpu-bundle";
/// File name of the archive.
pub const ARCHIVE: &str = "symm-gpu.tar.xz";
/// File name of the nextest archive of the GPU set, beside the bundle.
pub const NEXTEST_ARCHIVE: &str = "gpu-tests.tar.zst";
/// File name of the xz-packed `cargo-nextest` binary, beside the bundle.
pub const NEXTEST_BINARY: &str = "cargo-nextest.xz";
/// Top directory inside the archive.
const TOP: &str = "symm-gpu";
/// Repository files copied as they are, to the same relative path.
const FILES: [&str; 27] = [
    "ffi-headers/symm.h",
    "ffi-headers/symm_device.cuh",
    "examples/cuda/Makefile",
    "examples/cuda/fused.h",
    "examples/cuda/kernel.cu",
    "examples/cuda/device_allreduce.cu",
    "examples/cuda/jit_link.c",
    "examples/c/Makefile",
    "examples/c/common.h",
    "examples/c/allreduce.c",
    "examples/c/allreduce_pthreads.c",
    "examples/c/allreduce_mp.c",
    "examples/c/broadcast.c",
    "examples/c/allreduce_driver.c",
    "examples/c/launch_mp.sh",
    "bench/torch_baseline.py",
    "bench/gpu/run.sh",
    "bench/gpu/python_check.py",
    "bench/gpu/torch_symm.py",
    "bench/gpu/floor_probe.cu",
    "bench/gpu/host_read_probe.cu",
    "bench/gpu/probe.h",
    "examples/python/allreduce.py",
    "examples/triton/allreduce.py",
    "examples/torch/symmetric_tensors.py",
    "python/tests/torch_windows_worker.py",
    "python/pyproject.toml",
];
/// The Python package's directory: its `.py` files and `py.typed` are copied.
const PYTHON_PACKAGE: &str = "python/symm";
/// The C examples the Makefile builds.
const EXAMPLES: [&str; 4] = [
    "allreduce",
    "allreduce_pthreads",
    "allreduce_mp",
    "broadcast",
];

/// Build the bundle and print its size and path.
pub fn build() -> Result<(), String> {
    let root = root();
    run(cargo()
        .args(["build", "--release", "-p", "symm-c", "-p", "symm-perf"])
        .env(SASS_ENV.0, SASS_ENV.1))?;
    let tests = gpu_test_binary("symm-tests", "gpu_collectives")?;
    let example = gpu_test_binary("symm-example", "ring")?;
    // The device library's PTX (run.sh builds the archive with the GPU machine's nvcc).
    crate::device_lib::device_lib(&[])?;

    let dir = root.join(BUNDLE_DIR);
    let stage = dir.join(TOP);
    if stage.exists() {
        std::fs::remove_dir_all(&stage).map_err(|e| format!("removing {stage:?}: {e}"))?;
    }
    for sub in ["bin", "lib"] {
        create_dir(&stage.join(sub))?;
    }
    let release = root.join("target/release");
    strip_into(&tests, &stage.join("bin/gpu_collectives"), "--strip-all")?;
    strip_into(&example, &stage.join("bin/example_kernels"), "--strip-all")?;
    strip_into(
        &release.join("symm-perf"),
        &stage.join("bin/symm-perf"),
        "--strip-all",
    )?;
    strip_into(
        &release.join("libsymm.so"),
        &stage.join("lib/libsymm.so"),
        "--strip-unneeded",
    )?;
    // Programs linked against lib/libsymm.so record its SONAME (the C examples that run.sh
    // rebuilds with CUDA=1): the SONAME link lets them load from lib/.
    let soname = crate::install::soname(env!("CARGO_PKG_VERSION"));
    std::os::unix::fs::symlink("libsymm.so", stage.join("lib").join(&soname))
        .map_err(|e| format!("linking lib/{soname}: {e}"))?;
    strip_into(
        &release.join("libsymm.a"),
        &stage.join("lib/libsymm.a"),
        "--strip-debug",
    )?;
    for file in FILES {
        let to = stage.join(file);
        create_dir(to.parent().expect("a file in a directory"))?;
        // fs::copy keeps the permissions (run.sh stays executable).
        std::fs::copy(root.join(file), &to).map_err(|e| format!("copying {file}: {e}"))?;
    }
    copy_python_package(&root, &stage)?;
    // The Triton libraries as text (`ptx-out/` holds them compressed), where run.sh packages
    // them.
    for (file, _) in crate::ptx::TRITON_LIBRARIES {
        crate::ptx::plain_triton_library(&stage.join("ptx-out"), file)?;
    }
    create_dir(&stage.join("device-lib"))?;
    std::fs::copy(
        crate::device_lib::out_dir().join("symm_device.ptx"),
        stage.join("device-lib/symm_device.ptx"),
    )
    .map_err(|e| format!("copying symm_device.ptx: {e}"))?;
    // The examples against the bundle's libsymm.so, found next to them at run time. Built
    // without CUDA=1 (no CUDA toolkit needed here): they run on the host backend; run.sh
    // rebuilds them with CUDA=1 on the GPU machine.
    let lib = stage.join("lib/libsymm.so");
    run(Command::new("make")
        .arg("-C")
        .arg(stage.join("examples/c"))
        .arg(format!("LIBSYMM={}", lib.display()))
        .arg("LDFLAGS=-Wl,-rpath,'$$ORIGIN/../../lib'"))?;
    for example in EXAMPLES {
        let path = stage.join("examples/c").join(example);
        run(Command::new("strip").arg(&path))?;
    }
    std::fs::write(stage.join("BUILD-INFO.txt"), build_info(&stage)?)
        .map_err(|e| format!("writing BUILD-INFO.txt: {e}"))?;

    // A stale archive must not be carried by mistake when this build fails.
    let archive = dir.join(ARCHIVE);
    if archive.exists() {
        std::fs::remove_file(&archive).map_err(|e| format!("removing {archive:?}: {e}"))?;
    }
    let partial = dir.join(format!("{ARCHIVE}.partial"));
    // xz -9: a 64 MiB dictionary, so the PTX embedded in every binary is stored about once.
    // One thread: one block, the same archive on every machine.
    run(Command::new("tar")
        .env("XZ_OPT", "-9 -T1")
        .arg("--sort=name")
        .args(["--owner=0", "--group=0", "--numeric-owner"])
        .arg("-cJf")
        .arg(&partial)
        .arg("-C")
        .arg(&dir)
        .arg(TOP))?;
    let bytes = std::fs::metadata(&partial)
        .map_err(|e| format!("{partial:?}: {e}"))?
        .len();
    let checkout = checkout_bytes()?;
    if let Err(message) = check_size(bytes, MAX_BUNDLE_BYTES)
        .and_then(|()| check_transfer(checkout, bytes, MAX_TRANSFER_BYTES))
    {
        // Too large to carry: keep nothing at the archive's path.
        std::fs::remove_file(&partial).map_err(|e| format!("removing {partial:?}: {e}"))?;
        let _ = std::fs::remove_file(&archive);
        return Err(message);
    }
    std::fs::rename(&partial, &archive).map_err(|e| format!("renaming {partial:?}: {e}"))?;
    println!(
        "gpu bundle: {} ({bytes} bytes, {:.2} MiB; limit {} MiB)",
        archive.strip_prefix(&root).unwrap_or(&archive).display(),
        bytes as f64 / (1u64 << 20) as f64,
        MAX_BUNDLE_BYTES >> 20
    );
    let nextest = nextest_archive(&dir, checkout + bytes)?;
    println!(
        "gpu bundle: the checkout is {:.2} MiB; with the archive{} {:.2} MiB of the {} MiB a \
         device run is sent",
        checkout as f64 / (1u64 << 20) as f64,
        if nextest > 0 {
            " and the nextest files"
        } else {
            ""
        },
        (checkout + bytes + nextest) as f64 / (1u64 << 20) as f64,
        MAX_TRANSFER_BYTES >> 20
    );
    Ok(())
}

/// The GPU set as GPU runners with cargo-nextest run it (`cargo nextest run --profile gpu`),
/// for a GPU machine without Rust: a `cargo nextest archive` of `gpu_collectives` (release, the
/// bundle's SASS) in [`NEXTEST_ARCHIVE`] and this machine's `cargo-nextest` binary, xz-packed,
/// in [`NEXTEST_BINARY`], both beside the bundle (`bench/gpu/run.sh nextest` runs them).
/// Skipped, with a note, where cargo-nextest is not installed or the files would take the
/// transfer past [`MAX_TRANSFER_BYTES`] (`sent`: the bytes already sent). Returns their bytes.
fn nextest_archive(dir: &Path, sent: u64) -> Result<u64, String> {
    let files = [dir.join(NEXTEST_ARCHIVE), dir.join(NEXTEST_BINARY)];
    for file in &files {
        if file.exists() {
            std::fs::remove_file(file).map_err(|e| format!("removing {file:?}: {e}"))?;
        }
    }
    let Some(binary) = on_path("cargo-nextest") else {
        println!("gpu bundle: cargo-nextest not found: no nextest archive (run.sh tests works)");
        return Ok(0);
    };
    run(cargo()
        .env(SASS_ENV.0, SASS_ENV.1)
        .args(["nextest", "archive", "--cargo-profile", "release"])
        .args([
            "-p",
            "symm-tests",
            "--test",
            "gpu_collectives",
            "--zstd-level",
            "19",
        ])
        .arg("--archive-file")
        .arg(&files[0])
        .current_dir(root()))?;
    let packed =
        std::fs::File::create(&files[1]).map_err(|e| format!("creating {:?}: {e}", files[1]))?;
    run(Command::new("xz")
        .args(["-9", "-T1", "-c"])
        .arg(&binary)
        .stdout(packed))?;
    let mut bytes = 0;
    for file in &files {
        bytes += std::fs::metadata(file)
            .map_err(|e| format!("{file:?}: {e}"))?
            .len();
    }
    if let Err(message) = check_transfer(sent, bytes, MAX_TRANSFER_BYTES) {
        for file in &files {
            std::fs::remove_file(file).map_err(|e| format!("removing {file:?}: {e}"))?;
        }
        println!("gpu bundle: no nextest files: {message}");
        return Ok(0);
    }
    println!(
        "gpu bundle: {BUNDLE_DIR}/{NEXTEST_ARCHIVE} and {BUNDLE_DIR}/{NEXTEST_BINARY} \
         ({:.2} MiB): carry them too for `bench/gpu/run.sh nextest`",
        bytes as f64 / (1u64 << 20) as f64
    );
    Ok(bytes)
}

/// The first executable file named `name` in `$PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Bytes of what a device run copies from the checkout: the files `git ls-files` lists as
/// tracked or untracked-and-not-ignored.
fn checkout_bytes() -> Result<u64, String> {
    let output = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run git ls-files: {e}"))?;
    if !output.status.success() {
        return Err("git ls-files failed".into());
    }
    let root = root();
    Ok(output
        .stdout
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .filter_map(|name| {
            let name = std::ffi::OsStr::from_bytes(name);
            std::fs::symlink_metadata(root.join(name)).ok()
        })
        .filter(|meta| meta.is_file())
        .map(|meta| meta.len())
        .sum())
}

/// Fail when the checkout and the archive together exceed what a device run is sent.
pub fn check_transfer(checkout: u64, archive: u64, limit: u64) -> Result<(), String> {
    if checkout + archive > limit {
        Err(format!(
            "the checkout ({checkout} bytes) and the GPU bundle ({archive} bytes) exceed the \
             {} MiB a device run is sent: shrink the checkout (ptx-out/) or the bundle",
            limit >> 20
        ))
    } else {
        Ok(())
    }
}

/// Fail when an archive of `bytes` is larger than `limit`.
pub fn check_size(bytes: u64, limit: u64) -> Result<(), String> {
    if bytes > limit {
        Err(format!(
            "the GPU bundle is {bytes} bytes, over the limit of {limit} bytes ({} MiB)",
            limit >> 20
        ))
    } else {
        Ok(())
    }
}

/// Build the GPU test set in release without running it; return the test binary's path.
fn gpu_test_binary(package: &str, test: &str) -> Result<PathBuf, String> {
    let output = cargo()
        .env(SASS_ENV.0, SASS_ENV.1)
        .args(["test", "--release", "-p", package, "--test", test])
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start cargo test --no-run: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "building the GPU test set failed: {}",
            output.status
        ));
    }
    test_executable(&String::from_utf8_lossy(&output.stdout), test)
        .ok_or_else(|| format!("cargo reported no {test} test executable"))
}

/// The executable of test target `name` in cargo's JSON messages (one object per line).
pub fn test_executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| m["target"]["name"] == name && m["profile"]["test"] == true)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// Copy `from` to `to` without the parts `strip_flag` names.
fn strip_into(from: &Path, to: &Path, strip_flag: &str) -> Result<(), String> {
    run(Command::new("strip")
        .arg(strip_flag)
        .arg("-o")
        .arg(to)
        .arg(from))
}

fn create_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir:?}: {e}"))
}

/// Output of a command, trimmed; `unknown` when it cannot run.
fn output_of(command: &mut Command) -> String {
    command
        .current_dir(root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string())
}

/// The package's sources ([`PYTHON_PACKAGE`]: `*.py`, `py.typed`), without build products.
fn copy_python_package(root: &Path, stage: &Path) -> Result<(), String> {
    let from = root.join(PYTHON_PACKAGE);
    let to = stage.join(PYTHON_PACKAGE);
    create_dir(&to)?;
    let entries = std::fs::read_dir(&from).map_err(|e| format!("reading {from:?}: {e}"))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some(name) = name.filter(|n| n.ends_with(".py") || n == "py.typed") else {
            continue;
        };
        if path.is_file() {
            std::fs::copy(&path, to.join(&name)).map_err(|e| format!("copying {path:?}: {e}"))?;
        }
    }
    Ok(())
}

fn build_info(stage: &Path) -> Result<String, String> {
    let commit = output_of(Command::new("git").args(["rev-parse", "HEAD"]));
    let dirty =
        output_of(Command::new("git").args(["status", "--porcelain", "--untracked-files=no"]));
    let mut info = format!(
        "symm GPU bundle (cargo xtask gpu-bundle)\n\
         commit: {commit}{}\n\
         built: {}\n\
         toolchain: {}\n\
         embedded SASS: {} (other GPUs JIT-compile the PTX)\n\n\
         run on the GPU machine, from the repository root: bench/gpu/run.sh <part> [this archive]\n\n\
         files (bytes, uncompressed):\n",
        if dirty.is_empty() || dirty == "unknown" {
            ""
        } else {
            " (with uncommitted changes)"
        },
        output_of(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])),
        output_of(Command::new("rustc").arg("--version")),
        SASS_ENV.1,
    );
    let mut files = Vec::new();
    list_files(stage, stage, &mut files)?;
    files.sort();
    for (path, bytes) in files {
        info += &format!("{bytes:>12}  {path}\n");
    }
    Ok(info)
}

fn list_files(base: &Path, dir: &Path, out: &mut Vec<(String, u64)>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {dir:?}: {e}"))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.is_dir() {
            list_files(base, &path, out)?;
        } else {
            let bytes = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
            let relative = path.strip_prefix(base).unwrap_or(&path);
            out.push((relative.display().to_string(), bytes));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_limit_is_enforced() {
        assert!(check_size(MAX_BUNDLE_BYTES, MAX_BUNDLE_BYTES).is_ok());
        assert!(check_size(1, MAX_BUNDLE_BYTES).is_ok());
        let error = check_size(MAX_BUNDLE_BYTES + 1, MAX_BUNDLE_BYTES).unwrap_err();
        assert!(error.contains("over the limit"), "{error}");
        assert_eq!(MAX_BUNDLE_BYTES, 20 * 1024 * 1024);
    }

    #[test]
    fn the_transfer_limit_counts_checkout_and_archive() {
        let mib = 1u64 << 20;
        assert!(check_transfer(41 * mib, 16 * mib, MAX_TRANSFER_BYTES).is_ok());
        assert!(check_transfer(48 * mib, 16 * mib, MAX_TRANSFER_BYTES).is_ok());
        let error = check_transfer(48 * mib, 16 * mib + 1, MAX_TRANSFER_BYTES).unwrap_err();
        assert!(error.contains("64 MiB"), "{error}");
        // The checkout this test runs in is counted, and is not empty.
        assert!(checkout_bytes().unwrap() > mib);
    }

    #[test]
    fn finds_the_test_executable_in_cargo_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"symm_tests","kind":["lib"]},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","target":{"name":"gpu_collectives","kind":["test"]},"profile":{"test":true},"executable":"/w/target/release/deps/gpu_collectives-0123"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            test_executable(messages, "gpu_collectives"),
            Some(PathBuf::from("/w/target/release/deps/gpu_collectives-0123"))
        );
        assert_eq!(test_executable(messages, "abi_errors"), None);
    }

    #[test]
    fn every_bundled_file_exists() {
        for file in FILES {
            assert!(root().join(file).is_file(), "{file} is missing");
        }
    }
}
