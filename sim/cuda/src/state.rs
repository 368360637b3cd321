//! The driver's state: devices and contexts, memory regions, modules, streams, events, the
//! queue of stream operations, stream captures and graphs. One mutex guards all of it; host
//! threads enqueue and wait, the device thread (the `engine` module, above this one) runs what
//! is ready.

use crate::util::{CuResult, Kind, handle, handle_id};
use cudarc::driver::sys::{CUresult, cudaError_enum as E};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, mpsc};
use symm_sim::{AddressSpace, KernelId, Module, SimConfig, Simulator};

/// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
pub(crate) const MODE_GLOBAL: u32 = 0;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub(crate) const MODE_RELAXED: u32 = 2;

/// Most simulated devices (device masks are 64 bits).
pub(crate) const MAX_DEVICES: u32 = 64;

/// Settings of the driver itself (the simulator's are in [`SimConfig`]).
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Devices (`SYMM_SIM_DEVICES`, default 8).
    pub devices: u32,
    /// Real milliseconds without progress before a stall is reported
    /// (`SYMM_SIM_DEADLOCK_MS`, default 2000).
    pub deadlock_ms: u64,
    /// Fail stalled grids once reported (`SYMM_SIM_DEADLOCK=fail`).
    pub deadlock_fail: bool,
    /// Give synchronous copies from pageable host memory only the guarantee CUDA documents
    /// (`SYMM_SIM_STRICT_COPIES=1`): they return once the bytes are staged, before the copy
    /// lands. By default they return once it landed, as they do in practice.
    pub strict_copies: bool,
    /// Free without waiting (`SYMM_SIM_STRICT_FREE=1`): `cuMemFree`, `cuMemFreeHost` and
    /// `cuMemHostUnregister` release the memory at once, between kernel instructions, instead
    /// of first waiting for the device's queued work as the driver does in practice (its
    /// reference promises no such wait). A kernel that still uses the memory then faults: a
    /// program that frees memory under queued work relying on the implicit wait shows up.
    pub strict_free: bool,
    /// Print every stream operation queued, started and completed (`SYMM_SIM_TRACE=1`).
    pub trace: bool,
    /// Text replacements applied to every PTX module before it is parsed
    /// (`SYMM_SIM_PTX_EDIT="from=>to;from=>to"`): deliberate defects for mutation checks, such
    /// as an acquire load turned relaxed.
    pub ptx_edits: Vec<(String, String)>,
}

impl Options {
    fn from_env() -> Options {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(default)
        };
        Options {
            devices: number("SYMM_SIM_DEVICES", 8).clamp(1, MAX_DEVICES as u64) as u32,
            deadlock_ms: number("SYMM_SIM_DEADLOCK_MS", 2000),
            deadlock_fail: std::env::var("SYMM_SIM_DEADLOCK").is_ok_and(|v| v == "fail"),
            strict_copies: std::env::var("SYMM_SIM_STRICT_COPIES").is_ok_and(|v| v == "1"),
            strict_free: std::env::var("SYMM_SIM_STRICT_FREE").is_ok_and(|v| v == "1"),
            trace: std::env::var("SYMM_SIM_TRACE").is_ok_and(|v| v == "1"),
            ptx_edits: std::env::var("SYMM_SIM_PTX_EDIT")
                .map(|v| parse_ptx_edits(&v))
                .unwrap_or_default(),
        }
    }
}

/// `from=>to` pairs separated by `;` (empty `from`s are ignored).
fn parse_ptx_edits(spec: &str) -> Vec<(String, String)> {
    spec.split(';')
        .filter_map(|pair| pair.split_once("=>"))
        .map(|(from, to)| (from.trim().to_string(), to.trim().to_string()))
        .filter(|(from, _)| !from.is_empty())
        .collect()
}

/// `text` with `edits` applied; each edit's count of replacements is reported on stderr (a
/// mutation check that replaced nothing proves nothing).
pub(crate) fn edit_ptx(text: &str, edits: &[(String, String)]) -> String {
    let mut text = text.to_string();
    for (from, to) in edits {
        let n = text.matches(from.as_str()).count();
        if n == 0 {
            eprintln!("symm-sim: SYMM_SIM_PTX_EDIT found no `{from}` in a module");
        } else {
            eprintln!(
                "symm-sim: SYMM_SIM_PTX_EDIT replaced {n} occurrence(s) of `{from}` by `{to}`"
            );
        }
        text = text.replace(from.as_str(), to);
    }
    text
}

