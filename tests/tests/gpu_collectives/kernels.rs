//! The kernels themselves: loaded from the shipped SASS where it runs (from the PTX
//! elsewhere), and the software work source running every tile exactly once.

use crate::probes::simulator_symbol;
use crate::{cuda_ranks, run_group};
use std::ptr::null_mut;
use symm::*;
use symm_device::DataType;
use symm_tests::*;

gpu_test! {
    /// Kernels load from the shipped SASS on a GPU it runs on (compute capability 8.x, 9.x, 10.0),
    /// with no JIT compilation; the simulated GPU refuses binary images, and there they come from
    /// the PTX (the fallback a driver older than the SASS's ptxas takes). The call is right either
    /// way.
    fn gpu_kernels_load_from_the_shipped_sass_where_it_runs() {
        let backend = symm::internals::select_backend().unwrap();
        let symm::internals::Backend::Cuda(cuda) = &*backend else {
            panic!("run with SYMM_BACKEND=cuda");
        };
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        run_group(
            |_, b| {
                symmAllReduce(
                    b.base.cast(),
                    b.base.cast(),
                    5,
                    DataType::Float32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    null_mut(),
                )
            },
            &buffers,
        );
        let from_sass = cuda.kernels_from_sass(0);
        let simulated = simulator_symbol(c"symm_sim_driver_calls").is_some();
        let jit_asked = std::env::var_os("SYMM_JIT_PTX").is_some_and(|v| !v.is_empty() && v != "0");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: device 0 exists (the ranks above run on it); writes two ints.
        unsafe {
            cudarc::driver::sys::cuDeviceGetAttribute(
                &mut major,
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                0,
            );
            cudarc::driver::sys::cuDeviceGetAttribute(
                &mut minor,
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                0,
            );
        }
        let sass_runs = symm::internals::sass_target_for_capability(major, minor).is_some();
        let expected = !simulated && !jit_asked && sass_runs;
        assert_eq!(
            from_sass,
            Some(expected),
            "compute capability {major}.{minor}, simulated {simulated}, SYMM_JIT_PTX {jit_asked}"
        );
        teardown(buffers);
    }
}

gpu_test! {
    fn gpu_software_work_source_runs_every_tile_exactly_once() {
        use symm_device::scheduler::workload::{LINEAR_SKEW, ONE_HEAVY_IN_64, POLICIES, UNIFORM};
        use symm_perf::work_stealing::{self, Config, Variant};
        let backend = symm::internals::select_backend().unwrap();
        assert_eq!(backend.kind().name(), "cuda", "run with SYMM_BACKEND=cuda");
        // SYMM_GPU_TEST_MAX_TILES (the simulated GPU): fewer tiles, each with less work; the
        // exactly-once property does not depend on how long a tile takes.
        let max_tiles = std::env::var("SYMM_GPU_TEST_MAX_TILES")
            .ok()
            .and_then(|v| v.parse::<u32>().ok());
        let (work_iterations, prologue_iterations, iterations) = match max_tiles {
            Some(_) => (4, 8, 1),
            None => (50, 100, 3),
        };
        let mut tile_counts: Vec<u32> = [1, 7, 1000, 10_000]
            .into_iter()
            .map(|t| max_tiles.map_or(t, |m| t.min(m.max(1))))
            .collect();
        tile_counts.dedup();
        for tiles in tile_counts {
            for imbalance in [UNIFORM, LINEAR_SKEW, ONE_HEAVY_IN_64] {
                let config = Config {
                    tiles,
                    imbalance,
                    work_iterations,
                    prologue_iterations,
                    threads: 128,
                    iterations,
                    device: 0,
                };
                let variants = std::iter::once(Variant::FixedGrid)
                    .chain(POLICIES.iter().map(|p| Variant::Software(p)));
                for variant in variants {
                    let report = work_stealing::run(&backend, variant, &config).unwrap();
                    assert!(
                        report.exactly_once,
                        "{} tiles {tiles} imbalance {imbalance}",
                        variant.ptx_name()
                    );
                }
            }
        }
    }
}
