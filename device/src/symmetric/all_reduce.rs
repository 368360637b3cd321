//! All-reduce.
//!
//! Every kernel runs a batch of tasks (see [`super::batch`]: an unfused call is a batch of one);
//! block `b` of each rank owns the same cells of the batch.
//!
//! **One-shot** (latency): every rank reads every peer's copy and reduces locally.
//! 1. A cross-rank barrier: every rank's send buffer is ready (stream order put it there).
//! 2. Each thread reduces its elements over ranks `0, 1, …, world-1` — the same order on every
//!    rank, so results are bitwise identical — and stores them to its receive buffer.
//!    In place ([`FLAG_IN_PLACE`]), a rank must not overwrite data a peer has yet to read. When
//!    every rank is in place (the start barrier carries a vote on it, for parts longer than one
//!    round), the ranks share the range out as two-shot does its shard: each reduces its share
//!    and stores it into every rank, with no further barrier. Otherwise a rank in place goes
//!    through the range in rounds held in registers ([`UNROLL`] 16-byte packs per thread when
//!    the buffers are aligned and the elements at least 2 bytes wide, else [`UNROLL`]
//!    elements), with a barrier between the reads and the writes of a round.
//! 3. A closing barrier: no rank returns (and lets its caller reuse the send buffer) while a
//!    peer may still read it.
//!
//! **Reduce** runs on the one-shot kernel ([`FLAG_REDUCE_TO_ROOT`]): between the same barriers
//! only the root reduces, into its receive buffer, in one pass even in place (no peer reads
//! the root's buffer).
//!
//! **Two-shot** (bandwidth): rank `r` owns shard `r` of the elements. Between a start and an
//! end barrier, it loads its shard from every peer, reduces (rank order), and stores the result
//! into every peer's receive buffer: a reduce-scatter by loads and an all-gather by stores.
//! Each element is reduced by exactly one rank, so all ranks hold the same bits. In place is
//! safe without rounds: only rank `r` reads or writes shard `r`'s positions.

use super::Algorithm;
pub use super::FLAG_IN_PLACE;
use super::batch::{Batch, Task, cell_elements, for_packs_and_elements};
use super::frame::{between_barriers, fan_out};
use super::low_latency::{self, LlLines};
use super::{FLAG_REDUCE_TO_ROOT, FLAG_ROOT};
use super::{Grid, KernelStatus, block_range, vector};
use crate::arch;
use crate::context::SymmContext;
use crate::numeric::element::Element;
use crate::numeric::ops::{Accumulator, ReduceOp};
use crate::sync::barrier::{Aborted, CrossRankBarrier};

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

