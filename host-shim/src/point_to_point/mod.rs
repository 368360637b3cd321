//! Send and receive between two ranks (`docs/POINT_TO_POINT.md`): validation of a call, its
//! task, and its launch (alone, or at a group's end with the rank's other sends and receives),
//! on the communicator's point-to-point window.
//!
//! Point-to-point calls take no collective call number and pass no barrier: the kernel pairs
//! the `s`-th send of a rank to a peer with that peer's `s`-th receive from it, and the
//! receiver checks the send against its receive (bytes, data type, window, range) and refuses
//! it, naming the sender, which fails the communicator on every rank. A call refused here (a
//! bad argument) leaves the communicator as it was; its peer's matching call then waits for it
//! until the timeout.
//!
//! The point-to-point window and the rank's table of windows are `comm::pairs`; the decision
//! "now, or at the group's end" is `group::point_to_point`.

use crate::abi::symmDataTypeRaw;
use crate::backend::BackendKind;
use crate::collective::data_type;
use crate::comm::{Clique, Comm, failure};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::log::{Level, Subsys};
use crate::plan::{KernelId, Limits};
use crate::window::Window;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use symm_device::symmetric::batch::MAX_TASKS;
use symm_device::symmetric::point_to_point::PeerTask;
use symm_device::symmetric::{Algorithm, TaskArgs};
use symm_device::sync::p2p::{CHANNELS, WINDOW_TABLE_ENTRIES};
use symm_device::{DataType, RedOp};

/// One send or receive of a rank, validated.
pub struct Task {
    /// The rank.
    pub comm: Arc<Comm>,
    /// `true` for a send.
    pub send: bool,
    /// The other rank.
    pub peer: usize,
    /// The data type.
    pub dtype: DataType,
    /// Bytes.
    pub bytes: u64,
    /// The window holding the buffer.
    pub window: Arc<Window>,
    /// The buffer's offset in it.
    pub offset: u64,
    /// The point-to-point window.
    pub pairs: Arc<Window>,
    /// The caller's stream, as an address.
    pub stream: u64,
}

impl Task {
    fn name(&self) -> &'static str {
        if self.send { "symmSend" } else { "symmRecv" }
    }

    /// The work-table entry, the peer in place `slot` among the launch's distinct peers.
    fn args(&self, slot: u32) -> Result<TaskArgs> {
        let context = |w: &Window| {
            w.context()
                .map(|c| c.address)
                .ok_or_else(|| Error::invalid_usage("the window's registration has not completed"))
        };
        Ok(PeerTask {
            send: self.send,
            peer: self.peer as u32,
            datatype: self.dtype as u32,
            bytes: self.bytes,
            buffer_context: context(&self.window)?,
            offset: self.offset,
            window: self.window.seq,
            pairs_context: context(&self.pairs)?,
            slot,
            ordinals: 0,
        }
        .to_args())
    }

    /// The address range of this rank's memory the task writes (a receive) or reads (a send).
    fn range(&self) -> std::ops::Range<u64> {
        let start = self.window.base + self.offset;
        start..start + self.bytes
    }
}

/// What a `symmSend` or `symmRecv` names.
pub struct Call {
    /// `true` for a send.
    pub send: bool,
    /// The buffer's address.
    pub buffer: u64,
    /// Elements.
    pub count: usize,
    /// The C data type.
    pub datatype: symmDataTypeRaw,
    /// The other rank.
    pub peer: i32,
}

/// "symmSend of 1024 x Float32 to rank 1": a call as another thread's refusal names it.
pub fn describe(call: &Call) -> String {
    let (name, direction) = if call.send {
        ("symmSend", "to")
    } else {
        ("symmRecv", "from")
    };
    format!(
        "{} {direction} rank {}",
        crate::collective::describe(name, call.count, call.datatype),
        call.peer
    )
}

