//! A failed communicator: once any rank finds that the ranks' calls no longer pair up, the
//! communicator is failed on **every** rank.
//!
//! Ranks pair their collectives by number: the `k`-th collective of every rank is one
//! collective, and the kernels meet through barrier epochs and flags that only count. A rank
//! that skipped a call its peers made (refused it, timed out in it, or made another call under
//! its number) is out of step for good: its next call would pair with a peer's stale one and
//! could return success with another call's data. So whichever rank finds such a break — a
//! mismatched or refused call ((`collective`)), a wait that timed out, a kernel that
//! refused its launch, a failed device, two threads on one communicator — calls [`fail`]:
//!
//! * the rank keeps its error (later calls and `symmCommGetAsyncError` report it);
//! * the clique (this process's ranks of the communicator) keeps the first failure, and every
//!   in-process rank adopts it at its next look ([`adopted`]) as `symmRemoteError` naming the
//!   rank and the cause;
//! * ranks of other processes of this machine read it from the failing rank's call records
//!   ([`crate::agree::records`]) and adopt it likewise;
//! * the abort word of every window of this process's ranks is raised
//!   ([`ABORT_PEER_FAILED`]), and, through the call records, that of every rank of another
//!   process of this machine (after the failure record is written), so that every rank's
//!   pending kernels give up at their next look instead of after their timeout, and its next
//!   call is refused, naming the rank that found the failure and its cause.
//!
//! From then on every collective of every rank returns an error before anything is launched;
//! teardown (deregistration, `symmMemFree`, `symmCommDestroy`) and `symmCommSplit` (whose
//! exchanges do not use the failed kernels) remain. `symmCommRevoke` fails a communicator on
//! purpose, this way ([`crate::comm::revoke`]).

use crate::abi::symmResult_t;
use crate::comm::{self, Clique, Comm};
use crate::error::Error;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use symm_device::symmetric::{ABORT_INVALID_LAUNCH, ABORT_PEER_FAILED, timed_out_peer};
use symm_device::sync::abort::{
    ABORT_GRID_TIMED_OUT, ABORT_KERNEL_BLOCKS_DIFFER, ABORT_KERNEL_CALLS_DIFFER,
};

/// The first failure of a communicator: the rank that found it, and its error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The rank that found it.
    pub rank: usize,
    /// Its error code on that rank.
    pub code: symmResult_t,
    /// Its message on that rank.
    pub message: String,
}

/// `comm` found its communicator failed with `error`: keep it as this rank's error and make
/// every other rank fail as well (see the module documentation). Call it without holding
/// `comm`'s state lock.
pub fn fail(comm: &Comm, error: &Error) {
    if let Some(span) = comm.span.get() {
        // Every rank of every machine, through the spanning root; and this machine.
        span.fail(error);
    }
    {
        let mut state = comm.lock();
        if state.aborted.is_none() {
            state.aborted = Some(error.message.clone());
            state.abort_code = Some(error.code);
        }
    }
    if let Some(records) = &comm.call_records {
        records.publish_failure(error.code, &error.message);
        // After the record: a rank that finds its word raised finds the cause on record.
        if !crate::mutation::active(crate::mutation::Mutation::SkipRemoteAbort) {
            records.raise_peers(ABORT_PEER_FAILED);
        }
    }
    record_in_clique(
        &comm.clique,
        Failure {
            rank: comm.rank,
            code: error.code,
            message: error.message.clone(),
        },
    );
}

/// Keep `failure` as the clique's first failure and, if it is the first, wake the pending
/// kernels of every rank of this process.
fn record_in_clique(clique: &std::sync::Arc<Clique>, failure: Failure) {
    let first = {
        let mut slot = clique.failure.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(failure.clone());
            true
        } else {
            false
        }
    };
    if first {
        crate::log!(
            crate::log::Level::Warn,
            crate::log::Subsys::Coll,
            Some(failure.rank),
            "the communicator failed: {}",
            failure.message
        );
        for peer in comm::clique_comms(clique) {
            let windows: Vec<_> = peer.lock().windows.values().cloned().collect();
            for window in windows {
                window.raise_abort(ABORT_PEER_FAILED);
            }
        }
    }
}

