//! All-gather (and its low-latency variant, [`ll_all_gather`]): rank `r` stores its `count` bytes into segment `r` of every peer's receive
//! buffer, between a start barrier (every peer has reached this collective, so its receive
//! buffer is free) and an end barrier (every peer's stores into this rank have landed). Bytes
//! move in 16-, 8- or 4-byte units when both sides are aligned for them, else one at a time.

use super::all_reduce::between_barriers;
use super::{CollectiveArgs, Grid, KernelStatus, block_range};
use crate::arch;
use crate::context::SymmContext;

/// 16 bytes moved as one vector access.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Bytes16([u32; 4]);

/// All-gather of `args.count` bytes per rank.
///
/// # Safety
/// `ctx` is host-built for a window holding `[send_offset, + count)` and
/// `[recv_offset, + world·count)` on every rank; every rank launches the same kernel,
/// arguments and shape.
#[inline(always)]
pub unsafe fn all_gather(ctx: &SymmContext, grid: Grid, args: &CollectiveArgs) -> KernelStatus {
    let bytes = args.count;
    let segment = ctx.rank as u64 * bytes;
    let send = ctx.local_base + args.send_offset;
    let alignment = send | args.recv_offset.wrapping_add(segment) | bytes;
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
pub unsafe fn ll_all_gather(ctx: &SymmContext, grid: Grid, args: &CollectiveArgs) -> KernelStatus {
    use crate::sync::barrier::is_aborted;
    use crate::sync::ll::{put_line, wait_line};
    use crate::sync::signal_pad::{LL_LINES, ll_count_slot, ll_flag, ll_line};
    use crate::sync::wait::WaitOutcome;
    let bytes = args.count;
    let lines = bytes.div_ceil(8);
    if lines > LL_LINES as u64 {
        return KernelStatus::InvalidLaunch;
    }
    // SAFETY: the context is valid (caller's contract).
    if unsafe { is_aborted(ctx) } {
        return KernelStatus::Aborted;
    }
    let world = ctx.world_size;
    let rank = ctx.rank;
    // SAFETY: rank < world_size.
    let own_pad = unsafe { ctx.peer_signal_pad(rank) };
    let count_slot = ll_count_slot(own_pad, grid.block);
    // SAFETY: the slot lies in this rank's pad; written only after the barrier below.
    let calls = unsafe { core::ptr::read_volatile(count_slot) };
    let flag = ll_flag(calls);
    let parity = (calls & 1) as u32;
    let (lo, hi) = block_range(lines, grid.block, grid.blocks);
    let stride = arch::block_dim_x() as u64;
    let send = (ctx.local_base + args.send_offset) as *const u8;
    let recv = ctx.local_base.wrapping_add(args.recv_offset) as *mut u8;

    let mut line = lo + arch::thread_idx_x() as u64;
    while line < hi {
        let mut data = 0u64;
        for b in 0..8 {
            let index = line * 8 + b;
            if index < bytes {
                // SAFETY: index < bytes: inside the send buffer.
                data |= (unsafe { send.add(index as usize).read() } as u64) << (8 * b);
            }
        }
        for peer in 0..world {
            // SAFETY: peer < world; the line lies in that peer's pad.
            unsafe {
                put_line(
                    ll_line(ctx.peer_signal_pad(peer), world, parity, rank, line),
                    data,
                    flag,
                )
            };
        }
        line += stride;
    }

    let abort = ctx.abort_flag as *const u32;
    let mut failed = false;
    let mut line = lo + arch::thread_idx_x() as u64;
    'lines: while line < hi {
        for source in 0..world {
            let at = ll_line(own_pad, world, parity, source, line);
            // SAFETY: the line lies in this rank's pad; the abort word is the context's.
            match unsafe { wait_line(at, flag, abort, ctx.timeout_ns) } {
                Ok(data) => {
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
                Err(outcome) => {
                    if outcome == WaitOutcome::TimedOut {
                        // SAFETY: the abort word is a valid u32 of this rank.
                        unsafe { arch::store_release_sys_u32(abort as *mut u32, 1) };
                    }
                    failed = true;
                    break 'lines;
                }
            }
        }
        line += stride;
    }
    let failed = arch::sync_threads_or(failed);
    if arch::thread_idx_x() == 0 {
        // SAFETY: as above; every thread read the count before the barrier.
        unsafe { core::ptr::write_volatile(count_slot, calls.wrapping_add(1)) };
    }
    if failed {
        KernelStatus::Aborted
    } else {
        KernelStatus::Completed
    }
}
