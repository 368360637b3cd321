//! The low-latency (LL) protocol on one window across many calls: the grid (hence which block
//! owns which line) changes between calls, LL all-reduce and LL all-gather alternate with the
//! barrier-based kernels, and the flags cross the end of their period, where stale lines from
//! an earlier period would otherwise carry the flag of the next call.

mod harness;

use harness::{Ranks, Rng};
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::dispatch::kernel;
use symm_device::symmetric::{CollectiveArgs, FLAG_IN_PLACE, KernelStatus};
use symm_device::sync::signal_pad::{LL_FLAG_PERIOD, LL_LINES, MAX_BLOCKS};
use symm_device::{DataType, RedOp};

const TIMEOUT_NS: u64 = 20_000_000_000;
const THREADS: u32 = 4;
/// Byte offset of the send buffer in the windows.
const SEND: usize = 64;

/// One LL or barrier all-reduce (i32 sum) of `count` elements on `blocks` blocks per rank,
/// checked exactly on every rank.
fn all_reduce_and_check(
    ranks: &mut Ranks,
    rng: &mut Rng,
    algorithm: Algorithm,
    count: usize,
    blocks: u32,
    in_place: bool,
    what: &str,
) {
    let world = ranks.world();
    let recv = SEND + count * 4 + 16;
    let inputs: Vec<Vec<i32>> = (0..world)
        .map(|_| {
            (0..count)
                .map(|_| (rng.next_u64() % 2001) as i32 - 1000)
                .collect()
        })
        .collect();
    for (rank, input) in inputs.iter().enumerate() {
        ranks.write(rank, SEND, input);
    }
    let args = CollectiveArgs {
        send_offset: SEND as u64,
        recv_offset: if in_place { SEND } else { recv } as u64,
        count: count as u64,
        flags: if in_place { FLAG_IN_PLACE } else { 0 },
    };
    let statuses = ranks.launch(
        kernel(algorithm, DataType::Int32, RedOp::Sum),
        args,
        blocks,
        THREADS,
        None,
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{what}: {statuses:?}"
    );
    let at = if in_place { SEND } else { recv };
    for rank in 0..world {
        let out: Vec<i32> = ranks.read(rank, at, count);
        let wrong = (0..count)
            .filter(|&i| out[i] != inputs.iter().map(|x| x[i]).sum::<i32>())
            .count();
        assert_eq!(wrong, 0, "{what}: rank {rank}: {wrong} of {count} wrong");
    }
}

/// One LL all-gather of `bytes` bytes per rank on `blocks` blocks, checked on every rank.
fn ll_all_gather_and_check(
    ranks: &mut Ranks,
    rng: &mut Rng,
    bytes: usize,
    blocks: u32,
    what: &str,
) {
    let world = ranks.world();
    let recv = SEND + bytes + 16;
    let inputs: Vec<Vec<u8>> = (0..world)
        .map(|_| (0..bytes).map(|_| rng.next_u64() as u8).collect())
        .collect();
    for (rank, input) in inputs.iter().enumerate() {
        ranks.write(rank, SEND, input);
    }
    let args = CollectiveArgs {
        send_offset: SEND as u64,
        recv_offset: recv as u64,
        count: bytes as u64,
        flags: 0,
    };
    let statuses = ranks.launch(
        kernel(Algorithm::LlAllGather, DataType::Uint8, RedOp::Sum),
        args,
        blocks,
        THREADS,
        None,
    );
    assert!(
        statuses.iter().all(|s| *s == KernelStatus::Completed),
        "{what}: {statuses:?}"
    );
    for rank in 0..world {
        let out: Vec<u8> = ranks.read(rank, recv, world * bytes);
        let expected: Vec<u8> = inputs.concat();
        assert!(
            out == expected,
            "{what}: rank {rank}: gathered bytes differ"
        );
    }
}

/// The reviewer's case: 64 f32 on one block, then 100 on two: block 1's call number fell
/// behind and it accepted lines the first call left behind. Here with i32, exact.
#[test]
fn a_grid_change_between_two_ll_calls() {
    let mut ranks = Ranks::new(2, 4096, TIMEOUT_NS);
    let mut rng = Rng(1);
    all_reduce_and_check(
        &mut ranks,
        &mut rng,
        Algorithm::OneShotLlAllReduce,
        64,
        1,
        false,
        "first",
    );
    all_reduce_and_check(
        &mut ranks,
        &mut rng,
        Algorithm::OneShotLlAllReduce,
        100,
        2,
        false,
        "second",
    );
    // Every block index's copy of the call number agrees, whatever grid the calls had.
    for rank in 0..2 {
        for block in 0..MAX_BLOCKS as u32 {
            assert_eq!(ranks.ll_calls(rank, block), 2, "rank {rank} block {block}");
        }
    }
}

