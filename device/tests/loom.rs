//! Model checking of the synchronization protocols with loom: every interleaving (up to a
//! preemption bound) of a few ranks' blocks, on loom's weak memory model.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p symm-device --release --test loom
//! --target-dir target/loom` (`cargo xtask test` does). Under `--cfg loom` the host `arch` layer
//! runs grids as loom threads, maps every atomic word to a loom atomic and every plain word
//! (barrier epochs, LL call counters, response slots) to a loom cell, and never times out a
//! wait: a protocol that never completes exceeds loom's branch limit.
//!
//! Payloads are `loom::cell::UnsafeCell`s written and read around the protocol under test, so
//! that an access not ordered by it is reported as a causality violation. The `mutant_*` tests
//! switch on a deliberate weakening (`arch::host::Mutation`) and expect loom to fail: they show
//! that the other tests would catch it.

#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, Ordering};
use symm_device::arch;
use symm_device::arch::host::{
    Mutation, WordKind, model_word, mutate, run_grid, run_grid_with_residency,
};
use symm_device::context::{BackendTag, CONTEXT_VERSION, SymmContext};
use symm_device::scheduler::driver::for_each_tile;
use symm_device::scheduler::policy::Greedy;
use symm_device::scheduler::source::SoftwareSource;
use symm_device::symmetric::pat;
use symm_device::symmetric::{ABORT_PEER_FAILED, Grid};
use symm_device::sync::barrier::{Aborted, CrossRankBarrier, UnstartedBarrier};
use symm_device::sync::ll::LlCall;
use symm_device::sync::p2p;
use symm_device::sync::pat_rounds::PatRounds;
use symm_device::sync::signal_pad::{
    LL_FLAG_PERIOD, LL_LINES, MAX_BLOCKS, PAT_MAX_STEPS, PatCollective, PatFlag, epoch_slot,
    inbox_slot, ll_clears_other_parity, ll_count_slot, ll_flag, ll_parity_lines, out_of_step_slot,
    pat_flag_slot, pat_round_slot, signal_pad_bytes, vote_slot,
};