/// Validate `call` of `comm` on `stream`. A call refused once its peer is known fails the
/// communicator on every rank ([`refused`]).
pub fn validate(comm: &Arc<Comm>, call: &Call, stream: u64) -> Result<Task> {
    let name = if call.send { "symmSend" } else { "symmRecv" };
    crate::comm::refuse_if_finalized(comm, name)?;
    failure::check(comm)?;
    let nranks = comm.clique.nranks;
    let peer = usize::try_from(call.peer)
        .ok()
        .filter(|p| *p < nranks)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "peer = {}: must be a rank of the communicator, 0 to {}",
                call.peer,
                nranks - 1
            ))
        })?;
    validate_with_peer(comm, call, peer, stream).map_err(|e| refused(comm, call, peer, e))
}

/// The refusal `error` of `call` with `peer`, which fails the communicator on every rank: the
/// peer may have made the matching call, which would otherwise wait until the timeout, or pair
/// with this rank's next call to it.
fn refused(comm: &Comm, call: &Call, peer: usize, error: Error) -> Error {
    let error = Error::new(
        error.code,
        format!(
            "{}; this {} {} rank {peer} was refused, and since rank {peer}'s matching call would \
             wait for it (or pair with the next one), the communicator is failed on every rank",
            error.message,
            if call.send { "symmSend" } else { "symmRecv" },
            if call.send { "to" } else { "from" },
        ),
    );
    failure::fail(comm, &error);
    error
}

fn validate_with_peer(comm: &Arc<Comm>, call: &Call, peer: usize, stream: u64) -> Result<Task> {
    let name = if call.send { "symmSend" } else { "symmRecv" };
    let buffer_name = if call.send { "sendbuff" } else { "recvbuff" };
    let dtype = data_type(call.datatype)?;
    let element = dtype.size_bytes() as u64;
    let bytes = (call.count as u64)
        .checked_mul(element)
        .filter(|b| call.buffer.checked_add(*b).is_some())
        .ok_or_else(|| {
            Error::invalid_argument(format!("count = {}: the buffer would overflow", call.count))
        })?;
    let pairs = comm
        .lock()
        .point_to_point
        .as_ref()
        .map(|p| p.window.clone())
        .filter(|w| w.context().is_some())
        .ok_or_else(|| {
            Error::invalid_usage(format!(
                "{name}: no window is registered on this comm yet: {buffer_name} must lie in a \
                 window registered with symmCommWindowRegister"
            ))
        })?;
    // An empty message names no memory: it travels on the point-to-point window itself.
    let (window, offset) = if bytes == 0 {
        (pairs.clone(), 0)
    } else {
        let window = crate::collective::buffer_window(comm, buffer_name, call.buffer, bytes, 1)
            .map_err(|e| {
                Error::new(
                    e.code,
                    format!(
                        "{} (symmSend and symmRecv are not staged: unlike the collectives', \
                         their buffers must lie in windows)",
                        e.message
                    ),
                )
            })?;
        if window.context().is_none() {
            return Err(Error::invalid_usage(format!(
                "{buffer_name} lies in a window whose registration has not completed (inside \
                 a group: it completes at symmGroupEnd)"
            )));
        }
        let offset = call.buffer - window.base;
        (window, offset)
    };
    if call.send
        && !comm
            .lock()
            .point_to_point
            .as_ref()
            .is_some_and(|p| p.holds(window.seq))
    {
        return Err(Error::invalid_usage(format!(
            "symmSend: the window holding sendbuff (#{}) is not in this rank's point-to-point \
             table, which holds {WINDOW_TABLE_ENTRIES} windows: deregister windows no longer \
             in use",
            window.seq
        )));
    }
    Ok(Task {
        comm: comm.clone(),
        send: call.send,
        peer,
        dtype,
        bytes,
        window,
        offset,
        pairs,
        stream,
    })
}

/// The communicator (by its clique) and device of a launch.
type LaunchKey = (*const Clique, i32);

