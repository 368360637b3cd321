//! Layout of a rank's signal pad: the small, zero-initialised region of device memory that
//! peers write flags into. Every window has its own pad per rank, so two windows (two streams,
//! two libraries) never share slots.
//!
//! ```text
//! offset 0           inbox      [MAX_BLOCKS][MAX_RANKS] u32   barrier flags written by peers
//! EPOCHS_OFFSET      epochs     [MAX_BLOCKS] u32              this rank's barrier epoch per block
//! LL_COUNTS_OFFSET   ll counts  [MAX_BLOCKS] u64              low-latency calls made, per block
//! PAT_FLAGS_OFFSET   pat flags  [4][MAX_BLOCKS][PAT_MAX_STEPS] u32  per-step PAT flags
//! PAT_ROUNDS_OFFSET  pat rounds [2][MAX_BLOCKS] u32           PAT rounds made, per collective and block
//! VOTES_OFFSET       votes      [MAX_BLOCKS] u32              this rank's vote at its block's last voting barrier
//! OUT_OF_STEP_OFFSET out of step u32                          non-zero once this rank's epochs left its peers'
//! GRID_BARRIER_OFFSET grid barrier [arrivals, generation] u32  this rank's blocks meeting each other
//! TILES_OFFSET       tiles      [3 + MAX_TILES + 2·MAX_BLOCKS] u32  a user kernel's tile scheduler
//! DESCRIPTORS_OFFSET descriptors [2][MAX_BLOCKS] u32          this rank's call at its block's agreeing barriers
//! GRID_DESCRIPTORS_OFFSET  [2][MAX_BLOCKS] u32                each block's call at this rank's grid barriers
//! LL_OFFSET          ll lines   [2][world][LL_LINES] 16 B     low-latency lines written by peers
//! pat_staging_offset pat inbox  [world-1][PAT_SLOT_BYTES]     PAT reduce-scatter partials
//! ```
//!
//! The PAT region (see `symmetric::pat`) holds, per block index and step, four flags with one
//! writer each (all-gather data and readiness, reduce-scatter data and readiness), the block's
//! round counter, and the reduce-scatter inbox: one slot per (step, segment) a rank receives,
//! `world - 1` slots in all, each shared among the blocks of a launch. It follows the LL lines,
//! so that a pad of an older layout differs only in its length.
//!
//! A low-latency (LL) line carries 8 data bytes and a flag twice — `[lo, flag, hi, flag]` —
//! written with one 16-byte store; each 8-byte half is single-copy atomic, so a reader that
//! sees the expected flag in both halves has the data. Lines are double-buffered by the parity
//! of the window's LL call number, so no reset is needed between calls.
//!
//! The LL call number is one per window, not one per block: which block owns a line depends on
//! the grid, and the grid changes with the size. Every block index keeps a copy of the number
//! (`ll counts`), and at the end of a call each block writes the new number into its own copy
//! and into the copies of the block indices the launch did not have, so every copy always holds
//! the number of LL calls made on the window.
//!
//! The abort word is not in the pad: it lives where the host can read it without a copy
//! (`SymmContext::abort_flag`).

/// Most ranks a communicator may have.
pub const MAX_RANKS: usize = 64;
// Rank numbers travel as `u32` (the context's `world_size`, flags naming peers).
const _: () = assert!(MAX_RANKS <= u32::MAX as usize);
/// Most blocks a collective kernel may be launched with (4 under loom, to keep the model
/// small).
pub const MAX_BLOCKS: usize = if cfg!(loom) { 4 } else { 64 };

/// Bytes of the barrier inbox.
pub const INBOX_BYTES: usize = MAX_BLOCKS * MAX_RANKS * 4;
/// Offset of the per-block epoch counters.
pub const EPOCHS_OFFSET: usize = INBOX_BYTES;
/// Offset of the per-block LL call counters.
pub const LL_COUNTS_OFFSET: usize = EPOCHS_OFFSET + MAX_BLOCKS * 4;
/// Offset of the LL lines.
pub const LL_OFFSET: usize = 32 * 1024;
/// Most payload bytes per rank an LL collective may carry (16 under loom: two lines per source,
/// so that clearing a parity stays a handful of stores in the model).
pub const LL_MAX_BYTES: usize = if cfg!(loom) { 16 } else { 16 * 1024 };
/// LL lines per (parity, source rank).
pub const LL_LINES: usize = LL_MAX_BYTES / 8;

/// Most steps of a PAT collective: `ceil(log2(MAX_RANKS))`.
pub const PAT_MAX_STEPS: usize = (usize::BITS - (MAX_RANKS - 1).leading_zeros()) as usize;
/// Offset of the PAT flags.
pub const PAT_FLAGS_OFFSET: usize = LL_COUNTS_OFFSET + MAX_BLOCKS * 8;
/// Offset of the PAT round counters (one per collective and block index).
pub const PAT_ROUNDS_OFFSET: usize = PAT_FLAGS_OFFSET + 4 * MAX_BLOCKS * PAT_MAX_STEPS * 4;
/// Bytes of one PAT inbox slot (shared by the blocks of a launch; 256 under loom, to keep the
/// model small).
pub const PAT_SLOT_BYTES: usize = if cfg!(loom) { 256 } else { 64 * 1024 };

