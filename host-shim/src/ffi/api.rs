//! The exported C functions. Each one validates every argument, catches any panic, records a
//! message for `symmGetLastError`, and returns a `symmResult_t`; nothing unwinds into C.
//! Bad input returns an error before any memory is touched.

#![allow(non_snake_case)]

use crate::abi::*;
use crate::comm::{self, Comm, split, windows};
use crate::error::{Error, Result, set_thread_last_error, thread_last_error};
use crate::group;
use crate::group::entry::{CollectiveArgs, all_to_all_v_call, collective_call};
use crate::plan::Collective;
use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// Run `body`, turning errors and panics into a `symmResult_t` and a recorded message.
fn guard(
    function: &str,
    comm: Option<&Arc<Comm>>,
    body: impl FnOnce() -> Result<()>,
) -> symmResult_t {
    let result = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        Err(Error::internal(format!("internal panic: {what}")))
    });
    match result {
        Ok(()) => symmResult_t::symmSuccess,
        Err(error) => {
            let error = error.in_function(function);
            set_thread_last_error(&error.message);
            if let Some(comm) = comm {
                comm.set_last_error(&error.message);
            }
            error.code
        }
    }
}

/// Calls that a communicator whose ranks span machines makes on its machine's communicator
/// (its windows and memory are the machine's).
const MACHINE_CALLS: [&str; 5] = [
    "symmMemAlloc",
    "symmMemFree",
    "symmCommWindowRegister",
    "symmCommWindowDeregister",
    "symmCommGetAsyncError",
];

/// Calls that a communicator whose ranks span machines refuses.
const NOT_ACROSS_MACHINES: [&str; 8] = [
    "symmCommSplit",
    "symmCommShrink",
    "symmCommRevoke",
    "symmCommWindowRegisterPeers",
    "symmCommWindowRegisterNccl",
    "symmCommWindowRegisterNvshmem",
    "symmWindowSignalPadBytes",
    "symmCommGetDeviceContext",
];

/// Look `comm` up, then run `body` under [`guard`] (on a communicator spanning machines:
/// on its machine's communicator for [`MACHINE_CALLS`], refused for
/// [`NOT_ACROSS_MACHINES`]).
fn with_comm(
    function: &str,
    comm: symmComm_t,
    body: impl FnOnce(&Arc<Comm>) -> Result<()>,
) -> symmResult_t {
    match Comm::from_handle(comm) {
        Ok(c) if c.span.get().is_some() && MACHINE_CALLS.contains(&function) => {
            guard(function, Some(&c), || {
                body(&c.machine()).map_err(|e| match c.span.get() {
                    Some(span) => span.on_machine(e),
                    None => e,
                })
            })
        }
        Ok(c) if c.span.get().is_some() && NOT_ACROSS_MACHINES.contains(&function) => {
            guard(function, Some(&c), || {
                Err(crate::comm::span::unsupported(function))
            })
        }
        Ok(c) => guard(function, Some(&c), || body(&c)),
        Err(e) => guard(function, None, || Err(e)),
    }
}

/// Write `value` through `out`, which must be non-NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
unsafe fn write_out<T>(out: *mut T, name: &str, value: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Check that `out` is non-NULL before any work is done.
fn require_out<T>(out: *mut T, name: &str) -> Result<()> {
    if out.is_null() {
        Err(Error::invalid_argument(format!("{name} is NULL")))
    } else {
        Ok(())
    }
}

/// The library version: `major * 10000 + minor * 100 + patch`.
///
/// # Safety
/// `version` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmGetVersion(version: *mut c_int) -> symmResult_t {
    // SAFETY: forwarded contract.
    guard("symmGetVersion", None, || unsafe {
        write_out(version, "version", SYMM_VERSION_CODE)
    })
}

/// A static description of `result`; never NULL, also for unknown codes.
#[unsafe(no_mangle)]
pub extern "C" fn symmGetErrorString(result: symmResultRaw) -> *const c_char {
    match symmResult_t::from_raw(result) {
        Some(r) => r.description().as_ptr(),
        None => c"unknown symmResult_t value".as_ptr(),
    }
}

/// The message of the last failed call on `comm`, or of the calling thread when `comm` is
/// NULL. Never NULL; valid until the next failing call on that comm or thread.
#[unsafe(no_mangle)]
pub extern "C" fn symmGetLastError(comm: symmComm_t) -> *const c_char {
    if comm.is_null() {
        return thread_last_error();
    }
    match Comm::from_handle(comm) {
        Ok(c) => c.last_error(),
        Err(_) => c"comm is not a live communicator".as_ptr(),
    }
}

/// Make a new unique id for `symmCommInitRank`: starts the bootstrap root in this process
/// (with `SYMM_COMM_ID` set: the id of that address, whose root rank 0 opens).
///
/// # Safety
/// `uniqueId` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmGetUniqueId(uniqueId: *mut symmUniqueId) -> symmResult_t {
    // SAFETY: forwarded contract.
    guard("symmGetUniqueId", None, || {
        require_out(uniqueId, "uniqueId")?;
        let id = comm::new_unique_id()?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(uniqueId, "uniqueId", id) }
    })
}

/// Create rank `rank` of an `nranks`-rank communicator named by `commId`. Collective: returns
/// once every rank has joined (one thread or process per rank, any mix), or `symmTimeout`.
///
/// # Safety
/// `comm` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommInitRank(
    comm: *mut symmComm_t,
    nranks: c_int,
    commId: symmUniqueId,
    rank: c_int,
) -> symmResult_t {
    guard("symmCommInitRank", None, || {
        require_out(comm, "comm")?;
        if group::active() {
            // It returns only when every rank joined, so one thread cannot join several.
            return Err(Error::invalid_usage(
                "symmCommInitRank inside symmGroupStart/symmGroupEnd: it blocks until every \
                 rank joined, so one thread cannot join several ranks; call it from one thread \
                 per rank, or use symmCommInitAll",
            ));
        }
        let created = comm::init_rank(nranks, &commId, rank)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(comm, "comm", created.handle()) }
    })
}

