//! All-reduce, one-shot: every rank reads every peer's copy and reduces locally.
//!
//! Block `b` of each rank owns the same element range (see [`super::block_range`]).
//! 1. A cross-rank barrier: every rank's send buffer is ready (stream order put it there).
//! 2. Each thread reduces its elements over ranks `0, 1, …, world-1` — the same order on every
//!    rank, so results are bitwise identical — and stores them to its receive buffer.
//!    When the receive range overlaps the send range (in place), a rank must not overwrite
//!    data a peer has yet to read: the range is processed in rounds of `UNROLL` elements per
//!    thread held in registers, with a barrier between the reads and the writes of a round.
//! 3. A closing barrier: no rank returns (and lets its caller reuse the send buffer) while a
//!    peer may still read it.

use super::reduce::{Element, Reduce};
use super::{KernelStatus, block_range};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::barrier::{CrossRankBarrier, is_aborted};
use crate::sync::signal_pad::{MAX_BLOCKS, MAX_RANKS};

/// `flags` bit: the receive range overlaps the send range (in place); use the round protocol.
pub const FLAG_OVERLAP: u32 = 1;

/// Elements each thread holds per round in the overlapping protocol: a few registers on the
/// GPU; on the host, where a "thread" is an OS thread and a barrier costs microseconds, more.
pub const UNROLL: u64 = if cfg!(target_arch = "nvptx64") {
    4
} else {
    128
};

/// Arguments of an all-reduce launch; offsets are in bytes from the window base and the same
/// on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllReduceArgs {
    /// Byte offset of the send buffer in the window.
    pub send_offset: u64,
    /// Byte offset of the receive buffer in the window.
    pub recv_offset: u64,
    /// Number of elements.
    pub count: u64,
    /// [`FLAG_OVERLAP`] or 0.
    pub flags: u32,
}

/// One-shot all-reduce of `args.count` elements of `T` with reduction `R`. Every thread of the
/// grid calls it with the same arguments.
///
/// # Safety
/// `ctx` must be a context built by the host for a window in which
/// `[send_offset, send_offset + count·size_of::<T>())` and the receive range lie, on every
/// rank, suitably aligned for `T`; every rank must launch the same kernel with the same
/// arguments and grid shape.
#[inline(always)]
pub unsafe fn one_shot_all_reduce<T: Element, R: Reduce<T>>(
    ctx: &SymmContext,
    args: &AllReduceArgs,
) -> KernelStatus {
    if arch::grid_dim_x() as usize > MAX_BLOCKS
        || ctx.world_size == 0
        || ctx.world_size as usize > MAX_RANKS
        || ctx.rank >= ctx.world_size
    {
        return KernelStatus::InvalidLaunch;
    }
    // SAFETY: the context is valid (caller's contract).
    if unsafe { is_aborted(ctx) } {
        return KernelStatus::Aborted;
    }
    let (lo, hi) = block_range(args.count, arch::block_idx_x(), arch::grid_dim_x());
    // SAFETY: limits checked above; every thread of the block runs this same sequence.
    let mut barrier = unsafe { CrossRankBarrier::new(ctx) };
    if barrier.sync().is_err() {
        barrier.finish();
        return KernelStatus::Aborted;
    }

    let recv = ctx.local_base.wrapping_add(args.recv_offset) as *mut T;
    let result = if args.flags & FLAG_OVERLAP != 0 {
        // SAFETY: forwarded contract.
        unsafe { reduce_in_rounds::<T, R>(ctx, args, recv, lo, hi, &mut barrier) }
    } else {
        // SAFETY: forwarded contract; the ranges do not overlap, so no peer reads what we write.
        unsafe { reduce_direct::<T, R>(ctx, args, recv, lo, hi) };
        Ok(())
    };
    let result = result.and_then(|()| barrier.sync());
    barrier.finish();
    match result {
        Ok(()) => KernelStatus::Completed,
        Err(_) => KernelStatus::Aborted,
    }
}

/// Element `index` of rank `peer`'s send buffer.
///
/// # Safety
/// `peer < world_size`, `index < count`, and the contract of [`one_shot_all_reduce`].
#[inline(always)]
unsafe fn peer_element<T: Element>(
    ctx: &SymmContext,
    peer: u32,
    send_offset: u64,
    index: u64,
) -> T {
    // SAFETY: the caller guarantees the element lies inside peer's window.
    unsafe {
        let base = (ctx.peer_base(peer) + send_offset) as *const T;
        base.add(index as usize).read()
    }
}

/// Reduce element `index` over all ranks, in rank order.
///
/// # Safety
/// As for [`peer_element`].
#[inline(always)]
unsafe fn reduce_element<T: Element, R: Reduce<T>>(
    ctx: &SymmContext,
    send_offset: u64,
    index: u64,
) -> T {
    // SAFETY: forwarded contract, peer 0 < world_size.
    let mut acc = unsafe { peer_element::<T>(ctx, 0, send_offset, index) };
    for peer in 1..ctx.world_size {
        // SAFETY: forwarded contract.
        acc = R::combine(acc, unsafe {
            peer_element::<T>(ctx, peer, send_offset, index)
        });
    }
    acc
}

/// # Safety
/// Contract of [`one_shot_all_reduce`]; send and receive ranges do not overlap.
#[inline(always)]
unsafe fn reduce_direct<T: Element, R: Reduce<T>>(
    ctx: &SymmContext,
    args: &AllReduceArgs,
    recv: *mut T,
    lo: u64,
    hi: u64,
) {
    let stride = arch::block_dim_x() as u64;
    let mut index = lo + arch::thread_idx_x() as u64;
    while index < hi {
        // SAFETY: index < count; the receive element lies in this rank's window.
        unsafe {
            let value = reduce_element::<T, R>(ctx, args.send_offset, index);
            recv.add(index as usize).write(value);
        }
        index += stride;
    }
}

/// # Safety
/// Contract of [`one_shot_all_reduce`].
#[inline(always)]
unsafe fn reduce_in_rounds<T: Element, R: Reduce<T>>(
    ctx: &SymmContext,
    args: &AllReduceArgs,
    recv: *mut T,
    lo: u64,
    hi: u64,
    barrier: &mut CrossRankBarrier<'_>,
) -> Result<(), crate::sync::barrier::Aborted> {
    let threads = arch::block_dim_x() as u64;
    let per_round = threads * UNROLL;
    let rounds = (hi - lo).div_ceil(per_round);
    let thread = arch::thread_idx_x() as u64;
    for round in 0..rounds {
        let base = lo + round * per_round + thread;
        let mut held: [Option<T>; UNROLL as usize] = [None; UNROLL as usize];
        for (j, slot) in held.iter_mut().enumerate() {
            let index = base + j as u64 * threads;
            if index < hi {
                // SAFETY: index < count.
                *slot = Some(unsafe { reduce_element::<T, R>(ctx, args.send_offset, index) });
            }
        }
        // No rank overwrites this round's elements until every rank has read them.
        barrier.sync()?;
        for (j, slot) in held.iter().enumerate() {
            if let Some(value) = *slot {
                // SAFETY: index < count; the element lies in this rank's window.
                unsafe { recv.add((base + j as u64 * threads) as usize).write(value) };
            }
        }
    }
    Ok(())
}
