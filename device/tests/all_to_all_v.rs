//! The all-to-all-v kernel (counts in device memory) against a reference on the host model of
//! the ranks: random counts (zeros included) for 1 to 6 ranks and every element size, batches,
//! long sequences mixed with the fixed-count all-to-all on one window, every refusal (the same
//! on every rank, nothing written), and a missing rank.

mod harness;

use harness::{Ranks, Rng};
use symm_device::symmetric::all_to_all_v::{
    ABORT_COUNTS_REFUSED, CountsRefusal, ELEMENT_BYTES_SHIFT, abort_counts_refused,
    refused_counts_at,
};
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::{Algorithm, KernelStatus, TaskArgs};
use symm_device::{DataType, RedOp};

const TIMEOUT_NS: u64 = 2_000_000_000;

/// Where one task's buffers lie in every rank's window.
#[derive(Clone, Copy, Debug)]
struct Layout {
    send: usize,
    recv: usize,
    table: usize,
    /// Elements of the send buffer (every row's bound); `bound` is the receive buffer's (every
    /// column's).
    send_bound: usize,
    bound: usize,
    element: usize,
}

impl Layout {
    /// Send buffer, receive buffer (both of `bound` elements) and table one after the other
    /// from `start`.
    fn at(start: usize, bound: usize, element: usize) -> Layout {
        Layout::with_bounds(start, bound, bound, element)
    }

    /// As [`Layout::at`], the send buffer of `send_bound` elements.
    fn with_bounds(start: usize, send_bound: usize, bound: usize, element: usize) -> Layout {
        let round = |x: usize| x.div_ceil(16) * 16;
        let send = round(start);
        let recv = round(send + send_bound * element);
        let table = round(recv + bound * element);
        Layout {
            send,
            recv,
            table,
            send_bound,
            bound,
            element,
        }
    }

    fn end(&self, world: usize) -> usize {
        self.table + 3 * world * 8
    }
}

fn kernel_fn() -> symm_device::symmetric::dispatch::KernelFn {
    kernel(Algorithm::AllToAllV, DataType::Uint8, RedOp::Sum)
}

/// The work table of `tasks` on every rank (`element` bytes per element).
fn table_of(ranks: &Ranks, tasks: &[Layout]) -> Vec<TaskArgs> {
    (0..ranks.world())
        .flat_map(|r| {
            let context = ranks.context_address(r) as u64;
            tasks.iter().map(move |t| TaskArgs {
                send_context: context,
                recv_context: context,
                send_offset: t.send as u64,
                recv_offset: t.recv as u64,
                count: (t.bound * t.element) as u64,
                send_capacity: (t.send_bound * t.element) as u64,
                first_cell: 0,
                flags: (t.element as u32) << ELEMENT_BYTES_SHIFT,
                reserved: 0,
                counts_context: context,
                counts_offset: t.table as u64,
            })
        })
        .collect()
}

/// Random counts `counts[from][to]` whose rows and columns fit `bound`, zeros included.
fn random_counts(rng: &mut Rng, world: usize, bound: usize) -> Vec<Vec<i64>> {
    let share = bound / world.max(1);
    (0..world)
        .map(|_| {
            (0..world)
                .map(|_| match rng.next_u64() % 4 {
                    0 => 0,
                    1 => share as i64,
                    _ => (rng.next_u64() % (share as u64 + 1)) as i64,
                })
                .collect()
        })
        .collect()
}

/// Fill every rank's window with a pattern, its send buffer with values naming (rank, index)
/// and its table's row 0 with `counts[rank]`.
fn plant(ranks: &mut Ranks, layout: &Layout, counts: &[Vec<i64>], salt: u8) {
    for (r, row) in counts.iter().enumerate() {
        let bytes: Vec<u8> = (0..ranks.window_bytes)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt ^ r as u8))
            .collect();
        if salt == 0 {
            ranks.write(r, 0, &bytes);
        }
        let send: Vec<u8> = (0..layout.send_bound * layout.element)
            .map(|i| (i as u8).wrapping_mul(7).wrapping_add(r as u8 * 13 + salt))
            .collect();
        ranks.write(r, layout.send, &send);
        ranks.write(r, layout.table, row);
    }
}

