//! The device protocol of windows whose peers are reached through an engine
//! ([`BackendTag::Nvshmem`], [`BackendTag::Nccl`]): a window over NVSHMEM's symmetric heap, or
//! an NCCL window, in which some peer is not load/store reachable (another machine, or a GPU
//! without peer access). Every move of data or signal to a peer goes through the engine's
//! put-with-signal and signal operations ([`SignalEngine`]); nothing reads a peer's memory, so
//! the protocol is push only, as network transports need.
//!
//! # The pad of an engine window
//! The window's signal pads are memory of the engine (`nvshmem_malloc`; an NCCL window of
//! their own), sized as a native pad ([`signal_pad_bytes`]). Native kernels never run on an engine window (the host
//! refuses them), so the engine protocol lays out the pad's part from `LL_OFFSET` on afresh:
//!
//! ```text
//! SIGNALS_OFFSET   signals  [kind: 4][program: MAX_BLOCKS][source: world] u64   written by `source`
//! counters_offset  counters [program: MAX_BLOCKS][3] u64                        this rank's own
//! inbox_offset     inbox    [program: programs][source: world] slot             written by `source`
//! ```
//!
//! Every signal word has one writer (the source rank named by its index, through the engine's
//! signal add) and counts: after `k` operations of a kind between a source and program `p` of
//! this rank the word holds `k`. The counters hold how many of each a program has completed,
//! so the next target is always the counter plus one and no word is ever reset. An inbox slot
//! receives one round of an all-reduce from one source: the sender puts only once the receiver
//! has signalled ([`Signal::Free`]) that it consumed the previous round.
//!
//! Program `p` of every rank handles the same part of every call, and synchronizes with
//! program `p` of every other rank only, as the native device functions do.

pub mod nccl;
pub mod nvshmem;

use crate::arch;
use crate::context::{BackendTag, ENGINE_DATA, ENGINE_SIGNALS, SymmContext};
use crate::numeric::element::Element;
use crate::numeric::ops::ReduceOp;
use crate::sync::abort::{ABORT_TIMED_OUT, abort_timed_out_waiting_for, raise_timeout};
use crate::sync::grid::{Grid, block_range};
use crate::sync::signal_pad::{LL_OFFSET, MAX_BLOCKS, signal_pad_bytes};
use crate::sync::wait::{PARK_AFTER_POLLS, POLLS_PER_ABORT_LOOK, POLLS_PER_CHECK};

/// Where a put's bytes land: a byte offset in the window's data or in its pad, on the target
/// rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Offset in the window's data (`ctx.engine[ENGINE_DATA]`'s memory).
    Data(u64),
    /// Offset in the window's pad (`ctx.engine[ENGINE_SIGNALS]`'s memory).
    Pad(u64),
}

/// The engine operations the protocol uses. Places are offsets in the window's data or pad,
/// signals offsets of 64-bit words in the pad, sources offsets in this rank's data; `ctx` is
/// the engine context of the call, whose engine words ([`ENGINE_DATA`], [`ENGINE_SIGNALS`],
/// [`crate::context::ENGINE_COMM`]) tell the engine how it addresses them; `pe` is the
/// engine's number of the target rank (symm's rank: the host refuses any other mapping).
///
/// # Safety
/// Implementations deliver a put's bytes before its signal is seen (`put_with_signal`); make
/// a signal add atomic, and seen by its target only after every put this rank completed with
/// `quiet` before it settled there (what the barrier relies on); and complete this rank's
/// outstanding puts as far as their sources in `quiet`, or say that they gave up.
pub unsafe trait SignalEngine {
    /// The tag of the contexts this engine runs ([`BackendTag::Nvshmem`], [`BackendTag::Nccl`]).
    const TAG: BackendTag;

    /// `true` when the engine words of `ctx` (a valid context with this engine's tag) are
    /// usable by this engine.
    fn accepts(ctx: &SymmContext) -> bool;

    /// Copy `bytes` bytes from offset `src` of this rank's data to `dest` on `pe`, then add 1
    /// to the pad's 64-bit signal word at offset `signal` on `pe`. Called by every thread of
    /// the block with the same arguments; returns before the copy completes (see
    /// [`SignalEngine::quiet`]).
    ///
    /// # Safety
    /// `ctx` is an engine context the engine accepts; both ranges and the signal word lie in
    /// the window's data and pad; `pe` is a rank of the window.
    unsafe fn put_with_signal(
        &self,
        ctx: &SymmContext,
        dest: Place,
        src: u64,
        bytes: u64,
        signal: u64,
        pe: u32,
    );

