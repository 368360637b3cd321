//! Window registration on a communicator: a rendezvous of all ranks. Rank `r`'s `k`-th
//! registration meets every other rank's `k`-th: each rank deposits its window base, size and
//! signal pad in the clique's [`Exchange`](crate::window::Exchange) (or through the bootstrap, for ranks of other
//! processes); once all have, each builds its [`SymmContext`] and peer tables in device memory.
//! Also lookup of a buffer's window, and deregistration.

use crate::abi::{SYMM_WIN_COLL_SYMMETRIC, symmResult_t, symmWindow_t};
use crate::comm::{Comm, CommState};
use crate::error::{Error, Result};
use crate::log::{Level, Subsys};
use crate::transport::link::{RankLink, WindowDeposit};
use crate::transport::shareable::{ExportMessage, Imported, Shareable};
use crate::window::owner::{Owner, OwnerKind, PeerView, PeerWindow};
use crate::window::{Deposit, DeviceContext, Exports, Registration, SignalPad, Window};
use std::ffi::c_int;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Instant;
use symm_device::context::{BackendTag, CONTEXT_VERSION, SymmContext};
use symm_device::sync::signal_pad::signal_pad_bytes;

/// `symmCommWindowRegister` on one rank: validate, deposit, and (outside a group) complete.
pub fn register(comm: &Arc<Comm>, buff: u64, size: usize, flags: c_int) -> Result<Arc<Window>> {
    check_arguments(buff, size, flags)?;
    crate::comm::refuse_if_finalized(comm, "symmCommWindowRegister")?;
    let size = size as u64;
    let state = comm.lock();
    check_range(comm, &state, buff, size)?;
    let (signal_pad, exports) = new_signal_pad(comm, &state, buff)?;
    {
        let mut pads = comm
            .clique
            .signal_pads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        pads.retain(|_, pad| pad.strong_count() > 0);
        pads.insert(signal_pad.address, Arc::downgrade(&signal_pad));
    }
    add_window(
        comm,
        state,
        NewWindow {
            base: buff,
            size,
            signal_pad,
            exports,
            owner: Owner::SYMM,
            peer_view: None,
            owner_resources: None,
        },
    )
}