/// Every rank's window as the reference says it is after the call.
fn expected(ranks: &mut Ranks, layout: &Layout, counts: &[Vec<i64>]) -> Vec<Vec<u8>> {
    let world = ranks.world();
    let before: Vec<Vec<u8>> = (0..world)
        .map(|r| ranks.read::<u8>(r, 0, ranks.window_bytes))
        .collect();
    let e = layout.element;
    let mut after = before.clone();
    for to in 0..world {
        let mut at = 0usize;
        for from in 0..world {
            let n = counts[from][to] as usize;
            let src: usize = counts[from][..to].iter().sum::<i64>() as usize;
            let src = layout.send + src * e;
            let dst = layout.recv + at * e;
            after[to][dst..dst + n * e].copy_from_slice(&before[from][src..src + n * e]);
            let row = |k: usize, q: usize| layout.table + (k * world + q) * 8;
            after[to][row(1, from)..row(1, from) + 8].copy_from_slice(&(n as u64).to_ne_bytes());
            after[to][row(2, from)..row(2, from) + 8].copy_from_slice(&(at as u64).to_ne_bytes());
            at += n;
        }
    }
    after
}

fn check_windows(ranks: &mut Ranks, expected: &[Vec<u8>], what: &str) {
    for (r, want) in expected.iter().enumerate() {
        let got = ranks.read::<u8>(r, 0, ranks.window_bytes);
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "{what}: rank {r}, byte {i} of the window: {} where {} is expected",
                got[i], want[i]
            );
        }
    }
}

#[test]
fn random_counts_match_the_reference() {
    let mut rng = Rng(0xA11_70A11);
    for world in 1..=6usize {
        for element in [1usize, 2, 4, 8] {
            for round in 0..4 {
                let bound = [1usize, 7, 300, 4099][round] * world;
                let layout = Layout::at(16 * (round + 1), bound, element);
                let mut ranks = Ranks::new(world, layout.end(world) + 48, TIMEOUT_NS);
                let counts = random_counts(&mut rng, world, bound);
                plant(&mut ranks, &layout, &counts, 0);
                let want = expected(&mut ranks, &layout, &counts);
                let blocks = 1 + (rng.next_u64() % 4) as u32;
                let threads = [1u32, 3, 8][(rng.next_u64() % 3) as usize];
                let statuses = ranks.run_table(
                    &table_of(&ranks, &[layout]),
                    1,
                    kernel_fn(),
                    blocks,
                    threads,
                );
                let what = format!("{world} ranks, {element}-byte elements, bound {bound}");
                assert!(
                    statuses.iter().all(|s| *s == KernelStatus::Completed),
                    "{what}: {statuses:?}"
                );
                check_windows(&mut ranks, &want, &what);
            }
        }
    }
}

/// Counts that fill the bound exactly (every row and column sums to it) are accepted.
#[test]
fn counts_at_the_bound_are_accepted() {
    let world = 4;
    let layout = Layout::at(0, 40, 4);
    let mut ranks = Ranks::new(world, layout.end(world), TIMEOUT_NS);
    let counts: Vec<Vec<i64>> = (0..world)
        .map(|r| {
            (0..world)
                .map(|p| if p == (r + 1) % world { 40 } else { 0 })
                .collect()
        })
        .collect();
    plant(&mut ranks, &layout, &counts, 0);
    let want = expected(&mut ranks, &layout, &counts);
    let statuses = ranks.run_table(&table_of(&ranks, &[layout]), 1, kernel_fn(), 3, 4);
    assert!(statuses.iter().all(|s| *s == KernelStatus::Completed));
    check_windows(&mut ranks, &want, "counts at the bound");
}

