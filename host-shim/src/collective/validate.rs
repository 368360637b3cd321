//! Validation of a collective call against the communicator's windows: buffers inside
//! registered windows, aligned, counts that do not overflow, overlaps only in place; the
//! result is a [`Request`] that `prepare` plans.

use crate::abi::{symmDataTypeRaw, symmRedOpRaw};
use crate::comm::{Comm, windows};
use crate::error::{Error, Result};
use crate::plan::Collective;
use crate::plan::staging::Copies;
use crate::window::Window;
use std::ffi::c_int;
use std::sync::Arc;
use symm_device::symmetric::{CollectiveArgs, FLAG_IN_PLACE, FLAG_REDUCE_TO_ROOT, FLAG_ROOT};
use symm_device::{DataType, RedOp};

/// A validated request of one rank, before planning.
pub struct Request {
    pub(super) collective: Collective,
    pub(super) dtype: DataType,
    pub(super) op: RedOp,
    /// Elements the plan is for (all-reduce: total; broadcast: the root's; others: per rank).
    pub(super) count: u64,
    pub(super) send_window: Arc<Window>,
    pub(super) recv_window: Arc<Window>,
    pub(super) args: CollectiveArgs,
    /// This rank's flags.
    pub(super) rank_flags: u32,
    /// The broadcast's root (0 for the other collectives).
    pub(super) root: u32,
    /// All-to-all-v: its count table and send capacity.
    pub(super) counts: Option<CountTable>,
    /// A chunk of a staged call: its copies into and out of the staging window.
    pub(super) staged: Option<Copies>,
}

impl Request {
    /// This request (on the staging window's buffers) as a chunk of a staged call.
    pub(crate) fn staged(self, copies: Copies) -> Request {
        Request {
            staged: Some(copies),
            ..self
        }
    }
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

/// The window of `name`'s buffer `[address, + bytes)`, which must be at a multiple of `align`
/// in it.
pub(crate) fn buffer_window(
    comm: &Comm,
    name: &str,
    address: u64,
    bytes: u64,
    align: u64,
) -> Result<Arc<Window>> {
    window_of(comm, name, address, bytes, align)
}

/// Find the window of `name`'s buffer and check its alignment.
fn window_of(comm: &Comm, name: &str, address: u64, bytes: u64, align: u64) -> Result<Arc<Window>> {
    if address == 0 {
        return Err(Error::invalid_argument(format!("{name} is NULL")));
    }
    let window = windows::find(comm, address, bytes)
        .ok_or_else(|| Error::invalid_argument(outside_windows(comm, name, address, bytes)))?;
    let tag = window
        .context()
        .map_or(window.owner.kind.backend_tag() as u32, |c| c.host.backend);
    if tag != symm_device::BackendTag::Native as u32 {
        let (engine, option) = if tag == symm_device::BackendTag::Nccl as u32 {
            ("NCCL", "nccl")
        } else {
            ("NVSHMEM", "nvshmem")
        };
        return Err(Error::invalid_usage(format!(
            "{name} lies in the window at {:#x}, an {engine} engine window (some rank has \
             peers reachable only through {engine}): symm's collectives need every peer \
             reachable by loads and stores; on this window only device functions linked with \
             the engine run (symm.triton with engines=(\"{option}\",))",
            window.base
        )));
    }
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
    if let Some(w) = state
        .windows
        .values()
        .find(|w| w.contains(address, 1) && state.is_internal(w))
    {
        return format!(
            "{name} [{address:#x}, +{bytes} bytes) lies in the communicator's own window at \
             {:#x} (its point-to-point window), which no call may name",
            w.base
        );
    }
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
        .filter(|(base, a)| address < **base + a.size as u64)
        .map(|(base, a)| (base, a.size));
    if let Some((base, size)) = allocation {
        let windows: Vec<String> = state
            .windows
            .values()
            .filter(|w| w.base >= *base && w.base < *base + size as u64)
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
         this call's buffers must lie in windows registered with symmCommWindowRegister on the \
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
    crate::window::ranges_overlap(
        &(a..a.saturating_add(a_bytes)),
        &(b..b.saturating_add(b_bytes)),
    )
}

/// "symmAlltoAllvDevice of Float32 (sendcount 60, recvcount 64)": an all-to-all-v as another
/// thread's refusal names it (see [`describe`]).
pub fn describe_all_to_all_v(
    sendcount: usize,
    recvcount: usize,
    datatype: symmDataTypeRaw,
) -> String {
    let counts = format!("sendcount {sendcount}, recvcount {recvcount}");
    match data_type(datatype) {
        Ok(dtype) => format!("symmAlltoAllvDevice of {dtype:?} ({counts})"),
        Err(_) => format!("symmAlltoAllvDevice of (datatype {datatype}) ({counts})"),
    }
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
        root: 0,
        counts: None,
        staged: None,
    })
}

