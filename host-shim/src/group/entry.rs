//! One entry for every collective as its caller names it (buffers as addresses, the C values of
//! the data type and operator, the root): the call is routed (in its windows, or staged), then
//! run now or queued to the group's end. The C ABI (`ffi::api`) and the Rust API (`api`) both
//! call it, so the two front ends share every check and every path below.

use crate::abi::symmDataTypeRaw;
use crate::collective::{self, UserCall};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::plan::Collective;
use std::sync::Arc;

pub use crate::abi::CollectiveArgs;

/// A collective of `comm` (named `name`) that its front end refused with `error` before it
/// reached [`collective_call`] (an argument only that front end's types can check): counted as
/// the rank's call and refused, as the library's own checks count theirs, so that a peer whose
/// call is right fails at once naming it instead of waiting for this rank. The error to report.
pub fn refused_collective(comm: &Arc<Comm>, name: &str, error: Error) -> Error {
    if let Some(span) = comm.span.get() {
        return crate::comm::span::refuse_call(comm, span, name, error);
    }
    match super::collective(comm, name, || Err(error.clone()), 0) {
        Err(reported) => reported,
        Ok(()) => error,
    }
}

/// Run `collective` (named `name` in messages) of `comm` with `args` on `stream`.
pub fn collective_call(
    comm: &Arc<Comm>,
    collective: Collective,
    name: &'static str,
    args: CollectiveArgs,
    stream: u64,
) -> Result<()> {
    if let Some(span) = comm.span.get() {
        let grouped = super::active();
        let call = crate::comm::span::Call {
            collective,
            name,
            args,
            stream,
            grouped,
        };
        return crate::comm::span::collective(comm, span, call, &|c, leg, name, args, stream| {
            collective_call(c, leg, name, args, stream)
        });
    }
    let rooted = matches!(
        collective,
        Collective::Reduce | Collective::Broadcast | Collective::Gather | Collective::Scatter
    );
    let call = UserCall {
        collective,
        name,
        send: args.send,
        recv: args.recv,
        count: args.count,
        datatype: args.datatype,
        root: rooted.then_some(args.root),
    };
    let (datatype, op, root) = (args.datatype, args.op, args.root);
    let c = comm;
    super::collective(
        comm,
        &collective::describe(name, args.count, args.datatype),
        || {
            collective::route(c, &call, |s, r, n| match collective {
                Collective::AllReduce => collective::all_reduce(c, s, r, n, datatype, op),
                Collective::Reduce => collective::reduce(c, s, r, n, datatype, op, root),
                Collective::AllGather => collective::all_gather(c, s, r, n, datatype),
                Collective::ReduceScatter => collective::reduce_scatter(c, s, r, n, datatype, op),
                Collective::Broadcast => collective::broadcast(c, s, r, n, datatype, root),
                Collective::AllToAll => collective::all_to_all(c, s, r, n, datatype),
                Collective::Gather => collective::gather(c, s, r, n, datatype, root),
                Collective::Scatter => collective::scatter(c, s, r, n, datatype, root),
                Collective::AllToAllV => Err(crate::error::Error::internal(
                    "all-to-all-v has its own entry, all_to_all_v_call (its counts live in \
                     device memory)",
                )),
            })
        },
        stream,
    )
}

/// Run an all-to-all-v of `comm` on `stream`: `send` and `recv` with their capacities in
/// elements, `counts` the address of its count table (`3 × nranks` `int64_t`: row 0 read, rows
/// 1 and 2 written by the kernel), as `symmAlltoAllvDevice` takes them.
pub fn all_to_all_v_call(
    comm: &Arc<Comm>,
    send: (u64, usize),
    recv: (u64, usize),
    counts: u64,
    datatype: symmDataTypeRaw,
    stream: u64,
) -> Result<()> {
    super::collective(
        comm,
        &collective::describe_all_to_all_v(send.1, recv.1, datatype),
        || collective::route_all_to_all_v(comm, send, recv, counts, datatype),
        stream,
    )
}
