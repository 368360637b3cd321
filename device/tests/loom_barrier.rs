//! Loom model of the cross-rank barrier: payload ordering, epoch reuse, advancing rounds, a remote raise ending a pending barrier, votes, and the fused one-shot all-reduce's owed round barriers: every interleaving (up to a preemption bound) of a few ranks'
//! blocks, on loom's weak memory model. Shared setup: `loom_support`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p symm-device --release --test loom_barrier --target-dir
//! target/loom` (`cargo xtask test` runs every `loom_*` file).

#![cfg(loom)]

mod loom_support;

use loom_support::*;

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
// Agreeing barriers (a user's kernel compares what each rank's block is about to do).

/// Consecutive agreeing barriers on one block index, nothing between them, with the
/// descriptors of `calls[round][rank]`: every rank learns whether that round's descriptors
/// were equal (a rank that reads a peer's descriptor of another round answers wrongly, and a
/// read that races with the peer's next write is a causality violation).
fn agreeing_rounds(threads: u32, calls: &'static [[u32; 2]]) {
    let model = World::new(2);
    model.declare();
    run_grid(2, threads, &|| {
        let (rank, _) = place(1);
        let ctx = &model.contexts[rank];
        let mut barrier = Rounds::open(ctx);
        for (round, call) in calls.iter().enumerate() {
            let same = barrier
                .sync_agreeing(call[rank])
                .expect("no timeouts under loom");
            assert_eq!(same, call[0] == call[1], "round {round}, rank {rank}");
        }
        barrier.finish();
    });
}

const DESCRIPTORS: &[[u32; 2]] = &[[7, 7], [8, 9], [10, 10]];

/// 2 ranks × 1 block × 1 thread: the same call, different calls, the same call again.
#[test]
fn descriptors_of_consecutive_barriers_never_mix() {
    explore(|| agreeing_rounds(1, DESCRIPTORS));
}

/// 2 ranks × 1 block × 2 threads: thread 0 writes, both threads read; the answer is uniform.
#[test]
fn descriptors_are_compared_block_wide() {
    explore_bounded(2, BUDGET, || agreeing_rounds(2, DESCRIPTORS));
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
