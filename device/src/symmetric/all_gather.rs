//! All-gather (and its low-latency variant, [`ll_all_gather`]) of a batch: for each task, rank
//! `r` stores its `count` bytes into segment `r` of every peer's receive buffer, between a start
//! barrier (every peer has reached this launch, so its receive buffers are free) and an end
//! barrier (every peer's stores into this rank have landed), both on the batch window. Block
//! `b` of every rank copies the same cells (1 KiB of each rank's segment) of the batch. Bytes
//! move in 16-, 8- or 4-byte units when both sides are aligned for them, else one at a time;
//! each unit is loaded once and stored into every rank (16 bytes as a `u128`:
//! `ld.v2.b64`/`st.v2.b64`).

use super::Algorithm;
use super::batch::{Batch, Task, cell_elements};
use super::frame::between_barriers;
use super::frame::fan_out;
use super::low_latency::LlLines;
use super::{CollectiveArgs, FLAG_IN_PLACE, Grid, KernelStatus, Rank, block_range};
use crate::arch;

/// The send buffer of an all-gather: in place, this rank's segment of its receive buffer.
#[inline(always)]
pub(crate) fn send_address(rank: Rank<'_>, args: &CollectiveArgs) -> u64 {
    if args.flags & FLAG_IN_PLACE != 0 {
        rank.recv
            .local_base
            .wrapping_add(args.recv_offset)
            .wrapping_add(rank.recv.rank as u64 * args.count)
    } else {
        rank.send.local_base.wrapping_add(args.send_offset)
    }
}

/// All-gather of a batch (`count`: bytes per rank of each task).
///
/// # Safety
/// The contexts are host-built for windows holding each task's `[send_offset, + count)` (send
/// window, this rank) and `[recv_offset, + world·count)` (receive window, every rank); every
/// rank launches the same kernel, batch and shape.
#[inline(always)]
pub unsafe fn all_gather(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.recv;
    let per_cell = cell_elements(Algorithm::AllGather, 1);
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            batch.walk(lo, hi, per_cell, |task, first, end| {
                gather_part(task, first, end, grid.block);
                Ok(())
            })
        })
    }
}

/// Bytes `[lo, hi)` of one task's segment, into every rank. The unit of the copy (16, 8, 4 or
/// 1 bytes) is the largest that divides the send address, the byte count and every rank's
/// destination (each peer's window base may be aligned differently); `lo` starts a cell, so it
/// is a multiple of every unit. Each unit is loaded once and stored into every rank, ranks in
/// an order rotated by `block` (so that the blocks do not all store into one rank at once).
///
/// # Safety
/// Contract of [`all_gather`]; `hi <= count`.
#[inline(always)]
unsafe fn gather_part(task: &Task<'_>, lo: u64, hi: u64, block: u32) {
    let ctx = task.rank.recv;
    let args = &task.args;
    let bytes = args.count;
    let segment = ctx.rank as u64 * bytes;
    let send = send_address(task.rank, args);
    let mut alignment = send | args.recv_offset.wrapping_add(segment) | bytes | lo;
    for peer in 0..ctx.world_size {
        // SAFETY: peer < world_size; the context is host-built.
        alignment |= unsafe { ctx.peer_base(peer) };
    }
    let offset = args.recv_offset.wrapping_add(segment);
    // `checked_rem`: no division-by-zero panic path (a context always has ranks).
    let first = block.checked_rem(ctx.world_size).unwrap_or(0);
    // In place, this rank's own destination is its source: the unit is stored back unchanged
    // (no rank is skipped).
    let skip = u32::MAX;
    // SAFETY: forwarded contract; the unit divides the source, every destination, `lo` and
    // `hi`; the destinations are distinct segments of distinct windows.
    unsafe {
        if alignment.is_multiple_of(16) {
            fan_out::<u128>(ctx, send, offset, skip, first, lo / 16, hi / 16);
        } else if alignment.is_multiple_of(8) {
            fan_out::<u64>(ctx, send, offset, skip, first, lo / 8, hi / 8);
        } else if alignment.is_multiple_of(4) {
            fan_out::<u32>(ctx, send, offset, skip, first, lo / 4, hi / 4);
        } else {
            fan_out::<u8>(ctx, send, offset, skip, first, lo, hi);
        }
    }
}

/// All-gather over low-latency lines (up to `LL_MAX_BYTES` per rank for the whole batch): each
/// rank writes its bytes, 8 per line with the call's flag, into every peer's line buffer, then
/// waits for every rank's lines in its own buffer and copies them to its receive buffer. No
/// barrier; lines are double-buffered by call parity (see `one_shot_ll_all_reduce`, also for
/// how a batch's tasks share the batch window's lines). In place is safe.
///
/// # Safety
/// As for [`all_gather`]; the signal pads were sized for `world_size` ranks.
#[inline(always)]
pub unsafe fn ll_all_gather(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.recv;
    let per_line = cell_elements(Algorithm::LlAllGather, 1);
    // SAFETY: forwarded contract.
    let lines = match unsafe { LlLines::open(ctx, grid, batch.total_cells(per_line)) } {
        Ok(lines) => lines,
        Err(status) => return status,
    };
    let call = &lines.call;
    let stride = arch::block_dim_x() as u64;
    let _ = batch.walk(lines.lo, lines.hi, per_line, |task, first, end| {
        let send = send_address(task.rank, &task.args) as *const u8;
        // SAFETY: the send buffer holds `count` bytes (caller's contract).
        unsafe { lines.push(ctx, send, task.args.count, first, end, task.first_cell) };
        Ok::<(), ()>(())
    });

    let mut failed = false;
    let _ = batch.walk(lines.lo, lines.hi, per_line, |task, first, end| {
        let bytes = task.args.count;
        let recv = task
            .rank
            .recv
            .local_base
            .wrapping_add(task.args.recv_offset) as *mut u8;
        let end_line = end.div_ceil(8);
        let mut line = first / 8 + arch::thread_idx_x() as u64;
        while line < end_line {
            let copy = |source: u32, data: u64| {
                let segment = source as u64 * bytes;
                for b in 0..8 {
                    let index = line * 8 + b;
                    if index < bytes {
                        // SAFETY: inside segment `source` of the receive buffer.
                        unsafe {
                            recv.add((segment + index) as usize)
                                .write((data >> (8 * b)) as u8)
                        };
                    }
                }
            };
            // SAFETY: the line lies inside the batch's lines, which `open` checked against
            // LL_LINES.
            let taken = unsafe { call.take_every_source(task.first_cell + line, copy) };
            if taken.is_err() {
                failed = true;
                return Err(());
            }
            line += stride;
        }
        Ok(())
    });
    lines.close(failed)
}
