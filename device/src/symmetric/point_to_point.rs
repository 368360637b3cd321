//! Send and receive between two ranks (`docs/POINT_TO_POINT.md`): one launch runs a rank's
//! sends and receives of one call or one group, over the pairing protocol of
//! [`crate::sync::p2p`].
//!
//! **Tasks.** Each entry of the work table is one send or one receive ([`PeerTask`]: its peer,
//! bytes, data type, and its buffer in one of the rank's windows); every task's receive context
//! is the communicator's point-to-point window, whose buffers hold the pair regions.
//!
//! **Blocks.** A message travels on [`channels_for`] channels of its pair, each carrying one
//! part. The unit of work is one (task, channel), owned by block `(slot · CHANNELS + channel)
//! mod blocks`, `slot` being the peer's place among the launch's distinct peers (numbered by
//! the host): every task with the same peer and channel goes to one block, so that the
//! sequence numbers of a channel (this rank's counts `sent` and `received`, read and written by
//! its kernels only) need no other block.
//!
//! **Progress.** A block passes over its units until every one is done: a send is posted once
//! its slot is free, a receive copied once its send is posted (thread 0 looks, the block's
//! threads learn it through a barrier, then all of them copy, pass a barrier, and thread 0
//! stores `done`); units of one (peer, channel) go in task order. No unit waits for another,
//! so a rank's sends and receives progress together whatever order its peers make theirs in
//! (grouped or not, any number per peer). A pass without progress past the timeout raises the
//! abort word naming a peer waited for. Last, the block waits until its sends are copied.
//!
//! **Buffers outside the windows.** A task whose buffer lies outside every window
//! ([`FLAG_STAGED`]) names its address. Its rank's kernel reaches that memory itself: a receive
//! copies into it directly; a send copies it, piece by piece, into a ring of the rank's staging
//! window that the receiver pulls from (the rings of [`crate::sync::p2p`]), so a message of any
//! size passes through a ring of fixed size, in the same launch. A ring unit stays the current
//! unit of its (direction, peer, channel) until its last piece is filled (send) or copied out
//! (receive); its block serves its other units meanwhile.
//!
//! **Checks.** The receiver refuses a send whose bytes or data type differ from its receive's,
//! whose window it has no context of, or whose range lies outside that window: it raises its
//! abort word ([`ABORT_P2P_REFUSED`], naming the peer and the reason) and stores nothing into
//! the sender's region; the host fails the communicator, which ends the sender's wait.

use super::batch::MAX_TASKS;
use super::segments::copy_bytes;
use super::{Batch, Grid, KernelStatus, TaskArgs};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::abort::raise_timeout;
use crate::sync::p2p::{
    CHANNELS, Descriptor, MAX_PIECE, PIECE_UNIT, Pairs, WindowTable, channel_part, channels_for,
    piece_range, ring_bytes, ring_slot,
};

/// Abort-word value (low byte) of a receive that refused its send: the reason
/// ([`RefusalReason`]) in bits 8–15, the sending rank + 1 from bit 16.
pub const ABORT_P2P_REFUSED: u32 = 4;

/// Threads per block the send/receive kernel is launched with at most: its registers (the
/// rings' steps beside the pairing) fit a block of this many, not one of 512.
pub const MAX_THREADS: u32 = 256;

/// `TaskArgs::flags` bit of a point-to-point task: a send (else a receive). The data type's
/// C ABI value is in bits 8–15.
pub const FLAG_SEND: u32 = 8;

/// `TaskArgs::flags` bit of a point-to-point task that does nothing: it pads a rank's tasks to
/// the launch's task count when one launch serves several ranks.
pub const FLAG_PADDING: u32 = 16;

/// `TaskArgs::flags` bit of a point-to-point task whose buffer lies outside every window, at
/// the address in `TaskArgs::counts_context`. A send's ring is then at its offset in its
/// window (the rank's staging window), in pieces of `TaskArgs::send_capacity` bytes.
pub const FLAG_STAGED: u32 = 32;