/// Block 0's barrier on a window, through its rounds: the first passed with
/// `UnstartedBarrier::start*`, the later ones with `CrossRankBarrier::sync*`, so that the models
/// below read as a sequence of rounds.
enum Rounds<'a> {
    Unstarted(UnstartedBarrier<'a>),
    Started(CrossRankBarrier<'a>),
    Moved,
}

impl<'a> Rounds<'a> {
    /// Open block 0's barrier on `ctx` (never out of step in these models).
    fn open(ctx: &'a SymmContext) -> Self {
        // SAFETY: a host-built context; block 0 < MAX_BLOCKS; every thread of the block makes
        // the same calls.
        Rounds::Unstarted(unsafe { CrossRankBarrier::open(ctx, 0) })
    }

    fn round<T>(
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

    fn sync_advancing(&mut self, steps: u32) -> Result<(), Aborted> {
        self.round(
            |u| u.start_advancing(steps).map(|b| (b, ())),
            |b| b.sync_advancing(steps),
        )
    }

    fn sync(&mut self) -> Result<(), Aborted> {
        self.sync_advancing(1)
    }

    fn sync_unanimous(&mut self, vote: bool) -> Result<bool, Aborted> {
        self.round(|u| u.start_unanimous(vote), |b| b.sync_unanimous(vote))
    }

    fn finish(self) {
        if let Rounds::Started(barrier) = self {
            barrier.finish();
        }
    }
}

/// Explore `model` exhaustively with a preemption bound of 2 (unless `LOOM_MAX_PREEMPTIONS`
/// says otherwise).
fn explore(model: impl Fn() + Sync + Send + 'static) {
    explore_bounded(2, None, model)
}

/// Explore `model` with a preemption bound of `bound`, for at most `seconds` when given (the
/// three-rank and four-thread models are too large to finish in CI time: they explore as many
/// interleavings as fit, in loom's deterministic order; `LOOM_MAX_DURATION` overrides).
fn explore_bounded(bound: usize, seconds: Option<u64>, model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(bound);
    builder.max_branches = builder.max_branches.max(100_000);
    if builder.max_duration.is_none() {
        builder.max_duration = seconds.map(std::time::Duration::from_secs);
    }
    builder.check(model);
}

/// Seconds for each of the models too large to explore exhaustively.
const BUDGET: Option<u64> = Some(10);

/// 16-byte aligned storage.
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

/// `world` ranks' signal pads, abort words and contexts, in plain memory (fresh in every loom
/// execution: the model's objects stand for it from the first access on).
struct World {
    _pads: Vec<Vec<Chunk>>,
    _aborts: Vec<u32>,
    pad_addresses: Vec<u64>,
    contexts: Vec<SymmContext>,
}

impl World {
    fn new(world: usize) -> Box<World> {
        World::with_pads(world, signal_pad_bytes(world))
    }

    /// `world` ranks whose pads hold `bytes` each (the point-to-point window's: the pair
    /// region only).
    fn with_pads(world: usize, bytes: usize) -> Box<World> {
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

    fn world(&self) -> u32 {
        self.contexts.len() as u32
    }

    /// Set every copy of the LL call counter of every rank to `calls` (before the model runs).
    fn set_ll_calls(&self, calls: u64) {
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
    fn declare(&self) {
        let world = self.world();
        // SAFETY: every address lies inside a live pad or abort word; no grid runs yet.
        unsafe {
            for context in &self.contexts {
                model_word(context.abort_flag, WordKind::AtomicU32);
            }
            for pad in &self.pad_addresses {
                model_word(out_of_step_slot(*pad) as u64, WordKind::AtomicU32);
                for block in 0..MAX_BLOCKS as u32 {
                    for from in 0..world {
                        model_word(inbox_slot(*pad, block, from) as u64, WordKind::AtomicU32);
                    }
                    model_word(epoch_slot(*pad, block) as u64, WordKind::PlainU32);
                    model_word(vote_slot(*pad, block) as u64, WordKind::PlainU32);
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
    fn plant_ll_lines(&self, flag: u32, data: u64) {
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

const PAT_FLAGS: [PatFlag; 4] = [
    PatFlag::GatherData,
    PatFlag::GatherReady,
    PatFlag::ScatterData,
    PatFlag::ScatterReady,
];

/// Payload words, one per (rank, slot): plain memory whose accesses loom checks.
struct Payload(Vec<UnsafeCell<u64>>);

// SAFETY: accesses go through loom's cell, which reports any that is not ordered.
unsafe impl Sync for Payload {}

impl Payload {
    fn new(words: usize) -> Payload {
        Payload((0..words).map(|_| UnsafeCell::new(0)).collect())
    }

    fn write(&self, word: usize, value: u64) {
        // SAFETY: loom checks that no other access races with this one.
        self.0[word].with_mut(|p| unsafe { *p = value });
    }

    fn read(&self, word: usize) -> u64 {
        // SAFETY: loom checks that no write races with this read.
        self.0[word].with(|p| unsafe { *p })
    }
}

/// The calling thread's rank and block within its rank, for a grid of `blocks` blocks per rank.
fn place(blocks: u32) -> (usize, u32) {
    let b = arch::block_idx_x();
    ((b / blocks) as usize, b % blocks)
}

// ---------------------------------------------------------------------------------------------
// Cross-rank barrier.

/// Each rank's thread 0 publishes a payload word, passes the barrier, and reads every peer's
/// word; rewrites it only after the next barrier (so a peer's read of the old value is ordered
/// before the write); then `finish` and a second `CrossRankBarrier::open` on the same block
/// index (a second device-function call in the kernel) passes two more barriers.
fn barrier_payload(world: usize, threads: u32, calls: u64, rounds: u64) {
    let model = World::new(world);
    model.declare();
    let payload = Payload::new(world);
    run_grid(world as u32, threads, &|| {
        let (rank, _) = place(1);
        let ctx = &model.contexts[rank];
        let leader = arch::thread_idx_x() == 0;
        let mut value = 0;
        for call in 0..calls {
            // SAFETY: a host-built context; block 0 < MAX_BLOCKS; uniform calls.
            let mut barrier = Rounds::open(ctx);
            for round in 0..rounds {
                value += 1;
                if leader {
                    payload.write(rank, value * 10 + rank as u64);
                }
                barrier.sync().expect("no timeouts under loom");
                if leader {
                    for peer in 0..world {
                        assert_eq!(
                            payload.read(peer),
                            value * 10 + peer as u64,
                            "call {call} round {round}: rank {rank} reads rank {peer}"
                        );
                    }
                }
                barrier.sync().expect("no timeouts under loom");
            }
            barrier.finish();
        }
    });
}

const CALLS: u64 = 2;
const ROUNDS: u64 = 1;

/// 2 ranks × 1 block × 1 thread, two calls of one round (four barriers).
#[test]
fn barrier_orders_payload_two_ranks() {
    explore(|| barrier_payload(2, 1, CALLS, ROUNDS));
}

/// 3 ranks × 1 block × 1 thread.
#[test]
fn barrier_orders_payload_three_ranks() {
    explore_bounded(2, BUDGET, || barrier_payload(3, 1, CALLS, ROUNDS));
}

/// Two threads per block: thread 0 writes the epoch in `finish` while thread 1 may already be
/// in the next `new`; the closing block barrier orders them.
fn barrier_epoch_reuse() {
    let model = World::new(2);
    model.declare();
    let payload = Payload::new(4);
    run_grid(2, 2, &|| {
        let (rank, _) = place(1);
        let ctx = &model.contexts[rank];
        for call in 1..=2u64 {
            // SAFETY: a host-built context; block 0 < MAX_BLOCKS; uniform calls.
            let mut barrier = Rounds::open(ctx);
            // One word per (call, rank): the peer may still read this call's word while this
            // rank writes the next call's.
            let word = |rank: usize| 2 * (call as usize - 1) + rank;
            if arch::thread_idx_x() == 1 {
                payload.write(word(rank), call);
            }
            barrier.sync().expect("no timeouts under loom");
            if arch::thread_idx_x() == 1 {
                assert_eq!(
                    payload.read(word(1 - rank)),
                    call,
                    "call {call}, rank {rank}"
                );
            }
            barrier.finish();
        }
    });
}

/// 2 ranks × 1 block × 2 threads, two calls of one barrier each on the same block index.
#[test]
fn barrier_epoch_is_block_wide_after_finish() {
    explore_bounded(2, BUDGET, barrier_epoch_reuse);
}

/// Rank 0 passes two barriers with one `sync_advancing(2)`, rank 1 with two `sync`s (and
/// rank 2, when present, with `sync_advancing(1)` then `sync`); every rank's payload written
/// before the first barrier is visible after the last, and a second call continues from the
/// same epoch on every rank.
fn barrier_advancing(world: usize) {
    let model = World::new(world);
    model.declare();
    let payload = Payload::new(world);
    run_grid(world as u32, 1, &|| {
        let (rank, _) = place(1);
        let ctx = &model.contexts[rank];
        // SAFETY: a host-built context; block 0 < MAX_BLOCKS; uniform calls.
        let mut barrier = Rounds::open(ctx);
        payload.write(rank, 1 + rank as u64);
        match rank {
            0 => barrier.sync_advancing(2),
            1 => barrier.sync().and_then(|()| barrier.sync()),
            _ => barrier.sync_advancing(1).and_then(|()| barrier.sync()),
        }
        .expect("no timeouts under loom");
        for peer in 0..world {
            assert_eq!(
                payload.read(peer),
                1 + peer as u64,
                "rank {rank}, peer {peer}"
            );
        }
        barrier.sync().expect("no timeouts under loom");
        barrier.finish();
        // A second call: every rank continues from epoch 3.
        // SAFETY: as above.
        let mut barrier = Rounds::open(ctx);
        payload.write(rank, 10 + rank as u64);
        barrier.sync().expect("no timeouts under loom");
        for peer in 0..world {
            assert_eq!(
                payload.read(peer),
                10 + peer as u64,
                "rank {rank}, peer {peer}"
            );
        }
        barrier.finish();
    });
}

/// 2 ranks: `sync_advancing(2)` against two `sync`s.
#[test]
fn barrier_advancing_matches_single_steps() {
    explore(|| barrier_advancing(2));
}

/// 3 ranks: three different step sequences to the same epoch.
#[test]
fn barrier_advancing_three_ranks() {
    explore_bounded(2, BUDGET, || barrier_advancing(3));
}

/// Teeth: with relaxed instead of release stores, a peer's payload write is not ordered before
/// the read after the barrier.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_barrier_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        barrier_payload(2, 1, 1, 1)
    });
}

/// Teeth: with relaxed instead of acquire loads, likewise.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_barrier_relaxed_acquire_is_caught() {
    explore(|| {
        mutate(Mutation::AcquireAsRelaxed);
        barrier_payload(2, 1, 1, 1)
    });
}

/// Teeth: without the block barrier after the epoch store in `finish`, thread 1 may read the
/// epoch in the next `new` while thread 0 writes it.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_finish_without_closing_barrier_is_caught() {
    explore_bounded(1, None, || {
        mutate(Mutation::FinishWithoutClosingBarrier);
        barrier_epoch_reuse()
    });
}

// ---------------------------------------------------------------------------------------------
// A remote raise: a rank of another process fails the communicator and raises this rank's
// abort word through its mapping of this rank's call records.

/// Rank 1 stands for a rank of another process that refused its call: it never arrives at the
/// barrier; its host (a thread of its own, not joined before rank 0's host looks) writes its
/// failure record, then raises rank 0's abort word through its mapping (a release
/// compare-and-swap, as the host's `Flag::raise`) — in the other order when `!record_first`.
/// Rank 0's kernel gives up its pending barrier (its look at the word is relaxed); rank 0's
/// host then reads the word with acquire (as `Flag::read`, in `find_new_failure`) and only then
/// the record (`adopted`): the record is written, and ordered before the read by the word alone.
fn remote_raise(threads: u32, record_first: bool) {
    let model: std::sync::Arc<World> = std::sync::Arc::from(World::new(2));
    model.declare();
    let record = std::sync::Arc::new(Payload::new(1));
    // The address as an integer: the threads share it.
    let word = model.contexts[0].abort_flag;
    let failing_host = {
        let record = record.clone();
        loom::thread::spawn(move || {
            let raise = || {
                // SAFETY: rank 0's abort word, a live atomic word of the model.
                unsafe { arch::compare_exchange_sys_u32(word as *mut u32, 0, ABORT_PEER_FAILED) };
            };
            if record_first {
                record.write(0, 42);
                raise();
            } else {
                raise();
                record.write(0, 42);
            }
        })
    };
    // Rank 0 alone: its block waits for rank 1, which never comes.
    run_grid(1, threads, &|| {
        let mut barrier = Rounds::open(&model.contexts[0]);
        assert!(
            barrier.sync().is_err(),
            "a barrier completed without rank 1"
        );
    });
    // SAFETY: as above.
    let seen = unsafe { arch::host::load_acquire_sys_u32(word as *const u32) };
    assert_eq!(seen, ABORT_PEER_FAILED);
    assert_eq!(record.read(0), 42, "the cause is not on record");
    failing_host.join().unwrap();
}

/// 2 ranks × 1 thread: rank 0's pending barrier ends on the remote raise, with the cause on
/// record.
#[test]
fn a_remote_raise_ends_a_pending_barrier_with_the_cause_on_record() {
    explore(|| remote_raise(1, true));
}

/// 2 ranks × 2 threads: every thread of rank 0's block gives up together.
#[test]
fn a_remote_raise_ends_a_pending_barrier_on_every_thread() {
    explore_bounded(2, BUDGET, || remote_raise(2, true));
}

/// Teeth: a raise before the record is written lets rank 0 read the record while it is
/// written.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_remote_raise_before_the_record_is_caught() {
    explore(|| remote_raise(1, false));
}

// ---------------------------------------------------------------------------------------------
// Voting barriers (the one-shot all-reduce asks whether every rank is in place).

/// Three launches on one block index, each a voting start barrier and an end barrier, with
/// the votes of `votes[launch][rank]`: every rank's answer is the conjunction of that launch's
/// votes (a rank that reads a peer's vote of another launch answers wrongly, and a read that
/// races with the peer's next vote is a causality violation). Rank 0 votes yes every time, so
/// it reads rank 1's vote in every launch.
fn voting_launches(threads: u32, votes: &'static [[bool; 2]]) {
    let model = World::new(2);
    model.declare();
    run_grid(2, threads, &|| {
        let (rank, _) = place(1);
        let ctx = &model.contexts[rank];
        for (launch, vote) in votes.iter().enumerate() {
            // SAFETY: a host-built context; block 0 < MAX_BLOCKS; uniform calls.
            let mut barrier = Rounds::open(ctx);
            let every = barrier
                .sync_unanimous(vote[rank])
                .expect("no timeouts under loom");
            assert_eq!(every, vote[0] && vote[1], "launch {launch}, rank {rank}");
            barrier.sync().expect("no timeouts under loom");
            barrier.finish();
        }
    });
}

const VOTES: &[[bool; 2]] = &[[true, true], [true, false], [true, true]];

/// 2 ranks × 1 block × 1 thread: yes, then a no from rank 1, then yes again.
#[test]
fn votes_of_consecutive_launches_never_mix() {
    explore(|| voting_launches(1, VOTES));
}

/// 2 ranks × 1 block × 2 threads: the vote is written by thread 0 and read by both threads
/// (one peer each would be thread 0 or 1 with more ranks); the block's answer is uniform.
#[test]
fn votes_are_block_wide() {
    explore_bounded(2, BUDGET, || voting_launches(2, VOTES));
}

/// Teeth: a rank that writes its vote after the voting barrier lets its peer read the vote of
/// the previous launch (a wrong answer) or race with the write (a causality violation).
#[test]
#[should_panic(expected = "launch")]
fn mutant_vote_after_barrier_is_caught() {
    explore(|| {
        mutate(Mutation::VoteAfterBarrier);
        voting_launches(1, VOTES)
    });
}

// ---------------------------------------------------------------------------------------------
// Fused one-shot all-reduce: owed round barriers.

/// The barrier protocol of a fused one-shot all-reduce (`symmetric::all_reduce`) with two
/// tasks: rank 0 is out of place for task 0 and in place for task 1, rank 1 the other way
/// round. Every rank reads every rank's word of each task; a rank in place for a task
/// overwrites its own word after that task's round barrier; a rank out of place owes the
/// task's round barrier and announces it with its next barrier (`sync_advancing`). With
/// `announce_owed` false (the mutant), a rank announces only its own barriers, so a peer's
/// in-place write can race with its reads. A second launch then passes a barrier from the
/// epoch both ranks ended at.
fn fused_one_shot_owed_rounds(announce_owed: bool) {
    const TASKS: usize = 2;
    let world = 2;
    let model = World::new(world);
    model.declare();
    let payload = Payload::new(world * TASKS + world);
    let word = |task: usize, rank: usize| task * world + rank;
    for task in 0..TASKS {
        for rank in 0..world {
            payload.write(word(task, rank), (10 * task + rank) as u64);
        }
    }
    run_grid(world as u32, 1, &|| {
        let (rank, _) = place(1);
        let ctx = &model.contexts[rank];
        // SAFETY: a host-built context; block 0 < MAX_BLOCKS; uniform calls.
        let mut barrier = Rounds::open(ctx);
        barrier.sync().expect("no timeouts under loom");
        let mut owed = 0u32;
        for task in 0..TASKS {
            let in_place = (task + rank) % 2 == 1;
            let sum: u64 = (0..world).map(|r| payload.read(word(task, r))).sum();
            let expected: u64 = (0..world).map(|r| (10 * task + r) as u64).sum();
            assert_eq!(sum, expected, "rank {rank} task {task}");
            if in_place {
                barrier
                    .sync_advancing(owed + 1)
                    .expect("no timeouts under loom");
                owed = 0;
                payload.write(word(task, rank), sum);
            } else if announce_owed {
                owed += 1;
            }
        }
        barrier
            .sync_advancing(owed + 1)
            .expect("no timeouts under loom");
        barrier.finish();
        // The next launch on the window: both ranks continue from the same epoch.
        // SAFETY: as above.
        let mut barrier = Rounds::open(ctx);
        payload.write(world * TASKS + rank, 100 + rank as u64);
        barrier.sync().expect("no timeouts under loom");
        let peer = 1 - rank;
        assert_eq!(payload.read(world * TASKS + peer), 100 + peer as u64);
        barrier.finish();
    });
}

/// 2 ranks × 1 block × 1 thread: the owed round barriers of a fused one-shot batch.
#[test]
fn fused_one_shot_owed_round_barriers() {
    explore(|| fused_one_shot_owed_rounds(true));
}

/// Teeth: a rank that does not announce the round barriers it owes lets a peer overwrite a
/// word it is still reading.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_fused_one_shot_without_owed_rounds_is_caught() {
    explore(|| fused_one_shot_owed_rounds(false));
}

// ---------------------------------------------------------------------------------------------
// Low-latency lines.

/// Calls numbered from here on send the bits an LL wait that gave up returns
/// ([`symm_device::sync::ll::GAVE_UP`]) as every line's data.
const DATA_AS_GAVE_UP_FROM: u64 = (1 << 40) + 8;

/// The data of line `line` from `source` in call `call`.
fn ll_data(call: u64, source: u32, line: u64) -> u64 {
    if call >= DATA_AS_GAVE_UP_FROM {
        return symm_device::sync::ll::GAVE_UP;
    }
    (call << 32) | (source as u64) << 8 | line
}

/// A per-rank stand-in for stream order between kernel launches: every block of `rank` has
/// ended launch `launch` before any starts the next (acquire/release on a loom counter).
struct Launches(Vec<AtomicU32>);

impl Launches {
    fn new(ranks: usize) -> Launches {
        Launches((0..ranks).map(|_| AtomicU32::new(0)).collect())
    }

    fn end(&self, rank: usize, blocks: u32, launch: u32) {
        if arch::thread_idx_x() == 0 {
            self.0[rank].fetch_add(1, Ordering::AcqRel);
            while self.0[rank].load(Ordering::Acquire) < blocks * (launch + 1) {
                loom::thread::yield_now();
            }
        }
        arch::sync_threads();
    }
}

/// One LL call of the grid `grid` on `ctx` moving `lines` lines: every rank puts its lines to
/// every peer and takes every peer's; every take must return the data of this call.
fn ll_call(ctx: &SymmContext, grid: Grid, lines: u64, call: u64) {
    // SAFETY: a host-built context with full pads; grid.block < grid.blocks <= MAX_BLOCKS;
    // every rank makes the same calls with the same grids.
    let ll = unsafe { LlCall::begin(ctx, grid) }.expect("no timeouts under loom");
    let (lo, hi) = symm_device::symmetric::block_range(lines, grid.block, grid.blocks);
    let world = ctx.world_size;
    let mut line = lo + arch::thread_idx_x() as u64;
    while line < hi {
        for peer in 0..world {
            // SAFETY: peer < world, line < LL_LINES.
            unsafe { ll.put(peer, line, ll_data(call, ctx.rank, line)) };
        }
        line += arch::block_dim_x() as u64;
    }
    // As the LL kernels take lines: up to LL_ROUND sources' lines loaded together, then a wait
    // for each that had not arrived (`take_every_source`).
    let mut line = lo + arch::thread_idx_x() as u64;
    while line < hi {
        // SAFETY: line < LL_LINES.
        unsafe {
            ll.take_every_source(line, |source, data| {
                assert_eq!(
                    data,
                    ll_data(call, source, line),
                    "call {call}: rank {} took line {line} from {source}",
                    ctx.rank
                );
            })
        }
        .expect("no timeouts under loom");
        line += arch::block_dim_x() as u64;
    }
    ll.end(false).expect("no timeouts under loom");
}

/// Consecutive LL calls on one window with grids of `grids[k]` blocks per rank (each a
/// separate launch), moving `lines` lines each, starting from call number `first`.
fn ll_calls(world: usize, threads: u32, grids: &[u32], lines: u64, first: u64, stale: bool) {
    assert!(lines <= LL_LINES as u64);
    let model = World::new(world);
    if first != 0 {
        model.set_ll_calls(first);
    }
    if stale {
        // Lines with the flag the calls after the period's end will use: they must never be
        // accepted (their data is no call's).
        model.plant_ll_lines(ll_flag(first + 1), u64::MAX);
    }
    model.declare();
    let launches = Launches::new(world);
    let widest = *grids.iter().max().unwrap();
    run_grid(world as u32 * widest, threads, &|| {
        let (rank, block) = place(widest);
        let ctx = &model.contexts[rank];
        for (k, &blocks) in grids.iter().enumerate() {
            if block < blocks {
                ll_call(ctx, Grid { block, blocks }, lines, first + k as u64);
            }
            if k + 1 < grids.len() && widest > 1 {
                launches.end(rank, widest, k as u32);
            }
        }
    });
}

/// 2 ranks, three calls with grids of 1, 2 and 1 blocks per rank (the copies of the call
/// number that a 1-block call leaves to block index 1 are read by the 2-block call), one
/// thread per block; parities 0, 1, 0.
#[test]
fn ll_calls_with_changing_grids() {
    explore_bounded(2, BUDGET, || ll_calls(2, 1, &[1, 2, 1], 2, 0, false));
}

/// 2 ranks × 1 block × 2 threads, two calls in one kernel: the closing block barrier of `end`
/// orders thread 0's store of the new call number before thread 1 reads it.
#[test]
fn ll_calls_in_one_kernel_two_threads() {
    explore_bounded(2, BUDGET, || ll_calls(2, 2, &[1, 1], 2, 0, false));
}

/// 3 ranks × 1 block × 1 thread, three calls: a parity's buffer is reused only after every
/// peer took its lines.
#[test]
fn ll_calls_three_ranks() {
    explore_bounded(2, BUDGET, || ll_calls(3, 1, &[1, 1, 1], 1, 0, false));
}

/// Lines whose data is the bits a wait that gave up returns: a line that had not arrived at
/// its first load is waited for out of line, and its data, equal to those bits, must still be
/// taken as data (the take looks at the line again instead of reading the abort word).
#[test]
fn ll_calls_whose_data_looks_like_a_wait_that_gave_up() {
    assert!(!ll_clears_other_parity(DATA_AS_GAVE_UP_FROM));
    assert!(!ll_clears_other_parity(DATA_AS_GAVE_UP_FROM + 1));
    explore_bounded(2, BUDGET, || {
        ll_calls(2, 1, &[1, 1], 1, DATA_AS_GAVE_UP_FROM, false)
    });
}

/// The call numbers just before the end of a flag period; the buffers hold stale lines with
/// the next period's flags.
const BEFORE_WRAP: u64 = 2 * LL_FLAG_PERIOD - 1;

/// Across the end of a flag period, with stale lines carrying the next period's first flag:
/// the calls that clear the other parity (and pass a cross-rank barrier) make sure no stale
/// line is ever accepted.
#[test]
fn ll_flag_period_wrap_rejects_stale_lines() {
    assert!(ll_clears_other_parity(BEFORE_WRAP));
    assert!(ll_clears_other_parity(BEFORE_WRAP + 1));
    assert_eq!(ll_flag(BEFORE_WRAP + 1), ll_flag(BEFORE_WRAP + 2));
    explore(|| ll_calls(2, 1, &[1, 1, 1], 1, BEFORE_WRAP, true));
}

/// Teeth: without the clearing at the end of a flag period, a stale line is accepted.
#[test]
#[should_panic(expected = "took line")]
fn mutant_ll_without_period_clear_is_caught() {
    explore(|| {
        mutate(Mutation::LlSkipPeriodClear);
        ll_calls(2, 1, &[1, 1, 1], 1, BEFORE_WRAP, true)
    });
}

/// Teeth: without the closing block barrier in `end`, thread 1 may read the call number before
/// thread 0 writes it, take the previous call's flag and accept that call's line (loom finds
/// this stale take first; the other order is a causality violation on the counter).
#[test]
#[should_panic(expected = "took line")]
fn mutant_ll_end_without_closing_barrier_is_caught() {
    explore(|| {
        mutate(Mutation::LlEndWithoutClosingBarrier);
        ll_calls(2, 2, &[1, 1], 2, 0, false)
    });
}

// ---------------------------------------------------------------------------------------------
// Software work source.

/// Launches over `tiles` tiles on one state array: the first with every block resident, the
/// others `resident` at a time; each tile's counter (a loom cell, so that two blocks running
/// one tile at once are reported) must count one run per launch.
fn software_source(tiles: u32, resident: &[u32]) {
    let mut state = vec![0u32; SoftwareSource::state_words(tiles)];
    let state = state.as_mut_ptr() as u64;
    for word in 0..SoftwareSource::state_words(tiles) {
        // Counters, epoch and claims are atomic (the epoch is also read plainly at the start of
        // a launch); the response slots are plain.
        let kind = if word < 3 + tiles as usize {
            WordKind::AtomicU32
        } else {
            WordKind::PlainU32
        };
        // SAFETY: inside the state array; no grid runs yet.
        unsafe { model_word(state + 4 * word as u64, kind) };
    }
    let runs = Payload::new(tiles as usize);
    let kernel = || {
        // SAFETY: one block per tile; the state array is sized for `tiles` and outlives the
        // launches.
        let source = unsafe { SoftwareSource::new(state as *mut u32, tiles) };
        for_each_tile::<Greedy, _>(source, |tile| {
            if arch::thread_idx_x() == 0 {
                let t = tile.0 as usize;
                runs.write(t, runs.read(t) + 1);
            }
        });
    };
    let launch = |k: usize, run: &dyn Fn()| {
        run();
        for tile in 0..tiles as usize {
            assert_eq!(
                runs.read(tile),
                k as u64 + 1,
                "tile {tile} after launch {k}"
            );
        }
    };
    launch(0, &|| run_grid(tiles, 1, &kernel));
    for (k, &r) in resident.iter().enumerate() {
        launch(k + 1, &|| run_grid_with_residency(tiles, 1, r, &kernel));
    }
}

/// Two tiles, three launches (all resident; then one block at a time, twice): every tile runs
/// exactly once per launch, and the last block's reset lets the next launch start over.
#[test]
fn software_source_runs_every_tile_once_across_launches() {
    explore(|| software_source(2, &[1, 1]));
}

// ---------------------------------------------------------------------------------------------
// PAT step flags.

/// Which PAT collective a model call makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PatCall {
    Gather,
    Scatter,
}

/// Rank `rank`'s contribution to segment `segment` in call `call`.
fn pat_value(call: usize, rank: u32, segment: u32) -> u64 {
    ((call as u64 + 1) << 20) + ((rank as u64) << 8) + segment as u64
}

/// `calls` PAT collectives on one window of `world` ranks (one block of `threads` threads
/// each), with the real `PatRounds` flags and the kernels' schedule, in the kernels' order;
/// thread 0 moves the data through loom cells: all-gather, each rank's receive buffer (one
/// word per segment); reduce-scatter, each rank's inbox (one word per slot), partials as sums.
/// Every received word and every result is checked.
fn pat_calls(world: usize, threads: u32, calls: &[PatCall]) {
    let model = World::new(world);
    model.declare();
    let n = world as u32;
    let received = Payload::new(world * world);
    let inbox = Payload::new(world * world);
    run_grid(n, threads, &|| {
        let (rank, block) = place(1);
        let me = rank as u32;
        let ctx = &model.contexts[rank];
        let leader = arch::thread_idx_x() == 0;
        let total = pat::steps(n);
        for (call, kind) in calls.iter().enumerate() {
            let collective = match kind {
                PatCall::Gather => PatCollective::Gather,
                PatCall::Scatter => PatCollective::Scatter,
            };
            // SAFETY: host-built contexts with full-size pads; block 0; uniform calls.
            let rounds = unsafe { PatRounds::open(ctx, collective, block) };
            let round = rounds.before().wrapping_add(1);
            match kind {
                PatCall::Gather => {
                    for k in 0..total {
                        let sender = pat::all_gather_receive(n, me, k).peer;
                        // SAFETY: a rank; k < PAT_MAX_STEPS.
                        unsafe { rounds.post(sender, PatFlag::GatherReady, k, round) };
                    }
                    let mut look = Some(rounds.look_at_abort());
                    if leader {
                        received.write(rank * world + rank, pat_value(call, me, me));
                    }
                    for k in 0..total {
                        // SAFETY: k - 1, k < PAT_MAX_STEPS.
                        unsafe {
                            assert!(k == 0 || rounds.wait(PatFlag::GatherData, k - 1, round));
                            assert!(rounds.wait_ready(PatFlag::GatherReady, k, round, look.take()));
                        }
                        let out = pat::all_gather_send(n, me, k);
                        if leader {
                            for j in 0..out.segments {
                                let segment = (out.first + j) % n;
                                let value = received.read(rank * world + segment as usize);
                                assert_eq!(value, pat_value(call, segment, segment));
                                received.write(out.peer as usize * world + segment as usize, value);
                            }
                        }
                        // SAFETY: a rank; k < PAT_MAX_STEPS.
                        unsafe { rounds.post(out.peer, PatFlag::GatherData, k, round) };
                    }
                    let waited = total == 0
                        // SAFETY: total - 1 < PAT_MAX_STEPS.
                        || unsafe { rounds.wait(PatFlag::GatherData, total - 1, round) };
                    assert!(waited);
                    if leader {
                        for segment in 0..n {
                            assert_eq!(
                                received.read(rank * world + segment as usize),
                                pat_value(call, segment, segment),
                                "call {call}: rank {rank} segment {segment}"
                            );
                        }
                    }
                }
                PatCall::Scatter => {
                    for k in 0..total {
                        let child = pat::reduce_scatter_receive(n, me, k).peer;
                        // SAFETY: a rank; k < PAT_MAX_STEPS.
                        unsafe { rounds.post(child, PatFlag::ScatterReady, k, round) };
                    }
                    let mut look = Some(rounds.look_at_abort());
                    // The partial at `offset`: own contribution plus the children of the steps
                    // from `from` up, read from the inbox (as `pat::partial`).
                    let partial = |offset: u32, from: u32| {
                        let segment = (me + offset) % n;
                        let mut sum = pat_value(call, me, segment);
                        for k in (from..total).rev() {
                            if pat::reduce_scatter_receives(n, offset, k) {
                                let slot = pat::inbox_slot(k, offset) as usize;
                                sum += inbox.read(rank * world + slot);
                            }
                        }
                        sum
                    };
                    for k in (0..total).rev() {
                        // SAFETY: k + 1, k < PAT_MAX_STEPS.
                        unsafe {
                            assert!(
                                k + 1 == total || rounds.wait(PatFlag::ScatterData, k + 1, round)
                            );
                            assert!(rounds.wait_ready(
                                PatFlag::ScatterReady,
                                k,
                                round,
                                look.take()
                            ));
                        }
                        let out = pat::reduce_scatter_send(n, me, k);
                        if leader {
                            for j in 0..out.segments {
                                let value = partial((1 << k) + j, k + 1);
                                let slot = pat::inbox_slot(k, j) as usize;
                                inbox.write(out.peer as usize * world + slot, value);
                            }
                        }
                        // SAFETY: a rank; k < PAT_MAX_STEPS.
                        unsafe { rounds.post(out.peer, PatFlag::ScatterData, k, round) };
                    }
                    // SAFETY: 0 < PAT_MAX_STEPS.
                    assert!(total == 0 || unsafe { rounds.wait(PatFlag::ScatterData, 0, round) });
                    if leader {
                        let expected: u64 = (0..n).map(|r| pat_value(call, r, me)).sum();
                        assert_eq!(partial(0, 0), expected, "call {call}: rank {rank}");
                    }
                }
            }
            rounds.finish(1);
        }
    });
}

const GATHER_TWICE: &[PatCall] = &[PatCall::Gather, PatCall::Gather];
const SCATTER_TWICE: &[PatCall] = &[PatCall::Scatter, PatCall::Scatter];
const MIXED: &[PatCall] = &[PatCall::Gather, PatCall::Scatter, PatCall::Gather];

/// Two PAT all-gathers on 2 ranks × 1 thread: the second call's stores wait for the receiver
/// to finish reading the first's.
#[test]
fn pat_all_gather_flags_two_ranks() {
    explore(|| pat_calls(2, 1, GATHER_TWICE));
}

/// Two PAT all-gathers on 3 ranks (two steps, a forwarded segment).
#[test]
fn pat_all_gather_flags_three_ranks() {
    explore_bounded(2, BUDGET, || pat_calls(3, 1, GATHER_TWICE));
}

/// Two PAT reduce-scatters on 2 ranks × 2 threads (the inbox reused across calls).
#[test]
fn pat_reduce_scatter_flags_two_ranks_two_threads() {
    explore_bounded(2, BUDGET, || pat_calls(2, 2, SCATTER_TWICE));
}

/// Two PAT reduce-scatters on 3 ranks (a partial that combines a child's).
#[test]
fn pat_reduce_scatter_flags_three_ranks() {
    explore_bounded(2, BUDGET, || pat_calls(3, 1, SCATTER_TWICE));
}

/// All-gather, reduce-scatter, all-gather on one window: the two collectives' flags never
/// stand in for each other.
#[test]
fn pat_mixed_calls_two_ranks() {
    explore(|| pat_calls(2, 1, MIXED));
}

/// Teeth: with relaxed instead of release stores, a received segment is not ordered before
/// its data flag.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pat_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        pat_calls(2, 1, GATHER_TWICE)
    });
}

