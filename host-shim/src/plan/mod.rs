//! Plans: pure functions from a validated request to a kernel and a launch shape, by a cost
//! model. No memory is touched here, so every decision is testable on the host.
//!
//! The model follows NCCL's symmetric-kernel picker: the predicted time of an algorithm on
//! `b` blocks is `latency + bytes / min(b · per-block bandwidth, peak bandwidth)`, where
//! `bytes` is what one rank moves. For each algorithm the fewest blocks within 2.5 % of its
//! best time are taken; then the fastest algorithm wins.
//!
//! All-gather and reduce-scatter also have PAT kernels (`ceil(log2 n)` steps, one peer per
//! step). There the model adds what depends on the rank count: the direct kernels pay
//! `per_peer_us` for every rank they touch (flags and one stream of accesses per peer), PAT pays
//! `pat_step_us` per step (a dependent flag round trip) and reaches `pat_bandwidth_share` of
//! the bandwidth (each step drains before the next). So PAT wins at large rank counts for small
//! and medium sizes, and the direct kernels keep small rank counts and large sizes.

pub mod batch;
pub mod peer_staging;
pub mod scale_model;
pub mod staging;

pub use crate::config::parse_forced_algorithm;
use crate::error::{Error, Result};
use std::ops::RangeInclusive;
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::dispatch::kernel_name;
use symm_device::sync::signal_pad::{LL_MAX_BYTES, MAX_BLOCKS};
use symm_device::{DataType, RedOp};

/// The kind of device a plan is for: it picks the cost model. Executors name theirs
/// (`From<BackendKind>` in [`crate::backend`]), so the planner needs nothing of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceModel {
    /// A GPU (the cuda executor, and the model that checks its launches).
    Gpu,
    /// CPU threads (the host executor, `SYMM_HOST_MODE=testing`: blocks of
    /// [`HOST_MODEL`]`.threads` threads).
    Host,
    /// One CPU thread per rank (the host executor's default mode, `SYMM_HOST_MODE=fast`).
    HostFast,
}

/// A collective as the C ABI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// `symmAllReduce`.
    AllReduce,
    /// `symmReduce`.
    Reduce,
    /// `symmAllGather`.
    AllGather,
    /// `symmReduceScatter`.
    ReduceScatter,
    /// `symmBroadcast`.
    Broadcast,
    /// `symmAlltoAll`.
    AllToAll,
    /// `symmGather`.
    Gather,
    /// `symmScatter`.
    Scatter,
    /// `symmAlltoAllvDevice`.
    AllToAllV,
}

impl Collective {
    /// Every collective.
    pub(crate) const ALL: [Collective; 9] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllToAllV,
    ];

    /// The algorithms that implement it.
    pub fn algorithms(self) -> &'static [Algorithm] {
        match self {
            Collective::AllReduce => &[
                Algorithm::OneShotLlAllReduce,
                Algorithm::OneShotAllReduce,
                Algorithm::TwoShotAllReduce,
            ],
            // The one-shot kernel with its reduce flag: only the root reduces (see
            // `symm_device::symmetric::FLAG_REDUCE_TO_ROOT`).
            Collective::Reduce => &[Algorithm::OneShotAllReduce],
            Collective::AllGather => &[
                Algorithm::LlAllGather,
                Algorithm::AllGather,
                Algorithm::PatAllGather,
            ],
            Collective::ReduceScatter => &[Algorithm::ReduceScatter, Algorithm::PatReduceScatter],
            Collective::Broadcast => &[Algorithm::Broadcast],
            Collective::AllToAll => &[Algorithm::AllToAll],
            Collective::Gather => &[Algorithm::Gather],
            Collective::Scatter => &[Algorithm::Scatter],
            Collective::AllToAllV => &[Algorithm::AllToAllV],
        }
    }

    /// The algorithm a `SYMM_ALGO` value forces for this collective, or `None` when the value
    /// is one of another collective's (it is then ignored, and the model picks). `pat`
    /// ([`parse_forced_algorithm`] returns [`Algorithm::PatAllGather`] for it) forces
    /// each collective's PAT kernel; the all-reduce values force all-reduce only. The reduce,
    /// broadcast, all-to-all, gather and scatter have one kernel each and ignore every value.
    pub fn resolve_forced(self, forced: Algorithm) -> Option<Algorithm> {
        let pat = is_pat(forced);
        match self {
            Collective::AllReduce if !pat => Some(forced),
            Collective::AllGather if pat => Some(Algorithm::PatAllGather),
            Collective::ReduceScatter if pat => Some(Algorithm::PatReduceScatter),
            _ => None,
        }
    }

    /// Lower-case name, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::AllToAll => "all_to_all",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllToAllV => "all_to_all_v",
        }
    }
}

