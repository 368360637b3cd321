//! Running a launch: its calls numbered and agreed with the peers (a refused call still counts
//! as its rank's call), the work table built, the executor called, the communicator checked
//! before and after.

use super::Task;
use crate::agree::Call;
use crate::backend::LaunchEnd;
use crate::comm::{Comm, failure};
use crate::error::{Error, Result};
use crate::launch::{InstanceId, Launch};
use crate::log::{Level, Subsys};
use crate::plan::Plan;
use crate::window::Window;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use symm_device::symmetric::TaskArgs;
use symm_device::symmetric::batch::task_cells;

/// Number `call`, which launches nothing (a refused or empty call), as `comm`'s next
/// collective and compare it with the peers' calls of that number (this process's ranks, and
/// those of other processes of this machine). A disagreement fails the communicator
/// ([`failure::fail`]) and is returned. The call counts as issued at once (see
/// [`crate::comm::pacing`]).
pub(crate) fn agree_call(comm: &Comm, call: &Call) -> Result<u64> {
    let seq = number_call(comm, call)?;
    comm.clique.pacing.issued(comm.rank, seq);
    Ok(seq)
}

/// [`agree_call`] for a call about to be launched: it counts as issued once launched.
fn number_call(comm: &Comm, call: &Call) -> Result<u64> {
    let seq = comm.next_collective.fetch_add(1, Ordering::Relaxed);
    let clique = &comm.clique;
    // The in-process log's lock is released before the call records are read: that read may
    // wait for a rank of another process, which must not hold up this process's other ranks.
    let in_process = clique
        .calls
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .record(seq, comm.rank, call, clique.nranks, |r| {
            clique.devices[r] == crate::comm::REMOTE_DEVICE
        });
    let checked = in_process.and_then(|()| match &comm.call_records {
        Some(records) => records.agree(seq, call),
        None => Ok(()),
    });
    if let Err(e) = checked {
        failure::fail(comm, &e);
        return Err(e);
    }
    Ok(seq)
}

/// `true` when some peer of `comm` runs where its calls cannot be compared with this rank's
/// (another machine): a call this rank refuses then fails the communicator at once.
fn has_uncompared_peers(comm: &Comm) -> bool {
    comm.call_records.is_none()
        && comm
            .link
            .as_ref()
            .is_some_and(crate::transport::link::RankLink::has_remote_peers)
}

/// Count a call that `comm` refused after it reached the communicator (`error`) as its next
/// collective ([`Call::Refused`]): when a peer made that call, or may have (a peer on another
/// machine), the communicator is failed, and the error says so. Nothing is recorded on a
/// communicator that has failed already.
pub(crate) fn record_refusal(comm: &Comm, error: Error) -> Error {
    if failure::adopted(comm).is_some() || comm.clique.nranks == 1 {
        return error;
    }
    match agree_call(comm, &Call::Refused(error.message.clone())) {
        Err(conflict) => Error::new(
            error.code,
            format!("{}; {}", error.message, conflict.message),
        ),
        Ok(seq) if has_uncompared_peers(comm) => {
            let failed = Error::new(
                error.code,
                format!(
                    "{}; this refusal was rank {}'s collective #{seq}, which ranks on other \
                     machines may have made, so the communicator is failed on every rank",
                    error.message, comm.rank
                ),
            );
            failure::fail(comm, &failed);
            failed
        }
        Ok(seq) => {
            comm.unsettled_refusal.store(seq, Ordering::Relaxed);
            error
        }
    }
}