/// Validate `symmReduce`'s arguments against `comm`'s windows: the reduction of every rank's
/// `count` elements of `sendbuff` lands in `recvbuff` of the root. `root` is checked first;
/// `sendbuff` lies at the same offset of the same window on every rank (the root reads it);
/// `recvbuff` is checked only on the root (the other ranks' is not used, as in NCCL, and may
/// be NULL), where it may equal `sendbuff` (in place) but not overlap it otherwise. Every rank
/// carries `FLAG_REDUCE_TO_ROOT`: the one-shot all-reduce kernel runs it.
pub fn reduce(
    comm: &Comm,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    op: symmRedOpRaw,
    root: c_int,
) -> Result<Request> {
    let root = root_rank(comm, root)?;
    let dtype = data_type(datatype)?;
    let op = red_op(op)?;
    let element = dtype.size_bytes() as u64;
    let is_root = comm.rank == root as usize;
    let ends: &[u64] = if is_root { &[send, recv] } else { &[send] };
    let bytes = byte_count(count, element, "count", ends)?;
    let send_window = window_of(comm, "sendbuff", send, bytes, element)?;
    let (recv_window, recv_offset, rank_flags) = root_receive(
        comm,
        is_root,
        (send, bytes, &send_window),
        (recv, || Ok(bytes), recv),
        element,
        "sendbuff and recvbuff overlap on the root without being equal (in place needs \
         sendbuff == recvbuff)",
    )?;
    let args = CollectiveArgs {
        send_offset: send - send_window.base,
        recv_offset,
        count: count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::Reduce,
        dtype,
        op,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags: rank_flags | FLAG_REDUCE_TO_ROOT,
        root,
        counts: None,
        staged: None,
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

/// Validate `symmAllGather`'s arguments against `comm`'s windows: `sendcount` elements from
/// every rank, rank `r`'s at `recvbuff + r·sendcount`.
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
        count: sendcount as u64,
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
        root: 0,
        counts: None,
        staged: None,
    })
}

/// Validate `symmReduceScatter`'s arguments against `comm`'s windows: rank `r` receives the
/// reduction of segment `r` (`recvcount` elements) of every rank's send buffer.
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
        root: 0,
        counts: None,
        staged: None,
    })
}