/// Teeth: a sender that does not wait for its receiver's ready flag overwrites what the
/// receiver is still reading from the previous call.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pat_sender_not_waiting_for_ready_is_caught() {
    explore(|| {
        mutate(Mutation::PatSkipReadyWait);
        pat_calls(2, 1, SCATTER_TWICE)
    });
}

// ---------------------------------------------------------------------------------------------
// Point-to-point pairing (`sync::p2p`, docs/POINT_TO_POINT.md).

impl World {
    /// `world` ranks whose pads hold only the pair region, as on the communicator's
    /// point-to-point window.
    fn pairs(world: usize) -> Box<World> {
        let mut model = World::with_pads(world, p2p::pair_region_bytes(world as u32) as usize);
        // The pair region is the point-to-point window's buffer: the contexts' peer bases.
        for context in &mut model.contexts {
            context.peer_bases = context.peer_signal_pads;
        }
        model
    }

    /// Declare every word of the pair regions that `sync::p2p` touches to the loom model
    /// (after any planting, before the grid).
    fn declare_pairs(&self) {
        let world = self.world();
        let layout = p2p::RegionLayout::new(world);
        // SAFETY: every address lies inside a live pad or abort word; no grid runs yet.
        unsafe {
            for context in &self.contexts {
                model_word(context.abort_flag, WordKind::AtomicU32);
            }
            for pad in &self.pad_addresses {
                for peer in 0..world {
                    for channel in 0..p2p::CHANNELS {
                        for seq in 0..p2p::SLOTS {
                            let slot = pad + layout.outbox(peer, channel, seq);
                            for word in 0..p2p::DESCRIPTOR_BYTES / 8 {
                                model_word(slot + 8 * word, WordKind::PlainU64);
                            }
                        }
                        model_word(pad + layout.posted(peer, channel), WordKind::AtomicU32);
                        model_word(pad + layout.done(peer, channel), WordKind::AtomicU32);
                        model_word(pad + layout.filled(peer, channel), WordKind::AtomicU32);
                        model_word(pad + layout.drained(peer, channel), WordKind::AtomicU32);
                    }
                }
            }
        }
    }
}

