//! Fuzzing of C ABI call sequences against a reference model.
//!
//! An input is a sequence of [`input::Op`]s. [`run_input`] replays it through the library's
//! exported `extern "C"` functions, exactly as a C program calls them: communicators of 1–4
//! ranks on the host backend (made by `symmCommInitAll`, or by `symmGetUniqueId` and
//! `symmCommInitRank` with one thread per rank), allocations, windows, the three collectives,
//! groups, teardown and error queries, with arguments that are valid, stale (destroyed, freed,
//! deregistered), foreign (another rank's or communicator's), NULL or made up. Its
//! communicators are strict (`SYMM_STRICT_WINDOWS=1`): a buffer outside every window is
//! refused, not staged.
//!
//! Before every call the model ([`Harness`]) predicts its result code from what the earlier
//! calls left: which handles are live, which allocations and windows each rank holds, which
//! registrations are complete, what is queued in the open group. A well-formed collective is
//! issued by every rank of a communicator inside a group (one thread drives all ranks); an
//! ill-formed one is a single call that must fail validation without touching memory (a refused
//! call still counts as its rank's call, so on a communicator of several ranks it taints the
//! communicator, or makes its group's end uncertain). After a
//! collective ran, every receive buffer is checked against a reference computed independently
//! (integers exactly, floats in f64 within an error bound), and every byte of every allocation
//! outside the receive buffers must be unchanged.
//!
//! A call that can only time out (a collective or registration some rank does not join) is
//! predicted as `symmTimeout`; a communicator that timed out is *tainted*: from then on the
//! model accepts any result there but `symmInternalError`, and no call may outlive its bound.
//! Such calls are limited per input, since each waits for `SYMM_TIMEOUT_MS`.
//!
//! Failure is a panic: a result other than the predicted one, wrong data, a changed byte, a
//! call that blocks far past its bound, `symmInternalError` (a panic caught at the FFI
//! boundary), or an invalid error string; and, under the sanitizer, any memory error.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod input;
pub mod numeric;

use input::{BufSel, CallSpec, CommSel, Op, Reader};
use numeric::{Kind, Reduce, Rng, TYPES};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;

/// `SYMM_TIMEOUT_MS` of the patient communicators (see [`Clique`]): `SYMM_FUZZ_TIMEOUT_MS`
/// when set, else 5000 (well-formed collectives must finish within it even on a loaded
/// machine).
pub fn timeout_ms() -> u64 {
    static TIMEOUT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        std::env::var("SYMM_FUZZ_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|ms| *ms > 0)
            .unwrap_or(5000)
    })
}

/// `SYMM_TIMEOUT_MS` of the other communicators, where the calls that time out are made.
pub const FAST_TIMEOUT_MS: u64 = 50;

/// Set the bound of the communicators created next. Only the fuzzing thread creates
/// communicators and changes the variable.
fn use_timeout(ms: u64) {
    // SAFETY: the library reads its variables through `std::env`, which synchronizes with
    // `set_var`; no other thread of this process reads the environment through libc while
    // inputs run (the library's bootstrap threads make no such calls).
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", ms.to_string()) };
}

/// Calls per input that may wait for the timeout (each costs [`timeout_ms`]).
const BLOCKING_BUDGET: u32 = 2;

/// Most live communicators (ranks) at once.
const MAX_LIVE_RANKS: usize = 8;

/// Most allocations per rank.
const MAX_ALLOCATIONS: usize = 4;

/// Most operations run per input.
const MAX_OPS: usize = 64;

/// Longest any call may take: a wait is bounded by the timeout; a group may wait once per
/// queued item, and the machine may be busy.
fn call_bound() -> Duration {
    Duration::from_millis(timeout_ms() * 4)
}

/// What the inputs run so far exercised (for the replay test and debugging).
pub mod stats {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Collectives whose results were checked against the reference.
    pub static CHECKED_COLLECTIVES: AtomicU64 = AtomicU64::new(0);
    /// Calls that returned the predicted error.
    pub static PREDICTED_ERRORS: AtomicU64 = AtomicU64::new(0);
    /// Calls that timed out as predicted, or on a tainted communicator.
    pub static TIMEOUTS: AtomicU64 = AtomicU64::new(0);

    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The three counters.
    pub fn read() -> (u64, u64, u64) {
        (
            CHECKED_COLLECTIVES.load(Ordering::Relaxed),
            PREDICTED_ERRORS.load(Ordering::Relaxed),
            TIMEOUTS.load(Ordering::Relaxed),
        )
    }
}

/// Set the environment the library reads when it creates a communicator (once per process).
pub fn configure_environment() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before the first communicator exists; the library reads these
        // variables only while creating communicators, which happens after this returns.
        unsafe {
            std::env::set_var("SYMM_BACKEND", "host");
            std::env::set_var("SYMM_BOOTSTRAP_TIMEOUT_MS", "5000");
            // Strict windows: the inputs pass made-up and stale pointers, which a call
            // outside the windows would stage (copy from) instead of refusing; staging itself
            // is tested in tests/tests/staging.rs.
            std::env::set_var("SYMM_STRICT_WINDOWS", "1");
            std::env::remove_var("SYMM_ALGO");
            std::env::remove_var("SYMM_COMM_ID");
        }
    });
}

/// Run one input: decode it, replay it against the model, tear everything down.
pub fn run_input(data: &[u8]) {
    configure_environment();
    let mut harness = Harness::new(data);
    let mut reader = Reader::new(data);
    let mut ran = 0;
    while let Some(op) = Op::decode(&mut reader) {
        if ran == MAX_OPS {
            break;
        }
        ran += 1;
        harness.run(op);
    }
    harness.finish();
}

/// One `symmMemAlloc` allocation.
#[derive(Clone, Copy, Debug)]
struct Allocation {
    base: u64,
    size: usize,
}

/// One window of a rank.
#[derive(Clone, Copy, Debug)]
struct Win {
    handle: usize,
    base: u64,
    size: u64,
    seq: u64,
    /// Its registration completed (outside a group, or at its group's end).
    complete: bool,
}

/// What the model knows of one live rank.
struct Rank {
    handle: symmComm_t,
    allocations: Vec<Allocation>,
    windows: Vec<Win>,
    /// Sequence number of this rank's next registration.
    next_seq: u64,
    /// Calls of this rank queued in the open group.
    queued: usize,
}

/// The ranks of one communicator.
struct Clique {
    /// `None` once destroyed.
    ranks: Vec<Option<Rank>>,
    /// Made by `symmCommInitRank` (registrations go through the bootstrap).
    linked: bool,
    /// A call timed out or did something the model does not predict: from now on any result
    /// but `symmInternalError` is accepted here, and data is not checked.
    tainted: bool,
    /// Made with the long timeout ([`timeout_ms`]): calls that could only time out are not
    /// made, and every prediction is exact. Else the short one ([`FAST_TIMEOUT_MS`]): calls
    /// that time out are cheap, and a well-formed collective may time out too (a busy
    /// machine), which taints the communicator.
    patient: bool,
}

impl Clique {
    fn nranks(&self) -> usize {
        self.ranks.len()
    }

    fn all_alive(&self) -> bool {
        self.ranks.iter().all(Option::is_some)
    }

    /// The first live rank (the reference for "the same window on every rank").
    fn first_alive(&self) -> Option<usize> {
        self.ranks.iter().position(Option::is_some)
    }
}

/// A resolved collective call of one rank.
#[derive(Clone, Copy, Debug)]
struct Call {
    kind: u8,
    dtype: c_int,
    op: c_int,
    count: usize,
    send: u64,
    recv: u64,
}

impl Call {
    fn kind_name(&self) -> &'static str {
        ["symmAllReduce", "symmAllGather", "symmReduceScatter"][self.kind as usize]
    }
}

/// A validated call: where it reads and writes.
#[derive(Clone, Copy, Debug)]
struct Checked {
    elem: Kind,
    reduce: Option<Reduce>,
    /// Bytes of one rank's share.
    bytes: u64,
    /// Bytes of the whole buffer (shares of all ranks; all-reduce: `bytes`).
    total: u64,
    /// Send and receive windows (by registration) and offsets.
    send_seq: u64,
    recv_seq: u64,
}

/// Work queued in the open group.
enum Pending {
    Register {
        clique: usize,
        rank: usize,
        handle: usize,
        seq: u64,
        size: u64,
        /// The window base (every rank's must be 16-byte aligned).
        base: u64,
    },
    Collective {
        clique: usize,
        rank: usize,
        call: Call,
        checked: Checked,
        /// Issued as part of a well-formed all-rank call (else a single call, whose agreement
        /// with the others the model does not predict).
        symmetric: bool,
    },
}

/// Snapshot of every live allocation's bytes.
type Snapshot = Vec<((usize, usize, u64), Vec<u8>)>;

