//! [`SymmContext`]: the `#[repr(C)]` description of one symmetric window, as kernels see it.
//!
//! The host builds one context per (rank, window) in device memory; kernels and device
//! functions receive its address as a 64-bit integer (this is how Triton passes it). The layout
//! is locked below and mirrored by `symmDeviceContext` in `symm.h`.

use bytemuck::{Pod, Zeroable};
use static_assertions::const_assert_eq;

/// The device protocol of a context's window (not who owns its memory): [`BackendTag::Native`]
/// for every window whose peers are all load/store reachable (symm's own windows, and those of
/// another library whose peer addresses the host can fill in), the engine's tag where some peer
/// is reachable only through that engine (its `peer_bases` entry is 0). `Native` and `Nvshmem`
/// are implemented (`crate::engine` is the latter's protocol); `docs/ARCHITECTURE.md` states
/// the layout of each.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendTag {
    /// symm's own windows (peer table and signal pads built by symm).
    Native = 0,
    /// An NVSHMEM symmetric heap with peers beyond load/store reach: only the device functions
    /// linked with NVSHMEM run on it, through NVSHMEM's put-with-signal.
    Nvshmem = 1,
    /// An NCCL registered window with peers beyond load/store reach: only the device functions
    /// linked with NCCL's device bitcode run on it, through NCCL's GIN (the host does not make
    /// such contexts yet).
    Nccl = 2,
}

/// Layout version written into [`SymmContext::version`]. An engine's own ABI version (NCCL's
/// or NVSHMEM's) is checked on the host when a context for that engine is made, not here.
pub const CONTEXT_VERSION: u32 = 1;

/// Index in [`SymmContext::engine`] of the engine's handle of the window's data: NCCL, the
/// data window's `ncclWindow_t`; NVSHMEM, this rank's symmetric address of the window.
pub const ENGINE_DATA: usize = 0;
/// Index in [`SymmContext::engine`] of the engine's handle of the signal words: NCCL, the
/// signal window's `ncclWindow_t` (registered with `NCCL_WIN_STRICT_ORDERING`; 0 when the
/// signals live in a symm pad); NVSHMEM, the symmetric address of the signal words.
pub const ENGINE_SIGNALS: usize = 1;
/// Index in [`SymmContext::engine`] of the engine's communicator state: NCCL, a device pointer
/// to the `ncclDevComm`; NVSHMEM, 0 (PE `r` is rank `r`: the host refuses any other mapping).
pub const ENGINE_COMM: usize = 2;

/// One rank's view of a symmetric window.
///
/// All addresses are device addresses (host addresses on the host backend), stored as `u64`
/// so that the struct is plain old data with the same layout on every target.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct SymmContext {
    /// A [`BackendTag`] value.
    pub backend: u32,
    /// [`CONTEXT_VERSION`] of the layout.
    pub version: u32,
    /// This rank, `0 <= rank < world_size`.
    pub rank: u32,
    /// Number of ranks of the communicator.
    pub world_size: u32,
    /// Base address of this rank's window.
    pub local_base: u64,
    /// Size in bytes of the window (the same on every rank).
    pub window_size: u64,
    /// Address of a `[u64; world_size]` table: window base of every rank, by rank.
    pub peer_bases: u64,
    /// Address of a `[u64; world_size]` table: signal pad of every rank, by rank.
    pub peer_signal_pads: u64,
    /// Size in bytes of each rank's signal pad.
    pub signal_pad_size: u64,
    /// Address of this rank's abort word (a `u32` inside its own signal pad). Non-zero once a
    /// kernel on this window gave up waiting for a peer.
    pub abort_flag: u64,
    /// Bound, in nanoseconds of the global timer, of every wait on another rank.
    pub timeout_ns: u64,
    /// The engine words ([`ENGINE_DATA`], [`ENGINE_SIGNALS`], [`ENGINE_COMM`]): what a
    /// [`BackendTag::Nccl`] or [`BackendTag::Nvshmem`] context's kernels pass to that engine.
    /// All zero in a [`BackendTag::Native`] context.
    pub engine: [u64; 3],
}

const_assert_eq!(core::mem::size_of::<SymmContext>(), 96);
const_assert_eq!(core::mem::align_of::<SymmContext>(), 8);
const_assert_eq!(core::mem::offset_of!(SymmContext, backend), 0);
const_assert_eq!(core::mem::offset_of!(SymmContext, version), 4);
const_assert_eq!(core::mem::offset_of!(SymmContext, rank), 8);
const_assert_eq!(core::mem::offset_of!(SymmContext, world_size), 12);
const_assert_eq!(core::mem::offset_of!(SymmContext, local_base), 16);
const_assert_eq!(core::mem::offset_of!(SymmContext, window_size), 24);
const_assert_eq!(core::mem::offset_of!(SymmContext, peer_bases), 32);
const_assert_eq!(core::mem::offset_of!(SymmContext, peer_signal_pads), 40);
const_assert_eq!(core::mem::offset_of!(SymmContext, signal_pad_size), 48);
const_assert_eq!(core::mem::offset_of!(SymmContext, abort_flag), 56);
const_assert_eq!(core::mem::offset_of!(SymmContext, timeout_ns), 64);
const_assert_eq!(core::mem::offset_of!(SymmContext, engine), 72);

impl SymmContext {
    /// Address of rank `peer`'s window base.
    ///
    /// # Safety
    /// `self` must be a context built by the host (its tables valid for `world_size` entries)
    /// and `peer < world_size`.
    #[inline(always)]
    pub unsafe fn peer_base(&self, peer: u32) -> u64 {
        // SAFETY: the caller guarantees the table holds `world_size` entries and
        // `peer < world_size`.
        unsafe { *(self.peer_bases as *const u64).add(peer as usize) }
    }

    /// Address of rank `peer`'s signal pad.
    ///
    /// # Safety
    /// As for [`SymmContext::peer_base`].
    #[inline(always)]
    pub unsafe fn peer_signal_pad(&self, peer: u32) -> u64 {
        // SAFETY: as in `peer_base`.
        unsafe { *(self.peer_signal_pads as *const u64).add(peer as usize) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_context_is_pod() {
        let ctx = SymmContext::zeroed();
        let bytes = bytemuck::bytes_of(&ctx);
        assert_eq!(bytes.len(), 96);
        assert!(bytes.iter().all(|&b| b == 0));
    }
}