/// Validate `symmBroadcast`'s arguments against `comm`'s windows: the root's `count` elements of
/// `sendbuff` land in `recvbuff` of every rank. `root` is checked first (every rank knows the
/// rank count); `sendbuff` only on the root (the other ranks' is ignored, as in NCCL, and may
/// be NULL), where it may equal `recvbuff` (in place) but not overlap it otherwise.
pub fn broadcast(
    comm: &Comm,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    root: c_int,
) -> Result<Request> {
    let root = root_rank(comm, root)?;
    let dtype = data_type(datatype)?;
    let element = dtype.size_bytes() as u64;
    let is_root = comm.rank == root as usize;
    let ends: &[u64] = if is_root { &[send, recv] } else { &[recv] };
    let bytes = byte_count(count, element, "count", ends)?;
    let recv_window = window_of(comm, "recvbuff", recv, bytes, element)?;
    let (send_window, send_offset, rank_flags) = if is_root {
        let send_window = window_of(comm, "sendbuff", send, bytes, element)?;
        let in_place = send == recv;
        if !in_place && overlap(send, bytes, recv, bytes) {
            return Err(Error::invalid_argument(
                "sendbuff and recvbuff overlap on the root without being equal (in place needs \
                 sendbuff == recvbuff)",
            ));
        }
        if in_place {
            // In place, the kernel finds the root's data in its receive buffer.
            (recv_window.clone(), 0, FLAG_ROOT | FLAG_IN_PLACE)
        } else {
            (send_window.clone(), send - send_window.base, FLAG_ROOT)
        }
    } else {
        // Not the root: no send buffer; the kernel reads nothing of this rank.
        (recv_window.clone(), 0, 0)
    };
    let args = CollectiveArgs {
        send_offset,
        recv_offset: recv - recv_window.base,
        count: count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::Broadcast,
        dtype,
        op: RedOp::Sum,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags,
        root,
        counts: None,
        staged: None,
    })
}

/// The receive buffer of a reduce or gather, which only the root's kernel writes: on the root,
/// `recv` (its size from `recv_bytes`, checked only there) must lie in a window and may hold
/// the send buffer `(send, send_bytes)` only at `in_place_at` (else `overlapping` is the
/// error); off the root it is not used (NULL allowed) and the send window stands in.
/// Returns the window, the offset in it and this rank's flags.
fn root_receive(
    comm: &Comm,
    is_root: bool,
    (send, send_bytes, send_window): (u64, u64, &Arc<Window>),
    (recv, recv_bytes, in_place_at): (u64, impl FnOnce() -> Result<u64>, u64),
    element: u64,
    overlapping: &str,
) -> Result<(Arc<Window>, u64, u32)> {
    if !is_root {
        // Not the root: no receive buffer; the kernel writes nothing of this rank.
        return Ok((send_window.clone(), 0, 0));
    }
    let recv_bytes = recv_bytes()?;
    let recv_window = window_of(comm, "recvbuff", recv, recv_bytes, element)?;
    let in_place = send == in_place_at;
    if !in_place && overlap(send, send_bytes, recv, recv_bytes) {
        return Err(Error::invalid_argument(overlapping.to_string()));
    }
    let offset = recv - recv_window.base;
    let flags = FLAG_ROOT | if in_place { FLAG_IN_PLACE } else { 0 };
    Ok((recv_window, offset, flags))
}

/// `root` as a rank of `comm`, or the error naming it.
fn root_rank(comm: &Comm, root: c_int) -> Result<u32> {
    let nranks = comm.clique.nranks;
    u32::try_from(root)
        .ok()
        .filter(|r| (*r as usize) < nranks)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "root = {root} is not a rank of this comm (it has {nranks} ranks: 0 to {})",
                nranks - 1
            ))
        })
}

/// `nranks × bytes`, checked against the overflow of `end`'s buffer.
fn whole_bytes(comm: &Comm, bytes: u64, end: u64, count_name: &str) -> Result<u64> {
    bytes
        .checked_mul(comm.clique.nranks as u64)
        .filter(|t| end.checked_add(*t).is_some())
        .ok_or_else(|| {
            Error::invalid_argument(format!("{count_name} × nranks: the buffers would overflow"))
        })
}

