//! Backends: where memory lives and how a planned kernel is launched.
//!
//! * [`host`] — host memory, kernels run by `symm_device::arch::host::run_grid` (CI).
//! * [`cuda`] — the CUDA driver, loaded at run time through cudarc; the PTX in `ptx-out/`.
//!   [`vmm`] makes its shareable memory; both call the driver through [`driver`], the checked
//!   layer over `cudarc::driver::sys`.
//! * [`model`] — host memory, launches checked against a model of CUDA's ordering rules
//!   (tests; selected by [`model::activate`]).
//!
//! `SYMM_BACKEND=host|cuda` chooses; unset, cuda is used when a GPU is usable, else host.
//!
//! The cuda and model backends share the launch path: [`launch_input`] describes a launch,
//! [`schedule::schedule`] (pure) turns it into stream operations, and the backend executes
//! them (driver calls, or the model).

pub mod cuda;
pub(crate) mod driver;
pub mod host;
pub mod kernel;
pub mod model;
pub mod vmm;

use crate::abi::symmResult_t;
use crate::error::{Error, Result};
use crate::launch::{Launch, schedule};
use crate::log::{Level, Subsys};
use crate::plan::KernelId;
use std::sync::{Arc, OnceLock};

/// A `u32` flag visible to kernels (at `device`) and to the host (at `host`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    /// Host address.
    pub host: u64,
    /// Device address.
    pub device: u64,
}

impl Flag {
    /// Read the flag (acquire).
    pub fn read(&self) -> u32 {
        // SAFETY: `host` is a live, 4-byte aligned u32 that kernels access atomically.
        unsafe { symm_device::arch::host::load_acquire_sys_u32(self.host as *const u32) }
    }

    /// Raise the flag to `value` unless it is raised already (a kernel's report is kept).
    pub fn raise(&self, value: u32) {
        // SAFETY: `host` is a live, 4-byte aligned u32 that kernels and the host access only
        // atomically (system scope on the device).
        let word = unsafe { &*(self.host as *const std::sync::atomic::AtomicU32) };
        let raised = word.compare_exchange(
            0,
            value,
            std::sync::atomic::Ordering::AcqRel,
            std::sync::atomic::Ordering::Acquire,
        );
        if raised.is_ok() {
            // Host kernels parked on this word (waiting for a peer) look at it now.
            symm_device::arch::host::wake_all(self.host as *const u32);
        }
    }
}

/// How [`Backend::run_launch`] left a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchEnd {
    /// It ran to completion on every rank it serves (the host backend): its data is right,
    /// and a failure found since belongs to a later call.
    Completed,
    /// It ran, and some of it gave up or refused the launch (the abort word says why).
    GaveUp,
    /// It was enqueued (the cuda backend): it completes, or fails, later.
    Enqueued,
}

/// Which backend a communicator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// Host memory and CPU threads.
    Host,
    /// CUDA devices.
    Cuda,
    /// The CUDA model (tests).
    Model,
}

impl From<BackendKind> for crate::plan::DeviceModel {
    /// The cost model the planner uses for launches of this executor.
    fn from(kind: BackendKind) -> Self {
        match kind {
            BackendKind::Cuda | BackendKind::Model => crate::plan::DeviceModel::Gpu,
            BackendKind::Host => crate::plan::DeviceModel::Host,
        }
    }
}

impl BackendKind {
    /// Lower-case name, as `SYMM_BACKEND` spells it.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
            BackendKind::Model => "model",
        }
    }
}

/// A backend instance, shared by every communicator that uses it.
pub enum Backend {
    /// See `host::HostBackend`.
    Host(host::HostBackend),
    /// See `cuda::CudaBackend`.
    Cuda(cuda::CudaBackend),
    /// See [`model::ModelBackend`].
    Model(model::ModelBackend),
}

/// Per-communicator launch resources (the cuda backend's internal stream and events).
pub enum CommResources {
    /// The host backend needs none.
    Host,
    /// See [`cuda::CommStream`].
    Cuda(cuda::CommStream),
    /// The model backend's internal stream and events.
    Model {
        /// Internal stream.
        stream: u64,
        /// "Before" event.
        before: u64,
        /// "After" event.
        after: u64,
    },
}

