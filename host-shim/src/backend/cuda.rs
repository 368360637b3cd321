//! The cuda backend: the CUDA driver through cudarc, loaded at run time (libsymm builds and
//! runs with no CUDA installed; then this backend reports `symmNoDevice`).
//!
//! Every driver call goes through [`driver`] (see [`super::driver`]), which turns a driver
//! error into a `symmResult_t` and a panic (cudarc panics when a symbol is missing) into an
//! error. Every entry that needs a device's context holds the guard of
//! [`PrimaryContext::enter`], so the caller's current context is the same after the call as
//! before it.

use super::Flag;
use super::driver::{
    PrimaryContext, describe, device_attribute, driver, error_description, guarded,
    library_present, outside_capture,
};
use crate::abi::symmResult_t;
use crate::backend::kernel::{self, KernelArg, KernelLaunch};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::launch::schedule::{self, LaunchSchedule, StreamKind, StreamOp};
use crate::log::{Level, Subsys};
use crate::plan::KernelId;
use cudarc::driver::{DriverError, result, sys};
use std::collections::HashMap;
use std::ffi::{CStr, CString, c_void};
use std::panic::catch_unwind;
use std::sync::{Arc, Mutex, OnceLock};

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

/// Bytes of each JIT log buffer given to `cuModuleLoadDataEx`.
const JIT_LOG_BYTES: usize = 16 * 1024;

/// Most characters of a JIT log quoted in an error message.
const JIT_LOG_SHOWN: usize = 4000;

/// A JIT log buffer as text for an error message: up to its first NUL, trimmed, at most
/// [`JIT_LOG_SHOWN`] characters (then marked as cut); `None` when empty.
fn jit_log_text(buffer: &[u8]) -> Option<String> {
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    let text = String::from_utf8_lossy(&buffer[..end]);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let mut shown: String = text.chars().take(JIT_LOG_SHOWN).collect();
    if shown.len() < text.len() {
        shown.push_str(" [...]");
    }
    Some(shown)
}

/// `message` followed by the JIT error and info logs that are not empty.
fn with_jit_logs(message: String, error_log: &[u8], info_log: &[u8]) -> String {
    let mut message = message;
    if let Some(log) = jit_log_text(error_log) {
        message.push_str("; JIT error log: ");
        message.push_str(&log);
    }
    if let Some(log) = jit_log_text(info_log) {
        message.push_str("; JIT info log: ");
        message.push_str(&log);
    }
    message
}

/// Load `image` (NUL-terminated PTX, or a cubin) as a module, the JIT writing its error and
/// info logs into the two buffers (`cuModuleLoadDataEx` with the log options).
///
/// # Safety
/// `image` is a NUL-terminated PTX text or a complete cubin; a context is current; nothing is
/// being captured on this thread in global mode (see [`outside_capture`]).
unsafe fn load_module(
    image: *const u8,
    error_log: &mut [u8],
    info_log: &mut [u8],
) -> std::result::Result<sys::CUmodule, DriverError> {
    use sys::CUjit_option::*;
    let mut options = [
        CU_JIT_ERROR_LOG_BUFFER,
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        CU_JIT_INFO_LOG_BUFFER,
        CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
    ];
    // The size options are unsigned ints passed in the pointer-sized value slots, as the
    // driver API specifies for scalar option values.
    let mut values: [*mut c_void; 4] = [
        error_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(error_log.len()),
        info_log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(info_log.len()),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the image is complete (contract); the log buffers are valid for writes of the
    // sizes given and outlive the call; the option and value arrays have 4 entries each.
    unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    }
    .result()?;
    Ok(module)
}

/// Make `function` loaded on the device now rather than at its first launch. With lazy
/// loading (the driver's default since CUDA 12.2, `CUDA_MODULE_LOADING=LAZY`) a function
/// is loaded at first launch, which may happen inside a stream capture or while peers'
/// kernels already wait for this one. `cuFuncLoad` (CUDA 12.4) loads it; older drivers lack
/// it, and there `cuFuncGetAttribute`, which also loads a lazily loaded function, is used.
///
/// # Safety
/// `function` is a valid function handle; its context is current.
unsafe fn force_load(function: sys::CUfunction) -> std::result::Result<(), DriverError> {
    static HAS_FUNC_LOAD: OnceLock<bool> = OnceLock::new();
    let has_func_load = *HAS_FUNC_LOAD.get_or_init(|| {
        catch_unwind(|| {
            // SAFETY: only looks the symbol up in the already loaded driver library.
            unsafe {
                sys::culib()
                    .get::<unsafe extern "C" fn(sys::CUfunction) -> sys::CUresult>(b"cuFuncLoad")
                    .is_ok()
            }
        })
        .unwrap_or(false)
    });
    if has_func_load {
        // SAFETY: a valid function handle (caller's contract); the symbol exists.
        unsafe { sys::cuFuncLoad(function) }.result()
    } else {
        let mut registers = 0;
        // SAFETY: a valid function handle; writes one int.
        unsafe {
            sys::cuFuncGetAttribute(
                &mut registers,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS,
                function,
            )
        }
        .result()
    }
}