/// The two bounds are separate: a rank may receive more than its send buffer holds (up to its
/// receive buffer), or send more than its receive buffer holds (up to its send buffer); one
/// element past the larger bound refuses.
#[test]
fn the_send_and_receive_bounds_are_separate() {
    let world = 3;
    for (send_bound, bound) in [(10usize, 25usize), (25, 10)] {
        let layout = Layout::with_bounds(0, send_bound, bound, 2);
        // Receives past the send bound (rank 1 gets 20 of 25), or sends past the receive
        // bound (rank 2 sends 20 of 25 to three ranks, none past 10).
        let accepted: Vec<Vec<i64>> = if bound > send_bound {
            vec![vec![0, 10, 0], vec![0, 0, 0], vec![0, 10, 0]]
        } else {
            vec![vec![0, 0, 0], vec![0, 0, 0], vec![10, 5, 5]]
        };
        let mut refused = accepted.clone();
        if bound > send_bound {
            // Rank 1 would receive 26: 1 more than its receive buffer holds.
            refused[1][1] = 6;
        } else {
            // Rank 2 would send 26 (no rank receiving more than 10): 1 more than its send
            // buffer holds.
            refused[2] = vec![10, 10, 6];
        }
        for (counts, ok) in [(accepted, true), (refused, false)] {
            let what = format!("send bound {send_bound}, receive bound {bound}, {counts:?}");
            let mut ranks = Ranks::new(world, layout.end(world), TIMEOUT_NS);
            plant(&mut ranks, &layout, &counts, 0);
            let want = expected(&mut ranks, &layout, &counts);
            let statuses = ranks.run_table(&table_of(&ranks, &[layout]), 1, kernel_fn(), 2, 4);
            let status = if ok {
                KernelStatus::Completed
            } else {
                KernelStatus::Aborted
            };
            assert!(
                statuses.iter().all(|s| *s == status),
                "{what}: {statuses:?}"
            );
            if ok {
                check_windows(&mut ranks, &want, &what);
            }
        }
    }
}

/// The count table may lie in another window than the buffers (PyTorch's three symmetric
/// tensors): the kernel reads and writes it there.
#[test]
fn the_table_in_another_window() {
    let mut rng = Rng(0x7AB1E);
    for world in [2usize, 4] {
        let layout = Layout::with_bounds(0, 50 * world, 70 * world, 4);
        let mut ranks = Ranks::new(world, layout.table, TIMEOUT_NS);
        let mut tables = Ranks::new(world, 3 * world * 8 + 64, TIMEOUT_NS);
        let counts = random_counts(&mut rng, world, 50 * world);
        // The reference sees the table at its offset in a window holding both.
        let mut reference = Ranks::new(world, layout.end(world), TIMEOUT_NS);
        plant(&mut reference, &layout, &counts, 0);
        let want = expected(&mut reference, &layout, &counts);
        for (r, row) in counts.iter().enumerate() {
            let window = reference.read::<u8>(r, 0, layout.table);
            ranks.write(r, 0, &window);
            tables.write(r, 32, row);
        }
        let table: Vec<TaskArgs> = table_of(
            &ranks,
            &[Layout {
                table: 32,
                ..layout
            }],
        )
        .into_iter()
        .enumerate()
        .map(|(r, entry)| TaskArgs {
            counts_context: tables.context_address(r) as u64,
            ..entry
        })
        .collect();
        let statuses = ranks.run_table(&table, 1, kernel_fn(), 3, 4);
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "{statuses:?}"
        );
        for (r, want) in want.iter().enumerate() {
            assert_eq!(
                ranks.read::<u8>(r, 0, layout.table),
                want[..layout.table].to_vec()
            );
            let rows = tables.read::<i64>(r, 32, 3 * world);
            let expected_rows: Vec<i64> = want[layout.table..layout.end(world)]
                .chunks(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(rows, expected_rows, "{world} ranks: rank {r}'s table");
        }
        // A table context of another communicator size refuses the launch.
        let other = Ranks::new(world + 1, 1024, TIMEOUT_NS);
        let bad: Vec<TaskArgs> = table
            .iter()
            .enumerate()
            .map(|(r, entry)| TaskArgs {
                counts_context: other.context_address(r) as u64,
                ..*entry
            })
            .collect();
        let statuses = ranks.run_table(&bad, 1, kernel_fn(), 1, 2);
        assert!(statuses.iter().all(|s| *s == KernelStatus::InvalidLaunch));
    }
}

