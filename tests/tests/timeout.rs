//! Bounded waits: a rank that never arrives gives `symmTimeout` within the configured time,
//! never a hang. This binary sets `SYMM_TIMEOUT_MS` for itself, so it holds these tests only.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

const TIMEOUT_MS: u64 = 300;

fn configure() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    use_host_backend();
    ONCE.call_once(|| {
        // SAFETY: as in `use_host_backend`: set once, before any communicator is created.
        unsafe { std::env::set_var("SYMM_TIMEOUT_MS", TIMEOUT_MS.to_string()) };
    });
}

#[track_caller]
fn assert_bounded(start: Instant) {
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(TIMEOUT_MS),
        "returned too early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(TIMEOUT_MS * 20),
        "took {elapsed:?}"
    );
}

#[test]
fn all_reduce_with_a_missing_peer_times_out_and_aborts_the_comm() {
    configure();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 1024);
    let b = &buffers[0];
    let p = b.base as *mut c_void;
    let f32_ = symmDataType_t::symmFloat32 as i32;
    let sum = symmRedOp_t::symmSum as i32;
    let async_error = |comm| {
        let mut error = symmResult_t::symmInternalError;
        // SAFETY: valid out-pointer.
        check(unsafe { symmCommGetAsyncError(comm, &mut error) }, comm);
        error
    };
    assert_eq!(async_error(b.comm), symmResult_t::symmSuccess);
    let start = Instant::now();
    // Rank 1 never calls.
    let r = symmAllReduce(p, p, 16, f32_, sum, b.comm, null_mut());
    assert_eq!(r, symmResult_t::symmTimeout);
    assert_bounded(start);
    assert!(
        last_error(b.comm).contains("did not arrive"),
        "{}",
        last_error(b.comm)
    );
    // The message names the rank that did not arrive, and says that a group is probably
    // missing (one thread drives both ranks here), in the user's words.
    let message = last_error(b.comm);
    assert!(
        message.contains("rank 0: rank 1 did not arrive within")
            && message.contains("a group is probably missing")
            && !message.contains("ABORT_"),
        "{message}"
    );
    // The timeout stays the comm's asynchronous error, query after query; the other rank's
    // comm has failed too (it would otherwise pair its next call with rank 0's stale one).
    for _ in 0..2 {
        assert_eq!(async_error(b.comm), symmResult_t::symmTimeout);
        assert!(last_error(b.comm).contains("did not arrive"));
    }
    let other = buffers[1].comm;
    assert_eq!(async_error(other), symmResult_t::symmRemoteError);
    assert!(
        last_error(other).contains("failed on rank 0: rank 0: rank 1 did not arrive"),
        "{}",
        last_error(other)
    );
    // Both refuse further collectives, with a clear message.
    let r = symmAllReduce(p, p, 16, f32_, sum, b.comm, null_mut());
    assert_eq!(r, symmResult_t::symmTimeout);
    assert!(last_error(b.comm).contains("the communicator has failed"));
    let q = buffers[1].base as *mut c_void;
    let r = symmAllReduce(q, q, 16, f32_, sum, other, null_mut());
    assert_eq!(r, symmResult_t::symmRemoteError);
    teardown(buffers);
}

#[test]
fn window_registration_outside_a_group_times_out() {
    configure();
    let comms = init_all(2);
    let mut p = null_mut();
    let mut win = null_mut();
    // SAFETY: valid out-pointers; live allocation.
    unsafe {
        check(symmMemAlloc(comms[0], &mut p, 256), comms[0]);
        let start = Instant::now();
        let r = symmCommWindowRegister(comms[0], p, 256, &mut win, SYMM_WIN_COLL_SYMMETRIC);
        assert_eq!(r, symmResult_t::symmTimeout);
        assert_bounded(start);
    }
    assert!(win.is_null());
    assert!(last_error(comms[0]).contains("symmGroupStart"));
    for c in comms {
        check(symmCommDestroy(c), null_mut());
    }
}

#[test]
fn init_rank_with_a_missing_rank_times_out() {
    configure();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    let mut comm = null_mut();
    // SAFETY: valid out-pointers.
    unsafe {
        check(symmGetUniqueId(&mut id), null_mut());
        let start = Instant::now();
        assert_eq!(
            symmCommInitRank(&mut comm, 2, id, 0),
            symmResult_t::symmTimeout
        );
        assert_bounded(start);
    }
    assert!(comm.is_null());
    let message = last_error(null_mut());
    assert!(message.contains("not every rank joined"), "{message}");
}