/// The process's driver: configuration, the simulated memory and the guarded state.
pub(crate) struct Driver {
    /// The simulator's configuration.
    pub config: SimConfig,
    /// The driver's own settings.
    pub options: Options,
    /// Memory kernels may touch.
    pub memory: Arc<AddressSpace>,
    /// The process that initialized the driver (a forked child may not use it).
    pub pid: u32,
    state: Mutex<State>,
    /// Signalled when work or a query is queued (the device thread waits on it).
    pub work: Condvar,
    /// Signalled when operations complete or fail (host threads wait on it).
    pub done: Condvar,
}

static DRIVER: OnceLock<Driver> = OnceLock::new();

/// Initialize the driver (once per process) and start its device thread with
/// `start_device_thread` (the engine's, which the caller passes: the engine is built on this
/// module).
pub(crate) fn init(start_device_thread: fn(&'static Driver)) -> CuResult<&'static Driver> {
    let mut started = false;
    let driver = DRIVER.get_or_init(|| {
        started = true;
        let options = Options::from_env();
        Driver {
            config: SimConfig::from_env(),
            memory: Arc::new(AddressSpace::new()),
            pid: std::process::id(),
            state: Mutex::new(State::new(options.devices)),
            options,
            work: Condvar::new(),
            done: Condvar::new(),
        }
    });
    if started {
        start_device_thread(driver);
    }
    check_process(driver)?;
    Ok(driver)
}

/// The initialized driver: `CUDA_ERROR_NOT_INITIALIZED` before `cuInit` (and in a forked
/// child of the process that initialized it, which has no device thread).
pub(crate) fn driver() -> CuResult<&'static Driver> {
    let driver = DRIVER.get().ok_or(E::CUDA_ERROR_NOT_INITIALIZED)?;
    check_process(driver)?;
    Ok(driver)
}

fn check_process(driver: &Driver) -> CuResult<()> {
    if driver.pid != std::process::id() {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            eprintln!(
                "symm-sim: the CUDA driver was initialized in the parent of this forked process; \
                 a forked child cannot use it (as with a real driver)"
            )
        });
        return Err(E::CUDA_ERROR_NOT_INITIALIZED);
    }
    Ok(())
}

impl Driver {
    /// The state, locked (a panic while it was held does not make it unusable).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Block until `ready(state)` holds, or until `device`'s context has a sticky error (then
    /// that error). Waits on [`Driver::done`] without spinning.
    pub(crate) fn wait_until<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        device: Option<u32>,
        ready: impl Fn(&State) -> bool,
    ) -> CuResult<MutexGuard<'a, State>> {
        loop {
            if let Some(d) = device
                && let Some(code) = state.devices[d as usize].sticky
            {
                return Err(code);
            }
            if ready(&state) {
                return Ok(state);
            }
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Run `work` on the device thread (between simulator steps) and return its result. The
    /// caller must not hold the state lock.
    pub(crate) fn on_device<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Simulator) -> T + Send + 'static,
    ) -> T {
        let (reply, answer) = mpsc::channel();
        self.lock()
            .queries
            .push(Box::new(move |sim: &mut Simulator| {
                let _ = reply.send(work(sim));
            }));
        self.work.notify_all();
        answer
            .recv()
            .expect("the simulated device's thread answers every query")
    }

    /// Block until every operation of `ops` has completed (see [`Driver::wait_until`]).
    pub(crate) fn wait_ops<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
        device: Option<u32>,
        ops: &[u64],
    ) -> CuResult<MutexGuard<'a, State>> {
        self.wait_until(state, device, |s| {
            ops.iter().all(|op| !s.ops.contains_key(op))
        })
    }
}

/// Print `line()` on stderr when tracing (`SYMM_SIM_TRACE=1`).
pub(crate) fn trace(line: impl FnOnce() -> String) {
    if DRIVER.get().is_some_and(|d| d.options.trace) {
        eprintln!("symm-sim trace: {}", line());
    }
}