/// Several tasks in one launch, each with its own buffers and table.
#[test]
fn batches_of_several_tasks_match_the_reference() {
    let mut rng = Rng(0xBA7);
    for world in [2usize, 3, 5] {
        let mut layouts = Vec::new();
        let mut start = 0;
        for t in 0..4 {
            let layout =
                Layout::with_bounds(start, 33 * world + t, 40 * world + 3 * t, [1, 2, 4, 8][t]);
            start = layout.end(world) + 8;
            layouts.push(layout);
        }
        let all_counts: Vec<_> = layouts
            .iter()
            .map(|l| random_counts(&mut rng, world, l.send_bound.min(l.bound)))
            .collect();
        let planted = || {
            let mut ranks = Ranks::new(world, start, TIMEOUT_NS);
            for (i, (layout, counts)) in layouts.iter().zip(&all_counts).enumerate() {
                plant(&mut ranks, layout, counts, i as u8);
            }
            ranks
        };
        // The reference runs the tasks one after the other on a copy.
        let mut reference = planted();
        let mut want = Vec::new();
        for (layout, counts) in layouts.iter().zip(&all_counts) {
            want = expected(&mut reference, layout, counts);
            for (r, w) in want.iter().enumerate() {
                reference.write(r, 0, w);
            }
        }
        let mut fresh = planted();
        let statuses = fresh.run_table(
            &table_of(&fresh, &layouts),
            layouts.len() as u32,
            kernel_fn(),
            2,
            4,
        );
        assert!(statuses.iter().all(|s| *s == KernelStatus::Completed));
        check_windows(&mut fresh, &want, &format!("{world} ranks, a batch of 4"));
    }
}

/// Launches of all-to-all-v and of the fixed-count all-to-all follow each other on one window
/// with changing grids, counts and element sizes: the barrier epochs stay in step.
#[test]
fn a_long_sequence_mixed_with_all_to_all_on_one_window() {
    let world = 3;
    let mut rng = Rng(0x5E9);
    let layout_bound = 64 * world;
    let window = Layout::at(0, layout_bound, 8).end(world) + 64;
    let mut ranks = Ranks::new(world, window, TIMEOUT_NS);
    for step in 0..60 {
        let blocks = 1 + (rng.next_u64() % 4) as u32;
        let threads = [1u32, 2, 8][(rng.next_u64() % 3) as usize];
        if step % 3 == 2 {
            // Fixed-count all-to-all: 16 bytes per peer from offset 0 to offset 64·world.
            let args = symm_device::symmetric::CollectiveArgs {
                send_offset: 0,
                recv_offset: 64 * world as u64,
                count: 16,
                flags: 0,
            };
            let statuses = ranks.launch(
                kernel(Algorithm::AllToAll, DataType::Uint8, RedOp::Sum),
                args,
                blocks,
                threads,
                None,
            );
            assert!(statuses.iter().all(|s| *s == KernelStatus::Completed));
            continue;
        }
        let element = [1usize, 2, 4, 8][(rng.next_u64() % 4) as usize];
        let bound = layout_bound * 8 / element / 2;
        let layout = Layout::at(0, bound.min(layout_bound), element);
        let counts = random_counts(&mut rng, world, layout.bound);
        plant(&mut ranks, &layout, &counts, step as u8);
        let want = expected(&mut ranks, &layout, &counts);
        let statuses = ranks.run_table(
            &table_of(&ranks, &[layout]),
            1,
            kernel_fn(),
            blocks,
            threads,
        );
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "step {step}: {statuses:?}"
        );
        check_windows(&mut ranks, &want, &format!("step {step}"));
    }
}

