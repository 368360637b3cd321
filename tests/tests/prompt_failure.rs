//! A failure reaches every rank at once, not at the timeout: a rank that finds the
//! communicator failed (a mismatched or refused call, its own wait that ran out) makes every
//! peer's pending collective and next call fail well within a second, with the cause and the
//! rank that found it — also for ranks of other processes, whose waits are bounded by a
//! timeout far longer than the test allows.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`), where an enqueued call's failure is the
//! communicator's asynchronous error once its stream's work is done.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// The bound of every wait in the tests that must not reach it: 20 s, or
/// `SYMM_TEST_LONG_TIMEOUT_MS` (a mutation check that expects the bound to be reached).
fn long_timeout_ms() -> u64 {
    std::env::var("SYMM_TEST_LONG_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}
/// How soon every rank must have failed once one rank found the failure.
const PROMPT: Duration = Duration::from_millis(1000);
/// Elements of the window.
const COUNT: usize = 1024;
/// The environment variable that makes this binary a rank process.
const CHILD_ENV: &str = "SYMM_PROMPT_CHILD";

/// Join `id` as `rank` of `nranks` and register a window of `COUNT` f32.
fn join(id: symmUniqueId, rank: usize, nranks: usize) -> (symmComm_t, *mut c_void, symmWindow_t) {
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, nranks as i32, id, rank as i32) },
        null_mut(),
    );
    let (buffer, window) = window_of_bytes(comm, COUNT * 4);
    (comm, buffer, window)
}

/// Teardown after a failure: destroy must succeed.
fn leave(comm: symmComm_t, buffer: *mut c_void, window: symmWindow_t) {
    let _ = symmCommWindowDeregister(comm, window);
    let _ = symmMemFree(comm, buffer);
    check(symmCommDestroy(comm), null_mut());
}

/// One rank's part of a scenario: the call that fails, its result, time and message.
fn failing_call(scenario: &str, comm: symmComm_t, buffer: *mut c_void, rank: usize) -> RankOutcome {
    let f32_ = symmDataType_t::symmFloat32 as i32;
    let sum = symmRedOp_t::symmSum as i32;
    let stream = RankStream::new();
    let s = stream.handle();
    if scenario == "refusal_then_leave" && rank == 0 {
        // Rank 1 refuses its call and destroys its communicator before rank 0 makes its own.
        std::thread::sleep(Duration::from_millis(500));
    }
    // The ranks left `join` together: from here their times compare.
    let started = Instant::now();
    if scenario == "count" && rank == 1 {
        // Rank 0 is waiting in its collective when rank 1's call finds the mismatch: only the
        // failure rank 1 raises ends rank 0's wait before its bound (were both calls on record
        // before either compared, each would find the mismatch itself).
        std::thread::sleep(Duration::from_millis(500));
    }
    let result = match (scenario, rank) {
        // Rank 1 all-reduces half as much as rank 0.
        ("count", _) => {
            let count = if rank == 1 { COUNT / 2 } else { COUNT };
            symmAllReduce(buffer, buffer, count, f32_, sum, comm, s)
        }
        // Rank 1's call, inside its group, is refused (its receive buffer is NULL).
        ("group_refusal" | "refusal_then_leave", 1) => {
            check(symmGroupStart(), null_mut());
            let refused = symmAllReduce(buffer, null_mut(), COUNT, f32_, sum, comm, s);
            // The group's end reports the refusal again (nothing of the group was launched).
            let ended = symmGroupEnd();
            assert_ne!(ended, symmResult_t::symmSuccess);
            refused
        }
        ("group_refusal" | "refusal_then_leave", _) => {
            symmAllReduce(buffer, buffer, COUNT, f32_, sum, comm, s)
        }
        // Rank 2 never calls: rank 0's wait for it runs out first (its bound is short).
        ("kernel_gives_up", _) => symmAllReduce(buffer, buffer, COUNT, f32_, sum, comm, s),
        (other, _) => panic!("unknown scenario {other}"),
    };
    // On the cuda backend an enqueued call fails once its kernel gave up.
    let result = stream.completed(comm, result);
    RankOutcome {
        rank,
        result,
        took: started.elapsed(),
        message: last_error(comm),
    }
}

