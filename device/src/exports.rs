//! What the PTX and the bitcode export: one kernel entry point (`extern "ptx-kernel"`) per
//! (algorithm, data type, operator), named as [`crate::symmetric::dispatch::kernel_name`]
//! says, plus `symm_all_gather`, and the device function Triton kernels link against. Every
//! body is a target-independent function, so the host backend and the tests run exactly what
//! the GPU runs.
//!
//! Every kernel takes [`crate::symmetric::dispatch::KERNEL_PARAMETERS`]: a work table of task
//! descriptors (`task_count` per rank served by the launch; the grid is split evenly among the
//! ranks), the number of tasks and the number of ranks.

use crate::context::{BackendTag, SymmContext};
use crate::numeric::element::{Bf16, Element, F16};
use crate::numeric::ops::{Avg, Max, Min, ReduceOp, Sum};
use crate::symmetric::all_reduce::one_shot_all_reduce;
use crate::symmetric::{FLAG_IN_PLACE, KernelStatus, TaskArgs, for_virtual_rank};
use crate::types::{DataType, RedOp};

/// Return codes of [`symm_all_reduce_device`] (and of the exported `symm_all_reduce`).
pub mod device_status {
    /// Success.
    pub const SUCCESS: i32 = 0;
    /// The context pointer is null.
    pub const NULL_CONTEXT: i32 = -1;
    /// The context's backend tag is not one this library implements.
    pub const UNKNOWN_BACKEND: i32 = -2;
    /// The reduction is not supported by the device function.
    pub const UNSUPPORTED_OP: i32 = -3;
    /// The data type is not supported by the device function.
    pub const UNSUPPORTED_DTYPE: i32 = -4;
    /// A peer did not arrive in time (or the window was aborted); the abort word is set.
    pub const TIMEOUT: i32 = -5;
    /// `local_ptr` is not this rank's window base, the range leaves the window or is
    /// misaligned, or the grid is larger than the signal pad allows.
    pub const INVALID_ARGUMENT: i32 = -6;
}