/// A kernel of the device crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId {
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Element type (ignored by the all-gathers and the broadcast, which move bytes).
    pub dtype: DataType,
    /// Operator (ignored by the all-gathers and the broadcast).
    pub op: RedOp,
}

impl KernelId {
    /// The kernel's name in the PTX.
    pub fn ptx_name(self) -> String {
        kernel_name(self.algorithm, self.dtype, self.op)
            .as_str()
            .to_string()
    }
}

/// Kernel and launch shape of one rank's part of a collective.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// The kernel.
    pub kernel: KernelId,
    /// Blocks per rank.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// The model's predicted time, in microseconds.
    pub predicted_us: f64,
}

/// Constants of the cost model for one backend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    /// Launch-to-completion latency of each algorithm, in µs (LL one-shot, one-shot, two-shot,
    /// others).
    pub latency_us: [f64; 4],
    /// Bandwidth one block sustains, GB/s (all-reduce kernels, others).
    pub per_block_gbps: [f64; 2],
    /// Bandwidth ceiling of one rank whose peers are on other GPUs (its links), GB/s.
    pub link_gbps: f64,
    /// Bandwidth that the ranks on one GPU share, GB/s: a rank whose peers are all on its GPU
    /// gets its share of it (see [`Model::rank_peak_gbps`]). `None`: the ranks of one device
    /// share nothing the model knows, and every rank gets [`Model::link_gbps`].
    pub gpu_gbps: Option<f64>,
    /// Threads per block.
    pub threads: u32,
    /// Cost of each rank a direct all-gather or reduce-scatter touches, µs.
    pub per_peer_us: f64,
    /// Cost of each PAT step (a dependent flag round trip), µs.
    pub pat_step_us: f64,
    /// Share of the bandwidth PAT reaches.
    pub pat_bandwidth_share: f64,
}

/// Hopper values, fitted to the GPU runs (an H200 and an H100, 2, 4 and 8 virtual ranks on one
/// GPU, CUDA-graph replays). bench/RESULTS.md, "How the GPU model's constants were set", gives
/// each constant's measurement and what the model leaves out (one-shot and two-shot between 16
/// KiB and 2 MiB, in-place one-shot ranks, PAT's estimated constants).
pub const GPU_MODEL: Model = Model {
    latency_us: [7.5, 11.5, 12.5, 12.0],
    per_block_gbps: [30.0, 44.0],
    link_gbps: 320.0,
    gpu_gbps: Some(2650.0),
    threads: 512,
    per_peer_us: 0.25,
    pat_step_us: 1.25,
    pat_bandwidth_share: 0.8,
};

/// The host backend: OS threads and a microsecond-scale barrier (estimates).
pub const HOST_MODEL: Model = Model {
    latency_us: [300.0, 400.0, 600.0, 600.0],
    per_block_gbps: [1.0, 1.0],
    link_gbps: 2.0,
    gpu_gbps: None,
    threads: 8,
    per_peer_us: 16.0,
    pat_step_us: 80.0,
    pat_bandwidth_share: 0.8,
};

/// The host backend's fast mode: one thread per block (and one block per rank, which the
/// clique's block bound gives).
pub const HOST_FAST_MODEL: Model = Model {
    threads: 1,
    ..HOST_MODEL
};

/// Predicted time, in µs, of a staged chunk's `copies` copies of `bytes` in all (into and out
/// of the staging window, `crate::staging`), added to the chunk's plan: a copy's issue cost and
/// one pass over the bytes at the device's copy rate (GPU: a device-to-device copy reads and
/// writes HBM, about half its bandwidth; host: one thread's `memcpy`; estimates).
pub fn staged_copy_us(device: DeviceModel, copies: usize, bytes: u64) -> f64 {
    let (per_copy_us, gbps) = match device {
        DeviceModel::Gpu => (2.0, 1500.0),
        DeviceModel::Host | DeviceModel::HostFast => (0.2, 5.0),
    };
    copies as f64 * per_copy_us + bytes as f64 / (gbps * 1e3)
}

