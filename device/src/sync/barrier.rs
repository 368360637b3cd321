//! The cross-rank barrier: block `b` of every rank meets block `b` of every other rank.
//!
//! Each rank keeps, in its own signal pad, one epoch counter per block index; it persists across
//! launches, so no reset is needed and CUDA-graph replay works. To pass barrier number `e + 1`,
//! block `b` of rank `r` writes `e + 1` (release, system scope) into slot `[b][r]` of every
//! peer's inbox, then waits (acquire, bounded) until every slot `[b][*]` of its own inbox has
//! reached `e + 1`. Comparisons are wrap-safe. A peer may run ahead by one barrier; since slots
//! only grow, waiting for "at least" is correct.
//!
//! **Failure.** A block that gives up a barrier (a wait timed out, or this rank's abort word
//! was raised) has announced an epoch its peers may never reach: its rank is out of step on the
//! window for good, and any later announcement of that block index could release a peer still
//! waiting in the abandoned call, which would then complete with data that never came. The
//! same holds for a launch that refused its arguments, and for a barrier skipped on seeing
//! the abort word (the LL period clear): they announce nothing their peers wait for. Each
//! sets the window's out-of-step mark ([`out_of_step_slot`], in this rank's own pad, never
//! cleared: the communicator has failed), and the first round of every barrier
//! ([`UnstartedBarrier::start`]) reads the mark before anything else (a vote, an
//! announcement) and gives up without announcing when it is set.
//!
//! The abort word, which the host raises on every rank of the machine when the communicator failed
//! elsewhere (ranks of other processes through their call records), lives in host memory (a PCIe
//! round trip on a GPU). The barrier kernels do not read it before announcing their start barrier:
//! the start barrier ([`UnstartedBarrier::start`]) reads it after the announcement, while the wait
//! runs, and gives up when it is raised, before the caller touches a peer's memory. A rank whose
//! epochs are in step announces only epochs its peers announce for the same call, so the start
//! announcement of a kernel that then gives up lets no peer pass a later barrier of the call (a
//! one-round barrier, Triton's or the LL period clear, does complete on a peer: this rank did
//! arrive). What it can do, that the look before announcing it replaced could not: release a third
//! rank waiting at that start barrier that has not seen the abort word yet (waits look every
//! `POLLS_PER_ABORT_LOOK` polls, and a rank of another process is told a little later), which then
//! runs its body (the two-shot, gather and broadcast kernels and the one-shot share-out store into
//! peers' receive buffers) and gives up at its next barrier. That needs the communicator to fail
//! while a kernel of the call is still pending on one rank and waiting on another.

use super::abort::{abort_timed_out_waiting_for, raise_timeout};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::signal_pad::{
    MAX_BLOCKS, MAX_RANKS, descriptor_slot, epoch_slot, inbox_slot, out_of_step_slot, vote_slot,
};
use crate::sync::wait::{WaitOutcome, wait_until_reached};

/// The barrier was abandoned: a wait timed out on some thread of this rank, this rank's abort
/// word was raised, or the window was already out of step (see the module documentation). The
/// abort word or the out-of-step mark is set; the kernel must return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aborted;

/// Block-level handle on the cross-rank barrier of one block index, past its first round.
/// Every thread of the block opens it ([`CrossRankBarrier::open`]), passes the first round
/// ([`UnstartedBarrier::start`] and its variants), calls [`CrossRankBarrier::sync`] the same
/// number of times, and calls [`CrossRankBarrier::finish`] once at the end.
#[must_use = "a started barrier must `finish`, or its epoch is lost while the window is in step"]
pub struct CrossRankBarrier<'a> {
    ctx: &'a SymmContext,
    block: u32,
    epoch: u32,
}

/// A cross-rank barrier before its first round: the only way to a [`CrossRankBarrier`] is
/// through that round, which refuses a window out of step and looks at the abort word (see
/// the module documentation).
#[must_use = "an opened barrier does nothing until its first round is passed"]
pub struct UnstartedBarrier<'a>(CrossRankBarrier<'a>);

impl<'a> CrossRankBarrier<'a> {
    /// The largest block count and world size the signal pad has room for.
    pub const LIMITS: (usize, usize) = (MAX_BLOCKS, MAX_RANKS);