    /// Add 1 to the pad's 64-bit signal word at offset `signal` on `pe`. Called by one thread.
    ///
    /// # Safety
    /// As for [`SignalEngine::put_with_signal`].
    unsafe fn signal_add(&self, ctx: &SymmContext, signal: u64, pe: u32);

    /// `true` once this rank's signal word at pad offset `signal` is at least `target`; the
    /// bytes of the puts that signalled it are then visible to the calling thread. (NVSHMEM:
    /// `nvshmem_uint64_test`, which also makes a proxy or RDMA transport's writes consistent
    /// before it says yes; NCCL: `ncclGinReadSignalVA`, an acquire load, GIN's signals being
    /// delivered after their puts settled. A plain load would not do for NVSHMEM. The words
    /// count calls and never come near 2^64, so a plain `>=` is exact.)
    ///
    /// # Safety
    /// As for [`SignalEngine::put_with_signal`], for a signal word of this rank.
    unsafe fn signal_reached(&self, ctx: &SymmContext, signal: u64, target: u64) -> bool;

    /// Complete every put this thread's block issued as far as the source: its bytes may be
    /// reused. That the data settled at the target is known only from a signal after it (a
    /// put's own, or a later signal add to that target: the barrier's). Called by every
    /// thread of the block. `false` when the engine gave up first (NCCL: the context's
    /// `timeout_ns` passed); an engine without a bounded completion (NVSHMEM's `nvshmem_quiet`)
    /// waits on its own and returns `true`.
    ///
    /// # Safety
    /// As for [`SignalEngine::put_with_signal`].
    unsafe fn quiet(&self, ctx: &SymmContext) -> bool;
}

/// An engine that is never built: the native-only entry points' type argument.
pub enum NoEngine {}

// SAFETY: no value exists, so no method is ever called.
unsafe impl SignalEngine for NoEngine {
    const TAG: BackendTag = BackendTag::Native;

    fn accepts(_: &SymmContext) -> bool {
        false
    }
    unsafe fn put_with_signal(&self, _: &SymmContext, _: Place, _: u64, _: u64, _: u64, _: u32) {
        match *self {}
    }
    unsafe fn signal_add(&self, _: &SymmContext, _: u64, _: u32) {
        match *self {}
    }
    unsafe fn signal_reached(&self, _: &SymmContext, _: u64, _: u64) -> bool {
        match *self {}
    }
    unsafe fn quiet(&self, _: &SymmContext) -> bool {
        match *self {}
    }
}

/// The kinds of signal word, one array of words per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Signal {
    /// The source's program entered the call (barriers, and the start of the collectives).
    Ready = 0,
    /// The source's all-gather bytes landed in this rank's window.
    Gather = 1,
    /// A round of the source's all-reduce bytes landed in this rank's inbox slot for it.
    Reduce = 2,
    /// The source consumed the round this rank last put into the source's inbox.
    Free = 3,
}

const SIGNAL_KINDS: usize = 4;

/// The counters of one program: how many barriers (entries), all-gathers and all-reduce
/// rounds it completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
enum Counter {
    Ready = 0,
    Gather = 1,
    Reduce = 2,
}

const COUNTERS: usize = 3;

/// Offset of the signal words in an engine window's pad.
pub const SIGNALS_OFFSET: usize = LL_OFFSET;

/// Offset of the programs' counters in a `world`-rank engine window's pad.
pub const fn counters_offset(world: usize) -> usize {
    SIGNALS_OFFSET + SIGNAL_KINDS * MAX_BLOCKS * world * 8
}

/// Offset of the inbox in a `world`-rank engine window's pad.
pub const fn inbox_offset(world: usize) -> usize {
    (counters_offset(world) + MAX_BLOCKS * COUNTERS * 8).next_multiple_of(16)
}

/// Bytes of one inbox slot when `programs` programs share the inbox of a `world`-rank engine
/// window (a multiple of 16).
pub const fn inbox_slot_bytes(world: usize, programs: usize) -> usize {
    let slots = if world * programs == 0 {
        1
    } else {
        world * programs
    };
    ((signal_pad_bytes(world) - inbox_offset(world)) / slots) & !15
}

// The layout fits the smallest pad with room for the largest grid, at every world size (not
// under loom, whose pads are cut down for the models and which checks no engine protocol).
#[cfg(not(loom))]
const _: () = {
    let mut world = 1;
    while world <= crate::sync::signal_pad::MAX_RANKS {
        assert!(inbox_offset(world) + 16 * world * MAX_BLOCKS <= signal_pad_bytes(world));
        world += 1;
    }
};

