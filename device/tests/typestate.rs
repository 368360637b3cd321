//! Compile tests of the work-stealing typestate: each hardware rule broken in a small program
//! must not compile, with the error checked in next to it; the correct protocol compiles
//! (which also makes trybuild build rather than only check, so the post-monomorphization
//! errors of the drop guards are seen).
//!
//! The drop guards are `const { panic!(..) }` blocks, so rustc reports their errors inside
//! `core` (the `panic!` expansion and `drop_in_place`). It quotes that source only when the
//! toolchain has the `rust-src` component; without it, it points at the `panic!` call in the
//! device crate and quotes nothing from `core`. Those cases therefore have one expectation per
//! situation: `typestate/<case>.stderr` with `rust-src`, `typestate/without-rust-src/` without.
//! Every other case reports its error in the test program or the device crate only.

use std::path::Path;
use std::process::Command;

/// Cases whose expected errors do not depend on the installed components.
const CASES: [&str; 5] = [
    "submit_after_failure",
    "query_before_wait",
    "id_of_failed_response",
    "submit_without_election",
    "use_after_consume",
];

/// Cases rejected by a drop guard (post-monomorphization errors reported inside `core`).
const DROP_GUARD_CASES: [&str; 2] = ["drop_stolen_tile", "drop_request_in_flight"];

/// Whether the compiler trybuild runs will find the standard library's source: the same test
/// rustc makes (`<sysroot>/lib/rustlib/src/rust/library/std/src/lib.rs`, where the `rust-src`
/// component installs it), asked of the same compiler cargo uses (`$RUSTC`, else `rustc`).
fn rust_src_installed() -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let output = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {rustc:?} --print sysroot: {e}"));
    assert!(output.status.success(), "{rustc:?} --print sysroot failed");
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_string();
    Path::new(&sysroot)
        .join("lib/rustlib/src/rust/library/std/src/lib.rs")
        .is_file()
}

#[test]
fn typestate_rules_are_enforced_at_compile_time() {
    let t = trybuild::TestCases::new();
    t.pass("tests/typestate/correct_use.rs");
    for case in CASES {
        t.compile_fail(format!("tests/typestate/{case}.rs"));
    }
    let guards = if rust_src_installed() {
        "tests/typestate"
    } else {
        "tests/typestate/without-rust-src"
    };
    for case in DROP_GUARD_CASES {
        t.compile_fail(format!("{guards}/{case}.rs"));
    }
}
