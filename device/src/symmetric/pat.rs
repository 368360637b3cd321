//! PAT (parallel aggregated trees): all-gather and reduce-scatter in `ceil(log2(n))` steps for
//! any number of ranks `n`, after NCCL's PAT algorithms, on symmetric memory.
//!
//! **Schedule.** Segment `s` is rank `s`'s contribution (all-gather) or result
//! (reduce-scatter). Offsets are taken modulo `n`. At all-gather step `k = 0, 1, …, K-1`
//! rank `r` stores the `c_k = min(2^k, n - 2^k)` segments `r, r+1, …, r+c_k-1` into the
//! receive buffer of rank `r - 2^k`: after step `k` rank `r` holds segments
//! `[r, r + min(2^(k+1), n))`, so after `K` steps all of them. A step moves several segments
//! at once (the aggregation of NCCL's PAT), and a rank talks to one peer per step, so every
//! rank touches `K` peers instead of `n - 1`. For each segment the transfers form a binomial
//! tree rooted at its owner: the rank at distance `d = r' - s` below the root receives it from
//! distance `d - 2^h` (`h` the highest bit of `d`) at step `h`.
//!
//! Reduce-scatter runs the same trees backwards: at step `k = K-1, …, 1, 0` rank `r` sends to
//! rank `r + 2^k` its partial results of the segments at offsets `d ∈ [2^k, min(2^(k+1), n))`
//! (segment `r + d`). A partial is this rank's own element combined, in a fixed order (own
//! first, then the children of step `K-1`, `K-2`, … in turn), with the partials its children
//! sent at earlier steps. The root of segment `r` (offset 0) combines the same way, finishes
//! (`avg`) and narrows once.
//!
//! **Transport.** Push only: a rank reads its own memory and stores into its peer's, so a rank
//! never waits for anyone to finish reading its buffers. Per block index and step, a receiver
//! announces "ready for round `e`" in its sender's pad, and the sender announces "data of
//! round `e`" in the receiver's pad after its stores (release / acquire at system scope, waits
//! bounded by the window's timeout as everywhere). All-gather stores straight into the
//! receive buffers, which are symmetric: no staging. Reduce-scatter stores partials, in the
//! accumulator type (so narrow types round once, and integer averages are exact), into the
//! receiver's *inbox* in its signal pad: one slot per (step, segment) received, `n - 1` in
//! all, each [`PAT_SLOT_BYTES`] shared among the launch's blocks. A block's element range goes
//! through the inbox in rounds of at most a slot's share, so the staging area is bounded
//! whatever the count.
//!
//! **Rounds.** Each block index keeps two round counters in its rank's pad, one per
//! collective: every all-gather call is one all-gather round, every reduce-scatter call as
//! many reduce-scatter rounds as its range needs. A collective's flags trail only its own
//! counter, so however many rounds one makes, the other's flags never reach its next targets
//! (one shared counter would let a collective's old flags satisfy its targets after `2^31`
//! rounds of the other). Every rank launches the same grid and count, so block `b` of every
//! rank counts the same rounds of each collective, on any mix of collectives and grids on one
//! window. A flag never runs ahead of its reader: a sender writes round `e` only after the
//! receiver announced `e`, which it does only after it finished round `e - 1`; so every flag
//! of a collective is its counter's value or one less.
//!
//! **Failure.** Every wait is bounded and also looks at the rank's abort word (see
//! `crate::sync::wait`). The word lives in host memory (a PCIe round trip on a GPU), so a call
//! does not read it before its first useful work: thread 0 issues the read after posting the
//! call's first readiness flags ([`PatRounds::look_at_abort`]), and the first readiness wait,
//! which precedes the call's first store into a peer, compares it after waiting. A kernel
//! that starts after the host failed its communicator therefore stores into no peer (a
//! peer's flags of the same call may already be there: that peer's call may have returned,
//! and its memory may hold anything by now). Before giving up it does post its readiness
//! flags, copy its own segment into its own receive buffer (all-gather, out of place) and
//! advance its round counters. Flags compare as "at least", so those readiness flags may
//! release a sender waiting in that call, or in a later round of an earlier call that failed
//! part-way, which has not seen its own abort word yet: the sender then stores into this
//! rank's receive buffer or inbox, which belong to the failed communicator, and posts its data
//! flag. No peer completes a call on them: every rank's result depends on data flags this rank
//! never posts (each segment's tree is rooted at, or passes through, every rank).
//!
//! **Order of floating-point reduction.** The direct reduce-scatter combines ranks in rank
//! order; PAT combines along the tree (the same shape for every segment, rotated by the
//! segment's owner). Results are deterministic from call to call, and exact for integers and
//! for max/min, but for floating-point sums and products they may differ in the last bits from
//! the direct kernel's.