/// Offset of the `kind` signal word of `program` written by `source`.
#[inline(always)]
fn signal_offset(kind: Signal, world: u32, program: u32, source: u32) -> u64 {
    (SIGNALS_OFFSET
        + ((kind as usize * MAX_BLOCKS + program as usize) * world as usize + source as usize) * 8)
        as u64
}

/// `true` when `ctx` carries what the engine protocol of `E` needs: the engine's handles of
/// the data and of the pads (as `E` checks them), and pads as large as the layout.
#[inline(always)]
pub fn context_is_usable<E: SignalEngine>(ctx: &SymmContext) -> bool {
    ctx.engine[ENGINE_DATA] != 0
        && ctx.engine[ENGINE_SIGNALS] != 0
        && ctx.signal_pad_size >= signal_pad_bytes(ctx.world_size as usize) as u64
        && E::accepts(ctx)
}

/// A peer did not arrive in time, or the window was already aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aborted;

/// One program's view of an engine window during one device-function call.
pub struct EngineWindow<'a, E: SignalEngine> {
    engine: &'a E,
    ctx: &'a SymmContext,
    grid: Grid,
    /// This rank's pad, as this rank addresses it for loads and stores.
    pad_local: u64,
}

impl<'a, E: SignalEngine> EngineWindow<'a, E> {
    /// The view of `ctx` for the calling program.
    ///
    /// # Safety
    /// `ctx` is a host-built engine context ([`context_is_usable`]) of this rank, `grid.block <
    /// MAX_BLOCKS`, and every thread of the block calls the view's methods alike.
    #[inline(always)]
    pub unsafe fn new(engine: &'a E, ctx: &'a SymmContext, grid: Grid) -> Self {
        EngineWindow {
            engine,
            ctx,
            grid,
            // SAFETY: rank < world_size (a host-built context).
            pad_local: unsafe { ctx.peer_signal_pad(ctx.rank) },
        }
    }

    /// The ranks other than this one, starting after it (so that ranks spread their puts).
    #[inline(always)]
    fn peers(&self) -> impl Iterator<Item = u32> {
        let (me, world) = (self.ctx.rank, self.ctx.world_size);
        (1..world).map(move |k| (me + k) % world)
    }

    #[inline(always)]
    fn counter_slot(&self, counter: Counter) -> *mut u64 {
        let index = self.grid.block as usize * COUNTERS + counter as usize;
        (self.pad_local + (counters_offset(self.ctx.world_size as usize) + index * 8) as u64)
            as *mut u64
    }

    /// This program's `counter` (thread 0 reads and writes counters).
    #[inline(always)]
    fn counter(&self, counter: Counter) -> u64 {
        // SAFETY: a word of this rank's pad that only this program index touches, ordered by
        // block barriers and launch order.
        unsafe { arch::load_plain_u64(self.counter_slot(counter)) }
    }

    #[inline(always)]
    fn set_counter(&self, counter: Counter, value: u64) {
        // SAFETY: as in `counter`.
        unsafe { arch::store_plain_u64(self.counter_slot(counter), value) }
    }

    /// The pad offset of this program's `kind` word written by `source`, in any rank's pad.
    #[inline(always)]
    fn signal(&self, kind: Signal, source: u32) -> u64 {
        signal_offset(kind, self.ctx.world_size, self.grid.block, source)
    }

    /// The offset in a pad of the inbox slot of this program for `source`'s rounds.
    #[inline(always)]
    fn inbox_slot(&self, source: u32) -> u64 {
        let world = self.ctx.world_size as usize;
        let slot = self.grid.block as usize * world + source as usize;
        (inbox_offset(world) + slot * inbox_slot_bytes(world, self.grid.blocks as usize)) as u64
    }

    #[inline(always)]
    fn abort_word(&self) -> *mut u32 {
        self.ctx.abort_flag as *mut u32
    }

    /// `Err` on every thread when the window was already aborted (looked at by thread 0).
    #[inline(always)]
    fn refuse_if_aborted(&self) -> Result<(), Aborted> {
        let aborted = arch::thread_idx_x() == 0
            // SAFETY: the abort word of a host-built context, accessed atomically.
            && unsafe { arch::load_acquire_sys_u32(self.abort_word()) } != 0;
        if arch::sync_threads_or(aborted) {
            Err(Aborted)
        } else {
            Ok(())
        }
    }

