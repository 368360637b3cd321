//! Communicators whose ranks span machines: symm inside each machine, a rail between them.
//!
//! A spanning communicator of `M` machines of `L` ranks ([`shape`]) holds, on each rank, the
//! machine's own communicator (`inside`: windows, kernels, call records and process watch of
//! the machine's `L` ranks, made from the spanning bootstrap as a split makes its children)
//! and its rail (the `M` ranks of its local rank, one per machine). Each of the four
//! collectives it runs ([`plan`]) is legs inside and legs on the rail. A rail is an NCCL
//! communicator (`nccl`, the cuda backend's default) or an authenticated bootstrap connection
//! of its own (the all-gathers of `transport::bootstrap`, every read bounded, the data through
//! the host: the host backend's default); nothing of one machine's memory is mapped by another.
//!
//! **Agreement.** Every call of every rank is numbered and all-gathered over the spanning
//! bootstrap before any leg runs ([`signature`]): the user's call, or the rank's refusal of
//! it. Every rank sees every entry, so every rank runs the call or every rank refuses it,
//! naming the refusing rank or both differing calls, before any data moves.
//!
//! **Failures.** The first failure a rank sees (a leg's error, a refusal, a timeout, an abort,
//! its machine's failure adopted by the inside communicator) fails the inside communicator and
//! goes to every other rank through the spanning root (`Fail`). A monitor thread per rank reads
//! the root's news (another rank's failure, a rank whose connection was lost) and the inside
//! communicator's failure; every wait on the rail is cut into slices that end when the rank
//! failed. A rank that dies is seen by its machine's watch and by the root (its connection
//! closes), whichever comes first.

pub(crate) mod nccl;
pub mod plan;
mod rail;
pub mod shape;
pub mod signature;

use super::{Comm, Joining, REMOTE_DEVICE};
use crate::abi::{CollectiveArgs, symmDataTypeRaw};
use crate::abi::{symmRedOpRaw, symmResult_t};
use crate::error::{Error, Result};
use crate::log::{Level, Subsys};
use crate::plan::Collective;
use crate::transport::bootstrap::{Client, UniqueId};
use crate::transport::link::RankLink;
use plan::{Buffer, Region, Step};
use shape::Shape;
use signature::{Entry, Place, Signature};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use symm_device::RedOp;

/// Tag of the formation's all-gather on the spanning bootstrap (calls use their numbers).
const FORM_TAG: u64 = 1 << 62;

/// How often the monitor looks.
const MONITOR_PERIOD: Duration = Duration::from_millis(10);

/// Longest slice of a wait on other ranks between two looks at this rank's failure.
const WAIT_SLICE: Duration = Duration::from_millis(20);

/// A rank's part of a communicator spanning machines (see the module docs).
pub struct Span {
    /// The machines and ranks per machine.
    pub shape: Shape,
    /// This rank (of the spanning communicator).
    pub rank: usize,
    shared: Arc<Shared>,
    monitor: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Number of this rank's next call.
    next_call: AtomicU64,
}

/// What carries a rank's rail.
enum RailLink {
    /// A bootstrap root of the rail's own: all-gathers through the host.
    Sockets(Client),
    /// An NCCL communicator of the rail's ranks.
    Nccl(nccl::NcclRail),
}

/// What the rank's calls and its monitor share.
struct Shared {
    rank: usize,
    /// The machines and their ranks.
    shape: Shape,
    /// The machine's communicator.
    inside: Arc<Comm>,
    /// The spanning communicator's bootstrap (agreement, failures).
    link: RankLink,
    /// This rank's rail.
    rail: RailLink,
    /// All-gathers made on a rail of sockets so far (the tag of the next).
    rail_gathers: AtomicU64,
    /// The first failure this rank saw or was told.
    failure: Mutex<Option<Error>>,
    /// Set at destroy: the monitor ends.
    stop: AtomicBool,
    /// The bound of every wait on another rank.
    timeout: Duration,
}

impl Shared {
    fn failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `error` of the machine's communicator, as this communicator's: its ranks are numbered
    /// within the machine, so the error says which ranks they are, and a communicator spanning
    /// machines is not split, so the error does not advise it.
    fn on_machine(&self, error: Error) -> Error {
        let machine = self.shape.machine_of(self.rank);
        let first = self.shape.rank_of(machine, 0);
        let message = error.message.replace(
            crate::comm::failure::RECOVERY,
            "destroy the communicator (one spanning machines is not split)",
        );
        let context = format!("on its machine's communicator (machine {machine}, whose rank r");
        if message.contains(&context) {
            // Already this communicator's (a failure of it, kept by the machine's).
            return Error::new(error.code, message);
        }
        Error::new(
            error.code,
            format!(
                "rank {}: {context} is rank {first} + r): {message}",
                self.rank
            ),
        )
    }

