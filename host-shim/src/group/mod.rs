//! `symmGroupStart` / `symmGroupEnd`: one thread driving several ranks defers window
//! completion and collective launches to the end of the group, where every rank's part is
//! known and they can run together; collectives of one (collective, operator, data type) are
//! fused into one launch per device (see [`crate::group::fusion`]).

pub mod entry;
pub mod fusion;

use crate::abi::symmResult_t;
use crate::agree::Call;
use crate::collective::{self, Prepared, Request, Route, Task};
use crate::comm::{Clique, Comm, split, windows};
use crate::error::{Error, Result};
use crate::window::Window;
use fusion::Instance;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Work deferred to the end of the group.
pub enum Deferred {
    /// Finish a window registration.
    CompleteWindow(Arc<Comm>, Arc<Window>),
    /// Launch a collective.
    Collective(Task),
    /// Count a collective of count 0 (nothing to launch) as the rank's next call.
    Empty(Arc<Comm>, Call),
    /// A collective refused when it was called: the group's end refuses the whole group.
    Refused(Arc<Comm>, Error),
    /// A `symmCommSplit` of a rank, whose new handle goes to the caller's `newcomm` at the
    /// group's end.
    Split(Split),
    /// A `symmCommShrink` of a rank, likewise.
    Shrink(Shrink),
    /// A send or receive, launched with the group's other sends and receives.
    PointToPoint(crate::point_to_point::Task),
}

/// A `symmCommShrink` queued in a group.
pub struct Shrink {
    /// The parent rank.
    pub comm: Arc<Comm>,
    /// The call's arguments and number.
    pub request: crate::comm::shrink::Request,
    /// The caller's `newcomm`.
    pub out: SplitOut,
}

/// A `symmCommSplit` queued in a group.
pub struct Split {
    /// The parent rank.
    pub comm: Arc<Comm>,
    /// The split's number on the parent, taken when it was queued.
    pub number: u64,
    /// Its arguments, or why they were refused.
    pub request: split::Request,
    /// Where the new handle goes: the caller's `newcomm`, valid until the group's end by the
    /// call's contract (NULL: refused, nothing to write).
    pub out: SplitOut,
}

/// The caller's `newcomm` of a queued split.
pub struct SplitOut(pub *mut crate::abi::symmComm_t);

// SAFETY: the pointer is only written, once, at the group's end, by the contract of
// `symmCommSplit` valid until then; the group's end waits for every split it runs.
unsafe impl Send for SplitOut {}

impl SplitOut {
    /// Write the new handle (at the group's end).
    fn write(self, handle: crate::abi::symmComm_t) {
        if !self.0.is_null() {
            // SAFETY: `symmCommSplit`'s contract: `newcomm` is valid for a write until the
            // group's end, which this is.
            unsafe { self.0.write(handle) };
        }
    }
}

#[derive(Default)]
struct Group {
    depth: u32,
    deferred: Vec<Deferred>,
}

impl Drop for Group {
    /// A thread that exits with a group open: its queued work never runs, so it no longer
    /// holds its ranks' teardown back.
    fn drop(&mut self) {
        for item in &self.deferred {
            if item.uses_memory() {
                item.comm().queued_in_group.fetch_sub(1, Ordering::AcqRel);
            }
            if item.is_collective() {
                item.comm().release_call();
            }
        }
    }
}

std::thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
    static ENDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `true` between `symmGroupStart` and the matching `symmGroupEnd` on this thread.
pub fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// `true` while this thread runs the work of its outermost `symmGroupEnd`.
pub fn ending() -> bool {
    ENDING.with(|e| e.get())
}

/// Marks this thread as running a group's end while alive.
struct Ending;

impl Ending {
    fn start() -> Ending {
        ENDING.with(|e| e.set(true));
        publish_grouped();
        Ending
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        ENDING.with(|e| e.set(false));
        publish_grouped();
    }
}

/// Keep the failure layer's view of this thread current: its calls are grouped while a group
/// is open or its end runs (see `failure::set_thread_grouped`).
fn publish_grouped() {
    crate::comm::failure::set_thread_grouped(active() || ending());
}

