//! Routing a collective call: in the caller's windows, or staged through the communicator's
//! staging window (`comm::staging`) in chunks (`plan::staging`). Whether a call is staged is
//! part of what the ranks agree on ([`crate::agree`]): a staged rank never pairs with a rank
//! whose buffers are in its windows, and a rank's chunks pair with its peers' chunks. The
//! copies run where the launch runs (`collective::execute`, through
//! [`crate::backend::Backend::copy`]).

use super::{Request, data_type};
use crate::abi::symmDataTypeRaw;
use crate::comm::staging::Staging;
use crate::comm::windows::Placement;
use crate::comm::{Comm, windows};
use crate::error::{Error, Result};
use crate::log::{Level, Subsys};
use crate::plan::Collective;
use crate::plan::staging::{ChunkOf, Copies, Copy, Shape, plan_chunks};
use std::ffi::c_int;

/// A collective call as its caller made it: which collective, the caller's buffers, the
/// elements per segment, the data type and (rooted collectives) the root.
pub struct UserCall {
    /// The collective.
    pub collective: Collective,
    /// The C function's name, for messages.
    pub name: &'static str,
    /// `sendbuff`.
    pub send: u64,
    /// `recvbuff`.
    pub recv: u64,
    /// Elements per segment (the call's `count`, `sendcount` or `recvcount`).
    pub count: usize,
    /// `datatype`.
    pub datatype: symmDataTypeRaw,
    /// `root`, for a reduce, broadcast, gather or scatter.
    pub root: Option<c_int>,
}

/// Where a call runs.
pub enum Route {
    /// In the caller's windows.
    Windows(Request),
    /// Through the staging window: one request per chunk, in order, each with its copies.
    Staged(Vec<Request>),
}

