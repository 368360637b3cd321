//! Work-stealing benchmark launches: the fixed-grid, software-source and hardware-CLC kernels
//! of `symm_device::scheduler::workload`: their configuration, the host emulation and the
//! report (the cuda executor launches them: `Backend::run_clc_benchmark`). Hardware CLC needs an sm_100 GPU:
//! anywhere else the request is `symmUnsupported`, never a launch of instructions the GPU does
//! not have.

use crate::error::{Error, Result};
use symm_device::arch::host::run_grid_with_residency;
use symm_device::scheduler::source::SoftwareSource;
use symm_device::scheduler::workload::{self, Workload};

/// Which kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// One block per tile, no stealing.
    FixedGrid,
    /// Stealing with the software source and a policy (one of `workload::POLICIES`).
    Software(&'static str),
    /// Stealing with hardware CLC and a policy (sm_100a only).
    Hardware(&'static str),
    /// Stealing with hardware CLC in clusters of `cluster` CTAs along x (multicast requests;
    /// greedy policy; sm_100a only). The tile count must be a multiple of `cluster`.
    HardwareClustered {
        /// CTAs per cluster, 1 to 8 (the portable cluster size limit).
        cluster: u32,
    },
}

impl Variant {
    /// Kernel name in the PTX.
    pub fn ptx_name(self) -> String {
        match self {
            Variant::FixedGrid => "symm_clc_fixed_grid".to_string(),
            Variant::Software(p) => format!("symm_clc_software_{p}"),
            Variant::Hardware(p) => format!("symm_clc_hardware_{p}"),
            Variant::HardwareClustered { .. } => "symm_clc_hardware_clustered_greedy".to_string(),
        }
    }

    /// Whether the kernel uses Cluster Launch Control instructions (sm_100a only).
    pub fn is_hardware(self) -> bool {
        matches!(
            self,
            Variant::Hardware(_) | Variant::HardwareClustered { .. }
        )
    }

    /// CTAs per cluster of the launch (1: no cluster launch).
    pub fn cluster(self) -> u32 {
        match self {
            Variant::HardwareClustered { cluster } => cluster,
            _ => 1,
        }
    }
}

/// A benchmark configuration.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Tiles (and launched blocks).
    pub tiles: u32,
    /// `workload::UNIFORM`, `LINEAR_SKEW` or `ONE_HEAVY_IN_64`.
    pub imbalance: u32,
    /// Arithmetic iterations per cost unit.
    pub work_iterations: u32,
    /// Prologue iterations per block.
    pub prologue_iterations: u32,
    /// Threads per block.
    pub threads: u32,
    /// Timed launches (the median is reported).
    pub iterations: usize,
    /// CUDA device.
    pub device: i32,
}

/// What a benchmark measured.
#[derive(Clone, Debug)]
pub struct Report {
    /// Median time of one launch, µs (CUDA events on the cuda backend, wall time on the host).
    pub time_us: f64,
    /// Tiles run by each block that ran at least one (last launch).
    pub tiles_per_block: Vec<u32>,
    /// Successful steals (last launch).
    pub steals: u64,
    /// Every tile ran exactly once in every launch.
    pub exactly_once: bool,
}

/// Check `variant` and `config` before anything is launched (the cuda executor and the host
/// emulation both start with it).
pub fn validate(variant: Variant, config: &Config) -> Result<()> {
    if let Variant::Software(p) | Variant::Hardware(p) = variant
        && !workload::POLICIES.contains(&p)
    {
        return Err(Error::invalid_argument(format!("unknown policy {p:?}")));
    }
    if config.tiles == 0 || config.threads == 0 || config.threads > 1024 {
        return Err(Error::invalid_argument(
            "tiles must be >= 1 and threads in 1..=1024",
        ));
    }
    let cluster = variant.cluster();
    if !(1..=8).contains(&cluster) || !config.tiles.is_multiple_of(cluster) {
        return Err(Error::invalid_argument(format!(
            "cluster size {cluster} must be in 1..=8 and divide the tile count {}",
            config.tiles
        )));
    }
    Ok(())
}

/// Blocks of the host emulation that run at once (an SM count of sorts).
const HOST_RESIDENT_BLOCKS: u32 = 8;

