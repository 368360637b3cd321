//! What the PTX and the bitcode export: one kernel entry point (`extern "ptx-kernel"`) per
//! (algorithm, data type, operator), named as [`crate::symmetric::dispatch::kernel_name`]
//! says. Every body is a target-independent function, so the host backend and the tests run
//! exactly what the GPU runs. The device functions that Triton kernels link against are in
//! [`crate::triton`].
//!
//! Every kernel takes [`crate::symmetric::dispatch::KERNEL_PARAMETERS`]: a work table of task
//! descriptors (`task_count` per rank served by the launch; the grid is split evenly among the
//! ranks), the number of tasks and the number of ranks.

/// The kernel entry points, in symm's own PTX build only (the `kernels` feature): not in the
/// Triton-linkable library (the `triton-library` feature), which carries only the device
/// functions of [`crate::triton`], nor in the PTX of a user's kernel crate.
#[cfg(all(
    target_arch = "nvptx64",
    feature = "kernels",
    not(feature = "triton-library")
))]
mod ptx {
    use crate::numeric::element::{Bf16, F8E4M3, F8E5M2, F16};
    use crate::numeric::ops::{Avg, Max, Min, Prod, Sum};
    use crate::symmetric::all_gather::all_gather;
    use crate::symmetric::all_reduce::{
        one_shot_all_reduce, one_shot_ll_all_reduce, two_shot_all_reduce,
    };
    use crate::symmetric::pat::{pat_all_gather, pat_reduce_scatter};
    use crate::symmetric::reduce_scatter::reduce_scatter;
    use crate::symmetric::{KernelStatus, TaskArgs, resolve_launch};

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
                                // A body may refuse the launch too (LL lines that do not
                                // fit, a PAT work table of several tasks): reported alike,
                                // as the host backend's executor does.
                                if $body(&batch, grid) == KernelStatus::InvalidLaunch {
                                    crate::symmetric::report_invalid_launch(
                                        tasks, task_count, rank_count,
                                    );
                                }
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
            export_kernel!(
                concat!("symm_pat_reduce_scatter_", $tn, "_", $on),
                pat_reduce_scatter::<$t, $op>
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
    export_kernel!("symm_broadcast", crate::symmetric::broadcast::broadcast);
    export_kernel!("symm_all_to_all", crate::symmetric::segments::all_to_all);
    export_kernel!("symm_gather", crate::symmetric::segments::gather);
    export_kernel!("symm_scatter", crate::symmetric::segments::scatter);
    export_kernel!(
        "symm_all_to_all_v",
        crate::symmetric::all_to_all_v::all_to_all_v
    );
    export_kernel!(
        "symm_send_receive",
        crate::symmetric::point_to_point::send_receive
    );
    export_kernel!("symm_pat_all_gather", pat_all_gather);
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
}