/// Random sequences on one window: LL and barrier all-reduce (in and out of place) and LL
/// all-gather, with a random grid (1 to 6 blocks) and size per call.
#[test]
fn random_grids_sizes_and_kernels_on_one_window() {
    for (world, calls, seed) in [(2, 300, 11), (3, 150, 12), (5, 80, 13)] {
        let max_count = 1500;
        let mut ranks = Ranks::new(
            world,
            SEND + 2 * max_count * 4 + 64 + world * 4 * max_count,
            TIMEOUT_NS,
        );
        let mut rng = Rng(seed);
        for call in 0..calls {
            let blocks = 1 + (rng.next_u64() % 6) as u32;
            let count = 1 + (rng.next_u64() % max_count as u64) as usize;
            let what = format!("world {world} call {call}: {count} elements on {blocks} blocks");
            let in_place = rng.next_u64() & 1 == 0;
            match rng.next_u64() % 5 {
                0 | 1 => all_reduce_and_check(
                    &mut ranks,
                    &mut rng,
                    Algorithm::OneShotLlAllReduce,
                    count,
                    blocks,
                    in_place,
                    &what,
                ),
                2 => ll_all_gather_and_check(&mut ranks, &mut rng, count, blocks, &what),
                3 => all_reduce_and_check(
                    &mut ranks,
                    &mut rng,
                    Algorithm::OneShotAllReduce,
                    count,
                    blocks,
                    in_place,
                    &what,
                ),
                _ => all_reduce_and_check(
                    &mut ranks,
                    &mut rng,
                    Algorithm::TwoShotAllReduce,
                    count,
                    blocks,
                    false,
                    &what,
                ),
            }
        }
    }
}

/// Across the end of the flag period: every line of both parities holds a stale line with the
/// flag the first calls of the next period use. Without clearing at the wrap, those calls
/// would accept the stale data; with it, every result is exact.
#[test]
fn stale_lines_never_match_a_flag_of_the_next_period() {
    let world = 3;
    let count = LL_LINES * 2; // i32: every line of the buffers
    let mut ranks = Ranks::new(world, SEND + 2 * count * 4 + 64, TIMEOUT_NS);
    let mut rng = Rng(5);
    let first = 2 * LL_FLAG_PERIOD - 3;
    ranks.set_epochs(0, first);
    ranks.plant_ll_lines(1, 0x5555_5555_5555_5555);
    for (i, blocks) in [3u32, 1, 2, 4, 1, 3, 2].into_iter().enumerate() {
        let what = format!("call {} of the window (blocks {blocks})", first + i as u64);
        all_reduce_and_check(
            &mut ranks,
            &mut rng,
            Algorithm::OneShotLlAllReduce,
            count,
            blocks,
            i % 2 == 0,
            &what,
        );
    }
    assert_eq!(ranks.ll_calls(0, 0), first + 7);
}

/// An LL call does not look at the abort word at its start (a host-memory read on a GPU),
/// except before the period clear, whose cross-rank barrier barrier kernels share: a call at
/// the period's end on an aborted window announces no barrier epoch to its peers (a peer's
/// barrier kernel could pass on it and store into this rank's memory after its call failed)
/// and stops; before the end of the period it runs (its waits give up on the abort).
#[test]
fn an_ll_call_on_an_aborted_window_announces_no_barrier_at_the_period_clear() {
    let world = 2;
    let count = 64;
    let args = |in_place: bool| CollectiveArgs {
        send_offset: SEND as u64,
        recv_offset: if in_place {
            SEND as u64
        } else {
            (SEND + 4 * count) as u64
        },
        count: count as u64,
        flags: if in_place { FLAG_IN_PLACE } else { 0 },
    };
    let ll = kernel(Algorithm::OneShotLlAllReduce, DataType::Int32, RedOp::Sum);
    // The first call that clears the other parity at the end of a period.
    let at_the_clear = 2 * LL_FLAG_PERIOD - 1;
    assert!(symm_device::sync::signal_pad::ll_clears_other_parity(
        at_the_clear
    ));
    let mut ranks = Ranks::new(world, SEND + 8 * count + 64, 50_000_000);
    ranks.set_epochs(0, at_the_clear);
    ranks.raise_abort(0, symm_device::symmetric::ABORT_PEER_FAILED);
    let statuses = ranks.launch(ll, args(false), 1, 32, Some(&[0]));
    assert_eq!(statuses, vec![KernelStatus::Aborted]);
    assert_eq!(
        ranks.inbox(1, 0, 0),
        0,
        "rank 0 announced a barrier epoch to rank 1"
    );
    assert_eq!(
        ranks.ll_calls(0, 0),
        at_the_clear,
        "the aborted call was counted"
    );
}

