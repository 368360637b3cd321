//! The benchmark workload of the work-stealing kernels: a per-block prologue (paid once per
//! block: the reason persistent kernels exist) and per-tile arithmetic whose amount depends on
//! the tile (imbalance). Each tile's run is counted, so tests can check that every tile ran
//! exactly once.

use super::TileId;
use crate::arch;

/// Every tile costs the same.
pub const UNIFORM: u32 = 0;
/// Tile `t` of `n` costs `1 + 3t/n` units: a linear skew from 1 to 4.
pub const LINEAR_SKEW: u32 = 1;
/// One tile in 64 costs 16 units, the others 1.
pub const ONE_HEAVY_IN_64: u32 = 2;

/// Parameters of a benchmark launch (the same for every kernel variant).
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Number of tiles.
    pub tiles: u32,
    /// [`UNIFORM`], [`LINEAR_SKEW`] or [`ONE_HEAVY_IN_64`].
    pub imbalance: u32,
    /// Arithmetic iterations per cost unit and thread.
    pub work_iterations: u32,
    /// Arithmetic iterations of the per-block prologue.
    pub prologue_iterations: u32,
    /// `tiles × blockDim` floats, one per (tile, thread).
    pub data: u64,
    /// `tiles` counters: runs of each tile.
    pub tile_counts: u64,
    /// `2 × gridDim` counters: (tiles run, steals) of each block.
    pub block_stats: u64,
}

/// Cost units of `tile`.
pub fn weight(tile: u32, tiles: u32, imbalance: u32) -> u32 {
    match imbalance {
        LINEAR_SKEW => 1 + (3 * tile as u64 / tiles.max(1) as u64) as u32,
        ONE_HEAVY_IN_64 if tile.is_multiple_of(64) => 16,
        _ => 1,
    }
}

/// The per-block prologue: `iterations` dependent operations; returns a value the tiles use.
#[inline(always)]
pub fn prologue(iterations: u32) -> f32 {
    let mut x = 1.0f32 + arch::block_idx_x() as f32 * 1e-6;
    for _ in 0..iterations {
        x = x * 0.999_9 + 1e-4;
    }
    arch::sync_threads();
    x
}

/// Run `tile`: every thread updates its float `weight × work_iterations` times; thread 0
/// counts the run.
///
/// # Safety
/// The workload's buffers are valid for `tiles` tiles of `blockDim` threads.
#[inline(always)]
pub unsafe fn run_tile(w: &Workload, tile: TileId, seed: f32) {
    let index = tile.0 as usize * arch::block_dim_x() as usize + arch::thread_idx_x() as usize;
    let slot = (w.data as *mut f32).wrapping_add(index);
    // SAFETY: tile < tiles and the buffer holds tiles × blockDim floats (caller's contract).
    let mut x = unsafe { slot.read() };
    let iterations = weight(tile.0, w.tiles, w.imbalance) * w.work_iterations;
    for _ in 0..iterations {
        x = x * 0.999_9 + seed * 1e-4;
    }
    // SAFETY: as above.
    unsafe { slot.write(x) };
    if arch::thread_idx_x() == 0 {
        // SAFETY: tile < tiles counters.
        unsafe { arch::atomic_add_gpu_u32((w.tile_counts as *mut u32).add(tile.0 as usize), 1) };
    }
}

/// Record this block's statistics.
///
/// # Safety
/// `block_stats` holds `2 × gridDim` counters.
pub unsafe fn record(w: &Workload, stats: super::BlockStats) {
    if arch::thread_idx_x() == 0 {
        let at = (w.block_stats as *mut u32).wrapping_add(2 * arch::block_idx_x() as usize);
        // SAFETY: inside the stats array (caller's contract).
        unsafe {
            at.write(stats.tiles);
            at.add(1).write(stats.steals);
        }
    }
}

/// Fixed grid: one block per tile, each paying the prologue.
///
/// # Safety
/// Launched with `tiles` blocks; buffers as in [`Workload`].
pub unsafe fn fixed_grid(w: &Workload) {
    let seed = prologue(w.prologue_iterations);
    let tile = TileId(arch::block_idx_x());
    if tile.0 < w.tiles {
        // SAFETY: forwarded contract.
        unsafe { run_tile(w, tile, seed) };
    }
    // SAFETY: forwarded contract.
    unsafe {
        record(
            w,
            super::BlockStats {
                tiles: 1,
                steals: 0,
            },
        )
    };
}

