//! Communicators: one [`Comm`] per rank, the ranks of one communicator sharing a [`Clique`].
//!
//! Handles given to C are `Arc::as_ptr` of a live [`Comm`]; every entry point looks the handle
//! up in [`LIVE_COMMS`] first, so a destroyed or made-up handle is an error, never a deref.

pub mod failure;
pub mod pacing;
pub mod pairs;
pub mod shrink;
pub mod span;
pub mod split;
pub mod staging;
pub mod watch;
pub mod windows;

use crate::abi::{SYMM_UNIQUE_ID_BYTES, symmComm_t, symmResult_t, symmUniqueId};
use crate::agree::CallLog;
use crate::agree::records::CallRecords;
use crate::backend::{Backend, BackendKind, CommResources};
use crate::error::{Error, Result, c_message};
use crate::log::{Level, Subsys};
use crate::transport::bootstrap::{self, UniqueId};
use crate::transport::fdpass::FdListener;
use crate::transport::link::{self, PeerInfo, RankLink};
use crate::transport::shareable::Shareable;
use crate::window::memory::{self, Allocation};
use crate::window::{Exchange, SignalPads, Window};
use failure::Failure;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::TaskArgs;
use symm_device::sync::signal_pad::MAX_RANKS;

/// What the ranks of one communicator share.
pub struct Clique {
    /// Number of ranks.
    pub nranks: usize,
    /// How the host backend runs this clique's kernels (the same on every rank: agreed when
    /// the ranks join); unused by the other backends.
    pub host_mode: crate::config::HostMode,
    /// Device of every rank ([`REMOTE_DEVICE`] for ranks of other processes).
    pub devices: Vec<i32>,
    /// Backend of every rank.
    pub backend: Arc<Backend>,
    /// Bound of every wait on a peer.
    pub timeout: Duration,
    /// `SYMM_ALGO`: an algorithm forced for every call (see `Collective::resolve_forced`).
    pub forced_algorithm: Option<Algorithm>,
    /// Most blocks per rank of every kernel of this clique: the minimum over its devices of
    /// what lets every rank sharing that device be resident at once, and over the ranks'
    /// `SYMM_MAX_BLOCKS`. A property of the clique, so that every rank plans the same grid.
    pub max_blocks: u32,
    /// Fewest blocks per rank a plan gives a kernel (`SYMM_MIN_BLOCKS`, 1 unset; the planner
    /// keeps it within `max_blocks`). Ranks of other processes must set the same value: a
    /// different one gives a different grid, which the call agreement refuses.
    pub min_blocks: u32,
    /// Most ranks of this clique on one physical GPU, ranks of other processes counted (1: a GPU
    /// per rank): the planner shares a GPU's bandwidth among them. A property of the clique, so
    /// that every rank plans the same grid.
    pub ranks_per_gpu: u32,
    /// Device work tables of launches (see `symm_device::symmetric::TaskArgs`), by device and
    /// content; uploaded once and kept until the communicator is destroyed (a CUDA graph that
    /// captured a launch replays it with the same table). A program whose fused batches keep
    /// changing (offsets, counts, windows) adds a table per new batch.
    tables: Mutex<HashMap<(i32, Vec<TaskArgs>), u64>>,
    /// All-gathers of the ranks' `symmCommSplit` calls, when every rank runs in this process.
    pub gatherings: split::Gatherings,
    /// Window registrations in flight, by registration sequence number.
    pub exchange: Mutex<Exchange>,
    /// Signalled whenever `exchange` changes.
    pub exchange_changed: Condvar,
    /// The signal pads of this clique's windows in this process, so that a window can hold
    /// those of its peers (see [`crate::window::SignalPad`]).
    pub signal_pads: SignalPads,
    /// The allocations of this clique's ranks in this process, so that a window can hold
    /// those of its peers (see [`memory`]).
    pub allocations: memory::Allocations,
    /// The collectives in flight of this process's ranks (see [`crate::agree::Signature`]).
    pub calls: Mutex<CallLog>,
    /// The communicator's first failure found by a rank of this process, or adopted from a
    /// rank of another process (see [`failure`]).
    pub failure: Mutex<Option<Failure>>,
    /// The calls each rank of this process has issued, which separate launches on one device
    /// wait for (see [`pacing`]).
    pub pacing: pacing::Pacing,
    /// On the host backend: the threads of launches that serve several threads (several ranks
    /// of this process, or the testing mode's blocks) stay for the next launch while the
    /// clique lives.
    _host_workers: Option<symm_device::arch::host::WorkerLease>,
}

impl Clique {
    /// Ranks of the clique on `device`.
    pub fn ranks_on_device(&self, device: i32) -> u32 {
        self.devices.iter().filter(|d| **d == device).count() as u32
    }

    /// The cost model (and block size) of this clique's plans: its executor's, and on the host
    /// backend its mode's.
    pub fn device_model(&self) -> crate::plan::DeviceModel {
        match (self.backend.kind(), self.host_mode) {
            (BackendKind::Host, crate::config::HostMode::Fast) => {
                crate::plan::DeviceModel::HostFast
            }
            (kind, _) => kind.into(),
        }
    }