/// In-place one-shot all-reduce of `num_elements` elements at `byte_offset` of the window
/// described by `ctx`, for device code that links the bitcode (Triton). Every thread of every
/// block of the calling grid must call it with the same arguments, and every rank must make the
/// same call. Supports float32, float16 and bfloat16 with sum, avg, max and min.
///
/// `local_ptr` is this rank's window base (as Triton sees it) or 0.
///
/// # Safety
/// `ctx` must be 0 or the address of a context built by the host for this rank.
#[inline(always)]
pub unsafe fn symm_all_reduce_device(
    ctx: i64,
    local_ptr: i64,
    byte_offset: i64,
    num_elements: i64,
    reduce_op: i32,
    dtype: i32,
) -> i32 {
    use device_status::*;
    if ctx == 0 {
        return NULL_CONTEXT;
    }
    // SAFETY: a non-null ctx is a host-built context (caller's contract).
    let context = unsafe { &*(ctx as u64 as *const SymmContext) };
    if context.backend != BackendTag::Native as u32 {
        return UNKNOWN_BACKEND;
    }
    let Some(dtype) = DataType::from_raw(dtype as u32) else {
        return UNSUPPORTED_DTYPE;
    };
    let Some(op) = RedOp::from_raw(reduce_op as u32) else {
        return UNSUPPORTED_OP;
    };
    let size = dtype.size_bytes() as i64;
    let in_window = byte_offset >= 0
        && num_elements >= 0
        && num_elements
            .checked_mul(size)
            .and_then(|bytes| bytes.checked_add(byte_offset))
            .is_some_and(|end| end as u64 <= context.window_size);
    if !in_window
        || (local_ptr != 0 && local_ptr as u64 != context.local_base)
        || byte_offset % size != 0
    {
        return INVALID_ARGUMENT;
    }
    let table = TaskArgs {
        send_context: ctx as u64,
        recv_context: ctx as u64,
        send_offset: byte_offset as u64,
        recv_offset: byte_offset as u64,
        count: num_elements as u64,
        first_cell: 0,
        flags: FLAG_IN_PLACE,
        reserved: 0,
    };
    fn run<T: Element, O: ReduceOp>(table: &TaskArgs) -> KernelStatus {
        // SAFETY: the table holds one task of one rank with a host-built context; the range
        // was checked above.
        unsafe {
            for_virtual_rank(table, 1, 1, |batch, grid| {
                one_shot_all_reduce::<T, O>(batch, grid)
            })
        }
    }
    let status = match (dtype, op) {
        (DataType::Float32, RedOp::Sum) => run::<f32, Sum>(&table),
        (DataType::Float32, RedOp::Avg) => run::<f32, Avg>(&table),
        (DataType::Float32, RedOp::Max) => run::<f32, Max>(&table),
        (DataType::Float32, RedOp::Min) => run::<f32, Min>(&table),
        (DataType::Bfloat16, RedOp::Sum) => run::<Bf16, Sum>(&table),
        (DataType::Bfloat16, RedOp::Avg) => run::<Bf16, Avg>(&table),
        (DataType::Bfloat16, RedOp::Max) => run::<Bf16, Max>(&table),
        (DataType::Bfloat16, RedOp::Min) => run::<Bf16, Min>(&table),
        (DataType::Float16, RedOp::Sum) => run::<F16, Sum>(&table),
        (DataType::Float16, RedOp::Avg) => run::<F16, Avg>(&table),
        (DataType::Float16, RedOp::Max) => run::<F16, Max>(&table),
        (DataType::Float16, RedOp::Min) => run::<F16, Min>(&table),
        (DataType::Float32 | DataType::Bfloat16 | DataType::Float16, _) => {
            return UNSUPPORTED_OP;
        }
        _ => return UNSUPPORTED_DTYPE,
    };
    match status {
        KernelStatus::Completed => SUCCESS,
        KernelStatus::Aborted => TIMEOUT,
        KernelStatus::InvalidLaunch => INVALID_ARGUMENT,
    }
}

#[cfg(target_arch = "nvptx64")]
mod ptx {
    use super::*;
    use crate::numeric::element::{F8E4M3, F8E5M2};
    use crate::numeric::ops::Prod;
    use crate::symmetric::all_gather::all_gather;
    use crate::symmetric::all_reduce::{one_shot_ll_all_reduce, two_shot_all_reduce};
    use crate::symmetric::reduce_scatter::reduce_scatter;
    use crate::symmetric::resolve_launch;

    /// One exported kernel: `$body` is a kernel function taking (batch, grid).
    macro_rules! export_kernel {
        ($name:expr, $body:expr) => {
            const _: () = {
                /// # Safety
                /// Launched by the host shim with a work table of contexts and offsets it
                /// validated.
                #[unsafe(export_name = $name)]
                unsafe extern "ptx-kernel" fn kernel(
                    tasks: *const TaskArgs,
                    task_count: u32,
                    rank_count: u32,
                ) {
                    // SAFETY: the host validated the contexts and ranges before launching;
                    // the outcome is reported through each context's abort word (a refused
                    // launch included).
                    unsafe {
                        match resolve_launch(tasks, task_count, rank_count) {
                            Ok((batch, grid)) => {
                                $body(&batch, grid);
                            }
                            Err(_) => crate::symmetric::report_invalid_launch(
                                tasks, task_count, rank_count,
                            ),
                        }
                    }
                }
            };
        };
    }

    macro_rules! export_algorithms {
        ($t:ty, $tn:literal, $op:ty, $on:literal) => {
            export_kernel!(
                concat!("symm_one_shot_all_reduce_", $tn, "_", $on),
                one_shot_all_reduce::<$t, $op>
            );
            export_kernel!(
                concat!("symm_one_shot_ll_all_reduce_", $tn, "_", $on),
                one_shot_ll_all_reduce::<$t, $op>
            );
            export_kernel!(
                concat!("symm_two_shot_all_reduce_", $tn, "_", $on),
                two_shot_all_reduce::<$t, $op>
            );
            export_kernel!(
                concat!("symm_reduce_scatter_", $tn, "_", $on),
                reduce_scatter::<$t, $op>
            );
        };
    }