    /// Keep `error` as this rank's failure if it is the first; then fail the machine's
    /// communicator with it and, when `tell`, tell every other rank through the root.
    fn fail(&self, error: &Error, tell: bool) {
        {
            let mut slot = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_some() {
                return;
            }
            *slot = Some(error.clone());
        }
        crate::log!(
            Level::Warn,
            Subsys::Coll,
            Some(self.rank),
            "the communicator spanning machines failed: {}",
            error.message
        );
        if tell && !crate::mutation::active(crate::mutation::Mutation::SpanFailureUntold) {
            let _ = self.link.client().fail(&error.message);
        }
        super::failure::fail(&self.inside, error);
        if let RailLink::Nccl(rail) = &self.rail {
            // Ends NCCL's pending work on the rail, and its later calls.
            rail.abort();
        }
    }

    /// Wait for the all-gather `tag` of `client`, bounded by the timeout and ended at once by
    /// this rank's failure; `what` names the wait in the timeout's message.
    fn wait(&self, client: &Client, tag: u64, what: &dyn Fn() -> String) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match client.gathered(tag, left.min(WAIT_SLICE)) {
                Ok(payloads) => return Ok(payloads),
                Err(e) if e.code == symmResult_t::symmTimeout => {
                    if let Some(failure) = self.failure() {
                        return Err(failure);
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::new(
                            symmResult_t::symmTimeout,
                            format!(
                                "rank {}: {} did not come within the timeout ({:?})",
                                self.rank,
                                what(),
                                self.timeout
                            ),
                        ));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Span {
    /// The machine's communicator.
    pub fn inside(&self) -> &Arc<Comm> {
        &self.shared.inside
    }

    /// This rank's machine.
    pub fn machine(&self) -> usize {
        self.shape.machine_of(self.rank)
    }

    /// The first failure this rank saw or was told.
    pub fn failure(&self) -> Option<Error> {
        self.shared.failure()
    }

    /// `error` of the machine's communicator, as this communicator's (its ranks named).
    pub fn on_machine(&self, error: Error) -> Error {
        self.shared.on_machine(error)
    }

    /// Fail the communicator on every rank with `error` (see [`Shared::fail`]).
    pub fn fail(&self, error: &Error) {
        self.shared.fail(error, true);
    }

    /// Leave: stop the monitor, destroy the machine's communicator, leave the rail and the
    /// spanning bootstrap.
    pub fn close(&self) -> Result<()> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(monitor) = self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = monitor.join();
        }
        let destroyed = super::destroy(&self.shared.inside);
        match &self.shared.rail {
            RailLink::Sockets(rail) => rail.leave(),
            RailLink::Nccl(rail) if self.failure().is_some() => rail.abort(),
            RailLink::Nccl(rail) => rail.release(),
        }
        self.shared.link.client().leave();
        destroyed
    }
}

/// Form the communicator `link` joined as `rank`, whose ranks span the machines of `shape`
/// (see the module docs): the machine's communicator and the rail, then this rank's handle.
pub(crate) fn form(
    link: RankLink,
    rank: usize,
    shape: Shape,
    joining: Joining,
) -> Result<Arc<Comm>> {
    let Joining {
        backend,
        device,
        bounds,
        timeout,
        join_timeout,
    } = joining;
    let default_rails = match backend.kind() {
        crate::backend::BackendKind::Cuda => crate::config::Rails::Nccl,
        _ => crate::config::Rails::Sockets,
    };
    let rails = crate::config::rails(default_rails)?;
    if backend.kind() == crate::backend::BackendKind::Model {
        return Err(refuse_backend(shape, backend.kind()));
    }
    let (machine, local_rank) = (shape.machine_of(rank), shape.local_rank_of(rank));
    // NCCL is loaded on every rank before anything waits for it: a rank without it must not
    // leave the others in ncclCommInitRank.
    let nccl = match rails {
        crate::config::Rails::Nccl => Some(nccl::Nccl::load()),
        crate::config::Rails::Sockets => None,
    };
    // Local rank 0 of each machine opens its machine's root; machine 0's ranks make their
    // rails' ids (a bootstrap root, or an ncclUniqueId).
    let inside_root = match local_rank {
        0 => super::split::new_root(Some(&link))?.encode().to_vec(),
        _ => Vec::new(),
    };
    let rail_id = match (machine, &nccl) {
        (0, None) => Ok(super::split::new_root(Some(&link))?.encode().to_vec()),
        (0, Some(Ok(nccl))) => nccl.unique_id(),
        _ => Ok(Vec::new()),
    };
    let nccl_status = match (&nccl, &rail_id) {
        (Some(Err(e)), _) | (_, Err(e)) => e.message.clone().into_bytes(),
        _ => Vec::new(),
    };
    let rail_root = rail_id.unwrap_or_default();
    let staging = crate::config::staging_bytes()?;
    let mut contribution = vec![u8::from(rails == crate::config::Rails::Nccl)];
    for part in [&inside_root, &rail_root, &nccl_status] {
        contribution.extend_from_slice(&(part.len() as u32).to_le_bytes());
        contribution.extend_from_slice(part);
    }
    contribution.extend_from_slice(&staging.to_le_bytes());
    link.contribute(FORM_TAG, &contribution)?;
    let gathered = link.gathered(FORM_TAG, join_timeout)?;
    let parts = gathered
        .iter()
        .enumerate()
        .map(|(r, bytes)| formation_parts(bytes, r))
        .collect::<Result<Vec<_>>>()?;
    if let Some(r) = parts.iter().position(|p| p.nccl != parts[rank].nccl) {
        let name = |nccl: bool| if nccl { "nccl" } else { "sockets" };
        return Err(Error::invalid_argument(format!(
            "rank {r}'s rails between machines are {}, rank {rank}'s {}: set SYMM_RAILS alike on \
             every rank",
            name(parts[r].nccl),
            name(parts[rank].nccl)
        )));
    }
    if let Some((r, other)) = parts
        .iter()
        .enumerate()
        .find(|(_, p)| p.staging != staging)
        .map(|(r, p)| (r, p.staging))
    {
        return Err(Error::invalid_argument(format!(
            "rank {r} stages calls outside the windows through a staging window of {other} \
             bytes, rank {rank} through one of {staging} (0: none, SYMM_STRICT_WINDOWS=1 or \
             SYMM_STAGING_BYTES=0): set SYMM_STAGING_BYTES and SYMM_STRICT_WINDOWS alike on \
             every rank"
        )));
    }
    if let Some((r, reason)) = parts
        .iter()
        .enumerate()
        .find(|(_, p)| !p.nccl_status.is_empty())
    {
        return Err(Error::new(
            symmResult_t::symmSystemError,
            format!(
                "the ranks span {} machines of {} ranks, and symm's legs between machines run \
                 on NCCL, which rank {r} could not load: {}",
                shape.machines,
                shape.local,
                String::from_utf8_lossy(&reason.nccl_status)
            ),
        ));
    }
    let id_of = |bytes: &[u8], what: &str, from: usize| -> Result<UniqueId> {
        let key: [u8; crate::abi::SYMM_UNIQUE_ID_BYTES] = bytes
            .try_into()
            .map_err(|_| Error::internal(format!("rank {from} sent no {what} root")))?;
        UniqueId::decode(&key)
    };
    let inside_id = id_of(
        &parts[shape.rank_of(machine, 0)].inside,
        "machine",
        shape.rank_of(machine, 0),
    )?;
    let rail_rank0 = shape.rank_of(0, local_rank);
    let inside = super::join(
        shape.local,
        &inside_id,
        local_rank,
        Joining {
            backend: backend.clone(),
            device,
            bounds,
            timeout,
            join_timeout,
        },
    )?;
    // Every rank joined its machine before any enters NCCL's initialization, which waits for
    // every rank of the rail without a bound of symm's.
    if nccl.is_some() {
        let joined = link
            .contribute(FORM_TAG + 1, &[])
            .and_then(|()| link.gathered(FORM_TAG + 1, join_timeout));
        if let Err(e) = joined {
            let _ = super::destroy(&inside);
            return Err(e);
        }
    }
    let rail = match nccl {
        Some(nccl) => nccl.and_then(|nccl| {
            nccl::NcclRail::init(nccl, &parts[rail_rank0].rail, shape.machines, machine)
                .map(RailLink::Nccl)
        }),
        None => id_of(&parts[rail_rank0].rail, "rail", rail_rank0).and_then(|rail_id| {
            Client::connect(
                &rail_id,
                shape.machines as u32,
                machine as u32,
                &[],
                join_timeout,
            )
            .map(|(rail, _)| RailLink::Sockets(rail))
        }),
    };
    let rail = match rail {
        Ok(rail) => rail,
        Err(e) => {
            let _ = super::destroy(&inside);
            return Err(e);
        }
    };
    let mut devices = vec![REMOTE_DEVICE; shape.nranks()];
    devices[rank] = device;
    let clique = super::new_clique_with(
        backend,
        &devices,
        (
            bounds.0,
            inside.clique.max_blocks,
            inside.clique.ranks_per_gpu,
        ),
        inside.clique.host_mode,
        timeout,
    );
    let comm = match clique.and_then(|clique| super::new_comm(&clique, rank, None, None)) {
        Ok(comm) => comm,
        Err(e) => {
            let _ = super::destroy(&inside);
            return Err(e);
        }
    };
    let shared = Arc::new(Shared {
        rank,
        shape,
        inside,
        link,
        rail,
        rail_gathers: AtomicU64::new(0),
        failure: Mutex::new(None),
        stop: AtomicBool::new(false),
        timeout,
    });
    let watching = Arc::downgrade(&shared);
    let monitor = std::thread::Builder::new()
        .name("symm-span-monitor".into())
        .spawn(move || monitor(watching))
        .map_err(|e| Error::internal(format!("starting the monitor thread: {e}")));
    let span = Span {
        shape,
        rank,
        shared,
        monitor: Mutex::new(None),
        next_call: AtomicU64::new(0),
    };
    match monitor {
        Ok(handle) => *span.monitor.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle),
        Err(e) => {
            let _ = span.close();
            let _ = super::destroy(&comm);
            return Err(e);
        }
    }
    crate::log!(
        Level::Info,
        Subsys::Init,
        Some(rank),
        "the ranks span {} machines of {} ranks: this rank is local rank {local_rank} of machine \
         {machine}; symm runs inside each machine, the rails between them",
        shape.machines,
        shape.local
    );
    if comm.span.set(span).is_err() {
        return Err(Error::internal(
            "a new communicator already spanned machines",
        ));
    }
    Ok(comm)
}

