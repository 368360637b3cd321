//! A simulated GPU: parses the PTX symm ships and executes kernels on the CPU, every GPU
//! thread of every running grid interleaved on one OS thread by a seeded, adversarial
//! scheduler.
//!
//! The address space is flat: a device address is a host address (the fake CUDA driver in
//! `sim/cuda` hands out host memory as device memory). Every access a kernel makes is checked
//! against the [`AddressSpace`] the driver maintains.
//!
//! This is the interface the fake driver (`symm-sim-cuda`) programs against:
//! [`Module::load`] → [`Module::kernel`] → [`Simulator::launch`] → [`Simulator::run`].
//!
//! # Execution model
//!
//! - **Interpretation.** PTX is lowered at [`Module::load`] to a compact pre-decoded form
//!   (resolved register slots, immediates as constant slots, resolved branch targets and call
//!   sites). Anything not implemented is rejected there, naming the line.
//! - **Scheduling.** Only memory and synchronisation instructions (`ld`, `st`, `atom`,
//!   `barrier`, `nanosleep`) are interleaving points: a thread runs straight through pure
//!   arithmetic. Plain (weak) loads are interleaving points only under a quarter of the
//!   seeds: in data-race-free code they cannot change an outcome, and weak mode explores
//!   racy reads anyway. Each scheduling decision either takes the runnable thread of highest priority
//!   (PCT: random priorities, lowered at random change points) or, with a per-seed
//!   probability, a uniformly random runnable thread for a random burst of interleaving
//!   points. Every choice comes from [`SimConfig::seed`]: the same seed and the same launches
//!   give the same execution.
//! - **Virtual time.** `%globaltimer` is virtual: every live GPU thread runs one instruction
//!   per nanosecond, i.e. time advances by 1 ns per *L* instructions executed in the whole
//!   simulation, *L* being the number of live threads of resident blocks (at least 1). It
//!   moves otherwise only by [`Simulator::advance_time_to`].
//! - **Spinning.** `nanosleep` parks a thread until virtual time reaches its wake-up, or until
//!   another thread stores to a location (8-byte granule) it loaded since its previous
//!   `nanosleep` (a store between that load and the sleep makes the sleep return at once).
//!   When every live thread is parked (sleeping, at a barrier, or its block waiting for
//!   residency) [`Simulator::run`] returns [`RunOutcome::Stalled`] without moving time.
//! - **Residency.** Blocks occupy SM resources (threads, registers, block slots) from start
//!   to exit, non-preemptively, started in launch and index order.
//! - **Barriers.** `barrier.sync` / `barrier.red` complete when every non-exited thread of
//!   the block arrived (PTX: exited threads do not take part). Threads of one block waiting
//!   at different barrier instructions, or mixing `barrier.red` with `barrier.sync`, is a
//!   fault (see [`Simulator::set_strict_barriers`]).
//! - **Memory.** Every access is checked against the [`AddressSpace`] (mapped, allowed for the
//!   device, aligned to its size; a vector access to its whole size) and goes to real host
//!   memory through atomic accesses. With [`SimConfig::weak_memory`], per-location store
//!   histories with happens-before knowledge let relaxed, volatile and plain loads return
//!   older stores that coherence and happens-before allow (biased to stale ones);
//!   `st.release` / release atomics publish, `ld.acquire` / acquire atomics join, barriers
//!   join the block; read-modify-writes read the newest store; vector elements are separate
//!   locations. The newest value is always in real memory. Data races (a plain access and a
//!   conflicting access of another thread that happens-before does not order) are faults
//!   naming both accesses, unless [`SimConfig::races`] is off.
//! - **Faults** ([`RunOutcome::Fault`], classified by [`FaultKind::of`]) name the kernel,
//!   grid, block, thread, PTX line and text, the call chain (a `trap` names the Rust panic
//!   function that raised it) and the seed; the grid is removed.

#![deny(unsafe_op_in_unsafe_fn)]

mod exec;
mod fx;
mod ir;
mod lex;
mod memory;
mod parse;
mod rng;
mod weak;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::sync::Arc;

use exec::{Ctx, Stop, TState, Thread};
use ir::{red, slot};
use rng::Rng;

/// How a simulation runs; every choice that changes an execution is derived from `seed`.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed of every random choice (`SYMM_SIM_SEED`; printed in every failure report).
    pub seed: u64,
    /// Streaming multiprocessors of each simulated device (`SYMM_SIM_SMS`; default 132, an
    /// H100 SXM). Residency is counted per device.
    pub sms: u32,
    /// Registers per thread assumed for every kernel when computing residency
    /// (`SYMM_SIM_REGS`; default 80).
    pub registers_per_thread: u32,
    /// Model weak memory (`SYMM_SIM_WEAK=1`): relaxed, volatile and plain loads may read
    /// older stores that coherence allows.
    pub weak_memory: bool,
    /// With weak memory, report data races — a plain access and a conflicting access of
    /// another thread not ordered by happens-before — as faults (`SYMM_SIM_RACES`, default
    /// on; `0` turns it off).
    pub races: bool,
    /// Virtual nanoseconds a GPU thread waits for a load (or atomic) from host memory
    /// ([`AddressSpace::map_host`]), a round trip across PCIe (`SYMM_SIM_HOST_READ_NS`;
    /// default 0: free, as every other access).
    pub host_read_ns: u64,
    /// Virtual nanoseconds each such read holds the device's one PCIe link: reads from many
    /// threads queue behind each other (`SYMM_SIM_HOST_READ_GAP_NS`; default 0).
    pub host_read_gap_ns: u64,
}

impl Default for SimConfig {
    /// Seed 0, 132 SMs, 80 registers per thread, sequentially consistent memory.
    fn default() -> SimConfig {
        SimConfig {
            seed: 0,
            sms: 132,
            registers_per_thread: 80,
            weak_memory: false,
            races: true,
            host_read_ns: 0,
            host_read_gap_ns: 0,
        }
    }
}

impl SimConfig {
    /// The configuration from the `SYMM_SIM_*` environment variables (defaults where unset;
    /// a fresh random seed when `SYMM_SIM_SEED` is unset).
    pub fn from_env() -> SimConfig {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let num = |v: &str| env_number(v);
        let d = SimConfig::default();
        SimConfig {
            seed: var("SYMM_SIM_SEED")
                .and_then(|v| num(&v))
                .unwrap_or_else(random_seed),
            sms: var("SYMM_SIM_SMS")
                .and_then(|v| num(&v))
                .map_or(d.sms, |v| v.clamp(1, 1 << 16) as u32),
            registers_per_thread: var("SYMM_SIM_REGS")
                .and_then(|v| num(&v))
                .map_or(d.registers_per_thread, |v| v.clamp(1, 255) as u32),
            weak_memory: var("SYMM_SIM_WEAK").is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            }),
            races: var("SYMM_SIM_RACES").is_none_or(|v| {
                !matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "0" | "false" | "no" | "off"
                )
            }),
            host_read_ns: var("SYMM_SIM_HOST_READ_NS")
                .and_then(|v| num(&v))
                .map_or(d.host_read_ns, |v| v.min(1 << 32)),
            host_read_gap_ns: var("SYMM_SIM_HOST_READ_GAP_NS")
                .and_then(|v| num(&v))
                .map_or(d.host_read_gap_ns, |v| v.min(1 << 32)),
        }
    }
}