impl Deferred {
    /// The rank the item belongs to.
    fn comm(&self) -> &Arc<Comm> {
        match self {
            Deferred::CompleteWindow(comm, _) => comm,
            Deferred::Collective(task) => &task.comm,
            Deferred::Empty(comm, _) | Deferred::Refused(comm, _) => comm,
            Deferred::Split(split) => &split.comm,
            Deferred::Shrink(shrink) => &shrink.comm,
            Deferred::PointToPoint(task) => &task.comm,
        }
    }

    /// `true` for an item that uses its rank's memory at the group's end (a registration, a
    /// collective to launch): while queued, teardown of the rank is refused.
    fn uses_memory(&self) -> bool {
        matches!(
            self,
            Deferred::CompleteWindow(..)
                | Deferred::Collective(..)
                | Deferred::Split(..)
                | Deferred::Shrink(..)
                | Deferred::PointToPoint(..)
        )
    }

    /// `true` for a collective (made, empty or refused): it holds its rank for this thread
    /// until the group's end (see [`Comm::enter_call`]).
    fn is_collective(&self) -> bool {
        !matches!(
            self,
            Deferred::CompleteWindow(..) | Deferred::Split(..) | Deferred::Shrink(..)
        )
    }
}

/// Queue `item` for the end of the group (its rank counts it as queued until then; a
/// collective keeps its rank held by this thread until then).
pub fn defer(item: Deferred) {
    if item.uses_memory() {
        item.comm().queued_in_group.fetch_add(1, Ordering::AcqRel);
    }
    if item.is_collective() {
        item.comm().hold_for_group();
    }
    GROUP.with(|g| g.borrow_mut().deferred.push(item));
}

/// Uncounts the queued items of a group when its end has run them (on every path out), and
/// releases the holds of its collectives.
struct Unqueue(Vec<(Arc<Comm>, bool, bool)>);

impl Drop for Unqueue {
    fn drop(&mut self) {
        for (comm, uses_memory, collective) in &self.0 {
            if *uses_memory {
                comm.queued_in_group.fetch_sub(1, Ordering::AcqRel);
            }
            if *collective {
                comm.release_call();
            }
        }
    }
}

/// A collective call of `comm` (`what` names it, for another thread's refusal): its arguments
/// validated and routed by `route` (in the caller's windows, or through the staging window in
/// chunks: `crate::staging`), then run now or, inside a group, queued to the group's end. This
/// is the one place that decides "now or at the group's end" for collectives (windows:
/// [`complete_window`]). A call refused after it reached the communicator is still the rank's
/// next collective (`Call::Refused`); inside a group, the group's end refuses the whole group.
/// Each chunk of a staged call is a collective of its own, in order.
pub fn collective(
    comm: &Arc<Comm>,
    what: &str,
    route: impl FnOnce() -> Result<Route>,
    stream: u64,
) -> Result<()> {
    if comm.span.get().is_some() {
        // Every rank making this call refuses it alike: not numbered.
        return Err(crate::comm::span::unsupported(what));
    }
    let _call = comm.enter_call(what)?;
    match route() {
        Err(error) => run_prepared(comm, Err(error), stream),
        Ok(Route::Windows(request)) => run_prepared(comm, Ok(request), stream),
        Ok(Route::Staged(chunks)) => {
            for request in chunks {
                run_prepared(comm, Ok(request), stream)?;
            }
            Ok(())
        }
    }
}

/// Plan `request` and run it now or queue it to the group's end (see [`collective`]).
fn run_prepared(comm: &Arc<Comm>, request: Result<Request>, stream: u64) -> Result<()> {
    let prepared = request.and_then(|request| collective::prepare(comm, request, stream));
    let grouped = active();
    match prepared {
        Err(error) if grouped => {
            defer(Deferred::Refused(comm.clone(), error.clone()));
            Err(error)
        }
        Err(error) => Err(collective::record_refusal(comm, error)),
        Ok(Prepared::Empty(call)) if grouped => {
            defer(Deferred::Empty(comm.clone(), call));
            Ok(())
        }
        Ok(Prepared::Empty(call)) => collective::agree_call(comm, &call).map(|_| ()),
        Ok(Prepared::Task(task)) if grouped => {
            defer(Deferred::Collective(task));
            Ok(())
        }
        Ok(Prepared::Task(task)) => {
            let plan = task.plan;
            collective::execute(&[vec![&task]], &plan)
        }
    }
}

