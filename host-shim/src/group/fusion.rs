//! Fusion: at the end of a group, collectives of one communicator with the same (collective,
//! operator, data type) become one launch per device (NCCL's symmetric scheduler).
//!
//! The group's collectives arrive as *instances* in call order (the `k`-th call of every rank
//! of a clique in the group, its parts sorted by rank; see `group`). Each instance joins the
//! latest batch of its key — the clique, the collective, the operator and the data type — or
//! starts a new one. Batches launch in the order they were started, so launches follow the
//! calls' order per rank; a collective that joins an earlier batch runs before the calls made
//! between, which is why it may join only when that reorders nothing observable:
//!
//! * it conflicts with no task of that batch or of any batch started after it (one writes
//!   memory the other reads or writes, on any rank the group drives, by the address ranges of
//!   `Task::footprint`): the tasks of one launch run concurrently, and a dependent call must
//!   stay after the call it depends on;
//! * its parts are the same ranks as the batch's, on the same streams (a launch waits for and
//!   is waited on by one stream per rank);
//! * the batch holds fewer than [`MAX_TASKS`] tasks, and with `SYMM_ALGO=ll` the batch still
//!   fits the LL buffers; with `SYMM_ALGO=pat` all-gathers and reduce-scatters never fuse (the
//!   PAT kernels run one task per launch).
//!
//! Every rank of a clique that the group drives sees the same instances, so every decision is
//! the same for all of them, and each rank's launches serve the same tasks in the same order.
//! Ranks driven by separate threads (or processes) decide alone: they must make the same calls
//! with the same dependencies, as they must agree on every call.
//!
//! **Broadcasts (and gathers and scatters).** Only the root knows where a broadcast's data is
//! (the other ranks' send buffer is ignored), so only a decider that drives the root sees what
//! the broadcast reads. The same holds for a scatter's send buffer and a gather's receive
//! buffer, which they write.
//! When the group drives every rank of the clique, that decider is the only one, and the
//! broadcast fuses like any collective (the root's part carries the read). When it drives only
//! some ranks, deciders that do not drive the root could fuse where the root's decider does
//! not, and the ranks' launches would differ: such a broadcast is a fence instead: it starts a
//! batch of its own, and no later collective joins a batch at or before it.
//!
//! **Staged calls** (buffers outside the windows, `collective::route`) are fences too: each
//! chunk is a launch of its own, in call order, since its copies touch the caller's own memory
//! (which no footprint covers) and every chunk uses the one staging window.

use crate::collective::Task;
use crate::comm::Clique;
use crate::error::Result;
use crate::plan::batch::{BatchRequest, plan_batch};
use crate::plan::{Collective, Limits, Plan, is_pat};
use std::sync::Arc;
use symm_device::symmetric::Algorithm;
use symm_device::symmetric::batch::MAX_TASKS;
use symm_device::{DataType, RedOp};

/// One collective of a group: its parts on the ranks the group drives, sorted by rank.
pub type Instance<'t> = Vec<&'t Task>;

/// What fuses: the clique, the collective, the data type and the operator.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key {
    clique: *const Clique,
    collective: Collective,
    dtype: DataType,
    op: RedOp,
}

fn key(instance: &Instance<'_>) -> Key {
    let task = instance[0];
    Key {
        clique: Arc::as_ptr(&task.comm.clique),
        collective: task.collective,
        dtype: task.plan.kernel.dtype,
        op: task.plan.kernel.op,
    }
}

/// Collectives that run as one launch per device.
pub struct Batch<'t> {
    /// Its instances, in call order.
    pub instances: Vec<Instance<'t>>,
}

impl<'t> Batch<'t> {
    /// The plan of the batch's launches: a single collective keeps its own plan; several are
    /// planned together ([`plan_batch`]).
    pub fn plan(&self) -> Result<Plan> {
        let first = self.instances[0][0];
        if self.instances.len() == 1 {
            return Ok(first.plan);
        }
        let counts = self.counts();
        let comm = &first.comm;
        let request = BatchRequest {
            collective: first.collective,
            dtype: first.plan.kernel.dtype,
            op: first.plan.kernel.op,
            counts: &counts,
            nranks: comm.clique.nranks as u32,
        };
        plan_batch(&request, comm.clique.device_model(), limits(first))
    }

    /// Each task's count as the planner takes it (all-gather: elements, not bytes).
    fn counts(&self) -> Vec<u64> {
        self.instances
            .iter()
            .map(|instance| instance[0].args.count)
            .collect()
    }

