//! The cuda backend: the CUDA driver through cudarc, loaded at run time (libsymm builds and
//! runs with no CUDA installed; then this backend reports `symmNoDevice`).
//!
//! Every driver call goes through [`driver`] (see [`super::driver`]), which turns a driver
//! error into a `symmResult_t` and a panic (cudarc panics when a symbol is missing) into an
//! error. Every entry that needs a device's context holds the guard of
//! [`PrimaryContext::enter`](super::driver::PrimaryContext::enter), so the caller's current
//! context is the same after the call as before it.
//!
//! One file per driver concept; this one is the backend's facade: [`CudaBackend`] (the driver
//! initialized, the devices opened on first use, peer access between them) and the free
//! functions other modules call.
//!
//! * [`device`] — [`device::CudaDevice`]: a device opened, its primary context, setup stream
//!   and caches (kernels, launch events, residency).
//! * [`module`] — kernels loaded on a device: the shipped SASS, each kernel's PTX module
//!   JIT-compiled (the JIT's logs quoted in errors), users' PTX.
//! * [`memory`] — device allocations, copies, mapped host flags, registered host memory, and
//!   which memory a device's kernels reach.
//! * [`stream`] — communicators' streams ([`CommStream`]) and their events, streams made for
//!   callers, the kind of a caller's stream, the event recorded after each launch on one, and
//!   the guards that destroy a stream or event an error path leaves behind.
//! * [`launch`] — launches: symm's collectives (prepared, co-residency checked, enqueued as a
//!   schedule), users' kernels, and kernels launched by name and timed.
//! * [`async_error`] — polling a communicator's streams for the error of work already queued.

mod async_error;
mod device;
mod launch;
mod memory;
mod module;
mod stream;

pub use launch::{PreparedLaunch, launched_param_types};
pub use stream::CommStream;

use self::device::{CudaDevice, open_device};
use super::driver::{driver, library_present};
use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The CUDA driver and the devices opened so far.
pub struct CudaBackend {
    device_count: i32,
    devices: Mutex<HashMap<i32, Arc<CudaDevice>>>,
}

/// The process-wide cuda backend, or why it is unusable.
pub fn shared() -> Result<Arc<super::Backend>> {
    static SHARED: OnceLock<Result<Arc<super::Backend>>> = OnceLock::new();
    SHARED
        .get_or_init(|| CudaBackend::probe().map(|b| Arc::new(super::Backend::Cuda(b))))
        .clone()
}

/// The driver's handle of device `ordinal` (the cuda backend is in use, so the driver is
/// loaded and initialized).
pub fn cu_device(ordinal: i32) -> Result<sys::CUdevice> {
    driver("cuDeviceGet", || result::device::get(ordinal))
}

/// Whether the caller's stream `handle` is being captured into a CUDA graph.
pub fn stream_is_capturing(handle: u64) -> Result<bool> {
    stream::is_capturing(handle)
}

/// The calling thread's current CUDA device, if the driver is present and a context is current.
pub fn current_device() -> Option<i32> {
    if !library_present() {
        return None;
    }
    driver("cuCtxGetDevice", || {
        let mut device: sys::CUdevice = 0;
        // SAFETY: writes one CUdevice.
        unsafe { sys::cuCtxGetDevice(&mut device) }.result()?;
        Ok(device)
    })
    .ok()
}

impl CudaBackend {
    fn probe() -> Result<Self> {
        if !library_present() {
            return Err(Error::new(
                symmResult_t::symmNoDevice,
                "libcuda could not be loaded (no NVIDIA driver)",
            ));
        }
        driver("cuInit", result::init)?;
        let device_count = driver("cuDeviceGetCount", result::device::get_count)?;
        if device_count <= 0 {
            return Err(Error::new(symmResult_t::symmNoDevice, "no CUDA device"));
        }
        Ok(CudaBackend {
            device_count,
            devices: Mutex::new(HashMap::new()),
        })
    }

    fn device(&self, ordinal: i32) -> Result<Arc<CudaDevice>> {
        if ordinal < 0 || ordinal >= self.device_count {
            return Err(Error::invalid_argument(format!(
                "device {ordinal} does not exist ({} CUDA devices)",
                self.device_count
            )));
        }
        let mut devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = devices.get(&ordinal) {
            return Ok(d.clone());
        }
        let device = open_device(ordinal)?;
        let device = Arc::new(device);
        devices.insert(ordinal, device.clone());
        Ok(device)
    }

    /// See [`super::Backend::connect_devices`].
    pub fn connect_devices(&self, ordinals: &[i32]) -> Result<()> {
        let mut distinct: Vec<i32> = ordinals.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        for &a in &distinct {
            for &b in &distinct {
                if a == b {
                    continue;
                }
                let (da, db) = (self.device(a)?, self.device(b)?);
                let can = driver("cuDeviceCanAccessPeer", || {
                    let mut can = 0;
                    // SAFETY: plain queries on valid ordinals.
                    unsafe {
                        let (ca, cb) = (result::device::get(a)?, result::device::get(b)?);
                        sys::cuDeviceCanAccessPeer(&mut can, ca, cb).result()?;
                    }
                    Ok(can)
                })?;
                if can == 0 {
                    return Err(Error::unsupported(format!(
                        "device {a} cannot access device {b}'s memory (no peer access)"
                    )));
                }
                let _context = da.context.enter()?;
                // SAFETY: both contexts are retained primary contexts.
                let status = unsafe { sys::cuCtxEnablePeerAccess(db.context.handle(), 0) };
                if status != sys::cudaError_enum::CUDA_SUCCESS
                    && status != sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
                {
                    return Err(Error::new(
                        symmResult_t::symmUnhandledCudaError,
                        format!("cuCtxEnablePeerAccess({a} -> {b}) failed: {status:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The compute capability of device `ordinal`.
    pub fn compute_capability(&self, ordinal: i32) -> Result<(i32, i32)> {
        Ok(self.device(ordinal)?.capability)
    }
}