/// Every rank failed, within `PROMPT` of the first to fail; the message of every rank that did
/// not find the failure itself names the rank that did.
#[track_caller]
fn check_prompt(case: &str, outcomes: &[RankOutcome], cause: &[&str]) {
    let summary: Vec<String> = outcomes
        .iter()
        .map(|o| {
            format!(
                "rank {} after {:?}: {:?}: {}",
                o.rank, o.took, o.result, o.message
            )
        })
        .collect();
    for o in outcomes {
        assert_ne!(o.result, symmResult_t::symmSuccess, "{case}: {summary:#?}");
    }
    let first = outcomes.iter().map(|o| o.took).min().unwrap();
    let last = outcomes.iter().map(|o| o.took).max().unwrap();
    assert!(
        last < first + PROMPT,
        "{case}: the last rank failed {:?} after the first: {summary:#?}",
        last - first
    );
    for o in outcomes {
        assert!(
            cause.iter().all(|c| o.message.contains(c)),
            "{case}: rank {} does not name the cause {cause:?}: {summary:#?}",
            o.rank
        );
        if o.result == symmResult_t::symmRemoteError {
            assert!(
                o.message.contains("failed on rank"),
                "{case}: rank {} does not name the rank that found the failure: {summary:#?}",
                o.rank
            );
        }
    }
    println!(
        "{case}: every rank failed within {:?} of the first ({:?})",
        last - first,
        first
    );
}

/// Processes: one per rank, `timeouts[r]` the bound of rank `r`'s waits.
fn processes(scenario: &str, timeouts: &[u64]) -> Vec<RankOutcome> {
    use_backend_from_env();
    let id = id_to_hex(&new_unique_id());
    let nranks = timeouts.len();
    let ranks: Vec<Vec<(String, String)>> = timeouts
        .iter()
        .enumerate()
        .map(|(rank, timeout)| {
            vec![
                ("SYMM_TIMEOUT_MS".to_string(), timeout.to_string()),
                ("SYMM_BOOTSTRAP_TIMEOUT_MS".to_string(), "60000".to_string()),
                (
                    CHILD_ENV.to_string(),
                    format!("{scenario},{rank},{nranks},{id}"),
                ),
            ]
        })
        .collect();
    run_rank_processes("prompt_child_rank", &ranks, Duration::from_secs(90))
        .into_iter()
        .enumerate()
        .map(|(rank, (ok, log))| {
            assert!(ok, "{scenario}, rank {rank}:\n{log}");
            parse_outcome(rank, &log).unwrap_or_else(|| panic!("rank {rank}: no outcome:\n{log}"))
        })
        .collect()
}

/// Two processes, rank 0 all-reduces 1024 f32 and rank 1 512, waits bounded by 20 s: the rank
/// whose call is refused fails the communicator, and the other, already waiting in its
/// collective, fails at once instead of at its bound.
#[test]
fn a_mismatch_fails_every_process_at_once() {
    let outcomes = processes("count", &[long_timeout_ms(), long_timeout_ms()]);
    check_prompt(
        "processes, count mismatch",
        &outcomes,
        &["of 1024", "of 512"],
    );
}

/// Two processes, rank 1's call refused inside its group (one thread): rank 0, waiting in its
/// all-reduce, fails at once.
#[test]
fn a_refusal_in_a_group_fails_every_process_at_once() {
    let outcomes = processes("group_refusal", &[long_timeout_ms(), long_timeout_ms()]);
    // The refusing rank's message names its bad argument; the other's, the refusal (when it
    // found it on record) or the refusing rank's failure.
    check_prompt("processes, refused in a group", &outcomes, &[]);
}

/// Two processes: rank 1 refuses its call inside its group and destroys its communicator
/// before rank 0 makes its all-reduce: rank 0 fails at once, naming the refusal it pairs with
/// (not only the departure).
#[test]
fn a_refusal_before_the_peer_s_call_is_named_after_the_refuser_left() {
    let outcomes = processes(
        "refusal_then_leave",
        &[long_timeout_ms(), long_timeout_ms()],
    );
    check_prompt("processes, refused, then left", &outcomes, &[]);
    assert!(
        outcomes[0].message.contains("rank 1's was refused"),
        "{}",
        outcomes[0].message
    );
}

/// Three processes: rank 2 never makes its call; rank 0's wait for it is bounded by 1 s, rank
/// 1's by 20 s. Rank 0's kernel gives up, and rank 1, waiting in its own, fails with rank 0's
/// cause right after, not 19 s later.
#[test]
fn a_kernel_that_gives_up_fails_the_waiting_processes_at_once() {
    let outcomes = processes(
        "kernel_gives_up",
        &[1000, long_timeout_ms(), long_timeout_ms()],
    );
    check_prompt(
        "processes, a kernel gives up",
        &outcomes[..2],
        &["rank 2 did not arrive"],
    );
}

