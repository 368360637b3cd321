//! The watch on a rank's peers in other processes of this machine: a peer whose process exits
//! without destroying the communicator (killed, crashed, `exit` without `symmCommDestroy`)
//! fails the communicator on every rank at once ([`failure::fail`]: the abort words are
//! raised, pending kernels give up), instead of leaving them to wait for their timeout.
//!
//! One thread per rank that has such peers waits in `poll` on a process file descriptor of
//! each (`pidfd_open`, Linux 5.3), which becomes readable when that process exits, and on an
//! event that [`ProcessWatch`]'s drop signals (at `symmCommDestroy`). A peer that destroyed its
//! communicator first has said so in its call records ([`CallRecords::leave`]), and its exit
//! is no failure. Peers in another PID namespace (their pid does not name them here) and
//! kernels without `pidfd_open` are not watched: their death is found by the timeouts, as
//! before.
//!
//! [`CallRecords::leave`]: crate::agree::records::CallRecords::leave

use crate::abi::symmResult_t;
use crate::comm::{Comm, failure};
use crate::error::{Error, Result};
use crate::transport::link;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// The running watch of one rank (see the module documentation); dropping it stops it.
pub struct ProcessWatch {
    /// Signalled to stop the thread.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// A watched peer: its rank, pid and process file descriptor.
struct Watched {
    rank: usize,
    pid: u32,
    fd: OwnedFd,
}

impl ProcessWatch {
    /// Start watching the processes of `comm`'s peers in other processes of this machine;
    /// `None` when there are none that can be watched.
    pub fn start(comm: &Arc<Comm>) -> Result<Option<ProcessWatch>> {
        let (Some(link), Some(_)) = (&comm.link, &comm.call_records) else {
            return Ok(None);
        };
        let namespace = link::pid_namespace();
        if namespace == 0 || crate::mutation::active(crate::mutation::Mutation::SkipProcessWatch) {
            return Ok(None);
        }
        let watched: Vec<Watched> = link
            .peers
            .iter()
            .enumerate()
            .filter(|(rank, info)| !link.is_local(*rank) && info.pid_namespace == namespace)
            .filter_map(|(rank, info)| {
                let fd = pidfd_open(info.pid)?;
                Some(Watched {
                    rank,
                    pid: info.pid,
                    fd,
                })
            })
            .collect();
        if watched.is_empty() {
            return Ok(None);
        }
        // SAFETY: eventfd(2) with valid flags; the descriptor is owned below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if raw < 0 {
            return Err(Error::new(
                symmResult_t::symmSystemError,
                format!(
                    "eventfd for the watch on rank {}'s peers: {}",
                    comm.rank,
                    std::io::Error::last_os_error()
                ),
            ));
        }
        // SAFETY: a new descriptor that nothing else owns.
        let stop = unsafe { OwnedFd::from_raw_fd(raw) };
        let stop_raw = stop.as_raw_fd();
        let weak = Arc::downgrade(comm);
        let thread = std::thread::Builder::new()
            .name(format!("symm-watch-{}", comm.rank))
            .spawn(move || watch(weak, watched, stop_raw))
            .map_err(|e| {
                Error::new(
                    symmResult_t::symmSystemError,
                    format!("starting the watch thread: {e}"),
                )
            })?;
        Ok(Some(ProcessWatch {
            stop,
            thread: Some(thread),
        }))
    }
}

impl Drop for ProcessWatch {
    fn drop(&mut self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 into the eventfd this watch owns.
        let _ = unsafe {
            libc::write(
                self.stop.as_raw_fd(),
                (&raw const one).cast::<libc::c_void>(),
                8,
            )
        };
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

/// `pidfd_open(pid)`: a descriptor that becomes readable when process `pid` exits; `None`
/// when the process is gone already or the kernel has no `pidfd_open`.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) with no flags; the descriptor is owned below.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a new descriptor that nothing else owns.
    (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// The watch thread: wait until a watched process exits (fail the communicator unless that
/// rank left it) or `stop` is signalled.
fn watch(comm: Weak<Comm>, mut watched: Vec<Watched>, stop: i32) {
    while !watched.is_empty() {
        let mut fds: Vec<libc::pollfd> = std::iter::once(stop)
            .chain(watched.iter().map(|w| w.fd.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` holds fds.len() initialized pollfd entries of live descriptors.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if ready < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if fds[0].revents != 0 {
            return;
        }
        let exited: Vec<usize> = (0..watched.len())
            .filter(|i| fds[i + 1].revents != 0)
            .collect();
        for i in exited.into_iter().rev() {
            let gone = watched.remove(i);
            let Some(comm) = comm.upgrade() else { return };
            let left = comm
                .call_records
                .as_ref()
                .is_some_and(|records| records.peer_left(gone.rank));
            if !left {
                let error = Error::new(
                    symmResult_t::symmRemoteError,
                    format!(
                        "rank {}: rank {}'s process (pid {}) exited without destroying the \
                         communicator; the communicator is failed on every rank",
                        comm.rank, gone.rank, gone.pid
                    ),
                );
                failure::fail(&comm, &error);
            }
        }
    }
}