/// Launch `parts` as one launch with `plan`: `parts[i]` is the `i`-th served rank's tasks (one
/// device, distinct ranks), in batch order; the `t`-th task of every rank is one collective
/// (checked to agree). An unfused call is one rank's one task with its own plan. A timed-out
/// peer is reported as `symmTimeout` (host backend: of this call; cuda: of a later one, when
/// the kernel has run). Every task takes its rank's next call number: a task that cannot be
/// launched is counted as refused ([`record_refusal`]); a launch that fails after its tasks
/// were numbered fails the communicator.
pub fn execute(parts: &[Vec<&Task>], plan: &Plan) -> Result<()> {
    check_shape(parts)?;
    if let Err(e) = check_parts_agree(parts, plan) {
        refuse_tasks(parts, &e);
        return Err(e);
    }
    for tasks in parts {
        failure::check(&tasks[0].comm)?;
    }
    let clique = &parts[0][0].comm.clique;
    let resources: Vec<_> = parts.iter().map(|t| &t[0].comm.resources).collect();
    // Everything that can refuse the launch comes before its calls are numbered, so that a
    // refusal counts as refused calls (which the peers can compare), not as a launch the peers
    // wait for in vain.
    let prepared = launch_of(parts, plan)
        .and_then(|launch| Ok((clique.backend.prepare_launch(&launch, &resources)?, launch)));
    let (prepared, launch) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            refuse_tasks(parts, &e);
            return Err(e);
        }
    };
    number_calls(parts, plan, &launch)?;
    note_launch(parts, plan, &launch);
    // A staged chunk's copies out come before the windows' marks, so that teardown waits
    // for them too; a launch that gave up wrote no result worth copying out.
    let run = pace(parts, &launch)
        .and_then(|()| copy_staged(parts, Side::Before))
        .and_then(|()| clique.backend.run_launch(&launch, &resources, prepared))
        .and_then(|end| match end {
            LaunchEnd::GaveUp => Ok(end),
            _ => copy_staged(parts, Side::After).map(|()| end),
        })
        .and_then(|end| note_streams(parts, &launch).map(|()| end));
    // Issued once launched, or once the communicator is failed (so that a peer the pacing
    // releases finds the failure, not a launch to pair with).
    let issued = || {
        for (task, instance) in parts.iter().flatten().zip(&launch.instances) {
            clique.pacing.issued(task.comm.rank, instance.seq);
        }
    };
    let end = match run {
        Ok(end) => end,
        Err(e) => {
            // The peers may have launched these calls: this rank is out of step.
            let e = Error::new(
                e.code,
                format!(
                    "{}; the launch failed after its calls were numbered, so the communicator is \
                 failed on every rank",
                    e.message
                ),
            );
            for tasks in parts {
                failure::fail(&tasks[0].comm, &e);
            }
            issued();
            return Err(e);
        }
    };
    issued();
    if end == LaunchEnd::Completed {
        // Every rank's collective completed here: its data is right. A failure that peers
        // found since (in a later call) is this rank's next call's error.
        return Ok(());
    }
    let mut result = Ok(());
    for tasks in parts {
        if let Err(e) = failure::check(&tasks[0].comm) {
            tasks[0].comm.set_last_error(&e.message);
            result = result.and(Err(e));
        }
    }
    result
}

/// Which copies of a staged chunk ([`Task::staged`]).
#[derive(Clone, Copy)]
enum Side {
    /// Into the staging window, before the launch.
    Before,
    /// Out of it, after the launch.
    After,
}

/// Run (host) or enqueue (cuda, on each task's stream) the `side` copies of the staged
/// chunks of `parts`.
fn copy_staged(parts: &[Vec<&Task>], side: Side) -> Result<()> {
    for task in parts.iter().flatten() {
        let Some(copies) = &task.staged else {
            continue;
        };
        let comm = &task.comm;
        let staging = comm.lock().staging.clone().ok_or_else(|| {
            Error::internal("a staged chunk on a communicator without a staging window")
        })?;
        let backend = &comm.clique.backend;
        let list = match side {
            Side::Before => {
                staging.before_use(backend, comm.device, task.stream)?;
                &copies.before
            }
            Side::After => &copies.after,
        };
        for copy in list {
            // SAFETY: a chunk's copies join the caller's buffers (valid for the call's counts
            // by the C ABI's contract) and a region inside the staging window
            // (`staging::plan_chunks`), which the communicator holds while the task lives; the
            // staging window is the communicator's own memory, so the two are disjoint.
            unsafe { backend.copy(comm.device, task.stream, copy)? };
        }
        if let Side::After = side {
            staging.after_use(backend, comm.device, task.stream)?;
        }
    }
    Ok(())
}

