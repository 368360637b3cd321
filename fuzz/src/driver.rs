//! Making the C ABI calls: [`Harness::expect`] runs one call, times it and compares its result
//! code with the model's prediction (and the last-error strings with the call's name); the
//! result codes the predictions are made of; reading the library's strings; issuing a
//! collective; asking the library whether a window completed its registration.

use crate::config::call_bound;
use crate::harness::Harness;
use crate::model::Call;
use crate::stats;
use std::ffi::{CStr, c_char, c_void};
use std::ptr::null_mut;
use std::time::Instant;
use symm::*;

pub(crate) const OK: symmResult_t = symmResult_t::symmSuccess;
pub(crate) const INVALID_ARGUMENT: symmResult_t = symmResult_t::symmInvalidArgument;
pub(crate) const INVALID_USAGE: symmResult_t = symmResult_t::symmInvalidUsage;
pub(crate) const TIMEOUT: symmResult_t = symmResult_t::symmTimeout;

/// Every result code but `symmInternalError`.
pub(crate) fn anything() -> Vec<symmResult_t> {
    (0..=10)
        .filter_map(symmResult_t::from_raw)
        .filter(|r| *r != symmResult_t::symmInternalError)
        .collect()
}

/// A string the library returned (checked: not NULL, not too long).
pub(crate) fn c_text(ptr: *const c_char) -> String {
    assert!(!ptr.is_null(), "the library returned a NULL string");
    // SAFETY: non-NULL, and the library returns NUL-terminated strings valid until the next
    // failing call on this thread or comm (read at once).
    let text = unsafe { CStr::from_ptr(ptr) };
    assert!(text.to_bytes().len() < 4096, "an error string is too long");
    text.to_string_lossy().into_owned()
}

/// `symmGetLastError` of `comm` (NULL: of this thread).
pub(crate) fn last_error(comm: symmComm_t) -> String {
    c_text(symmGetLastError(comm))
}

impl Harness {
    /// Run `call` (the C function `name`), and check its result against `expected`.
    #[track_caller]
    pub(crate) fn expect(
        &self,
        name: &str,
        expected: &[symmResult_t],
        comm: symmComm_t,
        call: impl FnOnce() -> symmResult_t,
    ) -> symmResult_t {
        let started = Instant::now();
        let result = call();
        let elapsed = started.elapsed();
        if elapsed > call_bound() {
            self.fail(format!(
                "{name} took {elapsed:?}: longer than any bounded wait ({result:?})"
            ));
        }
        if result == symmResult_t::symmInternalError {
            self.fail(format!(
                "{name} returned symmInternalError: {}",
                last_error(null_mut())
            ));
        }
        if !expected.contains(&result) {
            self.fail(format!(
                "{name} returned {result:?} ({}), the model expected {expected:?}",
                last_error(null_mut())
            ));
        }
        if result == TIMEOUT {
            stats::add(&stats::TIMEOUTS);
        } else if result != OK {
            stats::add(&stats::PREDICTED_ERRORS);
        }
        if result != OK && name != "symmGroupEnd" {
            let message = last_error(null_mut());
            if !message.contains(name) {
                self.fail(format!(
                    "{name} failed ({result:?}) but the thread's last error does not name it: \
                     {message:?}"
                ));
            }
            if !comm.is_null() && self.locate(comm).is_some() {
                let message = last_error(comm);
                if !message.contains(name) {
                    self.fail(format!(
                        "{name} failed ({result:?}) but the comm's last error does not name it: \
                         {message:?}"
                    ));
                }
            }
        }
        result
    }

    /// Issue one rank's collective `call` on `handle`, expecting one of `expected`.
    pub(crate) fn issue_collective(
        &self,
        handle: symmComm_t,
        call: &Call,
        expected: &[symmResult_t],
    ) -> symmResult_t {
        let send = call.send as *const c_void;
        let recv = call.recv as *mut c_void;
        let stream = null_mut();
        self.expect(call.kind_name(), expected, handle, || match call.kind {
            0 => symmAllReduce(send, recv, call.count, call.dtype, call.op, handle, stream),
            1 => symmAllGather(send, recv, call.count, call.dtype, handle, stream),
            _ => symmReduceScatter(send, recv, call.count, call.dtype, call.op, handle, stream),
        })
    }

    /// Ask the library whether a window finished its registration (used where the model does
    /// not know).
    pub(crate) fn window_is_complete(&self, at: (usize, usize), handle: usize) -> bool {
        let Some(rank) = self.cliques[at.0].ranks[at.1].as_ref() else {
            return false;
        };
        let mut context: *const c_void = std::ptr::null();
        // SAFETY: valid out-pointer.
        let result =
            unsafe { symmCommGetDeviceContext(rank.handle, handle as symmWindow_t, &mut context) };
        result == OK
    }
}