    /// The devices of this process's ranks, each once: every one of them reads and writes the
    /// windows and signal pads of the others directly.
    pub fn local_devices(&self) -> Vec<i32> {
        let mut devices: Vec<i32> = self
            .devices
            .iter()
            .copied()
            .filter(|&d| d != REMOTE_DEVICE)
            .collect();
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    /// Device address (on `device`) of a work table holding `tasks`, uploaded once and reused;
    /// 0 on the host backend, whose kernels read the host's copy during the launch.
    pub fn work_table(&self, device: i32, tasks: &[TaskArgs]) -> Result<u64> {
        if self.backend.kind() == BackendKind::Host {
            return Ok(0);
        }
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let key = (device, tasks.to_vec());
        if let Some(address) = tables.get(&key) {
            return Ok(*address);
        }
        let bytes: Vec<u8> = bytemuck::cast_slice(tasks).to_vec();
        let address = self.backend.alloc_zeroed(device, bytes.len())?;
        if let Err(e) = self.backend.upload(device, address, &bytes) {
            let _ = self.backend.free(device, address);
            return Err(e);
        }
        tables.insert(key, address);
        Ok(address)
    }
}

impl Drop for Clique {
    fn drop(&mut self) {
        let tables = std::mem::take(self.tables.get_mut().unwrap_or_else(|e| e.into_inner()));
        for ((device, _), address) in tables {
            let _ = self.backend.free(device, address);
        }
    }
}

/// Mutable per-rank state.
#[derive(Default)]
pub struct CommState {
    /// This rank's hold on its `symmMemAlloc` allocations, by address (see [`memory`]).
    pub allocations: BTreeMap<u64, Arc<Allocation>>,
    /// Registered windows, by handle address.
    pub windows: HashMap<usize, Arc<Window>>,
    /// Sequence number of this rank's next window registration.
    pub next_window_seq: u64,
    /// Why this rank's communicator failed (see [`failure`]): its own finding, or
    /// another rank's it adopted; every later collective is refused with it.
    pub aborted: Option<String>,
    /// The code of that failure on this rank (its own finding's, or `symmRemoteError`).
    pub abort_code: Option<symmResult_t>,
    /// Set when a window registration through the bootstrap failed: later registrations are
    /// refused (the ranks of other processes may have given up on it).
    pub registration_failed: Option<String>,
    /// The kernel launched last by this rank (named when a kernel refuses its launch).
    pub last_kernel: Option<String>,
    /// Set by `symmCommFinalize`: every later collective and registration is refused; only
    /// teardown remains.
    pub finalized: bool,
    /// Set when the device reported that queued work failed (see
    /// [`crate::backend::Backend::async_error`]): every later collective fails with it.
    pub device_error: Option<Error>,
    /// The point-to-point window and its table of windows, made with the first window
    /// ([`pairs`]).
    pub point_to_point: Option<pairs::PointToPoint>,
    /// The staging window, made at the communicator's creation (none under
    /// `SYMM_STRICT_WINDOWS=1` or `SYMM_STAGING_BYTES=0`; see [`staging`]).
    pub staging: Option<Arc<staging::Staging>>,
}

impl CommState {
    /// `true` for the communicator's point-to-point window, whose memory no call names as its
    /// buffer. (The staging window is named by the staged calls' chunks: a caller's pointer
    /// into it is a pointer the caller never got.)
    pub fn is_internal(&self, window: &Window) -> bool {
        self.point_to_point
            .as_ref()
            .is_some_and(|p| p.window.seq == window.seq)
    }
}

/// One rank of a communicator.
pub struct Comm {
    /// Shared by all ranks.
    pub clique: Arc<Clique>,
    /// This rank.
    pub rank: usize,
    /// CUDA device ordinal (recorded, unused, on the host backend).
    pub device: i32,
    /// Most blocks this rank's kernels may use: the clique's `Clique::max_blocks`.
    pub max_blocks: u32,
    /// Launch resources (cuda stream and events).
    pub resources: CommResources,
    /// The link to the other ranks, for a communicator made by `symmCommInitRank` (`None`:
    /// `symmCommInitAll`, every rank in this process and its clique).
    pub link: Option<RankLink>,
    /// Mutable state.
    pub state: Mutex<CommState>,
    /// The process that created the communicator.
    pub pid: u32,
    /// Work of this rank queued in an open group (`symmGroupStart` without its
    /// `symmGroupEnd` yet): while non-zero, destroy, deregistration and free are refused, so
    /// that the group's end never runs on freed memory.
    pub queued_in_group: AtomicUsize,
    /// Sequence number of this rank's next collective launch (the `k`-th collective of every
    /// rank of the clique is one collective).
    pub next_collective: AtomicU64,
    /// The number of this rank's last refused collective while its peers' calls under that
    /// number are not all known (`u64::MAX`: none): see `failure::settle_refusal`.
    pub unsettled_refusal: AtomicU64,
    /// Kernel launches that served this rank (a fused launch counts once).
    pub launches: AtomicU64,
    /// The `symmCommSplit` calls this rank has made (the `n`-th of every rank is one split).
    pub splits: AtomicU64,
    /// The `symmCommShrink` calls this rank has made, by exclusion list (the `n`-th shrink
    /// with one list of every survivor is one shrink).
    pub shrinks: Mutex<HashMap<Vec<i32>, u64>>,
    /// The call records shared with the ranks of other processes of this machine (see
    /// `crate::agree::records`); `None` when every rank runs in this process or some rank runs
    /// on another machine.
    /// Windows whose abort word is in the records hold them too.
    pub call_records: Option<Arc<CallRecords>>,
    /// The watch on the processes of this rank's peers on this machine ([`watch`]), stopped
    /// at destroy.
    watch: Mutex<Option<watch::ProcessWatch>>,
    /// Set when the communicator's ranks span machines (see `span`): its collectives run inside
    /// each machine and on the rails, its windows are its machine's.
    pub span: std::sync::OnceLock<span::Span>,
    /// The thread whose call is being made on this rank (a collective, or the collectives it
    /// queued in its open group), and that call: see [`Comm::enter_call`].
    user: Mutex<Option<User>>,
    last_error: Mutex<CString>,
}

/// The thread currently making calls on a rank, and what it is doing.
struct User {
    thread: std::thread::ThreadId,
    /// The call it entered first ("symmAllReduce of 1024 x Float32", "symmGroupEnd").
    call: String,
    /// Its calls in progress: a collective being made, plus one per collective queued in its
    /// open group.
    holds: usize,
    /// Which entry of a thread into the rank this is (see [`Comm::wait_for_call_in_progress`]).
    entry: u64,
}

/// Entries of threads into ranks' calls, numbered.
static CALL_ENTRIES: AtomicU64 = AtomicU64::new(0);

/// A call in progress on a rank (see [`Comm::enter_call`]); leaving it releases the rank.
pub struct CallInProgress<'a> {
    comm: &'a Comm,
}

impl Drop for CallInProgress<'_> {
    fn drop(&mut self) {
        self.comm.release_call();
    }
}

/// Every live communicator, by handle address.
static LIVE_COMMS: Mutex<BTreeMap<usize, Arc<Comm>>> = Mutex::new(BTreeMap::new());