/// Why a receive refused a send.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// The send's bytes or data type differ from the receive's.
    Mismatch = 1,
    /// The receiver has no context of the send's window (not registered, or deregistered,
    /// on the receiver; or its window table was full).
    UnknownWindow = 2,
    /// The send's range does not lie inside its window.
    OutOfBounds = 3,
    /// The slot held another sequence: the pair is out of step.
    OutOfStep = 4,
    /// The task itself is outside the kernel's limits (its peer, its windows).
    InvalidTask = 5,
}

impl RefusalReason {
    /// The reason of a raised abort word's value.
    pub const fn from_word(word: u32) -> Option<RefusalReason> {
        match (word >> 8) & 0xFF {
            1 => Some(RefusalReason::Mismatch),
            2 => Some(RefusalReason::UnknownWindow),
            3 => Some(RefusalReason::OutOfBounds),
            4 => Some(RefusalReason::OutOfStep),
            5 => Some(RefusalReason::InvalidTask),
            _ => None,
        }
    }
}

/// The abort word of a receive from `peer` that refused its send for `reason`.
pub const fn abort_p2p_refused(peer: u32, reason: RefusalReason) -> u32 {
    ABORT_P2P_REFUSED | (reason as u32) << 8 | peer.wrapping_add(1) << 16
}

/// The sending rank named by an [`ABORT_P2P_REFUSED`] word.
pub const fn refused_peer(word: u32) -> Option<u32> {
    if word & 0xFF != ABORT_P2P_REFUSED || word >> 16 == 0 {
        None
    } else {
        Some((word >> 16) - 1)
    }
}

/// One send or receive of a rank, as its work-table entry carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerTask {
    /// `true` for a send.
    pub send: bool,
    /// The other rank.
    pub peer: u32,
    /// The data type's C ABI value.
    pub datatype: u32,
    /// Bytes of the message.
    pub bytes: u64,
    /// Address of the context of the window holding this rank's buffer.
    pub buffer_context: u64,
    /// Byte offset of the buffer in that window.
    pub offset: u64,
    /// Registration number of that window (a send names it to the receiver).
    pub window: u64,
    /// Address of the context of the communicator's point-to-point window.
    pub pairs_context: u64,
    /// The peer's place among the distinct peers of the rank's launch (numbered by the host
    /// from 0, below [`crate::sync::signal_pad::MAX_RANKS`]): which blocks own its channels.
    pub slot: u32,
    /// Byte `c`: the task's place among the launch's tasks of the same direction and peer that
    /// use channel `c` ([`assign_ordinals`]).
    pub ordinals: u32,
    /// The address of a buffer outside every window ([`FLAG_STAGED`]), else 0. A receive
    /// copies into it; a send copies it into its ring, at `offset` of its window.
    pub staged_address: u64,
    /// A staged send's piece: bytes of one slot of its ring (a multiple of
    /// [`crate::sync::p2p::PIECE_UNIT`]); else 0.
    pub piece: u64,
}

impl PeerTask {
    /// The work-table entry of this task.
    pub const fn to_args(&self) -> TaskArgs {
        TaskArgs {
            send_context: self.buffer_context,
            recv_context: self.pairs_context,
            send_offset: self.offset,
            recv_offset: self.window,
            count: self.bytes,
            first_cell: self.peer as u64,
            flags: if self.send { FLAG_SEND } else { 0 }
                | if self.staged_address != 0 {
                    FLAG_STAGED
                } else {
                    0
                }
                | (self.datatype & 0xFF) << 8
                | (self.slot & 0xFF) << 16,
            reserved: self.ordinals,
            counts_context: self.staged_address,
            counts_offset: 0,
            send_capacity: self.piece,
        }
    }

