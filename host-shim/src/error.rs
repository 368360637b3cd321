//! Errors: a [`symmResult_t`] code with a message that names the bad argument, and the
//! per-thread / per-communicator "last error" storage behind `symmGetLastError`.

use crate::abi::symmResult_t;
use std::cell::RefCell;
use std::ffi::CString;

/// An error: the result code the C ABI returns for it, and a message that names the function
/// and the bad argument (its `Display`, the text `symmGetLastError` gives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The code (`symmInvalidArgument`, `symmTimeout`, …).
    pub code: symmResult_t,
    /// What went wrong, naming the function and the argument.
    pub message: String,
}

/// Result of every internal operation.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with `code` and `message`.
    pub fn new(code: symmResult_t, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
        }
    }

    /// `symmInvalidArgument`.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(symmResult_t::symmInvalidArgument, message)
    }

    /// `symmInvalidUsage`.
    pub fn invalid_usage(message: impl Into<String>) -> Self {
        Self::new(symmResult_t::symmInvalidUsage, message)
    }

    /// `symmUnsupported`.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(symmResult_t::symmUnsupported, message)
    }

    /// `symmInternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(symmResult_t::symmInternalError, message)
    }

    /// Prefix the message with the function name.
    pub fn in_function(mut self, function: &str) -> Self {
        self.message = format!("{function}: {}", self.message);
        self
    }
}

impl std::fmt::Display for Error {
    /// The message, as `symmGetLastError` gives it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// A C string that can always be built from a message (interior NULs are replaced).
pub fn c_message(message: &str) -> CString {
    CString::new(message.replace('\0', "?")).expect("NULs were replaced")
}

std::thread_local! {
    static THREAD_LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `message` as the calling thread's last error.
pub fn set_thread_last_error(message: &str) {
    THREAD_LAST_ERROR.with(|e| *e.borrow_mut() = c_message(message));
}

/// The calling thread's last error. The pointer stays valid until the next failing call on
/// this thread.
pub fn thread_last_error() -> *const std::ffi::c_char {
    THREAD_LAST_ERROR.with(|e| e.borrow().as_ptr())
}
