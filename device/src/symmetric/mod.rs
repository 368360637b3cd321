//! Symmetric-memory collective kernels, one module per collective. Each kernel is a plain
//! function that every thread of the grid calls; the PTX entry points in [`crate::exports`]
//! and the host backend both reach these same functions through [`dispatch`].
//!
//! A launch may serve several ranks at once (several ranks on one GPU, launched together so
//! that they are co-resident): [`Grid`] is the calling block's place among the blocks of *its*
//! rank, and [`for_virtual_rank`] maps the launched grid onto the ranks. It may also run several
//! tasks (collectives fused by a group): see [`batch`].

mod algorithm;
pub mod all_gather;
pub mod all_reduce;
pub mod all_to_all_v;
pub mod batch;
pub mod broadcast;
pub mod dispatch;
mod frame;
mod low_latency;
pub mod pat;
pub mod point_to_point;
pub mod reduce_scatter;
pub mod segments;
pub mod vector;

use crate::arch;
use crate::context::SymmContext;
pub use crate::sync::abort::{
    ABORT_INVALID_LAUNCH, ABORT_PEER_FAILED, ABORT_TIMED_OUT, abort_timed_out_waiting_for,
    timed_out_peer,
};
pub use crate::sync::grid::{Grid, block_range};
use crate::sync::signal_pad::{MAX_BLOCKS, MAX_RANKS, out_of_step_slot};
pub use algorithm::Algorithm;
pub use batch::{Batch, Task, TaskArgs};

/// How a kernel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelStatus {
    /// The collective completed on this rank.
    Completed,
    /// A wait on a peer timed out or the window was already aborted; the abort word is set.
    Aborted,
    /// The launch shape or context violates the kernel's limits; nothing was touched.
    InvalidLaunch,
}

/// One task's arguments as one rank runs it. Offsets are bytes from the base of the window they
/// lie in (the send window for `send_offset`, the receive window for `recv_offset`) and the
/// same on every rank where peers use them: symmetric buffers sit at the same offset of the
/// same window on every rank. `count` is in elements (all-gather: bytes per rank; broadcast:
/// bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CollectiveArgs {
    /// Byte offset of the send buffer in the send window (unused when the rank is in place:
    /// see [`FLAG_IN_PLACE`]).
    pub send_offset: u64,
    /// Byte offset of the receive buffer in the receive window.
    pub recv_offset: u64,
    /// Elements (all-reduce: total; reduce-scatter: per rank), bytes per rank (all-gather) or
    /// bytes (broadcast).
    pub count: u64,
    /// This rank's flags ([`FLAG_IN_PLACE`], [`FLAG_ROOT`], [`FLAG_REDUCE_TO_ROOT`]).
    pub flags: u32,
}

/// `flags` bit: this rank's call is in place. All-reduce: the receive buffer is the send
/// buffer. All-gather: the send buffer is this rank's segment of the receive buffer.
/// Reduce-scatter: the receive buffer is this rank's segment of the send buffer. Broadcast (on
/// the root; meaningless elsewhere): the send buffer is the receive buffer. Ranks of one
/// collective may differ in this flag; every kernel's cross-rank protocol is the same either
/// way.
pub const FLAG_IN_PLACE: u32 = 1;

/// `flags` bit of a rooted task (broadcast, reduce): this rank is the task's root (broadcast:
/// the one whose send buffer every rank receives; reduce: the one that receives the result).
/// Exactly one rank of a rooted task carries it; the other kernels ignore it.
pub const FLAG_ROOT: u32 = 2;

/// `flags` bit of a one-shot all-reduce task, the same on every rank: the task is a reduce,
/// whose result only the root ([`FLAG_ROOT`]) stores (NCCL's `ncclReduce`). The other ranks
/// touch neither buffer of the task (their receive buffer is unused) and take the same
/// barriers. Only the one-shot all-reduce kernel runs such tasks.
pub const FLAG_REDUCE_TO_ROOT: u32 = 4;

/// One rank's view of a launch: the windows of its buffers.
#[derive(Clone, Copy, Debug)]
pub struct Rank<'a> {
    /// The window holding the send buffer.
    pub send: &'a SymmContext,
    /// The window holding the receive buffer.
    pub recv: &'a SymmContext,
}

/// `true` when `ctx` passes the kernels' limits (world size, rank).
#[inline(always)]
pub(crate) fn context_is_valid(ctx: &SymmContext) -> bool {
    ctx.world_size != 0 && ctx.world_size as usize <= MAX_RANKS && ctx.rank < ctx.world_size
}

