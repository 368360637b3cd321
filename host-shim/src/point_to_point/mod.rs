//! Send and receive between two ranks (`docs/POINT_TO_POINT.md`): validation of a call, its
//! task, and its launch (alone, or at a group's end with the rank's other sends and receives),
//! on the communicator's point-to-point window.
//!
//! Point-to-point calls take no collective call number and pass no barrier: the kernel pairs
//! the `s`-th send of a rank to a peer with that peer's `s`-th receive from it, and the
//! receiver checks the send against its receive (bytes, data type, window, range) and refuses
//! it, naming the sender, which fails the communicator on every rank. A call refused here
//! with a valid peer fails the communicator on every rank too (the peer's matching call would
//! otherwise wait for it, or pair with the next one); one whose peer is not a rank of the
//! communicator leaves it as it was.
//!
//! The point-to-point window and the rank's table of windows are `comm::pairs`; the decision
//! "now, or at the group's end" is `group::point_to_point`.
//!
//! A buffer outside every window needs no copy on the host: the kernel reads a send's buffer
//! into a ring in the communicator's staging window (`comm::staging`, rings placed by
//! `plan::peer_staging`), from which the receiver pulls it piece by piece, and writes a
//! receive's buffer directly; so a message of any size runs in the one launch.

use crate::abi::symmDataTypeRaw;
use crate::backend::BackendKind;
use crate::backend::LaunchEnd;
use crate::collective::data_type;
use crate::comm::staging::Staging;
use crate::comm::windows::{self, Placement};
use crate::comm::{Clique, Comm, failure};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::log::{Level, Subsys};
use crate::mutation::{self, Mutation};
use crate::plan::peer_staging::{self, Ring};
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

/// Where a task's bytes are.
pub enum Buffer {
    /// In a registered window, at `offset` (an empty message: the point-to-point window).
    InWindow {
        /// The window.
        window: Arc<Window>,
        /// The buffer's offset in it.
        offset: u64,
    },
    /// Outside every window: a send goes through a ring in the communicator's staging window,
    /// a receive is written in place.
    Staged {
        /// The caller's buffer.
        address: u64,
        /// The communicator's staging window.
        staging: Arc<Staging>,
    },
}

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
    /// Where the buffer is.
    pub buffer: Buffer,
    /// The point-to-point window.
    pub pairs: Arc<Window>,
    /// The caller's stream, as an address.
    pub stream: u64,
}

impl Task {
    fn name(&self) -> &'static str {
        if self.send { "symmSend" } else { "symmRecv" }
    }

    /// The caller's address range of this task (written by a receive, read by a send).
    fn range(&self) -> std::ops::Range<u64> {
        let start = match &self.buffer {
            Buffer::InWindow { window, offset } => window.base + offset,
            Buffer::Staged { address, .. } => *address,
        };
        start..start + self.bytes
    }

    fn staging(&self) -> Option<&Arc<Staging>> {
        match &self.buffer {
            Buffer::Staged { staging, .. } => Some(staging),
            Buffer::InWindow { .. } => None,
        }
    }
}

/// A task in its launch: a staged send's ring in the staging window.
struct Placed<'a> {
    task: &'a Task,
    /// A staged send's ring.
    ring: Option<Ring>,
}