/// Each offence refuses on every rank with the same abort word (naming the first offending
/// rank and, for a negative count, its peer), and nothing of any window changes: not the
/// receive buffers, not the table's rows 1 and 2.
#[test]
fn every_offence_refuses_on_every_rank_and_writes_nothing() {
    let world = 4;
    let bound = 20;
    type Edit = Box<dyn Fn(&mut Vec<Vec<i64>>)>;
    let cases: Vec<(&str, Edit, u32)> = vec![
        (
            "a negative count",
            Box::new(|c| c[2][1] = -1),
            abort_counts_refused(CountsRefusal::Negative, 2, Some(1)),
        ),
        (
            "a rank's sends over the bound",
            Box::new(|c| c[1][3] = 18),
            abort_counts_refused(CountsRefusal::SendsOverBound, 1, None),
        ),
        (
            "a count far beyond the bound",
            Box::new(|c| c[3][0] = i64::MAX),
            abort_counts_refused(CountsRefusal::SendsOverBound, 3, None),
        ),
        (
            "a rank's receives over the bound",
            Box::new(|c| {
                for row in c.iter_mut() {
                    row[2] = 6;
                }
            }),
            abort_counts_refused(CountsRefusal::ReceivesOverBound, 2, None),
        ),
    ];
    for (what, edit, word) in cases {
        for (blocks, threads) in [(1u32, 1u32), (3, 4)] {
            let layout = Layout::at(0, bound, 4);
            let mut ranks = Ranks::new(world, layout.end(world) + 16, TIMEOUT_NS);
            let mut counts: Vec<Vec<i64>> = vec![vec![5; world]; world];
            for row in counts.iter_mut() {
                row[3] = 0;
            }
            edit(&mut counts);
            plant(&mut ranks, &layout, &counts, 0);
            let before: Vec<Vec<u8>> = (0..world)
                .map(|r| ranks.read::<u8>(r, 0, ranks.window_bytes))
                .collect();
            let statuses = ranks.run_table(
                &table_of(&ranks, &[layout]),
                1,
                kernel_fn(),
                blocks,
                threads,
            );
            assert!(
                statuses.iter().all(|s| *s == KernelStatus::Aborted),
                "{what}: {statuses:?}"
            );
            for r in 0..world {
                assert_eq!(ranks.abort_word(r), word, "{what}: rank {r}'s abort word");
                assert_eq!(word & 0xFF, ABORT_COUNTS_REFUSED);
            }
            check_windows(&mut ranks, &before, what);
            let (rank, peer) = refused_counts_at(word);
            assert!(rank.is_some(), "{what}: the word names the rank");
            assert_eq!(
                peer.is_some(),
                CountsRefusal::from_word(word) == Some(CountsRefusal::Negative)
            );
        }
    }
}