/// Run `tasks` (one or several ranks', in call order): one launch per device and clique,
/// serving every rank of it. A refusal here (overlapping buffers, several streams for one
/// rank, too many calls) fails the ranks' communicators: their peers may have made the
/// matching calls.
pub fn run(tasks: &[Task]) -> Result<()> {
    let mut launches: Vec<(LaunchKey, Vec<Vec<&Task>>)> = Vec::new();
    let mut ranks: HashMap<*const Comm, (usize, usize)> = HashMap::new();
    for task in tasks {
        let key = Arc::as_ptr(&task.comm);
        let (l, r) = *ranks.entry(key).or_insert_with(|| {
            let launch = (Arc::as_ptr(&task.comm.clique), task.comm.device);
            let l = match launches.iter().position(|(k, _)| *k == launch) {
                Some(l) => l,
                None => {
                    launches.push((launch, Vec::new()));
                    launches.len() - 1
                }
            };
            launches[l].1.push(Vec::new());
            (l, launches[l].1.len() - 1)
        });
        launches[l].1[r].push(task);
    }
    let checked = launches
        .iter()
        .flat_map(|(_, parts)| parts)
        .try_for_each(|tasks| check_rank_tasks(tasks));
    if let Err(e) = checked {
        let e = Error::new(
            e.code,
            format!(
                "{}; nothing of it was launched, and since the peers' matching calls would wait \
                 for it, the communicator is failed on every rank",
                e.message
            ),
        );
        for task in tasks {
            failure::fail(&task.comm, &e);
        }
        return Err(e);
    }
    let host = tasks
        .first()
        .is_some_and(|t| t.comm.clique.backend.kind() == BackendKind::Host);
    let results: Vec<Result<()>> = if host && launches.len() > 1 {
        // Host launches return when done: the launches run side by side.
        std::thread::scope(|scope| {
            let handles: Vec<_> = launches
                .iter()
                .map(|(_, parts)| scope.spawn(move || run_launch(parts)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::internal("a host kernel panicked")))
                })
                .collect()
        })
    } else {
        launches
            .iter()
            .map(|(_, parts)| run_launch(parts))
            .collect()
    };
    results.into_iter().collect()
}

/// One rank's tasks of a launch: at most `MAX_TASKS`, on one stream, with receive buffers
/// that overlap no other buffer.
fn check_rank_tasks(tasks: &[&Task]) -> Result<()> {
    let first = tasks[0];
    if tasks.len() > MAX_TASKS {
        return Err(Error::invalid_usage(format!(
            "rank {}: {} sends and receives in one group; at most {MAX_TASKS}",
            first.comm.rank,
            tasks.len()
        )));
    }
    if let Some(other) = tasks.iter().find(|t| t.stream != first.stream) {
        return Err(Error::invalid_usage(format!(
            "rank {}: the sends and receives of one group name different streams ({:#x} and \
             {:#x}); a rank's calls in a group run in one launch, on one stream",
            first.comm.rank, first.stream, other.stream
        )));
    }
    check_overlaps(tasks)
}

/// Receive buffers of one rank's launch overlap no other buffer of it (the kernel copies
/// them concurrently).
fn check_overlaps(tasks: &[&Task]) -> Result<()> {
    for (i, a) in tasks.iter().enumerate() {
        for b in &tasks[i + 1..] {
            if (!a.send || !b.send) && crate::window::ranges_overlap(&a.range(), &b.range()) {
                return Err(Error::invalid_argument(format!(
                    "rank {}: the buffers of {} with rank {} and {} with rank {} in one group \
                     overlap, and one of them is received into",
                    a.comm.rank,
                    a.name(),
                    a.peer,
                    b.name(),
                    b.peer
                )));
            }
        }
    }
    Ok(())
}

