//! Plans: pure functions from a validated request to a kernel and a launch shape. No memory is
//! touched here, so every decision is testable on the host.

use crate::backend::BackendKind;
use crate::error::{Error, Result};
use symm_device::exports::ONE_SHOT_ALL_REDUCE_F32_SUM;
use symm_device::symmetric::all_reduce::AllReduceArgs;
use symm_device::sync::signal_pad::MAX_BLOCKS;
use symm_device::{DataType, RedOp};

/// A kernel of the device crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelId {
    /// `symm_one_shot_all_reduce_f32_sum`.
    OneShotAllReduceF32Sum,
}

impl KernelId {
    /// The kernel's name in the PTX.
    pub fn ptx_name(self) -> &'static str {
        match self {
            KernelId::OneShotAllReduceF32Sum => ONE_SHOT_ALL_REDUCE_F32_SUM,
        }
    }
}

/// Kernel and launch shape of an all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllReducePlan {
    /// The kernel to launch.
    pub kernel: KernelId,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
}

/// Everything a backend needs to launch one rank's kernel.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The kernel.
    pub kernel: KernelId,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Device address of the window's `SymmContext`.
    pub context: u64,
    /// Kernel arguments.
    pub args: AllReduceArgs,
    /// The caller's `CUstream` (cuda backend), as an address.
    pub stream: u64,
}

/// Bytes each GPU block handles before another block is worth adding.
const GPU_BYTES_PER_BLOCK: u64 = 32 * 1024;
/// Most blocks a GPU all-reduce uses (this version's one-shot kernel).
const GPU_MAX_BLOCKS: u64 = 16;
/// Threads per GPU block.
const GPU_THREADS: u32 = 512;
/// Elements per emulated block before the host backend adds a second one.
const HOST_ELEMENTS_PER_BLOCK: u64 = 8192;
/// Threads per emulated block (kept small: they are OS threads).
const HOST_THREADS: u32 = 8;

/// Choose the kernel and launch shape of an all-reduce of `count` elements.
pub fn plan_all_reduce(
    dtype: DataType,
    op: RedOp,
    count: u64,
    backend: BackendKind,
) -> Result<AllReducePlan> {
    let kernel = match (dtype, op) {
        (DataType::Float32, RedOp::Sum) => KernelId::OneShotAllReduceF32Sum,
        _ => {
            return Err(Error::unsupported(format!(
                "all-reduce of {dtype:?} with {op:?} is not implemented in this version \
                 (float32 sum is)"
            )));
        }
    };
    let bytes = count * dtype.size_bytes() as u64;
    let (grid, block) = match backend {
        BackendKind::Cuda => (
            bytes.div_ceil(GPU_BYTES_PER_BLOCK).clamp(1, GPU_MAX_BLOCKS),
            GPU_THREADS,
        ),
        BackendKind::Host => (
            count.div_ceil(HOST_ELEMENTS_PER_BLOCK).clamp(1, 2),
            HOST_THREADS,
        ),
    };
    debug_assert!(grid as usize <= MAX_BLOCKS);
    Ok(AllReducePlan {
        kernel,
        grid: grid as u32,
        block,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_sum_is_planned_within_limits() {
        for count in [0u64, 1, 7, 1023, 4099, 1 << 20, 1 << 30] {
            for backend in [BackendKind::Host, BackendKind::Cuda] {
                let plan = plan_all_reduce(DataType::Float32, RedOp::Sum, count, backend).unwrap();
                assert_eq!(plan.kernel, KernelId::OneShotAllReduceF32Sum);
                assert!(plan.grid >= 1 && plan.grid as usize <= MAX_BLOCKS);
                assert!(plan.block >= 1 && plan.block <= 1024);
            }
        }
    }

    #[test]
    fn gpu_grid_grows_with_size() {
        let small = plan_all_reduce(DataType::Float32, RedOp::Sum, 256, BackendKind::Cuda).unwrap();
        let large =
            plan_all_reduce(DataType::Float32, RedOp::Sum, 1 << 22, BackendKind::Cuda).unwrap();
        assert_eq!(small.grid, 1);
        assert_eq!(large.grid as u64, GPU_MAX_BLOCKS);
    }

    #[test]
    fn other_pairs_are_unsupported_not_wrong() {
        for dtype in DataType::ALL {
            for op in RedOp::ALL {
                let r = plan_all_reduce(dtype, op, 10, BackendKind::Host);
                if (dtype, op) == (DataType::Float32, RedOp::Sum) {
                    assert!(r.is_ok());
                } else {
                    let e = r.unwrap_err();
                    assert_eq!(e.code, crate::ffi::types::symmResult_t::symmUnsupported);
                    assert!(e.message.contains("not implemented"));
                }
            }
        }
    }
}