/// Map the launched grid onto `rank_count` ranks (blocks `[k·per, (k+1)·per)` serve the
/// `k`-th rank, whose tasks are entries `[k·task_count, (k+1)·task_count)` of `tasks`): the
/// calling block's rank's batch and its place among that rank's blocks. The shape and the
/// table are checked first (the block's threads share the checks of the entries); on a
/// violation nothing is touched and the result is `Err(KernelStatus::InvalidLaunch)` (see
/// [`report_invalid_launch`]). Kernels call their body directly with the result (no closure),
/// so that everything inlines into the entry point and no argument goes through local memory.
/// Every thread of the block calls it.
///
/// # Safety
/// `tasks` must hold `rank_count × task_count` entries whose contexts were built by the host;
/// the contexts outlive `'a`.
#[inline(always)]
pub unsafe fn resolve_launch<'a>(
    tasks: *const TaskArgs,
    task_count: u32,
    rank_count: u32,
) -> Result<(Batch<'a>, Grid), KernelStatus> {
    let launched = arch::grid_dim_x();
    if tasks.is_null() || task_count == 0 || rank_count == 0 || !launched.is_multiple_of(rank_count)
    {
        return Err(KernelStatus::InvalidLaunch);
    }
    let blocks = launched / rank_count;
    if blocks as usize > MAX_BLOCKS {
        return Err(KernelStatus::InvalidLaunch);
    }
    let block = arch::block_idx_x();
    // SAFETY: block / blocks < rank_count, and the table holds rank_count × task_count
    // entries.
    let entries = unsafe { tasks.add((block / blocks) as usize * task_count as usize) };
    // SAFETY: forwarded contract; task_count >= 1.
    let batch = unsafe { Batch::open(entries, task_count) }.ok_or(KernelStatus::InvalidLaunch)?;
    let grid = Grid {
        block: block % blocks,
        blocks,
    };
    Ok((batch, grid))
}

/// [`resolve_launch`], then `kernel` for the calling block (or the refusal's status).
///
/// # Safety
/// As for [`resolve_launch`].
#[inline(always)]
pub unsafe fn for_virtual_rank(
    tasks: *const TaskArgs,
    task_count: u32,
    rank_count: u32,
    kernel: impl FnOnce(&Batch<'_>, Grid) -> KernelStatus,
) -> KernelStatus {
    // SAFETY: forwarded contract.
    match unsafe { resolve_launch(tasks, task_count, rank_count) } {
        Ok((batch, grid)) => kernel(&batch, grid),
        Err(status) => status,
    }
}

/// Make a refused launch visible to the host: raise the abort word of every context of the
/// first task of the calling block's rank that can be read, with [`ABORT_INVALID_LAUNCH`]
/// (unless a timeout was already recorded). Called by the exported kernels, which have no other
/// way to report.
///
/// # Safety
/// As for [`for_virtual_rank`].
pub unsafe fn report_invalid_launch(tasks: *const TaskArgs, task_count: u32, rank_count: u32) {
    if tasks.is_null() || task_count == 0 || rank_count == 0 || arch::thread_idx_x() != 0 {
        return;
    }
    let slot = (arch::block_idx_x() as u64 * rank_count as u64 / arch::grid_dim_x() as u64)
        .min(rank_count as u64 - 1);
    // SAFETY: slot < rank_count (caller's contract for the table).
    let entry = unsafe { &*tasks.add(slot as usize * task_count as usize) };
    // SAFETY: the entry's contexts are 0 or host-built (caller's contract).
    unsafe {
        raise_invalid_launch(entry.send_context);
        raise_invalid_launch(entry.recv_context);
    }
}

/// Raise the abort word of the context at `context` (if not 0) with [`ABORT_INVALID_LAUNCH`],
/// unless it is already raised, and set its window's out-of-step mark: the refused launch
/// announced nothing its peers wait for, so no later kernel of this rank on the window may
/// announce a barrier (it would pair with the peers' refused call; see `sync::barrier`).
///
/// # Safety
/// `context` is 0 or the address of a host-built context.
#[inline(always)]
pub(crate) unsafe fn raise_invalid_launch(context: u64) {
    // SAFETY: forwarded contract.
    unsafe { raise_refusal(context, ABORT_INVALID_LAUNCH) }
}

/// [`raise_invalid_launch`] with the abort word `word` (a refusal that says more than
/// [`ABORT_INVALID_LAUNCH`]).
///
/// # Safety
/// As for [`raise_invalid_launch`].
#[inline(always)]
pub(crate) unsafe fn raise_refusal(context: u64, word: u32) {
    if context == 0 {
        return;
    }
    // SAFETY: a host-built context.
    let ctx = unsafe { &*(context as *const SymmContext) };
    if ctx.peer_signal_pads != 0 && ctx.rank < ctx.world_size {
        // SAFETY: rank < world_size, so the table entry is this rank's pad, whose mark kernels
        // access atomically.
        unsafe {
            let mark = out_of_step_slot(ctx.peer_signal_pad(ctx.rank));
            arch::store_release_sys_u32(mark, 1);
        }
    }
    let abort = ctx.abort_flag as *mut u32;
    if !abort.is_null() {
        // Only a clear word is raised: a concurrent timeout report keeps its value.
        // SAFETY: the abort word is a valid u32 that kernels and the host access atomically.
        unsafe { arch::compare_exchange_sys_u32(abort, 0, word) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_launch_raises_clear_words_and_keeps_a_timeout() {
        use crate::context::SymmContext;
        let mut words = [0u32, ABORT_TIMED_OUT];
        let contexts: std::vec::Vec<SymmContext> = words
            .iter_mut()
            .map(|word| SymmContext {
                abort_flag: word as *mut u32 as u64,
                ..bytemuck::Zeroable::zeroed()
            })
            .collect();
        let table: std::vec::Vec<TaskArgs> = contexts
            .iter()
            .map(|context| TaskArgs {
                send_context: context as *const SymmContext as u64,
                ..bytemuck::Zeroable::zeroed()
            })
            .collect();
        arch::host::run_grid(2, 4, &|| {
            // SAFETY: a table of two ranks' single tasks over live contexts; 0 stands for "no
            // context".
            unsafe { report_invalid_launch(table.as_ptr(), 1, 2) };
        });
        assert_eq!(words, [ABORT_INVALID_LAUNCH, ABORT_TIMED_OUT]);
    }
}