    /// Open the barrier of block index `block` (the calling block's index among its rank's
    /// blocks). Its first round ([`UnstartedBarrier::start`]) finds whether the window is out
    /// of step.
    ///
    /// # Safety
    /// `ctx` must be a context built by the host whose signal-pad tables are valid, with
    /// `world_size <= MAX_RANKS`; `block < MAX_BLOCKS`; every thread of the block must make the
    /// same sequence of calls on the barrier.
    #[inline(always)]
    pub unsafe fn open(ctx: &'a SymmContext, block: u32) -> UnstartedBarrier<'a> {
        // SAFETY: rank < world_size and the table is valid (caller's contract).
        let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
        // SAFETY: block < MAX_BLOCKS, so the slot lies inside the pad; only this block of this
        // rank writes it, and only after every thread has read it (see `finish`).
        let epoch = unsafe { arch::load_plain_u32(epoch_slot(own_pad, block)) };
        UnstartedBarrier(CrossRankBarrier { ctx, block, epoch })
    }

    /// The window's context this barrier was opened on.
    #[inline(always)]
    pub fn context(&self) -> &'a SymmContext {
        self.ctx
    }

    /// This rank's pad, read again where needed rather than held: a kernel keeps the barrier
    /// live through its body, and the one-shot kernels have no register to spare.
    #[inline(always)]
    fn own_pad(&self) -> u64 {
        // SAFETY: rank < world_size and the table is valid (`open`'s contract).
        unsafe { self.ctx.peer_signal_pad(self.ctx.rank) }
    }

    /// Wait until block `b` of every rank has reached this point. Everything this block wrote
    /// before the call is visible to every rank's block `b` after it, and vice versa.
    #[inline(always)]
    pub fn sync(&mut self) -> Result<(), Aborted> {
        self.sync_advancing(1)
    }

    /// Pass `steps` barriers at once: announce epoch `e + steps` and wait until every rank's
    /// block `b` has announced at least that. A peer that passes the same barriers one at a
    /// time is released at each of them by this one announcement (waits are for "at least"),
    /// so ranks that take the same epochs in different step sizes stay in step. `steps` is
    /// at least 1 and below 2^31.
    #[inline(always)]
    pub fn sync_advancing(&mut self, steps: u32) -> Result<(), Aborted> {
        self.round(steps, false, NO_VOTE)
    }

    /// One round `steps` epochs on, writing `vote` (unless [`NO_VOTE`]) before announcing;
    /// `first`: the barrier's first round ([`first_barrier_round`]).
    #[inline(always)]
    fn round(&mut self, steps: u32, first: bool, vote: u32) -> Result<(), Aborted> {
        self.epoch = self.epoch.wrapping_add(steps.max(1));
        let abandoned = if first {
            first_barrier_round(self.ctx, self.block, self.epoch, vote)
        } else {
            if vote != NO_VOTE && arch::thread_idx_x() == 0 {
                // SAFETY: as in `first_barrier_round`.
                unsafe { arch::store_plain_u32(vote_slot(self.own_pad(), self.block), vote) };
            }
            barrier_round(self.ctx, self.block, self.epoch)
        };
        if abandoned { Err(Aborted) } else { Ok(()) }
    }

    /// Pass the next barrier as [`CrossRankBarrier::sync`] does, and learn whether block `b` of
    /// every rank passed it with `vote` true: `Ok(true)` on every rank's block `b` alike, or
    /// `Ok(false)` on every one alike. Every thread of the block passes the same `vote`.
    ///
    /// Thread 0 writes the vote into this rank's pad before the barrier announces it (the
    /// barrier publishes it as it publishes data); a rank that voted true reads every peer's vote
    /// after the barrier, one thread per peer, and the block combines them. A rank that voted
    /// false knows the answer and reads nothing.
    ///
    /// Between two voting barriers of one block index (in one launch or two), the block must
    /// pass at least one other barrier: a peer reads this rank's vote after the voting barrier
    /// and before it announces its next one, so the next vote is written only after that
    /// announcement has been seen.
    #[inline(always)]
    pub fn sync_unanimous(&mut self, vote: bool) -> Result<bool, Aborted> {
        self.unanimous_round(vote, false)
    }