/// Join the communicator a launcher describes in the environment, as `torch.distributed`'s
/// `env://` does (torchrun, `mpirun` with the variables exported, Slurm scripts): the rank from
/// `RANK` (else `SYMM_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`), the number of ranks from
/// `WORLD_SIZE` (else `SYMM_WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`), the bootstrap root
/// at `SYMM_COMM_ID` (`host:port`) when set, else at `MASTER_ADDR`, port `MASTER_PORT + 1`
/// (torchrun's own store has `MASTER_PORT`), which rank 0 opens; the secret from
/// `SYMM_COMM_SECRET` (without it, anyone who reaches the address can join). The device is
/// the current one, as for `symmCommInitRank`. Collective, like `symmCommInitRank`.
///
/// `environ` is NULL (this process's environment) or a NULL-terminated array of `NAME=value`
/// strings (as `execve` takes) to read those variables from instead; the other `SYMM_*`
/// settings come from the process's environment either way. An error names the variable that
/// is missing or malformed.
///
/// # Safety
/// `comm` is NULL or valid for a write; `environ` is NULL or a NULL-terminated array of
/// pointers to NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommInitFromEnv(
    comm: *mut symmComm_t,
    environ: *const *const c_char,
) -> symmResult_t {
    guard("symmCommInitFromEnv", None, || {
        require_out(comm, "comm")?;
        if group::active() {
            return Err(Error::invalid_usage(
                "symmCommInitFromEnv inside symmGroupStart/symmGroupEnd: it blocks until every \
                 rank joined, so one thread cannot join several ranks",
            ));
        }
        let launcher = if environ.is_null() {
            crate::config::launcher()?
        } else {
            // SAFETY: a NULL-terminated array of C strings by the caller's contract.
            let vars = unsafe { environment_entries(environ) }?;
            crate::config::parse_launcher_pairs(&vars)?
        };
        let created = comm::init_from_launcher(&launcher)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(comm, "comm", created.handle()) }
    })
}

/// Most entries of an `environ` array read before its NULL.
const MAX_ENVIRON_ENTRIES: usize = 1 << 16;

/// The `NAME=value` entries of a NULL-terminated `environ` array (an entry without `=` names
/// no variable, as for `getenv`, and is skipped; of two entries with one name the later wins).
///
/// # Safety
/// `environ` is a NULL-terminated array of pointers to NUL-terminated strings.
unsafe fn environment_entries(environ: *const *const c_char) -> Result<Vec<(String, String)>> {
    let mut entries = Vec::new();
    for index in 0..MAX_ENVIRON_ENTRIES {
        // SAFETY: every entry up to the terminating NULL is readable (caller's contract), and
        // the loop stops at the NULL.
        let entry = unsafe { *environ.add(index) };
        if entry.is_null() {
            return Ok(entries);
        }
        // SAFETY: a NUL-terminated string by the caller's contract.
        let text = unsafe { std::ffi::CStr::from_ptr(entry) };
        let text = text
            .to_str()
            .map_err(|_| Error::invalid_argument(format!("environ[{index}] is not UTF-8")))?;
        if let Some((name, value)) = text.split_once('=') {
            entries.push((name.to_string(), value.to_string()));
        }
    }
    Err(Error::invalid_argument(format!(
        "environ has no NULL terminator within {MAX_ENVIRON_ENTRIES} entries"
    )))
}

/// Create `ndev` ranks in this process, rank `i` on device `devlist[i]` (devices may repeat,
/// to place several ranks on one GPU; NULL means devices 0..ndev-1).
///
/// # Safety
/// `comms` is NULL or valid for `ndev` writes; `devlist` is NULL or valid for `ndev` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommInitAll(
    comms: *mut symmComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> symmResult_t {
    guard("symmCommInitAll", None, || {
        require_out(comms, "comms")?;
        if ndev <= 0 {
            return Err(Error::invalid_argument(format!(
                "ndev = {ndev}: must be at least 1"
            )));
        }
        let devices: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: non-NULL and valid for ndev reads by the caller's contract.
            unsafe { std::slice::from_raw_parts(devlist, ndev as usize) }.to_vec()
        };
        let created = comm::init_all(&devices)?;
        for (i, c) in created.iter().enumerate() {
            // SAFETY: valid for ndev writes by the caller's contract.
            unsafe { comms.add(i).write(c.handle()) };
        }
        Ok(())
    })
}

/// Destroy a communicator: frees its windows and any memory still allocated through it.
#[unsafe(no_mangle)]
pub extern "C" fn symmCommDestroy(comm: symmComm_t) -> symmResult_t {
    with_comm("symmCommDestroy", comm, comm::destroy)
}

/// Abort `comm`: the communicator fails on every rank, naming this rank's abort (every rank's
/// pending collectives end promptly and its later calls fail with the cause), then everything
/// this rank owns is freed and `comm` is no longer valid, as after `symmCommDestroy`. May be
/// called from any thread, also while another thread's call on `comm` waits for a peer that
/// hangs: that call returns an error first. Refused (`symmInvalidUsage`) while the calling
/// thread's open group holds calls of `comm`.
#[unsafe(no_mangle)]
pub extern "C" fn symmCommAbort(comm: symmComm_t) -> symmResult_t {
    match Comm::from_handle(comm) {
        // Not `with_comm`'s error bookkeeping on the communicator it frees.
        Ok(c) => guard("symmCommAbort", None, || comm::abort(&c)),
        Err(e) => guard("symmCommAbort", None, || Err(e)),
    }
}

