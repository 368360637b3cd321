//! The byte movers between the ranks' segments (all-to-all, gather, scatter) on the host
//! backend's emulated grids, checked byte for byte against a reference built from the inputs:
//! every rank count from 1 to 6, every root, counts with odd tails, buffers at offsets of
//! every alignment, in place and out of place, several grids. Guard bytes after every buffer
//! must not change, nor the buffers a collective does not write (send buffers, and the receive
//! buffers of the ranks that are not a gather's root).

mod harness;

use harness::{Ranks, Rng};
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::{Algorithm, CollectiveArgs, FLAG_IN_PLACE, FLAG_ROOT, KernelStatus};
use symm_device::{DataType, RedOp};

const TIMEOUT_NS: u64 = 20_000_000_000;

/// Grids the cases run on: (blocks, threads).
const GRIDS: [(u32, u32); 2] = [(1, 1), (3, 4)];

/// Bytes per segment: empty, one, odd tails around the 1 KiB cell and the 16-byte unit.
const COUNTS: [usize; 6] = [0, 1, 7, 1023, 1040, 2061];

/// Where a case's buffers lie in each rank's window, and what they held before the call.
struct Layout {
    send: usize,
    recv: usize,
    window: usize,
}

/// A rank's window before the call: random bytes everywhere (so that guards, stale receive
/// buffers and send buffers all have known contents).
fn fill(ranks: &mut Ranks, world: usize, window: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    (0..world)
        .map(|rank| {
            let bytes: Vec<u8> = (0..window).map(|_| rng.next_u64() as u8).collect();
            ranks.write(rank, 0, &bytes);
            bytes
        })
        .collect()
}

/// Run `algorithm` over `world` ranks with `layout`, `flags[r]` on rank `r`, and compare every
/// rank's whole window with `expected(before)`.
fn run(
    algorithm: Algorithm,
    world: usize,
    count: usize,
    layout: &Layout,
    flags: &[u32],
    seed: u64,
    expected: impl Fn(&[Vec<u8>]) -> Vec<Vec<u8>>,
) {
    for (blocks, threads) in GRIDS {
        let mut ranks = Ranks::new(world, layout.window, TIMEOUT_NS);
        let mut rng = Rng(seed);
        let before = fill(&mut ranks, world, layout.window, &mut rng);
        let args = CollectiveArgs {
            send_offset: layout.send as u64,
            recv_offset: layout.recv as u64,
            count: count as u64,
            flags: 0,
        };
        let statuses = ranks.launch_with_rank_flags(
            kernel(algorithm, DataType::Uint8, RedOp::Sum),
            args,
            blocks,
            threads,
            None,
            flags,
        );
        let case = format!(
            "{} world {world} count {count} send {} recv {} flags {flags:?} grid {blocks}x{threads}",
            algorithm.name(),
            layout.send,
            layout.recv
        );
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "{case}: {statuses:?}"
        );
        let want = expected(&before);
        for (rank, want) in want.iter().enumerate() {
            let got: Vec<u8> = ranks.read(rank, 0, layout.window);
            if let Some(at) = (0..layout.window).find(|&i| got[i] != want[i]) {
                panic!(
                    "{case}: rank {rank}, byte {at} of the window: {} instead of {}",
                    got[at], want[at]
                );
            }
        }
    }
}

/// Offsets of every alignment the kernels pick a unit by (16, 8, 4, 1).
const LEADS: [usize; 4] = [16, 8, 4, 3];

#[test]
fn all_to_all_for_1_to_6_ranks() {
    let mut seed = 0;
    for world in 1..=6 {
        for count in COUNTS {
            for lead in LEADS {
                seed += 1;
                let whole = world * count;
                let layout = Layout {
                    send: lead,
                    recv: lead + whole + 5,
                    window: 2 * lead + 2 * whole + 32,
                };
                run(
                    Algorithm::AllToAll,
                    world,
                    count,
                    &layout,
                    &vec![0; world],
                    seed,
                    |before| {
                        let mut after = before.to_vec();
                        for (p, window) in after.iter_mut().enumerate() {
                            for (r, sender) in before.iter().enumerate() {
                                let from = layout.send + p * count;
                                let to = layout.recv + r * count;
                                window[to..to + count].copy_from_slice(&sender[from..from + count]);
                            }
                        }
                        after
                    },
                );
            }
        }
    }
}

#[test]
fn gather_from_every_root_for_1_to_6_ranks() {
    let mut seed = 100_000;
    for world in 1..=6 {
        for root in 0..world {
            for count in COUNTS {
                for (lead, in_place) in [(16, false), (3, false), (8, true), (3, true)] {
                    seed += 1;
                    let whole = world * count;
                    // In place, the root's send buffer is its segment of the receive buffer
                    // (the other ranks' send buffers lie at the same offset).
                    let (send, recv) = if in_place {
                        (lead + root * count, lead)
                    } else {
                        (lead + whole + 5, lead)
                    };
                    let layout = Layout {
                        send,
                        recv,
                        window: 2 * lead + 2 * whole + 32,
                    };
                    let flags: Vec<u32> = (0..world)
                        .map(|r| match (r == root, in_place) {
                            (true, true) => FLAG_ROOT | FLAG_IN_PLACE,
                            (true, false) => FLAG_ROOT,
                            (false, _) => 0,
                        })
                        .collect();
                    run(
                        Algorithm::Gather,
                        world,
                        count,
                        &layout,
                        &flags,
                        seed,
                        |before| {
                            let mut after = before.to_vec();
                            for (r, sender) in before.iter().enumerate() {
                                let to = recv + r * count;
                                after[root][to..to + count]
                                    .copy_from_slice(&sender[send..send + count]);
                            }
                            after
                        },
                    );
                }
            }
        }
    }
}

#[test]
fn scatter_from_every_root_for_1_to_6_ranks() {
    let mut seed = 200_000;
    for world in 1..=6 {
        for root in 0..world {
            for count in COUNTS {
                for (lead, in_place) in [(16, false), (3, false), (8, true), (3, true)] {
                    seed += 1;
                    let whole = world * count;
                    // In place, the root's receive buffer is its segment of the send buffer
                    // (the other ranks' receive buffers lie at the same offset).
                    let (send, recv) = if in_place {
                        (lead, lead + root * count)
                    } else {
                        (lead, lead + whole + 5)
                    };
                    let layout = Layout {
                        send,
                        recv,
                        window: 2 * lead + 2 * whole + 32,
                    };
                    let flags: Vec<u32> = (0..world)
                        .map(|r| match (r == root, in_place) {
                            (true, true) => FLAG_ROOT | FLAG_IN_PLACE,
                            (true, false) => FLAG_ROOT,
                            (false, _) => 0,
                        })
                        .collect();
                    run(
                        Algorithm::Scatter,
                        world,
                        count,
                        &layout,
                        &flags,
                        seed,
                        |before| {
                            let mut after = before.to_vec();
                            let source = &before[root];
                            for (p, window) in after.iter_mut().enumerate() {
                                let from = send + p * count;
                                window[recv..recv + count]
                                    .copy_from_slice(&source[from..from + count]);
                            }
                            after
                        },
                    );
                }
            }
        }
    }
}