    /// [`CrossRankBarrier::sync_unanimous`]; `first` as in [`CrossRankBarrier::round`]. The
    /// first round writes the vote only after finding the window in step (a block of a window out
    /// of step must not overwrite the vote a peer of the abandoned call may still read).
    #[inline(always)]
    fn unanimous_round(&mut self, vote: bool, first: bool) -> Result<bool, Aborted> {
        // The vote goes out with the announcement; the mutant writes it after the round.
        let written = if arch::mutated!(VoteAfterBarrier) {
            NO_VOTE
        } else {
            vote as u32
        };
        self.round(1, first, written)?;
        if arch::mutated!(VoteAfterBarrier) && arch::thread_idx_x() == 0 {
            // SAFETY: as in `first_barrier_round` (the mutant's deliberately late write).
            unsafe { arch::store_plain_u32(vote_slot(self.own_pad(), self.block), vote as u32) };
        }
        if !vote {
            return Ok(false);
        }
        let mut dissent = false;
        let mut peer = arch::thread_idx_x();
        while peer < self.ctx.world_size {
            // SAFETY: peer < world_size; the pad table is valid (`open`'s contract); the peer's
            // block wrote its vote before announcing the barrier just passed, and writes the
            // next one only after this block announces its next barrier.
            dissent |= unsafe {
                arch::load_plain_u32(vote_slot(self.ctx.peer_signal_pad(peer), self.block)) == 0
            };
            peer += arch::block_dim_x();
        }
        Ok(!arch::sync_threads_or(dissent))
    }

    /// Pass the next barrier as [`CrossRankBarrier::sync`] does, and learn whether block `b` of
    /// every rank passed it with the same `descriptor` (what the block is about to do, the same
    /// on every thread of the block): `Ok(true)` on every rank's block `b` alike, or `Ok(false)`
    /// on every one alike.
    ///
    /// Thread 0 writes the descriptor into this rank's pad, in the slot of the barrier's epoch
    /// parity, before the barrier announces it; after the barrier, one thread per peer reads the
    /// peer's slot of that parity. A peer writes its slot of the same parity again only for the
    /// barrier after next, which it reaches only after passing the next one, which needs this
    /// block's announcement of it, made after the reads: consecutive agreeing barriers need
    /// nothing between them.
    #[inline(always)]
    pub fn sync_agreeing(&mut self, descriptor: u32) -> Result<bool, Aborted> {
        self.agreeing_round(descriptor, false)
    }

    /// [`CrossRankBarrier::sync_agreeing`]; `first` as in [`CrossRankBarrier::round`]. A first
    /// round reads the out-of-step mark before writing the descriptor, as the votes do: a block
    /// of a window out of step must not overwrite a descriptor a peer of the abandoned call may
    /// still read.
    #[inline(always)]
    fn agreeing_round(&mut self, descriptor: u32, first: bool) -> Result<bool, Aborted> {
        if first {
            let marked = arch::thread_idx_x() == 0
                // SAFETY: the mark lies inside this rank's pad and is accessed atomically.
                && unsafe { arch::load_relaxed_sys_u32(out_of_step_slot(self.own_pad())) } != 0;
            if arch::sync_threads_or(marked) {
                return Err(Aborted);
            }
        }
        let parity = self.epoch.wrapping_add(1) & 1;
        if arch::thread_idx_x() == 0 {
            // SAFETY: the slot lies inside this rank's pad; only this block of this rank writes
            // it, and peers read it only between the barrier announced next and the one after.
            unsafe {
                let slot = descriptor_slot(self.own_pad(), parity, self.block);
                arch::store_plain_u32(slot, descriptor);
            }
        }
        // The round's block barrier orders the store before the announcement.
        self.round(1, first, NO_VOTE)?;
        let mut differ = false;
        let mut peer = arch::thread_idx_x();
        while peer < self.ctx.world_size {
            // SAFETY: peer < world_size; the pad table is valid (`open`'s contract); the peer's
            // block wrote its descriptor before announcing the barrier just passed, and writes
            // this slot again only after this block announces its next barrier.
            differ |= unsafe {
                let slot = descriptor_slot(self.ctx.peer_signal_pad(peer), parity, self.block);
                arch::load_plain_u32(slot) != descriptor
            };
            peer += arch::block_dim_x();
        }
        Ok(!arch::sync_threads_or(differ))
    }

    /// Store the epoch for the next use of this block index (a later launch, or a later call
    /// of a device function in the same kernel). Call once, on every thread, after the last
    /// `sync`. The two block barriers make the change visible block-wide: no thread can read
    /// the slot in a later [`CrossRankBarrier::open`] before it is written. A barrier whose
    /// round was abandoned need not finish: its window is out of step for good.
    pub fn finish(self) {
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            // SAFETY: the slot lies inside this rank's pad; every thread of the block read it in
            // `open` before the barrier above.
            unsafe { arch::store_plain_u32(epoch_slot(self.own_pad(), self.block), self.epoch) };
        }
        if !arch::mutated!(FinishWithoutClosingBarrier) {
            arch::sync_threads();
        }
    }
}

