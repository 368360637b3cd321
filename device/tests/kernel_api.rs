//! The typed device API (`symm_device::kernel`) run as users' kernels run: kernels written with
//! `kernel!`, one grid per rank on the host emulation, checked against references computed
//! here. Peer reads inside frames, the in-kernel all-reduce and all-gather, frames interleaved
//! with symm's launched kernels on one window, the checks that refuse a window, and a rank that
//! skips a frame (the others fail within the timeout, never hang).

mod harness;

use harness::Ranks;
use symm_device::kernel::{
    Avg, Block, Invalid, Max, Slot, Span, Sum, Win, WindowArg, all_gather, all_reduce, barrier,
};
use symm_device::symmetric::dispatch::kernel as launched;
use symm_device::symmetric::{Algorithm, CollectiveArgs, FLAG_IN_PLACE, KernelStatus};
use symm_device::sync::abort::{ABORT_KERNEL_BLOCKS_DIFFER, ABORT_KERNEL_CALLS_DIFFER};
use symm_device::{DataType, RedOp};

const SECOND: u64 = 1_000_000_000;

/// Outcome words a test kernel stores in its window's last element.
const DONE: i64 = 1;
const ABORTED: i64 = -1;
const INVALID: i64 = -2;

/// The layout of the exchange kernel's window of `4n + 1` i64: `[0, n)` this rank's data, `[n,
/// 2n)` what it read from the next rank inside a frame, `[2n, 3n)` summed over every rank in
/// place, `[3n, 4n)` the maximum over every rank, `[4n]` the outcome.
fn exchange_words(n: usize) -> usize {
    4 * n + 1
}

symm_device::kernel! {
    /// Each rank writes `rank · 1000 + i` into its data, reads the next rank's data inside a
    /// frame, overwrites its data once the frame is closed, then all-reduces two spans in the
    /// kernel (sum and max), and records its outcome.
    fn exchange(block, window: WindowArg<i64>, n: u64) {
        let outcome = block.window(window, |block, win, mut slot| {
            let (data, got, summed, maxed) = (
                win.span(0..n).unwrap(),
                win.span(n..2 * n).unwrap(),
                win.span(2 * n..3 * n).unwrap(),
                win.span(3 * n..4 * n).unwrap(),
            );
            let status = win.span(4 * n..4 * n + 1).unwrap();
            let next = win.peer((win.rank() + 1) % win.world()).unwrap();
            block.per_thread((win, data, n), |lane, (win, data, n)| {
                for i in lane.share(n) {
                    lane.write(win, data, i, win.rank() as i64 * 1000 + i as i64);
                }
            });
            let result = slot.frame(block, |block, frame| {
                let args = (win, next, data, got, n);
                frame.per_thread(block, args, |lane, (win, next, data, got, n)| {
                    for i in lane.share(n) {
                        let value = lane.read_peer(win, next, data, i).unwrap();
                        lane.write(win, got, i, value);
                    }
                })
            });
            let result = result.and_then(|read| read.map(|_| ()));
            // Once the frame is closed no peer reads this rank's data any more: overwrite it.
            block.per_thread((win, data, n), |lane, (win, data, n)| {
                for i in lane.share(n) {
                    lane.write(win, data, i, -1);
                }
            });
            let result = result
                .and_then(|()| all_reduce(block, win, &mut slot, summed, Sum))
                .and_then(|()| all_reduce(block, win, &mut slot, maxed, Max));
            let word = if result.is_ok() { DONE } else { ABORTED };
            record(block, win, status, word);
        });
        if outcome == Err(Invalid) {
            // Nothing to record into: the window was refused.
        }
    }
}

/// Store `word` as the first element of `at` from the grid's first thread: a test kernel's
/// outcome.
fn record<'w>(block: &Block, win: Win<'w, i64>, at: Span<'w, i64>, word: i64) {
    block.per_thread((win, at, word), |lane, (win, at, word)| {
        if lane.global() == 0 {
            lane.write(win, at, 0, word);
        }
    });
}