/// Wait until the ranks of this process that share a device with a rank of `parts`, and that
/// `launch` does not serve, have issued the call before this rank's first call of `launch`
/// ([`crate::comm::pacing`]): on the cuda backend, where kernels are enqueued without waiting
/// and separate launches on one device can meet in a hardware queue.
fn pace(parts: &[Vec<&Task>], launch: &Launch) -> Result<()> {
    let clique = &parts[0][0].comm.clique;
    if clique.backend.kind() != crate::backend::BackendKind::Cuda
        || crate::mutation::active(crate::mutation::Mutation::SkipLaunchPacing)
    {
        return Ok(());
    }
    let served: Vec<usize> = parts.iter().map(|tasks| tasks[0].comm.rank).collect();
    let per_rank = parts[0].len();
    for (i, tasks) in parts.iter().enumerate() {
        let comm = &tasks[0].comm;
        let peers = clique.device_peers(comm.device, &served);
        if peers.is_empty() {
            continue;
        }
        let first = launch.instances[i * per_rank].seq;
        clique.pacing.wait_for(comm, &peers, first)?;
    }
    Ok(())
}

/// Record on every window of `parts` the caller's stream its rank's part of `launch` was
/// enqueued on, so that deregistering the window waits for it ([`Window::note_launch`]).
fn note_streams(parts: &[Vec<&Task>], launch: &Launch) -> Result<()> {
    let first = &parts[0][0].comm;
    // One mark per distinct stream of the launch; every window of the launch keeps them all.
    let marks = first
        .clique
        .backend
        .mark_launch(first.device, &launch.streams)?;
    let mut windows: Vec<&Arc<Window>> = Vec::new();
    for task in parts.iter().flatten() {
        let table = task.counts.as_ref().map(|t| &t.window);
        for window in [&task.send_window, &task.recv_window]
            .into_iter()
            .chain(table)
        {
            if !windows.iter().any(|w| Arc::ptr_eq(w, window)) {
                windows.push(window);
            }
        }
    }
    for window in windows {
        window.note_launch(&marks);
    }
    Ok(())
}