/// What constrains a plan besides the request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Most blocks one rank may use (co-residency of every rank sharing the GPU, and
    /// `SYMM_MAX_BLOCKS`).
    pub max_blocks: u32,
    /// Fewest blocks a plan gives a rank (`SYMM_MIN_BLOCKS`; 1 by default), within
    /// `max_blocks`.
    pub min_blocks: u32,
    /// Most ranks of the communicator on one GPU (1: a GPU per rank). The same on every rank,
    /// as the plan must be (see `Model::rank_peak_gbps`).
    pub ranks_per_gpu: u32,
    /// An algorithm forced by `SYMM_ALGO`: an all-reduce algorithm, or PAT for all-gather and
    /// reduce-scatter (see [`Collective::resolve_forced`]).
    pub forced: Option<Algorithm>,
}

impl Model {
    /// Bytes one rank moves.
    fn bytes(algorithm: Algorithm, payload_bytes: f64, nranks: f64) -> f64 {
        match algorithm {
            // Writes its data into every rank and reads every rank's, as 16-byte lines per 8
            // bytes (NCCL models LL as 9 bytes moved per byte and rank).
            Algorithm::OneShotLlAllReduce => 9.0 * nranks * payload_bytes / 2.0,
            // Reads every rank's copy.
            Algorithm::OneShotAllReduce => nranks * payload_bytes,
            // Loads its shard from every rank, stores it to every rank.
            Algorithm::TwoShotAllReduce => 2.0 * payload_bytes,
            // Loads its segment from every rank (payload = per-rank count).
            Algorithm::ReduceScatter => nranks * payload_bytes,
            // Stores its segment into every rank (payload = per-rank bytes).
            Algorithm::AllGather => nranks * payload_bytes,
            // The same as 16-byte lines per 8 bytes, written and read.
            Algorithm::LlAllGather => 9.0 * nranks * payload_bytes / 2.0,
            // Stores every other rank's segment once, and copies its own.
            Algorithm::PatAllGather => nranks * payload_bytes,
            // Reads its own segments and stores a partial of every other rank's into a peer's
            // inbox (read back there locally; accumulators wider than the elements and the
            // local reads are not modelled).
            Algorithm::PatReduceScatter => nranks * payload_bytes,
            // The root stores the payload into every rank (its own receive buffer too, out of
            // place): the root's traffic, which bounds the call.
            Algorithm::Broadcast => nranks * payload_bytes,
            // Stores a segment into every rank (payload = bytes per peer).
            Algorithm::AllToAll => nranks * payload_bytes,
            // The root loads every rank's segment, or stores one into every rank (payload =
            // bytes per rank): the root's traffic.
            Algorithm::Gather | Algorithm::Scatter => nranks * payload_bytes,
            // Stores at most its whole send buffer (payload = the bound, in bytes).
            Algorithm::AllToAllV => payload_bytes,
            // Loads the message from its sender once.
            Algorithm::SendReceive => payload_bytes,
        }
    }

    /// Latency that depends on the rank count: per peer for the direct all-gather,
    /// reduce-scatter and broadcast kernels, per step for PAT, none for all-reduce (whose
    /// kernels all touch every peer).
    fn rank_latency_us(&self, algorithm: Algorithm, nranks: u32) -> f64 {
        match algorithm {
            Algorithm::AllGather
            | Algorithm::LlAllGather
            | Algorithm::ReduceScatter
            | Algorithm::Broadcast
            | Algorithm::AllToAll
            | Algorithm::AllToAllV
            | Algorithm::Gather
            | Algorithm::Scatter => self.per_peer_us * nranks as f64,
            Algorithm::PatAllGather | Algorithm::PatReduceScatter => {
                self.pat_step_us * symm_device::symmetric::pat::steps(nranks) as f64
            }
            _ => 0.0,
        }
    }

    /// Bandwidth ceiling of one rank of `nranks` with at most `ranks_per_gpu` of them on one
    /// GPU: its share of the GPU's bandwidth, and no more than its links carry when some peers
    /// are on other GPUs.
    pub fn rank_peak_gbps(&self, nranks: u32, ranks_per_gpu: u32) -> f64 {
        let Some(gpu) = self.gpu_gbps else {
            return self.link_gbps;
        };
        let ranks_per_gpu = ranks_per_gpu.clamp(1, nranks.max(1));
        let share = gpu / ranks_per_gpu as f64;
        if ranks_per_gpu >= nranks {
            share
        } else {
            share.min(self.link_gbps)
        }
    }