impl Placed<'_> {
    /// The window the kernel reads (a send, or a staged send's ring) or writes (a receive),
    /// and the task's offset in it; a staged receive names the point-to-point window.
    fn place(&self) -> Result<(&Arc<Window>, u64)> {
        match (&self.task.buffer, self.ring) {
            (Buffer::InWindow { window, offset }, None) => Ok((window, *offset)),
            (Buffer::Staged { staging, .. }, Some(ring)) if self.task.send => {
                Ok((&staging.window, ring.offset))
            }
            (Buffer::Staged { .. }, None) if !self.task.send => Ok((&self.task.pairs, 0)),
            _ => Err(Error::internal(
                "a send or receive placed against its buffer",
            )),
        }
    }

    /// The caller's address of a staged task, else 0.
    fn staged_address(&self) -> u64 {
        match &self.task.buffer {
            Buffer::Staged { address, .. } => *address,
            Buffer::InWindow { .. } => 0,
        }
    }

    /// The work-table entry, the peer in place `slot` among the launch's distinct peers.
    fn args(&self, slot: u32) -> Result<TaskArgs> {
        let context = |w: &Window| {
            w.context()
                .map(|c| c.address)
                .ok_or_else(|| Error::invalid_usage("the window's registration has not completed"))
        };
        let task = self.task;
        let (window, offset) = self.place()?;
        Ok(PeerTask {
            send: task.send,
            peer: task.peer as u32,
            datatype: task.dtype as u32,
            bytes: task.bytes,
            buffer_context: context(window)?,
            offset,
            window: window.seq,
            pairs_context: context(&task.pairs)?,
            slot,
            ordinals: 0,
            staged_address: self.staged_address(),
            piece: self.ring.map_or(0, |r| r.piece),
        }
        .to_args())
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
                "no window is registered on this comm yet: {buffer_name} must lie in a window \
                 registered with symmCommWindowRegister"
            ))
        })?;
    // An empty message names no memory: it travels on the point-to-point window itself.
    let staging = comm.lock().staging.clone();
    let buffer = match (bytes, staging) {
        (0, _) => Buffer::InWindow {
            window: pairs.clone(),
            offset: 0,
        },
        (_, Some(staging))
            if call.buffer != 0
                && windows::placement(comm, call.buffer, bytes) == Placement::Outside =>
        {
            // The kernel reads (a send) or writes (a receive) the buffer itself.
            if !comm
                .clique
                .backend
                .reaches(comm.device, call.buffer, bytes)?
            {
                return Err(Error::invalid_argument(format!(
                    "{buffer_name} = {:#x} ({bytes} bytes) lies outside every window, in memory \
                     device {} cannot reach (pageable host memory?): pass device memory, \
                     pinned or registered host memory (cuMemHostAlloc, cuMemHostRegister), or \
                     memory in a window",
                    call.buffer, comm.device
                )));
            }
            Buffer::Staged {
                address: call.buffer,
                staging,
            }
        }
        (_, staging) => {
            let window = crate::collective::buffer_window(comm, buffer_name, call.buffer, bytes, 1)
                .map_err(|e| match staging {
                    None => crate::collective::route::no_staging(e),
                    Some(_) => e,
                })?;
            if window.context().is_none() {
                return Err(Error::invalid_usage(format!(
                    "{buffer_name} lies in a window whose registration has not completed \
                     (inside a group: it completes at symmGroupEnd)"
                )));
            }
            let offset = call.buffer - window.base;
            Buffer::InWindow { window, offset }
        }
    };
    let sent_from = match &buffer {
        Buffer::InWindow { window, .. } => window,
        Buffer::Staged { staging, .. } => &staging.window,
    };
    if call.send
        && !comm
            .lock()
            .point_to_point
            .as_ref()
            .is_some_and(|p| p.holds(sent_from.seq))
    {
        return Err(Error::invalid_usage(format!(
            "symmSend: the window holding sendbuff (#{}) is not in this rank's point-to-point \
             table, which holds {WINDOW_TABLE_ENTRIES} windows: deregister windows no longer \
             in use",
            sent_from.seq
        )));
    }
    Ok(Task {
        comm: comm.clone(),
        send: call.send,
        peer,
        dtype,
        bytes,
        buffer,
        pairs,
        stream,
    })
}

/// The communicator (by its clique) and device of a launch.
type LaunchKey = (*const Clique, i32);