/// The ranks of a launch (one thread drives them, in a group) agree on every task as it runs
/// with the launch's `plan` (a fused batch's plan may pick another algorithm than each call's
/// own, with other needs: the two-shot all-reduce needs every rank in place or none), so that
/// a disagreement is refused before anything is numbered instead of failing the communicator.
fn check_parts_agree(parts: &[Vec<&Task>], plan: &Plan) -> Result<()> {
    let size = parts[0].len();
    for t in 0..size {
        let first = parts[0][t];
        let expected = first.signature(plan).in_batch(t, size);
        for tasks in &parts[1..] {
            let differences = expected.differences(&tasks[t].signature(plan).in_batch(t, size));
            if !differences.is_empty() {
                return Err(Error::invalid_usage(format!(
                    "call {} of the launch ({}) does not match between rank {} and rank {} as \
                     it runs fused with the group's other calls: {}; nothing of it was launched",
                    t + 1,
                    expected,
                    first.comm.rank,
                    tasks[t].comm.rank,
                    differences.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// A launch serves at least one rank, and every rank the same number of tasks.
fn check_shape(parts: &[Vec<&Task>]) -> Result<()> {
    if parts.is_empty() || parts[0].is_empty() {
        return Err(Error::internal("empty launch"));
    }
    let task_count = parts[0].len();
    if parts.iter().any(|tasks| tasks.len() != task_count) {
        return Err(Error::internal(
            "the ranks of a launch differ in their task counts",
        ));
    }
    Ok(())
}

/// Number every task of `parts` as its rank's next call and agree on it with the peers
/// ([`agree_call`]); each must take the number `launch` planned for it.
fn number_calls(parts: &[Vec<&Task>], plan: &Plan, launch: &Launch) -> Result<()> {
    for ((index, size, task), instance) in parts
        .iter()
        .flat_map(|tasks| {
            let size = tasks.len();
            tasks.iter().enumerate().map(move |(i, t)| (i, size, t))
        })
        .zip(&launch.instances)
    {
        let signature = task.signature(plan).in_batch(index, size);
        let seq = number_call(&task.comm, &Call::Made(signature))?;
        if seq != instance.seq {
            // The rank's calls are made by this thread alone (`Comm::enter_call`).
            let e = Error::internal(format!(
                "rank {}: collective numbered #{seq} while #{} was planned",
                task.comm.rank, instance.seq
            ));
            failure::fail(&task.comm, &e);
            return Err(e);
        }
    }
    Ok(())
}

/// Record the launch on its ranks (the last kernel, for messages; the launch count) and, at
/// `SYMM_DEBUG=INFO`, say what is launched.
fn note_launch(parts: &[Vec<&Task>], plan: &Plan, launch: &Launch) {
    let first = parts[0][0];
    crate::log!(
        Level::Info,
        Subsys::Coll,
        Some(first.comm.rank),
        "launch: {} of {} task(s) ({} B per rank), kernel {}, {} blocks x {} threads, predicted \
         {:.1} us; ranks {:?} on device {}",
        first.collective.name(),
        parts[0].len(),
        parts[0].iter().map(|t| t.share_bytes()).sum::<u64>(),
        plan.kernel.ptx_name(),
        plan.grid,
        plan.block,
        plan.predicted_us,
        launch.rank_ids,
        launch.device
    );
    for tasks in parts {
        let comm = &tasks[0].comm;
        comm.lock().last_kernel = Some(plan.kernel.ptx_name());
        comm.launches.fetch_add(1, Ordering::Relaxed);
    }
}

/// Count every task of `parts` as refused with `error` (see [`record_refusal`]).
pub(crate) fn refuse_tasks(parts: &[Vec<&Task>], error: &Error) {
    for task in parts.iter().flat_map(|tasks| tasks.iter()) {
        let _ = record_refusal(&task.comm, error.clone());
    }
}

/// The launch of `parts` with `plan`, its work table uploaded; its call numbers (`instances`)
/// are added once the calls agreed.
fn launch_of(parts: &[Vec<&Task>], plan: &Plan) -> Result<Launch> {
    let first = parts[0][0];
    let task_count = parts[0].len();
    let context = |w: &Window| {
        w.context()
            .map(|c| c.address)
            .ok_or_else(|| Error::invalid_usage("the window's registration has not completed"))
    };
    let algorithm = plan.kernel.algorithm;
    let element_bytes = plan.kernel.dtype.size_bytes() as u64;
    let mut work = Vec::with_capacity(parts.len() * task_count);
    for tasks in parts {
        let mut first_cell = 0u64;
        for task in tasks {
            work.push(TaskArgs {
                send_context: context(&task.send_window)?,
                recv_context: context(&task.recv_window)?,
                send_offset: task.args.send_offset,
                recv_offset: task.args.recv_offset,
                count: task.kernel_count(plan),
                first_cell,
                flags: task.rank_flags,
                reserved: 0,
                counts_context: match &task.counts {
                    Some(table) => context(&table.window)?,
                    None => 0,
                },
                counts_offset: task.counts.as_ref().map_or(0, |t| t.offset),
                send_capacity: task
                    .counts
                    .as_ref()
                    .map_or(0, |t| t.send_count * element_bytes),
            });
            first_cell += task_cells(algorithm, element_bytes, task.kernel_count(plan));
        }
    }
    let clique = &first.comm.clique;
    let table = clique.work_table(first.comm.device, &work)?;
    Ok(Launch {
        kernel: plan.kernel,
        grid: plan.grid,
        block: plan.block,
        tasks: work,
        task_count: task_count as u32,
        table,
        streams: parts.iter().map(|tasks| tasks[0].stream).collect(),
        device: first.comm.device,
        rank_ids: parts.iter().map(|tasks| tasks[0].comm.rank).collect(),
        // The numbers the calls take when they agree: this thread alone numbers the calls of
        // these ranks now (`Comm::enter_call`), the `t`-th task of a rank its `next + t`.
        instances: parts
            .iter()
            .flat_map(|tasks| {
                let next = tasks[0].comm.next_collective.load(Ordering::Relaxed);
                tasks.iter().enumerate().map(move |(t, task)| InstanceId {
                    clique: Arc::as_ptr(&task.comm.clique) as usize,
                    seq: next + t as u64,
                })
            })
            .collect(),
        clique_ranks: clique.nranks as u32,
        ranks_on_device: clique
            .devices
            .iter()
            .filter(|d| **d == first.comm.device)
            .count() as u32,
    })
}
