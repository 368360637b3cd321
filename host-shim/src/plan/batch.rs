//! Plans for batches: several collectives of one (collective, operator, data type) fused into
//! one launch (see `symm_device::symmetric::batch`). Pure, like the rest of [`super`].
//!
//! The predicted time of algorithm `a` on `b` blocks for a batch of `n` tasks extends the
//! single-call model ([`Model::time_us`]):
//!
//! ```text
//! time(a, b) = latency(a)
//!            + per_task(a) · (⌈n / b⌉ − 1)                   walking the work table
//!            + bus_bytes(a, total) / min(b' · per_block(a), peak),   b' = min(b, cells(a))
//! ```
//!
//! * the *total* payload sets the bytes moved, as for one call of that size;
//! * the *task count* adds the cost of a block stepping from one task to the next (reading its
//!   descriptor and windows: every block sees about `n / b` tasks, since cells are dealt out
//!   evenly whatever the tasks' sizes);
//! * blocks beyond the batch's cells (1 KiB, or one LL line each) get no work, so they add no
//!   bandwidth;
//! * the *largest task* decides whether the LL kernels may run: every task must fit the LL
//!   buffers, and so must the whole batch, since the tasks share the batch window's lines.
//!   (NCCL never uses LL for a fused batch; here a batch of small tasks is one LL call.) With
//!   cells dealt out evenly, a large task is split among blocks like any other work, so it
//!   does not otherwise bound the time (NCCL's picker uses it because its blocks split per
//!   task).
//!
//! Per algorithm the fewest blocks within 2.5 % of its best time are taken, then the fastest
//! algorithm wins, as for one call; a batch of one task is planned by [`super::plan`] alone,
//! so unfused calls keep their plans. Candidates come from [`Collective::algorithms`], less the
//! PAT kernels (they run one task per launch; a batch of one may still be planned to PAT): an
//! algorithm added there is considered here once the device crate gives its cells
//! (`cell_elements`).

use super::{
    Collective, DeviceModel, GPU_MODEL, HOST_FAST_MODEL, HOST_MODEL, KernelId, Limits, Model, Plan,
    block_range, candidates, fewest_blocks, is_pat,
};
use crate::error::{Error, Result};
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::batch::task_cells;
use symm_device::sync::signal_pad::{LL_LINES, LL_MAX_BYTES};
use symm_device::{DataType, RedOp};

/// Cost of one more task per block of a fused launch, in µs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchModel {
    /// A block stepping to its next task: loading the descriptor and the task's windows (a few
    /// dependent loads from L2 on a GPU).
    pub per_task_us: f64,
}

/// GPU: a few dependent L2 loads (~0.5 µs each on Hopper) per task, shared by warps.
pub const GPU_BATCH_MODEL: BatchModel = BatchModel { per_task_us: 0.15 };

/// Host backend: a task step is a handful of function calls on an emulated block.
pub const HOST_BATCH_MODEL: BatchModel = BatchModel { per_task_us: 5.0 };

/// What a batch is: the tasks' counts (elements, as [`super::plan`] takes them: all-reduce
/// total, all-gather and reduce-scatter per rank) and what they share.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRequest<'a> {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Operator (ignored by all-gather).
    pub op: RedOp,
    /// Each task's count, in call order.
    pub counts: &'a [u64],
    /// Ranks of the communicator.
    pub nranks: u32,
}

/// Sizes of a batch, in payload bytes per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSize {
    /// Tasks.
    pub tasks: u64,
    /// Every task's payload together.
    pub total_bytes: u64,
    /// The largest task's payload.
    pub largest_bytes: u64,
}

