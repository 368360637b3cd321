//! `SYMM_ALGO` and `SYMM_DEBUG=INFO`, observed from outside: the test re-runs this binary's
//! ignored child test in a new process with the variables set, and reads what it logged.

use std::process::Command;
use symm_tests::*;

fn run_child(algo: &str) -> (bool, String) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_all_reduce_with_logging",
            "--nocapture",
        ])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_DEBUG", "INFO")
        .env("SYMM_ALGO", algo)
        .output()
        .expect("re-running the test binary");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn symm_algo_forces_the_algorithm_and_symm_debug_logs_each_pick() {
    let (ok, log) = run_child("twoshot");
    assert!(ok, "{log}");
    assert!(
        log.contains(
            "symm INFO rank 0: all_reduce 1000 x Float32 Sum (4000 B) -> two_shot_all_reduce"
        ),
        "{log}"
    );
    assert!(log.contains("symm INFO rank 1:"), "{log}");
    assert!(log.contains("predicted"), "{log}");
    let (ok, log) = run_child("oneshot");
    assert!(ok, "{log}");
    assert!(log.contains("-> one_shot_all_reduce"), "{log}");
    let (ok, log) = run_child("ring");
    assert!(!ok);
    assert!(log.contains("SYMM_ALGO=\"ring\""), "{log}");
}

#[test]
#[ignore = "child process of symm_algo_forces_the_algorithm_and_symm_debug_logs_each_pick"]
fn child_all_reduce_with_logging() {
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4000);
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        unsafe { write_f32(b.base, &vec![r as f32 + 1.0; 1000]) };
    }
    check(symm::symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        check(all_reduce_f32_sum(b.comm, b.base, b.base, 1000), b.comm);
    }
    check(symm::symmGroupEnd(), std::ptr::null_mut());
    for b in &buffers {
        // SAFETY: host memory of the window.
        assert_eq!(unsafe { read_f32(b.base, 1000) }, vec![3.0; 1000]);
    }
    teardown(buffers);
}