/// One-shot all-reduce of a batch.
///
/// The block passes a start barrier, reduces its cells task by task, and passes an end
/// barrier, all on the batch window's barrier of its block index. A rank in place for a task
/// must not overwrite an element that a peer has yet to read: it goes through its part of the
/// task in rounds (`InPlaceRounds`: packs or elements), reading a round into registers, passing a
/// barrier, then writing. A rank out of place for the task reads and writes in one pass and
/// owes its peers the task's round barriers: it adds them to the next barrier it passes (a
/// later round barrier, or the end barrier) with [`CrossRankBarrier::sync_advancing`], which
/// announces every owed epoch at once. That is sound because an announcement means "this
/// block has read everything it reads before the barriers announced": an out-of-place rank has
/// read the task's cells before it announces the epochs of their rounds, and a peer's in-place
/// round barrier waits for at least its own epoch, so it is released only after those reads.
/// Every rank takes the same epochs in all (one start, one per round of every task part, one
/// end), since the rounds depend only on the cells, the block size, `UNROLL`, the element
/// width and the send offset's alignment (window bases are 16-byte aligned on every rank), so
/// ranks may differ in being in place, task by task.
///
/// When the block's part is longer than one round of packs, the start barrier is a vote
/// ([`super::super::sync::barrier::UnstartedBarrier::start_unanimous`]) on whether this rank is in place for every task of
/// the block's cells. If every rank is, no rank needs rounds: the ranks share each task part
/// out (`one_shot_share_part`) and pass only the end barrier (one start, one end on every
/// rank alike).
///
/// # Safety
/// The batch's contexts are host-built for windows holding each task's send range
/// (`send_offset`, every rank) and receive range (this rank), aligned for `T`; every rank
/// launches the same kernel, batch (counts, cells and the windows peers use) and shape.
#[inline(always)]
pub unsafe fn one_shot_all_reduce<T: Element, O: ReduceOp>(
    batch: &Batch<'_>,
    grid: Grid,
) -> KernelStatus {
    let ctx = batch.first().rank.send;
    let per_cell = cell_elements(
        Algorithm::OneShotAllReduce,
        core::mem::size_of::<T>() as u64,
    );
    let (lo, hi) = block_range(batch.total_cells(per_cell), grid.block, grid.blocks);
    // As in `between_barriers`: no look at the abort word before the start barrier.
    // SAFETY: limits were checked by `for_virtual_rank`; every thread runs this sequence.
    let unstarted = unsafe { CrossRankBarrier::open(ctx, grid.block) };
    // Round barriers of out-of-place task parts not announced yet.
    let mut owed: u32 = 0;
    // Whether every rank is in place for every task of the block's cells, asked only when the
    // block's part is longer than one in-place round (the same answer on every rank: cells,
    // block size and element width are).
    let started = if (hi - lo).saturating_mul(per_cell) > one_pack_round::<T>() {
        let mut in_place = true;
        let _ = batch.walk(lo, hi, per_cell, |task, _, _| {
            // A reduce's root reads and writes in one pass, in place or not: no peer reads
            // its buffer (`one_shot_part`).
            in_place &= task.args.flags & (FLAG_IN_PLACE | FLAG_REDUCE_TO_ROOT) == FLAG_IN_PLACE;
            Ok::<(), ()>(())
        });
        unstarted.start_unanimous(in_place)
    } else {
        unstarted.start().map(|barrier| (barrier, false))
    };
    let Ok((mut barrier, every_rank_in_place)) = started else {
        return KernelStatus::Aborted;
    };
    let result = Ok(every_rank_in_place)
        .and_then(|every_rank_in_place| {
            if every_rank_in_place {
                // SAFETY: forwarded contract; every rank voted that it is in place for every
                // task of the block's cells.
                unsafe { share_out::<T, O>(batch, lo, hi, per_cell) };
                return Ok(());
            }
            batch.walk(lo, hi, per_cell, |task, first, end| {
                // SAFETY: forwarded contract; [first, end) lies inside the task's count.
                unsafe { one_shot_part::<T, O>(task, first, end, &mut barrier, &mut owed) }
            })
        })
        .and_then(|()| barrier.sync_advancing(owed + 1));
    barrier.finish();
    match result {
        Ok(()) => KernelStatus::Completed,
        Err(Aborted) => KernelStatus::Aborted,
    }
}

/// Elements one in-place round of packs covers ([`InPlaceRounds`]).
#[inline(always)]
fn one_pack_round<T: Element>() -> u64 {
    arch::block_dim_x() as u64 * UNROLL * vector::lanes::<T>()
}

/// Share `rank` of `world` of the elements `[first, end)`: consecutive ranks take consecutive
/// shares, which cover the range once, and every share but the first starts on a multiple of
/// `lanes`.
#[inline(always)]
pub fn pack_aligned_share(first: u64, end: u64, rank: u32, world: u32, lanes: u64) -> (u64, u64) {
    let lanes = Ord::max(lanes, 1);
    let first_pack = first.div_ceil(lanes);
    let end_pack = Ord::max(end / lanes, first_pack);
    let (lo, hi) = block_range(end_pack - first_pack, rank, world);
    let lo = if rank == 0 {
        first
    } else {
        (first_pack + lo) * lanes
    };
    let hi = if rank.saturating_add(1) >= world {
        end
    } else {
        (first_pack + hi) * lanes
    };
    let hi = Ord::min(hi, end);
    (Ord::min(lo, hi), hi)
}

