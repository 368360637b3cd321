//! Point-to-point pairing between two ranks (`docs/POINT_TO_POINT.md`): the protocol a send
//! and its receive follow, outside the collectives' call numbers, barrier epochs and LL
//! counters.
//!
//! Every ordered pair (sender `a`, receiver `b`) has [`CHANNELS`] channels, each with its own
//! sequence: the `s`-th send from `a` to `b` on a channel (`s` from 1) pairs with the `s`-th
//! receive at `b` from `a` on that channel. A message uses channels `0..channels_for(bytes)`,
//! each carrying one part of it. The receiver pulls:
//!
//! 1. **post** (`a`): wait until slot `s mod SLOTS` of `a`'s ring for (`b`, channel) is free
//!    (`b` finished send `s − SLOTS`), write the [`Descriptor`] there with plain stores, then
//!    release-store `s` into `posted[a][channel]` of `b`'s pair region;
//! 2. **receive** (`b`): wait (acquire) until `posted[a][channel]` reaches `s`, read the
//!    descriptor from `a`'s ring, copy the bytes it names, then release-store `s` into
//!    `done[b][channel]` of `a`'s pair region;
//! 3. **complete** (`a`): wait (acquire) until `done[b][channel]` reaches `s`: the send buffer
//!    is free.
//!
//! **Rings.** A send whose buffer lies outside every window travels through a ring in the
//! sender's staging window instead: its descriptor names the ring (and the size of a piece,
//! [`Descriptor::piece`]), and each channel's part goes in pieces through [`RING_SLOTS`]
//! slots. The sender copies piece `k` into slot `k mod RING_SLOTS` once the receiver drained
//! piece `k − RING_SLOTS` (`drained[b][channel]` of `a`'s region, acquire), then release-stores
//! its count of pieces into `filled[a][channel]` of `b`'s region; the receiver copies a piece
//! out once `filled` counts it, then release-stores its count into `drained`. Both counts run
//! over every ring of the channel in order (`fills`, `drains`: each rank's own copies), so a
//! message of any size passes through a ring of fixed size; the receiver says `done` after the
//! last piece. A part of `n` bytes takes `max(1, ceil(n / piece))` pieces (an empty part one
//! empty piece), every piece full but the last ([`piece_range`]).
//!
//! Sequences compare in serial-number order ([`crate::sync::wait::reached`]), so they may wrap. Every wait is
//! bounded by the context's timeout and ends early on the abort word; a wait that times out
//! raises this rank's abort word naming the peer it waited for.
//!
//! **Layout.** The pair region is the whole of each rank's buffer in the communicator's
//! point-to-point window (the context's `peer_bases`; the window carries nothing else):
//! `outbox[peer][channel][slot]` (32-byte descriptors), then `posted[peer][channel]`,
//! `done[peer][channel]`, `sent[peer][channel]`, `received[peer][channel]`, the two counts as
//! the running launch found them, `filled[peer][channel]`, `drained[peer][channel]`, and the
//! ring counts `fills`, `drains`, `fill_progress`, `drain_progress` (`u32`s: all but `posted`,
//! `done`, `filled` and `drained` are this rank's own, read and written by its kernels only,
//! so that a replayed CUDA graph takes new sequence numbers), then the window table
//! ([`WindowTable`]).
//!
//! The functions run on one thread (thread 0 of the block that owns the channel; the kernel
//! broadcasts outcomes with a block barrier).

use crate::arch;
use crate::context::SymmContext;
use crate::sync::abort::{abort_timed_out_waiting_for, raise_timeout};
use crate::sync::wait::{WaitOutcome, wait_until_reached};

/// Descriptor slots per ordered pair and channel: a sender may post this many sends to one
/// peer on one channel before the first must complete. Two under loom, so that a model of
/// three sends reuses a slot.
pub const SLOTS: u32 = if cfg!(loom) { 2 } else { 8 };
// `seq % SLOTS` names the same slot on both sides of the u32 wrap only if SLOTS divides 2^32.
const _: () = assert!(SLOTS.is_power_of_two());

/// Channels per ordered pair: a message of many bytes is cut into this many parts, each
/// copied by its own block. One under loom (the channels are independent instances of one
/// protocol).
pub const CHANNELS: u32 = if cfg!(loom) { 1 } else { 4 };

/// Bytes per channel below which a message uses fewer channels: a message of `n` bytes uses
/// `ceil(n / CHANNEL_MIN_BYTES)` channels, at least one and at most [`CHANNELS`].
pub const CHANNEL_MIN_BYTES: u64 = 64 * 1024;

/// Bytes of one descriptor slot.
pub const DESCRIPTOR_BYTES: u64 = 32;

/// Entries of the window table: the windows of a rank that a peer's send may name. A window
/// registered while the table is full cannot be a send buffer's window (the host refuses such
/// a send).
pub const WINDOW_TABLE_ENTRIES: u32 = 1024;