/// Run this block's tiles from `source` under policy `P`: the prologue is paid once, at the
/// first tile (a block whose own tile was stolen pays nothing), and the statistics recorded.
///
/// # Safety
/// Every tile `source` hands out is < `tiles`; buffers as in [`Workload`].
#[inline(always)]
unsafe fn steal_tiles<P: super::policy::Policy, S: super::source::Source>(w: &Workload, source: S) {
    let mut seed = None;
    let stats = super::driver::for_each_tile::<P, _>(source, |tile| {
        let seed = *seed.get_or_insert_with(|| prologue(w.prologue_iterations));
        // SAFETY: tiles handed out are < tiles (caller's contract).
        unsafe { run_tile(w, tile, seed) }
    });
    // SAFETY: forwarded contract.
    unsafe { record(w, stats) };
}

/// Stealing with the software source: one block per tile is launched; a block whose tile was
/// stolen exits before its prologue, a block that steals pays its prologue once for all the
/// tiles it runs.
///
/// # Safety
/// Launched with `tiles` blocks; `state` as in [`super::source::SoftwareSource::new`];
/// buffers as in [`Workload`].
pub unsafe fn stealing_software<P: super::policy::Policy>(w: &Workload, state: u64) {
    // SAFETY: forwarded contract; the software source hands out tiles < tiles.
    unsafe {
        let source = super::source::SoftwareSource::new(state as *mut u32, w.tiles);
        steal_tiles::<P, _>(w, source)
    }
}

/// Stealing with hardware CLC: one block per tile is launched; running blocks cancel the
/// blocks not yet launched and run their tiles.
///
/// # Safety
/// Launched with `tiles` blocks (no clusters) on sm_100a; buffers as in [`Workload`].
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
pub unsafe fn stealing_hardware<P: super::policy::Policy>(w: &Workload) {
    // SAFETY: stolen ids are block indices of this grid, < tiles.
    unsafe { steal_tiles::<P, _>(w, super::source::HardwareSource::new(false)) }
}

/// Stealing with hardware CLC in clusters: requests are multicast to every CTA of the
/// cluster, each CTA adds its position in the cluster to the stolen id, and the cluster syncs
/// before each request and before exiting.
///
/// # Safety
/// Launched with `tiles` blocks in clusters (x dimension) on sm_100a; buffers as in
/// [`Workload`].
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
pub unsafe fn stealing_hardware_clustered<P: super::policy::Policy>(w: &Workload) {
    // SAFETY: stolen ids are block indices of this grid, < tiles.
    unsafe { steal_tiles::<P, _>(w, super::source::HardwareSource::new(true)) }
}

/// The policies the benchmark kernels are exported with, by name (PTX names are
/// `symm_clc_software_<name>` and, in the sm_100a PTX, `symm_clc_hardware_<name>`).
pub const POLICIES: [&str; 7] = [
    "greedy",
    "max_steals_4",
    "every_2nd",
    "first_half",
    "time_budget_100us",
    "first_half_and_max_steals_4",
    "max_steals_2_or_first_half",
];

/// A benchmark kernel body as the host backend calls it: `(workload, software-source state)`.
pub type BenchKernel = unsafe fn(&Workload, u64);

/// Apply `$m!(name, PolicyType)` to every exported policy (keeps the list in one place).
#[macro_export]
#[doc(hidden)]
macro_rules! for_each_benchmark_policy {
    ($m:ident) => {
        $m!("greedy", $crate::scheduler::policy::Greedy);
        $m!("max_steals_4", $crate::scheduler::policy::MaxSteals<4>);
        $m!("every_2nd", $crate::scheduler::policy::EveryNth<2>);
        $m!("first_half", $crate::scheduler::policy::FirstFraction<1, 2>);
        $m!("time_budget_100us", $crate::scheduler::policy::TimeBudget<100_000>);
        $m!(
            "first_half_and_max_steals_4",
            $crate::scheduler::policy::And<
                $crate::scheduler::policy::FirstFraction<1, 2>,
                $crate::scheduler::policy::MaxSteals<4>,
            >
        );
        $m!(
            "max_steals_2_or_first_half",
            $crate::scheduler::policy::Or<
                $crate::scheduler::policy::MaxSteals<2>,
                $crate::scheduler::policy::FirstFraction<1, 2>,
            >
        );
    };
}

/// The software-source stealing kernel for policy `name`.
pub fn software_kernel(name: &str) -> Option<BenchKernel> {
    let mut found: Option<BenchKernel> = None;
    macro_rules! pick {
        ($n:expr, $p:ty) => {
            if $n == name {
                found = Some(stealing_software::<$p>);
            }
        };
    }
    crate::for_each_benchmark_policy!(pick);
    found
}

/// The fixed-grid kernel, with the benchmark kernels' signature.
///
/// # Safety
/// As for [`fixed_grid`].
pub unsafe fn fixed_grid_kernel(w: &Workload, _state: u64) {
    // SAFETY: forwarded contract.
    unsafe { fixed_grid(w) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_listed_policy_has_a_kernel() {
        for name in super::POLICIES {
            assert!(super::software_kernel(name).is_some(), "{name}");
        }
        assert!(super::software_kernel("random").is_none());
    }
}