    /// A task that does nothing, over the point-to-point window at `pairs_context` (see
    /// [`FLAG_PADDING`]).
    pub const fn padding(pairs_context: u64) -> TaskArgs {
        TaskArgs {
            send_context: pairs_context,
            recv_context: pairs_context,
            send_offset: 0,
            recv_offset: 0,
            count: 0,
            first_cell: 0,
            flags: FLAG_PADDING,
            reserved: 0,
            counts_context: 0,
            counts_offset: 0,
            send_capacity: 0,
        }
    }

    /// The task an entry carries.
    pub const fn from_args(args: &TaskArgs) -> PeerTask {
        PeerTask {
            send: args.flags & FLAG_SEND != 0,
            peer: if args.first_cell > u32::MAX as u64 {
                u32::MAX
            } else {
                args.first_cell as u32
            },
            datatype: (args.flags >> 8) & 0xFF,
            bytes: args.count,
            buffer_context: args.send_context,
            offset: args.send_offset,
            window: args.recv_offset,
            pairs_context: args.recv_context,
            slot: (args.flags >> 16) & 0xFF,
            ordinals: args.reserved,
            staged_address: if args.flags & FLAG_STAGED != 0 {
                args.counts_context
            } else {
                0
            },
            piece: if args.flags & (FLAG_STAGED | FLAG_SEND) == FLAG_STAGED | FLAG_SEND {
                args.send_capacity
            } else {
                0
            },
        }
    }

    /// `true` for a send through a ring.
    #[inline(always)]
    pub const fn is_ring_send(&self) -> bool {
        self.send && self.staged_address != 0
    }
}

/// Number the point-to-point tasks of one rank's launch: each task's place, per channel it
/// uses, among the earlier tasks of the same direction and peer that use that channel (its
/// sequence within the launch on that channel), into [`TaskArgs::reserved`]. The kernel takes
/// the tasks of one (peer, channel) in this order. At most 256 tasks.
pub fn assign_ordinals(tasks: &mut [TaskArgs]) {
    for i in 0..tasks.len() {
        let task = PeerTask::from_args(&tasks[i]);
        let mut ordinals = 0u32;
        if tasks[i].flags & FLAG_PADDING == 0 {
            for channel in 0..channels_for(task.bytes) {
                let earlier = tasks[..i]
                    .iter()
                    .filter(|other| other.flags & FLAG_PADDING == 0)
                    .map(PeerTask::from_args)
                    .filter(|other| {
                        other.send == task.send
                            && other.peer == task.peer
                            && channels_for(other.bytes) > channel
                    })
                    .count() as u32;
                ordinals |= (earlier & 0xFF) << (8 * channel);
            }
        }
        tasks[i].reserved = ordinals;
    }
}

/// The task's place among its (direction, peer, `channel`) tasks of the launch.
#[inline(always)]
const fn ordinal(task: &PeerTask, channel: u32) -> u32 {
    (task.ordinals >> (8 * channel)) & 0xFF
}

/// The block that owns channel `channel` of the tasks with the peer in `slot`.
#[inline(always)]
const fn owner(slot: u32, channel: u32, blocks: u32) -> u32 {
    let unit = slot as u64 * CHANNELS as u64 + channel as u64;
    (unit % if blocks == 0 { 1 } else { blocks as u64 }) as u32
}

/// Raise this rank's abort word (of the point-to-point window `ctx`) with `word` unless it is
/// raised already.
///
/// # Safety
/// `ctx` is host-built.
#[inline(always)]
unsafe fn refuse(ctx: &SymmContext, word: u32) {
    // SAFETY: the abort word is this rank's, accessed atomically (contract).
    unsafe { raise_timeout(ctx.abort_flag as *mut u32, word) };
}