/// What a failed communicator's errors tell the user to do.
pub(crate) const RECOVERY: &str = "destroy it, or continue on a symmCommSplit of it";

/// The error every call of `comm` returns once its communicator failed: this rank's own
/// failure, or one that another rank found (in this process, or in another process of this
/// machine), which this rank then adopts as `symmRemoteError`. `None` while the communicator
/// works.
pub fn adopted(comm: &Comm) -> Option<Error> {
    {
        let state = comm.lock();
        if let Some(reason) = &state.aborted {
            return Some(Error::new(
                state.abort_code.unwrap_or(symmResult_t::symmRemoteError),
                format!(
                    "rank {}: the communicator has failed ({reason}); every collective on it \
                     fails: {RECOVERY}",
                    comm.rank
                ),
            ));
        }
    }
    let in_process = comm
        .clique
        .failure
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let failure = match in_process {
        Some(failure) => failure,
        None => {
            let (rank, code, message) = comm.call_records.as_ref()?.peer_failure()?;
            let failure = Failure {
                rank,
                code,
                message,
            };
            // This process's other ranks learn it too (and their kernels stop waiting).
            record_in_clique(&comm.clique, failure.clone());
            failure
        }
    };
    if failure.rank == comm.rank {
        // This rank's own failure, recorded by another of its calls meanwhile.
        let mut state = comm.lock();
        state.aborted.get_or_insert(failure.message.clone());
        state.abort_code.get_or_insert(failure.code);
        return Some(Error::new(failure.code, failure.message));
    }
    let reason = format!("failed on rank {}: {}", failure.rank, failure.message);
    let mut state = comm.lock();
    state.aborted.get_or_insert(reason.clone());
    state
        .abort_code
        .get_or_insert(symmResult_t::symmRemoteError);
    Some(Error::new(
        symmResult_t::symmRemoteError,
        format!(
            "rank {}: the communicator {reason}; every collective on it fails: {RECOVERY}",
            comm.rank
        ),
    ))
}

/// The communicator's state before and after a launch: `Err` once it has failed (here or on
/// another rank) — the failure already known ([`adopted`], or the device's error), or one found
/// now by [`find_new_failure`], which is then recorded on every rank ([`fail`]).
pub fn check(comm: &Comm) -> Result<(), Error> {
    check_with(comm, false)
}

/// [`check`], querying the device now when `fresh` (else a query of the last few
/// milliseconds may stand, see [`crate::backend::Backend::async_error`]).
fn check_with(comm: &Comm, fresh: bool) -> Result<(), Error> {
    if let Some(error) = comm.lock().device_error.clone() {
        return Err(error);
    }
    if let Some(error) = adopted(comm) {
        return Err(error);
    }
    let Some(found) = find_new_failure(comm, fresh) else {
        return Ok(());
    };
    if found.peer_failed
        && let Some(error) = adopted(comm)
    {
        // The word was read (acquire) after `adopted` looked: the rank that raised it wrote
        // its failure before raising, so the cause is on record now.
        return Err(error);
    }
    if found.error.code == symmResult_t::symmTimeout
        && let Some(earlier) = earlier_failure(comm)
    {
        // Another rank's wait ran out first: its failure names the cause (the rank that is
        // gone), where this rank's may name a live rank that was itself waiting for it.
        return Err(earlier);
    }
    if found.device {
        comm.lock().device_error = Some(found.error.clone());
    }
    fail(comm, &found.error);
    Err(if found.device {
        found.error
    } else {
        adopted(comm).unwrap_or(found.error)
    })
}

