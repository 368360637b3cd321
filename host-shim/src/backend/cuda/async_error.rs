//! The asynchronous error of a communicator on the cuda backend: its stream and its device's
//! setup stream queried without blocking (a trapped or faulting kernel poisons the context),
//! at most once per [`ERROR_POLL_INTERVAL`] for the calls' own checks.

use super::CudaBackend;
use super::stream::CommStream;
use crate::abi::symmResult_t;
use crate::backend::driver::{describe, error_description, guarded, outside_capture};
use crate::error::Error;
use cudarc::driver::{DriverError, sys};

/// How long a device's last error poll that found nothing stands for the calls' own checks:
/// a collective does not query the driver for errors more often (an error that poisons the
/// context also fails the next launch; `symmCommGetAsyncError` always queries).
const ERROR_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

impl CudaBackend {
    /// See [`Backend::async_error`](crate::backend::Backend::async_error): the error that work
    /// queued by or for `comm` raised, if any, without blocking. The communicator's stream is
    /// queried (`cuStreamQuery`) unless a capture is under way on it (a query would invalidate the
    /// capture; nothing of it has run anyway); the device's setup stream, never captured, is
    /// queried too, and reports an error that poisoned the context. Unless `fresh`, nothing is
    /// queried within [`ERROR_POLL_INTERVAL`] of a query of the device that found nothing.
    pub fn async_error(&self, comm: &CommStream, fresh: bool) -> Option<Error> {
        let device = &comm.device;
        let polled = || {
            device
                .error_poll
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_some_and(|at| at.elapsed() < ERROR_POLL_INTERVAL)
        };
        if !fresh && polled() {
            return None;
        }
        let unusable = |e: Error| {
            Error::new(
                symmResult_t::symmUnhandledCudaError,
                format!("device {}: {}", device.ordinal, e.message),
            )
        };
        let _context = match device.context.enter() {
            Ok(guard) => guard,
            Err(e) => return Some(unusable(e)),
        };
        // Querying enqueues nothing and does not block.
        let status = outside_capture(|| {
            // SAFETY: both streams belong to this context and live as long as `comm`.
            guarded("cuStreamIsCapturing, cuStreamQuery", || unsafe {
                let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                sys::cuStreamIsCapturing(comm.stream, &mut capture).result()?;
                if capture == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    let status = sys::cuStreamQuery(comm.stream);
                    if status != sys::cudaError_enum::CUDA_ERROR_NOT_READY {
                        status.result()?;
                    }
                }
                let status = sys::cuStreamQuery(device.setup_stream);
                if status != sys::cudaError_enum::CUDA_ERROR_NOT_READY {
                    status.result()?;
                }
                Ok(())
            })
        });
        match status {
            Ok(Ok(())) => {
                *device.error_poll.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(std::time::Instant::now());
                None
            }
            Ok(Err(DriverError(code))) => {
                async_status(device.ordinal, code, error_description(code).as_deref())
            }
            // The driver is missing, or the capture mode could not be relaxed.
            Err(e) => Some(unusable(e)),
        }
    }
}

/// The asynchronous error of a communicator on `device` for the status `code` of a
/// non-blocking stream query: `None` when the work succeeded or is still running, else
/// `symmUnhandledCudaError` naming the CUDA error. A kernel that traps or faults poisons the
/// whole context: from then on every driver call in it returns that (sticky) error.
fn async_status(device: i32, code: sys::CUresult, description: Option<&str>) -> Option<Error> {
    match code {
        sys::cudaError_enum::CUDA_SUCCESS | sys::cudaError_enum::CUDA_ERROR_NOT_READY => None,
        _ => Some(Error::new(
            symmResult_t::symmUnhandledCudaError,
            format!(
                "device {device} reported {}: work queued on it failed (a kernel trapped or \
                 accessed an illegal address, or the CUDA context is unusable)",
                describe(code, description)
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sys::cudaError_enum as E;

    #[test]
    fn stream_status_becomes_an_async_error_only_on_failure() {
        assert_eq!(async_status(0, E::CUDA_SUCCESS, None), None);
        assert_eq!(async_status(0, E::CUDA_ERROR_NOT_READY, None), None);
        for code in [
            E::CUDA_ERROR_ILLEGAL_ADDRESS,
            E::CUDA_ERROR_LAUNCH_FAILED,
            E::CUDA_ERROR_ASSERT,
            E::CUDA_ERROR_OUT_OF_MEMORY,
        ] {
            let e = async_status(3, code, Some("what the driver says")).unwrap();
            assert_eq!(e.code, symmResult_t::symmUnhandledCudaError);
            assert!(e.message.starts_with("device 3 reported "), "{}", e.message);
            assert!(e.message.contains(&format!("{code:?}")), "{}", e.message);
            assert!(
                e.message.contains("(what the driver says)"),
                "{}",
                e.message
            );
        }
    }
}
