//! `cargo xtask ptx`: PTX per target, Triton bitcode, and the ptxas report.

use crate::{cargo, root};
#[path = "../../host-shim/src/ptx/split.rs"]
mod split;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (target-cpu, file written in ptx-out/).
const TARGETS: [(&str, &str); 3] = [
    ("sm_80", "symm_sm80.ptx"),
    ("sm_90", "symm_sm90.ptx"),
    ("sm_100a", "symm_sm100a.ptx"),
];
/// Target of the bitcode handed to Triton.
const BITCODE_TARGET: (&str, &str) = ("sm_90", "symm_sm90.bc");

pub fn generate(check: bool) -> Result<(), String> {
    let root = root();
    let out_dir = if check {
        root.join("target/ptx/check")
    } else {
        root.join("ptx-out")
    };
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let ptxas = find_ptxas()?;

    let mut failures = Vec::new();
    for (cpu, file) in TARGETS {
        let built = build_device(cpu, false)?;
        let dest = out_dir.join(file);
        std::fs::copy(&built, &dest).map_err(|e| format!("copying {built:?}: {e}"))?;
        failures.extend(assemble(&ptxas, cpu, &dest)?);
        assemble_each_kernel(&ptxas, cpu, &dest)?;
    }
    let (cpu, file) = BITCODE_TARGET;
    let built = build_device(cpu, true)?;
    std::fs::copy(&built, out_dir.join(file)).map_err(|e| format!("copying {built:?}: {e}"))?;

    if !failures.is_empty() {
        return Err(format!(
            "kernels with spills or a stack frame: {failures:?}"
        ));
    }
    if check {
        for name in TARGETS.iter().map(|t| t.1).chain([BITCODE_TARGET.1]) {
            let fresh = std::fs::read(out_dir.join(name)).map_err(|e| e.to_string())?;
            let committed = std::fs::read(root.join("ptx-out").join(name)).unwrap_or_default();
            if fresh != committed {
                return Err(format!(
                    "ptx-out/{name} differs from a fresh build: run `cargo xtask ptx` and commit"
                ));
            }
        }
        println!("ptx-out/ is up to date");
    }
    Ok(())
}

/// Build the device crate for `cpu`; return the PTX, or the fat-LTO bitcode when `bitcode`.
fn build_device(cpu: &str, bitcode: bool) -> Result<PathBuf, String> {
    let kind = if bitcode { "bc" } else { "ptx" };
    let target_dir = root().join(format!("target/ptx/{kind}_{cpu}"));
    let mut command = cargo();
    command
        .args(["rustc", "-p", "symm-device", "--release", "--quiet"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .args(["--crate-type", "cdylib", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "-C", &format!("target-cpu={cpu}")])
        // Nightly-only device features (abi_ptx, stdarch_nvptx, asm_experimental_arch) are
        // enabled for this build alone.
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if bitcode {
        command
            .arg("--emit=llvm-bc")
            .env("CARGO_PROFILE_RELEASE_LTO", "fat");
    }
    crate::run(&mut command)?;
    let release = target_dir.join("nvptx64-nvidia-cuda/release");
    Ok(if bitcode {
        release.join("deps/symm_device.bc")
    } else {
        release.join("symm_device.ptx")
    })
}

/// ptxas from `$PTXAS`, the PATH, or the pip cache that `.ci/run` fills.
fn find_ptxas() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("PTXAS") {
        return Ok(PathBuf::from(path));
    }
    let cache = std::env::var("SYMM_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/symm")
        });
    let candidates = [
        cache.join("nvcc/nvidia/cu13/bin/ptxas"),
        cache.join("nvcc/nvidia/cuda_nvcc/bin/ptxas"),
    ];
    if let Some(found) = candidates.iter().find(|p| p.exists()) {
        return Ok(found.clone());
    }
    if Command::new("ptxas").arg("--version").output().is_ok() {
        return Ok(PathBuf::from("ptxas"));
    }
    Err(format!(
        "ptxas not found: `python3 -m pip install --target {}/nvcc nvidia-cuda-nvcc` or set PTXAS",
        cache.display()
    ))
}

/// Cut every kernel of `ptx` into its own module, as libsymm loads them, and check that ptxas
/// accepts each one (on every core).
fn assemble_each_kernel(ptxas: &Path, cpu: &str, ptx: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(ptx).map_err(|e| format!("reading {ptx:?}: {e}"))?;
    let index = split::PtxIndex::new(&text);
    let kernels = index.kernels();
    let dir = root().join("target/ptx/kernels").join(cpu);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let errors: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut errors = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(kernel) = kernels.get(i) else { break };
                        let module = index.kernel_module(kernel).expect("listed kernel");
                        let file = dir.join(format!("{kernel}.ptx"));
                        let checked = std::fs::write(&file, module)
                            .map_err(|e| e.to_string())
                            .and_then(|()| {
                                Command::new(ptxas)
                                    .args([&format!("-arch={cpu}"), "-o", "/dev/null"])
                                    .arg(&file)
                                    .output()
                                    .map_err(|e| e.to_string())
                            });
                        match checked {
                            Ok(out) if out.status.success() => {}
                            Ok(out) => errors.push(format!(
                                "{cpu} {kernel}: {}",
                                String::from_utf8_lossy(&out.stderr)
                            )),
                            Err(e) => errors.push(format!("{cpu} {kernel}: {e}")),
                        }
                    }
                    errors
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    if !errors.is_empty() {
        return Err(format!(
            "per-kernel modules rejected by ptxas:\n{}",
            errors.join("\n")
        ));
    }
    println!(
        "{cpu:>8}: all {} per-kernel modules assemble on their own",
        kernels.len()
    );
    Ok(())
}

/// Assemble `ptx` for `cpu`, print per-kernel resources, and return the kernels that spill or
/// have a stack frame.
fn assemble(ptxas: &Path, cpu: &str, ptx: &Path) -> Result<Vec<String>, String> {
    let output = Command::new(ptxas)
        .args(["-v", &format!("-arch={cpu}"), "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| format!("running {ptxas:?}: {e}"))?;
    let log = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("ptxas rejected {}:\n{log}", ptx.display()));
    }
    let mut failures = Vec::new();
    let mut entry: Option<String> = None;
    let mut frame_and_spills = (0u64, 0u64);
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().map(str::to_string);
        } else if line.contains("bytes stack frame") {
            let numbers: Vec<u64> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            if let [frame, stores, loads, ..] = numbers[..] {
                frame_and_spills = (frame, stores + loads);
            }
        } else if let (Some(name), Some(rest)) = (&entry, line.split("Used ").nth(1)) {
            let registers = rest.split_whitespace().next().unwrap_or("?");
            let (frame, spills) = frame_and_spills;
            println!(
                "{cpu:>8} {name}: {registers} registers, {spills} spill bytes, {frame} bytes stack frame"
            );
            if frame > 0 || spills > 0 {
                failures.push(format!("{cpu}:{name}"));
            }
            entry = None;
            frame_and_spills = (0, 0);
        }
    }
    Ok(failures)
}
