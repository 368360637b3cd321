//! Collectives: validation of a request against the communicator's windows, its plan, and its
//! execution (now, or at the end of the group, merged with the other ranks' parts).

use crate::abi::{symmDataTypeRaw, symmRedOpRaw};
use crate::agree::{Call, Signature};
use crate::comm::{Comm, windows};
use crate::error::{Error, Result};
use crate::launch::{InstanceId, Launch};
use crate::plan::{Collective, Limits, Plan, plan};
use crate::window::Window;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use symm_device::symmetric::batch::task_cells;
use symm_device::symmetric::{CollectiveArgs, FLAG_IN_PLACE, TaskArgs};
use symm_device::{DataType, RedOp};

/// A validated collective of one rank, ready to launch once its windows are complete.
pub struct Task {
    /// The rank that runs it.
    pub comm: Arc<Comm>,
    /// The window holding the send buffer.
    pub send_window: Arc<Window>,
    /// The window holding the receive buffer.
    pub recv_window: Arc<Window>,
    /// Kernel and shape.
    pub plan: Plan,
    /// Kernel arguments (flags: 0; this rank's flags are in `rank_flags`).
    pub args: CollectiveArgs,
    /// This rank's flags (`FLAG_IN_PLACE`).
    pub rank_flags: u32,
    /// The caller's stream, as an address.
    pub stream: u64,
    /// The collective.
    pub collective: Collective,
}

impl Task {
    /// `true` when the backend runs launches synchronously (the host backend), so independent
    /// launches of one group must run on separate threads.
    pub fn runs_to_completion(&self) -> bool {
        self.comm.clique.backend.kind() == crate::backend::BackendKind::Host
    }

    /// `true` when this rank's kernel reads the launch's send offset (an in-place all-gather
    /// derives its send buffer from the receive buffer).
    pub fn uses_send_offset(&self) -> bool {
        !(self.in_place() && self.collective == Collective::AllGather)
    }

    /// `true` when this rank's kernel reads the launch's receive offset (an in-place
    /// all-reduce or reduce-scatter derives its receive buffer from the send buffer).
    pub fn uses_recv_offset(&self) -> bool {
        !(self.in_place() && self.collective != Collective::AllGather)
    }

    fn in_place(&self) -> bool {
        self.rank_flags & FLAG_IN_PLACE != 0
    }

    /// Payload bytes of this rank's share (all-reduce: the whole buffer).
    fn share_bytes(&self) -> u64 {
        match self.collective {
            // All-gather counts bytes.
            Collective::AllGather => self.args.count,
            _ => self.args.count * self.plan.kernel.dtype.size_bytes() as u64,
        }
    }

    /// The address ranges of this rank's memory the task reads and writes, `(reads, writes)`
    /// (peers access the same offsets of the same windows, so these also stand for what the
    /// task does to peers' memory).
    pub fn footprint(&self) -> (Range<u64>, Range<u64>) {
        let share = self.share_bytes();
        let whole = share * self.comm.clique.nranks as u64;
        let send = self.send_window.base + self.args.send_offset;
        let recv = self.recv_window.base + self.args.recv_offset;
        let rank_share = self.comm.rank as u64 * share;
        match (self.collective, self.in_place()) {
            (Collective::AllReduce, true) => (send..send + share, send..send + share),
            (Collective::AllReduce, false) => (send..send + share, recv..recv + share),
            (Collective::AllGather, true) => (
                recv + rank_share..recv + rank_share + share,
                recv..recv + whole,
            ),
            (Collective::AllGather, false) => (send..send + share, recv..recv + whole),
            (Collective::ReduceScatter, true) => (
                send..send + whole,
                send + rank_share..send + rank_share + share,
            ),
            (Collective::ReduceScatter, false) => (send..send + whole, recv..recv + share),
        }
    }