/// Split `comm` into new communicators: every rank of `comm` calls it; the ranks that pass
/// one `color` form one new communicator, ranked by `key` (ties by their rank in `comm`), and
/// `*newcomm` is set to this rank's (NULL for `SYMM_SPLIT_NOCOLOR` or on failure). A call
/// refused for its arguments still tells the other ranks, whose calls then fail at once
/// naming it. `config` NULL: the new
/// communicators inherit `comm`'s settings. Inside symmGroupStart/symmGroupEnd (one thread
/// driving several ranks) the splits run at the group's end, which sets every `*newcomm`.
///
/// # Safety
/// `newcomm` is NULL or valid for a write (inside a group: until the group's end); `config`
/// is NULL or points to a `symmConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommSplit(
    comm: symmComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut symmComm_t,
    config: *const symmConfig_t,
) -> symmResult_t {
    with_comm("symmCommSplit", comm, |c| {
        // A refused call still takes part in the split's exchange: every rank then fails at
        // once, naming this one, instead of waiting for it.
        let request = require_out(newcomm, "newcomm")
            .and_then(|()| split::check_color(color))
            // SAFETY: NULL or a valid symmConfig_t by the caller's contract.
            .and_then(|()| split::Config::from_c(unsafe { config.as_ref() }))
            .map(|config| (color, key, config));
        if group::active() {
            let refusal = request.as_ref().err().cloned();
            group::defer(group::Deferred::Split(group::Split {
                comm: c.clone(),
                number: split::take_number(c),
                request,
                out: group::SplitOut(newcomm),
            }));
            return refusal.map_or(Ok(()), Err);
        }
        let made = split::split(c, request);
        if !newcomm.is_null() {
            let handle = match &made {
                Ok(Some(m)) => m.handle(),
                _ => std::ptr::null_mut(),
            };
            // SAFETY: non-NULL; valid for writes by the caller's contract.
            unsafe { newcomm.write(handle) };
        }
        made.map(|_| ())
    })
}

/// Shrink `comm` to the ranks not in `excludeRanksList` (NCCL's `ncclCommShrink`): only those
/// ranks call it, each with the same list; `*newcomm` is set to this rank's rank of the new
/// communicator, ranked in `comm`'s order. It does not need `comm`'s bootstrap root (whose
/// process may be the one lost). `shrinkFlags`: `SYMM_SHRINK_DEFAULT`, or `SYMM_SHRINK_ABORT`
/// to revoke `comm` first (its in-flight work ends on every rank). This rank's `symmMemAlloc`
/// allocations move to the new communicator: register the same memory, with its data, there
/// (and free it there). `config` NULL: `comm`'s settings. Inside symmGroupStart/symmGroupEnd
/// the shrinks run at the group's end, which sets every `*newcomm`.
///
/// # Safety
/// `excludeRanksList` is valid for `excludeRanksCount` reads (NULL when it is 0); `newcomm` is
/// NULL or valid for a write (inside a group: until the group's end); `config` is NULL or
/// points to a `symmConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommShrink(
    comm: symmComm_t,
    excludeRanksList: *const c_int,
    excludeRanksCount: c_int,
    newcomm: *mut symmComm_t,
    config: *const symmConfig_t,
    shrinkFlags: c_int,
) -> symmResult_t {
    with_comm("symmCommShrink", comm, |c| {
        require_out(newcomm, "newcomm")?;
        if excludeRanksCount < 0 {
            return Err(Error::invalid_argument(format!(
                "excludeRanksCount = {excludeRanksCount}: must be >= 0"
            )));
        }
        if excludeRanksCount > 0 && excludeRanksList.is_null() {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList is NULL with excludeRanksCount = {excludeRanksCount}"
            )));
        }
        let exclude = if excludeRanksCount == 0 {
            Vec::new()
        } else {
            // SAFETY: non-NULL and valid for excludeRanksCount reads by the caller's contract.
            unsafe { std::slice::from_raw_parts(excludeRanksList, excludeRanksCount as usize) }
                .to_vec()
        };
        comm::shrink::check_flags(shrinkFlags)?;
        comm::shrink::survivors(c.clique.nranks, &exclude)?;
        // SAFETY: NULL or a valid symmConfig_t by the caller's contract.
        let config = split::Config::from_c(unsafe { config.as_ref() })?;
        // Numbered now, whatever happens to the call, so that the survivors' next shrinks
        // with this list pair up.
        let number = comm::shrink::take_number(c, &exclude);
        let request = comm::shrink::Request {
            exclude,
            number,
            config,
            flags: shrinkFlags,
        };
        if group::active() {
            group::defer(group::Deferred::Shrink(group::Shrink {
                comm: c.clone(),
                request,
                out: group::SplitOut(newcomm),
            }));
            return Ok(());
        }
        c.refuse_if_queued_in_group("symmCommShrink")?;
        let made = comm::shrink::shrink(c, &request, false);
        let handle = match &made {
            Ok(m) => m.handle(),
            Err(_) => std::ptr::null_mut(),
        };
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { newcomm.write(handle) };
        made.map(|_| ())
    })
}