use super::all_gather::send_address;
use super::batch::{Batch, Task};
use super::{CollectiveArgs, FLAG_IN_PLACE, Grid, KernelStatus, Rank, block_range};
use crate::arch;
use crate::numeric::element::Element;
use crate::numeric::ops::ReduceOp;
use crate::sync::pat_rounds::PatRounds;
use crate::sync::signal_pad::{PAT_SLOT_BYTES, PatCollective, PatFlag, pat_staging_offset};

/// Steps of a PAT collective over `n` ranks: `ceil(log2(n))` (0 for one rank).
#[inline(always)]
pub const fn steps(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        u32::BITS - (n - 1).leading_zeros()
    }
}

/// Segments moved at step `k` (`k < steps(n)`): `min(2^k, n - 2^k)`.
#[inline(always)]
pub const fn step_segments(n: u32, k: u32) -> u32 {
    let span = 1u32 << k;
    if span < n - span { span } else { n - span }
}

/// One transfer of a schedule: `segments` consecutive segments starting at `first` (modulo
/// `n`), to or from `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// The other rank.
    pub peer: u32,
    /// First segment (rank number of its owner).
    pub first: u32,
    /// Number of segments.
    pub segments: u32,
}

/// `(a + b) mod n` for `a, b < n`.
#[inline(always)]
const fn add_mod(a: u32, b: u32, n: u32) -> u32 {
    let sum = a as u64 + b as u64;
    (sum % n as u64) as u32
}

/// `(a - b) mod n` for `a, b < n`.
#[inline(always)]
const fn sub_mod(a: u32, b: u32, n: u32) -> u32 {
    if a >= b { a - b } else { a + n - b }
}

/// What rank `rank` stores at all-gather step `k`: its segments `[rank, rank + c_k)` into
/// rank `rank - 2^k`.
#[inline(always)]
pub const fn all_gather_send(n: u32, rank: u32, k: u32) -> Transfer {
    Transfer {
        peer: sub_mod(rank, (1u32 << k) % n, n),
        first: rank,
        segments: step_segments(n, k),
    }
}

/// What rank `rank` receives at all-gather step `k`: segments `[rank + 2^k, + c_k)` from rank
/// `rank + 2^k`.
#[inline(always)]
pub const fn all_gather_receive(n: u32, rank: u32, k: u32) -> Transfer {
    let from = add_mod(rank, (1u32 << k) % n, n);
    Transfer {
        peer: from,
        first: from,
        segments: step_segments(n, k),
    }
}

/// What rank `rank` sends at reduce-scatter step `k`: its partials of the segments
/// `[rank + 2^k, + c_k)` (offsets `[2^k, 2^k + c_k)`) into the inbox of rank `rank + 2^k`.
#[inline(always)]
pub const fn reduce_scatter_send(n: u32, rank: u32, k: u32) -> Transfer {
    let to = add_mod(rank, (1u32 << k) % n, n);
    Transfer {
        peer: to,
        first: to,
        segments: step_segments(n, k),
    }
}

/// What rank `rank` receives at reduce-scatter step `k`: partials of its segments
/// `[rank, rank + c_k)` (offsets `[0, c_k)`) from rank `rank - 2^k`, into inbox slots
/// `inbox_slot(k, 0..c_k)`.
#[inline(always)]
pub const fn reduce_scatter_receive(n: u32, rank: u32, k: u32) -> Transfer {
    Transfer {
        peer: sub_mod(rank, (1u32 << k) % n, n),
        first: rank,
        segments: step_segments(n, k),
    }
}

/// `true` when the partial at offset `offset` receives a child's partial at reduce-scatter
/// step `k` (`offset < c_k`). A partial combines its children in descending step order.
#[inline(always)]
pub const fn reduce_scatter_receives(n: u32, offset: u32, k: u32) -> bool {
    offset < step_segments(n, k)
}

