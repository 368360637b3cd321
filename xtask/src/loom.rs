//! `cargo xtask test`'s loom step: the synchronization protocols of the device crate (cross-rank
//! barrier, LL lines, PAT step flags, software work source) model-checked with loom.

use crate::cargo;

/// Run the loom tests (`device/tests/loom.rs`) in release mode with `--cfg loom`, in their own
/// target directory so that the normal build cache keeps its flags.
pub fn run() -> Result<(), String> {
    crate::run(
        cargo()
            .args([
                "test",
                "-p",
                "symm-device",
                "--release",
                "--test",
                "loom",
                "--target-dir",
                "target/loom",
            ])
            .env("RUSTFLAGS", "--cfg loom"),
    )
}
