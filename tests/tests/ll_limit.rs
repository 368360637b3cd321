//! `SYMM_ALGO=ll` with a payload over the low-latency buffers: a clear error from the call
//! (never a panic, never a launch); payloads that fit still run. Observed in a child process
//! (this binary re-run with the variable set).

use std::process::Command;
use symm::*;
use symm_tests::*;

#[test]
fn forced_ll_over_its_limit_is_a_clear_error() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_forced_ll", "--nocapture"])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_ALGO", "ll")
        .output()
        .expect("re-running the test binary");
    let log = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{log}");
    assert!(
        log.contains("SYMM_ALGO=ll") && log.contains("low-latency"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
#[ignore = "child process of forced_ll_over_its_limit_is_a_clear_error"]
fn child_forced_ll() {
    let comms = init_all(2);
    let count = 1 << 13; // 32 KiB of float32: over the 16 KiB LL buffers
    let buffers = alloc_windows(&comms, 4 * count);
    // Refused on every rank (one thread drives both, so in a group): the group is refused as
    // a whole, and the communicator stays usable.
    check(symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        let r = all_reduce_f32_sum(b.comm, b.base, b.base, count);
        assert_eq!(r, symmResult_t::symmInvalidArgument);
    }
    assert_eq!(
        symmGroupEnd(),
        symmResult_t::symmInvalidArgument,
        "{}",
        last_error(buffers[0].comm)
    );
    println!("{}", last_error(buffers[0].comm));
    // A payload that fits runs.
    check(symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        check(all_reduce_f32_sum(b.comm, b.base, b.base, 256), b.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    teardown(buffers);
}
