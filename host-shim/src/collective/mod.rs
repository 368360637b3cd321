//! Collectives: validation of a request against the communicator's windows, its plan, and its
//! execution (now, or at the end of the group, merged with the other ranks' parts).

mod execute;
pub(crate) mod route;
mod validate;

pub use execute::execute;
pub(crate) use execute::{agree_call, record_refusal};
pub use route::{Route, UserCall, route, route_all_to_all_v};
pub use validate::CountTable;
pub use validate::{
    Request, all_gather, all_reduce, all_to_all, all_to_all_v, broadcast, describe,
    describe_all_to_all_v, gather, reduce, reduce_scatter, scatter,
};
pub(crate) use validate::{buffer_window, data_type};

use crate::agree::{BufferAt, Call, CountsAt, Signature};
use crate::comm::Comm;
use crate::error::Result;
use crate::log::{Level, Subsys};
use crate::plan::staging::Copies;
use crate::plan::{Collective, Limits, Plan, plan};
use crate::window::Window;
use std::ops::Range;
use std::sync::Arc;
use symm_device::symmetric::{CollectiveArgs, FLAG_IN_PLACE, FLAG_ROOT};

/// A validated collective of one rank, ready to launch once its windows are complete.
pub struct Task {
    /// The rank that runs it.
    pub comm: Arc<Comm>,
    /// The window holding the send buffer.
    pub send_window: Arc<Window>,
    /// The window holding the receive buffer.
    pub recv_window: Arc<Window>,
    /// Kernel and shape.
    pub plan: Plan,
    /// Kernel arguments (flags: 0; this rank's flags are in `rank_flags`), with the count in
    /// elements for every collective (all-reduce: total; broadcast: the root's; all-to-all: per
    /// peer; the others: per rank); the unit of the byte movers (bytes) is applied when the
    /// work table is built ([`Task::kernel_count`]).
    pub args: CollectiveArgs,
    /// This rank's flags (`FLAG_IN_PLACE`, `FLAG_ROOT`, `FLAG_REDUCE_TO_ROOT`).
    pub rank_flags: u32,
    /// The root of a reduce, broadcast, gather or scatter (0 for the other collectives).
    pub root: u32,
    /// The caller's stream, as an address.
    pub stream: u64,
    /// The collective.
    pub collective: Collective,
    /// All-to-all-v: its count table and send capacity.
    pub counts: Option<CountTable>,
    /// A chunk of a staged call (`crate::staging`): the copies into the staging window before
    /// its launch and out of it after, on `stream`.
    pub staged: Option<Copies>,
}

impl Task {
    /// What every rank's call under this task's number must agree on ([`crate::agree`]) when
    /// it runs with `plan` (its own, or its fused batch's).
    pub fn signature(&self, plan: &Plan) -> Signature {
        Signature {
            collective: self.collective,
            kernel: plan.kernel,
            count: self.args.count,
            grid: plan.grid,
            root: self.root,
            batch_index: 0,
            batch_size: 1,
            send: self.peers_use_send().then_some(BufferAt {
                window: self.send_window.seq,
                offset: self.args.send_offset,
            }),
            recv: self.peers_use_recv(plan).then_some(BufferAt {
                window: self.recv_window.seq,
                offset: self.args.recv_offset,
            }),
            in_place: self.in_place(),
            counts: self.counts.as_ref().map(|t| CountsAt {
                window: t.window.seq,
                offset: t.offset,
                send_count: t.send_count,
            }),
            staged: self.staged.as_ref().map(|c| c.of_call),
        }
    }

    /// `true` when the backend runs launches synchronously (the host backend), so independent
    /// launches of one group must run on separate threads.
    pub fn runs_to_completion(&self) -> bool {
        self.comm.clique.backend.kind() == crate::backend::BackendKind::Host
    }

    /// `true` when peers' kernels access this rank's send buffer at the send offset they were
    /// given (all-reduce and reduce-scatter: peers read their shares of it; reduce and gather:
    /// the root reads it). The all-gather and all-to-all kernels push each rank's own send buffer, and
    /// a broadcast's or a scatter's root reads its own: their send buffers may lie anywhere.
    pub fn peers_use_send(&self) -> bool {
        matches!(
            self.collective,
            Collective::AllReduce
                | Collective::Reduce
                | Collective::ReduceScatter
                | Collective::Gather
        )
    }

