//! Batches: one launch runs one or several tasks of one kernel (the same collective, operator
//! and data type), each with its own windows, offsets, count and flags.
//!
//! The host passes a work table of [`TaskArgs`], `task_count` entries per rank served by the
//! launch (rank-major: entry `k · task_count + t` is task `t` of the launch's `k`-th rank). An
//! unfused call is a batch of one.
//!
//! **Cells.** Each task's work is cut into cells ([`cell_elements`]: 1 KiB of payload, or one
//! low-latency line for the LL kernels), and the cells of the batch are numbered one after the
//! other in task order ([`TaskArgs::first_cell`], filled by the host with [`task_cells`]). A
//! kernel splits the batch's cells evenly among its blocks, so a batch of one large and many
//! small tasks balances: a block's range may cover the end of one task, several small tasks
//! and the start of another, and [`Batch::walk`] hands the block each task's part in turn.
//! Every rank computes the same cell layout and the same split, so block `b` of every rank
//! handles the same cells: the per-block-index barrier protocol of the unfused kernels is
//! unchanged (see each kernel for its barriers).
//!
//! **Synchronization of a batch.** The kernels synchronize through the signal pad of one
//! window, the *batch window*: task 0's send window for the reductions and the gather, its
//! receive window for the all-gathers, the broadcast, all-to-all and scatter (the window every
//! rank's part of task 0 uses at the same registration).
//! Barriers and LL calls of a batch advance that window's epochs and LL call number only, the
//! same way on every rank, so a later launch on any of the batch's windows, fused or not, finds
//! every rank's epochs and call numbers in agreement. Which pad carries a flag does not matter
//! for memory ordering: a release store and the acquire load that observes it order the
//! accesses around them whatever address they use.

use super::Algorithm;
use super::{CollectiveArgs, Rank, context_is_valid};
use crate::arch;
use crate::context::SymmContext;
use core::marker::PhantomData;

/// Payload bytes of one cell of the non-LL kernels.
pub const CELL_BYTES: u64 = 1024;

/// Most tasks the host fuses into one launch.
pub const MAX_TASKS: usize = 256;

/// One task of a launch as one rank runs it: the contexts of the windows holding its send and
/// receive buffers, the buffers' offsets in them, the count, this rank's flags, and where the
/// task's cells start among the batch's. Mirrored by the host shim; the layout is locked below.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TaskArgs {
    /// Address of the [`SymmContext`] of the window holding the send buffer.
    pub send_context: u64,
    /// Address of the [`SymmContext`] of the window holding the receive buffer (equal to
    /// `send_context` when both buffers lie in one window).
    pub recv_context: u64,
    /// Byte offset of the send buffer in its window (see [`CollectiveArgs::send_offset`]).
    pub send_offset: u64,
    /// Byte offset of the receive buffer in its window.
    pub recv_offset: u64,
    /// Elements (all-reduce: total; reduce-scatter: per rank), bytes per rank (all-gather) or
    /// bytes (broadcast).
    pub count: u64,
    /// Cells of the tasks before this one ([`task_cells`]); the same on every rank.
    pub first_cell: u64,
    /// This rank's flags ([`super::FLAG_IN_PLACE`], [`super::FLAG_ROOT`]).
    pub flags: u32,
    /// Zero, but for a point-to-point task (see `point_to_point::PeerTask`).
    pub reserved: u32,
    /// All-to-all-v: address of the [`SymmContext`] of the window holding the task's count
    /// table (see [`super::all_to_all_v`]). Zero for the other kernels.
    pub counts_context: u64,
    /// All-to-all-v: byte offset of the count table in its window (the same on every rank).
    /// Zero for the other kernels.
    pub counts_offset: u64,
    /// All-to-all-v: bytes of the send buffer, the same on every rank (`count` is the receive
    /// buffer's). Zero for the other kernels.
    pub send_capacity: u64,
}

