//! Reduce-scatter of a batch: for each task, the send buffer holds `world × count` elements;
//! rank `r` loads segment `r` from every peer, reduces in rank order, and stores the `count`
//! results into its receive buffer. Block `b` of every rank reduces the same cells of the batch
//! (1 KiB of each task's segment). Between a start barrier (every send buffer is ready) and an
//! end barrier (no peer is still reading this rank's send buffers), both on the batch window.
//! In place (receive buffer = segment `r` of the send buffer) is safe: peers read only their
//! own segments.

use super::Algorithm;
use super::all_reduce::reduce_element;
use super::batch::{Batch, Task, cell_elements, for_packs_and_elements};
use super::frame::between_barriers;
use super::{FLAG_IN_PLACE, Grid, KernelStatus, block_range, vector};
use crate::arch;
use crate::numeric::element::Element;
use crate::numeric::ops::ReduceOp;

/// Reduce-scatter of a batch (`count`: elements per rank of each task).
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[send_offset, + world·count)`
/// (send window, every rank) and receive range (this rank), aligned for `T`; every rank
/// launches the same kernel, batch and shape.
#[inline(always)]
pub unsafe fn reduce_scatter<T: Element, O: ReduceOp>(
    batch: &Batch<'_>,
    grid: Grid,
) -> KernelStatus {
    let ctx = batch.first().rank.send;
    let per_cell = cell_elements(Algorithm::ReduceScatter, core::mem::size_of::<T>() as u64);
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            batch.walk(lo, hi, per_cell, |task, first, end| {
                reduce_scatter_part::<T, O>(task, first, end);
                Ok(())
            })
        })
    }
}

/// Elements `[lo, hi)` of one task's segment: reduce over every rank, store locally.
///
/// # Safety
/// Contract of [`reduce_scatter`]; `hi <= count`.
#[inline(always)]
unsafe fn reduce_scatter_part<T: Element, O: ReduceOp>(task: &Task<'_>, lo: u64, hi: u64) {
    let ctx = task.rank.send;
    let args = &task.args;
    let segment = ctx.rank as u64 * args.count;
    let recv = if args.flags & FLAG_IN_PLACE != 0 {
        ctx.local_base
            .wrapping_add(args.send_offset)
            .wrapping_add(segment * core::mem::size_of::<T>() as u64)
    } else {
        task.rank.recv.local_base.wrapping_add(args.recv_offset)
    } as *mut T;
    let segment_bytes = args.count * core::mem::size_of::<T>() as u64;
    // SAFETY: the context is host-built.
    let packed = segment_bytes.is_multiple_of(16)
        && unsafe { vector::aligned(ctx, &[args.send_offset], recv as u64) };
    let store_element = |index: u64| {
        // SAFETY: index < hi <= count: inside segment `rank` of every send buffer and inside
        // the receive buffer.
        unsafe {
            let value = reduce_element::<T, O>(ctx, args.send_offset, segment + index);
            recv.add(index as usize).write(value);
        }
    };
    if packed {
        let first = segment / vector::lanes::<T>();
        for_packs_and_elements(
            lo,
            hi,
            vector::lanes::<T>(),
            // SAFETY: pack i of the segment lies inside [lo, hi); buffers and segments are
            // 16-byte aligned.
            |i| unsafe {
                let pack = vector::reduce_pack::<T, O, { vector::PEERS_IN_FLIGHT_FOR_BANDWIDTH }>(
                    ctx,
                    args.send_offset,
                    first + i,
                );
                (recv as *mut vector::Pack).add(i as usize).write(pack);
            },
            store_element,
        );
    } else {
        let stride = arch::block_dim_x() as u64;
        let mut index = lo + arch::thread_idx_x() as u64;
        while index < hi {
            store_element(index);
            index += stride;
        }
    }
}
