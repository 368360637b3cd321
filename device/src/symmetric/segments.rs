//! All-to-all, gather and scatter of a batch: byte movers between the ranks' segments (one
//! kernel each for every data type). `count` is the bytes of one segment: what one rank sends
//! to one peer. Each kernel passes a start barrier (every rank has reached this launch: the
//! buffers it writes are free and the buffers it reads hold their data) and an end barrier
//! (every copy has landed, and no rank returns while a peer may still read its buffers). Block
//! `b` of every rank handles the same bytes `[lo, hi)` of every segment (the batch's cells are
//! 1 KiB of a segment), so the per-block-index barriers pair as in every other kernel.
//!
//! - **All-to-all** stores: rank `r` copies segment `p` of its send buffer into segment `r` of
//!   peer `p`'s receive buffer (its own included). The receive buffer is symmetric; the send
//!   buffer may lie anywhere in its window. The barriers are on the receive window.
//! - **Gather** loads: the root copies the send buffer of every rank into segment `p` of its
//!   receive buffer. The send buffer is symmetric (the same offset of the same window on every
//!   rank); the other ranks' receive buffers are not used, as in NCCL. The barriers are on the
//!   send window, the one window every rank names. In place on the root (its send buffer is its
//!   own segment of its receive buffer), its segment is left alone.
//! - **Scatter** stores: the root copies segment `p` of its send buffer into the receive buffer
//!   of rank `p`. The receive buffer is symmetric; the other ranks' send buffers are not used.
//!   The barriers are on the receive window. In place on the root (its receive buffer is its
//!   own segment of its send buffer), that segment is left alone.
//!
//! Bytes move in 16-, 8-, 4- or 1-byte units: the largest that divides both addresses and the
//! block's range (16 bytes as a `u128`: `ld.v2.b64`/`st.v2.b64`). A block visits the peers in
//! an order rotated by its index, so that the blocks do not all store into one rank at once.

use super::Algorithm;
use super::batch::{Batch, cell_elements};
use super::frame::between_barriers;
use super::{FLAG_IN_PLACE, FLAG_ROOT, Grid, KernelStatus, block_range};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::barrier::CrossRankBarrier;

/// All-to-all of a batch (`count`: bytes per peer of each task).
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[send_offset, + world·count)`
/// (send window, this rank) and `[recv_offset, + world·count)` (receive window, every rank),
/// which do not overlap; every rank launches the same kernel, batch and shape.
#[inline(always)]
pub unsafe fn all_to_all(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.recv;
    let per_cell = cell_elements(Algorithm::AllToAll, 1);
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    let body = |_: &mut CrossRankBarrier<'_>| {
        batch.walk(lo, hi, per_cell, |task, first, end| {
            let recv = task.rank.recv;
            let bytes = task.args.count;
            let send = task
                .rank
                .send
                .local_base
                .wrapping_add(task.args.send_offset);
            let own_segment = recv.rank as u64 * bytes;
            each_peer(recv, grid.block, |peer| {
                // SAFETY: peer < world_size; segment `peer` of the send buffer and segment
                // `rank` of the peer's receive buffer hold `bytes` bytes (contract).
                unsafe {
                    let dst = recv
                        .peer_base(peer)
                        .wrapping_add(task.args.recv_offset)
                        .wrapping_add(own_segment);
                    copy_bytes(send.wrapping_add(peer as u64 * bytes), dst, first, end);
                }
            });
            Ok(())
        })
    };
    // SAFETY: forwarded contract.
    unsafe { between_barriers(ctx, grid, body) }
}

/// Gather of a batch to each task's root (`count`: bytes per rank of each task).
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[send_offset, + count)` (send
/// window, every rank) and, on the root, `[recv_offset, + world·count)` (receive window), which
/// do not overlap unless the root is in place ([`FLAG_IN_PLACE`]: its send buffer is segment
/// `root` of its receive buffer); exactly one rank of each task carries [`FLAG_ROOT`]; every
/// rank launches the same kernel, batch and shape.
#[inline(always)]
pub unsafe fn gather(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.send;
    let per_cell = cell_elements(Algorithm::Gather, 1);
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    let body = |_: &mut CrossRankBarrier<'_>| {
        batch.walk(lo, hi, per_cell, |task, first, end| {
            let flags = task.args.flags;
            if flags & FLAG_ROOT == 0 {
                return Ok(());
            }
            let send = task.rank.send;
            let bytes = task.args.count;
            let recv = task
                .rank
                .recv
                .local_base
                .wrapping_add(task.args.recv_offset);
            let skip = if flags & FLAG_IN_PLACE != 0 {
                send.rank
            } else {
                u32::MAX
            };
            each_peer(send, grid.block, |peer| {
                if peer == skip {
                    return;
                }
                // SAFETY: peer < world_size; the peer's send buffer and segment `peer` of
                // the receive buffer hold `bytes` bytes (contract).
                unsafe {
                    let src = send.peer_base(peer).wrapping_add(task.args.send_offset);
                    copy_bytes(src, recv.wrapping_add(peer as u64 * bytes), first, end);
                }
            });
            Ok(())
        })
    };
    // SAFETY: forwarded contract.
    unsafe { between_barriers(ctx, grid, body) }
}

