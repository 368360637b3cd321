//! Layout of a rank's signal pad: the small, zero-initialised region of device memory that
//! peers write flags into. Every window has its own pad per rank, so two windows (two streams,
//! two libraries) never share slots.
//!
//! ```text
//! offset 0       inbox   [MAX_BLOCKS][MAX_RANKS] u32   barrier flags written by peers
//! INBOX_BYTES    epochs  [MAX_BLOCKS] u32              this rank's barrier epoch per block
//! ```
//!
//! The abort word is not in the pad: it lives where the host can read it without a copy
//! (`SymmContext::abort_flag`).

/// Most ranks a communicator may have.
pub const MAX_RANKS: usize = 64;
/// Most blocks a collective kernel may be launched with.
pub const MAX_BLOCKS: usize = 64;

/// Bytes of the barrier inbox.
pub const INBOX_BYTES: usize = MAX_BLOCKS * MAX_RANKS * 4;
/// Offset of the per-block epoch counters.
pub const EPOCHS_OFFSET: usize = INBOX_BYTES;
/// Size in bytes of one rank's signal pad (room is left for later protocols).
pub const SIGNAL_PAD_BYTES: usize = 32 * 1024;

const _: () = assert!(EPOCHS_OFFSET + MAX_BLOCKS * 4 <= SIGNAL_PAD_BYTES);

/// Address of the inbox slot that rank `from` sets for `block` in the pad at `pad`.
#[inline(always)]
pub fn inbox_slot(pad: u64, block: u32, from: u32) -> *mut u32 {
    (pad + ((block as usize * MAX_RANKS + from as usize) * 4) as u64) as *mut u32
}

/// Address of the epoch counter of `block` in the pad at `pad`.
#[inline(always)]
pub fn epoch_slot(pad: u64, block: u32) -> *mut u32 {
    (pad + (EPOCHS_OFFSET + block as usize * 4) as u64) as *mut u32
}