/// Inbox slot of the partial at offset `offset` received at reduce-scatter step `k`:
/// `2^k - 1 + offset` (the slots of steps `0..k` hold `2^k - 1` partials, as only the last
/// step can move fewer than `2^k`). Slots run from 0 to `n - 2`.
#[inline(always)]
pub const fn inbox_slot(k: u32, offset: u32) -> u32 {
    (1u32 << k) - 1 + offset
}

/// Elements of an accumulator of `acc_bytes` bytes that one block's share of an inbox slot
/// holds, for a launch of `blocks` blocks (at least 1 for every `blocks <= MAX_BLOCKS` and
/// accumulator up to 16 bytes).
#[inline(always)]
pub const fn slot_capacity(acc_bytes: u32, blocks: u32) -> u64 {
    block_share_bytes(blocks) / acc_bytes as u64
}

/// Bytes of one block's share of an inbox slot (a multiple of 16).
#[inline(always)]
const fn block_share_bytes(blocks: u32) -> u64 {
    (PAT_SLOT_BYTES as u64 / blocks as u64) / 16 * 16
}

/// The one task of a PAT launch, or `None` for a batch of several (the host never fuses PAT
/// calls; a work table of several tasks is refused as an invalid launch on every rank alike).
#[inline(always)]
fn single_task<'a>(batch: &Batch<'a>) -> Option<Task<'a>> {
    (batch.len() == 1).then(|| batch.first())
}

/// PAT all-gather kernel: one task of `count` bytes per rank (see the module documentation).
///
/// # Safety
/// As for [`super::all_gather::all_gather`]; the signal pads were sized by
/// `signal_pad_bytes(world_size)`.
#[inline(always)]
pub unsafe fn pat_all_gather(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    match single_task(batch) {
        // SAFETY: forwarded contract.
        Some(task) => unsafe { pat_all_gather_task(task.rank, grid, &task.args) },
        None => KernelStatus::InvalidLaunch,
    }
}

/// PAT all-gather of `args.count` bytes per rank.
///
/// # Safety
/// As for [`pat_all_gather`].
#[inline(always)]
unsafe fn pat_all_gather_task(rank: Rank<'_>, grid: Grid, args: &CollectiveArgs) -> KernelStatus {
    let ctx = rank.recv;
    let bytes = args.count;
    // Uniform on every rank: a call without bytes takes no round.
    if bytes == 0 {
        return KernelStatus::Completed;
    }
    let (n, me) = (ctx.world_size, ctx.rank);
    let send = send_address(rank, args);
    let local_recv = ctx.local_base.wrapping_add(args.recv_offset);
    // SAFETY: forwarded contract; grid.block < MAX_BLOCKS (resolve_launch).
    let rounds = unsafe { PatRounds::open(ctx, PatCollective::Gather, grid.block) };
    let round = rounds.before().wrapping_add(1);
    let total = steps(n);
    // Ready for this round: the sender of each step may store into this receive buffer.
    for k in 0..total {
        // SAFETY: the peer is a rank; k < PAT_MAX_STEPS since n <= MAX_RANKS.
        unsafe {
            rounds.post(
                all_gather_receive(n, me, k).peer,
                PatFlag::GatherReady,
                k,
                round,
            )
        };
    }
    // The abort word, compared at the first wait, before any store into a peer.
    let mut look = Some(rounds.look_at_abort());
    if args.flags & FLAG_IN_PLACE == 0 {
        let own = local_recv.wrapping_add(me as u64 * bytes);
        // SAFETY: the send buffer and this rank's segment of its receive buffer (contract).
        unsafe { copy_segment(send, own, bytes, grid) };
    }
    let mut completed = true;
    for k in 0..total {
        // The segments received at step k-1 (and, by earlier waits, before) have landed, and
        // the receiver of step k has entered this round.
        // SAFETY: k - 1 and k < PAT_MAX_STEPS.
        if (k > 0 && unsafe { !rounds.wait(PatFlag::GatherData, k - 1, round) })
            // SAFETY: as above.
            || unsafe { !rounds.wait_ready(PatFlag::GatherReady, k, round, look.take()) }
        {
            completed = false;
            break;
        }
        let out = all_gather_send(n, me, k);
        // SAFETY: the peer is a rank.
        let peer_recv = unsafe { ctx.peer_base(out.peer) }.wrapping_add(args.recv_offset);
        for j in 0..out.segments {
            let segment = add_mod(out.first, j, n) as u64 * bytes;
            let src = if j == 0 {
                send
            } else {
                local_recv.wrapping_add(segment)
            };
            // SAFETY: a segment this rank holds (its own, or one received at an earlier step),
            // into the same segment of the peer's receive buffer (contract).
            unsafe { copy_segment(src, peer_recv.wrapping_add(segment), bytes, grid) };
        }
        // SAFETY: the peer is a rank; k < PAT_MAX_STEPS.
        unsafe { rounds.post(out.peer, PatFlag::GatherData, k, round) };
    }
    // SAFETY: total - 1 < PAT_MAX_STEPS.
    if completed && total > 0 && unsafe { !rounds.wait(PatFlag::GatherData, total - 1, round) } {
        completed = false;
    }
    rounds.finish(1);
    if completed {
        KernelStatus::Completed
    } else {
        KernelStatus::Aborted
    }
}

