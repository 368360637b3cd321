//! Barrier frames: a window's peers are reachable only between a cross-rank barrier that opens
//! a [`Frame`] and one that closes it, and the frame is lent to a closure between the two.

use super::{Block, Element, Lane, Peer, Span, Varying, Win};
use crate::context::SymmContext;
use crate::sync::barrier::{Aborted, CrossRankBarrier};
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

    /// Run `body` inside a barrier frame on the window: a cross-rank barrier that block `b` of
    /// every rank passes opens it (`b` this block's index), so each rank sees what the others
    /// wrote before; another closes it when `body` returns, so each rank has finished its
    /// accesses to the others' windows before any rank goes on. Inside, [`Frame::per_thread`]
    /// reaches every rank's window. The frame is lent to `body`, never owned: it cannot be
    /// dropped, forgotten or kept past its closing barrier.
    ///
    /// `Err` when a peer did not arrive within the window's timeout, or the window already
    /// failed (its abort word is then raised and the host reports the window failed): at the
    /// opening (`body` does not run), at a [`Frame::sync`], or at the closing.
    #[inline(always)]
    pub fn frame<R>(
        &mut self,
        block: &mut Block,
        body: impl for<'f> FnOnce(&mut Block, &mut Frame<'f, 'w, T>) -> R,
    ) -> Result<R, Aborted> {
        // SAFETY: the context is host-built and within the kernels' limits, and this block's
        // index is below the pad's block count (both checked when the window was opened); every
        // thread of the block makes the same sequence of barrier steps (each takes the block's
        // token, and control flow outside lanes is uniform).
        let barrier = unsafe { CrossRankBarrier::open(self.ctx, self.block) }.start()?;
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
        frame.barrier.sync()?;
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
    /// Pass a cross-rank barrier inside the frame: what each rank wrote before it is visible to
    /// every rank after it. `Err` as [`Slot::frame`]; the frame has then failed (later syncs
    /// return `Err` at once, and so does [`Slot::frame`]).
    #[inline(always)]
    pub fn sync(&mut self, block: &mut Block) -> Result<(), Aborted> {
        let _ = block;
        if self.failed {
            return Err(Aborted);
        }
        let passed = self.barrier.sync();
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
