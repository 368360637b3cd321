//! The cuda backend: the CUDA driver through cudarc, loaded at run time (libsymm builds and
//! runs with no CUDA installed; then this backend reports `symmNoDevice`).
//!
//! Every driver call goes through [`driver`], which turns a driver error into a
//! `symmResult_t` and a panic (cudarc panics when a symbol is missing) into an error.

use super::Flag;
use super::schedule::{self, LaunchSchedule, StreamKind, StreamOp};
use crate::clc::{Config as ClcConfig, Report as ClcReport, Variant, report as clc_report};
use crate::error::{Error, Result};
use crate::ffi::types::symmResult_t;
use crate::plan::{KernelId, Launch};
use cudarc::driver::{DriverError, result, sys};
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};
use symm_device::scheduler::source::SoftwareSource;

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

/// Run `setup` (allocation, upload, module loading: work that is not a stream operation) with
/// this thread's stream-capture mode relaxed, and restore the mode after. A collective's first
/// use of a kernel or of a rank combination may happen while the caller captures a CUDA graph;
/// in the default (global) mode such calls would invalidate the capture. This is the driver's
/// documented way to make them during a capture.
///
/// # Safety
/// `setup` enqueues nothing on a capturing stream.
unsafe fn outside_capture<T>(
    setup: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> std::result::Result<T, DriverError> {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges this thread's mode; restored below.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    let result = setup();
    // SAFETY: as above.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result()?;
    result
}

/// A device with its primary context and the kernels loaded on it so far.
struct CudaDevice {
    context: sys::CUcontext,
    /// A non-blocking stream for the library's own uploads: never captured, never waited on
    /// by a user's stream, so uploads run at once even while a graph is being captured.
    setup_stream: sys::CUstream,
    capability: (i32, i32),
    /// Kernel name → function. Each kernel is its own module (see [`crate::ptx::split`]),
    /// loaded on first use and kept for the process.
    functions: Mutex<HashMap<String, sys::CUfunction>>,
    multiprocessors: u32,
    ptx_target: &'static str,
}

// SAFETY: CUDA driver handles (contexts, functions) may be used from any thread; the driver
// synchronizes internally.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the map is behind a mutex and the rest is immutable after creation.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    fn make_current(&self) -> Result<()> {
        // SAFETY: the context is a retained primary context, alive for the process.
        driver("cuCtxSetCurrent", || unsafe {
            result::ctx::set_current(self.context)
        })
    }

    fn function(&self, kernel: KernelId) -> Result<sys::CUfunction> {
        self.function_by_name(&kernel.ptx_name())
    }

    /// The kernel `name`, loading its module (JIT-compiled by the driver, which caches the
    /// result on disk) the first time. The caller has made this device's context current.
    fn function_by_name(&self, name: &str) -> Result<sys::CUfunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(name) {
            return Ok(*f);
        }
        let module = crate::ptx::kernel_module(self.ptx_target, name).ok_or_else(|| {
            Error::internal(format!(
                "kernel {name} is not in the {} PTX",
                self.ptx_target
            ))
        })?;
        let image =
            CString::new(module).map_err(|_| Error::internal("embedded PTX contains NUL"))?;
        let c_name = CString::new(name).map_err(|_| Error::internal("kernel name has a NUL"))?;
        // SAFETY: a NUL-terminated PTX image; the module is never unloaded, so the function
        // stays valid for the process. Loading enqueues nothing on any stream.
        let f = driver("loading a kernel (cuModuleLoadData)", || unsafe {
            outside_capture(|| {
                let module = result::module::load_data(image.as_ptr().cast())?;
                result::module::get_function(module, c_name)
            })
        })
        .map_err(|e| {
            Error::new(
                e.code,
                format!("{} ({name}, {} PTX)", e.message, self.ptx_target),
            )
        })?;
        functions.insert(name.to_string(), f);
        Ok(f)
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

    /// See [`super::Backend::alloc_zeroed`]. Safe to call while the caller captures a graph
    /// (see [`outside_capture`]): zeroed on the device's setup stream, synchronously.
    pub fn alloc_zeroed(&self, ordinal: i32, bytes: usize) -> Result<u64> {
        let device = self.device(ordinal)?;
        device.make_current()?;
        // SAFETY: a fresh allocation of `bytes`, zeroed on the setup stream (never captured)
        // before use.
        driver("cuMemAlloc", || unsafe {
            outside_capture(|| {
                let address = result::malloc_sync(bytes)?;
                result::memset_d8_async(address, 0, bytes, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)?;
                Ok(address)
            })
        })
    }

    /// See [`super::Backend::free`].
    pub fn free(&self, ordinal: i32, address: u64) -> Result<()> {
        self.device(ordinal)?.make_current()?;
        // SAFETY: `address` came from `alloc_zeroed` and is freed once (callers own it).
        driver("cuMemFree", || unsafe {
            outside_capture(|| result::free_sync(address))
        })
    }

    /// See [`super::Backend::upload`]. Safe during a capture, as `alloc_zeroed`.
    pub fn upload(&self, ordinal: i32, address: u64, bytes: &[u8]) -> Result<()> {
        let device = self.device(ordinal)?;
        device.make_current()?;
        // SAFETY: callers pass an allocation with room for `bytes`; the copy completes before
        // `bytes` goes out of scope (synchronized).
        driver("cuMemcpyHtoD", || unsafe {
            outside_capture(|| {
                result::memcpy_htod_async(address, bytes, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)
            })
        })
    }

    /// Allocate mapped, pinned host memory for a `u32` flag.
    pub fn alloc_flag(&self, ordinal: i32) -> Result<Flag> {
        self.device(ordinal)?.make_current()?;
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

    /// Free a flag from [`CudaBackend::alloc_flag`].
    pub fn free_flag(&self, ordinal: i32, flag: Flag) -> Result<()> {
        self.device(ordinal)?.make_current()?;
        // SAFETY: allocated by `alloc_flag`, freed once.
        driver("cuMemFreeHost", || unsafe {
            sys::cuMemFreeHost(flag.host as *mut c_void).result()
        })
    }

    /// Blocks per rank such that `ranks_on_device` ranks fit at one block per multiprocessor.
    pub fn max_blocks_per_rank(&self, ordinal: i32, ranks_on_device: u32) -> Result<u32> {
        let device = self.device(ordinal)?;
        Ok((device.multiprocessors / ranks_on_device.max(1)).max(1))
    }

    /// Enqueue `launch`: describe it ([`super::launch_input`]: the callers' stream kinds from
    /// `cuStreamGetFlags`, the kernel's occupancy when separate launches share the device),
    /// plan its stream operations ([`schedule::schedule`], pure) and carry them out.
    pub fn launch(&self, launch: &Launch, comms: &[&CommStream]) -> Result<()> {
        let first = comms
            .first()
            .ok_or_else(|| Error::internal("launch without a rank"))?;
        let device = &first.device;
        device.make_current()?;
        let function = device.function(launch.kernel)?;
        let kinds = launch
            .streams
            .iter()
            .map(|s| stream_kind(*s))
            .collect::<Result<Vec<_>>>()?;
        let resident = if (launch.ranks.len() as u32) < launch.ranks_on_device {
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
        let schedule = schedule::schedule(&input)?;
        execute(function, &schedule)
            .map_err(|e| Error::new(e.code, format!("{} ({} PTX)", e.message, device.ptx_target)))
    }

    /// Run a work-stealing benchmark variant on `config.device`, timed with CUDA events.
    pub fn run_clc_benchmark(&self, variant: Variant, config: &ClcConfig) -> Result<ClcReport> {
        let device = self.device(config.device)?;
        if variant.is_hardware() && device.capability != (10, 0) {
            let (major, minor) = device.capability;
            return Err(Error::unsupported(format!(
                "device {} has compute capability {major}.{minor}: hardware Cluster Launch \
                 Control kernels are built for sm_100a (compute capability 10.0) only",
                config.device
            )));
        }
        device.make_current()?;
        let function = device.function_by_name(&variant.ptx_name())?;
        let tiles = config.tiles as usize;
        let ordinal = config.device;
        let data_bytes = tiles * config.threads as usize * 4;
        let data = self.alloc_zeroed(ordinal, data_bytes)?;
        let counts = self.alloc_zeroed(ordinal, tiles * 4)?;
        let stats = self.alloc_zeroed(ordinal, tiles * 8)?;
        let state = self.alloc_zeroed(ordinal, SoftwareSource::state_words(config.tiles) * 4)?;
        let ones: Vec<u8> = (0..tiles * config.threads as usize)
            .flat_map(|_| 1.0f32.to_ne_bytes())
            .collect();
        let result = (|| {
            self.upload(ordinal, data, &ones)?;
            let mut params_storage = (
                config.tiles,
                config.imbalance,
                config.work_iterations,
                config.prologue_iterations,
                data,
                counts,
                stats,
                state,
            );
            let p = &mut params_storage;
            let mut params: [*mut c_void; 8] = [
                (&mut p.0 as *mut u32).cast(),
                (&mut p.1 as *mut u32).cast(),
                (&mut p.2 as *mut u32).cast(),
                (&mut p.3 as *mut u32).cast(),
                (&mut p.4 as *mut u64).cast(),
                (&mut p.5 as *mut u64).cast(),
                (&mut p.6 as *mut u64).cast(),
                (&mut p.7 as *mut u64).cast(),
            ];
            let mut times = Vec::new();
            // SAFETY: parameters match the benchmark kernels' signature; the buffers are sized
            // for `tiles` tiles; events are created and destroyed here.
            driver("benchmark launch", || unsafe {
                let (mut start, mut stop) = (std::ptr::null_mut(), std::ptr::null_mut());
                sys::cuEventCreate(&mut start, 0).result()?;
                sys::cuEventCreate(&mut stop, 0).result()?;
                for launch in 0..=config.iterations {
                    sys::cuEventRecord(start, std::ptr::null_mut()).result()?;
                    launch_clustered(function, config, variant.cluster(), &mut params)?;
                    sys::cuEventRecord(stop, std::ptr::null_mut()).result()?;
                    sys::cuEventSynchronize(stop).result()?;
                    let mut ms = 0f32;
                    sys::cuEventElapsedTime(&mut ms, start, stop).result()?;
                    if launch > 0 {
                        times.push(ms as f64 * 1e3);
                    }
                }
                sys::cuEventDestroy_v2(start).result()?;
                sys::cuEventDestroy_v2(stop).result()
            })?;
            let mut host_counts = vec![0u32; tiles];
            let mut host_stats = vec![0u32; 2 * tiles];
            // SAFETY: the buffers hold these many u32s.
            driver("reading benchmark counters", || unsafe {
                result::memcpy_dtoh_sync(&mut host_counts, counts)?;
                result::memcpy_dtoh_sync(&mut host_stats, stats)
            })?;
            let launches = config.iterations as u32 + 1;
            Ok(clc_report(&mut times, &host_counts, launches, &host_stats))
        })();
        for address in [data, counts, stats, state] {
            let _ = self.free(ordinal, address);
        }
        result
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

/// Launch a benchmark kernel on the default stream, one block per tile, in clusters of
/// `cluster` CTAs along x when `cluster > 1` (`cuLaunchKernelEx` with a cluster-dimension
/// attribute).
///
/// # Safety
/// `params` match the benchmark kernels' signature; `config.tiles` is a multiple of `cluster`.
unsafe fn launch_clustered(
    function: sys::CUfunction,
    config: &ClcConfig,
    cluster: u32,
    params: &mut [*mut c_void],
) -> std::result::Result<(), DriverError> {
    if cluster <= 1 {
        // SAFETY: forwarded contract.
        return unsafe {
            result::launch_kernel(
                function,
                (config.tiles, 1, 1),
                (config.threads, 1, 1),
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
    let launch = sys::CUlaunchConfig {
        gridDimX: config.tiles,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: config.threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: std::ptr::null_mut(),
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: the configuration and attribute outlive the call; forwarded contract.
    unsafe { sys::cuLaunchKernelEx(&launch, function, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
}

/// The kind of a caller's stream: the special handles by value, others by `cuStreamGetFlags`.
fn stream_kind(handle: u64) -> Result<StreamKind> {
    if let Some(kind) = StreamKind::of_special_handle(handle) {
        return Ok(kind);
    }
    let mut flags: std::ffi::c_uint = 0;
    // SAFETY: a stream handle from the caller, queried for its flags (one write).
    driver("cuStreamGetFlags", || unsafe {
        sys::cuStreamGetFlags(handle as sys::CUstream, &mut flags).result()
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
/// `device`: occupancy × multiprocessors.
fn resident_blocks(device: &CudaDevice, function: sys::CUfunction, block: u32) -> Result<u32> {
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
    Ok(per_multiprocessor.max(0) as u32 * device.multiprocessors)
}

/// Carry out a launch schedule with driver calls, in order. Kernel launches go through
/// `cuLaunchKernelEx`; a cooperative one carries `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`, which
/// stream capture accepts.
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
                let mut table = l.table;
                let mut ranks = l.ranks.len() as u32;
                let mut send_offset = l.args.send_offset;
                let mut recv_offset = l.args.recv_offset;
                let mut count = l.args.count;
                let mut flags = l.args.flags;
                let mut params: [*mut c_void; 6] = [
                    (&mut table as *mut u64).cast(),
                    (&mut ranks as *mut u32).cast(),
                    (&mut send_offset as *mut u64).cast(),
                    (&mut recv_offset as *mut u64).cast(),
                    (&mut count as *mut u64).cast(),
                    (&mut flags as *mut u32).cast(),
                ];
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
    let (ptx_target, _) = crate::ptx::for_capability(major, minor).ok_or_else(|| {
        Error::unsupported(format!(
            "device {ordinal} has compute capability {major}.{minor}; symm needs 8.0 or newer"
        ))
    })?;
    let multiprocessors =
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let setup_stream = driver("cuStreamCreate", || {
        result::stream::create(result::stream::StreamKind::NonBlocking)
    })?;
    Ok(CudaDevice {
        context,
        setup_stream,
        capability: (major, minor),
        functions: Mutex::new(HashMap::new()),
        multiprocessors: multiprocessors.max(1) as u32,
        ptx_target,
    })
}