/// Revoke `comm` (NCCL's `ncclCommRevoke`): its work stops on every rank, and its later
/// collectives are refused (`symmInvalidUsage` on this rank, `symmRemoteError` naming the
/// revoke on a peer until it revokes too); `symmCommSplit`, deregistration, `symmMemFree` and
/// `symmCommDestroy` remain. Returns once this rank's work has ended. `revokeFlags` must be
/// `SYMM_REVOKE_DEFAULT`. May be called from another thread while a call of this rank waits.
#[unsafe(no_mangle)]
pub extern "C" fn symmCommRevoke(comm: symmComm_t, revokeFlags: c_int) -> symmResult_t {
    with_comm("symmCommRevoke", comm, |c| comm::revoke(c, revokeFlags))
}

/// Finalize `comm`: wait until every collective this rank enqueued has completed, then refuse
/// later collectives and registrations (`symmInvalidUsage`); `symmCommDestroy` frees it.
/// Returns the communicator's failure, if it failed.
#[unsafe(no_mangle)]
pub extern "C" fn symmCommFinalize(comm: symmComm_t) -> symmResult_t {
    with_comm("symmCommFinalize", comm, comm::finalize)
}

/// Number of ranks of `comm`.
///
/// # Safety
/// `count` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommCount(comm: symmComm_t, count: *mut c_int) -> symmResult_t {
    with_comm("symmCommCount", comm, |c| {
        // SAFETY: forwarded contract.
        unsafe { write_out(count, "count", c.clique.nranks as c_int) }
    })
}

/// Rank of `comm`.
///
/// # Safety
/// `rank` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommUserRank(comm: symmComm_t, rank: *mut c_int) -> symmResult_t {
    with_comm("symmCommUserRank", comm, |c| {
        // SAFETY: forwarded contract.
        unsafe { write_out(rank, "rank", c.rank as c_int) }
    })
}

/// CUDA device of `comm`.
///
/// # Safety
/// `device` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommCuDevice(comm: symmComm_t, device: *mut c_int) -> symmResult_t {
    with_comm("symmCommCuDevice", comm, |c| {
        // SAFETY: forwarded contract.
        unsafe { write_out(device, "device", c.device) }
    })
}

/// The name of `comm`'s backend (\"cuda\" or \"host\"), a static string. An extension of
/// ABI v0, for programs that must know where symmMemAlloc memory lives.
///
/// # Safety
/// `name` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommGetBackend(
    comm: symmComm_t,
    name: *mut *const c_char,
) -> symmResult_t {
    with_comm("symmCommGetBackend", comm, |c| {
        let backend: &'static std::ffi::CStr = match c.clique.backend.kind() {
            crate::backend::BackendKind::Cuda => c"cuda",
            crate::backend::BackendKind::Host => c"host",
            crate::backend::BackendKind::Model => c"model",
        };
        // SAFETY: forwarded contract.
        unsafe { write_out(name, "name", backend.as_ptr()) }
    })
}

/// Allocate `size` bytes usable in a symmetric window of `comm` (device memory; host memory
/// on the host backend).
///
/// # Safety
/// `ptr` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmMemAlloc(
    comm: symmComm_t,
    ptr: *mut *mut c_void,
    size: usize,
) -> symmResult_t {
    with_comm("symmMemAlloc", comm, |c| {
        require_out(ptr, "ptr")?;
        if size == 0 {
            return Err(Error::invalid_argument("size is 0"));
        }
        if size > isize::MAX as usize - 4096 {
            return Err(Error::invalid_argument(format!(
                "size = {size} is too large"
            )));
        }
        let address = c.mem_alloc(size)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(ptr, "ptr", address as *mut c_void) }
    })
}

/// Free memory from `symmMemAlloc` on the same comm. Deregister its windows first.
#[unsafe(no_mangle)]
pub extern "C" fn symmMemFree(comm: symmComm_t, ptr: *mut c_void) -> symmResult_t {
    with_comm("symmMemFree", comm, |c| {
        c.refuse_if_queued_in_group("symmMemFree")?;
        let address = ptr as u64;
        if ptr.is_null() {
            return Err(Error::invalid_argument("ptr is NULL"));
        }
        let state = c.lock();
        let Some(size) = state.allocations.get(&address).map(|a| a.size) else {
            return Err(Error::invalid_argument(
                "ptr was not returned by symmMemAlloc on this comm, or was already freed",
            ));
        };
        if state
            .windows
            .values()
            .any(|w| w.overlaps(address, size as u64))
        {
            return Err(Error::invalid_usage(
                "ptr is still registered in a window: call symmCommWindowDeregister first",
            ));
        }
        drop(state);
        if let Some((rank, base)) = comm::window_covering(address, size as u64) {
            return Err(Error::invalid_usage(format!(
                "ptr is still registered in a window (at {base:#x}) of rank {rank} of another \
                 communicator (the parent of the symmCommShrink that moved it here): \
                 deregister that window first"
            )));
        }
        c.mem_free(address)
    })
}

/// Register `[buff, buff + size)`, inside one `symmMemAlloc` allocation, as a window on every
/// rank (collective; inside a group when one thread drives several ranks). `buff` must be
/// 16-byte aligned on every rank (the kernels access windows 16 bytes at a time; `size` may be
/// any number of bytes): a rank whose `buff` is not fails the registration on every rank with
/// `symmInvalidArgument`, once every rank registered (at `symmGroupEnd` inside a group).
///
/// # Safety
/// `win` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommWindowRegister(
    comm: symmComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut symmWindow_t,
    winFlags: c_int,
) -> symmResult_t {
    with_comm("symmCommWindowRegister", comm, |c| {
        require_out(win, "win")?;
        let window = group::register_window(c, buff as u64, size, winFlags)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(win, "win", window.handle()) }
    })
}

