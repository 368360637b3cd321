//! Symmetric windows: one rank's registered buffer ([`Window`]), its signal pad, the device
//! context built once every rank registered, and the clique's exchange of registrations in
//! flight. Registration itself (the rendezvous of all ranks) is `comm::windows`.

pub mod memory;
pub mod owner;

use crate::abi::symmWindow_t;
use crate::agree::records::CallRecords;
use crate::backend::{Backend, Flag, LaunchMarks, StreamMarks};
use crate::error::Result;
use crate::transport::shareable::{Imported, Shareable};
use owner::{Owner, PeerView};
use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use symm_device::context::SymmContext;

/// What one rank contributes to a window registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deposit {
    pub(crate) base: u64,
    pub(crate) size: u64,
    pub(crate) signal_pad: u64,
    /// The rank refused its description of the registration (a window over another owner's
    /// memory): every rank's registration fails, naming it.
    pub(crate) refused: bool,
    /// The rank runs in this process: its signal pad is a [`SignalPad`] of this process,
    /// found through [`Clique::signal_pads`](crate::comm::Clique::signal_pads) (else it is
    /// mapped from another process, and the mapping is kept by the window's imports).
    pub(crate) local: bool,
    /// Who owns the window's memory, and where the window lies in it.
    pub(crate) owner: Owner,
}

/// A window's signal pad. Every rank of the registration writes into it (barrier arrivals,
/// low-latency lines), so it lives as long as any window that references it: its own, and
/// those of the ranks of this process that registered with it. A rank that deregisters or
/// destroys its communicator while a peer still holds the window therefore never frees memory
/// that the peer's kernels write (they time out waiting for it instead).
pub struct SignalPad {
    pub(crate) backend: Arc<Backend>,
    pub(crate) device: i32,
    /// Its address.
    pub address: u64,
    /// The shareable memory behind it, when ranks of other processes map it.
    pub(crate) memory: Option<Shareable>,
    /// Memory of the window's owner (a window over another library's memory): never freed
    /// by symm.
    pub(crate) borrowed: bool,
}

impl Drop for SignalPad {
    fn drop(&mut self) {
        if self.memory.is_none() && !self.borrowed {
            let _ = self.backend.free(self.device, self.address);
        }
    }
}

/// The signal pads of a clique's windows in this process, by address (each entry lives while
/// some window holds the pad).
pub type SignalPads = Mutex<HashMap<u64, Weak<SignalPad>>>;

/// One registration in flight.
pub(crate) struct Registration {
    pub(crate) ranks: Vec<Option<Deposit>>,
    pub(crate) taken: usize,
}

/// Registrations in flight on a clique, by sequence number.
#[derive(Default)]
pub struct Exchange {
    pub(crate) registrations: HashMap<u64, Registration>,
}

/// The device context of a completed window: one allocation holding the `SymmContext` and the
/// peer tables.
pub struct DeviceContext {
    /// Device address of the `SymmContext`.
    pub address: u64,
    /// A host copy of the context.
    pub host: SymmContext,
}

/// One rank's registered window.
pub struct Window {
    /// Registration sequence number (the same on every rank).
    pub seq: u64,
    /// Base address of this rank's buffer.
    pub base: u64,
    /// Size in bytes.
    pub size: u64,
    pub(crate) backend: Arc<Backend>,
    pub(crate) device: i32,
    pub(crate) signal_pad: Arc<SignalPad>,
    /// The signal pads of the other ranks of this process in the registration, kept alive
    /// while this window may write into them.
    pub(crate) peer_pads: Mutex<Vec<Arc<SignalPad>>>,
    /// The allocations under the windows of this registration's ranks in this process (its
    /// own rank's and its peers'), kept while this window's kernels may write into them (see
    /// [`memory`]).
    pub(crate) memory: Mutex<Vec<Arc<memory::Allocation>>>,
    /// How ranks of other processes map this window and its signal pad.
    pub(crate) exports: Option<Exports>,
    /// Peers' windows and signal pads mapped into this process (ranks of other processes).
    pub(crate) imports: Mutex<Vec<Imported>>,
    /// The abort word its kernels look at: its own flag, or its rank's word in the call
    /// records (`abort_in_records`), which peers in other processes raise too.
    pub(crate) abort: Flag,
    /// The call records holding [`Window::abort`], kept alive while the window is (`None`:
    /// the window owns its flag).
    pub(crate) abort_in_records: Option<Arc<CallRecords>>,
    /// Who owns the window's memory.
    pub owner: Owner,
    /// Where every rank's bytes and pad are, for a window over another owner's memory
    /// (`None`: symm's own window, whose peers' memory symm mapped from their deposits).
    pub(crate) peer_view: Option<PeerView>,
    /// What an adapter allocated through the owner for this window (its signal pads),
    /// released with the window, after its context.
    pub(crate) owner_resources: Mutex<Option<Box<dyn Any + Send + Sync>>>,
    pub(crate) context: OnceLock<DeviceContext>,
    /// The callers' streams its collectives were enqueued on ([`Window::note_launch`]),
    /// waited for before it is torn down ([`Window::wait_for_launches`]).
    pub(crate) launches: Mutex<StreamMarks>,
}

