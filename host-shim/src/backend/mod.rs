//! Backends: where memory lives and how a planned kernel is launched.
//!
//! * [`host`] — host memory, kernels run by `symm_device::arch::host::run_grid` (CI).
//! * [`cuda`] — the CUDA driver, loaded at run time through cudarc; the PTX in `ptx-out/`.
//!
//! `SYMM_BACKEND=host|cuda` chooses; unset, cuda is used when a GPU is usable, else host.

pub mod cuda;
pub mod host;

use crate::error::{Error, Result};
use crate::ffi::types::symmResult_t;
use crate::plan::Launch;
use std::sync::{Arc, OnceLock};

/// Which backend a communicator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Host memory and CPU threads.
    Host,
    /// CUDA devices.
    Cuda,
}

impl BackendKind {
    /// Lower-case name, as `SYMM_BACKEND` spells it.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// A backend instance, shared by every communicator that uses it.
pub enum Backend {
    /// See [`host::HostBackend`].
    Host(host::HostBackend),
    /// See [`cuda::CudaBackend`].
    Cuda(cuda::CudaBackend),
}

/// Per-communicator launch resources (the cuda backend's internal stream and events).
pub enum CommResources {
    /// The host backend needs none.
    Host,
    /// See [`cuda::CommStream`].
    Cuda(cuda::CommStream),
}

impl Backend {
    /// The backend's kind.
    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Host(_) => BackendKind::Host,
            Backend::Cuda(_) => BackendKind::Cuda,
        }
    }

    /// Check that `device` can be used, and create a communicator's launch resources on it.
    pub fn open_comm(&self, device: i32) -> Result<CommResources> {
        match self {
            Backend::Host(_) => Ok(CommResources::Host),
            Backend::Cuda(b) => b.open_comm(device).map(CommResources::Cuda),
        }
    }

    /// Make every pair of `devices` able to access each other's memory.
    pub fn connect_devices(&self, devices: &[i32]) -> Result<()> {
        match self {
            Backend::Host(_) => Ok(()),
            Backend::Cuda(b) => b.connect_devices(devices),
        }
    }

    /// Allocate `bytes` of zeroed memory on `device`; returns its address.
    pub fn alloc_zeroed(&self, device: i32, bytes: usize) -> Result<u64> {
        match self {
            Backend::Host(b) => b.alloc_zeroed(bytes),
            Backend::Cuda(b) => b.alloc_zeroed(device, bytes),
        }
    }

    /// Free memory from [`Backend::alloc_zeroed`].
    pub fn free(&self, device: i32, address: u64) -> Result<()> {
        match self {
            Backend::Host(b) => b.free(address),
            Backend::Cuda(b) => b.free(device, address),
        }
    }

    /// Copy `bytes` to `address` on `device`.
    pub fn upload(&self, device: i32, address: u64, bytes: &[u8]) -> Result<()> {
        match self {
            Backend::Host(b) => b.upload(address, bytes),
            Backend::Cuda(b) => b.upload(device, address, bytes),
        }
    }

    /// Run or enqueue `launch`. On the host backend it has completed when this returns.
    pub fn launch(&self, resources: &CommResources, launch: &Launch) -> Result<()> {
        match (self, resources) {
            (Backend::Host(b), _) => b.launch(launch),
            (Backend::Cuda(b), CommResources::Cuda(stream)) => b.launch(stream, launch),
            (Backend::Cuda(_), CommResources::Host) => {
                Err(Error::internal("cuda launch without a cuda stream"))
            }
        }
    }

    /// Wait until the communicator's queued work is done (before its memory is freed).
    pub fn synchronize(&self, resources: &CommResources) -> Result<()> {
        match (self, resources) {
            (Backend::Cuda(b), CommResources::Cuda(stream)) => b.synchronize(stream),
            _ => Ok(()),
        }
    }
}

/// The backend selected by `SYMM_BACKEND` (see the module docs).
pub fn select() -> Result<Arc<Backend>> {
    static HOST: OnceLock<Arc<Backend>> = OnceLock::new();
    let host = || {
        HOST.get_or_init(|| Arc::new(Backend::Host(host::HostBackend::new())))
            .clone()
    };
    match std::env::var("SYMM_BACKEND").ok().as_deref().map(str::trim) {
        Some("host") => Ok(host()),
        Some("cuda") => cuda::shared().map_err(|e| {
            Error::new(
                symmResult_t::symmNoDevice,
                format!(
                    "SYMM_BACKEND=cuda, but the cuda backend is unusable: {}",
                    e.message
                ),
            )
        }),
        None | Some("") => Ok(cuda::shared().unwrap_or_else(|_| host())),
        Some(other) => Err(Error::invalid_argument(format!(
            "SYMM_BACKEND={other:?} is not a backend: expected \"host\" or \"cuda\""
        ))),
    }
}