/// Register another library's symmetric memory as a window on every rank (collective, as
/// `symmCommWindowRegister`; inside a group when one thread drives several ranks): PyTorch's
/// symmetric memory, an NCCL or NVSHMEM window read by the caller, or the caller's own mapping
/// of every rank's memory. `desc` says where this process addresses every rank's bytes and
/// signal pad (start from `SYMM_PEER_WINDOW_INITIALIZER`); every peer must be reachable by
/// loads and stores. symm's collectives and device functions then run on the window as on its
/// own; its barriers use the signal pads, which must be memory of the same owner that nothing
/// else uses (never PyTorch's own signal pads, which must return to zero after each use). Every
/// rank's window has the same `bytes`, `owner` and `ownerOffset`, and 16-byte aligned bases and
/// pads: a rank whose description differs fails the registration on every rank. The owner's
/// memory must outlive the window: deregister it before the owner frees or unmaps it.
///
/// # Safety
/// `desc` is NULL or a valid description whose tables are NULL or hold `nranks` entries;
/// `win` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommWindowRegisterPeers(
    comm: symmComm_t,
    desc: *const symmPeerWindow_t,
    win: *mut symmWindow_t,
) -> symmResult_t {
    with_comm("symmCommWindowRegisterPeers", comm, |c| {
        require_out(win, "win")?;
        // SAFETY: NULL or a valid description whose tables hold nranks entries (contract).
        let peers = unsafe { peer_window(c, desc) }?;
        let window = group::register_peer_window(c, peers)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(win, "win", window.handle()) }
    })
}

/// Register `bytes` bytes at `offset` of an NCCL window (`ncclCommWindowRegister` with
/// `NCCL_WIN_COLL_SYMMETRIC`, NCCL 2.29 or newer) as a symm window on every rank: symm's
/// collectives and device functions then run on the NCCL window's memory. `ncclComm` is the
/// NCCL communicator the window belongs to; its rank `r` must be this communicator's rank `r`.
/// NCCL is loaded at run time (the one the process loaded already, else `SYMM_NCCL_LIBRARY`, else
/// `libnccl.so.2`). When the NCCL communicator's ranks are all in one load/store team every
/// peer is reached by loads and stores; when they span several (NVLink domains), with NCCL
/// 2.32.3 or newer, the window is an engine window (context `backend` 2) for Triton device
/// functions linked with NCCL's device bitcode, which reach the other teams through NCCL's GIN:
/// the call then makes the communicator's `ncclDevComm` (collective) and refuses an NCCL
/// without GIN. Before 2.32.3 a peer NCCL gives no address for is refused, naming it. Every
/// rank prepares what it can alone first, and no rank enters NCCL's collective calls unless
/// every rank's preparation worked (a rank that failed is named on every rank at once). The
/// window's signal pads are a small `ncclMemAlloc` allocation registered as an NCCL window of
/// its own, so the call is collective over the NCCL communicator too: every rank calls it from
/// a thread or process of its own, outside a group; and deregistration
/// (`symmCommWindowDeregister`, on every rank) deregisters and frees them (and destroys the
/// device communicator). `offset` must be the same on every rank; the NCCL window must outlive
/// the symm window.
///
/// # Safety
/// `ncclComm` and `ncclWindow` are NULL or NCCL's handles; `win` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommWindowRegisterNccl(
    comm: symmComm_t,
    ncclComm: *mut c_void,
    ncclWindow: *mut c_void,
    offset: usize,
    bytes: usize,
    win: *mut symmWindow_t,
) -> symmResult_t {
    with_comm("symmCommWindowRegisterNccl", comm, |c| {
        require_out(win, "win")?;
        let window = crate::engine::nccl::register(c, ncclComm, ncclWindow, offset, bytes)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(win, "win", window.handle()) }
    })
}

/// Register `bytes` bytes at the symmetric address `symAddr` of NVSHMEM's heap (from
/// `nvshmem_malloc`) as a symm window on every rank, in a job whose PE `r` is this
/// communicator's rank `r`: symm's collectives and device functions then run on NVSHMEM's
/// memory. NVSHMEM is loaded at run time (the one the process loaded already, else
/// `SYMM_NVSHMEM_LIBRARY`, else `libnvshmem_host.so.3`) and must be initialized. When some rank
/// has a PE `nvshmem_ptr` gives no address for (another machine), the window is an NVSHMEM
/// engine window on every rank (device context `backend` 1): symm's collectives refuse it, and
/// only device functions linked with NVSHMEM's device bitcode run on it, reaching every peer
/// through NVSHMEM. The window's signal pads are a small `nvshmem_malloc` allocation, so the call is
/// collective over the job: every PE calls it, outside a group; deregistration (on every rank)
/// frees them with `nvshmem_free`. `symAddr` must be the same symmetric address on every rank.
///
/// # Safety
/// `symAddr` is NULL or a symmetric address of NVSHMEM's heap with `bytes` bytes; `win` is NULL
/// or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommWindowRegisterNvshmem(
    comm: symmComm_t,
    symAddr: *mut c_void,
    bytes: usize,
    win: *mut symmWindow_t,
) -> symmResult_t {
    with_comm("symmCommWindowRegisterNvshmem", comm, |c| {
        require_out(win, "win")?;
        let window = crate::engine::nvshmem::register(c, symAddr, bytes)?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(win, "win", window.handle()) }
    })
}

/// The bytes of each signal pad a window of `comm` needs (`symmPeerWindow_t::signalPadBytes`
/// at least): it grows with the number of ranks.
///
/// # Safety
/// `bytes` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmWindowSignalPadBytes(
    comm: symmComm_t,
    bytes: *mut usize,
) -> symmResult_t {
    with_comm("symmWindowSignalPadBytes", comm, |c| {
        require_out(bytes, "bytes")?;
        let needed = symm_device::sync::signal_pad::signal_pad_bytes(c.clique.nranks);
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(bytes, "bytes", needed) }
    })
}