/// A number as `SYMM_SIM_*` variables spell it: decimal or `0x` hexadecimal.
fn env_number(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// A seed nobody chose: the time, the process id and std's per-process hash keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// An error of loading or launching, with a message that names the PTX line or kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    /// What went wrong.
    pub message: String,
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SimError {}

fn sim_err(message: impl Into<String>) -> SimError {
    SimError {
        message: message.into(),
    }
}

/// A parsed and lowered PTX module.
#[derive(Debug)]
pub struct Module {
    prog: parse::Program,
}

/// A `.entry` of a [`Module`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub u32);

/// One `.param` of a kernel: its size and alignment in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// Bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

impl Module {
    /// Parse and lower PTX text (one or more `.entry`/`.func`); an error names the line.
    pub fn load(ptx: &str) -> Result<Module, SimError> {
        let prog = parse::parse(ptx).map_err(|e| sim_err(format!("PTX rejected: {e}")))?;
        Ok(Module { prog })
    }

    /// The `.entry` named `name`.
    pub fn kernel(&self, name: &str) -> Option<KernelId> {
        self.prog
            .kernels
            .iter()
            .position(|k| k.name == name)
            .map(|i| KernelId(i as u32))
    }

    /// The parameters of `kernel`, in declaration order.
    pub fn kernel_params(&self, kernel: KernelId) -> &[ParamInfo] {
        self.prog
            .kernels
            .get(kernel.0 as usize)
            .map_or(&[], |k| &k.params[..])
    }

    /// The module-level `.global`/`.const` variables: (name, address, bytes). Their bytes are
    /// host memory owned by the module (initialized from the PTX); the driver maps each range
    /// for the devices the module is loaded on, and unmaps it when the module is unloaded.
    pub fn globals(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.prog
            .globals
            .iter()
            .map(|g| (g.name.as_str(), g.address, g.size))
    }

    /// The names of the module's kernels, in file order.
    pub fn kernel_names(&self) -> Vec<&str> {
        self.prog.kernels.iter().map(|k| k.name.as_str()).collect()
    }

    /// Static facts about `kernel`, `None` for an id not of this module.
    pub fn kernel_info(&self, kernel: KernelId) -> Option<KernelInfo> {
        let k = self.prog.kernels.get(kernel.0 as usize)?;
        Some(KernelInfo {
            shared_bytes: 0,
            local_bytes: 0,
            param_bytes: k.param_bytes as u32,
            instructions: self.prog.code.len() as u32,
        })
    }

    /// Instructions of the lowered module (all functions).
    pub fn instruction_count(&self) -> usize {
        self.prog.code.len()
    }
}

/// The memory kernels may touch: ranges the driver registered (device allocations, mapped
/// host memory, VMM mappings). Shared between the driver's threads.
///
/// Kernels read and write a mapped range directly (a device address is a host address):
/// whoever maps a range must keep it valid, readable and writable host memory until it is
/// unmapped, and must not unmap it while a kernel that may touch it runs.
#[derive(Debug, Default)]
pub struct AddressSpace {
    ranges: memory::Ranges,
}

impl AddressSpace {
    /// An empty address space.
    pub fn new() -> AddressSpace {
        AddressSpace::default()
    }

    /// Allow kernels running on the devices of mask `devices` (bit d: device d; `u64::MAX`:
    /// all) to access `[base, base + len)`; `what` names it in reports.
    pub fn map(&self, base: u64, len: u64, what: &str, devices: u64) {
        self.ranges.map(base, len, what, devices, false);
    }

    /// [`AddressSpace::map`] for host memory that GPUs reach across PCIe (pinned host
    /// allocations): a GPU thread's load from it costs [`SimConfig::host_read_ns`].
    pub fn map_host(&self, base: u64, len: u64, what: &str, devices: u64) {
        self.ranges.map(base, len, what, devices, true);
    }

    /// Change which devices may access the mapped range starting at `base` (as
    /// `cuMemSetAccess` does); an access from another device is a fault.
    pub fn set_devices(&self, base: u64, len: u64, devices: u64) {
        self.ranges.set_devices(base, len, devices);
    }

    /// Forbid `[base, base + len)` again.
    pub fn unmap(&self, base: u64, len: u64) {
        self.ranges.unmap(base, len);
    }
}

/// A grid started by [`Simulator::launch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GridId(pub u64);

/// A launch: the kernel, its shape and its parameter values (one byte buffer per `.param`,
/// sizes as [`Module::kernel_params`] says).
#[derive(Clone, Debug)]
pub struct Launch {
    /// The device it runs on (its SMs, its access rights).
    pub device: u32,
    /// The module holding the kernel.
    pub module: Arc<Module>,
    /// The kernel.
    pub kernel: KernelId,
    /// Blocks (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// One buffer per parameter.
    pub params: Vec<Vec<u8>>,
}

/// What [`Simulator::run`] stopped on.
#[derive(Clone, Debug)]
pub enum RunOutcome {
    /// These grids finished (every thread exited).
    Finished(Vec<GridId>),
    /// No grid is running.
    Idle,
    /// The step budget ran out with grids still running.
    Budget,
    /// Every live thread waits (spins on memory no running thread will store to, or a block
    /// barrier other threads cannot reach, or a block not resident waits for residency):
    /// only a store from outside (host, another process) or more virtual time can help.
    /// [`Simulator::stall_report`] says who waits where (built only when asked: stalls are
    /// frequent while kernels wait on each other, reports rare).
    Stalled,
    /// A grid faulted (trap, out-of-bounds access, unsupported instruction, bad barrier use):
    /// the report names the kernel, block, thread, PTX line and seed. The grid is gone.
    Fault(GridId, String),
}

/// What kind of fault a [`RunOutcome::Fault`] report describes (its report starts with the
/// kind's prefix: `illegal address:`, `misaligned address:`, `trap`, `barrier misuse:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// An access outside every mapped range, or to a range the device may not access.
    IllegalAddress,
    /// An access not aligned to its size.
    MisalignedAddress,
    /// `trap` (a Rust panic in the kernel).
    Trap,
    /// An instruction the simulator cannot execute (normally rejected at load already).
    IllegalInstruction,
    /// Barrier misuse (threads of one block at different barriers, mixed forms).
    Barrier,
    /// A data race (weak memory with race reports on).
    DataRace,
    /// Anything else.
    Other,
}

impl FaultKind {
    /// The kind of the fault `report` (of a [`RunOutcome::Fault`]) describes.
    pub fn of(report: &str) -> FaultKind {
        if report.starts_with("illegal address:") {
            FaultKind::IllegalAddress
        } else if report.starts_with("misaligned address:") {
            FaultKind::MisalignedAddress
        } else if report.starts_with("data race:") {
            FaultKind::DataRace
        } else if report.starts_with("trap") {
            FaultKind::Trap
        } else if report.starts_with("illegal instruction:") {
            FaultKind::IllegalInstruction
        } else if report.starts_with("barrier misuse:") {
            FaultKind::Barrier
        } else {
            FaultKind::Other
        }
    }
}

/// Static facts about a kernel (for `cuFuncGetAttribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// Static `.shared` bytes (always 0: shared memory is rejected at load).
    pub shared_bytes: u32,
    /// `.local` bytes per thread (always 0: local memory is rejected at load).
    pub local_bytes: u32,
    /// Parameter bytes.
    pub param_bytes: u32,
    /// Lowered instructions of the kernel and the functions it calls.
    pub instructions: u32,
}