impl TaskArgs {
    /// The one task of a call whose buffers both lie in the window of the context at `context`
    /// (a device function's or an in-kernel collective's), at the given byte offsets.
    #[inline(always)]
    pub(crate) fn in_one_window(
        context: u64,
        send_offset: u64,
        recv_offset: u64,
        count: u64,
        flags: u32,
    ) -> TaskArgs {
        TaskArgs {
            send_context: context,
            recv_context: context,
            send_offset,
            recv_offset,
            count,
            first_cell: 0,
            flags,
            reserved: 0,
            counts_context: 0,
            counts_offset: 0,
            send_capacity: 0,
        }
    }
}

static_assertions::const_assert_eq!(core::mem::size_of::<TaskArgs>(), 80);
static_assertions::const_assert_eq!(core::mem::align_of::<TaskArgs>(), 8);

/// Elements of one cell of `algorithm` on elements of `element_bytes` bytes (all-gathers and
/// the broadcast count bytes): 1 KiB of payload, or one 8-byte LL line.
#[inline(always)]
pub const fn cell_elements(algorithm: Algorithm, element_bytes: u64) -> u64 {
    let element_bytes = if element_bytes == 0 { 1 } else { element_bytes };
    match algorithm {
        Algorithm::OneShotLlAllReduce => 8 / element_bytes,
        Algorithm::LlAllGather => 8,
        // The PAT kernels run one task and split it their own way; cells only number it.
        Algorithm::AllGather
        | Algorithm::PatAllGather
        | Algorithm::Broadcast
        | Algorithm::AllToAll
        | Algorithm::Gather
        | Algorithm::Scatter
        | Algorithm::AllToAllV
        | Algorithm::SendReceive => CELL_BYTES,
        Algorithm::OneShotAllReduce
        | Algorithm::TwoShotAllReduce
        | Algorithm::ReduceScatter
        | Algorithm::PatReduceScatter => CELL_BYTES / element_bytes,
    }
}

/// Cells of a task of `count` elements (all-gathers and the broadcast: bytes) for `algorithm`.
#[inline(always)]
pub const fn task_cells(algorithm: Algorithm, element_bytes: u64, count: u64) -> u64 {
    count.div_ceil(cell_elements(algorithm, element_bytes))
}

/// One task as the calling rank runs it.
#[derive(Clone, Copy, Debug)]
pub struct Task<'a> {
    /// The windows of its buffers.
    pub rank: Rank<'a>,
    /// Offsets, count and this rank's flags.
    pub args: CollectiveArgs,
    /// Its first cell among the batch's.
    pub first_cell: u64,
}

/// The calling block's rank's tasks of a launch, checked by [`super::resolve_launch`] (a
/// launched kernel: a table pointer and a length, so that the launch's resolution stays in
/// registers on the GPU; tasks are read from the table when used) or by `Batch::open_one` (a
/// device function's single task, held by value so that it never goes through local memory).
/// Everything is inlined and each kind is built where it is a constant, so only the fields of
/// the kind in use reach the registers.
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    entries: Entries,
    len: u32,
    _contexts: PhantomData<&'a SymmContext>,
}

/// Where a batch's task arguments are. Every function reading them is inlined, and each kind
/// is built at a place where the kind is a constant, so the other arm is folded away.
#[derive(Clone, Copy)]
enum Entries {
    /// `len` entries of the launch's work table.
    Table(*const TaskArgs),
    /// One task, by value (`len == 1`).
    One(TaskArgs),
}

impl Entries {
    /// Entry `index` (`index < len`).
    ///
    /// # Safety
    /// For a table, `index` is below the batch's length.
    #[inline(always)]
    unsafe fn get(&self, index: u32) -> TaskArgs {
        match self {
            // SAFETY: index < len (caller's contract); the table holds len entries.
            Entries::Table(entries) => unsafe { *entries.add(index as usize) },
            Entries::One(task) => *task,
        }
    }
}