/// A rank's formation entry.
struct Formation {
    /// Its rails are NCCL's.
    nccl: bool,
    /// Its machine's root id (local rank 0's).
    inside: Vec<u8>,
    /// Its rail's id (machine 0's ranks'): a bootstrap root's, or an `ncclUniqueId`.
    rail: Vec<u8>,
    /// Why it could not load NCCL (empty: it could, or needs not).
    nccl_status: Vec<u8>,
    /// Its staging window's bytes.
    staging: u64,
}

/// Decode rank `rank`'s formation entry.
fn formation_parts(bytes: &[u8], rank: usize) -> Result<Formation> {
    let malformed = || Error::internal(format!("rank {rank} sent a malformed formation entry"));
    let (&nccl, mut rest) = bytes.split_first().ok_or_else(malformed)?;
    let mut part = || -> Result<Vec<u8>> {
        let len = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(malformed)? as usize;
        let body = rest.get(4..4 + len).ok_or_else(malformed)?.to_vec();
        rest = &rest[4 + len..];
        Ok(body)
    };
    let inside = part()?;
    let rail = part()?;
    let nccl_status = part()?;
    let staging = u64::from_le_bytes(rest.try_into().map_err(|_| malformed())?);
    Ok(Formation {
        nccl: nccl == 1,
        inside,
        rail,
        nccl_status,
        staging,
    })
}