/// Counters of a simulation ([`Simulator::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Instructions executed (all threads).
    pub instructions: u64,
    /// Scheduling decisions (a thread ran until its next switch).
    pub slices: u64,
    /// `nanosleep`s that parked their thread.
    pub sleeps_parked: u64,
    /// Loads that returned an older store (weak memory).
    pub stale_reads: u64,
    /// Loads and atomics GPU threads executed on host memory ([`AddressSpace::map_host`]).
    pub host_reads: u64,
}

/// Threads per SM.
const SM_THREADS: u32 = 2048;
/// Registers per SM.
const SM_REGS: u32 = 65536;
/// Resident blocks per SM.
const SM_BLOCKS: u32 = 32;
/// Threads per block at most.
const MAX_BLOCK_THREADS: u32 = 1024;

/// Registers one warp of a kernel using `regs` registers per thread occupies (allocated in
/// units of 256 per warp).
fn regs_per_warp(regs: u32) -> u32 {
    (regs.max(1) * 32).div_ceil(256) * 256
}

/// Blocks of `block_threads` threads fitting on one SM at `regs` registers per thread.
fn blocks_per_sm_for(regs: u32, block_threads: u32) -> u32 {
    if block_threads == 0 || block_threads > MAX_BLOCK_THREADS || regs > 255 {
        return 0;
    }
    let warps = block_threads.div_ceil(32);
    let by_threads = SM_THREADS / (warps * 32);
    let by_regs = SM_REGS / (warps * regs_per_warp(regs));
    by_threads.min(by_regs).min(SM_BLOCKS)
}

/// Resource use of one SM.
#[derive(Clone, Copy, Debug, Default)]
struct Sm {
    threads: u32,
    regs: u32,
    blocks: u32,
}

/// One device's SMs.
#[derive(Debug)]
struct Device {
    id: u32,
    sms: Vec<Sm>,
}

/// A running grid.
#[derive(Debug)]
struct Grid {
    id: GridId,
    module: Arc<Module>,
    kernel: u32,
    device: u32,
    dims: [u32; 3],
    block_dims: [u32; 3],
    params: Box<[u8]>,
    entry_pc: u32,
    next_block: u64,
    total_blocks: u64,
    /// Live block slots.
    blocks: Vec<u32>,
    /// Register file template (constants, `%ntid`, `%nctaid` filled in).
    template: Box<[u64]>,
    threads_per_block: u32,
    /// Weak memory: the grid's id and the finish count it sees.
    weak_grid: (u32, u32),
    /// SM resources one block takes: threads (warp-rounded) and registers.
    res_threads: u32,
    res_regs: u32,
}

/// A resident block.
#[derive(Debug)]
struct Block {
    grid: u32,
    ctaid: [u32; 3],
    device: u32,
    sm: u32,
    threads: Vec<u32>,
    live: u32,
    /// Barrier: threads arrived, the instruction, how many had a true predicate, who waits.
    arrived: u32,
    bar_pc: u32,
    bar_true: u32,
    waiting: Vec<u32>,
    /// Weak-memory block id.
    weak_block: u32,
    /// The block's local memory (every thread's frame, one after another), mapped for the
    /// block's device while the block lives; `None` when the module has no `.local`
    /// variables.
    local: Option<Box<[std::sync::atomic::AtomicU64]>>,
}

/// A thread's scheduling state.
#[derive(Clone, Copy, Debug)]
struct Sched {
    state: TState,
    /// PCT priority.
    prio: u32,
    /// Bumped whenever the thread parks or becomes runnable (stale wake-ups are ignored).
    token: u32,
    /// Whether the heap holds an entry for it, and at which priority.
    in_heap: bool,
    heap_prio: u32,
}

/// The priority-heap key of `tid` at `prio` (ties: lower slot first).
/// Drop the entries of a list of parks (`(thread, park token)`, just pushed to) whose park has
/// ended, each time the list doubles: only live parks stay (the one just pushed included: its
/// thread sleeps with that token already). Without it, a list no store drains — a granule one
/// thread polls alone, the sleepers that read too much to track — grows by one entry per
/// sleep without bound.
fn prune_parks(parks: &mut Vec<(u32, u32)>, sched: &[Sched]) {
    let len = parks.len();
    if len >= 16 && len.is_power_of_two() {
        parks.retain(|&(w, tok)| {
            sched
                .get(w as usize)
                .is_some_and(|s| s.state == TState::Sleeping && s.token == tok)
        });
    }
}

fn heap_key(prio: u32, tid: u32) -> u64 {
    (prio as u64) << 32 | (!tid) as u64
}

/// Scheduling policy parameters drawn from the seed.
#[derive(Debug, Clone, Copy)]
struct Policy {
    /// Chance (of 65536) that a decision picks a uniformly random thread.
    random: u32,
    /// Longest random burst, in interleaving points.
    burst: u64,
    /// Mean interleaving points between PCT priority changes.
    pct_mean: u64,
    /// Whether plain (weak) loads are interleaving points too.
    plain_load_points: bool,
}

/// Threads parked alike: count, an example block and thread, the addresses watched.
type StallGroup = (u32, u32, u32, Vec<u64>);

/// One simulated GPU: the grids running on it and the scheduler. Not `Sync`: one OS thread
/// drives it.
#[derive(Debug)]
pub struct Simulator {
    config: SimConfig,
    mem: memory::MemView,
    rng: Rng,
    policy: Policy,
    now: u64,
    /// Instructions executed towards the next nanosecond.
    time_frac: u64,
    /// Threads of resident blocks not exited.
    live_threads: u64,
    instructions: u64,
    slices: u64,
    parks: u64,
    /// Host-memory reads that cost time, and when the PCIe link is free again.
    host_reads: u64,
    host_link_free_at: u64,
    /// Wake-ups of threads parked by host reads (also in `timers`).
    host_read_timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    trace: u64,
    next_grid: u64,
    next_token: u32,
    grids: Vec<Option<Grid>>,
    /// Live grid slots in launch order.
    grid_order: Vec<u32>,
    blocks: Vec<Option<Block>>,
    free_blocks: Vec<u32>,
    threads: Vec<Option<Box<Thread>>>,
    free_threads: Vec<u32>,
    devices: Vec<Device>,
    run_list: Vec<u32>,
    run_pos: Vec<u32>,
    /// Scheduling state by thread slot.
    sched: Vec<Sched>,
    /// PCT: `heap_key(priority, thread)` of runnable threads (lazily cleaned).
    heap: BinaryHeap<u64>,
    timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    pct_countdown: u64,
    stores: exec::Stores,
    weak: Option<weak::Weak>,
    finished: Vec<GridId>,
    faults: Vec<(GridId, String)>,
    strict_barriers: bool,
}

/// A readable name for a (Rust v0-mangled) PTX symbol: `a::b::c`, or the name itself.
fn demangle(name: &str) -> String {
    let Some(rest) = name.strip_prefix("_R") else {
        return name.to_string();
    };
    let b = rest.as_bytes();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'N' => i += 2,
            b'C' => {
                i += 1;
                if b.get(i) == Some(&b's') {
                    while i < b.len() && b[i] != b'_' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            c if c.is_ascii_digit() => {
                let start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                let n: usize = rest[start..i].parse().unwrap_or(0);
                if b.get(i) == Some(&b'_') {
                    i += 1;
                }
                if i + n > b.len() {
                    return name.to_string();
                }
                parts.push(&rest[i..i + n]);
                i += n;
            }
            _ => return name.to_string(),
        }
    }
    if parts.is_empty() {
        name.to_string()
    } else {
        parts.join("::")
    }
}

