//! Barrier frames: a window's peers are reachable only between a cross-rank barrier that opens
//! a [`Frame`] and one that closes it, and the frame is lent to a closure between the two.

use super::{Block, Element, Lane, Peer, Span, Varying, Win};
use crate::arch;
use crate::context::SymmContext;
use crate::symmetric::raise_refusal;
use crate::sync::abort::{ABORT_KERNEL_BLOCKS_DIFFER, ABORT_KERNEL_CALLS_DIFFER};
use crate::sync::barrier::{Aborted, CrossRankBarrier};
use crate::sync::grid_barrier::grid_sync;
use core::marker::PhantomData;
use core::ops::Deref;

/// This block's barrier slot of an open window of elements of `T` (branded `'w`): the epochs
/// the block's frames and in-kernel collectives on the window count, shared with symm's
/// launched kernels on it. Neither `Copy` nor `Clone`: a frame borrows it while open, and an
/// in-kernel collective borrows it, so the two cannot interleave.
pub struct Slot<'w, T: Element> {
    ctx: &'w SymmContext,
    block: u32,
    brand: PhantomData<fn(&'w ()) -> &'w T>,
    _per_thread: PhantomData<*mut ()>,
}

impl<'w, T: Element> Slot<'w, T> {
    /// Block `block`'s slot of the window `ctx` (checked by `Block::window`: a native context
    /// within the kernels' limits, and `block` below the pad's block count).
    #[inline(always)]
    pub(super) fn new(ctx: &'w SymmContext, block: u32) -> Self {
        Slot {
            ctx,
            block,
            brand: PhantomData,
            _per_thread: PhantomData,
        }
    }

    /// The window's context and the block index (for the in-kernel collectives).
    #[inline(always)]
    pub(super) fn parts(&mut self) -> (&'w SymmContext, u32) {
        (self.ctx, self.block)
    }

    /// Pass the window's grid barrier: every block of this rank's launch meets here, about to
    /// make `call` (the blocks compare it).
    #[inline(always)]
    pub(super) fn grid_sync(&mut self, block: &Block, call: Call) -> Result<(), Aborted> {
        grid_sync_on(self.ctx, block, call)
    }

    /// Run `body` inside a barrier frame on the window: a barrier that every block of every
    /// rank passes opens it, so each block sees what every block of every rank wrote before;
    /// another closes it when `body` returns, so every block of every rank has finished its
    /// accesses to the windows before any goes on. Inside, [`Frame::per_thread`] reaches every
    /// rank's window. The frame is lent to `body`, never owned: it cannot be dropped, forgotten
    /// or kept past its closing barrier. Every block of every rank opens the same frames.
    ///
    /// Each of these barriers is the window's grid barrier (the blocks of this rank's launch)
    /// followed by the cross-rank barrier of this block's index (block `b` of every rank).
    ///
    /// `Err` when a peer or a block did not arrive within the window's timeout, or the window
    /// already failed (its abort word is then raised and the host reports the window failed):
    /// at the opening (`body` does not run), at a [`Frame::sync`], or at the closing.
    #[inline(always)]
    pub fn frame<R>(
        &mut self,
        block: &mut Block,
        body: impl for<'f> FnOnce(&mut Block, &mut Frame<'f, 'w, T>) -> R,
    ) -> Result<R, Aborted> {
        let opening = Call::new::<T>(Call::FRAME_OPEN, block);
        self.grid_sync(block, opening)?;
        // SAFETY: the context is host-built and within the kernels' limits, and this block's
        // index is below the pad's block count (both checked when the window was opened); every
        // thread of the block makes the same sequence of barrier steps (each takes the block's
        // token, and control flow outside lanes is uniform).
        let (barrier, agreed) = unsafe { CrossRankBarrier::open(self.ctx, self.block) }
            .start_agreeing(opening.word())?;
        refuse_unless(self.ctx, agreed)?;
        let mut frame = Frame {
            barrier,
            failed: false,
            brand: PhantomData,
            _per_thread: PhantomData,
        };
        let value = body(block, &mut frame);
        if frame.failed {
            return Err(Aborted);
        }
        let closing = Call::new::<T>(Call::FRAME_CLOSE, block);
        grid_sync_on(self.ctx, block, closing)?;
        refuse_unless(self.ctx, frame.barrier.sync_agreeing(closing.word())?)?;
        frame.barrier.finish();
        Ok(value)
    }
}

