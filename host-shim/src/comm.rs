//! Communicators: one [`Comm`] per rank, the ranks of one communicator sharing a [`Clique`].
//!
//! Handles given to C are `Arc::as_ptr` of a live [`Comm`]; every entry point looks the handle
//! up in [`LIVE_COMMS`] first, so a destroyed or made-up handle is an error, never a deref.

use crate::backend::{Backend, CommResources};
use crate::error::{Error, Result, c_message};
use crate::ffi::types::{SYMM_UNIQUE_ID_BYTES, symmComm_t, symmResult_t, symmUniqueId};
use crate::window::{Exchange, Window};
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use symm_device::symmetric::RankArgs;
use symm_device::symmetric::dispatch::Algorithm;
use symm_device::sync::signal_pad::MAX_RANKS;

/// What the ranks of one communicator share.
pub struct Clique {
    /// Number of ranks.
    pub nranks: usize,
    /// Device of every rank.
    pub devices: Vec<i32>,
    /// Backend of every rank.
    pub backend: Arc<Backend>,
    /// Bound of every wait on a peer.
    pub timeout: Duration,
    /// `SYMM_ALGO`: an all-reduce algorithm forced for every call.
    pub forced_algorithm: Option<Algorithm>,
    /// `SYMM_DEBUG=INFO`: log every plan to stderr.
    pub debug: bool,
    /// Most blocks per rank of every kernel of this clique: the minimum over its devices of
    /// what lets every rank sharing that device be resident at once. A property of the clique,
    /// so that every rank plans the same grid.
    pub max_blocks: u32,
    /// Device rank tables of launches (see `symm_device::symmetric::RankArgs`), by device and
    /// content; uploaded once and kept until the communicator is destroyed.
    tables: Mutex<HashMap<(i32, Vec<RankArgs>), u64>>,
    /// Window registrations in flight, by registration sequence number.
    pub exchange: Mutex<Exchange>,
    /// Signalled whenever `exchange` changes.
    pub exchange_changed: Condvar,
}

impl Clique {
    /// Device address (on `device`) of a rank table holding `ranks`, uploaded once and reused.
    pub fn rank_table(&self, device: i32, ranks: &[RankArgs]) -> Result<u64> {
        let mut tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let key = (device, ranks.to_vec());
        if let Some(address) = tables.get(&key) {
            return Ok(*address);
        }
        let bytes: Vec<u8> = bytemuck::cast_slice(ranks).to_vec();
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
    /// `symmMemAlloc` allocations: address → size.
    pub allocations: BTreeMap<u64, usize>,
    /// Registered windows, by handle address.
    pub windows: HashMap<usize, Arc<Window>>,
    /// Sequence number of this rank's next window registration.
    pub next_window_seq: u64,
    /// Set when a collective timed out or a kernel refused its launch: the communicator
    /// refuses further collectives.
    pub aborted: Option<String>,
    /// The error of the abort (`symmTimeout`, or `symmInternalError` for a refused launch).
    pub abort_code: Option<symmResult_t>,
    /// The kernel launched last by this rank (named when a kernel refuses its launch).
    pub last_kernel: Option<String>,
    /// Set when the device reported that queued work failed (see
    /// [`crate::backend::Backend::async_error`]): every later collective fails with it.
    pub device_error: Option<Error>,
}

/// One rank of a communicator.
pub struct Comm {
    /// Shared by all ranks.
    pub clique: Arc<Clique>,
    /// This rank.
    pub rank: usize,
    /// CUDA device ordinal (recorded, unused, on the host backend).
    pub device: i32,
    /// Most blocks this rank's kernels may use: the clique's [`Clique::max_blocks`].
    pub max_blocks: u32,
    /// Launch resources (cuda stream and events).
    pub resources: CommResources,
    /// Mutable state.
    pub state: Mutex<CommState>,
    /// Sequence number of this rank's next collective launch (the `k`-th collective of every
    /// rank of the clique is one collective).
    pub next_collective: AtomicU64,
    last_error: Mutex<CString>,
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
        live_comms()
            .get(&(handle as usize))
            .cloned()
            .ok_or_else(|| {
                Error::invalid_argument(
                    "comm is not a live communicator (never created, or already destroyed)",
                )
            })
    }

    /// This communicator's handle.
    pub fn handle(self: &Arc<Self>) -> symmComm_t {
        Arc::as_ptr(self) as symmComm_t
    }

    /// Lock the mutable state.
    pub fn lock(&self) -> MutexGuard<'_, CommState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
        backend.synchronize(&self.resources)?;
        let (windows, allocations) = {
            let mut state = self.lock();
            (
                std::mem::take(&mut state.windows),
                std::mem::take(&mut state.allocations),
            )
        };
        drop(windows);
        for address in allocations.into_keys() {
            backend.free(self.device, address)?;
        }
        Ok(())
    }
}

fn new_comm(clique: &Arc<Clique>, rank: usize) -> Result<Arc<Comm>> {
    let device = clique.devices[rank];
    let resources = clique.backend.open_comm(device)?;
    let max_blocks = clique.max_blocks;
    let comm = Arc::new(Comm {
        clique: clique.clone(),
        rank,
        device,
        max_blocks,
        resources,
        state: Mutex::new(CommState::default()),
        next_collective: AtomicU64::new(0),
        last_error: Mutex::new(CString::default()),
    });
    live_comms().insert(Arc::as_ptr(&comm) as usize, comm.clone());
    Ok(comm)
}

