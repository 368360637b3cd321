//! All-gather (and its low-latency variant, [`ll_all_gather`]): rank `r` stores its `count`
//! bytes into segment `r` of every peer's receive buffer, between a start barrier (every peer has reached this collective, so its receive
//! buffer is free) and an end barrier (every peer's stores into this rank have landed). Bytes
//! move in 16-, 8- or 4-byte units when both sides are aligned for them, else one at a time.

use super::all_reduce::between_barriers;
use super::low_latency::LlLines;
use super::{CollectiveArgs, FLAG_IN_PLACE, Grid, KernelStatus, Rank, block_range};
use crate::arch;

/// 16 bytes moved as one vector access.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(crate) struct Bytes16([u32; 4]);

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

/// All-gather of `args.count` bytes per rank. The unit of the copy (16, 8, 4 or 1 bytes) is
/// the largest that divides the send address, the byte count and every rank's destination
/// (each peer's window base may be aligned differently).
///
/// # Safety
/// The contexts are host-built for windows holding `[send_offset, + count)` (send window, this
/// rank) and `[recv_offset, + world·count)` (receive window, every rank); every rank launches
/// the same kernel, arguments and shape.
#[inline(always)]
pub unsafe fn all_gather(rank: Rank<'_>, grid: Grid, args: &CollectiveArgs) -> KernelStatus {
    let ctx = rank.recv;
    let bytes = args.count;
    let segment = ctx.rank as u64 * bytes;
    let send = send_address(rank, args);
    let mut alignment = send | args.recv_offset.wrapping_add(segment) | bytes;
    for peer in 0..ctx.world_size {
        // SAFETY: peer < world_size; the context is host-built.
        alignment |= unsafe { ctx.peer_base(peer) };
    }
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            for peer in 0..ctx.world_size {
                let dst = ctx
                    .peer_base(peer)
                    .wrapping_add(args.recv_offset)
                    .wrapping_add(segment);
                if alignment.is_multiple_of(16) {
                    copy_units::<Bytes16>(send, dst, bytes / 16, grid);
                } else if alignment.is_multiple_of(8) {
                    copy_units::<u64>(send, dst, bytes / 8, grid);
                } else if alignment.is_multiple_of(4) {
                    copy_units::<u32>(send, dst, bytes / 4, grid);
                } else {
                    copy_units::<u8>(send, dst, bytes, grid);
                }
            }
            Ok(())
        })
    }
}

/// Copy `units` values of `U` from `src` to `dst`, this block's share.
///
/// # Safety
/// Both ranges are valid and aligned for `U`.
#[inline(always)]
unsafe fn copy_units<U: Copy>(src: u64, dst: u64, units: u64, grid: Grid) {
    let (lo, hi) = block_range(units, grid.block, grid.blocks);
    let stride = arch::block_dim_x() as u64;
    let mut i = lo + arch::thread_idx_x() as u64;
    while i < hi {
        // SAFETY: i < units; forwarded contract.
        unsafe {
            let value = (src as *const U).add(i as usize).read();
            (dst as *mut U).add(i as usize).write(value);
        }
        i += stride;
    }
}

/// All-gather over low-latency lines (up to `LL_MAX_BYTES` per rank): each rank writes its
/// bytes, 8 per line with the call's flag, into every peer's line buffer, then waits for every
/// rank's lines in its own buffer and copies them to its receive buffer. No barrier; lines are
/// double-buffered by call parity (see `one_shot_ll_all_reduce`). In place is safe.
///
/// # Safety
/// As for [`all_gather`]; the signal pads were sized for `world_size` ranks.
#[inline(always)]
pub unsafe fn ll_all_gather(rank: Rank<'_>, grid: Grid, args: &CollectiveArgs) -> KernelStatus {
    let ctx = rank.recv;
    let bytes = args.count;
    // SAFETY: forwarded contract.
    let lines = match unsafe { LlLines::open::<u8>(ctx, grid, bytes) } {
        Ok(lines) => lines,
        Err(status) => return status,
    };
    let (call, lo, hi) = (&lines.call, lines.lo, lines.hi);
    let stride = arch::block_dim_x() as u64;
    let send = send_address(rank, args) as *const u8;
    let recv = ctx.local_base.wrapping_add(args.recv_offset) as *mut u8;
    // SAFETY: the send buffer holds `bytes` bytes (caller's contract).
    unsafe { lines.push(ctx, send, bytes) };

    let mut failed = false;
    let mut line = lo + arch::thread_idx_x() as u64;
    'lines: while line < hi {
        for source in 0..ctx.world_size {
            // SAFETY: source < world, line < LL_LINES.
            let Ok(data) = (unsafe { call.take(source, line) }) else {
                failed = true;
                break 'lines;
            };
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
        }
        line += stride;
    }
    lines.close(failed)
}