/// A device with its primary context and the kernels loaded on it so far.
pub(crate) struct CudaDevice {
    /// The device ordinal.
    ordinal: i32,
    /// The device's primary context, retained for the device's life.
    context: PrimaryContext,
    /// A non-blocking stream for the library's own uploads: never captured, never waited on
    /// by a user's stream, so uploads run at once even while a graph is being captured.
    setup_stream: sys::CUstream,
    capability: (i32, i32),
    /// Kernel name → function. Each kernel is its own module (see `symm_artifacts::split`),
    /// loaded on first use and kept for the process.
    functions: Mutex<HashMap<String, sys::CUfunction>>,
    multiprocessors: u32,
    /// Kernels reach pageable host memory (`CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`: HMM or
    /// address translation services).
    pageable_access: bool,
    ptx_target: &'static str,
    /// The shipped SASS for this GPU, loaded as one module at the first kernel's load: `None`
    /// when none runs on it, `SYMM_JIT_PTX` asks for the PTX, or the driver refused it (an
    /// older driver than the ptxas that assembled it); kernels then come from the PTX.
    sass: OnceLock<Option<SassModule>>,
    /// When the device's streams were last queried for errors and none was found (see
    /// [`CudaBackend::async_error`]).
    error_poll: Mutex<Option<std::time::Instant>>,
    /// One event per caller's stream a collective was launched on ([`stream_key`]), recorded
    /// again after every launch on that stream (see [`CudaBackend::mark_launch`]). Kept for
    /// the device's life: a handful of events per stream ever used.
    launch_events: Mutex<HashMap<(u64, u64), sys::CUevent>>,
    /// (function, threads per block) → blocks resident at once on the device (see
    /// [`resident_blocks`]): asked of the driver once per kernel and block size.
    resident: Mutex<HashMap<(usize, u32), u32>>,
}

/// How long a device's last error poll that found nothing stands for the calls' own checks:
/// a collective does not query the driver for errors more often (an error that poisons the
/// context also fails the next launch; `symmCommGetAsyncError` always queries).
const ERROR_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

// SAFETY: CUDA driver handles (contexts, functions) may be used from any thread; the driver
// synchronizes internally.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the map is behind a mutex and the rest is immutable after creation.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// The kernel `kernel`, loaded on the device (see [`CudaDevice::function_by_name`]).
    fn function(&self, kernel: KernelId) -> Result<sys::CUfunction> {
        self.function_by_name(&kernel.ptx_name())
    }

    /// The kernel `name`, loaded on the device: the first time, its module is loaded
    /// (JIT-compiled by the driver, which caches the result on disk) and the function is
    /// forced onto the device (see [`force_load`]), with this thread's capture mode relaxed
    /// and this device's context current (the caller's context is restored). A JIT failure
    /// quotes the JIT's error log.
    fn function_by_name(&self, name: &str) -> Result<sys::CUfunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(name) {
            return Ok(*f);
        }
        let c_name = CString::new(name).map_err(|_| Error::internal("kernel name has a NUL"))?;
        if let Some(f) = self.sass_function(name, &c_name) {
            functions.insert(name.to_string(), f);
            return Ok(f);
        }
        let module = crate::ptx::kernel_module(self.ptx_target, name).ok_or_else(|| {
            if crate::ptx::text(self.ptx_target).is_none() {
                Error::internal(format!(
                    "the embedded {} PTX does not decompress (a damaged build of libsymm)",
                    self.ptx_target
                ))
            } else {
                Error::internal(format!(
                    "kernel {name} is not in the {} PTX",
                    self.ptx_target
                ))
            }
        })?;
        let image =
            CString::new(module).map_err(|_| Error::internal("embedded PTX contains NUL"))?;
        let f = self.load_function(&image, &c_name, &format!("{name}, {} PTX", self.ptx_target))?;
        functions.insert(name.to_string(), f);
        Ok(f)
    }

    /// Function `c_name` of the PTX `image`, loaded on the device: the module JIT-compiled (a
    /// failure quotes the JIT's logs; `what` names the kernel in messages) and the function
    /// forced onto the device, with this thread's capture mode relaxed and this device's
    /// context current. The module stays loaded for the process once a function of it is kept.
    fn load_function(&self, image: &CString, c_name: &CStr, what: &str) -> Result<sys::CUfunction> {
        let annotate = |e: Error| Error::new(e.code, format!("{} ({what})", e.message));
        let _context = self.context.enter()?;
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        // Loading enqueues nothing on any stream.
        let module = outside_capture(|| {
            // SAFETY: a NUL-terminated PTX image; logs as `load_module` requires; this
            // device's context is current and the capture mode relaxed.
            driver("loading a kernel (cuModuleLoadDataEx)", || unsafe {
                load_module(image.as_ptr().cast(), &mut error_log, &mut info_log)
            })
        })
        .map_err(|e| {
            let e = annotate(e);
            Error::new(e.code, with_jit_logs(e.message, &error_log, &info_log))
        })?;
        // Loading a function enqueues nothing on any stream.
        let loaded = outside_capture(|| {
            // SAFETY: `module` was just loaded in the current context; it is never unloaded
            // once a function of it is kept, so the function stays valid for the process.
            driver(
                "loading a kernel (cuModuleGetFunction, cuFuncLoad)",
                || unsafe {
                    let f = result::module::get_function(module, c_name.to_owned())?;
                    force_load(f)?;
                    Ok(f)
                },
            )
        });
        match loaded {
            Ok(f) => Ok(f),
            Err(e) => {
                let _ = outside_capture(|| {
                    // SAFETY: the module was loaded above and none of its functions is kept.
                    driver("cuModuleUnload", || unsafe {
                        result::module::unload(module)
                    })
                });
                Err(annotate(e))
            }
        }
    }

    /// Kernel `name` of a user's PTX module `ptx`, loaded on the device (see
    /// [`CudaDevice::load_function`]) the first time and kept for the process.
    fn user_function(&self, ptx: &str, name: &str) -> Result<sys::CUfunction> {
        let key = format!("user {:#x}+{}:{name}", ptx.as_ptr() as usize, ptx.len());
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(&key) {
            return Ok(*f);
        }
        let c_name = CString::new(name)
            .map_err(|_| Error::invalid_argument(format!("kernel name {name:?} holds a NUL")))?;
        let image = CString::new(ptx).map_err(|_| {
            Error::invalid_argument(format!("the PTX of kernel {name} holds a NUL"))
        })?;
        let f = self.load_function(&image, &c_name, &format!("the user's kernel {name}"))?;
        functions.insert(key, f);
        Ok(f)
    }
}