/// Bytes of the granules a segment is split into among the blocks of a launch.
const GRANULE_BYTES: u64 = 16;

/// The byte range `[lo, hi)` of a `bytes`-byte segment that block `grid.block` copies: whole
/// `GRANULE_BYTES` granules, split by [`block_range`] and clipped to `bytes`. It depends on
/// nothing but `bytes` and the grid, so block `b` of every rank covers the same bytes whatever
/// the alignment of each rank's buffers: the data flag of block `b` announces exactly the bytes
/// block `b` of the receiver forwards.
#[inline(always)]
pub fn segment_share(bytes: u64, grid: Grid) -> (u64, u64) {
    let (lo, hi) = block_range(bytes.div_ceil(GRANULE_BYTES), grid.block, grid.blocks);
    (
        (lo * GRANULE_BYTES).min(bytes),
        (hi * GRANULE_BYTES).min(bytes),
    )
}

/// Copy this block's share ([`segment_share`]) of a `bytes`-byte segment, in the widest unit
/// that divides both addresses of the share and its length.
///
/// # Safety
/// Both `bytes`-byte ranges are valid.
#[inline(always)]
unsafe fn copy_segment(src: u64, dst: u64, bytes: u64, grid: Grid) {
    let (lo, hi) = segment_share(bytes, grid);
    let (src, dst, len) = (src.wrapping_add(lo), dst.wrapping_add(lo), hi - lo);
    let alignment = src | dst | len;
    // SAFETY: forwarded contract; the share lies inside both ranges and the unit divides both
    // addresses and the length.
    unsafe {
        if alignment.is_multiple_of(16) {
            // As a `u128`: one `ld.v2.b64` and one `st.v2.b64`.
            copy_share::<u128>(src, dst, len / 16);
        } else if alignment.is_multiple_of(8) {
            copy_share::<u64>(src, dst, len / 8);
        } else if alignment.is_multiple_of(4) {
            copy_share::<u32>(src, dst, len / 4);
        } else {
            copy_share::<u8>(src, dst, len);
        }
    }
}

/// Copy `units` values of `U` from `src` to `dst`, strided over the threads of the block (a
/// block's only thread copies them as one `memmove`).
///
/// # Safety
/// Both ranges are valid and aligned for `U`.
#[inline(always)]
unsafe fn copy_share<U: Copy>(src: u64, dst: u64, units: u64) {
    if arch::single_thread_block() {
        // SAFETY: forwarded contract (`copy` also allows the in-place copy onto itself).
        unsafe { core::ptr::copy(src as *const U, dst as *mut U, units as usize) };
        return;
    }
    let stride = arch::block_dim_x() as u64;
    let mut i = arch::thread_idx_x() as u64;
    while i < units {
        // SAFETY: i < units; forwarded contract.
        unsafe {
            let value = (src as *const U).add(i as usize).read();
            (dst as *mut U).add(i as usize).write(value);
        }
        i += stride;
    }
}