thread_local! {
    static CURRENT: Cell<Option<u32>> = const { Cell::new(None) };
    static CAPTURE_MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// The device whose primary context is current on this thread.
pub(crate) fn current() -> Option<u32> {
    CURRENT.with(Cell::get)
}

/// Make `device`'s primary context (or none) current on this thread.
pub(crate) fn set_current(device: Option<u32>) {
    CURRENT.with(|c| c.set(device));
}

/// The current device, or `CUDA_ERROR_INVALID_CONTEXT` when no context is current.
pub(crate) fn current_device() -> CuResult<u32> {
    current().ok_or(E::CUDA_ERROR_INVALID_CONTEXT)
}

/// This thread's stream-capture mode (`cuThreadExchangeStreamCaptureMode`).
pub(crate) fn capture_mode() -> u32 {
    CAPTURE_MODE.with(Cell::get)
}

/// Set this thread's stream-capture mode.
pub(crate) fn set_capture_mode(mode: u32) {
    CAPTURE_MODE.with(|c| c.set(mode));
}

/// A number naming this OS thread.
pub(crate) fn thread_id() -> u64 {
    THREAD.with(|t| *t)
}

/// The context handle of `device`'s primary context.
pub(crate) fn context_handle(device: u32) -> u64 {
    handle(Kind::Context, device as u64)
}

/// Per-device state.
#[derive(Debug)]
pub(crate) struct DeviceState {
    /// `cuDevicePrimaryCtxRetain` references.
    pub primary_refs: u32,
    /// The sticky error of the context after a kernel fault.
    pub sticky: Option<CUresult>,
    /// Devices whose memory this context enabled peer access to (bit mask).
    pub peers: u64,
    /// The key of the device's legacy default stream.
    pub legacy: u64,
}

/// What a registered memory region is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegionKind {
    /// `cuMemAlloc`.
    Device,
    /// `cuMemHostAlloc` (pinned, mapped).
    Host,
    /// `cuMemHostRegister_v2`: the caller's host memory, pinned and mapped (the caller keeps
    /// it; `cuMemHostUnregister` only forbids it to kernels again).
    RegisteredHost,
    /// A VMM mapping (`cuMemMap`) of allocation `handle`, accessible to the devices of
    /// `access` (`cuMemSetAccess`; 0 before the first call).
    Vmm { handle: u64, access: u64 },
}

impl RegionKind {
    /// Pinned host memory mapped for the devices (`cuMemHostAlloc`, `cuMemHostRegister_v2`).
    pub(crate) fn is_pinned_host(self) -> bool {
        matches!(self, RegionKind::Host | RegionKind::RegisteredHost)
    }
}

/// A registered memory region.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    /// Bytes.
    pub len: u64,
    /// What it is.
    pub kind: RegionKind,
}

/// Physical memory of `cuMemCreate` or an import: a memfd.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// The memfd (owned; closed on release).
    pub fd: i32,
    /// Bytes.
    pub size: u64,
    /// `CU_MEM_HANDLE_TYPE_*` bits it may be exported as.
    pub handle_types: u32,
}

/// How a stream orders itself with the legacy default stream of its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    /// The legacy default stream (handle 0 or `CU_STREAM_LEGACY`).
    Legacy,
    /// A per-thread default stream (`CU_STREAM_PER_THREAD`): blocking.
    PerThread,
    /// Created without `CU_STREAM_NON_BLOCKING`.
    Blocking,
    /// Created with `CU_STREAM_NON_BLOCKING`.
    NonBlocking,
}

impl StreamKind {
    /// Synchronizes with the legacy default stream (the legacy stream itself excluded).
    pub(crate) fn is_blocking(self) -> bool {
        matches!(self, StreamKind::PerThread | StreamKind::Blocking)
    }
}

/// A stream's part in a capture.
#[derive(Clone, Debug)]
pub(crate) struct StreamCapture {
    /// The capture.
    pub id: u64,
    /// The graph nodes the stream's next captured node depends on.
    pub deps: Vec<usize>,
}

/// A stream.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Its device.
    pub device: u32,
    /// Its kind.
    pub kind: StreamKind,
    /// The last operation enqueued on it.
    pub tail: Option<u64>,
    /// The capture it takes part in.
    pub capture: Option<StreamCapture>,
    /// The device's hardware queue its kernels enter (see [`State::hw_queues`]).
    pub queue: u32,
}

