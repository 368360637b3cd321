//! Loom model of the low-latency lines: flags, parities and call counters across launches and grids: every interleaving (up to a preemption bound) of a few ranks'
//! blocks, on loom's weak memory model. Shared setup: `loom_support`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p symm-device --release --test loom_ll --target-dir
//! target/loom` (`cargo xtask test` runs every `loom_*` file).

#![cfg(loom)]

mod loom_support;

use loom_support::*;

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