/// The windows of `entry`, when it passes the kernels' limits.
///
/// # Safety
/// The entry's contexts are 0 or host-built, alive for `'a`.
#[inline(always)]
pub(crate) unsafe fn checked_rank<'a>(entry: &TaskArgs) -> Option<Rank<'a>> {
    if entry.send_context == 0 || entry.recv_context == 0 {
        return None;
    }
    // SAFETY: non-null contexts built by the host, alive for 'a (caller's contract).
    let (send, recv) = unsafe {
        (
            &*(entry.send_context as *const SymmContext),
            &*(entry.recv_context as *const SymmContext),
        )
    };
    let valid = context_is_valid(send)
        && context_is_valid(recv)
        && send.rank == recv.rank
        && send.world_size == recv.world_size;
    valid.then_some(Rank { send, recv })
}

/// `entry` as a task of a rank whose windows are `rank`.
#[inline(always)]
fn task_of<'a>(rank: Rank<'a>, entry: &TaskArgs) -> Task<'a> {
    Task {
        rank,
        args: CollectiveArgs {
            send_offset: entry.send_offset,
            recv_offset: entry.recv_offset,
            count: entry.count,
            flags: entry.flags,
        },
        first_cell: entry.first_cell,
    }
}

impl<'a> Batch<'a> {
    /// Check the `len` entries at `entries` (one rank's tasks): every context valid, and every
    /// task of the same rank of the same communicator size as task 0. The threads of the block
    /// share the checks; the answer is the same on every thread. Every thread of the block
    /// calls it.
    ///
    /// # Safety
    /// `entries` holds `len >= 1` entries whose contexts are 0 or host-built, alive for `'a`.
    #[inline(always)]
    pub(crate) unsafe fn open(entries: *const TaskArgs, len: u32) -> Option<Batch<'a>> {
        // SAFETY: len >= 1 (caller's contract).
        let first_entry = unsafe { &*entries };
        // SAFETY: forwarded contract.
        let first_rank = unsafe { checked_rank(first_entry) };
        let mut bad = first_rank.is_none();
        if let Some(first) = first_rank {
            let mut index = 1 + arch::thread_idx_x();
            while index < len {
                // SAFETY: index < len.
                let entry = unsafe { &*entries.add(index as usize) };
                // SAFETY: forwarded contract.
                let matches = unsafe { checked_rank(entry) }.is_some_and(|rank| {
                    rank.send.rank == first.send.rank
                        && rank.send.world_size == first.send.world_size
                });
                bad |= !matches;
                index += arch::block_dim_x();
            }
        }
        if arch::sync_threads_or(bad) {
            return None;
        }
        Some(Batch {
            entries: Entries::Table(entries),
            len,
            _contexts: PhantomData,
        })
    }

    /// A batch of the one task `task`, held by value.
    ///
    /// # Safety
    /// The task's contexts are host-built, alive for `'a`, and already checked as
    /// [`checked_rank`] would (non-null, within the kernels' limits, one rank of one
    /// communicator size): the device functions check their context first.
    #[inline(always)]
    pub(crate) unsafe fn open_one(task: TaskArgs) -> Batch<'a> {
        Batch {
            entries: Entries::One(task),
            len: 1,
            _contexts: PhantomData,
        }
    }

    /// Number of tasks.
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.len
    }

    /// `true` for a batch without tasks (never: a launch has at least one).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Task 0: its windows carry the batch's synchronization.
    #[inline(always)]
    pub fn first(&self) -> Task<'a> {
        self.task(0)
    }

    /// Task `index` (the last task for an index past the end).
    #[inline(always)]
    pub fn task(&self, index: u32) -> Task<'a> {
        let index = Ord::min(index, self.len - 1);
        // SAFETY: index < len.
        let entry = unsafe { self.entries.get(index) };
        // SAFETY: `open` checked, and `open_one`'s caller checked, that every entry's contexts
        // are non-null, host-built and valid, alive for 'a.
        let rank = unsafe {
            Rank {
                send: &*(entry.send_context as *const SymmContext),
                recv: &*(entry.recv_context as *const SymmContext),
            }
        };
        task_of(rank, &entry)
    }

    /// The work-table entry of task `index` (the last task for an index past the end), as the
    /// host wrote it.
    #[inline(always)]
    pub fn entry(&self, index: u32) -> TaskArgs {
        let index = Ord::min(index, self.len - 1);
        // SAFETY: index < len.
        unsafe { self.entries.get(index) }
    }

    /// `first_cell` of task `index` (no context is read).
    #[inline(always)]
    fn first_cell(&self, index: u32) -> u64 {
        // SAFETY: index < len (callers).
        unsafe { self.entries.get(index) }.first_cell
    }

    /// Cells of the batch when a cell holds `per_cell` elements: the last task's first cell
    /// plus its cells.
    #[inline(always)]
    pub fn total_cells(&self, per_cell: u64) -> u64 {
        // SAFETY: len >= 1.
        let last = unsafe { self.entries.get(self.len - 1) };
        last.first_cell
            .saturating_add(last.count.div_ceil(Ord::max(per_cell, 1)))
    }

    /// For every task with cells in `[lo, hi)` (of `per_cell` elements each), in task order:
    /// `part(task, first, end)` with the task's elements `[first, end)` that lie in those cells
    /// (`first < end <= count`). Stops at the first `Err`. Every thread of the block makes the
    /// same calls (the walk depends only on the table and the range), so `part` may contain
    /// block barriers.
    #[inline(always)]
    pub fn walk<E>(
        &self,
        lo: u64,
        hi: u64,
        per_cell: u64,
        mut part: impl FnMut(&Task<'a>, u64, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        if lo >= hi {
            return Ok(());
        }
        let per_cell = Ord::max(per_cell, 1);
        // The last task whose first cell is at or before `lo` (first cells grow with the task).
        let (mut below, mut above) = (0u32, self.len);
        while above - below > 1 {
            let middle = below + (above - below) / 2;
            if self.first_cell(middle) <= lo {
                below = middle;
            } else {
                above = middle;
            }
        }
        let mut index = below;
        while index < self.len {
            let first_cell = self.first_cell(index);
            if first_cell >= hi {
                break;
            }
            let task = self.task(index);
            let cells = task.args.count.div_ceil(Ord::max(per_cell, 1));
            let from = Ord::max(lo, first_cell);
            let to = Ord::min(hi, first_cell.saturating_add(cells));
            if from < to {
                let first = (from - first_cell) * per_cell;
                let end = Ord::min((to - first_cell).saturating_mul(per_cell), task.args.count);
                if first < end {
                    part(&task, first, end)?;
                }
            }
            index += 1;
        }
        Ok(())
    }
}