/// Offset of the per-block votes (see `CrossRankBarrier::sync_unanimous`).
pub const VOTES_OFFSET: usize = PAT_ROUNDS_OFFSET + 2 * MAX_BLOCKS * 4;

/// Offset of the out-of-step mark (see [`out_of_step_slot`]).
pub const OUT_OF_STEP_OFFSET: usize = VOTES_OFFSET + MAX_BLOCKS * 4;

/// Offset of the grid barrier's two words, the arrival count and the generation (see
/// `sync::grid_barrier`).
pub const GRID_BARRIER_OFFSET: usize = OUT_OF_STEP_OFFSET + 4;

/// Offset of the tile scheduler state of a user's kernel (`kernel::Slot::for_each_tile`): three
/// counters (ticket, finished blocks, epoch), a claim word per tile, and the response slots
/// (two per block index).
pub const TILES_OFFSET: usize = GRID_BARRIER_OFFSET + 8;
/// Most tiles one `for_each_tile` of a user's kernel may share out (8 under loom).
pub const MAX_TILES: usize = if cfg!(loom) { 8 } else { 1024 };
/// Response slots per block index in the tile scheduler state.
pub const TILE_SLOTS_PER_BLOCK: usize = 2;
/// `u32`s of the tile scheduler state.
pub const TILE_STATE_WORDS: usize = 3 + MAX_TILES + TILE_SLOTS_PER_BLOCK * MAX_BLOCKS;

const _: () = assert!(LL_COUNTS_OFFSET + MAX_BLOCKS * 8 <= PAT_FLAGS_OFFSET);
/// Offset of the call descriptors (see `CrossRankBarrier::sync_agreeing`): per barrier parity
/// and block index, what this rank's block is about to do.
pub const DESCRIPTORS_OFFSET: usize = TILES_OFFSET + TILE_STATE_WORDS * 4;

/// Offset of the grid barrier's call descriptors (see `sync::grid_barrier`): per generation
/// parity and block index, what the block is about to do.
pub const GRID_DESCRIPTORS_OFFSET: usize = DESCRIPTORS_OFFSET + 2 * MAX_BLOCKS * 4;

const _: () = assert!(GRID_DESCRIPTORS_OFFSET + 2 * MAX_BLOCKS * 4 <= LL_OFFSET);
const _: () = assert!(1 << PAT_MAX_STEPS >= MAX_RANKS);
const _: () = assert!(PAT_SLOT_BYTES.is_multiple_of(16 * MAX_BLOCKS));

/// Offset of the PAT inbox in a `world`-rank communicator's pad (after the LL lines).
pub const fn pat_staging_offset(world: usize) -> usize {
    LL_OFFSET + 2 * world * LL_LINES * 16
}

/// Size in bytes of one rank's signal pad in a `world`-rank communicator.
pub const fn signal_pad_bytes(world: usize) -> usize {
    pat_staging_offset(world) + world.saturating_sub(1) * PAT_SLOT_BYTES
}

/// The four kinds of PAT flag. Each (kind, block, step) slot of a pad has exactly one writer,
/// so flags written in calls of the two collectives never stand in for each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PatFlag {
    /// All-gather: the segments of step `k` have landed here (written by rank `r + 2^k`).
    GatherData = 0,
    /// All-gather: rank `r - 2^k` (the receiver of this rank's step `k`) has entered the round.
    GatherReady = 1,
    /// Reduce-scatter: the partials of step `k` have landed in this inbox (written by rank
    /// `r - 2^k`).
    ScatterData = 2,
    /// Reduce-scatter: rank `r + 2^k` (the receiver of this rank's step `k`) has entered the
    /// round, its inbox of step `k` is free.
    ScatterReady = 3,
}

/// Address of the PAT flag `kind` of `block` and `step` in the pad at `pad`.
#[inline(always)]
pub fn pat_flag_slot(pad: u64, kind: PatFlag, block: u32, step: u32) -> *mut u32 {
    let index = (kind as usize * MAX_BLOCKS + block as usize) * PAT_MAX_STEPS + step as usize;
    (pad + (PAT_FLAGS_OFFSET + index * 4) as u64) as *mut u32
}

/// The two PAT collectives. Each keeps its own round counter per block index, and its flags
/// (`Gather*`, `Scatter*`) trail only that counter, so rounds of one never move the targets of
/// the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PatCollective {
    /// All-gather (flags `GatherData`, `GatherReady`).
    Gather = 0,
    /// Reduce-scatter (flags `ScatterData`, `ScatterReady`).
    Scatter = 1,
}