/// An event.
#[derive(Debug)]
pub(crate) struct Event {
    /// Its device.
    pub device: u32,
    /// `CU_EVENT_*` flags.
    pub flags: u32,
    /// The latest record operation, pending or done.
    pub last_record: Option<u64>,
    /// Virtual time of the latest record, once it completed.
    pub time_ns: Option<u64>,
    /// Recorded in a capture: the capture and the nodes a wait on it depends on.
    pub captured: Option<(u64, Vec<usize>)>,
}

/// A kernel launch, its parameters copied at launch time.
#[derive(Debug)]
pub(crate) struct KernelLaunch {
    /// The module.
    pub module: Arc<Module>,
    /// The kernel.
    pub kernel: KernelId,
    /// Its name (for reports).
    pub name: String,
    /// Blocks.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: [u32; 3],
    /// One buffer per parameter.
    pub params: Vec<Vec<u8>>,
}

/// The source of a copy.
#[derive(Clone, Debug)]
pub(crate) enum CopySource {
    /// Read at execution time.
    Address(u64),
    /// Pageable host memory staged when the copy was enqueued.
    Staged(Arc<Vec<u8>>),
}

/// What a stream operation or graph node does.
#[derive(Clone, Debug)]
pub(crate) enum OpKind {
    /// Run a grid.
    Kernel(Arc<KernelLaunch>),
    /// Copy `len` bytes; `device_dst`/`device_src` tell which sides must be device-accessible
    /// memory (checked again when the copy runs).
    Copy {
        dst: u64,
        src: CopySource,
        len: u64,
        device_dst: bool,
        device_src: bool,
    },
    /// Set `len` bytes at `dst` to `value`.
    Memset { dst: u64, value: u8, len: u64 },
    /// Record event `event` (its handle).
    Record { event: u64 },
    /// Nothing (a wait, the end of a graph launch, a synchronization point).
    Marker,
}

impl OpKind {
    /// A short description for traces.
    pub(crate) fn describe(&self) -> String {
        match self {
            OpKind::Kernel(k) => format!(
                "kernel {} grid {:?} block {:?} params {:x?}",
                k.name, k.grid, k.block, k.params
            ),
            OpKind::Copy { dst, src, len, .. } => match src {
                CopySource::Address(a) => format!("copy {len} bytes {a:#x} -> {dst:#x}"),
                CopySource::Staged(_) => format!("copy {len} staged bytes -> {dst:#x}"),
            },
            OpKind::Memset { dst, value, len } => {
                format!("memset {len} bytes at {dst:#x} to {value}")
            }
            OpKind::Record { event } => format!("record event {event:#x}"),
            OpKind::Marker => "marker".into(),
        }
    }
}

/// A queued or running operation.
#[derive(Debug)]
pub(crate) struct Op {
    /// The device it runs on (its context's sticky error drops it).
    pub device: u32,
    /// Operations that must complete before it starts.
    pub deps: Vec<u64>,
    /// What it does.
    pub kind: OpKind,
    /// Started by the device thread.
    pub running: bool,
    /// The device's hardware queue it waits in, first in, first out (kernels queued on a
    /// stream when [`State::hw_queues`] is set): it starts only after every operation queued
    /// before it in that queue started.
    pub queue: Option<u32>,
}

/// A node of a captured graph.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    /// What it does.
    pub kind: OpKind,
    /// The device of the stream it was captured on.
    pub device: u32,
    /// Nodes it depends on.
    pub deps: Vec<usize>,
}

/// A capture under way.
#[derive(Debug)]
pub(crate) struct Capture {
    /// The stream `cuStreamBeginCapture` was called on.
    pub origin: u64,
    /// Its mode.
    pub mode: u32,
    /// The thread that began it.
    pub thread: u64,
    /// Nodes captured so far.
    pub nodes: Vec<Node>,
    /// An illegal operation invalidated it.
    pub invalidated: bool,
    /// Streams taking part (the origin first).
    pub streams: Vec<u64>,
}

/// An instantiated graph.
#[derive(Debug)]
pub(crate) struct Exec {
    /// Its nodes.
    pub nodes: Arc<Vec<Node>>,
    /// The completion marker of its latest launch (launches of one graph are serialized).
    pub last: Option<u64>,
}

/// A loaded module.
#[derive(Debug)]
pub(crate) struct ModuleEntry {
    /// The parsed PTX.
    pub module: Arc<Module>,
    /// Its context's device.
    pub device: u32,
    /// Handles of the functions taken from it.
    pub functions: Vec<u64>,
}