/// A module loaded from the shipped SASS, kept for the process (its functions are).
struct SassModule(sys::CUmodule);

impl CudaDevice {
    /// Kernel `name` from the shipped SASS, loaded on the device, or `None` (the caller then
    /// JIT-compiles its PTX): no SASS runs on this GPU, the driver refused the SASS (logged
    /// once), or the function does not load (logged). The first call loads the whole SASS as
    /// one module (the driver loads each function at its first use, or here by `force_load`).
    fn sass_function(&self, name: &str, c_name: &CStr) -> Option<sys::CUfunction> {
        let module = self.sass.get_or_init(|| self.load_sass()).as_ref()?.0;
        let _context = self.context.enter().ok()?;
        let loaded = outside_capture(|| {
            // SAFETY: `module` is loaded in this device's context, which is current, and never
            // unloaded.
            driver(
                "loading a kernel (cuModuleGetFunction, cuFuncLoad)",
                || unsafe {
                    let f = result::module::get_function(module, c_name.to_owned())?;
                    force_load(f)?;
                    Ok(f)
                },
            )
        });
        match loaded {
            Ok(f) => Some(f),
            Err(e) => {
                crate::log!(
                    Level::Warn,
                    Subsys::Init,
                    None,
                    "device {}: {name} does not load from the shipped SASS ({}); JIT-compiling \
                     its PTX",
                    self.ordinal,
                    e.message
                );
                None
            }
        }
    }

    /// Load the shipped SASS that runs on this GPU as one module (see
    /// [`CudaDevice::sass_function`]).
    fn load_sass(&self) -> Option<SassModule> {
        let (major, minor) = self.capability;
        let target = crate::ptx::sass_target_for_capability(major, minor)?;
        if crate::config::jit_ptx() {
            return None;
        }
        let image = crate::ptx::sass(target)?;
        let _context = self.context.enter().ok()?;
        let mut error_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        let loaded = outside_capture(|| {
            // SAFETY: a complete cubin that lives for the process; logs as `load_module`
            // requires; this device's context is current and the capture mode relaxed.
            driver("loading the shipped SASS (cuModuleLoadDataEx)", || unsafe {
                load_module(image.as_ptr(), &mut error_log, &mut info_log)
            })
        });
        match loaded {
            Ok(module) => {
                crate::log!(
                    Level::Info,
                    Subsys::Init,
                    None,
                    "device {}: kernels load from the shipped {target} SASS",
                    self.ordinal
                );
                Some(SassModule(module))
            }
            Err(e) => {
                crate::log!(
                    Level::Info,
                    Subsys::Init,
                    None,
                    "device {}: the driver refused the shipped {target} SASS ({}); kernels are \
                     JIT-compiled from the PTX at first use",
                    self.ordinal,
                    with_jit_logs(e.message, &error_log, &info_log)
                );
                None
            }
        }
    }
}

/// The CUDA driver and the devices opened so far.
pub struct CudaBackend {
    device_count: i32,
    devices: Mutex<HashMap<i32, Arc<CudaDevice>>>,
}

/// A communicator's internal stream and the two events that order it with the caller's
/// stream. A launch serving several ranks on different callers' streams runs on the first
/// rank's internal stream, after every caller's stream and before its next work; a launch
/// serving one rank (or ranks all on one stream) goes directly on the caller's stream (see
/// [`schedule::schedule`]).
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
        // Destroy even when the context cannot be entered: the calls then fail harmlessly.
        let _context = self.device.context.enter();
        // SAFETY: the handles were created by `open_comm` and are destroyed once, here.
        let _ = driver("destroying a stream", || unsafe {
            result::stream::synchronize(self.stream)?;
            result::event::destroy(self.before)?;
            result::event::destroy(self.after)?;
            result::stream::destroy(self.stream)
        });
    }
}