/// Where the bytes of `descriptor` start as this rank reads them, once checked against the
/// receive `task` (see the module's checks). With `wait_for_window`, a window not yet in the
/// table is waited for, bounded (its registration may still be completing on this rank while
/// the sender already posted).
///
/// # Safety
/// `pairs` and `task` come from a checked batch; `task.peer < world_size`.
#[inline(always)]
unsafe fn source_of(
    pairs: &Pairs<'_>,
    ctx: &SymmContext,
    task: &PeerTask,
    descriptor: &Descriptor,
    wait_for_window: bool,
) -> Result<u64, u32> {
    let refused = |reason| abort_p2p_refused(task.peer, reason);
    if descriptor.bytes != task.bytes || descriptor.datatype != task.datatype {
        return Err(refused(RefusalReason::Mismatch));
    }
    let table = pairs.window_table();
    let start = arch::global_timer_ns();
    let window = loop {
        // SAFETY: this rank's window table, which the host maintains.
        if let Some(window) = unsafe { WindowTable::find(table, descriptor.window) } {
            break window;
        }
        if !wait_for_window {
            return Err(refused(RefusalReason::UnknownWindow));
        }
        // SAFETY: this rank's abort word, accessed atomically.
        if unsafe { arch::load_acquire_sys_u32(ctx.abort_flag as *const u32) } != 0 {
            return Err(0);
        }
        if arch::global_timer_ns().wrapping_sub(start) > ctx.timeout_ns {
            return Err(refused(RefusalReason::UnknownWindow));
        }
        arch::nanosleep(1000);
    };
    if window.world_size != ctx.world_size || window.rank != ctx.rank {
        return Err(refused(RefusalReason::UnknownWindow));
    }
    let inside = descriptor
        .offset
        .checked_add(descriptor.extent())
        .is_some_and(|end| end <= window.window_size);
    if !inside {
        return Err(refused(RefusalReason::OutOfBounds));
    }
    // SAFETY: peer < world_size == the window's world size.
    Ok(unsafe { window.peer_base(task.peer) }.wrapping_add(descriptor.offset))
}

/// `true` when every task of `batch` is a point-to-point task over the point-to-point window
/// of task 0, with a peer of the communicator and a buffer inside its window (a staged send:
/// its ring; a staged receive names no window), and a staged send's piece a multiple of
/// [`PIECE_UNIT`] up to [`MAX_PIECE`].
#[inline(always)]
fn tasks_are_valid(batch: &Batch<'_>, pairs: &SymmContext) -> bool {
    let mut index = 0;
    while index < batch.len() {
        let entry = batch.entry(index);
        if entry.flags & FLAG_PADDING != 0 {
            index += 1;
            continue;
        }
        let task = batch.task(index);
        let args = PeerTask::from_args(&entry);
        let (extent, piece_fits) = if args.is_ring_send() {
            (
                ring_bytes(args.bytes, args.piece),
                args.piece > 0 && args.piece.is_multiple_of(PIECE_UNIT) && args.piece <= MAX_PIECE,
            )
        } else if args.staged_address != 0 {
            (0, true)
        } else {
            (args.bytes, true)
        };
        let buffer = task.rank.send;
        let inside = args
            .offset
            .checked_add(extent)
            .is_some_and(|end| end <= buffer.window_size);
        if !core::ptr::eq(task.rank.recv, pairs)
            || args.peer >= pairs.world_size
            || !inside
            || !piece_fits
        {
            return false;
        }
        index += 1;
    }
    true
}

/// Where the task's bytes are: its buffer in its window, or outside every window (a staged
/// send's source, a staged receive's destination).
///
/// # Safety
/// `task` comes from a checked batch.
#[inline(always)]
unsafe fn destination(task: &PeerTask) -> u64 {
    if task.staged_address != 0 {
        task.staged_address
    } else {
        // SAFETY: the buffer's window is host-built (the batch was checked).
        let buffer = unsafe { &*(task.buffer_context as *const SymmContext) };
        buffer.local_base.wrapping_add(task.offset)
    }
}

/// What one step of a ring unit did.
enum RingStep {
    /// Its slot (a send) or its piece (a receive) is not ready yet.
    Waiting,
    /// One piece moved; `last`: the unit is done.
    Moved { last: bool },
}

