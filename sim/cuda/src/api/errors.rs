//! `cuGetErrorString` and `cuGetErrorName` (usable before `cuInit`).

use crate::util::{entry, put};
use cudarc::driver::sys::{CUresult, cudaError_enum as E};
use std::ffi::{CStr, c_char};

macro_rules! errors {
    ($($name:ident => $text:literal,)*) => {
        /// (code, name, description) of every error the driver knows.
        const ERRORS: &[(E, &CStr, &CStr)] = &[
            $((E::$name, {
                const NAME: &str = concat!(stringify!($name), "\0");
                match CStr::from_bytes_with_nul(NAME.as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("error name"),
                }
            }, {
                const TEXT: &str = concat!($text, "\0");
                match CStr::from_bytes_with_nul(TEXT.as_bytes()) {
                    Ok(s) => s,
                    Err(_) => panic!("error text"),
                }
            }),)*
        ];
    };
}

errors! {
    CUDA_SUCCESS => "no error",
    CUDA_ERROR_INVALID_VALUE => "invalid argument",
    CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
    CUDA_ERROR_NOT_INITIALIZED => "initialization error",
    CUDA_ERROR_DEINITIALIZED => "driver shutting down",
    CUDA_ERROR_STUB_LIBRARY => "CUDA driver is a stub library",
    CUDA_ERROR_DEVICE_UNAVAILABLE => "CUDA-capable device(s) is/are busy or unavailable",
    CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
    CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
    CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
    CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
    CUDA_ERROR_MAP_FAILED => "mapping of buffer object failed",
    CUDA_ERROR_UNMAP_FAILED => "unmapping of buffer object failed",
    CUDA_ERROR_ALREADY_MAPPED => "resource already mapped",
    CUDA_ERROR_NO_BINARY_FOR_GPU => "no kernel image is available for execution on the device",
    CUDA_ERROR_NOT_MAPPED => "resource not mapped",
    CUDA_ERROR_ECC_UNCORRECTABLE => "uncorrectable ECC error encountered",
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => "peer access is not supported between these two devices",
    CUDA_ERROR_INVALID_PTX => "a PTX JIT compilation failed",
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION => "the provided PTX was compiled with an unsupported toolchain.",
    CUDA_ERROR_OPERATING_SYSTEM => "OS call failed or operation not supported on this OS",
    CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
    CUDA_ERROR_ILLEGAL_STATE => "the operation cannot be performed in the present state",
    CUDA_ERROR_NOT_FOUND => "named symbol not found",
    CUDA_ERROR_NOT_READY => "device not ready",
    CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "too many resources requested for launch",
    CUDA_ERROR_LAUNCH_TIMEOUT => "the launch timed out and was terminated",
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => "peer access is already enabled",
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => "peer access has not been enabled",
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE => "cannot set while device is active in this process",
    CUDA_ERROR_CONTEXT_IS_DESTROYED => "context is destroyed",
    CUDA_ERROR_ASSERT => "device-side assert triggered",
    CUDA_ERROR_ILLEGAL_INSTRUCTION => "an illegal instruction was encountered",
    CUDA_ERROR_MISALIGNED_ADDRESS => "misaligned address",
    CUDA_ERROR_INVALID_ADDRESS_SPACE => "operation not supported on global/shared address space",
    CUDA_ERROR_INVALID_PC => "invalid program counter",
    CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE => "too many blocks in cooperative launch",
    CUDA_ERROR_NOT_PERMITTED => "operation not permitted",
    CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => "operation not permitted when stream is capturing",
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => "operation failed due to a previous error during capture",
    CUDA_ERROR_STREAM_CAPTURE_MERGE => "operation would result in a merge of separate capture sequences",
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => "capture was not ended in the same stream as it began",
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED => "capturing stream has unjoined work",
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION => "dependency created on uncaptured work in another stream",
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => "operation would make the legacy stream depend on a capturing blocking stream",
    CUDA_ERROR_CAPTURED_EVENT => "operation not permitted on an event last recorded in a capturing stream",
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => "attempt to terminate a thread-local capture sequence from another thread",
    CUDA_ERROR_TIMEOUT => "wait operation timed out",
    CUDA_ERROR_INVALID_CLUSTER_SIZE => "invalid cluster size",
    CUDA_ERROR_UNKNOWN => "unknown error",
}

fn lookup(code: u32) -> Option<&'static (E, &'static CStr, &'static CStr)> {
    ERRORS.iter().find(|(e, _, _)| *e as u32 == code)
}

/// `cuGetErrorString`: the description of `error` (a static string).
///
/// # Safety
/// `text` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: u32, text: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", || {
        let found = lookup(error);
        let value = found.map_or(std::ptr::null(), |(_, _, t)| t.as_ptr());
        // SAFETY: the caller's output pointer.
        unsafe { put(text, value) }?;
        found.map(|_| ()).ok_or(E::CUDA_ERROR_INVALID_VALUE)
    })
}

/// `cuGetErrorName`: the name of `error` (a static string).
///
/// # Safety
/// `text` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: u32, text: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", || {
        let found = lookup(error);
        let value = found.map_or(std::ptr::null(), |(_, n, _)| n.as_ptr());
        // SAFETY: the caller's output pointer.
        unsafe { put(text, value) }?;
        found.map(|_| ()).ok_or(E::CUDA_ERROR_INVALID_VALUE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_enum() {
        for (code, name, _) in ERRORS {
            assert_eq!(format!("{code:?}"), name.to_str().unwrap());
        }
        assert!(lookup(123_456).is_none());
    }
}