/// Regression (found by the `abi_sequence` fuzz target, corpus input
/// `seed-peer-deregistered`): rank 1 deregisters and frees its window, then rank 0 calls an
/// all-reduce alone. Rank 0's barrier writes its arrival into rank 1's signal pad, which was
/// freed with rank 1's window (a use-after-free under AddressSanitizer). The pad now lives as
/// long as rank 0's window: the call times out, and teardown works.
#[test]
fn a_rank_calling_after_its_peer_deregistered_times_out() {
    configure();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 1024);
    let (b0, b1) = (&buffers[0], &buffers[1]);
    check(symmCommWindowDeregister(b1.comm, b1.window), b1.comm);
    check(symmMemFree(b1.comm, b1.base.cast()), b1.comm);
    check(symmCommDestroy(b1.comm), null_mut());
    let start = Instant::now();
    let r = all_reduce_f32_sum(b0.comm, b0.base, b0.base, 16);
    assert_eq!(r, symmResult_t::symmTimeout, "{}", last_error(b0.comm));
    assert_bounded(start);
    check(symmCommWindowDeregister(b0.comm, b0.window), b0.comm);
    check(symmMemFree(b0.comm, b0.base.cast()), b0.comm);
    check(symmCommDestroy(b0.comm), null_mut());
}

/// Regression: a registration that timed out on rank 0 left its deposit behind, so rank 1's
/// later registration completed against rank 0's dropped window (and its freed signal pad),
/// and rank 1 got a window whose collectives wrote into freed memory. Now each times out;
/// both ranks have used the same registration number, so a registration of both in a group
/// then works, and so does a collective on it.
#[test]
fn a_timed_out_registration_never_pairs_with_a_later_one() {
    configure();
    let comms = init_all(2);
    let mut buffers = alloc(&comms, 1024);
    for b in &mut buffers {
        // SAFETY: valid out-pointer; a live allocation of b.bytes.
        let r = unsafe {
            symmCommWindowRegister(
                b.comm,
                b.base.cast(),
                b.bytes,
                &mut b.window,
                SYMM_WIN_COLL_SYMMETRIC,
            )
        };
        assert_eq!(r, symmResult_t::symmTimeout, "{}", last_error(b.comm));
        assert!(b.window.is_null());
    }
    register_all(&mut buffers);
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        // SAFETY: the window holds 16 f32; no collective is running.
        unsafe { write_f32(b.base, &[(rank + 1) as f32; 16]) };
        check(all_reduce_f32_sum(b.comm, b.base, b.base, 16), b.comm);
    }
    check(symmGroupEnd(), null_mut());
    for b in &buffers {
        // SAFETY: as above; the group has completed.
        assert_eq!(unsafe { read_f32(b.base, 16) }, vec![3.0; 16]);
    }
    teardown(buffers);
}

/// One thread per rank, and a rank calls another collective (or another count) than its peer:
/// never success with wrong data. The later call is refused with `symmInvalidUsage` naming both
/// calls and fails the communicator; the earlier one, launched already, gives up at once with
/// `symmRemoteError`, and its message names both calls too.
#[test]
fn ranks_that_disagree_on_the_call_get_an_error_naming_both() {
    configure();
    let f32_ = symmDataType_t::symmFloat32 as i32;
    let sum = symmRedOp_t::symmSum as i32;
    for (second_gathers, second_count) in [(true, 64), (false, 128)] {
        let comms = init_all(2);
        let buffers = alloc_windows(&comms, 4096);
        let calls: Vec<(usize, usize, usize)> = buffers
            .iter()
            .map(|b| (b.comm as usize, b.base as usize, b.bytes))
            .collect();
        let results: Vec<(symmResult_t, String)> = std::thread::scope(|scope| {
            let threads: Vec<_> = calls
                .iter()
                .enumerate()
                .map(|(rank, &(comm, base, _))| {
                    scope.spawn(move || {
                        let comm = comm as symmComm_t;
                        let p = base as *mut c_void;
                        let r = if rank == 1 && second_gathers {
                            // In place: rank 1's share is the second 32 elements.
                            let share = (base + 32 * 4) as *const c_void;
                            symmAllGather(share, p, 32, f32_, comm, null_mut())
                        } else {
                            let count = if rank == 1 { second_count } else { 64 };
                            symmAllReduce(p, p, count, f32_, sum, comm, null_mut())
                        };
                        (r, last_error(comm))
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut codes: Vec<symmResult_t> = results.iter().map(|(r, _)| *r).collect();
        codes.sort_by_key(|r| *r as i32);
        assert_eq!(
            codes,
            [
                symmResult_t::symmInvalidUsage,
                symmResult_t::symmRemoteError
            ],
            "{results:?}"
        );
        let (first, second) = if second_gathers {
            ("symmAllReduce of 64", "symmAllGather of 32")
        } else {
            ("symmAllReduce of 64", "symmAllReduce of 128")
        };
        for (_, message) in &results {
            assert!(
                message.contains(first) && message.contains(second),
                "{message}"
            );
        }
        teardown(buffers);
    }
}
