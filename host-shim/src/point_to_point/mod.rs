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
//! **The point-to-point window** is registered with a rank's first window (registration is
//! collective, so every rank makes it at the same registration): its buffers hold the pair
//! regions and the rank's table of windows (`symm_device::sync::p2p`), which a window enters
//! when its registration completes and leaves before it is freed.

use crate::abi::{SYMM_WIN_COLL_SYMMETRIC, symmDataTypeRaw};
use crate::backend::BackendKind;
use crate::collective::data_type;
use crate::comm::{Comm, failure, windows};
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::log::{Level, Subsys};
use crate::plan::{KernelId, Limits};
use crate::window::Window;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use symm_device::symmetric::point_to_point::PeerTask;
use symm_device::symmetric::{Algorithm, TaskArgs};
use symm_device::sync::p2p::{
    RegionLayout, SLOTS, WINDOW_TABLE_ENTRIES, WindowTable, channels_for, pair_region_bytes,
};
use symm_device::{DataType, RedOp};

/// A rank's point-to-point window and its table of windows.
pub struct PointToPoint {
    /// The window whose buffers hold the pair regions.
    pub window: Arc<Window>,
    /// The `symmMemAlloc` allocation behind it (never the user's).
    pub allocation: u64,
    /// The registration number of the window in each entry of the device table.
    entries: Vec<Option<u64>>,
}

/// Register `comm`'s point-to-point window unless it has one: called by the rank's window
/// registrations before the caller's own, so that every rank makes it at its first one.
pub fn ensure_window(comm: &Arc<Comm>) -> Result<()> {
    if comm.lock().point_to_point.is_some() {
        return Ok(());
    }
    let bytes = pair_region_bytes(comm.clique.nranks as u32) as usize;
    let address = comm.mem_alloc(bytes)?;
    let window = match windows::register(comm, address, bytes, SYMM_WIN_COLL_SYMMETRIC) {
        Ok(window) => window,
        Err(e) => {
            let _ = comm.mem_free(address);
            return Err(e);
        }
    };
    comm.lock().point_to_point = Some(PointToPoint {
        window: window.clone(),
        allocation: address,
        entries: vec![None; WINDOW_TABLE_ENTRIES as usize],
    });
    crate::group::complete_window(comm, &window)
}

/// The allocation of `comm`'s point-to-point window, if it has one (it stays with `comm` when
/// a shrink moves the rank's allocations).
pub fn allocation(comm: &Comm) -> Option<u64> {
    comm.lock().point_to_point.as_ref().map(|p| p.allocation)
}

/// Enter `window`, whose registration just completed, in `comm`'s window table, so that peers'
/// sends may name it. A full table leaves it out (a send from it is then refused).
pub fn enter_window(comm: &Comm, window: &Window) -> Result<()> {
    let Some(context) = window.context().map(|c| c.address) else {
        return Ok(());
    };
    let mut state = comm.lock();
    let Some(p2p) = state.point_to_point.as_mut() else {
        return Ok(());
    };
    let Some(table) = table_address(p2p) else {
        return Ok(());
    };
    let Some(index) = p2p.entries.iter().position(Option::is_none) else {
        crate::log!(
            Level::Warn,
            Subsys::Reg,
            Some(comm.rank),
            "window #{}: the point-to-point table is full ({WINDOW_TABLE_ENTRIES} windows); \
             sends from this window are refused",
            window.seq
        );
        return Ok(());
    };
    let mut entry = Vec::with_capacity(16);
    entry.extend_from_slice(&(window.seq + 1).to_ne_bytes());
    entry.extend_from_slice(&context.to_ne_bytes());
    let address = table + WindowTable::entry(index as u32);
    comm.clique.backend.upload(comm.device, address, &entry)?;
    p2p.entries[index] = Some(window.seq);
    Ok(())
}

/// Take `window` out of `comm`'s window table, before its context is freed (every launch that
/// may read the table has ended: see [`wait_for_launches`]).
pub fn leave_window(comm: &Comm, window: &Window) -> Result<()> {
    let mut state = comm.lock();
    let Some(p2p) = state.point_to_point.as_mut() else {
        return Ok(());
    };
    let Some(table) = table_address(p2p) else {
        return Ok(());
    };
    let Some(index) = p2p.entries.iter().position(|e| *e == Some(window.seq)) else {
        return Ok(());
    };
    let address = table + WindowTable::entry(index as u32);
    comm.clique
        .backend
        .upload(comm.device, address, &[0u8; 16])?;
    p2p.entries[index] = None;
    Ok(())
}