/// Sends from rank 0 to rank 1 in the model: one more than the slots, so that a slot is
/// reused.
const PAIR_SENDS: u32 = p2p::SLOTS + 1;

/// Rank 0 posts `PAIR_SENDS` sends to rank 1 without waiting in between (a group's first
/// phase), each from a send buffer of its own written just before; then waits for the last to
/// complete and reuses every send buffer. Rank 1 receives them in order into one receive
/// buffer, checking each value. The pair has made `before` sends already (its `posted` and
/// `done` words hold it), so that the sequences may wrap.
fn pair_sends_after(before: u32) {
    let model = World::pairs(2);
    // SAFETY: words of live pads; no grid runs yet; the model reads them through loom (the
    // declared objects take the values the memory holds when declared, so plant first).
    unsafe {
        let layout = p2p::RegionLayout::new(2);
        ((model.pad_addresses[1] + layout.posted(0, 0)) as *mut u32).write(before);
        ((model.pad_addresses[0] + layout.done(1, 0)) as *mut u32).write(before);
    }
    model.declare_pairs();
    let sent = Payload::new(PAIR_SENDS as usize);
    let received = Payload::new(1);
    run_grid(2, 1, &|| {
        let (rank, _) = place(1);
        // SAFETY: a host-built context whose pads hold the pair region; rank < world.
        let pairs = unsafe { p2p::Pairs::open(&model.contexts[rank]) };
        if rank == 0 {
            for k in 1..=PAIR_SENDS {
                let seq = before.wrapping_add(k);
                let buffer = (k - 1) as usize;
                sent.write(buffer, 100 + k as u64);
                let descriptor = p2p::Descriptor {
                    seq,
                    datatype: 3,
                    window: 7,
                    offset: buffer as u64,
                    bytes: 8,
                    piece: 0,
                };
                // SAFETY: rank 1 < world; sends posted in order, once each.
                unsafe { pairs.post(1, 0, descriptor) }.expect("no timeouts under loom");
            }
            // SAFETY: rank 1 < world.
            unsafe { pairs.complete(1, 0, before.wrapping_add(PAIR_SENDS)) }
                .expect("no timeouts under loom");
            for buffer in 0..PAIR_SENDS as usize {
                sent.write(buffer, 0);
            }
        } else {
            for k in 1..=PAIR_SENDS {
                let seq = before.wrapping_add(k);
                // SAFETY: rank 0 < world; receives in order, once each.
                unsafe {
                    pairs.receive(0, 0, seq, |descriptor| {
                        assert_eq!(
                            (descriptor.datatype, descriptor.window, descriptor.bytes),
                            (3, 7, 8),
                            "receive {seq}: {descriptor:?}"
                        );
                        let value = sent.read(descriptor.offset as usize);
                        assert_eq!(value, 100 + k as u64, "receive {seq}");
                        received.write(0, value);
                        Ok(())
                    })
                }
                .expect("no timeouts under loom");
            }
        }
    });
}