/// The refusal of ranks spanning machines on a backend without rails.
pub(crate) fn refuse_backend(shape: Shape, kind: crate::backend::BackendKind) -> Error {
    Error::unsupported(format!(
        "the ranks span {} machines of {} ranks: the {} backend runs in one process",
        shape.machines,
        shape.local,
        kind.name()
    ))
}

/// The monitor of a rank (see the module docs): until the rank fails or leaves.
fn monitor(shared: Weak<Shared>) {
    loop {
        std::thread::sleep(MONITOR_PERIOD);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.stop.load(Ordering::Acquire) || shared.failure().is_some() {
            return;
        }
        if let Some(error) = shared.link.client().poll(Duration::from_millis(2)) {
            shared.fail(&error, false);
            return;
        }
        let machine_failure = {
            let state = shared.inside.lock();
            state.aborted.clone().map(|message| {
                Error::new(
                    state.abort_code.unwrap_or(symmResult_t::symmRemoteError),
                    message,
                )
            })
        };
        if let Some(error) = machine_failure {
            shared.fail(&shared.on_machine(error), true);
            return;
        }
    }
}

/// The index of `collective` in [`signature::NAMES`], for the four a spanning communicator
/// runs.
fn collective_index(collective: Collective) -> Option<u8> {
    Some(match collective {
        Collective::AllReduce => 0,
        Collective::AllGather => 1,
        Collective::ReduceScatter => 2,
        Collective::Broadcast => 3,
        _ => return None,
    })
}

/// A collective call of a spanning communicator, as its front end took it.
pub struct Call<'a> {
    /// Which collective.
    pub collective: Collective,
    /// Its C name.
    pub name: &'a str,
    /// Its arguments.
    pub args: CollectiveArgs,
    /// Its stream.
    pub stream: u64,
    /// Whether the calling thread is inside a group.
    pub grouped: bool,
}

/// How a leg inside the machine runs: the collective entry of the machine's communicator.
pub type InsideLeg<'a> =
    &'a dyn Fn(&Arc<Comm>, Collective, &'static str, CollectiveArgs, u64) -> Result<()>;