/// PAT reduce-scatter kernel: one task of `count` elements per rank (see the module
/// documentation).
///
/// # Safety
/// As for [`super::reduce_scatter::reduce_scatter`]; the signal pads were sized by
/// `signal_pad_bytes(world_size)`.
#[inline(always)]
pub unsafe fn pat_reduce_scatter<T: Element, O: ReduceOp>(
    batch: &Batch<'_>,
    grid: Grid,
) -> KernelStatus {
    match single_task(batch) {
        // SAFETY: forwarded contract.
        Some(task) => unsafe { pat_reduce_scatter_task::<T, O>(task.rank, grid, &task.args) },
        None => KernelStatus::InvalidLaunch,
    }
}

/// PAT reduce-scatter with `args.count` elements per rank.
///
/// # Safety
/// As for [`pat_reduce_scatter`].
#[inline(always)]
unsafe fn pat_reduce_scatter_task<T: Element, O: ReduceOp>(
    rank: Rank<'_>,
    grid: Grid,
    args: &CollectiveArgs,
) -> KernelStatus {
    let ctx = rank.send;
    let count = args.count;
    if count == 0 {
        return KernelStatus::Completed;
    }
    let (n, me) = (ctx.world_size, ctx.rank);
    let size = core::mem::size_of::<T>() as u64;
    let send = ctx.local_base.wrapping_add(args.send_offset) as *const T;
    let recv = if args.flags & FLAG_IN_PLACE != 0 {
        ctx.local_base
            .wrapping_add(args.send_offset)
            .wrapping_add(me as u64 * count * size)
    } else {
        rank.recv.local_base.wrapping_add(args.recv_offset)
    } as *mut T;
    let acc_bytes = core::mem::size_of::<T::Acc>() as u32;
    let capacity = slot_capacity(acc_bytes, grid.blocks);
    if capacity == 0 {
        return KernelStatus::InvalidLaunch;
    }
    let (lo, hi) = block_range(count, grid.block, grid.blocks);
    let round_count = (hi - lo).div_ceil(capacity) as u32;
    // SAFETY: forwarded contract; grid.block < MAX_BLOCKS (resolve_launch).
    let rounds = unsafe { PatRounds::open(ctx, PatCollective::Scatter, grid.block) };
    let total = steps(n);
    let share = block_share_bytes(grid.blocks);
    // This block's share of inbox slot `slot` in the pad at `pad`.
    let slot_address = |pad: u64, slot: u32| -> *mut T::Acc {
        (pad + pat_staging_offset(n as usize) as u64
            + slot as u64 * PAT_SLOT_BYTES as u64
            + grid.block as u64 * share) as *mut T::Acc
    };
    let own_pad = rounds.own_pad();
    let stride = arch::block_dim_x() as u64;
    let mut completed = true;
    // The abort word, looked at after the first round's readiness flags and compared at its
    // first wait, before any store into a peer.
    let mut look = None;
    'rounds: for r in 0..round_count {
        let round = rounds.before().wrapping_add(r + 1);
        let start = lo + r as u64 * capacity;
        let len = (hi - start).min(capacity);
        // Ready: every sender may store this round's partials into this inbox (the previous
        // round's were all read: the block barrier in `post` follows the last read).
        for k in 0..total {
            let from = reduce_scatter_receive(n, me, k).peer;
            // SAFETY: the peer is a rank; k < PAT_MAX_STEPS.
            unsafe { rounds.post(from, PatFlag::ScatterReady, k, round) };
        }
        if r == 0 {
            look = Some(rounds.look_at_abort());
        }
        for k in (0..total).rev() {
            // SAFETY: k + 1 and k < PAT_MAX_STEPS.
            if (k + 1 < total && unsafe { !rounds.wait(PatFlag::ScatterData, k + 1, round) })
                // SAFETY: as above.
                || unsafe { !rounds.wait_ready(PatFlag::ScatterReady, k, round, look.take()) }
            {
                completed = false;
                break 'rounds;
            }
            let out = reduce_scatter_send(n, me, k);
            // SAFETY: the peer is a rank.
            let peer_pad = unsafe { ctx.peer_signal_pad(out.peer) };
            for j in 0..out.segments {
                let offset = (1u32 << k) + j;
                let segment = add_mod(me, offset, n) as u64;
                let dst = slot_address(peer_pad, inbox_slot(k, j));
                let mut i = arch::thread_idx_x() as u64;
                while i < len {
                    // SAFETY: inside this rank's send buffer, its inbox and the peer's inbox
                    // (contract; len <= capacity).
                    unsafe {
                        let acc = partial::<T, O>(
                            send,
                            segment * count + start + i,
                            n,
                            offset,
                            k + 1,
                            total,
                            |slot| slot_address(own_pad, slot).add(i as usize).read(),
                        );
                        dst.add(i as usize).write(acc);
                    }
                    i += stride;
                }
            }
            // SAFETY: the peer is a rank; k < PAT_MAX_STEPS.
            unsafe { rounds.post(out.peer, PatFlag::ScatterData, k, round) };
        }
        // SAFETY: 0 < PAT_MAX_STEPS.
        if total > 0 && unsafe { !rounds.wait(PatFlag::ScatterData, 0, round) } {
            completed = false;
            break;
        }
        let mut i = arch::thread_idx_x() as u64;
        while i < len {
            // SAFETY: this rank's segment of the send buffer, its inbox, and its receive
            // buffer (contract).
            unsafe {
                let acc = partial::<T, O>(
                    send,
                    me as u64 * count + start + i,
                    n,
                    0,
                    0,
                    total,
                    |slot| slot_address(own_pad, slot).add(i as usize).read(),
                );
                recv.add((start + i) as usize)
                    .write(T::narrow(O::finish(acc, n)));
            }
            i += stride;
        }
    }
    rounds.finish(round_count);
    if completed {
        KernelStatus::Completed
    } else {
        KernelStatus::Aborted
    }
}