/// Run `kernel` on every rank of `ranks` (its own `blocks × threads` grid each).
fn run_kernel(ranks: &Ranks, blocks: u32, threads: u32, kernel: &(dyn Fn(WindowArg<i64>) + Sync)) {
    ranks.run_per_rank(blocks, threads, None, &|rank| {
        // SAFETY: the harness's context of `rank`, alive for the run, whose window the
        // kernel treats as i64 (the tests size it in i64).
        kernel(unsafe { WindowArg::from_context_address(ranks.context_address(rank) as u64) });
        0
    });
}

#[test]
fn peers_read_inside_frames_and_reduce_in_the_kernel() {
    for world in 1..=4usize {
        for (blocks, threads) in [(1u32, 1u32), (1, 32), (3, 8), (4, 64)] {
            let n = [1usize, 7, 64, 1001][(world + blocks as usize) % 4];
            let mut ranks = Ranks::new(world, exchange_words(n) * 8, 5 * SECOND);
            for rank in 0..world {
                let summed: Vec<i64> = (0..n).map(|i| (rank * 31 + i) as i64 - 500).collect();
                let maxed: Vec<i64> = (0..n)
                    .map(|i| ((rank * 7919 + i * 13) % 101) as i64)
                    .collect();
                ranks.write(rank, 2 * n * 8, &summed);
                ranks.write(rank, 3 * n * 8, &maxed);
            }
            run_kernel(&ranks, blocks, threads, &|w| exchange(w, n as u64));
            let case = format!("world {world}, {blocks}x{threads}, n {n}");
            for rank in 0..world {
                let words: Vec<i64> = ranks.read(rank, 0, exchange_words(n));
                assert_eq!(words[4 * n], DONE, "{case}: rank {rank}'s outcome");
                let next = (rank + 1) % world;
                for i in 0..n {
                    assert_eq!(words[i], -1, "{case}: data overwritten after the frame");
                    assert_eq!(
                        words[n + i],
                        next as i64 * 1000 + i as i64,
                        "{case}: read from {next}"
                    );
                    let sum: i64 = (0..world).map(|r| (r * 31 + i) as i64 - 500).sum();
                    assert_eq!(words[2 * n + i], sum, "{case}: sum {i}");
                    let max = (0..world)
                        .map(|r| ((r * 7919 + i * 13) % 101) as i64)
                        .max()
                        .unwrap();
                    assert_eq!(words[3 * n + i], max, "{case}: max {i}");
                }
            }
        }
    }
}

symm_device::kernel! {
    /// Block 0 of each rank writes the rank's data `[0, n)` late; inside a frame, the last block
    /// reads the next rank's data into `[n, 2n)`, late too; once the frame is closed, block 0
    /// overwrites the data with -1. Frames are barriers of every block of every rank, so the
    /// last block reads what block 0 of the next rank wrote, and block 0's overwrite waits for
    /// every block's reads. `[2n]`: the outcome.
    fn late_blocks(block, window: WindowArg<i64>, n: u64) {
        let _ = block.window(window, |block, win, mut slot| {
            let (data, got) = (win.span(0..n).unwrap(), win.span(n..2 * n).unwrap());
            let status = win.span(2 * n..2 * n + 1).unwrap();
            let next = win.peer((win.rank() + 1) % win.world()).unwrap();
            block.per_thread((win, data, n), |lane, (win, data, n)| {
                if lane.block() == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    for i in (lane.thread() as u64..n).step_by(lane.threads() as usize) {
                        lane.write(win, data, i, win.rank() as i64 * 1000 + i as i64);
                    }
                }
            });
            let read = slot.frame(block, |block, frame| {
                let args = (win, next, data, got, n);
                frame.per_thread(block, args, |lane, (win, next, data, got, n)| {
                    if lane.block() + 1 == lane.blocks() {
                        std::thread::sleep(std::time::Duration::from_millis(30));
                        for i in (lane.thread() as u64..n).step_by(lane.threads() as usize) {
                            lane.write(win, got, i, lane.read_peer(win, next, data, i).unwrap());
                        }
                    }
                })
            });
            block.per_thread((win, data, n), |lane, (win, data, n)| {
                if lane.block() == 0 {
                    for i in (lane.thread() as u64..n).step_by(lane.threads() as usize) {
                        lane.write(win, data, i, -1);
                    }
                }
            });
            let word = if matches!(read, Ok(Ok(_))) { DONE } else { ABORTED };
            record(block, win, status, word);
        });
    }
}

