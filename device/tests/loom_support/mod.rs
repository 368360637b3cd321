//! What the loom models share: the ranks' windows and signal pads (`World`), payload cells
//! whose unordered accesses loom reports, the barrier's rounds, and the exploration bounds.
//! Each `loom_*.rs` test file models one protocol.

#![allow(dead_code, unused_imports)]

pub use loom::cell::UnsafeCell;
pub use loom::sync::atomic::{AtomicU32, Ordering};
pub use symm_device::arch;
pub use symm_device::arch::host::{
    Mutation, WordKind, model_word, mutate, run_grid, run_grid_with_residency,
};
pub use symm_device::context::{BackendTag, CONTEXT_VERSION, SymmContext};
pub use symm_device::scheduler::driver::for_each_tile;
pub use symm_device::scheduler::policy::Greedy;
pub use symm_device::scheduler::source::SoftwareSource;
pub use symm_device::symmetric::pat;
pub use symm_device::symmetric::{ABORT_PEER_FAILED, Grid};
pub use symm_device::sync::barrier::{Aborted, CrossRankBarrier, UnstartedBarrier};
pub use symm_device::sync::grid_barrier::grid_sync;
pub use symm_device::sync::ll::LlCall;
pub use symm_device::sync::p2p;
pub use symm_device::sync::pat_rounds::PatRounds;
pub use symm_device::sync::signal_pad::{
    LL_FLAG_PERIOD, LL_LINES, MAX_BLOCKS, PAT_MAX_STEPS, PatCollective, PatFlag, descriptor_slot,
    epoch_slot, grid_barrier_slots, grid_descriptor_slot, inbox_slot, ll_clears_other_parity,
    ll_count_slot, ll_flag, ll_parity_lines, out_of_step_slot, pat_flag_slot, pat_round_slot,
    signal_pad_bytes, vote_slot,
};

