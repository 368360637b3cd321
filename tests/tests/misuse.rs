//! Misuse of the C ABI with defined outcomes: teardown calls that would free memory under work
//! still queued in an open group are refused, and the group still completes correctly; a
//! window base that is not 16-byte aligned fails its registration on every rank at once.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

const COUNT: usize = 1024;

/// Queue an in-place f32 sum all-reduce of every rank in an open group.
fn queue_all_reduce(buffers: &[RankBuffer]) {
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        let values = vec![(rank + 1) as f32; COUNT];
        // SAFETY: the window holds COUNT f32; no collective on it is in flight.
        unsafe { write_f32(b.base, &values) };
        let p = b.base as *mut c_void;
        check(
            all_reduce_f32_sum(b.comm, p.cast(), p.cast(), COUNT),
            b.comm,
        );
    }
}

fn expect_refused(result: symmResult_t, comm: symmComm_t) {
    let message = last_error(comm);
    assert_eq!(result, symmResult_t::symmInvalidUsage, "{message}");
    assert!(message.contains("open group"), "{message}");
}

/// End the group and check the queued all-reduce's result on every rank.
fn end_and_check(buffers: &[RankBuffer]) {
    check(symmGroupEnd(), null_mut());
    let n = buffers.len();
    let want = (n * (n + 1) / 2) as f32;
    for b in buffers {
        // SAFETY: the window holds COUNT f32; the group has completed.
        let got = unsafe { read_f32(b.base, COUNT) };
        assert!(
            got.iter().all(|v| *v == want),
            "the queued all-reduce ran correctly"
        );
    }
}

#[test]
fn destroy_with_work_queued_in_an_open_group_is_refused() {
    use_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, COUNT * 4);
    queue_all_reduce(&buffers);
    expect_refused(symmCommDestroy(buffers[0].comm), buffers[0].comm);
    end_and_check(&buffers);
    teardown(buffers);
}

#[test]
fn deregister_and_free_with_work_queued_in_an_open_group_are_refused() {
    use_host_backend();
    let comms = init_all(3);
    let buffers = alloc_windows(&comms, COUNT * 4);
    queue_all_reduce(&buffers);
    let b = &buffers[1];
    expect_refused(symmCommWindowDeregister(b.comm, b.window), b.comm);
    expect_refused(symmMemFree(b.comm, b.base.cast()), b.comm);
    end_and_check(&buffers);
    teardown(buffers);
}

#[test]
fn a_registration_queued_in_an_open_group_blocks_destroy_too() {
    use_host_backend();
    let comms = init_all(2);
    let mut buffers = alloc(&comms, COUNT * 4);
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffers);
    expect_refused(symmCommDestroy(buffers[1].comm), buffers[1].comm);
    check(symmGroupEnd(), null_mut());
    teardown(buffers);
}

#[test]
fn a_thread_that_exits_with_a_group_open_does_not_block_teardown() {
    use_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, COUNT * 4);
    let addresses: Vec<(usize, usize)> = buffers
        .iter()
        .map(|b| (b.comm as usize, b.base as usize))
        .collect();
    std::thread::spawn(move || {
        check(symmGroupStart(), null_mut());
        for (comm, base) in addresses {
            let p = base as *mut c_void;
            let comm = comm as symmComm_t;
            check(all_reduce_f32_sum(comm, p.cast(), p.cast(), COUNT), comm);
        }
        // The thread ends without symmGroupEnd.
    })
    .join()
    .unwrap();
    teardown(buffers);
}

/// `symmCommInitRank` blocks until every rank joined: inside a group (one thread joining
/// several ranks, as NCCL allows) it is refused at once with a message saying what to do,
/// instead of waiting out the bound.
#[test]
fn init_rank_inside_a_group_is_refused_at_once() {
    use_host_backend();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    check(symmGroupStart(), null_mut());
    let mut comm = null_mut();
    let start = std::time::Instant::now();
    // SAFETY: valid out-pointer.
    let r = unsafe { symmCommInitRank(&mut comm, 2, id, 0) };
    let message = last_error(null_mut());
    check(symmGroupEnd(), null_mut());
    assert_eq!(r, symmResult_t::symmInvalidUsage, "{message}");
    assert!(message.contains("one thread per rank"), "{message}");
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
    assert!(comm.is_null());
}

/// Registration failures come at once, not after `SYMM_TIMEOUT_MS` (10 s by default).
const PROMPT: Duration = Duration::from_secs(3);