/// A collective of a spanning communicator: agreed by every rank, then run leg by leg (the
/// inside legs through `inside_leg`).
pub fn collective(
    comm: &Arc<Comm>,
    span: &Span,
    call: Call<'_>,
    inside_leg: InsideLeg<'_>,
) -> Result<()> {
    let Call {
        collective,
        name,
        args,
        stream,
        grouped,
    } = call;
    let _call = comm.enter_call(name)?;
    if let Some(failure) = span.failure() {
        return Err(failure);
    }
    // Refusals every rank making this call makes alike: not numbered, the communicator stays.
    if collective_index(collective).is_none() {
        return Err(unsupported(name));
    }
    if grouped {
        return Err(unsupported(&format!("{name} inside a group")));
    }
    let local = entry(comm, span, collective, name, &args)
        .and_then(|entry| refuse_on_stream(span, stream).map(|()| entry));
    let own = match &local {
        Ok((signature, _)) => Entry::Call(*signature),
        Err(e) => Entry::Refused(e.message.clone()),
    };
    let agreed = agree(span, &own);
    let (_, call) = match local {
        // This rank's own refusal is its answer (the others name it).
        Err(e) => {
            span.shared.fail(&e, false);
            return Err(e);
        }
        Ok(local) => local,
    };
    agreed?;
    run(span, call, &args, stream, inside_leg).map_err(|e| {
        // A leg ended by this rank's failure (its rail aborted, its machine's communicator
        // failed) reports that failure: the cause, not the leg's symptom.
        if let Some(failure) = span.failure() {
            crate::log!(
                Level::Info,
                Subsys::Coll,
                Some(span.rank),
                "{name} ended after the communicator failed: {}",
                e.message
            );
            return failure;
        }
        // A failure relayed by the root is every rank's already.
        span.shared
            .fail(&e, e.code != symmResult_t::symmRemoteError);
        e
    })
}

/// A call of a spanning communicator this rank refuses with `error` before it runs (a
/// collective it does not run, a point-to-point call, an argument its front end refused):
/// still numbered and agreed, so that every rank refuses it at once naming this rank.
pub fn refuse_call(comm: &Arc<Comm>, span: &Span, what: &str, error: Error) -> Error {
    let _call = match comm.enter_call(what) {
        Ok(call) => call,
        Err(e) => return e,
    };
    if let Some(failure) = span.failure() {
        return failure;
    }
    // Whatever the others sent, this rank's own refusal is its answer.
    let _ = agree(span, &Entry::Refused(error.message.clone()));
    span.fail(&error);
    error
}

/// The refusal of `what` on a communicator spanning machines.
pub fn unsupported(what: &str) -> Error {
    Error::unsupported(format!(
        "{what} on a communicator whose ranks span machines: such a communicator runs \
         symmAllReduce, symmAllGather, symmReduceScatter and symmBroadcast (outside groups), \
         registers windows of each machine's ranks, and is destroyed, aborted or finalized; \
         make other calls on a communicator of one machine"
    ))
}

/// All-gather this rank's entry of its next call and judge it; on any failure (a refusal, a
/// difference, a lost rank, the timeout) the communicator fails on every rank.
fn agree(span: &Span, own: &Entry) -> Result<Signature> {
    let number = span.next_call.fetch_add(1, Ordering::Relaxed);
    let shared = &span.shared;
    if crate::mutation::active(crate::mutation::Mutation::SpanAgreementSkipped) {
        // The mutant: every rank takes its own call for everyone's.
        let entries = vec![own.clone(); span.shape.nranks()];
        return signature::verdict(number, &entries).inspect_err(|e| shared.fail(e, false));
    }
    let gathered = shared
        .link
        .contribute(number, &own.encode())
        .and_then(|()| {
            shared.wait(shared.link.client(), number, &|| {
                format!("every rank's call {number} of the communicator spanning machines")
            })
        })
        .inspect_err(|e| {
            // A lost rank or root, or another rank's failure, is every rank's news already; a
            // timeout is this rank's alone (the late ranks may still come, and must not then
            // run the call without it).
            shared.fail(e, e.code != symmResult_t::symmRemoteError)
        })?;
    let entries = gathered
        .iter()
        .enumerate()
        .map(|(r, bytes)| Entry::decode(bytes, r))
        .collect::<Result<Vec<_>>>();
    // Every rank judges the same entries: no rank needs telling.
    entries
        .and_then(|entries| signature::verdict(number, &entries))
        .inspect_err(|e| shared.fail(e, false))
}

/// The refusal of a call on `stream` when it is being captured into a CUDA graph: the legs
/// between machines run through the host (sockets) or need scratch freed after the stream ran
/// (NCCL), neither of which a graph replays.
fn refuse_on_stream(span: &Span, stream: u64) -> Result<()> {
    if span.inside().clique.backend.stream_is_capturing(stream)? {
        return Err(Error::unsupported(
            "a collective of a communicator spanning machines on a stream being captured into a \
             CUDA graph: its legs between machines are not captured; call it outside the capture",
        ));
    }
    Ok(())
}

/// The place of a buffer of `bytes` bytes at `address` in the machine's windows.
fn place(inside: &Comm, address: u64, bytes: u64, name: &str) -> Result<Place> {
    let state = inside.lock();
    let window = state
        .windows
        .values()
        .find(|w| w.overlaps(address, bytes.max(1)) && !state.is_internal(w));
    match window {
        Some(w) if w.contains(address, bytes) => Ok(Place::Window {
            seq: w.seq,
            offset: address - w.base,
        }),
        Some(w) => Err(Error::invalid_argument(format!(
            "{name} [{address:#x}, +{bytes}) runs past the end of its window [{:#x}, +{})",
            w.base, w.size
        ))),
        None if state.staging.is_none() => Err(Error::invalid_argument(format!(
            "{name} {address:#x} lies outside every registered window, and this communicator \
             stages nothing (SYMM_STRICT_WINDOWS=1 or SYMM_STAGING_BYTES=0): register it"
        ))),
        None => Ok(Place::Outside),
    }
}