    /// `true` when one of `self` and `other` writes memory the other reads or writes, so
    /// that they must run one after the other.
    pub fn conflicts_with(&self, other: &Task) -> bool {
        let overlap = |a: &Range<u64>, b: &Range<u64>| a.start < b.end && b.start < a.end;
        let (reads, writes) = self.footprint();
        let (other_reads, other_writes) = other.footprint();
        overlap(&writes, &other_reads)
            || overlap(&writes, &other_writes)
            || overlap(&reads, &other_writes)
    }
}

/// Number `call` as `comm`'s next collective and compare it with the peers' calls of that
/// number (this process's ranks, and those of other processes of this machine). A
/// disagreement fails the communicator ([`crate::comm::failure::fail`]) and is returned.
pub(crate) fn agree_call(comm: &Comm, call: &Call) -> Result<u64> {
    let seq = comm.next_collective.fetch_add(1, Ordering::Relaxed);
    let clique = &comm.clique;
    let checked = clique
        .calls
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .record(seq, comm.rank, call, clique.nranks, |r| {
            clique.devices[r] == crate::comm::REMOTE_DEVICE
        })
        .and_then(|()| match &comm.call_records {
            Some(records) => records.agree(seq, call),
            None => Ok(()),
        });
    if let Err(e) = checked {
        crate::comm::failure::fail(comm, &e);
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
    if crate::comm::failure::adopted(comm).is_some() || comm.clique.nranks == 1 {
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
            crate::comm::failure::fail(comm, &failed);
            failed
        }
        Ok(_) => error,
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
    if parts.is_empty() || parts[0].is_empty() {
        return Err(Error::internal("empty launch"));
    }
    let task_count = parts[0].len();
    if parts.iter().any(|tasks| tasks.len() != task_count) {
        return Err(Error::internal(
            "the ranks of a launch differ in their task counts",
        ));
    }
    for tasks in parts {
        crate::comm::failure::check(&tasks[0].comm)?;
    }
    let first = parts[0][0];
    let clique = &first.comm.clique;
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
    for (task, instance) in parts
        .iter()
        .flat_map(|tasks| tasks.iter())
        .zip(&launch.instances)
    {
        let signature = Signature {
            collective: task.collective,
            kernel: plan.kernel,
            count: task.args.count,
            grid: plan.grid,
        };
        let seq = agree_call(&task.comm, &Call::Made(signature))?;
        if seq != instance.seq {
            // The rank's calls are made by this thread alone (`Comm::enter_call`).
            let e = Error::internal(format!(
                "rank {}: collective numbered #{seq} while #{} was planned",
                task.comm.rank, instance.seq
            ));
            crate::comm::failure::fail(&task.comm, &e);
            return Err(e);
        }
    }
    if clique.debug {
        let bytes: u64 = parts[0].iter().map(|t| t.share_bytes()).sum();
        eprintln!(
            "symm INFO launch: {} of {} task(s) ({} B per rank), kernel {}, {} blocks x {} threads, \
             predicted {:.1} us; ranks {:?} on device {}",
            first.collective.name(),
            task_count,
            bytes,
            plan.kernel.ptx_name(),
            plan.grid,
            plan.block,
            plan.predicted_us,
            launch.rank_ids,
            launch.device
        );
    }
    for tasks in parts {
        let comm = &tasks[0].comm;
        comm.lock().last_kernel = Some(plan.kernel.ptx_name());
        comm.launches.fetch_add(1, Ordering::Relaxed);
    }
    if let Err(e) = clique.backend.run_launch(&launch, &resources, prepared) {
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
            crate::comm::failure::fail(&tasks[0].comm, &e);
        }
        return Err(e);
    }
    let mut result = Ok(());
    for tasks in parts {
        if let Err(e) = crate::comm::failure::check(&tasks[0].comm) {
            tasks[0].comm.set_last_error(&e.message);
            result = result.and(Err(e));
        }
    }
    result
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
                count: task.args.count,
                first_cell,
                flags: task.rank_flags,
                reserved: 0,
            });
            first_cell += task_cells(algorithm, element_bytes, task.args.count);
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