/// Calls `pack(i)` for every whole pack `i` of `lanes` elements inside the elements `[lo, hi)`
/// and `element(i)` for the elements of the range before and after those packs; each thread of
/// the block takes its share (stride: the block size).
#[inline(always)]
pub fn for_packs_and_elements(
    lo: u64,
    hi: u64,
    lanes: u64,
    mut pack: impl FnMut(u64),
    mut element: impl FnMut(u64),
) {
    let lanes = Ord::max(lanes, 1);
    let first_pack = lo.div_ceil(lanes);
    let end_pack = Ord::max(hi / lanes, first_pack);
    let stride = arch::block_dim_x() as u64;
    let thread = arch::thread_idx_x() as u64;
    let mut i = first_pack + thread;
    while i < end_pack {
        pack(i);
        i += stride;
    }
    let (head_end, tail_start) = if first_pack < end_pack {
        (first_pack * lanes, end_pack * lanes)
    } else {
        (hi, hi)
    };
    let mut index = lo + thread;
    while index < head_end {
        element(index);
        index += stride;
    }
    let mut index = Ord::max(tail_start, lo) + thread;
    while index < hi {
        element(index);
        index += stride;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_cover_every_element_once() {
        for algorithm in Algorithm::ALL {
            for size in [1u64, 2, 4, 8] {
                let per = cell_elements(algorithm, size);
                assert!(per >= 1);
                for count in [0u64, 1, per - 1, per, per + 1, 10 * per + 3] {
                    let cells = task_cells(algorithm, size, count);
                    assert!(cells * per >= count && (cells == 0 || (cells - 1) * per < count));
                }
            }
        }
    }
}
