//! Point-to-point pairing between two ranks (`docs/POINT_TO_POINT.md`): the protocol a send
//! and its receive follow, outside the collectives' call numbers, barrier epochs and LL
//! counters.
//!
//! Every ordered pair (sender `a`, receiver `b`) has its own sequence: the `s`-th send from `a`
//! to `b` (`s` from 1) pairs with the `s`-th receive at `b` from `a`. The receiver pulls:
//!
//! 1. **post** (`a`): wait until slot `s mod SLOTS` of `a`'s ring for `b` is free (`b` finished
//!    send `s − SLOTS`), write the [`Descriptor`] there with plain stores, then release-store
//!    `s` into `posted[a]` of `b`'s pair region;
//! 2. **receive** (`b`): wait (acquire) until `posted[a]` reaches `s`, read the descriptor from
//!    `a`'s ring, copy the bytes it names, then release-store `s` into `done[b]` of `a`'s pair
//!    region;
//! 3. **complete** (`a`): wait (acquire) until `done[b]` reaches `s`: the send buffer is free.
//!
//! Sequences compare in serial-number order ([`reached`]), so they may wrap. Every wait is
//! bounded by the context's timeout and ends early on the abort word; a wait that times out
//! raises this rank's abort word naming the peer it waited for.
//!
//! **Layout.** The pair region starts at the base of each rank's signal pad of the window whose
//! context the functions take (the communicator's point-to-point window: its pad carries
//! nothing else): `SLOTS` descriptors per peer (`outbox[peer][slot]`, 32 bytes each), then
//! `posted[world]` and `done[world]` (`u32`s).
//!
//! The functions run on one thread (thread 0 of the block that owns the task; the kernel
//! broadcasts outcomes with a block barrier).

use crate::arch;
use crate::context::SymmContext;
use crate::sync::abort::{abort_timed_out_waiting_for, raise_timeout};
use crate::sync::wait::{WaitOutcome, reached, wait_until_reached};

/// Descriptor slots per ordered pair: a sender may post this many sends to one peer before the
/// first must complete. Two under loom, so that a model of three sends reuses a slot.
pub const SLOTS: u32 = if cfg!(loom) { 2 } else { 8 };
// `seq % SLOTS` names the same slot on both sides of the u32 wrap only if SLOTS divides 2^32.
const _: () = assert!(SLOTS.is_power_of_two());

/// Bytes of one descriptor slot.
pub const DESCRIPTOR_BYTES: u64 = 32;

/// Where a send's bytes are, as the receiver needs it to pull them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The send's sequence number in its pair (a check: the slot holds this send's entry).
    pub seq: u32,
    /// Index of the sender's window in the communicator's device table of windows (the same
    /// on every rank: registration is collective).
    pub window: u32,
    /// Byte offset of the send buffer in that window.
    pub offset: u64,
    /// Bytes sent.
    pub bytes: u64,
}

/// Bytes of the pair region of a communicator of `world` ranks.
pub const fn pair_region_bytes(world: u32) -> u64 {
    world as u64 * SLOTS as u64 * DESCRIPTOR_BYTES + 2 * 4 * world as u64
}

/// Address of the descriptor slot for `seq` in the ring, held in the pad at `pad`, of the
/// sends to `peer`.
#[inline(always)]
pub fn outbox_slot(pad: u64, peer: u32, seq: u32) -> *mut u64 {
    let slot = (peer as u64 * SLOTS as u64 + (seq % SLOTS) as u64) * DESCRIPTOR_BYTES;
    (pad + slot) as *mut u64
}

/// Address of `posted[from]` in the pad at `pad` of a communicator of `world` ranks: the
/// latest sequence `from` posted to the pad's rank.
#[inline(always)]
pub fn posted_slot(pad: u64, world: u32, from: u32) -> *mut u32 {
    let outboxes = world as u64 * SLOTS as u64 * DESCRIPTOR_BYTES;
    (pad + outboxes + 4 * from as u64) as *mut u32
}

/// Address of `done[to]` in the pad at `pad`: the latest of the pad's rank's sends to `to` that
/// `to` has finished copying.
#[inline(always)]
pub fn done_slot(pad: u64, world: u32, to: u32) -> *mut u32 {
    let outboxes = world as u64 * SLOTS as u64 * DESCRIPTOR_BYTES;
    (pad + outboxes + 4 * world as u64 + 4 * to as u64) as *mut u32
}

