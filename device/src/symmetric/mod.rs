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

/// Arguments shared by every collective kernel. Offsets are bytes from the window base of the
/// context and the same on every rank; `count` is in elements (all-gather: bytes per rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveArgs {
    /// Byte offset of the send buffer.
    pub send_offset: u64,
    /// Byte offset of the receive buffer (may point into another window of the same rank:
    /// the addition wraps).
    pub recv_offset: u64,
    /// Elements (all-reduce: total; reduce-scatter: per rank) or bytes per rank (all-gather).
    pub count: u64,
    /// Algorithm-specific flags (see each kernel).
    pub flags: u32,
}

/// The contiguous range `[lo, hi)` of `count` items owned by `block` of `blocks`.
/// Every rank computes the same partition, so block `b` of every rank handles the same range.
#[inline(always)]
pub fn block_range(count: u64, block: u32, blocks: u32) -> (u64, u64) {
    let per_block = count.div_ceil(blocks as u64);
    let lo = (block as u64 * per_block).min(count);
    let hi = (lo + per_block).min(count);
    (lo, hi)
}

/// Map the launched grid onto `context_count` ranks (blocks `[k·per, (k+1)·per)` serve the
/// rank whose context address is `contexts[k]`) and run `kernel` for the calling block.
///
/// # Safety
/// `contexts` must hold `context_count` addresses of host-built contexts.
#[inline(always)]
pub unsafe fn for_virtual_rank(
    contexts: *const u64,
    context_count: u32,
    kernel: impl FnOnce(&SymmContext, Grid) -> KernelStatus,
) -> KernelStatus {
    let launched = arch::grid_dim_x();
    if context_count == 0 || !launched.is_multiple_of(context_count) {
        return KernelStatus::InvalidLaunch;
    }
    let blocks = launched / context_count;
    let block = arch::block_idx_x();
    // SAFETY: block / blocks < context_count, and the table holds that many addresses.
    let ctx = unsafe { &*(*contexts.add((block / blocks) as usize) as *const SymmContext) };
    if blocks as usize > MAX_BLOCKS
        || ctx.world_size == 0
        || ctx.world_size as usize > MAX_RANKS
        || ctx.rank >= ctx.world_size
    {
        return KernelStatus::InvalidLaunch;
    }
    kernel(
        ctx,
        Grid {
            block: block % blocks,
            blocks,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