/// The key of a caller's stream in [`CudaDevice::launch_events`]: its handle, and for
/// `CU_STREAM_PER_THREAD` (one handle, a stream per thread) the calling thread too.
fn stream_key(stream: u64) -> (u64, u64) {
    static NEXT_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        static THREAD: u64 = NEXT_THREAD.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    if stream == schedule::PER_THREAD_STREAM {
        (stream, THREAD.with(|t| *t))
    } else {
        (stream, 0)
    }
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

    /// Where device `ordinal`'s kernels come from: `Some(true)` the shipped SASS, `Some(false)`
    /// the PTX (no SASS runs on the GPU, `SYMM_JIT_PTX`, or the driver refused it), `None`
    /// while the device has loaded no kernel yet.
    pub fn kernels_from_sass(&self, ordinal: i32) -> Option<bool> {
        let devices = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        let device = devices.get(&ordinal)?;
        device.sass.get().map(Option::is_some)
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
        let entered = device.context.enter()?;
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        // Destroyed again (with the context still entered) when a later creation fails.
        let stream = OwnedStream::create()?;
        let before = OwnedEvent::create(flags)?;
        let after = OwnedEvent::create(flags)?;
        let comm = CommStream {
            device: device.clone(),
            stream: stream.into_raw(),
            before: before.into_raw(),
            after: after.into_raw(),
        };
        drop(entered);
        Ok(comm)
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

    /// See [`super::Backend::alloc_zeroed`]. Safe to call while the caller captures a graph
    /// (see [`outside_capture`]): zeroed on the device's setup stream, synchronously.
    pub fn alloc_zeroed(&self, ordinal: i32, bytes: usize) -> Result<u64> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: a fresh allocation of `bytes`, zeroed on the setup stream (never
            // captured) before use.
            driver("cuMemAlloc", || unsafe {
                let address = result::malloc_sync(bytes)?;
                result::memset_d8_async(address, 0, bytes, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)?;
                Ok(address)
            })
        })
    }

    /// See [`super::Backend::copy`]: enqueued on the caller's `stream` (captured when the
    /// stream captures).
    ///
    /// # Safety
    ///
    /// As [`super::Backend::copy`].
    pub unsafe fn copy(
        &self,
        ordinal: i32,
        stream: u64,
        copy: &crate::plan::staging::Copy,
    ) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: the caller's contract (both ranges valid until the copy has run, disjoint);
        // `stream` is the caller's stream of the collective.
        driver("cuMemcpyAsync", || unsafe {
            sys::cuMemcpyAsync(
                copy.dst,
                copy.src,
                copy.bytes as usize,
                stream as sys::CUstream,
            )
            .result()
        })
    }

    /// See [`super::Backend::free`].
    pub fn free(&self, ordinal: i32, address: u64) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: `address` came from `alloc_zeroed` and is freed once (callers own it).
            driver("cuMemFree", || unsafe { result::free_sync(address) })
        })
    }

    /// A non-blocking stream of device `ordinal`'s context, owned by the caller (who destroys
    /// it with [`CudaBackend::destroy_stream`]).
    pub fn create_stream(&self, ordinal: i32) -> Result<u64> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        Ok(OwnedStream::create()?.into_raw() as u64)
    }

    /// Destroy a stream made by [`CudaBackend::create_stream`] on device `ordinal`.
    pub fn destroy_stream(&self, ordinal: i32, stream: u64) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: a stream `create_stream` made and handed over, destroyed once by its owner.
        driver("cuStreamDestroy", || unsafe {
            result::stream::destroy(stream as sys::CUstream)
        })
    }

    /// See [`super::Backend::download`]. Safe during a capture, as `alloc_zeroed`.
    pub fn download(&self, ordinal: i32, address: u64, out: &mut [u8]) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: callers pass an allocation holding `out.len()` bytes; the copy completes
            // before `out` is used again (synchronized).
            driver("cuMemcpyDtoH", || unsafe {
                result::memcpy_dtoh_async(out, address, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)
            })
        })
    }

    /// See [`super::Backend::upload`]. Safe during a capture, as `alloc_zeroed`.
    pub fn upload(&self, ordinal: i32, address: u64, bytes: &[u8]) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: callers pass an allocation with room for `bytes`; the copy completes
            // before `bytes` goes out of scope (synchronized).
            driver("cuMemcpyHtoD", || unsafe {
                result::memcpy_htod_async(address, bytes, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)
            })
        })
    }

    /// Allocate mapped, pinned host memory for a `u32` flag.
    pub fn alloc_flag(&self, ordinal: i32) -> Result<Flag> {
        let device_handle = self.device(ordinal)?;
        let _context = device_handle.context.enter()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let mut device: sys::CUdeviceptr = 0;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a 4-byte mapped host allocation, zeroed before use; the device pointer is the
        // mapping of that allocation.
        driver("cuMemHostAlloc", || unsafe {
            sys::cuMemHostAlloc(&mut host, 4, flags).result()?;
            (host as *mut u32).write(0);
            sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0).result()
        })?;
        Ok(Flag {
            host: host as u64,
            device,
        })
    }

    /// Page-lock `bytes` of host memory at `host` and map it for kernels of every device
    /// (`cuMemHostRegister`, portable and device-mapped); its device address.
    pub fn register_host(&self, ordinal: i32, host: u64, bytes: usize) -> Result<u64> {
        let device_handle = self.device(ordinal)?;
        let _context = device_handle.context.enter()?;
        let mut device: sys::CUdeviceptr = 0;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller's live, page-aligned mapping of `bytes`, which stays mapped until
        // `unregister_host`; the device pointer is the mapping of that range.
        driver("cuMemHostRegister", || unsafe {
            sys::cuMemHostRegister_v2(host as *mut c_void, bytes, flags).result()
        })?;
        // SAFETY: the range registered above; on failure it is unregistered again.
        let mapped = driver("cuMemHostGetDevicePointer", || unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0).result()
        });
        if let Err(e) = mapped {
            // SAFETY: registered above, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(host as *mut c_void) };
            return Err(e);
        }
        Ok(device)
    }

    /// Whether kernels on device `ordinal` reach `[address, address + bytes)` (`bytes > 0`):
    /// memory the driver knows at its first and its last byte (device memory, pinned or
    /// registered host memory, managed memory, a VMM mapping), or any memory where the device
    /// reaches pageable host memory. Pageable host memory elsewhere is not reachable: a
    /// kernel's access to it faults, and the fault is sticky. Access rights are not checked:
    /// a VMM mapping this device was not granted, or another device's memory without peer
    /// access, passes here and faults in the kernel, as it would in NCCL.
    pub fn reaches(&self, ordinal: i32, address: u64, bytes: u64) -> Result<bool> {
        let device = self.device(ordinal)?;
        if device.pageable_access {
            return Ok(true);
        }
        let _context = device.context.enter()?;
        for at in [address, address + bytes.max(1) - 1] {
            let mut kind: u32 = 0;
            // SAFETY: the memory-type attribute is a 32-bit CUmemorytype written to `kind`;
            // the driver only looks the address up.
            let looked_up = super::driver::guarded("cuPointerGetAttribute", || unsafe {
                sys::cuPointerGetAttribute(
                    (&mut kind as *mut u32).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    at,
                )
                .result()
            })?;
            match looked_up {
                Ok(()) => {}
                Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => return Ok(false),
                Err(DriverError(code)) => {
                    return Err(super::driver::cuda_error("cuPointerGetAttribute", code));
                }
            }
        }
        Ok(true)
    }

    /// Undo [`CudaBackend::register_host`].
    pub fn unregister_host(&self, ordinal: i32, host: u64) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: registered by `register_host`, unregistered once.
        driver("cuMemHostUnregister", || unsafe {
            sys::cuMemHostUnregister(host as *mut c_void).result()
        })
    }

    /// Free a flag from [`CudaBackend::alloc_flag`].
    pub fn free_flag(&self, ordinal: i32, flag: Flag) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: allocated by `alloc_flag`, freed once.
        driver("cuMemFreeHost", || unsafe {
            sys::cuMemFreeHost(flag.host as *mut c_void).result()
        })
    }

    /// Enqueue a user's kernel (`kernel`: its PTX and entry name) on `stream` of device
    /// `ordinal` with `grid` blocks of `block` threads and the parameters `params` (each one's
    /// bytes), after checking that `grid` blocks of each of the `ranks_on_device` ranks sharing
    /// the device can be resident at once (its frames wait on peers' blocks).
    pub fn launch_user_kernel(
        &self,
        ordinal: i32,
        ranks_on_device: u32,
        (ptx, name): (&str, &str),
        (grid, block): (u32, u32),
        params: &[Vec<u8>],
        stream: u64,
    ) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        let function = device.user_function(ptx, name)?;
        let resident = resident_blocks(&device, function, block)?;
        let needed = u64::from(grid) * u64::from(ranks_on_device.max(1));
        if needed > u64::from(resident) {
            return Err(Error::invalid_argument(format!(
                "grid = {grid} blocks of {block} threads for each of the {ranks_on_device} ranks \
                 on device {ordinal}: kernel {name}'s {needed} blocks must be resident at once, \
                 and the device holds {resident} of them"
            )));
        }
        let mut pointers: Vec<*mut c_void> =
            params.iter().map(|p| p.as_ptr() as *mut c_void).collect();
        // SAFETY: a function loaded in the current context; one pointer per kernel parameter,
        // each to that parameter's bytes (the sizes the kernel declares: `KernelArgs` writes
        // each parameter at its type's size), alive across the call, which copies them; the
        // stream is the caller's stream of this device's context.
        driver("launching a user's kernel (cuLaunchKernel)", || unsafe {
            sys::cuLaunchKernel(
                function,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream as sys::CUstream,
                pointers.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        })
    }

    /// Blocks per rank such that `ranks_on_device` ranks fit at one block per multiprocessor.
    pub fn max_blocks_per_rank(&self, ordinal: i32, ranks_on_device: u32) -> Result<u32> {
        let device = self.device(ordinal)?;
        if crate::mutation::active(crate::mutation::Mutation::OversizedGrids) {
            return Ok(device.multiprocessors);
        }
        Ok((device.multiprocessors / ranks_on_device.max(1)).max(1))
    }

    /// Enqueue `launch`: describe it ([`super::launch_input`]: the callers' stream kinds from
    /// `cuStreamGetFlags`, the kernel's occupancy when separate launches share the device),
    /// plan its stream operations ([`schedule::schedule`], pure) and carry them out.
    pub fn launch(&self, launch: &Launch, comms: &[&CommStream]) -> Result<()> {
        let prepared = self.prepare_launch(launch, comms)?;
        self.run_launch(comms, &prepared)
    }

    /// Everything of `launch` that can refuse it before anything is enqueued: the kernel
    /// loaded on the device, the streams' kinds, co-residency, the stream operations
    /// ([`schedule::schedule`]).
    pub fn prepare_launch(&self, launch: &Launch, comms: &[&CommStream]) -> Result<PreparedLaunch> {
        let first = comms
            .first()
            .ok_or_else(|| Error::internal("launch without a rank"))?;
        let device = &first.device;
        let _context = device.context.enter()?;
        // Loaded (and, with lazy loading, put on the device) before anything is enqueued.
        let function = device.function(launch.kernel)?;
        // The streams' kinds matter only to a separate launch (the schedule refuses blocking
        // streams there); the driver is asked only then, once per distinct stream. Other
        // launches leave the kinds unasked (`of_special_handle`, else `Blocking`, which the
        // schedule does not read): no call that a stream capture could forbid.
        let separate = (launch.rank_ids.len() as u32) < launch.ranks_on_device;
        let mut known: Vec<(u64, StreamKind)> = Vec::new();
        let mut kinds = Vec::with_capacity(launch.streams.len());
        for &stream in &launch.streams {
            let kind = match known.iter().find(|(s, _)| *s == stream) {
                Some(&(_, kind)) => kind,
                None if !separate => {
                    StreamKind::of_special_handle(stream).unwrap_or(StreamKind::Blocking)
                }
                None => {
                    let kind = stream_kind(stream)?;
                    known.push((stream, kind));
                    kind
                }
            };
            kinds.push(kind);
        }
        // Co-residency is checked (from the occupancy, asked once per kernel) where the
        // kernels wait for each other: separate launches on a shared device, and a cooperative
        // launch serving several ranks.
        let resident = if separate || launch.rank_ids.len() > 1 {
            Some(resident_blocks(device, function, launch.block)?)
        } else {
            None
        };
        let befores: Vec<u64> = comms.iter().map(|c| c.before as u64).collect();
        let input = super::launch_input(
            launch,
            (first.stream as u64, first.after as u64),
            &befores,
            &kinds,
            resident,
        );
        Ok(PreparedLaunch {
            function,
            schedule: schedule::schedule(&input)?,
        })
    }

    /// Enqueue a launch that [`CudaBackend::prepare_launch`] accepted.
    pub fn run_launch(&self, comms: &[&CommStream], prepared: &PreparedLaunch) -> Result<()> {
        let first = comms
            .first()
            .ok_or_else(|| Error::internal("launch without a rank"))?;
        let device = &first.device;
        let _context = device.context.enter()?;
        execute(prepared.function, &prepared.schedule)
            .map_err(|e| Error::new(e.code, format!("{} ({} PTX)", e.message, device.ptx_target)))
    }

    /// See [`super::Backend::time_kernel`].
    pub fn time_kernel(
        &self,
        launch: &KernelLaunch<'_>,
        args: &[KernelArg],
        launches: usize,
    ) -> Result<Vec<f64>> {
        let device = self.device(launch.device)?;
        let ptx = crate::ptx::text(device.ptx_target).ok_or_else(|| {
            Error::internal(format!(
                "the embedded {} PTX does not decompress (a damaged build of libsymm)",
                device.ptx_target
            ))
        })?;
        kernel::check(
            launch,
            args,
            crate::ptx::entry_param_types(ptx, launch.name),
        )?;
        let _context = device.context.enter()?;
        let function = device.function_by_name(launch.name)?;
        // The arguments' storage, and one pointer to each (`kernelParams`), valid while
        // `values` is neither moved nor dropped.
        let mut values = args.to_vec();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|arg| match arg {
                KernelArg::U32(v) => (v as *mut u32).cast(),
                KernelArg::U64(v) => (v as *mut u64).cast(),
            })
            .collect();
        let timing = sys::CUevent_flags::CU_EVENT_DEFAULT;
        // Destroyed when this function returns (a failed launch included).
        let (start, stop) = (OwnedEvent::create(timing)?, OwnedEvent::create(timing)?);
        let (start, stop) = (start.0, stop.0);
        let mut times = Vec::with_capacity(launches);
        // SAFETY: the parameters match the kernel's `.param` list (checked above) and point
        // into `values`, alive until the end of the function; the events live as long.
        driver("kernel launch", || unsafe {
            for _ in 0..launches {
                sys::cuEventRecord(start, std::ptr::null_mut()).result()?;
                launch_clustered(function, launch, &mut params)?;
                sys::cuEventRecord(stop, std::ptr::null_mut()).result()?;
                sys::cuEventSynchronize(stop).result()?;
                let mut ms = 0f32;
                sys::cuEventElapsedTime(&mut ms, start, stop).result()?;
                times.push(ms as f64 * 1e3);
            }
            Ok(())
        })?;
        Ok(times)
    }

    /// The compute capability of device `ordinal`.
    pub fn compute_capability(&self, ordinal: i32) -> Result<(i32, i32)> {
        Ok(self.device(ordinal)?.capability)
    }

    /// See [`super::Backend::mark_launch`]: record the device's event of each distinct stream
    /// of `streams` on it, after the launch just enqueued there, and return the events. A
    /// stream being captured is skipped: its work runs when the graph is launched, on streams
    /// the caller chooses and waits for.
    pub fn mark_launch(&self, ordinal: i32, streams: &[u64]) -> Result<Vec<u64>> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        let mut keys: Vec<(u64, (u64, u64))> = Vec::with_capacity(streams.len());
        for &stream in streams {
            let key = stream_key(stream);
            if !keys.iter().any(|(_, k)| *k == key) {
                keys.push((stream, key));
            }
        }
        let mut recorded = Vec::with_capacity(keys.len());
        for (stream, key) in keys {
            let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: a stream of this context (the caller's); one write.
            driver("cuStreamIsCapturing", || unsafe {
                sys::cuStreamIsCapturing(stream as sys::CUstream, &mut capture).result()
            })?;
            if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                continue;
            }
            let event = {
                let mut events = device
                    .launch_events
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                match events.get(&key) {
                    Some(&event) => event,
                    None => {
                        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
                        let event = driver("cuEventCreate", || result::event::create(flags))?;
                        events.insert(key, event);
                        event
                    }
                }
            };
            // SAFETY: an event of this context (never destroyed while the device lives) and
            // the caller's stream of this context.
            driver("cuEventRecord", || unsafe {
                result::event::record(event, stream as sys::CUstream)
            })?;
            recorded.push(event as u64);
        }
        Ok(recorded)
    }

    /// See [`super::Backend::wait_marks`]: wait for every event of `events` (from
    /// [`CudaBackend::mark_launch`] on device `ordinal`).
    pub fn wait_marks(&self, ordinal: i32, events: &[u64]) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        for &event in events {
            // SAFETY: an event of this context, alive while the device is.
            driver("cuEventSynchronize", || unsafe {
                result::event::synchronize(event as sys::CUevent)
            })?;
        }
        Ok(())
    }

    /// Wait for the communicator's stream.
    pub fn synchronize(&self, comm: &CommStream) -> Result<()> {
        let _context = comm.device.context.enter()?;
        // SAFETY: the stream belongs to this context.
        driver("cuStreamSynchronize", || unsafe {
            result::stream::synchronize(comm.stream)
        })
    }

    /// See [`super::Backend::prepare`]: load `kernel` on device `ordinal` now (module, JIT,
    /// function on the device), with the capture mode relaxed, so that no launch has to load
    /// it. Later calls for the same kernel only look it up.
    pub fn prepare(&self, ordinal: i32, kernel: KernelId) -> Result<()> {
        self.device(ordinal)?.function(kernel).map(|_| ())
    }

    /// See [`super::Backend::async_error`]: the error that work queued by or for `comm`
    /// raised, if any, without blocking. The communicator's stream is queried
    /// (`cuStreamQuery`) unless a capture is under way on it (a query would invalidate the
    /// capture; nothing of it has run anyway); the device's setup stream, never captured, is
    /// queried too, and reports an error that poisoned the context. Unless `fresh`, nothing
    /// is queried within [`ERROR_POLL_INTERVAL`] of a query of the device that found nothing.
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