/// Decode a C `symmDataType_t`.
pub fn data_type(raw: symmDataTypeRaw) -> Result<DataType> {
    u32::try_from(raw)
        .ok()
        .and_then(DataType::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("datatype = {raw} is not a symmDataType_t")))
}

/// Decode a C `symmRedOp_t`.
pub fn red_op(raw: symmRedOpRaw) -> Result<RedOp> {
    u32::try_from(raw)
        .ok()
        .and_then(RedOp::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("op = {raw} is not a symmRedOp_t")))
}

/// Find the window of `name`'s buffer and check its alignment.
fn window_of(comm: &Comm, name: &str, address: u64, bytes: u64, align: u64) -> Result<Arc<Window>> {
    if address == 0 {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    let window = windows::find(comm, address, bytes)
        .ok_or_else(|| Error::invalid_argument(outside_windows(comm, name, address, bytes)))?;
    if !(address - window.base).is_multiple_of(align) {
        return Err(Error::invalid_argument(format!(
            "{name} is at offset {} of its window, not a multiple of the element size {align}",
            address - window.base
        )));
    }
    Ok(window)
}

/// Why `[address, +bytes)` is in no window of `comm`: it starts in a window and overruns it,
/// lies in a `symmMemAlloc` allocation outside every window, or is no memory of this comm.
fn outside_windows(comm: &Comm, name: &str, address: u64, bytes: u64) -> String {
    let state = comm.lock();
    if let Some(w) = state.windows.values().find(|w| w.contains(address, 1)) {
        let end = address.saturating_add(bytes);
        return format!(
            "{name} [{address:#x}, +{bytes} bytes) starts in the window registered at {:#x} \
             (+{} bytes) but overruns its end by {} bytes",
            w.base,
            w.size,
            end - (w.base + w.size)
        );
    }
    let allocation = state
        .allocations
        .range(..=address)
        .next_back()
        .filter(|(base, size)| address < **base + **size as u64);
    if let Some((base, size)) = allocation {
        let windows: Vec<String> = state
            .windows
            .values()
            .filter(|w| w.base >= *base && w.base < *base + *size as u64)
            .map(|w| format!("[{:#x}, +{})", w.base, w.size))
            .collect();
        let registered = if windows.is_empty() {
            "no window is registered in it".to_string()
        } else {
            format!("its registered windows are {}", windows.join(", "))
        };
        return format!(
            "{name} [{address:#x}, +{bytes} bytes) is inside the symmMemAlloc allocation at \
             {base:#x} (+{size} bytes) of this comm, but in none of its windows ({registered}): \
             register the range with symmCommWindowRegister"
        );
    }
    format!(
        "{name} = {address:#x} is not memory from symmMemAlloc on this comm (rank {}): \
         collective buffers must lie in windows registered with symmCommWindowRegister on the \
         comm of the call",
        comm.rank
    )
}

/// `count × element` bytes, also checked for overflow of the buffers' ends.
fn byte_count(count: usize, element: u64, name: &str, ends: &[u64]) -> Result<u64> {
    (count as u64)
        .checked_mul(element)
        .filter(|b| ends.iter().all(|e| e.checked_add(*b).is_some()))
        .ok_or_else(|| {
            Error::invalid_argument(format!("{name} = {count}: the buffers would overflow"))
        })
}

fn overlap(a: u64, a_bytes: u64, b: u64, b_bytes: u64) -> bool {
    a < b + b_bytes && b < a + a_bytes
}

/// A validated request of one rank, before planning.
pub struct Request {
    collective: Collective,
    dtype: DataType,
    op: RedOp,
    /// Elements the plan is for (all-reduce: total; others: per rank).
    count: u64,
    send_window: Arc<Window>,
    recv_window: Arc<Window>,
    args: CollectiveArgs,
    /// This rank's flags.
    rank_flags: u32,
}

/// A planned call, ready to run now or at the group's end (the caller decides: `group`).
pub enum Prepared {
    /// A call of count 0: nothing to launch, but still the rank's next collective (a peer that
    /// made another call under its number must not pair it with a later one).
    Empty(Call),
    /// A task to launch.
    Task(Task),
}

/// Plan `request` of `comm` on `stream`. A failed communicator refuses every call first,
/// before anything is planned or numbered.
pub fn prepare(comm: &Arc<Comm>, request: Request, stream: u64) -> Result<Prepared> {
    crate::comm::failure::check(comm)?;
    let forced = comm
        .clique
        .forced_algorithm
        .and_then(|forced| request.collective.resolve_forced(forced));
    let limits = Limits {
        max_blocks: comm.max_blocks,
        forced,
    };
    let plan = plan(
        request.collective,
        request.dtype,
        request.op,
        request.count,
        comm.clique.nranks as u32,
        comm.clique.backend.kind(),
        limits,
    )?;
    if comm.clique.debug {
        eprintln!(
            "symm INFO rank {}: {} {} x {:?} {:?} ({} B) -> {}, {} blocks x {} threads, predicted {:.1} us",
            comm.rank,
            request.collective.name(),
            request.count,
            request.dtype,
            request.op,
            request.count * request.dtype.size_bytes() as u64,
            plan.kernel.algorithm.name(),
            plan.grid,
            plan.block,
            plan.predicted_us
        );
    }
    if request.args.count == 0 {
        return Ok(Prepared::Empty(Call::Made(Signature {
            collective: request.collective,
            kernel: plan.kernel,
            count: 0,
            grid: plan.grid,
        })));
    }
    Ok(Prepared::Task(Task {
        comm: comm.clone(),
        send_window: request.send_window,
        recv_window: request.recv_window,
        plan,
        args: request.args,
        rank_flags: request.rank_flags,
        stream,
        collective: request.collective,
    }))
}

/// "symmAllReduce of 1024 x Float32": a call as another thread's refusal names it.
pub fn describe(name: &str, count: usize, datatype: symmDataTypeRaw) -> String {
    match data_type(datatype) {
        Ok(dtype) => format!("{name} of {count} x {dtype:?}"),
        Err(_) => format!("{name} of {count} x (datatype {datatype})"),
    }
}

/// Validate `symmAllReduce`'s arguments against `comm`'s windows.
pub fn all_reduce(
    comm: &Comm,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
) -> Result<Request> {
    let dtype = data_type(datatype)?;
    let op = red_op(op)?;
    let element = dtype.size_bytes() as u64;
    let bytes = byte_count(count, element, "count", &[send, recv])?;
    let send_window = window_of(comm, "sendbuff", send, bytes, element)?;
    let recv_window = window_of(comm, "recvbuff", recv, bytes, element)?;
    let in_place = send == recv;
    if !in_place && overlap(send, bytes, recv, bytes) {
        return Err(Error::invalid_argument(
            "sendbuff and recvbuff overlap without being equal (in place needs sendbuff == recvbuff)",
        ));
    }
    let args = CollectiveArgs {
        send_offset: send - send_window.base,
        recv_offset: recv - recv_window.base,
        count: count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::AllReduce,
        dtype,
        op,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags: if in_place { FLAG_IN_PLACE } else { 0 },
    })
}

