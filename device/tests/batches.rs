//! Batches run directly by the kernels: several tasks in one launch, cells dealt evenly among
//! blocks, ranks that differ task by task in being in place (the one-shot protocol's owed round
//! barriers), and launches of every kernel one after the other on one window with changing
//! grids and batch sizes (barrier epochs and LL call numbers stay in agreement). Every result
//! is checked exactly (i32 wrapping sum, computed here; broadcasts: the root's data, each task
//! from its own root; all-to-all, gather and scatter: the segments where they belong).

mod harness;

use harness::{BatchTask, Ranks, Rng};
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::all_reduce::UNROLL;
use symm_device::symmetric::batch::task_cells;
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::{CollectiveArgs, FLAG_IN_PLACE, FLAG_ROOT, KernelStatus};
use symm_device::sync::signal_pad::LL_LINES;
use symm_device::{DataType, RedOp};

const TIMEOUT_NS: u64 = 20_000_000_000;
const WINDOW: usize = 1 << 20;

/// One task of a batch: where its buffers lie (the same offsets on every rank), which ranks
/// run it in place, and (broadcasts) its root.
#[derive(Clone, Debug)]
struct Spec {
    count: usize,
    send: usize,
    recv: usize,
    in_place: Vec<bool>,
    root: usize,
}

fn is_all_gather(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::AllGather | Algorithm::LlAllGather | Algorithm::PatAllGather
    )
}

/// The kernels whose task has a root (its entry carries `FLAG_ROOT` on that rank).
fn is_rooted(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::Broadcast | Algorithm::Gather | Algorithm::Scatter
    )
}

/// The byte movers between segments, run out of place here (in place is covered by
/// `device/tests/segments.rs`).
fn is_segment_mover(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::AllToAll | Algorithm::Gather | Algorithm::Scatter
    )
}

fn is_reduce_scatter(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::ReduceScatter | Algorithm::PatReduceScatter
    )
}

/// The PAT kernels run one task per launch (the host never fuses them).
fn is_pat(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::PatAllGather | Algorithm::PatReduceScatter
    )
}

/// Random tasks for `algorithm` whose buffers lie one after the other from byte 64; LL batches
/// stay within the LL lines.
fn random_batch(rng: &mut Rng, algorithm: Algorithm, world: usize, tasks: usize) -> Vec<Spec> {
    let ll = matches!(
        algorithm,
        Algorithm::OneShotLlAllReduce | Algorithm::LlAllGather
    );
    let max = if ll {
        // i32 (or bytes of i32) per task so that the batch fits the lines.
        (LL_LINES * 2 / tasks).max(1)
    } else {
        // Two regions of up to `world` shares each per task, with room for alignment.
        (WINDOW * 3 / 4 / (tasks * world * 8) - 16).min(3000)
    };
    let mut next = 64usize;
    let mut take = |rng: &mut Rng, bytes: usize| {
        // Sometimes 16-byte aligned, sometimes only 4.
        let at = next.next_multiple_of(16) + 4 * (rng.next_u64() % 2) as usize;
        next = at + bytes;
        assert!(next <= WINDOW);
        at
    };
    (0..tasks)
        .map(|_| {
            let count = match rng.next_u64() % 5 {
                0 => 1 + (rng.next_u64() % 3) as usize,
                1 => max,
                _ => 1 + (rng.next_u64() % max as u64) as usize,
            }
            .min(max);
            let bytes = count * 4;
            let (send_bytes, recv_bytes) = match algorithm {
                _ if is_all_gather(algorithm) => (bytes, world * bytes),
                _ if is_reduce_scatter(algorithm) => (world * bytes, bytes),
                Algorithm::AllToAll => (world * bytes, world * bytes),
                Algorithm::Gather => (bytes, world * bytes),
                Algorithm::Scatter => (world * bytes, bytes),
                _ => (bytes, bytes),
            };
            // Two-shot: every rank in place or none; the others: rank by rank.
            let uniform = rng.next_u64().is_multiple_of(2);
            let in_place: Vec<bool> = (0..world)
                .map(|_| {
                    if algorithm == Algorithm::TwoShotAllReduce {
                        uniform
                    } else {
                        rng.next_u64().is_multiple_of(2)
                    }
                })
                .collect();
            let whole = take(rng, send_bytes.max(recv_bytes));
            let other = take(rng, recv_bytes.max(send_bytes));
            let root = if is_rooted(algorithm) {
                (rng.next_u64() % world as u64) as usize
            } else {
                0
            };
            Spec {
                count,
                send: whole,
                recv: other,
                in_place,
                root,
            }
        })
        .collect()
}

