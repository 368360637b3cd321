//! All-reduce.
//!
//! **One-shot** (latency): every rank reads every peer's copy and reduces locally.
//! Block `b` of each rank owns the same element range (see [`super::block_range`]).
//! 1. A cross-rank barrier: every rank's send buffer is ready (stream order put it there).
//! 2. Each thread reduces its elements over ranks `0, 1, …, world-1` — the same order on every
//!    rank, so results are bitwise identical — and stores them to its receive buffer.
//!    In place ([`FLAG_IN_PLACE`]), a rank must not overwrite data a peer has yet to read: the
//!    range is processed in rounds of [`UNROLL`] elements per thread held in registers, with a
//!    barrier between the reads and the writes of a round.
//! 3. A closing barrier: no rank returns (and lets its caller reuse the send buffer) while a
//!    peer may still read it.
//!
//! **Two-shot** (bandwidth): rank `r` owns shard `r` of the elements. Between a start and an
//! end barrier, it loads its shard from every peer, reduces (rank order), and stores the result
//! into every peer's receive buffer: a reduce-scatter by loads and an all-gather by stores.
//! Each element is reduced by exactly one rank, so all ranks hold the same bits. In place is
//! safe without rounds: only rank `r` reads or writes shard `r`'s positions.

pub use super::FLAG_IN_PLACE;
use super::low_latency::{self, LlLines};
use super::{CollectiveArgs, Grid, KernelStatus, Rank, block_range, vector};
use crate::arch;
use crate::context::SymmContext;
use crate::numeric::element::Element;
use crate::numeric::ops::{Accumulator, ReduceOp};
use crate::sync::barrier::{Aborted, CrossRankBarrier, block_sees_abort};

/// Elements each thread holds per round in the in-place one-shot protocol. One on the GPU: a
/// round then covers `threads × blocks` elements, one-shot is picked for small counts (a
/// round or two), and larger arrays of held values end up in local memory for the wider
/// conversions. On the host, where a "thread" is an OS thread and a barrier costs
/// microseconds, many.
pub const UNROLL: u64 = if cfg!(target_arch = "nvptx64") {
    1
} else {
    128
};

/// Element `index` of rank `peer`'s buffer at `offset`.
///
/// # Safety
/// `peer < world_size` and the element lies inside that peer's window.
#[inline(always)]
pub(crate) unsafe fn peer_element<T: Element>(
    ctx: &SymmContext,
    peer: u32,
    offset: u64,
    index: u64,
) -> T {
    // SAFETY: the caller guarantees the element lies inside peer's window.
    unsafe {
        let base = (ctx.peer_base(peer) + offset) as *const T;
        base.add(index as usize).read()
    }
}

/// Reduce element `index` of the buffers at `offset` over all ranks, in rank order.
///
/// # Safety
/// The element lies inside every rank's window.
#[inline(always)]
pub(crate) unsafe fn reduce_element<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    offset: u64,
    index: u64,
) -> T {
    // SAFETY: forwarded contract.
    T::narrow(unsafe { reduce_to_accumulator::<T, O>(ctx, offset, index) })
}

/// As [`reduce_element`], before the final narrowing.
///
/// # Safety
/// As for [`reduce_element`].
#[inline(always)]
unsafe fn reduce_to_accumulator<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    offset: u64,
    index: u64,
) -> T::Acc {
    // SAFETY: forwarded contract, peer 0 < world_size.
    let mut acc = unsafe { peer_element::<T>(ctx, 0, offset, index) }.widen();
    for peer in 1..ctx.world_size {
        // SAFETY: forwarded contract.
        let next = unsafe { peer_element::<T>(ctx, peer, offset, index) }.widen();
        acc = O::combine(acc, next);
    }
    O::finish(acc, ctx.world_size)
}

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
    // SAFETY: forwarded contract.
    unsafe { between_barriers_advancing(ctx, grid, 1, body) }
}