symm_device::kernel! {
    /// Block 0 writes the rank's `[0, n)` late, then every block sums it over the ranks in the
    /// kernel and the last block copies the sum into `[n, 2n)`.
    fn late_then_sum(block, window: WindowArg<i64>, n: u64) {
        let _ = block.window(window, |block, win, mut slot| {
            let (data, copy) = (win.span(0..n).unwrap(), win.span(n..2 * n).unwrap());
            block.per_thread((win, data, n), |lane, (win, data, n)| {
                if lane.block() == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    for i in (lane.thread() as u64..n).step_by(lane.threads() as usize) {
                        lane.write(win, data, i, win.rank() as i64 * 1000 + i as i64);
                    }
                }
            });
            if all_reduce(block, win, &mut slot, data, Sum).is_ok() {
                block.per_thread((win, data, copy, n), |lane, (win, data, copy, n)| {
                    if lane.block() + 1 == lane.blocks() {
                        for i in (lane.thread() as u64..n).step_by(lane.threads() as usize) {
                            lane.write(win, copy, i, lane.read(win, data, i).unwrap());
                        }
                    }
                });
            }
        });
    }
}

/// The in-kernel all-reduce reduces what any block wrote before it, and any block reads its
/// result after it.
#[test]
fn in_kernel_collectives_order_every_block() {
    for (world, blocks, threads) in [(2usize, 3u32, 4u32), (3, 4, 2)] {
        let n = 20_001usize;
        let mut ranks = Ranks::new(world, 2 * n * 8, 5 * SECOND);
        run_kernel(&ranks, blocks, threads, &|w| late_then_sum(w, n as u64));
        for rank in 0..world {
            let words: Vec<i64> = ranks.read(rank, 0, 2 * n);
            for i in 0..n {
                let sum: i64 = (0..world).map(|r| r as i64 * 1000 + i as i64).sum();
                let case = format!("world {world}, {blocks}x{threads}, rank {rank}, element {i}");
                assert_eq!(words[i], sum, "{case}: the sum");
                assert_eq!(words[n + i], sum, "{case}: the last block's copy");
            }
        }
    }
}

/// What one block writes before a frame, another block of a peer reads inside it; what one
/// block reads inside a frame, no block of its peer overwrites before the frame is closed.
#[test]
fn frames_order_every_block_of_every_rank() {
    for (world, blocks, threads) in [(2usize, 2u32, 4u32), (3, 3, 2), (2, 5, 8)] {
        let n = 37usize;
        let mut ranks = Ranks::new(world, (2 * n + 1) * 8, 5 * SECOND);
        run_kernel(&ranks, blocks, threads, &|w| late_blocks(w, n as u64));
        let case = format!("world {world}, {blocks}x{threads}");
        for rank in 0..world {
            let words: Vec<i64> = ranks.read(rank, 0, 2 * n + 1);
            assert_eq!(words[2 * n], DONE, "{case}: rank {rank}'s outcome");
            let next = (rank + 1) % world;
            for i in 0..n {
                assert_eq!(words[i], -1, "{case}: rank {rank}'s data overwritten");
                assert_eq!(
                    words[n + i],
                    next as i64 * 1000 + i as i64,
                    "{case}: rank {rank} read element {i} of rank {next}"
                );
            }
        }
    }
}