/// One step of the ring unit `task` on `channel`, `seq` being its sequence and `progress` its
/// progress word (1 + the pieces it moved): a send fills its next piece into its ring once the
/// slot is free; a
/// receive copies the sender's next piece out once it is filled (and says `done` after the
/// last). Every thread of the block calls it; thread 0 alone writes the counts, between
/// barriers.
///
/// # Safety
/// `task` comes from a checked batch, `peer < world`; the calling block alone owns the
/// channel; for a receive, the descriptor of `seq` was posted and checked, and its ring noted
/// in the own words ([`Pairs::ring_of`]).
#[inline(always)]
unsafe fn ring_step(
    pairs: &Pairs<'_>,
    task: &PeerTask,
    channel: u32,
    seq: u32,
    progress: u32,
) -> RingStep {
    let done_pieces = progress.wrapping_sub(1);
    let thread0 = arch::thread_idx_x() == 0;
    let (lo, hi) = channel_part(task.bytes, channel);
    // SAFETY: forwarded contract: this rank's own words of a channel this block alone owns.
    let (moved_word, progress_word) = unsafe {
        if task.send {
            (
                pairs.fills(task.peer, channel),
                pairs.fill_progress(task.peer, channel),
            )
        } else {
            (
                pairs.drains(task.peer, channel),
                pairs.drain_progress(task.peer, channel),
            )
        }
    };
    // SAFETY: as above; thread 0 writes it only between two barriers.
    let moved = unsafe { arch::load_plain_u32(moved_word) };
    // Thread 0 looks at the peer's count: the slot is free (a send), the piece filled (a
    // receive); the block learns it through the barrier, which orders the copy after it.
    // SAFETY: forwarded contract.
    let ready = thread0
        && unsafe {
            if task.send {
                pairs.ring_slot_free(task.peer, channel, moved)
            } else {
                pairs.piece_ready(task.peer, channel, moved)
            }
        };
    if !arch::sync_threads_or(ready) {
        return RingStep::Waiting;
    }
    // The ring as this rank reaches it, and its piece: a send's own (its window, host-built
    // and checked), a receive's noted when it began (own words, written by thread 0 before a
    // barrier).
    // SAFETY: forwarded contract.
    let (ring, piece) = unsafe {
        if task.send {
            let window = &*(task.buffer_context as *const SymmContext);
            (window.local_base.wrapping_add(task.offset), task.piece)
        } else {
            let (ring, piece) = pairs.ring_of(task.peer, channel);
            (arch::load_plain_u64(ring), arch::load_plain_u64(piece))
        }
    };
    let (from, to, last) = piece_range(lo, hi, piece, done_pieces);
    let slot = ring.wrapping_add(ring_slot(piece, channel, moved));
    // SAFETY: a checked batch.
    let buffer = unsafe { destination(task) }.wrapping_add(from);
    let (src, dst) = if task.send {
        (buffer, slot)
    } else {
        (slot, buffer)
    };
    // SAFETY: the slot lies in the ring (checked against its window); the caller's memory or
    // the receive's window holds the message (C ABI contract, host checks); a send's slot is
    // free and a receive's piece filled (thread 0's acquire and the barrier); they are
    // different memory.
    unsafe { copy_bytes(src, dst, 0, to - from) };
    arch::sync_threads();
    // Thread 0's section before the next barrier keeps its branches few (the count's word is
    // selected, not branched on), and nothing after that barrier branches on thread 0 again:
    // either lets the compiler duplicate the barrier into two arms.
    if thread0 {
        let next = moved.wrapping_add(1);
        // SAFETY: every thread's accesses to the piece are done (barrier); own words; the
        // count and `done` go to the peer's region (forwarded contract); `done` after the last
        // piece's drain count.
        unsafe {
            arch::store_plain_u32(moved_word, next);
            arch::store_plain_u32(progress_word, if last { 0 } else { progress + 1 });
            pairs.publish_ring_count(task.peer, channel, task.send, next);
            if last && !task.send {
                pairs.mark_done(task.peer, channel, seq);
            }
        }
    }
    arch::sync_threads();
    RingStep::Moved { last }
}

