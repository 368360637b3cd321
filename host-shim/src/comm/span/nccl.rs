//! A rail on NCCL: the host API of `libnccl` (loaded at run time, never a build dependency), a
//! communicator of the rail's ranks (one per machine), its calls enqueued on the caller's
//! stream. NCCL compares no arguments; the agreement before every call does (`super::agree`).
//! A rank's failure aborts its rail (`ncclCommAbort`, from whichever thread sees it: NCCL's way
//! to end pending work, and a call another thread has in NCCL, as PyTorch's watchdog uses it).
//! Each call into NCCL is checked against the abort and marked while it runs; the abort waits
//! at most [`ABORT_GRACE`] for a marked call to return (it may wait in NCCL for a peer that
//! failed), then ends it. So no call enters NCCL after the abort, except one whose thread was
//! descheduled for the whole grace between its check and its entry: the race NCCL's own
//! watchdog model has (a communicator made non-blocking and polled would close it).
//! The rails' initialization is blocking: every rank reached it (two all-gathers said so), but
//! a rank that dies between them and `ncclCommInitRank` leaves its rail peers in NCCL.

use crate::error::{Error, Result};
use crate::transport::library::{Library, function, open};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Bytes of `ncclUniqueId`.
const UNIQUE_ID_BYTES: usize = 128;

/// NCCL's `ncclUniqueId`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// Oldest NCCL the rails call: 2.19 (`ncclCommAbort` ending pending work in every mode, and
/// the data types symm's match, float8 aside).
const MIN_VERSION: c_int = 21900;

/// First NCCL with `ncclFloat8e4m3` and `ncclFloat8e5m2`: 2.24.
pub(super) const FLOAT8_VERSION: c_int = 22400;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
/// `ncclGetErrorString`.
pub(crate) type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int;
type Reduction = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type CommCall = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The NCCL functions the rails call.
pub struct Nccl {
    library: Arc<Library>,
    version: c_int,
    error_string: GetErrorString,
    get_unique_id: GetUniqueId,
    init_rank: CommInitRank,
    all_reduce: Reduction,
    reduce_scatter: Reduction,
    broadcast: Broadcast,
    group_start: Group,
    group_end: Group,
    abort: CommCall,
    destroy: CommCall,
}

impl Nccl {
    /// Load NCCL (`SYMM_NCCL_LIBRARY`, else `libnccl.so.2`) and its rail functions.
    pub fn load() -> Result<Nccl> {
        let library = open(
            "NCCL (libnccl.so.2), which carries symm's legs between machines,",
            "libnccl.so.2",
            crate::config::nccl_library(),
            "SYMM_NCCL_LIBRARY",
        )?;
        // SAFETY: each type is the function's signature in nccl.h.
        unsafe {
            let get_version: GetVersion = function(&library, "ncclGetVersion")?;
            let mut version = 0;
            get_version(&mut version);
            if version < MIN_VERSION {
                return Err(Error::unsupported(format!(
                    "{} is NCCL version code {version}: symm's legs between machines need NCCL \
                     2.19 ({MIN_VERSION}) or newer",
                    library.name
                )));
            }
            Ok(Nccl {
                version,
                error_string: function(&library, "ncclGetErrorString")?,
                get_unique_id: function(&library, "ncclGetUniqueId")?,
                init_rank: function(&library, "ncclCommInitRank")?,
                all_reduce: function(&library, "ncclAllReduce")?,
                reduce_scatter: function(&library, "ncclReduceScatter")?,
                broadcast: function(&library, "ncclBroadcast")?,
                group_start: function(&library, "ncclGroupStart")?,
                group_end: function(&library, "ncclGroupEnd")?,
                abort: function(&library, "ncclCommAbort")?,
                destroy: function(&library, "ncclCommDestroy")?,
                library,
            })
        }
    }

    /// `Ok` for `ncclSuccess`, else an error naming `call` and NCCL's description.
    fn check(&self, result: c_int, call: &str) -> Result<()> {
        check_result(
            (self.error_string, &self.library, self.version),
            result,
            call,
        )
    }

