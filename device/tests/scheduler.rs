//! Work stealing with the software source on the host emulation: for every policy, residency
//! (how many blocks run at once, as an SM count would limit it), tile count and imbalance,
//! every tile runs exactly once, and each policy's bound holds.

use symm_device::arch::host::{run_grid, run_grid_with_residency};
use symm_device::scheduler::policy::{
    And, EveryNth, FirstFraction, Greedy, MaxSteals, Or, Policy, TimeBudget,
};
use symm_device::scheduler::source::SoftwareSource;
use symm_device::scheduler::workload::{
    LINEAR_SKEW, ONE_HEAVY_IN_64, UNIFORM, Workload, fixed_grid, stealing_software,
};

/// Buffers of one launch.
struct Launch {
    data: Vec<f32>,
    counts: Vec<u32>,
    stats: Vec<u32>,
    state: Vec<u32>,
}

impl Launch {
    fn new(tiles: u32, threads: u32) -> Launch {
        Launch {
            data: vec![1.0; (tiles * threads) as usize],
            counts: vec![0; tiles as usize],
            stats: vec![0; 2 * tiles as usize],
            state: vec![0; SoftwareSource::state_words(tiles)],
        }
    }

    fn workload(&mut self, tiles: u32, imbalance: u32) -> Workload {
        Workload {
            tiles,
            imbalance,
            work_iterations: 1,
            prologue_iterations: 4,
            data: self.data.as_mut_ptr() as u64,
            tile_counts: self.counts.as_mut_ptr() as u64,
            block_stats: self.stats.as_mut_ptr() as u64,
        }
    }

    /// (tiles, steals) per block.
    fn per_block(&self) -> Vec<(u32, u32)> {
        self.stats.chunks(2).map(|c| (c[0], c[1])).collect()
    }
}

const THREADS: u32 = 3;

/// Run the software-source stealing kernel with policy `P` (`tiles` blocks, `resident` at a
/// time); check exactly-once; return the per-block (tiles, steals).
fn run_policy<P: Policy>(resident: u32, tiles: u32, imbalance: u32) -> Vec<(u32, u32)> {
    let mut launch = Launch::new(tiles, THREADS);
    let workload = launch.workload(tiles, imbalance);
    let state = launch.state.as_mut_ptr() as u64;
    // Two launches on the same state: the counters reset themselves (CUDA-graph replay).
    for replay in 0..2 {
        run_grid_with_residency(tiles, THREADS, resident, &|| {
            // SAFETY: one block per tile; buffers sized for `tiles` tiles × THREADS.
            unsafe { stealing_software::<P>(&workload, state) }
        });
        let expected = replay + 1;
        for (tile, count) in launch.counts.iter().enumerate() {
            assert_eq!(
                *count,
                expected,
                "{}: {resident} resident, {tiles} tiles, imbalance {imbalance}: tile {tile} ran {count} times after {expected} launches",
                std::any::type_name::<P>()
            );
        }
        assert_eq!(
            &launch.state[..2],
            &[0, 0],
            "counters reset after the launch"
        );
        assert_eq!(launch.state[2], replay + 1, "epoch advanced");
    }
    let per_block = launch.per_block();
    let total: u32 = per_block.iter().map(|b| b.0).sum();
    assert_eq!(total, tiles, "tiles per block add up (last launch)");
    per_block
}

/// Blocks resident at once.
const RESIDENCY: [u32; 3] = [1, 3, 8];
const TILE_COUNTS: [u32; 6] = [1, 2, 7, 64, 1000, 10_000];
const IMBALANCES: [u32; 3] = [UNIFORM, LINEAR_SKEW, ONE_HEAVY_IN_64];

fn each_shape(mut f: impl FnMut(u32, u32, u32)) {
    for resident in RESIDENCY {
        for tiles in TILE_COUNTS {
            for imbalance in IMBALANCES {
                f(resident, tiles, imbalance);
            }
        }
    }
}

#[test]
fn greedy_runs_every_tile_exactly_once() {
    each_shape(|grid, tiles, imbalance| {
        let blocks = run_policy::<Greedy>(grid, tiles, imbalance);
        // Every tile was run by its own block or stolen.
        let own = blocks.iter().filter(|b| b.0 > 0).count() as u32;
        assert_eq!(blocks.iter().map(|b| b.1).sum::<u32>(), tiles - own);
        // Greedy blocks steal until nothing is left: the block that found the work exhausted
        // ran every tile it could get, so some block ran more than its own when any was
        // stolen. (Any block, block 0 included, may find its own tile already stolen.)
        if own < tiles {
            assert!(blocks.iter().any(|b| b.0 > 1));
        }
    });
}

#[test]
fn max_steals_never_exceeds_n_per_block() {
    each_shape(|grid, tiles, imbalance| {
        for (t, s) in run_policy::<MaxSteals<4>>(grid, tiles, imbalance) {
            assert!(s <= 4 && (t == s + 1 || (t, s) == (0, 0)));
        }
    });
}

#[test]
fn every_nth_still_runs_everything() {
    each_shape(|grid, tiles, imbalance| {
        let blocks = run_policy::<EveryNth<2>>(grid, tiles, imbalance);
        assert_eq!(blocks.iter().map(|b| b.0).sum::<u32>(), tiles);
    });
}

#[test]
fn first_fraction_other_blocks_never_steal() {
    each_shape(|grid, tiles, imbalance| {
        for (block, (_, steals)) in run_policy::<FirstFraction<1, 2>>(grid, tiles, imbalance)
            .into_iter()
            .enumerate()
        {
            if 2 * block as u32 >= tiles {
                assert_eq!(steals, 0, "block {block} of {tiles} stole");
            }
        }
    });
}

#[test]
fn time_budget_zero_never_steals_and_a_long_one_steals_everything() {
    each_shape(|grid, tiles, imbalance| {
        let none = run_policy::<TimeBudget<0>>(grid, tiles, imbalance);
        assert!(none.iter().all(|b| b.1 == 0));
        let all = run_policy::<TimeBudget<3_600_000_000_000>>(grid, tiles, imbalance);
        assert_eq!(all.iter().map(|b| b.0).sum::<u32>(), tiles);
    });
}

#[test]
fn compositions_respect_both_bounds() {
    each_shape(|grid, tiles, imbalance| {
        for (block, (_, steals)) in
            run_policy::<And<FirstFraction<1, 2>, MaxSteals<3>>>(grid, tiles, imbalance)
                .into_iter()
                .enumerate()
        {
            assert!(steals <= 3);
            if 2 * block as u32 >= tiles {
                assert_eq!(steals, 0);
            }
        }
        for (_, steals) in run_policy::<Or<MaxSteals<2>, MaxSteals<5>>>(grid, tiles, imbalance) {
            assert!(steals <= 5);
        }
    });
}

#[test]
fn fixed_grid_runs_every_tile_once() {
    for tiles in [1u32, 7, 300] {
        let mut launch = Launch::new(tiles, THREADS);
        let workload = launch.workload(tiles, LINEAR_SKEW);
        run_grid(tiles, THREADS, &|| {
            // SAFETY: one block per tile; buffers sized for it.
            unsafe { fixed_grid(&workload) }
        });
        assert!(launch.counts.iter().all(|c| *c == 1));
    }
}
