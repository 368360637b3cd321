//! `symmCommAbort` and `symmCommFinalize`, NCCL's semantics. Abort from a watchdog thread while
//! its rank's collective waits for a peer that hangs: the call ends, abort returns promptly,
//! every peer's pending and next calls fail naming the abort. Finalize: completes the rank's
//! work, then refuses collectives and registrations; teardown still works.
//!
//! On the host backend by default; with `SYMM_BACKEND=cuda` on the cuda backend (the simulated
//! GPU runs it in `cargo xtask sim --test`).

use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

/// Elements of each rank's window.
const COUNT: usize = 1024;
/// Far longer than any wait these tests allow: an abort must not wait for it.
const TIMEOUT_MS: &str = "20000";
/// How soon every rank must have seen the abort: 1.5 s, 6 s on the cuda backend (whose
/// kernels the simulated GPU interprets thread by thread, and whose waits look at the abort
/// word only every few thousand polls).
fn prompt() -> Duration {
    Duration::from_millis(if on_cuda() { 6000 } else { 1500 })
}

/// A communicator handle that may cross threads (the library takes it from any thread).
#[derive(Clone, Copy)]
struct Handle(symmComm_t);
// SAFETY: the library looks a handle up in its table of live communicators on every call.
unsafe impl Send for Handle {}

fn long_timeouts() {
    use_backend_from_env();
    // SAFETY: set before this file's communicators are made; every test here wants it.
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", TIMEOUT_MS) };
}

/// An in-place float sum of `COUNT` elements at `buffer` on `stream`, as issued.
fn issue_all_reduce(
    comm: symmComm_t,
    buffer: *mut std::ffi::c_void,
    stream: symmStream_t,
) -> symmResult_t {
    symmAllReduce(
        buffer,
        buffer,
        COUNT,
        symmDataType_t::symmFloat32 as i32,
        symmRedOp_t::symmSum as i32,
        comm,
        stream,
    )
}

/// One rank's all-reduce on its window, completed (on the cuda backend: its stream
/// synchronized, then the communicator's asynchronous error).
fn all_reduce(comm: symmComm_t, buffer: *mut std::ffi::c_void) -> symmResult_t {
    let stream = RankStream::new();
    let result = issue_all_reduce(comm, buffer, stream.handle());
    stream.completed(comm, result)
}

/// One all-reduce of every rank's window in a group (one thread drives them all).
fn grouped_all_reduce(buffers: &[RankBuffer]) {
    check(symmGroupStart(), null_mut());
    for b in buffers {
        check(issue_all_reduce(b.comm, b.base.cast(), null_mut()), b.comm);
    }
    check(symmGroupEnd(), null_mut());
}