/// The model and the handles of one input.
pub struct Harness {
    cliques: Vec<Clique>,
    stale_comms: Vec<usize>,
    stale_pointers: Vec<u64>,
    group_depth: u32,
    pending: Vec<Pending>,
    /// Cliques (of several ranks) on which a collective of the open group was refused when it
    /// was called, or made with count 0 where others may not be: the library refuses the
    /// whole group at its end, or numbers the calls in a way the model does not follow, so
    /// the group's end is uncertain and those cliques are tainted (see
    /// `symm::agree::Call`).
    group_unsure: Vec<usize>,
    blocking_left: u32,
    rng: Rng,
    log: Vec<String>,
    /// Threads of the process when the input started.
    threads_at_start: usize,
}

/// Threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// A made-up address that is never a handle or a buffer of the library.
fn made_up_address() -> u64 {
    static NOT_A_HANDLE: u64 = 0;
    &NOT_A_HANDLE as *const u64 as u64
}

const OK: symmResult_t = symmResult_t::symmSuccess;
const INVALID_ARGUMENT: symmResult_t = symmResult_t::symmInvalidArgument;
const INVALID_USAGE: symmResult_t = symmResult_t::symmInvalidUsage;
const TIMEOUT: symmResult_t = symmResult_t::symmTimeout;
const WINDOW_ALIGNMENT: u64 = 16;

/// Every result code but `symmInternalError`.
fn anything() -> Vec<symmResult_t> {
    (0..=10)
        .filter_map(symmResult_t::from_raw)
        .filter(|r| *r != symmResult_t::symmInternalError)
        .collect()
}

fn c_text(ptr: *const c_char) -> String {
    assert!(!ptr.is_null(), "the library returned a NULL string");
    // SAFETY: non-NULL, and the library returns NUL-terminated strings valid until the next
    // failing call on this thread or comm (read at once).
    let text = unsafe { CStr::from_ptr(ptr) };
    assert!(text.to_bytes().len() < 4096, "an error string is too long");
    text.to_string_lossy().into_owned()
}

fn last_error(comm: symmComm_t) -> String {
    c_text(symmGetLastError(comm))
}

impl Harness {
    fn new(data: &[u8]) -> Self {
        let seed = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Harness {
            cliques: Vec::new(),
            stale_comms: Vec::new(),
            stale_pointers: Vec::new(),
            group_depth: 0,
            pending: Vec::new(),
            group_unsure: Vec::new(),
            blocking_left: BLOCKING_BUDGET,
            rng: Rng(seed),
            log: Vec::new(),
            threads_at_start: thread_count(),
        }
    }

    /// Panic with the sequence so far.
    #[track_caller]
    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(24).rev().collect();
        panic!(
            "{what}\nlast operations:\n  {}",
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }

    /// Run `call` (the C function `name`), and check its result against `expected`.
    #[track_caller]
    fn expect(
        &self,
        name: &str,
        expected: &[symmResult_t],
        comm: symmComm_t,
        call: impl FnOnce() -> symmResult_t,
    ) -> symmResult_t {
        let started = Instant::now();
        let result = call();
        let elapsed = started.elapsed();
        if elapsed > call_bound() {
            self.fail(format!(
                "{name} took {elapsed:?}: longer than any bounded wait ({result:?})"
            ));
        }
        if result == symmResult_t::symmInternalError {
            self.fail(format!(
                "{name} returned symmInternalError: {}",
                last_error(null_mut())
            ));
        }
        if !expected.contains(&result) {
            self.fail(format!(
                "{name} returned {result:?} ({}), the model expected {expected:?}",
                last_error(null_mut())
            ));
        }
        if result == TIMEOUT {
            stats::add(&stats::TIMEOUTS);
        } else if result != OK {
            stats::add(&stats::PREDICTED_ERRORS);
        }
        if result != OK && name != "symmGroupEnd" {
            let message = last_error(null_mut());
            if !message.contains(name) {
                self.fail(format!(
                    "{name} failed ({result:?}) but the thread's last error does not name it: \
                     {message:?}"
                ));
            }
            if !comm.is_null() && self.locate(comm).is_some() {
                let message = last_error(comm);
                if !message.contains(name) {
                    self.fail(format!(
                        "{name} failed ({result:?}) but the comm's last error does not name it: \
                         {message:?}"
                    ));
                }
            }
        }
        result
    }

    // ---- handles -------------------------------------------------------------------------

