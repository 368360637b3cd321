//! The cuda backend: the CUDA driver through cudarc, loaded at run time (libsymm builds and
//! runs with no CUDA installed; then this backend reports `symmNoDevice`).
//!
//! Every driver call goes through [`driver`], which turns a driver error into a
//! `symmResult_t` and a panic (cudarc panics when a symbol is missing) into an error.

use crate::error::{Error, Result};
use crate::ffi::types::symmResult_t;
use crate::plan::{KernelId, Launch};
use cudarc::driver::{DriverError, result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

/// Run a driver call, mapping failures and panics to errors that name `what`.
fn driver<T>(what: &str, call: impl FnOnce() -> std::result::Result<T, DriverError>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(DriverError(code))) => {
            let result = if code == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                symmResult_t::symmOutOfMemory
            } else {
                symmResult_t::symmUnhandledCudaError
            };
            Err(Error::new(result, format!("{what} failed: {code:?}")))
        }
        Err(_) => Err(Error::new(
            symmResult_t::symmNoDevice,
            format!("{what}: the CUDA driver library is missing or too old"),
        )),
    }
}

/// A device with its primary context and loaded module.
struct CudaDevice {
    context: sys::CUcontext,
    all_reduce_f32_sum: sys::CUfunction,
    ptx_target: &'static str,
}

// SAFETY: CUDA driver handles (contexts, functions) may be used from any thread; the driver
// synchronizes internally.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the struct is immutable after creation.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    fn make_current(&self) -> Result<()> {
        // SAFETY: the context is a retained primary context, alive for the process.
        driver("cuCtxSetCurrent", || unsafe {
            result::ctx::set_current(self.context)
        })
    }

    fn function(&self, kernel: KernelId) -> sys::CUfunction {
        match kernel {
            KernelId::OneShotAllReduceF32Sum => self.all_reduce_f32_sum,
        }
    }
}

/// The CUDA driver and the devices opened so far.
pub struct CudaBackend {
    device_count: i32,
    devices: Mutex<HashMap<i32, Arc<CudaDevice>>>,
}

/// A communicator's internal stream and the two events that order it with the caller's
/// stream: every kernel runs on the internal stream, so ranks never share a stream (ranks
/// sharing one stream would serialize and wait for each other forever).
pub struct CommStream {
    device: Arc<CudaDevice>,
    stream: sys::CUstream,
    before: sys::CUevent,
    after: sys::CUevent,
}

// SAFETY: driver handles may be used from any thread.
unsafe impl Send for CommStream {}
// SAFETY: as above.
unsafe impl Sync for CommStream {}

impl Drop for CommStream {
    fn drop(&mut self) {
        let _ = self.device.make_current();
        // SAFETY: the handles were created by `open_comm` and are destroyed once, here.
        let _ = driver("destroying a stream", || unsafe {
            result::stream::synchronize(self.stream)?;
            result::event::destroy(self.before)?;
            result::event::destroy(self.after)?;
            result::stream::destroy(self.stream)
        });
    }
}

/// The process-wide cuda backend, or why it is unusable.
pub fn shared() -> Result<Arc<super::Backend>> {
    static SHARED: OnceLock<Result<Arc<super::Backend>>> = OnceLock::new();
    SHARED
        .get_or_init(|| CudaBackend::probe().map(|b| Arc::new(super::Backend::Cuda(b))))
        .clone()
}