/// The window `desc` describes, its fields checked one by one.
///
/// # Safety
/// As for [`symmCommWindowRegisterPeers`].
unsafe fn peer_window(
    comm: &Comm,
    desc: *const symmPeerWindow_t,
) -> Result<crate::window::owner::PeerWindow> {
    use crate::window::owner::{Owner, OwnerKind, PeerView, PeerWindow};
    if desc.is_null() {
        return Err(Error::invalid_argument("desc is NULL"));
    }
    // SAFETY: non-NULL; the caller passes a valid description. Its leading size is read
    // first, so that a shorter struct is refused before the rest is read.
    let size = unsafe { std::ptr::addr_of!((*desc).size).read_unaligned() };
    if size != std::mem::size_of::<symmPeerWindow_t>() {
        return Err(Error::invalid_argument(format!(
            "desc->size = {size}: desc was not made with SYMM_PEER_WINDOW_INITIALIZER (this \
             library's symmPeerWindow_t has {} bytes)",
            std::mem::size_of::<symmPeerWindow_t>()
        )));
    }
    // SAFETY: as above, and the size matches.
    let d = unsafe { desc.read_unaligned() };
    if d.magic != SYMM_PEER_WINDOW_MAGIC {
        return Err(Error::invalid_argument(
            "desc->magic is wrong: desc was not made with SYMM_PEER_WINDOW_INITIALIZER",
        ));
    }
    let kind = OwnerKind::from_abi(d.owner).ok_or_else(|| {
        Error::invalid_argument(format!("desc->owner = {}: not a symmOwner_t", d.owner))
    })?;
    let nranks = comm.clique.nranks;
    let table = |pointer: *const *mut c_void, name: &str| -> Result<Vec<u64>> {
        if pointer.is_null() {
            return Err(Error::invalid_argument(format!("desc->{name} is NULL")));
        }
        // SAFETY: a non-NULL table holds nranks entries (contract).
        let entries = unsafe { std::slice::from_raw_parts(pointer, nranks) };
        Ok(entries.iter().map(|p| *p as u64).collect())
    };
    Ok(PeerWindow {
        owner: Owner {
            kind,
            offset: d.ownerOffset as u64,
        },
        base: d.buff as u64,
        size: d.bytes as u64,
        view: PeerView {
            bases: table(d.peerBuffs, "peerBuffs")?,
            pads: table(d.peerSignalPads, "peerSignalPads")?,
            pad_bytes: d.signalPadBytes as u64,
            engine: [0; 3],
        },
        resources: None,
    })
}

/// Deregister a window of `comm`.
#[unsafe(no_mangle)]
pub extern "C" fn symmCommWindowDeregister(comm: symmComm_t, win: symmWindow_t) -> symmResult_t {
    with_comm("symmCommWindowDeregister", comm, |c| {
        c.refuse_if_queued_in_group("symmCommWindowDeregister")?;
        windows::deregister(c, win)
    })
}

/// A collective of this rank that a front end refused before calling it (a language binding
/// whose own checks found a bad argument the library cannot see, such as a read-only array):
/// counted as the rank's collective and refused, as the library's own checks count theirs, so
/// that a peer whose call is right fails at once naming `call` and `reason` instead of waiting
/// for this rank until the timeout. Returns `symmInvalidArgument`, the last error
/// `"symmCallRefused: <call>: <reason>"`. Not for point-to-point calls (refuse those by calling `symmSend` or
/// `symmRecv` with a NULL buffer, which names the peer).
///
/// # Safety
/// `call` and `reason` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCallRefused(
    call: *const c_char,
    reason: *const c_char,
    comm: symmComm_t,
) -> symmResult_t {
    with_comm("symmCallRefused", comm, |c| {
        // SAFETY: NULL or a NUL-terminated string, by the caller's contract.
        let call = unsafe { text_argument(call, "call") }?;
        // SAFETY: as above.
        let reason = unsafe { text_argument(reason, "reason") }?;
        let error = Error::invalid_argument(reason).in_function(&call);
        Err(group::entry::refused_collective(c, &call, error))
    })
}

/// A NUL-terminated string argument named `name`, refused when NULL.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string.
unsafe fn text_argument(text: *const c_char, name: &str) -> Result<String> {
    if text.is_null() {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let text = unsafe { std::ffi::CStr::from_ptr(text) };
    Ok(text.to_string_lossy().into_owned())
}

/// All-reduce `count` elements from `sendbuff` into `recvbuff` (both inside registered
/// windows, at the same offsets on every rank; in place when equal). Every data type and
/// operator: float16, bfloat16 and float8 accumulate in float32; integers wrap, and `symmAvg`
/// on integers is the exact sum divided by the number of ranks, truncated toward zero. The
/// result is bitwise identical on every rank.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmAllReduce", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op,
            root: 0,
        };
        collective_call(
            c,
            Collective::AllReduce,
            "symmAllReduce",
            args,
            stream as u64,
        )
    })
}

/// Reduce: the reduction of every rank's `count` elements of `sendbuff` lands in `recvbuff` of
/// the root (in place on the root when `sendbuff == recvbuff`). `sendbuff` inside a registered
/// window, at the same offset on every rank (the root reads it); `recvbuff` inside a registered
/// window on the root, and not used on the other ranks (it may be NULL there), as in NCCL.
/// `root` must be a rank of `comm`, the same on every rank. Data types, operators and results
/// as [`symmAllReduce`]'s.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    root: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmReduce", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op,
            root,
        };
        collective_call(c, Collective::Reduce, "symmReduce", args, stream as u64)
    })
}