/// Where one window's collectives were enqueued, so that its teardown waits for them: a
/// launch that serves a rank on one caller's stream runs on that stream, not on the
/// communicator's internal stream, so waiting for the internal stream alone is not enough.
/// On the cuda backend the device's event of each caller's stream used (recorded after every
/// launch on that stream, so waiting for it waits for the window's launches and the
/// collectives after them, not for later work of the caller); nothing on the host backend,
/// whose launches complete before they return, and on the model backend.
#[derive(Default)]
pub struct StreamMarks {
    events: Vec<u64>,
}

impl StreamMarks {
    /// Add the events of `launch` not held yet.
    pub fn add(&mut self, launch: &LaunchMarks) {
        for &event in &launch.events {
            if !self.events.contains(&event) {
                self.events.push(event);
            }
        }
    }
}

/// The events one launch recorded on its callers' streams ([`Backend::mark_launch`]).
#[derive(Default)]
pub struct LaunchMarks {
    events: Vec<u64>,
}

/// Describe `launch` for [`schedule::schedule`]: `internal` is the first rank's internal stream
/// and events `(stream, before, after)`, `befores` every rank's "before" event, `kinds` the
/// kinds of the callers' streams.
pub fn launch_input(
    launch: &Launch,
    internal: (u64, u64),
    befores: &[u64],
    kinds: &[schedule::StreamKind],
    resident_blocks: Option<u32>,
) -> schedule::LaunchInput {
    let tasks = launch.task_count.max(1) as usize;
    let parts = (0..launch.rank_ids.len())
        .map(|i| schedule::Part {
            rank: launch.rank_ids[i],
            // A send/receive launch takes no collective numbers: no instances.
            instances: launch
                .instances
                .get(i * tasks..(i + 1) * tasks)
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
            user_stream: launch.streams[i],
            user_kind: kinds[i],
            before_event: befores[i],
        })
        .collect();
    schedule::LaunchInput {
        device: launch.device,
        kernel: launch.kernel,
        grid: launch.grid,
        block: launch.block,
        table: launch.table,
        tasks: launch.tasks.clone(),
        task_count: launch.task_count,
        parts,
        internal_stream: internal.0,
        after_event: internal.1,
        clique_ranks: launch.clique_ranks,
        ranks_on_device: launch.ranks_on_device,
        resident_blocks,
    }
}

impl Backend {
    /// Launch kernel `launch.name` of libsymm's PTX `launches` times on the default stream,
    /// each alone, with `args` (checked against its `.param` list first): the time of each
    /// launch in µs (CUDA events). The cuda backend only (see [`kernel`]).
    pub fn time_kernel(
        &self,
        launch: &kernel::KernelLaunch<'_>,
        args: &[kernel::KernelArg],
        launches: usize,
    ) -> Result<Vec<f64>> {
        match self {
            Backend::Cuda(cuda) => cuda.time_kernel(launch, args, launches),
            Backend::Host(_) | Backend::Model(_) => Err(Error::unsupported(format!(
                "kernel {}: launching a kernel by name needs the cuda backend",
                launch.name
            ))),
        }
    }

    /// The compute capability of `device` (the cuda backend), or `None` (the others).
    pub fn compute_capability(&self, device: i32) -> Result<Option<(i32, i32)>> {
        match self {
            Backend::Cuda(cuda) => cuda.compute_capability(device).map(Some),
            Backend::Host(_) | Backend::Model(_) => Ok(None),
        }
    }

    /// The backend's kind.
    pub fn kind(&self) -> BackendKind {
        match self {
            Backend::Host(_) => BackendKind::Host,
            Backend::Cuda(_) => BackendKind::Cuda,
            Backend::Model(_) => BackendKind::Model,
        }
    }

    /// Check that `device` can be used, and create a communicator's launch resources on it.
    pub fn open_comm(&self, device: i32) -> Result<CommResources> {
        match self {
            Backend::Host(_) => Ok(CommResources::Host),
            Backend::Cuda(b) => b.open_comm(device).map(CommResources::Cuda),
            Backend::Model(_) => {
                let (stream, events) = model::create_internal(device, 2);
                Ok(CommResources::Model {
                    stream,
                    before: events[0],
                    after: events[1],
                })
            }
        }
    }