symm_device::kernel! {
    /// `[0, n)` cut into `tiles` tiles shared out among the blocks: each tile adds
    /// `(rank + 1) · (i + 1)` to its elements (read, add, write: a tile run twice shows); block 0
    /// starts late, so the others steal its share. Then `[0, n)` is summed over the ranks in the
    /// kernel. `[n + b]`: the tiles block `b` ran.
    fn tiles_then_sum(block, window: WindowArg<i64>, n: u64, tiles: u32) {
        let _ = block.window(window, |block, win, mut slot| {
            let data = win.span(0..n).unwrap();
            let counts = win.span(n..n + block.blocks() as u64).unwrap();
            block.per_thread((), |lane, ()| {
                if lane.block() == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            });
            let args = (win, data, n, tiles);
            let ran = slot.for_each_tile(block, tiles, args, |lane, tile, (win, data, n, tiles)| {
                let per_tile = n.div_ceil(tiles as u64);
                let lo = (tile.0 as u64 * per_tile).min(n);
                let hi = (lo + per_tile).min(n);
                let step = lane.threads() as usize;
                for i in (lo + lane.thread() as u64..hi).step_by(step) {
                    let value = lane.read(win, data, i).unwrap();
                    lane.write(win, data, i, value + (win.rank() as i64 + 1) * (i as i64 + 1));
                }
            });
            let Ok(stats) = ran else { return };
            let _ = all_reduce(block, win, &mut slot, data, Sum);
            let index = block.index() as u64;
            block.per_thread((win, counts, index, stats.tiles), |lane, (win, counts, index, ran)| {
                if lane.thread() == 0 {
                    lane.write(win, counts, index, ran as i64);
                }
            });
        });
    }
}

/// Tiles shared out among a launch's blocks by the software CLC scheduler: every tile runs
/// exactly once, for tile counts below, at and above the block count, and the in-kernel sum
/// after the tiles sees every tile's writes.
#[test]
fn tiles_run_once_each_then_reduce_in_the_kernel() {
    for (world, blocks, threads, tiles) in [
        (2usize, 3u32, 4u32, 2u32),
        (2, 3, 4, 3),
        (3, 4, 8, 37),
        (1, 2, 2, 1024),
        (2, 1, 16, 9),
    ] {
        let n = 1000usize;
        let mut ranks = Ranks::new(world, (n + blocks as usize) * 8, 5 * SECOND);
        for _round in 0..2 {
            for rank in 0..world {
                ranks.write(rank, 0, &vec![0i64; n]);
            }
            run_kernel(&ranks, blocks, threads, &|w| {
                tiles_then_sum(w, n as u64, tiles)
            });
            let case = format!("world {world}, {blocks}x{threads}, {tiles} tiles");
            let ranks_sum = (world * (world + 1) / 2) as i64;
            for rank in 0..world {
                let words: Vec<i64> = ranks.read(rank, 0, n + blocks as usize);
                for (i, word) in words[..n].iter().enumerate() {
                    let want = ranks_sum * (i as i64 + 1);
                    assert_eq!(*word, want, "{case}: rank {rank}, element {i}");
                }
                let ran: i64 = words[n..].iter().sum();
                assert_eq!(
                    ran,
                    tiles as i64,
                    "{case}: rank {rank}'s blocks ran {:?}",
                    &words[n..]
                );
            }
        }
    }
}

/// The scheduler's claim epoch wrapping around on a window: tiles whose claim words kept an old
/// epoch (or were never claimed) still run once each after the wrap.
#[test]
fn tiles_run_once_each_across_the_claim_epoch_wrap() {
    let (world, blocks, n) = (2usize, 3u32, 600usize);
    let mut ranks = Ranks::new(world, (n + blocks as usize) * 8, 5 * SECOND);
    for rank in 0..world {
        let state = symm_device::sync::signal_pad::tile_state(ranks.pad_address(rank));
        // SAFETY: the tile state's epoch word, in the rank's pad; no kernel runs yet.
        unsafe { state.add(2).write(u32::MAX - 1) };
    }
    // Epoch u32::MAX over 10 tiles, then (after the wrap) 37 tiles, then 37 again.
    for (call, tiles) in [10u32, 37, 37].into_iter().enumerate() {
        for rank in 0..world {
            ranks.write(rank, 0, &vec![0i64; n]);
        }
        run_kernel(&ranks, blocks, 4, &|w| tiles_then_sum(w, n as u64, tiles));
        let ranks_sum = (world * (world + 1) / 2) as i64;
        for rank in 0..world {
            let words: Vec<i64> = ranks.read(rank, 0, n + blocks as usize);
            for (i, word) in words[..n].iter().enumerate() {
                let want = ranks_sum * (i as i64 + 1);
                assert_eq!(
                    *word, want,
                    "call {call}, {tiles} tiles: rank {rank}, element {i}"
                );
            }
        }
    }
}