/// A function (kernel) of a module.
#[derive(Debug)]
pub(crate) struct FunctionEntry {
    /// The module.
    pub module: Arc<Module>,
    /// The kernel.
    pub kernel: KernelId,
    /// Its name.
    pub name: String,
    /// Its context's device.
    pub device: u32,
}

/// Work only the device thread may do: questions to the simulator it owns, and changes to
/// memory that must not happen while a kernel instruction is under way (unmapping).
pub(crate) type Query = Box<dyn FnOnce(&mut Simulator) + Send>;

/// Everything the driver tracks.
pub(crate) struct State {
    next_id: u64,
    /// Per device.
    pub devices: Vec<DeviceState>,
    /// Device-accessible memory by base address.
    pub regions: BTreeMap<u64, Region>,
    /// Reserved address ranges (`cuMemAddressReserve`): base → length.
    pub reservations: BTreeMap<u64, u64>,
    /// Physical allocations by handle.
    pub allocations: HashMap<u64, Allocation>,
    /// Modules by handle.
    pub modules: HashMap<u64, ModuleEntry>,
    /// Functions by handle.
    pub functions: HashMap<u64, FunctionEntry>,
    /// Pending `cuLink*` sessions by handle: the PTX texts added so far and, once completed,
    /// the linked image (kept until `cuLinkDestroy`, as the driver keeps its cubin).
    pub links: HashMap<u64, LinkSession>,
    /// Streams by handle (legacy and per-thread streams under internal handles).
    pub streams: HashMap<u64, Stream>,
    per_thread: HashMap<(u64, u32), u64>,
    /// Events by handle.
    pub events: HashMap<u64, Event>,
    /// Operations not yet completed, by id.
    pub ops: HashMap<u64, Op>,
    /// Captures under way, by id.
    pub captures: HashMap<u64, Capture>,
    /// Captured graphs by handle.
    pub graphs: HashMap<u64, Arc<Vec<Node>>>,
    /// Instantiated graphs by handle.
    pub execs: HashMap<u64, Exec>,
    /// Questions for the device thread.
    pub queries: Vec<Query>,
    /// Cached occupancy: (function handle, threads per block) → blocks per SM.
    pub occupancy: HashMap<(u64, u32), u32>,
    /// Hardware queues per device (`SYMM_SIM_HW_QUEUES`, default 0: not modelled). As CUDA
    /// feeds streams through `CUDA_DEVICE_MAX_CONNECTIONS` queues, each stream's kernels
    /// enter queue (stream number mod this), and a kernel waiting for its stream's earlier
    /// work holds up every kernel behind it in its queue, of any stream.
    pub hw_queues: u32,
}

/// A `cuLinkCreate` session.
#[derive(Debug, Default)]
pub(crate) struct LinkSession {
    /// (name, PTX text) of each input, in the order added.
    pub inputs: Vec<(String, String)>,
    /// The linked image (NUL-terminated PTX) after `cuLinkComplete`.
    pub image: Option<std::ffi::CString>,
    /// The error log buffer (address) and its size in bytes, from the creation options.
    pub error_log: (usize, usize),
}

impl State {
    fn new(devices: u32) -> State {
        let mut state = State {
            next_id: 1,
            devices: Vec::new(),
            regions: BTreeMap::new(),
            reservations: BTreeMap::new(),
            allocations: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            links: HashMap::new(),
            streams: HashMap::new(),
            per_thread: HashMap::new(),
            events: HashMap::new(),
            ops: HashMap::new(),
            captures: HashMap::new(),
            graphs: HashMap::new(),
            execs: HashMap::new(),
            queries: Vec::new(),
            occupancy: HashMap::new(),
            hw_queues: std::env::var("SYMM_SIM_HW_QUEUES")
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .unwrap_or(0),
        };
        for device in 0..devices {
            let legacy = state.new_stream(device, StreamKind::Legacy);
            state.devices.push(DeviceState {
                primary_refs: 0,
                sticky: None,
                peers: 0,
                legacy,
            });
        }
        state
    }