impl BatchRequest<'_> {
    /// Task count, total and largest payload.
    pub fn size(&self) -> BatchSize {
        let element = self.dtype.size_bytes() as u64;
        let bytes = self.counts.iter().map(|c| c.saturating_mul(element));
        BatchSize {
            tasks: self.counts.len() as u64,
            total_bytes: bytes.clone().fold(0u64, u64::saturating_add),
            largest_bytes: bytes.max().unwrap_or(0),
        }
    }

    /// Cells of the batch for `algorithm` (the unit blocks are dealt).
    fn cells(&self, algorithm: Algorithm) -> u64 {
        let element = self.dtype.size_bytes() as u64;
        self.counts
            .iter()
            .map(|&count| {
                // All-gathers count bytes.
                let units = if algorithm.is_data_type_agnostic() {
                    count.saturating_mul(element)
                } else {
                    count
                };
                task_cells(algorithm, element, units)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// `true` when the whole batch fits the LL buffers of one window: every task, and all of
    /// them together (they share the batch window's lines).
    pub fn fits_ll(&self) -> bool {
        let size = self.size();
        let lines: u64 = self
            .counts
            .iter()
            .map(|c| c.saturating_mul(self.dtype.size_bytes() as u64).div_ceil(8))
            .fold(0u64, u64::saturating_add);
        size.largest_bytes <= LL_MAX_BYTES as u64 && lines <= LL_LINES as u64
    }
}

/// Predicted µs of `algorithm` on `blocks` blocks for `request`, with at most `ranks_per_gpu`
/// of its ranks on one GPU (see the module docs).
pub fn batch_time_us(
    model: &Model,
    batch_model: &BatchModel,
    request: &BatchRequest<'_>,
    algorithm: Algorithm,
    ranks_per_gpu: u32,
    blocks: u32,
) -> f64 {
    let size = request.size();
    let mut cells = request.cells(algorithm).max(1);
    if algorithm == Algorithm::TwoShotAllReduce {
        // Ranks split the cells before blocks do.
        cells = cells.div_ceil(request.nranks.max(1) as u64);
    }
    let working = (blocks as u64).min(cells).max(1) as u32;
    let steps = size.tasks.max(1).div_ceil(blocks.max(1) as u64) - 1;
    model.time_us(
        algorithm,
        size.total_bytes,
        (request.nranks, ranks_per_gpu),
        working,
    ) + batch_model.per_task_us * steps as f64
}

/// Choose the kernel and launch shape of a fused launch of `request` (two or more tasks; one
/// task gets [`super::plan`]'s answer).
pub fn plan_batch(
    request: &BatchRequest<'_>,
    device: impl Into<DeviceModel>,
    limits: Limits,
) -> Result<Plan> {
    let BatchRequest {
        collective,
        dtype,
        op,
        counts,
        nranks,
    } = *request;
    if counts.len() <= 1 {
        return super::plan(
            collective,
            dtype,
            op,
            counts.first().copied().unwrap_or(0),
            nranks,
            device,
            limits,
        );
    }
    let (model, batch_model) = match device.into() {
        DeviceModel::Gpu => (GPU_MODEL, GPU_BATCH_MODEL),
        DeviceModel::Host => (HOST_MODEL, HOST_BATCH_MODEL),
        DeviceModel::HostFast => (HOST_FAST_MODEL, HOST_BATCH_MODEL),
    };
    let blocks = block_range(&limits);
    let fits_ll = request.fits_ll();
    let mut candidates = candidates(collective, limits.forced, fits_ll, || {
        format!(
            "a fused batch of {} all-reduces ({} bytes) exceeds",
            counts.len(),
            request.size().total_bytes
        )
    })?;
    // The PAT kernels run one task per launch: a batch takes the direct kernels (fusion keeps
    // calls forced to PAT apart, so a forced PAT never reaches here).
    candidates.retain(|a| !is_pat(*a));
    let (algorithm, grid, predicted_us) = candidates
        .into_iter()
        .map(|a| {
            let (blocks, time) = fewest_blocks(blocks.clone(), |b| {
                batch_time_us(&model, &batch_model, request, a, limits.ranks_per_gpu, b)
            });
            (a, blocks, time)
        })
        .min_by(|x, y| x.2.total_cmp(&y.2))
        .ok_or_else(|| Error::internal(format!("no algorithm for {}", collective.name())))?;
    Ok(Plan {
        kernel: KernelId {
            algorithm,
            dtype,
            op,
        },
        grid,
        block: model.threads,
        predicted_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: Limits = Limits {
        max_blocks: 64,
        min_blocks: 1,
        ranks_per_gpu: 1,
        forced: None,
    };

    fn request(collective: Collective, counts: &[u64], nranks: u32) -> BatchRequest<'_> {
        BatchRequest {
            collective,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            counts,
            nranks,
        }
    }

    #[test]
    fn a_batch_of_one_is_the_single_call_plan() {
        for count in [0u64, 10, 5000, 1 << 22] {
            let counts = [count];
            let batch = plan_batch(
                &request(Collective::AllReduce, &counts, 8),
                DeviceModel::Gpu,
                OPEN,
            )
            .unwrap();
            let single = super::super::plan(
                Collective::AllReduce,
                DataType::Float32,
                RedOp::Sum,
                count,
                8,
                DeviceModel::Gpu,
                OPEN,
            )
            .unwrap();
            assert_eq!(batch, single);
        }
    }

    #[test]
    fn small_batches_use_ll_when_every_task_and_the_total_fit() {
        // 16 × 1 KiB = 16 KiB: exactly the LL lines; one more task does not fit.
        assert!(request(Collective::AllReduce, &[256u64; 16], 8).fits_ll());
        assert!(!request(Collective::AllReduce, &[256u64; 17], 8).fits_ll());
        // The GPU planner picks LL by itself for whatever fits (measured on an H100 to beat
        // one-shot up to its 16 KiB): 8 × 32 B and 16 × 1 KiB on 8 ranks, not 17 × 1 KiB.
        for counts in [&[8u64; 8][..], &[256u64; 16]] {
            let p = plan_batch(
                &request(Collective::AllReduce, counts, 8),
                DeviceModel::Gpu,
                OPEN,
            )
            .unwrap();
            assert_eq!(p.kernel.algorithm, Algorithm::OneShotLlAllReduce);
        }
        let p = plan_batch(
            &request(Collective::AllReduce, &[256u64; 17], 8),
            DeviceModel::Gpu,
            OPEN,
        )
        .unwrap();
        assert_ne!(p.kernel.algorithm, Algorithm::OneShotLlAllReduce);
        let counts = [256u64; 17];
        let forced = Limits {
            max_blocks: 64,
            min_blocks: 1,
            ranks_per_gpu: 1,
            forced: Some(Algorithm::OneShotLlAllReduce),
        };
        let e = plan_batch(
            &request(Collective::AllReduce, &counts, 8),
            DeviceModel::Gpu,
            forced,
        )
        .unwrap_err();
        assert!(e.message.contains("low-latency"), "{}", e.message);
        // All-gather: LL lines hold bytes per rank (192 B per rank, 768 B gathered).
        let counts = [16u64, 0, 32];
        let p = plan_batch(
            &request(Collective::AllGather, &counts, 4),
            DeviceModel::Gpu,
            OPEN,
        )
        .unwrap();
        assert_eq!(p.kernel.algorithm, Algorithm::LlAllGather);
    }

    #[test]
    fn fused_batch_meets_the_issue_target_in_the_model() {
        // 64 fused 1 KiB float all-reduces on 8 ranks: within 2x of one 1 KiB all-reduce, and
        // at least 10x faster than 64 separate calls.
        let one = super::super::plan(
            Collective::AllReduce,
            DataType::Float32,
            RedOp::Sum,
            256,
            8,
            DeviceModel::Gpu,
            OPEN,
        )
        .unwrap();
        let counts = [256u64; 64];
        let fused = plan_batch(
            &request(Collective::AllReduce, &counts, 8),
            DeviceModel::Gpu,
            OPEN,
        )
        .unwrap();
        assert!(
            fused.predicted_us <= 2.0 * one.predicted_us,
            "{fused:?} vs {one:?}"
        );
        assert!(64.0 * one.predicted_us >= 10.0 * fused.predicted_us);
    }

    #[test]
    fn more_tasks_cost_more_and_blocks_stay_within_limits() {
        let mut previous = 0.0;
        for tasks in [2usize, 8, 64, 256] {
            let counts = vec![4096u64; tasks];
            for collective in [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ] {
                let p = plan_batch(
                    &request(collective, &counts, 4),
                    DeviceModel::Gpu,
                    Limits {
                        max_blocks: 16,
                        min_blocks: 1,
                        ranks_per_gpu: 1,
                        forced: None,
                    },
                )
                .unwrap();
                assert!((1..=16).contains(&p.grid));
                assert!(collective.algorithms().contains(&p.kernel.algorithm));
                if collective == Collective::AllReduce {
                    assert!(p.predicted_us > previous);
                    previous = p.predicted_us;
                }
            }
        }
        // Host plans: the host model's threads, at most the limit's blocks.
        let counts = [3u64, 0, 70_000];
        let p = plan_batch(
            &request(Collective::ReduceScatter, &counts, 3),
            DeviceModel::Host,
            Limits {
                max_blocks: 2,
                min_blocks: 1,
                ranks_per_gpu: 1,
                forced: None,
            },
        )
        .unwrap();
        assert!(p.grid <= 2 && p.block == HOST_MODEL.threads);
    }

    #[test]
    fn one_large_and_many_small_tasks_use_blocks_like_one_large_call() {
        let mut counts = vec![64u64; 63];
        counts.push(1 << 22);
        let p = plan_batch(
            &request(Collective::AllReduce, &counts, 8),
            DeviceModel::Gpu,
            OPEN,
        )
        .unwrap();
        assert_eq!(p.kernel.algorithm, Algorithm::TwoShotAllReduce);
        assert!(p.grid >= 4, "{p:?}");
    }

    /// At 64 ranks a single small all-gather or reduce-scatter is planned to PAT, but a batch
    /// of them takes a direct kernel: the PAT kernels run one task per launch.
    #[test]
    fn batches_never_take_the_pat_kernels() {
        for backend in [DeviceModel::Gpu, DeviceModel::Host] {
            for collective in [Collective::AllGather, Collective::ReduceScatter] {
                let single = super::super::plan(
                    collective,
                    DataType::Float32,
                    RedOp::Sum,
                    256,
                    64,
                    backend,
                    OPEN,
                )
                .unwrap();
                assert!(is_pat(single.kernel.algorithm), "{single:?}");
                for tasks in [2usize, 5, 64] {
                    let counts = vec![256u64; tasks];
                    let p = plan_batch(&request(collective, &counts, 64), backend, OPEN).unwrap();
                    assert!(!is_pat(p.kernel.algorithm), "{tasks} tasks: {p:?}");
                }
            }
        }
    }
}