/// One-shot all-reduce with some ranks in place and the others not, on the 16-byte pack path
/// with a block count that does not divide the packs evenly (f32, 1024 elements, 3 blocks):
/// an out-of-place block must have read every element its in-place peer block overwrites after
/// their shared barrier. Exact on every rank, ranks bitwise equal. Also a zero-length LL call
/// between two LL calls is not counted.
#[test]
fn one_shot_with_mixed_in_place_ranks() {
    let world = 3;
    let count = 1024;
    let recv = SEND + count * 4 + 64;
    let mut rng = Rng(9);
    for (blocks, threads) in [(3u32, 4u32), (5, 2), (2, 8)] {
        for pattern in [[1u32, 0, 1], [0, 1, 0], [1, 1, 0]] {
            let mut ranks = Ranks::new(world, recv + count * 4 + 64, TIMEOUT_NS);
            for _ in 0..3 {
                let inputs: Vec<Vec<i32>> = (0..world)
                    .map(|_| {
                        (0..count)
                            .map(|_| (rng.next_u64() % 2001) as i32 - 1000)
                            .collect()
                    })
                    .collect();
                for (rank, input) in inputs.iter().enumerate() {
                    ranks.write(rank, SEND, input);
                }
                let args = CollectiveArgs {
                    send_offset: SEND as u64,
                    recv_offset: recv as u64,
                    count: count as u64,
                    flags: 0,
                };
                let statuses = ranks.launch_with_rank_flags(
                    kernel(Algorithm::OneShotAllReduce, DataType::Int32, RedOp::Sum),
                    args,
                    blocks,
                    threads,
                    None,
                    &pattern.map(|f| f * FLAG_IN_PLACE),
                );
                assert!(statuses.iter().all(|s| *s == KernelStatus::Completed));
                for rank in 0..world {
                    let at = if pattern[rank] == 1 { SEND } else { recv };
                    let out: Vec<i32> = ranks.read(rank, at, count);
                    let wrong = (0..count)
                        .filter(|&i| out[i] != inputs.iter().map(|x| x[i]).sum::<i32>())
                        .count();
                    assert_eq!(wrong, 0, "blocks {blocks} pattern {pattern:?} rank {rank}");
                }
            }
        }
    }
    let mut ranks = Ranks::new(2, 4096, TIMEOUT_NS);
    all_reduce_and_check(
        &mut ranks,
        &mut rng,
        Algorithm::OneShotLlAllReduce,
        8,
        1,
        false,
        "a",
    );
    all_reduce_and_check(
        &mut ranks,
        &mut rng,
        Algorithm::OneShotLlAllReduce,
        0,
        2,
        false,
        "empty",
    );
    assert_eq!(
        ranks.ll_calls(0, 0),
        1,
        "a call without lines takes no call number"
    );
    all_reduce_and_check(
        &mut ranks,
        &mut rng,
        Algorithm::OneShotLlAllReduce,
        40,
        2,
        false,
        "b",
    );
}

/// A line whose data is the bits an out-of-line LL wait returns when it gives up
/// ([`symm_device::sync::ll::GAVE_UP`]), from a rank that writes it late (so that the other
/// rank's first load misses and its wait runs out of line): still taken as the data, on every
/// rank, and the call completes with the abort word down.
#[test]
fn a_late_line_carrying_the_give_up_bits_is_data() {
    use symm_device::SymmContext;
    use symm_device::sync::grid::Grid;
    use symm_device::sync::ll::{GAVE_UP, LlCall};
    let ranks = Ranks::new(2, 4096, TIMEOUT_NS);
    let results = ranks.run_per_rank(1, 1, None, &|rank| {
        // SAFETY: the harness's context of `rank`, alive for the whole grid.
        let ctx = unsafe { &*(ranks.context_address(rank) as *const SymmContext) };
        let grid = Grid {
            block: 0,
            blocks: 1,
        };
        // SAFETY: a host-built context with full pads; one block; both ranks make this call.
        let Ok(ll) = (unsafe { LlCall::begin(ctx, grid) }) else {
            return -1;
        };
        if rank == 1 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for peer in 0..2 {
            // SAFETY: peer < world, line 0 < LL_LINES.
            unsafe { ll.put(peer, 0, GAVE_UP) };
        }
        let mut taken = [0u64; 2];
        // SAFETY: line 0 < LL_LINES.
        let result =
            unsafe { ll.take_every_source(0, |source, data| taken[source as usize] = data) };
        let ended = ll.end(result.is_err());
        i32::from(result.is_ok() && ended.is_ok() && taken == [GAVE_UP; 2])
    });
    assert_eq!(results, vec![1, 1]);
    assert_eq!((ranks.abort_word(0), ranks.abort_word(1)), (0, 0));
}