/// Two processes: rank 1 is killed (SIGKILL) while rank 0 waits in its all-reduce, bounded
/// by 20 s: rank 0 fails right after, naming rank 1's process. A process that exits after
/// destroying its communicator fails nobody (see the next test).
#[test]
fn a_killed_process_fails_the_others_at_once() {
    use_backend_from_env();
    let id = id_to_hex(&new_unique_id());
    let ranks: Vec<Vec<(String, String)>> = (0..2)
        .map(|rank| {
            vec![
                ("SYMM_TIMEOUT_MS".to_string(), long_timeout_ms().to_string()),
                ("SYMM_BOOTSTRAP_TIMEOUT_MS".to_string(), "60000".to_string()),
                (CHILD_ENV.to_string(), format!("killed,{rank},2,{id}")),
            ]
        })
        .collect();
    let results = run_rank_processes("prompt_child_rank", &ranks, Duration::from_secs(90));
    let (ok, log) = &results[0];
    assert!(ok, "rank 0:\n{log}");
    assert!(!results[1].0, "rank 1 was not killed:\n{}", results[1].1);
    let o = parse_outcome(0, log).unwrap_or_else(|| panic!("rank 0: no outcome:\n{log}"));
    assert_ne!(o.result, symmResult_t::symmSuccess, "{}", o.message);
    assert!(
        o.message.contains("rank 1's process") && o.message.contains("exited"),
        "{}",
        o.message
    );
    // Rank 1 dies about 300 ms into rank 0's call.
    assert!(
        o.took < Duration::from_millis(300) + PROMPT,
        "{:?}: {}",
        o.took,
        o.message
    );
    println!(
        "a killed process: rank 0 failed after {:?}: {}",
        o.took, o.message
    );
}

/// Two processes: rank 1 destroys its communicator and exits; rank 0, which made the same calls
/// (none), finds its communicator healthy afterwards (no error), and its next collective, which
/// can never pair, fails at once naming rank 1.
#[test]
fn a_process_that_left_cleanly_fails_nobody() {
    let outcomes = processes("left", &[long_timeout_ms(), long_timeout_ms()]);
    for o in &outcomes {
        assert_eq!(
            o.result,
            symmResult_t::symmSuccess,
            "rank {}: {}",
            o.rank,
            o.message
        );
    }
}

/// A thread per rank, waits bounded by 20 s, rank 1 all-reduces half as much as rank 0: every
/// rank fails at once.
#[test]
fn a_mismatch_fails_every_thread_at_once() {
    use_backend_from_env();
    // SAFETY: set before this test's communicator is made; every test of this file that makes
    // one in this process wants the same bound.
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", long_timeout_ms().to_string()) };
    let id = new_unique_id();
    let outcomes: Vec<RankOutcome> = std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    let (comm, buffer, window) = join(id, rank, 2);
                    let outcome = failing_call("count", comm, buffer, rank);
                    leave(comm, buffer, window);
                    outcome
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    check_prompt("threads, count mismatch", &outcomes, &["of 1024", "of 512"]);
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// A rank process of the tests above: prints its failing call's outcome.
#[test]
#[ignore = "a rank process of the other tests of this file (needs SYMM_PROMPT_CHILD)"]
fn prompt_child_rank() {
    let spec = std::env::var(CHILD_ENV).expect("run through the other tests of this file");
    let fields: Vec<&str> = spec.split(',').collect();
    let scenario = fields[0];
    let rank: usize = fields[1].parse().unwrap();
    let nranks: usize = fields[2].parse().unwrap();
    let id = id_from_hex(fields[3]);
    use_backend_from_env();
    let (comm, buffer, window) = join(id, rank, nranks);
    if scenario == "killed" && rank == 1 {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: ends this process at once, like `kill -9`.
        unsafe { kill(std::process::id() as i32, 9) };
        unreachable!("killed");
    }
    if scenario == "left" {
        if rank == 1 {
            leave(comm, buffer, window);
        } else {
            // Long enough for rank 1's process to have exited.
            std::thread::sleep(Duration::from_millis(500));
            let result = async_error(comm);
            let message = last_error(comm);
            assert_eq!(result, symmResult_t::symmSuccess, "{message}");
            // The next collective can never pair: it fails at once, naming the rank that left.
            let o = failing_call("count", comm, buffer, rank);
            assert!(
                o.result != symmResult_t::symmSuccess
                    && o.message.contains("rank 1")
                    && o.message.contains("destroyed its communicator")
                    && o.took < PROMPT,
                "after {:?}: {:?}: {}",
                o.took,
                o.result,
                o.message
            );
            leave(comm, buffer, window);
            print_outcome(result, Duration::ZERO, &message);
            return;
        }
        print_outcome(symmResult_t::symmSuccess, Duration::ZERO, "left");
        return;
    }
    if scenario == "killed" {
        let o = failing_call("kernel_gives_up", comm, buffer, rank);
        print_outcome(o.result, o.took, &o.message);
        leave(comm, buffer, window);
        return;
    }
    if scenario == "kernel_gives_up" && rank == 2 {
        // Present, but never making the call: the others wait for it until rank 0's bound.
        std::thread::sleep(Duration::from_millis(3000));
        print_outcome(
            symmResult_t::symmInternalError,
            Duration::ZERO,
            "made no call",
        );
    } else {
        let o = failing_call(scenario, comm, buffer, rank);
        print_outcome(o.result, o.took, &o.message);
    }
    leave(comm, buffer, window);
}