/// The channels a message of `bytes` bytes uses (both sides compute it from their own count;
/// channel 0 always, so that a mismatch of counts is seen there).
#[inline(always)]
pub const fn channels_for(bytes: u64) -> u32 {
    let wanted = bytes.div_ceil(CHANNEL_MIN_BYTES);
    if wanted == 0 {
        1
    } else if wanted > CHANNELS as u64 {
        CHANNELS
    } else {
        wanted as u32
    }
}

/// The bytes `[lo, hi)` of a message of `bytes` bytes that `channel` carries: the message in
/// [`channels_for`] parts, each a multiple of 16 bytes but the last.
#[inline(always)]
pub const fn channel_part(bytes: u64, channel: u32) -> (u64, u64) {
    let channels = channels_for(bytes) as u64;
    let part = bytes.div_ceil(channels).next_multiple_of(16);
    let lo = channel as u64 * part;
    let hi = lo + part;
    (
        if lo < bytes { lo } else { bytes },
        if hi < bytes { hi } else { bytes },
    )
}

/// Slots of a ring per channel: a sender fills at most this many pieces ahead of its
/// receiver.
pub const RING_SLOTS: u64 = 2;

/// A ring's piece is a multiple of this many bytes (the descriptor carries it in these units).
pub const PIECE_UNIT: u64 = 256;

/// The largest piece a descriptor can carry.
pub const MAX_PIECE: u64 = ((1 << 24) - 1) * PIECE_UNIT;

/// Bytes of the ring of a message of `bytes` bytes in pieces of `piece` bytes: [`RING_SLOTS`]
/// pieces for each of its channels.
#[inline(always)]
pub const fn ring_bytes(bytes: u64, piece: u64) -> u64 {
    channels_for(bytes) as u64 * RING_SLOTS * piece
}

/// Offset in a ring of pieces of `piece` bytes of the slot that `channel`'s piece number
/// `count` (counted over the channel's rings, from 0) goes through.
#[inline(always)]
pub const fn ring_slot(piece: u64, channel: u32, count: u32) -> u64 {
    (channel as u64 * RING_SLOTS + count as u64 % RING_SLOTS) * piece
}

/// The bytes `[from, to)` of piece number `moved` (from 0) of the part `[lo, hi)` of a message
/// in pieces of `piece` bytes (every piece full but the last), and whether it is the last.
#[inline(always)]
pub const fn piece_range(lo: u64, hi: u64, piece: u64, moved: u32) -> (u64, u64, bool) {
    let from = lo.saturating_add((moved as u64).saturating_mul(piece));
    let from = if from < hi { from } else { hi };
    let end = from.saturating_add(piece);
    let to = if end < hi { end } else { hi };
    (from, to, to == hi)
}

/// Where a send's bytes are, as the receiver needs it to pull them, and what it must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The send's sequence number on its channel (a check: the slot holds this send's entry).
    pub seq: u32,
    /// The send's data type (the C ABI's value; the receiver's must be the same).
    pub datatype: u32,
    /// Registration number of the sender's window (the same on every rank: registration is
    /// collective); the receiver finds its own context of it in its [`WindowTable`].
    pub window: u64,
    /// Byte offset of the send buffer in that window.
    pub offset: u64,
    /// Bytes of the whole message.
    pub bytes: u64,
    /// 0: the bytes lie at `offset`, whole. Else the message comes through a ring at `offset`
    /// ([`ring_bytes`]) in pieces of this many bytes (a multiple of [`PIECE_UNIT`], at most
    /// [`MAX_PIECE`]).
    pub piece: u64,
}

impl Descriptor {
    /// The descriptor's first word: sequence, data type (8 bits) and piece (in units).
    const fn head(&self) -> u64 {
        self.seq as u64 | ((self.datatype & 0xFF) as u64) << 32 | (self.piece / PIECE_UNIT) << 40
    }

    /// Bytes of the sender's window that the descriptor names from `offset`.
    #[inline(always)]
    pub const fn extent(&self) -> u64 {
        if self.piece == 0 {
            self.bytes
        } else {
            ring_bytes(self.bytes, self.piece)
        }
    }
}

/// Byte offsets of the parts of a pair region of a communicator of `world` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionLayout {
    world: u64,
}

impl RegionLayout {
    /// The layout for `world` ranks.
    #[inline(always)]
    pub const fn new(world: u32) -> Self {
        RegionLayout {
            world: world as u64,
        }
    }

    const fn channels(&self) -> u64 {
        self.world * CHANNELS as u64
    }

    /// Offset of the descriptor slot of `seq` in the ring of the sends to `peer` on `channel`.
    #[inline(always)]
    pub const fn outbox(&self, peer: u32, channel: u32, seq: u32) -> u64 {
        ((peer as u64 * CHANNELS as u64 + channel as u64) * SLOTS as u64 + (seq % SLOTS) as u64)
            * DESCRIPTOR_BYTES
    }

    const fn words(&self) -> u64 {
        self.channels() * SLOTS as u64 * DESCRIPTOR_BYTES
    }

