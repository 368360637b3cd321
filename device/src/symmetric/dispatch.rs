//! The kernel of each (algorithm, data type, operator): a function pointer for the host
//! backend, and the PTX name under which [`crate::exports`] exports the same function.

use super::all_gather::{all_gather, ll_all_gather};
use super::all_reduce::{one_shot_all_reduce, one_shot_ll_all_reduce, two_shot_all_reduce};
use super::all_to_all_v::all_to_all_v;
use super::broadcast::broadcast;
use super::pat::{pat_all_gather, pat_reduce_scatter};
use super::point_to_point::send_receive;
use super::reduce_scatter::reduce_scatter;
use super::segments::{all_to_all, gather, scatter};
use super::{Algorithm, Batch, Grid, KernelStatus};
use crate::numeric::element::{Bf16, Element, F8E4M3, F8E5M2, F16};
use crate::numeric::ops::{Avg, Max, Min, Prod, ReduceOp, Sum};
use crate::types::{DataType, RedOp};

/// A kernel body as the host backend calls it.
pub type KernelFn = unsafe fn(&Batch<'_>, Grid) -> KernelStatus;

/// PTX parameters shared by every exported kernel, in order (`TaskArgs` is
/// [`super::TaskArgs`], 80 bytes; the table holds `rank_count × task_count` entries,
/// rank-major).
pub const KERNEL_PARAMETERS: &str = "(const TaskArgs* tasks, u32 task_count, u32 rank_count)";

/// PTX name of the kernel for `algorithm` (reductions: on `dtype` with `op`).
pub fn kernel_name(algorithm: Algorithm, dtype: DataType, op: RedOp) -> heapless_name::KernelName {
    let mut name = heapless_name::KernelName::new();
    name.push("symm_");
    name.push(algorithm.name());
    if !algorithm.is_data_type_agnostic() {
        name.push("_");
        name.push(dtype.short_name());
        name.push("_");
        name.push(op.short_name());
    }
    name
}

/// A fixed-capacity kernel name (no allocation: this crate is `no_std`).
pub mod heapless_name {
    /// Up to 64 bytes of ASCII.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub struct KernelName {
        bytes: [u8; 64],
        len: usize,
    }

    impl KernelName {
        pub(super) const fn new() -> Self {
            KernelName {
                bytes: [0; 64],
                len: 0,
            }
        }

        pub(super) fn push(&mut self, s: &str) {
            let end = self.len + s.len();
            self.bytes[self.len..end].copy_from_slice(s.as_bytes());
            self.len = end;
        }

        /// The name.
        pub fn as_str(&self) -> &str {
            core::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
        }
    }

    impl core::fmt::Debug for KernelName {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str(self.as_str())
        }
    }
}

fn pick<T: Element, O: ReduceOp>(algorithm: Algorithm) -> KernelFn {
    match algorithm {
        Algorithm::OneShotAllReduce => one_shot_all_reduce::<T, O>,
        Algorithm::OneShotLlAllReduce => one_shot_ll_all_reduce::<T, O>,
        Algorithm::TwoShotAllReduce => two_shot_all_reduce::<T, O>,
        Algorithm::ReduceScatter => reduce_scatter::<T, O>,
        Algorithm::AllGather => all_gather,
        Algorithm::LlAllGather => ll_all_gather,
        Algorithm::PatAllGather => pat_all_gather,
        Algorithm::PatReduceScatter => pat_reduce_scatter::<T, O>,
        Algorithm::Broadcast => broadcast,
        Algorithm::AllToAll => all_to_all,
        Algorithm::Gather => gather,
        Algorithm::Scatter => scatter,
        Algorithm::AllToAllV => all_to_all_v,
        Algorithm::SendReceive => send_receive,
    }
}

fn by_op<T: Element>(algorithm: Algorithm, op: RedOp) -> KernelFn {
    match op {
        RedOp::Sum => pick::<T, Sum>(algorithm),
        RedOp::Prod => pick::<T, Prod>(algorithm),
        RedOp::Max => pick::<T, Max>(algorithm),
        RedOp::Min => pick::<T, Min>(algorithm),
        RedOp::Avg => pick::<T, Avg>(algorithm),
    }
}

/// The kernel for `algorithm` on `dtype` with `op` (both ignored by the all-gathers and the
/// broadcast).
pub fn kernel(algorithm: Algorithm, dtype: DataType, op: RedOp) -> KernelFn {
    match dtype {
        DataType::Int8 => by_op::<i8>(algorithm, op),
        DataType::Uint8 => by_op::<u8>(algorithm, op),
        DataType::Int32 => by_op::<i32>(algorithm, op),
        DataType::Uint32 => by_op::<u32>(algorithm, op),
        DataType::Int64 => by_op::<i64>(algorithm, op),
        DataType::Uint64 => by_op::<u64>(algorithm, op),
        DataType::Float16 => by_op::<F16>(algorithm, op),
        DataType::Float32 => by_op::<f32>(algorithm, op),
        DataType::Float64 => by_op::<f64>(algorithm, op),
        DataType::Bfloat16 => by_op::<Bf16>(algorithm, op),
        DataType::Float8E4M3 => by_op::<F8E4M3>(algorithm, op),
        DataType::Float8E5M2 => by_op::<F8E5M2>(algorithm, op),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            kernel_name(Algorithm::TwoShotAllReduce, DataType::Bfloat16, RedOp::Avg).as_str(),
            "symm_two_shot_all_reduce_bf16_avg"
        );
        assert_eq!(
            kernel_name(Algorithm::AllGather, DataType::Int8, RedOp::Max).as_str(),
            "symm_all_gather"
        );
        assert_eq!(
            kernel_name(Algorithm::Broadcast, DataType::Float64, RedOp::Avg).as_str(),
            "symm_broadcast"
        );
    }
}
