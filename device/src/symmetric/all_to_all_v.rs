//! All-to-all-v whose per-peer counts live in device memory (PyTorch SymmMem's
//! `all_to_all_vdev`): no host synchronization, what token dispatch of a mixture of experts
//! needs. A byte mover: one kernel for every data type.
//!
//! **The count table.** Each task names a table of `3 × world` `i64` in a window of its own
//! (`counts_context`; the receive window, or any other), at the same offset on every rank (peers
//! read it): row 0, written by the caller before the
//! call, holds the elements this rank sends to each peer, its segments packed in peer order
//! in the send buffer; the kernel writes row 1 (the elements received from each peer) and
//! row 2 (where each peer's segment starts in the receive buffer, in elements: the segments
//! are packed in peer order).
//!
//! **The bounds.** The host agrees on the capacities of the send and the receive buffers, the
//! same on every rank (`send_capacity` and `count`, in bytes, in the work table). Each rank
//! checks its own row (no count negative, their sum within the send capacity) and its own
//! column (the counts its peers send it, summed, within the receive capacity), and the ranks
//! vote ([`CrossRankBarrier::sync_unanimous`]) before anything is
//! copied: every rank's block `b` learns the same answer. On a refusal no rank copies or
//! writes anything; every rank finds the first offence in the whole table (the same on every
//! rank), raises its abort word with it ([`ABORT_COUNTS_REFUSED`]), and its host fails the
//! communicator. A kernel never writes outside a window, whatever the counts.
//!
//! **Copies.** After the vote, rank `r` stores its segment for peer `p` into peer `p`'s receive
//! buffer at the sum of the counts that ranks `0..r` send to `p`. Block `b` of every rank
//! copies its share (16-byte units) of every segment, visiting the peers in an order rotated
//! by its index. An end barrier follows (every copy has landed; no rank leaves while a peer may
//! still read its table). Barriers are on the receive window of task 0: a start barrier, then
//! per task a vote and an end barrier.
//!
//! Every block reads the counts it needs itself, from the peers' tables (each thread keeps its
//! own sums: at most `world²` loads of 8 bytes per block), so no block depends on another
//! block's reads through a barrier of a block index it does not share.

use super::batch::Batch;
use super::segments::copy_bytes;
use super::{Grid, KernelStatus, TaskArgs, context_is_valid};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::abort::raise_timeout;
use crate::sync::barrier::{Aborted, CrossRankBarrier};
use crate::sync::grid::block_range;

/// Abort-word value (low byte) of an all-to-all-v whose counts broke the agreed bound on some
/// rank: the reason ([`CountsRefusal`]) in bits 8–15, the offending rank + 1 in bits 16–23,
/// the peer its count names + 1 in bits 24–31 (0 when the reason names no peer).
pub const ABORT_COUNTS_REFUSED: u32 = 5;

/// Bit of `TaskArgs::flags` where an all-to-all-v task's element size in bytes starts (bits
/// 8–15).
pub const ELEMENT_BYTES_SHIFT: u32 = 8;

/// Rows of the count table: sent, received, received offsets.
pub const TABLE_ROWS: u64 = 3;

/// Why an all-to-all-v refused its counts.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountsRefusal {
    /// A rank's count for a peer is negative.
    Negative = 1,
    /// A rank's counts sum to more elements than its send buffer holds.
    SendsOverBound = 2,
    /// The counts that a rank's peers send it sum to more elements than its receive buffer
    /// holds.
    ReceivesOverBound = 3,
}

impl CountsRefusal {
    /// The reason of an [`ABORT_COUNTS_REFUSED`] word.
    pub const fn from_word(word: u32) -> Option<CountsRefusal> {
        match (word >> 8) & 0xFF {
            1 => Some(CountsRefusal::Negative),
            2 => Some(CountsRefusal::SendsOverBound),
            3 => Some(CountsRefusal::ReceivesOverBound),
            _ => None,
        }
    }
}

/// The abort word of a refusal for `reason` found at `rank` (and, for a negative count, the
/// `peer` it was for).
pub const fn abort_counts_refused(reason: CountsRefusal, rank: u32, peer: Option<u32>) -> u32 {
    let peer = match peer {
        Some(p) => (p.wrapping_add(1) & 0xFF) << 24,
        None => 0,
    };
    ABORT_COUNTS_REFUSED | (reason as u32) << 8 | (rank.wrapping_add(1) & 0xFF) << 16 | peer
}

