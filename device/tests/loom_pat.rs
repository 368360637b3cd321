//! Loom model of PAT step flags and rounds: every interleaving (up to a preemption bound) of a few ranks'
//! blocks, on loom's weak memory model. Shared setup: `loom_support`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p symm-device --release --test loom_pat --target-dir
//! target/loom` (`cargo xtask test` runs every `loom_*` file).

#![cfg(loom)]

mod loom_support;

use loom_support::*;

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