    /// `true` when peers' kernels access this rank's receive buffer at the receive offset they
    /// were given with `plan` (all-gather, broadcast, all-to-all and scatter: peers store into
    /// it; the two-shot all-reduce out of place: peers store their reduced shards into it). A
    /// reduce-scatter's, a gather's and the other all-reduces' results are written by their
    /// own rank only.
    pub fn peers_use_recv(&self, plan: &Plan) -> bool {
        match self.collective {
            Collective::AllGather
            | Collective::Broadcast
            | Collective::AllToAll
            | Collective::AllToAllV
            | Collective::Scatter => true,
            Collective::Gather | Collective::Reduce => false,
            Collective::AllReduce => {
                plan.kernel.algorithm == symm_device::symmetric::Algorithm::TwoShotAllReduce
                    && !self.in_place()
            }
            Collective::ReduceScatter => false,
        }
    }

    /// `true` on the root of a reduce, broadcast, gather or scatter.
    pub fn is_root(&self) -> bool {
        self.rank_flags & FLAG_ROOT != 0
    }

    fn in_place(&self) -> bool {
        self.rank_flags & FLAG_IN_PLACE != 0
    }

    /// Payload bytes of this rank's share (all-reduce: the whole buffer).
    fn share_bytes(&self) -> u64 {
        self.args.count * self.plan.kernel.dtype.size_bytes() as u64
    }

    /// The count as `plan`'s kernel takes it: elements, except for the byte movers (the
    /// all-gathers, broadcast, all-to-all, gather and scatter), which serve every data type and
    /// count bytes (per rank, or per peer for all-to-all).
    pub fn kernel_count(&self, plan: &Plan) -> u64 {
        if plan.kernel.algorithm.is_data_type_agnostic() {
            self.share_bytes()
        } else {
            self.args.count
        }
    }

    /// The address ranges of this rank's memory the task reads and writes, `(reads, writes)`
    /// (peers access the same offsets of the same windows, so these also stand for what the
    /// task does to peers' memory). A broadcast or a scatter reads the root's send buffer on the
    /// root only, and a reduce or a gather writes the root's receive buffer only: the other
    /// ranks do not know where they are (see `group::fusion` for what that means for fusion).
    pub fn footprint(&self) -> (Range<u64>, Range<u64>) {
        let share = self.share_bytes();
        let whole = share * self.comm.clique.nranks as u64;
        let send = self.send_window.base + self.args.send_offset;
        let recv = self.recv_window.base + self.args.recv_offset;
        let rank_share = self.comm.rank as u64 * share;
        match (self.collective, self.in_place()) {
            (Collective::AllReduce, true) => (send..send + share, send..send + share),
            (Collective::AllReduce, false) => (send..send + share, recv..recv + share),
            // Every rank's send buffer is read (by the root); only the root's receive buffer
            // is written.
            (Collective::Reduce, _) if !self.is_root() => (send..send + share, recv..recv),
            (Collective::Reduce, true) => (send..send + share, send..send + share),
            (Collective::Reduce, false) => (send..send + share, recv..recv + share),
            (Collective::AllGather, true) => (
                recv + rank_share..recv + rank_share + share,
                recv..recv + whole,
            ),
            (Collective::AllGather, false) => (send..send + share, recv..recv + whole),
            (Collective::ReduceScatter, true) => (
                send..send + whole,
                send + rank_share..send + rank_share + share,
            ),
            (Collective::ReduceScatter, false) => (send..send + whole, recv..recv + share),
            (Collective::Broadcast, _) if !self.is_root() => (recv..recv, recv..recv + share),
            (Collective::Broadcast, true) => (recv..recv + share, recv..recv + share),
            (Collective::Broadcast, false) => (send..send + share, recv..recv + share),
            (Collective::AllToAll, _) => (send..send + whole, recv..recv + whole),
            // Every rank's send buffer is read (by the root); only the root's receive buffer
            // is written.
            (Collective::Gather, _) if !self.is_root() => (send..send + share, recv..recv),
            (Collective::Gather, true) => (recv..recv + whole, recv..recv + whole),
            (Collective::Gather, false) => (send..send + share, recv..recv + whole),
            // Only the root's send buffer is read; every rank's receive buffer is written.
            (Collective::Scatter, _) if !self.is_root() => (recv..recv, recv..recv + share),
            (Collective::Scatter, true) => (send..send + whole, send..send + whole),
            (Collective::Scatter, false) => (send..send + whole, recv..recv + share),
            // The send buffer (its whole capacity) is read and the receive buffer written; the
            // count table is [`Task::table_range`].
            (Collective::AllToAllV, _) => {
                let send_count = self.counts.as_ref().map_or(0, |t| t.send_count);
                let element = self.plan.kernel.dtype.size_bytes() as u64;
                (send..send + send_count * element, recv..recv + share)
            }
        }
    }