/// Before the next collective of a rank that refused its previous one (number `k`) while some
/// peers had not made call `k` yet: wait, at most the timeout, until every peer this rank can
/// compare with (in this process, or in another process of this machine) has made and checked
/// call `k`. A peer whose call `k` was a real call has then found the disagreement and failed
/// the communicator, and this call returns that error; peers that refused `k` too leave the
/// ranks in step. Without the wait, this rank's next call could be launched before the
/// disagreement is found, and return success with its own data unreduced.
pub fn settle_refusal(comm: &Comm) -> Result<(), Error> {
    let seq = comm.unsettled_refusal.load(Ordering::Relaxed);
    // Inside a group, this thread may drive the peers itself: their call `k` comes after this
    // one, and the group's end compares them (and fails the communicator on a disagreement).
    if seq == u64::MAX || THREAD_GROUPED.with(|g| g.get()) {
        return Ok(());
    }
    // `Some(Err)`: a failure, adopted; `Some(Ok)`: every peer's call `seq` is known.
    let settled = poll_until(comm.clique.timeout, || {
        if let Some(error) = adopted(comm) {
            return Some(Err(error));
        }
        let in_process = comm
            .clique
            .calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .settled(seq);
        let other_processes = comm
            .call_records
            .as_ref()
            .is_none_or(|records| records.peers_checked(seq));
        (in_process && other_processes).then_some(Ok(()))
    });
    match settled {
        Some(Err(error)) => Err(error),
        Some(Ok(())) => {
            comm.unsettled_refusal.store(u64::MAX, Ordering::Relaxed);
            // A peer that found the disagreement may have recorded it just now.
            match adopted(comm) {
                Some(error) => Err(error),
                None => Ok(()),
            }
        }
        None => {
            let error = Error::new(
                symmResult_t::symmTimeout,
                format!(
                    "rank {}: its collective #{seq} was refused, and a peer did not make its collective #{seq} within {} ms, so the ranks cannot be known to be in step; the communicator is failed on every rank",
                    comm.rank,
                    comm.clique.timeout.as_millis()
                ),
            );
            fail(comm, &error);
            Err(adopted(comm).unwrap_or(error))
        }
    }
}

/// A failure that another rank recorded while this rank's own wait ran out, adopted
/// ([`adopted`]) if it arrives within a short grace (a fifth of the timeout, between 10 ms and
/// 1 s). When a rank dies, the ranks waiting for it are not the only ones that time out: a rank
/// a step ahead waits for those, and its own timeout would name a live rank. The rank that
/// waited longest, for the dead one, times out first; the grace lets its record arrive, so that
/// every rank reports the cause.
fn earlier_failure(comm: &Comm) -> Option<Error> {
    let grace = (comm.clique.timeout / 5).clamp(Duration::from_millis(10), Duration::from_secs(1));
    poll_until(grace, || adopted(comm))
}

