//! `cargo xtask test`'s loom step: the synchronization protocols of the device crate (cross-rank
//! barrier, LL lines, PAT step flags, software work source, point-to-point pairing)
//! model-checked with loom, one test file per protocol (`device/tests/loom_*.rs`).

use crate::cargo;

/// The loom test files, one per protocol.
const PROTOCOLS: [&str; 5] = [
    "loom_barrier",
    "loom_ll",
    "loom_scheduler",
    "loom_pat",
    "loom_p2p",
];

/// Run the loom tests in release mode with `--cfg loom`, in their own target directory so that
/// the normal build cache keeps its flags.
pub fn run() -> Result<(), String> {
    let mut command = cargo();
    command.args(["test", "-p", "symm-device", "--release"]);
    for protocol in PROTOCOLS {
        command.args(["--test", protocol]);
    }
    crate::run(
        command
            .args(["--target-dir", "target/loom"])
            .env("RUSTFLAGS", "--cfg loom"),
    )
}