/// The parameters of every collective kernel, in the order of their `.param` list
/// ([`symm_device::symmetric::dispatch::KERNEL_PARAMETERS`]).
struct CollectiveParams {
    /// Device address of the work table.
    table: u64,
    /// Tasks per rank in the table.
    task_count: u32,
    /// Ranks served by the launch.
    ranks: u32,
}

impl CollectiveParams {
    /// The PTX type of each parameter, in order (checked against every collective `.entry`
    /// of the shipped PTX by the PTX linter of the tests).
    pub(crate) const PTX_TYPES: [&str; 3] = ["u64", "u32", "u32"];

    /// `kernelParams` for `cuLaunchKernelEx`: one pointer per parameter, valid while `self`
    /// is neither moved nor dropped.
    fn pointers(&mut self) -> [*mut c_void; 3] {
        if crate::mutation::active(crate::mutation::Mutation::SwapKernelParameters) {
            return [
                (&raw mut self.table).cast(),
                (&raw mut self.ranks).cast(),
                (&raw mut self.task_count).cast(),
            ];
        }
        [
            (&raw mut self.table).cast(),
            (&raw mut self.task_count).cast(),
            (&raw mut self.ranks).cast(),
        ]
    }
}

/// The `.param` types the library passes to its kernel `name` (see `CollectiveParams`), or
/// `None` for a name its calls never launch (the benchmarks' `symm_clc_*` kernels go through
/// `Backend::time_kernel`, which checks their arguments against the PTX itself).
pub fn launched_param_types(name: &str) -> Option<&'static [&'static str]> {
    if name.starts_with("symm_") && !name.starts_with("symm_clc_") {
        Some(&CollectiveParams::PTX_TYPES)
    } else {
        None
    }
}

