//! The grid barrier: every block of one rank's launch meets every other block of that launch,
//! on two words of the window's signal pad (this rank's own): an arrival count and a
//! generation.
//!
//! Thread 0 of each block reads the generation `g`, then adds one to the arrival count
//! (acquire-release, system scope). The block that brings the count to the grid's block count
//! resets the count to zero and stores `g + 1` into the generation (release); the others wait
//! (acquire, bounded) until the generation reaches `g + 1`. Once a barrier completes, the count
//! is zero again, so launches of different grid sizes take turns on one window with no reset;
//! the generation only grows, and a block reads it before arriving, so it cannot have moved
//! past `g + 1` by then. A barrier that fails (a block timed out, the abort word was raised)
//! may leave the count part-way: the window is then marked out of step for good, and every
//! later grid barrier on it returns at once, before arriving.
//!
//! With the cross-rank barrier of each block index ([`super::barrier`]) this makes a barrier
//! of every block of every rank: block `c` of rank `p` reaches the grid barrier after its
//! accesses, block `d` of rank `p` passes it only after that, and block `d` of every rank
//! passes the next cross-rank barrier only after block `d` of rank `p` announced it.
//!
//! Each block also says what it is about to do (a descriptor, the same on all of its threads):
//! thread 0 writes it into this rank's pad, in the slot of its block and of the parity of
//! `g + 1`, before arriving; after the barrier, thread `t` reads block `t`'s slot and the block
//! learns whether every block passed with the same descriptor. A block writes the slot of that
//! parity again only for generation `g + 3`, which needs every block's arrival at `g + 2`, so
//! no read of `g + 1` races with it.
//!
//! Every block of the launch must be resident at once (the host refuses a launch of a user's
//! kernel that would not be), and every block must make the same sequence of grid barriers. A
//! wait that times out raises the abort word; a barrier of a window out of step returns at
//! once; either way the window is marked out of step and every block gets [`Aborted`].

use super::abort::{ABORT_GRID_TIMED_OUT, raise_timeout};
use super::barrier::{Aborted, mark_out_of_step};
use super::signal_pad::{grid_barrier_slots, grid_descriptor_slot, out_of_step_slot};
use super::wait::{WaitOutcome, wait_until_reached};
use crate::arch;
use crate::context::SymmContext;

/// Wait until every block of this rank's launch reached this point: what any of them wrote
/// before is visible to all of them after it (and, through a cross-rank barrier that follows,
/// to every rank). Every thread of the block calls it, with the block's `descriptor` of what
/// it is about to do: `Ok(true)` when every block passed with the same descriptor, `Ok(false)`
/// on every block alike otherwise.
///
/// `Err` on every thread when the window is out of step, this rank's abort word is raised, or
/// a block did not arrive within the window's timeout.
///
/// # Safety
/// `ctx` is a context built by the host whose signal-pad tables are valid; `blocks` is the
/// launch's block count (at most `MAX_BLOCKS`), every block of which is resident and makes the
/// same sequence of grid barriers on the window; `block` is the calling block's index; every
/// thread of the block calls this.
#[inline(never)]
pub unsafe fn grid_sync(
    ctx: &SymmContext,
    blocks: u32,
    block: u32,
    descriptor: u32,
) -> Result<bool, Aborted> {
    // SAFETY: rank < world_size and the table is valid (caller's contract).
    let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
    let (arrivals, generation) = grid_barrier_slots(own_pad);
    let abort = ctx.abort_flag as *mut u32;
    let leader = arch::thread_idx_x() == 0;
    let marked = leader
        // SAFETY: the mark lies inside this rank's pad and is accessed atomically.
        && unsafe { arch::load_relaxed_sys_u32(out_of_step_slot(own_pad)) } != 0;
    // Also orders the block's earlier accesses before the leader's arrival.
    if arch::sync_threads_or(marked) {
        return Err(Aborted);
    }
    let mut failed = false;
    if leader {
        // SAFETY: both words lie inside this rank's pad and are accessed atomically; the
        // generation is read before arriving (program order before the acquire-release add).
        unsafe {
            let current = arch::load_relaxed_sys_u32(generation);
            let next = current.wrapping_add(1);
            arch::store_plain_u32(grid_descriptor_slot(own_pad, next, block), descriptor);
            if arch::atomic_add_acq_rel_sys_u32(arrivals, 1).wrapping_add(1) == blocks {
                arch::store_release_sys_u32(arrivals, 0);
                arch::store_release_sys_u32(generation, next);
            } else {
                match wait_until_reached(generation, next, abort, ctx.timeout_ns) {
                    WaitOutcome::Reached => {}
                    WaitOutcome::TimedOut => {
                        raise_timeout(abort, ABORT_GRID_TIMED_OUT);
                        failed = true;
                    }
                    WaitOutcome::Aborted => failed = true,
                }
            }
        }
    }
    if arch::sync_threads_or(failed) {
        // SAFETY: the pad is this rank's.
        unsafe { mark_out_of_step(own_pad) };
        return Err(Aborted);
    }
    // The generation this barrier reached, as every thread sees it after the block barrier.
    // SAFETY: the word lies inside this rank's pad and is accessed atomically.
    let reached = unsafe { arch::load_relaxed_sys_u32(generation) };
    let mut differ = false;
    let mut other = arch::thread_idx_x();
    while other < blocks {
        // SAFETY: `other` < blocks <= MAX_BLOCKS; block `other` wrote its slot of this parity
        // before arriving, and writes it again only after this block arrives at the next grid
        // barrier.
        differ |= unsafe {
            arch::load_plain_u32(grid_descriptor_slot(own_pad, reached, other)) != descriptor
        };
        other += arch::block_dim_x();
    }
    Ok(!arch::sync_threads_or(differ))
}