/// Run `tasks` (one or several ranks', in call order): one launch per device and clique,
/// serving every rank of it. A refusal here (overlapping buffers, several streams for one
/// rank, too many calls, staged buffers past the staging window) fails the ranks'
/// communicators: their peers may have made the matching calls.
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
    let checked: Result<Vec<Vec<Vec<Placed>>>> = launches
        .iter()
        .map(|(_, parts)| parts.iter().map(|tasks| check_rank_tasks(tasks)).collect())
        .collect();
    let placed = match checked {
        Ok(placed) => placed,
        Err(e) => {
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
    };
    let host = tasks
        .first()
        .is_some_and(|t| t.comm.clique.backend.kind() == BackendKind::Host);
    let results: Vec<Result<()>> = if host && placed.len() > 1 {
        // Host launches return when done: the launches run side by side.
        std::thread::scope(|scope| {
            let handles: Vec<_> = placed
                .iter()
                .map(|parts| scope.spawn(move || run_launch(parts)))
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
        placed.iter().map(|parts| run_launch(parts)).collect()
    };
    results.into_iter().collect()
}

/// One rank's tasks of a launch: at most `MAX_TASKS`, on one stream, with receive buffers
/// that overlap no other buffer, and staged buffers that fit the staging window together:
/// the tasks, each staged one with its place in the window.
fn check_rank_tasks<'a>(tasks: &[&'a Task]) -> Result<Vec<Placed<'a>>> {
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
    check_overlaps(tasks)?;
    let sends: Vec<Option<u64>> = tasks
        .iter()
        .map(|t| (t.send && t.staging().is_some()).then_some(t.bytes))
        .collect();
    let capacity = tasks
        .iter()
        .find_map(|t| t.staging())
        .map_or(0, |s| s.window.size);
    let rings = if mutation::active(Mutation::P2pRingsOverlap) {
        peer_staging::place_rings(&sends, capacity).map(|rings| {
            rings
                .into_iter()
                .map(|r| r.map(|r| Ring { offset: 0, ..r }))
                .collect()
        })
    } else {
        peer_staging::place_rings(&sends, capacity)
    };
    let rings = rings.map_err(|needed| {
        Error::invalid_argument(format!(
            "rank {}: {} of its sends in one call or group have buffers outside the windows, \
             and their rings need at least {needed} bytes, more than the staging window's \
             {capacity} (SYMM_STAGING_BYTES, alike on every rank): put the buffers in windows, \
             or raise SYMM_STAGING_BYTES",
            first.comm.rank,
            sends.iter().flatten().count()
        ))
    })?;
    announce_staged(tasks, &rings);
    Ok(tasks
        .iter()
        .zip(rings)
        .map(|(task, ring)| Placed { task, ring })
        .collect())
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

/// Say a rank's first staged send in the log, once per communicator (with the collectives'
/// first staged call). A receive outside the windows costs nothing more than one inside, so it
/// is not said.
fn announce_staged(tasks: &[&Task], rings: &[Option<Ring>]) {
    let Some((task, ring)) = tasks
        .iter()
        .zip(rings)
        .find_map(|(t, ring)| ring.filter(|_| t.bytes > 0).map(|ring| (t, ring)))
    else {
        return;
    };
    let staging = task.staging().expect("a staged send");
    crate::collective::route::announce(&task.comm, staging, || {
        let range = task.range();
        format!(
            "symmSend of {} bytes to rank {}: sendbuff [{:#x}, +{} bytes) is in no registered \
             window: sent in pieces of {} bytes through a ring,",
            task.bytes, task.peer, range.start, task.bytes, ring.piece,
        )
    });
}

/// Order the rings of a launch's staged sends against the staging window's other uses: before
/// the launch, a rank's staging window waits for its last use on another stream
/// (`Staging::before_use`); after it, the use is marked (`after_use`).
fn order_rings(parts: &[Vec<Placed>], before: bool) -> Result<()> {
    for placed in parts {
        let Some(staging) = placed
            .iter()
            .find(|p| p.ring.is_some())
            .and_then(|p| p.task.staging())
        else {
            continue;
        };
        let task = placed[0].task;
        let comm = &task.comm;
        let backend = &comm.clique.backend;
        if before {
            staging.before_use(backend, comm.device, task.stream)?;
        } else {
            staging.after_use(backend, comm.device, task.stream)?;
        }
    }
    Ok(())
}

