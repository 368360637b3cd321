//! The model's state: what each live rank of each communicator holds (allocations, windows,
//! calls queued in the open group), the resolved form of a collective call, and the work
//! queued in the open group.

use crate::numeric::{Kind, Reduce};
use std::ffi::c_int;
use symm::symmComm_t;

/// One `symmMemAlloc` allocation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allocation {
    pub(crate) base: u64,
    pub(crate) size: usize,
}

/// One window of a rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Win {
    pub(crate) handle: usize,
    pub(crate) base: u64,
    pub(crate) size: u64,
    pub(crate) seq: u64,
    /// Its registration completed (outside a group, or at its group's end).
    pub(crate) complete: bool,
}

/// What the model knows of one live rank.
pub(crate) struct Rank {
    pub(crate) handle: symmComm_t,
    pub(crate) allocations: Vec<Allocation>,
    pub(crate) windows: Vec<Win>,
    /// Sequence number of this rank's next registration.
    pub(crate) next_seq: u64,
    /// Calls of this rank queued in the open group.
    pub(crate) queued: usize,
}

/// The ranks of one communicator.
pub(crate) struct Clique {
    /// `None` once destroyed.
    pub(crate) ranks: Vec<Option<Rank>>,
    /// Made by `symmCommInitRank` (registrations go through the bootstrap).
    pub(crate) linked: bool,
    /// A call timed out or did something the model does not predict: from now on any result
    /// but `symmInternalError` is accepted here, and data is not checked.
    pub(crate) tainted: bool,
    /// Made with the long timeout ([`timeout_ms`](crate::timeout_ms)): calls that could only
    /// time out are not made, and every prediction is exact. Else the short one
    /// ([`FAST_TIMEOUT_MS`](crate::FAST_TIMEOUT_MS)): calls that time out are cheap, and a
    /// well-formed collective may time out too (a busy machine), which taints the
    /// communicator.
    pub(crate) patient: bool,
}

impl Clique {
    /// Its number of ranks (live or destroyed).
    pub(crate) fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// No rank was destroyed.
    pub(crate) fn all_alive(&self) -> bool {
        self.ranks.iter().all(Option::is_some)
    }

    /// The first live rank (the reference for "the same window on every rank").
    pub(crate) fn first_alive(&self) -> Option<usize> {
        self.ranks.iter().position(Option::is_some)
    }
}

/// A resolved collective call of one rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub(crate) kind: u8,
    pub(crate) dtype: c_int,
    pub(crate) op: c_int,
    pub(crate) count: usize,
    pub(crate) send: u64,
    pub(crate) recv: u64,
}

impl Call {
    /// The C function it calls.
    pub(crate) fn kind_name(&self) -> &'static str {
        ["symmAllReduce", "symmAllGather", "symmReduceScatter"][self.kind as usize]
    }
}

/// A validated call: where it reads and writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    pub(crate) elem: Kind,
    pub(crate) reduce: Option<Reduce>,
    /// Bytes of one rank's share.
    pub(crate) bytes: u64,
    /// Bytes of the whole buffer (shares of all ranks; all-reduce: `bytes`).
    pub(crate) total: u64,
    /// Send and receive windows (by registration) and offsets.
    pub(crate) send_seq: u64,
    pub(crate) recv_seq: u64,
}

/// Work queued in the open group.
pub(crate) enum Pending {
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
pub(crate) type Snapshot = Vec<((usize, usize, u64), Vec<u8>)>;

/// Alignment of a window's base that completing its registration requires.
pub(crate) const WINDOW_ALIGNMENT: u64 = 16;