/// As [`between_barriers`], with an end barrier that passes `end_steps` barriers at once
/// (see [`CrossRankBarrier::sync_advancing`]).
///
/// # Safety
/// As for [`between_barriers`].
#[inline(always)]
pub(crate) unsafe fn between_barriers_advancing(
    ctx: &SymmContext,
    grid: Grid,
    end_steps: u32,
    body: impl FnOnce(&mut CrossRankBarrier<'_>) -> Result<(), Aborted>,
) -> KernelStatus {
    // SAFETY: the context is valid (caller's contract); the whole block takes this branch.
    if unsafe { block_sees_abort(ctx) } {
        return KernelStatus::Aborted;
    }
    // SAFETY: limits were checked by `for_virtual_rank`; every thread runs this sequence.
    let mut barrier = unsafe { CrossRankBarrier::new(ctx, grid.block) };
    let result = barrier
        .sync()
        .and_then(|()| body(&mut barrier))
        .and_then(|()| barrier.sync_advancing(end_steps));
    barrier.finish();
    match result {
        Ok(()) => KernelStatus::Completed,
        Err(Aborted) => KernelStatus::Aborted,
    }
}

/// One-shot all-reduce of `args.count` elements.
///
/// The cross-rank protocol is the same whether this rank is in place or not, so ranks of one
/// collective may differ in that: in place, the block's range goes in `rounds` rounds with a
/// barrier between each round's reads and writes; out of place, the block reads and writes in
/// one pass and its end barrier passes the `rounds` round barriers with it (an in-place peer
/// waiting at a round barrier is released by it, since this rank has read everything).
///
/// # Safety
/// The contexts are host-built for windows holding the send range (`send_offset`, every rank)
/// and the receive range on this rank, aligned for `T`; every rank launches the same kernel,
/// arguments and shape.
#[inline(always)]
pub unsafe fn one_shot_all_reduce<T: Element, O: ReduceOp>(
    rank: Rank<'_>,
    grid: Grid,
    args: &CollectiveArgs,
) -> KernelStatus {
    let ctx = rank.send;
    let (lo, hi) = block_range(args.count, grid.block, grid.blocks);
    let rounds = (hi - lo).div_ceil(arch::block_dim_x() as u64 * UNROLL) as u32;
    let in_place = args.flags & FLAG_IN_PLACE != 0;
    let recv = if in_place {
        ctx.local_base.wrapping_add(args.send_offset)
    } else {
        rank.recv.local_base.wrapping_add(args.recv_offset)
    } as *mut T;
    // SAFETY: forwarded contract.
    unsafe {
        if in_place {
            return between_barriers(ctx, grid, |barrier| {
                reduce_in_rounds::<T, O>(ctx, args.send_offset, recv, lo, hi, barrier)
            });
        }
        between_barriers_advancing(ctx, grid, rounds + 1, |_| {
            if vector::aligned(ctx, &[args.send_offset], recv as u64) {
                reduce_packs::<T, O>(ctx, args.send_offset, lo, hi, recv);
            } else {
                let stride = arch::block_dim_x() as u64;
                let mut index = lo + arch::thread_idx_x() as u64;
                while index < hi {
                    let value = reduce_element::<T, O>(ctx, args.send_offset, index);
                    recv.add(index as usize).write(value);
                    index += stride;
                }
            }
            Ok(())
        })
    }
}

/// Out of place, 16-byte aligned: the packs that lie wholly inside this block's element range
/// `[lo, hi)`, and the elements of the range before and after them one by one. The range is
/// the one the in-place protocol uses ([`block_range`] over elements), so that a peer's
/// in-place block with the same index overwrites only elements this block has already read
/// when it passes the barrier.
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; every buffer is 16-byte aligned.
#[inline(always)]
unsafe fn reduce_packs<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    send_offset: u64,
    lo: u64,
    hi: u64,
    recv: *mut T,
) {
    let lanes = vector::lanes::<T>();
    let first_pack = lo.div_ceil(lanes);
    let end_pack = Ord::max(hi / lanes, first_pack);
    let stride = arch::block_dim_x() as u64;
    let thread = arch::thread_idx_x() as u64;
    let mut i = first_pack + thread;
    while i < end_pack {
        // SAFETY: pack i lies inside [lo, hi), hence in every send buffer and in the receive
        // buffer.
        unsafe {
            let pack = vector::reduce_pack::<T, O>(ctx, send_offset, i);
            (recv as *mut vector::Pack).add(i as usize).write(pack);
        }
        i += stride;
    }
    let (head_end, tail_start) = if first_pack < end_pack {
        (first_pack * lanes, end_pack * lanes)
    } else {
        (hi, hi)
    };
    let mut index = lo + thread;
    while index < head_end {
        // SAFETY: lo <= index < hi <= count.
        unsafe {
            recv.add(index as usize)
                .write(reduce_element::<T, O>(ctx, send_offset, index))
        };
        index += stride;
    }
    let mut index = tail_start + thread;
    while index < hi {
        // SAFETY: index < hi <= count.
        unsafe {
            recv.add(index as usize)
                .write(reduce_element::<T, O>(ctx, send_offset, index))
        };
        index += stride;
    }
}

