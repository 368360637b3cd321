//! A launch as the executors receive it ([`Launch`]: the kernel, its shape, the work table,
//! the streams and the calls it serves) and the launch schedule ([`schedule`]: pure data —
//! which stream waits for which event — that the cuda executor and the checking model both
//! follow).

pub mod schedule;

use crate::plan::KernelId;
use symm_device::symmetric::TaskArgs;

/// One collective of a clique: the clique (its address) and the per-rank sequence number of
/// the call (the `seq`-th collective call of every rank of the clique is one collective).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId {
    /// The clique, by address.
    pub clique: usize,
    /// The call's sequence number on each rank.
    pub seq: u64,
}

/// Everything a backend needs to launch a plan for one or several ranks at once.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The kernel.
    pub kernel: KernelId,
    /// Blocks per rank.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// The work table: `task_count` tasks (windows' contexts, offsets, count, flags, first
    /// cell) per rank served, rank-major, ranks in launch order.
    pub tasks: Vec<TaskArgs>,
    /// Tasks per rank (1 for an unfused call).
    pub task_count: u32,
    /// Device address of a table holding `tasks` (0 on the host backend, which passes
    /// `tasks` itself).
    pub table: u64,
    /// The callers' `CUstream`s (cuda backend), as addresses, one per rank.
    pub streams: Vec<u64>,
    /// Device of every rank served.
    pub device: i32,
    /// The ranks served (rank numbers, in table order).
    pub rank_ids: Vec<usize>,
    /// The collectives each served rank takes part in: `task_count` per rank, rank-major.
    pub instances: Vec<InstanceId>,
    /// Ranks of the clique.
    pub clique_ranks: u32,
    /// Ranks of the clique on `device`.
    pub ranks_on_device: u32,
}
