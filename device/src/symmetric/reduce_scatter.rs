//! Reduce-scatter: the send buffer holds `world × count` elements; rank `r` loads segment `r`
//! from every peer, reduces in rank order, and stores the `count` results into its receive
//! buffer. Between a start barrier (every send buffer is ready) and an end barrier (no peer is
//! still reading this rank's send buffer). In place (receive buffer = segment `r` of the send
//! buffer) is safe: peers read only their own segments.

use super::all_reduce::{between_barriers, reduce_element};
use super::{CollectiveArgs, FLAG_IN_PLACE, Grid, KernelStatus, Rank, block_range, vector};
use crate::arch;
use crate::numeric::element::Element;
use crate::numeric::ops::ReduceOp;

/// Reduce-scatter with `args.count` elements per rank.
///
/// # Safety
/// The contexts are host-built for windows holding `[send_offset, + world·count)` (send
/// window, every rank) and the receive range (this rank), aligned for `T`; every rank launches the same kernel, arguments and
/// shape.
#[inline(always)]
pub unsafe fn reduce_scatter<T: Element, O: ReduceOp>(
    rank: Rank<'_>,
    grid: Grid,
    args: &CollectiveArgs,
) -> KernelStatus {
    let ctx = rank.send;
    let segment = ctx.rank as u64 * args.count;
    let recv = if args.flags & FLAG_IN_PLACE != 0 {
        ctx.local_base
            .wrapping_add(args.send_offset)
            .wrapping_add(segment * core::mem::size_of::<T>() as u64)
    } else {
        rank.recv.local_base.wrapping_add(args.recv_offset)
    } as *mut T;
    let lanes = vector::lanes::<T>();
    let segment_bytes = args.count * core::mem::size_of::<T>() as u64;
    // SAFETY: the context is host-built.
    let packed = segment_bytes.is_multiple_of(16)
        && unsafe { vector::aligned(ctx, &[args.send_offset], recv as u64) };
    if packed {
        let (lo, hi) = block_range(args.count / lanes, grid.block, grid.blocks);
        let first = segment / lanes;
        // SAFETY: forwarded contract; buffers and segments are 16-byte aligned.
        return unsafe {
            between_barriers(ctx, grid, |_| {
                let stride = arch::block_dim_x() as u64;
                let mut i = lo + arch::thread_idx_x() as u64;
                while i < hi {
                    let pack = vector::reduce_pack::<T, O>(ctx, args.send_offset, first + i);
                    (recv as *mut vector::Pack).add(i as usize).write(pack);
                    i += stride;
                }
                Ok(())
            })
        };
    }
    let (lo, hi) = block_range(args.count, grid.block, grid.blocks);
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            let stride = arch::block_dim_x() as u64;
            let mut index = lo + arch::thread_idx_x() as u64;
            while index < hi {
                let value = reduce_element::<T, O>(ctx, args.send_offset, segment + index);
                recv.add(index as usize).write(value);
                index += stride;
            }
            Ok(())
        })
    }
}
