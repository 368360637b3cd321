//! Loom model of the grid barrier (`sync::grid_barrier`): the blocks of one rank's launch meet
//! on two words of the window's pad, so what any block wrote before a grid barrier is visible
//! to every block after it, and launches of different block counts take turns on one window.
//! Shared setup: `loom_support`. Run with `RUSTFLAGS="--cfg loom" cargo test -p symm-device
//! --release --test loom_grid --target-dir target/loom`.

#![cfg(loom)]

mod loom_support;

use loom_support::*;

/// Seconds for each grid model too large to explore exhaustively (fewer than the other files'
/// `BUDGET`: the grid barrier's state is two words).
const GRID_BUDGET: Option<u64> = Some(5);

/// `world` ranks of `blocks` one-thread blocks: each block writes its payload word, passes a
/// grid barrier, reads every word of its rank's blocks, passes another, and rewrites its word
/// (ordered after the other blocks' reads by the second barrier). Every block passes the same
/// descriptors, so every barrier agrees.
fn grid_payload(model: &World, blocks: u32, rounds: u64) {
    let payload = Payload::new(model.contexts.len() * blocks as usize);
    run_grid(model.world() * blocks, 1, &|| {
        let (rank, block) = place(blocks);
        let ctx = &model.contexts[rank];
        let first = rank * blocks as usize;
        for round in 1..=rounds {
            payload.write(first + block as usize, round);
            // SAFETY: a host-built context; every block of the rank calls it, all resident.
            let agreed = unsafe { grid_sync(ctx, blocks, block, 2 * round as u32) };
            assert_eq!(agreed, Ok(true), "rank {rank} block {block}");
            for other in 0..blocks as usize {
                assert_eq!(
                    payload.read(first + other),
                    round,
                    "rank {rank} block {other}"
                );
            }
            // SAFETY: as above.
            let agreed = unsafe { grid_sync(ctx, blocks, block, 2 * round as u32 + 1) };
            assert_eq!(agreed, Ok(true), "rank {rank} block {block}");
        }
    });
}

/// One rank of two blocks, three grid barriers with nothing between them, the blocks'
/// descriptors `calls[barrier][block]`: every block learns whether that barrier's descriptors
/// were equal (a read of another barrier's descriptor answers wrongly; a read that races with
/// the next write is a causality violation).
fn grid_descriptors(calls: &'static [[u32; 2]]) {
    let model = World::new(1);
    model.declare();
    run_grid(2, 1, &|| {
        let (_, block) = place(2);
        let ctx = &model.contexts[0];
        for (barrier, call) in calls.iter().enumerate() {
            // SAFETY: a host-built context; both blocks call it, resident.
            let agreed = unsafe { grid_sync(ctx, 2, block, call[block as usize]) };
            assert_eq!(
                agreed,
                Ok(call[0] == call[1]),
                "barrier {barrier}, block {block}"
            );
        }
    });
}

/// The same call, different calls, the same call again.
#[test]
fn grid_descriptors_of_consecutive_barriers_never_mix() {
    explore(|| grid_descriptors(&[[7, 7], [8, 9], [10, 10]]));
}

/// One rank, two blocks, two rounds (four grid barriers).
#[test]
fn grid_barrier_orders_payload_two_blocks() {
    explore(|| {
        let model = World::new(1);
        model.declare();
        grid_payload(&model, 2, 2);
    });
}

/// One rank, three blocks: the last to arrive is any of them.
#[test]
fn grid_barrier_orders_payload_three_blocks() {
    explore_bounded(2, GRID_BUDGET, || {
        let model = World::new(1);
        model.declare();
        grid_payload(&model, 3, 1);
    });
}

/// Two ranks of two blocks: each rank's barrier is its own (its own pad's words).
#[test]
fn grid_barriers_of_two_ranks_are_apart() {
    explore_bounded(2, GRID_BUDGET, || {
        let model = World::new(2);
        model.declare();
        grid_payload(&model, 2, 1);
    });
}