    const fn word(&self, array: u64, peer: u32, channel: u32) -> u64 {
        self.words()
            + 4 * (array * self.channels() + peer as u64 * CHANNELS as u64 + channel as u64)
    }

    /// Offset of `posted[from][channel]`: the latest sequence `from` posted to the region's rank.
    #[inline(always)]
    pub const fn posted(&self, from: u32, channel: u32) -> u64 {
        self.word(0, from, channel)
    }

    /// Offset of `done[to][channel]`: the latest of the region's rank's sends to `to` that
    /// `to` has finished copying.
    #[inline(always)]
    pub const fn done(&self, to: u32, channel: u32) -> u64 {
        self.word(1, to, channel)
    }

    /// Offset of `sent[to][channel]`: the region's rank's count of its sends to `to`.
    #[inline(always)]
    pub const fn sent(&self, to: u32, channel: u32) -> u64 {
        self.word(2, to, channel)
    }

    /// Offset of `received[from][channel]`: the region's rank's count of its receives from
    /// `from`.
    #[inline(always)]
    pub const fn received(&self, from: u32, channel: u32) -> u64 {
        self.word(3, from, channel)
    }

    /// Offset of `sent_base[to][channel]`: `sent[to][channel]` when the running launch began
    /// (written by the block that owns the channel, before its first post).
    #[inline(always)]
    pub const fn sent_base(&self, to: u32, channel: u32) -> u64 {
        self.word(4, to, channel)
    }

    /// Offset of `received_base[from][channel]`: `received[from][channel]` when the running
    /// launch began.
    #[inline(always)]
    pub const fn received_base(&self, from: u32, channel: u32) -> u64 {
        self.word(5, from, channel)
    }

    /// Offset of `filled[from][channel]`: the pieces `from` has filled into its rings for the
    /// region's rank on `channel` (counted over every ring).
    #[inline(always)]
    pub const fn filled(&self, from: u32, channel: u32) -> u64 {
        self.word(6, from, channel)
    }

    /// Offset of `drained[to][channel]`: the pieces of the region's rank's rings that `to`
    /// has copied out on `channel`.
    #[inline(always)]
    pub const fn drained(&self, to: u32, channel: u32) -> u64 {
        self.word(7, to, channel)
    }

    /// Offset of `fills[to][channel]`: the region's rank's count of the pieces it filled for
    /// `to` (its own copy of `to`'s `filled` word).
    #[inline(always)]
    pub const fn fills(&self, to: u32, channel: u32) -> u64 {
        self.word(8, to, channel)
    }

    /// Offset of `drains[from][channel]`: the region's rank's count of the pieces it copied
    /// out of `from`'s rings.
    #[inline(always)]
    pub const fn drains(&self, from: u32, channel: u32) -> u64 {
        self.word(9, from, channel)
    }

    /// Offset of `fill_progress[to][channel]`: 0 when no ring send to `to` on `channel` is
    /// being filled, else 1 + the pieces of it filled so far.
    #[inline(always)]
    pub const fn fill_progress(&self, to: u32, channel: u32) -> u64 {
        self.word(10, to, channel)
    }

    /// Offset of `drain_progress[from][channel]`: 0 when no ring receive from `from` on
    /// `channel` is being drained, else 1 + the pieces of it copied out so far.
    #[inline(always)]
    pub const fn drain_progress(&self, from: u32, channel: u32) -> u64 {
        self.word(11, from, channel)
    }

    /// Offset of `ring_source[from][channel]` (a `u64`, own): where this rank reads the ring
    /// of the receive from `from` being drained on `channel` (the sender's ring, as this rank
    /// maps it, found when the receive began).
    #[inline(always)]
    pub const fn ring_source(&self, from: u32, channel: u32) -> u64 {
        self.word(12, 0, 0).next_multiple_of(8)
            + 8 * (from as u64 * CHANNELS as u64 + channel as u64)
    }

    /// Offset of `ring_piece[from][channel]` (a `u64`, own): the piece of that ring.
    #[inline(always)]
    pub const fn ring_piece(&self, from: u32, channel: u32) -> u64 {
        self.ring_source(0, 0)
            + 8 * (self.channels() + from as u64 * CHANNELS as u64 + channel as u64)
    }

    /// Offset of the window table (16-byte aligned).
    #[inline(always)]
    pub const fn window_table(&self) -> u64 {
        (self.ring_source(0, 0) + 16 * self.channels()).next_multiple_of(16)
    }

    /// Bytes of the whole region, window table included.
    #[inline(always)]
    pub const fn bytes(&self) -> u64 {
        self.window_table() + WindowTable::BYTES
    }
}

/// Bytes of the pair region (window table included) of a communicator of `world` ranks.
pub const fn pair_region_bytes(world: u32) -> u64 {
    RegionLayout::new(world).bytes()
}