/// Finish `window`'s registration on `comm` now or, inside a group, at the group's end (where
/// every rank's registration is known).
pub fn complete_window(comm: &Arc<Comm>, window: &Arc<Window>) -> Result<()> {
    if active() {
        defer(Deferred::CompleteWindow(comm.clone(), window.clone()));
        Ok(())
    } else {
        windows::complete(comm, window)
    }
}

/// A `symmSend` or `symmRecv` of `comm`: validated, then run now or, inside a group, queued
/// to the group's end, where the rank's sends and receives run in one launch.
pub fn point_to_point(
    comm: &Arc<Comm>,
    call: crate::point_to_point::Call,
    stream: u64,
) -> Result<()> {
    let what = crate::point_to_point::describe(&call);
    if comm.span.get().is_some() {
        // Its pairs refuse it alike: not numbered, so that ranks that make no such call stay in
        // step.
        return Err(crate::comm::span::unsupported(&what));
    }
    let _call = comm.enter_call(&what)?;
    if !active() && usize::try_from(call.peer).is_ok_and(|p| p == comm.rank) {
        // Nothing can pair with it: its matching call would have to be in the same launch.
        let name = if call.send { "symmSend" } else { "symmRecv" };
        return Err(Error::invalid_usage(format!(
            "peer = {} is this rank: a {name} to itself pairs only with its matching call in \
             the same group (symmGroupStart ... symmGroupEnd)",
            call.peer
        )));
    }
    let task = crate::point_to_point::validate(comm, &call, stream)?;
    if active() {
        defer(Deferred::PointToPoint(task));
        return Ok(());
    }
    crate::point_to_point::run(&[task])
}

/// Register `[address, +size)` of `comm` as a window with `flags`, as `symmCommWindowRegister`
/// does for both front ends: the caller's arguments checked first (a refused call registers
/// nothing), the point-to-point window made by the rank's first registration, the registration
/// completed now or, inside a group, at its end.
pub fn register_window(
    comm: &Arc<Comm>,
    address: u64,
    size: usize,
    flags: std::ffi::c_int,
) -> Result<Arc<Window>> {
    windows::check_registration(comm, address, size, flags)?;
    ensure_point_to_point_window(comm)?;
    let window = windows::register(comm, address, size, flags)?;
    complete_window(comm, &window)?;
    Ok(window)
}

/// `symmCommWindowRegisterPeers` (and the engine adapters): as [`register_window`], over
/// memory another owner mapped.
pub fn register_peer_window(
    comm: &Arc<Comm>,
    peers: crate::window::owner::PeerWindow,
) -> Result<Arc<Window>> {
    windows::peer_registration_allowed(comm)?;
    // Before the description is checked: a description refused on this rank still takes its
    // registration's number on every rank (`windows::register_peers`), after the
    // point-to-point window every rank makes at its first registration.
    ensure_point_to_point_window(comm)?;
    let window = windows::register_peers(comm, peers)?;
    complete_window(comm, &window)?;
    Ok(window)
}

/// A peer-window registration this rank cannot make after all (`error`: the owner's side of
/// it failed on this rank): refused in its place, so that every peer's registration of that
/// window fails at once, naming this rank, instead of waiting for it. Returns the error.
pub fn refuse_peer_window(comm: &Arc<Comm>, error: Error) -> Error {
    if let Err(e) =
        windows::peer_registration_allowed(comm).and_then(|()| ensure_point_to_point_window(comm))
    {
        return e;
    }
    windows::refuse_registration(comm, error)
}