    /// Thread 0 waits until the `kind` word of `source` reaches `target` (wrap-safe), the abort
    /// word is raised, or the window's timeout passes (then it raises the abort word naming
    /// `source`).
    fn wait_one(&self, kind: Signal, source: u32, target: u64) -> bool {
        let start = arch::global_timer_ns();
        let address = self.signal(kind, source);
        let mut polls: u32 = 0;
        loop {
            // SAFETY: a signal word of this rank's pad.
            if unsafe { self.engine.signal_reached(self.ctx, address, target) } {
                return true;
            }
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(POLLS_PER_CHECK) {
                if polls.is_multiple_of(POLLS_PER_ABORT_LOOK)
                    // SAFETY: as in `refuse_if_aborted`.
                    && unsafe { arch::load_acquire_sys_u32(self.abort_word()) } != 0
                {
                    return false;
                }
                if arch::global_timer_ns().wrapping_sub(start) > self.ctx.timeout_ns {
                    // SAFETY: this rank's abort word.
                    unsafe {
                        raise_timeout(self.abort_word(), abort_timed_out_waiting_for(source))
                    };
                    return false;
                }
                arch::nanosleep(if polls >= PARK_AFTER_POLLS {
                    20_000
                } else {
                    100
                });
            }
        }
    }

    /// Every thread returns once the `kind` word of every peer reached `target` (then what
    /// the peers put before those signals is visible to every thread), or `Err` on every
    /// thread.
    fn wait_all(&self, kind: Signal, target: u64) -> Result<(), Aborted> {
        let mut failed = false;
        if arch::thread_idx_x() == 0 {
            failed = !self.peers().all(|s| self.wait_one(kind, s, target));
            // The thread that saw the signals orders them before the block barrier that
            // releases the others.
            arch::fence_acq_rel_sys();
        }
        if arch::sync_threads_or(failed) {
            return Err(Aborted);
        }
        arch::fence_acq_rel_sys();
        Ok(())
    }

    /// Complete this block's puts (every thread); `Err` on every thread when the engine gave
    /// up first (then the abort word is raised: a timeout naming no peer).
    #[inline(always)]
    fn quiet(&self) -> Result<(), Aborted> {
        // SAFETY: device code of the engine's job (the context is an engine context).
        let completed = unsafe { self.engine.quiet(self.ctx) };
        if !arch::sync_threads_or(!completed) {
            return Ok(());
        }
        if arch::thread_idx_x() == 0 {
            // SAFETY: this rank's abort word.
            unsafe { raise_timeout(self.abort_word(), ABORT_TIMED_OUT) };
        }
        Err(Aborted)
    }

    /// Program `p` of every rank meets here: returns once program `p` of every peer called it.
    /// What this program put or stored before is complete and visible to those peers' program
    /// `p` after theirs.
    pub fn barrier(&self) -> Result<(), Aborted> {
        self.refuse_if_aborted()?;
        self.quiet()?;
        let target = self.counter(Counter::Ready).wrapping_add(1);
        if arch::thread_idx_x() == 0 {
            arch::fence_acq_rel_sys();
            for peer in self.peers() {
                // SAFETY: this program's Ready word in the peer's pad (symmetric).
                unsafe {
                    self.engine.signal_add(
                        self.ctx,
                        self.signal(Signal::Ready, self.ctx.rank),
                        peer,
                    )
                };
            }
        }
        self.wait_all(Signal::Ready, target)?;
        if arch::thread_idx_x() == 0 {
            self.set_counter(Counter::Ready, target);
        }
        arch::sync_threads();
        Ok(())
    }