/// A rank's table of its windows that peers' sends may name: [`WINDOW_TABLE_ENTRIES`] entries
/// of two `u64`s, `(registration number + 1, address of this rank's context of the window)`,
/// `(0, 0)` when free. The host writes an entry when a window's registration completes and
/// clears it before the window's context is freed (after every point-to-point launch of the
/// rank ended); an entry is used only when both words are set.
pub struct WindowTable;

impl WindowTable {
    /// Bytes of a table.
    pub const BYTES: u64 = WINDOW_TABLE_ENTRIES as u64 * 16;

    /// Offset in the table of entry `index`.
    pub const fn entry(index: u32) -> u64 {
        index as u64 * 16
    }

    /// The context of window `window` in the table at `table`, or `None` when no entry holds
    /// it.
    ///
    /// # Safety
    /// `table` is the address of a window table the host maintains.
    #[inline(always)]
    pub unsafe fn find<'t>(table: u64, window: u64) -> Option<&'t SymmContext> {
        let tag = window.wrapping_add(1);
        let mut index = 0;
        while index < WINDOW_TABLE_ENTRIES {
            let entry = (table + Self::entry(index)) as *const u64;
            // SAFETY: the entry lies in the table (contract); the host writes it only while
            // no launch of this rank may read it, or while the entry is not yet used.
            let (seq, context) = unsafe {
                (
                    arch::load_plain_u64(entry),
                    arch::load_plain_u64(entry.add(1)),
                )
            };
            if seq == tag && context != 0 {
                // SAFETY: a set entry holds the address of a live host-built context.
                return Some(unsafe { &*(context as *const SymmContext) });
            }
            index += 1;
        }
        None
    }
}

/// A wait on a peer that did not end in time (this rank's abort word is raised, naming the
/// peer), or ended on the abort word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLost;

/// Why a receive copied nothing and did not tell the sender it is done.
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
    /// The copy refused the descriptor (a window, size or data type the receiver cannot take).
    Refused,
}

/// The calling rank's end of its pairs, over the point-to-point window's context.
pub struct Pairs<'a> {
    ctx: &'a SymmContext,
    layout: RegionLayout,
}

impl<'a> Pairs<'a> {
    /// The pairs of the window `ctx` (each rank's buffer in it holds [`pair_region_bytes`]).
    ///
    /// # Safety
    /// `ctx` is host-built, `rank < world_size`, and each rank's buffer holds the pair region.
    #[inline(always)]
    pub unsafe fn open(ctx: &'a SymmContext) -> Self {
        Pairs {
            ctx,
            layout: RegionLayout::new(ctx.world_size),
        }
    }

    /// This rank.
    #[inline(always)]
    pub fn rank(&self) -> u32 {
        self.ctx.rank
    }

    /// Ranks of the communicator.
    #[inline(always)]
    pub fn world(&self) -> u32 {
        self.ctx.world_size
    }

    /// This rank's region.
    #[inline(always)]
    fn own(&self) -> u64 {
        // SAFETY: rank < world_size (contract of `open`).
        unsafe { self.ctx.peer_base(self.ctx.rank) }
    }

    /// `peer`'s region.
    ///
    /// # Safety
    /// `peer < world_size`.
    #[inline(always)]
    unsafe fn region_of(&self, peer: u32) -> u64 {
        // SAFETY: forwarded contract.
        unsafe { self.ctx.peer_base(peer) }
    }

    /// Address of this rank's window table.
    #[inline(always)]
    pub fn window_table(&self) -> u64 {
        self.own() + self.layout.window_table()
    }