/// Launch `function` on the default stream, `launch.blocks` blocks of `launch.threads`, in
/// clusters of `launch.cluster` CTAs along x when it is above 1 (`cuLaunchKernelEx` with a
/// cluster-dimension attribute).
///
/// # Safety
/// `params` match the kernel's `.param` list; `launch.blocks` is a multiple of its cluster.
unsafe fn launch_clustered(
    function: sys::CUfunction,
    launch: &KernelLaunch<'_>,
    params: &mut [*mut c_void],
) -> std::result::Result<(), DriverError> {
    let cluster = launch.cluster;
    if cluster <= 1 {
        // SAFETY: forwarded contract.
        return unsafe {
            result::launch_kernel(
                function,
                (launch.blocks, 1, 1),
                (launch.threads, 1, 1),
                0,
                std::ptr::null_mut(),
                params,
            )
        };
    }
    // SAFETY: a zeroed attribute is valid plain data; the cluster field is then set.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attribute.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: cluster,
        y: 1,
        z: 1,
    };
    let config = sys::CUlaunchConfig {
        gridDimX: launch.blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: launch.threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: std::ptr::null_mut(),
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: the configuration and attribute outlive the call; forwarded contract.
    unsafe { sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
}

/// The kind of a caller's stream: the special handles by value, others by `cuStreamGetFlags`.
///
/// `cuStreamGetFlags` is refused on a stream being captured (and, in the default capture
/// mode, while this thread captures any stream): the refusal invalidates the caller's capture
/// (seen on an H200, driver 580). So a capturing stream is not asked: its kernel runs when the
/// graph is launched, on a stream the caller picks then, and the blocking-stream hazard the
/// kind guards against belongs to that launch, which this library never sees; it counts as
/// non-blocking. Another stream is asked with this thread's capture mode relaxed.
fn stream_kind(handle: u64) -> Result<StreamKind> {
    if let Some(kind) = StreamKind::of_special_handle(handle) {
        return Ok(kind);
    }
    let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a stream handle from the caller; one write. Allowed during any capture.
    driver("cuStreamIsCapturing", || unsafe {
        sys::cuStreamIsCapturing(handle as sys::CUstream, &mut capture).result()
    })?;
    if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(StreamKind::NonBlocking);
    }
    let mut flags: std::ffi::c_uint = 0;
    outside_capture(|| {
        // SAFETY: a stream handle from the caller, queried for its flags (one write).
        driver("cuStreamGetFlags", || unsafe {
            sys::cuStreamGetFlags(handle as sys::CUstream, &mut flags).result()
        })
    })?;
    Ok(
        if flags & sys::CUstream_flags::CU_STREAM_NON_BLOCKING as std::ffi::c_uint != 0 {
            StreamKind::NonBlocking
        } else {
            StreamKind::Blocking
        },
    )
}