/// Every rank in place for every task of the block's cells `[lo, hi)`: the block's part of
/// each task is shared out among the ranks as two-shot shares its shard. Rank `r` reduces
/// share `r` from every rank into its own buffer ([`reduce_share`]), then, after a block
/// barrier, copies it into every peer's ([`copy_share_to_peers`]). No round barriers are
/// needed: blocks own disjoint cells (the same on every rank), so only block `b` of rank `r`
/// reads or writes share `r`'s positions of block `b`'s cells, and the kernel's end barrier
/// orders the copies before any rank returns. As with two-shot, a rank whose start barrier
/// timed out after announcing its arrival may still receive a peer's copies after its kernel
/// returned aborted: after a failure the buffers' contents are undefined.
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; every rank is in place for every task with cells in
/// `[lo, hi)`, and every rank's block of this index runs this with the same cells.
#[inline(always)]
unsafe fn share_out<T: Element, O: ReduceOp>(batch: &Batch<'_>, lo: u64, hi: u64, per_cell: u64) {
    let _ = batch.walk(lo, hi, per_cell, |task, first, end| {
        // SAFETY: forwarded contract; [first, end) lies inside the task's count.
        unsafe { reduce_share::<T, O>(task, first, end) };
        Ok::<(), ()>(())
    });
    // Every thread's part of the block's shares is in this rank's buffer.
    arch::sync_threads();
    let _ = batch.walk(lo, hi, per_cell, |task, first, end| {
        // SAFETY: forwarded contract; the share was reduced before the block barrier above.
        unsafe { copy_share_to_peers::<T>(task, first, end) };
        Ok::<(), ()>(())
    });
}

/// Ranks whose packs the share reduction loads together: fewer than the other one-shot paths
/// (the copy pass's state stays live across it, and the kernel must stay within 128
/// registers).
const SHARE_PEERS_IN_FLIGHT: usize = 2;

/// Every rank in place: reduce this rank's share of elements `[first, end)` of one task
/// (shares start on pack boundaries) from every rank into its own buffer: by packs, but for
/// 1-byte elements, which go one by one as in their in-place rounds (a second inlined 16-lane
/// float8 reduction would push the kernel body out of line, see [`PACK_ROUNDS_MAX_LANES`]).
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; `end <= count`; every rank is in place for the task.
#[inline(always)]
unsafe fn reduce_share<T: Element, O: ReduceOp>(task: &Task<'_>, first: u64, end: u64) {
    let ctx = task.rank.send;
    let offset = task.args.send_offset;
    let lanes = vector::lanes::<T>();
    let (lo, hi) = pack_aligned_share(first, end, ctx.rank, ctx.world_size, lanes);
    let own = ctx.local_base.wrapping_add(offset) as *mut T;
    // SAFETY: forwarded contract: the share lies in every rank's buffer; only this rank reads
    // or writes its positions.
    unsafe {
        if lanes <= PACK_ROUNDS_MAX_LANES && vector::aligned(ctx, &[offset], own as u64) {
            reduce_packs::<T, O, SHARE_PEERS_IN_FLIGHT>(ctx, offset, lo, hi, own);
        } else {
            reduce_elements::<T, O>(ctx, offset, lo, hi, own);
        }
    }
}

