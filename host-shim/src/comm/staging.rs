//! A communicator's staging window: registered by every rank at the communicator's creation
//! (so that staging a call never waits for a peer to make one), through which calls whose
//! buffers lie outside every registered window run (`collective::route`).

use crate::abi::SYMM_WIN_COLL_SYMMETRIC;
use crate::comm::{Comm, windows};
use crate::error::{Error, Result};
use crate::window::Window;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A communicator's staging window.
pub struct Staging {
    /// The window (registered like a user's, on every rank, at the communicator's creation).
    pub window: Arc<Window>,
    /// Set once the first staged call has been announced in the log.
    announced: AtomicBool,
}

/// Make the staging window of each of `comms` (ranks of one communicator that this thread
/// creates; one rank per thread, or every rank of an `symmCommInitAll`), of
/// `SYMM_STAGING_BYTES` (none when 0 or under `SYMM_STRICT_WINDOWS=1`). Every rank of the
/// communicator makes it at its creation, so that its registration pairs with the peers'.
pub fn attach(comms: &[Arc<Comm>]) -> Result<()> {
    let bytes = crate::config::staging_bytes()?;
    attach_with(comms, bytes)
}

/// [`attach`] with the window's size given (0: none).
pub fn attach_with(comms: &[Arc<Comm>], bytes: u64) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    let mut made = Vec::with_capacity(comms.len());
    for comm in comms {
        let address = comm.mem_alloc(bytes as usize)?;
        match windows::register(comm, address, bytes as usize, SYMM_WIN_COLL_SYMMETRIC) {
            Ok(window) => made.push((comm, window)),
            Err(e) => {
                let _ = comm.mem_free(address);
                return Err(staging_error(e));
            }
        }
    }
    // One thread completing several ranks' registrations starts every one before finishing
    // any (see `windows::start_completion`).
    let started: Vec<Result<()>> = made
        .iter()
        .map(|(comm, window)| windows::start_completion(comm, window))
        .collect();
    let mut first_error = None;
    for ((comm, window), started) in made.into_iter().zip(started) {
        match windows::finish_completion(comm, &window, started) {
            Ok(()) => {
                comm.lock().staging = Some(Arc::new(Staging {
                    window,
                    announced: AtomicBool::new(false),
                }))
            }
            Err(e) => {
                first_error.get_or_insert(staging_error(e));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

impl Staging {
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
            "the communicator's staging window (SYMM_STAGING_BYTES; 0 makes none): {}",
            e.message
        ),
    )
}
