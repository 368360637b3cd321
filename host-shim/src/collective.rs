//! Collectives: validation of a request against the communicator's windows, its plan, and its
//! execution (now, or at the end of the group, merged with the other ranks' parts).

use crate::backend::schedule::InstanceId;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::ffi::types::{symmDataTypeRaw, symmRedOpRaw, symmResult_t};
use crate::group::{self, Deferred};
use crate::plan::{Collective, KernelId, Launch, Limits, Plan, plan};
use crate::window::{self, Window};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use symm_device::symmetric::batch::task_cells;
use symm_device::symmetric::dispatch::Algorithm;
use symm_device::symmetric::{ABORT_INVALID_LAUNCH, CollectiveArgs, FLAG_IN_PLACE, TaskArgs};
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

/// What the `k`-th collective of every rank of a communicator must agree on: checked between
/// the ranks of this process (one thread per rank, or a group driving some of them) before a
/// launch, so that a rank that calls another collective, type, operator or count than its
/// peers is refused instead of exchanging data with them under wrong assumptions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    collective: Collective,
    kernel: KernelId,
    /// The kernel's count argument (elements; bytes for all-gather).
    count: u64,
    grid: u32,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.collective {
            Collective::AllReduce => "symmAllReduce",
            Collective::AllGather => "symmAllGather",
            Collective::ReduceScatter => "symmReduceScatter",
        };
        // All-gather kernels count bytes.
        let elements = match self.collective {
            Collective::AllGather => self.count / self.kernel.dtype.size_bytes() as u64,
            _ => self.count,
        };
        write!(f, "{name} of {elements} x {:?}", self.kernel.dtype)?;
        if self.collective != Collective::AllGather {
            write!(f, " {:?}", self.kernel.op)?;
        }
        write!(
            f,
            " ({}, {} blocks)",
            self.kernel.algorithm.name(),
            self.grid
        )
    }
}

impl Signature {
    /// Words of [`Signature::to_words`].
    pub(crate) const WORDS: usize = 2;

    /// The signature as plain words, for ranks of other processes to read
    /// ([`crate::call_records`]): collective, algorithm, type, operator and grid; the count.
    pub(crate) fn to_words(&self) -> [u64; Self::WORDS] {
        let collective = Collective::ALL
            .iter()
            .position(|c| *c == self.collective)
            .unwrap_or(0) as u64;
        let algorithm = Algorithm::ALL
            .iter()
            .position(|a| *a == self.kernel.algorithm)
            .unwrap_or(0) as u64;
        [
            collective
                | algorithm << 8
                | (self.kernel.dtype as u64) << 16
                | (self.kernel.op as u64) << 24
                | (self.grid as u64) << 32,
            self.count,
        ]
    }

    /// The signature of [`Signature::to_words`]'s `words`, if they name one.
    pub(crate) fn from_words(words: [u64; Self::WORDS]) -> Option<Signature> {
        let field = |shift: u32| ((words[0] >> shift) & 0xFF) as usize;
        Some(Signature {
            collective: *Collective::ALL.get(field(0))?,
            kernel: KernelId {
                algorithm: *Algorithm::ALL.get(field(8))?,
                dtype: DataType::from_raw(field(16) as u32)?,
                op: RedOp::from_raw(field(24) as u32)?,
            },
            count: words[1],
            grid: (words[0] >> 32) as u32,
        })
    }
}

/// The signatures of the collectives in flight of a clique's ranks in this process, by call
/// number, and the last disagreement found (named again by the peer's timeout).
#[derive(Default)]
pub struct CallLog {
    calls: BTreeMap<u64, Vec<Option<Signature>>>,
    mismatch: Option<String>,
}

/// Most call numbers kept waiting for a rank that never calls (one that left, or lives in
/// another process, where the check does not reach).
const CALL_LOG_ENTRIES: usize = 256;

/// "rank A's collective #k is X, but rank B's is Y: ...": two ranks' different calls under
/// one number (this process's ranks here, ranks of other processes in `crate::call_records`).
pub(crate) fn mismatch_message(
    seq: u64,
    rank: usize,
    own: &Signature,
    peer: usize,
    theirs: &Signature,
) -> String {
    format!(
        "rank {rank}'s collective #{seq} is {own}, but rank {peer}'s is {theirs}: every rank must \
         make the same collective calls, with the same count, in the same order"
    )
}