impl Window {
    /// The handle given to C.
    pub fn handle(self: &Arc<Self>) -> symmWindow_t {
        Arc::as_ptr(self) as symmWindow_t
    }

    /// The device context, once the registration completed on every rank.
    pub fn context(&self) -> Option<&DeviceContext> {
        self.context.get()
    }

    /// `true` if `[address, address + bytes)` lies inside the window.
    pub fn contains(&self, address: u64, bytes: u64) -> bool {
        address >= self.base
            && address
                .checked_add(bytes)
                .is_some_and(|end| end <= self.base + self.size)
    }

    /// `true` if `[address, address + bytes)` shares a byte with the window.
    pub fn overlaps(&self, address: u64, bytes: u64) -> bool {
        ranges_overlap(&(address..address.saturating_add(bytes)), &self.range())
    }

    /// `true` if `[address, address + bytes)` shares a byte with the window or, for a window
    /// over another owner's memory, with this rank's signal pad (which the owner lent and the
    /// window's barriers write).
    pub fn overlaps_window_or_pad(&self, address: u64, bytes: u64) -> bool {
        let range = address..address.saturating_add(bytes);
        let pad = self.peer_view.as_ref().map(|view| {
            let start = self.signal_pad.address;
            start..start.saturating_add(view.pad_bytes)
        });
        ranges_overlap(&range, &self.range()) || pad.is_some_and(|p| ranges_overlap(&range, &p))
    }

    /// Never release what an owner lent for this window (see `comm::abort`).
    pub fn leak_owner_resources(&self) {
        let lent = self
            .owner_resources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        std::mem::forget(lent);
    }

    /// The window's bytes, `[base, base + size)`.
    pub fn range(&self) -> Range<u64> {
        self.base..self.base + self.size
    }

    /// `true` once a kernel on this window gave up waiting for a peer. The word is readable
    /// from the host without a copy on both backends; on the cuda backend it reflects the
    /// kernels that have run so far.
    pub fn aborted(&self) -> bool {
        self.abort.read() != 0
    }

    /// The abort word: 0, a timeout (`ABORT_TIMED_OUT` in the low byte, the peer waited for
    /// above it), `ABORT_INVALID_LAUNCH` or `ABORT_PEER_FAILED` (`symm_device::symmetric`).
    pub fn abort_word(&self) -> u32 {
        self.abort.read()
    }

    /// Raise the abort word to `value` unless it is raised already: kernels on this window
    /// give up at their next look.
    pub fn raise_abort(&self, value: u32) {
        self.abort.raise(value);
    }

    /// Record that a launch using this window was just enqueued, with its marks on the
    /// callers' streams ([`Backend::mark_launch`]).
    pub fn note_launch(&self, launch: &LaunchMarks) {
        self.launches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(launch);
    }

    /// Wait until every launch that used this window is done, on every stream it was
    /// enqueued on: before the window (its context, its signal pad) or its memory is freed.
    pub fn wait_for_launches(&self) -> Result<()> {
        if crate::mutation::active(crate::mutation::Mutation::SkipWindowStreamWait) {
            return Ok(());
        }
        let marks = self.launches.lock().unwrap_or_else(|e| e.into_inner());
        self.backend.wait_marks(self.device, &marks)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(context) = self.context.take() {
            let _ = self.backend.free(self.device, context.address);
        }
        if self.abort_in_records.is_none() {
            let _ = self.backend.free_flag(self.device, self.abort);
        }
        // What the owner lent for the window (its pads) goes after the context.
        drop(
            self.owner_resources
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }
}

/// What ranks of other processes need to map a window: the export messages of its memory and
/// of its signal pad ([`crate::transport::shareable`]) and their descriptors, in that order.
pub(crate) struct Exports {
    pub(crate) window_message: Vec<u8>,
    pub(crate) pad_message: Vec<u8>,
    pub(crate) fds: Vec<OwnedFd>,
}

/// `true` when two byte ranges share a byte (empty ranges share none): the one overlap test of
/// the crate (buffers of a call, windows of a registration, tasks of a group).
pub fn ranges_overlap(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
}