/// A window about to join a rank's windows: what [`register`] and [`register_peers`] differ in.
struct NewWindow {
    base: u64,
    size: u64,
    signal_pad: Arc<SignalPad>,
    exports: Option<Exports>,
    owner: Owner,
    peer_view: Option<PeerView>,
    owner_resources: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Give `new` its abort word and the registration's number, add it to the rank's windows
/// (`state` is the rank's locked state) and deposit it; on a failed deposit it is removed again.
fn add_window(
    comm: &Comm,
    mut state: MutexGuard<'_, CommState>,
    new: NewWindow,
) -> Result<Arc<Window>> {
    let backend = comm.clique.backend.clone();
    // The rank's abort word in the call records, which peers in other processes can raise,
    // where the backend's kernels can read it; else a flag of the window's own.
    let in_records = comm
        .call_records
        .as_ref()
        .and_then(|records| Some((records.abort_flag()?, records.clone())));
    let (abort, abort_in_records) = match in_records {
        Some((flag, records)) => (flag, Some(records)),
        None => (backend.alloc_flag(comm.device)?, None),
    };
    let seq = state.next_window_seq;
    state.next_window_seq += 1;
    let window = Arc::new(Window {
        seq,
        base: new.base,
        size: new.size,
        backend,
        device: comm.device,
        signal_pad: new.signal_pad,
        peer_pads: Mutex::new(Vec::new()),
        memory: Mutex::new(Vec::new()),
        exports: new.exports,
        imports: Mutex::new(Vec::new()),
        abort,
        abort_in_records,
        owner: new.owner,
        peer_view: new.peer_view,
        owner_resources: Mutex::new(new.owner_resources),
        context: OnceLock::new(),
        launches: Mutex::new(Default::default()),
    });
    state
        .windows
        .insert(window.handle() as usize, window.clone());
    drop(state);
    if let Err(e) = deposit(comm, &window) {
        comm.lock().windows.remove(&(window.handle() as usize));
        return Err(e);
    }
    Ok(window)
}

/// `symmCommWindowRegisterPeers` on one rank (and the engine adapters): a window over memory
/// another owner mapped into this process ([`crate::window::owner`]). Validate, zero this
/// rank's signal pad, deposit; completed like [`register`]'s windows, the peer tables taken
/// from `peers.view` instead of the deposits.
pub fn register_peers(comm: &Arc<Comm>, peers: PeerWindow) -> Result<Arc<Window>> {
    peer_registration_allowed(comm)?;
    let backend = comm.clique.backend.clone();
    let state = comm.lock();
    if let Err(e) =
        check_peer_window(comm, &peers).and_then(|()| check_peer_range(comm, &state, &peers))
    {
        drop(state);
        return Err(refuse_registration(comm, e));
    }
    let own_pad = peers.view.pads[comm.rank];
    // The bytes symm's barriers use (a larger pad is the owner's to keep).
    let zeros = vec![0u8; signal_pad_bytes(comm.clique.nranks)];
    backend.upload(comm.device, own_pad, &zeros)?;
    let signal_pad = Arc::new(SignalPad {
        backend,
        device: comm.device,
        address: own_pad,
        memory: None,
        borrowed: true,
    });
    add_window(
        comm,
        state,
        NewWindow {
            base: peers.base,
            size: peers.size,
            signal_pad,
            exports: None,
            owner: peers.owner,
            peer_view: Some(peers.view),
            owner_resources: peers.resources,
        },
    )
}

/// Whether `comm` takes a window over another owner's memory at all: not after
/// `symmCommFinalize`, nor after a failed registration on a multi-process communicator. A
/// refusal here is this rank's alone (its communicator is unusable for registrations).
pub fn peer_registration_allowed(comm: &Comm) -> Result<()> {
    crate::comm::refuse_if_finalized(comm, "symmCommWindowRegisterPeers")?;
    let state = comm.lock();
    match state
        .registration_failed
        .as_ref()
        .filter(|_| comm.link.is_some())
    {
        Some(failed) => Err(Error::invalid_usage(format!(
            "an earlier window registration on this communicator failed ({failed}); the ranks \
             of other processes may have given up on it: create a new communicator"
        ))),
        None => Ok(()),
    }
}

/// This rank refused its part of a registration (`error`, its description's fault): the
/// refusal takes the registration's number and is deposited in its place, so that every peer's
/// registration of that window fails at once, naming this rank, instead of waiting for it
/// until the timeout. Returns `error`.
pub(crate) fn refuse_registration(comm: &Comm, error: Error) -> Error {
    let seq = {
        let mut state = comm.lock();
        let seq = state.next_window_seq;
        state.next_window_seq += 1;
        if comm.link.is_some() {
            state.registration_failed = Some(error.message.clone());
        }
        seq
    };
    match &comm.link {
        Some(link) => {
            let refusal = WindowDeposit {
                base: 0,
                size: 0,
                signal_pad: 0,
                owner: (0, 0),
                refused: true,
                window_export: Vec::new(),
                pad_export: Vec::new(),
            };
            // The peers' registrations fail on this refusal (their second round then waits for
            // nothing); if the bootstrap is gone, they fail on that.
            let _ = link.contribute(seq, &refusal.encode());
            let _ = link.contribute(CONFIRM_TAG | seq, &[0]);
        }
        None => deposit_in_clique(
            comm,
            seq,
            Deposit {
                base: 0,
                size: 0,
                signal_pad: 0,
                local: true,
                owner: Owner::SYMM,
                refused: true,
            },
        ),
    }
    crate::log!(
        Level::Warn,
        Subsys::Reg,
        Some(comm.rank),
        "window #{seq} refused on this rank: {}",
        error.message
    );
    error
}

/// The description of a window over another owner's memory, on its own: one entry per rank,
/// this rank's entry its own bytes, every peer reachable, pads large enough, aligned and apart
/// from the window.
fn check_peer_window(comm: &Comm, peers: &PeerWindow) -> Result<()> {
    let nranks = comm.clique.nranks;
    let view = &peers.view;
    if peers.base == 0 {
        return Err(Error::invalid_argument("buff is NULL"));
    }
    if peers.size == 0 {
        return Err(Error::invalid_argument("bytes is 0"));
    }
    if view.bases.len() != nranks || view.pads.len() != nranks {
        return Err(Error::internal(format!(
            "a peer view of {} bases and {} pads for {nranks} ranks",
            view.bases.len(),
            view.pads.len()
        )));
    }
    let needed = signal_pad_bytes(nranks) as u64;
    if view.pad_bytes < needed {
        return Err(Error::invalid_argument(format!(
            "signalPadBytes = {}: a window of {nranks} ranks needs signal pads of at least \
             {needed} bytes (symmWindowSignalPadBytes)",
            view.pad_bytes
        )));
    }
    // An engine window reaches a peer without an address through the engine; its own
    // entries, and every entry of any other window, are addresses.
    let engine_window = peers.owner.kind.backend_tag() != symm_device::BackendTag::Native;
    for (table, name) in [(&view.bases, "peerBuffs"), (&view.pads, "peerSignalPads")] {
        if let Some(rank) = table
            .iter()
            .enumerate()
            .position(|(r, a)| *a == 0 && (!engine_window || r == comm.rank))
        {
            return Err(Error::invalid_argument(format!(
                "{name}[{rank}] is NULL: rank {rank}'s memory is not reachable by loads and \
                 stores from rank {} ({} maps no address for it here); symm's kernels need \
                 every peer of a window reachable",
                comm.rank,
                peers.owner.kind.name()
            )));
        }
        if let Some(rank) = table
            .iter()
            .position(|a| !a.is_multiple_of(WINDOW_ALIGNMENT))
        {
            return Err(Error::invalid_argument(format!(
                "{name}[{rank}] = {:#x} is not {WINDOW_ALIGNMENT}-byte aligned: the kernels \
                 access windows and pads {WINDOW_ALIGNMENT} bytes at a time",
                table[rank]
            )));
        }
    }
    if view.bases[comm.rank] != peers.base {
        return Err(Error::invalid_argument(format!(
            "peerBuffs[{rank}] = {:#x} is not buff ({:#x}): entry {rank} is this rank's own bytes",
            view.bases[comm.rank],
            peers.base,
            rank = comm.rank
        )));
    }
    // Every rank's bytes and pad are memory of their own, as this process maps them: two
    // ranks sharing bytes would reduce one rank's data twice, two sharing a pad would count
    // each other's barrier arrivals.
    let ranges: Vec<(String, std::ops::Range<u64>)> = view
        .bases
        .iter()
        .enumerate()
        .map(|(r, &b)| (format!("peerBuffs[{r}]"), b..b.saturating_add(peers.size)))
        .chain(view.pads.iter().enumerate().map(|(r, &p)| {
            (
                format!("peerSignalPads[{r}]"),
                p..p.saturating_add(view.pad_bytes),
            )
        }))
        // A peer reached through the engine has no range here.
        .filter(|(_, range)| range.start != 0)
        .collect();
    for (i, (name, range)) in ranges.iter().enumerate() {
        if let Some((other, _)) = ranges[i + 1..]
            .iter()
            .find(|(_, o)| crate::window::ranges_overlap(range, o))
        {
            return Err(Error::invalid_argument(format!(
                "{name} [{:#x}, +{}) overlaps {other}: every rank's window and signal pad are \
                 memory of their own",
                range.start,
                range.end - range.start
            )));
        }
    }
    Ok(())
}

/// A window over another owner's memory may join `comm`'s windows: its bytes and pad overlap
/// no window of the rank, and no earlier registration of a multi-process communicator failed.
fn check_peer_range(comm: &Comm, state: &CommState, peers: &PeerWindow) -> Result<()> {
    let pad = peers.view.pads[comm.rank];
    for (what, start, bytes) in [
        ("buff", peers.base, peers.size),
        ("this rank's signal pad", pad, peers.view.pad_bytes),
    ] {
        if start.checked_add(bytes).is_none() {
            return Err(Error::invalid_argument(format!(
                "{what} = {start:#x} (+{bytes}) wraps around the address space"
            )));
        }
        if let Some(other) = state
            .windows
            .values()
            .find(|w| w.overlaps_window_or_pad(start, bytes))
        {
            return Err(Error::invalid_argument(format!(
                "{what} [{start:#x}, +{bytes}) overlaps the window registered at {:#x} (+{}) \
                 or its signal pad",
                other.base, other.size
            )));
        }
        if state
            .allocations
            .range(..start.saturating_add(bytes))
            .next_back()
            .is_some_and(|(base, a)| start < base + a.size as u64)
        {
            return Err(Error::invalid_argument(format!(
                "{what} [{start:#x}, +{bytes}) overlaps a symmMemAlloc allocation of this comm: \
                 register symm's own memory with symmCommWindowRegister"
            )));
        }
    }
    Ok(())
}

/// Whether `register(comm, buff, size, flags)` would pass its checks now: the caller's own
/// registration is checked before the rank's point-to-point window is made with it, so that a
/// refused call registers nothing.
pub fn check_registration(comm: &Comm, buff: u64, size: usize, flags: c_int) -> Result<()> {
    check_arguments(buff, size, flags)?;
    crate::comm::refuse_if_finalized(comm, "symmCommWindowRegister")?;
    let state = comm.lock();
    check_range(comm, &state, buff, size as u64)
}

/// The arguments of `symmCommWindowRegister`, before anything is looked at.
fn check_arguments(buff: u64, size: usize, flags: c_int) -> Result<()> {
    if buff == 0 {
        return Err(Error::invalid_argument("buff is NULL"));
    }
    if size == 0 {
        return Err(Error::invalid_argument("size is 0"));
    }
    if flags & SYMM_WIN_COLL_SYMMETRIC == 0 || flags & !SYMM_WIN_COLL_SYMMETRIC != 0 {
        return Err(Error::invalid_argument(format!(
            "winFlags = {flags:#x}: must be SYMM_WIN_COLL_SYMMETRIC"
        )));
    }
    Ok(())
}

/// `[buff, buff + size)` may become a window of `comm`: inside one `symmMemAlloc` allocation,
/// overlapping no window, and no earlier registration of a multi-process communicator failed.
fn check_range(comm: &Comm, state: &CommState, buff: u64, size: u64) -> Result<()> {
    if let Some(failed) = state
        .registration_failed
        .as_ref()
        .filter(|_| comm.link.is_some())
    {
        return Err(Error::invalid_usage(format!(
            "an earlier window registration on this communicator failed ({failed}); the ranks \
             of other processes may have given up on it: create a new communicator"
        )));
    }
    if buff.checked_add(size).is_none() || !inside_allocation(state, buff, size) {
        return Err(Error::invalid_argument(format!(
            "[buff, buff + size) = [{buff:#x}, +{size}) is not inside one symmMemAlloc \
             allocation of this comm"
        )));
    }
    if let Some(other) = state.windows.values().find(|w| w.overlaps(buff, size)) {
        return Err(Error::invalid_argument(format!(
            "buff overlaps the window registered at {:#x} (+{})",
            other.base, other.size
        )));
    }
    Ok(())
}

/// The signal pad of a new window at `buff` (the caller makes it known to the clique's other
/// ranks of this process): shareable, with the exports ranks of other processes map, when the communicator has such
/// ranks.
fn new_signal_pad(
    comm: &Comm,
    state: &CommState,
    buff: u64,
) -> Result<(Arc<SignalPad>, Option<Exports>)> {
    let backend = &comm.clique.backend;
    let pad_bytes = signal_pad_bytes(comm.clique.nranks);
    let (address, memory, exports) = match comm.link.as_ref() {
        Some(link) if link.has_remote_peers() => {
            let (&allocation, memory) = state
                .allocations
                .range(..=buff)
                .next_back()
                .and_then(|(base, a)| Some((base, a.shared()?)))
                .ok_or_else(|| Error::internal("a window outside shareable memory"))?;
            let kind = link.export_kind();
            let (window_message, mut fds) = memory.export(buff - allocation, kind)?;
            let pad = Shareable::create(
                backend,
                comm.device,
                &comm.clique.local_devices(),
                pad_bytes,
                "symm-signal-pad",
            )?;
            let (pad_message, pad_fds) = pad.export(0, kind)?;
            fds.extend(pad_fds);
            let exports = Exports {
                window_message,
                pad_message,
                fds,
            };
            (pad.address(), Some(pad), Some(exports))
        }
        _ => (backend.alloc_zeroed(comm.device, pad_bytes)?, None, None),
    };
    let signal_pad = Arc::new(SignalPad {
        backend: backend.clone(),
        device: comm.device,
        address,
        memory,
        borrowed: false,
    });
    Ok((signal_pad, exports))
}

fn inside_allocation(state: &CommState, address: u64, bytes: u64) -> bool {
    state
        .allocations
        .range(..=address)
        .next_back()
        .is_some_and(|(base, a)| address + bytes <= base + a.size as u64)
}

fn deposit(comm: &Comm, window: &Window) -> Result<()> {
    if let Some(link) = &comm.link {
        return deposit_linked(comm, link, window);
    }
    deposit_in_clique(
        comm,
        window.seq,
        Deposit {
            base: window.base,
            size: window.size,
            signal_pad: window.signal_pad.address,
            local: true,
            owner: window.owner,
            refused: false,
        },
    );
    Ok(())
}

/// Put this rank's `deposit` for registration `seq` in the clique's exchange (a refusal also
/// counts as taken by this rank, which completes nothing), and wake the ranks waiting for it.
fn deposit_in_clique(comm: &Comm, seq: u64, deposit: Deposit) {
    let clique = &comm.clique;
    let mut exchange = clique.exchange.lock().unwrap_or_else(|e| e.into_inner());
    let registration = exchange
        .registrations
        .entry(seq)
        .or_insert_with(|| Registration {
            ranks: vec![None; clique.nranks],
            taken: 0,
        });
    registration.ranks[comm.rank] = Some(deposit);
    if deposit.refused {
        registration.taken += 1;
        if registration.taken == clique.nranks {
            exchange.registrations.remove(&seq);
        }
    }
    clique.exchange_changed.notify_all();
}

/// Deposit through the bootstrap: the all-gather contribution (returns at once), then the
/// window's and signal pad's memory to every rank of another process (queued on their
/// sockets, so one thread may deposit for several ranks before completing any).
fn deposit_linked(comm: &Comm, link: &RankLink, window: &Window) -> Result<()> {
    let (window_export, pad_export) = window.exports.as_ref().map_or_else(Default::default, |e| {
        (e.window_message.clone(), e.pad_message.clone())
    });
    let deposit = WindowDeposit {
        base: window.base,
        size: window.size,
        signal_pad: window.signal_pad.address,
        owner: (window.owner.kind.code(), window.owner.offset),
        refused: false,
        window_export,
        pad_export,
    };
    link.contribute(window.seq, &deposit.encode())?;
    if let Some(exports) = &window.exports
        && !exports.fds.is_empty()
    {
        let fds: Vec<BorrowedFd<'_>> = exports.fds.iter().map(AsFd::as_fd).collect();
        link.send_fds(window.seq, &fds, comm.clique.timeout)?;
    }
    Ok(())
}

/// Wait until every rank deposited this window's registration, then build this rank's
/// context. On failure the window is removed from the communicator.
pub fn complete(comm: &Arc<Comm>, window: &Arc<Window>) -> Result<()> {
    let started = start_completion(comm, window);
    finish_completion(comm, window, started)
}

/// The first half of [`complete`]: gather and build the context, and (through the bootstrap)
/// tell the others whether that worked. One thread completing several ranks' registrations
/// (a group) starts every one before finishing any, since finishing waits for every rank's
/// answer.
pub fn start_completion(comm: &Arc<Comm>, window: &Arc<Window>) -> Result<()> {
    match &comm.link {
        Some(link) => {
            let built = gather_linked(comm, link, window)
                .and_then(|deposits| build_context(comm, window, &deposits));
            let answer = link.contribute(CONFIRM_TAG | window.seq, &[built.is_ok() as u8]);
            built.and(answer)
        }
        None => gather(comm, window).and_then(|deposits| build_context(comm, window, &deposits)),
    }
}

/// The second half of [`complete`], given the first half's result.
pub fn finish_completion(
    comm: &Arc<Comm>,
    window: &Arc<Window>,
    started: Result<()>,
) -> Result<()> {
    let result = match &comm.link {
        Some(link) => {
            let result = started.and_then(|()| confirm(comm, link, window));
            link.forget_fds_up_to(window.seq);
            if let Err(e) = &result {
                comm.lock().registration_failed = Some(e.message.clone());
            }
            result
        }
        None => started,
    };
    let result = result.and_then(|()| super::pairs::enter_window(comm, window));
    match &result {
        Ok(()) => crate::log!(
            Level::Info,
            Subsys::Reg,
            Some(comm.rank),
            "window #{} registered: [{:#x}, +{} bytes) on device {}, signal pad {:#x}",
            window.seq,
            window.base,
            window.size,
            comm.device,
            window.signal_pad.address
        ),
        Err(e) => {
            crate::log!(
                Level::Warn,
                Subsys::Reg,
                Some(comm.rank),
                "window #{} registration failed: {}",
                window.seq,
                e.message
            );
            comm.lock().windows.remove(&(window.handle() as usize));
        }
    }
    result
}

/// All-gather tag bit of the confirmation round of a registration.
const CONFIRM_TAG: u64 = 1 << 62;

/// The second round of a registration through the bootstrap: every rank said whether it
/// built its context ([`start_completion`]), and the window exists only if all did. A rank
/// that failed (a bad import, a size mismatch, a timeout) makes every rank fail together,
/// instead of some holding a context over peers that gave up; and a rank whose earlier
/// registration failed can never complete a later one alone.
fn confirm(comm: &Comm, link: &RankLink, window: &Window) -> Result<()> {
    let answers = link.gathered(CONFIRM_TAG | window.seq, comm.clique.timeout)?;
    match answers.iter().position(|a| a.as_slice() != [1]) {
        None => Ok(()),
        Some(rank) => Err(Error::new(
            symmResult_t::symmRemoteError,
            format!(
                "rank {}: rank {rank} could not register window #{} (see its error)",
                comm.rank, window.seq
            ),
        )),
    }
}

fn gather(comm: &Comm, window: &Window) -> Result<Vec<Deposit>> {
    let clique = &comm.clique;
    let deadline = Instant::now() + clique.timeout;
    let mut exchange = clique.exchange.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let registration = exchange
            .registrations
            .get_mut(&window.seq)
            .ok_or_else(|| Error::internal("window registration vanished"))?;
        if registration.ranks.iter().all(Option::is_some) {
            let deposits: Vec<Deposit> = registration.ranks.iter().flatten().copied().collect();
            registration.taken += 1;
            if registration.taken == clique.nranks {
                exchange.registrations.remove(&window.seq);
            }
            return Ok(deposits);
        }
        let now = Instant::now();
        if now >= deadline {
            let missing: Vec<usize> = (0..clique.nranks)
                .filter(|r| registration.ranks[*r].is_none())
                .collect();
            // Withdraw this rank's deposit (under the lock, so no rank can take it from now
            // on): the window is dropped with this error, and a peer registering later must not
            // complete against its freed signal pad; it times out in turn.
            registration.ranks[comm.rank] = None;
            if registration.ranks.iter().all(Option::is_none) {
                exchange.registrations.remove(&window.seq);
            }
            return Err(Error::new(
                symmResult_t::symmTimeout,
                format!(
                    "rank {}: ranks {missing:?} did not register window #{} within {} ms \
                     (one thread driving several ranks must call symmCommWindowRegister \
                     between symmGroupStart and symmGroupEnd)",
                    comm.rank,
                    window.seq,
                    clique.timeout.as_millis()
                ),
            ));
        }
        exchange = clique
            .exchange_changed
            .wait_timeout(exchange, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Gather through the bootstrap: every rank's deposit, with the addresses of ranks of other
/// processes replaced by where their memory is mapped here.
fn gather_linked(comm: &Comm, link: &RankLink, window: &Window) -> Result<Vec<Deposit>> {
    let timeout = comm.clique.timeout;
    let deadline = Instant::now() + timeout;
    let contributions = link.gathered(window.seq, timeout).map_err(|e| {
        Error::new(
            e.code,
            format!(
                "rank {}: window #{} registration: {}",
                comm.rank, window.seq, e.message
            ),
        )
    })?;
    let deposits = contributions
        .iter()
        .enumerate()
        .map(|(r, bytes)| WindowDeposit::decode(bytes, r))
        .collect::<Result<Vec<_>>>()?;
    refused_by_a_rank(window, deposits.iter().map(|d| d.refused))?;
    let owners = deposits
        .iter()
        .enumerate()
        .map(|(rank, d)| {
            let kind = OwnerKind::from_code(d.owner.0).ok_or_else(|| {
                Error::internal(format!("rank {rank} sent an unknown window owner"))
            })?;
            Ok(Owner {
                kind,
                offset: d.owner.1,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    same_size_on_every_rank(window, deposits.iter().map(|d| d.size))?;
    same_owner_on_every_rank(window, owners.iter().copied())?;
    aligned_on_every_rank(comm, window, deposits.iter().map(|d| d.base))?;
    if window.peer_view.is_some() {
        // The owner mapped every rank's memory into this process: nothing to import.
        return Ok(deposits
            .iter()
            .enumerate()
            .map(|(rank, d)| Deposit {
                base: d.base,
                size: d.size,
                signal_pad: d.signal_pad,
                local: link.is_local(rank),
                owner: owners[rank],
                refused: false,
            })
            .collect());
    }
    let backend = &comm.clique.backend;
    let pad_bytes = signal_pad_bytes(comm.clique.nranks) as u64;
    let mut out = Vec::with_capacity(deposits.len());
    let mut imports = Vec::new();
    for (rank, d) in deposits.iter().enumerate() {
        if link.is_local(rank) {
            out.push(Deposit {
                base: d.base,
                size: d.size,
                signal_pad: d.signal_pad,
                local: true,
                owner: owners[rank],
                refused: false,
            });
            continue;
        }
        let memory = ExportMessage::decode(&d.window_export)?;
        let pad = ExportMessage::decode(&d.pad_export)?;
        let count = memory.descriptors() + pad.descriptors();
        let mut fds = if count > 0 {
            link.receive_fds(window.seq, rank as u32, count, deadline)?
        } else {
            Vec::new()
        };
        let pad_fds = fds.split_off(memory.descriptors());
        let memory = Imported::import(backend, comm.device, &memory, fds)?;
        let pad = Imported::import(backend, comm.device, &pad, pad_fds)?;
        if memory.region_len() < d.size || pad.region_len() < pad_bytes {
            return Err(Error::internal(format!(
                "rank {rank} exported less memory than window #{} needs",
                window.seq
            )));
        }
        out.push(Deposit {
            base: memory.address(),
            size: d.size,
            signal_pad: pad.address(),
            local: false,
            owner: owners[rank],
            refused: false,
        });
        imports.push(memory);
        imports.push(pad);
    }
    *window.imports.lock().unwrap_or_else(|e| e.into_inner()) = imports;
    Ok(out)
}

/// A symmetric window has the same size on every rank: an error naming the first rank whose
/// registration (`sizes`, by rank) differs from this rank's.
fn same_size_on_every_rank(window: &Window, sizes: impl IntoIterator<Item = u64>) -> Result<()> {
    match sizes
        .into_iter()
        .enumerate()
        .find(|(_, size)| *size != window.size)
    {
        Some((rank, size)) => Err(Error::invalid_argument(format!(
            "size = {}, but rank {rank} registered window #{} with size {size}: symmetric \
             windows have the same size on every rank",
            window.size, window.seq
        ))),
        None => Ok(()),
    }
}

/// No rank refused its part of the registration: else an error naming the first that did (its
/// own error names its bad argument).
fn refused_by_a_rank(window: &Window, refused: impl IntoIterator<Item = bool>) -> Result<()> {
    match refused.into_iter().position(|r| r) {
        Some(rank) => Err(Error::invalid_argument(format!(
            "rank {rank} refused its description of window #{} (its own error names the \
             argument): the window is registered on no rank",
            window.seq
        ))),
        None => Ok(()),
    }
}

/// Every rank's window has the same owner, at the same offset of its allocation: an error
/// naming the first rank whose registration (`owners`, by rank) differs from this rank's.
fn same_owner_on_every_rank(
    window: &Window,
    owners: impl IntoIterator<Item = Owner>,
) -> Result<()> {
    match owners
        .into_iter()
        .enumerate()
        .find(|(_, owner)| !owner.same_memory(&window.owner))
    {
        Some((rank, owner)) => Err(Error::invalid_argument(format!(
            "this rank's window #{} is {}, but rank {rank}'s is {}: every rank registers the \
             same bytes of the same owner's symmetric memory (window #{} is refused on every \
             rank)",
            window.seq,
            window.owner.describe(),
            owner.describe(),
            window.seq
        ))),
        None => Ok(()),
    }
}

/// Alignment of every rank's window base: the kernels access windows (this rank's and its
/// peers') 16 bytes at a time.
const WINDOW_ALIGNMENT: u64 = 16;

/// Every rank's window base (`bases`, by rank, each in its own address space) is
/// [`WINDOW_ALIGNMENT`]-aligned: else an error naming this rank's `buff`, or the first other
/// rank whose base is not. Checked once every rank deposited, like the size, so that every
/// rank of the registration fails together instead of the others waiting for one that
/// refused alone.
fn aligned_on_every_rank(
    comm: &Comm,
    window: &Window,
    bases: impl IntoIterator<Item = u64>,
) -> Result<()> {
    if !window.base.is_multiple_of(WINDOW_ALIGNMENT) {
        return Err(Error::invalid_argument(format!(
            "buff = {:#x} is not {WINDOW_ALIGNMENT}-byte aligned: a window's base must be a \
             multiple of {WINDOW_ALIGNMENT} bytes on every rank (window #{} is refused on every \
             rank)",
            window.base, window.seq
        )));
    }
    match bases
        .into_iter()
        .enumerate()
        .find(|(rank, base)| *rank != comm.rank && !base.is_multiple_of(WINDOW_ALIGNMENT))
    {
        Some((rank, base)) => Err(Error::invalid_argument(format!(
            "rank {rank} registered window #{} at {base:#x}, which is not {WINDOW_ALIGNMENT}-byte \
             aligned: a window's base must be a multiple of {WINDOW_ALIGNMENT} bytes on every rank",
            window.seq
        ))),
        None => Ok(()),
    }
}

fn build_context(comm: &Comm, window: &Window, deposits: &[Deposit]) -> Result<()> {
    refused_by_a_rank(window, deposits.iter().map(|d| d.refused))?;
    same_size_on_every_rank(window, deposits.iter().map(|d| d.size))?;
    same_owner_on_every_rank(window, deposits.iter().map(|d| d.owner))?;
    aligned_on_every_rank(comm, window, deposits.iter().map(|d| d.base))?;
    if let Some(view) = &window.peer_view {
        // An engine window when any rank reaches a peer only through the engine: every rank
        // then runs the engine's protocol (reachability need not be the same from every rank).
        let tag = deposits
            .iter()
            .map(|d| d.owner.kind.backend_tag())
            .find(|tag| *tag != BackendTag::Native)
            .unwrap_or(BackendTag::Native);
        let engine = if tag == BackendTag::Native {
            [0; 3]
        } else {
            view.engine
        };
        // The owner keeps every rank's memory and pad mapped while the window lives.
        return upload_context(
            comm,
            window,
            &view.bases,
            &view.pads,
            view.pad_bytes,
            (tag, engine),
        );
    }
    // Hold the signal pads of the other ranks of this process: this rank's kernels write into
    // them for as long as the window exists.
    let mut peer_pads = Vec::new();
    {
        let pads = comm
            .clique
            .signal_pads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (rank, d) in deposits.iter().enumerate() {
            if rank == comm.rank || !d.local {
                continue;
            }
            let pad = pads
                .get(&d.signal_pad)
                .and_then(Weak::upgrade)
                .ok_or_else(|| {
                    Error::invalid_usage(format!(
                        "rank {}: rank {rank} deregistered window #{} (or destroyed its \
                         communicator) before the registration completed",
                        comm.rank, window.seq
                    ))
                })?;
            peer_pads.push(pad);
        }
    }
    *window.peer_pads.lock().unwrap_or_else(|e| e.into_inner()) = peer_pads;
    // And the memory under the windows of this process's ranks: this rank's kernels write
    // into its peers' and its own (which a shrink may hand to another communicator).
    let mut memory = Vec::new();
    for (rank, d) in deposits.iter().enumerate() {
        let skip_peer = rank != comm.rank
            && crate::mutation::active(crate::mutation::Mutation::SkipPeerMemoryHold);
        if !d.local || skip_peer {
            continue;
        }
        match comm.clique.allocations.holding(d.base, d.size) {
            Some(allocation) => memory.push(allocation),
            None => {
                return Err(Error::invalid_usage(format!(
                    "rank {}: rank {rank} freed the memory of window #{} before the \
                     registration completed",
                    comm.rank, window.seq
                )));
            }
        }
    }
    *window.memory.lock().unwrap_or_else(|e| e.into_inner()) = memory;
    let bases: Vec<u64> = deposits.iter().map(|d| d.base).collect();
    let pads: Vec<u64> = deposits.iter().map(|d| d.signal_pad).collect();
    let pad_bytes = signal_pad_bytes(deposits.len()) as u64;
    upload_context(
        comm,
        window,
        &bases,
        &pads,
        pad_bytes,
        (BackendTag::Native, [0; 3]),
    )
}

/// Build this rank's context of `window` in device memory: the `SymmContext`, then the table
/// of every rank's window base and the table of every rank's signal pad.
fn upload_context(
    comm: &Comm,
    window: &Window,
    bases: &[u64],
    pads: &[u64],
    pad_bytes: u64,
    (tag, engine): (BackendTag, [u64; 3]),
) -> Result<()> {
    let nranks = bases.len();
    let ctx_bytes = std::mem::size_of::<SymmContext>();
    let table_bytes = nranks * 8;
    let backend = &comm.clique.backend;
    let total = ctx_bytes + 2 * table_bytes;
    let address = backend.alloc_zeroed(comm.device, total)?;
    let host = SymmContext {
        backend: tag as u32,
        version: CONTEXT_VERSION,
        rank: comm.rank as u32,
        world_size: nranks as u32,
        local_base: window.base,
        window_size: window.size,
        peer_bases: address + ctx_bytes as u64,
        peer_signal_pads: address + (ctx_bytes + table_bytes) as u64,
        signal_pad_size: pad_bytes,
        abort_flag: window.abort.device,
        timeout_ns: comm.clique.timeout.as_nanos().min(u64::MAX as u128) as u64,
        engine,
    };
    let mut image = Vec::with_capacity(total);
    image.extend_from_slice(bytemuck::bytes_of(&host));
    for address in bases.iter().chain(pads) {
        image.extend_from_slice(&address.to_ne_bytes());
    }
    if let Err(e) = backend.upload(comm.device, address, &image) {
        let _ = backend.free(comm.device, address);
        return Err(e);
    }
    window
        .context
        .set(DeviceContext { address, host })
        .map_err(|_| Error::internal("window completed twice"))
}

/// `symmCommWindowDeregister`.
pub fn deregister(comm: &Arc<Comm>, handle: symmWindow_t) -> Result<()> {
    if handle.is_null() {
        return Err(Error::invalid_argument("win is NULL"));
    }
    if !comm.lock().windows.contains_key(&(handle as usize)) {
        return Err(Error::invalid_argument(
            "win is not a window registered on this comm (never registered, or already \
             deregistered)",
        ));
    }
    // Every stream a collective on the window was enqueued on, not only the internal one: a
    // launch serving one rank runs on its caller's stream.
    comm.clique.backend.synchronize(&comm.resources)?;
    let window = comm.lock().windows.get(&(handle as usize)).cloned();
    if let Some(window) = &window {
        window.wait_for_launches()?;
        // Point-to-point launches read the window's context through the rank's table.
        super::pairs::wait_for_launches(comm)?;
        super::pairs::leave_window(comm, window)?;
    }
    // A kernel on this window may have raised its abort word (a timeout) since the host last
    // looked: record that failure now, while the window is still among the rank's windows,
    // so that later calls and `symmCommGetAsyncError` report it. Deregistration goes on
    // either way (the error is the communicator's, not this call's).
    if window.as_ref().is_some_and(|w| w.aborted()) {
        let _ = super::failure::check(comm);
    }
    let window = comm.lock().windows.remove(&(handle as usize));
    if let Some(window) = window.filter(|w| w.context().is_none()) {
        forget_registration(comm, &window);
    }
    Ok(())
}

/// Drop this rank's deposit of a registration that never completed.
fn forget_registration(comm: &Comm, window: &Window) {
    let mut exchange = comm
        .clique
        .exchange
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(registration) = exchange.registrations.get_mut(&window.seq) {
        registration.ranks[comm.rank] = None;
        if registration.ranks.iter().all(Option::is_none) {
            exchange.registrations.remove(&window.seq);
        }
    }
}

/// The live window of `comm` behind `handle`.
pub fn from_handle(comm: &Comm, handle: symmWindow_t) -> Result<Arc<Window>> {
    if handle.is_null() {
        return Err(Error::invalid_argument("win is NULL"));
    }
    comm.lock()
        .windows
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(|| Error::invalid_argument("win is not a window registered on this comm"))
}

/// The window of `comm` that holds `[address, address + bytes)`.
pub fn find(comm: &Comm, address: u64, bytes: u64) -> Option<Arc<Window>> {
    find_in(&comm.lock(), address, bytes)
}

/// Where a caller's buffer lies among a communicator's memory ([`placement`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Wholly in one registered window.
    InWindow,
    /// Outside the communicator's memory: a call on it can be staged.
    Outside,
    /// Not wholly in one window but into memory of the communicator in a way no caller
    /// means: it overlaps a registered window, or starts in a `symmMemAlloc` allocation and
    /// runs past its end. Such a buffer is refused, never staged (staging would copy memory
    /// past the end of what this communicator knows of).
    Overruns,
}

/// Where `[address, +bytes)` lies among `comm`'s windows and allocations.
pub fn placement(comm: &Comm, address: u64, bytes: u64) -> Placement {
    let state = comm.lock();
    if find_in(&state, address, bytes.max(1)).is_some() {
        return Placement::InWindow;
    }
    let end = address.saturating_add(bytes.max(1));
    let range = address..end;
    let in_window = state
        .windows
        .values()
        .any(|w| crate::window::ranges_overlap(&range, &(w.base..w.base + w.size)));
    let past_allocation = state
        .allocations
        .range(..=address)
        .next_back()
        .is_some_and(|(base, a)| address < base + a.size as u64 && end > base + a.size as u64);
    if in_window || past_allocation {
        Placement::Overruns
    } else {
        Placement::Outside
    }
}

/// The window that holds the range (not the communicator's point-to-point window).
fn find_in(state: &CommState, address: u64, bytes: u64) -> Option<Arc<Window>> {
    state
        .windows
        .values()
        .find(|w| w.contains(address, bytes) && !state.is_internal(w))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::backend::host::HostBackend;
    use std::time::Duration;

    fn host_ranks(nranks: usize, timeout_ms: u64) -> (Arc<Backend>, Vec<Arc<Comm>>) {
        let backend = Arc::new(Backend::Host(HostBackend::new()));
        let comms =
            crate::comm::init_all_on(backend.clone(), nranks, Duration::from_millis(timeout_ms))
                .expect("host ranks");
        (backend, comms)
    }

    fn allocated(backend: &Backend, address: u64) -> bool {
        match backend {
            Backend::Host(host) => host.is_allocated(address),
            _ => unreachable!("a host backend"),
        }
    }

    fn windows_of(comms: &[Arc<Comm>], bytes: usize) -> Vec<Arc<Window>> {
        let windows: Vec<Arc<Window>> = comms
            .iter()
            .map(|c| {
                let base = c.mem_alloc(bytes).expect("allocation");
                register(c, base, bytes, SYMM_WIN_COLL_SYMMETRIC).expect("registration")
            })
            .collect();
        for (c, w) in comms.iter().zip(&windows) {
            complete(c, w).expect("completion");
        }
        windows
    }

    /// A kernel's timeout that the host had not looked at yet outlives the window: after the
    /// deregistration, the rank's calls and `symmCommGetAsyncError` report it.
    #[test]
    fn a_timeout_raised_in_a_window_is_reported_after_its_deregistration() {
        let (_backend, comms) = host_ranks(2, 10_000);
        let windows = windows_of(&comms, 4096);
        // What a kernel on rank 0 does when rank 1 does not arrive.
        windows[0].raise_abort(symm_device::symmetric::abort_timed_out_waiting_for(1));
        deregister(&comms[0], windows[0].handle()).expect("deregistration");
        let error = crate::comm::failure::async_error(&comms[0])
            .expect("the timeout is still the communicator's error");
        assert_eq!(
            error.code,
            crate::abi::symmResult_t::symmTimeout,
            "{}",
            error.message
        );
        assert!(error.message.contains("rank 1"), "{}", error.message);
        // Rank 1 learns it too (same process).
        let peer = crate::comm::failure::async_error(&comms[1]).expect("rank 1 adopts it");
        assert_eq!(
            peer.code,
            crate::abi::symmResult_t::symmRemoteError,
            "{}",
            peer.message
        );
        deregister(&comms[1], windows[1].handle()).expect("deregistration");
    }

    /// A rank that destroys its communicator while its peer keeps the window: the peer's
    /// kernels still write into the rank's window memory, so it is freed only with the last
    /// window over it (`window::memory`).
    #[test]
    fn window_memory_lives_while_a_peer_window_writes_into_it() {
        let (backend, comms) = host_ranks(2, 10_000);
        let windows = windows_of(&comms, 4096);
        let base = windows[0].base;
        let peer = windows[1].handle();
        drop(windows);
        crate::comm::destroy(&comms[0]).expect("destroy");
        assert!(
            allocated(&backend, base),
            "rank 0's memory was freed while rank 1's window writes into it"
        );
        deregister(&comms[1], peer).expect("deregistration");
        assert!(
            !allocated(&backend, base),
            "the memory outlived every window"
        );
        crate::comm::destroy(&comms[1]).expect("destroy");
    }

    /// A shrink hands the rank's allocations to the new communicator, while the parent's
    /// windows on them stay: destroying the new communicator frees none of that memory until
    /// the parent's windows go too.
    #[test]
    fn a_window_keeps_its_own_memory_after_a_shrink_moved_it() {
        let (backend, comms) = host_ranks(2, 10_000);
        crate::comm::staging::attach_with(&comms, 4096).expect("staging windows");
        let staging = comms[0]
            .lock()
            .staging
            .as_ref()
            .expect("a staging window")
            .window
            .base;
        let request = crate::comm::shrink::Request {
            exclude: vec![1],
            number: crate::comm::shrink::take_number(&comms[0], &[1]),
            config: Default::default(),
            flags: 0,
        };
        let made = crate::comm::shrink::shrink(&comms[0], &request, false).expect("shrink");
        crate::comm::destroy(&comms[1]).expect("destroy the excluded rank");
        crate::comm::destroy(&made).expect("destroy the new communicator");
        assert!(
            allocated(&backend, staging),
            "the parent's staging window lost its memory"
        );
        crate::comm::destroy(&comms[0]).expect("destroy the parent");
        assert!(
            !allocated(&backend, staging),
            "the memory outlived its windows"
        );
    }

    /// A rank that deregisters while its peer keeps the window: the peer's kernels still write
    /// barrier arrivals into the rank's signal pad, so the pad is freed only with the last
    /// window that references it.
    #[test]
    fn a_signal_pad_lives_while_a_peer_window_writes_into_it() {
        let (backend, comms) = host_ranks(2, 10_000);
        let windows = windows_of(&comms, 4096);
        let pad = windows[1].signal_pad.address;
        let handles: Vec<symmWindow_t> = windows.iter().map(Window::handle).collect();
        drop(windows);
        deregister(&comms[1], handles[1]).expect("deregistration");
        assert!(
            allocated(&backend, pad),
            "rank 1's pad was freed while rank 0's window writes into it"
        );
        deregister(&comms[0], handles[0]).expect("deregistration");
        assert!(!allocated(&backend, pad), "the pad outlived every window");
        for c in &comms {
            crate::comm::destroy(c).expect("destroy");
        }
    }

    /// A registration that timed out is withdrawn: a peer registering later times out too,
    /// instead of completing against the dropped window (and its freed signal pad).
    #[test]
    fn a_timed_out_registration_is_withdrawn() {
        let (_backend, comms) = host_ranks(2, 50);
        let mut late = Vec::new();
        for c in &comms {
            let base = c.mem_alloc(256).expect("allocation");
            let window = register(c, base, 256, SYMM_WIN_COLL_SYMMETRIC).expect("registration");
            let error = complete(c, &window).expect_err("nobody else registers at this time");
            assert_eq!(error.code, symmResult_t::symmTimeout, "{}", error.message);
            late.push(window);
        }
        // Both took the same sequence number: a registration of both now completes.
        let windows = windows_of(&comms, 128);
        assert!(windows.iter().all(|w| w.seq == 1 && w.context().is_some()));
        drop((late, windows));
        for c in &comms {
            crate::comm::destroy(c).expect("destroy");
        }
    }
}
