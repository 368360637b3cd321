//! The example's kernels as the Rust API launches them: each one's entry in the kernels' PTX
//! (the cuda backend) and its host form (the host backend).

use symm::{Kernel, WindowArg};

/// The kernels' PTX, compiled by the build script.
pub const PTX: &str = include_str!(env!("SYMM_EXAMPLE_KERNELS_PTX"));

/// `symm_example_kernels::ring_then_sum`.
pub static RING_THEN_SUM: Kernel<(WindowArg<f32>, u64, f32)> =
    Kernel::new("ring_then_sum", PTX, |(window, n, scale)| {
        symm_example_kernels::ring_then_sum(window, n, scale)
    });

/// `symm_example_kernels::tiles_then_sum`.
pub static TILES_THEN_SUM: Kernel<(WindowArg<f32>, u64, u32)> =
    Kernel::new("tiles_then_sum", PTX, |(window, n, tiles)| {
        symm_example_kernels::tiles_then_sum(window, n, tiles)
    });
