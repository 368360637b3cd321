//! Memory that ranks of other processes map: what `symmMemAlloc` and window registration use
//! on a communicator with ranks in several processes. On the host backend a `memfd`
//! ([`crate::transport::shm`]); on the cuda backend CUDA VMM memory ([`crate::backend::vmm`]), made as
//! NCCL's `ncclMemAlloc` makes it.
//!
//! A rank [`Shareable::export`]s a region (a message and file descriptors); each rank of
//! another process receives both (the message through the bootstrap all-gather, the
//! descriptors over its Unix socket) and [`Imported::import`]s them. Message:
//! `kind u8` then, for host memory, `length u64, offset u64`; for CUDA memory, the
//! [`ExportedHandle`] bytes.

use crate::backend::vmm::{self, ExportedHandle, HandleKind, ImportedMapping, VmmAllocation};
use crate::backend::{Backend, BackendKind};
use crate::error::{Error, Result};
use crate::transport::shm::SharedMemory;
use std::os::fd::OwnedFd;

const HOST: u8 = 1;
const CUDA: u8 = 2;
/// Longest export message accepted from a peer.
pub(crate) const MAX_EXPORT_BYTES: usize = 256;

/// This rank's shareable memory.
pub enum Shareable {
    /// A memfd mapping (host backend).
    Host(SharedMemory),
    /// CUDA VMM memory (cuda backend).
    Cuda(VmmAllocation),
}

/// How to hand memory to a rank of another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportKind {
    /// A file descriptor, over a Unix socket (same machine).
    FileDescriptor,
    /// A CUDA fabric handle inside the message (other machines of an NVLink domain).
    Fabric,
}

impl Shareable {
    /// `bytes` of zeroed shareable memory on `device` of `backend`, named `name` where the
    /// system shows names, readable and writable by `device` and by `peer_devices` (the other
    /// devices of this process whose ranks use it directly: CUDA VMM memory is reachable only
    /// by the devices `cuMemSetAccess` names; peer access enabled between contexts does not
    /// cover it).
    pub fn create(
        backend: &Backend,
        device: i32,
        peer_devices: &[i32],
        bytes: usize,
        name: &str,
    ) -> Result<Self> {
        match backend.kind() {
            BackendKind::Host => SharedMemory::create(bytes, name).map(Shareable::Host),
            BackendKind::Cuda => {
                let cu = crate::backend::cuda::cu_device(device)?;
                let caps = vmm::device_caps(cu)?;
                let plan = vmm::plan_allocation(bytes, caps)?;
                let memory = VmmAllocation::create(device, cu, plan)?;
                let mut peers = Vec::with_capacity(peer_devices.len());
                for &peer in peer_devices.iter().filter(|&&d| d != device) {
                    let peer = crate::backend::cuda::cu_device(peer)?;
                    if !peers.contains(&peer) {
                        peers.push(peer);
                    }
                }
                // Dropping `memory` on failure unmaps and releases it.
                memory.set_access(&peers)?;
                Ok(Shareable::Cuda(memory))
            }
            BackendKind::Model => Err(Error::unsupported(
                "the model backend has no memory shared across processes",
            )),
        }
    }

    /// Address of the memory in this process (device address on the cuda backend).
    pub fn address(&self) -> u64 {
        match self {
            Shareable::Host(m) => m.address(),
            Shareable::Cuda(m) => m.address(),
        }
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        match self {
            Shareable::Host(m) => m.len(),
            Shareable::Cuda(m) => m.size(),
        }
    }

    /// Never empty (allocations are at least a page).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message and descriptors that let a rank of another process map the region that
    /// starts `offset` bytes into this memory.
    pub fn export(&self, offset: u64, kind: ExportKind) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
        if offset >= self.len() as u64 {
            return Err(Error::internal("export offset outside the allocation"));
        }
        match (self, kind) {
            (Shareable::Host(m), ExportKind::FileDescriptor) => {
                let fd = m.fd().try_clone_to_owned().map_err(|e| {
                    Error::internal(format!("duplicating a shared-memory descriptor: {e}"))
                })?;
                let mut message = vec![HOST];
                message.extend_from_slice(&(m.len() as u64).to_le_bytes());
                message.extend_from_slice(&offset.to_le_bytes());
                Ok((message, vec![fd]))
            }
            (Shareable::Host(_), ExportKind::Fabric) => Err(Error::unsupported(
                "the host backend shares memory between the processes of one machine only",
            )),
            (Shareable::Cuda(m), ExportKind::FileDescriptor) => {
                let handle = m.handle_message(HandleKind::PosixFd, offset)?;
                let fd = m.export_posix_fd()?;
                let mut message = vec![CUDA];
                message.extend_from_slice(&handle.encode());
                Ok((message, vec![fd]))
            }
            (Shareable::Cuda(m), ExportKind::Fabric) => {
                let fabric = m.export_fabric()?;
                let handle = m.handle_message(HandleKind::Fabric(fabric), offset)?;
                let mut message = vec![CUDA];
                message.extend_from_slice(&handle.encode());
                Ok((message, Vec::new()))
            }
        }
    }
}