/// Blocks of `function` (at `block` threads, no dynamic shared memory) resident at once on
/// `device`: occupancy × multiprocessors, asked of the driver the first time only.
fn resident_blocks(device: &CudaDevice, function: sys::CUfunction, block: u32) -> Result<u32> {
    if crate::mutation::active(crate::mutation::Mutation::OversizedGrids) {
        return Ok(u32::MAX);
    }
    let key = (function as usize, block);
    let cache = || device.resident.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&resident) = cache().get(&key) {
        return Ok(resident);
    }
    let mut per_multiprocessor: std::ffi::c_int = 0;
    // SAFETY: a loaded function of the current context; one write.
    driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", || unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut per_multiprocessor,
            function,
            block as std::ffi::c_int,
            0,
        )
        .result()
    })?;
    let resident = per_multiprocessor.max(0) as u32 * device.multiprocessors;
    cache().insert(key, resident);
    Ok(resident)
}

/// Carry out a launch schedule with driver calls, in order. Kernel launches go through
/// `cuLaunchKernelEx`; a cooperative one carries `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`, which
/// stream capture accepts.
/// A launch accepted by [`CudaBackend::prepare_launch`], ready to enqueue.
pub struct PreparedLaunch {
    function: sys::CUfunction,
    schedule: LaunchSchedule,
}

