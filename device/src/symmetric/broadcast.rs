//! Broadcast of a batch: for each task, the root stores its `count` bytes into the receive
//! buffer of every rank, between a start barrier (every rank has reached this launch, so its
//! receive buffer is free to overwrite) and an end barrier (the root's stores have landed in
//! every rank, and no rank returns while the root may still read its send buffer), both on the
//! batch window (task 0's receive window, as for the all-gathers). The root of each task is the
//! rank whose entry carries [`FLAG_ROOT`]; the other ranks' blocks only take part in the
//! barriers. Block `b` of the root copies the same cells (1 KiB of the payload) of the batch as
//! block `b` of every other rank would, so the per-block-index barriers pair as in every other
//! kernel.
//!
//! **Why the root pushes (stores) rather than every rank pulling (loading).** Only the root
//! knows where its data is: as in NCCL, the other ranks' `sendbuff` is ignored, so its offset
//! is not known to them, while every receive buffer is symmetric (the same offset of the same
//! window on every rank), which is all a push needs. It is also the faster transport on
//! NVLink: stores are posted (no round trip per access), each 16-byte unit is loaded once from
//! the root's memory and stored to every peer, and the root's outgoing bandwidth bounds a
//! broadcast either way (it sends `(n − 1) · count` bytes whether it stores them or the peers
//! load them). It is the all-gather's store path with one sender. The price is that only the
//! root's blocks move data; a tree or a pull by the receivers would spread that work, and
//! neither is implemented.

use super::Algorithm;
use super::batch::{Batch, Task, cell_elements};
use super::frame::{between_barriers, fan_out};
use super::{FLAG_IN_PLACE, FLAG_ROOT, Grid, KernelStatus, block_range};

/// Broadcast of a batch (`count`: bytes of each task).
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[recv_offset, + count)`
/// (receive window, every rank) and, on the task's root, `[send_offset, + count)` (send window;
/// unused when the root is in place, [`FLAG_IN_PLACE`]: its receive buffer holds the data);
/// exactly one rank of each task carries [`FLAG_ROOT`]; every rank launches the same kernel,
/// batch and shape.
#[inline(always)]
pub unsafe fn broadcast(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.recv;
    let per_cell = cell_elements(Algorithm::Broadcast, 1);
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            batch.walk(lo, hi, per_cell, |task, first, end| {
                if task.args.flags & FLAG_ROOT != 0 {
                    push_part(task, first, end, grid.block);
                }
                Ok(())
            })
        })
    }
}

/// Bytes `[lo, hi)` of one task, from the root into every rank's receive buffer (itself
/// included unless it is in place). The unit of the copy (16, 8, 4 or 1 bytes) is the largest
/// that divides the source address, the byte count, the receive offset and every rank's window
/// base; `lo` starts a cell, so it is a multiple of every unit. 16 bytes travel as a `u128`
/// (`ld.v2.b64`/`st.v2.b64`): a 16-byte aggregate held across the stores would be kept in
/// local memory. `block` rotates the order of
/// the destinations, so that the root's blocks do not all store into the same rank at once.
///
/// # Safety
/// Contract of [`broadcast`], called on the task's root; `hi <= count`.
#[inline(always)]
unsafe fn push_part(task: &Task<'_>, lo: u64, hi: u64, block: u32) {
    let ctx = task.rank.recv;
    let args = &task.args;
    let in_place = args.flags & FLAG_IN_PLACE != 0;
    let src = if in_place {
        ctx.local_base.wrapping_add(args.recv_offset)
    } else {
        task.rank.send.local_base.wrapping_add(args.send_offset)
    };
    let mut alignment = src | args.recv_offset | args.count | lo;
    for peer in 0..ctx.world_size {
        // SAFETY: peer < world_size; the context is host-built.
        alignment |= unsafe { ctx.peer_base(peer) };
    }
    // In place, the root's own receive buffer is the source: it is left alone.
    let skip = if in_place { ctx.rank } else { u32::MAX };
    let first = block % ctx.world_size;
    // SAFETY: forwarded contract; the unit divides the source, every destination, `lo` and
    // `hi`.
    unsafe {
        if alignment.is_multiple_of(16) {
            fan_out::<u128>(ctx, src, args.recv_offset, skip, first, lo / 16, hi / 16);
        } else if alignment.is_multiple_of(8) {
            fan_out::<u64>(ctx, src, args.recv_offset, skip, first, lo / 8, hi / 8);
        } else if alignment.is_multiple_of(4) {
            fan_out::<u32>(ctx, src, args.recv_offset, skip, first, lo / 4, hi / 4);
        } else {
            fan_out::<u8>(ctx, src, args.recv_offset, skip, first, lo, hi);
        }
    }
}
