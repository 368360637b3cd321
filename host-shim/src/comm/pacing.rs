//! Launch pacing: a rank's launch of call n waits until every other rank of this process on
//! its device has issued call n - 1.
//!
//! CUDA feeds a device's streams through a few hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`,
//! 8 by default), each first in, first out. Ranks on one device launched separately (a thread
//! per rank, or a group that splits a device's ranks) each spin in their kernel until their
//! peers' kernels of the same call arrive. If a rank's kernel n+1, which waits on its stream
//! for its kernel n, entered a queue ahead of a peer's kernel n, that peer kernel could never
//! start and kernel n would spin until the timeout. Pacing keeps every rank at most one call
//! ahead of the others at launch, so a kernel n+1 enters the queues only after every kernel n.

use super::{Clique, Comm, failure};
use crate::error::{Error, Result};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The calls each rank of this process has issued.
#[derive(Default)]
pub struct Pacing {
    /// Per rank: how many of its calls (numbers 0, 1, …) are issued (launched, refused or
    /// empty).
    issued: Mutex<Vec<u64>>,
    /// Signalled whenever `issued` grows.
    grew: Condvar,
}

/// How often a wait looks for a failure of the communicator.
const POLL: Duration = Duration::from_millis(20);

impl Pacing {
    /// For `nranks` ranks, none issued.
    pub fn new(nranks: usize) -> Pacing {
        Pacing {
            issued: Mutex::new(vec![0; nranks]),
            grew: Condvar::new(),
        }
    }

    /// Rank `rank` has issued its calls up to number `seq`.
    pub fn issued(&self, rank: usize, seq: u64) {
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = issued.get_mut(rank)
            && *n <= seq
        {
            *n = seq + 1;
            self.grew.notify_all();
        }
    }

    /// Wait until every rank of `peers` has issued call `seq - 1` (at once for call 0), at most
    /// the clique's timeout; return early with the communicator's failure when it fails.
    pub fn wait_for(&self, comm: &Comm, peers: &[usize], seq: u64) -> Result<()> {
        let deadline = Instant::now() + comm.clique.timeout;
        let mut issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let behind = peers.iter().copied().find(|&q| issued[q] < seq);
            let Some(behind) = behind else {
                drop(issued);
                // A peer marks its calls issued after it failed the communicator: released by
                // a failed launch, this one must not go ahead.
                return failure::check(comm);
            };
            drop(issued);
            failure::check(comm)?;
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    crate::abi::symmResult_t::symmTimeout,
                    format!(
                        "rank {}: rank {behind} (same device, this process) did not issue its \
                         collective #{} within {} ms, so rank {}'s collective #{seq} was not \
                         launched (ranks of one device may be at most one call apart when \
                         launched: if one thread drives several of them, make each call on \
                         every rank before the next, or make them between symmGroupStart and \
                         symmGroupEnd); the communicator is failed on every rank",
                        comm.rank,
                        seq - 1,
                        comm.clique.timeout.as_millis(),
                        comm.rank
                    ),
                ));
            }
            issued = self.issued.lock().unwrap_or_else(|e| e.into_inner());
            if peers.iter().all(|&q| issued[q] >= seq) {
                continue;
            }
            issued = self
                .grew
                .wait_timeout(issued, POLL.min(deadline - now))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Clique {
    /// The ranks of this process on `device` other than those of `served` (a launch's own
    /// ranks): the ranks whose separate launches a launch on `device` must not overtake.
    pub fn device_peers(&self, device: i32, served: &[usize]) -> Vec<usize> {
        (0..self.nranks)
            .filter(|&q| self.devices[q] == device && !served.contains(&q))
            .collect()
    }
}
