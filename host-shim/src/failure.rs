//! A failed communicator: once any rank finds that the ranks' calls no longer pair up, the
//! communicator is failed on **every** rank.
//!
//! Ranks pair their collectives by number: the `k`-th collective of every rank is one
//! collective, and the kernels meet through barrier epochs and flags that only count. A rank
//! that skipped a call its peers made (refused it, timed out in it, or made another call under
//! its number) is out of step for good: its next call would pair with a peer's stale one and
//! could return success with another call's data. So whichever rank finds such a break — a
//! mismatched or refused call ([`crate::collective`]), a wait that timed out, a kernel that
//! refused its launch, a failed device, two threads on one communicator — calls [`fail`]:
//!
//! * the rank keeps its error (later calls and `symmCommGetAsyncError` report it);
//! * the clique (this process's ranks of the communicator) keeps the first failure, and every
//!   in-process rank adopts it at its next look ([`adopted`]) as `symmRemoteError` naming the
//!   rank and the cause;
//! * ranks of other processes of this machine read it from the failing rank's call records
//!   ([`crate::call_records`]) and adopt it likewise;
//! * the abort word of every window of this process's ranks is raised
//!   ([`ABORT_PEER_FAILED`]), so that their pending kernels give up at once instead of after
//!   their timeout (ranks of other processes time out, then name the cause).
//!
//! From then on every collective of every rank returns an error before anything is launched;
//! only teardown (deregistration, `symmMemFree`, `symmCommDestroy`) remains.

use crate::abi::symmResult_t;
use crate::comm::{self, Clique, Comm};
use crate::error::Error;
use symm_device::symmetric::ABORT_PEER_FAILED;

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
    {
        let mut state = comm.lock();
        if state.aborted.is_none() {
            state.aborted = Some(error.message.clone());
            state.abort_code = Some(error.code);
        }
    }
    if let Some(records) = &comm.call_records {
        records.publish_failure(error.code, &error.message);
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
            *slot = Some(failure);
            true
        } else {
            false
        }
    };
    if first {
        for peer in comm::clique_comms(clique) {
            let windows: Vec<_> = peer.lock().windows.values().cloned().collect();
            for window in windows {
                window.raise_abort(ABORT_PEER_FAILED);
            }
        }
    }
}

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
                     fails: destroy it",
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
            "rank {}: the communicator {reason}; every collective on it fails: destroy it",
            comm.rank
        ),
    ))
}
