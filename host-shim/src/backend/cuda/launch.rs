//! Kernel launches on the cuda backend: symm's collectives (prepared — the kernel loaded, the
//! callers' stream kinds, co-residency from the occupancy, the stream operations scheduled —
//! then enqueued with their parameters), users' kernels (checked to be co-resident), and
//! kernels launched by name and timed (the work-stealing benchmark).

use super::CudaBackend;
use super::device::CudaDevice;
use super::stream::{CommStream, OwnedEvent, stream_kind};
use crate::backend::driver::driver;
use crate::backend::kernel::{self, KernelArg, KernelLaunch};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::launch::schedule::{self, LaunchSchedule, StreamKind, StreamOp};
use cudarc::driver::{DriverError, result, sys};
use std::ffi::c_void;

/// A launch accepted by [`CudaBackend::prepare_launch`], ready to enqueue.
pub struct PreparedLaunch {
    function: sys::CUfunction,
    schedule: LaunchSchedule,
}

impl CudaBackend {
    /// Enqueue `launch`: describe it ([`launch_input`](crate::backend::launch_input): the callers'
    /// stream kinds from `cuStreamGetFlags`, the kernel's occupancy when separate launches share
    /// the device), plan its stream operations ([`schedule::schedule`], pure) and carry them out.
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
        let input = crate::backend::launch_input(
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

    /// Blocks per rank such that `ranks_on_device` ranks fit at one block per multiprocessor.
    pub fn max_blocks_per_rank(&self, ordinal: i32, ranks_on_device: u32) -> Result<u32> {
        let device = self.device(ordinal)?;
        if crate::mutation::active(crate::mutation::Mutation::OversizedGrids) {
            return Ok(device.multiprocessors);
        }
        Ok((device.multiprocessors / ranks_on_device.max(1)).max(1))
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

    /// See [`Backend::time_kernel`](crate::backend::Backend::time_kernel).
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
        let (start_event, stop_event) = (OwnedEvent::create(timing)?, OwnedEvent::create(timing)?);
        let (start, stop) = (start_event.handle(), stop_event.handle());
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
