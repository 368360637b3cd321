//! Sources of stolen tiles. The wrapper ([`super::steal`]) calls these in the only valid order;
//! they are sealed so that no other code can drive them.

use super::TileId;
use crate::arch;

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// Where stolen tiles come from. Sealed: use it through [`super::steal::Steal`] and
/// [`super::driver::for_each_tile`].
pub trait Source: sealed::Sealed {
    /// Block-wide: the tile this block runs first (its own), or `None` when another block
    /// already took it (the block then exits).
    fn first_tile(&mut self) -> Option<TileId>;
    /// Block-wide, before a request: ordering (fences, barriers) the hardware needs.
    fn before_request(&mut self);
    /// Issue a request into `slot`; `leader` is `true` on exactly one thread of the block.
    ///
    /// # Safety
    /// `slot` is free (its previous response, if any, was decoded); called by every thread of
    /// the block with the same `slot`; no failed response was observed by this block.
    unsafe fn issue(&mut self, slot: u32, leader: bool);
    /// Block-wide: wait until `slot`'s response is complete.
    ///
    /// # Safety
    /// A request was issued into `slot` and not yet waited for.
    unsafe fn wait(&mut self, slot: u32);
    /// Block-wide: decode `slot`'s response: the stolen tile, or `None` on failure. Issues the
    /// fence that releases the slot.
    ///
    /// # Safety
    /// `slot` was waited for and not yet decoded.
    unsafe fn decode(&mut self, slot: u32) -> Option<TileId>;
    /// Block-wide, once, when the block stops stealing.
    fn finish(&mut self);
}

/// Slots (requests that may be in flight at once).
pub const SLOTS: u32 = 2;

/// Cluster Launch Control in software, for every target (and the host): the grid is launched
/// with one block per tile, as with CLC. A block first claims its own tile (an atomic
/// exchange on the tile's claim word); if a running block already stole it, the block exits at
/// once — the software counterpart of a canceled launch. A request takes tickets from a global
/// counter, ticket `k` naming tile `tiles − 1 − k` (the blocks least likely to have started),
/// until a claim succeeds or no tile is left. Claims carry the launch's epoch, and the last
/// block to finish advances the epoch and resets the counter, so the next launch (or CUDA-graph
/// replay) starts over with no reset kernel.
///
/// State layout (`u32`s): `[ticket, finished, epoch, claims[tiles], slots[SLOTS × tiles]]`.
pub struct SoftwareSource {
    state: *mut u32,
    slots: *mut u32,
    tiles: u32,
    epoch: u32,
}

/// A response slot's value when the request failed.
const NO_TILE: u32 = u32::MAX;

impl sealed::Sealed for SoftwareSource {}

impl SoftwareSource {
    /// `u32`s of state a launch over `tiles` tiles needs (zero-initialized once).
    pub const fn state_words(tiles: u32) -> usize {
        3 + tiles as usize * (1 + SLOTS as usize)
    }

    /// A source over `tiles` tiles for the calling block.
    ///
    /// # Safety
    /// The grid has `tiles` blocks; `state` points to [`SoftwareSource::state_words`]`(tiles)`
    /// `u32`s of global memory, zero-initialized before the first launch and otherwise left as
    /// the last launch left them; every thread of every block calls this with the same
    /// arguments.
    pub unsafe fn new(state: *mut u32, tiles: u32) -> Self {
        // SAFETY: forwarded contract, with room for exactly `tiles` claims.
        unsafe { Self::with_claim_room(state, tiles, tiles) }
    }

    /// A source over `tiles` tiles for the calling block, in a state array laid out for up to
    /// `room` tiles (`[ticket, finished, epoch, claims[room], slots[SLOTS × blocks]]`), so that
    /// calls over different tile counts share one array. The grid's blocks need not match the
    /// tiles: block `b` first claims tile `b` (none when `b ≥ tiles`), and the tiles past the
    /// grid run only when stolen.
    ///
    /// # Safety
    /// `tiles <= room`; `state` points to `3 + room + SLOTS × grid blocks` `u32`s of global
    /// memory, zero-initialized before the first launch and otherwise left as the last use
    /// left them, which has finished on every block (every block of the last use finished its
    /// source before any block of this one starts); every thread of every block calls this
    /// with the same arguments.
    pub unsafe fn with_claim_room(state: *mut u32, room: u32, tiles: u32) -> Self {
        // SAFETY: inside the state array (caller's contract).
        unsafe {
            let epoch = arch::load_plain_u32(state.add(2)).wrapping_add(1);
            let slots = state.add(3 + room as usize + (SLOTS * arch::block_idx_x()) as usize);
            SoftwareSource {
                state,
                slots,
                tiles,
                epoch,
            }
        }
    }

    /// Block-wide, by one block, once every block finished its last use of the state array at
    /// `state` (laid out for `room` tiles, as [`SoftwareSource::with_claim_room`] lays it out)
    /// and before any block starts the next: when the next use's epoch would wrap around,
    /// clear every claim word and the epoch, so the next use starts at epoch 1 over clear
    /// claims. Claims are compared with the epoch for equality, and with tile counts that vary
    /// between uses a tile's word can keep an old epoch for as long as the epoch takes to come
    /// round again (2^32 uses): it would then read as claimed and its tile would never run.
    ///
    /// # Safety
    /// As for [`SoftwareSource::with_claim_room`]; no block uses the state meanwhile; every
    /// thread of the calling block calls this.
    pub unsafe fn renew_claims_before_wrap(state: *mut u32, room: u32) {
        // SAFETY: inside the state array; no block writes it meanwhile (caller's contract).
        if unsafe { arch::load_plain_u32(state.add(2)) } != u32::MAX {
            return;
        }
        let mut tile = arch::thread_idx_x();
        while tile < room {
            // SAFETY: claim word `tile` < `room` lies in the state array.
            unsafe { arch::store_plain_u32(state.add(3 + tile as usize), 0) };
            tile += arch::block_dim_x();
        }
        // Every thread has read the epoch before it is cleared.
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            // SAFETY: inside the state array.
            unsafe { arch::store_plain_u32(state.add(2), 0) };
        }
    }

    /// Claim `tile` for this launch; `false` if another block already did.
    ///
    /// # Safety
    /// `tile < tiles`.
    unsafe fn claim(&self, tile: u32) -> bool {
        // SAFETY: the claim word lies in the state array.
        unsafe {
            arch::atomic_exchange_gpu_u32(self.state.add(3 + tile as usize), self.epoch)
                != self.epoch
        }
    }
}