/// Validate `symmAlltoAll`'s arguments against `comm`'s windows: segment `p` (`count` elements)
/// of every rank's `sendbuff` lands in segment `r` of rank `p`'s `recvbuff`, `r` the sender.
/// `recvbuff` lies at the same offset of the same window on every rank (peers store into it);
/// `sendbuff` anywhere in a window. The two may not overlap: all-to-all has no in-place form.
pub fn all_to_all(
    comm: &Comm,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
) -> Result<Request> {
    let dtype = data_type(datatype)?;
    let element = dtype.size_bytes() as u64;
    let bytes = byte_count(count, element, "count", &[send, recv])?;
    let total = whole_bytes(comm, bytes, send.max(recv), "count")?;
    let send_window = window_of(comm, "sendbuff", send, total, element)?;
    let recv_window = window_of(comm, "recvbuff", recv, total, element)?;
    if overlap(send, total, recv, total) {
        return Err(Error::invalid_argument(
            "sendbuff and recvbuff overlap (symmAlltoAll has no in-place form: the buffers must \
             be disjoint)",
        ));
    }
    let args = CollectiveArgs {
        send_offset: send - send_window.base,
        recv_offset: recv - recv_window.base,
        count: count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::AllToAll,
        dtype,
        op: RedOp::Sum,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags: 0,
        root: 0,
        counts: None,
        staged: None,
    })
}

/// An all-to-all-v's count table and the capacity of its send buffer (the receive buffer's is
/// the call's count): what every rank's kernel assumes of every rank (see
/// `symm_device::symmetric::all_to_all_v`).
#[derive(Clone)]
pub struct CountTable {
    /// The window holding the table.
    pub window: Arc<Window>,
    /// Byte offset of the table in its window (the same on every rank).
    pub offset: u64,
    /// Elements of the send buffer (the same on every rank).
    pub send_count: u64,
}

/// Validate `symmAlltoAllvDevice`'s arguments against `comm`'s windows: `sendcount` and
/// `recvcount` are the capacities, in elements, of every rank's `sendbuff` and `recvbuff` (the
/// bounds the kernel holds the counts to); `counts` is the count table, `3 × nranks` `int64_t`
/// (row 0 read, rows 1 and 2 written by the kernel). `recvbuff` and `counts` lie at the same
/// offsets of the same windows on every rank (peers store into the one and read the other);
/// `sendbuff` anywhere in a window. No two of the three may overlap.
pub fn all_to_all_v(
    comm: &Comm,
    (send, send_count): (u64, usize),
    (recv, recv_count): (u64, usize),
    counts: u64,
    datatype: symmDataTypeRaw,
) -> Result<Request> {
    let dtype = data_type(datatype)?;
    let element = dtype.size_bytes() as u64;
    let send_bytes = byte_count(send_count, element, "sendcount", &[send])?;
    let recv_bytes = byte_count(recv_count, element, "recvcount", &[recv])?;
    let send_window = window_of(comm, "sendbuff", send, send_bytes.max(1), element)?;
    let recv_window = window_of(comm, "recvbuff", recv, recv_bytes.max(1), element)?;
    let table_bytes =
        symm_device::symmetric::all_to_all_v::TABLE_ROWS * 8 * comm.clique.nranks as u64;
    let table_window = window_of(comm, "counts", counts, table_bytes, 8)?;
    for (a, a_bytes, b, b_bytes, what) in [
        (send, send_bytes, recv, recv_bytes, "sendbuff and recvbuff"),
        (counts, table_bytes, recv, recv_bytes, "counts and recvbuff"),
        (counts, table_bytes, send, send_bytes, "counts and sendbuff"),
    ] {
        if overlap(a, a_bytes, b, b_bytes) {
            return Err(Error::invalid_argument(format!(
                "{what} overlap (symmAlltoAllvDevice needs the three disjoint)"
            )));
        }
    }
    let args = CollectiveArgs {
        send_offset: send - send_window.base,
        recv_offset: recv - recv_window.base,
        count: recv_count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::AllToAllV,
        dtype,
        op: RedOp::Sum,
        count: recv_count as u64,
        send_window,
        recv_window,
        args,
        rank_flags: (element as u32) << symm_device::symmetric::all_to_all_v::ELEMENT_BYTES_SHIFT,
        root: 0,
        counts: Some(CountTable {
            offset: counts - table_window.base,
            window: table_window,
            send_count: send_count as u64,
        }),
        staged: None,
    })
}