/// Register `comm`'s point-to-point window (`comm::pairs`) unless it has one: called by the
/// rank's window registrations before the caller's own, so that every rank makes it at its
/// first one; completed now or, inside a group, at the group's end.
pub fn ensure_point_to_point_window(comm: &Arc<Comm>) -> Result<()> {
    if comm.lock().point_to_point.is_some() {
        return Ok(());
    }
    let bytes = symm_device::sync::p2p::pair_region_bytes(comm.clique.nranks as u32) as usize;
    let address = comm.mem_alloc(bytes)?;
    let registered = windows::register(comm, address, bytes, crate::abi::SYMM_WIN_COLL_SYMMETRIC);
    let window = match registered {
        Ok(window) => window,
        Err(e) => {
            let _ = comm.mem_free(address);
            return Err(e);
        }
    };
    comm.lock().point_to_point = Some(crate::comm::pairs::PointToPoint::new(
        window.clone(),
        address,
    ));
    complete_window(comm, &window)
}

/// `symmGroupStart`: groups nest.
pub fn start() -> Result<()> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        g.depth = g
            .depth
            .checked_add(1)
            .ok_or_else(|| Error::invalid_usage("groups nested too deeply"))?;
        Ok(())
    })?;
    publish_grouped();
    Ok(())
}

/// `symmGroupEnd`: at the outermost end, complete windows, then run every collective (on the
/// host backend concurrently, one thread per task, and wait for all).
pub fn end() -> Result<()> {
    let deferred = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "symmGroupEnd without a matching symmGroupStart",
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            std::mem::take(&mut g.deferred)
        } else {
            Vec::new()
        })
    })?;
    publish_grouped();

    let _unqueue = Unqueue(
        deferred
            .iter()
            .map(|item| {
                (
                    item.comm().clone(),
                    item.uses_memory(),
                    item.is_collective(),
                )
            })
            .collect(),
    );
    let _ending = Ending::start();
    let Sorted {
        registrations,
        tasks,
        empties,
        in_order,
        refusal,
        splits,
        shrinks,
        peers,
    } = sort(deferred);
    let mut first_error: Option<Error> = None;
    // The splits first: a rank whose peers split and then call collectives outside a group
    // meets them in that order.
    let mut remote_error = None;
    for (comm, result) in run_splits(splits).into_iter().chain(run_shrinks(shrinks)) {
        if let Err(e) = result {
            comm.set_last_error(&e.message);
            // The group's own refusal, rather than its echo on a peer.
            if e.code == symmResult_t::symmRemoteError {
                remote_error.get_or_insert(e);
            } else {
                first_error.get_or_insert(e);
            }
        }
    }
    if first_error.is_none() {
        first_error = remote_error;
    }
    let mut record = |comm: &Comm, result: Result<()>| {
        if let Err(e) = result {
            comm.set_last_error(&e.message);
            first_error.get_or_insert(e);
        }
    };
    for (comm, window, started) in registrations {
        let result = windows::finish_completion(&comm, &window, started);
        record(&comm, result);
    }
    let instances = group_collectives(&tasks, refusal, &in_order)?;
    for (comm, call) in &empties {
        let result = crate::comm::failure::check(comm)
            .and_then(|()| collective::agree_call(comm, call).map(|_| ()));
        record(comm, result);
    }
    for batch in fusion::fuse(instances) {
        if let Err(e) = run_batch(&batch) {
            first_error.get_or_insert(e);
        }
    }
    // The sends and receives last, each rank's in one launch (batch_isend_irecv).
    if !peers.is_empty()
        && let Err(e) = crate::point_to_point::run(&peers)
    {
        for task in &peers {
            task.comm.set_last_error(&e.message);
        }
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

/// Run a group's splits side by side (each waits for the other ranks' parts), writing each
/// new handle (NULL for no color, or on failure) to its caller's `newcomm`. A split's number
/// was taken when it was queued, so a rank's splits pair with its peers' in call order.
fn run_splits(splits: Vec<Split>) -> Vec<(Arc<Comm>, Result<()>)> {
    run_beside(
        splits,
        |item| item.comm.clone(),
        |item| {
            let made = split::split_numbered(&item.comm, item.number, item.request);
            (item.out, made)
        },
    )
}

/// Run a group's shrinks side by side, as [`run_splits`] runs splits (this group's end holds
/// their ranks).
fn run_shrinks(shrinks: Vec<Shrink>) -> Vec<(Arc<Comm>, Result<()>)> {
    run_beside(
        shrinks,
        |item| item.comm.clone(),
        |item| {
            let made = crate::comm::shrink::shrink(&item.comm, &item.request, true).map(Some);
            (item.out, made)
        },
    )
}

/// Run `run` on every item, each on a thread of its own (still this group's end), and write
/// the new communicator each makes (NULL for none, or on failure) through its `newcomm`; each
/// item's rank (`comm_of`) with its result (a panic is an internal error).
fn run_beside<T: Send>(
    items: Vec<T>,
    comm_of: impl Fn(&T) -> Arc<Comm>,
    run: impl Fn(T) -> (SplitOut, Result<Option<Arc<Comm>>>) + Sync,
) -> Vec<(Arc<Comm>, Result<()>)> {
    let run = &run;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| {
                let comm = comm_of(&item);
                let handle = scope.spawn(move || {
                    let _ending = Ending::start();
                    let (out, made) = run(item);
                    out.write(match &made {
                        Ok(Some(made)) => made.handle(),
                        _ => std::ptr::null_mut(),
                    });
                    made.map(|_| ())
                });
                (comm, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(comm, h)| {
                let result = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::internal("a split or shrink panicked")));
                (comm, result)
            })
            .collect()
    })
}