fn value(rank: usize, task: usize, index: usize, salt: u64) -> i32 {
    (((rank * 1_000_003 + task * 7919 + index * 31) as u64 ^ salt) % 200_003) as i32 - 100_000
}

/// Launch `specs` as one batch of `algorithm` (i32 sum; all-gathers move the i32's bytes) on
/// `blocks` × `threads`, and check every rank's results.
fn run_batch(
    ranks: &mut Ranks,
    algorithm: Algorithm,
    specs: &[Spec],
    blocks: u32,
    threads: u32,
    salt: u64,
    what: &str,
) {
    let world = ranks.world();
    let broadcast = algorithm == Algorithm::Broadcast;
    // Inputs, and poisoned receive buffers.
    for (t, spec) in specs.iter().enumerate() {
        for rank in 0..world {
            // Only a broadcast's root can be in place (see `batch_for`); its data is then in
            // its receive buffer.
            let in_place = spec.in_place[rank] && !broadcast;
            let n = spec.count;
            let len = match algorithm {
                _ if is_reduce_scatter(algorithm) => world * n,
                Algorithm::AllToAll | Algorithm::Scatter => world * n,
                _ => n,
            };
            let data: Vec<i32> = (0..len).map(|i| value(rank, t, i, salt)).collect();
            if !in_place {
                let len = match algorithm {
                    _ if is_all_gather(algorithm) => n * world,
                    Algorithm::AllToAll | Algorithm::Gather => n * world,
                    _ => n,
                };
                ranks.write(rank, spec.recv, &vec![0x5A5A_5A5Au32 as i32; len]);
            }
            ranks.write(rank, spec.send, &data);
            if broadcast && spec.in_place[rank] {
                ranks.write(rank, spec.recv, &data);
            }
        }
    }
    let mut tasks = Vec::new();
    let mut first_cell = 0u64;
    for spec in specs {
        let units = if algorithm.is_data_type_agnostic() {
            spec.count as u64 * 4
        } else {
            spec.count as u64
        };
        tasks.push(BatchTask {
            args: CollectiveArgs {
                send_offset: spec.send as u64,
                recv_offset: spec.recv as u64,
                count: units,
                flags: 0,
            },
            first_cell,
        });
        first_cell += task_cells(algorithm, 4, units);
    }
    // In place, the kernels derive the buffer they do not use from the other one; the entries
    // still carry this rank's offsets.
    let flags: Vec<Vec<u32>> = (0..world)
        .map(|rank| {
            specs
                .iter()
                .map(|s| {
                    let root = if is_rooted(algorithm) && s.root == rank {
                        FLAG_ROOT
                    } else {
                        0
                    };
                    root | if s.in_place[rank] { FLAG_IN_PLACE } else { 0 }
                })
                .collect()
        })
        .collect();
    let in_place_recv: Vec<Vec<usize>> = (0..world)
        .map(|rank| {
            specs
                .iter()
                .map(|s| match s.in_place[rank] {
                    _ if broadcast => s.recv,
                    true if is_reduce_scatter(algorithm) => s.send + rank * s.count * 4,
                    true => s.send,
                    false => s.recv,
                })
                .collect()
        })
        .collect();
    // All-gathers run every rank out of place here (see `batch_for`).
    assert!(!is_all_gather(algorithm) || specs.iter().all(|s| s.in_place.iter().all(|p| !p)));
    let statuses = ranks.launch_batch(
        kernel(algorithm, DataType::Int32, RedOp::Sum),
        &tasks,
        &flags,
        blocks,
        threads,
        None,
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{what}: {statuses:?}"
    );
    for (t, spec) in specs.iter().enumerate() {
        let n = spec.count;
        let sum = |index: usize| {
            (0..world).fold(0i32, |acc, r| acc.wrapping_add(value(r, t, index, salt)))
        };
        for (rank, recv_of) in in_place_recv.iter().enumerate() {
            let at = recv_of[t];
            let (got, expected): (Vec<i32>, Vec<i32>) = if algorithm == Algorithm::AllToAll {
                (
                    ranks.read(rank, at, world * n),
                    (0..world)
                        .flat_map(|r| (0..n).map(move |i| (r, i)))
                        .map(|(r, i)| value(r, t, rank * n + i, salt))
                        .collect(),
                )
            } else if algorithm == Algorithm::Gather {
                // Only the root's receive buffer is written; the others keep their poison.
                (
                    ranks.read(rank, at, world * n),
                    (0..world)
                        .flat_map(|r| (0..n).map(move |i| (r, i)))
                        .map(|(r, i)| {
                            if rank == spec.root {
                                value(r, t, i, salt)
                            } else {
                                0x5A5A_5A5Au32 as i32
                            }
                        })
                        .collect(),
                )
            } else if algorithm == Algorithm::Scatter {
                (
                    ranks.read(rank, at, n),
                    (0..n)
                        .map(|i| value(spec.root, t, rank * n + i, salt))
                        .collect(),
                )
            } else if broadcast {
                (
                    ranks.read(rank, at, n),
                    (0..n).map(|i| value(spec.root, t, i, salt)).collect(),
                )
            } else if is_all_gather(algorithm) {
                (
                    ranks.read(rank, at, world * n),
                    (0..world)
                        .flat_map(|r| (0..n).map(move |i| (r, i)))
                        .map(|(r, i)| value(r, t, i, salt))
                        .collect(),
                )
            } else if is_reduce_scatter(algorithm) {
                (
                    ranks.read(rank, at, n),
                    (0..n).map(|i| sum(rank * n + i)).collect(),
                )
            } else {
                (ranks.read(rank, at, n), (0..n).map(sum).collect())
            };
            if got != expected {
                let i = (0..got.len()).find(|&i| got[i] != expected[i]).unwrap();
                panic!(
                    "{what}: task {t} {spec:?}, rank {rank}: element {i} is {}, expected {}",
                    got[i], expected[i]
                );
            }
        }
    }
}