/// An open barrier frame on a window of elements of `T` (branded `'w`), lent to the body of
/// [`Slot::frame`] (`'f`): [`Frame::per_thread`] reaches every rank's window, [`Frame::sync`]
/// passes a barrier inside it.
pub struct Frame<'f, 'w, T: Element> {
    barrier: CrossRankBarrier<'w>,
    failed: bool,
    brand: PhantomData<(Invariant<'f>, Invariant<'w>, T)>,
    _per_thread: PhantomData<*mut ()>,
}

impl<'w, T: Element> Frame<'_, 'w, T> {
    /// Pass a barrier of every block of every rank inside the frame (as the frame's opening
    /// does): what any block of any rank wrote before it is visible to every block of every
    /// rank after it. `Err` as [`Slot::frame`]; the frame has then failed (later syncs
    /// return `Err` at once, and so does [`Slot::frame`]).
    #[inline(always)]
    pub fn sync(&mut self, block: &mut Block) -> Result<(), Aborted> {
        if self.failed {
            return Err(Aborted);
        }
        let sync = Call::new::<T>(Call::FRAME_SYNC, block);
        let ctx = self.barrier.context();
        let passed = grid_sync_on(ctx, block, sync)
            .and_then(|()| self.barrier.sync_agreeing(sync.word()))
            .and_then(|agreed| refuse_unless(ctx, agreed));
        self.failed = passed.is_err();
        passed
    }

    /// Run `work` on every thread of the block with `args`, as [`Block::per_thread`] does, with
    /// a [`PeerLane`]: every rank's window is reachable. `Err` without running it once a
    /// [`Frame::sync`] of the frame failed (peers may have left the frame).
    #[inline(always)]
    pub fn per_thread<A: Send, R: Send>(
        &self,
        block: &Block,
        args: A,
        work: fn(PeerLane<'_, 'w>, A) -> R,
    ) -> Result<Varying<R>, Aborted> {
        if self.failed {
            return Err(Aborted);
        }
        let lane = PeerLane {
            lane: Lane::of(block),
            brand: PhantomData,
        };
        Ok(Varying(work(lane, args)))
    }
}

/// Pass the grid barrier of the window `ctx` (checked when it was opened) with the calling
/// block, about to make `call`: `Err` (the window failed, its abort word saying the blocks'
/// calls differ) when they differ.
#[inline(always)]
pub(super) fn grid_sync_on(ctx: &SymmContext, block: &Block, call: Call) -> Result<(), Aborted> {
    // SAFETY: the context was checked when the window was opened (host-built, native, within
    // the kernels' limits); the block count is the launch's (a 1-D grid of at most
    // `MAX_BLOCKS` blocks, checked at opening, whose blocks the host launches resident); every
    // thread of the block makes the same barrier steps (each takes the block's token).
    let agreed = unsafe { grid_sync(ctx, block.blocks(), block.index(), call.word()) }?;
    if agreed {
        return Ok(());
    }
    refuse(ctx, ABORT_KERNEL_BLOCKS_DIFFER)
}

/// What block `b` of a rank is about to do at a barrier of a user's kernel, folded into the word
/// that block `b` of every rank compares at that barrier
/// ([`CrossRankBarrier::sync_agreeing`]): the call's kind, the window's element type, the
/// grid's blocks and threads per block, and the call's spans and operator. FNV-1a over those words, folded to 32 bits.
#[derive(Clone, Copy)]
pub(super) struct Call(u64);