/// The group's collectives as instances to fuse and launch, unless one of them was refused
/// when it was called (`refusal`) or their parts do not match: then nothing of the group is
/// launched, and every collective of it (its ranks `in_order`) counts as refused on its rank.
/// Ranks whose whole group this thread drove stay usable (they all refused the same calls); a
/// rank whose peers run elsewhere and made these calls fails the communicator instead of
/// pairing its next call with theirs.
fn group_collectives<'t>(
    tasks: &'t [Task],
    refusal: Option<Error>,
    in_order: &[Arc<Comm>],
) -> Result<Vec<Instance<'t>>> {
    let instances = match refusal {
        Some(e) => Err(Error::new(
            e.code,
            format!("{}; nothing of this group was launched", e.message),
        )),
        None => collectives(tasks),
    };
    instances.inspect_err(|e| {
        for comm in in_order {
            let refused = collective::record_refusal(comm, e.clone());
            comm.set_last_error(&refused.message);
        }
    })
}

/// A group's deferred work by kind; the group's collectives hold their ranks for this thread
/// since they were queued.
struct Sorted {
    /// Window registrations, each with its first half started.
    registrations: Vec<(Arc<Comm>, Arc<Window>, Result<()>)>,
    /// Collectives to launch.
    tasks: Vec<Task>,
    /// Collectives of count 0.
    empties: Vec<(Arc<Comm>, Call)>,
    /// The rank of every collective of the group in call order (made, empty or refused).
    in_order: Vec<Arc<Comm>>,
    /// The first collective refused when it was called.
    refusal: Option<Error>,
    /// Splits and shrinks, run before the registrations and collectives.
    splits: Vec<Split>,
    shrinks: Vec<Shrink>,
    /// Sends and receives, launched after the collectives.
    peers: Vec<crate::point_to_point::Task>,
}

/// Sort `deferred`, starting every registration's first half before any second half (see
/// `windows::start_completion`).
fn sort(deferred: Vec<Deferred>) -> Sorted {
    let mut sorted = Sorted {
        registrations: Vec::new(),
        tasks: Vec::new(),
        empties: Vec::new(),
        in_order: Vec::new(),
        refusal: None,
        splits: Vec::new(),
        shrinks: Vec::new(),
        peers: Vec::new(),
    };
    for item in deferred {
        match item {
            Deferred::CompleteWindow(comm, window) => {
                let started = windows::start_completion(&comm, &window);
                sorted.registrations.push((comm, window, started));
            }
            Deferred::Collective(task) => {
                // A staged call is one call of its rank however many chunks it takes: a
                // refused group counts it once, as its peers count theirs.
                if task.staged.as_ref().is_none_or(|c| c.of_call.first == 0) {
                    sorted.in_order.push(task.comm.clone());
                }
                sorted.tasks.push(task);
            }
            Deferred::Empty(comm, call) => {
                sorted.in_order.push(comm.clone());
                sorted.empties.push((comm, call));
            }
            Deferred::Refused(comm, error) => {
                sorted.in_order.push(comm);
                sorted.refusal.get_or_insert(error);
            }
            Deferred::Split(split) => sorted.splits.push(split),
            Deferred::Shrink(shrink) => sorted.shrinks.push(shrink),
            Deferred::PointToPoint(task) => sorted.peers.push(task),
        }
    }
    sorted
}