/// A batch whose second task is refused: the first task's data land, nothing of the second is
/// written, every rank raises the same word. With one block per rank (no other block of the
/// rank waits at the closing barrier when the word goes up, and so none abandons it) the ranks
/// leave in step, so that (the abort words cleared, as if the host had not yet looked) later
/// launches on the window pair: a one-shot all-reduce whose first barrier is a vote, then an
/// all-to-all-v, both exact.
#[test]
fn a_refusal_in_a_batch_leaves_the_window_in_step() {
    let world = 3;
    let first = Layout::at(0, 30, 4);
    let second = Layout::at(first.end(world) + 16, 30, 4);
    let window = second.end(world) + 16 + 8192 * 4;
    let mut ranks = Ranks::new(world, window, TIMEOUT_NS);
    let good = vec![vec![10i64; world]; world];
    let mut bad = good.clone();
    bad[1][2] = -5;
    plant(&mut ranks, &first, &good, 0);
    plant(&mut ranks, &second, &bad, 1);
    let before: Vec<Vec<u8>> = (0..world)
        .map(|r| ranks.read::<u8>(r, 0, ranks.window_bytes))
        .collect();
    let want_first = expected(&mut ranks, &first, &good);
    let statuses = ranks.run_table(&table_of(&ranks, &[first, second]), 2, kernel_fn(), 1, 4);
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Aborted),
        "{statuses:?}"
    );
    let word = abort_counts_refused(CountsRefusal::Negative, 1, Some(2));
    for r in 0..world {
        assert_eq!(ranks.abort_word(r), word, "rank {r}");
        let now = ranks.read::<u8>(r, 0, ranks.window_bytes);
        let split = second.send;
        assert!(
            now[..split] == want_first[r][..split],
            "rank {r}: the first task's results"
        );
        assert!(
            now[split..] == before[r][split..],
            "rank {r}: the refused task wrote"
        );
    }
    for r in 0..world {
        ranks.raise_abort(r, 0);
    }
    // A one-shot all-reduce in place of 8192 f32 on 2 blocks: parts longer than a round, so
    // its first barrier is a vote.
    let at = second.end(world).div_ceil(16) * 16;
    for r in 0..world {
        ranks.write(r, at, &vec![r as f32 + 1.0; 8192]);
    }
    let args = symm_device::symmetric::CollectiveArgs {
        send_offset: at as u64,
        recv_offset: at as u64,
        count: 8192,
        flags: symm_device::symmetric::FLAG_IN_PLACE,
    };
    let statuses = ranks.launch(
        kernel(Algorithm::OneShotAllReduce, DataType::Float32, RedOp::Sum),
        args,
        2,
        4,
        None,
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{statuses:?}"
    );
    for r in 0..world {
        assert!(
            ranks.read::<f32>(r, at, 8192).iter().all(|v| *v == 6.0),
            "rank {r}"
        );
    }
    plant(&mut ranks, &second, &good, 2);
    let want = expected(&mut ranks, &second, &good);
    let statuses = ranks.run_table(&table_of(&ranks, &[second]), 1, kernel_fn(), 3, 4);
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{statuses:?}"
    );
    check_windows(&mut ranks, &want, "after the refusal");
}

/// A rank that never launches makes the others give up at the bound, not hang, before they
/// store anything.
#[test]
fn a_missing_rank_makes_the_others_time_out() {
    let world = 3;
    let layout = Layout::at(0, 30, 1);
    let mut ranks = Ranks::new(world, layout.end(world), 50_000_000);
    let counts = vec![vec![10i64; world]; world];
    plant(&mut ranks, &layout, &counts, 0);
    let full = table_of(&ranks, &[layout]);
    let table: Vec<TaskArgs> = vec![full[0], full[2]];
    let start = std::time::Instant::now();
    let statuses = ranks.run_table(&table, 1, kernel_fn(), 2, 4);
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Aborted),
        "{statuses:?}"
    );
    assert!(ranks.aborted(0) && ranks.aborted(2));
}

/// An element size the host never writes refuses the launch before any barrier.
#[test]
fn an_invalid_element_size_refuses_the_launch() {
    let world = 2;
    let layout = Layout::at(0, 8, 4);
    let ranks = Ranks::new(world, layout.end(world), TIMEOUT_NS);
    let mut table = table_of(&ranks, &[layout]);
    for entry in table.iter_mut() {
        entry.flags = 3 << ELEMENT_BYTES_SHIFT;
    }
    let statuses = ranks.run_table(&table, 1, kernel_fn(), 1, 2);
    assert!(statuses.iter().all(|s| *s == KernelStatus::InvalidLaunch));
}