fn execute(function: sys::CUfunction, schedule: &LaunchSchedule) -> Result<()> {
    let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
    for op in &schedule.ops {
        match op {
            StreamOp::RecordEvent { event, stream, .. } => {
                // SAFETY: an event of this context (a comm's) and the caller's stream.
                driver("cuEventRecord", || unsafe {
                    result::event::record(*event as sys::CUevent, *stream as sys::CUstream)
                })?
            }
            StreamOp::WaitEvent { stream, event, .. } => {
                // SAFETY: as above.
                driver("cuStreamWaitEvent", || unsafe {
                    result::stream::wait_event(
                        *stream as sys::CUstream,
                        *event as sys::CUevent,
                        wait,
                    )
                })?
            }
            StreamOp::Launch(l) => {
                let mut values = CollectiveParams {
                    table: l.table,
                    task_count: l.task_count,
                    ranks: l.ranks.len() as u32,
                };
                let mut params = values.pointers();
                // SAFETY: a zeroed attribute is valid plain data; the cooperative field is set.
                let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
                attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
                attribute.value.cooperative = 1;
                let config = sys::CUlaunchConfig {
                    gridDimX: l.grid,
                    gridDimY: 1,
                    gridDimZ: 1,
                    blockDimX: l.block,
                    blockDimY: 1,
                    blockDimZ: 1,
                    sharedMemBytes: 0,
                    hStream: l.stream as sys::CUstream,
                    attrs: &mut attribute,
                    numAttrs: u32::from(l.cooperative),
                };
                // SAFETY: the parameters match the kernels' signature (KERNEL_PARAMETERS) and,
                // with the configuration and attribute, live until the call has copied them.
                driver("launching a kernel (cuLaunchKernelEx)", || unsafe {
                    sys::cuLaunchKernelEx(
                        &config,
                        function,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                    .result()
                })?
            }
        }
    }
    Ok(())
}

/// A stream created by [`OwnedStream::create`] in the current context, destroyed on drop (with
/// that context entered) unless handed over by [`OwnedStream::into_raw`]: what keeps an error
/// path that creates several handles from leaking the first ones.
struct OwnedStream(sys::CUstream);

impl OwnedStream {
    /// A non-blocking stream of the current context.
    fn create() -> Result<Self> {
        driver("cuStreamCreate", || {
            result::stream::create(result::stream::StreamKind::NonBlocking)
        })
        .map(Self)
    }

    /// The stream, now owned by the caller (who destroys it).
    fn into_raw(self) -> sys::CUstream {
        let stream = self.0;
        std::mem::forget(self);
        stream
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: a stream created by `create`, not handed over, destroyed once, here.
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

/// An event of the current context, destroyed on drop unless handed over (as
/// [`OwnedStream`]).
struct OwnedEvent(sys::CUevent);

impl OwnedEvent {
    /// An event of the current context with `flags`.
    fn create(flags: sys::CUevent_flags) -> Result<Self> {
        driver("cuEventCreate", || result::event::create(flags)).map(Self)
    }

    /// The event, now owned by the caller (who destroys it).
    fn into_raw(self) -> sys::CUevent {
        let event = self.0;
        std::mem::forget(self);
        event
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        // SAFETY: an event created by `create`, not handed over, destroyed once, here.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// Open device `ordinal`: retain its primary context (released again if anything after
/// fails), check its compute capability, create its setup stream.
fn open_device(ordinal: i32) -> Result<CudaDevice> {
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

    #[test]
    fn jit_logs_are_cut_at_the_nul_trimmed_and_bounded() {
        let mut buffer = vec![0u8; 64];
        buffer[..12].copy_from_slice(b"\n error: x\n ");
        assert_eq!(jit_log_text(&buffer).as_deref(), Some("error: x"));
        assert_eq!(jit_log_text(&[0; 16]), None);
        assert_eq!(jit_log_text(b"  \n\t"), None);
        assert_eq!(jit_log_text(b"no nul").as_deref(), Some("no nul"));
        assert_eq!(jit_log_text(b"a\xffb\0junk").as_deref(), Some("a\u{fffd}b"));
        let long = "y".repeat(JIT_LOG_SHOWN + 10);
        let shown = jit_log_text(long.as_bytes()).unwrap();
        assert_eq!(shown, format!("{} [...]", "y".repeat(JIT_LOG_SHOWN)));
        let exact = "z".repeat(JIT_LOG_SHOWN);
        assert_eq!(jit_log_text(exact.as_bytes()), Some(exact));
    }

    #[test]
    fn load_failures_quote_the_logs_that_are_not_empty() {
        let base = "loading a kernel failed".to_string();
        assert_eq!(with_jit_logs(base.clone(), &[0; 8], &[0; 8]), base);
        assert_eq!(
            with_jit_logs(base.clone(), b"ptxas fatal\0", &[0; 8]),
            "loading a kernel failed; JIT error log: ptxas fatal"
        );
        assert_eq!(
            with_jit_logs(base, b"bad\0", b"info\0"),
            "loading a kernel failed; JIT error log: bad; JIT info log: info"
        );
    }
}