/// The calling thread's current CUDA device, if the driver is present and a context is current.
pub fn current_device() -> Option<i32> {
    // SAFETY: only checks whether the library can be loaded.
    if !unsafe { sys::is_culib_present() } {
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
        // SAFETY: only checks whether the library can be loaded.
        if !unsafe { sys::is_culib_present() } {
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

    /// See [`super::Backend::open_comm`].
    pub fn open_comm(&self, ordinal: i32) -> Result<CommStream> {
        let device = self.device(ordinal)?;
        device.make_current()?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let stream = driver("cuStreamCreate", || {
            result::stream::create(result::stream::StreamKind::NonBlocking)
        })?;
        let before = driver("cuEventCreate", || result::event::create(flags))?;
        let after = driver("cuEventCreate", || result::event::create(flags))?;
        Ok(CommStream {
            device,
            stream,
            before,
            after,
        })
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
                da.make_current()?;
                // SAFETY: both contexts are retained primary contexts.
                let status = unsafe { sys::cuCtxEnablePeerAccess(db.context, 0) };
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

    /// See [`super::Backend::alloc_zeroed`].
    pub fn alloc_zeroed(&self, ordinal: i32, bytes: usize) -> Result<u64> {
        self.device(ordinal)?.make_current()?;
        // SAFETY: a fresh allocation of `bytes`, zeroed before use.
        driver("cuMemAlloc", || unsafe {
            let address = result::malloc_sync(bytes)?;
            result::memset_d8_sync(address, 0, bytes)?;
            Ok(address)
        })
    }

    /// See [`super::Backend::free`].
    pub fn free(&self, ordinal: i32, address: u64) -> Result<()> {
        self.device(ordinal)?.make_current()?;
        // SAFETY: `address` came from `alloc_zeroed` and is freed once (callers own it).
        driver("cuMemFree", || unsafe { result::free_sync(address) })
    }

    /// See [`super::Backend::upload`].
    pub fn upload(&self, ordinal: i32, address: u64, bytes: &[u8]) -> Result<()> {
        self.device(ordinal)?.make_current()?;
        // SAFETY: callers pass an allocation with room for `bytes`.
        driver("cuMemcpyHtoD", || unsafe {
            result::memcpy_htod_sync(address, bytes)
        })
    }

    /// Enqueue `launch` on the communicator's stream, ordered after and before the caller's.
    pub fn launch(&self, comm: &CommStream, launch: &Launch) -> Result<()> {
        let device = &comm.device;
        device.make_current()?;
        let user = launch.stream as sys::CUstream;
        let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        let mut context = launch.context;
        let mut send_offset = launch.args.send_offset;
        let mut recv_offset = launch.args.recv_offset;
        let mut count = launch.args.count;
        let mut flags = launch.args.flags;
        let mut params: [*mut c_void; 5] = [
            (&mut context as *mut u64).cast(),
            (&mut send_offset as *mut u64).cast(),
            (&mut recv_offset as *mut u64).cast(),
            (&mut count as *mut u64).cast(),
            (&mut flags as *mut u32).cast(),
        ];
        let function = device.function(launch.kernel);
        // SAFETY: the parameters match the kernel's signature (ctx, send_offset, recv_offset,
        // count, flags) and live until cuLaunchKernel has copied them; the events and stream
        // belong to this device's context.
        driver("launching a kernel", || unsafe {
            result::event::record(comm.before, user)?;
            result::stream::wait_event(comm.stream, comm.before, wait)?;
            result::launch_kernel(
                function,
                (launch.grid, 1, 1),
                (launch.block, 1, 1),
                0,
                comm.stream,
                &mut params,
            )?;
            result::event::record(comm.after, comm.stream)?;
            result::stream::wait_event(user, comm.after, wait)
        })
        .map_err(|e| Error::new(e.code, format!("{} ({} PTX)", e.message, device.ptx_target)))
    }

    /// Wait for the communicator's stream.
    pub fn synchronize(&self, comm: &CommStream) -> Result<()> {
        comm.device.make_current()?;
        // SAFETY: the stream belongs to this context.
        driver("cuStreamSynchronize", || unsafe {
            result::stream::synchronize(comm.stream)
        })
    }
}

fn open_device(ordinal: i32) -> Result<CudaDevice> {
    let cu = driver("cuDeviceGet", || result::device::get(ordinal))?;
    // SAFETY: `cu` is a valid device.
    let context = driver("cuDevicePrimaryCtxRetain", || unsafe {
        result::primary_ctx::retain(cu)
    })?;
    // SAFETY: a retained primary context.
    driver("cuCtxSetCurrent", || unsafe {
        result::ctx::set_current(context)
    })?;
    let attribute = |a| {
        // SAFETY: `cu` is a valid device.
        driver("cuDeviceGetAttribute", || unsafe {
            result::device::get_attribute(cu, a)
        })
    };
    let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let (ptx_target, ptx) = crate::ptx::for_capability(major, minor).ok_or_else(|| {
        Error::unsupported(format!(
            "device {ordinal} has compute capability {major}.{minor}; symm needs 8.0 or newer"
        ))
    })?;
    let image = CString::new(ptx).map_err(|_| Error::internal("embedded PTX contains NUL"))?;
    // SAFETY: a NUL-terminated PTX image; the module lives for the process.
    let module = driver("cuModuleLoadData", || unsafe {
        result::module::load_data(image.as_ptr().cast())
    })?;
    let name = CString::new(KernelId::OneShotAllReduceF32Sum.ptx_name()).expect("no NUL");
    // SAFETY: `module` was just loaded.
    let all_reduce_f32_sum = driver("cuModuleGetFunction", || unsafe {
        result::module::get_function(module, name)
    })?;
    Ok(CudaDevice {
        context,
        all_reduce_f32_sum,
        ptx_target,
    })
}