/// This rank's entry for a call: its signature and its plan's input, or the refusal.
fn entry(
    comm: &Comm,
    span: &Span,
    collective: Collective,
    name: &str,
    args: &CollectiveArgs,
) -> Result<(Signature, plan::Call)> {
    super::refuse_if_finalized(span.inside(), name)?;
    let Some(index) = collective_index(collective) else {
        return Err(unsupported(name));
    };
    let dtype = data_type(args.datatype)?;
    let reduces = matches!(
        collective,
        Collective::AllReduce | Collective::ReduceScatter
    );
    let op = if reduces {
        let op = red_op(args.op)?;
        if op == RedOp::Avg && (!dtype.is_float() || dtype.size_bytes() < 4) {
            return Err(Error::unsupported(format!(
                "{name} with symmAvg on {dtype:?}: between machines the average would be taken \
                 of each machine's sums, already wrapped (integers) or rounded and saturated \
                 (8- and 16-bit floats); use symmSum and divide, or a wider type"
            )));
        }
        args.op
    } else {
        0
    };
    if let RailLink::Nccl(rail) = &span.shared.rail
        && matches!(
            dtype,
            symm_device::DataType::Float8E4M3 | symm_device::DataType::Float8E5M2
        )
        && rail.version() < nccl::FLOAT8_VERSION
    {
        return Err(Error::unsupported(format!(
            "{name} of {dtype:?} between machines: NCCL {} has no float8 types (2.24 and newer \
             do)",
            rail.version()
        )));
    }
    let nranks = comm.clique.nranks;
    let elem = dtype.size_bytes() as u64;
    let count = args.count as u64;
    let too_large = || Error::invalid_argument(format!("count = {count}: too large"));
    let bytes = count.checked_mul(elem).ok_or_else(too_large)?;
    let all = bytes.checked_mul(nranks as u64).ok_or_else(too_large)?;
    let root = if collective == Collective::Broadcast {
        if args.root < 0 || args.root as usize >= nranks {
            return Err(Error::invalid_argument(format!(
                "root = {}: must be in [0, {nranks})",
                args.root
            )));
        }
        args.root as usize
    } else {
        0
    };
    let inside = span.inside();
    let nonnull = |address: u64, what: &str| {
        if address == 0 && count > 0 {
            Err(Error::invalid_argument(format!("{what} is NULL")))
        } else {
            Ok(())
        }
    };
    nonnull(args.recv, "recvbuff")?;
    let rank = comm.rank as u64;
    let (in_place, send, recv) = match collective {
        Collective::AllReduce => {
            nonnull(args.send, "sendbuff")?;
            let in_place = args.send == args.recv;
            let apart = args.send.saturating_add(bytes) <= args.recv
                || args.recv.saturating_add(bytes) <= args.send;
            if !in_place && !apart {
                return Err(Error::invalid_argument(format!(
                    "sendbuff {:#x} and recvbuff {:#x} overlap in {bytes} bytes without being \
                     equal (in place)",
                    args.send, args.recv
                )));
            }
            let send = match in_place {
                true => Place::Unused,
                false => place(inside, args.send, bytes, "sendbuff")?,
            };
            (in_place, send, place(inside, args.recv, bytes, "recvbuff")?)
        }
        Collective::AllGather => {
            nonnull(args.send, "sendbuff")?;
            let in_place = args.recv.checked_add(rank * bytes) == Some(args.send);
            let send = match in_place {
                true => Place::Unused,
                false => place(inside, args.send, bytes, "sendbuff")?,
            };
            (in_place, send, place(inside, args.recv, all, "recvbuff")?)
        }
        Collective::ReduceScatter => {
            nonnull(args.send, "sendbuff")?;
            let in_place = args.send.checked_add(rank * bytes) == Some(args.recv);
            let recv = match in_place {
                true => Place::Unused,
                false => place(inside, args.recv, bytes, "recvbuff")?,
            };
            (in_place, place(inside, args.send, all, "sendbuff")?, recv)
        }
        _ => {
            // Broadcast: the root's send buffer is the root's alone to check.
            if comm.rank == root && args.send != args.recv {
                nonnull(args.send, "sendbuff")?;
                place(inside, args.send, bytes, "sendbuff")?;
            }
            let recv = place(inside, args.recv, bytes, "recvbuff")?;
            (
                comm.rank == root && args.send == args.recv,
                Place::Unused,
                recv,
            )
        }
    };
    // Compared: what every rank's legs read or write alike. The send buffers of all-reduce,
    // all-gather and broadcast are read by this rank alone (a copy, a rail leg), so their
    // places and in-place-ness may differ between ranks, as NCCL allows.
    let reads_send_inside = collective == Collective::ReduceScatter;
    let signature = Signature {
        collective: index,
        datatype: args.datatype,
        op,
        count,
        root: root as i32,
        in_place: in_place && reads_send_inside,
        send: if reads_send_inside {
            send
        } else {
            Place::Unused
        },
        recv,
    };
    Ok((
        signature,
        plan::Call {
            collective,
            count: args.count,
            in_place,
            root,
        },
    ))
}