    /// The live (clique, rank) behind a comm handle value.
    fn locate(&self, handle: symmComm_t) -> Option<(usize, usize)> {
        self.cliques.iter().enumerate().find_map(|(c, clique)| {
            clique
                .ranks
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.handle == handle))
                .map(|r| (c, r))
        })
    }

    fn live_ranks(&self) -> Vec<(usize, usize)> {
        self.cliques
            .iter()
            .enumerate()
            .flat_map(|(c, clique)| {
                clique
                    .ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_some())
                    .map(move |(r, _)| (c, r))
            })
            .collect()
    }

    fn rank(&self, at: (usize, usize)) -> &Rank {
        self.cliques[at.0].ranks[at.1]
            .as_ref()
            .expect("a live rank")
    }

    fn rank_mut(&mut self, at: (usize, usize)) -> &mut Rank {
        self.cliques[at.0].ranks[at.1]
            .as_mut()
            .expect("a live rank")
    }

    fn pick_comm(&self, sel: CommSel) -> symmComm_t {
        match sel.kind % 8 {
            0 => null_mut(),
            1 => made_up_address() as symmComm_t,
            2 if !self.stale_comms.is_empty() => {
                self.stale_comms[sel.index as usize % self.stale_comms.len()] as symmComm_t
            }
            _ => {
                let live = self.live_ranks();
                if live.is_empty() {
                    return null_mut();
                }
                self.rank(live[sel.index as usize % live.len()]).handle
            }
        }
    }

    /// Index of a live clique.
    fn pick_clique(&self, index: u8) -> Option<usize> {
        let live: Vec<usize> = (0..self.cliques.len())
            .filter(|c| self.cliques[*c].first_alive().is_some())
            .collect();
        (!live.is_empty()).then(|| live[index as usize % live.len()])
    }

    /// The address `sel` names for the rank `owner` (or for no live rank).
    fn pick_buffer(&self, owner: Option<(usize, usize)>, sel: BufSel) -> u64 {
        let (base, size) = match sel.kind % 8 {
            0 => return 0,
            1 => (0x1000, 0),
            2 if !self.stale_pointers.is_empty() => (
                self.stale_pointers[sel.index as usize % self.stale_pointers.len()],
                0,
            ),
            3 | 2 => {
                let foreign: Vec<Win> = self
                    .live_ranks()
                    .into_iter()
                    .filter(|at| Some(*at) != owner)
                    .flat_map(|at| self.rank(at).windows.clone())
                    .collect();
                if foreign.is_empty() {
                    return 0;
                }
                let w = foreign[sel.index as usize % foreign.len()];
                (w.base, w.size)
            }
            4 => {
                let Some(at) = owner else { return 0 };
                let list = &self.rank(at).allocations;
                if list.is_empty() {
                    return 0;
                }
                let a = list[sel.index as usize % list.len()];
                (a.base, a.size as u64)
            }
            _ => {
                let Some(at) = owner else { return 0 };
                let list = &self.rank(at).windows;
                if list.is_empty() {
                    return 0;
                }
                let w = list[sel.index as usize % list.len()];
                (w.base, w.size)
            }
        };
        match sel.offset {
            0xFFFF => base.wrapping_add(size),
            0xFFFE => base.wrapping_add(u64::MAX - 7),
            offset => base.wrapping_add(offset as u64),
        }
    }

    /// Spend one unit of the blocking budget; `false` when none is left.
    fn may_block(&mut self, clique: usize) -> bool {
        if self.cliques[clique].patient || self.blocking_left == 0 {
            return false;
        }
        self.blocking_left -= 1;
        true
    }

    fn mark_comm_stale(&mut self, handle: symmComm_t) {
        if self.stale_comms.len() < 16 {
            self.stale_comms.push(handle as usize);
        }
    }

    fn mark_pointer_stale(&mut self, address: u64) {
        if self.stale_pointers.len() < 16 {
            self.stale_pointers.push(address);
        }
    }

    // ---- operations ----------------------------------------------------------------------

    /// Run one operation.
    pub fn run(&mut self, op: Op) {
        self.log.push(format!("{op:?}"));
        match op {
            Op::InitAll { nranks } => self.init_all(1 + nranks as usize % 4, nranks & 0x80 == 0),
            Op::InitUniqueId { nranks } => self.init_unique_id(1 + nranks as usize % 4),
            Op::Alloc { comm, size } => {
                let handle = self.pick_comm(comm);
                self.alloc(handle, alloc_size(size));
            }
            Op::AllocAll { clique, size } => {
                if let Some(c) = self.pick_clique(clique) {
                    for r in 0..self.cliques[c].nranks() {
                        if let Some(rank) = &self.cliques[c].ranks[r] {
                            let handle = rank.handle;
                            self.alloc(handle, alloc_size(size));
                        }
                    }
                }
            }
            Op::Free { comm, ptr } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let address = self.pick_buffer(owner, ptr);
                self.free(handle, address);
            }
            Op::Register {
                comm,
                ptr,
                size,
                flags,
            } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let address = self.pick_buffer(owner, ptr);
                let size = match size {
                    0xFFFF => owner
                        .and_then(|at| {
                            self.rank(at)
                                .allocations
                                .iter()
                                .find(|a| a.base <= address && address < a.base + a.size as u64)
                                .map(|a| (a.base + a.size as u64 - address) as usize)
                        })
                        .unwrap_or(usize::MAX),
                    s => s as usize,
                };
                self.register(handle, address, size, flags, false);
            }
            Op::RegisterAll {
                clique,
                alloc,
                offset,
                size,
            } => self.register_all(clique, alloc, offset, size),
            Op::Deregister { comm, win } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let window = self.pick_window(owner, win);
                self.deregister(handle, window, false);
            }
            Op::DeregisterAll { clique, win, free } => self.deregister_all(clique, win, free),
            Op::Collective {
                comm,
                call,
                send,
                recv,
            } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let call = Call {
                    kind: call.kind % 3,
                    dtype: raw_enum(call.dtype),
                    op: raw_enum(call.op),
                    count: count_value(call.count, 4096),
                    send: self.pick_buffer(owner, send),
                    recv: self.pick_buffer(owner, recv),
                };
                self.single_collective(handle, call);
            }
            Op::CollectiveAll {
                clique,
                call,
                whole,
                whole_offset,
                share,
                share_offset,
                variant,
            } => {
                if let Some(c) = self.pick_clique(clique) {
                    self.collective_all(
                        c,
                        call,
                        (whole, whole_offset),
                        (share, share_offset),
                        variant,
                    );
                }
            }
            Op::GroupStart => {
                if self.group_depth < 4 {
                    self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
                    self.group_depth += 1;
                }
            }
            Op::GroupEnd => self.group_end(),
            Op::Destroy { comm } => {
                let handle = self.pick_comm(comm);
                self.destroy(handle);
            }
            Op::DestroyAll { clique } => {
                if let Some(c) = self.pick_clique(clique) {
                    let handles: Vec<symmComm_t> = self.cliques[c]
                        .ranks
                        .iter()
                        .flatten()
                        .map(|r| r.handle)
                        .collect();
                    for handle in handles {
                        self.destroy(handle);
                    }
                }
            }
            Op::Query { comm, what, win } => self.query(comm, what, win),
            Op::ErrorString { code } => {
                let text = c_text(symmGetErrorString(code as i8 as c_int));
                assert!(!text.is_empty(), "empty error string for {code}");
            }
            Op::InitRankMisuse { what } => self.init_rank_misuse(what),
        }
    }

    fn init_all(&mut self, n: usize, patient: bool) {
        if self.live_ranks().len() + n > MAX_LIVE_RANKS {
            return;
        }
        use_timeout(if patient {
            timeout_ms()
        } else {
            FAST_TIMEOUT_MS
        });
        let mut comms = vec![null_mut(); n];
        let devices = vec![0 as c_int; n];
        // SAFETY: both arrays hold n elements.
        self.expect("symmCommInitAll", &[OK], null_mut(), || unsafe {
            symmCommInitAll(comms.as_mut_ptr(), n as c_int, devices.as_ptr())
        });
        self.add_clique(comms, false, patient);
    }

    fn add_clique(&mut self, comms: Vec<symmComm_t>, linked: bool, patient: bool) {
        for (r, comm) in comms.iter().enumerate() {
            let mut count: c_int = 0;
            let mut rank: c_int = -1;
            // SAFETY: valid out-pointers.
            self.expect("symmCommCount", &[OK], *comm, || unsafe {
                symmCommCount(*comm, &mut count)
            });
            // SAFETY: valid out-pointers.
            self.expect("symmCommUserRank", &[OK], *comm, || unsafe {
                symmCommUserRank(*comm, &mut rank)
            });
            if count as usize != comms.len() || rank as usize != r {
                self.fail(format!(
                    "rank {r} of {} reports rank {rank} of {count}",
                    comms.len()
                ));
            }
        }
        self.cliques.push(Clique {
            ranks: comms
                .into_iter()
                .map(|handle| {
                    Some(Rank {
                        handle,
                        allocations: Vec::new(),
                        windows: Vec::new(),
                        next_seq: 0,
                        queued: 0,
                    })
                })
                .collect(),
            linked,
            tainted: false,
            patient,
        });
    }

    fn init_unique_id(&mut self, n: usize) {
        if self.live_ranks().len() + n > MAX_LIVE_RANKS || self.group_depth > 0 {
            return;
        }
        // Patient: the ranks' first exchange through the bootstrap is bounded by the timeout.
        use_timeout(timeout_ms());
        let mut id = symmUniqueId {
            internal: [0; SYMM_UNIQUE_ID_BYTES],
        };
        // SAFETY: valid out-pointer.
        self.expect("symmGetUniqueId", &[OK], null_mut(), || unsafe {
            symmGetUniqueId(&mut id)
        });
        let started = Instant::now();
        let results: Vec<(symmResult_t, usize, String)> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..n)
                .map(|rank| {
                    scope.spawn(move || {
                        let mut comm: symmComm_t = null_mut();
                        // SAFETY: valid out-pointer.
                        let result =
                            unsafe { symmCommInitRank(&mut comm, n as c_int, id, rank as c_int) };
                        (result, comm as usize, last_error(null_mut()))
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("an init thread panicked"))
                .collect()
        });
        if started.elapsed() > call_bound() {
            self.fail(format!("symmCommInitRank took {:?}", started.elapsed()));
        }
        for (rank, (result, _, message)) in results.iter().enumerate() {
            if *result != OK {
                self.fail(format!(
                    "symmCommInitRank of rank {rank}: {result:?}: {message}"
                ));
            }
        }
        let comms = results
            .into_iter()
            .map(|(_, comm, _)| comm as symmComm_t)
            .collect();
        self.add_clique(comms, true, true);
    }

    fn init_rank_misuse(&mut self, what: u8) {
        let zero = symmUniqueId {
            internal: [0; SYMM_UNIQUE_ID_BYTES],
        };
        let mut comm: symmComm_t = null_mut();
        let (nranks, rank, in_group, expected) = match what % 4 {
            0 => (2, 0, true, INVALID_USAGE),
            1 => (2, 2, false, INVALID_ARGUMENT),
            2 => (1, 0, false, INVALID_ARGUMENT),
            _ => (
                if what & 4 != 0 { 0 } else { 100_000 },
                0,
                false,
                INVALID_ARGUMENT,
            ),
        };
        let open_here = in_group && self.group_depth == 0;
        if open_here {
            self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
        }
        // A group open for other reasons refuses the call before its arguments are read.
        let expected = if in_group || self.group_depth > 0 {
            INVALID_USAGE
        } else {
            expected
        };
        // SAFETY: valid out-pointer.
        self.expect("symmCommInitRank", &[expected], null_mut(), || unsafe {
            symmCommInitRank(&mut comm, nranks, zero, rank)
        });
        if open_here {
            self.expect("symmGroupEnd", &[OK], null_mut(), || symmGroupEnd());
        }
    }

    fn alloc(&mut self, handle: symmComm_t, size: usize) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) if self.rank(at).allocations.len() >= MAX_ALLOCATIONS => return,
            Some(_) if size == 0 || size > isize::MAX as usize - 4096 => vec![INVALID_ARGUMENT],
            Some(_) if size > 1 << 20 => return,
            Some(_) => vec![OK],
        };
        let mut ptr: *mut c_void = null_mut();
        // SAFETY: valid out-pointer.
        let result = self.expect("symmMemAlloc", &expected, handle, || unsafe {
            symmMemAlloc(handle, &mut ptr, size)
        });
        if result == OK {
            let at = at.expect("a live rank");
            if ptr.is_null() || !(ptr as usize).is_multiple_of(8) {
                self.fail(format!("symmMemAlloc returned {ptr:?}"));
            }
            // SAFETY: the library returned `size` bytes of host memory, zeroed.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, size) };
            if bytes.iter().any(|b| *b != 0) {
                self.fail("symmMemAlloc memory is not zeroed".into());
            }
            self.rank_mut(at).allocations.push(Allocation {
                base: ptr as u64,
                size,
            });
        }
    }

    fn free(&mut self, handle: symmComm_t, address: u64) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) => {
                let rank = self.rank(at);
                if rank.queued > 0 {
                    vec![INVALID_USAGE]
                } else if address == 0 {
                    vec![INVALID_ARGUMENT]
                } else {
                    match rank.allocations.iter().find(|a| a.base == address) {
                        None => vec![INVALID_ARGUMENT],
                        Some(a) => {
                            let end = a.base + a.size as u64;
                            if rank
                                .windows
                                .iter()
                                .any(|w| w.base < end && a.base < w.base + w.size)
                            {
                                vec![INVALID_USAGE]
                            } else {
                                vec![OK]
                            }
                        }
                    }
                }
            }
        };
        let result = self.expect("symmMemFree", &expected, handle, || {
            symmMemFree(handle, address as *mut c_void)
        });
        if result == OK {
            let at = at.expect("a live rank");
            self.rank_mut(at).allocations.retain(|a| a.base != address);
            self.mark_pointer_stale(address);
        }
    }

    /// `symmCommWindowRegister` on one rank (`in_all`: part of a registration of every rank).
    fn register(&mut self, handle: symmComm_t, address: u64, size: usize, flags: u8, in_all: bool) {
        let at = self.locate(handle);
        let win_flags = if flags & 1 != 0 {
            0
        } else if flags & 4 != 0 {
            SYMM_WIN_COLL_SYMMETRIC | 2
        } else {
            SYMM_WIN_COLL_SYMMETRIC
        };
        let null_out = flags & 2 != 0;
        let valid_args = |h: &Self, at: (usize, usize)| -> bool {
            let rank = h.rank(at);
            let end = address.checked_add(size as u64);
            address != 0
                && size != 0
                && win_flags == SYMM_WIN_COLL_SYMMETRIC
                && end.is_some_and(|end| {
                    rank.allocations
                        .iter()
                        .any(|a| a.base <= address && end <= a.base + a.size as u64)
                        && !rank
                            .windows
                            .iter()
                            .any(|w| address < w.base + w.size && w.base < end)
                })
        };
        let mut blocking = false;
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(_) if null_out => vec![INVALID_ARGUMENT],
            Some(at) if !valid_args(self, at) => {
                if self.cliques[at.0].linked && self.cliques[at.0].tainted {
                    // A failed registration through the bootstrap refuses the later ones.
                    vec![INVALID_ARGUMENT, INVALID_USAGE]
                } else {
                    vec![INVALID_ARGUMENT]
                }
            }
            Some(at) => {
                let clique = &self.cliques[at.0];
                let alone = clique.nranks() == 1;
                if self.group_depth > 0 {
                    // Deposited now, completed at the group's end.
                    if !in_all {
                        blocking = !alone;
                    }
                    if clique.tainted { anything() } else { vec![OK] }
                } else if clique.tainted {
                    blocking = !alone;
                    anything()
                } else if alone {
                    // Completed now: a base that is not 16-byte aligned fails it.
                    if address.is_multiple_of(WINDOW_ALIGNMENT) {
                        vec![OK]
                    } else {
                        vec![INVALID_ARGUMENT]
                    }
                } else {
                    // Outside a group nobody else can join it: it times out.
                    blocking = true;
                    if clique.linked {
                        vec![TIMEOUT, symmResult_t::symmRemoteError]
                    } else {
                        vec![TIMEOUT]
                    }
                }
            }
        };
        if blocking && !self.may_block(at.map_or(0, |a| a.0)) {
            return;
        }
        let takes_seq = !null_out && at.is_some_and(|at| valid_args(self, at));
        let mut win: symmWindow_t = null_mut();
        let out = if null_out {
            null_mut()
        } else {
            &mut win as *mut symmWindow_t
        };
        // SAFETY: `out` is NULL or a valid out-pointer.
        let result = self.expect("symmCommWindowRegister", &expected, handle, || unsafe {
            symmCommWindowRegister(handle, address as *mut c_void, size, out, win_flags)
        });
        let Some(at) = at else { return };
        if takes_seq && result != INVALID_USAGE {
            // A call that got past validation took a registration sequence number.
            self.rank_mut(at).next_seq += 1;
        }
        let seq = self.rank(at).next_seq.wrapping_sub(1);
        // Past validation, only completing the registration fails with INVALID_ARGUMENT (a
        // misaligned base): through the bootstrap, that refuses the later registrations.
        let failed_completion = takes_seq && result == INVALID_ARGUMENT;
        if result == TIMEOUT || result == symmResult_t::symmRemoteError || failed_completion {
            if self.cliques[at.0].linked {
                self.cliques[at.0].tainted = true;
            }
            return;
        }
        if result != OK {
            return;
        }
        if win.is_null() {
            self.fail("symmCommWindowRegister succeeded without a window".into());
        }
        let in_group = self.group_depth > 0;
        self.rank_mut(at).windows.push(Win {
            handle: win as usize,
            base: address,
            size: size as u64,
            seq,
            complete: !in_group,
        });
        if in_group {
            self.rank_mut(at).queued += 1;
            self.pending.push(Pending::Register {
                clique: at.0,
                rank: at.1,
                handle: win as usize,
                seq,
                size: size as u64,
                base: address,
            });
        }
    }

    fn register_all(&mut self, clique: u8, alloc: u8, offset: u16, size: u16) {
        let Some(c) = self.pick_clique(clique) else {
            return;
        };
        let mut targets = Vec::new();
        for r in 0..self.cliques[c].nranks() {
            let Some(rank) = &self.cliques[c].ranks[r] else {
                continue;
            };
            let handle = rank.handle;
            let (address, bytes) = match rank
                .allocations
                .get(alloc as usize % rank.allocations.len().max(1))
            {
                None => (0, 0),
                Some(a) => {
                    let address = a.base + offset as u64;
                    let bytes = if size == 0xFFFF {
                        (a.size as u64).saturating_sub(offset as u64) as usize
                    } else {
                        size as usize
                    };
                    (address, bytes)
                }
            };
            targets.push((r, handle, address, bytes));
        }
        // Every rank deposits the same registration, or someone waits for the timeout.
        let clique = &self.cliques[c];
        let seqs: Vec<u64> = clique.ranks.iter().flatten().map(|r| r.next_seq).collect();
        let aligned = clique.all_alive()
            && !clique.tainted
            && seqs.windows(2).all(|w| w[0] == w[1])
            && targets.iter().all(|&(r, _, address, bytes)| {
                let rank = self.rank((c, r));
                let end = address.checked_add(bytes as u64);
                address != 0
                    && bytes != 0
                    && end.is_some_and(|end| {
                        rank.allocations
                            .iter()
                            .any(|a| a.base <= address && end <= a.base + a.size as u64)
                            && !rank
                                .windows
                                .iter()
                                .any(|w| address < w.base + w.size && w.base < end)
                    })
            });
        if !aligned && clique.nranks() > 1 && !self.may_block(c) {
            return;
        }
        let own_group = self.group_depth == 0;
        if own_group {
            self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
            self.group_depth += 1;
        }
        for (_, handle, address, bytes) in targets {
            self.register(handle, address, bytes, 0, true);
        }
        if own_group {
            self.group_end();
        }
    }

    fn pick_window(&self, owner: Option<(usize, usize)>, sel: BufSel) -> symmWindow_t {
        let address = match sel.kind % 8 {
            0 => 0,
            1 => made_up_address(),
            2 if !self.stale_pointers.is_empty() => {
                self.stale_pointers[sel.index as usize % self.stale_pointers.len()]
            }
            3 | 2 => {
                let foreign: Vec<usize> = self
                    .live_ranks()
                    .into_iter()
                    .filter(|at| Some(*at) != owner)
                    .flat_map(|at| {
                        self.rank(at)
                            .windows
                            .iter()
                            .map(|w| w.handle)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                if foreign.is_empty() {
                    0
                } else {
                    foreign[sel.index as usize % foreign.len()] as u64
                }
            }
            _ => match owner {
                Some(at) if !self.rank(at).windows.is_empty() => {
                    let list = &self.rank(at).windows;
                    list[sel.index as usize % list.len()].handle as u64
                }
                _ => 0,
            },
        };
        address as symmWindow_t
    }

    fn deregister(&mut self, handle: symmComm_t, window: symmWindow_t, then_free: bool) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) => {
                let rank = self.rank(at);
                if rank.queued > 0 {
                    vec![INVALID_USAGE]
                } else if window.is_null()
                    || !rank.windows.iter().any(|w| w.handle == window as usize)
                {
                    vec![INVALID_ARGUMENT]
                } else {
                    vec![OK]
                }
            }
        };
        let result = self.expect("symmCommWindowDeregister", &expected, handle, || {
            symmCommWindowDeregister(handle, window)
        });
        if result != OK {
            return;
        }
        let at = at.expect("a live rank");
        let removed = {
            let rank = self.rank_mut(at);
            let i = rank
                .windows
                .iter()
                .position(|w| w.handle == window as usize);
            i.map(|i| rank.windows.remove(i))
        };
        self.mark_pointer_stale(window as u64);
        if then_free && let Some(w) = removed {
            let base = self
                .rank(at)
                .allocations
                .iter()
                .find(|a| a.base <= w.base && w.base < a.base + a.size as u64)
                .map(|a| a.base);
            if let Some(base) = base {
                self.free(handle, base);
            }
        }
    }

    fn deregister_all(&mut self, clique: u8, win: u8, free: u8) {
        let Some(c) = self.pick_clique(clique) else {
            return;
        };
        let reference = self.cliques[c].first_alive().expect("a live clique");
        let windows = &self.rank((c, reference)).windows;
        if windows.is_empty() {
            return;
        }
        let seq = windows[win as usize % windows.len()].seq;
        for r in 0..self.cliques[c].nranks() {
            let Some(rank) = &self.cliques[c].ranks[r] else {
                continue;
            };
            let handle = rank.handle;
            let window = rank
                .windows
                .iter()
                .find(|w| w.seq == seq)
                .map_or(null_mut(), |w| w.handle as symmWindow_t);
            self.deregister(handle, window, free & 1 != 0);
        }
    }

    fn destroy(&mut self, handle: symmComm_t) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) if self.rank(at).queued > 0 => vec![INVALID_USAGE],
            Some(_) => vec![OK],
        };
        let result = self.expect("symmCommDestroy", &expected, handle, || {
            symmCommDestroy(handle)
        });
        if result == OK {
            let at = at.expect("a live rank");
            let rank = self.cliques[at.0].ranks[at.1].take().expect("a live rank");
            for a in &rank.allocations {
                self.mark_pointer_stale(a.base);
            }
            self.mark_comm_stale(handle);
        }
    }

    fn query(&mut self, sel: CommSel, what: u8, win: BufSel) {
        let handle = self.pick_comm(sel);
        let at = self.locate(handle);
        let null_out = what & 8 != 0;
        let expected = if at.is_none() || null_out {
            vec![INVALID_ARGUMENT]
        } else {
            vec![OK]
        };
        match what % 7 {
            0..=2 => {
                let mut value: c_int = -1;
                let out = if null_out {
                    null_mut()
                } else {
                    &mut value as *mut c_int
                };
                let (name, f): (
                    &str,
                    unsafe extern "C" fn(symmComm_t, *mut c_int) -> symmResult_t,
                ) = match what % 7 {
                    0 => ("symmCommCount", symmCommCount),
                    1 => ("symmCommUserRank", symmCommUserRank),
                    _ => ("symmCommCuDevice", symmCommCuDevice),
                };
                // SAFETY: `out` is NULL or a valid out-pointer.
                let result = self.expect(name, &expected, handle, || unsafe { f(handle, out) });
                if result == OK {
                    let at = at.expect("a live rank");
                    let want = match what % 7 {
                        0 => self.cliques[at.0].nranks() as c_int,
                        1 => at.1 as c_int,
                        _ => 0,
                    };
                    if value != want {
                        self.fail(format!("{name} gave {value}, expected {want}"));
                    }
                }
            }
            3 => {
                let mut name: *const c_char = std::ptr::null();
                let out = if null_out {
                    null_mut()
                } else {
                    &mut name as *mut *const c_char
                };
                // SAFETY: `out` is NULL or a valid out-pointer.
                let result = self.expect("symmCommGetBackend", &expected, handle, || unsafe {
                    symmCommGetBackend(handle, out)
                });
                if result == OK && c_text(name) != "host" {
                    self.fail(format!("backend {:?}", c_text(name)));
                }
            }
            4 => {
                let mut state = symmResult_t::symmInternalError;
                let out = if null_out {
                    null_mut()
                } else {
                    &mut state as *mut symmResult_t
                };
                // SAFETY: `out` is NULL or a valid out-pointer.
                let result = self.expect("symmCommGetAsyncError", &expected, handle, || unsafe {
                    symmCommGetAsyncError(handle, out)
                });
                if result == OK {
                    let at = at.expect("a live rank");
                    let tainted = self.cliques[at.0].tainted;
                    if state == symmResult_t::symmInternalError || (!tainted && state != OK) {
                        self.fail(format!("symmCommGetAsyncError reported {state:?}"));
                    }
                }
            }
            5 => {
                let window = self.pick_window(at, win);
                let expected = match at {
                    None => vec![INVALID_ARGUMENT],
                    Some(_) if null_out => vec![INVALID_ARGUMENT],
                    Some(at) => match self
                        .rank(at)
                        .windows
                        .iter()
                        .find(|w| w.handle == window as usize)
                    {
                        None => vec![INVALID_ARGUMENT],
                        Some(_) if self.cliques[at.0].tainted => vec![OK, INVALID_USAGE],
                        Some(w) if w.complete => vec![OK],
                        Some(_) => vec![INVALID_USAGE],
                    },
                };
                let mut context: *const c_void = std::ptr::null();
                let out = if null_out {
                    null_mut()
                } else {
                    &mut context as *mut *const c_void
                };
                // SAFETY: `out` is NULL or a valid out-pointer.
                let result =
                    self.expect("symmCommGetDeviceContext", &expected, handle, || unsafe {
                        symmCommGetDeviceContext(handle, window, out)
                    });
                if result == OK {
                    self.check_context(at.expect("a live rank"), window, context);
                }
            }
            _ => {
                let text = last_error(handle);
                let _ = text;
            }
        }
    }

    /// A completed window's device context (host memory here) describes the window.
    fn check_context(&self, at: (usize, usize), window: symmWindow_t, context: *const c_void) {
        let w = *self
            .rank(at)
            .windows
            .iter()
            .find(|w| w.handle == window as usize)
            .expect("a window of this rank");
        if context.is_null() {
            self.fail("symmCommGetDeviceContext gave NULL".into());
        }
        // SAFETY: on the host backend the device context is host memory holding a
        // symmDeviceContext, alive while the window is registered.
        let ctx = unsafe { (context as *const symmDeviceContext).read_unaligned() };
        let nranks = self.cliques[at.0].nranks() as u32;
        if ctx.rank != at.1 as u32
            || ctx.world_size != nranks
            || ctx.local_base != w.base
            || ctx.window_size != w.size
        {
            self.fail(format!(
                "device context {ctx:?} does not describe window {w:?}"
            ));
        }
    }

    // ---- collectives ---------------------------------------------------------------------

    /// The model's validation of one rank's collective call: where it reads and writes, or
    /// `None` when it must fail with `symmInvalidArgument`.
    fn validate(&self, at: (usize, usize), call: &Call) -> Option<Checked> {
        let elem = *TYPES.get(usize::try_from(call.dtype).ok()?)?;
        let reduce = match call.kind {
            1 => None,
            _ => Some(numeric::reduce_op(u8::try_from(call.op).ok()?)?),
        };
        let es = elem.size() as u64;
        let nranks = self.cliques[at.0].nranks() as u64;
        let rank = at.1 as u64;
        let bytes = (call.count as u64).checked_mul(es)?;
        let windows = &self.rank(at).windows;
        let find = |address: u64, len: u64| -> Option<Win> {
            if address == 0 {
                return None;
            }
            let w = *windows.iter().find(|w| {
                address >= w.base
                    && address
                        .checked_add(len)
                        .is_some_and(|e| e <= w.base + w.size)
            })?;
            (address - w.base).is_multiple_of(es).then_some(w)
        };
        let overlap = |a: u64, al: u64, b: u64, bl: u64| a < b + bl && b < a + al;
        let (send_len, recv_len, in_place) = match call.kind {
            0 => {
                call.send.checked_add(bytes)?;
                call.recv.checked_add(bytes)?;
                (bytes, bytes, call.send == call.recv)
            }
            1 => {
                call.send.checked_add(bytes)?;
                let total = bytes.checked_mul(nranks)?;
                call.recv.checked_add(total)?;
                (bytes, total, call.send == call.recv + rank * bytes)
            }
            _ => {
                call.recv.checked_add(bytes)?;
                let total = bytes.checked_mul(nranks)?;
                call.send.checked_add(total)?;
                (total, bytes, call.recv == call.send + rank * bytes)
            }
        };
        let send_window = find(call.send, send_len)?;
        let recv_window = find(call.recv, recv_len)?;
        if !in_place && overlap(call.send, send_len, call.recv, recv_len) {
            return None;
        }
        Some(Checked {
            elem,
            reduce,
            bytes,
            total: bytes * if call.kind == 0 { 1 } else { nranks },
            send_seq: send_window.seq,
            recv_seq: recv_window.seq,
        })
    }

    fn issue_collective(
        &self,
        handle: symmComm_t,
        call: &Call,
        expected: &[symmResult_t],
    ) -> symmResult_t {
        let send = call.send as *const c_void;
        let recv = call.recv as *mut c_void;
        let stream = null_mut();
        self.expect(call.kind_name(), expected, handle, || match call.kind {
            0 => symmAllReduce(send, recv, call.count, call.dtype, call.op, handle, stream),
            1 => symmAllGather(send, recv, call.count, call.dtype, handle, stream),
            _ => symmReduceScatter(send, recv, call.count, call.dtype, call.op, handle, stream),
        })
    }

    /// One rank's collective with arbitrary arguments.
    fn single_collective(&mut self, handle: symmComm_t, call: Call) {
        let at = self.locate(handle);
        let checked = at.and_then(|at| self.validate(at, &call));
        let Some(at) = at else {
            self.issue_collective(handle, &call, &[INVALID_ARGUMENT]);
            return;
        };
        let alone = self.cliques[at.0].nranks() == 1;
        let Some(checked) = checked else {
            self.issue_collective(handle, &call, &[INVALID_ARGUMENT]);
            // A refused call is still the rank's call: its peers are out of step with it
            // (outside a group), or the group is refused at its end.
            self.refused_on(at.0, alone);
            return;
        };
        let tainted = self.cliques[at.0].tainted;
        if (call.count == 0 || tainted) && !alone {
            // Numbered on this rank alone, or on a communicator that may have failed.
            self.refused_on(at.0, alone);
        }
        if self.group_depth > 0 {
            if call.count > 0 && !alone && !self.may_block(at.0) {
                return;
            }
            let expected = if tainted { anything() } else { vec![OK] };
            let result = self.issue_collective(handle, &call, &expected);
            if result != OK {
                // Refused (a failed communicator): the group is refused at its end.
                self.refused_on(at.0, alone);
            }
            if result == OK && call.count > 0 {
                self.rank_mut(at).queued += 1;
                self.pending.push(Pending::Collective {
                    clique: at.0,
                    rank: at.1,
                    call,
                    checked,
                    symmetric: alone,
                });
            }
            return;
        }
        if call.count == 0 {
            let expected = if tainted { anything() } else { vec![OK] };
            self.issue_collective(handle, &call, &expected);
            return;
        }
        if tainted || !alone {
            if !self.may_block(at.0) {
                return;
            }
            let expected = if tainted { anything() } else { vec![TIMEOUT] };
            let result = self.issue_collective(handle, &call, &expected);
            if result != OK {
                self.cliques[at.0].tainted = true;
            }
            return;
        }
        // One rank alone: runs now.
        self.fill_inputs(at, &call, &checked);
        let before = self.snapshot();
        let inputs = self.read_inputs(&[(at.1, call, checked)], at.0);
        self.issue_collective(handle, &call, &[OK]);
        self.check_results(at.0, &[(at.1, call, checked)], &inputs, &before);
    }

    /// A collective call on clique `c` that its peers do not match (or a refused call): inside
    /// a group, the group's end is uncertain (a refused call refuses the whole group, on every
    /// clique); outside one, a clique of several ranks is tainted at once.
    fn refused_on(&mut self, c: usize, alone: bool) {
        if self.group_depth > 0 {
            if !self.group_unsure.contains(&c) {
                self.group_unsure.push(c);
            }
        } else if !alone {
            self.cliques[c].tainted = true;
        }
    }

    /// The same collective on every rank of clique `c` (with `variant`'s deviations).
    fn collective_all(
        &mut self,
        c: usize,
        spec: CallSpec,
        whole: (u8, u16),
        share: (u8, u16),
        variant: u8,
    ) {
        let clique = &self.cliques[c];
        let n = clique.nranks();
        let reference = clique.first_alive().expect("a live clique");
        let kind = spec.kind % 3;
        let dtype = raw_enum(spec.dtype);
        let es = usize::try_from(dtype)
            .ok()
            .and_then(|d| TYPES.get(d))
            .map_or(1, |k| k.size() as u64);
        let ref_windows = &self.rank((c, reference)).windows;
        let window_seq = |index: u8| -> Option<u64> {
            (!ref_windows.is_empty()).then(|| ref_windows[index as usize % ref_windows.len()].seq)
        };
        let whole_seq = window_seq(whole.0);
        let share_seq = if share.0 == 0xFF {
            None
        } else {
            window_seq(share.0)
        };
        let whole_offset = whole.1 as u64 * es;
        let share_offset = share.1 as u64 * es;
        let count = if spec.count == 0xFFFC {
            // As many as fit after the offsets.
            let room = |seq: Option<u64>, offset: u64| {
                seq.and_then(|s| ref_windows.iter().find(|w| w.seq == s))
                    .map_or(0, |w| w.size.saturating_sub(offset))
            };
            let whole_room = room(whole_seq, whole_offset) / es;
            let whole_count = if kind == 0 {
                whole_room
            } else {
                whole_room / n as u64
            };
            let share_count = if share.0 == 0xFF {
                whole_count
            } else {
                room(share_seq, share_offset) / es
            };
            whole_count.min(share_count) as usize
        } else {
            count_value(spec.count, 0)
        };
        let mut calls = Vec::new();
        for r in 0..n {
            let Some(rank) = &self.cliques[c].ranks[r] else {
                continue;
            };
            match variant {
                5 if r == n - 1 && n > 1 => continue,
                6 if r != 0 => continue,
                _ => {}
            }
            let base_of = |seq: Option<u64>| {
                seq.and_then(|s| rank.windows.iter().find(|w| w.seq == s))
                    .map_or(0, |w| w.base)
            };
            let deviant = n > 1 && r == 1 % n;
            let kind = if variant == 4 && deviant {
                (kind + 1) % 3
            } else {
                kind
            };
            let count = if variant == 3 && deviant {
                count.wrapping_add(1)
            } else {
                count
            };
            let whole_address = base_of(whole_seq).wrapping_add(whole_offset);
            let bytes = (count as u64).wrapping_mul(es);
            let other = if share.0 == 0xFF {
                None
            } else {
                Some(base_of(share_seq).wrapping_add(share_offset))
            };
            let (send, recv) = match kind {
                0 => (whole_address, other.unwrap_or(whole_address)),
                1 => (
                    other.unwrap_or(whole_address.wrapping_add((r as u64).wrapping_mul(bytes))),
                    whole_address,
                ),
                _ => (
                    whole_address,
                    other.unwrap_or(whole_address.wrapping_add((r as u64).wrapping_mul(bytes))),
                ),
            };
            calls.push((
                r,
                rank.handle,
                Call {
                    kind,
                    dtype,
                    op: raw_enum(spec.op),
                    count,
                    send,
                    recv,
                },
            ));
        }
        let tainted = self.cliques[c].tainted;
        let checked: Vec<Option<Checked>> = calls
            .iter()
            .map(|(r, _, call)| self.validate((c, *r), call))
            .collect();
        // Calls deferred to the group's end; fewer than every rank: the others wait in vain.
        let deferred = calls
            .iter()
            .zip(&checked)
            .filter(|((_, _, call), ch)| ch.is_some() && call.count > 0)
            .count();
        let partial = deferred < n || !self.cliques[c].all_alive();
        if n > 1 && deferred > 0 && (tainted || partial) && !self.may_block(c) {
            return;
        }
        let own_group = self.group_depth == 0;
        if own_group {
            self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
            self.group_depth += 1;
        }
        // Calls the library numbers in ways the model does not follow (counts of 0 beside
        // others, a tainted communicator's calls) or refuses (which refuses the group).
        // A count of 0 is a call too: its signature (kind, type, op) is compared with its
        // peers', so count-0 calls that differ are a mismatch the model does not follow.
        let has_zero = calls.iter().any(|(_, _, call)| call.count == 0);
        let calls_differ = calls.windows(2).any(|pair| {
            let (a, b) = (&pair[0].2, &pair[1].2);
            (a.kind, a.dtype, a.op, a.count) != (b.kind, b.dtype, b.op, b.count)
        });
        // Count-0 calls not every rank makes leave the ranks' call numbers out of step.
        let some_ranks_skip = calls.len() < n || !self.cliques[c].all_alive();
        if (n > 1 && ((has_zero && (calls_differ || some_ranks_skip)) || tainted))
            || checked.iter().any(Option::is_none)
        {
            self.refused_on(c, n == 1);
        }
        for ((r, handle, call), checked) in calls.into_iter().zip(checked) {
            let Some(checked) = checked else {
                self.issue_collective(handle, &call, &[INVALID_ARGUMENT]);
                continue;
            };
            self.fill_inputs((c, r), &call, &checked);
            let expected = if tainted { anything() } else { vec![OK] };
            let result = self.issue_collective(handle, &call, &expected);
            if result != OK {
                // Refused (a failed communicator): the group is refused at its end.
                self.refused_on(c, n == 1);
            }
            if result == OK && call.count > 0 {
                self.rank_mut((c, r)).queued += 1;
                self.pending.push(Pending::Collective {
                    clique: c,
                    rank: r,
                    call,
                    checked,
                    symmetric: true,
                });
            }
        }
        if own_group {
            self.group_end();
        }
    }

    /// Fill a call's input with fresh values of its type.
    fn fill_inputs(&mut self, _at: (usize, usize), call: &Call, checked: &Checked) {
        let (address, len) = input_range(call, checked);
        let n = len as usize / checked.elem.size();
        let mut bytes = vec![0u8; len as usize];
        for i in 0..n {
            let v = self.rng.element(checked.elem);
            checked.elem.set_bits_at(&mut bytes, i, v);
        }
        // SAFETY: the model validated that [address, +len) lies in a live window of this rank
        // (host memory); no collective is running (the harness is the only thread).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), address as *mut u8, bytes.len()) };
    }

    /// Every live allocation's bytes.
    fn snapshot(&self) -> Snapshot {
        self.live_ranks()
            .into_iter()
            .flat_map(|at| {
                self.rank(at).allocations.iter().map(move |a| {
                    // SAFETY: a live allocation of `size` bytes of host memory.
                    let bytes = unsafe { std::slice::from_raw_parts(a.base as *const u8, a.size) };
                    ((at.0, at.1, a.base), bytes.to_vec())
                })
            })
            .collect()
    }

    /// The inputs of the parts of one collective (by rank).
    fn read_inputs(&self, parts: &[(usize, Call, Checked)], _c: usize) -> Vec<Vec<u8>> {
        parts
            .iter()
            .map(|(_, call, checked)| {
                let (address, len) = input_range(call, checked);
                // SAFETY: validated to lie in a live window (host memory).
                unsafe { std::slice::from_raw_parts(address as *const u8, len as usize) }.to_vec()
            })
            .collect()
    }

    /// After one collective of clique `c` ran: every receive buffer against the reference,
    /// and every other byte unchanged since `before`.
    fn check_results(
        &self,
        c: usize,
        parts: &[(usize, Call, Checked)],
        inputs: &[Vec<u8>],
        before: &Snapshot,
    ) {
        let outputs: Vec<(usize, u64, u64)> = parts
            .iter()
            .map(|(r, call, checked)| {
                let len = if call.kind == 1 {
                    checked.total
                } else {
                    checked.bytes
                };
                (*r, call.recv, len)
            })
            .collect();
        self.check_unchanged(c, &outputs, before);
        stats::add(&stats::CHECKED_COLLECTIVES);
        let n = parts.len();
        let (_, first, checked) = parts[0];
        let elem = checked.elem;
        let count = first.count;
        for (i, (r, call, _)) in parts.iter().enumerate() {
            let len = outputs[i].2 as usize;
            // SAFETY: validated to lie in a live window (host memory); the collective is done.
            let got = unsafe { std::slice::from_raw_parts(call.recv as *const u8, len) };
            for e in 0..len / elem.size() {
                let (sources, element): (Vec<u64>, usize) = match call.kind {
                    0 => (inputs.iter().map(|x| elem.bits_at(x, e)).collect(), e),
                    1 => (vec![elem.bits_at(&inputs[e / count], e % count)], e),
                    _ => (
                        inputs
                            .iter()
                            .map(|x| elem.bits_at(x, r * count + e))
                            .collect(),
                        e,
                    ),
                };
                let actual = elem.bits_at(got, element);
                let ok = match (call.kind, elem) {
                    (1, _) => actual == sources[0],
                    (_, Kind::Int { .. }) => {
                        let values: Vec<i128> =
                            sources.iter().map(|b| elem.int_value(*b)).collect();
                        actual == numeric::reduce_int(elem, checked.reduce.expect("an op"), &values)
                    }
                    _ => {
                        let values: Vec<f64> =
                            sources.iter().map(|b| elem.float_value(*b)).collect();
                        let (exact, tolerance) =
                            numeric::reduce_float(elem, checked.reduce.expect("an op"), &values);
                        (elem.float_value(actual) - exact).abs() <= tolerance
                    }
                };
                if !ok {
                    self.fail(format!(
                        "{} of {n} ranks, {count} x {elem:?} {:?}: rank {r} element {e} = {actual:#x}, inputs {sources:x?}",
                        call.kind_name(),
                        checked.reduce
                    ));
                }
            }
        }
        if first.kind == 0 {
            // Every rank holds the same bits.
            let read = |call: &Call| {
                // SAFETY: as above.
                unsafe {
                    std::slice::from_raw_parts(call.recv as *const u8, checked.bytes as usize)
                }
                .to_vec()
            };
            let reference = read(&first);
            for (r, call, _) in &parts[1..] {
                if read(call) != reference {
                    self.fail(format!(
                        "all-reduce results of rank {r} differ from rank {}",
                        parts[0].0
                    ));
                }
            }
        }
    }

    /// Every byte of every allocation outside `outputs` (rank, address, bytes of clique `c`)
    /// is as in `before`.
    fn check_unchanged(&self, c: usize, outputs: &[(usize, u64, u64)], before: &Snapshot) {
        for ((ci, r, base), old) in before {
            let Some(rank) = self.cliques[*ci].ranks[*r].as_ref() else {
                continue;
            };
            if !rank
                .allocations
                .iter()
                .any(|a| a.base == *base && a.size == old.len())
            {
                continue;
            }
            // SAFETY: still a live allocation of this size (host memory).
            let now = unsafe { std::slice::from_raw_parts(*base as *const u8, old.len()) };
            for (i, (a, b)) in old.iter().zip(now).enumerate() {
                let address = base + i as u64;
                let written = *ci == c
                    && outputs.iter().any(|(orank, start, len)| {
                        orank == r && address >= *start && address < start + len
                    });
                if a != b && !written {
                    self.fail(format!(
                        "byte {i} of allocation {base:#x} of clique {ci} rank {r} changed outside \
                         every receive buffer ({a:#x} -> {b:#x})"
                    ));
                }
            }
        }
    }

    // ---- groups --------------------------------------------------------------------------

    fn group_end(&mut self) {
        if self.group_depth == 0 {
            self.expect("symmGroupEnd", &[INVALID_USAGE], null_mut(), || {
                symmGroupEnd()
            });
            return;
        }
        if self.group_depth > 1 {
            self.expect("symmGroupEnd", &[OK], null_mut(), || symmGroupEnd());
            self.group_depth -= 1;
            return;
        }
        self.group_depth = 0;
        let pending = std::mem::take(&mut self.pending);
        let mut codes: Vec<Vec<symmResult_t>> = Vec::new();
        let unsure = std::mem::take(&mut self.group_unsure);
        let group_unsure = !unsure.is_empty();
        let mut uncertain = group_unsure;
        for c in unsure {
            self.cliques[c].tainted = true;
        }

        // Registrations: the k-th of every rank of a clique is one; it completes when every
        // rank deposited its k-th in this group, with the same size.
        let mut registered: Vec<(usize, usize, usize, bool)> = Vec::new();
        for p in &pending {
            let Pending::Register {
                clique,
                rank,
                handle,
                seq,
                size,
                ..
            } = *p
            else {
                continue;
            };
            let cl = &self.cliques[clique];
            if cl.tainted {
                uncertain = true;
                registered.push((clique, rank, handle, false));
                continue;
            }
            let deposits: Vec<(u64, u64)> = pending
                .iter()
                .filter_map(|q| match *q {
                    Pending::Register {
                        clique: qc,
                        seq: qs,
                        size: qsize,
                        base: qbase,
                        ..
                    } if qc == clique && qs == seq => Some((qsize, qbase)),
                    _ => None,
                })
                .collect();
            let code = if deposits.len() < cl.nranks() || !cl.all_alive() {
                if cl.linked {
                    uncertain = true;
                    vec![TIMEOUT, symmResult_t::symmRemoteError]
                } else {
                    vec![TIMEOUT]
                }
            } else if deposits.iter().any(|(s, _)| *s != size)
                || deposits
                    .iter()
                    .any(|(_, b)| !b.is_multiple_of(WINDOW_ALIGNMENT))
            {
                // Sizes that differ, or a base that is not 16-byte aligned on some rank.
                if cl.linked {
                    uncertain = true;
                }
                vec![INVALID_ARGUMENT]
            } else {
                vec![OK]
            };
            registered.push((clique, rank, handle, code == [OK]));
            if code != [OK] {
                codes.push(code);
            }
        }

        // Collectives: the k-th call of every rank of a clique is one.
        let mut instances: Vec<(usize, Vec<&Pending>)> = Vec::new();
        let mut calls_of: std::collections::HashMap<(usize, usize), usize> = Default::default();
        let mut index_of: std::collections::HashMap<(usize, usize), usize> = Default::default();
        for p in &pending {
            let Pending::Collective { clique, rank, .. } = *p else {
                continue;
            };
            let k = calls_of.entry((clique, rank)).or_insert(0);
            let key = (clique, *k);
            *k += 1;
            let i = *index_of.entry(key).or_insert_with(|| {
                instances.push((clique, Vec::new()));
                instances.len() - 1
            });
            instances[i].1.push(p);
        }
        let mut mismatch = false;
        let mut partial_mismatch: Vec<usize> = Vec::new();
        let mut launches: Vec<(usize, bool)> = Vec::new(); // (clique, certain success)
        for (clique, parts) in &instances {
            let cl = &self.cliques[*clique];
            let mut agree = true;
            let mut symmetric = true;
            let mut windows_complete = true;
            let first = match parts[0] {
                Pending::Collective { call, .. } => *call,
                _ => unreachable!(),
            };
            for p in parts {
                let Pending::Collective {
                    call,
                    checked,
                    symmetric: s,
                    rank,
                    ..
                } = p
                else {
                    unreachable!()
                };
                symmetric &= *s;
                agree &= call.kind == first.kind
                    && call.dtype == first.dtype
                    && call.count == first.count
                    && (call.kind == 1 || call.op == first.op);
                for seq in [checked.send_seq, checked.recv_seq] {
                    let complete_now = cl.ranks[*rank]
                        .as_ref()
                        .and_then(|r| r.windows.iter().find(|w| w.seq == seq))
                        .is_some_and(|w| {
                            w.complete
                                || registered.iter().any(|(c, rk, h, ok)| {
                                    c == clique && rk == rank && *h == w.handle && *ok
                                })
                        });
                    windows_complete &= complete_now;
                }
            }
            if cl.tainted || !symmetric {
                uncertain = true;
                continue;
            }
            let full = parts.len() == cl.nranks() && cl.all_alive();
            if !full {
                // If the group is refused (a mismatch), its calls count as refused on these
                // ranks only: out of step.
                partial_mismatch.push(*clique);
            }
            if !agree {
                mismatch = true;
                continue;
            }
            if !windows_complete {
                uncertain = true;
                continue;
            }
            launches.push((*clique, full));
        }
        if mismatch {
            codes.push(vec![INVALID_USAGE]);
        } else {
            for (_, full) in &launches {
                if !full {
                    codes.push(vec![TIMEOUT]);
                }
            }
        }
        let expected = if uncertain {
            anything()
        } else {
            codes.first().cloned().unwrap_or_else(|| vec![OK])
        };

        // Inputs and a snapshot, for a group that runs exactly one collective.
        let single =
            !uncertain && !mismatch && instances.len() == 1 && launches.len() == 1 && launches[0].1;
        let parts: Vec<(usize, Call, Checked)> = if single {
            instances[0]
                .1
                .iter()
                .map(|p| match p {
                    Pending::Collective {
                        rank,
                        call,
                        checked,
                        ..
                    } => (*rank, *call, *checked),
                    _ => unreachable!(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut parts = parts;
        parts.sort_by_key(|p| p.0);
        let inputs = if single {
            self.read_inputs(&parts, instances[0].0)
        } else {
            Vec::new()
        };
        let before = self.snapshot();

        // On a communicator with the short bound, a well-formed group may time out too.
        let fast = pending.iter().any(|p| {
            let (Pending::Register { clique, .. } | Pending::Collective { clique, .. }) = *p;
            !self.cliques[clique].patient
        });
        let mut expected = expected;
        if fast && !expected.contains(&TIMEOUT) {
            expected.push(TIMEOUT);
        }
        let result = self.expect("symmGroupEnd", &expected, null_mut(), || symmGroupEnd());
        let uncertain =
            uncertain || (fast && result == TIMEOUT && !codes.iter().any(|c| c.contains(&TIMEOUT)));

        // The model's state after the group.
        for p in &pending {
            let (Pending::Register { clique, rank, .. } | Pending::Collective { clique, rank, .. }) =
                *p;
            if let Some(r) = self.cliques[clique].ranks[rank].as_mut() {
                r.queued = r.queued.saturating_sub(1);
            }
        }
        for (clique, rank, handle, ok) in registered {
            let tainted = self.cliques[clique].tainted || uncertain;
            let complete = if tainted {
                self.window_is_complete((clique, rank), handle)
            } else {
                ok
            };
            let Some(r) = self.cliques[clique].ranks[rank].as_mut() else {
                continue;
            };
            if complete {
                if let Some(w) = r.windows.iter_mut().find(|w| w.handle == handle) {
                    w.complete = true;
                }
            } else {
                r.windows.retain(|w| w.handle != handle);
                if self.cliques[clique].linked {
                    self.cliques[clique].tainted = true;
                }
            }
        }
        let touched: Vec<usize> = instances.iter().map(|(c, _)| *c).collect();
        if group_unsure || (mismatch && !partial_mismatch.is_empty()) {
            for c in &touched {
                self.cliques[*c].tainted = true;
            }
        }
        if uncertain || result == TIMEOUT || result != OK && !mismatch {
            for c in &touched {
                self.cliques[*c].tainted = true;
            }
        }
        if mismatch || result != OK {
            // Nothing launched (mismatch) or nothing the model can check: no byte of any
            // window may have changed when nothing was launched.
            if mismatch && !uncertain {
                self.check_unchanged(usize::MAX, &[], &before);
            }
            return;
        }
        if single {
            self.check_results(instances[0].0, &parts, &inputs, &before);
        } else {
            // Several collectives: only what none of them writes must be unchanged.
            let mut outputs = Vec::new();
            for (_, parts) in &instances {
                for p in parts {
                    if let Pending::Collective {
                        rank,
                        call,
                        checked,
                        ..
                    } = p
                    {
                        let len = if call.kind == 1 {
                            checked.total
                        } else {
                            checked.bytes
                        };
                        outputs.push((*rank, call.recv, len));
                    }
                }
            }
            if touched.windows(2).all(|w| w[0] == w[1]) {
                let c = touched.first().copied().unwrap_or(usize::MAX);
                self.check_unchanged(c, &outputs, &before);
            }
        }
    }

    /// Ask the library whether a window finished its registration (used where the model does
    /// not know).
    fn window_is_complete(&self, at: (usize, usize), handle: usize) -> bool {
        let Some(rank) = self.cliques[at.0].ranks[at.1].as_ref() else {
            return false;
        };
        let mut context: *const c_void = std::ptr::null();
        // SAFETY: valid out-pointer.
        let result =
            unsafe { symmCommGetDeviceContext(rank.handle, handle as symmWindow_t, &mut context) };
        result == OK
    }

    /// End open groups and destroy every communicator left.
    pub fn finish(&mut self) {
        while self.group_depth > 0 {
            self.log.push("(end of input) GroupEnd".into());
            self.group_end();
        }
        let handles: Vec<symmComm_t> = self
            .live_ranks()
            .into_iter()
            .map(|at| self.rank(at).handle)
            .collect();
        for handle in handles {
            self.log.push("(end of input) Destroy".into());
            self.destroy(handle);
        }
        // Every thread the library started for this input ends: kernels' threads at once,
        // bootstrap roots shortly after their ranks left. (Waiting also keeps LeakSanitizer,
        // which checks right after the input, from seeing the bookkeeping of a thread that is
        // still exiting as a leak.)
        let deadline = Instant::now() + call_bound();
        while thread_count() > self.threads_at_start {
            if Instant::now() > deadline {
                self.fail(format!(
                    "{} threads run after every communicator was destroyed, {} before the input",
                    thread_count(),
                    self.threads_at_start
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Where a call reads its input: (address, bytes).
fn input_range(call: &Call, checked: &Checked) -> (u64, u64) {
    match call.kind {
        0 => (call.send, checked.bytes),
        1 => (call.send, checked.bytes),
        _ => (call.send, checked.total),
    }
}

/// An allocation size: 0xFFFF is `usize::MAX`, 0xFFFE just over the library's limit.
fn alloc_size(raw: u16) -> usize {
    match raw {
        0xFFFF => usize::MAX,
        0xFFFE => isize::MAX as usize - 4095,
        n => n as usize,
    }
}

/// A count: large special values for the top codes (0xFFFC: `fits`).
fn count_value(raw: u16, fits: usize) -> usize {
    match raw {
        0xFFFF => usize::MAX,
        0xFFFE => 1 << 62,
        0xFFFD => usize::MAX / 2 + 1,
        0xFFFC => fits,
        n => n as usize,
    }
}

/// A raw enum value: 0xFF is -1, anything else as is (values past the last are invalid).
fn raw_enum(raw: u8) -> c_int {
    if raw == 0xFF { -1 } else { raw as c_int }
}
