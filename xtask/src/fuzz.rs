//! `cargo xtask fuzz`: the `abi_sequence` fuzz target of `fuzz/` (cargo fuzz, libFuzzer,
//! AddressSanitizer and LeakSanitizer).
//!
//! * `--replay` — run every input of `fuzz/corpus/abi_sequence/` once.
//! * `--time SECONDS` — fuzz for that long, starting from the corpus (new inputs go to a
//!   scratch directory in the target directory, crashes to `fuzz/artifacts/abi_sequence/`).
//! * `--seeds` — (re)write the generated seed inputs into the corpus.
//!
//! cargo fuzz needs nightly-only compiler flags (`-Zsanitizer=address`); the pinned stable
//! toolchain accepts them with `RUSTC_BOOTSTRAP=1`, which is set for the fuzz crate only. A
//! missing `cargo-fuzz` is installed with `cargo install --locked` (into `~/.cargo/bin`).

use crate::{cargo, root, run};
use std::path::PathBuf;
use std::process::Command;

const TARGET: &str = "abi_sequence";

/// Where the fuzz crate builds: `$CARGO_TARGET_DIR/fuzz`, else `target/fuzz`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("fuzz")
}

fn corpus() -> PathBuf {
    root().join("fuzz/corpus").join(TARGET)
}

/// `cargo fuzz …` in `fuzz/`, with the fuzz crate's target directory.
fn cargo_fuzz() -> Command {
    let mut command = cargo();
    command
        .arg("fuzz")
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", target_dir());
    command
}

fn ensure_cargo_fuzz() -> Result<(), String> {
    let installed = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if installed {
        return Ok(());
    }
    run(cargo().args(["install", "cargo-fuzz", "--locked"]))
}

/// Run `cargo fuzz run` from `fuzz/` on the corpus with `libfuzzer_args`; new inputs go to a
/// scratch directory, never into the checked-in corpus.
fn fuzz_run(libfuzzer_args: &[String]) -> Result<(), String> {
    let scratch = target_dir().join("scratch-corpus");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("creating {scratch:?}: {e}"))?;
    let mut command = cargo_fuzz();
    command
        .args(["run", TARGET])
        .arg(&scratch)
        .arg(corpus())
        .arg("--")
        .args(["-timeout=60", "-max_len=1024", "-print_final_stats=1"])
        .args(libfuzzer_args);
    let status = command
        .current_dir(root().join("fuzz"))
        .status()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "the fuzz target failed ({status}); the input is in fuzz/artifacts/{TARGET}/ (see \
             docs/DEVELOPING.md, section Fuzzing)"
        ))
    }
}

/// `cargo xtask fuzz --replay | --time SECONDS | --seeds`.
pub fn fuzz(args: &[String]) -> Result<(), String> {
    let usage = "usage: cargo xtask fuzz --replay | --time SECONDS | --seeds";
    match args.first().map(String::as_str) {
        Some("--replay") => {
            ensure_cargo_fuzz()?;
            fuzz_run(&["-runs=0".to_string()])
        }
        Some("--time") => {
            let seconds: u64 = args
                .get(1)
                .and_then(|s| s.parse().ok())
                .filter(|s| *s > 0)
                .ok_or_else(|| usage.to_string())?;
            ensure_cargo_fuzz()?;
            fuzz_run(&[format!("-max_total_time={seconds}")])
        }
        Some("--seeds") => {
            let mut command = cargo();
            command
                .args(["run", "--release", "--bin", "abi_sequence_seeds", "--"])
                .arg(corpus())
                .env("CARGO_TARGET_DIR", target_dir())
                .current_dir(root().join("fuzz"));
            let status = command
                .status()
                .map_err(|e| format!("cannot start {command:?}: {e}"))?;
            if status.success() {
                Ok(())
            } else {
                Err(format!("{command:?} failed: {status}"))
            }
        }
        _ => Err(usage.to_string()),
    }
}
