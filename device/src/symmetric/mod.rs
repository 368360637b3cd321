//! Symmetric-memory collective kernels, one module per collective. Each kernel is a plain
//! function that every thread of the grid calls; the PTX entry points in [`crate::exports`]
//! and the host backend both reach these same functions through [`dispatch`].
//!
//! A launch may serve several ranks at once (several ranks on one GPU, launched together so
//! that they are co-resident): [`Grid`] is the calling block's place among the blocks of *its*
//! rank, and [`for_virtual_rank`] maps the launched grid onto the ranks.

pub mod all_gather;
pub mod all_reduce;
pub mod dispatch;
mod low_latency;
pub mod reduce_scatter;
pub mod vector;

use crate::arch;
use crate::context::SymmContext;
use crate::sync::signal_pad::{MAX_BLOCKS, MAX_RANKS};

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

/// The calling block's index among the blocks that serve its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    /// Block index within the rank, `0 <= block < blocks`.
    pub block: u32,
    /// Blocks serving the rank.
    pub blocks: u32,
}

/// Arguments shared by every rank of one collective launch. Offsets are bytes from the base of
/// the window they lie in (the send window for `send_offset`, the receive window for
/// `recv_offset`) and the same on every rank: symmetric buffers sit at the same offset of the
/// same window on every rank. `count` is in elements (all-gather: bytes per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CollectiveArgs {
    /// Byte offset of the send buffer in the send window (unused when the rank is in place:
    /// see [`FLAG_IN_PLACE`]).
    pub send_offset: u64,
    /// Byte offset of the receive buffer in the receive window.
    pub recv_offset: u64,
    /// Elements (all-reduce: total; reduce-scatter: per rank) or bytes per rank (all-gather).
    pub count: u64,
    /// Flags: the launch's, or-ed with the calling rank's [`RankArgs::flags`].
    pub flags: u32,
}

/// `flags` bit: this rank's call is in place. All-reduce: the receive buffer is the send
/// buffer. All-gather: the send buffer is this rank's segment of the receive buffer.
/// Reduce-scatter: the receive buffer is this rank's segment of the send buffer. Ranks of one
/// collective may differ in this flag; every kernel's cross-rank protocol is the same either
/// way.
pub const FLAG_IN_PLACE: u32 = 1;

/// One rank's entry in a launch's rank table: the contexts of the windows holding its send and
/// receive buffers, and its own flags. A launch serving `n` ranks (several ranks sharing one
/// GPU) passes a device table of `n` entries; blocks `[k·per, (k+1)·per)` serve entry `k`.
/// Mirrored by `symmRankArgs` in the host shim; the layout is locked below.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RankArgs {
    /// Address of the [`SymmContext`] of the window holding the send buffer.
    pub send_context: u64,
    /// Address of the [`SymmContext`] of the window holding the receive buffer (equal to
    /// `send_context` when both buffers lie in one window).
    pub recv_context: u64,
    /// This rank's flags ([`FLAG_IN_PLACE`]).
    pub flags: u32,
    /// Zero.
    pub reserved: u32,
}

static_assertions::const_assert_eq!(core::mem::size_of::<RankArgs>(), 24);
static_assertions::const_assert_eq!(core::mem::align_of::<RankArgs>(), 8);

/// One rank's view of a launch: the windows of its buffers.
#[derive(Clone, Copy, Debug)]
pub struct Rank<'a> {
    /// The window holding the send buffer.
    pub send: &'a SymmContext,
    /// The window holding the receive buffer.
    pub recv: &'a SymmContext,
}

/// The contiguous range `[lo, hi)` of `count` items owned by `block` of `blocks`.
/// Every rank computes the same partition, so block `b` of every rank handles the same range.
#[inline(always)]
pub fn block_range(count: u64, block: u32, blocks: u32) -> (u64, u64) {
    // `blocks` is never 0 (launch shapes are checked); `max` lets the compiler see it, so no
    // division-by-zero panic path is emitted.
    let per_block = count.div_ceil(blocks.max(1) as u64);
    let lo = (block as u64 * per_block).min(count);
    let hi = (lo + per_block).min(count);
    (lo, hi)
}

/// `true` when `ctx` passes the kernels' limits (world size, rank).
#[inline(always)]
pub(crate) fn context_is_valid(ctx: &SymmContext) -> bool {
    ctx.world_size != 0 && ctx.world_size as usize <= MAX_RANKS && ctx.rank < ctx.world_size
}