impl Call {
    /// A frame's opening barrier.
    pub(super) const FRAME_OPEN: u32 = 1;
    /// A [`Frame::sync`].
    pub(super) const FRAME_SYNC: u32 = 2;
    /// A frame's closing barrier.
    pub(super) const FRAME_CLOSE: u32 = 3;
    /// [`super::barrier`].
    pub(super) const BARRIER: u32 = 4;
    /// [`super::all_reduce`].
    pub(super) const ALL_REDUCE: u32 = 5;
    /// [`super::all_gather`].
    pub(super) const ALL_GATHER: u32 = 6;
    /// [`Slot::for_each_tile`].
    pub(super) const TILES: u32 = 7;

    /// The call `kind` on a window of `T`, from a grid of `block.blocks()` blocks of
    /// `block.threads()` threads (symm's collective bodies share their spans out by both).
    #[inline(always)]
    pub(super) fn new<T: Element>(kind: u32, block: &Block) -> Call {
        Call(0xcbf2_9ce4_8422_2325)
            .with(kind as u64)
            .with(T::DTYPE as u64)
            .with(block.blocks() as u64)
            .with(block.threads() as u64)
    }

    /// The call with one more word of its arguments.
    #[inline(always)]
    pub(super) fn with(self, word: u64) -> Call {
        let mut hash = self.0;
        let mut rest = word;
        for _ in 0..8 {
            hash = (hash ^ (rest & 0xFF)).wrapping_mul(0x0100_0000_01b3);
            rest >>= 8;
        }
        Call(hash)
    }

    /// The word ranks compare.
    #[inline(always)]
    pub(super) fn word(self) -> u32 {
        (self.0 ^ (self.0 >> 32)) as u32
    }
}

/// `Ok` when block `b` of every rank made the same call at the barrier just passed; otherwise
/// fail the window (its abort word says the ranks' calls differ; its out-of-step mark is set)
/// and `Err`, on every rank alike.
#[inline(always)]
pub(super) fn refuse_unless(ctx: &SymmContext, agreed: bool) -> Result<(), Aborted> {
    if agreed {
        return Ok(());
    }
    refuse(ctx, ABORT_KERNEL_CALLS_DIFFER)
}

/// Fail the window `ctx` with the abort word `word` (its out-of-step mark is set) and `Err`.
#[inline(always)]
fn refuse(ctx: &SymmContext, word: u32) -> Result<(), Aborted> {
    if arch::thread_idx_x() == 0 {
        // SAFETY: the context was checked when the window was opened.
        unsafe { raise_refusal(ctx as *const SymmContext as u64, word) };
    }
    Err(Aborted)
}

/// A marker invariant in `'a` (a brand cannot be shortened or lengthened).
type Invariant<'a> = fn(&'a ()) -> &'a ();

/// A thread inside a frame on the window branded `'w`: a [`Lane`] that also reaches every rank's
/// window.
pub struct PeerLane<'a, 'w> {
    lane: Lane<'a>,
    brand: PhantomData<fn(&'w ()) -> &'w ()>,
}

impl<'a> Deref for PeerLane<'a, '_> {
    type Target = Lane<'a>;

    fn deref(&self) -> &Lane<'a> {
        &self.lane
    }
}

impl<'w> PeerLane<'_, 'w> {
    /// Element `index` of `span` in `peer`'s window, or `None` past the span.
    #[inline(always)]
    pub fn read_peer<T: Element>(
        &self,
        win: Win<'w, T>,
        peer: Peer<'w>,
        span: Span<'w, T>,
        index: u64,
    ) -> Option<T> {
        win.read(peer, span, index)
    }

    /// Store `value` as element `index` of `span` in `peer`'s window: `false` (nothing stored)
    /// past the span.
    #[inline(always)]
    pub fn write_peer<T: Element>(
        &self,
        win: Win<'w, T>,
        peer: Peer<'w>,
        span: Span<'w, T>,
        index: u64,
        value: T,
    ) -> bool {
        win.write(peer, span, index, value)
    }
}