/// The first sends of a pair.
fn pair_sends() {
    pair_sends_after(0)
}

/// Three sends through two slots: every descriptor and payload read is ordered after its
/// writes, and every reuse (of a slot, of a send buffer) after the reads it overwrites.
#[test]
fn pair_sends_through_a_reused_slot() {
    explore(pair_sends);
}

/// The same across the wrap of the sequence numbers (u32::MAX − 1 sends made before).
#[test]
fn pair_sends_across_the_sequence_wrap() {
    explore(|| pair_sends_after(u32::MAX - 1));
}

/// Teeth: a send published before its descriptor is written.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_post_before_descriptor_is_caught() {
    explore(|| {
        mutate(Mutation::P2pPostBeforeDescriptor);
        pair_sends()
    });
}

/// Teeth: a receiver that says "done" before it copied lets the sender reuse its buffer
/// under the copy.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_done_before_copy_is_caught() {
    explore(|| {
        mutate(Mutation::P2pDoneBeforeCopy);
        pair_sends()
    });
}

/// Teeth: a sender that reuses a slot without waiting for the send that held it overwrites a
/// descriptor the receiver may still be reading.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_slot_reuse_without_waiting_is_caught() {
    explore(|| {
        mutate(Mutation::P2pSkipSlotWait);
        pair_sends()
    });
}

