//! A device of the cuda backend once opened: its primary context, its setup stream, what it
//! is (capability, multiprocessors, PTX target) and what is cached on it for the process (the
//! kernels loaded, the shipped SASS, the launch events of callers' streams, the residency of
//! each kernel and block size, the time of the last error poll).

use super::cu_device;
use super::module::SassModule;
use super::stream::OwnedStream;
use crate::backend::driver::{PrimaryContext, device_attribute};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A device with its primary context and the kernels loaded on it so far.
pub(super) struct CudaDevice {
    /// The device ordinal.
    pub(super) ordinal: i32,
    /// The device's primary context, retained for the device's life.
    pub(super) context: PrimaryContext,
    /// A non-blocking stream for the library's own uploads: never captured, never waited on
    /// by a user's stream, so uploads run at once even while a graph is being captured.
    pub(super) setup_stream: sys::CUstream,
    pub(super) capability: (i32, i32),
    /// Kernel name → function. Each kernel is its own module (see `symm_artifacts::split`),
    /// loaded on first use and kept for the process.
    pub(super) functions: Mutex<HashMap<String, sys::CUfunction>>,
    pub(super) multiprocessors: u32,
    /// Kernels reach pageable host memory (`CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`: HMM or
    /// address translation services).
    pub(super) pageable_access: bool,
    pub(super) ptx_target: &'static str,
    /// The shipped SASS for this GPU, loaded as one module at the first kernel's load: `None`
    /// when none runs on it, `SYMM_JIT_PTX` asks for the PTX, or the driver refused it (an
    /// older driver than the ptxas that assembled it); kernels then come from the PTX.
    pub(super) sass: OnceLock<Option<SassModule>>,
    /// When the device's streams were last queried for errors and none was found (see
    /// [`CudaBackend::async_error`](super::CudaBackend::async_error)).
    pub(super) error_poll: Mutex<Option<std::time::Instant>>,
    /// One event per caller's stream a collective was launched on (keyed by `stream_key`),
    /// recorded again after every launch on that stream (see
    /// [`CudaBackend::mark_launch`](super::CudaBackend::mark_launch)). Kept for the device's
    /// life: a handful of events per stream ever used.
    pub(super) launch_events: Mutex<HashMap<(u64, u64), sys::CUevent>>,
    /// (function, threads per block) → blocks resident at once on the device (see
    /// `resident_blocks`): asked of the driver once per kernel and block size.
    pub(super) resident: Mutex<HashMap<(usize, u32), u32>>,
}

// SAFETY: CUDA driver handles (contexts, functions) may be used from any thread; the driver
// synchronizes internally.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the map is behind a mutex and the rest is immutable after creation.
unsafe impl Sync for CudaDevice {}

/// Open device `ordinal`: retain its primary context (released again if anything after
/// fails), check its compute capability, create its setup stream.
pub(super) fn open_device(ordinal: i32) -> Result<CudaDevice> {
    let cu = cu_device(ordinal)?;
    let context = PrimaryContext::retain(cu)?;
    let entered = context.enter()?;
    let attribute = |a| device_attribute(cu, a);
    let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let ptx_target = crate::ptx::target_for_capability(major, minor).ok_or_else(|| {
        match crate::ptx::targets_for_capability(major, minor).first() {
            None => Error::unsupported(format!(
                "device {ordinal} has compute capability {major}.{minor}; symm needs 8.0 or \
                 newer"
            )),
            Some(target) => Error::unsupported(format!(
                "device {ordinal} has compute capability {major}.{minor}, and this build of \
                 symm embeds no PTX that runs there (it embeds {:?}): enable the symm crate's \
                 feature `ptx-{}` (its default features embed every target)",
                crate::ptx::embedded_targets(),
                target.replace('_', "")
            )),
        }
    })?;
    let multiprocessors =
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let setup_stream = OwnedStream::create()?.into_raw();
    drop(entered);
    Ok(CudaDevice {
        ordinal,
        context,
        setup_stream,
        capability: (major, minor),
        functions: Mutex::new(HashMap::new()),
        multiprocessors: multiprocessors.max(1) as u32,
        pageable_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
        )
        .is_ok_and(|v| v != 0),
        ptx_target,
        sass: OnceLock::new(),
        error_poll: Mutex::new(None),
        launch_events: Mutex::new(HashMap::new()),
        resident: Mutex::new(HashMap::new()),
    })
}