impl<'a> UnstartedBarrier<'a> {
    /// Pass the first barrier, as [`CrossRankBarrier::sync`] does: `Err` without announcing
    /// when the window is out of step, and `Err` when this rank's abort word (host memory, read
    /// while waiting) is raised, before the caller touches a peer's memory.
    #[inline(always)]
    pub fn start(self) -> Result<CrossRankBarrier<'a>, Aborted> {
        self.start_advancing(1)
    }

    /// [`UnstartedBarrier::start`] passing `steps` barriers at once, as
    /// [`CrossRankBarrier::sync_advancing`] does.
    #[inline(always)]
    pub fn start_advancing(self, steps: u32) -> Result<CrossRankBarrier<'a>, Aborted> {
        let mut barrier = self.0;
        barrier.round(steps, true, NO_VOTE).map(|()| barrier)
    }

    /// [`UnstartedBarrier::start`] comparing descriptors, as
    /// [`CrossRankBarrier::sync_agreeing`] does.
    #[inline(always)]
    pub fn start_agreeing(self, descriptor: u32) -> Result<(CrossRankBarrier<'a>, bool), Aborted> {
        let mut barrier = self.0;
        barrier
            .agreeing_round(descriptor, true)
            .map(|agreed| (barrier, agreed))
    }

    /// [`UnstartedBarrier::start`] as a vote, as [`CrossRankBarrier::sync_unanimous`] does.
    #[inline(always)]
    pub fn start_unanimous(self, vote: bool) -> Result<(CrossRankBarrier<'a>, bool), Aborted> {
        let mut barrier = self.0;
        barrier
            .unanimous_round(vote, true)
            .map(|unanimous| (barrier, unanimous))
    }
}

/// [`first_barrier_round`]'s `vote` when the round carries none.
const NO_VOTE: u32 = u32::MAX;

/// One barrier round to epoch `target`; returns `true` when it was abandoned (a wait timed out
/// or saw the abort word raised), leaving the window's out-of-step mark set. Not inlined in
/// the kernels: a kernel calls it a few times, never per element, and few scalar arguments
/// keep the caller's state in registers (ptxas passes them in registers: each one more is one
/// more register at every call, and the one-shot kernels sit at the 128 a 512-thread block
/// may use; the pad's address is read again inside rather than passed). Inlined in the
/// Triton-linkable library, whose callers are compiled by Triton's ptxas: there a call makes
/// ptxas save the values that live across it (an in-place round's loaded data) to the stack.
#[cfg_attr(not(feature = "triton-library"), inline(never))]
#[cfg_attr(feature = "triton-library", inline(always))]
fn barrier_round(ctx: &SymmContext, block: u32, target: u32) -> bool {
    // Orders the block's earlier accesses before the announcement.
    arch::sync_threads();
    announce_and_wait(ctx, block, target, false)
}

/// The first round of a barrier, to epoch `target`: `true` at once, with nothing announced,
/// when the window is out of step; else write `vote` (0 or 1; [`NO_VOTE`]: none) into this
/// rank's vote slot, announce, and wait as [`barrier_round`] does, looking at the abort word
/// while waiting (`true` when it is raised). Not inlined, as [`barrier_round`]; called once per
/// barrier, where the kernel holds little.
#[cfg_attr(not(feature = "triton-library"), inline(never))]
#[cfg_attr(feature = "triton-library", inline(always))]
fn first_barrier_round(ctx: &SymmContext, block: u32, target: u32, vote: u32) -> bool {
    // SAFETY: rank < world_size and the table is valid (`CrossRankBarrier::open`'s contract).
    let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
    let leader = arch::thread_idx_x() == 0;
    // The out-of-step mark (this rank's own pad), read by one thread and shared by a block
    // barrier, so that the whole block takes the same branch; before the vote and the
    // announcement.
    let marked = leader
        // SAFETY: the mark lies inside this rank's pad and is accessed atomically.
        && unsafe { arch::load_relaxed_sys_u32(out_of_step_slot(own_pad)) } != 0;
    if arch::sync_threads_or(marked) {
        return true;
    }
    if vote != NO_VOTE && leader {
        // SAFETY: the slot lies inside this rank's pad; only this block of this rank writes
        // it, and no peer reads it until this barrier is announced (and, for the previous vote,
        // peers read it before announcing the barrier that followed it).
        unsafe { arch::store_plain_u32(vote_slot(own_pad, block), vote) };
    }
    // Orders the block's earlier accesses (and the vote) before the announcement.
    arch::sync_threads();
    announce_and_wait(ctx, block, target, true)
}