/// Record that `rank`'s collective number `seq` is `signature`; an error naming both calls when
/// a rank of this process made another call under that number.
fn agree(comm: &Comm, seq: u64, signature: &Signature) -> Result<()> {
    let clique = &comm.clique;
    let mut log = clique.calls.lock().unwrap_or_else(|e| e.into_inner());
    let entry = log
        .calls
        .entry(seq)
        .or_insert_with(|| vec![None; clique.nranks]);
    let conflict = entry.iter().enumerate().find_map(|(r, theirs)| {
        theirs
            .as_ref()
            .filter(|theirs| r != comm.rank && *theirs != signature)
            .map(|theirs| (r, theirs.clone()))
    });
    if let Some((other, theirs)) = conflict {
        let message = format!(
            "{}; rank {}'s call was refused (nothing was exchanged) and rank {other}'s times out",
            mismatch_message(seq, comm.rank, signature, other, &theirs),
            comm.rank
        );
        log.mismatch = Some(message.clone());
        return Err(Error::invalid_usage(message));
    }
    entry[comm.rank] = Some(signature.clone());
    if entry.iter().all(Option::is_some) {
        log.calls.remove(&seq);
    }
    while log.calls.len() > CALL_LOG_ENTRIES {
        log.calls.pop_first();
    }
    Ok(())
}

/// Launch `parts` as one launch with `plan`: `parts[i]` is the `i`-th served rank's tasks (one
/// device, distinct ranks), in batch order; the `t`-th task of every rank is one collective
/// (checked to agree). An unfused call is one rank's one task with its own plan. A timed-out
/// peer is reported as `symmTimeout` (host backend: of this call; cuda: of a later one, when
/// the kernel has run).
pub fn execute(parts: &[Vec<&Task>], plan: &Plan) -> Result<()> {
    let first = parts
        .first()
        .and_then(|tasks| tasks.first())
        .ok_or_else(|| Error::internal("empty launch"))?;
    let task_count = parts[0].len();
    if parts.iter().any(|tasks| tasks.len() != task_count) {
        return Err(Error::internal(
            "the ranks of a launch differ in their task counts",
        ));
    }
    for tasks in parts {
        check_not_aborted(&tasks[0].comm)?;
    }
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
    let launch = Launch {
        kernel: plan.kernel,
        grid: plan.grid,
        block: plan.block,
        tasks: work,
        task_count: task_count as u32,
        table,
        streams: parts.iter().map(|tasks| tasks[0].stream).collect(),
        device: first.comm.device,
        rank_ids: parts.iter().map(|tasks| tasks[0].comm.rank).collect(),
        instances: parts
            .iter()
            .flat_map(|tasks| tasks.iter())
            .map(|t| InstanceId {
                clique: Arc::as_ptr(&t.comm.clique) as usize,
                // Numbered when launched, so that refused calls (a refused group) take no
                // number.
                seq: t.comm.next_collective.fetch_add(1, Ordering::Relaxed),
            })
            .collect(),
        clique_ranks: clique.nranks as u32,
        ranks_on_device: clique
            .devices
            .iter()
            .filter(|d| **d == first.comm.device)
            .count() as u32,
    };
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
        agree(&task.comm, instance.seq, &signature)?;
        if let Some(records) = &task.comm.call_records {
            records.agree(instance.seq, &signature)?;
        }
    }
    for tasks in parts {
        let comm = &tasks[0].comm;
        comm.lock().last_kernel = Some(plan.kernel.ptx_name());
        comm.launches.fetch_add(1, Ordering::Relaxed);
    }
    let resources: Vec<_> = parts.iter().map(|t| &t[0].comm.resources).collect();
    clique.backend.launch(&launch, &resources)?;
    let mut result = Ok(());
    for tasks in parts {
        if let Err(e) = check_not_aborted(&tasks[0].comm) {
            tasks[0].comm.set_last_error(&e.message);
            result = result.and(Err(e));
        }
    }
    result
}

