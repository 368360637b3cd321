//! The cross-rank barrier: block `b` of every rank meets block `b` of every other rank.
//!
//! Each rank keeps, in its own signal pad, one epoch counter per block index; it persists across
//! launches, so no reset is needed and CUDA-graph replay works. To pass barrier number `e + 1`,
//! block `b` of rank `r` writes `e + 1` (release, system scope) into slot `[b][r]` of every
//! peer's inbox, then waits (acquire, bounded) until every slot `[b][*]` of its own inbox has
//! reached `e + 1`. Comparisons are wrap-safe. A peer may run ahead by one barrier; since slots
//! only grow, waiting for "at least" is correct.

use crate::arch;
use crate::context::SymmContext;
use crate::sync::signal_pad::{MAX_BLOCKS, MAX_RANKS, abort_slot, epoch_slot, inbox_slot};
use crate::sync::wait::{WaitOutcome, wait_until_reached};

/// The barrier was abandoned: a wait timed out on some thread of this rank, or this rank's abort
/// word was already raised. The abort word is set; the kernel must return.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aborted;

/// Block-level handle on the cross-rank barrier of one block index. Every thread of the block
/// creates it, calls [`CrossRankBarrier::sync`] the same number of times, and calls
/// [`CrossRankBarrier::finish`] once at the end.
pub struct CrossRankBarrier<'a> {
    ctx: &'a SymmContext,
    own_pad: u64,
    block: u32,
    epoch: u32,
}

impl<'a> CrossRankBarrier<'a> {
    /// The largest block count and world size the signal pad has room for.
    pub const LIMITS: (usize, usize) = (MAX_BLOCKS, MAX_RANKS);

    /// Open the barrier of the calling thread's block.
    ///
    /// # Safety
    /// `ctx` must be a context built by the host whose signal-pad tables are valid, with
    /// `world_size <= MAX_RANKS`; the grid must have at most `MAX_BLOCKS` blocks; every thread
    /// of the block must make the same sequence of calls on the barrier.
    pub unsafe fn new(ctx: &'a SymmContext) -> Self {
        let block = arch::block_idx_x();
        // SAFETY: rank < world_size and the table is valid (caller's contract).
        let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
        // SAFETY: block < MAX_BLOCKS, so the slot lies inside the pad; only this block of this
        // rank writes it, and only after every thread has read it (see `finish`).
        let epoch = unsafe { core::ptr::read_volatile(epoch_slot(own_pad, block)) };
        CrossRankBarrier {
            ctx,
            own_pad,
            block,
            epoch,
        }
    }

    /// Wait until block `b` of every rank has reached this point. Everything this block wrote
    /// before the call is visible to every rank's block `b` after it, and vice versa.
    pub fn sync(&mut self) -> Result<(), Aborted> {
        arch::sync_threads();
        let target = self.epoch.wrapping_add(1);
        let stride = arch::block_dim_x();
        let world = self.ctx.world_size;
        let rank = self.ctx.rank;
        let abort = abort_slot(self.own_pad) as *const u32;

        let mut peer = arch::thread_idx_x();
        while peer < world {
            // SAFETY: peer < world_size; the slot lies inside that peer's pad, which peers
            // only access atomically.
            unsafe {
                let pad = self.ctx.peer_signal_pad(peer);
                arch::store_release_sys_u32(inbox_slot(pad, self.block, rank), target);
            }
            peer += stride;
        }

        let mut failed = false;
        let mut peer = arch::thread_idx_x();
        while peer < world && !failed {
            let slot = inbox_slot(self.own_pad, self.block, peer);
            // SAFETY: slot and abort word lie inside this rank's pad, accessed atomically.
            match unsafe { wait_until_reached(slot, target, abort, self.ctx.timeout_ns) } {
                WaitOutcome::Reached => {}
                WaitOutcome::TimedOut => {
                    // SAFETY: the abort word lies inside this rank's pad.
                    unsafe { arch::store_release_sys_u32(abort as *mut u32, 1) };
                    failed = true;
                }
                WaitOutcome::Aborted => failed = true,
            }
            peer += stride;
        }
        self.epoch = target;
        if arch::sync_threads_or(failed) {
            Err(Aborted)
        } else {
            Ok(())
        }
    }

    /// Store the epoch for the next launch. Call once, on every thread, after the last `sync`.
    pub fn finish(self) {
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            // SAFETY: the slot lies inside this rank's pad; every thread of the block read it in
            // `new` before the barrier above.
            unsafe { core::ptr::write_volatile(epoch_slot(self.own_pad, self.block), self.epoch) };
        }
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
