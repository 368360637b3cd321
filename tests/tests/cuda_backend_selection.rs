//! `SYMM_BACKEND=cuda` on a machine without a usable GPU or driver returns `symmNoDevice` with a
//! message — never a panic or an abort across the FFI. On a GPU machine the same call succeeds
//! on the cuda backend. (This binary sets `SYMM_BACKEND` for itself.)

use std::ptr::null_mut;
use symm::*;
use symm_tests::last_error;

#[test]
fn cuda_backend_is_no_device_without_a_gpu_and_works_with_one() {
    // SAFETY: the only test of this binary; set before any communicator exists.
    unsafe { std::env::set_var("SYMM_BACKEND", "cuda") };
    // SAFETY: only checks whether libcuda can be loaded.
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    let mut comms = [null_mut(); 2];
    // SAFETY: two elements; devlist NULL.
    let r = unsafe { symmCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) };
    if driver_present && r == symmResult_t::symmSuccess {
        for c in comms {
            assert_eq!(symm_tests::backend(c), "cuda");
            assert_eq!(symmCommDestroy(c), symmResult_t::symmSuccess);
        }
    } else {
        assert_eq!(r, symmResult_t::symmNoDevice, "{}", last_error(null_mut()));
        let message = last_error(null_mut());
        assert!(message.contains("SYMM_BACKEND=cuda"), "{message}");
        assert!(comms.iter().all(|c| c.is_null()));
    }
    // SAFETY: as above.
    unsafe { std::env::set_var("SYMM_BACKEND", "gpu") };
    // SAFETY: two elements; devlist NULL.
    let r = unsafe { symmCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()) };
    assert_eq!(r, symmResult_t::symmInvalidArgument);
    assert!(last_error(null_mut()).contains("SYMM_BACKEND"));
}