/// Elements `[first, end)` of one task of a one-shot batch (see [`one_shot_all_reduce`]), some
/// rank not in place: a rank in place goes through the range in rounds; a rank out of place
/// reduces it into its receive buffer and owes the rounds' barriers. A reduce
/// ([`FLAG_REDUCE_TO_ROOT`]) has no rounds: its root reduces in one pass, the other ranks
/// touch nothing, and every rank owes the rounds' barriers.
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; `end <= count`.
#[inline(always)]
unsafe fn one_shot_part<T: Element, O: ReduceOp>(
    task: &Task<'_>,
    first: u64,
    end: u64,
    barrier: &mut CrossRankBarrier<'_>,
    owed: &mut u32,
) -> Result<(), Aborted> {
    let ctx = task.rank.send;
    let send_offset = task.args.send_offset;
    let flags = task.args.flags;
    // SAFETY: the context is host-built (contract).
    let rounds = unsafe { InPlaceRounds::of::<T>(ctx, send_offset) };
    let reduce_to_root = flags & FLAG_REDUCE_TO_ROOT != 0;
    if flags & FLAG_IN_PLACE != 0 && !reduce_to_root {
        let recv = ctx.local_base.wrapping_add(send_offset) as *mut T;
        // SAFETY: forwarded contract.
        return unsafe {
            if rounds.packs {
                reduce_pack_rounds::<T, O>(ctx, send_offset, recv, first, end, barrier, owed)
            } else {
                reduce_in_rounds::<T, O>(ctx, send_offset, recv, first, end, barrier, owed)
            }
        };
    }
    let per_round = rounds.elements;
    *owed = owed.wrapping_add((end - first).div_ceil(Ord::max(per_round, 1)) as u32);
    if reduce_to_root && flags & FLAG_ROOT == 0 {
        return Ok(());
    }
    // A reduce's root in place stores each element after it has loaded it from every rank,
    // on the same thread, and no peer reads its buffer: one pass, as out of place.
    let recv = if flags & FLAG_IN_PLACE != 0 {
        ctx.local_base.wrapping_add(send_offset)
    } else {
        task.rank
            .recv
            .local_base
            .wrapping_add(task.args.recv_offset)
    } as *mut T;
    // SAFETY: forwarded contract.
    unsafe {
        if vector::aligned(ctx, &[send_offset], recv as u64) {
            reduce_packs::<T, O, { vector::PEERS_IN_FLIGHT_FOR_LATENCY }>(
                ctx,
                send_offset,
                first,
                end,
                recv,
            );
        } else {
            reduce_elements::<T, O>(ctx, send_offset, first, end, recv);
        }
    }
    Ok(())
}

/// Elements `[lo, hi)` reduced one by one into `recv` (buffers not 16-byte aligned).
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; `hi <= count`; `recv` holds the range.
#[inline(always)]
unsafe fn reduce_elements<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    send_offset: u64,
    lo: u64,
    hi: u64,
    recv: *mut T,
) {
    let stride = arch::block_dim_x() as u64;
    let mut index = lo + arch::thread_idx_x() as u64;
    while index < hi {
        // SAFETY: index < hi <= count (contract).
        unsafe {
            let value = reduce_element::<T, O>(ctx, send_offset, index);
            recv.add(index as usize).write(value);
        }
        index += stride;
    }
}

/// Every rank in place: copy this rank's share of elements `[first, end)` of one task (see
/// [`share_out`]), reduced into its own buffer, into every peer's buffer.
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; `end <= count`; every rank is in place for the task,
/// and this block has reduced its share of `[first, end)` and passed a block barrier since.
#[inline(always)]
unsafe fn copy_share_to_peers<T: Element>(task: &Task<'_>, first: u64, end: u64) {
    let ctx = task.rank.send;
    let offset = task.args.send_offset;
    let lanes = vector::lanes::<T>();
    let (lo, hi) = pack_aligned_share(first, end, ctx.rank, ctx.world_size, lanes);
    // SAFETY: forwarded contract: the share lies in every rank's buffer at `offset` (the same
    // alignment test as the reduction's, whose destination was this rank's buffer there), and
    // only this rank writes its positions.
    unsafe {
        let aligned = vector::aligned(ctx, &[offset], ctx.local_base.wrapping_add(offset));
        copy_to_peers::<T>(ctx, offset, lo, hi, aligned);
    }
}

/// Copy elements `[lo, hi)` of this rank's buffer at `offset` into every peer's buffer at
/// `offset` of the same window ([`fan_out`], starting with the next rank): the packs inside
/// the range as `u128`s where `aligned`, the other elements one by one.
///
/// # Safety
/// `ctx` is host-built; the range lies inside every rank's buffer; with `aligned`, every
/// buffer is 16-byte aligned; no other thread writes the range meanwhile.
#[inline(always)]
unsafe fn copy_to_peers<T: Element>(
    ctx: &SymmContext,
    offset: u64,
    lo: u64,
    hi: u64,
    aligned: bool,
) {
    let own = ctx.local_base.wrapping_add(offset);
    let world = Ord::max(ctx.world_size, 1);
    let next = (ctx.rank + 1) % world;
    let lanes = vector::lanes::<T>();
    let (first_pack, end_pack) = if aligned {
        let first_pack = lo.div_ceil(lanes);
        (first_pack, Ord::max(hi / lanes, first_pack))
    } else {
        (0, 0)
    };
    let (head_end, tail_start) = if first_pack < end_pack {
        (first_pack * lanes, end_pack * lanes)
    } else {
        (hi, hi)
    };
    // SAFETY: forwarded contract: the packs lie inside [lo, hi) and are 16-byte aligned (when
    // there are any), the elements before and after them lie inside [lo, hi).
    unsafe {
        fan_out::<u128>(ctx, own, offset, ctx.rank, next, first_pack, end_pack);
        fan_out::<T>(ctx, own, offset, ctx.rank, next, lo, head_end);
        fan_out::<T>(ctx, own, offset, ctx.rank, next, tail_start, hi);
    }
}