/// Announce epoch `target` to every peer and wait until every peer announced it; with `look`,
/// thread 0 reads the abort word between the two. `true` (on every thread) when the round was
/// abandoned; the window is then marked out of step.
#[inline(always)]
fn announce_and_wait(ctx: &SymmContext, block: u32, target: u32, look: bool) -> bool {
    // SAFETY: rank < world_size and the table is valid (`CrossRankBarrier::open`'s contract).
    let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
    let stride = arch::block_dim_x();
    let world = ctx.world_size;
    let rank = ctx.rank;
    let abort = ctx.abort_flag as *const u32;

    let mut peer = arch::thread_idx_x();
    while peer < world {
        // SAFETY: peer < world_size; the slot lies inside that peer's pad, which peers only
        // access atomically.
        unsafe {
            let pad = ctx.peer_signal_pad(peer);
            arch::store_release_sys_u32(inbox_slot(pad, block, rank), target);
        }
        peer += stride;
    }

    // The first round's look at the abort word (host memory): issued after the announcement
    // and used after the wait, so that its round trip overlaps the wait instead of delaying
    // the announcement. The value is compared only after the wait.
    let looked = if look && arch::thread_idx_x() == 0 {
        // SAFETY: the abort word is a valid u32 of this rank, accessed atomically.
        unsafe { arch::load_relaxed_sys_u32(abort) }
    } else {
        0
    };

    let mut failed = false;
    let mut peer = arch::thread_idx_x();
    while peer < world && !failed {
        let slot = inbox_slot(own_pad, block, peer);
        // SAFETY: the slot lies inside this rank's pad and the abort word is the context's;
        // both are accessed atomically.
        match unsafe { wait_until_reached(slot, target, abort, ctx.timeout_ns) } {
            WaitOutcome::Reached => {}
            WaitOutcome::TimedOut => {
                // SAFETY: the abort word is a valid u32 of this rank.
                unsafe { raise_timeout(abort as *mut u32, abort_timed_out_waiting_for(peer)) };
                failed = true;
            }
            WaitOutcome::Aborted => failed = true,
        }
        peer += stride;
    }
    let abandoned = arch::sync_threads_or(failed || looked != 0);
    if abandoned {
        // SAFETY: the pad is this rank's.
        unsafe { mark_out_of_step(own_pad) };
    }
    abandoned
}

/// Set the out-of-step mark of the window whose pad (this rank's) is at `own_pad`, from thread
/// 0: the calling block skipped or abandoned a barrier its peers may pass.
///
/// # Safety
/// `own_pad` is this rank's pad of a host-built window.
#[inline(always)]
pub unsafe fn mark_out_of_step(own_pad: u64) {
    if arch::thread_idx_x() == 0 {
        // SAFETY: the mark lies inside the pad and is accessed atomically.
        unsafe { arch::store_release_sys_u32(out_of_step_slot(own_pad), 1) };
    }
}

/// `true` when this rank's abort word is raised.
///
/// # Safety
/// `ctx` must be a context built by the host.
pub unsafe fn is_aborted(ctx: &SymmContext) -> bool {
    // SAFETY: the abort word is a valid u32 in this rank's pad (caller's contract).
    unsafe { arch::load_acquire_sys_u32(ctx.abort_flag as *const u32) != 0 }
}

/// `true`, on every thread of the block alike, when this rank's abort word is raised: one
/// thread reads the word (it may live in host memory: one read per block, not per warp) and
/// the block barrier broadcasts the answer, so the whole block takes the same branch (a block
/// barrier reached by only some threads is undefined behaviour). Every thread of the block
/// must call it.
///
/// # Safety
/// `ctx` must be a context built by the host.
pub unsafe fn block_sees_abort(ctx: &SymmContext) -> bool {
    // SAFETY: forwarded contract.
    let raised = arch::thread_idx_x() == 0 && unsafe { is_aborted(ctx) };
    arch::sync_threads_or(raised)
}
