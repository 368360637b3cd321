//! The checked layer over `cudarc::driver::sys`, shared by the cuda backend ([`super::cuda`])
//! and the VMM allocations ([`super::vmm`]).
//!
//! * [`driver`] runs one driver call and turns its failure into an [`Error`] that names the
//!   call, the `CUresult` (as `cuGetErrorName` spells it) and the driver's description of it
//!   ([`cuda_error`]); the panic cudarc raises when the library or a symbol is missing becomes
//!   `symmNoDevice` ([`guarded`]).
//! * [`PrimaryContext`] holds a reference to a device's primary context;
//!   [`PrimaryContext::enter`] makes it current for the life of a [`CurrentContext`], which
//!   restores the caller's context (or none) when dropped.
//! * [`outside_capture`] runs setup with the thread's stream-capture mode relaxed, so that it
//!   is safe while the caller captures a CUDA graph.
//! * [`device_attribute`] and [`library_present`]: the queries both users make.

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use cudarc::driver::{DriverError, result, sys};
use std::ffi::{CStr, c_char};
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Whether the CUDA driver library can be loaded.
pub(crate) fn library_present() -> bool {
    // SAFETY: only checks whether the library can be loaded.
    unsafe { sys::is_culib_present() }
}

/// Run driver call `what`, catching the panic cudarc raises when the library or a symbol is
/// missing: `Err` (`symmNoDevice`) only for that panic; the call's own result inside.
pub(crate) fn guarded<T>(
    what: &str,
    call: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> Result<std::result::Result<T, DriverError>> {
    catch_unwind(AssertUnwindSafe(call)).map_err(|_| {
        Error::new(
            symmResult_t::symmNoDevice,
            format!("{what}: the CUDA driver library is missing or too old"),
        )
    })
}

/// Run driver call `what`, mapping a failure to [`cuda_error`] and a panic (a missing library
/// or symbol) to `symmNoDevice`, both naming `what`.
pub(crate) fn driver<T>(
    what: &str,
    call: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> Result<T> {
    guarded(what, call)?.map_err(|DriverError(code)| cuda_error(what, code))
}

/// The error of driver call `what` failing with `code`, quoting the driver's description of
/// `code` when it has one (see [`error_with_description`]).
pub(crate) fn cuda_error(what: &str, code: sys::CUresult) -> Error {
    error_with_description(what, code, error_description(code).as_deref())
}

/// The error of driver call `what` failing with `code` ([`result_code`]), its message
/// `"{what} failed: {code name} ({description})"`; `description` is the driver's text for
/// `code` (see [`error_description`]).
pub(crate) fn error_with_description(
    what: &str,
    code: sys::CUresult,
    description: Option<&str>,
) -> Error {
    Error::new(
        result_code(code),
        format!("{what} failed: {}", describe(code, description)),
    )
}

/// The `symmResult_t` for a driver call that failed with `code`: `symmOutOfMemory` for
/// `CUDA_ERROR_OUT_OF_MEMORY`, `symmNoDevice` for `CUDA_ERROR_NO_DEVICE`, else
/// `symmUnhandledCudaError`.
pub(crate) fn result_code(code: sys::CUresult) -> symmResult_t {
    match code {
        sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => symmResult_t::symmOutOfMemory,
        sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => symmResult_t::symmNoDevice,
        _ => symmResult_t::symmUnhandledCudaError,
    }
}

/// `code` as text: its name (as `cuGetErrorName` spells it) and, when known, the driver's
/// description of it.
pub(crate) fn describe(code: sys::CUresult, description: Option<&str>) -> String {
    match description.map(str::trim).filter(|d| !d.is_empty()) {
        Some(d) => format!("{code:?} ({d})"),
        None => format!("{code:?}"),
    }
}

/// The driver's description of `code` (`cuGetErrorString`), or `None` when the driver has
/// none or cannot be asked.
pub(crate) fn error_description(code: sys::CUresult) -> Option<String> {
    catch_unwind(|| {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: `cuGetErrorString` writes a pointer to a static string, or fails.
        let status = unsafe { sys::cuGetErrorString(code, &mut text) };
        if status != sys::cudaError_enum::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: on success the pointer is a NUL-terminated string owned by the driver for
        // the life of the process.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    })
    .ok()
    .flatten()
}

/// Attribute `attribute` of `device` (`cuDeviceGetAttribute`).
pub(crate) fn device_attribute(
    device: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> Result<i32> {
    // SAFETY: a plain query; the driver checks the device handle and the attribute.
    driver("cuDeviceGetAttribute", || unsafe {
        result::device::get_attribute(device, attribute)
    })
}

/// Run `work` (setup: allocation, upload, module loading, VMM mapping; nothing enqueued on a
/// stream a caller may be capturing) with this thread's stream-capture mode relaxed, then
/// restore the mode. A first use of a kernel, an allocation or an import may happen while
/// the caller captures a CUDA graph; in the default (global) mode such calls would
/// invalidate the capture. This is the driver's documented way to make them during one.
///
/// The mode is restored on every path, a panic in `work` included. `work`'s result is
/// returned even if restoring the mode fails, so that nothing it made (an allocation, a
/// handle) is lost; relaxing the mode failing is an error naming
/// `cuThreadExchangeStreamCaptureMode`, and `work` does not run.
pub(crate) fn outside_capture<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    let _relaxed = RelaxedCapture::enter()?;
    work()
}

/// This thread's stream-capture mode relaxed for the guard's life (see [`outside_capture`]).
struct RelaxedCapture {
    /// The mode to restore.
    previous: sys::CUstreamCaptureMode,
}

impl RelaxedCapture {
    /// Relax the mode, keeping the previous one.
    fn enter() -> Result<Self> {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        exchange_capture_mode(&mut mode)?;
        Ok(RelaxedCapture { previous: mode })
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // A failure cannot be reported from here, and must not hide what the work returned.
        let _ = exchange_capture_mode(&mut self.previous);
    }
}

/// `cuThreadExchangeStreamCaptureMode`: make `*mode` this thread's mode and put the previous
/// one in `*mode`.
fn exchange_capture_mode(mode: &mut sys::CUstreamCaptureMode) -> Result<()> {
    driver("cuThreadExchangeStreamCaptureMode", || {
        // SAFETY: exchanges this thread's capture mode with `*mode` (a valid enum value).
        unsafe { sys::cuThreadExchangeStreamCaptureMode(mode) }.result()
    })
}

/// A retained reference to a device's primary context, released on drop.
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    /// The device whose primary context this is.
    device: sys::CUdevice,
    /// The context (valid while `self` is).
    context: sys::CUcontext,
}

impl PrimaryContext {
    /// Initialize the driver (`cuInit`, idempotent) and retain `device`'s primary context
    /// (`cuDevicePrimaryCtxRetain`).
    pub(crate) fn retain(device: sys::CUdevice) -> Result<Self> {
        driver("cuInit", result::init)?;
        // SAFETY: the driver checks the device handle and fails for an invalid one; the
        // reference is released once, in `Drop`.
        let context = driver("cuDevicePrimaryCtxRetain", || unsafe {
            result::primary_ctx::retain(device)
        })?;
        Ok(PrimaryContext { device, context })
    }

    /// The context's handle, valid while `self` is.
    pub(crate) fn handle(&self) -> sys::CUcontext {
        self.context
    }

    /// Make the context current on the calling thread until the guard is dropped (see
    /// [`CurrentContext`]).
    pub(crate) fn enter(&self) -> Result<CurrentContext<'_>> {
        let current = driver("cuCtxGetCurrent", || {
            let mut current: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: writes one context handle (null when none is current).
            unsafe { sys::cuCtxGetCurrent(&mut current) }.result()?;
            Ok(current)
        })?;
        let switch = Switch::enter(current, self.context, set_current)?;
        Ok(CurrentContext {
            switch,
            _context: PhantomData,
        })
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases the one reference taken in `retain`.
        let _ = driver("cuDevicePrimaryCtxRelease", || unsafe {
            result::primary_ctx::release(self.device)
        });
    }
}

/// A primary context made current on the calling thread by [`PrimaryContext::enter`] for the
/// guard's life; on drop, the context that was current before (or none) is current again, on
/// every path, errors and panics included.
///
/// Every function that needs a current context holds one, so the library never changes the
/// context a caller (a runtime-API program, a framework with its own contexts) has current.
/// Guards nest; a guard made while the context is already current changes nothing. It is not
/// `Send`: it restores the context of the thread that made it.
///
/// ```ignore
/// let _context = device.context.enter()?;
/// // driver calls in the device's context
/// ```
pub(crate) struct CurrentContext<'a> {
    /// What to restore.
    switch: Switch<sys::CUcontext>,
    /// The entered context outlives the guard.
    _context: PhantomData<&'a PrimaryContext>,
}

impl Drop for CurrentContext<'_> {
    fn drop(&mut self) {
        // A failure cannot be reported from here; the next driver call reports a broken
        // context anyway.
        let _ = self.switch.leave(set_current);
    }
}