/// Out of place (or this rank's share, every rank in place), 16-byte aligned: the packs that
/// lie wholly inside the element range `[lo, hi)` of a task, and the elements of the range
/// before and after them one by one. Out of place, the range is the one the in-place protocol
/// uses (the same cells), so that a peer's in-place block with the same index overwrites only
/// elements this block has already read when it passes the barrier.
///
/// # Safety
/// Contract of [`one_shot_all_reduce`]; every buffer is 16-byte aligned; `hi <= count`.
#[inline(always)]
unsafe fn reduce_packs<T: Element, O: ReduceOp, const MOST: usize>(
    ctx: &SymmContext,
    send_offset: u64,
    lo: u64,
    hi: u64,
    recv: *mut T,
) {
    for_packs_and_elements(
        lo,
        hi,
        vector::lanes::<T>(),
        // SAFETY: pack i lies inside [lo, hi), hence in every send buffer and in the receive
        // buffer.
        |i| unsafe {
            let pack = vector::reduce_pack::<T, O, MOST>(ctx, send_offset, i);
            (recv as *mut vector::Pack).add(i as usize).write(pack);
        },
        // SAFETY: lo <= index < hi <= count.
        |index| unsafe {
            recv.add(index as usize)
                .write(reduce_element::<T, O>(ctx, send_offset, index))
        },
    );
}

/// Widest packs the in-place rounds take: 1-byte elements (16 lanes) keep the scalar rounds,
/// because a second inlined 16-lane float8 reduction pushes the one-shot kernel's per-task body
/// out of line on the GPU (a stack frame, which `cargo xtask ptx` refuses).
const PACK_ROUNDS_MAX_LANES: u64 = 8;

/// How a rank in place for a task goes through its part in rounds, which every rank of the
/// task computes alike (an out-of-place rank owes its peers one barrier per round): 16-byte
/// packs, [`UNROLL`] per thread and round, when the send buffers are 16-byte aligned, a block
/// has at least two threads per lane of a pack (for the elements outside whole packs) and the
/// elements are at least 2 bytes ([`PACK_ROUNDS_MAX_LANES`]); else [`UNROLL`] elements per
/// thread and round.
#[derive(Clone, Copy)]
struct InPlaceRounds {
    /// Whether the rounds are of packs.
    packs: bool,
    /// Elements per round.
    elements: u64,
}

impl InPlaceRounds {
    /// The rounds of a task whose send buffers lie at `send_offset`. The same on every rank:
    /// window bases are 16-byte aligned on every rank (registration requires it) and every
    /// rank launches the same block size.
    ///
    /// # Safety
    /// `ctx` is host-built.
    #[inline(always)]
    unsafe fn of<T: Element>(ctx: &SymmContext, send_offset: u64) -> InPlaceRounds {
        let threads = arch::block_dim_x() as u64;
        let lanes = vector::lanes::<T>();
        let local = ctx.local_base.wrapping_add(send_offset);
        // SAFETY: forwarded contract.
        let packs = threads >= 2 * lanes
            && lanes <= PACK_ROUNDS_MAX_LANES
            && unsafe { vector::aligned(ctx, &[send_offset], local) };
        InPlaceRounds {
            packs,
            elements: threads * UNROLL * if packs { lanes } else { 1 },
        }
    }
}