/// Run `variant` on CPU threads, `config.iterations` times after one warm-up (the host and
/// model executors), once [`validate`] accepted it.
pub(crate) fn run_on_host(variant: Variant, config: &Config) -> Result<Report> {
    let kernel: workload::BenchKernel = match variant {
        Variant::FixedGrid => workload::fixed_grid_kernel,
        Variant::Software(p) => workload::software_kernel(p).expect("policy checked"),
        Variant::Hardware(_) | Variant::HardwareClustered { .. } => {
            return Err(Error::unsupported(
                "hardware Cluster Launch Control needs an sm_100 GPU; the host backend has \
                 none (use a software policy)",
            ));
        }
    };
    let tiles = config.tiles as usize;
    let mut data = vec![1.0f32; tiles * config.threads as usize];
    let mut counts = vec![0u32; tiles];
    let mut stats = vec![0u32; 2 * tiles];
    let mut state = vec![0u32; SoftwareSource::state_words(config.tiles)];
    let w = Workload {
        tiles: config.tiles,
        imbalance: config.imbalance,
        work_iterations: config.work_iterations,
        prologue_iterations: config.prologue_iterations,
        data: data.as_mut_ptr() as u64,
        tile_counts: counts.as_mut_ptr() as u64,
        block_stats: stats.as_mut_ptr() as u64,
    };
    let state_address = state.as_mut_ptr() as u64;
    let mut times = Vec::new();
    for launch in 0..=config.iterations {
        let start = std::time::Instant::now();
        run_grid_with_residency(config.tiles, config.threads, HOST_RESIDENT_BLOCKS, &|| {
            // SAFETY: one block per tile, buffers sized for `tiles` tiles of `threads`
            // threads and for the software source's state.
            unsafe { kernel(&w, state_address) }
        });
        if launch > 0 {
            times.push(start.elapsed().as_secs_f64() * 1e6);
        }
    }
    let launches = config.iterations as u32 + 1;
    Ok(report(&mut times, &counts, launches, &stats))
}

/// Summarize the last launch's statistics.
pub fn report(times: &mut [f64], counts: &[u32], launches: u32, stats: &[u32]) -> Report {
    times.sort_by(f64::total_cmp);
    let time_us = times.get(times.len() / 2).copied().unwrap_or(0.0);
    let tiles_per_block = stats.chunks(2).map(|c| c[0]).filter(|t| *t > 0).collect();
    let steals = stats.chunks(2).map(|c| c[1] as u64).sum();
    Report {
        time_us,
        tiles_per_block,
        steals,
        exactly_once: counts.iter().all(|c| *c == launches),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::symmResult_t;
    use crate::backend::Backend;
    use crate::backend::host::HostBackend;

    #[test]
    fn host_runs_fixed_and_software_variants_and_refuses_hardware() {
        let backend = Backend::Host(HostBackend::new());
        let config = Config {
            tiles: 200,
            imbalance: workload::ONE_HEAVY_IN_64,
            work_iterations: 10,
            prologue_iterations: 10,
            threads: 4,
            iterations: 2,
            device: 0,
        };
        let fixed = backend
            .run_clc_benchmark(Variant::FixedGrid, &config)
            .unwrap();
        assert!(fixed.exactly_once && fixed.steals == 0);
        assert_eq!(fixed.tiles_per_block.len(), 200);
        let greedy = backend
            .run_clc_benchmark(Variant::Software("greedy"), &config)
            .unwrap();
        assert!(greedy.exactly_once);
        assert_eq!(greedy.tiles_per_block.iter().sum::<u32>(), 200);
        let capped = backend
            .run_clc_benchmark(Variant::Software("max_steals_4"), &config)
            .unwrap();
        assert!(capped.tiles_per_block.iter().all(|t| *t <= 5));
        let e = backend
            .run_clc_benchmark(Variant::Hardware("greedy"), &config)
            .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmUnsupported);
        let e = backend
            .run_clc_benchmark(Variant::HardwareClustered { cluster: 2 }, &config)
            .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmUnsupported);
        let odd = Config { tiles: 7, ..config };
        let e = backend
            .run_clc_benchmark(Variant::HardwareClustered { cluster: 2 }, &odd)
            .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let e = backend
            .run_clc_benchmark(Variant::Software("lucky"), &config)
            .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
    }
}