    /// A new `ncclUniqueId`, as bytes.
    pub fn unique_id(&self) -> Result<Vec<u8>> {
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: writes one ncclUniqueId.
        self.check(unsafe { (self.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
        Ok(id.internal.iter().map(|&c| c as u8).collect())
    }
}

/// `Ok` for `ncclSuccess`, else an error naming `call`, NCCL's description of `result` (from
/// `error_string` of `library`, NCCL version `version`), the library and its version.
pub(crate) fn check_result(
    (error_string, library, version): (GetErrorString, &Library, c_int),
    result: c_int,
    call: &str,
) -> Result<()> {
    if result == 0 {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns NULL or a static NUL-terminated string.
    let text = unsafe {
        let text = error_string(result);
        if text.is_null() {
            String::from("unknown error")
        } else {
            CStr::from_ptr(text).to_string_lossy().into_owned()
        }
    };
    Err(Error::new(
        crate::abi::symmResult_t::symmSystemError,
        format!(
            "{call} failed with NCCL error {result} ({text}; {} version {version})",
            library.name
        ),
    ))
}

/// How long an abort (or a release) lets a call that is in NCCL return before ending it with
/// `ncclCommAbort`: enqueueing work takes microseconds; a call still in NCCL after this waits
/// there (for a peer, or connecting to one), and once the rank has failed only the abort ends
/// that.
const ABORT_GRACE: Duration = Duration::from_millis(100);

/// A rank's rail on NCCL: its communicator of the rail's ranks.
pub struct NcclRail {
    nccl: Nccl,
    comm: usize,
    /// Whether calls may enter NCCL, and whether one is in it; taken briefly, never across a
    /// call into NCCL.
    state: Mutex<RailState>,
    /// Told when a call leaves NCCL (an abort waiting to end the communicator listens).
    call_left: Condvar,
}

/// What [`NcclRail::state`] guards.
#[derive(Default)]
struct RailState {
    /// Set by the abort or the release: no call enters NCCL after it.
    closed: bool,
    /// A call is between its check against `closed` and its return from NCCL (a rank's calls
    /// are made by one thread at a time: `Comm::enter_call`).
    in_nccl: bool,
}

/// An element type or operator of symm as NCCL's: the C values are NCCL's.
fn as_nccl(value: i32) -> c_int {
    value as c_int
}

impl NcclRail {
    /// Join the rail whose `ncclUniqueId` is `id` as rank `machine` of `machines` (every rank
    /// of the rail reached this call: the formation's all-gather said so).
    pub fn init(nccl: Nccl, id: &[u8], machines: usize, machine: usize) -> Result<NcclRail> {
        let mut unique = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        if id.len() != UNIQUE_ID_BYTES {
            return Err(Error::internal("a rail's ncclUniqueId of the wrong size"));
        }
        for (slot, byte) in unique.internal.iter_mut().zip(id) {
            *slot = *byte as c_char;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id as NCCL made it on the rail's rank 0.
        let result =
            unsafe { (nccl.init_rank)(&mut comm, machines as c_int, unique, machine as c_int) };
        nccl.check(result, "ncclCommInitRank (the rail between machines)")?;
        Ok(NcclRail {
            nccl,
            comm: comm as usize,
            state: Mutex::new(RailState::default()),
            call_left: Condvar::new(),
        })
    }

    fn comm(&self) -> *mut c_void {
        self.comm as *mut c_void
    }

    /// NCCL's version code.
    pub fn version(&self) -> i32 {
        self.nccl.version
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, RailState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Make one call into NCCL, refused once the rail was aborted or released (its
    /// communicator is gone). The call is marked while it runs, so that an abort lets it return
    /// first (within [`ABORT_GRACE`]) instead of ending the communicator under it.
    fn enter<T>(&self, call: impl FnOnce() -> T) -> Result<T> {
        {
            let mut state = self.lock_state();
            if state.closed {
                return Err(Error::new(
                    crate::abi::symmResult_t::symmRemoteError,
                    "the rail between machines was aborted or released (the communicator \
                     failed, or is being destroyed)",
                ));
            }
            state.in_nccl = true;
        }
        let result = call();
        self.lock_state().in_nccl = false;
        self.call_left.notify_all();
        Ok(result)
    }

    /// Close the rail (no call enters NCCL from now on) and wait up to [`ABORT_GRACE`] for a
    /// call in NCCL to return: `None` when it was closed already, else whether a call is still
    /// in NCCL.
    fn close(&self) -> Option<bool> {
        let mut state = self.lock_state();
        if state.closed {
            return None;
        }
        state.closed = true;
        let (state, _) = self
            .call_left
            .wait_timeout_while(state, ABORT_GRACE, |state| state.in_nccl)
            .unwrap_or_else(|e| e.into_inner());
        Some(state.in_nccl)
    }

    fn abort_now(&self) {
        // SAFETY: the rail's communicator, ended once (`close` let one caller through); no
        // call enters NCCL on it any more, and one still in NCCL after the grace is the work
        // `ncclCommAbort` exists to end.
        let _ = unsafe { (self.nccl.abort)(self.comm()) };
    }

    /// All-reduce of `count` elements at `at`, in place, on `stream`.
    pub fn all_reduce(
        &self,
        at: u64,
        count: usize,
        dtype: i32,
        op: i32,
        stream: u64,
    ) -> Result<()> {
        let call = (
            self.nccl.all_reduce,
            "ncclAllReduce (the rail between machines)",
        );
        self.reduction(call, (at, at), count, (dtype, op), stream)
    }

    /// Reduce-scatter: `from` holds a block of `count` elements per machine; block `machine`
    /// of every machine, reduced, lands at `to`.
    pub fn reduce_scatter(
        &self,
        ends: (u64, u64),
        count: usize,
        dtype: i32,
        op: i32,
        stream: u64,
    ) -> Result<()> {
        let call = (
            self.nccl.reduce_scatter,
            "ncclReduceScatter (the rail between machines)",
        );
        self.reduction(call, ends, count, (dtype, op), stream)
    }

    /// One reduction call `(function, name)` of NCCL from `from` to `to`, on `stream`.
    fn reduction(
        &self,
        (function, name): (Reduction, &str),
        (from, to): (u64, u64),
        count: usize,
        (dtype, op): (i32, i32),
        stream: u64,
    ) -> Result<()> {
        // SAFETY: both buffers hold what the call reads and writes on this rank's device until
        // the stream ran it; the communicator is live (not aborted: `enter`).
        let result = self.enter(|| unsafe {
            function(
                from as *const c_void,
                to as *mut c_void,
                count,
                as_nccl(dtype),
                as_nccl(op),
                self.comm(),
                stream as *mut c_void,
            )
        })?;
        self.nccl.check(result, name)
    }

    /// Broadcasts of `count` elements, one per `(root, from, to)` (`from` read on the root),
    /// in one NCCL group. Each call into NCCL is checked against an abort: after one, no leg
    /// and not the group's end enter NCCL (the group's operations went with the aborted
    /// communicator).
    pub fn broadcasts(
        &self,
        legs: &[(usize, u64, u64)],
        count: usize,
        dtype: i32,
        stream: u64,
    ) -> Result<()> {
        // SAFETY: no arguments.
        let started = self.enter(|| unsafe { (self.nccl.group_start)() })?;
        self.nccl.check(started, "ncclGroupStart")?;
        let mut first_error = Ok(());
        for &(root, from, to) in legs {
            // SAFETY: as in `all_reduce`, for both buffers; the communicator is live (`enter`).
            let result = self.enter(|| unsafe {
                (self.nccl.broadcast)(
                    from as *const c_void,
                    to as *mut c_void,
                    count,
                    as_nccl(dtype),
                    root as c_int,
                    self.comm(),
                    stream as *mut c_void,
                )
            });
            let result = result.and_then(|result| {
                self.nccl
                    .check(result, "ncclBroadcast (the rail between machines)")
            });
            if result.is_err() {
                first_error = result;
                break;
            }
        }
        // SAFETY: closes the group opened above, unless the rail was aborted meanwhile.
        let ended = self.enter(|| unsafe { (self.nccl.group_end)() })?;
        let ended = self.nccl.check(ended, "ncclGroupEnd");
        first_error.and(ended)
    }

    /// End the rail's pending work, a call another thread has in NCCL included, and refuse
    /// its later calls (`ncclCommAbort`); once.
    pub fn abort(&self) {
        if self.close().is_some() {
            self.abort_now();
        }
    }

    /// Release the rail after a clean teardown (`ncclCommDestroy`; a failed one was aborted).
    /// A call another thread still has in NCCL after the grace (a misuse: the rank is being
    /// destroyed) is ended by an abort instead of a destroy under it.
    pub fn release(&self) {
        match self.close() {
            None => {}
            Some(true) => self.abort_now(),
            Some(false) => {
                // SAFETY: the rail's communicator, destroyed once (`close` let one caller
                // through), with no call in NCCL and none entering it any more.
                let _ = unsafe { (self.nccl.destroy)(self.comm()) };
            }
        }
    }
}

impl Drop for NcclRail {
    fn drop(&mut self) {
        // Not released by a teardown: its rank may have pending work no peer completes.
        self.abort();
    }
}