    /// An all-to-all-v's count table, in whichever window it lies: written (rows 1 and 2) and
    /// read by peers (row 0), so it counts as written. Empty for the other collectives.
    pub fn table_range(&self) -> Range<u64> {
        match &self.counts {
            Some(t) => {
                let start = t.window.base + t.offset;
                start..start + 24 * self.comm.clique.nranks as u64
            }
            None => 0..0,
        }
    }

    /// `true` when one of `self` and `other` writes memory the other reads or writes, so
    /// that they must run one after the other.
    pub fn conflicts_with(&self, other: &Task) -> bool {
        let overlap = crate::window::ranges_overlap;
        let (reads, writes) = self.footprint();
        let (other_reads, other_writes) = other.footprint();
        let (table, other_table) = (self.table_range(), other.table_range());
        [&writes, &table].into_iter().any(|w| {
            overlap(w, &other_reads) || overlap(w, &other_writes) || overlap(w, &other_table)
        }) || [&other_writes, &other_table]
            .into_iter()
            .any(|w| overlap(&reads, w))
    }
}

/// A planned call, ready to run now or at the group's end (the caller decides: `group`).
pub enum Prepared {
    /// A call of count 0: nothing to launch, but still the rank's next collective (a peer that
    /// made another call under its number must not pair it with a later one).
    Empty(Call),
    /// A task to launch.
    Task(Task),
}

/// Plan `request` of `comm` on `stream`. A failed communicator refuses every call first,
/// before anything is planned or numbered.
pub fn prepare(comm: &Arc<Comm>, request: Request, stream: u64) -> Result<Prepared> {
    crate::comm::refuse_if_finalized(comm, request.collective.name())?;
    crate::comm::failure::settle_refusal(comm)?;
    crate::comm::failure::check(comm)?;
    let forced = comm
        .clique
        .forced_algorithm
        .and_then(|forced| request.collective.resolve_forced(forced));
    let limits = Limits {
        max_blocks: comm.max_blocks,
        min_blocks: comm.clique.min_blocks,
        ranks_per_gpu: comm.clique.ranks_per_gpu,
        forced,
    };
    let mut plan = plan(
        request.collective,
        request.dtype,
        request.op,
        request.count,
        comm.clique.nranks as u32,
        comm.clique.device_model(),
        limits,
    )?;
    if let Some(copies) = &request.staged {
        plan.predicted_us += crate::plan::staged_copy_us(
            comm.clique.device_model(),
            copies.before.len() + copies.after.len(),
            copies.bytes(),
        );
    }
    crate::log!(
        Level::Info,
        Subsys::Plan,
        Some(comm.rank),
        "plan: {}{} {} x {:?} {:?} ({} B) -> {}, {} blocks x {} threads, predicted {:.1} us",
        request.collective.name(),
        if request.staged.is_some() {
            " (a staged chunk, with its copies)"
        } else {
            ""
        },
        request.count,
        request.dtype,
        request.op,
        request.count * request.dtype.size_bytes() as u64,
        plan.kernel.algorithm.name(),
        plan.grid,
        plan.block,
        plan.predicted_us
    );
    // An all-to-all-v of capacity 0 still launches: its kernel writes the count table's
    // received rows (zeros) and refuses counts that are not.
    if request.args.count == 0 && request.collective != Collective::AllToAllV {
        return Ok(Prepared::Empty(Call::Made(Signature {
            collective: request.collective,
            kernel: plan.kernel,
            count: 0,
            grid: plan.grid,
            root: request.root,
            batch_index: 0,
            batch_size: 1,
            send: None,
            recv: None,
            in_place: false,
            counts: None,
            staged: None,
        })));
    }
    Ok(Prepared::Task(Task {
        comm: comm.clone(),
        send_window: request.send_window,
        recv_window: request.recv_window,
        plan,
        args: request.args,
        rank_flags: request.rank_flags,
        root: request.root,
        stream,
        collective: request.collective,
        counts: request.counts,
        staged: request.staged,
    }))
}
