//! The per-step flags of the PAT collectives (`symmetric::pat`): a block's round counter and
//! its ready / data flags in the signal pads (layout: [`crate::sync::signal_pad`]).
//!
//! Per block index and step, a receiver posts "ready for round `e`" into its sender's pad and
//! the sender posts "data of round `e`" into the receiver's pad after its stores. Posts are
//! release stores at system scope from thread 0 after a block barrier; waits are bounded
//! acquire spins by thread 0 followed by a block barrier that broadcasts the outcome. The round
//! counter lives in the rank's own pad and is read and written like the barrier epochs; each
//! collective has its own counter, and its flags trail only that one.

use super::abort::{ABORT_TIMED_OUT, raise_timeout};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::signal_pad::{PatCollective, PatFlag, pat_flag_slot, pat_round_slot};
use crate::sync::wait::{WaitOutcome, wait_until_reached};

/// Thread 0's look at its rank's abort word ([`PatRounds::look_at_abort`]), issued and not yet
/// compared; 0 on the other threads.
#[must_use = "a look is compared by the wait that takes it"]
pub struct AbortLook(u32);

/// The flags of one block of one rank for a PAT call: the round counter and the per-step
/// flags. Every thread of the block makes the same calls.
pub struct PatRounds<'a> {
    ctx: &'a SymmContext,
    own_pad: u64,
    collective: PatCollective,
    block: u32,
    /// Rounds this block index made on the window before this call.
    before: u32,
}

impl<'a> PatRounds<'a> {
    /// Rounds this block index made on the window before this call.
    #[inline(always)]
    pub fn before(&self) -> u32 {
        self.before
    }

    /// Address of this rank's signal pad.
    #[inline(always)]
    pub fn own_pad(&self) -> u64 {
        self.own_pad
    }

    /// Open: read the block's round counter of `collective`.
    ///
    /// # Safety
    /// `ctx` is host-built with pads sized by `signal_pad_bytes(world_size)`;
    /// `block < MAX_BLOCKS`.
    #[inline(always)]
    pub unsafe fn open(ctx: &'a SymmContext, collective: PatCollective, block: u32) -> Self {
        // SAFETY: rank < world_size (checked by `resolve_launch`).
        let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
        // SAFETY: the counter lies inside this rank's pad; only this block index of this rank
        // writes it, after every thread has read it (see `finish`).
        let before = unsafe { arch::load_plain_u32(pat_round_slot(own_pad, collective, block)) };
        PatRounds {
            ctx,
            own_pad,
            collective,
            block,
            before,
        }
    }

    /// Store the counter after `rounds` rounds (every thread calls it once, at the end). The
    /// block barriers keep every read of the old value before the store, and the store before
    /// any later read by this block index.
    #[inline(always)]
    pub fn finish(self, rounds: u32) {
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            // SAFETY: the counter lies inside this rank's pad; every thread read it in `open`
            // before the barrier above.
            unsafe {
                arch::store_plain_u32(
                    pat_round_slot(self.own_pad, self.collective, self.block),
                    self.before.wrapping_add(rounds),
                )
            };
        }
        arch::sync_threads();
    }

    /// Set flag `kind` of `step` in `peer`'s pad to `round` (release, system scope), from
    /// thread 0, after a block barrier: everything the block stored before is visible to a
    /// reader that acquires the flag.
    ///
    /// # Safety
    /// `peer < world_size`; `step < PAT_MAX_STEPS`.
    #[inline(always)]
    pub unsafe fn post(&self, peer: u32, kind: PatFlag, step: u32, round: u32) {
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            // SAFETY: peer < world_size (caller); the slot lies in that peer's pad, which is
            // only accessed atomically there.
            unsafe {
                let pad = self.ctx.peer_signal_pad(peer);
                arch::store_release_sys_u32(pat_flag_slot(pad, kind, self.block, step), round);
            }
        }
    }

    /// Issue, from thread 0, a read of this rank's abort word (host memory: a PCIe round trip
    /// on a GPU) without waiting for its value: the wait that takes the look
    /// ([`PatRounds::wait_ready`]) compares it after its own wait, so that the round trip
    /// overlaps that wait. A kernel issues it once per call, after posting its first readiness
    /// flags and before its first wait, which precedes its first store into a peer (see
    /// `symmetric::pat`).
    #[inline(always)]
    pub fn look_at_abort(&self) -> AbortLook {
        AbortLook(if arch::thread_idx_x() == 0 {
            // SAFETY: the abort word is a valid u32 of this rank, accessed atomically.
            unsafe { arch::load_relaxed_sys_u32(self.ctx.abort_flag as *const u32) }
        } else {
            0
        })
    }

    /// [`PatRounds::wait`] for a readiness flag (`GatherReady`, `ScatterReady`): the wait a
    /// sender makes before it stores into its receiver. With `look`, it also gives up (`false`
    /// on every thread) when the look found the abort word raised. (Under loom, the mutation
    /// `PatSkipReadyWait` leaves the wait and the comparison out, to show that the model
    /// checks catch the race.)
    ///
    /// # Safety
    /// As for [`PatRounds::wait`].
    #[inline(always)]
    pub unsafe fn wait_ready(
        &self,
        kind: PatFlag,
        step: u32,
        round: u32,
        look: Option<AbortLook>,
    ) -> bool {
        if arch::mutated!(PatSkipReadyWait) {
            return true;
        }
        let looked = look.map_or(0, |look| look.0);
        // SAFETY: forwarded contract.
        unsafe { self.wait_and_compare(kind, step, round, looked) }
    }

    /// Wait until flag `kind` of `step` in this rank's pad reaches `round` (acquire, bounded);
    /// `true` on every thread when it did, `false` on every thread after a timeout (the abort
    /// word is raised) or an abort. Ends with a block barrier, so the whole block may use what
    /// the flag published.
    ///
    /// # Safety
    /// `step < PAT_MAX_STEPS`.
    #[inline(always)]
    pub unsafe fn wait(&self, kind: PatFlag, step: u32, round: u32) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.wait_and_compare(kind, step, round, 0) }
    }

    /// [`PatRounds::wait`], giving up also when `looked` (thread 0's look at the abort word;
    /// 0 on the other threads) is not 0; the look is compared after the wait.
    ///
    /// # Safety
    /// As for [`PatRounds::wait`].
    #[inline(always)]
    unsafe fn wait_and_compare(&self, kind: PatFlag, step: u32, round: u32, looked: u32) -> bool {
        let mut failed = false;
        if arch::thread_idx_x() == 0 {
            let slot = pat_flag_slot(self.own_pad, kind, self.block, step);
            let abort = self.ctx.abort_flag as *const u32;
            // SAFETY: the slot lies in this rank's pad and the abort word is the context's;
            // both are accessed atomically.
            match unsafe { wait_until_reached(slot, round, abort, self.ctx.timeout_ns) } {
                WaitOutcome::Reached => failed = looked != 0,
                WaitOutcome::TimedOut => {
                    // SAFETY: the abort word is a valid u32 of this rank.
                    unsafe { raise_timeout(abort as *mut u32, ABORT_TIMED_OUT) };
                    failed = true;
                }
                WaitOutcome::Aborted => failed = true,
            }
        }
        !arch::sync_threads_or(failed)
    }
}
