//! A kernel that refuses its launch raises the window's abort word with
//! `ABORT_INVALID_LAUNCH`; the next call and `symmCommGetAsyncError` report it, distinct from a
//! timeout. (The word is raised by hand here: validation keeps real launches in bounds.)

use std::ffi::c_void;
use std::ptr::null_mut;
use symm::*;
use symm_device::context::SymmContext;
use symm_device::symmetric::ABORT_INVALID_LAUNCH;
use symm_tests::*;

#[test]
fn a_refused_launch_is_reported_by_the_next_call_and_the_async_error() {
    use_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4096);
    let b = &buffers[0];
    let p = b.base as *mut c_void;
    let (f32_, sum) = (
        symmDataType_t::symmFloat32 as i32,
        symmRedOp_t::symmSum as i32,
    );
    check(symmGroupStart(), null_mut());
    for c in &buffers {
        let q = c.base as *mut c_void;
        check(
            symmAllReduce(q, q, 16, f32_, sum, c.comm, null_mut()),
            c.comm,
        );
    }
    check(symmGroupEnd(), null_mut());

    let mut context: *const c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommGetDeviceContext(b.comm, b.window, &mut context) },
        b.comm,
    );
    // SAFETY: on the host backend the context and its abort word are host memory; the word is
    // accessed atomically by kernels, none of which runs now.
    unsafe {
        let abort = (*(context as *const SymmContext)).abort_flag as *mut u32;
        abort.write_volatile(ABORT_INVALID_LAUNCH);
    }
    let mut state = symmResult_t::symmSuccess;
    // SAFETY: valid out-pointer.
    check(unsafe { symmCommGetAsyncError(b.comm, &mut state) }, b.comm);
    assert_eq!(state, symmResult_t::symmInternalError);
    let r = symmAllReduce(p, p, 16, f32_, sum, b.comm, null_mut());
    assert_eq!(r, symmResult_t::symmInternalError, "{}", last_error(b.comm));
    assert!(
        last_error(b.comm).contains("the communicator has failed"),
        "{}",
        last_error(b.comm)
    );
    // SAFETY: valid out-pointer.
    check(unsafe { symmCommGetAsyncError(b.comm, &mut state) }, b.comm);
    assert_eq!(state, symmResult_t::symmInternalError);
    // The other rank's communicator has failed too, naming rank 0 and the cause.
    let other = buffers[1].comm;
    // SAFETY: valid out-pointer.
    check(unsafe { symmCommGetAsyncError(other, &mut state) }, other);
    assert_eq!(state, symmResult_t::symmRemoteError);
    let message = last_error(other);
    assert!(
        message.contains("failed on rank 0") && message.contains("refused its launch"),
        "{message}"
    );
    teardown(buffers);
}

#[test]
fn the_first_call_after_a_refused_launch_names_the_kernel() {
    use_host_backend();
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4096);
    let (f32_, sum) = (
        symmDataType_t::symmFloat32 as i32,
        symmRedOp_t::symmSum as i32,
    );
    check(symmGroupStart(), null_mut());
    for c in &buffers {
        let q = c.base as *mut c_void;
        check(
            symmAllReduce(q, q, 16, f32_, sum, c.comm, null_mut()),
            c.comm,
        );
    }
    check(symmGroupEnd(), null_mut());
    let b = &buffers[1];
    let mut context: *const c_void = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommGetDeviceContext(b.comm, b.window, &mut context) },
        b.comm,
    );
    // SAFETY: as above.
    unsafe {
        let abort = (*(context as *const SymmContext)).abort_flag as *mut u32;
        abort.write_volatile(ABORT_INVALID_LAUNCH);
    }
    let p = b.base as *mut c_void;
    let r = symmAllReduce(p, p, 16, f32_, sum, b.comm, null_mut());
    let message = last_error(b.comm);
    assert_eq!(r, symmResult_t::symmInternalError, "{message}");
    assert!(
        message.contains("refused its launch") && message.contains("symm_"),
        "{message}"
    );
    teardown(buffers);
}
