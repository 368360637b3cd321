//! `SYMM_ALGO` and `SYMM_DEBUG=INFO`, observed from outside: the test re-runs this binary's
//! ignored child test in a new process with the variables set, and reads what it logged.

use symm_tests::*;

fn run_child(algo: &str) -> (bool, String) {
    run_child_test("child_all_reduce_with_logging", algo)
}

fn run_child_test(test: &str, algo: &str) -> (bool, String) {
    let output = rerun_ignored_test(test, &[("SYMM_ALGO", algo)]);
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
            "[0] symm INFO plan: all_reduce 1000 x Float32 Sum (4000 B) -> two_shot_all_reduce"
        ),
        "{log}"
    );
    assert!(log.contains("[1] symm INFO plan:"), "{log}");
    assert!(log.contains("predicted"), "{log}");
    let (ok, log) = run_child("oneshot");
    assert!(ok, "{log}");
    assert!(log.contains("-> one_shot_all_reduce"), "{log}");
    let (ok, log) = run_child("ring");
    assert!(!ok);
    assert!(log.contains("SYMM_ALGO=\"ring\""), "{log}");
}

/// `SYMM_ALGO=pat` through the C ABI: all-gather and reduce-scatter run PAT (at 3 ranks, where
/// the model would not pick it), all-reduce ignores the value, and every result is right.
#[test]
fn symm_algo_pat_forces_pat_for_all_gather_and_reduce_scatter() {
    let (ok, log) = run_child_test("child_pat_collectives_with_logging", "pat");
    assert!(ok, "{log}");
    assert!(
        log.contains("all_gather 1000 x Float32 Sum (4000 B) -> pat_all_gather"),
        "{log}"
    );
    assert!(
        log.contains("reduce_scatter 1000 x Float32 Sum (4000 B) -> pat_reduce_scatter"),
        "{log}"
    );
    assert!(
        log.contains("all_reduce 1000 x Float32 Sum (4000 B) -> "),
        "{log}"
    );
    assert!(
        !log.contains("all_reduce 1000 x Float32 Sum (4000 B) -> pat"),
        "{log}"
    );
    // Without SYMM_ALGO the model keeps the direct kernels at 3 ranks.
    let (ok, log) = run_child_test("child_pat_collectives_with_logging", "auto");
    assert!(ok, "{log}");
    assert!(!log.contains("-> pat_"), "{log}");
}

#[test]
#[ignore = "child process of symm_algo_pat_forces_pat_for_all_gather_and_reduce_scatter"]
fn child_pat_collectives_with_logging() {
    const NRANKS: usize = 3;
    const COUNT: usize = 1000;
    let comms = init_all(NRANKS);
    // Layout of each window: send [0, NRANKS·COUNT) floats, receive after it.
    let bytes = 2 * NRANKS * COUNT * 4;
    let buffers = alloc_windows(&comms, bytes);
    let input = |rank: usize, i: usize| (rank * 7919 + i) as f32;
    for (r, b) in buffers.iter().enumerate() {
        let values: Vec<f32> = (0..NRANKS * COUNT).map(|i| input(r, i)).collect();
        // SAFETY: host memory of the window.
        unsafe { write_f32(b.base, &values) };
    }
    let recv = |b: &RankBuffer| b.base.wrapping_add(NRANKS * COUNT * 4);
    let f32_type = symm::symmDataType_t::symmFloat32 as i32;
    let sum = symm::symmRedOp_t::symmSum as i32;
    // All-gather of each rank's first COUNT floats.
    check(symm::symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        let result = symm::symmAllGather(
            b.base.cast(),
            recv(b).cast(),
            COUNT,
            f32_type,
            b.comm,
            std::ptr::null_mut(),
        );
        check(result, b.comm);
    }
    check(symm::symmGroupEnd(), std::ptr::null_mut());
    for b in &buffers {
        // SAFETY: host memory of the window.
        let got = unsafe { read_f32(recv(b), NRANKS * COUNT) };
        for (i, v) in got.iter().enumerate() {
            assert_eq!(*v, input(i / COUNT, i % COUNT), "all-gather index {i}");
        }
    }
    // Reduce-scatter of the whole send buffer (exact: small integers in f32).
    check(symm::symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        let result = symm::symmReduceScatter(
            b.base.cast(),
            recv(b).cast(),
            COUNT,
            f32_type,
            sum,
            b.comm,
            std::ptr::null_mut(),
        );
        check(result, b.comm);
    }
    check(symm::symmGroupEnd(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { read_f32(recv(b), COUNT) };
        for (i, v) in got.iter().enumerate() {
            let expected: f32 = (0..NRANKS).map(|s| input(s, r * COUNT + i)).sum();
            assert_eq!(*v, expected, "reduce-scatter rank {r} index {i}");
        }
    }
    // An all-reduce on the same window.
    check(symm::symmGroupStart(), std::ptr::null_mut());
    for b in &buffers {
        check(all_reduce_f32_sum(b.comm, b.base, recv(b), COUNT), b.comm);
    }
    check(symm::symmGroupEnd(), std::ptr::null_mut());
    for b in &buffers {
        // SAFETY: host memory of the window.
        let got = unsafe { read_f32(recv(b), COUNT) };
        for (i, v) in got.iter().enumerate() {
            let expected: f32 = (0..NRANKS).map(|s| input(s, i)).sum();
            assert_eq!(*v, expected, "all-reduce index {i}");
        }
    }
    teardown(buffers);
}

#[test]
#[ignore = "child process of symm_algo_forces_the_algorithm_and_symm_debug_logs_each_pick"]
fn child_all_reduce_with_logging() {
    two_rank_grouped_all_reduces(1);
}