    /// The batch's launches, one per device: each as its ranks' tasks (`launch[i]` is the
    /// `i`-th rank's tasks in batch order; ranks ascending).
    pub fn launches(&self) -> Vec<Vec<Vec<&'t Task>>> {
        let mut launches: Vec<Vec<Vec<&'t Task>>> = Vec::new();
        for slot in 0..self.instances[0].len() {
            let tasks: Vec<&'t Task> = self.instances.iter().map(|i| i[slot]).collect();
            let device = tasks[0].comm.device;
            match launches.iter_mut().find(|l| l[0][0].comm.device == device) {
                Some(launch) => launch.push(tasks),
                None => launches.push(vec![tasks]),
            }
        }
        launches
    }
}

/// What limits a plan of `task`'s communicator (as `collective::prepare` plans).
fn limits(task: &Task) -> Limits {
    Limits {
        max_blocks: task.comm.max_blocks,
        min_blocks: task.comm.clique.min_blocks,
        ranks_per_gpu: task.comm.clique.ranks_per_gpu,
        forced: task
            .comm
            .clique
            .forced_algorithm
            .and_then(|forced| task.collective.resolve_forced(forced)),
    }
}

/// `true` for a reduce, broadcast, gather or scatter of which the group drives only some ranks: the
/// ranks' deciders may not know what the root's part reads or writes (see the module docs).
fn is_partial_rooted(instance: &Instance<'_>) -> bool {
    let task = instance[0];
    matches!(
        task.collective,
        Collective::Reduce | Collective::Broadcast | Collective::Gather | Collective::Scatter
    ) && instance.len() < task.comm.clique.nranks
}

/// `true` when `a` and `b` must keep their order: a conflict on a rank's memory (parts of one
/// clique are compared rank by rank, since peers touch the same offsets; parts of different
/// cliques always, as their windows may share memory), or one of them is a rooted collective
/// that only some of its ranks' deciders see whole ([`is_partial_rooted`]).
fn depends(a: &Instance<'_>, b: &Instance<'_>) -> bool {
    if is_partial_rooted(a) || is_partial_rooted(b) || is_staged(a) || is_staged(b) {
        return true;
    }
    a.iter().any(|x| {
        b.iter().any(|y| {
            let same_clique = Arc::ptr_eq(&x.comm.clique, &y.comm.clique);
            (!same_clique || x.comm.rank == y.comm.rank) && x.conflicts_with(y)
        })
    })
}

/// `true` for a chunk of a staged call (`collective::route`): its copies read and write the
/// caller's own buffers, which no footprint covers, and it shares the staging window with
/// every other staged chunk, so it keeps its place among the group's calls: it fuses with
/// none and nothing moves past it.
fn is_staged(instance: &Instance<'_>) -> bool {
    instance.iter().any(|task| task.staged.is_some())
}

/// `true` when `instance` may join `batch` as far as the batch itself is concerned (the
/// conflicts with later batches are checked by [`fuse`]).
fn fits(batch: &Batch<'_>, instance: &Instance<'_>) -> bool {
    let first = &batch.instances[0];
    if is_staged(first) || is_staged(instance) {
        return false;
    }
    let same_parts = first.len() == instance.len()
        && first
            .iter()
            .zip(instance)
            .all(|(a, b)| Arc::ptr_eq(&a.comm, &b.comm) && a.stream == b.stream);
    if !same_parts || batch.instances.len() >= MAX_TASKS {
        return false;
    }
    let task = instance[0];
    let forced = limits(task).forced;
    if forced.is_some_and(is_pat) {
        // The PAT kernels run one task per launch.
        return false;
    }
    if forced == Some(Algorithm::OneShotLlAllReduce) {
        let mut counts = batch.counts();
        counts.push(task.args.count);
        let request = BatchRequest {
            collective: task.collective,
            dtype: task.plan.kernel.dtype,
            op: task.plan.kernel.op,
            counts: &counts,
            nranks: task.comm.clique.nranks as u32,
        };
        return request.fits_ll();
    }
    true
}

/// Group `instances` (in call order) into batches, in launch order (see the module docs).
pub fn fuse<'t>(instances: Vec<Instance<'t>>) -> Vec<Batch<'t>> {
    let mut batches: Vec<Batch<'t>> = Vec::new();
    for instance in instances {
        let k = key(&instance);
        let target = batches
            .iter()
            .rposition(|b| key(&b.instances[0]) == k)
            .filter(|&j| {
                fits(&batches[j], &instance)
                    && batches[j..]
                        .iter()
                        .flat_map(|b| b.instances.iter())
                        .all(|other| !depends(&instance, other))
            });
        match target {
            Some(j) => batches[j].instances.push(instance),
            None => batches.push(Batch {
                instances: vec![instance],
            }),
        }
    }
    batches
}