    macro_rules! export_types {
        ($(($t:ty, $tn:literal)),* $(,)?) => {$(
            export_algorithms!($t, $tn, Sum, "sum");
            export_algorithms!($t, $tn, Prod, "prod");
            export_algorithms!($t, $tn, Max, "max");
            export_algorithms!($t, $tn, Min, "min");
            export_algorithms!($t, $tn, Avg, "avg");
        )*};
    }

    export_types!(
        (i8, "i8"),
        (u8, "u8"),
        (i32, "i32"),
        (u32, "u32"),
        (i64, "i64"),
        (u64, "u64"),
        (F16, "f16"),
        (f32, "f32"),
        (f64, "f64"),
        (Bf16, "bf16"),
        (F8E4M3, "f8e4m3"),
        (F8E5M2, "f8e5m2"),
    );
    export_kernel!("symm_all_gather", all_gather);
    export_kernel!(
        "symm_ll_all_gather",
        crate::symmetric::all_gather::ll_all_gather
    );

    /// One exported work-stealing benchmark kernel; parameters: `(u32 tiles, u32 imbalance,
    /// u32 work_iterations, u32 prologue_iterations, u64 data, u64 tile_counts,
    /// u64 block_stats, u64 source_state)`.
    macro_rules! export_benchmark {
        ($name:expr, $body:expr) => {
            const _: () = {
                /// # Safety
                /// Launched by the host with buffers sized for `tiles` tiles.
                #[unsafe(export_name = $name)]
                #[allow(clippy::too_many_arguments)]
                unsafe extern "ptx-kernel" fn kernel(
                    tiles: u32,
                    imbalance: u32,
                    work_iterations: u32,
                    prologue_iterations: u32,
                    data: u64,
                    tile_counts: u64,
                    block_stats: u64,
                    source_state: u64,
                ) {
                    let workload = crate::scheduler::workload::Workload {
                        tiles,
                        imbalance,
                        work_iterations,
                        prologue_iterations,
                        data,
                        tile_counts,
                        block_stats,
                    };
                    // SAFETY: the host sized the buffers for this launch.
                    unsafe { $body(&workload, source_state) }
                }
            };
        };
    }

    export_benchmark!(
        "symm_clc_fixed_grid",
        crate::scheduler::workload::fixed_grid_kernel
    );
    macro_rules! export_software {
        ($n:expr, $p:ty) => {
            export_benchmark!(
                concat!("symm_clc_software_", $n),
                crate::scheduler::workload::stealing_software::<$p>
            );
        };
    }
    crate::for_each_benchmark_policy!(export_software);

    #[cfg(target_feature = "sm_100a")]
    mod hardware {
        macro_rules! export_hardware {
            ($n:expr, $p:ty) => {
                export_benchmark!(concat!("symm_clc_hardware_", $n), |w, _state| {
                    crate::scheduler::workload::stealing_hardware::<$p>(w)
                });
            };
        }
        crate::for_each_benchmark_policy!(export_hardware);
        export_benchmark!("symm_clc_hardware_clustered_greedy", |w, _state| {
            crate::scheduler::workload::stealing_hardware_clustered::<
                crate::scheduler::policy::Greedy,
            >(w)
        });
    }

    /// Device function for Triton: see [`symm_all_reduce_device`].
    ///
    /// # Safety
    /// As for [`symm_all_reduce_device`].
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn symm_all_reduce(
        ctx: i64,
        local_ptr: i64,
        byte_offset: i64,
        num_elements: i64,
        reduce_op: i32,
        dtype: i32,
    ) -> i32 {
        // SAFETY: forwarded contract.
        unsafe {
            symm_all_reduce_device(ctx, local_ptr, byte_offset, num_elements, reduce_op, dtype)
        }
    }
}