impl Simulator {
    /// A simulator over `memory`.
    pub fn new(config: SimConfig, memory: Arc<AddressSpace>) -> Simulator {
        let mut rng = Rng::new(config.seed);
        let policy = Policy {
            random: [0, 4096, 16384, 65536][rng.below(4) as usize],
            burst: [1, 4, 32, 256][rng.below(4) as usize],
            pct_mean: [16, 256, 4096, 65536][rng.below(4) as usize],
            plain_load_points: rng.below(4) == 0,
        };
        let pct_countdown = 1 + rng.below(2 * policy.pct_mean);
        let weak = config.weak_memory.then(|| {
            let mut w = weak::Weak::new(rng.next_u64());
            w.report_races = config.races;
            w
        });
        Simulator {
            mem: memory::MemView::new(memory),
            rng,
            policy,
            now: 0,
            time_frac: 0,
            live_threads: 0,
            instructions: 0,
            slices: 0,
            parks: 0,
            host_reads: 0,
            host_link_free_at: 0,
            host_read_timers: BinaryHeap::new(),
            trace: 0,
            next_grid: 1,
            next_token: 0,
            grids: Vec::new(),
            grid_order: Vec::new(),
            blocks: Vec::new(),
            free_blocks: Vec::new(),
            threads: Vec::new(),
            free_threads: Vec::new(),
            devices: Vec::new(),
            run_list: Vec::new(),
            run_pos: Vec::new(),
            sched: Vec::new(),
            heap: BinaryHeap::new(),
            timers: BinaryHeap::new(),
            pct_countdown,
            stores: exec::Stores::default(),
            weak,
            finished: Vec::new(),
            faults: Vec::new(),
            strict_barriers: true,
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Start a grid (its blocks become resident as room allows).
    pub fn launch(&mut self, launch: Launch) -> Result<GridId, SimError> {
        let prog = &launch.module.prog;
        let kernel = prog
            .kernels
            .get(launch.kernel.0 as usize)
            .ok_or_else(|| sim_err(format!("no kernel {:?} in this module", launch.kernel)))?;
        if launch.params.len() != kernel.params.len() {
            return Err(sim_err(format!(
                "{} takes {} parameters, the launch gives {}",
                kernel.name,
                kernel.params.len(),
                launch.params.len()
            )));
        }
        let mut params = vec![0u8; kernel.param_bytes];
        for (k, (value, info)) in launch.params.iter().zip(&kernel.params).enumerate() {
            if value.len() != info.size {
                return Err(sim_err(format!(
                    "{} parameter {k} is {} bytes, the launch gives {}",
                    kernel.name,
                    info.size,
                    value.len()
                )));
            }
            let off = kernel.offsets[k];
            params[off..off + info.size].copy_from_slice(value);
        }
        let threads_per_block = launch.block.iter().try_fold(1u32, |a, &d| a.checked_mul(d));
        let threads_per_block = match threads_per_block {
            Some(n) if (1..=MAX_BLOCK_THREADS).contains(&n) => n,
            _ => {
                return Err(sim_err(format!(
                    "{}: block {:?} is not 1 to {MAX_BLOCK_THREADS} threads",
                    kernel.name, launch.block
                )));
            }
        };
        if launch.grid.contains(&0) {
            return Err(sim_err(format!(
                "{}: empty grid {:?}",
                kernel.name, launch.grid
            )));
        }
        let regs = self.config.registers_per_thread;
        if blocks_per_sm_for(regs, threads_per_block) == 0 {
            return Err(sim_err(format!(
                "{}: a block of {threads_per_block} threads at {regs} registers per thread does not fit on an SM",
                kernel.name
            )));
        }
        let total_blocks = launch.grid.iter().map(|&d| d as u64).product();
        let func = &prog.funcs[kernel.func as usize];
        let mut template = prog.template.clone();
        for d in 0..3 {
            template[(slot::NTID + d) as usize] = launch.block[d as usize] as u64;
            template[(slot::NCTAID + d) as usize] = launch.grid[d as usize] as u64;
        }
        let warps = threads_per_block.div_ceil(32);
        let id = GridId(self.next_grid);
        self.next_grid += 1;
        if !self.devices.iter().any(|d| d.id == launch.device) {
            self.devices.push(Device {
                id: launch.device,
                sms: vec![Sm::default(); self.config.sms.max(1) as usize],
            });
        }
        let grid = Grid {
            id,
            kernel: launch.kernel.0,
            device: launch.device,
            dims: launch.grid,
            block_dims: launch.block,
            params: params.into(),
            entry_pc: func.start,
            next_block: 0,
            total_blocks,
            blocks: Vec::new(),
            template: template.into(),
            threads_per_block,
            weak_grid: match self.weak.as_mut() {
                Some(w) => w.new_grid(format!(
                    "kernel {} (grid {}, device {})",
                    launch.module.prog.kernels[launch.kernel.0 as usize].name, id.0, launch.device
                )),
                None => (0, 0),
            },
            res_threads: warps * 32,
            res_regs: warps * regs_per_warp(regs),
            module: launch.module.clone(),
        };
        let slot_ = match self.grids.iter().position(|g| g.is_none()) {
            Some(s) => {
                self.grids[s] = Some(grid);
                s
            }
            None => {
                self.grids.push(Some(grid));
                self.grids.len() - 1
            }
        } as u32;
        self.grid_order.push(slot_);
        self.start_blocks();
        Ok(id)
    }

    /// Blocks of `block_threads` threads of `kernel` that fit on one SM.
    pub fn blocks_per_sm(&self, module: &Module, kernel: KernelId, block_threads: u32) -> u32 {
        if module.prog.kernels.get(kernel.0 as usize).is_none() {
            return 0;
        }
        blocks_per_sm_for(self.config.registers_per_thread, block_threads)
    }

    /// Run the running grids for at most `max_steps` instructions.
    pub fn run(&mut self, max_steps: u64) -> RunOutcome {
        self.mem.refresh();
        let mut executed = 0u64;
        loop {
            if !self.faults.is_empty() {
                let (g, r) = self.faults.remove(0);
                return RunOutcome::Fault(g, r);
            }
            if !self.finished.is_empty() {
                return RunOutcome::Finished(std::mem::take(&mut self.finished));
            }
            if self.grid_order.is_empty() {
                return RunOutcome::Idle;
            }
            self.wake_timers();
            self.process_woken();
            if self.run_list.is_empty() {
                // A read from host memory ends at a known time whatever real time does: move
                // to the first wake-up (a `nanosleep` may end first) instead of stalling.
                if self.host_read_pending()
                    && let Some(at) = self.next_wakeup_ns()
                {
                    self.advance_time_to(at);
                    continue;
                }
                return RunOutcome::Stalled;
            }
            if executed >= max_steps {
                return RunOutcome::Budget;
            }
            let (tid, points, pct) = self.pick();
            let limit = (max_steps - executed).min(1 << 16);
            let mut t = self.threads[tid as usize].take().expect("live thread");
            let grid = self.grids[t.grid as usize].as_ref().expect("live grid");
            let mut ctx = Ctx {
                mem: &mut self.mem,
                device: grid.device,
                params: &grid.params,
                now: self.now,
                frac: self.time_frac,
                live: self.live_threads.max(1),
                stores: &mut self.stores,
                weak: self.weak.as_mut(),
                plain_load_points: self.policy.plain_load_points,
                host_reads_cost: self.config.host_read_ns > 0 || self.config.host_read_gap_ns > 0,
                host_reads: 0,
            };
            let (stop, n) = exec::run(&mut t, &grid.module.prog, &mut ctx, points, limit);
            self.host_reads += ctx.host_reads;
            let pc = t.pc;
            self.threads[tid as usize] = Some(t);
            executed += n;
            self.time_frac += n;
            let live = self.live_threads.max(1);
            self.now += self.time_frac / live;
            self.time_frac %= live;
            self.instructions += n;
            self.slices += 1;
            self.trace = (self.trace ^ (tid as u64) ^ ((pc as u64) << 24) ^ (n << 44))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
            if pct {
                self.pct_countdown = self.pct_countdown.saturating_sub(points as u64);
                if self.pct_countdown == 0 {
                    self.pct_countdown = 1 + self.rng.below(2 * self.policy.pct_mean);
                    let low = (self.rng.next_u64() as u32) >> 1;
                    let s = &mut self.sched[tid as usize];
                    s.prio = low;
                    if s.state == TState::Runnable {
                        s.heap_prio = low;
                        s.in_heap = true;
                        self.heap.push(heap_key(low, tid));
                        self.compact_heap();
                    }
                }
            }
            match stop {
                Stop::Yield | Stop::Limit => {}
                Stop::Barrier => self.thread_barrier(tid),
                Stop::Sleep(ns) => self.thread_sleep(tid, ns),
                Stop::HostRead => self.thread_host_read(tid),
                Stop::Exit => self.thread_exit(tid),
                Stop::Trap => {
                    let what = self.trap_message(tid);
                    self.fault_thread(tid, &what);
                }
                Stop::Fault(msg) => self.fault_thread(tid, &msg),
            }
        }
    }

    /// Virtual `%globaltimer` now, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// Move virtual time forward to at least `ns` (when stalled, the driver lets time pass).
    pub fn advance_time_to(&mut self, ns: u64) {
        self.now = self.now.max(ns);
    }

    /// Memory may have changed from outside (host copies, other processes): spinning threads
    /// look again.
    pub fn wake_all(&mut self) {
        for tid in 0..self.threads.len() as u32 {
            if self.threads[tid as usize].is_some()
                && self.sched[tid as usize].state == TState::Sleeping
            {
                self.make_runnable(tid);
            }
        }
    }

    /// The earliest virtual time at which a sleeping thread wakes up by itself, if any
    /// sleeps (what [`Simulator::advance_time_to`] would need to reach to make progress
    /// after a [`RunOutcome::Stalled`] with sleepers).
    pub fn next_wakeup_ns(&mut self) -> Option<u64> {
        while let Some(&Reverse((at, tid, token))) = self.timers.peek() {
            if self.sleeping_with(tid, token) {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    /// Stores to global memory executed so far (all threads; atomics included).
    pub fn stores(&self) -> u64 {
        self.stores.seq
    }

    /// Instructions executed so far (all threads).
    pub fn instructions(&self) -> u64 {
        self.instructions
    }

    /// Counters of the simulation so far.
    pub fn stats(&self) -> SimStats {
        SimStats {
            instructions: self.instructions,
            slices: self.slices,
            sleeps_parked: self.parks,
            host_reads: self.host_reads,
            stale_reads: self.weak.as_ref().map_or(0, |w| w.stale_reads),
        }
    }

    /// A hash of the scheduling decisions so far: equal for equal seeds and launches.
    pub fn trace_hash(&self) -> u64 {
        self.trace
    }

    /// Whether threads of one block waiting at *different* non-`.aligned` `barrier.sync`
    /// instructions is a fault (default: yes; PTX allows it, symm's kernels never mean it).
    pub fn set_strict_barriers(&mut self, strict: bool) {
        self.strict_barriers = strict;
    }

    /// Remove running grid `grid` at once (its blocks leave their SMs; no `Finished` or
    /// `Fault` follows for it). Returns whether it was running.
    pub fn abort(&mut self, grid: GridId) -> bool {
        let Some(pos) = self.grid_order.iter().position(|&g| {
            self.grids[g as usize]
                .as_ref()
                .is_some_and(|x| x.id == grid)
        }) else {
            return false;
        };
        let g = self.grid_order[pos];
        self.kill_grid(g);
        self.faults.retain(|(id, _)| *id != grid);
        self.finished.retain(|id| *id != grid);
        true
    }

    /// Grids still running.
    pub fn running_grids(&self) -> Vec<GridId> {
        self.grid_order
            .iter()
            .filter_map(|&g| self.grids[g as usize].as_ref().map(|g| g.id))
            .collect()
    }

    // ---- scheduling -----------------------------------------------------------------

    fn token(&mut self) -> u32 {
        self.next_token = self.next_token.wrapping_add(1);
        self.next_token
    }

    fn sleeping_with(&self, tid: u32, token: u32) -> bool {
        self.sched
            .get(tid as usize)
            .is_some_and(|s| s.state == TState::Sleeping && s.token == token)
    }

    /// Drop stale entries of the run heap (threads that exited or changed priority since)
    /// once they outnumber the threads: entries below the running threads' priorities are
    /// otherwise never popped, and a long simulation would grow without bound.
    fn compact_heap(&mut self) {
        if self.heap.len() <= 2 * self.sched.len() + 4096 {
            return;
        }
        let sched = &mut self.sched;
        self.heap.retain(|&key| {
            let (prio, tid) = ((key >> 32) as u32, !(key as u32));
            sched
                .get(tid as usize)
                .is_some_and(|s| s.in_heap && s.heap_prio == prio && s.state != TState::Exited)
        });
        for s in sched.iter_mut().filter(|s| s.state == TState::Exited) {
            s.in_heap = false;
        }
    }

    /// Drop timer entries of sleeps that already ended (woken early by a store, or the thread
    /// exited) once they outnumber the threads.
    fn compact_timers(&mut self) {
        if self.timers.len() <= 2 * self.sched.len() + 4096 {
            return;
        }
        let sched = &self.sched;
        self.timers.retain(|&Reverse((_, tid, token))| {
            sched
                .get(tid as usize)
                .is_some_and(|s| s.state == TState::Sleeping && s.token == token)
        });
    }

    fn make_runnable(&mut self, tid: u32) {
        let token = self.token();
        let s = &mut self.sched[tid as usize];
        s.state = TState::Runnable;
        s.token = token;
        if !(s.in_heap && s.heap_prio == s.prio) {
            s.in_heap = true;
            s.heap_prio = s.prio;
            self.heap.push(heap_key(s.prio, tid));
            self.compact_heap();
        }
        if self.run_pos[tid as usize] == u32::MAX {
            self.run_pos[tid as usize] = self.run_list.len() as u32;
            self.run_list.push(tid);
        }
    }

    fn make_unrunnable(&mut self, tid: u32, state: TState) {
        self.sched[tid as usize].state = state;
        let pos = self.run_pos[tid as usize];
        if pos != u32::MAX {
            self.run_list.swap_remove(pos as usize);
            if let Some(&moved) = self.run_list.get(pos as usize) {
                self.run_pos[moved as usize] = pos;
            }
            self.run_pos[tid as usize] = u32::MAX;
        }
    }

    /// The next thread to run, its interleaving points, and whether PCT picked it.
    fn pick(&mut self) -> (u32, u32, bool) {
        if self.rng.chance(self.policy.random) {
            let tid = self.run_list[self.rng.below(self.run_list.len() as u64) as usize];
            let points = 1 + self.rng.below(self.policy.burst);
            return (tid, points as u32, false);
        }
        loop {
            let key = *self.heap.peek().expect("runnable threads");
            let (prio, tid) = ((key >> 32) as u32, !(key as u32));
            let s = &mut self.sched[tid as usize];
            if s.in_heap && s.heap_prio == prio {
                if s.state == TState::Runnable {
                    return (tid, self.pct_countdown.clamp(1, 512) as u32, true);
                }
                s.in_heap = false;
            }
            self.heap.pop();
        }
    }

    fn wake_timers(&mut self) {
        while let Some(&Reverse((at, tid, token))) = self.timers.peek() {
            if at > self.now {
                break;
            }
            self.timers.pop();
            if self.sleeping_with(tid, token) {
                self.make_runnable(tid);
            }
        }
    }

    fn process_woken(&mut self) {
        while let Some((tid, token)) = self.stores.woken.pop() {
            if self.sleeping_with(tid, token) {
                self.make_runnable(tid);
            }
        }
    }

    fn thread_sleep(&mut self, tid: u32, ns: u64) {
        let t = self.threads[tid as usize].as_mut().expect("thread");
        if let Some(w) = self.weak.as_mut()
            && w.on_sleep(t.weak_id)
        {
            // It read stale values: it looks again (and sees newer ones) instead of parking.
            t.reads.clear();
            t.reads_overflow = None;
            return;
        }
        let reads = std::mem::take(&mut t.reads);
        let overflow = t.reads_overflow.take();
        let stores = &self.stores;
        let stored_since = reads
            .iter()
            .any(|(g, seq)| stores.map.get(g).is_some_and(|e| e.last > *seq))
            || overflow.is_some_and(|seq| stores.seq > seq);
        if stored_since {
            // Something it read changed since: the sleep ends at once.
            t.reads = reads;
            t.reads.clear();
            return;
        }
        let token = self.token();
        self.sched[tid as usize].token = token;
        let t = self.threads[tid as usize].as_mut().expect("thread");
        t.wake_at = self.now.saturating_add(ns);
        t.watch.clear();
        t.watch.extend(reads.iter().map(|&(g, _)| g));
        let wake_at = t.wake_at;
        let mut reads = reads;
        reads.clear();
        t.reads = reads;
        self.make_unrunnable(tid, TState::Sleeping);
        self.parks += 1;
        let t = self.threads[tid as usize].as_ref().expect("thread");
        for &g in &t.watch {
            let e = self.stores.map.entry(g).or_default();
            e.watchers.push((tid, token));
            prune_parks(&mut e.watchers, &self.sched);
        }
        if overflow.is_some() {
            self.stores.any.push((tid, token));
            prune_parks(&mut self.stores.any, &self.sched);
        }
        self.timers.push(Reverse((wake_at, tid, token)));
        self.compact_timers();
    }

    /// Park `tid` for a read from host memory: it waits for the PCIe link to be free (reads
    /// queue behind each other, [`SimConfig::host_read_gap_ns`] each), then for the round
    /// trip ([`SimConfig::host_read_ns`]). Stores do not wake it, and what it read before
    /// stays watched for its next `nanosleep`.
    fn thread_host_read(&mut self, tid: u32) {
        let issued = self.now.max(self.host_link_free_at);
        self.host_link_free_at = issued.saturating_add(self.config.host_read_gap_ns);
        let wake_at = self
            .host_link_free_at
            .saturating_add(self.config.host_read_ns);
        let token = self.token();
        self.sched[tid as usize].token = token;
        let t = self.threads[tid as usize].as_mut().expect("thread");
        t.wake_at = wake_at;
        t.watch.clear();
        self.make_unrunnable(tid, TState::Sleeping);
        self.timers.push(Reverse((wake_at, tid, token)));
        self.compact_timers();
        self.host_read_timers.push(Reverse((wake_at, tid, token)));
    }

    /// `true` while a thread waits for a read from host memory.
    fn host_read_pending(&mut self) -> bool {
        while let Some(&Reverse((_, tid, token))) = self.host_read_timers.peek() {
            if self.sleeping_with(tid, token) {
                return true;
            }
            self.host_read_timers.pop();
        }
        false
    }

    fn thread_barrier(&mut self, tid: u32) {
        let t = self.threads[tid as usize].as_ref().expect("thread");
        let (b, pc, pred) = (t.block, t.bar_pc, t.bar_pred);
        let block = self.blocks[b as usize].as_ref().expect("block");
        let grid = self.grids[block.grid as usize].as_ref().expect("grid");
        let prog = &grid.module.prog;
        if block.arrived > 0 && block.bar_pc != pc {
            let first = prog.code[block.bar_pc as usize];
            let this = prog.code[pc as usize];
            let (l1, l2) = (prog.lines[block.bar_pc as usize], prog.lines[pc as usize]);
            let problem = if first.aux != this.aux {
                Some(
                    "barrier misuse: barrier.red and barrier.sync (or different reductions) mixed on barrier 0: unpredictable in PTX",
                )
            } else if first.flags & 2 != 0 || this.flags & 2 != 0 {
                Some(
                    "barrier misuse: threads of one block wait at different .aligned barrier instructions: undefined in PTX",
                )
            } else if self.strict_barriers {
                Some("barrier misuse: threads of one block wait at different barrier instructions")
            } else {
                None
            };
            if let Some(p) = problem {
                let msg = format!(
                    "{p} (line {l1} `{}` and line {l2})",
                    prog.line_text.get(&l1).map_or("", |s| s)
                );
                self.fault_thread(tid, &msg);
                return;
            }
        }
        let block = self.blocks[b as usize].as_mut().expect("block");
        if block.arrived == 0 {
            block.bar_pc = pc;
        }
        block.arrived += 1;
        block.bar_true += pred as u32;
        block.waiting.push(tid);
        let release = block.arrived == block.live;
        self.make_unrunnable(tid, TState::Barrier);
        if let Some(w) = self.weak.as_mut() {
            let id = self.threads[tid as usize].as_ref().expect("thread").weak_id;
            let wb = self.blocks[b as usize].as_ref().expect("block").weak_block;
            w.barrier_arrive(id, wb);
        }
        if release {
            self.release_barrier(b);
        }
    }

    fn release_barrier(&mut self, b: u32) {
        let block = self.blocks[b as usize].as_mut().expect("block");
        let grid = self.grids[block.grid as usize].as_ref().expect("grid");
        let inst = grid.module.prog.code[block.bar_pc as usize];
        let value = match inst.aux {
            red::OR => (block.bar_true > 0) as u64,
            red::AND => (block.bar_true == block.arrived) as u64,
            red::POPC => block.bar_true as u64,
            _ => 0,
        };
        let waiting = std::mem::take(&mut block.waiting);
        let wb = block.weak_block;
        block.arrived = 0;
        block.bar_true = 0;
        for &tid in &waiting {
            let t = self.threads[tid as usize].as_mut().expect("thread");
            if inst.aux != red::NONE {
                t.regs[t.bar_dest as usize] = value;
            }
            if let Some(w) = self.weak.as_mut() {
                w.barrier_leave(t.weak_id, wb);
            }
            self.make_runnable(tid);
        }
        if let Some(w) = self.weak.as_mut() {
            w.barrier_done(wb);
        }
        let block = self.blocks[b as usize].as_mut().expect("block");
        block.waiting = waiting;
        block.waiting.clear();
    }

    fn thread_exit(&mut self, tid: u32) {
        self.make_unrunnable(tid, TState::Exited);
        let t = self.threads[tid as usize].as_mut().expect("thread");
        t.regs = Box::new([]);
        t.frames = Vec::new();
        let b = t.block;
        let weak_id = t.weak_id;
        if let Some(w) = self.weak.as_mut() {
            w.thread_exit(weak_id);
        }
        let block = self.blocks[b as usize].as_mut().expect("block");
        block.live -= 1;
        self.live_threads -= 1;
        if block.live == 0 {
            self.finish_block(b);
        } else if block.arrived > 0 && block.arrived == block.live {
            // Exited threads do not take part in barriers (PTX: non-exited threads).
            self.release_barrier(b);
        }
    }

    fn free_block(&mut self, b: u32) -> Block {
        let mut block = self.blocks[b as usize].take().expect("block");
        if let Some(words) = block.local.take() {
            let base = (words.as_ptr() as u64).div_ceil(16) * 16;
            let len = (words.len() as u64 - 2) * 8;
            self.mem.space.unmap(base, len);
        }
        self.live_threads -= block.live as u64;
        for &tid in &block.threads {
            self.make_unrunnable(tid, TState::Exited);
            self.threads[tid as usize] = None;
            self.free_threads.push(tid);
        }
        let grid = self.grids[block.grid as usize].as_mut().expect("grid");
        grid.blocks.retain(|&x| x != b);
        let (rt, rr) = (grid.res_threads, grid.res_regs);
        let dev = self
            .devices
            .iter_mut()
            .find(|d| d.id == block.device)
            .expect("device");
        let sm = &mut dev.sms[block.sm as usize];
        sm.threads -= rt;
        sm.regs -= rr;
        sm.blocks -= 1;
        self.free_blocks.push(b);
        block
    }

    fn finish_block(&mut self, b: u32) {
        let block = self.free_block(b);
        let g = block.grid;
        let grid = self.grids[g as usize].as_ref().expect("grid");
        if grid.blocks.is_empty() && grid.next_block == grid.total_blocks {
            self.finished.push(grid.id);
            self.remove_grid(g);
        }
        self.start_blocks();
    }

    fn remove_grid(&mut self, g: u32) {
        let grid = self.grids[g as usize].take().expect("grid");
        if let Some(w) = self.weak.as_mut() {
            w.grid_done(grid.weak_grid.0);
        }
        self.grid_order.retain(|&x| x != g);
    }

    /// Make blocks resident while they fit, grids in launch order, blocks in index order.
    fn start_blocks(&mut self) {
        for oi in 0..self.grid_order.len() {
            let g = self.grid_order[oi];
            loop {
                let grid = self.grids[g as usize].as_ref().expect("grid");
                if grid.next_block >= grid.total_blocks {
                    break;
                }
                let (rt, rr) = (grid.res_threads, grid.res_regs);
                let dev = self
                    .devices
                    .iter_mut()
                    .find(|d| d.id == grid.device)
                    .expect("device");
                let Some(sm) = dev.sms.iter().position(|s| {
                    s.threads + rt <= SM_THREADS && s.regs + rr <= SM_REGS && s.blocks < SM_BLOCKS
                }) else {
                    break;
                };
                let s = &mut dev.sms[sm];
                s.threads += rt;
                s.regs += rr;
                s.blocks += 1;
                self.create_block(g, sm as u32);
            }
        }
    }

    fn create_block(&mut self, g: u32, sm: u32) {
        let grid = self.grids[g as usize].as_mut().expect("grid");
        let lin = grid.next_block;
        grid.next_block += 1;
        let [gx, gy, _] = grid.dims.map(|d| d as u64);
        let ctaid = [
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ];
        let b = self.free_blocks.pop().unwrap_or_else(|| {
            self.blocks.push(None);
            self.blocks.len() as u32 - 1
        });
        grid.blocks.push(b);
        let [bx, by, _] = grid.block_dims;
        let n = grid.threads_per_block;
        let entry = grid.entry_pc;
        let device = grid.device;
        let weak_grid = grid.weak_grid;
        let weak_block = self.weak.as_mut().map_or(0, |w| w.new_block());
        // Local memory: one frame per thread, 16-byte aligned.
        let frame = grid.module.prog.local_frame.div_ceil(16) * 16;
        let local: Option<Box<[std::sync::atomic::AtomicU64]>> = (frame > 0).then(|| {
            (0..(frame / 8 * n as u64 + 2) as usize)
                .map(|_| Default::default())
                .collect()
        });
        let local_base = local.as_ref().map_or(0, |words| {
            let base = (words.as_ptr() as u64).div_ceil(16) * 16;
            self.mem.space.map(
                base,
                frame * n as u64,
                &format!("local memory of block {ctaid:?}"),
                1u64.checked_shl(device).unwrap_or(0),
            );
            base
        });
        let mut tids = Vec::with_capacity(n as usize);
        for lane in 0..n {
            let mut regs = grid.template.clone();
            regs[slot::LOCAL_BASE as usize] = local_base + lane as u64 * frame;
            let tid3 = [lane % bx, (lane / bx) % by, lane / (bx * by)];
            for d in 0..3 {
                regs[(slot::TID + d) as usize] = tid3[d as usize] as u64;
                regs[(slot::CTAID + d) as usize] = ctaid[d as usize] as u64;
            }
            let prio = (self.rng.next_u64() as u32) | 0x8000_0000;
            let weak_id = self.weak.as_mut().map_or(0, |w| {
                let site = [ctaid[0], ctaid[1], ctaid[2], tid3[0], tid3[1], tid3[2]];
                w.new_thread(weak_block, weak_grid, site)
            });
            let t = Box::new(Thread {
                regs,
                pc: entry,
                frames: Vec::new(),
                grid: g,
                block: b,
                lane,
                reads: Vec::new(),
                reads_overflow: None,
                wake_at: 0,
                watch: Vec::new(),
                bar_dest: slot::SINK,
                bar_pred: false,
                bar_pc: 0,
                weak_id,
            });
            let sched = Sched {
                state: TState::Exited,
                prio,
                token: 0,
                in_heap: false,
                heap_prio: 0,
            };
            let tid = match self.free_threads.pop() {
                Some(tid) => {
                    self.threads[tid as usize] = Some(t);
                    self.sched[tid as usize] = sched;
                    tid
                }
                None => {
                    self.threads.push(Some(t));
                    self.sched.push(sched);
                    self.run_pos.push(u32::MAX);
                    self.threads.len() as u32 - 1
                }
            };
            tids.push(tid);
        }
        for &tid in &tids {
            self.make_runnable(tid);
        }
        self.live_threads += n as u64;
        self.blocks[b as usize] = Some(Block {
            grid: g,
            ctaid,
            device,
            sm,
            threads: tids,
            live: n,
            arrived: 0,
            bar_pc: 0,
            bar_true: 0,
            waiting: Vec::new(),
            weak_block,
            local,
        });
    }

    // ---- faults and reports -------------------------------------------------------------

    fn seed_line(&self) -> String {
        format!(
            "seed {0} (SYMM_SIM_SEED={0:#x}{1}), virtual time {2} ns",
            self.config.seed,
            if self.config.weak_memory {
                " SYMM_SIM_WEAK=1"
            } else {
                ""
            },
            self.now
        )
    }

    /// Where thread `tid` is: kernel, grid, block, thread, line, call chain.
    fn locate(&self, tid: u32, pc: u32) -> String {
        let t = self.threads[tid as usize].as_ref().expect("thread");
        let grid = self.grids[t.grid as usize].as_ref().expect("grid");
        let block = self.blocks[t.block as usize].as_ref().expect("block");
        let prog = &grid.module.prog;
        let kernel = &prog.kernels[grid.kernel as usize].name;
        let [bx, by, _] = grid.block_dims;
        let lane = t.lane;
        let tid3 = [lane % bx, (lane / bx) % by, lane / (bx * by)];
        let line = prog.lines.get(pc as usize).copied().unwrap_or(0);
        let text = prog.line_text.get(&line).map_or("", |s| s);
        let mut chain = Vec::new();
        if let Some(f) = prog.func_at(pc) {
            chain.push(demangle(&f.name));
        }
        for fr in t.frames.iter().rev() {
            let call_pc = fr.ret_pc.saturating_sub(1);
            if let Some(f) = prog.func_at(call_pc) {
                chain.push(format!(
                    "{} (line {})",
                    demangle(&f.name),
                    prog.lines[call_pc as usize]
                ));
            }
        }
        format!(
            "  kernel {kernel} (grid {}, device {}), block ({}, {}, {}), thread ({}, {}, {})\n  at line {line}: {text}\n  in {}",
            grid.id.0,
            grid.device,
            block.ctaid[0],
            block.ctaid[1],
            block.ctaid[2],
            tid3[0],
            tid3[1],
            tid3[2],
            chain.join(", called from ")
        )
    }

    fn trap_message(&self, tid: u32) -> String {
        let t = self.threads[tid as usize].as_ref().expect("thread");
        let grid = self.grids[t.grid as usize].as_ref().expect("grid");
        let prog = &grid.module.prog;
        // The outermost panicking function names the panic.
        let mut panic = None;
        for fr in &t.frames {
            let f = &prog.funcs[prog.calls[fr.site as usize].func as usize];
            let name = demangle(&f.name);
            if name.contains("panicking") {
                panic = Some(name);
                break;
            }
        }
        match panic {
            Some(p) => format!("trap: Rust panic {p}"),
            None => "trap".to_string(),
        }
    }

    fn fault_thread(&mut self, tid: u32, what: &str) {
        let pc = self.threads[tid as usize].as_ref().expect("thread").pc;
        let report = format!("{what}\n{}\n  {}", self.locate(tid, pc), self.seed_line());
        let g = self.threads[tid as usize].as_ref().expect("thread").grid;
        let id = self.grids[g as usize].as_ref().expect("grid").id;
        self.kill_grid(g);
        self.faults.push((id, report));
    }

    fn kill_grid(&mut self, g: u32) {
        let blocks = self.grids[g as usize]
            .as_ref()
            .expect("grid")
            .blocks
            .clone();
        for b in blocks {
            self.free_block(b);
        }
        self.remove_grid(g);
        self.start_blocks();
    }

    /// Who waits where, after a [`RunOutcome::Stalled`]: groups of threads parked alike (the
    /// PTX line, the addresses they watch), blocks waiting for residency, the seed.
    pub fn stall_report(&self) -> String {
        let mut out = format!(
            "stalled: every live thread waits; only a store from outside or more virtual time can help ({})\n",
            self.seed_line()
        );
        if let Some(Reverse((at, _, _))) = self
            .timers
            .iter()
            .filter(|Reverse((_, tid, tok))| self.sleeping_with(*tid, *tok))
            .min()
        {
            let _ = writeln!(out, "next nanosleep wake-up at {at} ns");
        }
        for &g in &self.grid_order {
            let grid = self.grids[g as usize].as_ref().expect("grid");
            let prog = &grid.module.prog;
            let _ = writeln!(
                out,
                "grid {} kernel {} on device {}: {} resident blocks, {} blocks waiting for residency",
                grid.id.0,
                prog.kernels[grid.kernel as usize].name,
                grid.device,
                grid.blocks.len(),
                grid.total_blocks - grid.next_block
            );
            // (kind, line, first watched address) → (count, example block, example lane)
            let mut groups: std::collections::BTreeMap<(u8, u32, u64), StallGroup> =
                std::collections::BTreeMap::new();
            for &b in &grid.blocks {
                let block = self.blocks[b as usize].as_ref().expect("block");
                for &tid in &block.threads {
                    let t = self.threads[tid as usize].as_ref().expect("thread");
                    let (kind, pc) = match self.sched[tid as usize].state {
                        TState::Sleeping => (0u8, t.pc.saturating_sub(1)),
                        TState::Barrier => (1, t.bar_pc),
                        _ => continue,
                    };
                    let line = prog.lines.get(pc as usize).copied().unwrap_or(0);
                    let first = t.watch.first().copied().unwrap_or(0) << 3;
                    let e = groups.entry((kind, line, first)).or_insert((
                        0,
                        block.ctaid[0],
                        t.lane,
                        t.watch.iter().map(|g| g << 3).collect(),
                    ));
                    e.0 += 1;
                }
            }
            for ((kind, line, _), (count, bx, lane, watch)) in groups {
                let text = prog.line_text.get(&line).map_or("", |s| s);
                if kind == 0 {
                    let mut addrs: Vec<String> =
                        watch.iter().take(4).map(|a| format!("{a:#x}")).collect();
                    if watch.len() > 4 {
                        addrs.push(format!("+{} more", watch.len() - 4));
                    }
                    let _ = writeln!(
                        out,
                        "  {count} threads sleep at line {line} `{text}` (e.g. block {bx} thread {lane}), having read [{}]",
                        addrs.join(", ")
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "  {count} threads wait at the barrier at line {line} `{text}` (e.g. block {bx} thread {lane})"
                    );
                }
            }
        }
        out
    }
}

/// The driver shares these between its threads.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Module>();
    shared::<AddressSpace>();
    const fn movable<T: Send>() {}
    movable::<Simulator>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_formula() {
        assert_eq!(blocks_per_sm_for(80, 512), 1);
        assert_eq!(blocks_per_sm_for(32, 256), 8);
        assert_eq!(blocks_per_sm_for(32, 32), 32);
        assert_eq!(blocks_per_sm_for(255, 1024), 0);
        assert_eq!(blocks_per_sm_for(64, 1024), 1);
        assert_eq!(blocks_per_sm_for(80, 2000), 0);
    }

    #[test]
    fn environment_numbers_are_decimal_or_hex() {
        assert_eq!(env_number("42"), Some(42));
        assert_eq!(env_number(" 0x2A "), Some(42));
        assert_eq!(env_number("0XfFfF"), Some(0xFFFF));
        assert_eq!(env_number("nope"), None);
        assert_eq!(env_number("18446744073709551615"), Some(u64::MAX));
    }

    #[test]
    fn demangles_rust_v0_paths() {
        assert_eq!(
            demangle("_RNvNtNtCsby7Xz2y7qhS_4core9panicking11panic_const23panic_const_div_by_zero"),
            "core::panicking::panic_const::panic_const_div_by_zero"
        );
        assert_eq!(demangle("symm_all_gather"), "symm_all_gather");
    }
}