/// All-gathers are run with every rank out of place here (in place they read their segment
/// from the receive buffer, covered through the C ABI); the reductions with random in-place
/// ranks; broadcasts with a random root, in place or not (the other ranks out of place: in
/// place means nothing there).
fn batch_for(rng: &mut Rng, algorithm: Algorithm, world: usize, tasks: usize) -> Vec<Spec> {
    let mut specs = random_batch(rng, algorithm, world, tasks);
    if is_all_gather(algorithm) || is_segment_mover(algorithm) {
        for s in &mut specs {
            s.in_place.iter_mut().for_each(|p| *p = false);
        }
    }
    if algorithm == Algorithm::Broadcast {
        for s in &mut specs {
            for (rank, p) in s.in_place.iter_mut().enumerate() {
                *p &= rank == s.root;
            }
        }
    }
    specs
}

#[test]
fn every_kernel_runs_batches_exactly() {
    let mut rng = Rng(0xBA7C);
    for world in [2usize, 3] {
        let mut ranks = Ranks::new(world, WINDOW, TIMEOUT_NS);
        for algorithm in Algorithm::COLLECTIVES {
            for (tasks, blocks) in [(1usize, 1u32), (5, 3), (23, 2), (64, 4)] {
                if is_pat(algorithm) && tasks > 1 {
                    // Refused: `pat_kernels_refuse_batches_of_several_tasks`.
                    continue;
                }
                let specs = batch_for(&mut rng, algorithm, world, tasks);
                let what = format!("{world} ranks, {algorithm:?}, {tasks} tasks, {blocks} blocks");
                run_batch(
                    &mut ranks,
                    algorithm,
                    &specs,
                    blocks,
                    4,
                    rng.next_u64(),
                    &what,
                );
            }
        }
    }
}