/// Wait until every point-to-point launch of `comm` has ended (they read the rank's window
/// table and its windows' contexts).
pub fn wait_for_launches(comm: &Comm) -> Result<()> {
    let window = comm
        .lock()
        .point_to_point
        .as_ref()
        .map(|p| p.window.clone());
    match window {
        Some(window) => window.wait_for_launches(),
        None => Ok(()),
    }
}

fn table_address(p2p: &PointToPoint) -> Option<u64> {
    let context = p2p.window.context()?;
    Some(context.host.local_base + RegionLayout::new(context.host.world_size).window_table())
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

    fn args(&self) -> Result<TaskArgs> {
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

/// Validate `call` of `comm` on `stream`.
pub fn validate(comm: &Arc<Comm>, call: &Call, stream: u64) -> Result<Task> {
    let name = if call.send { "symmSend" } else { "symmRecv" };
    let buffer_name = if call.send { "sendbuff" } else { "recvbuff" };
    crate::comm::refuse_if_finalized(comm, name)?;
    failure::check(comm)?;
    let dtype = data_type(call.datatype)?;
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
        let window = crate::collective::buffer_window(comm, buffer_name, call.buffer, bytes, 1)?;
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
            .is_some_and(|p| p.entries.contains(&Some(window.seq)))
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

/// `symmSend` / `symmRecv` of `comm`: run now, or inside a group at its end.
pub fn call(comm: &Arc<Comm>, call: Call, stream: u64) -> Result<()> {
    let _call = comm.enter_call(&describe(&call))?;
    let task = validate(comm, &call, stream)?;
    if crate::group::active() {
        crate::group::defer(crate::group::Deferred::PointToPoint(task));
        return Ok(());
    }
    run(&[task])
}

/// Run `tasks` (one or several ranks', in call order): per device, one launch serving all its
/// ranks, or several where a rank has more than `SLOTS` sends to one peer ([`split_launches`]).
/// Receive buffers must not overlap each other or a send buffer of the same rank.
pub fn run(tasks: &[Task]) -> Result<()> {
    let mut by_device: Vec<(i32, Vec<Vec<&Task>>)> = Vec::new();
    let mut ranks: HashMap<*const Comm, (usize, usize)> = HashMap::new();
    for task in tasks {
        let key = Arc::as_ptr(&task.comm);
        let (d, r) = *ranks.entry(key).or_insert_with(|| {
            let d = match by_device
                .iter()
                .position(|(dev, _)| *dev == task.comm.device)
            {
                Some(d) => d,
                None => {
                    by_device.push((task.comm.device, Vec::new()));
                    by_device.len() - 1
                }
            };
            by_device[d].1.push(Vec::new());
            (d, by_device[d].1.len() - 1)
        });
        by_device[d].1[r].push(task);
    }
    for (_, parts) in &by_device {
        for tasks in parts {
            check_overlaps(tasks)?;
        }
    }
    let host = tasks
        .first()
        .is_some_and(|t| t.comm.clique.backend.kind() == BackendKind::Host);
    let run_device = |parts: &Vec<Vec<&Task>>| -> Result<()> {
        for launch in split_launches(parts) {
            run_launch(&launch)?;
        }
        Ok(())
    };
    let results: Vec<Result<()>> = if host && by_device.len() > 1 {
        // Host launches return when done: the devices' launches run side by side.
        std::thread::scope(|scope| {
            let handles: Vec<_> = by_device
                .iter()
                .map(|(_, parts)| scope.spawn(move || run_device(parts)))
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
        by_device
            .iter()
            .map(|(_, parts)| run_device(parts))
            .collect()
    };
    results.into_iter().collect()
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

/// The launches of one device's `parts` (each rank's tasks in call order): launch `k` takes,
/// of every rank, its sends to each peer numbered `k·SLOTS` to `(k+1)·SLOTS − 1` (counting its
/// sends to that peer) and its receives from each peer numbered likewise. Every send of launch
/// `k` pairs with a receive of its peer's launch `k`, so the launches of all ranks complete
/// one after the other, and no launch has more sends to a peer than a channel has slots.
fn split_launches<'a>(parts: &[Vec<&'a Task>]) -> Vec<Vec<(&'a Task, Vec<&'a Task>)>> {
    let chunks: Vec<Vec<Vec<&Task>>> = parts
        .iter()
        .map(|tasks| {
            let mut chunks: Vec<Vec<&Task>> = Vec::new();
            let mut ordinals: HashMap<(bool, usize), u32> = HashMap::new();
            for task in tasks {
                let ordinal = ordinals.entry((task.send, task.peer)).or_insert(0);
                let chunk = (*ordinal / SLOTS) as usize;
                *ordinal += 1;
                if chunks.len() <= chunk {
                    chunks.resize(chunk + 1, Vec::new());
                }
                chunks[chunk].push(*task);
            }
            chunks
        })
        .collect();
    let launches = chunks.iter().map(Vec::len).max().unwrap_or(0);
    // Every rank takes part in every launch (with no task of its own: padding), so that the
    // launch serves the same ranks of the device as the group's other launches.
    (0..launches)
        .map(|k| {
            parts
                .iter()
                .zip(&chunks)
                .map(|(tasks, c)| (tasks[0], c.get(k).cloned().unwrap_or_default()))
                .collect()
        })
        .collect()
}

/// One launch serving `parts` (ranks of one device: a task of the rank, and the rank's tasks
/// in this launch, perhaps none).
fn run_launch(parts: &[(&Task, Vec<&Task>)]) -> Result<()> {
    let first = &parts[0].0.comm;
    let clique = &first.clique;
    for (rank, _) in parts {
        failure::check(&rank.comm)?;
    }
    let task_count = parts.iter().map(|p| p.1.len()).max().unwrap_or(1).max(1);
    let mut work = Vec::with_capacity(parts.len() * task_count);
    let mut units = 1u32;
    for (rank, tasks) in parts {
        let mut distinct: Vec<(usize, u32)> = Vec::new();
        for task in tasks {
            work.push(task.args()?);
            for channel in 0..channels_for(task.bytes) {
                if !distinct.contains(&(task.peer, channel)) {
                    distinct.push((task.peer, channel));
                }
            }
        }
        let pairs = rank.pairs.context().map(|c| c.address).unwrap_or(0);
        for _ in tasks.len()..task_count {
            work.push(PeerTask::padding(pairs));
        }
        units = units.max(distinct.len() as u32);
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
        streams: parts.iter().map(|p| p.0.stream).collect(),
        device: first.device,
        rank_ids: parts.iter().map(|p| p.0.comm.rank).collect(),
        instances: Vec::new(),
        clique_ranks: clique.nranks as u32,
        ranks_on_device: clique
            .devices
            .iter()
            .filter(|d| **d == first.device)
            .count() as u32,
    };
    let resources: Vec<_> = parts.iter().map(|p| &p.0.comm.resources).collect();
    crate::log!(
        Level::Info,
        Subsys::Coll,
        Some(first.rank),
        "launch: send/receive of {} task(s), kernel {}, {} blocks x {} threads; ranks {:?} on \
         device {}",
        parts.iter().map(|p| p.1.len()).sum::<usize>(),
        kernel.ptx_name(),
        plan.grid,
        plan.block,
        launch.rank_ids,
        launch.device
    );
    let prepared = clique.backend.prepare_launch(&launch, &resources)?;
    for (rank, _) in parts {
        rank.comm.lock().last_kernel = Some(kernel.ptx_name());
        rank.comm.launches.fetch_add(1, Ordering::Relaxed);
    }
    let end = clique.backend.run_launch(&launch, &resources, prepared);
    let marks = clique.backend.mark_launch(first.device, &launch.streams)?;
    for (rank, tasks) in parts {
        rank.pairs.note_launch(&marks);
        for task in tasks {
            task.window.note_launch(&marks);
        }
    }
    let end = match end {
        Ok(end) => end,
        Err(e) => {
            // The peers may wait for this launch: fail the communicator on every rank.
            let e = Error::new(
                e.code,
                format!(
                    "{}; a send/receive launch failed, so the communicator is failed on every \
                     rank",
                    e.message
                ),
            );
            for (rank, _) in parts {
                failure::fail(&rank.comm, &e);
            }
            return Err(e);
        }
    };
    if end == crate::backend::LaunchEnd::Completed {
        return Ok(());
    }
    let mut result = Ok(());
    for (rank, _) in parts {
        if let Err(e) = failure::check(&rank.comm) {
            rank.comm.set_last_error(&e.message);
            result = result.and(Err(e));
        }
    }
    result
}