    /// All-gather of `n_bytes` from `send` to `recv + rank * n_bytes` (window offsets, checked
    /// by the caller; `in_place` when `send` is this rank's segment). This program moves its
    /// part of the bytes.
    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        n_bytes: u64,
        in_place: bool,
    ) -> Result<(), Aborted> {
        // Every peer is in this call: its receive range no longer holds anything it still reads.
        self.barrier()?;
        let (lo, hi) = block_range(n_bytes, self.grid.block, self.grid.blocks);
        let me = self.ctx.rank;
        let segment = recv + me as u64 * n_bytes;
        let signal = self.signal(Signal::Gather, me);
        for peer in self.peers() {
            if hi > lo {
                // SAFETY: both ranges lie in the window (checked by the caller).
                unsafe {
                    self.engine.put_with_signal(
                        self.ctx,
                        Place::Data(segment + lo),
                        send + lo,
                        hi - lo,
                        signal,
                        peer,
                    )
                };
            } else if arch::thread_idx_x() == 0 {
                // SAFETY: this program's Gather word in the peer's pad.
                unsafe { self.engine.signal_add(self.ctx, signal, peer) };
            }
        }
        if !in_place {
            let from = (self.ctx.local_base + send) as *const u8;
            let to = (self.ctx.local_base + segment) as *mut u8;
            let mut i = lo + arch::thread_idx_x() as u64;
            while i < hi {
                // SAFETY: both bytes lie in this rank's window; the ranges do not overlap
                // (checked by the caller).
                unsafe { to.add(i as usize).write(from.add(i as usize).read()) };
                i += arch::block_dim_x() as u64;
            }
        }
        let target = self.counter(Counter::Gather).wrapping_add(1);
        let arrived = self.wait_all(Signal::Gather, target);
        // The puts read this rank's send bytes, which the caller may reuse once the call
        // returns, failed or not.
        let quieted = self.quiet();
        arrived?;
        quieted?;
        if arch::thread_idx_x() == 0 {
            self.set_counter(Counter::Gather, target);
        }
        arch::sync_threads();
        Ok(())
    }

    /// In-place all-reduce of `count` elements at window offset `offset` (checked and aligned
    /// by the caller). This program reduces its part of the elements in rounds of one inbox
    /// slot: it puts each round into every peer's inbox slot for this rank, waits for every
    /// peer's round in its own inbox, reduces in rank order (the order of the native one-shot
    /// kernel, so both give the same bits) and tells each peer its slot is free.
    pub fn all_reduce<T: Element, O: ReduceOp>(
        &self,
        offset: u64,
        count: u64,
    ) -> Result<(), Aborted> {
        self.barrier()?;
        let (lo, hi) = block_range(count, self.grid.block, self.grid.blocks);
        let size = core::mem::size_of::<T>() as u64;
        let world = self.ctx.world_size;
        let me = self.ctx.rank;
        let per_round = inbox_slot_bytes(world as usize, self.grid.blocks as usize) as u64 / size;
        let rounds = (hi - lo).div_ceil(per_round.max(1));
        let done = self.counter(Counter::Reduce);
        let data = self.ctx.local_base + offset;
        let signal = self.signal(Signal::Reduce, me);
        let own_slot = self.inbox_slot(me);
        for round in 0..rounds {
            let number = done.wrapping_add(round + 1);
            let first = lo + round * per_round;
            let elements = Ord::min(per_round, hi - first);
            for peer in self.peers() {
                let busy = arch::thread_idx_x() == 0
                    && !self.wait_one(Signal::Free, peer, number.wrapping_sub(1));
                if arch::sync_threads_or(busy) {
                    // Puts of this round to earlier peers may still read the elements.
                    let _ = self.quiet();
                    return Err(Aborted);
                }
                // SAFETY: the source lies in this rank's window (checked by the caller); the
                // slot lies in the peer's pad, which it has consumed (its Free word reached
                // the previous round).
                unsafe {
                    self.engine.put_with_signal(
                        self.ctx,
                        Place::Pad(own_slot),
                        offset + first * size,
                        elements * size,
                        signal,
                        peer,
                    )
                };
            }
            let arrived = self.wait_all(Signal::Reduce, number);
            // The elements are overwritten below, or reused by the caller after a failure: the
            // puts reading them must be complete.
            let quieted = self.quiet();
            arrived?;
            quieted?;
            let mut i = arch::thread_idx_x() as u64;
            while i < elements {
                let value = |rank: u32| -> T {
                    let address = if rank == me {
                        data + (first + i) * size
                    } else {
                        self.pad_local + self.inbox_slot(rank) + i * size
                    };
                    // SAFETY: an element of this rank's window or of a landed inbox slot
                    // (aligned: window offsets are checked, slots are 16-byte aligned).
                    unsafe { (address as *const T).read() }
                };
                let mut acc = value(0).widen();
                for rank in 1..world {
                    acc = O::combine(acc, value(rank).widen());
                }
                let result = T::narrow(O::finish(acc, world));
                // SAFETY: an element of this rank's window, read above by this thread only.
                unsafe { ((data + (first + i) * size) as *mut T).write(result) };
                i += arch::block_dim_x() as u64;
            }
            arch::sync_threads();
            if arch::thread_idx_x() == 0 {
                arch::fence_acq_rel_sys();
                for peer in self.peers() {
                    // SAFETY: this rank's Free word in the peer's pad.
                    unsafe {
                        self.engine
                            .signal_add(self.ctx, self.signal(Signal::Free, me), peer)
                    };
                }
            }
        }
        if arch::thread_idx_x() == 0 {
            self.set_counter(Counter::Reduce, done.wrapping_add(rounds));
        }
        arch::sync_threads();
        Ok(())
    }
}