    /// Predicted µs of `algorithm` on `blocks` blocks, for `nranks` ranks with at most
    /// `ranks_per_gpu` of them on one GPU.
    pub fn time_us(
        &self,
        algorithm: Algorithm,
        payload_bytes: u64,
        (nranks, ranks_per_gpu): (u32, u32),
        blocks: u32,
    ) -> f64 {
        let (latency, per_block) = match algorithm {
            Algorithm::OneShotLlAllReduce => (self.latency_us[0], self.per_block_gbps[0]),
            Algorithm::LlAllGather => (self.latency_us[0], self.per_block_gbps[1]),
            Algorithm::PatAllGather | Algorithm::PatReduceScatter => (
                self.latency_us[3],
                self.per_block_gbps[1] * self.pat_bandwidth_share,
            ),
            Algorithm::OneShotAllReduce => (self.latency_us[1], self.per_block_gbps[0]),
            Algorithm::TwoShotAllReduce => (self.latency_us[2], self.per_block_gbps[0]),
            _ => (self.latency_us[3], self.per_block_gbps[1]),
        };
        let rank_peak = self.rank_peak_gbps(nranks, ranks_per_gpu);
        let peak = if is_pat(algorithm) {
            rank_peak * self.pat_bandwidth_share
        } else {
            rank_peak
        };
        let bandwidth_bytes_per_us = (blocks as f64 * per_block).min(peak) * 1e3;
        latency
            + self.rank_latency_us(algorithm, nranks)
            + Self::bytes(algorithm, payload_bytes as f64, nranks as f64) / bandwidth_bytes_per_us
    }

    /// Fewest blocks of `blocks` within 2.5 % of the best time for `algorithm`, and that time
    /// (`ranks`: the rank count and the most ranks on one GPU, as [`Model::time_us`] takes
    /// them).
    pub fn best_blocks(
        &self,
        algorithm: Algorithm,
        payload: u64,
        ranks: (u32, u32),
        blocks: RangeInclusive<u32>,
    ) -> (u32, f64) {
        fewest_blocks(blocks, |b| self.time_us(algorithm, payload, ranks, b))
    }
}

/// The fewest blocks in `blocks` (at least 1; an empty range is read as its start) whose
/// predicted `time_us` is within 2.5 % of the best, and that time.
pub(crate) fn fewest_blocks(
    blocks: RangeInclusive<u32>,
    time_us: impl Fn(u32) -> f64,
) -> (u32, f64) {
    let first = (*blocks.start()).max(1);
    let last = (*blocks.end()).max(first);
    let times: Vec<f64> = (first..=last).map(time_us).collect();
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let index = times.iter().position(|t| *t <= best * 1.025).unwrap_or(0);
    (first + index as u32, times[index])
}

/// The block counts a plan may choose among: `limits`' bounds within 1..=[`MAX_BLOCKS`], the
/// fewest lowered to the most where they cross.
pub(crate) fn block_range(limits: &Limits) -> RangeInclusive<u32> {
    let most = limits.max_blocks.clamp(1, MAX_BLOCKS as u32);
    limits.min_blocks.clamp(1, most)..=most
}

/// Choose the kernel and launch shape. `count` is in elements (all-reduce: total;
/// reduce-scatter: per rank; all-gather: per rank; broadcast: the root's; all-to-all: per
/// peer; gather and scatter: per rank).
pub fn plan(
    collective: Collective,
    dtype: DataType,
    op: RedOp,
    count: u64,
    nranks: u32,
    device: impl Into<DeviceModel>,
    limits: Limits,
) -> Result<Plan> {
    let model = match device.into() {
        DeviceModel::Gpu => GPU_MODEL,
        DeviceModel::Host => HOST_MODEL,
        DeviceModel::HostFast => HOST_FAST_MODEL,
    };
    let blocks = block_range(&limits);
    let payload = count.saturating_mul(dtype.size_bytes() as u64);
    let fits_ll = payload <= LL_MAX_BYTES as u64;
    let candidates = candidates(collective, limits.forced, fits_ll, || {
        format!("{payload} bytes exceed")
    })?;
    let (algorithm, grid, predicted_us) = candidates
        .into_iter()
        .map(|a| {
            let (blocks, time) =
                model.best_blocks(a, payload, (nranks, limits.ranks_per_gpu), blocks.clone());
            (a, blocks, time)
        })
        .min_by(|x, y| x.2.total_cmp(&y.2))
        .expect("every collective has an algorithm");
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

/// The launch shape of a rank's sends and receives (`crate::point_to_point`): a block per
/// unit of work (a peer's channel), within `limits`, at most as many as there are units.
pub fn plan_point_to_point(units: u32, device: impl Into<DeviceModel>, limits: Limits) -> Plan {
    let model = match device.into() {
        DeviceModel::Gpu => GPU_MODEL,
        DeviceModel::Host => HOST_MODEL,
        DeviceModel::HostFast => HOST_FAST_MODEL,
    };
    let blocks = block_range(&limits);
    Plan {
        kernel: KernelId {
            algorithm: Algorithm::SendReceive,
            dtype: DataType::Uint8,
            op: RedOp::Sum,
        },
        grid: units.clamp(*blocks.start(), *blocks.end()),
        block: model
            .threads
            .min(symm_device::symmetric::point_to_point::MAX_THREADS),
        predicted_us: model.latency_us[3],
    }
}

/// `true` for the low-latency algorithms (payloads up to `LL_MAX_BYTES` per rank).
pub(crate) fn is_low_latency(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::OneShotLlAllReduce | Algorithm::LlAllGather
    )
}