symm_device::kernel! {
    /// `for_each_tile` over more tiles than the scheduler's state has room for.
    fn too_many_tiles(block, window: WindowArg<i64>) {
        let _ = block.window(window, |block, win, mut slot| {
            let too_many = Slot::<i64>::MAX_TILES + 1;
            let word = match slot.for_each_tile(block, too_many, (), |_, _, ()| {}) {
                Ok(_) => DONE,
                Err(_) => ABORTED,
            };
            let at = win.span(0..1).unwrap();
            record(block, win, at, word);
        });
    }
}

#[test]
fn more_tiles_than_the_scheduler_holds_fail_the_window() {
    let mut ranks = Ranks::new(1, 8, 5 * SECOND);
    run_kernel(&ranks, 2, 4, &|w| too_many_tiles(w));
    assert_eq!(ranks.read::<i64>(0, 0, 1)[0], ABORTED);
    assert!(ranks.aborted(0), "the window's abort word");
}

symm_device::kernel! {
    /// The f32 average of `[0, n)` in place, then an all-gather of `[0, n)` into `[n, n + world · n)`.
    fn average_then_gather(block, window: WindowArg<f32>, n: u64, status: WindowArg<i64>) {
        let result = block.window(window, |block, win, mut slot| {
            let part = win.span(0..n).unwrap();
            let gathered = win.span(n..n + win.world() as u64 * n).unwrap();
            all_reduce(block, win, &mut slot, part, Avg)
                .and_then(|()| all_gather(block, win, &mut slot, part, gathered))
        });
        let word = match result {
            Ok(Ok(())) => DONE,
            Ok(Err(_)) => ABORTED,
            Err(Invalid) => INVALID,
        };
        let _ = block.window(status, |block, win, _slot| {
            let at = win.span(0..1).unwrap();
            record(block, win, at, word);
        });
    }
}

#[test]
fn an_average_and_an_all_gather_in_one_kernel() {
    for world in 1..=4usize {
        let n = 37usize;
        let mut data = Ranks::new(world, (n + world * n) * 4, 5 * SECOND);
        let mut status = Ranks::new(world, 8, 5 * SECOND);
        for rank in 0..world {
            let values: Vec<f32> = (0..n).map(|i| (rank * 4 + i) as f32).collect();
            data.write(rank, 0, &values);
        }
        let (data_ref, status_ref) = (&data, &status);
        data.run_per_rank(2, 16, None, &|rank| {
            // SAFETY: the harness's contexts of `rank`, alive for the run, sized in f32 and i64.
            let (w, s) = unsafe {
                (
                    WindowArg::from_context_address(data_ref.context_address(rank) as u64),
                    WindowArg::from_context_address(status_ref.context_address(rank) as u64),
                )
            };
            average_then_gather(w, n as u64, s);
            0
        });
        for rank in 0..world {
            assert_eq!(
                status.read::<i64>(rank, 0, 1)[0],
                DONE,
                "world {world}: rank {rank}"
            );
            let words: Vec<f32> = data.read(rank, 0, n + world * n);
            for i in 0..n {
                let mean = (0..world).map(|r| (r * 4 + i) as f64).sum::<f64>() / world as f64;
                assert!(
                    (words[i] as f64 - mean).abs() < 1e-4,
                    "average {i}: {} vs {mean}",
                    words[i]
                );
                for r in 0..world {
                    assert_eq!(words[n + r * n + i], words[i], "gathered segment {r}");
                }
            }
        }
    }
}

symm_device::kernel! {
    /// One frame on the window, and nothing else: what interleaves with launched kernels.
    fn one_frame(block, window: WindowArg<i64>, status: u64) {
        let _ = block.window(window, |block, win, mut slot| {
            let word = match slot.frame(block, |_, _| ()) {
                Ok(()) => DONE,
                Err(_) => ABORTED,
            };
            let at = win.span(status..status + 1).unwrap();
            record(block, win, at, word);
        });
    }
}