/// All-gather: every rank's `sendcount` elements, rank `r`'s at `recvbuff + r·sendcount`
/// (in place when `sendbuff == recvbuff + rank·sendcount`). Both buffers inside registered
/// windows, at the same offsets on every rank.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: symmDataTypeRaw,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmAllGather", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count: sendcount,
            datatype,
            op: 0,
            root: 0,
        };
        collective_call(
            c,
            Collective::AllGather,
            "symmAllGather",
            args,
            stream as u64,
        )
    })
}

/// Reduce-scatter: rank `r` receives, in `recvcount` elements, the reduction of segment `r` of
/// every rank's send buffer (in place when `recvbuff == sendbuff + rank·recvcount`). Both
/// buffers inside registered windows, at the same offsets on every rank.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmReduceScatter", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count: recvcount,
            datatype,
            op,
            root: 0,
        };
        collective_call(
            c,
            Collective::ReduceScatter,
            "symmReduceScatter",
            args,
            stream as u64,
        )
    })
}

/// Broadcast: the root's `count` elements of `sendbuff` land in `recvbuff` of every rank (in
/// place on the root when `sendbuff == recvbuff`). `recvbuff` inside a registered window, at the
/// same offset on every rank; `sendbuff` inside a registered window on the root, and ignored on
/// the other ranks (it may be NULL there), as in NCCL. `root` must be a rank of `comm`, the
/// same on every rank. The root's data is stored into every rank as bytes, so every data type
/// arrives bit for bit.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    root: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmBroadcast", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op: 0,
            root,
        };
        collective_call(
            c,
            Collective::Broadcast,
            "symmBroadcast",
            args,
            stream as u64,
        )
    })
}

/// Send `count` elements of `datatype` from `sendbuff` to rank `peer` (as `ncclSend`): the
/// `s`-th send of this rank to `peer` pairs with `peer`'s `s`-th `symmRecv` from this rank,
/// which must name the same count and data type. `sendbuff` lies inside a window registered on
/// `comm` (any offset; `count` 0 needs none), or outside every window: the kernel then sends it
/// in pieces through a ring in the communicator's staging window (any size; the staged sends of
/// one call or group share the window, `SYMM_STAGING_BYTES`; refused under
/// `SYMM_STRICT_WINDOWS=1`). The call returns once the send is enqueued on `stream` (host
/// backend: once the receiver has copied it); the kernel completes once the receiver has copied
/// the data. Inside a group, the group's sends and receives of a rank run in one launch (at
/// most 256), so that ranks may send to each other in any order (`batch_isend_irecv`);
/// outside one, a send and a receive between two ranks in opposite orders wait for each other
/// until the timeout, as in NCCL. A receiver whose count or data type differs refuses the send:
/// both fail, and so does the communicator on every rank.
#[unsafe(no_mangle)]
pub extern "C" fn symmSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    peer: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    peer_call(
        "symmSend",
        true,
        sendbuff as u64,
        count,
        datatype,
        peer,
        comm,
        stream,
    )
}

/// Receive `count` elements of `datatype` from rank `peer` into `recvbuff` (as `ncclRecv`):
/// pairs with `peer`'s next `symmSend` to this rank (see [`symmSend`]). `recvbuff` lies inside a
/// window registered on `comm` (any offset; `count` 0 needs none), or outside every window (the
/// kernel writes it in place; refused under `SYMM_STRICT_WINDOWS=1`), and is written only once
/// the send was checked against this call.
#[unsafe(no_mangle)]
pub extern "C" fn symmRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    peer: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    peer_call(
        "symmRecv",
        false,
        recvbuff as u64,
        count,
        datatype,
        peer,
        comm,
        stream,
    )
}

/// `symmSend` (`send`) or `symmRecv` of `count` elements at `buffer` with rank `peer`.
#[allow(clippy::too_many_arguments)]
fn peer_call(
    name: &str,
    send: bool,
    buffer: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    peer: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm(name, comm, |c| {
        let call = crate::point_to_point::Call {
            send,
            buffer,
            count,
            datatype,
            peer,
        };
        group::point_to_point(c, call, stream as u64)
    })
}

/// All-to-all: segment `p` (`count` elements) of every rank's `sendbuff` lands in segment `r`
/// of rank `p`'s `recvbuff`, `r` being the sender: data for rank `j` is taken from
/// `sendbuff + j·count`, data from rank `i` is placed at `recvbuff + i·count`, as in NCCL.
/// `recvbuff` inside a registered window, at the same offset on every rank; `sendbuff` inside a
/// registered window, anywhere. The buffers must not overlap (there is no in-place form). Bytes
/// are moved, so every data type arrives bit for bit.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmAlltoAll", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op: 0,
            root: 0,
        };
        collective_call(c, Collective::AllToAll, "symmAlltoAll", args, stream as u64)
    })
}