/// `cuCtxSetCurrent`: `context` is a retained primary context or null.
fn set_current(context: sys::CUcontext) -> Result<()> {
    // SAFETY: a retained primary context (alive while its `PrimaryContext` is, which outlives
    // every guard), or the context that was current before a guard, which its owner still
    // holds, or null, which unbinds.
    driver("cuCtxSetCurrent", || unsafe {
        result::ctx::set_current(context)
    })
}

/// The pure part of [`CurrentContext`]: switch the current context from `current` to a
/// target, and back when leaving, only when they differ.
#[derive(Debug)]
struct Switch<C> {
    /// The context to make current again when leaving; `None` when nothing was switched.
    restore: Option<C>,
}

impl<C: Copy + PartialEq> Switch<C> {
    /// Make `target` current (through `set`) unless it is `current` already.
    fn enter(current: C, target: C, set: impl FnOnce(C) -> Result<()>) -> Result<Self> {
        if current == target {
            return Ok(Switch { restore: None });
        }
        set(target)?;
        Ok(Switch {
            restore: Some(current),
        })
    }

    /// Make the context that was current at [`Switch::enter`] current again (once).
    fn leave(&mut self, set: impl FnOnce(C) -> Result<()>) -> Result<()> {
        match self.restore.take() {
            Some(previous) => set(previous),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use sys::cudaError_enum as E;

    /// A thread's current context (0: none) and every `set` made, for [`Switch`].
    struct Thread {
        current: Cell<u32>,
        sets: RefCell<Vec<u32>>,
    }

    impl Thread {
        fn new(current: u32) -> Self {
            Thread {
                current: Cell::new(current),
                sets: RefCell::new(Vec::new()),
            }
        }

        fn set(&self, context: u32) -> Result<()> {
            self.sets.borrow_mut().push(context);
            self.current.set(context);
            Ok(())
        }

        fn enter(&self, target: u32) -> Switch<u32> {
            Switch::enter(self.current.get(), target, |c| self.set(c)).unwrap()
        }
    }

    #[test]
    fn switch_restores_the_previous_context_including_none() {
        for previous in [0, 7] {
            let thread = Thread::new(previous);
            let mut switch = thread.enter(3);
            assert_eq!(thread.current.get(), 3);
            switch.leave(|c| thread.set(c)).unwrap();
            assert_eq!(thread.current.get(), previous);
            assert_eq!(*thread.sets.borrow(), [3, previous]);
            // Leaving again changes nothing.
            switch.leave(|c| thread.set(c)).unwrap();
            assert_eq!(thread.sets.borrow().len(), 2);
        }
    }

    #[test]
    fn switch_to_the_current_context_sets_nothing() {
        let thread = Thread::new(3);
        let mut switch = thread.enter(3);
        switch.leave(|c| thread.set(c)).unwrap();
        assert_eq!(thread.current.get(), 3);
        assert!(thread.sets.borrow().is_empty());
    }

    #[test]
    fn nested_switches_unwind_in_order() {
        let thread = Thread::new(1);
        let mut outer = thread.enter(2);
        let mut same = thread.enter(2);
        let mut inner = thread.enter(5);
        assert_eq!(thread.current.get(), 5);
        inner.leave(|c| thread.set(c)).unwrap();
        assert_eq!(thread.current.get(), 2);
        same.leave(|c| thread.set(c)).unwrap();
        assert_eq!(thread.current.get(), 2);
        outer.leave(|c| thread.set(c)).unwrap();
        assert_eq!(thread.current.get(), 1);
        assert_eq!(*thread.sets.borrow(), [2, 5, 2, 1]);
    }

    #[test]
    fn a_failed_switch_leaves_nothing_to_restore() {
        let failed = Switch::enter(1u32, 2, |_| Err(Error::internal("refused")));
        assert_eq!(failed.unwrap_err().message, "refused");
    }

    #[test]
    fn cuda_errors_map_to_results_and_name_the_error() {
        assert_eq!(
            result_code(E::CUDA_ERROR_OUT_OF_MEMORY),
            symmResult_t::symmOutOfMemory
        );
        assert_eq!(
            result_code(E::CUDA_ERROR_NO_DEVICE),
            symmResult_t::symmNoDevice
        );
        for code in [
            E::CUDA_ERROR_ILLEGAL_ADDRESS,
            E::CUDA_ERROR_LAUNCH_FAILED,
            E::CUDA_ERROR_INVALID_PTX,
            E::CUDA_ERROR_INVALID_VALUE,
        ] {
            assert_eq!(result_code(code), symmResult_t::symmUnhandledCudaError);
        }
        let e = error_with_description(
            "cuMemAlloc",
            E::CUDA_ERROR_OUT_OF_MEMORY,
            Some("out of memory"),
        );
        assert_eq!(e.code, symmResult_t::symmOutOfMemory);
        assert_eq!(
            e.message,
            "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
        );
        let e = error_with_description("cuMemCreate", E::CUDA_ERROR_OUT_OF_MEMORY, None);
        assert_eq!(e.message, "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(
            describe(E::CUDA_ERROR_ILLEGAL_ADDRESS, None),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(
            describe(E::CUDA_ERROR_ILLEGAL_ADDRESS, Some("  ")),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
    }

    #[test]
    fn driver_maps_errors_and_missing_symbols() {
        let e = driver("cuMemAlloc", || -> std::result::Result<(), _> {
            Err(DriverError(E::CUDA_ERROR_OUT_OF_MEMORY))
        })
        .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmOutOfMemory);
        // The driver's description follows when a driver is loaded.
        assert!(
            e.message
                .starts_with("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"),
            "{}",
            e.message
        );
        let e = driver("x", || Err::<(), _>(DriverError(E::CUDA_ERROR_NO_DEVICE))).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmNoDevice);
        let e = driver("x", || {
            Err::<(), _>(DriverError(E::CUDA_ERROR_INVALID_VALUE))
        })
        .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmUnhandledCudaError);
        let e = driver("cuMemMap", || -> std::result::Result<(), DriverError> {
            panic!("Missing symbol cuMemMap")
        })
        .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmNoDevice);
        assert_eq!(
            e.message,
            "cuMemMap: the CUDA driver library is missing or too old"
        );
        assert_eq!(driver("ok", || Ok(5)), Ok(5));
    }

    #[test]
    fn guarded_separates_a_missing_driver_from_the_call_result() {
        assert_eq!(guarded("x", || Ok(3)), Ok(Ok(3)));
        assert_eq!(
            guarded("x", || Err::<(), _>(DriverError(
                E::CUDA_ERROR_NOT_PERMITTED
            ))),
            Ok(Err(DriverError(E::CUDA_ERROR_NOT_PERMITTED)))
        );
        let e = guarded("cuFuncLoad", || -> std::result::Result<(), DriverError> {
            panic!("Missing symbol cuFuncLoad")
        })
        .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmNoDevice);
    }
}