/// Block 0's barrier on a window, through its rounds: the first passed with
/// `UnstartedBarrier::start*`, the later ones with `CrossRankBarrier::sync*`, so that the models
/// below read as a sequence of rounds.
pub enum Rounds<'a> {
    Unstarted(UnstartedBarrier<'a>),
    Started(CrossRankBarrier<'a>),
    Moved,
}

impl<'a> Rounds<'a> {
    /// Open block 0's barrier on `ctx` (never out of step in these models).
    pub fn open(ctx: &'a SymmContext) -> Self {
        // SAFETY: a host-built context; block 0 < MAX_BLOCKS; every thread of the block makes
        // the same calls.
        Rounds::Unstarted(unsafe { CrossRankBarrier::open(ctx, 0) })
    }

    pub fn round<T>(
        &mut self,
        first: impl FnOnce(UnstartedBarrier<'a>) -> Result<(CrossRankBarrier<'a>, T), Aborted>,
        later: impl FnOnce(&mut CrossRankBarrier<'a>) -> Result<T, Aborted>,
    ) -> Result<T, Aborted> {
        match std::mem::replace(self, Rounds::Moved) {
            Rounds::Unstarted(unstarted) => {
                let (barrier, value) = first(unstarted)?;
                *self = Rounds::Started(barrier);
                Ok(value)
            }
            Rounds::Started(mut barrier) => {
                let value = later(&mut barrier);
                *self = Rounds::Started(barrier);
                value
            }
            Rounds::Moved => unreachable!("a round after an abandoned one"),
        }
    }

    pub fn sync_advancing(&mut self, steps: u32) -> Result<(), Aborted> {
        self.round(
            |u| u.start_advancing(steps).map(|b| (b, ())),
            |b| b.sync_advancing(steps),
        )
    }

    pub fn sync(&mut self) -> Result<(), Aborted> {
        self.sync_advancing(1)
    }

    pub fn sync_unanimous(&mut self, vote: bool) -> Result<bool, Aborted> {
        self.round(|u| u.start_unanimous(vote), |b| b.sync_unanimous(vote))
    }

    pub fn sync_agreeing(&mut self, descriptor: u32) -> Result<bool, Aborted> {
        self.round(
            |u| u.start_agreeing(descriptor),
            |b| b.sync_agreeing(descriptor),
        )
    }

    pub fn finish(self) {
        if let Rounds::Started(barrier) = self {
            barrier.finish();
        }
    }
}

/// Explore `model` exhaustively with a preemption bound of 2 (unless `LOOM_MAX_PREEMPTIONS`
/// says otherwise).
pub fn explore(model: impl Fn() + Sync + Send + 'static) {
    explore_bounded(2, None, model)
}

/// Explore `model` with a preemption bound of `bound`, for at most `seconds` when given (the
/// three-rank and four-thread models are too large to finish in CI time: they explore as many
/// interleavings as fit, in loom's deterministic order; `LOOM_MAX_DURATION` overrides).
pub fn explore_bounded(
    bound: usize,
    seconds: Option<u64>,
    model: impl Fn() + Sync + Send + 'static,
) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(bound);
    builder.max_branches = builder.max_branches.max(100_000);
    if builder.max_duration.is_none() {
        builder.max_duration = seconds.map(std::time::Duration::from_secs);
    }
    builder.check(model);
}

/// Seconds for each of the models too large to explore exhaustively.
pub const BUDGET: Option<u64> = Some(10);

/// 16-byte aligned storage.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
pub struct Chunk([u8; 16]);

/// `world` ranks' signal pads, abort words and contexts, in plain memory (fresh in every loom
/// execution: the model's objects stand for it from the first access on).
pub struct World {
    _pads: Vec<Vec<Chunk>>,
    _aborts: Vec<u32>,
    /// Each rank's signal pad.
    pub pad_addresses: Vec<u64>,
    /// Each rank's context.
    pub contexts: Vec<SymmContext>,
}

impl World {
    pub fn new(world: usize) -> Box<World> {
        World::with_pads(world, signal_pad_bytes(world))
    }

    /// `world` ranks whose pads hold `bytes` each (the point-to-point window's: the pair
    /// region only).
    pub fn with_pads(world: usize, bytes: usize) -> Box<World> {
        let mut pads: Vec<Vec<Chunk>> = (0..world)
            .map(|_| vec![Chunk([0; 16]); bytes.div_ceil(16)])
            .collect();
        let mut aborts = vec![0u32; world];
        let pad_addresses: Vec<u64> = pads.iter_mut().map(|p| p.as_mut_ptr() as u64).collect();
        let mut model = Box::new(World {
            _pads: Vec::new(),
            _aborts: Vec::new(),
            pad_addresses,
            contexts: Vec::new(),
        });
        let table = model.pad_addresses.as_ptr() as u64;
        for (rank, abort) in aborts.iter_mut().enumerate() {
            model.contexts.push(SymmContext {
                backend: BackendTag::Native as u32,
                version: CONTEXT_VERSION,
                rank: rank as u32,
                world_size: world as u32,
                local_base: 0,
                window_size: 0,
                peer_bases: 0,
                peer_signal_pads: table,
                signal_pad_size: bytes as u64,
                abort_flag: abort as *mut u32 as u64,
                timeout_ns: 1,
                engine: [0; 3],
            });
        }
        model._pads = pads;
        model._aborts = aborts;
        model
    }

    pub fn world(&self) -> u32 {
        self.contexts.len() as u32
    }

    /// Set every copy of the LL call counter of every rank to `calls` (before the model runs).
    pub fn set_ll_calls(&self, calls: u64) {
        for pad in &self.pad_addresses {
            for block in 0..MAX_BLOCKS as u32 {
                // SAFETY: the counter lies inside the pad; no grid runs yet.
                unsafe { ll_count_slot(*pad, block).write(calls) };
            }
        }
    }

    /// Declare every word the protocols touch to the loom model (after any planting, before
    /// the grid): inbox slots and abort words are atomic `u32`s, LL line halves atomic `u64`s,
    /// epochs and LL call counters plain.
    pub fn declare(&self) {
        let world = self.world();
        // SAFETY: every address lies inside a live pad or abort word; no grid runs yet.
        unsafe {
            for context in &self.contexts {
                model_word(context.abort_flag, WordKind::AtomicU32);
            }
            for pad in &self.pad_addresses {
                model_word(out_of_step_slot(*pad) as u64, WordKind::AtomicU32);
                let (arrivals, generation) = grid_barrier_slots(*pad);
                model_word(arrivals as u64, WordKind::AtomicU32);
                model_word(generation as u64, WordKind::AtomicU32);
                for block in 0..MAX_BLOCKS as u32 {
                    for from in 0..world {
                        model_word(inbox_slot(*pad, block, from) as u64, WordKind::AtomicU32);
                    }
                    model_word(epoch_slot(*pad, block) as u64, WordKind::PlainU32);
                    model_word(vote_slot(*pad, block) as u64, WordKind::PlainU32);
                    for parity in 0..2 {
                        let slot = descriptor_slot(*pad, parity, block);
                        model_word(slot as u64, WordKind::PlainU32);
                        let slot = grid_descriptor_slot(*pad, parity, block);
                        model_word(slot as u64, WordKind::PlainU32);
                    }
                    model_word(ll_count_slot(*pad, block) as u64, WordKind::PlainU64);
                    for collective in [PatCollective::Gather, PatCollective::Scatter] {
                        let slot = pat_round_slot(*pad, collective, block);
                        model_word(slot as u64, WordKind::PlainU32);
                    }
                    for kind in PAT_FLAGS {
                        for step in 0..PAT_MAX_STEPS as u32 {
                            let slot = pat_flag_slot(*pad, kind, block, step);
                            model_word(slot as u64, WordKind::AtomicU32);
                        }
                    }
                }
                for parity in 0..2 {
                    let (lines, total) = ll_parity_lines(*pad, world, parity);
                    for half in 0..2 * total as usize {
                        model_word((lines as *mut u64).add(half) as u64, WordKind::AtomicU64);
                    }
                }
            }
        }
    }

    /// Fill every LL line of every rank (both parities) with `data` and `flag`: lines left by
    /// a call one or more flag periods ago (before the model runs).
    pub fn plant_ll_lines(&self, flag: u32, data: u64) {
        for pad in &self.pad_addresses {
            for parity in 0..2 {
                let (lines, total) = ll_parity_lines(*pad, self.world(), parity);
                for line in 0..total as usize {
                    // SAFETY: the line lies inside the pad; no grid runs yet.
                    unsafe {
                        lines
                            .add(line)
                            .write([data as u32, flag, (data >> 32) as u32, flag])
                    };
                }
            }
        }
    }
}

pub const PAT_FLAGS: [PatFlag; 4] = [
    PatFlag::GatherData,
    PatFlag::GatherReady,
    PatFlag::ScatterData,
    PatFlag::ScatterReady,
];

/// Payload words, one per (rank, slot): plain memory whose accesses loom checks.
pub struct Payload(Vec<UnsafeCell<u64>>);

// SAFETY: accesses go through loom's cell, which reports any that is not ordered.
unsafe impl Sync for Payload {}

impl Payload {
    pub fn new(words: usize) -> Payload {
        Payload((0..words).map(|_| UnsafeCell::new(0)).collect())
    }

    pub fn write(&self, word: usize, value: u64) {
        // SAFETY: loom checks that no other access races with this one.
        self.0[word].with_mut(|p| unsafe { *p = value });
    }

    pub fn read(&self, word: usize) -> u64 {
        // SAFETY: loom checks that no write races with this read.
        self.0[word].with(|p| unsafe { *p })
    }
}

/// The calling thread's rank and block within its rank, for a grid of `blocks` blocks per rank.
pub fn place(blocks: u32) -> (usize, u32) {
    let b = arch::block_idx_x();
    ((b / blocks) as usize, b % blocks)
}