/// All-to-all-v with its counts in device memory (PyTorch SymmMem's `all_to_all_vdev`): no
/// host synchronization, as token dispatch of a mixture of experts needs. `counts` is a table of
/// `3 × nranks` `int64_t`: row 0, written by the caller (e.g. by an earlier kernel on the
/// stream), holds the elements this rank sends to each rank, its segments packed in rank order
/// in `sendbuff`; the call writes row 1 (the elements received from each rank) and row 2 (where
/// each rank's segment starts in `recvbuff`, in elements; packed in rank order).
///
/// `sendcount` and `recvcount` are the capacities in elements of `sendbuff` and `recvbuff`,
/// the same on every rank: the bounds the counts are held to. When a rank's counts are
/// negative or sum to more than `sendcount`, or the counts a rank receives sum to more than
/// `recvcount`, every rank refuses before anything is copied; the communicator is then failed
/// on every rank with that cause (the kernel found it after the call returned). Nothing is ever
/// written outside the buffers.
///
/// `recvbuff` and `counts` lie in registered windows (one or two), each at the same offset of the
/// same window on every rank; `sendbuff` anywhere in a registered window; the three are
/// disjoint. A bad argument is refused at once, naming it; refused alike on every rank, the
/// communicator stays usable; refused on some ranks only, the others' calls fail at once and
/// the communicator is failed on every rank. Bytes are moved, so every
/// data type arrives bit for bit.
/// Buffers or table outside every registered window: the call is staged whole through the
/// communicator's staging window (every rank's must then be outside, or every rank's inside).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn symmAlltoAllvDevice(
    sendbuff: *const c_void,
    sendcount: usize,
    recvbuff: *mut c_void,
    recvcount: usize,
    counts: *mut i64,
    datatype: symmDataTypeRaw,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmAlltoAllvDevice", comm, |c| {
        all_to_all_v_call(
            c,
            (sendbuff as u64, sendcount),
            (recvbuff as u64, recvcount),
            counts as u64,
            datatype,
            stream as u64,
        )
    })
}

/// Gather: every rank's `count` elements of `sendbuff` land on the root, rank `i`'s at
/// `recvbuff + i·count` (in place on the root when `sendbuff == recvbuff + root·count`).
/// `sendbuff` inside a registered window, at the same offset on every rank (the root reads it);
/// `recvbuff` inside a registered window on the root, and not used on the other ranks (it may
/// be NULL there), as in NCCL. `root` must be a rank of `comm`, the same on every rank. Bytes
/// are moved, so every data type arrives bit for bit.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    root: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmGather", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op: 0,
            root,
        };
        collective_call(c, Collective::Gather, "symmGather", args, stream as u64)
    })
}

/// Scatter: the root's `count` elements at `sendbuff + i·count` land in `recvbuff` of rank `i`
/// (in place on the root when `recvbuff == sendbuff + root·count`). `recvbuff` inside a
/// registered window, at the same offset on every rank (the root stores into it); `sendbuff`
/// inside a registered window on the root, and not used on the other ranks (it may be NULL
/// there), as in NCCL. `root` must be a rank of `comm`, the same on every rank. Bytes are
/// moved, so every data type arrives bit for bit.
/// Buffers outside every registered window (`cudaMalloc` memory, as NCCL takes): the call is
/// staged through the communicator's staging window, in chunks, on `stream` (every rank's
/// buffers must then be outside, or every rank's inside: the ranks agree on it).
#[unsafe(no_mangle)]
pub extern "C" fn symmScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: symmDataTypeRaw,
    root: c_int,
    comm: symmComm_t,
    stream: symmStream_t,
) -> symmResult_t {
    with_comm("symmScatter", comm, |c| {
        let args = CollectiveArgs {
            send: sendbuff as u64,
            recv: recvbuff as u64,
            count,
            datatype,
            op: 0,
            root,
        };
        collective_call(c, Collective::Scatter, "symmScatter", args, stream as u64)
    })
}

/// The asynchronous state of `comm`: `symmTimeout` once a kernel of this comm gave up waiting
/// for a peer, `symmInternalError` once a kernel refused its launch, `symmUnhandledCudaError`
/// once work queued on its device failed (a kernel trap or illegal address, which leaves the
/// device's context unusable; `symmGetLastError(comm)` names the CUDA error), or the
/// communicator's failure once it failed on any rank (`symmRemoteError` for another rank's,
/// this rank's own code for its own: `symmInvalidUsage` after its `symmCommAbort` or
/// `symmCommRevoke`, or a misuse it found), else `symmSuccess`. Any of these errors is kept:
/// the comm then refuses further collectives. On the cuda backend this reflects the work that
/// has run so far; it does not synchronize.
///
/// # Safety
/// `asyncError` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommGetAsyncError(
    comm: symmComm_t,
    asyncError: *mut symmResult_t,
) -> symmResult_t {
    with_comm("symmCommGetAsyncError", comm, |c| {
        require_out(asyncError, "asyncError")?;
        let state = match crate::comm::failure::async_error(c) {
            None => symmResult_t::symmSuccess,
            Some(error) => {
                c.set_last_error(&error.message);
                error.code
            }
        };
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(asyncError, "asyncError", state) }
    })
}

/// Start a group: window registrations and collectives are deferred to `symmGroupEnd`.
#[unsafe(no_mangle)]
pub extern "C" fn symmGroupStart() -> symmResult_t {
    guard("symmGroupStart", None, group::start)
}

/// End a group; at the outermost end, complete registrations and run the collectives.
#[unsafe(no_mangle)]
pub extern "C" fn symmGroupEnd() -> symmResult_t {
    guard("symmGroupEnd", None, group::end)
}

/// The device address of `win`'s `symmDeviceContext`, for kernels (PTX, Triton) that call
/// symm's device functions.
///
/// # Safety
/// `devCtx` is NULL or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symmCommGetDeviceContext(
    comm: symmComm_t,
    win: symmWindow_t,
    devCtx: *mut *const c_void,
) -> symmResult_t {
    with_comm("symmCommGetDeviceContext", comm, |c| {
        require_out(devCtx, "devCtx")?;
        let window = windows::from_handle(c, win)?;
        let context = window.context().ok_or_else(|| {
            Error::invalid_usage("the window's registration has not completed (call symmGroupEnd)")
        })?;
        // SAFETY: checked non-NULL; valid for writes by the caller's contract.
        unsafe { write_out(devCtx, "devCtx", context.address as *const c_void) }
    })
}