/// Scatter of a batch from each task's root (`count`: bytes per rank of each task).
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[recv_offset, + count)`
/// (receive window, every rank) and, on the root, `[send_offset, + world·count)` (send window),
/// which do not overlap unless the root is in place ([`FLAG_IN_PLACE`]: its receive buffer is
/// segment `root` of its send buffer); exactly one rank of each task carries [`FLAG_ROOT`];
/// every rank launches the same kernel, batch and shape.
#[inline(always)]
pub unsafe fn scatter(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.recv;
    let per_cell = cell_elements(Algorithm::Scatter, 1);
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    let body = |_: &mut CrossRankBarrier<'_>| {
        batch.walk(lo, hi, per_cell, |task, first, end| {
            let flags = task.args.flags;
            if flags & FLAG_ROOT == 0 {
                return Ok(());
            }
            let recv = task.rank.recv;
            let bytes = task.args.count;
            let send = task
                .rank
                .send
                .local_base
                .wrapping_add(task.args.send_offset);
            let skip = if flags & FLAG_IN_PLACE != 0 {
                recv.rank
            } else {
                u32::MAX
            };
            each_peer(recv, grid.block, |peer| {
                if peer == skip {
                    return;
                }
                // SAFETY: peer < world_size; segment `peer` of the send buffer and the
                // peer's receive buffer hold `bytes` bytes (contract).
                unsafe {
                    let dst = recv.peer_base(peer).wrapping_add(task.args.recv_offset);
                    copy_bytes(send.wrapping_add(peer as u64 * bytes), dst, first, end);
                }
            });
            Ok(())
        })
    };
    // SAFETY: forwarded contract.
    unsafe { between_barriers(ctx, grid, body) }
}

/// `visit(peer)` for every rank of `ctx`, starting at `block mod world` and wrapping around.
#[inline(always)]
fn each_peer(ctx: &SymmContext, block: u32, mut visit: impl FnMut(u32)) {
    let world = ctx.world_size;
    // `checked_rem`: no division-by-zero panic path (a context always has ranks).
    let mut peer = block.checked_rem(world).unwrap_or(0);
    for _ in 0..world {
        visit(peer);
        peer += 1;
        if peer == world {
            peer = 0;
        }
    }
}

/// Copy the bytes `[lo, hi)` from `src` to `dst`, shared among the block's threads, in the
/// largest unit that divides both addresses and both ends.
///
/// # Safety
/// `[src + lo, src + hi)` is readable and `[dst + lo, dst + hi)` writable, and they do not
/// overlap.
#[inline(always)]
pub(crate) unsafe fn copy_bytes(src: u64, dst: u64, lo: u64, hi: u64) {
    let alignment = src | dst | lo | hi;
    // SAFETY: forwarded contract; the unit divides both addresses, `lo` and `hi`.
    unsafe {
        if alignment.is_multiple_of(16) {
            copy_units::<u128>(src, dst, lo / 16, hi / 16);
        } else if alignment.is_multiple_of(8) {
            copy_units::<u64>(src, dst, lo / 8, hi / 8);
        } else if alignment.is_multiple_of(4) {
            copy_units::<u32>(src, dst, lo / 4, hi / 4);
        } else {
            copy_units::<u8>(src, dst, lo, hi);
        }
    }
}

/// Copy the values `[lo, hi)` of `U` from `src` to `dst`, shared among the block's threads (a
/// block's only thread copies them as one `memcpy`).
///
/// # Safety
/// As for [`copy_bytes`], in units of `U`, both addresses aligned for it.
#[inline(always)]
unsafe fn copy_units<U: Copy>(src: u64, dst: u64, lo: u64, hi: u64) {
    if arch::single_thread_block() {
        if lo < hi {
            // SAFETY: forwarded contract: `hi - lo` values of `U` at each, not overlapping.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    (src as *const U).add(lo as usize),
                    (dst as *mut U).add(lo as usize),
                    (hi - lo) as usize,
                )
            };
        }
        return;
    }
    let stride = arch::block_dim_x() as u64;
    let mut i = lo + arch::thread_idx_x() as u64;
    while i < hi {
        // SAFETY: i < hi; forwarded contract.
        unsafe {
            let value = (src as *const U).add(i as usize).read();
            (dst as *mut U).add(i as usize).write(value);
        }
        i += stride;
    }
}