/// # Safety
/// Contract of [`one_shot_all_reduce`], in place.
#[inline(always)]
unsafe fn reduce_in_rounds<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    send_offset: u64,
    recv: *mut T,
    lo: u64,
    hi: u64,
    barrier: &mut CrossRankBarrier<'_>,
) -> Result<(), Aborted> {
    let threads = arch::block_dim_x() as u64;
    let per_round = threads * UNROLL;
    let rounds = (hi - lo).div_ceil(per_round);
    let thread = arch::thread_idx_x() as u64;
    for round in 0..rounds {
        let base = lo + round * per_round + thread;
        // Indices grow with j, so the valid ones are a prefix.
        let valid = if base < hi {
            Ord::min((hi - base).div_ceil(threads), UNROLL)
        } else {
            0
        };
        // Accumulators (at least 32 bits) rather than narrow elements: on the GPU, an array of
        // bytes would live in local memory.
        let mut held = [<T::Acc as Accumulator>::ZERO; UNROLL as usize];
        // Constant trip counts (not `take(valid)`) keep `held` in registers on the GPU.
        for (j, slot) in held.iter_mut().enumerate() {
            if (j as u64) < valid {
                // SAFETY: index < hi <= count.
                *slot = unsafe {
                    reduce_to_accumulator::<T, O>(ctx, send_offset, base + j as u64 * threads)
                };
            }
        }
        // No rank overwrites this round's elements until every rank has read them.
        barrier.sync()?;
        for (j, value) in held.iter().enumerate() {
            if (j as u64) < valid {
                let index = base + j as u64 * threads;
                // SAFETY: index < count; the element lies in this rank's window.
                unsafe { recv.add(index as usize).write(T::narrow(*value)) };
            }
        }
    }
    Ok(())
}

/// The shard `[lo, hi)` of `count` elements that rank `rank` of `world` reduces in two-shot.
#[inline(always)]
pub fn shard(count: u64, rank: u32, world: u32) -> (u64, u64) {
    block_range(count, rank, world)
}

/// Two-shot all-reduce of `args.count` elements. Results are stored into every rank's receive
/// buffer at `recv_offset` of its receive window (in place: the send buffer, which then must
/// be at that offset of that window).
///
/// # Safety
/// As for [`one_shot_all_reduce`]; the receive range lies in every rank's receive window.
#[inline(always)]
pub unsafe fn two_shot_all_reduce<T: Element, O: ReduceOp>(
    rank: Rank<'_>,
    grid: Grid,
    args: &CollectiveArgs,
) -> KernelStatus {
    let ctx = rank.send;
    let (recv_ctx, recv_offset) = if args.flags & FLAG_IN_PLACE != 0 {
        (rank.send, args.send_offset)
    } else {
        (rank.recv, args.recv_offset)
    };
    // SAFETY: the contexts are host-built.
    let aligned = unsafe {
        vector::aligned(ctx, &[args.send_offset, recv_offset], ctx.local_base)
            && vector::aligned(recv_ctx, &[recv_offset], recv_ctx.local_base)
    };
    if aligned {
        // SAFETY: forwarded contract; every buffer is 16-byte aligned.
        return unsafe { two_shot_packs::<T, O>(ctx, recv_ctx, recv_offset, grid, args) };
    }
    let (shard_lo, shard_hi) = shard(args.count, ctx.rank, ctx.world_size);
    let (lo, hi) = block_range(shard_hi - shard_lo, grid.block, grid.blocks);
    let (lo, hi) = (shard_lo + lo, shard_lo + hi);
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            let stride = arch::block_dim_x() as u64;
            let mut index = lo + arch::thread_idx_x() as u64;
            while index < hi {
                let value = reduce_element::<T, O>(ctx, args.send_offset, index);
                for peer in 0..ctx.world_size {
                    let recv = recv_ctx.peer_base(peer).wrapping_add(recv_offset) as *mut T;
                    recv.add(index as usize).write(value);
                }
                index += stride;
            }
            Ok(())
        })
    }
}