/// `true` for the PAT kernels, which run one task per launch (never a fused batch).
pub(crate) fn is_pat(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::PatAllGather | Algorithm::PatReduceScatter
    )
}

/// The algorithms a plan chooses among: the one `SYMM_ALGO` forces for `collective`
/// ([`Collective::resolve_forced`]), else every algorithm of `collective`, the low-latency ones
/// only when the payload `fits_ll`. A forced
/// low-latency algorithm that does not fit is an error; `too_large` words the payload
/// ("… bytes exceed").
pub(crate) fn candidates(
    collective: Collective,
    forced: Option<Algorithm>,
    fits_ll: bool,
    too_large: impl FnOnce() -> String,
) -> Result<Vec<Algorithm>> {
    let forced = forced.and_then(|forced| collective.resolve_forced(forced));
    let candidates: Vec<Algorithm> = match (collective, forced) {
        (Collective::AllReduce, Some(forced)) if is_low_latency(forced) && !fits_ll => {
            return Err(Error::invalid_argument(format!(
                "SYMM_ALGO=ll: {} the low-latency buffers ({LL_MAX_BYTES} bytes per rank)",
                too_large()
            )));
        }
        (_, Some(forced)) => vec![forced],
        _ => collective
            .algorithms()
            .iter()
            .copied()
            .filter(|a| !is_low_latency(*a) || fits_ll)
            .collect(),
    };
    if !candidates
        .iter()
        .all(|a| collective.algorithms().contains(a))
    {
        return Err(Error::invalid_argument(format!(
            "SYMM_ALGO names an algorithm that does not implement {}",
            collective.name()
        )));
    }
    Ok(candidates)
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

    fn pick(count: u64, nranks: u32) -> Plan {
        plan(
            Collective::AllReduce,
            DataType::Float32,
            RedOp::Sum,
            count,
            nranks,
            DeviceModel::Gpu,
            OPEN,
        )
        .unwrap()
    }

    /// The plan of a float sum of `bytes` on `nranks` ranks, all on one GPU of 132
    /// multiprocessors (the co-residency cap of each rank: 132 / `nranks`, at most 64).
    fn pick_on_one_gpu(bytes: u64, nranks: u32) -> Plan {
        plan(
            Collective::AllReduce,
            DataType::Float32,
            RedOp::Sum,
            bytes / 4,
            nranks,
            DeviceModel::Gpu,
            Limits {
                max_blocks: (132 / nranks).min(64),
                min_blocks: 1,
                ranks_per_gpu: nranks,
                forced: None,
            },
        )
        .unwrap()
    }

    #[test]
    fn small_all_reduce_is_ll_on_one_block_large_is_two_shot_on_many() {
        let small = pick(64, 8);
        assert_eq!(small.kernel.algorithm, Algorithm::OneShotLlAllReduce);
        assert!(small.grid <= 4);
        // Past the LL buffers, LL is never picked.
        let past_ll = (LL_MAX_BYTES / 4 + 1) as u64;
        assert_ne!(
            pick(past_ll, 2).kernel.algorithm,
            Algorithm::OneShotLlAllReduce
        );
        let large = pick(64 << 20, 8);
        assert_eq!(large.kernel.algorithm, Algorithm::TwoShotAllReduce);
        assert!(large.grid > 1);
        assert!(large.predicted_us > small.predicted_us);
    }

    /// What the H100 run measured (bench/RESULTS.md, "Second GPU run"), as the plans of 2, 4
    /// and 8 ranks on that one GPU.
    #[test]
    fn plans_follow_the_h100_measurements() {
        for nranks in [2, 4, 8] {
            // LL took 6.3–8.5 µs from 64 B to 16 KiB, where one-shot took 11–29 µs.
            let mut bytes = 8;
            while bytes <= LL_MAX_BYTES as u64 {
                for p in [pick_on_one_gpu(bytes, nranks), pick(bytes / 4, nranks)] {
                    assert_eq!(
                        p.kernel.algorithm,
                        Algorithm::OneShotLlAllReduce,
                        "{bytes} B on {nranks} ranks"
                    );
                }
                bytes *= 2;
            }
        }
        // 8 ranks: two-shot from 64 KiB; at 64 MiB its 11 blocks per rank reached 88 % of the
        // copy rate in 416.6 µs, so they keep 11.
        for shift in 16..=26 {
            let p = pick_on_one_gpu(1 << shift, 8);
            assert_eq!(
                p.kernel.algorithm,
                Algorithm::TwoShotAllReduce,
                "2^{shift} B"
            );
        }
        let eight = pick_on_one_gpu(64 << 20, 8);
        assert_eq!(eight.grid, 11);
        assert!(
            (eight.predicted_us / 416.6 - 1.0).abs() < 0.1,
            "{}",
            eight.predicted_us
        );
        // 2 and 4 ranks: 11 blocks per rank left the GPU's memory idle (29 % and 61 % of the
        // copy rate at 64 MiB); sharing the GPU among fewer ranks, they take more.
        let two = pick_on_one_gpu(64 << 20, 2);
        assert_eq!(two.kernel.algorithm, Algorithm::OneShotAllReduce);
        assert!(two.grid >= 40, "{}", two.grid);
        let four = pick_on_one_gpu(64 << 20, 4);
        assert_eq!(four.kernel.algorithm, Algorithm::TwoShotAllReduce);
        assert!(four.grid >= 20, "{}", four.grid);
        // A rank whose peers are on other GPUs keeps the link's 320 GB/s: 11 blocks.
        assert_eq!(pick((64 << 20) / 4, 8).grid, 11);
        assert_eq!(pick((64 << 20) / 4, 2).grid, 11);
    }

    #[test]
    fn block_bounds_hold_every_plan() {
        let bounded = |min_blocks, max_blocks, bytes: u64| {
            plan(
                Collective::AllReduce,
                DataType::Float32,
                RedOp::Sum,
                bytes / 4,
                8,
                DeviceModel::Gpu,
                Limits {
                    max_blocks,
                    min_blocks,
                    ranks_per_gpu: 8,
                    forced: None,
                },
            )
            .unwrap()
        };
        // Unbounded, 64 KiB takes 7 blocks and 64 MiB 11.
        assert_eq!(bounded(1, 16, 64 << 10).grid, 7);
        assert_eq!(bounded(1, 16, 64 << 20).grid, 11);
        for bytes in [8, 64 << 10, 64 << 20] {
            assert_eq!(bounded(12, 16, bytes).grid, 12, "{bytes} B, at least 12");
            assert_eq!(bounded(3, 3, bytes).grid, 3, "{bytes} B, exactly 3");
            // The fewest lowered to the most where they cross; 0 read as 1.
            assert_eq!(bounded(9, 4, bytes).grid, 4, "{bytes} B");
            assert!(bounded(0, 0, bytes).grid == 1, "{bytes} B");
        }
        // A fused batch is bounded alike.
        let counts = [4096u64; 8];
        let batch = crate::plan::batch::BatchRequest {
            collective: Collective::AllReduce,
            dtype: DataType::Float32,
            op: RedOp::Sum,
            counts: &counts,
            nranks: 8,
        };
        let limits = |min_blocks| Limits {
            max_blocks: 16,
            min_blocks,
            ranks_per_gpu: 8,
            forced: None,
        };
        let free = crate::plan::batch::plan_batch(&batch, DeviceModel::Gpu, limits(1)).unwrap();
        assert!(free.grid < 15, "{}", free.grid);
        let at_least =
            crate::plan::batch::plan_batch(&batch, DeviceModel::Gpu, limits(15)).unwrap();
        assert_eq!(at_least.grid, 15);
    }

    #[test]
    fn a_gpu_is_shared_by_its_ranks_and_links_bound_ranks_on_other_gpus() {
        let m = GPU_MODEL;
        let gpu = m.gpu_gbps.unwrap();
        assert_eq!(m.rank_peak_gbps(8, 8), gpu / 8.0);
        assert_eq!(m.rank_peak_gbps(2, 2), gpu / 2.0);
        assert_eq!(m.rank_peak_gbps(8, 1), m.link_gbps);
        // Some peers elsewhere: the smaller of the share and the links.
        assert_eq!(m.rank_peak_gbps(16, 8), m.link_gbps.min(gpu / 8.0));
        assert_eq!(m.rank_peak_gbps(16, 2), m.link_gbps);
        // More ranks per GPU than ranks is read as all on one GPU; 0 as 1.
        assert_eq!(m.rank_peak_gbps(2, 9), gpu / 2.0);
        assert_eq!(m.rank_peak_gbps(2, 0), m.link_gbps);
        // The host model shares nothing.
        assert_eq!(HOST_MODEL.rank_peak_gbps(8, 8), HOST_MODEL.link_gbps);
    }

    #[test]
    fn blocks_grow_with_size_and_respect_limits() {
        let mut previous = 0;
        for shift in 15..28 {
            let p = plan(
                Collective::AllGather,
                DataType::Uint8,
                RedOp::Sum,
                1 << shift,
                4,
                DeviceModel::Gpu,
                Limits {
                    max_blocks: 16,
                    min_blocks: 1,
                    ranks_per_gpu: 1,
                    forced: None,
                },
            )
            .unwrap();
            assert!(p.grid >= previous && p.grid <= 16);
            previous = p.grid;
        }
        assert_eq!(
            previous, 8,
            "320 GB/s peak / 44 GB/s per block: 8 blocks suffice"
        );
    }

    #[test]
    fn forced_algorithm_is_obeyed_and_checked() {
        let forced = Limits {
            max_blocks: 8,
            min_blocks: 1,
            ranks_per_gpu: 1,
            forced: Some(Algorithm::TwoShotAllReduce),
        };
        let p = plan(
            Collective::AllReduce,
            DataType::Float32,
            RedOp::Sum,
            4,
            2,
            DeviceModel::Gpu,
            forced,
        )
        .unwrap();
        assert_eq!(p.kernel.algorithm, Algorithm::TwoShotAllReduce);
        assert_eq!(
            parse_forced_algorithm(Some("oneshot")).unwrap(),
            Some(Algorithm::OneShotAllReduce)
        );
        assert_eq!(parse_forced_algorithm(None).unwrap(), None);
        let ring = parse_forced_algorithm(Some("ring")).unwrap_err();
        assert!(ring.message.contains("pat"));
        let ll = Limits {
            max_blocks: 8,
            min_blocks: 1,
            ranks_per_gpu: 1,
            forced: Some(Algorithm::OneShotLlAllReduce),
        };
        let too_big = plan(
            Collective::AllReduce,
            DataType::Float32,
            RedOp::Sum,
            1 << 20,
            2,
            DeviceModel::Gpu,
            ll,
        );
        assert!(too_big.unwrap_err().message.contains("low-latency"));
    }

    fn pick_for(collective: Collective, bytes: u64, nranks: u32, backend: DeviceModel) -> Plan {
        plan(
            collective,
            DataType::Float32,
            RedOp::Sum,
            bytes / 4,
            nranks,
            backend,
            OPEN,
        )
        .unwrap()
    }

    #[test]
    fn pat_wins_at_large_rank_counts_for_small_and_medium_sizes() {
        for backend in [DeviceModel::Gpu, DeviceModel::Host] {
            for (collective, pat) in [
                (Collective::AllGather, Algorithm::PatAllGather),
                (Collective::ReduceScatter, Algorithm::PatReduceScatter),
            ] {
                // Few ranks: the direct kernels, at every size.
                for bytes in [4u64, 4 << 10, 1 << 20, 64 << 20] {
                    for nranks in [2, 4, 8, 16] {
                        let p = pick_for(collective, bytes, nranks, backend);
                        assert_ne!(p.kernel.algorithm, pat, "{bytes} B x {nranks} {backend:?}");
                    }
                }
                // 64 ranks: PAT from tiny to medium sizes.
                for bytes in [4u64, 4 << 10, 16 << 10] {
                    let p = pick_for(collective, bytes, 64, backend);
                    assert_eq!(p.kernel.algorithm, pat, "{bytes} B x 64 {backend:?}");
                }
            }
            // Large payloads stay on the direct kernels, where PAT's steps drain the pipeline.
            let large = pick_for(Collective::AllGather, 256 << 20, 64, backend);
            assert_eq!(large.kernel.algorithm, Algorithm::AllGather, "{backend:?}");
        }
    }

    #[test]
    fn symm_algo_pat_forces_pat_for_all_gather_and_reduce_scatter_only() {
        let forced = parse_forced_algorithm(Some("pat")).unwrap();
        assert_eq!(
            Collective::AllGather.resolve_forced(forced.unwrap()),
            Some(Algorithm::PatAllGather)
        );
        let limits = Limits {
            max_blocks: 8,
            min_blocks: 1,
            ranks_per_gpu: 1,
            forced,
        };
        let planned = |collective| {
            plan(
                collective,
                DataType::Int8,
                RedOp::Max,
                1 << 20,
                2,
                DeviceModel::Gpu,
                limits,
            )
            .unwrap()
            .kernel
            .algorithm
        };
        assert_eq!(planned(Collective::AllGather), Algorithm::PatAllGather);
        assert_eq!(
            planned(Collective::ReduceScatter),
            Algorithm::PatReduceScatter
        );
        // All-reduce has no PAT kernel: the value is ignored there, as the all-reduce values
        // are by all-gather and reduce-scatter.
        assert_eq!(
            planned(Collective::AllReduce),
            pick_for(Collective::AllReduce, 1 << 20, 2, DeviceModel::Gpu)
                .kernel
                .algorithm
        );
        let oneshot = Limits {
            max_blocks: 8,
            min_blocks: 1,
            ranks_per_gpu: 1,
            forced: Some(Algorithm::OneShotAllReduce),
        };
        let gather = plan(
            Collective::AllGather,
            DataType::Int8,
            RedOp::Sum,
            4,
            64,
            DeviceModel::Gpu,
            oneshot,
        )
        .unwrap();
        assert_eq!(gather.kernel.algorithm, Algorithm::PatAllGather);
        // A forced algorithm of the wrong collective is still refused when asked for directly.
        let wrong = Limits {
            max_blocks: 8,
            min_blocks: 1,
            ranks_per_gpu: 1,
            forced: Some(Algorithm::ReduceScatter),
        };
        let refused = plan(
            Collective::AllReduce,
            DataType::Int8,
            RedOp::Sum,
            4,
            2,
            DeviceModel::Gpu,
            wrong,
        );
        assert!(refused.unwrap_err().message.contains("does not implement"));
    }

    #[test]
    fn host_plans_stay_small() {
        for count in [0u64, 1, 1 << 20] {
            let p = plan(
                Collective::ReduceScatter,
                DataType::Float64,
                RedOp::Max,
                count,
                8,
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
    }

    #[test]
    fn broadcast_has_one_kernel_whatever_the_size_and_symm_algo() {
        let mut previous = 0;
        for shift in [0u32, 10, 14, 20, 26] {
            for forced in [
                None,
                Some(Algorithm::OneShotLlAllReduce),
                Some(Algorithm::PatAllGather),
            ] {
                let p = plan(
                    Collective::Broadcast,
                    DataType::Float32,
                    RedOp::Sum,
                    1 << shift,
                    8,
                    DeviceModel::Gpu,
                    Limits {
                        max_blocks: 32,
                        min_blocks: 1,
                        ranks_per_gpu: 1,
                        forced,
                    },
                )
                .unwrap();
                assert_eq!(
                    p.kernel.algorithm,
                    Algorithm::Broadcast,
                    "{shift} {forced:?}"
                );
                assert_eq!(p.kernel.ptx_name(), "symm_broadcast");
                assert!(p.grid >= previous && p.grid <= 32);
                previous = p.grid;
            }
        }
        assert!(previous > 1, "a large broadcast uses several blocks");
    }

    #[test]
    fn ptx_names() {
        let k = KernelId {
            algorithm: Algorithm::OneShotAllReduce,
            dtype: DataType::Float8E4M3,
            op: RedOp::Min,
        };
        assert_eq!(k.ptx_name(), "symm_one_shot_all_reduce_f8e4m3_min");
    }
}
