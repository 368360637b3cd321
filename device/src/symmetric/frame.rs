//! The frame every collective kernel runs in and the store they share: [`between_barriers`]
//! (a start barrier, the body, an end barrier) and [`fan_out`] (a block's values stored into
//! every rank's window), below the collectives that use them.

use super::{Grid, KernelStatus};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::barrier::{Aborted, CrossRankBarrier};

/// Run `body` between a start and an end barrier of the calling block; the common frame of
/// every collective.
///
/// # Safety
/// `ctx` is host-built and `grid` comes from [`super::for_virtual_rank`]; every thread of the
/// block calls this with the same arguments.
#[inline(always)]
pub(crate) unsafe fn between_barriers(
    ctx: &SymmContext,
    grid: Grid,
    body: impl FnOnce(&mut CrossRankBarrier<'_>) -> Result<(), Aborted>,
) -> KernelStatus {
    // No look at the abort word (host memory) before the start barrier: the start barrier
    // refuses a window out of step before announcing and looks at the word while it waits,
    // before `body` touches a peer's memory (see `sync::barrier`).
    // SAFETY: limits were checked by `for_virtual_rank`; every thread runs this sequence.
    let started = unsafe { CrossRankBarrier::open(ctx, grid.block) }.start();
    let Ok(mut barrier) = started else {
        return KernelStatus::Aborted;
    };
    let result = body(&mut barrier).and_then(|()| barrier.sync());
    barrier.finish();
    match result {
        Ok(()) => KernelStatus::Completed,
        Err(Aborted) => KernelStatus::Aborted,
    }
}

/// Copy the values `[lo, hi)` of `U` at `src` to `recv_offset` of every rank's window but
/// rank `skip`, ranks in the order `first, first + 1, …` (modulo the world): each thread of the
/// block loads its share of the values once and stores each into every rank.
///
/// # Safety
/// `ctx` is host-built; `first < world_size`; the source range and every rank's destination
/// range are valid and aligned for `U`, and do not overlap, but for the skipped rank's and for
/// a destination that is the source itself (each unit is then stored back unchanged, by the
/// thread that loaded it).
#[inline(always)]
pub(crate) unsafe fn fan_out<U: Copy>(
    ctx: &SymmContext,
    src: u64,
    recv_offset: u64,
    skip: u32,
    first: u32,
    lo: u64,
    hi: u64,
) {
    if arch::single_thread_block() {
        // SAFETY: forwarded contract.
        unsafe { fan_out_whole_range::<U>(ctx, src, recv_offset, skip, first, lo, hi) };
        return;
    }
    let stride = arch::block_dim_x() as u64;
    let mut i = lo + arch::thread_idx_x() as u64;
    while i < hi {
        // SAFETY: i < hi; forwarded contract.
        let value = unsafe { (src as *const U).add(i as usize).read() };
        let mut peer = first;
        for _ in 0..ctx.world_size {
            if peer != skip {
                // SAFETY: peer < world_size; the destination range is valid (contract).
                unsafe {
                    let dst = ctx.peer_base(peer).wrapping_add(recv_offset) as *mut U;
                    dst.add(i as usize).write(value);
                }
            }
            peer += 1;
            if peer == ctx.world_size {
                peer = 0;
            }
        }
        i += stride;
    }
}

/// [`fan_out`] by a block's only thread: the range in pieces of [`WHOLE_RANGE_PIECE_BYTES`],
/// each copied into every destination (one `memcpy` each, where the loop of units stores one
/// value at a time) while it is still in the cache, a destination that is the source itself
/// left alone.
///
/// # Safety
/// As for [`fan_out`].
#[inline(always)]
unsafe fn fan_out_whole_range<U: Copy>(
    ctx: &SymmContext,
    src: u64,
    recv_offset: u64,
    skip: u32,
    first: u32,
    lo: u64,
    hi: u64,
) {
    let piece = (WHOLE_RANGE_PIECE_BYTES / core::mem::size_of::<U>()).max(1) as u64;
    let mut start = lo;
    while start < hi {
        let units = piece.min(hi - start) as usize;
        // SAFETY: start < hi and the source range is valid (contract).
        let from = unsafe { (src as *const U).add(start as usize) };
        let mut peer = first;
        for _ in 0..ctx.world_size {
            if peer != skip {
                // SAFETY: peer < world_size; the destination range is valid (contract).
                let to = unsafe {
                    (ctx.peer_base(peer).wrapping_add(recv_offset) as *mut U).add(start as usize)
                };
                if !core::ptr::eq(to.cast_const(), from) {
                    // SAFETY: both ranges are valid and aligned for `units` values of `U`, and a
                    // destination other than the source does not overlap it (contract).
                    unsafe { core::ptr::copy_nonoverlapping(from, to, units) };
                }
            }
            peer += 1;
            if peer == ctx.world_size {
                peer = 0;
            }
        }
        start += units as u64;
    }
}

/// Bytes of the source that [`fan_out_whole_range`] copies into every destination before it
/// moves on: small enough to stay in a core's cache, so the source is read from memory once.
const WHOLE_RANGE_PIECE_BYTES: usize = 32 * 1024;