/// Two-shot over 16-byte packs: shards are whole packs; the last rank's last block also takes
/// the tail, element by element.
///
/// # Safety
/// As for [`two_shot_all_reduce`]; every buffer is 16-byte aligned.
#[inline(always)]
unsafe fn two_shot_packs<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    recv_ctx: &SymmContext,
    recv_offset: u64,
    grid: Grid,
    args: &CollectiveArgs,
) -> KernelStatus {
    let lanes = vector::lanes::<T>();
    let packs = args.count / lanes;
    let (shard_lo, shard_hi) = shard(packs, ctx.rank, ctx.world_size);
    let (lo, hi) = block_range(shard_hi - shard_lo, grid.block, grid.blocks);
    let (lo, hi) = (shard_lo + lo, shard_lo + hi);
    let takes_tail = ctx.rank + 1 == ctx.world_size && grid.block + 1 == grid.blocks;
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            let stride = arch::block_dim_x() as u64;
            let mut i = lo + arch::thread_idx_x() as u64;
            while i < hi {
                let pack = vector::reduce_pack::<T, O>(ctx, args.send_offset, i);
                for peer in 0..ctx.world_size {
                    let recv =
                        recv_ctx.peer_base(peer).wrapping_add(recv_offset) as *mut vector::Pack;
                    recv.add(i as usize).write(pack);
                }
                i += stride;
            }
            if takes_tail {
                let mut index = packs * lanes + arch::thread_idx_x() as u64;
                while index < args.count {
                    let value = reduce_element::<T, O>(ctx, args.send_offset, index);
                    for peer in 0..ctx.world_size {
                        let recv = recv_ctx.peer_base(peer).wrapping_add(recv_offset) as *mut T;
                        recv.add(index as usize).write(value);
                    }
                    index += stride;
                }
            }
            Ok(())
        })
    }
}

/// One-shot all-reduce over low-latency lines (payloads up to `LL_MAX_BYTES` per rank): each
/// rank writes its data, 8 bytes per line with the call's flag, into every peer's line buffer,
/// then waits for every rank's lines in its own buffer and reduces them in rank order. No
/// barrier at all: the flags say when data is there, and lines are double-buffered by call
/// parity (a rank cannot start call `k + 2` before every rank has read call `k`). In place is
/// safe: peers never read the send buffer. Blocks own the same line ranges on every rank; the
/// call number is the window's (see `sync::ll::LlCall`), so any grid may follow any other.
///
/// # Safety
/// As for [`one_shot_all_reduce`]; the signal pads were sized for `world_size` ranks
/// (`signal_pad_bytes`).
#[inline(always)]
pub unsafe fn one_shot_ll_all_reduce<T: Element, O: ReduceOp>(
    rank: Rank<'_>,
    grid: Grid,
    args: &CollectiveArgs,
) -> KernelStatus {
    let ctx = rank.send;
    let size = core::mem::size_of::<T>() as u64;
    let per_line = low_latency::per_line::<T>();
    // SAFETY: forwarded contract.
    let lines = match unsafe { LlLines::open::<T>(ctx, grid, args.count) } {
        Ok(lines) => lines,
        Err(status) => return status,
    };
    let (call, lo, hi) = (&lines.call, lines.lo, lines.hi);
    let stride = arch::block_dim_x() as u64;
    let send = ctx.local_base.wrapping_add(args.send_offset) as *const T;
    let recv = if args.flags & FLAG_IN_PLACE != 0 {
        send as *mut T
    } else {
        rank.recv.local_base.wrapping_add(args.recv_offset) as *mut T
    };
    // SAFETY: the send buffer holds `count` elements (caller's contract).
    unsafe { lines.push(ctx, send, args.count) };

    let mut failed = false;
    let mut line = lo + arch::thread_idx_x() as u64;
    'lines: while line < hi {
        for e in 0..per_line {
            let index = line * per_line + e;
            if index >= args.count {
                break;
            }
            let mut acc = None;
            for source in 0..ctx.world_size {
                // SAFETY: source < world, line < LL_LINES.
                let Ok(data) = (unsafe { call.take(source, line) }) else {
                    failed = true;
                    break 'lines;
                };
                let value = T::from_bits(data >> (e * size * 8)).widen();
                acc = Some(match acc {
                    None => value,
                    Some(a) => O::combine(a, value),
                });
            }
            if let Some(acc) = acc {
                let value = T::narrow(O::finish(acc, ctx.world_size));
                // SAFETY: index < count: inside the receive buffer.
                unsafe { recv.add(index as usize).write(value) };
            }
        }
        line += stride;
    }
    lines.close(failed)
}