    /// Make every pair of `devices` able to access each other's memory.
    pub fn connect_devices(&self, devices: &[i32]) -> Result<()> {
        match self {
            Backend::Host(_) | Backend::Model(_) => Ok(()),
            Backend::Cuda(b) => b.connect_devices(devices),
        }
    }

    /// Allocate `bytes` of zeroed memory on `device`; returns its address.
    pub fn alloc_zeroed(&self, device: i32, bytes: usize) -> Result<u64> {
        match self {
            Backend::Host(b) => b.alloc_zeroed(bytes),
            Backend::Model(b) => b.memory.alloc_zeroed(bytes),
            Backend::Cuda(b) => b.alloc_zeroed(device, bytes),
        }
    }

    /// Free memory from [`Backend::alloc_zeroed`].
    pub fn free(&self, device: i32, address: u64) -> Result<()> {
        match self {
            Backend::Host(b) => b.free(address),
            Backend::Model(b) => b.memory.free(address),
            Backend::Cuda(b) => b.free(device, address),
        }
    }

    /// Copy `bytes` to `address` on `device`.
    pub fn upload(&self, device: i32, address: u64, bytes: &[u8]) -> Result<()> {
        match self {
            Backend::Host(b) => b.upload(address, bytes),
            Backend::Model(b) => b.memory.upload(address, bytes),
            Backend::Cuda(b) => b.upload(device, address, bytes),
        }
    }

    /// Copy `out.len()` bytes from `address` on `device` into `out`, synchronously (on the
    /// cuda backend, through the device's setup stream).
    pub fn download(&self, device: i32, address: u64, out: &mut [u8]) -> Result<()> {
        match self {
            Backend::Host(b) => b.download(address, out),
            Backend::Model(b) => b.memory.download(address, out),
            Backend::Cuda(b) => b.download(device, address, out),
        }
    }

    /// A new stream of `device` for a caller's collectives (non-blocking on the cuda
    /// backend; 0 on the others, whose calls complete before they return).
    pub fn create_stream(&self, device: i32) -> Result<u64> {
        match self {
            Backend::Cuda(b) => b.create_stream(device),
            Backend::Host(_) | Backend::Model(_) => Ok(0),
        }
    }

    /// Destroy a stream made by [`Backend::create_stream`].
    pub fn destroy_stream(&self, device: i32, stream: u64) -> Result<()> {
        match self {
            Backend::Cuda(b) => b.destroy_stream(device, stream),
            Backend::Host(_) | Backend::Model(_) => Ok(()),
        }
    }

    /// Whether `stream` is being captured into a CUDA graph (never on the host and model
    /// backends).
    pub fn stream_is_capturing(&self, stream: u64) -> Result<bool> {
        match self {
            Backend::Cuda(_) => cuda::stream_is_capturing(stream),
            Backend::Host(_) | Backend::Model(_) => Ok(false),
        }
    }

    /// Wait until the work enqueued on `stream` of `device` so far has run (the host backend's
    /// work has run when its call returns).
    pub fn synchronize_stream(&self, device: i32, stream: u64) -> Result<()> {
        let marks = self.mark_launch(device, &[stream])?;
        let mut waits = StreamMarks::default();
        waits.add(&marks);
        self.wait_marks(device, &waits)
    }