/// Which buffer of an all-gather or reduce-scatter holds one rank's share (the other holds
/// all ranks' shares).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Segment {
    /// All-gather: the send buffer is the share, the receive buffer the whole.
    Send,
    /// Reduce-scatter: the receive buffer is the share, the send buffer the whole.
    Recv,
}

/// The windows of an all-gather's or reduce-scatter's buffers, `(send, recv)`: the share is
/// `bytes`, the whole `nranks × bytes`; they may overlap only when the share is this rank's
/// part of the whole (in place).
fn segment_and_whole(
    comm: &Comm,
    segment: Segment,
    send: u64,
    recv: u64,
    bytes: u64,
    element: u64,
) -> Result<(Arc<Window>, Arc<Window>)> {
    let (share, whole, share_name, whole_name, count_name) = match segment {
        Segment::Send => (send, recv, "sendbuff", "recvbuff", "sendcount"),
        Segment::Recv => (recv, send, "recvbuff", "sendbuff", "recvcount"),
    };
    let total = bytes
        .checked_mul(comm.clique.nranks as u64)
        .filter(|t| whole.checked_add(*t).is_some())
        .ok_or_else(|| {
            Error::invalid_argument(format!("{count_name} × nranks: the buffers would overflow"))
        })?;
    let (send_bytes, recv_bytes) = match segment {
        Segment::Send => (bytes, total),
        Segment::Recv => (total, bytes),
    };
    let send_window = window_of(comm, "sendbuff", send, send_bytes, element)?;
    let recv_window = window_of(comm, "recvbuff", recv, recv_bytes, element)?;
    if share != whole + comm.rank as u64 * bytes && overlap(share, bytes, whole, total) {
        return Err(Error::invalid_argument(format!(
            "{share_name} overlaps {whole_name} without being this rank's segment (in place \
             needs {share_name} == {whole_name} + rank × {count_name})"
        )));
    }
    Ok((send_window, recv_window))
}