/// The elements `[lo, hi)` of a task this rank runs in place, in rounds of 16-byte packs
/// ([`InPlaceRounds`]): each thread reduces [`UNROLL`] packs of the round (and at most one
/// element outside whole packs) into registers, the block passes the round barrier, then
/// writes them. A round covers `threads × UNROLL × lanes` elements, where the scalar rounds
/// cover `threads × UNROLL`: 4 to 16 times fewer cross-rank barriers, and 16-byte loads. The
/// first round barrier also announces the `owed` barriers of earlier out-of-place parts.
///
/// # Safety
/// Contract of [`one_shot_all_reduce`], in place; the buffers are 16-byte aligned.
#[inline(always)]
unsafe fn reduce_pack_rounds<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    send_offset: u64,
    recv: *mut T,
    lo: u64,
    hi: u64,
    barrier: &mut CrossRankBarrier<'_>,
    owed: &mut u32,
) -> Result<(), Aborted> {
    let threads = arch::block_dim_x() as u64;
    let lanes = vector::lanes::<T>();
    let per_round = threads * UNROLL * lanes;
    let rounds = (hi - lo).div_ceil(Ord::max(per_round, 1));
    let thread = arch::thread_idx_x() as u64;
    for round in 0..rounds {
        let start = lo + round * per_round;
        let stop = Ord::min(start + per_round, hi);
        let first_pack = start.div_ceil(lanes);
        let end_pack = Ord::max(stop / lanes, first_pack);
        let mut held = [vector::Pack::default(); UNROLL as usize];
        // Constant trip counts keep `held` in registers on the GPU.
        for (j, slot) in held.iter_mut().enumerate() {
            let pack = first_pack + thread + j as u64 * threads;
            if pack < end_pack {
                // SAFETY: the pack lies inside [start, stop) ⊆ [lo, hi): in every send buffer.
                *slot = unsafe {
                    vector::reduce_pack::<T, O, { vector::PEERS_IN_FLIGHT_FOR_LATENCY }>(
                        ctx,
                        send_offset,
                        pack,
                    )
                };
            }
        }
        // The elements outside whole packs: fewer than 2 × lanes <= threads, one a thread.
        let (head_end, tail_start) = if first_pack < end_pack {
            (first_pack * lanes, end_pack * lanes)
        } else {
            (stop, stop)
        };
        let head = head_end - start;
        let edge = if thread < head {
            Some(start + thread)
        } else {
            Some(tail_start + (thread - head)).filter(|index| *index < stop)
        };
        // SAFETY: index < stop <= count.
        let edge_value =
            edge.map(|index| unsafe { reduce_to_accumulator::<T, O>(ctx, send_offset, index) });
        // No rank overwrites this round's elements until every rank has read them.
        barrier.sync_advancing(owed.wrapping_add(1))?;
        *owed = 0;
        for (j, value) in held.iter().enumerate() {
            let pack = first_pack + thread + j as u64 * threads;
            if pack < end_pack {
                // SAFETY: inside this rank's window, 16-byte aligned (contract).
                unsafe { (recv as *mut vector::Pack).add(pack as usize).write(*value) };
            }
        }
        if let (Some(index), Some(value)) = (edge, edge_value) {
            // SAFETY: index < count: inside this rank's window.
            unsafe { recv.add(index as usize).write(T::narrow(value)) };
        }
    }
    Ok(())
}