/// The partial at offset `offset` for element `index` of the send buffer: the own element,
/// then the children received at steps `total-1` down to `from_step` (those the offset receives
/// at: [`reduce_scatter_receives`]), read through `inbox(slot)`.
///
/// # Safety
/// `send + index` is readable; `inbox` reads valid slots.
#[inline(always)]
unsafe fn partial<T: Element, O: ReduceOp>(
    send: *const T,
    index: u64,
    n: u32,
    offset: u32,
    from_step: u32,
    total: u32,
    inbox: impl Fn(u32) -> T::Acc,
) -> T::Acc {
    // SAFETY: forwarded contract.
    let mut acc = unsafe { send.add(index as usize).read() }.widen();
    let mut k = total;
    while k > from_step {
        k -= 1;
        if reduce_scatter_receives(n, offset, k) {
            acc = O::combine(acc, inbox(inbox_slot(k, offset)));
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_the_ceiling_of_log2() {
        assert_eq!(
            [1, 2, 3, 4, 5, 8, 9, 64, 65, 4096].map(steps),
            [0, 1, 2, 2, 3, 3, 4, 6, 7, 12]
        );
        for n in 2..300u32 {
            let total: u32 = (0..steps(n)).map(|k| step_segments(n, k)).sum();
            assert_eq!(total, n - 1, "n = {n}");
        }
    }

    #[test]
    fn segment_shares_tile_the_segment_in_granules() {
        for bytes in [1u64, 15, 16, 17, 48, 1000, 4100, 65_537] {
            for blocks in 1..=9u32 {
                let mut next = 0;
                for block in 0..blocks {
                    let (lo, hi) = segment_share(bytes, Grid { block, blocks });
                    assert_eq!(lo, next, "bytes {bytes} blocks {blocks} block {block}");
                    assert!(lo <= hi && hi <= bytes);
                    assert!(lo == bytes || lo.is_multiple_of(GRANULE_BYTES));
                    assert!(hi == bytes || hi.is_multiple_of(GRANULE_BYTES));
                    next = hi;
                }
                assert_eq!(next, bytes, "bytes {bytes} blocks {blocks}");
            }
        }
    }

    #[test]
    fn inbox_slots_are_dense() {
        for n in 2..300u32 {
            let mut seen = std::vec![false; n as usize - 1];
            for k in 0..steps(n) {
                for j in 0..step_segments(n, k) {
                    let slot = inbox_slot(k, j) as usize;
                    assert!(!seen[slot], "n {n} slot {slot}");
                    seen[slot] = true;
                }
            }
            assert!(seen.iter().all(|s| *s));
        }
    }
}