/// Address of the round counter of `collective` for `block` in the pad at `pad`.
#[inline(always)]
pub fn pat_round_slot(pad: u64, collective: PatCollective, block: u32) -> *mut u32 {
    let index = collective as usize * MAX_BLOCKS + block as usize;
    (pad + (PAT_ROUNDS_OFFSET + index * 4) as u64) as *mut u32
}

/// Address of LL line `line` from `source` for calls of parity `parity`, in the pad at `pad`.
#[inline(always)]
pub fn ll_line(pad: u64, world: u32, parity: u32, source: u32, line: u64) -> *mut [u32; 4] {
    let index = (parity as u64 * world as u64 + source as u64) * LL_LINES as u64 + line;
    (pad + LL_OFFSET as u64 + index * 16) as *mut [u32; 4]
}

/// Address of the LL call counter of `block` in the pad at `pad`.
#[inline(always)]
pub fn ll_count_slot(pad: u64, block: u32) -> *mut u64 {
    (pad + (LL_COUNTS_OFFSET + block as usize * 8) as u64) as *mut u64
}

/// Flags of one parity repeat after this many calls of that parity (flags are `1..=2^32 - 1`;
/// 0 is the value of a cleared line and never a flag).
pub const LL_FLAG_PERIOD: u64 = 0xFFFF_FFFF;

/// The flag of LL call number `calls`: never 0 (the value of a cleared line), and different from
/// the flag of each of the previous `LL_FLAG_PERIOD - 1` calls of the same parity. Calls of one
/// parity take the flags `1, 2, 3, …` in turn.
#[inline(always)]
pub fn ll_flag(calls: u64) -> u32 {
    ((calls >> 1) % LL_FLAG_PERIOD) as u32 + 1
}

/// `true` when LL call number `calls` must clear the line buffers of the other parity before
/// writing any line: the next call of that parity starts a new period of flags, and a line left
/// from a call one or more periods ago would carry its flag.
#[inline(always)]
pub fn ll_clears_other_parity(calls: u64) -> bool {
    let next = calls.wrapping_add(1);
    next >= 2 && (next >> 1).is_multiple_of(LL_FLAG_PERIOD)
}

/// Address of the line buffers of parity `parity` (every source, every line) in the pad at
/// `pad`, and their size in 16-byte lines.
#[inline(always)]
pub fn ll_parity_lines(pad: u64, world: u32, parity: u32) -> (*mut [u32; 4], u64) {
    (
        ll_line(pad, world, parity, 0, 0),
        world as u64 * LL_LINES as u64,
    )
}

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

/// Address of the vote of `block` in the pad at `pad`: written by that block of the pad's rank
/// only, read by the same block index of its peers.
#[inline(always)]
pub fn vote_slot(pad: u64, block: u32) -> *mut u32 {
    (pad + (VOTES_OFFSET + block as usize * 4) as u64) as *mut u32
}

/// Addresses of the grid barrier's arrival count and generation in the pad at `pad`.
#[inline(always)]
pub fn grid_barrier_slots(pad: u64) -> (*mut u32, *mut u32) {
    let arrivals = pad + GRID_BARRIER_OFFSET as u64;
    (arrivals as *mut u32, (arrivals + 4) as *mut u32)
}

/// Address of the call descriptor of `block` for barriers of epoch parity `parity` (0 or 1) in
/// the pad at `pad`.
#[inline(always)]
pub fn descriptor_slot(pad: u64, parity: u32, block: u32) -> *mut u32 {
    let index = (parity & 1) as usize * MAX_BLOCKS + block as usize;
    (pad + (DESCRIPTORS_OFFSET + index * 4) as u64) as *mut u32
}

/// Address of the grid barrier's call descriptor of `block` for generations of parity `parity`
/// (0 or 1) in the pad at `pad`.
#[inline(always)]
pub fn grid_descriptor_slot(pad: u64, parity: u32, block: u32) -> *mut u32 {
    let index = (parity & 1) as usize * MAX_BLOCKS + block as usize;
    (pad + (GRID_DESCRIPTORS_OFFSET + index * 4) as u64) as *mut u32
}

/// Address of the tile scheduler state in the pad at `pad` ([`TILE_STATE_WORDS`] `u32`s).
#[inline(always)]
pub fn tile_state(pad: u64) -> *mut u32 {
    (pad + TILES_OFFSET as u64) as *mut u32
}

/// Address of the out-of-step mark in the pad at `pad`: 0 while this rank's barrier epochs on
/// the window are in step with its peers'; set (never cleared: the communicator has failed)
/// by a block of this rank that gave up a barrier, after announcing an epoch its peers may
/// never reach, by a launch that refused its arguments and by an LL period clear that skipped
/// its barrier, which announce nothing their peers wait for. A barrier kernel reads it before
/// its first announcement (device memory, this
/// rank's own pad) and announces nothing when it is set: that announcement could release a
/// peer still waiting in the abandoned call (see `CrossRankBarrier`).
#[inline(always)]
pub fn out_of_step_slot(pad: u64) -> *mut u32 {
    (pad + OUT_OF_STEP_OFFSET as u64) as *mut u32
}