/// A user's frames and symm's launched one-shot all-reduce on one window, in turn, 5 rounds:
/// they count the same epochs, so every round completes and the sums are right.
#[test]
fn frames_interleave_with_launched_kernels_on_one_window() {
    let world = 3;
    let n = 16usize;
    let mut ranks = Ranks::new(world, (n + 1) * 8, 5 * SECOND);
    for round in 0..5 {
        for rank in 0..world {
            let values: Vec<i64> = (0..n).map(|i| (rank * 10 + i + round) as i64).collect();
            ranks.write(rank, 0, &values);
        }
        run_kernel(&ranks, 2, 8, &|w| one_frame(w, n as u64));
        let args = CollectiveArgs {
            send_offset: 0,
            recv_offset: 0,
            count: n as u64,
            flags: FLAG_IN_PLACE,
        };
        let f = launched(Algorithm::OneShotAllReduce, DataType::Int64, RedOp::Sum);
        let statuses = ranks.launch(f, args, 2, 32, None);
        assert!(
            statuses.iter().all(|s| *s == KernelStatus::Completed),
            "round {round}: launched {statuses:?}"
        );
        for rank in 0..world {
            let words: Vec<i64> = ranks.read(rank, 0, n + 1);
            assert_eq!(words[n], DONE, "round {round}: rank {rank}'s frame");
            for (i, word) in words[..n].iter().enumerate() {
                let sum: i64 = (0..world).map(|r| (r * 10 + i + round) as i64).sum();
                assert_eq!(*word, sum, "round {round}: element {i}");
            }
        }
    }
}

symm_device::kernel! {
    /// Rank 0 opens a frame; the others do not: rank 0 must fail within the timeout.
    fn lonely_frame(block, window: WindowArg<i64>) {
        let _ = block.window(window, |block, win, mut slot| {
            if win.rank() != 0 {
                return;
            }
            let word = match slot.frame(block, |_, _| ()) {
                Ok(()) => DONE,
                Err(_) => ABORTED,
            };
            let at = win.span(0..1).unwrap();
            record(block, win, at, word);
        });
    }
}