/// `symmAllGather`: `sendcount` elements from every rank, rank `r`'s at `recvbuff + r·sendcount`.
/// Validate `symmAllGather`'s arguments against `comm`'s windows.
pub fn all_gather(
    comm: &Comm,
    send: u64,
    recv: u64,
    sendcount: usize,
    datatype: symmDataTypeRaw,
) -> Result<Request> {
    let dtype = data_type(datatype)?;
    let element = dtype.size_bytes() as u64;
    let bytes = byte_count(sendcount, element, "sendcount", &[send])?;
    let (send_window, recv_window) =
        segment_and_whole(comm, Segment::Send, send, recv, bytes, element)?;
    let in_place = send == recv + comm.rank as u64 * bytes;
    let args = CollectiveArgs {
        // In place, the kernel finds the send buffer from the receive buffer and the rank.
        send_offset: if in_place { 0 } else { send - send_window.base },
        recv_offset: recv - recv_window.base,
        count: bytes,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::AllGather,
        dtype,
        op: RedOp::Sum,
        count: sendcount as u64,
        send_window,
        recv_window,
        args,
        rank_flags: if in_place { FLAG_IN_PLACE } else { 0 },
    })
}

/// `symmReduceScatter`: rank `r` receives the reduction of segment `r` (`recvcount` elements)
/// of every rank's send buffer.
/// Validate `symmReduceScatter`'s arguments against `comm`'s windows.
pub fn reduce_scatter(
    comm: &Comm,
    send: u64,
    recv: u64,
    recvcount: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
) -> Result<Request> {
    let dtype = data_type(datatype)?;
    let op = red_op(op)?;
    let element = dtype.size_bytes() as u64;
    let bytes = byte_count(recvcount, element, "recvcount", &[recv])?;
    let (send_window, recv_window) =
        segment_and_whole(comm, Segment::Recv, send, recv, bytes, element)?;
    let in_place = recv == send + comm.rank as u64 * bytes;
    let args = CollectiveArgs {
        send_offset: send - send_window.base,
        // In place, the kernel finds the receive buffer from the send buffer and the rank.
        recv_offset: if in_place { 0 } else { recv - recv_window.base },
        count: recvcount as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::ReduceScatter,
        dtype,
        op,
        count: recvcount as u64,
        send_window,
        recv_window,
        args,
        rank_flags: if in_place { FLAG_IN_PLACE } else { 0 },
    })
}