/// Route `call` of `comm`: in its windows when every buffer this rank uses lies wholly in one
/// registered window (or when the call's arguments are wrong in a way its validation names,
/// such as a buffer that overruns a window or an allocation of the communicator), else through
/// the staging window (none: the validation's refusal, which says why). `validate`
/// is the collective's validation, given the send buffer, the receive buffer and the count.
pub fn route(
    comm: &Comm,
    call: &UserCall,
    validate: impl Fn(u64, u64, usize) -> Result<Request>,
) -> Result<Route> {
    let in_windows = || validate(call.send, call.recv, call.count).map(Route::Windows);
    let Some(staged) = staged_form(comm, call) else {
        return in_windows();
    };
    let staging = comm.lock().staging.clone();
    let Some(staging) = staging else {
        return in_windows().map_err(no_staging);
    };
    let (shape, element, outside) = staged?;
    let plan = plan_chunks(
        shape,
        call.count as u64,
        element,
        (staging.window.base, staging.window.size),
        (call.send, call.recv),
    )?;
    let requests = plan
        .chunks
        .iter()
        .map(|chunk| {
            validate(plan.send, plan.recv, chunk.count as usize)
                .map(|request| request.staged(chunk.copies.clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    if call.count > 0 {
        announce(comm, &staging, || {
            format!(
                "{} of {} elements: {outside} in no registered window; {} chunk(s) of up to {} \
                 elements, {} bytes copied",
                call.name,
                call.count,
                plan.chunks.len(),
                plan.capacity,
                plan.chunks.iter().map(|c| c.copies.bytes()).sum::<u64>()
            )
        });
    }
    Ok(Route::Staged(requests))
}

/// Route `symmAlltoAllvDevice`: in its windows when its send buffer, receive buffer and
/// count table each lie wholly in one window, else staged in one piece (its counts are known
/// only on the device, so it cannot be cut into chunks): the send buffer, the receive buffer
/// (so that the bytes past the received segments stay as they were) and row 0 of the table
/// are copied in, the receive buffer and rows 1 and 2 copied out. A call whose buffers do not
/// fit the staging window is refused, on every rank alike (the capacities are the same on
/// every rank).
pub fn route_all_to_all_v(
    comm: &Comm,
    (send, send_count): (u64, usize),
    (recv, recv_count): (u64, usize),
    counts: u64,
    datatype: symmDataTypeRaw,
) -> Result<Route> {
    let in_windows = || {
        super::all_to_all_v(
            comm,
            (send, send_count),
            (recv, recv_count),
            counts,
            datatype,
        )
        .map(Route::Windows)
    };
    let Ok(dtype) = data_type(datatype) else {
        return in_windows();
    };
    let element = dtype.size_bytes() as u64;
    let nranks = comm.clique.nranks as u64;
    let row = 8 * nranks;
    let table = symm_device::symmetric::all_to_all_v::TABLE_ROWS * row;
    let (Some(send_bytes), Some(recv_bytes)) = (
        (send_count as u64).checked_mul(element),
        (recv_count as u64).checked_mul(element),
    ) else {
        return in_windows();
    };
    let buffers = [
        ("sendbuff", send, send_bytes),
        ("recvbuff", recv, recv_bytes),
        ("counts", counts, table),
    ];
    let Some(outside) = outside_windows(comm, &buffers) else {
        return in_windows();
    };
    let staging = comm.lock().staging.clone();
    let Some(staging) = staging else {
        return in_windows().map_err(no_staging);
    };
    for (i, (a_name, a, a_bytes)) in buffers.iter().enumerate() {
        for (b_name, b, b_bytes) in &buffers[i + 1..] {
            if crate::window::ranges_overlap(&(*a..a + a_bytes), &(*b..b + b_bytes)) {
                return Err(Error::invalid_argument(format!(
                    "{a_name} and {b_name} overlap (symmAlltoAllvDevice needs the three disjoint)"
                )));
            }
        }
    }
    let aligned = |bytes: u64| bytes.div_ceil(256) * 256;
    let (base, size) = (staging.window.base, staging.window.size);
    let staged_send = base;
    let staged_recv = staged_send + aligned(send_bytes);
    let staged_table = staged_recv + aligned(recv_bytes);
    if staged_table + table > base + size {
        return Err(Error::invalid_argument(format!(
            "symmAlltoAllvDevice of sendcount {send_count}, recvcount {recv_count}: {outside} in \
             no registered window, and staging it needs {} bytes, more than the staging window's \
             {size} (SYMM_STAGING_BYTES); an all-to-all-v is staged whole (its counts are known \
             only on the device): put its buffers in windows, or raise SYMM_STAGING_BYTES",
            staged_table + table - base
        )));
    }
    let copy = |dst, src, bytes| Copy { dst, src, bytes };
    let copies = Copies {
        before: [
            copy(staged_send, send, send_bytes),
            copy(staged_recv, recv, recv_bytes),
            copy(staged_table, counts, row),
        ]
        .into_iter()
        .filter(|c| c.bytes > 0)
        .collect(),
        after: [
            copy(recv, staged_recv, recv_bytes),
            copy(counts + row, staged_table + row, table - row),
        ]
        .into_iter()
        .filter(|c| c.bytes > 0)
        .collect(),
        of_call: ChunkOf {
            count: recv_count as u64,
            first: 0,
        },
    };
    let request = super::all_to_all_v(
        comm,
        (staged_send, send_count),
        (staged_recv, recv_count),
        staged_table,
        datatype,
    )?;
    announce(comm, &staging, || {
        format!("symmAlltoAllvDevice: {outside} in no registered window, staged whole")
    });
    Ok(Route::Staged(vec![request.staged(copies)]))
}

/// The refusal of a call that would be staged, on a communicator without a staging window,
/// with the reason it has none.
pub(crate) fn no_staging(e: Error) -> Error {
    Error::new(
        e.code,
        format!(
            "{} (this communicator stages no call: it was made with SYMM_STRICT_WINDOWS=1 or \
             SYMM_STAGING_BYTES=0)",
            e.message
        ),
    )
}

/// Say the communicator's first staged call in the log (`what`: the call and why it is
/// staged); later ones are not.
pub(crate) fn announce(comm: &Comm, staging: &Staging, what: impl FnOnce() -> String) {
    if staging.first_staged() {
        crate::log!(
            Level::Info,
            Subsys::Coll,
            Some(comm.rank),
            "{} staged through the communicator's staging window ({} bytes); later staged \
             calls are not logged; SYMM_STRICT_WINDOWS=1 refuses such calls",
            what(),
            staging.window.size
        );
    }
}

/// Which of `buffers` (name, address, bytes) lie outside every window of `comm`, described
/// ("sendbuff [0x…, +N bytes) is"), or `None` when a buffer is one the call's validation
/// refuses by name (NULL, overflowing, overrunning a window or an allocation of `comm`); an
/// empty description when every buffer is in a window.
fn outside_windows(comm: &Comm, buffers: &[(&str, u64, u64)]) -> Option<String> {
    let mut outside = Vec::new();
    for &(name, address, bytes) in buffers {
        if address == 0 || address.checked_add(bytes).is_none() {
            return None;
        }
        match windows::placement(comm, address, bytes) {
            Placement::InWindow => {}
            Placement::Outside => outside.push(format!("{name} [{address:#x}, +{bytes} bytes)")),
            Placement::Overruns => return None,
        }
    }
    let verb = if outside.len() > 1 { "are" } else { "is" };
    (!outside.is_empty()).then(|| format!("{} {verb}", outside.join(" and ")))
}

/// The shape, element size and offending buffer's description of `call` when it is to be
/// staged; `None` when it runs in the windows (its buffers are there, or its arguments are
/// wrong in a way the collective's validation names); an error for buffers that overlap
/// other than in place.
fn staged_form(comm: &Comm, call: &UserCall) -> Option<Result<(Shape, u64, String)>> {
    let nranks = comm.clique.nranks as u64;
    let element = data_type(call.datatype).ok()?.size_bytes() as u64;
    let root = match call.root {
        None => 0,
        Some(root) => usize::try_from(root)
            .ok()
            .filter(|r| (*r as u64) < nranks)?,
    };
    let shape = Shape::of(call.collective, nranks, comm.rank, root)?;
    let segment = (call.count as u64).checked_mul(element)?;
    let send_bytes = segment.checked_mul(shape.send_segments)?;
    let recv_bytes = segment.checked_mul(shape.recv_segments)?;
    let used: Vec<(&str, u64, u64)> = [
        ("sendbuff", call.send, send_bytes, shape.uses_send),
        ("recvbuff", call.recv, recv_bytes, shape.uses_recv),
    ]
    .into_iter()
    .filter(|b| b.3)
    .map(|(name, address, bytes, _)| (name, address, bytes))
    .collect();
    let outside = outside_windows(comm, &used)?;
    if shape.uses_send && shape.uses_recv {
        let in_place_at = match call.collective {
            Collective::AllGather => call.recv.checked_add(comm.rank as u64 * segment),
            Collective::ReduceScatter => call.send.checked_add(comm.rank as u64 * segment),
            Collective::Gather => call.recv.checked_add(root as u64 * segment),
            Collective::Scatter => call.send.checked_add(root as u64 * segment),
            Collective::AllToAll => None,
            _ => Some(call.recv),
        };
        let in_place = match call.collective {
            Collective::ReduceScatter | Collective::Scatter => in_place_at == Some(call.recv),
            _ => in_place_at == Some(call.send),
        };
        let overlaps = crate::window::ranges_overlap(
            &(call.send..call.send + send_bytes),
            &(call.recv..call.recv + recv_bytes),
        );
        if overlaps && !in_place {
            return Some(Err(Error::invalid_argument(format!(
                "sendbuff and recvbuff of {} overlap without being in place (in place, the \
                 buffers must be placed as for a call in windows: see the function's \
                 documentation)",
                call.name
            ))));
        }
    }
    Some(Ok((shape, element, outside)))
}