    /// Copy `copy.bytes` from `copy.src` to `copy.dst` on `stream` of `device` (a staged
    /// call's copies): now on the host backend (its launches complete before they return);
    /// enqueued on the cuda backend (`cuMemcpyAsync`, which a graph capture records); nothing
    /// on the model backend, which moves no data.
    ///
    /// # Safety
    ///
    /// Both ranges are valid for the copy (on the device, for the cuda backend) until it has
    /// run, and do not overlap.
    pub unsafe fn copy(
        &self,
        device: i32,
        stream: u64,
        copy: &crate::plan::staging::Copy,
    ) -> Result<()> {
        match self {
            Backend::Host(_) => {
                // SAFETY: the caller's contract: both ranges are valid and disjoint.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        copy.src as *const u8,
                        copy.dst as *mut u8,
                        copy.bytes as usize,
                    )
                };
                Ok(())
            }
            Backend::Model(_) => Ok(()),
            // SAFETY: the caller's contract, passed on.
            Backend::Cuda(b) => unsafe { b.copy(device, stream, copy) },
        }
    }

    /// Allocate a zeroed `u32` flag that kernels on `device` write (system scope) and the host
    /// reads without a copy: host memory on the host backend, mapped pinned host memory on
    /// the cuda backend.
    pub fn alloc_flag(&self, device: i32) -> Result<Flag> {
        match self {
            Backend::Host(b) => b.alloc_zeroed(4).map(|a| Flag { host: a, device: a }),
            Backend::Model(b) => b
                .memory
                .alloc_zeroed(4)
                .map(|a| Flag { host: a, device: a }),
            Backend::Cuda(b) => b.alloc_flag(device),
        }
    }

    /// Make `bytes` of this process's host memory at `host` (page aligned, owned by the caller,
    /// possibly shared with other processes) accessible to kernels on `device` as flags are
    /// ([`Backend::alloc_flag`]): its device address, the same on the host backend, the
    /// mapping of the page-locked range on the cuda backend (`cuMemHostRegister`). `None` on
    /// the model backend, whose kernels see only its own memory.
    pub fn register_host(&self, device: i32, host: u64, bytes: usize) -> Result<Option<u64>> {
        match self {
            Backend::Host(_) => Ok(Some(host)),
            Backend::Model(_) => Ok(None),
            Backend::Cuda(b) => b.register_host(device, host, bytes).map(Some),
        }
    }

    /// Whether kernels on `device` reach the caller's `[address, address + bytes)`: always on
    /// the host and model backends (their kernels run in this process); on the cuda backend
    /// see [`cuda::CudaBackend::reaches`].
    pub fn reaches(&self, device: i32, address: u64, bytes: u64) -> Result<bool> {
        match self {
            Backend::Host(_) | Backend::Model(_) => Ok(true),
            Backend::Cuda(b) => b.reaches(device, address, bytes),
        }
    }

    /// Undo [`Backend::register_host`] (the memory stays the caller's).
    pub fn unregister_host(&self, device: i32, host: u64) -> Result<()> {
        match self {
            Backend::Host(_) | Backend::Model(_) => Ok(()),
            Backend::Cuda(b) => b.unregister_host(device, host),
        }
    }

    /// Free a flag from [`Backend::alloc_flag`].
    pub fn free_flag(&self, device: i32, flag: Flag) -> Result<()> {
        match self {
            Backend::Host(b) => b.free(flag.host),
            Backend::Model(b) => b.memory.free(flag.host),
            Backend::Cuda(b) => b.free_flag(device, flag),
        }
    }

    /// Enqueue a user's kernel on the cuda backend (see `CudaBackend::launch_user_kernel`); the
    /// host backend runs users' kernels itself (`Scope::launch`), the model runs none.
    pub fn launch_user_kernel(
        &self,
        device: i32,
        ranks_on_device: u32,
        kernel: (&str, &str),
        shape: (u32, u32),
        params: &[Vec<u8>],
        stream: u64,
    ) -> Result<()> {
        match self {
            Backend::Cuda(b) => {
                b.launch_user_kernel(device, ranks_on_device, kernel, shape, params, stream)
            }
            Backend::Host(_) | Backend::Model(_) => Err(Error::internal(
                "a user's kernel enqueued on a backend without a driver",
            )),
        }
    }

    /// Most blocks one rank may use when `ranks_on_device` ranks share its device (they must
    /// all be resident at once).
    pub fn max_blocks_per_rank(&self, device: i32, ranks_on_device: u32) -> Result<u32> {
        match self {
            Backend::Host(_) => Ok(crate::config::HostMode::Testing.max_blocks()),
            Backend::Cuda(b) => b.max_blocks_per_rank(device, ranks_on_device),
            Backend::Model(_) => Ok((model::MULTIPROCESSORS / ranks_on_device.max(1)).max(1)),
        }
    }

    /// Run or enqueue `launch`, which serves one rank per entry of `comms` (in the order of
    /// `launch.contexts`). On the host backend it has completed when this returns.
    pub fn launch(&self, launch: &Launch, comms: &[&CommResources]) -> Result<()> {
        let prepared = self.prepare_launch(launch, comms)?;
        self.run_launch(launch, comms, prepared).map(|_| ())
    }

    /// Everything that can refuse `launch` before anything of it runs or is enqueued (the
    /// kernel's loading, the streams, co-residency, the stream operations): an error here
    /// leaves nothing behind.
    pub fn prepare_launch(
        &self,
        launch: &Launch,
        comms: &[&CommResources],
    ) -> Result<PreparedLaunch> {
        match self {
            Backend::Host(_) => Ok(PreparedLaunch::Host),
            Backend::Cuda(b) => b
                .prepare_launch(launch, &cuda_streams(comms)?)
                .map(PreparedLaunch::Cuda),
            Backend::Model(_) => {
                let mut befores = Vec::new();
                let mut first = None;
                for r in comms {
                    match r {
                        CommResources::Model {
                            stream,
                            before,
                            after,
                        } => {
                            befores.push(*before);
                            first.get_or_insert((*stream, *after));
                        }
                        _ => return Err(Error::internal("model launch without a model stream")),
                    }
                }
                let first = first.ok_or_else(|| Error::internal("launch without a rank"))?;
                let kinds = launch
                    .streams
                    .iter()
                    .map(|s| model::stream_kind(launch.device, *s))
                    .collect::<Result<Vec<_>>>()?;
                let resident = model::MULTIPROCESSORS * model::BLOCKS_PER_MULTIPROCESSOR;
                let input = launch_input(launch, first, &befores, &kinds, Some(resident));
                schedule::schedule(&input).map(PreparedLaunch::Model)
            }
        }
    }

    /// Run or enqueue a launch that [`Backend::prepare_launch`] accepted.
    pub fn run_launch(
        &self,
        launch: &Launch,
        comms: &[&CommResources],
        prepared: PreparedLaunch,
    ) -> Result<LaunchEnd> {
        match (self, prepared) {
            (Backend::Host(b), PreparedLaunch::Host) => b.launch(launch).map(|completed| {
                if completed {
                    LaunchEnd::Completed
                } else {
                    LaunchEnd::GaveUp
                }
            }),
            (Backend::Cuda(b), PreparedLaunch::Cuda(prepared)) => b
                .run_launch(&cuda_streams(comms)?, &prepared)
                .map(|()| LaunchEnd::Enqueued),
            (Backend::Model(b), PreparedLaunch::Model(schedule)) => {
                b.execute(&schedule).map(|()| LaunchEnd::Enqueued)
            }
            _ => Err(Error::internal("a launch prepared by another backend")),
        }
    }

    /// Load `kernel` on `device` now, so that no later launch of it has to: on the cuda
    /// backend the module is JIT-compiled and the function loaded on the device (with lazy
    /// loading, the default since CUDA 12.2, that would otherwise happen at the first launch,
    /// possibly inside a stream capture or while peers' kernels already wait). Call it before
    /// anything of a collective is enqueued; it is safe during a capture and cheap once the
    /// kernel is loaded. Nothing to do on the host backend.
    pub fn prepare(&self, device: i32, kernel: KernelId) -> Result<()> {
        match self {
            Backend::Host(_) | Backend::Model(_) => Ok(()),
            Backend::Cuda(b) => b.prepare(device, kernel),
        }
    }

    /// The error that the communicator's queued work raised on its device, if any, found
    /// without blocking: on the cuda backend a failed kernel (trap, illegal address) or an
    /// unusable context, as `symmUnhandledCudaError` naming the CUDA error. Always `None` on
    /// the host backend, whose calls complete (and report) before they return.
    /// Unless `fresh`, the cuda backend may answer from a query of the device made within the
    /// last few milliseconds.
    pub fn async_error(&self, resources: &CommResources, fresh: bool) -> Option<Error> {
        match (self, resources) {
            (Backend::Cuda(b), CommResources::Cuda(stream)) => b.async_error(stream, fresh),
            _ => None,
        }
    }

    /// Mark that a launch was just enqueued on each of `streams` (the callers' streams of the
    /// ranks it serves on `device`; one mark per distinct stream): the windows it used keep
    /// the marks ([`StreamMarks::add`]) and [`Backend::wait_marks`] waits for them.
    pub fn mark_launch(&self, device: i32, streams: &[u64]) -> Result<LaunchMarks> {
        match self {
            Backend::Cuda(b) => Ok(LaunchMarks {
                events: b.mark_launch(device, streams)?,
            }),
            Backend::Host(_) | Backend::Model(_) => Ok(LaunchMarks::default()),
        }
    }

    /// Wait until every launch recorded in `marks` (of `device`) is done (before the window's
    /// memory, its context or its signal pad is freed).
    pub fn wait_marks(&self, device: i32, marks: &StreamMarks) -> Result<()> {
        match self {
            Backend::Cuda(b) => b.wait_marks(device, &marks.events),
            Backend::Host(_) | Backend::Model(_) => Ok(()),
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

/// A launch accepted by [`Backend::prepare_launch`].
pub enum PreparedLaunch {
    /// Host backend: nothing to prepare.
    Host,
    /// Cuda backend: the loaded kernel and the stream operations.
    Cuda(cuda::PreparedLaunch),
    /// Model backend: the stream operations.
    Model(schedule::LaunchSchedule),
}

/// The cuda streams of `comms`.
fn cuda_streams<'a>(comms: &[&'a CommResources]) -> Result<Vec<&'a cuda::CommStream>> {
    comms
        .iter()
        .map(|r| match r {
            CommResources::Cuda(s) => Ok(s),
            _ => Err(Error::internal("cuda launch without a stream")),
        })
        .collect()
}

