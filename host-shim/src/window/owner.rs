//! Windows over memory symm did not allocate: another library's symmetric memory (PyTorch's,
//! NCCL's, NVSHMEM's) or the caller's own mapping. The owner maps every rank's bytes into each
//! process and tells symm where ([`PeerView`]); symm's kernels run on them unchanged, with
//! symm's own barrier protocol in signal pads the owner provides next to the data.

use crate::abi::symmOwner_t;
use std::any::Any;
use std::ffi::c_int;

/// Who owns a window's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OwnerKind {
    /// symm: a `symmMemAlloc` allocation, mapped into peers' processes by symm.
    Symm = 0,
    /// The caller's own mapping.
    User = 1,
    /// PyTorch's symmetric memory.
    Torch = 2,
    /// An NCCL registered window.
    Nccl = 3,
    /// An NVSHMEM symmetric heap whose peers are all reachable by loads and stores.
    Nvshmem = 4,
    /// An NVSHMEM symmetric heap with some peer reachable only through NVSHMEM: an engine
    /// window (`BackendTag::Nvshmem`), for device functions linked with NVSHMEM only.
    NvshmemEngine = 5,
    /// An NCCL registered window of a communicator whose ranks span several load/store
    /// domains (NVLink domains): an engine window (`BackendTag::Nccl`), for device functions
    /// linked with NCCL's device bitcode, reaching the other domains through NCCL's GIN.
    NcclEngine = 6,
}

impl OwnerKind {
    /// The owner a `symmOwner_t` names, or `None`.
    pub fn from_abi(value: c_int) -> Option<OwnerKind> {
        [
            (symmOwner_t::symmOwnerUser, OwnerKind::User),
            (symmOwner_t::symmOwnerTorch, OwnerKind::Torch),
            (symmOwner_t::symmOwnerNccl, OwnerKind::Nccl),
            (symmOwner_t::symmOwnerNvshmem, OwnerKind::Nvshmem),
        ]
        .into_iter()
        .find(|(abi, _)| *abi as c_int == value)
        .map(|(_, kind)| kind)
    }

    /// The owner encoded as [`OwnerKind::code`], or `None`.
    pub fn from_code(code: u8) -> Option<OwnerKind> {
        [
            OwnerKind::Symm,
            OwnerKind::User,
            OwnerKind::Torch,
            OwnerKind::Nccl,
            OwnerKind::Nvshmem,
            OwnerKind::NvshmemEngine,
            OwnerKind::NcclEngine,
        ]
        .into_iter()
        .find(|k| *k as u8 == code)
    }

    /// Its wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            OwnerKind::Symm => "symmMemAlloc memory",
            OwnerKind::User => "the caller's own mapping",
            OwnerKind::Torch => "PyTorch symmetric memory",
            OwnerKind::Nccl => "an NCCL window",
            OwnerKind::Nvshmem => "an NVSHMEM symmetric heap",
            OwnerKind::NvshmemEngine => {
                "an NVSHMEM symmetric heap with peers reachable only through NVSHMEM"
            }
            OwnerKind::NcclEngine => "an NCCL window with peers reachable only through NCCL",
        }
    }

    /// The device protocol of windows over this owner's memory: the engine's for a window
    /// reaching some peer only through the engine, else symm's native one.
    pub fn backend_tag(self) -> symm_device::BackendTag {
        match self {
            OwnerKind::NvshmemEngine => symm_device::BackendTag::Nvshmem,
            OwnerKind::NcclEngine => symm_device::BackendTag::Nccl,
            _ => symm_device::BackendTag::Native,
        }
    }
}

/// Who owns a window's memory, and where the window lies in the owner's symmetric allocation
/// (bytes from its start; 0 for symm's own windows). Every rank of a registration must have
/// the same: a window at different offsets of the ranks' allocations would pair different
/// bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The owner.
    pub kind: OwnerKind,
    /// Offset in the owner's allocation.
    pub offset: u64,
}

impl Owner {
    /// symm's own windows.
    pub const SYMM: Owner = Owner {
        kind: OwnerKind::Symm,
        offset: 0,
    };

    /// Whether `self` and `other` name the same bytes of the same owner's memory. An NVSHMEM
    /// heap (an NCCL window) is one owner whether or not a rank reaches every peer by loads
    /// and stores (reachability decides the window's protocol, agreed among the ranks, not its
    /// memory).
    pub fn same_memory(&self, other: &Owner) -> bool {
        let memory = |kind: OwnerKind| match kind {
            OwnerKind::NvshmemEngine => OwnerKind::Nvshmem,
            OwnerKind::NcclEngine => OwnerKind::Nccl,
            kind => kind,
        };
        memory(self.kind) == memory(other.kind) && self.offset == other.offset
    }

    /// `"<owner> at offset <offset>"`.
    pub fn describe(&self) -> String {
        match self.kind {
            OwnerKind::Symm => self.kind.name().to_string(),
            kind => format!("{} at offset {}", kind.name(), self.offset),
        }
    }
}

/// Where a window over another owner's memory is, as this rank's process addresses it: every
/// rank's bytes and signal pad, by rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerView {
    /// Every rank's window base.
    pub bases: Vec<u64>,
    /// Every rank's signal pad.
    pub pads: Vec<u64>,
    /// Bytes of each signal pad.
    pub pad_bytes: u64,
    /// The context's engine words (`SymmContext::engine`) should the window be an engine
    /// window (some rank reaching a peer only through the engine); zero for owners without
    /// one.
    pub engine: [u64; 3],
}

/// A window over another owner's memory, before its registration: what
/// `symmCommWindowRegisterPeers` and the engine adapters pass to
/// [`crate::comm::windows::register_peers`].
pub struct PeerWindow {
    /// The owner.
    pub owner: Owner,
    /// This rank's bytes.
    pub base: u64,
    /// Their length.
    pub size: u64,
    /// Every rank's bytes and pad.
    pub view: PeerView,
    /// What the adapter allocated for the window through its owner (an engine's signal-pad
    /// window), released when the window is dropped.
    pub resources: Option<Box<dyn Any + Send + Sync>>,
}