/// The calling block's sends and receives of `batch` (see the module).
///
/// # Safety
/// The contexts are host-built: each task's send context the window of its buffer (which holds
/// `[offset, + bytes)`), its receive context the communicator's point-to-point window; receive
/// buffers do not overlap each other or any send buffer of the launch; every rank's sends pair
/// with its peers' receives in order (else the receivers refuse).
#[inline(always)]
pub unsafe fn send_receive(batch: &Batch<'_>, grid: Grid) -> KernelStatus {
    let ctx = batch.first().rank.recv;
    if batch.len() as usize > MAX_TASKS || !tasks_are_valid(batch, ctx) {
        if arch::thread_idx_x() == 0 {
            // SAFETY: a host-built context.
            unsafe { refuse(ctx, abort_p2p_refused(ctx.rank, RefusalReason::InvalidTask)) };
        }
        return KernelStatus::Aborted;
    }
    // SAFETY: a host-built point-to-point window (contract): its buffers hold the regions.
    let pairs = unsafe { Pairs::open(ctx) };
    let thread0 = arch::thread_idx_x() == 0;
    // A padding task is neither a send nor a receive: `None`.
    let entry = |index: u32| {
        let args = batch.entry(index);
        (args.flags & FLAG_PADDING == 0).then(|| PeerTask::from_args(&args))
    };
    let owned =
        |task: &PeerTask, channel: u32| owner(task.slot, channel, grid.blocks) == grid.block;
    // The counts of a (direction, peer, channel) of this rank: the running one, and as this
    // launch found it. Their difference is how many of the launch's tasks on it are done.
    let counts = |task: &PeerTask, channel: u32| {
        // SAFETY: peer < world (checked).
        unsafe {
            if task.send {
                (
                    pairs.sent(task.peer, channel),
                    pairs.sent_base(task.peer, channel),
                )
            } else {
                (
                    pairs.received(task.peer, channel),
                    pairs.received_base(task.peer, channel),
                )
            }
        }
    };
    // Every thread counts the block's units; thread 0 notes where each of its (direction,
    // peer, channel)s starts.
    let mut remaining = 0u32;
    let mut index = 0;
    while index < batch.len() {
        if let Some(task) = entry(index) {
            for channel in 0..channels_for(task.bytes) {
                if !owned(&task, channel) {
                    continue;
                }
                remaining += 1;
                if thread0 && ordinal(&task, channel) == 0 {
                    let (count, base) = counts(&task, channel);
                    // SAFETY: this rank's own words of a channel this block alone owns.
                    unsafe { arch::store_plain_u32(base, arch::load_plain_u32(count)) };
                }
            }
        }
        index += 1;
    }
    arch::sync_threads();
    let mut last_progress = arch::global_timer_ns();
    // Passes over the units until every one is done: a send is posted once its slot is free, a
    // receive copied once its send is posted, each (direction, peer, channel) in task order
    // (a unit is next when its place equals the count done). No unit waits for another, so a
    // rank's sends and receives progress together whatever order its peers make theirs in.
    // Every thread takes every decision, learnt through a block barrier; the counts are read by
    // every thread and written by thread 0 only between two barriers.
    while remaining > 0 {
        let mut progressed = false;
        let mut waiting_for = u32::MAX;
        let mut index = 0;
        while index < batch.len() {
            let Some(task) = entry(index) else {
                index += 1;
                continue;
            };
            for channel in 0..channels_for(task.bytes) {
                if !owned(&task, channel) {
                    continue;
                }
                let (count, base) = counts(&task, channel);
                // SAFETY: this rank's own words of a channel this block alone owns.
                let progress_word = unsafe {
                    if task.send {
                        pairs.fill_progress(task.peer, channel)
                    } else {
                        pairs.drain_progress(task.peer, channel)
                    }
                };
                // SAFETY: as above.
                let (now, start, progress) = unsafe {
                    (
                        arch::load_plain_u32(count),
                        arch::load_plain_u32(base),
                        arch::load_plain_u32(progress_word),
                    )
                };
                let place = ordinal(&task, channel);
                if progress != 0 {
                    // A ring unit of this (direction, peer, channel) is under way: the one
                    // whose post or receipt took the latest sequence.
                    if place.wrapping_add(1) != now.wrapping_sub(start) {
                        continue;
                    }
                    // SAFETY: peer < world (checked); this block alone owns the channel; the
                    // unit's descriptor was posted (and checked, for a receive) when it began.
                    let step = unsafe { ring_step(&pairs, &task, channel, now, progress) };
                    match step {
                        RingStep::Waiting => waiting_for = waiting_for.min(task.peer),
                        RingStep::Moved { last } => {
                            progressed = true;
                            if last {
                                remaining -= 1;
                            }
                        }
                    }
                    continue;
                }
                if place != now.wrapping_sub(start) {
                    // Done already, or an earlier task of its channel is not.
                    continue;
                }
                let seq = now.wrapping_add(1);
                let (lo, hi) = channel_part(task.bytes, channel);
                if task.send {
                    let descriptor = Descriptor {
                        seq,
                        datatype: task.datatype,
                        window: task.window,
                        offset: task.offset,
                        bytes: task.bytes,
                        piece: task.piece,
                    };
                    // SAFETY: peer < world (checked); this block alone owns the channel.
                    let posted =
                        thread0 && unsafe { pairs.try_post(task.peer, channel, descriptor) };
                    if arch::sync_threads_or(posted) {
                        // A ring send is done once its last piece is filled.
                        let ring = task.is_ring_send();
                        if thread0 {
                            // SAFETY: as above; every thread read the words before the
                            // barrier. The progress word was 0 (no unit under way): storing
                            // it unconditionally keeps one path to the barrier below.
                            unsafe {
                                arch::store_plain_u32(count, seq);
                                arch::store_plain_u32(progress_word, u32::from(ring));
                            }
                        }
                        arch::sync_threads();
                        if !ring {
                            remaining -= 1;
                        }
                        progressed = true;
                    } else {
                        waiting_for = waiting_for.min(task.peer);
                    }
                    continue;
                }
                // SAFETY: as above.
                let ready = thread0 && unsafe { pairs.is_posted(task.peer, channel, seq) };
                if !arch::sync_threads_or(ready) {
                    waiting_for = waiting_for.min(task.peer);
                    continue;
                }
                let (mut refused, mut refusal) = (false, 0);
                if thread0 {
                    // SAFETY: as above; the post was acquired.
                    let descriptor = unsafe { pairs.read_descriptor(task.peer, channel, seq) };
                    let outcome = if descriptor.seq != seq {
                        Err(abort_p2p_refused(task.peer, RefusalReason::OutOfStep))
                    } else {
                        // SAFETY: checked batch; peer < world.
                        unsafe { source_of(&pairs, ctx, &task, &descriptor, true) }
                    };
                    // A ring: where its steps read it (own words of this block's channel);
                    // stored in every case (no ring unit of the channel is under way), so
                    // that this section ends without a branch before the barrier.
                    let (ring, piece) = match outcome {
                        Ok(source) if descriptor.piece != 0 => (source, descriptor.piece),
                        _ => (0, 0),
                    };
                    // SAFETY: peer < world; read by this block after a barrier.
                    unsafe {
                        let (ring_word, piece_word) = pairs.ring_of(task.peer, channel);
                        arch::store_plain_u64(ring_word, ring);
                        arch::store_plain_u64(piece_word, piece);
                    }
                    refused = outcome.is_err();
                    refusal = outcome.err().unwrap_or(0);
                }
                if arch::sync_threads_or(refused) {
                    if thread0 && refusal != 0 {
                        // SAFETY: a host-built context.
                        unsafe { refuse(ctx, refusal) };
                    }
                    return KernelStatus::Aborted;
                }
                // Every thread: the descriptor and the window, as thread 0 checked them (its
                // acquire of the post and the barrier order these reads after the sender's
                // writes).
                // SAFETY: as above.
                let descriptor = unsafe { pairs.read_descriptor(task.peer, channel, seq) };
                if descriptor.piece != 0 {
                    // Through the sender's ring: the pieces follow, one per step.
                    if thread0 {
                        // SAFETY: every thread read the words before the barrier above; the
                        // next unit reads them after the barrier below.
                        unsafe {
                            arch::store_plain_u32(count, seq);
                            arch::store_plain_u32(progress_word, 1);
                        }
                    }
                    arch::sync_threads();
                    progressed = true;
                    continue;
                }
                if thread0 {
                    // SAFETY: every thread read the count before the barrier above; the next
                    // unit reads it after the barrier below.
                    unsafe { arch::store_plain_u32(count, seq) };
                }
                // SAFETY: as above; the window's entry stays while this launch runs.
                let source = unsafe { source_of(&pairs, ctx, &task, &descriptor, false) };
                if arch::sync_threads_or(source.is_err()) {
                    // Thread 0 found the same descriptor acceptable: only a table entry that
                    // changed under the launch gets here.
                    if thread0 {
                        let word = abort_p2p_refused(task.peer, RefusalReason::UnknownWindow);
                        // SAFETY: a host-built context.
                        unsafe { refuse(ctx, word) };
                    }
                    return KernelStatus::Aborted;
                }
                let src = source.unwrap_or(0);
                // SAFETY: a checked batch.
                let dst = unsafe { destination(&task) };
                // SAFETY: the source range lies in the sender's window (checked), the
                // destination in this rank's window (host-checked) or outside every window
                // (the caller's memory, by the C ABI's contract); they are different buffers
                // (contract).
                unsafe { copy_bytes(src, dst, lo, hi) };
                arch::sync_threads();
                if thread0 {
                    // SAFETY: as above; every thread's loads of the send are done (barrier).
                    unsafe { pairs.mark_done(task.peer, channel, seq) };
                }
                remaining -= 1;
                progressed = true;
            }
            index += 1;
        }
        if remaining == 0 {
            break;
        }
        let mut give_up = false;
        if thread0 {
            let now = arch::global_timer_ns();
            if progressed {
                last_progress = now;
            } else if pairs.aborted() {
                give_up = true;
            } else if now.wrapping_sub(last_progress) > pairs.timeout_ns() {
                pairs.raise_timeout_for(waiting_for);
                give_up = true;
            }
        }
        if arch::sync_threads_or(give_up) {
            return KernelStatus::Aborted;
        }
        if !progressed {
            arch::nanosleep(200);
        }
    }
    // Every send is posted and every receive copied: wait until the peers have copied this
    // block's sends (their buffers may then be reused).
    let mut index = 0;
    while index < batch.len() {
        if let Some(task) = entry(index).filter(|t| t.send) {
            for channel in 0..channels_for(task.bytes) {
                if !owned(&task, channel) {
                    continue;
                }
                let mut failed = false;
                if thread0 {
                    // SAFETY: peer < world (checked); this block alone owns the channel.
                    unsafe {
                        let seq = arch::load_plain_u32(pairs.sent(task.peer, channel));
                        failed = pairs.complete(task.peer, channel, seq).is_err();
                    }
                }
                if arch::sync_threads_or(failed) {
                    return KernelStatus::Aborted;
                }
            }
        }
        index += 1;
    }
    KernelStatus::Completed
}