/// A launch of three blocks, then one of one on the same window: the arrival count is back at
/// zero between them (a count left at 3 would hold the lone block for ever, which loom reports
/// as a deadlock). Loom allows four threads besides the model's own.
#[test]
fn the_arrival_count_is_zero_between_launches() {
    explore_bounded(2, GRID_BUDGET, || {
        let model = World::new(1);
        model.declare();
        grid_payload(&model, 3, 1);
        grid_payload(&model, 1, 1);
    });
}

/// A launch of one block, then one of three: the generation carries over from launch to
/// launch.
#[test]
fn the_generation_carries_over_between_launches() {
    explore_bounded(2, GRID_BUDGET, || {
        let model = World::new(1);
        model.declare();
        grid_payload(&model, 1, 2);
        grid_payload(&model, 3, 1);
    });
}

/// Teeth: with relaxed instead of release stores (and the add's release half), a block's
/// payload write is not ordered before another block's read after the barrier.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_grid_barrier_relaxed_release_is_caught() {
    explore(|| {
        mutate(Mutation::ReleaseAsRelaxed);
        let model = World::new(1);
        model.declare();
        grid_payload(&model, 2, 1);
    });
}

/// Teeth: with relaxed instead of acquire loads (and the add's acquire half), likewise.
#[test]
#[should_panic(expected = "Causality violation")]
fn mutant_grid_barrier_relaxed_acquire_is_caught() {
    explore(|| {
        mutate(Mutation::AcquireAsRelaxed);
        let model = World::new(1);
        model.declare();
        grid_payload(&model, 2, 1);
    });
}

/// One rank of two blocks of two threads: thread 0 of each block writes its payload word, and
/// after the grid barrier both threads of every block read every word (the generation is read
/// again by every thread to find the descriptors' parity).
#[test]
fn grid_barrier_orders_payload_for_every_thread() {
    explore_bounded(2, GRID_BUDGET, || {
        let model = World::new(1);
        model.declare();
        let payload = Payload::new(2);
        run_grid(2, 2, &|| {
            let (_, block) = place(2);
            let ctx = &model.contexts[0];
            if arch::thread_idx_x() == 0 {
                payload.write(block as usize, 1);
            }
            // SAFETY: a host-built context; both blocks call it, resident.
            let agreed = unsafe { grid_sync(ctx, 2, block, 5) };
            assert_eq!(agreed, Ok(true));
            for other in 0..2 {
                assert_eq!(payload.read(other), 1, "block {block} reads block {other}");
            }
        });
    });
}

/// Two ranks of two blocks: block 0 of rank 0 writes, then every block passes the grid barrier
/// of its rank and the cross-rank barrier of its block index; block 1 of rank 1 then reads
/// what block 0 of rank 0 wrote: the two barriers together order every block of every rank.
/// Without the grid barrier (`grid` false) the read is not ordered after the write.
fn every_block_of_every_rank(grid: bool) {
    let model = World::new(2);
    model.declare();
    let payload = Payload::new(1);
    run_grid(4, 1, &|| {
        let (rank, block) = place(2);
        let ctx = &model.contexts[rank];
        if (rank, block) == (0, 0) {
            payload.write(0, 7);
        }
        if grid {
            // SAFETY: a host-built context; both blocks of the rank call it, resident.
            let agreed = unsafe { grid_sync(ctx, 2, block, 1) };
            assert_eq!(agreed, Ok(true));
        }
        // SAFETY: a host-built context; block < MAX_BLOCKS; every thread of the block calls it.
        let barrier = unsafe { CrossRankBarrier::open(ctx, block) }
            .start()
            .expect("no timeouts under loom");
        barrier.finish();
        if (rank, block) == (1, 1) {
            assert_eq!(
                payload.read(0),
                7,
                "block 1 of rank 1 reads block 0 of rank 0"
            );
        }
    });
}

#[test]
fn a_grid_barrier_then_a_cross_rank_barrier_order_every_block_of_every_rank() {
    explore_bounded(2, GRID_BUDGET, || every_block_of_every_rank(true));
}

/// Teeth: the cross-rank barrier alone orders block 1 with block 1 only.
#[test]
#[should_panic]
fn mutant_cross_rank_barrier_alone_is_caught() {
    explore_bounded(2, GRID_BUDGET, || every_block_of_every_rank(false));
}