/// Lay the i32 buffers of `specs` one after the other from byte 64, every send and receive
/// buffer 16-byte aligned (the pack rounds and the shares need aligned buffers).
fn lay_out_aligned(specs: &mut [Spec]) {
    let mut next = 64;
    for spec in specs {
        spec.send = next;
        spec.recv = next + spec.count * 4 + 16;
        next = (spec.recv + spec.count * 4 + 32).next_multiple_of(16);
    }
    assert!(next <= WINDOW, "{next}");
}

/// One-shot with ranks in place for some tasks and not others, in every combination over two
/// ranks and three tasks that take several rounds each (the out-of-place ranks owe their round
/// barriers and announce them with their next barrier): exact, and no wait times out.
#[test]
fn one_shot_mixed_in_place_ranks_task_by_task() {
    let mut ranks = Ranks::new(2, WINDOW, TIMEOUT_NS);
    let mut rng = Rng(0x0115);
    for pattern in 0u32..64 {
        let mut specs = random_batch(&mut rng, Algorithm::OneShotAllReduce, 2, 3);
        for (t, spec) in specs.iter_mut().enumerate() {
            // Several rounds per block part: UNROLL × threads elements is a round.
            spec.count = 700 + 300 * t;
            spec.in_place = (0..2).map(|r| pattern >> (2 * t + r) & 1 == 1).collect();
        }
        // Re-lay the buffers for the new counts.
        let mut next = 64;
        for spec in &mut specs {
            spec.send = next;
            spec.recv = next + spec.count * 4 + 16;
            next = spec.recv + spec.count * 4 + 32;
        }
        let what = format!("pattern {pattern:06b}");
        // Two threads per block, or one (the host backend's fast mode: a round barrier every
        // UNROLL elements).
        let threads = 1 + pattern % 2;
        run_batch(
            &mut ranks,
            Algorithm::OneShotAllReduce,
            &specs,
            2,
            threads,
            rng.next_u64(),
            &what,
        );
    }
}

/// The same with 16-byte aligned send buffers and blocks wide enough for the pack rounds
/// (`threads >= 2 × lanes`): each block part takes several rounds of `threads × UNROLL × 4`
/// i32, and the out-of-place ranks owe as many barriers as the pack rounds take.
#[test]
fn one_shot_mixed_in_place_ranks_in_pack_rounds() {
    let threads = 8;
    let per_round = threads as usize * UNROLL as usize * 4;
    let mut ranks = Ranks::new(2, WINDOW, TIMEOUT_NS);
    let mut rng = Rng(0x0116);
    for pattern in [0b000110u32, 0b011001, 0b100101, 0b111111, 0b010010] {
        let mut specs = random_batch(&mut rng, Algorithm::OneShotAllReduce, 2, 3);
        for (t, spec) in specs.iter_mut().enumerate() {
            // Two blocks: each block part spans two to three rounds and a partial one.
            spec.count = 2 * (2 * per_round + 1000 * t) + 13;
            spec.in_place = (0..2).map(|r| pattern >> (2 * t + r) & 1 == 1).collect();
        }
        lay_out_aligned(&mut specs);
        let what = format!("pattern {pattern:06b}, pack rounds");
        run_batch(
            &mut ranks,
            Algorithm::OneShotAllReduce,
            &specs,
            2,
            threads,
            rng.next_u64(),
            &what,
        );
    }
}