/// Validate `symmGather`'s arguments against `comm`'s windows: every rank's `count` elements of
/// `sendbuff` land on the root, rank `r`'s at `recvbuff + r·count`. `sendbuff` lies at the same
/// offset of the same window on every rank (the root reads it); `recvbuff` is checked only on
/// the root (the other ranks' is not used, as in NCCL, and may be NULL), where it may hold
/// `sendbuff` as its segment `root` (in place) but not overlap it otherwise.
pub fn gather(
    comm: &Comm,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    root: c_int,
) -> Result<Request> {
    let root = root_rank(comm, root)?;
    let dtype = data_type(datatype)?;
    let element = dtype.size_bytes() as u64;
    let is_root = comm.rank == root as usize;
    let ends: &[u64] = if is_root { &[send, recv] } else { &[send] };
    let bytes = byte_count(count, element, "count", ends)?;
    let send_window = window_of(comm, "sendbuff", send, bytes, element)?;
    let (recv_window, recv_offset, rank_flags) = root_receive(
        comm,
        is_root,
        (send, bytes, &send_window),
        (
            recv,
            || whole_bytes(comm, bytes, recv, "count"),
            recv.wrapping_add(root as u64 * bytes),
        ),
        element,
        "sendbuff overlaps recvbuff on the root without being its segment root (in place \
         needs sendbuff == recvbuff + root × count)",
    )?;
    let args = CollectiveArgs {
        send_offset: send - send_window.base,
        recv_offset,
        count: count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::Gather,
        dtype,
        op: RedOp::Sum,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags,
        root,
        counts: None,
        staged: None,
    })
}

/// Validate `symmScatter`'s arguments against `comm`'s windows: segment `r` (`count` elements)
/// of the root's `sendbuff` lands in `recvbuff` of rank `r`. `recvbuff` lies at the same offset
/// of the same window on every rank (the root stores into it); `sendbuff` is checked only on
/// the root (the other ranks' is not used, as in NCCL, and may be NULL), where it may hold
/// `recvbuff` as its segment `root` (in place) but not overlap it otherwise.
pub fn scatter(
    comm: &Comm,
    send: u64,
    recv: u64,
    count: usize,
    datatype: symmDataTypeRaw,
    root: c_int,
) -> Result<Request> {
    let root = root_rank(comm, root)?;
    let dtype = data_type(datatype)?;
    let element = dtype.size_bytes() as u64;
    let is_root = comm.rank == root as usize;
    let ends: &[u64] = if is_root { &[send, recv] } else { &[recv] };
    let bytes = byte_count(count, element, "count", ends)?;
    let recv_window = window_of(comm, "recvbuff", recv, bytes, element)?;
    let (send_window, send_offset, rank_flags) = if is_root {
        let total = whole_bytes(comm, bytes, send, "count")?;
        let send_window = window_of(comm, "sendbuff", send, total, element)?;
        let in_place = recv == send + root as u64 * bytes;
        if !in_place && overlap(send, total, recv, bytes) {
            return Err(Error::invalid_argument(
                "recvbuff overlaps sendbuff on the root without being its segment root (in \
                 place needs recvbuff == sendbuff + root × count)",
            ));
        }
        let offset = send - send_window.base;
        let flags = FLAG_ROOT | if in_place { FLAG_IN_PLACE } else { 0 };
        (send_window, offset, flags)
    } else {
        // Not the root: no send buffer; the kernel reads nothing of this rank.
        (recv_window.clone(), 0, 0)
    };
    let args = CollectiveArgs {
        send_offset,
        recv_offset: recv - recv_window.base,
        count: count as u64,
        flags: 0,
    };
    Ok(Request {
        collective: Collective::Scatter,
        dtype,
        op: RedOp::Sum,
        count: count as u64,
        send_window,
        recv_window,
        args,
        rank_flags,
        root,
        counts: None,
        staged: None,
    })
}