/// Decode a C `symmDataType_t`.
fn data_type(raw: symmDataTypeRaw) -> Result<symm_device::DataType> {
    u32::try_from(raw)
        .ok()
        .and_then(symm_device::DataType::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("datatype = {raw} is not a symmDataType_t")))
}

/// Decode a C `symmRedOp_t`.
fn red_op(raw: symmRedOpRaw) -> Result<RedOp> {
    u32::try_from(raw)
        .ok()
        .and_then(RedOp::from_raw)
        .ok_or_else(|| Error::invalid_argument(format!("op = {raw} is not a symmRedOp_t")))
}

/// The C name of an inside leg.
fn leg_name(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "symmAllReduce",
        Collective::AllGather => "symmAllGather",
        Collective::ReduceScatter => "symmReduceScatter",
        _ => "symmBroadcast",
    }
}

/// Scratch of one call: host memory for a rail of sockets (its legs run through the host),
/// device memory for NCCL's (freed once the call's stream has run).
enum Scratch<'a> {
    Host(Vec<u8>),
    Device {
        backend: &'a crate::backend::Backend,
        device: i32,
        stream: u64,
        address: u64,
    },
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Scratch::Device {
            backend,
            device,
            stream,
            address,
        } = self
            && *address != 0
        {
            // Freed only once the stream's work on it has run; else kept (leaked).
            if backend.synchronize_stream(*device, *stream).is_ok() {
                let _ = backend.free(*device, *address);
            }
        }
    }
}