/// The first `Some` that `step` returns, polled every millisecond for at most `limit`.
fn poll_until<T>(limit: Duration, mut step: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = step() {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A failure that [`find_new_failure`] found.
pub struct Finding {
    /// The error every call of the rank returns from now on.
    pub error: Error,
    /// `true` when the device itself failed (kept as the rank's device error).
    pub device: bool,
    /// `true` when another rank raised this rank's abort word ([`ABORT_PEER_FAILED`]): its
    /// failure, with the cause, is on record ([`adopted`]).
    pub peer_failed: bool,
}

/// A failure that nothing recorded yet, read (never written) from the rank's windows and
/// device: a raised abort word — `symmTimeout` naming the rank that did not arrive (when the
/// kernel knew it), `symmInternalError` for a kernel that refused its launch, `symmRemoteError`
/// when another rank raised it — or a failed device (`symmUnhandledCudaError`: a trapped or
/// faulting kernel, an unusable context).
pub fn find_new_failure(comm: &Comm, fresh: bool) -> Option<Finding> {
    let (word, last_kernel) = {
        let state = comm.lock();
        let word = state
            .windows
            .values()
            .map(|w| w.abort_word())
            .find(|w| *w != 0)
            .unwrap_or(0);
        (word, state.last_kernel.clone())
    };
    if word != 0 {
        let error = match word & 0xFF {
            ABORT_INVALID_LAUNCH => Error::internal(format!(
                "rank {}: kernel {} refused its launch, or a device function (Triton) its \
                 arguments (launch shape or arguments outside the limits; nothing was \
                 written); the communicator is failed on every rank",
                comm.rank,
                last_kernel.as_deref().unwrap_or("(unknown)")
            )),
            symm_device::symmetric::point_to_point::ABORT_P2P_REFUSED => {
                p2p_refusal(comm.rank, word)
            }
            symm_device::symmetric::all_to_all_v::ABORT_COUNTS_REFUSED => {
                counts_refusal(comm.rank, word)
            }
            ABORT_KERNEL_CALLS_DIFFER => Error::invalid_usage(format!(
                "rank {}: the ranks' kernels made different calls on a window at one barrier \
                 (a frame, a barrier or an in-kernel collective whose kind, spans, element \
                 type, operator or grid differ between ranks); nothing of that call was done, \
                 and the communicator is failed on every rank",
                comm.rank
            )),
            ABORT_KERNEL_BLOCKS_DIFFER => Error::invalid_usage(format!(
                "rank {}: the blocks of one launch of a kernel made different calls on a window \
                 at one barrier (a frame, a barrier, an in-kernel collective or for_each_tile on \
                 some blocks and not others, or with other arguments: every block makes the \
                 same sequence); nothing of that call was done, and the communicator is failed \
                 on every rank",
                comm.rank
            )),
            ABORT_GRID_TIMED_OUT => Error::new(
                symmResult_t::symmTimeout,
                format!(
                    "rank {}: a block of a kernel on a window waited past the timeout for a block \
                     of its own launch at a barrier (the blocks made different sequences of \
                     frames, barriers and collectives, or were not all resident); the \
                     communicator is failed on every rank",
                    comm.rank
                ),
            ),
            ABORT_PEER_FAILED => Error::new(
                symmResult_t::symmRemoteError,
                format!(
                    "rank {}: another rank failed the communicator; every collective on it \
                     fails: {RECOVERY}",
                    comm.rank
                ),
            ),
            _ => timeout_error(comm, timed_out_peer(word)),
        };
        return Some(Finding {
            error,
            device: false,
            peer_failed: word & 0xFF == ABORT_PEER_FAILED,
        });
    }
    let error = comm.clique.backend.async_error(&comm.resources, fresh)?;
    Some(Finding {
        error: Error::new(
            error.code,
            format!(
                "rank {}: {}; the communicator is failed on every rank: destroy it",
                comm.rank, error.message
            ),
        ),
        device: true,
        peer_failed: false,
    })
}

/// The error of a raised [`ABORT_P2P_REFUSED`](symm_device::symmetric::point_to_point) word
/// of rank `rank`: its receive refused a peer's send (naming the peer and why), or the kernel
/// refused a task.
fn p2p_refusal(rank: usize, word: u32) -> Error {
    use symm_device::symmetric::point_to_point::{RefusalReason, refused_peer};
    let peer = refused_peer(word).map_or_else(|| "a peer".to_string(), |p| format!("rank {p}"));
    let why = match RefusalReason::from_word(word) {
        Some(RefusalReason::Mismatch) => "the send's count or data type differs from the receive's",
        Some(RefusalReason::UnknownWindow) => {
            "the send's window is not registered on the receiving rank (or was deregistered there)"
        }
        Some(RefusalReason::OutOfBounds) => {
            "the send's range lies outside its window as the receiving rank sees it"
        }
        Some(RefusalReason::OutOfStep) => "the pair's sequence numbers are out of step",
        Some(RefusalReason::InvalidTask) | None => {
            return Error::internal(format!(
                "rank {rank}: kernel symm_send_receive refused a task of its launch (a peer or \
                 buffer outside the kernel's limits); the communicator is failed on every rank"
            ));
        }
    };
    Error::invalid_usage(format!(
        "rank {rank}: its symmRecv from {peer} refused the matching symmSend: {why}; nothing \
         was received, and the communicator is failed on every rank"
    ))
}

/// The error of a raised [`ABORT_COUNTS_REFUSED`](symm_device::symmetric::all_to_all_v) word
/// of rank `rank`: an all-to-all-v whose counts broke the agreed bound (every rank raises the
/// same word).
fn counts_refusal(rank: usize, word: u32) -> Error {
    use symm_device::symmetric::all_to_all_v::{CountsRefusal, refused_counts_at};
    let (at, peer) = refused_counts_at(word);
    let at = at.map_or_else(|| "a rank".to_string(), |r| format!("rank {r}"));
    let why = match (CountsRefusal::from_word(word), peer) {
        (Some(CountsRefusal::Negative), Some(peer)) => {
            format!("{at}'s count for rank {peer} is negative")
        }
        (Some(CountsRefusal::Negative), None) => format!("a count of {at} is negative"),
        (Some(CountsRefusal::SendsOverBound), _) => format!(
            "{at}'s counts sum to more elements than sendcount (the capacity of its sendbuff)"
        ),
        (Some(CountsRefusal::ReceivesOverBound), _) => format!(
            "the counts sent to {at} sum to more elements than recvcount (the capacity of its \
             recvbuff)"
        ),
        (None, _) => "the counts break the bound".to_string(),
    };
    Error::invalid_argument(format!(
        "rank {rank}: symmAlltoAllvDevice refused its counts on every rank: {why}; nothing of \
         that call was copied, and the communicator is failed on every rank"
    ))
}

std::thread_local! {
    /// This thread's calls are grouped now (see [`set_thread_grouped`]).
    static THREAD_GROUPED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tell whether this thread's calls are grouped now (between `symmGroupStart` and the end of
/// the outermost `symmGroupEnd`, including its helper threads): `group` keeps it current. A
/// timeout found outside a group, on a communicator whose ranks all run in this process, says
/// that a group is probably missing.
pub fn set_thread_grouped(grouped: bool) {
    THREAD_GROUPED.with(|g| g.set(grouped));
}

/// `symmTimeout` of `comm`, whose wait for `peer` (when known) ran out: "rank 0: rank 1 did not
/// arrive within 3000 ms", with a disagreement of calls a rank of another process made when
/// there is one, and a hint when one thread seems to drive several ranks without a group.
fn timeout_error(comm: &Comm, peer: Option<u32>) -> Error {
    let who = match peer {
        Some(peer) => format!("rank {peer}"),
        None => "a peer".to_string(),
    };
    let mismatch = comm
        .call_records
        .as_ref()
        .and_then(|records| records.recent_conflict(comm.next_collective.load(Ordering::Relaxed)))
        .map(|m| format!(" ({m})"))
        .unwrap_or_default();
    let grouped = THREAD_GROUPED.with(|g| g.get());
    let hint = if comm.link.is_none() && comm.clique.nranks > 1 && !grouped {
        " (if one thread drives several ranks of this communicator, their calls must be made \
         between symmGroupStart and symmGroupEnd: a group is probably missing)"
    } else {
        ""
    };
    Error::new(
        symmResult_t::symmTimeout,
        format!(
            "rank {}: {who} did not arrive within {} ms{mismatch}{hint}; the communicator is \
             failed on every rank",
            comm.rank,
            comm.clique.timeout.as_millis()
        ),
    )
}

/// `symmCommGetAsyncError`: the communicator's asynchronous error, if any — `symmTimeout`
/// once a peer timed out, `symmInternalError` once a kernel refused its launch (also on later
/// queries), the device's error once queued work failed, `symmRemoteError` once another rank
/// failed the communicator, or the error of this rank's refused call that failed it.
pub fn async_error(comm: &Comm) -> Option<Error> {
    check_with(comm, true).err()
}
