//! Windows over the memory of another communication engine, NCCL's registered windows
//! ([`nccl`]) and NVSHMEM's symmetric heap ([`nvshmem`]): each adapter asks the engine's host
//! library, loaded at run time (never a build dependency), where every rank's bytes are mapped
//! in this process, allocates the window's signal pads through the same engine, and registers
//! the whole as a window over another owner's memory
//! ([`crate::comm::windows::register_peers`]). symm's kernels then run on it unchanged.

pub mod nccl;
pub mod nvshmem;

use crate::comm::Comm;
use crate::error::{Error, Result};

pub use crate::transport::library::{Library, function, open};

/// Tag space of the adapters' agreements ([`agree_prepared`]), apart from the other
/// all-gathers of a communicator.
const ENGINE_TAG: u64 = 1 << 59;

/// Before any rank enters the engine's own collective calls (which wait for every rank,
/// unbounded), every rank says whether its local preparation of `call` (`prepared`: loading
/// the engine, checking the ranks, allocating what it can alone) worked. `Ok` on every rank
/// when all did; else each rank fails at once, a rank whose preparation failed with its own
/// error, the others naming the first such rank and its error: none enters the engine's
/// collectives, none is left waiting in them. Bounded by the communicator's timeout.
pub fn agree_prepared(comm: &Comm, call: &str, prepared: &Result<()>) -> Result<()> {
    // Every rank makes its registrations in one order and this one has not taken its number
    // yet: the next number is the same on every rank.
    let seq = comm.lock().next_window_seq;
    let payload = match prepared {
        Ok(()) => vec![1],
        Err(e) => [&[0][..], e.message.as_bytes()].concat(),
    };
    let parts = crate::comm::split::gather(comm, call, ENGINE_TAG | seq, &payload)?;
    prepared.clone()?;
    match parts
        .iter()
        .enumerate()
        .find(|(_, part)| part.first() != Some(&1))
    {
        Some((rank, part)) => Err(Error::new(
            crate::abi::symmResult_t::symmRemoteError,
            format!(
                "rank {rank} could not prepare its part of {call} ({}): no rank entered the \
                 engine's collective calls",
                String::from_utf8_lossy(part.get(1..).unwrap_or_default())
            ),
        )),
        None => Ok(()),
    }
}

/// Refuse an adapter call inside a group: the engine's own registration of the window's pads is
/// collective and runs in the call, so one thread cannot do it for several ranks.
pub fn refuse_in_group(call: &str) -> Result<()> {
    if crate::group::active() {
        return Err(Error::invalid_usage(format!(
            "{call} inside symmGroupStart/symmGroupEnd: the engine's registration of the \
             window's signal pads is collective and runs in the call, so every rank calls it \
             from a thread (or process) of its own, outside a group"
        )));
    }
    Ok(())
}