/// Run this rank's plan of an agreed call.
fn run(
    span: &Span,
    call: plan::Call,
    args: &CollectiveArgs,
    stream: u64,
    inside_leg: InsideLeg<'_>,
) -> Result<()> {
    let Some(plan) = plan::plan(span.shape, span.rank, call) else {
        return Err(Error::internal("an agreed call without a plan"));
    };
    let dtype = data_type(args.datatype)?;
    let elem = dtype.size_bytes();
    let op = if matches!(
        call.collective,
        Collective::AllReduce | Collective::ReduceScatter
    ) {
        red_op(args.op)?
    } else {
        RedOp::Sum
    };
    let inside = span.inside();
    let backend: &crate::backend::Backend = &inside.clique.backend;
    let device = inside.device;
    let nccl = match &span.shared.rail {
        RailLink::Nccl(rail) => Some(rail),
        RailLink::Sockets(_) => None,
    };
    // An average: on sockets, a sum inside and one division by every rank on the host; on
    // NCCL, an average inside and one on the rail (floats of 32 bits or more only).
    let inside_op = match (op, nccl) {
        (RedOp::Avg, None) => RedOp::Sum,
        (op, _) => op,
    } as symmRedOpRaw;
    let scratch_bytes = plan.scratch * elem;
    let mut scratch = match nccl {
        None => Scratch::Host(vec![0u8; scratch_bytes]),
        Some(_) => Scratch::Device {
            backend,
            device,
            stream,
            address: match scratch_bytes {
                0 => 0,
                bytes => backend.alloc_zeroed(device, bytes)?,
            },
        },
    };
    let scratch_address = match &scratch {
        Scratch::Device { address, .. } => Some(*address),
        Scratch::Host(_) => None,
    };
    // The device address of a region (none for host scratch).
    let address = |region: Region| -> Option<u64> {
        let base = match region.buffer {
            Buffer::Send => args.send,
            Buffer::Recv => args.recv,
            Buffer::Scratch => scratch_address?,
        };
        Some(base + (region.offset * elem) as u64)
    };
    let device_address = |region: Region| -> Result<u64> {
        address(region).ok_or_else(|| Error::internal("a device leg on host scratch"))
    };
    let read = |scratch: &Scratch, region: Region, count: usize| -> Result<Vec<u8>> {
        let bytes = count * elem;
        if let (Scratch::Host(host), Buffer::Scratch) = (scratch, region.buffer) {
            let start = region.offset * elem;
            return Ok(host[start..start + bytes].to_vec());
        }
        backend.synchronize_stream(device, stream)?;
        let mut out = vec![0u8; bytes];
        backend.download(device, device_address(region)?, &mut out)?;
        Ok(out)
    };
    let write = |scratch: &mut Scratch, region: Region, bytes: &[u8]| -> Result<()> {
        if let (Scratch::Host(host), Buffer::Scratch) = (scratch, region.buffer) {
            let start = region.offset * elem;
            host[start..start + bytes.len()].copy_from_slice(bytes);
            return Ok(());
        }
        // After the stream's work on it (the upload goes through another stream).
        backend.synchronize_stream(device, stream)?;
        backend.upload(device, device_address(region)?, bytes)
    };
    let sockets = match &span.shared.rail {
        RailLink::Sockets(client) => Some(rail::Rail {
            shared: &span.shared,
            client,
            machines: span.shape.machines,
            machine: span.machine(),
            dtype,
            op,
            nranks: span.shape.nranks(),
        }),
        RailLink::Nccl(_) => None,
    };
    let (nccl_dtype, nccl_op) = (args.datatype, op as i32);
    for step in plan.steps {
        match (step, nccl, &sockets) {
            (
                Step::Inside {
                    collective,
                    send,
                    recv,
                    count,
                    root,
                },
                _,
                _,
            ) => {
                let leg = CollectiveArgs {
                    send: device_address(send)?,
                    recv: device_address(recv)?,
                    count,
                    datatype: args.datatype,
                    op: inside_op,
                    root: root as std::ffi::c_int,
                };
                inside_leg(inside, collective, leg_name(collective), leg, stream)
                    .map_err(|e| span.shared.on_machine(e))?;
            }
            (Step::Copy { from, to, count }, _, _) => match (address(from), address(to)) {
                (Some(src), Some(dst)) => {
                    let copy = crate::plan::staging::Copy {
                        dst,
                        src,
                        bytes: (count * elem) as u64,
                    };
                    // SAFETY: both ranges lie in the caller's buffers (checked against the
                    // windows, or staged memory the caller vouches for, as NCCL takes it) or
                    // in this call's scratch, and do not overlap: an out-of-place call's
                    // buffers were checked apart, scratch is this call's own.
                    unsafe { backend.copy(device, stream, &copy)? };
                }
                _ => {
                    let bytes = read(&scratch, from, count)?;
                    write(&mut scratch, to, &bytes)?;
                }
            },
            (Step::RailAllReduce { at, count }, Some(rail), _) => {
                rail.all_reduce(device_address(at)?, count, nccl_dtype, nccl_op, stream)?;
            }
            (
                Step::RailAllGather {
                    from,
                    to,
                    count,
                    stride,
                },
                Some(rail),
                _,
            ) => {
                let from = device_address(from)?;
                let legs: Vec<(usize, u64, u64)> = (0..span.shape.machines)
                    .map(|m| {
                        let to = Region {
                            buffer: to.buffer,
                            offset: to.offset + m * stride,
                        };
                        device_address(to).map(|to| (m, from, to))
                    })
                    .collect::<Result<_>>()?;
                rail.broadcasts(&legs, count, nccl_dtype, stream)?;
            }
            (Step::RailReduceScatter { from, to, count }, Some(rail), _) => {
                let ends = (device_address(from)?, device_address(to)?);
                rail.reduce_scatter(ends, count, nccl_dtype, nccl_op, stream)?;
            }
            (
                Step::RailBroadcast {
                    root_machine,
                    from,
                    to,
                    count,
                },
                Some(rail),
                _,
            ) => {
                let to = device_address(to)?;
                // Off the root machine NCCL reads no send buffer: the receive buffer stands in.
                let from = match span.machine() == root_machine {
                    true => device_address(from)?,
                    false => to,
                };
                rail.broadcasts(&[(root_machine, from, to)], count, nccl_dtype, stream)?;
            }
            (Step::RailAllReduce { at, count }, None, Some(rail)) => {
                let mine = read(&scratch, at, count)?;
                let reduced = rail.all_reduce(&mine)?;
                write(&mut scratch, at, &reduced)?;
            }
            (
                Step::RailAllGather {
                    from,
                    to,
                    count,
                    stride,
                },
                None,
                Some(rail),
            ) => {
                let mine = read(&scratch, from, count)?;
                for (m, block) in rail.all_gather(&mine)?.iter().enumerate() {
                    let place = Region {
                        buffer: to.buffer,
                        offset: to.offset + m * stride,
                    };
                    write(&mut scratch, place, block)?;
                }
            }
            (Step::RailReduceScatter { from, to, count }, None, Some(rail)) => {
                let mine = read(&scratch, from, count * span.shape.machines)?;
                let reduced = rail.reduce_scatter(&mine)?;
                write(&mut scratch, to, &reduced)?;
            }
            (
                Step::RailBroadcast {
                    root_machine,
                    from,
                    to,
                    count,
                },
                None,
                Some(rail),
            ) => {
                let mine = match span.machine() == root_machine {
                    true => read(&scratch, from, count)?,
                    false => Vec::new(),
                };
                let data = rail.broadcast(root_machine, &mine, count * elem)?;
                write(&mut scratch, to, &data)?;
            }
            (step, _, _) => {
                return Err(Error::internal(format!("{step:?} without its rail")));
            }
        }
    }
    Ok(())
}