/// A region of another process's memory, mapped here.
pub enum Imported {
    /// A peer's memfd (host backend), and the region's offset in it.
    Host(SharedMemory, u64),
    /// A peer's CUDA VMM memory (cuda backend).
    Cuda(ImportedMapping),
}

/// A peer's export message, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportMessage {
    /// Host memory of `length` bytes, the region at `offset`.
    Host {
        /// Bytes of the peer's memfd to map.
        length: u64,
        /// Offset of the region.
        offset: u64,
    },
    /// CUDA memory.
    Cuda(ExportedHandle),
}

impl ExportMessage {
    /// Parse a peer's message.
    pub fn decode(bytes: &[u8]) -> Result<ExportMessage> {
        let bad = || Error::invalid_argument("a peer sent a malformed memory export message");
        match bytes.split_first() {
            Some((&HOST, rest)) if rest.len() == 16 => {
                let length = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
                let offset = u64::from_le_bytes(rest[8..].try_into().expect("8 bytes"));
                if length == 0 || offset >= length || length > isize::MAX as u64 {
                    return Err(bad());
                }
                Ok(ExportMessage::Host { length, offset })
            }
            Some((&CUDA, rest)) => ExportedHandle::decode(rest).map(ExportMessage::Cuda),
            _ => Err(bad()),
        }
    }

    /// File descriptors that travel beside the message.
    pub fn descriptors(&self) -> usize {
        match self {
            ExportMessage::Host { .. } => 1,
            ExportMessage::Cuda(h) => match h.kind {
                HandleKind::PosixFd => 1,
                HandleKind::Fabric(_) => 0,
            },
        }
    }
}

impl Imported {
    /// Map a peer's region on `device` of `backend`, from its message and its descriptors
    /// (as many as [`ExportMessage::descriptors`]).
    pub fn import(
        backend: &Backend,
        device: i32,
        message: &ExportMessage,
        mut fds: Vec<OwnedFd>,
    ) -> Result<Imported> {
        if fds.len() != message.descriptors() {
            return Err(Error::internal(format!(
                "{} file descriptors for a memory export that needs {}",
                fds.len(),
                message.descriptors()
            )));
        }
        match (backend.kind(), message) {
            (BackendKind::Host, ExportMessage::Host { length, offset }) => {
                let fd = fds.pop().expect("one descriptor");
                SharedMemory::import(fd, *length as usize).map(|m| Imported::Host(m, *offset))
            }
            (BackendKind::Cuda, ExportMessage::Cuda(handle)) => {
                let cu = crate::backend::cuda::cu_device(device)?;
                match fds.pop() {
                    Some(fd) => ImportedMapping::import_fd(cu, fd, handle),
                    None => ImportedMapping::import_fabric(cu, handle),
                }
                .map(Imported::Cuda)
            }
            _ => Err(Error::invalid_usage(
                "a peer exported memory of another backend (SYMM_BACKEND must agree)",
            )),
        }
    }

    /// Address of the region in this process.
    pub fn address(&self) -> u64 {
        match self {
            Imported::Host(m, offset) => m.address() + offset,
            Imported::Cuda(m) => m.address(),
        }
    }

    /// Bytes mapped from [`Imported::address`] on.
    pub fn region_len(&self) -> u64 {
        match self {
            Imported::Host(m, offset) => (m.len() as u64).saturating_sub(*offset),
            Imported::Cuda(m) => (m.base() + m.size() as u64).saturating_sub(m.address()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host::HostBackend;

    #[test]
    fn host_memory_round_trips_through_export_and_import() {
        let backend = Backend::Host(HostBackend::new());
        let memory = Shareable::create(&backend, 0, &[], 10_000, "test").unwrap();
        assert!(memory.len() >= 10_000);
        let (message, fds) = memory.export(4096, ExportKind::FileDescriptor).unwrap();
        let message = ExportMessage::decode(&message).unwrap();
        assert_eq!(message.descriptors(), 1);
        let imported = Imported::import(&backend, 0, &message, fds).unwrap();
        // SAFETY: both addresses map the same live memfd, at least 8 KiB + 8 bytes long.
        unsafe {
            (memory.address() as *mut u64)
                .add(512)
                .write_volatile(0xFEED);
            assert_eq!((imported.address() as *const u64).read_volatile(), 0xFEED);
        }
        assert!(memory.export(1 << 40, ExportKind::FileDescriptor).is_err());
        assert!(memory.export(0, ExportKind::Fabric).is_err());
    }

    #[test]
    fn messages_are_checked() {
        for bad in [
            &[][..],
            &[HOST],
            &[HOST, 0, 0],
            &[9, 1, 2, 3],
            &[CUDA, 1, 2, 3],
        ] {
            assert!(ExportMessage::decode(bad).is_err(), "{bad:?}");
        }
        let mut offset_outside = vec![HOST];
        offset_outside.extend_from_slice(&4096u64.to_le_bytes());
        offset_outside.extend_from_slice(&4096u64.to_le_bytes());
        assert!(ExportMessage::decode(&offset_outside).is_err());
        let backend = Backend::Host(HostBackend::new());
        let message = ExportMessage::Host {
            length: 4096,
            offset: 0,
        };
        assert!(Imported::import(&backend, 0, &message, Vec::new()).is_err());
    }
}
