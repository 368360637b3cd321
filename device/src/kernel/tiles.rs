//! Tiles shared out among the blocks of a launch by the Cluster Launch Control scheduler in
//! software (`scheduler::driver::for_each_tile` over a `SoftwareSource`), its state in the
//! window's signal pad.

use super::frame::Call;
use super::{Block, Element, Lane, Slot};
use crate::arch;
use crate::scheduler::driver::for_each_tile;
use crate::scheduler::policy::Greedy;
use crate::scheduler::source::{SLOTS, SoftwareSource};
pub use crate::scheduler::{BlockStats, TileId};
use crate::symmetric::raise_invalid_launch;
use crate::sync::barrier::Aborted;
use crate::sync::signal_pad::{MAX_TILES, TILE_SLOTS_PER_BLOCK, tile_state};

const _: () = assert!(SLOTS as usize == TILE_SLOTS_PER_BLOCK);

impl<'w, T: Element> Slot<'w, T> {
    /// Run `work` once for each of `tiles` tiles (at most [`Slot::MAX_TILES`]), shared out among
    /// the blocks of this rank's launch: block `b` first runs tile `b` (when `b < tiles`), then
    /// every block steals tiles (from the last one down) until none is left, so a block that
    /// started late or got quick tiles does not hold the others up. Every thread of the block
    /// runs `work` for each of the block's tiles, with its [`Lane`] (this rank's window only:
    /// the tiles a block gets differ from rank to rank, so no peer is reachable), the tile and
    /// `args`. Returns what this block ran.
    ///
    /// Every block of the launch calls it, with the same `tiles`. A grid barrier of the
    /// launch's blocks comes before (the tiles see what any block wrote before) and after (any
    /// block sees every tile's writes). Each tile runs exactly once: blocks keep stealing
    /// while tiles are left (the scheduler's stopping policies are for launches of one block
    /// per tile, whose unclaimed tiles run on their own blocks).
    ///
    /// The tiles come from the software scheduler, also on GPUs with Cluster Launch Control:
    /// the hardware cancels blocks that have not started, and a canceled block could not take
    /// its part in the window's barriers. The scheduler's state lives in the window's signal
    /// pad (one `for_each_tile` at a time per window).
    ///
    /// `Err` when a block did not arrive at a grid barrier within the window's timeout or the
    /// window already failed; more than [`Slot::MAX_TILES`] tiles fail the window (its abort
    /// word is raised) and return `Err`.
    #[inline(always)]
    pub fn for_each_tile<A: Send + Copy>(
        &mut self,
        block: &mut Block,
        tiles: u32,
        args: A,
        work: fn(Lane<'_>, TileId, A),
    ) -> Result<BlockStats, Aborted> {
        let (ctx, _) = self.parts();
        if tiles as usize > MAX_TILES {
            if arch::thread_idx_x() == 0 {
                // SAFETY: the context was checked when the window was opened.
                unsafe { raise_invalid_launch(ctx as *const _ as u64) };
            }
            return Err(Aborted);
        }
        let call = Call::new::<T>(Call::TILES, block).with(tiles as u64);
        self.grid_sync(block, call)?;
        // SAFETY: rank < world_size and the pad table is valid (checked at opening).
        let state = tile_state(unsafe { ctx.peer_signal_pad(ctx.rank) });
        // SAFETY: the state lies in this rank's pad (`TILE_STATE_WORDS` words: room for
        // `MAX_TILES` claims and two slots per block index, and the grid has at most
        // `MAX_BLOCKS` blocks, checked at opening); it is zero when the window is registered and
        // only used here, between two grid barriers, so the last use finished on every block;
        // every thread of every block calls with the same `tiles`.
        let source = unsafe { SoftwareSource::with_claim_room(state, MAX_TILES as u32, tiles) };
        let stats = for_each_tile::<Greedy, _>(source, |tile| work(Lane::of(block), tile, args));
        self.grid_sync(block, call)?;
        if block.index() == 0 {
            // SAFETY: the state as above; every block finished this use (the grid barrier just
            // passed) and none starts the next before the next use's grid barrier, which block
            // 0 reaches after this; every thread of block 0 calls it.
            unsafe { SoftwareSource::renew_claims_before_wrap(state, MAX_TILES as u32) };
        }
        Ok(stats)
    }

    /// The most tiles one [`Slot::for_each_tile`] shares out.
    pub const MAX_TILES: u32 = MAX_TILES as u32;
}