/// The communicator's state after a timed-out wait or a refused launch: the first call that
/// sees a raised abort word gets `symmTimeout` (a peer did not arrive) or `symmInternalError`
/// (a kernel refused its launch); later calls are refused. After the device reported a failure
/// of queued work (a trapped or faulting kernel, an unusable context), this call and every
/// later one fail with that error (`symmUnhandledCudaError`).
pub fn check_not_aborted(comm: &Comm) -> Result<()> {
    let mut state = comm.lock();
    if let Some(error) = &state.device_error {
        return Err(error.clone());
    }
    if let Some(reason) = &state.aborted {
        return Err(Error::invalid_usage(format!(
            "the communicator was aborted ({reason}); destroy it"
        )));
    }
    let word = state
        .windows
        .values()
        .map(|w| w.abort_word())
        .max()
        .unwrap_or(0);
    if word != 0 {
        let (code, message) = if word == ABORT_INVALID_LAUNCH {
            (
                symmResult_t::symmInternalError,
                format!(
                    "rank {}: kernel {} refused its launch (ABORT_INVALID_LAUNCH: launch shape \
                     or arguments outside the kernel's limits; nothing was written); this \
                     communicator is aborted",
                    comm.rank,
                    state.last_kernel.as_deref().unwrap_or("(unknown)")
                ),
            )
        } else {
            let in_process = comm
                .clique
                .calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .mismatch
                .clone();
            // A rank of another process that made another call under a number this rank
            // launched (see `crate::call_records`).
            let mismatch = in_process
                .or_else(|| {
                    comm.call_records.as_ref().and_then(|records| {
                        records.recent_conflict(comm.next_collective.load(Ordering::Relaxed))
                    })
                })
                .map(|m| format!(" ({m})"))
                .unwrap_or_default();
            (
                symmResult_t::symmTimeout,
                format!(
                    "rank {}: a peer did not arrive within {} ms (ABORT_TIMED_OUT); this \
                     communicator is aborted{mismatch}",
                    comm.rank,
                    comm.clique.timeout.as_millis()
                ),
            )
        };
        state.aborted = Some(message.clone());
        state.abort_code = Some(code);
        return Err(Error::new(code, message));
    }
    if let Some(error) = comm.clique.backend.async_error(&comm.resources) {
        let error = Error::new(
            error.code,
            format!(
                "rank {}: {}; destroy the communicator",
                comm.rank, error.message
            ),
        );
        state.device_error = Some(error.clone());
        return Err(error);
    }
    Ok(())
}

/// `symmCommGetAsyncError`: the communicator's asynchronous error, if any — `symmTimeout`
/// once a peer timed out, `symmInternalError` once a kernel refused its launch (also on later
/// queries), the device's error once queued work failed.
pub fn async_error(comm: &Comm) -> Option<Error> {
    let error = check_not_aborted(comm).err()?;
    let state = comm.lock();
    Some(match (&state.device_error, &state.aborted) {
        (Some(device), _) => device.clone(),
        (None, Some(reason)) => Error::new(
            state.abort_code.unwrap_or(symmResult_t::symmTimeout),
            reason.clone(),
        ),
        (None, None) => error,
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
    let window = window::find(comm, address, bytes).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{name} [{address:#x}, +{bytes} bytes) is not inside a window registered on this \
             comm with SYMM_WIN_COLL_SYMMETRIC"
        ))
    })?;
    if !(address - window.base).is_multiple_of(align) {
        return Err(Error::invalid_argument(format!(
            "{name} is at offset {} of its window, not a multiple of the element size {align}",
            address - window.base
        )));
    }
    Ok(window)
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

/// A validated request, before planning.
struct Request {
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

fn submit(comm: &Arc<Comm>, request: Request, stream: u64) -> Result<()> {
    // A call that `execute`s at once is checked there; a deferred one (group) or a no-op
    // (count 0) is checked here, when the call is made.
    if group::active() || request.args.count == 0 {
        check_not_aborted(comm)?;
    }
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
        return Ok(());
    }
    let task = Task {
        comm: comm.clone(),
        send_window: request.send_window,
        recv_window: request.recv_window,
        plan,
        args: request.args,
        rank_flags: request.rank_flags,
        stream,
        collective: request.collective,
    };
    if group::active() {
        group::defer(Deferred::Collective(task));
        Ok(())
    } else {
        let plan = task.plan;
        execute(&[vec![&task]], &plan)
    }
}

/// `symmAllReduce`.
#[allow(clippy::too_many_arguments)]
pub fn all_reduce(
    comm: &Arc<Comm>,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    stream: u64,
) -> Result<()> {
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
    let request = Request {
        collective: Collective::AllReduce,
        dtype,
        op,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags: if in_place { FLAG_IN_PLACE } else { 0 },
    };
    submit(comm, request, stream)
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
pub fn all_gather(
    comm: &Arc<Comm>,
    send: u64,
    recv: u64,
    sendcount: usize,
    datatype: symmDataTypeRaw,
    stream: u64,
) -> Result<()> {
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
    let request = Request {
        collective: Collective::AllGather,
        dtype,
        op: RedOp::Sum,
        count: sendcount as u64,
        send_window,
        recv_window,
        args,
        rank_flags: if in_place { FLAG_IN_PLACE } else { 0 },
    };
    submit(comm, request, stream)
}

/// `symmReduceScatter`: rank `r` receives the reduction of segment `r` (`recvcount` elements)
/// of every rank's send buffer.
#[allow(clippy::too_many_arguments)]
pub fn reduce_scatter(
    comm: &Arc<Comm>,
    send: u64,
    recv: u64,
    recvcount: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    stream: u64,
) -> Result<()> {
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
    let request = Request {
        collective: Collective::ReduceScatter,
        dtype,
        op,
        count: recvcount as u64,
        send_window,
        recv_window,
        args,
        rank_flags: if in_place { FLAG_IN_PLACE } else { 0 },
    };
    submit(comm, request, stream)
}