/// Teeth: with relaxed instead of release stores, a descriptor is not ordered before its post.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        pair_sends()
    });
}

/// Teeth: with relaxed instead of acquire loads, the receiver's descriptor reads are not
/// ordered after the post it saw.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_pair_relaxed_acquire_is_caught() {
    explore(|| {
        mutate(Mutation::AcquireAsRelaxed);
        pair_sends()
    });
}

/// Pieces rank 0 passes to rank 1 through a ring of [`p2p::RING_SLOTS`] slots: one more than
/// the slots, so that a slot is reused.
const RING_PIECES: u32 = p2p::RING_SLOTS as u32 + 1;

/// Rank 0 fills `RING_PIECES` pieces into a ring (each a payload word of its slot) and rank 1
/// copies each out in order, checking it; both counts start at `before`, so that they may
/// wrap.
fn ring_pieces_after(before: u32) {
    let model = World::pairs(2);
    let layout = p2p::RegionLayout::new(2);
    // SAFETY: words of live pads; no grid runs yet (plant first, then declare).
    unsafe {
        for (pad, word) in [
            (0, layout.fills(1, 0)),
            (1, layout.drains(0, 0)),
            (1, layout.filled(0, 0)),
            (0, layout.drained(1, 0)),
        ] {
            ((model.pad_addresses[pad] + word) as *mut u32).write(before);
        }
    }
    model.declare_pairs();
    // SAFETY: as above.
    unsafe {
        model_word(
            model.pad_addresses[0] + layout.fills(1, 0),
            WordKind::PlainU32,
        );
        model_word(
            model.pad_addresses[1] + layout.drains(0, 0),
            WordKind::PlainU32,
        );
    }
    let ring = Payload::new(p2p::RING_SLOTS as usize);
    run_grid(2, 1, &|| {
        let (rank, _) = place(1);
        // SAFETY: a host-built context whose pads hold the pair region; rank < world.
        let pairs = unsafe { p2p::Pairs::open(&model.contexts[rank]) };
        for k in 1..=RING_PIECES {
            let value = 100 + k as u64;
            if rank == 0 {
                // SAFETY: rank 1 < world; this thread is rank 0's only filler of channel 0.
                let filled =
                    unsafe { pairs.fill_piece(1, 0, |slot| ring.write(slot as usize, value)) };
                assert_eq!(filled, Ok(before.wrapping_add(k)), "no timeouts under loom");
            } else {
                // SAFETY: rank 0 < world; rank 1's only drainer of channel 0.
                let drained = unsafe {
                    pairs.drain_piece(0, 0, |slot| {
                        assert_eq!(ring.read(slot as usize), value, "piece {k}");
                    })
                };
                assert_eq!(
                    drained,
                    Ok(before.wrapping_add(k)),
                    "no timeouts under loom"
                );
            }
        }
    });
}