/// The elements `[lo, hi)` of a task this rank runs in place, in rounds; the first round
/// barrier also announces the `owed` barriers of earlier out-of-place parts.
///
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
    owed: &mut u32,
) -> Result<(), Aborted> {
    let threads = arch::block_dim_x() as u64;
    let per_round = threads * UNROLL;
    let rounds = (hi - lo).div_ceil(Ord::max(per_round, 1));
    let thread = arch::thread_idx_x() as u64;
    for round in 0..rounds {
        let base = lo + round * per_round + thread;
        // Indices grow with j, so the valid ones are a prefix.
        let valid = if base < hi {
            Ord::min((hi - base).div_ceil(Ord::max(threads, 1)), UNROLL)
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
        barrier.sync_advancing(owed.wrapping_add(1))?;
        *owed = 0;
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

/// The shard `[lo, hi)` of `count` elements (two-shot: cells) that rank `rank` of `world`
/// reduces in two-shot.
#[inline(always)]
pub fn shard(count: u64, rank: u32, world: u32) -> (u64, u64) {
    block_range(count, rank, world)
}

/// Two-shot all-reduce of a batch: rank `r` owns shard `r` of the batch's cells (blocks split
/// the shard), loads its elements from every rank, reduces them and stores the result into
/// every rank's receive buffer at `recv_offset` of its receive window (in place: the send
/// buffer, which then must be at that offset of that window). Between a start and an end
/// barrier on the batch window.
///
/// # Safety
/// As for [`one_shot_all_reduce`]; each task's receive range lies in every rank's receive
/// window.
#[inline(always)]
pub unsafe fn two_shot_all_reduce<T: Element, O: ReduceOp>(
    batch: &Batch<'_>,
    grid: Grid,
) -> KernelStatus {
    let ctx = batch.first().rank.send;
    let per_cell = cell_elements(
        Algorithm::TwoShotAllReduce,
        core::mem::size_of::<T>() as u64,
    );
    let (shard_lo, shard_hi) = shard(batch.total_cells(per_cell), ctx.rank, ctx.world_size);
    let (lo, hi) = block_range(shard_hi - shard_lo, grid.block, grid.blocks);
    let (lo, hi) = (shard_lo + lo, shard_lo + hi);
    // SAFETY: forwarded contract.
    unsafe {
        between_barriers(ctx, grid, |_| {
            batch.walk(lo, hi, per_cell, |task, first, end| {
                two_shot_part::<T, O>(task, first, end);
                Ok(())
            })
        })
    }
}

/// Elements `[lo, hi)` of one task of a two-shot batch: reduce, store into every rank.
///
/// # Safety
/// Contract of [`two_shot_all_reduce`]; `hi <= count`.
#[inline(always)]
unsafe fn two_shot_part<T: Element, O: ReduceOp>(task: &Task<'_>, lo: u64, hi: u64) {
    let ctx = task.rank.send;
    let args = &task.args;
    let (recv_ctx, recv_offset) = if args.flags & FLAG_IN_PLACE != 0 {
        (task.rank.send, args.send_offset)
    } else {
        (task.rank.recv, args.recv_offset)
    };
    let world = ctx.world_size;
    // SAFETY: the contexts are host-built.
    let aligned = unsafe {
        vector::aligned(ctx, &[args.send_offset, recv_offset], ctx.local_base)
            && vector::aligned(recv_ctx, &[recv_offset], recv_ctx.local_base)
    };
    let store_element = |index: u64| {
        // SAFETY: index < hi <= count: inside every rank's send and receive buffers.
        unsafe {
            let value = reduce_element::<T, O>(ctx, args.send_offset, index);
            for peer in 0..world {
                let recv = recv_ctx.peer_base(peer).wrapping_add(recv_offset) as *mut T;
                recv.add(index as usize).write(value);
            }
        }
    };
    if aligned {
        for_packs_and_elements(
            lo,
            hi,
            vector::lanes::<T>(),
            // SAFETY: pack i lies inside [lo, hi): inside every rank's buffers, 16-byte
            // aligned.
            |i| unsafe {
                let pack = vector::reduce_pack::<T, O, { vector::PEERS_IN_FLIGHT_FOR_BANDWIDTH }>(
                    ctx,
                    args.send_offset,
                    i,
                );
                for peer in 0..world {
                    let recv =
                        recv_ctx.peer_base(peer).wrapping_add(recv_offset) as *mut vector::Pack;
                    recv.add(i as usize).write(pack);
                }
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

/// One-shot all-reduce over low-latency lines (payloads up to `LL_MAX_BYTES` per rank for the
/// whole batch): each rank writes its data, 8 bytes per line with the call's flag, into every
/// peer's line buffer, then waits for every rank's lines in its own buffer and reduces them in
/// rank order. No barrier at all: the flags say when data is there, and lines are
/// double-buffered by call parity (a rank cannot start call `k + 2` before every rank has read
/// call `k`). In place is safe: peers never read the send buffer. The tasks of a batch lie one
/// after the other in the batch window's lines (a task's lines start at its first cell: a cell
/// is a line), and the batch is one LL call on that window. Blocks own the same line ranges on
/// every rank; the call number is the window's (see `sync::ll::LlCall`), so any grid may follow
/// any other.
///
/// # Safety
/// As for [`one_shot_all_reduce`]; the signal pads were sized for `world_size` ranks
/// (`signal_pad_bytes`).
#[inline(always)]
pub unsafe fn one_shot_ll_all_reduce<T: Element, O: ReduceOp>(
    batch: &Batch<'_>,
    grid: Grid,
) -> KernelStatus {
    let ctx = batch.first().rank.send;
    let size = core::mem::size_of::<T>() as u64;
    let per_line = low_latency::per_line::<T>();
    // SAFETY: forwarded contract.
    let lines = match unsafe { LlLines::open(ctx, grid, batch.total_cells(per_line)) } {
        Ok(lines) => lines,
        Err(status) => return status,
    };
    let call = &lines.call;
    let stride = arch::block_dim_x() as u64;
    let _ = batch.walk(lines.lo, lines.hi, per_line, |task, first, end| {
        let send = task
            .rank
            .send
            .local_base
            .wrapping_add(task.args.send_offset) as *const T;
        // SAFETY: the send buffer holds `count` elements (caller's contract).
        unsafe { lines.push(ctx, send, task.args.count, first, end, task.first_cell) };
        Ok::<(), ()>(())
    });

    let mut failed = false;
    let _ = batch.walk(lines.lo, lines.hi, per_line, |task, first, end| {
        let args = &task.args;
        let recv = if args.flags & FLAG_IN_PLACE != 0 {
            task.rank.send.local_base.wrapping_add(args.send_offset)
        } else {
            task.rank.recv.local_base.wrapping_add(args.recv_offset)
        } as *mut T;
        let end_line = end.div_ceil(Ord::max(per_line, 1));
        let mut line = first / Ord::max(per_line, 1) + arch::thread_idx_x() as u64;
        while line < end_line {
            // Each source's line is taken once ([`LL_ROUND`] sources' lines loaded together)
            // and all its elements reduced from it, in rank order. `per_line <= 8` (1-byte
            // elements).
            let mut acc = [<T::Acc as Accumulator>::ZERO; 8];
            // SAFETY: the line lies inside the batch's lines, which `open` checked against
            // LL_LINES.
            let taken = unsafe {
                call.take_every_source(task.first_cell + line, |source, data| {
                    unroll!(e in [0 1 2 3 4 5 6 7] => {
                        if (e as u64) < per_line {
                            let value = T::from_bits(data >> (e as u64 * size * 8)).widen();
                            acc[e] = if source == 0 {
                                value
                            } else {
                                O::combine(acc[e], value)
                            };
                        }
                    });
                })
            };
            if taken.is_err() {
                failed = true;
                return Err(());
            }
            unroll!(e in [0 1 2 3 4 5 6 7] => {
                let index = line * per_line + e as u64;
                if (e as u64) < per_line && index < args.count {
                    let value = T::narrow(O::finish(acc[e], ctx.world_size));
                    // SAFETY: index < count: inside the receive buffer.
                    unsafe { recv.add(index as usize).write(value) };
                }
            });
            line += stride;
        }
        Ok(())
    });
    lines.close(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_aligned_shares_cover_the_range_once_and_start_on_packs() {
        for lanes in [1u64, 2, 4, 8, 16] {
            for first in [0u64, 1, 3, 16, 17, 1000] {
                for length in [0u64, 1, 5, 16, 31, 64, 65, 999, 4096] {
                    let end = first + length;
                    for world in 1..=9u32 {
                        let mut next = first;
                        for rank in 0..world {
                            let (lo, hi) = pack_aligned_share(first, end, rank, world, lanes);
                            let what = (first, end, lanes, rank, world);
                            assert_eq!(lo, next, "{what:?}");
                            assert!(lo <= hi && hi <= end, "{what:?}");
                            assert!(rank == 0 || lo == hi || lo % lanes == 0, "{what:?}");
                            next = hi;
                        }
                        assert_eq!(next, end, "{first}..{end} lanes {lanes} world {world}");
                    }
                }
            }
        }
    }
}