impl Source for SoftwareSource {
    fn first_tile(&mut self) -> Option<TileId> {
        let tile = arch::block_idx_x();
        let mine = arch::thread_idx_x() == 0 && tile < self.tiles && {
            // SAFETY: tile < tiles.
            unsafe { self.claim(tile) }
        };
        arch::sync_threads_or(mine).then_some(TileId(tile))
    }

    fn before_request(&mut self) {
        // Every thread has read the previous response of the slot before it is rewritten.
        arch::sync_threads();
    }

    unsafe fn issue(&mut self, slot: u32, leader: bool) {
        if !leader {
            return;
        }
        let mut found = NO_TILE;
        loop {
            // SAFETY: the ticket counter lies in the state array.
            let ticket = unsafe { arch::atomic_add_gpu_u32(self.state, 1) };
            if ticket >= self.tiles {
                break;
            }
            let tile = self.tiles - 1 - ticket;
            // SAFETY: tile < tiles.
            if unsafe { self.claim(tile) } {
                found = tile;
                break;
            }
        }
        // SAFETY: the slot lies in the state array.
        unsafe { arch::store_plain_u32(self.slots.add(slot as usize), found) };
    }

    unsafe fn wait(&mut self, _slot: u32) {
        // The leader's write of the response is visible to the block after the barrier.
        arch::sync_threads();
    }

    unsafe fn decode(&mut self, slot: u32) -> Option<TileId> {
        // SAFETY: the slot lies in the state array and was written before the barrier.
        let tile = unsafe { arch::load_plain_u32(self.slots.add(slot as usize)) };
        (tile != NO_TILE).then_some(TileId(tile))
    }

    fn finish(&mut self) {
        arch::sync_threads();
        if arch::thread_idx_x() == 0 {
            // SAFETY: the counters lie in the state array. The last block of the launch is the
            // last to touch them: it advances the epoch and resets the counters.
            unsafe {
                if arch::atomic_add_gpu_u32(self.state.add(1), 1) + 1 == arch::grid_dim_x() {
                    arch::store_release_sys_u32(self.state.add(2), self.epoch);
                    arch::store_release_sys_u32(self.state, 0);
                    arch::store_release_sys_u32(self.state.add(1), 0);
                }
            }
        }
    }
}

/// Cluster Launch Control (sm_100a): the grid is launched with one block (cluster) per tile;
/// a running block cancels a not-yet-launched cluster and runs its tiles instead.
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
pub struct HardwareSource {
    phases: u32,
    clustered: bool,
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
impl sealed::Sealed for HardwareSource {}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
impl HardwareSource {
    /// Initialize the calling block's response slots. `clustered`: the kernel is launched with
    /// clusters of more than one CTA (then requests multicast to the cluster and the CTA's
    /// position in the cluster is added to each stolen id).
    pub fn new(clustered: bool) -> Self {
        if arch::thread_idx_x() == 0 {
            for slot in 0..SLOTS {
                // SAFETY: once per block, one thread, before any request.
                unsafe { arch::clc::init_mbarrier(slot) };
            }
        }
        arch::sync_threads();
        if clustered {
            // Every CTA's barriers are initialized before any multicast response arrives.
            arch::clc::cluster_sync();
        }
        HardwareSource {
            phases: 0,
            clustered,
        }
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
impl Source for HardwareSource {
    fn first_tile(&mut self) -> Option<TileId> {
        // A launched block was not canceled: its tile is its own.
        Some(TileId(arch::block_idx_x()))
    }

    fn before_request(&mut self) {
        arch::sync_threads();
        if self.clustered {
            // No CTA of the cluster has exited: multicast to an exited CTA is undefined.
            arch::clc::cluster_sync();
        }
        arch::clc::fence_acquire_async();
    }

    unsafe fn issue(&mut self, slot: u32, leader: bool) {
        if leader {
            let submitter = !self.clustered || arch::clc::cluster_cta_rank() == 0;
            // SAFETY: forwarded contract; one thread per CTA arms its barrier and, with
            // clusters, only the first CTA's submits (multicast).
            unsafe { arch::clc::request(slot, self.clustered, submitter) };
        }
    }

    unsafe fn wait(&mut self, slot: u32) {
        let parity = (self.phases >> slot) & 1;
        // SAFETY: the slot's barrier is initialized and armed for this phase.
        while !unsafe { arch::clc::try_wait(slot, parity) } {}
        self.phases ^= 1 << slot;
    }

    unsafe fn decode(&mut self, slot: u32) -> Option<TileId> {
        // SAFETY: the barrier wait completed for this response.
        let first = unsafe { arch::clc::query(slot) };
        arch::clc::fence_release_async();
        first.map(|x| {
            let offset = if self.clustered {
                arch::clc::cluster_cta_rank()
            } else {
                0
            };
            TileId(x + offset)
        })
    }

    fn finish(&mut self) {
        if self.clustered {
            // Keep this CTA alive until no multicast response can target it.
            arch::clc::cluster_sync();
        }
    }
}