/// Check the messages of a registration that rank 0 made at `misaligned` and every other rank
/// at an aligned base.
fn expect_misaligned(results: &[(symmResult_t, String)], misaligned: *mut u8) {
    for (rank, (result, message)) in results.iter().enumerate() {
        assert_eq!(
            *result,
            symmResult_t::symmInvalidArgument,
            "rank {rank}: {message}"
        );
        assert!(
            message.contains("16-byte aligned"),
            "rank {rank}: {message}"
        );
        if rank == 0 {
            let address = format!("buff = {:#x}", misaligned as usize);
            assert!(message.contains(&address), "rank 0: {message}");
        } else {
            assert!(
                message.contains("rank 0 registered"),
                "rank {rank}: {message}"
            );
        }
    }
}

/// One thread drives two ranks; rank 0 registers its allocation's base + 4 (symmMemAlloc
/// memory is aligned): the group's end refuses the registration on both ranks at once,
/// nothing stays registered, and the ranks then register aligned windows and all-reduce.
#[test]
fn a_misaligned_window_base_fails_the_registration_on_every_rank_and_the_comm_stays_usable() {
    use_host_backend();
    let comms = init_all(2);
    let size = COUNT * 4;
    let mut buffers = alloc(&comms, size + 64);
    // SAFETY: 4 bytes into an allocation of size + 64 bytes.
    let misaligned = unsafe { buffers[0].base.add(4) };
    let mut windows = [null_mut(); 2];
    let start = Instant::now();
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        let base = if rank == 0 { misaligned } else { b.base };
        // SAFETY: valid out-pointer; [base, base + size) lies inside the allocation.
        let r = unsafe {
            symmCommWindowRegister(
                b.comm,
                base.cast(),
                size,
                &mut windows[rank],
                SYMM_WIN_COLL_SYMMETRIC,
            )
        };
        check(r, b.comm);
    }
    let ended = symmGroupEnd();
    assert!(start.elapsed() < PROMPT, "at once, not at the bound");
    assert_eq!(ended, symmResult_t::symmInvalidArgument);
    let results: Vec<(symmResult_t, String)> =
        comms.iter().map(|&c| (ended, last_error(c))).collect();
    expect_misaligned(&results, misaligned);
    // Nothing stays registered: the handles are not windows, and the allocations are free to
    // register again.
    for (rank, b) in buffers.iter().enumerate() {
        let r = symmCommWindowDeregister(b.comm, windows[rank]);
        assert_eq!(
            r,
            symmResult_t::symmInvalidArgument,
            "{}",
            last_error(b.comm)
        );
        assert!(last_error(b.comm).contains("not a window registered"));
    }
    register_all(&mut buffers);
    queue_all_reduce(&buffers);
    end_and_check(&buffers);
    teardown(buffers);
}

/// Ranks made by `symmCommInitRank`, one thread each, registering outside a group (the
/// registration goes through the bootstrap): rank 0's misaligned base fails the registration
/// on both ranks at once, with the same messages.
#[test]
fn a_misaligned_window_base_fails_a_bootstrap_registration_on_every_rank_at_once() {
    use_host_backend();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    let comms = join_threads(id, 2);
    let size = COUNT * 4;
    let buffers = alloc(&comms, size + 64);
    // SAFETY: 4 bytes into an allocation of size + 64 bytes.
    let misaligned = unsafe { buffers[0].base.add(4) } as usize;
    let start = Instant::now();
    let threads: Vec<_> = buffers
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            let comm = b.comm as usize;
            let base = if rank == 0 {
                misaligned
            } else {
                b.base as usize
            };
            std::thread::spawn(move || {
                let comm = comm as symmComm_t;
                let mut win = null_mut();
                // SAFETY: valid out-pointer; [base, base + size) lies inside the allocation.
                let r = unsafe {
                    symmCommWindowRegister(
                        comm,
                        base as *mut c_void,
                        size,
                        &mut win,
                        SYMM_WIN_COLL_SYMMETRIC,
                    )
                };
                (r, last_error(comm))
            })
        })
        .collect();
    let results: Vec<(symmResult_t, String)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        start.elapsed() < PROMPT,
        "at once, not at the bound: {results:?}"
    );
    expect_misaligned(&results, misaligned as *mut u8);
    for b in buffers {
        check(symmMemFree(b.comm, b.base.cast()), b.comm);
        check(symmCommDestroy(b.comm), null_mut());
    }
}