/// Map the launched grid onto `rank_count` ranks (blocks `[k·per, (k+1)·per)` serve the rank of
/// `ranks[k]`): the calling block's rank, its place among that rank's blocks, and the launch's
/// `args` with the rank's flags or-ed in. The shape and the table are checked first; on a
/// violation nothing is touched and the result is `Err(KernelStatus::InvalidLaunch)` (see
/// [`report_invalid_launch`]). Kernels call their body directly with the result (no closure),
/// so that everything inlines into the entry point and no argument goes through local memory.
///
/// # Safety
/// `ranks` must hold `rank_count` entries whose contexts were built by the host; the contexts
/// outlive `'a`.
#[inline(always)]
pub unsafe fn resolve_launch<'a>(
    ranks: *const RankArgs,
    rank_count: u32,
    args: &CollectiveArgs,
) -> Result<(Rank<'a>, Grid, CollectiveArgs), KernelStatus> {
    let launched = arch::grid_dim_x();
    if ranks.is_null() || rank_count == 0 || !launched.is_multiple_of(rank_count) {
        return Err(KernelStatus::InvalidLaunch);
    }
    let blocks = launched / rank_count;
    let block = arch::block_idx_x();
    // SAFETY: block / blocks < rank_count, and the table holds that many entries.
    let entry = unsafe { &*ranks.add((block / blocks) as usize) };
    if entry.send_context == 0 || entry.recv_context == 0 {
        return Err(KernelStatus::InvalidLaunch);
    }
    // SAFETY: non-null contexts built by the host, alive for 'a (caller's contract).
    let (send, recv) = unsafe {
        (
            &*(entry.send_context as *const SymmContext),
            &*(entry.recv_context as *const SymmContext),
        )
    };
    if blocks as usize > MAX_BLOCKS
        || !context_is_valid(send)
        || !context_is_valid(recv)
        || send.rank != recv.rank
        || send.world_size != recv.world_size
    {
        return Err(KernelStatus::InvalidLaunch);
    }
    let args = CollectiveArgs {
        flags: args.flags | entry.flags,
        ..*args
    };
    let grid = Grid {
        block: block % blocks,
        blocks,
    };
    Ok((Rank { send, recv }, grid, args))
}

/// [`resolve_launch`], then `kernel` for the calling block (or the refusal's status).
///
/// # Safety
/// As for [`resolve_launch`].
#[inline(always)]
pub unsafe fn for_virtual_rank(
    ranks: *const RankArgs,
    rank_count: u32,
    args: &CollectiveArgs,
    kernel: impl FnOnce(Rank<'_>, Grid, &CollectiveArgs) -> KernelStatus,
) -> KernelStatus {
    // SAFETY: forwarded contract.
    match unsafe { resolve_launch(ranks, rank_count, args) } {
        Ok((rank, grid, args)) => kernel(rank, grid, &args),
        Err(status) => status,
    }
}

/// Abort-word value of a window whose kernel gave up waiting for a peer.
pub const ABORT_TIMED_OUT: u32 = 1;
/// Abort-word value of a window whose kernel refused its launch (shape or arguments outside the
/// kernel's limits); nothing was touched.
pub const ABORT_INVALID_LAUNCH: u32 = 2;

/// Make a refused launch visible to the host: raise the abort word of every context of the
/// calling block's rank entry that can be read, with [`ABORT_INVALID_LAUNCH`] (unless a timeout
/// was already recorded). Called by the exported kernels, which have no other way to report.
///
/// # Safety
/// As for [`for_virtual_rank`].
pub unsafe fn report_invalid_launch(ranks: *const RankArgs, rank_count: u32) {
    if ranks.is_null() || rank_count == 0 || arch::thread_idx_x() != 0 {
        return;
    }
    let entry_index = (arch::block_idx_x() as u64 * rank_count as u64 / arch::grid_dim_x() as u64)
        .min(rank_count as u64 - 1);
    // SAFETY: entry_index < rank_count (caller's contract for the table).
    let entry = unsafe { &*ranks.add(entry_index as usize) };
    // SAFETY: the entry's contexts are 0 or host-built (caller's contract).
    unsafe {
        raise_invalid_launch(entry.send_context);
        raise_invalid_launch(entry.recv_context);
    }
}

/// Raise the abort word of the context at `context` (if not 0) with [`ABORT_INVALID_LAUNCH`],
/// unless it is already raised.
///
/// # Safety
/// `context` is 0 or the address of a host-built context.
#[inline(always)]
unsafe fn raise_invalid_launch(context: u64) {
    if context == 0 {
        return;
    }
    // SAFETY: a host-built context; its abort word is a valid u32 that kernels and the host
    // access atomically.
    unsafe {
        let abort = (*(context as *const SymmContext)).abort_flag as *mut u32;
        if !abort.is_null() {
            // Only a clear word is raised: a concurrent timeout report keeps its value.
            arch::compare_exchange_sys_u32(abort, 0, ABORT_INVALID_LAUNCH);
        }
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
        let table: std::vec::Vec<RankArgs> = contexts
            .iter()
            .map(|context| RankArgs {
                send_context: context as *const SymmContext as u64,
                recv_context: 0,
                flags: 0,
                reserved: 0,
            })
            .collect();
        arch::host::run_grid(2, 4, &|| {
            // SAFETY: a table of two entries over live contexts; 0 stands for "no context".
            unsafe { report_invalid_launch(table.as_ptr(), 2) };
        });
        assert_eq!(words, [ABORT_INVALID_LAUNCH, ABORT_TIMED_OUT]);
    }

    #[test]
    fn block_ranges_tile_the_count() {
        for count in [0u64, 1, 7, 63, 64, 65, 1000, 4099] {
            for blocks in 1..=9u32 {
                let mut next = 0;
                for b in 0..blocks {
                    let (lo, hi) = block_range(count, b, blocks);
                    assert_eq!(lo, next.min(count));
                    assert!(hi >= lo);
                    next = hi;
                }
                assert_eq!(next, count);
            }
        }
    }
}