/// One launch serving `parts` (ranks of one device and clique, each with its tasks in call
/// order).
fn run_launch(parts: &[Vec<&Task>]) -> Result<()> {
    let first = &parts[0][0].comm;
    let clique = &first.clique;
    for tasks in parts {
        failure::check(&tasks[0].comm)?;
    }
    let task_count = parts.iter().map(Vec::len).max().unwrap_or(1);
    let mut work = Vec::with_capacity(parts.len() * task_count);
    let mut units = 1u32;
    for tasks in parts {
        // Each distinct peer's place: which blocks own its channels.
        let mut peers: Vec<usize> = Vec::new();
        let mut rank_units = 0u32;
        for task in tasks {
            let slot = match peers.iter().position(|p| *p == task.peer) {
                Some(slot) => slot,
                None => {
                    peers.push(task.peer);
                    rank_units += CHANNELS;
                    peers.len() - 1
                }
            };
            work.push(task.args(slot as u32)?);
        }
        let start = work.len() - tasks.len();
        symm_device::symmetric::point_to_point::assign_ordinals(&mut work[start..]);
        let pairs = tasks[0].pairs.context().map(|c| c.address).unwrap_or(0);
        for _ in tasks.len()..task_count {
            work.push(PeerTask::padding(pairs));
        }
        units = units.max(rank_units);
    }
    let plan = crate::plan::plan_point_to_point(
        units,
        clique.device_model(),
        Limits {
            max_blocks: first.max_blocks,
            min_blocks: 1,
            ranks_per_gpu: clique.ranks_per_gpu,
            forced: None,
        },
    );
    let kernel = KernelId {
        algorithm: Algorithm::SendReceive,
        dtype: DataType::Uint8,
        op: RedOp::Sum,
    };
    clique.backend.prepare(first.device, kernel)?;
    let launch = Launch {
        kernel,
        grid: plan.grid,
        block: plan.block,
        table: clique.work_table(first.device, &work)?,
        tasks: work,
        task_count: task_count as u32,
        streams: parts.iter().map(|t| t[0].stream).collect(),
        device: first.device,
        rank_ids: parts.iter().map(|t| t[0].comm.rank).collect(),
        instances: Vec::new(),
        clique_ranks: clique.nranks as u32,
        ranks_on_device: clique
            .devices
            .iter()
            .filter(|d| **d == first.device)
            .count() as u32,
    };
    let resources: Vec<_> = parts.iter().map(|t| &t[0].comm.resources).collect();
    crate::log!(
        Level::Info,
        Subsys::Coll,
        Some(first.rank),
        "launch: send/receive of {} task(s), kernel {}, {} blocks x {} threads; ranks {:?} on \
         device {}",
        parts.iter().map(Vec::len).sum::<usize>(),
        kernel.ptx_name(),
        plan.grid,
        plan.block,
        launch.rank_ids,
        launch.device
    );
    let prepared = clique.backend.prepare_launch(&launch, &resources)?;
    for tasks in parts {
        let comm = &tasks[0].comm;
        comm.lock().last_kernel = Some(kernel.ptx_name());
        comm.launches.fetch_add(1, Ordering::Relaxed);
    }
    let fail_all = |e: Error, what: &str| {
        // The peers may wait for this launch: fail the communicator on every rank.
        let e = Error::new(
            e.code,
            format!(
                "{}; {what}, so the communicator is failed on every rank",
                e.message
            ),
        );
        for tasks in parts {
            failure::fail(&tasks[0].comm, &e);
        }
        e
    };
    let end = clique.backend.run_launch(&launch, &resources, prepared);
    let marks = match clique.backend.mark_launch(first.device, &launch.streams) {
        Ok(marks) => marks,
        Err(e) => {
            // The kernel may be enqueued: nothing may be freed until the streams are idle.
            for tasks in parts {
                let _ = clique.backend.synchronize(&tasks[0].comm.resources);
            }
            return Err(fail_all(
                e,
                "the launch could not be recorded on its streams",
            ));
        }
    };
    for tasks in parts {
        tasks[0].pairs.note_launch(&marks);
        for task in tasks {
            task.window.note_launch(&marks);
        }
    }
    let end = end.map_err(|e| fail_all(e, "a send/receive launch failed"))?;
    if end == crate::backend::LaunchEnd::Completed {
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
