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
    // The timeout stays the comm's asynchronous error, query after query; the other rank's
    // comm is unaffected.
    for _ in 0..2 {
        assert_eq!(async_error(b.comm), symmResult_t::symmTimeout);
        assert!(last_error(b.comm).contains("did not arrive"));
    }
    assert_eq!(async_error(buffers[1].comm), symmResult_t::symmSuccess);
    // The comm refuses further collectives, with a clear message.
    let r = symmAllReduce(p, p, 16, f32_, sum, b.comm, null_mut());
    assert_eq!(r, symmResult_t::symmInvalidUsage);
    assert!(last_error(b.comm).contains("aborted"));
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