    /// This rank's count of its sends to `to` on `channel` (its kernels only).
    ///
    /// # Safety
    /// `to < world_size`, `channel < CHANNELS`; no other block of this rank's launch uses the
    /// channel.
    #[inline(always)]
    pub unsafe fn sent(&self, to: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.sent(to, channel)) as *mut u32
    }

    /// This rank's count of its receives from `from` on `channel` (its kernels only).
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn received(&self, from: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.received(from, channel)) as *mut u32
    }

    /// Where the running launch keeps `sent[to][channel]` as it found it (its kernels only).
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn sent_base(&self, to: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.sent_base(to, channel)) as *mut u32
    }

    /// Where the running launch keeps `received[from][channel]` as it found it.
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn received_base(&self, from: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.received_base(from, channel)) as *mut u32
    }

    /// This rank's count of the pieces it filled into its rings for `to` on `channel` (its
    /// kernels only).
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn fills(&self, to: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.fills(to, channel)) as *mut u32
    }

    /// This rank's count of the pieces it copied out of `from`'s rings on `channel`.
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn drains(&self, from: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.drains(from, channel)) as *mut u32
    }

    /// 0 when no ring send of this rank to `to` on `channel` is being filled, else 1 + the
    /// pieces of it filled so far.
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn fill_progress(&self, to: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.fill_progress(to, channel)) as *mut u32
    }

    /// Where this rank reads the ring of its receive from `from` on `channel` being drained,
    /// and that ring's piece (its kernels only).
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn ring_of(&self, from: u32, channel: u32) -> (*mut u64, *mut u64) {
        (
            (self.own() + self.layout.ring_source(from, channel)) as *mut u64,
            (self.own() + self.layout.ring_piece(from, channel)) as *mut u64,
        )
    }

    /// 0 when no ring receive from `from` on `channel` is being drained, else 1 + the pieces of
    /// it copied out so far.
    ///
    /// # Safety
    /// As for [`Pairs::sent`].
    #[inline(always)]
    pub unsafe fn drain_progress(&self, from: u32, channel: u32) -> *mut u32 {
        (self.own() + self.layout.drain_progress(from, channel)) as *mut u32
    }

    /// `true` when the slot of the next piece for `to` on `channel` is free: `to` copied out
    /// piece `filled − RING_SLOTS + 1` (counting from 1), `filled` being this rank's count of
    /// pieces it filled so far. Acquire: `to`'s loads of the slot's previous piece are ordered
    /// before the caller's stores of the next.
    ///
    /// # Safety
    /// `to < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn ring_slot_free(&self, to: u32, channel: u32, filled: u32) -> bool {
        if arch::mutated!(P2pRingSkipDrainWait) {
            return true;
        }
        let drained = (self.own() + self.layout.drained(to, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; `to` stores it atomically.
        let drained = unsafe { arch::load_acquire_sys_u32(drained) };
        crate::sync::wait::reached(drained, filled.wrapping_sub(RING_SLOTS as u32 - 1))
    }

    /// Tell `to` that this rank has filled `filled` pieces for it on `channel` (release: the
    /// pieces' bytes are ordered before). Called after every store of the piece of this
    /// rank's threads, past a block barrier.
    ///
    /// # Safety
    /// `to < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn publish_fill(&self, to: u32, channel: u32, filled: u32) {
        // SAFETY: `to < world_size` (contract).
        let word = (unsafe { self.region_of(to) } + self.layout.filled(self.ctx.rank, channel))
            as *mut u32;
        // SAFETY: `filled[rank][channel]` lies in `to`'s pair region, accessed atomically.
        unsafe { arch::store_release_sys_u32(word, filled) };
    }

    /// Tell `peer` this rank's count of ring pieces on `channel`: as [`Pairs::publish_fill`]
    /// when `send`, else as [`Pairs::publish_drain`]. The word is picked without a branch, so
    /// that the block barrier after a thread-0 section calling it keeps one instruction.
    ///
    /// # Safety
    /// `peer < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn publish_ring_count(&self, peer: u32, channel: u32, send: bool, count: u32) {
        let offset = if send {
            self.layout.filled(self.ctx.rank, channel)
        } else {
            self.layout.drained(self.ctx.rank, channel)
        };
        // SAFETY: `peer < world_size` (contract).
        let word = (unsafe { self.region_of(peer) } + offset) as *mut u32;
        // SAFETY: `filled[rank][channel]` or `drained[rank][channel]` lies in `peer`'s pair
        // region, accessed atomically.
        unsafe { arch::store_release_sys_u32(word, count) };
    }

    /// `true` when `from` has filled the piece after the `drained` this rank copied out on
    /// `channel`. Acquire: the piece's bytes are visible to the calling thread after it.
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn piece_ready(&self, from: u32, channel: u32, drained: u32) -> bool {
        let filled = (self.own() + self.layout.filled(from, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; `from` stores it atomically.
        let filled = unsafe { arch::load_acquire_sys_u32(filled) };
        crate::sync::wait::reached(filled, drained.wrapping_add(1))
    }

    /// Tell `from` that this rank has copied out `drained` pieces of its rings on `channel`
    /// (release: the copies' loads are ordered before). Called after every load of the piece
    /// of this rank's threads, past a block barrier.
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn publish_drain(&self, from: u32, channel: u32, drained: u32) {
        // SAFETY: `from < world_size` (contract).
        let word = (unsafe { self.region_of(from) } + self.layout.drained(self.ctx.rank, channel))
            as *mut u32;
        // SAFETY: `drained[rank][channel]` lies in `from`'s pair region, accessed atomically.
        unsafe { arch::store_release_sys_u32(word, drained) };
    }

    /// Fill this rank's next piece for `to` on `channel` on one thread: wait, bounded, until
    /// its slot is free, let `write` store it (given the slot's number, `0..RING_SLOTS`), then
    /// publish it. Returns the new count.
    ///
    /// # Safety
    /// `to < world_size`, `channel < CHANNELS`; this rank's only filler of the channel.
    #[inline(always)]
    pub unsafe fn fill_piece(
        &self,
        to: u32,
        channel: u32,
        write: impl FnOnce(u64),
    ) -> Result<u32, PeerLost> {
        // SAFETY: forwarded contract; this rank's own word.
        let fills = unsafe { self.fills(to, channel) };
        // SAFETY: as above.
        let filled = unsafe { arch::load_plain_u32(fills) };
        if !arch::mutated!(P2pRingSkipDrainWait) {
            let drained = (self.own() + self.layout.drained(to, channel)) as *const u32;
            // SAFETY: the word lies in this rank's pair region; `to` stores it atomically.
            unsafe { self.wait(drained, filled.wrapping_sub(RING_SLOTS as u32 - 1), to)? };
        }
        write(filled as u64 % RING_SLOTS);
        let filled = filled.wrapping_add(1);
        // SAFETY: forwarded contract; the piece is written.
        unsafe {
            arch::store_plain_u32(fills, filled);
            self.publish_fill(to, channel, filled);
        }
        Ok(filled)
    }

    /// Copy out `from`'s next piece on `channel` on one thread: wait, bounded, until it is
    /// filled, let `read` load it (given its slot's number), then tell `from`. Returns the
    /// new count.
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`; this rank's only drainer of the channel.
    #[inline(always)]
    pub unsafe fn drain_piece(
        &self,
        from: u32,
        channel: u32,
        read: impl FnOnce(u64),
    ) -> Result<u32, PeerLost> {
        // SAFETY: forwarded contract; this rank's own word.
        let drains = unsafe { self.drains(from, channel) };
        // SAFETY: as above.
        let drained = unsafe { arch::load_plain_u32(drains) };
        let filled = (self.own() + self.layout.filled(from, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; `from` stores it atomically.
        unsafe { self.wait(filled, drained.wrapping_add(1), from)? };
        let next = drained.wrapping_add(1);
        if arch::mutated!(P2pRingDrainBeforeCopy) {
            // SAFETY: forwarded contract.
            unsafe { self.publish_drain(from, channel, next) };
        }
        read(drained as u64 % RING_SLOTS);
        // SAFETY: forwarded contract; the piece is read.
        unsafe {
            arch::store_plain_u32(drains, next);
            if !arch::mutated!(P2pRingDrainBeforeCopy) {
                self.publish_drain(from, channel, next);
            }
        }
        Ok(next)
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

    /// Post send `descriptor.seq` to `to` on `channel`: wait until its slot is free (`to`
    /// finished send `seq − SLOTS`), write the descriptor, then publish it in `to`'s `posted`
    /// word.
    ///
    /// # Safety
    /// `to < world_size`, `channel < CHANNELS`; this rank posts its sends to `to` on `channel`
    /// in sequence order, once each.
    #[inline(always)]
    pub unsafe fn post(
        &self,
        to: u32,
        channel: u32,
        descriptor: Descriptor,
    ) -> Result<(), PeerLost> {
        let own = self.own();
        let seq = descriptor.seq;
        if !arch::mutated!(P2pSkipSlotWait) {
            let done = (own + self.layout.done(to, channel)) as *const u32;
            // SAFETY: the word lies in this rank's pair region; receivers store it atomically.
            unsafe { self.wait(done, seq.wrapping_sub(SLOTS), to)? };
        }
        // SAFETY: `to < world_size` (contract).
        let posted = (unsafe { self.region_of(to) } + self.layout.posted(self.ctx.rank, channel))
            as *mut u32;
        if arch::mutated!(P2pPostBeforeDescriptor) {
            // SAFETY: as below.
            unsafe { arch::store_release_sys_u32(posted, seq) };
        }
        let slot = (own + self.layout.outbox(to, channel, seq)) as *mut u64;
        // SAFETY: the slot lies in this rank's pair region; `to` reads it only after it saw
        // this post (acquire), and the wait above ordered its reads of the slot's previous
        // entry (send `seq − SLOTS`) before these stores.
        unsafe {
            arch::store_plain_u64(slot, descriptor.head());
            arch::store_plain_u64(slot.add(1), descriptor.window);
            arch::store_plain_u64(slot.add(2), descriptor.offset);
            arch::store_plain_u64(slot.add(3), descriptor.bytes);
        }
        if !arch::mutated!(P2pPostBeforeDescriptor) {
            // SAFETY: `posted` lies in `to`'s pair region, accessed atomically; the release
            // orders the descriptor (and the send buffer's contents) before it.
            unsafe { arch::store_release_sys_u32(posted, seq) };
        }
        Ok(())
    }

    /// Post send `descriptor.seq` to `to` on `channel` if its slot is free (`to` finished send
    /// `seq − SLOTS`): [`Pairs::post`] without waiting. `false`: nothing was written.
    ///
    /// # Safety
    /// As for [`Pairs::post`].
    #[inline(always)]
    pub unsafe fn try_post(&self, to: u32, channel: u32, descriptor: Descriptor) -> bool {
        let done = (self.own() + self.layout.done(to, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; receivers store it atomically.
        let free = crate::sync::wait::reached(
            unsafe { arch::load_acquire_sys_u32(done) },
            descriptor.seq.wrapping_sub(SLOTS),
        );
        // SAFETY: forwarded contract; the slot is free, so `post` does not wait.
        free && unsafe { self.post(to, channel, descriptor) }.is_ok()
    }

    /// `true` once `from` has posted send `seq` on `channel` (acquire: the descriptor and the
    /// send's bytes are visible to the calling thread after it).
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn is_posted(&self, from: u32, channel: u32, seq: u32) -> bool {
        let posted = (self.own() + self.layout.posted(from, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; `from` stores it atomically.
        crate::sync::wait::reached(unsafe { arch::load_acquire_sys_u32(posted) }, seq)
    }

    /// This rank's abort word is raised.
    #[inline(always)]
    pub fn aborted(&self) -> bool {
        // SAFETY: the context's abort word, accessed atomically.
        unsafe { arch::load_acquire_sys_u32(self.ctx.abort_flag as *const u32) != 0 }
    }

    /// Raise this rank's abort word for a wait on `peer` that made no progress within the
    /// timeout (unless it is raised already).
    #[inline(always)]
    pub fn raise_timeout_for(&self, peer: u32) {
        // SAFETY: the context's abort word, accessed atomically.
        unsafe {
            raise_timeout(
                self.ctx.abort_flag as *mut u32,
                abort_timed_out_waiting_for(peer),
            )
        };
    }

    /// The wait bound of the context, in nanoseconds.
    #[inline(always)]
    pub fn timeout_ns(&self) -> u64 {
        self.ctx.timeout_ns
    }

    /// Wait for send `seq` from `from` on `channel` to be posted and return its descriptor
    /// (the slot holds send `seq`, or the pair is out of step). Nothing is stored.
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`; this rank receives from `from` on `channel`
    /// in sequence order, once each.
    #[inline(always)]
    pub unsafe fn await_post(
        &self,
        from: u32,
        channel: u32,
        seq: u32,
    ) -> Result<Descriptor, ReceiveRefused> {
        let posted = (self.own() + self.layout.posted(from, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; `from` stores it atomically.
        unsafe { self.wait(posted, seq, from) }.map_err(|PeerLost| ReceiveRefused::PeerLost)?;
        // SAFETY: forwarded contract; the post was acquired.
        let descriptor = unsafe { self.read_descriptor(from, channel, seq) };
        if descriptor.seq != seq {
            return Err(ReceiveRefused::OutOfStep {
                found: descriptor.seq,
            });
        }
        Ok(descriptor)
    }

    /// The descriptor in the slot of send `seq` from `from` on `channel`, read without waiting.
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`; the calling thread saw the post of `seq`
    /// (acquire), itself or through a block barrier after the thread that did.
    #[inline(always)]
    pub unsafe fn read_descriptor(&self, from: u32, channel: u32, seq: u32) -> Descriptor {
        // SAFETY: `from < world_size` (contract).
        let sender = unsafe { self.region_of(from) };
        let slot = (sender + self.layout.outbox(self.ctx.rank, channel, seq)) as *const u64;
        // SAFETY: the slot lies in `from`'s pair region; its stores happened before the post
        // this thread saw, and `from` rewrites it only after this rank's `done` for `seq`.
        let (head, window, offset, bytes) = unsafe {
            (
                arch::load_plain_u64(slot),
                arch::load_plain_u64(slot.add(1)),
                arch::load_plain_u64(slot.add(2)),
                arch::load_plain_u64(slot.add(3)),
            )
        };
        Descriptor {
            seq: head as u32,
            datatype: ((head >> 32) & 0xFF) as u32,
            window,
            offset,
            bytes,
            piece: (head >> 40) * PIECE_UNIT,
        }
    }

    /// Tell `from` that this rank finished copying its send `seq` on `channel`: the sender may
    /// reuse its buffer and the slot. Called after every load of the send's bytes (and of its
    /// descriptor) of this rank's threads, past a block barrier.
    ///
    /// # Safety
    /// `from < world_size`, `channel < CHANNELS`; send `seq` was awaited.
    #[inline(always)]
    pub unsafe fn mark_done(&self, from: u32, channel: u32, seq: u32) {
        // SAFETY: `from < world_size` (contract).
        let done = (unsafe { self.region_of(from) } + self.layout.done(self.ctx.rank, channel))
            as *mut u32;
        // SAFETY: `done[rank][channel]` lies in `from`'s pair region, accessed atomically; the
        // release orders the copy's loads of the send buffer (and of the descriptor) before it.
        unsafe { arch::store_release_sys_u32(done, seq) };
    }

    /// Receive send `seq` from `from` on `channel` on one thread: [`Pairs::await_post`], let
    /// `copy` pull the bytes the descriptor names, then [`Pairs::mark_done`]. `from` may reuse
    /// its send buffer only after `copy` returned `Ok`. On any refusal nothing is stored into
    /// `from`'s region.
    ///
    /// # Safety
    /// As for [`Pairs::await_post`].
    #[inline(always)]
    pub unsafe fn receive(
        &self,
        from: u32,
        channel: u32,
        seq: u32,
        copy: impl FnOnce(Descriptor) -> Result<(), ()>,
    ) -> Result<(), ReceiveRefused> {
        // SAFETY: forwarded contract.
        let descriptor = unsafe { self.await_post(from, channel, seq) }?;
        if arch::mutated!(P2pDoneBeforeCopy) {
            // SAFETY: forwarded contract.
            unsafe { self.mark_done(from, channel, seq) };
            return copy(descriptor).map_err(|()| ReceiveRefused::Refused);
        }
        copy(descriptor).map_err(|()| ReceiveRefused::Refused)?;
        // SAFETY: forwarded contract; the copy is done.
        unsafe { self.mark_done(from, channel, seq) };
        Ok(())
    }

    /// Wait until `to` finished send `seq` on `channel`: the send buffer may be reused.
    ///
    /// # Safety
    /// `to < world_size`, `channel < CHANNELS`.
    #[inline(always)]
    pub unsafe fn complete(&self, to: u32, channel: u32, seq: u32) -> Result<(), PeerLost> {
        let done = (self.own() + self.layout.done(to, channel)) as *const u32;
        // SAFETY: the word lies in this rank's pair region; `to` stores it atomically.
        unsafe { self.wait(done, seq, to) }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap() {
        let world = 5;
        let layout = RegionLayout::new(world);
        let last_slot = layout.outbox(world - 1, CHANNELS - 1, SLOTS - 1) + DESCRIPTOR_BYTES;
        assert_eq!(last_slot, layout.posted(0, 0));
        assert_eq!(
            layout.posted(world - 1, CHANNELS - 1) + 4,
            layout.done(0, 0)
        );
        assert_eq!(layout.done(world - 1, CHANNELS - 1) + 4, layout.sent(0, 0));
        assert_eq!(
            layout.sent(world - 1, CHANNELS - 1) + 4,
            layout.received(0, 0)
        );
        assert_eq!(
            layout.received(world - 1, CHANNELS - 1) + 4,
            layout.sent_base(0, 0)
        );
        assert_eq!(
            layout.sent_base(world - 1, CHANNELS - 1) + 4,
            layout.received_base(0, 0)
        );
        assert_eq!(
            layout.received_base(world - 1, CHANNELS - 1) + 4,
            layout.filled(0, 0)
        );
        let u32_end = layout.drain_progress(world - 1, CHANNELS - 1) + 4;
        assert!(layout.ring_source(0, 0) >= u32_end && layout.ring_source(0, 0) < u32_end + 8);
        assert_eq!(layout.ring_source(0, 0) % 8, 0);
        assert_eq!(
            layout.ring_source(world - 1, CHANNELS - 1) + 8,
            layout.ring_piece(0, 0)
        );
        let words_end = layout.ring_piece(world - 1, CHANNELS - 1) + 8;
        assert!(layout.window_table() >= words_end && layout.window_table() < words_end + 16);
        assert_eq!(layout.window_table() % 16, 0);
        assert_eq!(
            layout.window_table() + WindowTable::BYTES,
            pair_region_bytes(world)
        );
        // Sequence s and s + SLOTS share a slot; s and s + 1 do not; nor do two channels.
        assert_eq!(layout.outbox(2, 1, 3), layout.outbox(2, 1, 3 + SLOTS));
        assert_ne!(layout.outbox(2, 1, 3), layout.outbox(2, 1, 4));
        assert_ne!(layout.outbox(2, 0, 3), layout.outbox(2, 1, 3));
    }

    #[test]
    fn channels_cover_a_message_once() {
        for bytes in [
            0u64,
            1,
            15,
            16,
            17,
            65_535,
            65_536,
            65_537,
            200_000,
            262_144,
            1 << 24,
            1_000_003,
        ] {
            let channels = channels_for(bytes);
            assert!((1..=CHANNELS).contains(&channels), "{bytes}");
            let mut next = 0;
            for channel in 0..channels {
                let (lo, hi) = channel_part(bytes, channel);
                assert_eq!(lo, next, "{bytes} B, channel {channel}");
                assert!(hi >= lo);
                assert!(lo % 16 == 0 || lo == bytes);
                next = hi;
            }
            assert_eq!(next, bytes, "{bytes} B");
        }
        assert_eq!(channels_for(1 << 24), CHANNELS);
        assert_eq!(channels_for(CHANNEL_MIN_BYTES + 1), 2);
    }

    #[test]
    fn the_window_table_finds_set_entries_only() {
        let mut table = std::vec![0u64; (WindowTable::BYTES / 8) as usize];
        let context = SymmContext {
            rank: 3,
            ..bytemuck::Zeroable::zeroed()
        };
        let address = table.as_mut_ptr() as u64;
        table[2 * 5] = 42 + 1;
        table[2 * 5 + 1] = &context as *const SymmContext as u64;
        table[2 * 6] = 43 + 1; // being written: no context yet
        // SAFETY: a live table of the right size.
        unsafe {
            assert_eq!(WindowTable::find(address, 42).map(|c| c.rank), Some(3));
            assert!(WindowTable::find(address, 43).is_none());
            assert!(WindowTable::find(address, 7).is_none());
        }
    }
}
