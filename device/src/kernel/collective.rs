//! symm's collectives inside a user's kernel, typed by element and operator: the same kernel
//! bodies symm launches, on a span of an open window, sharing the window's barrier epochs.

use super::frame::{Call, refuse_unless};
use super::{Block, Element, ReduceOp, Slot, Span, Win};
use crate::context::SymmContext;
use crate::symmetric::all_gather::all_gather as all_gather_body;
use crate::symmetric::all_reduce::one_shot_all_reduce;
use crate::symmetric::{Batch, FLAG_IN_PLACE, Grid, KernelStatus, TaskArgs, raise_invalid_launch};
use crate::sync::barrier::{Aborted, CrossRankBarrier};

/// The one task of an in-kernel collective on the window `ctx`.
#[inline(always)]
fn task(ctx: &SymmContext, send_offset: u64, recv_offset: u64, count: u64, flags: u32) -> TaskArgs {
    let context = ctx as *const SymmContext as u64;
    TaskArgs::in_one_window(context, send_offset, recv_offset, count, flags)
}

/// The collective's result for a kernel body's status.
#[inline(always)]
fn outcome(status: KernelStatus) -> Result<(), Aborted> {
    match status {
        KernelStatus::Completed => Ok(()),
        KernelStatus::Aborted | KernelStatus::InvalidLaunch => Err(Aborted),
    }
}

/// All-reduce `span` of the window in place with `op` (`O`, a [`ReduceOp`]: [`super::Sum`],
/// [`super::Prod`], [`super::Max`], [`super::Min`], [`super::Avg`]), across ranks: the blocks
/// of a grid share the span out, so every block of every rank calls it, with the same span.
/// Symm's one-shot all-reduce, the same as a launched `symmAllReduce` of the span, between two
/// grid barriers: it reads what any block wrote before it, and what any block reads after it
/// is the result. `Err` when a peer or a block did not arrive within the window's timeout or
/// the window already failed (its abort word is raised; the host reports it).
#[inline(always)]
pub fn all_reduce<'w, T: Element, O: ReduceOp>(
    block: &mut Block,
    win: Win<'w, T>,
    slot: &mut Slot<'w, T>,
    span: Span<'w, T>,
    op: O,
) -> Result<(), Aborted> {
    let _ = op;
    let (ctx, index) = slot.parts();
    let offset = span.start() * size_of::<T>() as u64;
    let _ = win;
    // SAFETY: the context was checked when the window was opened (host-built, native, within
    // the kernels' limits), and outlives the window's brand.
    let batch = unsafe { Batch::open_one(task(ctx, offset, offset, span.len(), FLAG_IN_PLACE)) };
    let grid = Grid {
        block: index,
        blocks: block.blocks(),
    };
    let call = Call::new::<T>(Call::ALL_REDUCE, block)
        .with(O::OP as u64)
        .with(span.start())
        .with(span.len());
    slot.grid_sync(block, call)?;
    agree(ctx, index, call)?;
    // SAFETY: the span lies in the window on every rank and is aligned for `T` (every base is
    // 16-byte aligned, checked at opening); every thread of the block calls with the same
    // span (uniform control flow outside lanes); the slot is borrowed, so no frame of this
    // block is open on the window.
    outcome(unsafe { one_shot_all_reduce::<T, O>(&batch, grid) })?;
    slot.grid_sync(block, call)
}

/// All-gather: this rank's `send` lands at element `rank · send.len()` of `recv` on every rank
/// (`recv` holds `world · send.len()` elements; in place when `send` is exactly this rank's part
/// of `recv`, else the two must not overlap). Every block of every rank calls it, with the same
/// spans. `Err` as [`all_reduce`]; spans of the wrong shape also fail the window (its abort
/// word is raised, so the peers' waits end) and return `Err`.
#[inline(always)]
pub fn all_gather<'w, T: Element>(
    block: &mut Block,
    win: Win<'w, T>,
    slot: &mut Slot<'w, T>,
    send: Span<'w, T>,
    recv: Span<'w, T>,
) -> Result<(), Aborted> {
    let (ctx, index) = slot.parts();
    let world = win.world() as u64;
    let own = recv.sub(win.rank() as u64 * send.len()..(win.rank() as u64 + 1) * send.len());
    let in_place = own.is_some_and(|own| own.start() == send.start());
    let disjoint =
        send.start() + send.len() <= recv.start() || recv.start() + recv.len() <= send.start();
    if send.len().checked_mul(world) != Some(recv.len())
        || !(in_place || disjoint || send.is_empty())
    {
        if crate::arch::thread_idx_x() == 0 {
            // SAFETY: the context was checked when the window was opened.
            unsafe { raise_invalid_launch(ctx as *const SymmContext as u64) };
        }
        return Err(Aborted);
    }
    let size = size_of::<T>() as u64;
    let flags = if in_place { FLAG_IN_PLACE } else { 0 };
    // SAFETY: as in `all_reduce`.
    let batch = unsafe {
        Batch::open_one(task(
            ctx,
            send.start() * size,
            recv.start() * size,
            send.len() * size,
            flags,
        ))
    };
    let grid = Grid {
        block: index,
        blocks: block.blocks(),
    };
    let call = Call::new::<T>(Call::ALL_GATHER, block)
        .with(send.start())
        .with(send.len())
        .with(recv.start())
        .with(recv.len());
    slot.grid_sync(block, call)?;
    agree(ctx, index, call)?;
    // SAFETY: both spans lie in the window (on every rank), checked for shape and overlap
    // above; every thread of the block calls with the same spans; no frame is open (the slot
    // is borrowed).
    outcome(unsafe { all_gather_body(&batch, grid) })?;
    slot.grid_sync(block, call)
}

/// A barrier of every block of every rank (the window's grid barrier, then the cross-rank
/// barrier of this block's index): what any block of any rank wrote before it is visible to
/// every block of every rank after it.
/// `Err` as [`all_reduce`].
#[inline(always)]
pub fn barrier<T: Element>(block: &mut Block, slot: &mut Slot<'_, T>) -> Result<(), Aborted> {
    let call = Call::new::<T>(Call::BARRIER, block);
    slot.grid_sync(block, call)?;
    let (ctx, index) = slot.parts();
    agree(ctx, index, call)
}

/// Pass a cross-rank barrier of block `index` on the window `ctx` at which block `index` of every
/// rank compares its `call`: `Err` (the window failed, on every rank alike) when they differ.
#[inline(always)]
fn agree(ctx: &SymmContext, index: u32, call: Call) -> Result<(), Aborted> {
    // SAFETY: as in `Slot::frame`: a checked context, a block index within the pad, and every
    // thread of the block making the same barrier steps.
    let (barrier, agreed) =
        unsafe { CrossRankBarrier::open(ctx, index) }.start_agreeing(call.word())?;
    refuse_unless(ctx, agreed)?;
    barrier.finish();
    Ok(())
}