/// The rank and the peer an [`ABORT_COUNTS_REFUSED`] word names.
pub const fn refused_counts_at(word: u32) -> (Option<u32>, Option<u32>) {
    let rank = (word >> 16) & 0xFF;
    let peer = word >> 24;
    (
        if rank == 0 { None } else { Some(rank - 1) },
        if peer == 0 { None } else { Some(peer - 1) },
    )
}

/// One task's count table as the calling rank reads it.
#[derive(Clone, Copy)]
struct Table<'a> {
    /// The window holding the table.
    ctx: &'a SymmContext,
    /// Byte offset of the table in its window (every rank).
    offset: u64,
    /// The send buffer's capacity, in elements: a row's bound.
    send_bound: u64,
    /// The receive buffer's capacity, in elements: a column's bound.
    recv_bound: u64,
}

impl Table<'_> {
    /// What rank `from` sends to rank `to` (row 0 of `from`'s table).
    ///
    /// # Safety
    /// `from, to < world_size`; the table lies in every rank's window (host-checked).
    #[inline(always)]
    unsafe fn count(&self, from: u32, to: u32) -> i64 {
        // SAFETY: forwarded contract; nothing writes row 0 during the launch.
        unsafe {
            let at = self.ctx.peer_base(from) + self.offset + to as u64 * 8;
            arch::load_plain_u64(at as *const u64) as i64
        }
    }

    /// What `from` sends to `to`, as a checked element count (`None`: negative, or above the
    /// send buffer's capacity).
    ///
    /// # Safety
    /// As for [`Table::count`].
    #[inline(always)]
    unsafe fn checked(&self, from: u32, to: u32) -> Option<u64> {
        // SAFETY: forwarded contract.
        let count = unsafe { self.count(from, to) };
        (count >= 0 && count as u64 <= self.send_bound).then_some(count as u64)
    }

    /// Why rank `rank`'s own row or column breaks the bound, if it does: the check each rank
    /// makes before voting.
    ///
    /// # Safety
    /// `rank < world_size`; as for [`Table::count`].
    #[inline(always)]
    unsafe fn offence(&self, rank: u32) -> Option<(CountsRefusal, Option<u32>)> {
        // SAFETY: forwarded contract.
        unsafe { self.row_offence(rank).or_else(|| self.column_offence(rank)) }
    }

    /// Why rank `rank`'s counts (its row) break the bound, if they do.
    ///
    /// # Safety
    /// As for [`Table::offence`].
    #[inline(always)]
    unsafe fn row_offence(&self, rank: u32) -> Option<(CountsRefusal, Option<u32>)> {
        let mut sends = 0u64;
        for peer in 0..self.ctx.world_size {
            // SAFETY: peer, rank < world_size (contract).
            let out = unsafe { self.count(rank, peer) };
            if out < 0 {
                return Some((CountsRefusal::Negative, Some(peer)));
            }
            // The sum refuses as soon as it passes the bound, so it never overflows.
            sends = sends.saturating_add(out as u64);
            if sends > self.send_bound {
                return Some((CountsRefusal::SendsOverBound, None));
            }
        }
        None
    }

    /// Why the counts rank `rank` receives (its column) break the bound, if they do. A
    /// negative or oversized count is its sender's offence ([`Table::row_offence`]); here it
    /// counts as more than the bound, which refuses too.
    ///
    /// # Safety
    /// As for [`Table::offence`].
    #[inline(always)]
    unsafe fn column_offence(&self, rank: u32) -> Option<(CountsRefusal, Option<u32>)> {
        let mut receives = 0u64;
        for peer in 0..self.ctx.world_size {
            // SAFETY: peer, rank < world_size (contract).
            let into = unsafe { self.checked(peer, rank) }.unwrap_or(u64::MAX);
            receives = receives.saturating_add(into);
        }
        (receives > self.recv_bound).then_some((CountsRefusal::ReceivesOverBound, None))
    }

    /// The first offence of the whole table: the rows of every rank in rank order, then the
    /// columns (the same answer on every rank: they read the same table).
    ///
    /// # Safety
    /// As for [`Table::count`].
    #[inline(always)]
    unsafe fn first_offence(&self) -> Option<(CountsRefusal, u32, Option<u32>)> {
        let world = self.ctx.world_size;
        for rank in 0..world {
            // SAFETY: rank < world_size; forwarded contract.
            if let Some((reason, peer)) = unsafe { self.row_offence(rank) } {
                return Some((reason, rank, peer));
            }
        }
        for rank in 0..world {
            // SAFETY: as above.
            if let Some((reason, peer)) = unsafe { self.column_offence(rank) } {
                return Some((reason, rank, peer));
            }
        }
        None
    }

    /// Elements that ranks `0..before` send to `to` (saturating).
    ///
    /// # Safety
    /// `before <= world_size`, `to < world_size`; as for [`Table::count`].
    #[inline(always)]
    unsafe fn column_prefix(&self, before: u32, to: u32) -> u64 {
        let mut sum = 0u64;
        for from in 0..before {
            // SAFETY: from, to < world_size (contract).
            sum = sum.saturating_add(unsafe { self.checked(from, to) }.unwrap_or(0));
        }
        sum
    }

    /// Elements that rank `from` sends to ranks `0..before` (saturating).
    ///
    /// # Safety
    /// As for [`Table::column_prefix`].
    #[inline(always)]
    unsafe fn row_prefix(&self, from: u32, before: u32) -> u64 {
        let mut sum = 0u64;
        for to in 0..before {
            // SAFETY: as in `column_prefix`.
            sum = sum.saturating_add(unsafe { self.checked(from, to) }.unwrap_or(0));
        }
        sum
    }
}