/// One-shot batches whose every task is run in place by every rank, with block parts of several
/// rounds: the start barrier's vote lets the ranks share each part out (no round barriers), so
/// block 0 passes two barriers, start and end, whatever the length. With one rank out of place
/// for one task the rounds are taken. Exact either way, for 2 to 5 ranks, with tails that are
/// not whole packs.
#[test]
fn one_shot_with_every_rank_in_place_passes_only_start_and_end_barriers() {
    let threads = 8;
    let per_round = threads as usize * UNROLL as usize * 4;
    for world in 2..=5 {
        let mut ranks = Ranks::new(world, WINDOW, TIMEOUT_NS);
        let mut rng = Rng(0x0117 + world as u64);
        for mixed in [false, true, false] {
            let mut specs = random_batch(&mut rng, Algorithm::OneShotAllReduce, world, 2);
            for (t, spec) in specs.iter_mut().enumerate() {
                // Two blocks: each block part spans three rounds and more.
                spec.count = 2 * (3 * per_round + 500 * t) + 7 + t;
                spec.in_place = (0..world)
                    .map(|r| !(mixed && t == 1 && r == world - 1))
                    .collect();
            }
            lay_out_aligned(&mut specs);
            let epochs = |ranks: &Ranks| -> Vec<u32> {
                (0..world).map(|r| ranks.inbox(r, 0, r as u32)).collect()
            };
            let before = epochs(&ranks);
            let what = format!("{world} ranks, one rank out of place for a task: {mixed}");
            run_batch(
                &mut ranks,
                Algorithm::OneShotAllReduce,
                &specs,
                2,
                threads,
                rng.next_u64(),
                &what,
            );
            for (rank, after) in epochs(&ranks).into_iter().enumerate() {
                let passed = after.wrapping_sub(before[rank]);
                if mixed {
                    assert!(passed > 2, "{what}: rank {rank} passed {passed} barriers");
                } else {
                    assert_eq!(passed, 2, "{what}: rank {rank} passed {passed} barriers");
                }
            }
        }
    }
}

/// Every kernel, one after the other on one window, with batch sizes and grids changing at
/// every launch (including batches of one, as an unfused call is, and the PAT kernels, which
/// run one task).
#[test]
fn launches_of_every_kernel_follow_each_other_on_one_window() {
    let mut rng = Rng(0x5E0);
    let mut ranks = Ranks::new(3, WINDOW, TIMEOUT_NS);
    for step in 0..60 {
        let algorithm =
            Algorithm::COLLECTIVES[(rng.next_u64() % Algorithm::COLLECTIVES.len() as u64) as usize];
        let tasks = if is_pat(algorithm) {
            1
        } else {
            [1usize, 1, 2, 7, 30][(rng.next_u64() % 5) as usize]
        };
        let blocks = 1 + (rng.next_u64() % 4) as u32;
        // One thread per block is the host backend's fast mode.
        let threads = [1u32, 2, 4, 8][(rng.next_u64() % 4) as usize];
        let specs = batch_for(&mut rng, algorithm, 3, tasks);
        let what = format!("step {step}: {algorithm:?}, {tasks} tasks, {blocks}x{threads}");
        run_batch(
            &mut ranks,
            algorithm,
            &specs,
            blocks,
            threads,
            rng.next_u64(),
            &what,
        );
    }
}

/// A PAT kernel given a work table of several tasks refuses the launch on every rank, before
/// any synchronization or data movement: no wait, nothing written, and the window's PAT round
/// counters and barrier state unchanged, so the next launch runs as if the refused one had not
/// been made.
#[test]
fn pat_kernels_refuse_batches_of_several_tasks() {
    let mut rng = Rng(0x9A7);
    let world = 3;
    let mut ranks = Ranks::new(world, WINDOW, TIMEOUT_NS);
    for algorithm in [Algorithm::PatAllGather, Algorithm::PatReduceScatter] {
        let specs = batch_for(&mut rng, algorithm, world, 4);
        let before: Vec<Vec<u8>> = (0..world).map(|r| ranks.window(r).to_vec()).collect();
        let tasks: Vec<BatchTask> = specs
            .iter()
            .map(|spec| BatchTask {
                args: CollectiveArgs {
                    send_offset: spec.send as u64,
                    recv_offset: spec.recv as u64,
                    count: spec.count as u64 * if is_all_gather(algorithm) { 4 } else { 1 },
                    flags: 0,
                },
                first_cell: 0,
            })
            .collect();
        let statuses = ranks.launch_batch(
            kernel(algorithm, DataType::Int32, RedOp::Sum),
            &tasks,
            &[],
            2,
            4,
            None,
        );
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::InvalidLaunch),
            "{algorithm:?}: {statuses:?}"
        );
        for (rank, window) in before.iter().enumerate() {
            assert!(
                ranks.window(rank) == window.as_slice(),
                "{algorithm:?}: rank {rank}"
            );
        }
        // The window still works: one task of the same kernel, checked exactly.
        let one = batch_for(&mut rng, algorithm, world, 1);
        run_batch(
            &mut ranks,
            algorithm,
            &one,
            2,
            4,
            rng.next_u64(),
            "after the refusal",
        );
    }
}