/// Three pieces through a ring of two slots: every piece read is ordered after its write, and
/// every slot's reuse after the read of the piece it held.
#[test]
fn ring_pieces_through_reused_slots() {
    explore(|| ring_pieces_after(0));
}

/// The same across the wrap of the piece counts.
#[test]
fn ring_pieces_across_the_count_wrap() {
    explore(|| ring_pieces_after(u32::MAX - 1));
}

/// Teeth: a sender that refills a slot without waiting for the receiver to copy out the piece
/// it held.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_slot_reuse_without_waiting_is_caught() {
    explore(|| {
        mutate(Mutation::P2pRingSkipDrainWait);
        ring_pieces_after(0)
    });
}

/// Teeth: a receiver that says it copied a piece out before it did.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_drain_before_copy_is_caught() {
    explore(|| {
        mutate(Mutation::P2pRingDrainBeforeCopy);
        ring_pieces_after(0)
    });
}

/// Teeth: with relaxed instead of release stores, a piece is not ordered before its count.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        ring_pieces_after(0)
    });
}

/// Teeth: with relaxed instead of acquire loads, a piece's read is not ordered after its count.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_ring_relaxed_acquire_is_caught() {
    explore(|| {
        mutate(Mutation::AcquireAsRelaxed);
        ring_pieces_after(0)
    });
}
