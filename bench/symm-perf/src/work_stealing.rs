//! The work-stealing benchmark: the fixed-grid, software-source and hardware-CLC kernels of
//! `symm_device::scheduler::workload`, on the GPU (launched by name through the cuda backend,
//! timed with CUDA events) or emulated on CPU threads (the host backend). Hardware CLC needs an
//! sm_100 GPU: anywhere else the request is `symmUnsupported`, never a launch of instructions
//! the GPU does not have.

use symm::internals::{Backend, Error, KernelArg, KernelLaunch};
use symm::symmResult_t;
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

/// The `.param` types of the benchmark kernels, in order (what [`run`] passes; the PTX linter
/// of the tests checks every `symm_clc_*` kernel declares them).
pub const PTX_PARAM_TYPES: [&str; 8] = ["u32", "u32", "u32", "u32", "u64", "u64", "u64", "u64"];

/// Check `variant` and `config` before anything is launched.
pub fn validate(variant: Variant, config: &Config) -> Result<(), Error> {
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

/// Run `variant` `config.iterations` times after one warm-up: on the GPU (the cuda backend),
/// else as the host emulation.
pub fn run(backend: &Backend, variant: Variant, config: &Config) -> Result<Report, Error> {
    validate(variant, config)?;
    match backend.compute_capability(config.device)? {
        Some(capability) => run_on_gpu(backend, variant, config, capability),
        None => run_on_host(variant, config),
    }
}

/// The device buffers of one run, freed when dropped.
struct DeviceBuffers<'a> {
    backend: &'a Backend,
    device: i32,
    addresses: Vec<u64>,
}

impl DeviceBuffers<'_> {
    fn alloc(&mut self, bytes: usize) -> Result<u64, Error> {
        let address = self.backend.alloc_zeroed(self.device, bytes)?;
        self.addresses.push(address);
        Ok(address)
    }
}

impl Drop for DeviceBuffers<'_> {
    fn drop(&mut self) {
        for &address in &self.addresses {
            let _ = self.backend.free(self.device, address);
        }
    }
}

fn run_on_gpu(
    backend: &Backend,
    variant: Variant,
    config: &Config,
    (major, minor): (i32, i32),
) -> Result<Report, Error> {
    if variant.is_hardware() && (major, minor) != (10, 0) {
        return Err(Error::unsupported(format!(
            "device {} has compute capability {major}.{minor}: hardware Cluster Launch Control \
             kernels are built for sm_100a (compute capability 10.0) only",
            config.device
        )));
    }
    let tiles = config.tiles as usize;
    let mut buffers = DeviceBuffers {
        backend,
        device: config.device,
        addresses: Vec::new(),
    };
    let data = buffers.alloc(tiles * config.threads as usize * 4)?;
    let counts = buffers.alloc(tiles * 4)?;
    let stats = buffers.alloc(tiles * 8)?;
    let state = buffers.alloc(SoftwareSource::state_words(config.tiles) * 4)?;
    let ones: Vec<u8> = (0..tiles * config.threads as usize)
        .flat_map(|_| 1.0f32.to_ne_bytes())
        .collect();
    backend.upload(config.device, data, &ones)?;
    let name = variant.ptx_name();
    let launch = KernelLaunch {
        device: config.device,
        name: &name,
        blocks: config.tiles,
        threads: config.threads,
        cluster: variant.cluster(),
    };
    let args = [
        KernelArg::U32(config.tiles),
        KernelArg::U32(config.imbalance),
        KernelArg::U32(config.work_iterations),
        KernelArg::U32(config.prologue_iterations),
        KernelArg::U64(data),
        KernelArg::U64(counts),
        KernelArg::U64(stats),
        KernelArg::U64(state),
    ];
    debug_assert!(args.iter().map(|a| a.ptx_type()).eq(PTX_PARAM_TYPES));
    let mut times = backend.time_kernel(&launch, &args, config.iterations + 1)?;
    times.remove(0); // the warm-up
    let mut host_counts = vec![0u8; tiles * 4];
    let mut host_stats = vec![0u8; tiles * 8];
    backend.download(config.device, counts, &mut host_counts)?;
    backend.download(config.device, stats, &mut host_stats)?;
    let words = |bytes: &[u8]| -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let launches = config.iterations as u32 + 1;
    Ok(report(
        &mut times,
        &words(&host_counts),
        launches,
        &words(&host_stats),
    ))
}

/// Blocks of the host emulation that run at once (an SM count of sorts).
const HOST_RESIDENT_BLOCKS: u32 = 8;

/// Run `variant` on CPU threads, `config.iterations` times after one warm-up, once
/// [`validate`] accepted it.
fn run_on_host(variant: Variant, config: &Config) -> Result<Report, Error> {
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
fn report(times: &mut [f64], counts: &[u32], launches: u32, stats: &[u32]) -> Report {
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

/// `true` for the error of a variant the backend or device cannot run.
pub fn is_unsupported(e: &Error) -> bool {
    e.code == symmResult_t::symmUnsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Backend {
        Backend::Host(symm::internals::HostBackend::new())
    }

    #[test]
    fn host_runs_fixed_and_software_variants_and_refuses_hardware() {
        let backend = host();
        let config = Config {
            tiles: 200,
            imbalance: workload::ONE_HEAVY_IN_64,
            work_iterations: 10,
            prologue_iterations: 10,
            threads: 4,
            iterations: 2,
            device: 0,
        };
        let fixed = run(&backend, Variant::FixedGrid, &config).unwrap();
        assert!(fixed.exactly_once && fixed.steals == 0);
        assert_eq!(fixed.tiles_per_block.len(), 200);
        let greedy = run(&backend, Variant::Software("greedy"), &config).unwrap();
        assert!(greedy.exactly_once);
        assert_eq!(greedy.tiles_per_block.iter().sum::<u32>(), 200);
        let capped = run(&backend, Variant::Software("max_steals_4"), &config).unwrap();
        assert!(capped.tiles_per_block.iter().all(|t| *t <= 5));
        for variant in [
            Variant::Hardware("greedy"),
            Variant::HardwareClustered { cluster: 2 },
        ] {
            let e = run(&backend, variant, &config).unwrap_err();
            assert!(is_unsupported(&e), "{}", e.message);
        }
        let odd = Config { tiles: 7, ..config };
        let e = run(&backend, Variant::HardwareClustered { cluster: 2 }, &odd).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let e = run(&backend, Variant::Software("lucky"), &config).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
    }

    #[test]
    fn a_kernel_by_name_needs_the_cuda_backend() {
        let launch = KernelLaunch {
            device: 0,
            name: "symm_clc_fixed_grid",
            blocks: 1,
            threads: 1,
            cluster: 1,
        };
        let e = host().time_kernel(&launch, &[], 1).unwrap_err();
        assert!(is_unsupported(&e), "{}", e.message);
    }
}
