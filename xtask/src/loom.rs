//! `cargo xtask test`'s loom step: the synchronization protocols of the device crate (cross-rank
//! barrier, grid barrier, LL lines, PAT step flags, software work source, point-to-point
//! pairing) model-checked with loom, one test file per protocol (`device/tests/loom_*.rs`).

use crate::cargo;

/// The loom test files, one per protocol: every `device/tests/loom_*.rs`, so that a new
/// protocol's model runs as soon as its file exists.
fn protocols() -> Result<Vec<String>, String> {
    let dir = crate::root().join("device/tests");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| Some(name.strip_suffix(".rs")?.to_owned()))
        .filter(|name| name.starts_with("loom_"))
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(format!("no loom_*.rs in {}", dir.display()));
    }
    Ok(names)
}

/// Run the loom tests in release mode with `--cfg loom`, in their own target directory so that
/// the normal build cache keeps its flags.
pub fn run() -> Result<(), String> {
    let mut command = cargo();
    command.args(["test", "-p", "symm-device", "--release"]);
    for protocol in protocols()? {
        command.args(["--test", &protocol]);
    }
    crate::run(
        command
            .args(["--target-dir", "target/loom"])
            .env("RUSTFLAGS", "--cfg loom"),
    )
}