fn new_clique(devices: &[i32]) -> Result<Arc<Clique>> {
    let backend = crate::backend::select()?;
    backend.connect_devices(devices)?;
    let mut max_blocks = u32::MAX;
    for &device in devices {
        let sharing = devices.iter().filter(|d| **d == device).count() as u32;
        max_blocks = max_blocks.min(backend.max_blocks_per_rank(device, sharing)?);
    }
    Ok(Arc::new(Clique {
        max_blocks,
        nranks: devices.len(),
        devices: devices.to_vec(),
        backend,
        timeout: crate::config::timeout()?,
        forced_algorithm: crate::config::forced_algorithm()?,
        debug: crate::config::debug(),
        tables: Mutex::new(HashMap::new()),
        exchange: Mutex::new(Exchange::default()),
        exchange_changed: Condvar::new(),
    }))
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
    for rank in 0..nranks {
        match new_comm(&clique, rank) {
            Ok(comm) => comms.push(comm),
            Err(e) => {
                for comm in comms {
                    let _ = destroy(&comm);
                }
                return Err(e);
            }
        }
    }
    Ok(comms)
}

/// `symmCommDestroy`.
pub fn destroy(comm: &Arc<Comm>) -> Result<()> {
    if live_comms().remove(&(Arc::as_ptr(comm) as usize)).is_none() {
        return Err(Error::invalid_argument("comm was already destroyed"));
    }
    comm.release()
}

const UNIQUE_ID_MAGIC: &[u8; 8] = b"SYMMUID1";

/// `symmGetUniqueId`: magic, process id, a per-process counter and the time.
pub fn new_unique_id() -> symmUniqueId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut bytes = [0u8; SYMM_UNIQUE_ID_BYTES];
    bytes[..8].copy_from_slice(UNIQUE_ID_MAGIC);
    bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    bytes[12..20].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    bytes[20..28].copy_from_slice(&nanos.to_le_bytes());
    symmUniqueId {
        internal: bytes.map(|b| b as std::ffi::c_char),
    }
}

/// Ranks gathering for one unique id.
struct PendingInit {
    nranks: usize,
    clique: Option<Arc<Clique>>,
    joined: Vec<Option<i32>>,
    left: usize,
}

static PENDING_INITS: Mutex<BTreeMap<[u8; SYMM_UNIQUE_ID_BYTES], PendingInit>> =
    Mutex::new(BTreeMap::new());
static INIT_CHANGED: Condvar = Condvar::new();

/// `symmCommInitRank`: join the communicator named by `id` as `rank` of `nranks`; returns
/// when all ranks have joined, or `symmTimeout`.
pub fn init_rank(nranks: i32, id: &symmUniqueId, rank: i32) -> Result<Arc<Comm>> {
    let nranks = check_nranks(nranks as i64, "nranks")?;
    if rank < 0 || rank as usize >= nranks {
        return Err(Error::invalid_argument(format!(
            "rank = {rank}: must be in [0, {nranks})"
        )));
    }
    let rank = rank as usize;
    let key: [u8; SYMM_UNIQUE_ID_BYTES] = id.internal.map(|c| c as u8);
    if &key[..8] != UNIQUE_ID_MAGIC {
        return Err(Error::invalid_argument(
            "commId was not made by symmGetUniqueId",
        ));
    }
    let pid = u32::from_le_bytes(key[8..12].try_into().expect("4 bytes"));
    if pid != std::process::id() {
        return Err(Error::unsupported(format!(
            "commId comes from process {pid}: communicators across processes are not supported \
             by this version (use one thread per rank in one process, or symmCommInitAll)"
        )));
    }
    let device = current_device_hint();
    let mut pending = PENDING_INITS.lock().unwrap_or_else(|e| e.into_inner());
    let entry = pending.entry(key).or_insert_with(|| PendingInit {
        nranks,
        clique: None,
        joined: vec![None; nranks],
        left: 0,
    });
    if entry.nranks != nranks {
        return Err(Error::invalid_argument(format!(
            "nranks = {nranks}, but another rank joined this commId with nranks = {}",
            entry.nranks
        )));
    }
    if entry.joined[rank].is_some() {
        return Err(Error::invalid_argument(format!(
            "rank = {rank} already joined this commId"
        )));
    }
    entry.joined[rank] = Some(device);
    if entry.joined.iter().all(Option::is_some) {
        let devices: Vec<i32> = entry.joined.iter().flatten().copied().collect();
        match new_clique(&devices) {
            Ok(clique) => entry.clique = Some(clique),
            Err(e) => {
                pending.remove(&key);
                INIT_CHANGED.notify_all();
                return Err(e);
            }
        }
        INIT_CHANGED.notify_all();
    }
    let timeout = crate::config::timeout()?;
    let deadline = Instant::now() + timeout;
    loop {
        let Some(entry) = pending.get_mut(&key) else {
            return Err(Error::internal(
                "communicator creation was abandoned by another rank",
            ));
        };
        if let Some(clique) = entry.clique.clone() {
            entry.left += 1;
            if entry.left == nranks {
                pending.remove(&key);
            }
            drop(pending);
            return new_comm(&clique, rank);
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = (0..nranks).filter(|r| entry.joined[*r].is_none()).collect();
            entry.joined[rank] = None;
            return Err(Error::new(
                symmResult_t::symmTimeout,
                format!(
                    "rank {rank}: ranks {missing:?} did not join within {} ms",
                    timeout.as_millis()
                ),
            ));
        }
        pending = INIT_CHANGED
            .wait_timeout(pending, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// The device a rank joining with `symmCommInitRank` uses: the calling thread's current CUDA
/// device on the cuda backend, else 0.
fn current_device_hint() -> i32 {
    crate::backend::cuda::current_device().unwrap_or(0)
}