#[test]
fn a_frame_a_peer_never_enters_fails_within_the_timeout() {
    let mut ranks = Ranks::new(2, 8, SECOND / 5);
    let started = std::time::Instant::now();
    run_kernel(&ranks, 1, 4, &|w| lonely_frame(w));
    assert!(
        started.elapsed().as_secs() < 10,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(ranks.read::<i64>(0, 0, 1)[0], ABORTED);
    assert!(ranks.aborted(0), "rank 0's abort word");
}

symm_device::kernel! {
    /// Rank 0 sums `[0, 4)` in the kernel, the others `[4, 8)`; then (`second`) rank 0 opens a
    /// frame where the others pass two barriers: the same number of cross-rank barriers, other
    /// calls. `[8]`: the outcome.
    fn calls_that_differ(block, window: WindowArg<i64>, second: u64) {
        let _ = block.window(window, |block, win, mut slot| {
            let first = win.rank() == 0;
            let result = if second == 0 {
                let span = if first { win.span(0..4) } else { win.span(4..8) };
                all_reduce(block, win, &mut slot, span.unwrap(), Sum)
            } else if first {
                slot.frame(block, |_, _| ())
            } else {
                barrier(block, &mut slot).and_then(|()| barrier(block, &mut slot))
            };
            let word = if result.is_ok() { DONE } else { ABORTED };
            let at = win.span(8..9).unwrap();
            record(block, win, at, word);
        });
    }
}

symm_device::kernel! {
    /// Block 0 of every rank sums `[0, 4)` in the kernel, the other blocks pass a barrier: the
    /// same on every rank, but the blocks of one rank differ. `[8]`: block 0's outcome.
    fn blocks_that_differ(block, window: WindowArg<i64>) {
        let _ = block.window(window, |block, win, mut slot| {
            let result = if block.index() == 0 {
                all_reduce(block, win, &mut slot, win.span(0..4).unwrap(), Sum)
            } else {
                barrier(block, &mut slot)
            };
            let word = if result.is_ok() { DONE } else { ABORTED };
            let at = win.span(8..9).unwrap();
            record(block, win, at, word);
        });
    }
}

/// Blocks of one rank that make different calls (an in-kernel collective on block 0 only)
/// fail at the grid barrier, on every rank, before anything of the call is done.
#[test]
fn blocks_making_different_calls_fail_the_window() {
    let world = 2;
    let mut ranks = Ranks::new(world, 9 * 8, 5 * SECOND);
    for rank in 0..world {
        ranks.write(rank, 0, &[rank as i64 + 1; 8]);
    }
    let started = std::time::Instant::now();
    run_kernel(&ranks, 3, 4, &|w| blocks_that_differ(w));
    assert!(
        started.elapsed().as_secs() < 3,
        "took {:?}",
        started.elapsed()
    );
    for rank in 0..world {
        let words: Vec<i64> = ranks.read(rank, 0, 9);
        assert_eq!(words[8], ABORTED, "rank {rank}'s outcome");
        assert_eq!(
            words[..8],
            [rank as i64 + 1; 8],
            "rank {rank}'s data touched"
        );
        assert_eq!(ranks.abort_word(rank) & 0xFF, ABORT_KERNEL_BLOCKS_DIFFER);
    }
}

/// Ranks whose kernels make different calls on a window at the same barrier (an in-kernel
/// all-reduce of different spans; a frame against two barriers) fail on every rank, promptly,
/// with nothing of the call done and the window's abort word saying why.
#[test]
fn ranks_making_different_calls_fail_on_every_rank() {
    for second in [0u64, 1] {
        for world in [2usize, 3] {
            let mut ranks = Ranks::new(world, 9 * 8, 5 * SECOND);
            for rank in 0..world {
                ranks.write(
                    rank,
                    0,
                    &(0..8).map(|i| 10 * rank as i64 + i).collect::<Vec<_>>(),
                );
            }
            let started = std::time::Instant::now();
            run_kernel(&ranks, 2, 8, &|w| calls_that_differ(w, second));
            let case = format!("case {second}, world {world}");
            assert!(
                started.elapsed().as_secs() < 3,
                "{case}: took {:?}",
                started.elapsed()
            );
            for rank in 0..world {
                let words: Vec<i64> = ranks.read(rank, 0, 9);
                assert_eq!(words[8], ABORTED, "{case}: rank {rank}'s outcome");
                let original: Vec<i64> = (0..8).map(|i| 10 * rank as i64 + i).collect();
                assert_eq!(
                    words[..8],
                    original[..],
                    "{case}: rank {rank}'s data touched"
                );
                assert_eq!(
                    ranks.abort_word(rank) & 0xFF,
                    ABORT_KERNEL_CALLS_DIFFER,
                    "{case}: rank {rank}'s abort word"
                );
            }
        }
    }
}

symm_device::kernel! {
    /// Bounds: spans, peers and element indices past the window are refused, and nothing
    /// outside a span is written. Records the number of checks that held.
    fn bounds(block, window: WindowArg<i64>) {
        let _ = block.window(window, |block, win, _slot| {
            let len = win.len();
            let mut held = 0i64;
            held += win.span(0..len + 1).is_none() as i64;
            let (three, two) = (3, 2);
            held += win.span(three..two).is_none() as i64;
            held += win.span(len..len).is_some_and(|s| s.is_empty()) as i64;
            held += win.peer(win.world()).is_none() as i64;
            held += win.peer(win.world() - 1).is_some() as i64;
            let first = win.span(0..2).unwrap();
            held += first.sub(1..3).is_none() as i64;
            held += (first.sub(1..2).unwrap().start() == 1) as i64;
            let tally = win.span(2..3).unwrap();
            block.per_thread((win, first, tally, held), |lane, (win, first, tally, held)| {
                if lane.global() == 0 {
                    let mut held = held;
                    held += (!lane.write(win, first, 2, 99)) as i64;
                    held += lane.read(win, first, 2).is_none() as i64;
                    lane.write(win, tally, 0, held);
                }
            });
        });
    }
}

#[test]
fn spans_peers_and_indices_past_the_window_are_refused() {
    let mut ranks = Ranks::new(2, 4 * 8, 5 * SECOND);
    run_kernel(&ranks, 1, 2, &|w| bounds(w));
    for rank in 0..2 {
        let words: Vec<i64> = ranks.read(rank, 0, 4);
        assert_eq!(words[2], 9, "rank {rank}: checks held");
        assert_eq!(words[3], 0, "rank {rank}: a write past its span landed");
    }
}

symm_device::kernel! {
    /// Opens its window and records whether it was refused.
    fn open_only(block, window: WindowArg<i64>, status: WindowArg<i64>) {
        let word = match block.window(window, |_, _, _| ()) {
            Ok(()) => DONE,
            Err(Invalid) => INVALID,
        };
        let _ = block.window(status, |block, win, _slot| {
            let at = win.span(0..1).unwrap();
            record(block, win, at, word);
        });
    }
}

/// A null context, a grid of more blocks than the window has barrier slots, and a peer whose
/// base is not 16-byte aligned are refused; a refused (non-null) window's abort word is raised.
#[test]
fn windows_the_kernels_cannot_use_are_refused() {
    /// The status `open_only` records for the window at `window` on a grid of `blocks`.
    fn outcome(status: &mut Ranks, window: u64, blocks: u32) -> i64 {
        let status_context = status.context_address(0) as u64;
        status.run_per_rank(blocks, 1, None, &|_| {
            // SAFETY: 0 or a harness context alive for the run; the status window's context.
            let (w, s) = unsafe {
                (
                    WindowArg::from_context_address(window),
                    WindowArg::from_context_address(status_context),
                )
            };
            open_only(w, s);
            0
        });
        status.read::<i64>(0, 0, 1)[0]
    }
    let mut status = Ranks::new(1, 8, SECOND);
    let good = Ranks::new(1, 64, SECOND);
    let address = good.context_address(0) as u64;
    assert_eq!(outcome(&mut status, address, 1), DONE);
    assert!(!good.aborted(0));
    assert_eq!(outcome(&mut status, 0, 1), INVALID, "a null context");
    assert_eq!(outcome(&mut status, address, 65), INVALID, "65 blocks");
    assert!(good.aborted(0), "the refused window's abort word");
    let shifted = Ranks::with_base_shifts(2, 64, SECOND, &[0, 4]);
    let address = shifted.context_address(0) as u64;
    assert_eq!(
        outcome(&mut status, address, 1),
        INVALID,
        "a peer base at +4"
    );
}

/// The token's block-wide reductions: `any` and `all` over a value that differs by thread.
#[test]
fn any_and_all_make_a_varying_value_uniform() {
    let ranks = Ranks::new(1, 8, SECOND);
    let results = ranks.run_per_rank(2, 8, None, &|_| {
        // SAFETY: every thread of the grid makes one token, at its start.
        let mut block = unsafe { Block::enter() };
        let odd = block.per_thread((), |lane, ()| lane.thread() % 2 == 1);
        let big = block.per_thread((), |lane, ()| lane.thread() < 100);
        let none = block.per_thread((), |lane, ()| lane.thread() > 100);
        (block.any(odd) as i32)
            | ((block.all(odd) as i32) << 1)
            | ((block.all(big) as i32) << 2)
            | ((block.any(none) as i32) << 3)
    });
    assert_eq!(results, [0b0101]);
}

symm_device::kernel! {
    /// A kernel whose entry is called again inside a lane of another kernel.
    fn inner(block) {
        block.sync();
    }
}

symm_device::kernel! {
    fn outer(block) {
        block.per_thread((), |lane, ()| {
            if lane.thread() == 0 {
                inner();
            }
        });
    }
}

/// A kernel's entry called inside a kernel (a second block token on one thread) panics on the
/// host emulation instead of reaching a barrier from one thread.
#[test]
fn an_entry_called_inside_a_kernel_panics() {
    let caught = std::panic::catch_unwind(|| symm_device::arch::host::run_grid(1, 2, &|| outer()));
    assert!(caught.is_err(), "a second token was made");
}