/// All-to-all-v of a batch whose counts are in device memory (see the module documentation).
/// Each task's `count` and `send_capacity` are the bounds in bytes, its flags carry the
/// element size ([`ELEMENT_BYTES_SHIFT`]), and `counts_context` and `counts_offset` place its
/// count table.
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[send_offset, +
/// send_capacity)` (send window, this rank), `[recv_offset, + count)` (receive window, every
/// rank) and the table `[counts_offset, + 3·world·8)` (its window, every rank), which do not
/// overlap; the table's context is 0 (refused) or host-built; the element size divides `count`, the
/// offsets and the window bases; every rank launches the same kernel, batch (bounds included)
/// and shape.
#[inline(always)]
pub unsafe fn all_to_all_v(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    for index in 0..batch.len() {
        let entry = batch.entry(index);
        let element = (entry.flags >> ELEMENT_BYTES_SHIFT) & 0xFF;
        // SAFETY: the table's context is 0 or host-built (contract).
        let table = unsafe { table_context(&entry) };
        let recv = batch.task(index).rank.recv;
        let same_ranks =
            table.is_some_and(|t| t.rank == recv.rank && t.world_size == recv.world_size);
        if !matches!(element, 1 | 2 | 4 | 8) || !same_ranks {
            return KernelStatus::InvalidLaunch;
        }
    }
    let ctx = batch.first().rank.recv;
    // SAFETY: limits were checked by `for_virtual_rank`; every thread runs this sequence.
    let Ok(mut barrier) = (unsafe { CrossRankBarrier::open(ctx, grid.block) }).start() else {
        return KernelStatus::Aborted;
    };
    let mut result = Ok(());
    for index in 0..batch.len() {
        // SAFETY: forwarded contract.
        result = unsafe { run_task(batch, index, grid, &mut barrier) };
        if result.is_err() {
            break;
        }
    }
    barrier.finish();
    match result {
        Ok(()) => KernelStatus::Completed,
        Err(Aborted) => KernelStatus::Aborted,
    }
}

/// Task `index` of the batch: the vote, the table's rows 1 and 2, the copies, the end barrier.
/// A refusal raises the abort word and returns `Err(Aborted)` on every rank alike.
///
/// # Safety
/// As for [`all_to_all_v`].
#[inline(always)]
unsafe fn run_task(
    batch: &Batch<'_>,
    index: u32,
    grid: Grid,
    barrier: &mut CrossRankBarrier<'_>,
) -> Result<(), Aborted> {
    let task = batch.task(index);
    let entry = batch.entry(index);
    let recv = task.rank.recv;
    let element = ((entry.flags >> ELEMENT_BYTES_SHIFT) & 0xFF) as u64;
    let table = Table {
        // SAFETY: checked by `all_to_all_v` before the first barrier (never `None` here).
        ctx: unsafe { table_context(&entry) }.unwrap_or(recv),
        offset: entry.counts_offset,
        send_bound: entry.send_capacity / element,
        recv_bound: task.args.count / element,
    };
    let me = recv.rank;
    let world = recv.world_size;
    let leader = arch::thread_idx_x() == 0;
    // Thread 0 checks and the block shares its answer, so that every thread votes alike even
    // if the table changed under the launch (a caller's race).
    // SAFETY: me < world_size; the table lies in every rank's window (contract).
    let offending = leader && unsafe { table.offence(me) }.is_some();
    let fine = !arch::sync_threads_or(offending);
    if !barrier.sync_unanimous(fine)? {
        // Every rank finds the same first offence (they read the same table, and no rank
        // leaves before the barrier below, so no row 0 changes meanwhile). A refusal without
        // one happens only if the table changed under the launch: it names no rank.
        let word = if leader {
            // SAFETY: the table lies in every rank's window (contract).
            match unsafe { table.first_offence() } {
                Some((reason, rank, peer)) => abort_counts_refused(reason, rank, peer),
                None => abort_counts_refused(CountsRefusal::ReceivesOverBound, u32::MAX, None),
            }
        } else {
            0
        };
        // Every rank refuses the same task, so they pass this barrier together: no peer still
        // reads this rank's table (or votes) when a later launch writes them; the word goes up
        // after it. Another block of this rank still waiting here may see the word and abandon
        // the barrier (announced): it marks the window out of step, so no later launch votes.
        let closed = barrier.sync();
        if leader {
            // SAFETY: the abort word is this rank's, accessed atomically.
            unsafe { raise_timeout(recv.abort_flag as *mut u32, word) };
        }
        return closed.and(Err(Aborted));
    }
    if grid.block == 0 {
        // Rows 1 and 2 of this rank's table: what each peer sent here, and where it landed.
        let own = table.ctx.local_base + table.offset;
        let mut from = arch::thread_idx_x();
        while from < world {
            // SAFETY: from < world_size; the table passed the vote; rows 1 and 2 lie in the
            // window (contract) and only this rank's block 0 writes them, one thread each.
            unsafe {
                let received = table.checked(from, me).unwrap_or(0);
                let at = table.column_prefix(from, me);
                let row = |r: u64| (own + (r * world as u64 + from as u64) * 8) as *mut u64;
                arch::store_plain_u64(row(1), received);
                arch::store_plain_u64(row(2), at);
            }
            from += arch::block_dim_x();
        }
    }
    let send = task.rank.send.local_base + task.args.send_offset;
    let mut peer = grid.block % world;
    for _ in 0..world {
        // Where the segment starts in the send buffer and in the peer's receive buffer, and
        // its length, each clamped into its buffer: the table passed the vote, so clamping
        // changes nothing unless the table changed under the launch (a caller's race, which
        // then gets wrong data but never a write outside the buffers).
        // SAFETY: peer, me < world_size; the table lies in every rank's window (contract).
        let (from, into, elements) = unsafe {
            let from = table.row_prefix(me, peer).min(table.send_bound);
            let into = table.column_prefix(me, peer).min(table.recv_bound);
            let elements = table
                .checked(me, peer)
                .unwrap_or(0)
                .min(table.send_bound - from)
                .min(table.recv_bound - into);
            (from, into, elements)
        };
        let bytes = elements * element;
        let units = bytes.div_ceil(16);
        let (lo, hi) = block_range(units, grid.block, grid.blocks);
        let (lo, hi) = ((lo * 16).min(bytes), (hi * 16).min(bytes));
        if lo < hi {
            // SAFETY: `[from, + elements)` lies in this rank's send buffer and `[into, +
            // elements)` in the peer's receive buffer (clamped above; both capacities are
            // host-checked against the windows); the two do not overlap (contract).
            unsafe {
                let src = send + from * element;
                let dst = recv.peer_base(peer) + task.args.recv_offset + into * element;
                copy_bytes(src, dst, lo, hi);
            }
        }
        peer += 1;
        if peer == world {
            peer = 0;
        }
    }
    barrier.sync()
}

/// The context of `entry`'s count table, when it is one a kernel may use.
///
/// # Safety
/// `entry.counts_context` is 0 or the address of a host-built context.
#[inline(always)]
unsafe fn table_context<'a>(entry: &TaskArgs) -> Option<&'a SymmContext> {
    if entry.counts_context == 0 {
        return None;
    }
    // SAFETY: a host-built context (contract).
    let ctx = unsafe { &*(entry.counts_context as *const SymmContext) };
    context_is_valid(ctx).then_some(ctx)
}