    /// A fresh id (for handles, operations and captures).
    pub(crate) fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Create a stream; returns its handle.
    pub(crate) fn new_stream(&mut self, device: u32, kind: StreamKind) -> u64 {
        let id = self.new_id();
        let h = handle(Kind::Stream, id);
        self.streams.insert(
            h,
            Stream {
                device,
                kind,
                tail: None,
                capture: None,
                queue: (id % u64::from(self.hw_queues.max(1))) as u32,
            },
        );
        h
    }

    /// The number of devices.
    pub(crate) fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    /// `device` as an index, or `CUDA_ERROR_INVALID_DEVICE`.
    pub(crate) fn check_device(&self, device: i32) -> CuResult<u32> {
        if device >= 0 && (device as u32) < self.device_count() {
            Ok(device as u32)
        } else {
            Err(E::CUDA_ERROR_INVALID_DEVICE)
        }
    }

    /// The device of a context handle, or `CUDA_ERROR_INVALID_CONTEXT`.
    pub(crate) fn context_device(&self, context: u64) -> CuResult<u32> {
        handle_id(Kind::Context, context)
            .filter(|&d| d < self.device_count() as u64)
            .map(|d| d as u32)
            .ok_or(E::CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The sticky error of `device`'s context, as an error.
    pub(crate) fn healthy(&self, device: u32) -> CuResult<()> {
        match self.devices[device as usize].sticky {
            Some(code) => Err(code),
            None => Ok(()),
        }
    }

    /// The current context's device, healthy (see [`State::healthy`]).
    pub(crate) fn current_healthy(&self) -> CuResult<u32> {
        let device = current_device()?;
        self.healthy(device)?;
        Ok(device)
    }

    /// The stream a memory operation of `call` goes on: `stream`'s (the asynchronous
    /// functions), or for the synchronous ones (`None`) the current context's legacy stream,
    /// which needs a healthy context and no capture that forbids it.
    pub(crate) fn memory_op_stream(&mut self, call: &str, stream: Option<u64>) -> CuResult<u64> {
        match stream {
            Some(h) => self.resolve_stream(h),
            None => {
                let d = self.current_healthy()?;
                self.check_capture_safe(call)?;
                Ok(self.devices[d as usize].legacy)
            }
        }
    }

    /// The stream a handle names for this thread: 0 and `CU_STREAM_LEGACY` (1) the current
    /// context's legacy stream, `CU_STREAM_PER_THREAD` (2) this thread's per-thread stream of
    /// the current context.
    pub(crate) fn resolve_stream(&mut self, value: u64) -> CuResult<u64> {
        match value {
            0 | 1 => Ok(self.devices[current_device()? as usize].legacy),
            2 => {
                let device = current_device()?;
                let key = (thread_id(), device);
                if let Some(&s) = self.per_thread.get(&key) {
                    return Ok(s);
                }
                let s = self.new_stream(device, StreamKind::PerThread);
                self.per_thread.insert(key, s);
                Ok(s)
            }
            h if self.streams.contains_key(&h) => Ok(h),
            _ => Err(E::CUDA_ERROR_INVALID_HANDLE),
        }
    }

    /// `true` while `op` has not completed.
    pub(crate) fn pending(&self, op: Option<u64>) -> bool {
        op.is_some_and(|op| self.ops.contains_key(&op))
    }

    /// Operations an operation enqueued now on `stream` must wait for: the stream's previous
    /// operation and, for the legacy stream, every blocking stream's last operation (for a
    /// blocking stream, the legacy stream's).
    pub(crate) fn entry_deps(&self, stream: u64) -> Vec<u64> {
        let s = &self.streams[&stream];
        let mut deps: Vec<u64> = s.tail.into_iter().collect();
        match s.kind {
            StreamKind::Legacy => {
                for other in self.streams.values() {
                    if other.device == s.device && other.kind.is_blocking() {
                        deps.extend(other.tail);
                    }
                }
            }
            kind if kind.is_blocking() => {
                let legacy = &self.streams[&self.devices[s.device as usize].legacy];
                deps.extend(legacy.tail);
            }
            _ => {}
        }
        deps.retain(|d| self.ops.contains_key(d));
        deps.sort_unstable();
        deps.dedup();
        deps
    }

    /// Queue `kind` on `stream` after [`State::entry_deps`] and `extra`; returns its id.
    /// Capture is not considered (see [`State::submit`]).
    pub(crate) fn enqueue(&mut self, stream: u64, kind: OpKind, extra: &[u64]) -> u64 {
        let mut deps = self.entry_deps(stream);
        deps.extend(extra.iter().copied().filter(|d| self.ops.contains_key(d)));
        let device = self.streams[&stream].device;
        let queue = (self.hw_queues > 0 && matches!(kind, OpKind::Kernel(_)))
            .then(|| self.streams[&stream].queue);
        let id = self.new_id();
        trace(|| {
            format!(
                "queue op {id} on stream {stream:#x} (device {device}): {} after {deps:?}",
                kind.describe()
            )
        });
        self.ops.insert(
            id,
            Op {
                device,
                deps,
                kind,
                running: false,
                queue,
            },
        );
        self.streams.get_mut(&stream).expect("stream").tail = Some(id);
        id
    }

    /// Queue an operation with explicit dependencies and no stream (graph nodes).
    pub(crate) fn enqueue_free(&mut self, device: u32, kind: OpKind, deps: Vec<u64>) -> u64 {
        let id = self.new_id();
        let deps: Vec<u64> = deps
            .into_iter()
            .filter(|d| self.ops.contains_key(d))
            .collect();
        trace(|| {
            format!(
                "queue graph op {id} (device {device}): {} after {deps:?}",
                kind.describe()
            )
        });
        self.ops.insert(
            id,
            Op {
                device,
                deps,
                kind,
                running: false,
                queue: None,
            },
        );
        id
    }

    /// Submit `kind` to `stream` as CUDA does: captured into the stream's capture graph when
    /// it is capturing (returns `None`), else queued (returns the operation). Fails when the
    /// stream's context has a sticky error, when the stream's capture was invalidated, and
    /// (invalidating the capture) when an operation on the legacy stream would implicitly
    /// synchronize with a capturing blocking stream.
    pub(crate) fn submit(&mut self, stream: u64, kind: OpKind) -> CuResult<Option<u64>> {
        let (device, stream_kind, capture) = {
            let s = &self.streams[&stream];
            (s.device, s.kind, s.capture.clone())
        };
        self.healthy(device)?;
        if let Some(sc) = capture {
            let cap = self
                .captures
                .get_mut(&sc.id)
                .ok_or(E::CUDA_ERROR_ILLEGAL_STATE)?;
            if cap.invalidated {
                return Err(E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
            }
            let index = cap.nodes.len();
            cap.nodes.push(Node {
                kind,
                device,
                deps: sc.deps,
            });
            self.streams
                .get_mut(&stream)
                .expect("stream")
                .capture
                .as_mut()
                .expect("capturing")
                .deps = vec![index];
            return Ok(None);
        }
        if stream_kind == StreamKind::Legacy {
            self.refuse_implicit_sync(device)?;
        }
        Ok(Some(self.enqueue(stream, kind, &[])))
    }

    /// Fail with `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (invalidating the captures) when a
    /// blocking stream of `device` is capturing: work on the legacy stream would synchronize
    /// with it.
    pub(crate) fn refuse_implicit_sync(&mut self, device: u32) -> CuResult<()> {
        let capturing: Vec<u64> = self
            .streams
            .values()
            .filter(|s| s.device == device && s.kind.is_blocking())
            .filter_map(|s| s.capture.as_ref().map(|c| c.id))
            .collect();
        if capturing.is_empty() {
            return Ok(());
        }
        for id in capturing {
            self.invalidate(
                id,
                "the legacy default stream was used while a blocking stream of its device was \
                 capturing (implicit synchronization)",
            );
        }
        Err(E::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    }

    /// Invalidate capture `id` (reporting why on stderr).
    pub(crate) fn invalidate(&mut self, id: u64, why: &str) {
        if let Some(cap) = self.captures.get_mut(&id)
            && !cap.invalidated
        {
            cap.invalidated = true;
            eprintln!(
                "symm-sim: the stream capture begun on stream {:#x} is invalidated: {why}",
                cap.origin
            );
        }
    }

    /// The rule for "potentially unsafe" calls (allocation, synchronous copies, module loading,
    /// device synchronization) during stream capture: refused with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, invalidating the captures concerned, unless
    /// this thread's mode is relaxed, when this thread has a capture not begun in relaxed mode,
    /// or (in global mode) another thread has a capture begun in global mode.
    pub(crate) fn check_capture_safe(&mut self, call: &str) -> CuResult<()> {
        let mode = capture_mode();
        if mode == MODE_RELAXED {
            return Ok(());
        }
        let me = thread_id();
        let concerned: Vec<u64> = self
            .captures
            .iter()
            .filter(|(_, c)| {
                (c.thread == me && c.mode != MODE_RELAXED)
                    || (mode == MODE_GLOBAL && c.thread != me && c.mode == MODE_GLOBAL)
            })
            .map(|(&id, _)| id)
            .collect();
        if concerned.is_empty() {
            return Ok(());
        }
        for id in concerned {
            self.invalidate(
                id,
                &format!("{call} was called during the capture in a capture mode that forbids it"),
            );
        }
        Err(E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    }

    /// Refuse (invalidating its capture) an operation that synchronizes with or queries a
    /// capturing `stream`.
    pub(crate) fn refuse_if_capturing(&mut self, stream: u64, call: &str) -> CuResult<()> {
        let capture = self.streams[&stream].capture.as_ref().map(|c| c.id);
        if let Some(id) = capture {
            self.invalidate(id, &format!("{call} on a capturing stream"));
            return Err(E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        if self.streams[&stream].kind == StreamKind::Legacy {
            let device = self.streams[&stream].device;
            self.refuse_implicit_sync(device)?;
        }
        Ok(())
    }

    /// The operations a synchronization of `stream` waits for: its last operation and, for
    /// the legacy stream, every blocking stream's last operation.
    pub(crate) fn stream_targets(&self, stream: u64) -> Vec<u64> {
        let s = &self.streams[&stream];
        let mut targets: Vec<u64> = s.tail.into_iter().collect();
        if s.kind == StreamKind::Legacy {
            targets.extend(
                self.streams
                    .values()
                    .filter(|o| o.device == s.device && o.kind.is_blocking())
                    .filter_map(|o| o.tail),
            );
        }
        targets
    }

    /// Complete operation `id` (the device thread ran it) at virtual time `now_ns`.
    pub(crate) fn complete(&mut self, id: u64, now_ns: u64) {
        if let Some(op) = self.ops.remove(&id)
            && let OpKind::Record { event } = op.kind
            && let Some(e) = self.events.get_mut(&event)
            && e.last_record == Some(id)
        {
            e.time_ns = Some(now_ns);
        }
    }

    /// Poison `device`'s context with `code` (a kernel fault): its pending operations are
    /// dropped and every later call in the context returns `code`.
    pub(crate) fn fail_device(&mut self, device: u32, code: CUresult) {
        let d = &mut self.devices[device as usize];
        if d.sticky.is_none() {
            d.sticky = Some(code);
        }
        self.ops.retain(|_, op| op.device != device);
    }

    /// Operations ready to start: not running, every dependency completed. Sorted by id.
    pub(crate) fn ready(&self) -> Vec<u64> {
        // The oldest operation not started of each hardware queue: the only one of it that
        // may start.
        let mut heads: HashMap<(u32, u32), u64> = HashMap::new();
        for (&id, op) in &self.ops {
            if let (Some(queue), false) = (op.queue, op.running) {
                let head = heads.entry((op.device, queue)).or_insert(id);
                *head = (*head).min(id);
            }
        }
        let mut ready: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, op)| !op.running && op.deps.iter().all(|d| !self.ops.contains_key(d)))
            .filter(|(id, op)| op.queue.is_none_or(|q| heads[&(op.device, q)] == **id))
            .map(|(&id, _)| id)
            .collect();
        ready.sort_unstable();
        ready
    }

    /// The registered region holding all of `[address, address + len)`.
    pub(crate) fn region(&self, address: u64, len: u64) -> Option<(u64, Region)> {
        let (&base, &region) = self.regions.range(..=address).next_back()?;
        let end = address.checked_add(len.max(1))?;
        (end <= base + region.len).then_some((base, region))
    }

    /// `CUDA_ERROR_INVALID_VALUE` unless `[address, address + len)` is memory a device may
    /// access (an allocation, mapped host memory, a VMM mapping with access granted).
    pub(crate) fn check_device_memory(&self, address: u64, len: u64) -> CuResult<()> {
        match self.region(address, len) {
            Some((_, r)) if !matches!(r.kind, RegionKind::Vmm { access: 0, .. }) => Ok(()),
            _ => Err(E::CUDA_ERROR_INVALID_VALUE),
        }
    }
}