/// The backend selected by `SYMM_BACKEND` (see the module docs).
pub fn select() -> Result<Arc<Backend>> {
    static HOST: OnceLock<Arc<Backend>> = OnceLock::new();
    let host = || {
        HOST.get_or_init(|| Arc::new(Backend::Host(host::HostBackend::new())))
            .clone()
    };
    if model::active() {
        static MODEL: OnceLock<Arc<Backend>> = OnceLock::new();
        return Ok(MODEL
            .get_or_init(|| Arc::new(Backend::Model(model::ModelBackend::new())))
            .clone());
    }
    match crate::config::backend_name().as_deref() {
        Some("host") => {
            crate::log!(
                Level::Info,
                Subsys::Init,
                None,
                "backend host (SYMM_BACKEND=host)"
            );
            Ok(host())
        }
        Some("cuda") => cuda::shared().map_err(|e| {
            Error::new(
                symmResult_t::symmNoDevice,
                format!(
                    "SYMM_BACKEND=cuda, but the cuda backend is unusable: {}",
                    e.message
                ),
            )
        }),
        None | Some("") => Ok(match cuda::shared() {
            Ok(cuda) => {
                crate::log!(
                    Level::Info,
                    Subsys::Init,
                    None,
                    "backend cuda (SYMM_BACKEND unset and a CUDA device is usable)"
                );
                cuda
            }
            Err(e) => {
                crate::log!(
                    Level::Warn,
                    Subsys::Init,
                    None,
                    "backend host: SYMM_BACKEND is unset and the cuda backend is unusable ({}); \
                     collectives run on CPU threads (set SYMM_BACKEND=cuda to make this an error)",
                    e.message
                );
                host()
            }
        }),
        Some(other) => Err(Error::invalid_argument(format!(
            "SYMM_BACKEND={other:?} is not a backend: expected \"host\" or \"cuda\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_backend_has_no_async_error_and_nothing_to_prepare() {
        let backend = Backend::Host(host::HostBackend::new());
        assert_eq!(backend.async_error(&CommResources::Host, true), None);
        let kernel = KernelId {
            algorithm: symm_device::symmetric::Algorithm::OneShotAllReduce,
            dtype: symm_device::DataType::Float32,
            op: symm_device::RedOp::Sum,
        };
        assert_eq!(backend.prepare(0, kernel), Ok(()));
    }
}