/// Rank 0's all-reduce waits for rank 2, which hangs (makes no call); a watchdog thread aborts
/// rank 0. Rank 0's call ends with an error, the abort returns well within the timeout, rank
/// 1's pending call and rank 2's next call fail naming the abort; ranks 1 and 2 tear down.
#[test]
fn abort_while_a_peer_hangs_ends_every_rank_s_calls() {
    long_timeouts();
    let id = new_unique_id();
    let (go, hang) = mpsc::channel::<()>();
    let mut hang = Some(hang);
    let (joined, handles) = mpsc::channel::<(usize, Handle)>();
    std::thread::scope(|scope| {
        let mut ranks = Vec::new();
        for rank in 0..3 {
            let joined = joined.clone();
            let hang = if rank == 2 { hang.take() } else { None };
            ranks.push(scope.spawn(move || {
                let mut comm = null_mut();
                // SAFETY: valid out-pointer.
                check(
                    unsafe { symmCommInitRank(&mut comm, 3, id, rank as i32) },
                    null_mut(),
                );
                let (buffer, window) = window_of_bytes(comm, COUNT * 4);
                joined.send((rank, Handle(comm))).unwrap();
                if let Some(hang) = hang {
                    // Hang until the others have failed (or the test gave up: the sender is
                    // gone), then make the call.
                    let _ = hang.recv();
                }
                let start = Instant::now();
                let result = if rank == 0 && on_cuda() {
                    // The abort frees this communicator, maybe before its stream is done:
                    // only the stream's end can be waited for (the call was enqueued).
                    let stream = RankStream::new();
                    let enqueued = issue_all_reduce(comm, buffer, stream.handle());
                    stream.synchronize();
                    if enqueued == symmResult_t::symmSuccess {
                        symmResult_t::symmRemoteError
                    } else {
                        enqueued
                    }
                } else {
                    all_reduce(comm, buffer)
                };
                let took = start.elapsed();
                let message = last_error(comm);
                if rank != 0 {
                    // Rank 0's communicator is freed by its abort.
                    let _ = symmCommWindowDeregister(comm, window);
                    let _ = symmMemFree(comm, buffer);
                    check(symmCommDestroy(comm), null_mut());
                }
                (rank, result, took, message)
            }));
        }
        let mut comms = [None, None, None];
        for _ in 0..3 {
            let (rank, handle) = handles.recv().unwrap();
            comms[rank] = Some(handle);
        }
        // Dropped if this thread panics, so that rank 2 stops hanging and the scope ends.
        let go = go;
        let rank0 = comms[0].unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let start = Instant::now();
        let aborted = symmCommAbort(rank0.0);
        let abort_took = start.elapsed();
        assert_eq!(
            aborted,
            symmResult_t::symmSuccess,
            "{}",
            last_error(null_mut())
        );
        assert!(abort_took < prompt(), "symmCommAbort took {abort_took:?}");
        // The handle is no longer valid.
        assert_eq!(symmCommDestroy(rank0.0), symmResult_t::symmInvalidArgument);
        std::thread::sleep(Duration::from_millis(100));
        go.send(()).unwrap();
        for rank in ranks {
            let (rank, result, took, message) = rank.join().unwrap();
            assert_ne!(result, symmResult_t::symmSuccess, "rank {rank} succeeded");
            if rank == 0 {
                // Its call ended once the abort's words were raised.
                assert!(
                    took < Duration::from_millis(300) + prompt(),
                    "rank 0: {took:?}"
                );
                continue;
            }
            let limit = if rank == 1 {
                Duration::from_millis(300) + prompt()
            } else {
                prompt()
            };
            assert!(
                took < limit,
                "rank {rank}: failed after {took:?}: {message}"
            );
            assert!(
                message.contains("symmCommAbort") && message.contains("rank 0"),
                "rank {rank}: {message}"
            );
        }
    });
}

/// An abort with nothing in flight: the peers' next calls fail naming it, and they tear down.
#[test]
fn abort_between_calls_fails_the_peers_next_calls() {
    long_timeouts();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, COUNT * 4);
    grouped_all_reduce(&buffers);
    // Completed (on the cuda backend: the context's work).
    let _ = get_f32(buffers[1].base, 1);
    assert_eq!(symmCommAbort(buffers[0].comm), symmResult_t::symmSuccess);
    let start = Instant::now();
    let result = all_reduce(buffers[1].comm, buffers[1].base.cast());
    assert_ne!(result, symmResult_t::symmSuccess);
    let message = last_error(buffers[1].comm);
    assert!(start.elapsed() < prompt(), "{:?}", start.elapsed());
    assert!(message.contains("symmCommAbort"), "{message}");
    let b = &buffers[1];
    let _ = symmCommWindowDeregister(b.comm, b.window);
    let _ = symmMemFree(b.comm, b.base.cast());
    check(symmCommDestroy(b.comm), null_mut());
    assert_eq!(symmCommAbort(null_mut()), symmResult_t::symmInvalidArgument);
}

/// Finalize waits for the rank's work, then refuses collectives and registrations naming it;
/// teardown works.
#[test]
fn finalize_completes_the_work_then_only_teardown_remains() {
    long_timeouts();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, COUNT * 4);
    for b in &buffers {
        put_f32(b.base, &[1.5f32; COUNT]);
    }
    grouped_all_reduce(&buffers);
    for b in &buffers {
        check(symmCommFinalize(b.comm), b.comm);
    }
    for b in &buffers {
        assert!(get_f32(b.base, COUNT).iter().all(|v| *v == 3.0));
    }
    for b in &buffers {
        let result = issue_all_reduce(b.comm, b.base.cast(), null_mut());
        assert_eq!(result, symmResult_t::symmInvalidUsage);
        assert!(
            last_error(b.comm).contains("symmCommFinalize"),
            "{}",
            last_error(b.comm)
        );
        let mut window = null_mut();
        // SAFETY: valid out-pointer; a live allocation of this comm.
        let registered = unsafe {
            symmCommWindowRegister(
                b.comm,
                b.base.cast(),
                64,
                &mut window,
                SYMM_WIN_COLL_SYMMETRIC,
            )
        };
        assert_eq!(registered, symmResult_t::symmInvalidUsage);
    }
    teardown(buffers);
}
