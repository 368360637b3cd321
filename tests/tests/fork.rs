//! A child made by `fork` must not use its parent's communicators. Alone in its own test
//! binary: with one test thread, no other thread of this process is inside symm when it
//! forks, so the child cannot inherit a lock held by a thread that does not exist there.

use std::ffi::c_void;
use std::ptr::null_mut;
use symm::*;
use symm_tests::*;

const COUNT: usize = 1024;

unsafe extern "C" {
    fn fork() -> i32;
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn _exit(code: i32) -> !;
}

/// A child made by `fork` inherits the parent's handles but not its communicators: every call
/// on them is refused (symmInvalidUsage naming both processes), nothing runs, and the parent's
/// communicators keep working.
#[test]
fn a_forked_child_cannot_use_the_parents_communicators() {
    use_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, COUNT * 4);
    let comm = buffers[0].comm;
    let p = buffers[0].base as *mut c_void;
    // SAFETY: this binary's only test runs on the only thread inside symm (see the module
    // docs); the child makes one call and `_exit`s, its exit code reporting what it saw.
    let pid = unsafe { fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let r = all_reduce_f32_sum(comm, p.cast(), p.cast(), COUNT);
        let message = last_error(null_mut());
        let code = if r == symmResult_t::symmInvalidUsage && message.contains("fork") {
            0
        } else {
            1
        };
        // SAFETY: ends the child without running the parent's test harness.
        unsafe { _exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child made above.
    assert_eq!(unsafe { waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(status, 0, "the child's call was not refused as expected");
    let values = vec![1.0f32; COUNT];
    for b in &buffers {
        // SAFETY: the window holds COUNT f32; no collective on it is in flight.
        unsafe { write_f32(b.base, &values) };
    }
    check(symmGroupStart(), null_mut());
    for b in &buffers {
        let q = b.base as *mut c_void;
        check(
            all_reduce_f32_sum(b.comm, q.cast(), q.cast(), COUNT),
            b.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    for b in &buffers {
        // SAFETY: as above; the group has completed.
        assert!(unsafe { read_f32(b.base, COUNT) }.iter().all(|v| *v == 2.0));
    }
    teardown(buffers);
}
