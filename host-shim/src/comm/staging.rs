//! A communicator's staging window: registered by every rank at the communicator's creation
//! (so that staging a call never waits for a peer to make one), through which calls whose
//! buffers lie outside every registered window run (`collective::route`).

use crate::abi::SYMM_WIN_COLL_SYMMETRIC;
use crate::backend::{Backend, StreamMarks};
use crate::comm::{Comm, windows};
use crate::error::{Error, Result};
use crate::window::Window;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A communicator's staging window.
pub struct Staging {
    /// The window (registered like a user's, on every rank, at the communicator's creation).
    pub window: Arc<Window>,
    /// Set once the first staged call has been announced in the log.
    announced: AtomicBool,
    /// The stream of the last staged chunk, and the mark recorded on it after that chunk's
    /// copy out (see [`Staging::before_use`]).
    last: Mutex<Option<(u64, StreamMarks)>>,
}

/// Make the point-to-point window and the staging window of each of `comms` (ranks of one
/// communicator that this thread creates; one rank per thread, or every rank of an
/// `symmCommInitAll`), the latter of `SYMM_STAGING_BYTES` (none when 0 or under
/// `SYMM_STRICT_WINDOWS=1`). Every rank of the communicator makes them at its creation, so
/// that their registrations pair with the peers'.
pub fn attach(comms: &[Arc<Comm>]) -> Result<()> {
    let bytes = crate::config::staging_bytes()?;
    attach_with(comms, bytes)
}

/// [`attach`] with the staging window's size given (0: none). Ranks of other processes agreed
/// on it when they joined (`comm::join`), so that every rank registers its staging window, or
/// none does.
pub fn attach_with(comms: &[Arc<Comm>], bytes: u64) -> Result<()> {
    // The point-to-point window first (as a rank's first registration makes it), so that the
    // staging window enters the rank's table of windows a staged send names.
    let pair_bytes = |comm: &Arc<Comm>| {
        symm_device::sync::p2p::pair_region_bytes(comm.clique.nranks as u32) as u64
    };
    let needs_pairs: Vec<Arc<Comm>> = comms
        .iter()
        .filter(|c| c.lock().point_to_point.is_none())
        .cloned()
        .collect();
    for (comm, window, address) in register_each(&needs_pairs, pair_bytes)? {
        comm.lock().point_to_point = Some(super::pairs::PointToPoint::new(window.clone(), address));
        // Its own entry too: an empty message travels on it.
        super::pairs::enter_window(&comm, &window)?;
    }
    if bytes == 0 {
        return Ok(());
    }
    for (comm, window, _) in register_each(comms, |_| bytes).map_err(staging_error)? {
        comm.lock().staging = Some(Arc::new(Staging {
            window,
            announced: AtomicBool::new(false),
            last: Mutex::new(None),
        }));
    }
    Ok(())
}

/// A window [`register_each`] made: its rank, the window and its allocation's address.
type Registered = (Arc<Comm>, Arc<Window>, u64);

/// Allocate and register a window of `bytes(comm)` on each of `comms` (ranks of one
/// communicator this thread creates), completing every registration: the windows with their
/// allocations' addresses, or the first error (the allocations of windows not made are freed).
fn register_each(
    comms: &[Arc<Comm>],
    bytes: impl Fn(&Arc<Comm>) -> u64,
) -> Result<Vec<Registered>> {
    let mut made = Vec::with_capacity(comms.len());
    for comm in comms {
        let size = bytes(comm);
        let address = comm.mem_alloc(size as usize)?;
        match windows::register(comm, address, size as usize, SYMM_WIN_COLL_SYMMETRIC) {
            Ok(window) => made.push((comm, window, address)),
            Err(e) => {
                let _ = comm.mem_free(address);
                return Err(e);
            }
        }
    }
    // One thread completing several ranks' registrations starts every one before finishing
    // any (see `windows::start_completion`).
    let started: Vec<Result<()>> = made
        .iter()
        .map(|(comm, window, _)| windows::start_completion(comm, window))
        .collect();
    let mut first_error = None;
    let mut done = Vec::with_capacity(made.len());
    for ((comm, window, address), started) in made.into_iter().zip(started) {
        match windows::finish_completion(comm, &window, started) {
            Ok(()) => done.push((comm.clone(), window, address)),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    first_error.map_or(Ok(done), Err)
}

impl Staging {
    /// Before a chunk's copies into the window on `stream`: when the last staged chunk ran on
    /// another stream, wait (on the host) until it is done, since every stream shares the one
    /// staging window. Chunks on one stream are ordered by it. A stream being captured into a
    /// CUDA graph records no mark: its replays are ordered by the caller.
    pub fn before_use(&self, backend: &Backend, device: i32, stream: u64) -> Result<()> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match &*last {
            Some((previous, marks)) if *previous != stream => backend.wait_marks(device, marks),
            _ => Ok(()),
        }
    }

    /// After a chunk's copies out of the window on `stream`: mark where it ends.
    pub fn after_use(&self, backend: &Backend, device: i32, stream: u64) -> Result<()> {
        let launch = backend.mark_launch(device, &[stream])?;
        let mut marks = StreamMarks::default();
        marks.add(&launch);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((stream, marks));
        Ok(())
    }

    /// `true` the first time only: the first staged call of the communicator is said in the
    /// log, the later ones are not.
    pub fn first_staged(&self) -> bool {
        !self.announced.swap(true, Ordering::Relaxed)
    }
}

fn staging_error(e: Error) -> Error {
    Error::new(
        e.code,
        format!(
            "the communicator's staging window (SYMM_STAGING_BYTES, SYMM_STRICT_WINDOWS: alike \
             on every rank): {}",
            e.message
        ),
    )
}