/// Plan and run one fused batch: one launch per device (on the host backend side by side, one
/// thread each, since host launches return when done). A batch that cannot be planned counts
/// as refused calls on its ranks. The first error, after each failed launch's ranks have it as
/// their last error.
fn run_batch(batch: &fusion::Batch<'_>) -> Result<()> {
    let plan = match batch.plan() {
        Ok(plan) => plan,
        Err(e) => {
            for task in batch.instances.iter().flatten() {
                let refused = collective::record_refusal(&task.comm, e.clone());
                task.comm.set_last_error(&refused.message);
            }
            return Err(e);
        }
    };
    let launches = batch.launches();
    let results: Vec<Result<()>> = if launches.len() > 1 && launches[0][0][0].runs_to_completion() {
        std::thread::scope(|scope| {
            let handles: Vec<_> = launches
                .iter()
                .map(|parts| {
                    scope.spawn(|| {
                        // Still this group's end, on a helper thread.
                        let _ending = Ending::start();
                        collective::execute(parts, &plan)
                    })
                })
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
        // Enqueued without blocking the host (cuda), one launch per device.
        launches
            .iter()
            .map(|parts| collective::execute(parts, &plan))
            .collect()
    };
    let mut first_error = None;
    for (parts, result) in launches.iter().zip(results) {
        if let Err(e) = result {
            for task in parts.iter().flatten() {
                task.comm.set_last_error(&e.message);
            }
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The group's collectives, in order, each as its parts (ranks in ascending order). As in
/// NCCL, the `k`-th collective call of each rank of a clique in the group is one collective;
/// its parts must agree ([`check_parts`]). Ordering the collectives by their first call keeps
/// every rank's call order.
fn collectives(tasks: &[Task]) -> Result<Vec<Instance<'_>>> {
    let mut calls: HashMap<*const Comm, u64> = HashMap::new();
    let mut index: HashMap<(*const Clique, u64), usize> = HashMap::new();
    let mut instances: Vec<Vec<&Task>> = Vec::new();
    for task in tasks {
        let k = calls.entry(Arc::as_ptr(&task.comm)).or_insert(0);
        let key = (Arc::as_ptr(&task.comm.clique), *k);
        *k += 1;
        let i = *index.entry(key).or_insert_with(|| {
            instances.push(Vec::new());
            instances.len() - 1
        });
        instances[i].push(task);
    }
    for (k, parts) in instances.iter().enumerate() {
        check_parts(k, parts)?;
    }
    Ok(instances
        .into_iter()
        .map(|mut parts| {
            parts.sort_by_key(|t| t.comm.rank);
            parts
        })
        .collect())
}

/// The parts of one collective (`index`-th of the group) must agree on what every rank's
/// kernel assumes: collective, kernel, count, broadcast root, launch shape, and the symmetric
/// offsets and windows wherever a rank uses them.
fn check_parts(index: usize, parts: &[&Task]) -> Result<()> {
    // Every pair: a buffer one rank's kernel does not take as its peers' is compared only
    // between ranks that both do, so agreement is not transitive.
    let pairs = (0..parts.len()).flat_map(|i| (i + 1..parts.len()).map(move |j| (i, j)));
    for (i, j) in pairs {
        let (a, b) = (parts[i], parts[j]);
        let mut differences = a.signature(&a.plan).differences(&b.signature(&b.plan));
        if a.collective == b.collective && a.plan.block != b.plan.block {
            differences.push(format!(
                "launch shape {}x{} vs {}x{}",
                a.plan.grid, a.plan.block, b.plan.grid, b.plan.block
            ));
        }
        if !differences.is_empty() {
            return Err(Error::invalid_usage(format!(
                "collective #{index} of the group (the {}-th call of each rank) does not match \
                 between rank {} and rank {}: {}; nothing of this group was launched",
                index + 1,
                a.comm.rank,
                b.comm.rank,
                differences.join(", ")
            )));
        }
    }
    Ok(())
}