/// A wait on a peer that did not end in time (this rank's abort word is raised, naming the
/// peer), or ended on the abort word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLost;

/// Why [`Pairs::receive`] copied nothing and did not tell the sender it is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiveRefused {
    /// The wait for the post ended without it ([`PeerLost`]).
    PeerLost,
    /// The slot holds another send's descriptor (sequence `found`): the pair is out of step.
    /// The caller raises its abort word; nothing was copied.
    OutOfStep {
        /// The sequence the slot held.
        found: u32,
    },
    /// The copy refused the descriptor (a window or size the receiver cannot take).
    Refused,
}

/// The calling rank's end of its pairs, over a window's context.
pub struct Pairs<'a> {
    ctx: &'a SymmContext,
}

impl<'a> Pairs<'a> {
    /// The pairs of the window `ctx` (its pads hold [`pair_region_bytes`] at their base).
    ///
    /// # Safety
    /// `ctx` is host-built, `rank < world_size`, and each pad holds the pair region.
    #[inline(always)]
    pub unsafe fn open(ctx: &'a SymmContext) -> Self {
        Pairs { ctx }
    }

    /// This rank's pad.
    #[inline(always)]
    fn own_pad(&self) -> u64 {
        // SAFETY: rank < world_size (contract of `open`).
        unsafe { self.ctx.peer_signal_pad(self.ctx.rank) }
    }

    /// `peer`'s pad.
    ///
    /// # Safety
    /// `peer < world_size`.
    #[inline(always)]
    unsafe fn pad_of(&self, peer: u32) -> u64 {
        // SAFETY: forwarded contract.
        unsafe { self.ctx.peer_signal_pad(peer) }
    }

    /// Wait, bounded, until the `u32` at `flag` reaches `target`; on a timeout raise this
    /// rank's abort word naming `peer`.
    ///
    /// # Safety
    /// `flag` is a pair-region word other ranks access atomically.
    #[inline(always)]
    unsafe fn wait(&self, flag: *const u32, target: u32, peer: u32) -> Result<(), PeerLost> {
        let abort = self.ctx.abort_flag as *mut u32;
        // SAFETY: forwarded contract; the abort word is this rank's, accessed atomically.
        match unsafe { wait_until_reached(flag, target, abort, self.ctx.timeout_ns) } {
            WaitOutcome::Reached => Ok(()),
            WaitOutcome::TimedOut => {
                // SAFETY: as above.
                unsafe { raise_timeout(abort, abort_timed_out_waiting_for(peer)) };
                Err(PeerLost)
            }
            WaitOutcome::Aborted => Err(PeerLost),
        }
    }

    /// Post send `descriptor.seq` to `to`: wait until its slot is free (`to` finished send
    /// `seq − SLOTS`), write the descriptor, then publish it in `to`'s `posted` word.
    ///
    /// # Safety
    /// `to < world_size`; this rank posts its sends to `to` in sequence order, once each.
    #[inline(always)]
    pub unsafe fn post(&self, to: u32, descriptor: Descriptor) -> Result<(), PeerLost> {
        let world = self.ctx.world_size;
        let own = self.own_pad();
        let seq = descriptor.seq;
        if !arch::mutated!(P2pSkipSlotWait) {
            // SAFETY: the word lies in this rank's pair region; receivers store it atomically.
            unsafe { self.wait(done_slot(own, world, to), seq.wrapping_sub(SLOTS), to)? };
        }
        // SAFETY: `to < world_size` (contract).
        let posted = unsafe { posted_slot(self.pad_of(to), world, self.ctx.rank) };
        if arch::mutated!(P2pPostBeforeDescriptor) {
            // SAFETY: as below.
            unsafe { arch::store_release_sys_u32(posted, seq) };
        }
        let slot = outbox_slot(own, to, seq);
        // SAFETY: the slot lies in this rank's pair region; `to` reads it only after it saw
        // this post (acquire), and the wait above ordered its reads of the slot's previous
        // entry (send `seq − SLOTS`) before these stores.
        unsafe {
            arch::store_plain_u64(slot, seq as u64 | (descriptor.window as u64) << 32);
            arch::store_plain_u64(slot.add(1), descriptor.offset);
            arch::store_plain_u64(slot.add(2), descriptor.bytes);
        }
        if !arch::mutated!(P2pPostBeforeDescriptor) {
            // SAFETY: `posted` lies in `to`'s pair region, accessed atomically; the release
            // orders the descriptor (and the send buffer's contents) before it.
            unsafe { arch::store_release_sys_u32(posted, seq) };
        }
        Ok(())
    }