/// The launch serving `parts` (ranks of one device and clique, each with its tasks in call
/// order), its work table built.
fn build_launch(parts: &[Vec<Placed>]) -> Result<Launch> {
    let first = &parts[0][0].task.comm;
    let clique = &first.clique;
    let task_count = parts.iter().map(Vec::len).max().unwrap_or(1);
    let mut work = Vec::with_capacity(parts.len() * task_count);
    let mut units = 1u32;
    for placed in parts {
        // Each distinct peer's place: which blocks own its channels.
        let mut peers: Vec<usize> = Vec::new();
        let mut rank_units = 0u32;
        for one in placed {
            let peer = one.task.peer;
            let slot = match peers.iter().position(|p| *p == peer) {
                Some(slot) => slot,
                None => {
                    peers.push(peer);
                    rank_units += CHANNELS;
                    peers.len() - 1
                }
            };
            work.push(one.args(slot as u32)?);
        }
        let start = work.len() - placed.len();
        symm_device::symmetric::point_to_point::assign_ordinals(&mut work[start..]);
        let pairs = placed[0]
            .task
            .pairs
            .context()
            .map(|c| c.address)
            .unwrap_or(0);
        for _ in placed.len()..task_count {
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
    Ok(Launch {
        kernel,
        grid: plan.grid,
        block: plan.block,
        table: clique.work_table(first.device, &work)?,
        tasks: work,
        task_count: task_count as u32,
        streams: parts.iter().map(|p| p[0].task.stream).collect(),
        device: first.device,
        rank_ids: parts.iter().map(|p| p[0].task.comm.rank).collect(),
        instances: Vec::new(),
        clique_ranks: clique.nranks as u32,
        ranks_on_device: clique
            .devices
            .iter()
            .filter(|d| **d == first.device)
            .count() as u32,
    })
}

/// One launch serving `parts` (ranks of one device and clique, each with its tasks in call
/// order), ordered after the staging window's last use on another stream. Any failure once the ranks are
/// found healthy fails their communicators: the peers' matching calls would wait for it.
fn run_launch(parts: &[Vec<Placed>]) -> Result<()> {
    let first = &parts[0][0].task.comm;
    let clique = &first.clique;
    for placed in parts {
        failure::check(&placed[0].task.comm)?;
    }
    let fail_all = |e: Error, what: &str| {
        let e = Error::new(
            e.code,
            format!(
                "{}; {what}, so the communicator is failed on every rank",
                e.message
            ),
        );
        for placed in parts {
            failure::fail(&placed[0].task.comm, &e);
        }
        e
    };
    let resources: Vec<_> = parts.iter().map(|p| &p[0].task.comm.resources).collect();
    let (launch, prepared) = build_launch(parts)
        .and_then(|launch| {
            let prepared = clique.backend.prepare_launch(&launch, &resources)?;
            Ok((launch, prepared))
        })
        .map_err(|e| fail_all(e, "the send/receive launch could not be prepared"))?;
    crate::log!(
        Level::Info,
        Subsys::Coll,
        Some(first.rank),
        "launch: send/receive of {} task(s) ({} staged), kernel {}, {} blocks x {} threads; \
         ranks {:?} on device {}",
        parts.iter().map(Vec::len).sum::<usize>(),
        parts
            .iter()
            .flatten()
            .filter(|p| p.task.staging().is_some())
            .count(),
        launch.kernel.ptx_name(),
        launch.grid,
        launch.block,
        launch.rank_ids,
        launch.device
    );
    order_rings(parts, true).map_err(|e| {
        fail_all(
            e,
            "the staging window's last use on another stream could not be waited for",
        )
    })?;
    for placed in parts {
        let comm = &placed[0].task.comm;
        comm.lock().last_kernel = Some(launch.kernel.ptx_name());
        comm.launches.fetch_add(1, Ordering::Relaxed);
    }
    let end = clique
        .backend
        .run_launch(&launch, &resources, prepared)
        .and_then(|end| order_rings(parts, false).map(|()| end));
    let marks = match clique.backend.mark_launch(first.device, &launch.streams) {
        Ok(marks) => marks,
        Err(e) => {
            // The kernel may be enqueued: nothing may be freed until the streams are idle.
            for placed in parts {
                let _ = clique.backend.synchronize(&placed[0].task.comm.resources);
            }
            return Err(fail_all(
                e,
                "the launch could not be recorded on its streams",
            ));
        }
    };
    for placed in parts {
        placed[0].task.pairs.note_launch(&marks);
        for one in placed {
            one.place()?.0.note_launch(&marks);
        }
    }
    let end = end.map_err(|e| fail_all(e, "a send/receive launch failed"))?;
    if end == LaunchEnd::Completed {
        return Ok(());
    }
    let mut result = Ok(());
    for placed in parts {
        if let Err(e) = failure::check(&placed[0].task.comm) {
            placed[0].task.comm.set_last_error(&e.message);
            result = result.and(Err(e));
        }
    }
    if end == LaunchEnd::GaveUp && result.is_ok() {
        // Nothing was received: never report success.
        return Err(fail_all(
            Error::internal("a send/receive launch gave up, and no rank's communicator names why"),
            "nothing was received",
        ));
    }
    result
}