fn live_comms() -> MutexGuard<'static, BTreeMap<usize, Arc<Comm>>> {
    LIVE_COMMS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Comm {
    /// The live communicator behind `handle`.
    pub fn from_handle(handle: symmComm_t) -> Result<Arc<Comm>> {
        if handle.is_null() {
            return Err(Error::invalid_argument("comm is NULL"));
        }
        let comm = live_comms()
            .get(&(handle as usize))
            .cloned()
            .ok_or_else(|| {
                Error::invalid_argument(
                    "comm is not a live communicator (never created, or already destroyed)",
                )
            })?;
        let here = std::process::id();
        if comm.pid != here {
            // A forked child inherits the handles, not the communicator: its peers, memory
            // mappings and (on the cuda backend) CUDA context belong to the parent.
            return Err(Error::invalid_usage(format!(
                "comm was created by process {}, and this is process {here} (a child made by \
                 fork?): create a new communicator in this process",
                comm.pid
            )));
        }
        Ok(comm)
    }

    /// Kernel launches that have served this rank so far (a launch that fuses a group's
    /// collectives counts once): what a group became, for tests and benchmarks.
    pub fn launch_count(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// This communicator's handle.
    pub fn handle(self: &Arc<Self>) -> symmComm_t {
        Arc::as_ptr(self) as symmComm_t
    }

    /// Lock the mutable state.
    pub fn lock(&self) -> MutexGuard<'_, CommState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `symmInvalidUsage` while work of this rank is queued in an open group (`what` names the
    /// refused call).
    pub fn refuse_if_queued_in_group(&self, what: &str) -> Result<()> {
        let queued = self.queued_in_group.load(Ordering::Acquire);
        if queued == 0 {
            return Ok(());
        }
        Err(Error::invalid_usage(format!(
            "{what} while {queued} call(s) of this comm are queued in an open group \
             (symmGroupStart without symmGroupEnd): end the group first"
        )))
    }

    /// Enter `call` (a collective, or a group end) on this rank from the calling thread.
    /// Calls on one rank are ordered, so that every rank can pair its `k`-th collective with
    /// its peers' `k`-th: a call from a second thread while another thread's call is in
    /// progress (or queued in its open group) is refused with `symmInvalidUsage` naming both,
    /// and since the rank's calls no longer have an order its peers can know, the communicator
    /// is failed on every rank ([`failure`]). The same thread may enter again (its
    /// group's end, a nested call).
    pub fn enter_call(&self, call: &str) -> Result<CallInProgress<'_>> {
        let me = std::thread::current().id();
        let refused = {
            let mut user = self.user.lock().unwrap_or_else(|e| e.into_inner());
            match user.as_mut() {
                Some(u)
                    if u.thread != me
                        && !crate::mutation::active(
                            crate::mutation::Mutation::ThreadsShareARank,
                        ) =>
                {
                    Some(format!(
                        "comm is in use by another thread: this thread's {call} on rank {} was made \
                     while another thread's {} is in progress on it; a communicator must be used \
                     by one thread at a time (the rank's calls now have no order its peers can \
                     agree on, so the communicator is failed on every rank)",
                        self.rank, u.call
                    ))
                }
                Some(u) => {
                    u.holds += 1;
                    None
                }
                None => {
                    *user = Some(User {
                        thread: me,
                        call: call.to_string(),
                        holds: 1,
                        entry: CALL_ENTRIES.fetch_add(1, Ordering::Relaxed),
                    });
                    None
                }
            }
        };
        match refused {
            Some(message) => {
                let error = Error::invalid_usage(message);
                failure::fail(self, &error);
                Err(error)
            }
            None => Ok(CallInProgress { comm: self }),
        }
    }

    /// Wait until no thread but the calling one is in a call on this rank, at most `bound`;
    /// `true` when none is. Another thread's call that holds the rank for its open group
    /// counts as in a call.
    pub fn wait_for_other_threads(&self, bound: Duration) -> bool {
        let me = std::thread::current().id();
        let start = Instant::now();
        loop {
            let busy = self
                .user
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|u| u.thread != me);
            if !busy {
                return true;
            }
            if start.elapsed() >= bound {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Wait until the call another thread is making on this rank now (if any) has returned,
    /// at most `bound` (later calls of that thread are not waited for); `true` when it has.
    pub fn wait_for_call_in_progress(&self, bound: Duration) -> bool {
        let me = std::thread::current().id();
        let entry_now =
            |user: &Option<User>| user.as_ref().filter(|u| u.thread != me).map(|u| u.entry);
        let Some(entry) = entry_now(&self.user.lock().unwrap_or_else(|e| e.into_inner())) else {
            return true;
        };
        let start = Instant::now();
        loop {
            let now = entry_now(&self.user.lock().unwrap_or_else(|e| e.into_inner()));
            if now != Some(entry) {
                return true;
            }
            if start.elapsed() >= bound {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Keep the calling thread's hold on this rank for a collective queued in its open group
    /// (released by [`Comm::release_call`] at the group's end). The thread must be in a call
    /// on this rank ([`Comm::enter_call`]).
    pub fn hold_for_group(&self) {
        let mut user = self.user.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = user.as_mut() {
            u.holds += 1;
        }
    }

    /// Release one hold of [`Comm::enter_call`] or [`Comm::hold_for_group`].
    pub fn release_call(&self) {
        let mut user = self.user.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = user.as_mut() {
            u.holds -= 1;
            if u.holds == 0 {
                *user = None;
            }
        }
    }

    /// Record `message` as this communicator's last error.
    pub fn set_last_error(&self, message: &str) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = c_message(message);
    }

    /// This communicator's last error; valid until its next failing call.
    pub fn last_error(&self) -> *const std::ffi::c_char {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ptr()
    }

    /// Free everything this rank still owns; called by `symmCommDestroy`.
    fn release(&self) -> Result<()> {
        let backend = &self.clique.backend;
        // Every stream a collective on a window was enqueued on, before anything is freed.
        let waited = backend.synchronize(&self.resources).and_then(|()| {
            let windows: Vec<Arc<Window>> = self.lock().windows.values().cloned().collect();
            windows.iter().try_for_each(|w| w.wait_for_launches())
        });
        let mut state = self.lock();
        let windows = std::mem::take(&mut state.windows);
        let staging = state.staging.take();
        let point_to_point = state.point_to_point.take();
        let allocations = std::mem::take(&mut state.allocations);
        drop(state);
        if let Err(e) = waited {
            // Work of this rank may still use its memory: keep it (leaked), never free it
            // under that work.
            std::mem::forget((windows, staging, point_to_point, allocations));
            return Err(e);
        }
        // In registration order: a window over an engine's memory releases its pads with the
        // engine's collective calls, which every rank must make in the same order.
        let mut windows: Vec<Arc<Window>> = windows.into_values().collect();
        windows.sort_by_key(|w| w.seq);
        drop(windows);
        drop(staging);
        drop(point_to_point);
        // Freed now, or by the last window of this process that holds it (`window::memory`).
        drop(allocations);
        Ok(())
    }

    /// The communicator of this rank's machine: its own, or for a communicator whose ranks span
    /// machines ([`span`]), the machine's, which holds the windows.
    pub fn machine(self: &Arc<Self>) -> Arc<Comm> {
        match self.span.get() {
            Some(span) => span.inside().clone(),
            None => self.clone(),
        }
    }

    /// `true` when this rank's windows must be mapped by ranks of other processes.
    pub fn shares_across_processes(&self) -> bool {
        self.link.as_ref().is_some_and(RankLink::has_remote_peers)
    }

    /// `symmMemAlloc`: `size` zeroed bytes for windows of this communicator; shareable memory
    /// when ranks of other processes must map it.
    pub fn mem_alloc(&self, size: usize) -> Result<u64> {
        let backend = &self.clique.backend;
        let allocation = if self.shares_across_processes() {
            let memory = Shareable::create(
                backend,
                self.device,
                &self.clique.local_devices(),
                size,
                "symm-window",
            )?;
            Allocation::from_shared(backend, self.device, memory, size)
        } else {
            let address = backend.alloc_zeroed(self.device, size)?;
            Allocation::from_backend(backend, self.device, address, size)
        };
        let allocation = Arc::new(allocation);
        self.clique.allocations.insert(&allocation);
        let address = allocation.address;
        self.lock().allocations.insert(address, allocation);
        Ok(address)
    }

    /// `symmMemFree` of an allocation that is no longer in a window (checked by the caller):
    /// this rank lets go of it once its own work is done; the memory is freed then, or by the
    /// last window of another rank of this process that holds it (see [`memory`]).
    pub fn mem_free(&self, address: u64) -> Result<()> {
        // On an error this rank's work may still use it: it stays allocated.
        self.clique.backend.synchronize(&self.resources)?;
        let allocation = self.lock().allocations.remove(&address);
        drop(allocation);
        Ok(())
    }
}

pub(crate) fn new_comm(
    clique: &Arc<Clique>,
    rank: usize,
    link: Option<RankLink>,
    call_records: Option<Arc<CallRecords>>,
) -> Result<Arc<Comm>> {
    let device = clique.devices[rank];
    let resources = clique.backend.open_comm(device)?;
    let max_blocks = clique.max_blocks;
    let comm = Arc::new(Comm {
        clique: clique.clone(),
        rank,
        device,
        max_blocks,
        resources,
        link,
        state: Mutex::new(CommState::default()),
        pid: std::process::id(),
        queued_in_group: AtomicUsize::new(0),
        next_collective: AtomicU64::new(0),
        unsettled_refusal: AtomicU64::new(u64::MAX),
        launches: AtomicU64::new(0),
        splits: AtomicU64::new(0),
        shrinks: Mutex::new(HashMap::new()),
        call_records,
        watch: Mutex::new(None),
        span: std::sync::OnceLock::new(),
        user: Mutex::new(None),
        last_error: Mutex::new(CString::default()),
    });
    crate::log!(
        Level::Info,
        Subsys::Init,
        Some(rank),
        "symm {} rank {rank} of {}: backend {}, device {device}, {}",
        env!("CARGO_PKG_VERSION"),
        clique.nranks,
        clique.backend.kind().name(),
        match &comm.link {
            Some(link) if link.has_remote_peers() => {
                "joined through the bootstrap, with ranks in other processes"
            }
            Some(_) => "joined through the bootstrap, every rank in this process",
            None if clique.devices.contains(&REMOTE_DEVICE) => {
                "ranks on several machines (each machine's ranks in a communicator of their own)"
            }
            None => "every rank in this process (symmCommInitAll)",
        }
    );
    crate::log!(
        Level::Info,
        Subsys::Init,
        Some(rank),
        "calls on a communicator must come from one thread at a time: a collective or group end \
         that finds another thread's call in progress on it is refused (symmInvalidUsage) and \
         fails the communicator on every rank"
    );
    live_comms().insert(Arc::as_ptr(&comm) as usize, comm.clone());
    Ok(comm)
}

/// `SYMM_HOST_MODE` on the host backend; the other backends ignore it (and a value they would
/// refuse).
fn host_mode_of(backend: &Backend) -> Result<crate::config::HostMode> {
    if backend.kind() == BackendKind::Host {
        crate::config::host_mode()
    } else {
        Ok(crate::config::HostMode::Fast)
    }
}

fn new_clique(devices: &[i32]) -> Result<Arc<Clique>> {
    let backend = crate::backend::select()?;
    let host_mode = host_mode_of(&backend)?;
    new_local_clique(
        backend,
        devices,
        crate::config::block_bounds()?,
        host_mode,
        crate::config::timeout()?,
    )
}

/// A clique of `devices`, every rank in this process, whose kernels get between `bounds.0`
/// and `bounds.1` blocks per rank (within what lets the ranks sharing a device be resident
/// at once).
pub(crate) fn new_local_clique(
    backend: Arc<Backend>,
    devices: &[i32],
    (min_blocks, most_blocks): (u32, u32),
    host_mode: crate::config::HostMode,
    timeout: Duration,
) -> Result<Arc<Clique>> {
    let mut max_blocks = most_blocks;
    let mut ranks_per_gpu = 1;
    for &device in devices {
        let sharing = devices.iter().filter(|d| **d == device).count() as u32;
        max_blocks = max_blocks.min(backend.max_blocks_per_rank(device, sharing)?);
        ranks_per_gpu = ranks_per_gpu.max(sharing);
    }
    new_clique_with(
        backend,
        devices,
        (min_blocks, max_blocks, ranks_per_gpu),
        host_mode,
        timeout,
    )
}

/// A clique of `devices` (entries [`REMOTE_DEVICE`] for ranks of other processes) whose
/// kernels use at least `min_blocks` and at most `max_blocks` blocks per rank, with at most
/// `ranks_per_gpu` ranks on one GPU.
fn new_clique_with(
    backend: Arc<Backend>,
    devices: &[i32],
    (min_blocks, max_blocks, ranks_per_gpu): (u32, u32, u32),
    host_mode: crate::config::HostMode,
    timeout: Duration,
) -> Result<Arc<Clique>> {
    let max_blocks = if backend.kind() == BackendKind::Host {
        max_blocks.min(host_mode.max_blocks())
    } else {
        max_blocks
    };
    let local: Vec<i32> = devices
        .iter()
        .copied()
        .filter(|d| *d != REMOTE_DEVICE)
        .collect();
    backend.connect_devices(&local)?;
    let backend_kind = backend.kind();
    if backend_kind == BackendKind::Host && host_mode == crate::config::HostMode::Fast {
        park_sooner_when_oversubscribed(devices.len());
    }
    Ok(Arc::new(Clique {
        host_mode,
        max_blocks,
        min_blocks,
        ranks_per_gpu,
        nranks: devices.len(),
        devices: devices.to_vec(),
        backend,
        timeout,
        forced_algorithm: crate::config::forced_algorithm()?,
        tables: Mutex::new(HashMap::new()),
        gatherings: split::Gatherings::default(),
        exchange: Mutex::new(Exchange::default()),
        exchange_changed: Condvar::new(),
        signal_pads: Mutex::new(HashMap::new()),
        allocations: memory::Allocations::default(),
        calls: Mutex::new(CallLog::default()),
        failure: Mutex::new(None),
        pacing: pacing::Pacing::new(devices.len()),
        _host_workers: (backend_kind == BackendKind::Host)
            .then(symm_device::arch::host::WorkerLease::acquire),
    }))
}

/// In the host backend's fast mode, a communicator of more ranks than the machine has cores
/// (`std::thread::available_parallelism`) makes every wait of the process park after
/// [`PARK_AFTER_POLLS_OVERSUBSCRIBED`] polls (see `symm_device::sync::wait`): a waiter that
/// keeps polling would hold a core that the rank it waits for needs.
///
/// [`PARK_AFTER_POLLS_OVERSUBSCRIBED`]: symm_device::sync::wait::PARK_AFTER_POLLS_OVERSUBSCRIBED
fn park_sooner_when_oversubscribed(nranks: usize) {
    let cores = std::thread::available_parallelism().map_or(usize::MAX, |n| n.get());
    if nranks > cores {
        symm_device::arch::host::park_sooner(
            symm_device::sync::wait::PARK_AFTER_POLLS_OVERSUBSCRIBED,
        );
    }
}

/// `nranks` ranks of one clique on device 0 of `backend`, with the bound `timeout` (tests of
/// this crate, which must not depend on the environment).
#[cfg(test)]
pub(crate) fn init_all_on(
    backend: Arc<Backend>,
    nranks: usize,
    timeout: Duration,
) -> Result<Vec<Arc<Comm>>> {
    let clique = new_clique_with(
        backend,
        &vec![0; nranks],
        (1, 1, nranks as u32),
        crate::config::HostMode::Testing,
        timeout,
    )?;
    (0..nranks)
        .map(|r| new_comm(&clique, r, None, None))
        .collect()
}

fn check_nranks(nranks: i64, name: &str) -> Result<usize> {
    if nranks <= 0 {
        return Err(Error::invalid_argument(format!(
            "{name} = {nranks}: must be at least 1"
        )));
    }
    if nranks as usize > MAX_RANKS {
        return Err(Error::invalid_argument(format!(
            "{name} = {nranks}: at most {MAX_RANKS} ranks are supported"
        )));
    }
    Ok(nranks as usize)
}

/// `symmCommInitAll`: `devices.len()` ranks in this process, rank `i` on `devices[i]`.
pub fn init_all(devices: &[i32]) -> Result<Vec<Arc<Comm>>> {
    let nranks = check_nranks(devices.len() as i64, "ndev")?;
    if let Some((i, d)) = devices.iter().enumerate().find(|(_, d)| **d < 0) {
        return Err(Error::invalid_argument(format!(
            "devlist[{i}] = {d}: must be >= 0"
        )));
    }
    let clique = new_clique(devices)?;
    let mut comms = Vec::with_capacity(nranks);
    let destroy_all = |comms: Vec<Arc<Comm>>| {
        for comm in comms {
            let _ = destroy(&comm);
        }
    };
    for rank in 0..nranks {
        match new_comm(&clique, rank, None, None) {
            Ok(comm) => comms.push(comm),
            Err(e) => {
                destroy_all(comms);
                return Err(e);
            }
        }
    }
    if let Err(e) = staging::attach(&comms) {
        destroy_all(comms);
        return Err(e);
    }
    Ok(comms)
}

/// The live ranks of `clique` in this process.
pub fn clique_comms(clique: &Arc<Clique>) -> Vec<Arc<Comm>> {
    live_comms()
        .values()
        .filter(|c| Arc::ptr_eq(&c.clique, clique))
        .cloned()
        .collect()
}

/// `symmCommDestroy`.
pub fn destroy(comm: &Arc<Comm>) -> Result<()> {
    comm.refuse_if_queued_in_group("symmCommDestroy")?;
    if let Some(span) = comm.span.get() {
        // Its windows' registrations queue on the machine's communicator.
        span.inside().refuse_if_queued_in_group("symmCommDestroy")?;
    }
    if live_comms().remove(&(Arc::as_ptr(comm) as usize)).is_none() {
        return Err(Error::invalid_argument("comm was already destroyed"));
    }
    // This rank leaves: its peers' watches must not take its process's exit for a failure.
    if let Some(records) = &comm.call_records {
        records.leave();
    }
    let watch = comm.watch.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(watch);
    let left = comm.span.get().map_or(Ok(()), span::Span::close);
    comm.release().and(left)
}

/// `symmCommAbort`: fail the communicator on every rank, naming this rank's abort (the
/// failure path of [`failure::fail`]: every rank's pending kernels give up at their next look
/// and every later call of every rank is refused with the cause), wait for a call another
/// thread has in progress on this rank to return (it returns the abort's error: its kernels
/// see the raised abort words), then free everything as [`destroy`] does. Not a call of the
/// rank: it may come from any thread, also while another thread's call waits for a peer that
/// hangs. Refused only when the calling thread holds calls of this rank queued in its open
/// group (end the group first), or when that other thread's call has not returned within the
/// communicator's timeout.
pub fn abort(comm: &Arc<Comm>) -> Result<()> {
    comm.refuse_if_queued_in_group("symmCommAbort")?;
    let error = Error::invalid_usage(format!(
        "rank {} called symmCommAbort: the communicator is aborted",
        comm.rank
    ));
    failure::fail(comm, &error);
    // The clique's first failure raised every window's abort word; a later one found them
    // raised already. Raise this rank's again so that no kernel of it waits on.
    let windows: Vec<Arc<Window>> = comm.lock().windows.values().cloned().collect();
    for window in windows {
        window.raise_abort(symm_device::symmetric::ABORT_PEER_FAILED);
        // What an engine lent for the window (its pads) is released by that engine's
        // collective calls, which failed peers may never make: keep it (leaked) rather than
        // hang the abort.
        window.leak_owner_resources();
    }
    if !comm.wait_for_other_threads(comm.clique.timeout) {
        return Err(Error::new(
            symmResult_t::symmTimeout,
            format!(
                "symmCommAbort on rank {}: another thread's call on this rank did not return \
                 within the timeout ({:?}); the communicator is failed on every rank but not \
                 freed",
                comm.rank, comm.clique.timeout
            ),
        ));
    }
    destroy(comm)
}

/// `symmCommRevoke`: stop the communicator's work on every rank and refuse its later
/// collectives, keeping it for recovery (NCCL's `ncclCommRevoke`). The communicator fails on
/// every rank as by [`abort`], with the cause "rank r revoked the communicator" (every rank's
/// pending kernels give up at their next look); this rank's later collectives are refused with
/// `symmInvalidUsage` naming the revoke (a peer's, with `symmRemoteError` naming it, until it
/// revokes too); then it waits, within the timeout, for this rank's launches to end. What
/// stays: `symmCommSplit` (the new communicators are made through the bootstrap, not the
/// revoked kernels), deregistration, `symmMemFree`, `symmCommDestroy`. `flags` must be
/// `SYMM_REVOKE_DEFAULT` (0). Like [`abort`], callable from another thread while a call of
/// this rank waits.
pub fn revoke(comm: &Arc<Comm>, flags: i32) -> Result<()> {
    if flags != crate::abi::SYMM_REVOKE_DEFAULT {
        return Err(Error::invalid_argument(format!(
            "revokeFlags = {flags}: must be SYMM_REVOKE_DEFAULT (0)"
        )));
    }
    comm.refuse_if_queued_in_group("symmCommRevoke")?;
    if comm.span.get().is_some() {
        return Err(span::unsupported("symmCommRevoke"));
    }
    let cause = format!(
        "rank {} revoked the communicator (symmCommRevoke): its collectives are refused; \
         symmCommSplit, symmCommShrink and teardown remain",
        comm.rank
    );
    revoke_with(comm, cause, ("symmCommRevoke", true))
}

/// Revoke `comm` with `cause` (see [`revoke`]); `what` names the call, for its timeout, and
/// `wait` says whether to wait for another thread's call in progress (not when that thread is
/// the caller's own group end, which holds the rank).
pub(crate) fn revoke_with(
    comm: &Arc<Comm>,
    cause: String,
    (what, wait): (&str, bool),
) -> Result<()> {
    failure::fail(comm, &Error::invalid_usage(cause.clone()));
    {
        // This rank's own refusals name its revoke, also after it adopted another failure.
        let mut state = comm.lock();
        state.aborted = Some(cause);
        state.abort_code = Some(symmResult_t::symmInvalidUsage);
    }
    let windows: Vec<Arc<Window>> = comm.lock().windows.values().cloned().collect();
    for window in &windows {
        window.raise_abort(symm_device::symmetric::ABORT_PEER_FAILED);
    }
    if wait && !comm.wait_for_call_in_progress(comm.clique.timeout) {
        return Err(Error::new(
            symmResult_t::symmTimeout,
            format!(
                "{what} on rank {}: another thread's call on this rank did not return within \
                 the timeout ({:?}); the communicator is revoked",
                comm.rank, comm.clique.timeout
            ),
        ));
    }
    // Quiesced: this rank's kernels, which saw the raised words, are done (their own errors
    // are the revoke's).
    for window in &windows {
        let _ = window.wait_for_launches();
    }
    Ok(())
}

/// A window of any live communicator of this process that covers part of `[address, +size)`,
/// as (rank, window base): memory a shrink moved to a new communicator may still be registered
/// on the parent, and is not freed while it is.
pub fn window_covering(address: u64, size: u64) -> Option<(usize, u64)> {
    let comms: Vec<Arc<Comm>> = live_comms().values().cloned().collect();
    comms.iter().find_map(|c| {
        c.lock()
            .windows
            .values()
            .find(|w| w.overlaps(address, size))
            .map(|w| (c.rank, w.base))
    })
}

/// `symmCommFinalize`: wait until every collective this rank enqueued has completed (on every
/// stream it was enqueued on), then refuse every later collective and registration; only
/// teardown (`symmCommDestroy`, deregistration, `symmMemFree`) remains. Returns the
/// communicator's failure if it failed, here or on another rank. A call of the rank (one thread
/// at a time), refused inside an open group that queued calls of it.
pub fn finalize(comm: &Arc<Comm>) -> Result<()> {
    if let Some(span) = comm.span.get() {
        let _call = comm.enter_call("symmCommFinalize")?;
        finalize(span.inside())?;
        comm.lock().finalized = true;
        return match span.failure() {
            Some(failure) => Err(failure),
            None => Ok(()),
        };
    }
    let _call = comm.enter_call("symmCommFinalize")?;
    comm.refuse_if_queued_in_group("symmCommFinalize")?;
    comm.clique.backend.synchronize(&comm.resources)?;
    let windows: Vec<Arc<Window>> = comm.lock().windows.values().cloned().collect();
    for window in &windows {
        window.wait_for_launches()?;
    }
    comm.lock().finalized = true;
    failure::check(comm)
}

/// The refusal of `what` on a finalized communicator, or `Ok`.
pub fn refuse_if_finalized(comm: &Comm, what: &str) -> Result<()> {
    if comm.lock().finalized {
        return Err(Error::invalid_usage(format!(
            "{what} on rank {} after symmCommFinalize: a finalized communicator only allows \
             teardown (deregistration, symmMemFree, symmCommDestroy)",
            comm.rank
        )));
    }
    Ok(())
}

/// How long a root made by `symmGetUniqueId` waits for its ranks to join: the id may travel
/// through a slow launcher first, so longer than the ranks' own bound.
pub(crate) const ROOT_JOIN_TIMEOUT: Duration = Duration::from_secs(600);

/// Bootstrap roots serving communicators from this process (kept so that they can be
/// stopped when the process unloads the library; a root ends by itself once its ranks left).
static ROOTS: Mutex<Vec<bootstrap::RootHandle>> = Mutex::new(Vec::new());

pub(crate) fn keep_root(root: bootstrap::RootHandle) {
    let mut roots = ROOTS.lock().unwrap_or_else(|e| e.into_inner());
    roots.retain(|r| !r.is_finished());
    roots.push(root);
}

/// `symmGetUniqueId`: with `SYMM_COMM_ID=host:port` set, the id naming that address (rank 0's
/// `symmCommInitRank` opens the root there); else a fresh id with a random secret whose root
/// listens in this process (on loopback unless `SYMM_SOCKET_ADDR` says otherwise).
pub fn new_unique_id() -> Result<symmUniqueId> {
    if let Some(id) = UniqueId::from_env()? {
        return Ok(to_c_id(&id));
    }
    let listen = bootstrap::listen_address_from_env()?;
    let secret = bootstrap::random_secret()?;
    let root = bootstrap::start_root(listen, secret, ROOT_JOIN_TIMEOUT)?;
    let id = UniqueId::new(root.address(), secret);
    keep_root(root);
    Ok(to_c_id(&id))
}

fn to_c_id(id: &UniqueId) -> symmUniqueId {
    symmUniqueId {
        internal: id.encode().map(|b| b as std::ffi::c_char),
    }
}

/// Cliques of this process's ranks of communicators made by `symmCommInitRank`, by unique id:
/// ranks of one communicator in one process share their clique (so that a group can merge
/// their launches).
static LOCAL_CLIQUES: Mutex<BTreeMap<[u8; SYMM_UNIQUE_ID_BYTES], std::sync::Weak<Clique>>> =
    Mutex::new(BTreeMap::new());

/// `symmCommInitRank`: join the communicator named by `id` as `rank` of `nranks`, in this
/// process or another; returns when all ranks have joined, or `symmTimeout`.
pub fn init_rank(nranks: i32, id: &symmUniqueId, rank: i32) -> Result<Arc<Comm>> {
    let nranks = check_nranks(nranks as i64, "nranks")?;
    if rank < 0 || rank as usize >= nranks {
        return Err(Error::invalid_argument(format!(
            "rank = {rank}: must be in [0, {nranks})"
        )));
    }
    let key: [u8; SYMM_UNIQUE_ID_BYTES] = id.internal.map(|c| c as u8);
    let id = UniqueId::decode(&key)?;
    // SYMM_COMM_ID: rank 0 opens the root at the agreed address.
    let opens_root = rank == 0 && UniqueId::from_env()?.is_some_and(|env| env == id);
    join_as(nranks, &id, rank as usize, opens_root)
}

/// `symmCommInitFromEnv`: join the communicator `launcher` describes (see
/// [`crate::config::parse_launcher`]); rank 0 opens the bootstrap root at its address.
pub fn init_from_launcher(launcher: &crate::config::Launcher) -> Result<Arc<Comm>> {
    let nranks = check_nranks(launcher.nranks as i64, "the number of ranks").map_err(|e| {
        Error::invalid_argument(format!("{} (from the launcher's variables)", e.message))
    })?;
    let rank = launcher.rank;
    if rank < 0 || rank as usize >= nranks {
        return Err(Error::invalid_argument(format!(
            "rank = {rank} (from the launcher's variables): must be in [0, {nranks})"
        )));
    }
    let id = bootstrap::parse_root_address(
        &launcher.address,
        launcher.secret.as_deref(),
        launcher.address_from,
    )?;
    join_as(nranks, &id, rank as usize, rank == 0)
}

/// Join the communicator `id` names as `rank` of `nranks` (validated), opening its root first
/// when `opens_root`.
fn join_as(nranks: usize, id: &UniqueId, rank: usize, opens_root: bool) -> Result<Arc<Comm>> {
    if opens_root {
        let root = bootstrap::start_root(id.address(), *id.secret(), ROOT_JOIN_TIMEOUT)?;
        keep_root(root);
    }
    let backend = crate::backend::select()?;
    join(
        nranks,
        id,
        rank,
        Joining {
            device: current_device_hint(),
            bounds: crate::config::block_bounds()?,
            timeout: crate::config::timeout()?,
            join_timeout: crate::config::bootstrap_timeout()?,
            backend,
        },
    )
}

/// How a rank joins a communicator through its bootstrap root.
pub(crate) struct Joining {
    /// The backend the rank runs on.
    pub backend: Arc<Backend>,
    /// Its device.
    pub device: i32,
    /// Its fewest and most blocks per rank (`SYMM_MIN_BLOCKS`, `SYMM_MAX_BLOCKS`).
    pub bounds: (u32, u32),
    /// The bound of the communicator's waits on a peer.
    pub timeout: Duration,
    /// How long it waits for every rank to join.
    pub join_timeout: Duration,
}

/// Join the communicator whose root `id` names as `rank` of `nranks` (after validation: the
/// common part of `symmCommInitRank` and `symmCommSplit`).
pub(crate) fn join(
    nranks: usize,
    id: &UniqueId,
    rank: usize,
    joining: Joining,
) -> Result<Arc<Comm>> {
    let Joining {
        backend,
        device,
        bounds,
        timeout,
        join_timeout,
    } = joining;
    let rank = rank as i32;
    let key = id.encode();
    let id = *id;
    let gpu = match backend.kind() {
        BackendKind::Cuda => {
            crate::backend::vmm::device_uuid(crate::backend::cuda::cu_device(device)?)?
        }
        BackendKind::Host | BackendKind::Model => [0; 16],
    };
    let listener = FdListener::bind()?;
    let info = PeerInfo {
        pid: std::process::id(),
        pid_namespace: link::pid_namespace(),
        process: link::process_identity()?,
        node: link::node_id(),
        backend: backend.kind() as u8,
        device,
        gpu,
        socket: listener.name().to_vec(),
    };
    let (client, blobs) = bootstrap::Client::connect(
        &id,
        nranks as u32,
        rank as u32,
        &info.encode(),
        join_timeout,
    )?;
    let peers = blobs
        .iter()
        .enumerate()
        .map(|(r, b)| PeerInfo::decode(b, r))
        .collect::<Result<Vec<_>>>()?;
    let link = RankLink::new(rank as u32, id, peers, client, listener);
    let nodes: Vec<[u8; 16]> = link.peers.iter().map(|p| p.node).collect();
    if let Some(shape) = span::shape::shape(&nodes)? {
        check_peers(&link, rank as usize, backend.kind())?;
        let joining = Joining {
            backend,
            device,
            bounds,
            timeout,
            join_timeout,
        };
        return span::form(link, rank as usize, shape, joining);
    }
    check_peers(&link, rank as usize, backend.kind())?;
    crate::log!(
        Level::Info,
        Subsys::Bootstrap,
        Some(rank as usize),
        "bootstrap: joined {nranks} ranks through the root at {}; ranks in other processes: {}",
        link.id.address(),
        (0..nranks).filter(|&r| !link.is_local(r)).count()
    );

    // Every rank plans the same grids: the block cap is the minimum over the ranks of what
    // lets every rank on one physical GPU be resident at once, ranks of other processes
    // included (they share the SMs under MPS; without it, their kernels take turns).
    let on_gpu = link::ranks_on_same_gpu(&link.peers, rank as usize);
    let elsewhere: Vec<usize> = on_gpu
        .iter()
        .copied()
        .filter(|&r| !link.is_local(r))
        .collect();
    if !elsewhere.is_empty() {
        crate::log!(
            Level::Warn,
            Subsys::Init,
            Some(rank as usize),
            "ranks {elsewhere:?} of other processes share this rank's GPU (device {device}): \
             each rank's kernels get a share of the SMs ({} ranks on it), and without MPS \
             their kernels take turns on the GPU, so every cross-rank wait lasts a time slice \
             (correct, slow; start the MPS daemon for concurrency)",
            on_gpu.len()
        );
    }
    let own_cap = backend
        .max_blocks_per_rank(device, on_gpu.len() as u32)?
        .min(bounds.1);
    // Each rank's block cap, host mode and staging window: the clique takes the smallest cap,
    // and the testing mode when any rank asks for it (every rank must run the same block
    // size); the staging windows must be alike (they are registered together below).
    let own_mode = host_mode_of(&backend)?;
    let own_staging = crate::config::staging_bytes()?;
    let mut contribution = own_cap.to_le_bytes().to_vec();
    contribution.push(u8::from(own_mode == crate::config::HostMode::Testing));
    contribution.extend_from_slice(&own_staging.to_le_bytes());
    link.contribute(link::INIT_TAG, &contribution)?;
    let caps = link.gathered(link::INIT_TAG, timeout)?;
    let mut max_blocks = u32::MAX;
    let mut host_mode = crate::config::HostMode::Fast;
    for (r, sent) in caps.iter().enumerate() {
        let malformed = || Error::internal(format!("rank {r} sent a malformed block cap"));
        let (cap, mode, staging) = match sent.as_slice() {
            [a, b, c, d, mode @ (0 | 1), staging @ ..] if staging.len() == 8 => (
                u32::from_le_bytes([*a, *b, *c, *d]),
                *mode,
                u64::from_le_bytes(staging.try_into().map_err(|_| malformed())?),
            ),
            _ => return Err(malformed()),
        };
        if cap == 0 {
            return Err(malformed());
        }
        if staging != own_staging {
            return Err(Error::invalid_argument(format!(
                "rank {r} stages calls outside the windows through a staging window of \
                 {staging} bytes, rank {rank} through one of {own_staging} (0: none, \
                 SYMM_STRICT_WINDOWS=1 or SYMM_STAGING_BYTES=0): set SYMM_STAGING_BYTES and \
                 SYMM_STRICT_WINDOWS alike on every rank"
            )));
        }
        max_blocks = max_blocks.min(cap);
        if mode == 1 {
            host_mode = crate::config::HostMode::Testing;
        }
    }
    if host_mode != own_mode && backend.kind() == BackendKind::Host {
        crate::log!(
            Level::Info,
            Subsys::Init,
            Some(rank as usize),
            "SYMM_HOST_MODE: another rank runs the testing mode, so every rank does"
        );
    }
    let ranks_per_gpu = link::most_ranks_on_one_gpu(&link.peers);

    let clique = {
        let mut cliques = LOCAL_CLIQUES.lock().unwrap_or_else(|e| e.into_inner());
        cliques.retain(|_, c| c.strong_count() > 0);
        match cliques.get(&key).and_then(std::sync::Weak::upgrade) {
            Some(clique) => clique,
            None => {
                // Ranks of other processes have no device here.
                let devices: Vec<i32> = (0..nranks)
                    .map(|r| {
                        if link.is_local(r) {
                            link.peers[r].device
                        } else {
                            REMOTE_DEVICE
                        }
                    })
                    .collect();
                let clique = new_clique_with(
                    backend,
                    &devices,
                    (bounds.0, max_blocks, ranks_per_gpu),
                    host_mode,
                    timeout,
                )?;
                cliques.insert(key, Arc::downgrade(&clique));
                clique
            }
        }
    };
    let call_records = CallRecords::exchange(
        &link,
        timeout,
        &clique.backend,
        clique.devices[rank as usize],
    )?
    .map(Arc::new);
    let comm = new_comm(&clique, rank as usize, Some(link), call_records)?;
    let watch = watch::ProcessWatch::start(&comm)?;
    *comm.watch.lock().unwrap_or_else(|e| e.into_inner()) = watch;
    if let Err(e) = staging::attach_with(std::slice::from_ref(&comm), own_staging) {
        let _ = destroy(&comm);
        return Err(e);
    }
    Ok(comm)
}

/// Device entry of [`Clique::devices`] for a rank in another process.
pub const REMOTE_DEVICE: i32 = -1;

/// Check that the ranks can form one communicator from this rank's point of view.
fn check_peers(link: &RankLink, rank: usize, kind: BackendKind) -> Result<()> {
    let own = &link.peers[rank];
    for (r, peer) in link.peers.iter().enumerate() {
        if peer.backend != own.backend {
            return Err(Error::invalid_usage(format!(
                "rank {r} uses another backend than rank {rank} (SYMM_BACKEND must agree)"
            )));
        }
        if link.is_local(r) {
            continue;
        }
        match kind {
            BackendKind::Host | BackendKind::Cuda => {}
            BackendKind::Model => {
                return Err(Error::unsupported(format!(
                    "rank {r} runs in another process: the model backend runs in one process"
                )));
            }
        }
    }
    Ok(())
}

/// The device a rank joining with `symmCommInitRank` uses: the calling thread's current CUDA
/// device on the cuda backend, else 0.
fn current_device_hint() -> i32 {
    crate::backend::cuda::current_device().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::park_sooner_when_oversubscribed;
    use symm_device::arch::host::polls_before_park;
    use symm_device::sync::wait::PARK_AFTER_POLLS_OVERSUBSCRIBED;

    #[test]
    fn only_a_communicator_of_more_ranks_than_cores_makes_waits_park_sooner() {
        let before = polls_before_park();
        // One rank never outnumbers the cores.
        park_sooner_when_oversubscribed(1);
        assert_eq!(polls_before_park(), before);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        park_sooner_when_oversubscribed(cores + 1);
        assert_eq!(
            polls_before_park(),
            before.min(PARK_AFTER_POLLS_OVERSUBSCRIBED)
        );
    }
}
