//! Children made by `fork` form communicators of their own (as Python's multiprocessing does),
//! also after the parent ran ranks of its own with `symmCommInitRank`. Alone in its own test
//! binary: one test, so no other thread of this process is inside symm when it forks.

use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

const COUNT: usize = 4099;
const NRANKS: usize = 2;

unsafe extern "C" {
    fn fork() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
    fn _exit(code: i32) -> !;
}
const WNOHANG: i32 = 1;
const SIGKILL: i32 = 9;

/// Rank `rank` of `id`: join, all-reduce (sum, in place) of `rank + 1 + i % 5` three times,
/// each checked exactly, tear down; the first failure, if any.
fn one_rank(id: symmUniqueId, rank: usize) -> Result<(), String> {
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    let r = unsafe { symmCommInitRank(&mut comm, NRANKS as i32, id, rank as i32) };
    if r != symmResult_t::symmSuccess {
        return Err(format!("init: {r:?}: {}", last_error(null_mut())));
    }
    let (buffer, window) = window_of_bytes(comm, COUNT * 4);
    let base: usize = (1..=NRANKS).sum();
    for round in 0..3 {
        let values: Vec<f32> = (0..COUNT)
            .map(|i| (rank + 1 + (i + round) % 5) as f32)
            .collect();
        // SAFETY: the window holds COUNT f32 of host memory; no call is in flight.
        unsafe { write_f32(buffer.cast(), &values) };
        let r = all_reduce_f32_sum(comm, buffer.cast(), buffer.cast(), COUNT);
        if r != symmResult_t::symmSuccess {
            return Err(format!("round {round}: {r:?}: {}", last_error(comm)));
        }
        // SAFETY: as above; the call returned.
        let got = unsafe { read_f32(buffer.cast(), COUNT) };
        let wrong = (0..COUNT)
            .filter(|&i| got[i] != (base + NRANKS * ((i + round) % 5)) as f32)
            .count();
        if wrong > 0 {
            return Err(format!("round {round}: {wrong} wrong elements"));
        }
    }
    check(symmCommWindowDeregister(comm, window), comm);
    check(symmMemFree(comm, buffer), comm);
    check(symmCommDestroy(comm), null_mut());
    Ok(())
}

fn new_id() -> symmUniqueId {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    id
}

/// The parent runs two ranks as threads (`symmGetUniqueId` + `symmCommInitRank`), tears them
/// down, then forks two children that form their own communicator the same way: their
/// all-reduces are exact, and they finish well within the bound of a wait.
#[test]
fn forked_children_form_their_own_communicator_after_the_parent_had_ranks() {
    use_host_backend();
    // SAFETY: set before any communicator is made, while this is the only thread in symm.
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", "5000") };
    let id = new_id();
    std::thread::scope(|scope| {
        let ranks: Vec<_> = (0..NRANKS)
            .map(|rank| scope.spawn(move || one_rank(id, rank)))
            .collect();
        for (rank, r) in ranks.into_iter().enumerate() {
            r.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("parent rank {rank}: {e}"));
        }
    });
    let id = new_id();
    let started = Instant::now();
    let children: Vec<i32> = (0..NRANKS)
        .map(|rank| {
            // SAFETY: no other thread of this test is inside symm (the parent's ranks are torn
            // down; the bootstrap roots take no lock a child uses); the child runs its rank and
            // `_exit`s with a code saying whether it was right.
            let pid = unsafe { fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = match one_rank(id, rank) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("child rank {rank}: {e}");
                        1
                    }
                };
                // SAFETY: ends the child without running the parent's test harness.
                unsafe { _exit(code) };
            }
            pid
        })
        .collect();
    // Each child is waited for at most 30 s (then killed): a child that hangs fails the test.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (rank, pid) in children.into_iter().enumerate() {
        let mut status = 0;
        loop {
            // SAFETY: polls a child made above.
            let done = unsafe { waitpid(pid, &mut status, WNOHANG) };
            if done == pid {
                break;
            }
            if Instant::now() > deadline {
                // SAFETY: our own unreaped child.
                unsafe { kill(pid, SIGKILL) };
                // SAFETY: reaps it.
                unsafe { waitpid(pid, &mut status, 0) };
                panic!("child rank {rank} did not finish within 30 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(status, 0, "child rank {rank} failed (its message is above)");
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the children took {took:?}: at least one waited for its peer until the bound"
    );
    println!("the forked children's communicator: 3 exact all-reduces in {took:?}");
}