    /// Receive send `seq` from `from`: wait for its post, read its descriptor, let `copy`
    /// pull the bytes it names, then tell `from` the send is done. `copy` runs only once the
    /// post was seen and the slot holds send `seq`; `from` may reuse its send buffer only after
    /// `copy` returned `Ok`. On any refusal nothing is stored into `from`'s pad.
    ///
    /// # Safety
    /// `from < world_size`; this rank receives from `from` in sequence order, once each.
    #[inline(always)]
    pub unsafe fn receive(
        &self,
        from: u32,
        seq: u32,
        copy: impl FnOnce(Descriptor) -> Result<(), ()>,
    ) -> Result<(), ReceiveRefused> {
        let world = self.ctx.world_size;
        // SAFETY: the word lies in this rank's pair region; `from` stores it atomically.
        unsafe { self.wait(posted_slot(self.own_pad(), world, from), seq, from) }
            .map_err(|PeerLost| ReceiveRefused::PeerLost)?;
        // SAFETY: `from < world_size` (contract).
        let sender = unsafe { self.pad_of(from) };
        let slot = outbox_slot(sender, self.ctx.rank, seq);
        // SAFETY: the slot lies in `from`'s pair region; its stores happened before the post
        // this rank acquired, and `from` rewrites it only after this rank's `done` for `seq`.
        let (head, offset, bytes) = unsafe {
            (
                arch::load_plain_u64(slot),
                arch::load_plain_u64(slot.add(1)),
                arch::load_plain_u64(slot.add(2)),
            )
        };
        let descriptor = Descriptor {
            seq: head as u32,
            window: (head >> 32) as u32,
            offset,
            bytes,
        };
        if descriptor.seq != seq {
            return Err(ReceiveRefused::OutOfStep {
                found: descriptor.seq,
            });
        }
        let done = done_slot(sender, world, self.ctx.rank);
        if arch::mutated!(P2pDoneBeforeCopy) {
            // SAFETY: as below.
            unsafe { arch::store_release_sys_u32(done, seq) };
            return copy(descriptor).map_err(|()| ReceiveRefused::Refused);
        }
        copy(descriptor).map_err(|()| ReceiveRefused::Refused)?;
        // SAFETY: `done[rank]` lies in `from`'s pair region, accessed atomically; the release
        // orders the copy's loads of the send buffer (and of the descriptor) before it.
        unsafe { arch::store_release_sys_u32(done, seq) };
        Ok(())
    }

    /// Wait until `to` finished send `seq`: the send buffer may be reused.
    ///
    /// # Safety
    /// `to < world_size`.
    #[inline(always)]
    pub unsafe fn complete(&self, to: u32, seq: u32) -> Result<(), PeerLost> {
        let done = done_slot(self.own_pad(), self.ctx.world_size, to);
        // SAFETY: the word lies in this rank's pair region; `to` stores it atomically.
        unsafe { self.wait(done, seq, to) }
    }

    /// `true` when `to` has finished send `seq` already (no wait).
    ///
    /// # Safety
    /// `to < world_size`.
    #[inline(always)]
    pub unsafe fn is_complete(&self, to: u32, seq: u32) -> bool {
        let done = done_slot(self.own_pad(), self.ctx.world_size, to);
        // SAFETY: the word lies in this rank's pair region, accessed atomically.
        reached(unsafe { arch::load_acquire_sys_u32(done) }, seq)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        let world = 5;
        let pad = 0x1000;
        let last_slot = outbox_slot(pad, world - 1, SLOTS - 1) as u64 + DESCRIPTOR_BYTES;
        assert_eq!(last_slot, posted_slot(pad, world, 0) as u64);
        assert_eq!(
            posted_slot(pad, world, world - 1) as u64 + 4,
            done_slot(pad, world, 0) as u64
        );
        assert_eq!(
            done_slot(pad, world, world - 1) as u64 + 4,
            pad + pair_region_bytes(world)
        );
        // Sequence s and s + SLOTS share a slot; s and s + 1 do not.
        assert_eq!(outbox_slot(pad, 2, 3), outbox_slot(pad, 2, 3 + SLOTS));
        assert_ne!(outbox_slot(pad, 2, 3), outbox_slot(pad, 2, 4));
    }
}
