//! Types of the C ABI, as they appear in `symm.h`: the bottom layer, imported by every other
//! module and importing none of them. cbindgen generates the header from this module and the
//! entry points ([`crate::ffi::api`]).
//!
//! Enum-typed *parameters* are received as raw integers (`symmDataTypeRaw`, …), which the
//! header spells with the enum's name: a C caller may pass any value, and a Rust enum holding
//! an unknown value would be undefined behaviour. Every value is validated before use.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};
use symm_device::context::SymmContext;

/// Version of this library: `major * 10000 + minor * 100 + patch`.
pub const SYMM_VERSION_CODE: c_int = 100;

/// Window flag: the buffer is symmetric (same size and same offsets on every rank), so
/// collectives may use it directly, as NCCL's `NCCL_WIN_COLL_SYMMETRIC`.
pub const SYMM_WIN_COLL_SYMMETRIC: c_int = 1;

/// Bytes in a [`symmUniqueId`].
pub const SYMM_UNIQUE_ID_BYTES: usize = 128;

/// `symmCommSplit`'s color of a rank that joins no new communicator (its `newcomm` is set to
/// NULL), as NCCL's `NCCL_SPLIT_NOCOLOR`.
pub const SYMM_SPLIT_NOCOLOR: c_int = -1;

/// `symmCommRevoke`'s flags: the default (the only value), as NCCL's `NCCL_REVOKE_DEFAULT`.
pub const SYMM_REVOKE_DEFAULT: c_int = 0;

/// `symmCommShrink`'s flags: the parent's in-flight work is left alone (it must have none), as
/// NCCL's `NCCL_SHRINK_DEFAULT`.
pub const SYMM_SHRINK_DEFAULT: c_int = 0;

/// `symmCommShrink`'s flags: the parent is revoked first, ending its in-flight work on every
/// rank (after a failure), as NCCL's `NCCL_SHRINK_ABORT`.
pub const SYMM_SHRINK_ABORT: c_int = 1;

/// A [`symmConfig_t`] field left unset (the default, or the parent's value for a split), as
/// NCCL's `NCCL_CONFIG_UNDEF_INT`.
pub const SYMM_CONFIG_UNDEF_INT: c_int = -2147483647 - 1;

/// [`symmConfig_t::magic`] of a configuration made with `SYMM_CONFIG_INITIALIZER`.
pub const SYMM_CONFIG_MAGIC: u32 = 0x5359_4d4d;

/// Options of a communicator being created (NCCL's `ncclConfig_t`, the fields that apply).
/// Start from `SYMM_CONFIG_INITIALIZER` and set what you need; a NULL configuration means
/// every default (for `symmCommSplit`: the parent's values).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_snake_case)]
pub struct symmConfig_t {
    /// `sizeof(symmConfig_t)` (set by `SYMM_CONFIG_INITIALIZER`).
    pub size: usize,
    /// [`SYMM_CONFIG_MAGIC`] (set by `SYMM_CONFIG_INITIALIZER`).
    pub magic: u32,
    /// [`SYMM_VERSION_CODE`] of the header the caller compiled with (set by
    /// `SYMM_CONFIG_INITIALIZER`).
    pub version: u32,
    /// 1 (the default): every call returns once it is done or enqueued, as NCCL's blocking
    /// communicators. 0 (NCCL's non-blocking communicators) is refused: symm has none.
    pub blocking: c_int,
    /// Fewest blocks per rank a kernel gets (`SYMM_MIN_BLOCKS`).
    pub minCTAs: c_int,
    /// Most blocks per rank a kernel gets (`SYMM_MAX_BLOCKS`; the device's co-residency limit
    /// still applies).
    pub maxCTAs: c_int,
}

/// [`symmPeerWindow_t::magic`] of a description made with `SYMM_PEER_WINDOW_INITIALIZER`.
pub const SYMM_PEER_WINDOW_MAGIC: u32 = 0x5359_5057;

/// Who owns the memory of a window registered with `symmCommWindowRegisterPeers` (named in
/// messages, and compared between ranks: every rank's window must have the same owner).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum symmOwner_t {
    /// The caller's own mapping of every rank's memory (CUDA IPC, VMM, a fabric handle).
    symmOwnerUser = 1,
    /// PyTorch's symmetric memory (`torch.distributed._symmetric_memory`).
    symmOwnerTorch = 2,
    /// An NCCL registered window (`ncclCommWindowRegister`).
    symmOwnerNccl = 3,
    /// An NVSHMEM symmetric heap (`nvshmem_malloc`).
    symmOwnerNvshmem = 4,
}

/// Another library's symmetric memory, as this rank sees it, for
/// `symmCommWindowRegisterPeers`: this rank's bytes, and where every rank's bytes and signal
/// pad are mapped in this process. Start from `SYMM_PEER_WINDOW_INITIALIZER`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_snake_case)]
pub struct symmPeerWindow_t {
    /// `sizeof(symmPeerWindow_t)` (set by `SYMM_PEER_WINDOW_INITIALIZER`).
    pub size: usize,
    /// [`SYMM_PEER_WINDOW_MAGIC`] (set by `SYMM_PEER_WINDOW_INITIALIZER`).
    pub magic: u32,
    /// [`SYMM_VERSION_CODE`] of the header the caller compiled with (set by
    /// `SYMM_PEER_WINDOW_INITIALIZER`).
    pub version: u32,
    /// A `symmOwner_t`: who owns the memory (`symmOwnerUser` by default).
    pub owner: c_int,
    /// This rank's bytes: 16-byte aligned, `peerBuffs[rank]`.
    pub buff: *mut c_void,
    /// Bytes of the window, the same on every rank.
    pub bytes: usize,
    /// Where `buff` lies in the owner's symmetric allocation (bytes from its start): the same
    /// on every rank, which the registration checks.
    pub ownerOffset: usize,
    /// `nranks` entries: every rank's `buff`, as this process addresses it (all non-NULL:
    /// every peer must be reachable by loads and stores).
    pub peerBuffs: *const *mut c_void,
    /// `nranks` entries: every rank's signal pad, as this process addresses it (all non-NULL,
    /// 16-byte aligned, outside the window). symm's barriers own these bytes: memory of the
    /// same owner that nothing else uses (never PyTorch's own signal pads). Each rank's
    /// registration zeroes its own pad.
    pub peerSignalPads: *const *mut c_void,
    /// Bytes of each signal pad: at least `symmWindowSignalPadBytes`.
    pub signalPadBytes: usize,
}

/// Result of every call. Codes that mean what one of NCCL's `ncclResult_t` means have its
/// number (0 to 6); 7 is left free (NCCL's `ncclInProgress`: symm has no non-blocking
/// communicators); symm's own codes follow.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum symmResult_t {
    /// The call succeeded.
    symmSuccess = 0,
    /// A CUDA driver call failed.
    symmUnhandledCudaError = 1,
    /// A system call failed.
    symmSystemError = 2,
    /// An internal invariant was broken (a bug in symm).
    symmInternalError = 3,
    /// An argument is invalid; `symmGetLastError` names it.
    symmInvalidArgument = 4,
    /// The call is not valid in the current state (e.g. `symmGroupEnd` without a start).
    symmInvalidUsage = 5,
    /// A peer's process exited or its bootstrap connection was lost (or the root failed), or
    /// another rank failed the communicator.
    symmRemoteError = 6,
    /// No usable GPU or no CUDA driver for the cuda backend.
    symmNoDevice = 8,
    /// Valid, but not supported by this version or this GPU.
    symmUnsupported = 9,
    /// A peer did not arrive within `SYMM_TIMEOUT_MS`.
    symmTimeout = 10,
    /// A memory allocation failed.
    symmOutOfMemory = 11,
}

/// Element types: NCCL's names and numbers (`symm.h` also defines NCCL's aliases, e.g.
/// `symmFloat` for `symmFloat32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum symmDataType_t {
    /// Signed 8-bit integer.
    symmInt8 = 0,
    /// Unsigned 8-bit integer.
    symmUint8 = 1,
    /// Signed 32-bit integer.
    symmInt32 = 2,
    /// Unsigned 32-bit integer.
    symmUint32 = 3,
    /// Signed 64-bit integer.
    symmInt64 = 4,
    /// Unsigned 64-bit integer.
    symmUint64 = 5,
    /// IEEE binary16.
    symmFloat16 = 6,
    /// IEEE binary32.
    symmFloat32 = 7,
    /// IEEE binary64.
    symmFloat64 = 8,
    /// bfloat16.
    symmBfloat16 = 9,
    /// float8 e4m3.
    symmFloat8e4m3 = 10,
    /// float8 e5m2.
    symmFloat8e5m2 = 11,
}

/// Reduction operators.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum symmRedOp_t {
    /// Sum.
    symmSum = 0,
    /// Product.
    symmProd = 1,
    /// Maximum.
    symmMax = 2,
    /// Minimum.
    symmMin = 3,
    /// Average: sum divided by the number of ranks.
    symmAvg = 4,
}

/// Status returned by the device functions of the Triton-linkable library
/// (`ptx-out/symm_triton.ll.gz`: `symm_all_reduce`, `symm_all_gather`, `symm_barrier`), the same
/// on every thread of a program. Mirrors `symm_device::triton::status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum symmDeviceStatus_t {
    /// The collective completed on this rank.
    symmDeviceSuccess = 0,
    /// The context pointer is null.
    symmDeviceNullContext = -1,
    /// The context's protocol is not one this function implements (see `backend`).
    symmDeviceUnknownBackend = -2,
    /// The reduction operator is not a `symmRedOp_t`.
    symmDeviceUnsupportedOp = -3,
    /// The data type is not a `symmDataType_t`.
    symmDeviceUnsupportedDtype = -4,
    /// A peer did not arrive within the window's timeout, or the window was aborted; the host
    /// reports `symmTimeout` for the window.
    symmDeviceTimeout = -5,
    /// A range leaves the window, is misaligned or overlaps, `local_ptr` is not this rank's
    /// window base, or the grid is not 1-D with at most 64 programs.
    symmDeviceInvalidArgument = -6,
}

/// A raw `symmResult_t` received from C (spelled `symmResult_t` in the header).
pub type symmResultRaw = c_int;
/// A raw `symmDataType_t` received from C (spelled `symmDataType_t` in the header).
pub type symmDataTypeRaw = c_int;
/// A raw `symmRedOp_t` received from C (spelled `symmRedOp_t` in the header).
pub type symmRedOpRaw = c_int;

/// Identifies a communicator being created with `symmCommInitRank`; made by
/// `symmGetUniqueId` on one rank and passed to all others.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct symmUniqueId {
    /// Opaque bytes.
    pub internal: [c_char; SYMM_UNIQUE_ID_BYTES],
}

/// Opaque communicator.
pub struct symmComm {
    _private: [u8; 0],
}

/// Handle of a communicator (one rank).
pub type symmComm_t = *mut symmComm;

/// Opaque registered window.
pub struct symmWindow {
    _private: [u8; 0],
}

/// Handle of a registered window.
pub type symmWindow_t = *mut symmWindow;

/// CUDA's stream type, as in `cuda.h`.
pub struct CUstream_st {
    _private: [u8; 0],
}

/// A `CUstream`; NULL is the default stream.
pub type symmStream_t = *mut CUstream_st;

/// Layout of the device context returned by `symmCommGetDeviceContext` (the device crate's
/// `SymmContext`): what device code receives as a 64-bit pointer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct symmDeviceContext {
    /// Device protocol: 0 = native (every peer load/store reachable); 1 = NVSHMEM (some peer
    /// reached only through NVSHMEM: device functions linked with NVSHMEM only); 2 = NCCL
    /// (some peer reached only through NCCL's GIN: device functions linked with NCCL only; the
    /// host does not make such contexts yet).
    pub backend: u32,
    /// Layout version (1).
    pub version: u32,
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// This rank's window base.
    pub local_base: u64,
    /// Window size in bytes.
    pub window_size: u64,
    /// Device address of `uint64_t[world_size]`: every rank's window base.
    pub peer_bases: u64,
    /// Device address of `uint64_t[world_size]`: every rank's signal pad.
    pub peer_signal_pads: u64,
    /// Bytes of each signal pad.
    pub signal_pad_size: u64,
    /// Device address of this rank's abort word (`uint32_t`).
    pub abort_flag: u64,
    /// Bound of every wait on a peer, in nanoseconds.
    pub timeout_ns: u64,
    /// Engine words: the data window's, the signal words' and the communicator's handles of
    /// the engine; NVSHMEM: the window's and the pads' symmetric addresses, then 0 (PE r is
    /// rank r); all zero for a native window.
    pub engine: [u64; 3],
}

macro_rules! same_layout {
    ($($field:ident),*) => {
        static_assertions::assert_eq_size!(symmDeviceContext, SymmContext);
        static_assertions::assert_eq_align!(symmDeviceContext, SymmContext);
        $(static_assertions::const_assert_eq!(
            core::mem::offset_of!(symmDeviceContext, $field),
            core::mem::offset_of!(SymmContext, $field)
        );)*
    };
}
same_layout!(
    backend,
    version,
    rank,
    world_size,
    local_base,
    window_size,
    peer_bases,
    peer_signal_pads,
    signal_pad_size,
    abort_flag,
    timeout_ns,
    engine
);

impl symmResult_t {
    /// The result with this raw value, if any.
    pub fn from_raw(raw: c_int) -> Option<Self> {
        use symmResult_t::*;
        [
            symmSuccess,
            symmUnhandledCudaError,
            symmSystemError,
            symmInternalError,
            symmInvalidArgument,
            symmInvalidUsage,
            symmRemoteError,
            symmNoDevice,
            symmUnsupported,
            symmTimeout,
            symmOutOfMemory,
        ]
        .into_iter()
        .find(|r| *r as c_int == raw)
    }

    /// A static, NUL-terminated description.
    pub fn description(self) -> &'static std::ffi::CStr {
        use symmResult_t::*;
        match self {
            symmSuccess => c"no error",
            symmUnhandledCudaError => c"unhandled CUDA error",
            symmSystemError => c"system error",
            symmInternalError => c"internal error (a bug in symm)",
            symmInvalidArgument => c"invalid argument",
            symmInvalidUsage => c"invalid usage",
            symmNoDevice => c"no usable CUDA device or driver",
            symmUnsupported => c"unsupported",
            symmTimeout => c"timed out waiting for a peer",
            symmOutOfMemory => c"out of memory",
            symmRemoteError => c"a peer failed or left",
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn device_status_codes_match_the_device_crate() {
        use super::symmDeviceStatus_t::*;
        use symm_device::triton::{MAX_PROGRAMS, status};
        let pairs = [
            (symmDeviceSuccess, status::SUCCESS),
            (symmDeviceNullContext, status::NULL_CONTEXT),
            (symmDeviceUnknownBackend, status::UNKNOWN_BACKEND),
            (symmDeviceUnsupportedOp, status::UNSUPPORTED_OP),
            (symmDeviceUnsupportedDtype, status::UNSUPPORTED_DTYPE),
            (symmDeviceTimeout, status::TIMEOUT),
            (symmDeviceInvalidArgument, status::INVALID_ARGUMENT),
        ];
        for (abi, device) in pairs {
            assert_eq!(abi as i32, device, "{abi:?}");
        }
        assert_eq!(
            MAX_PROGRAMS, 64,
            "update symmDeviceInvalidArgument's documentation"
        );
    }

    use super::*;
    use symm_device::{DataType, RedOp};

    #[test]
    fn c_enums_match_device_enums() {
        use symmDataType_t::*;
        let c_types = [
            symmInt8,
            symmUint8,
            symmInt32,
            symmUint32,
            symmInt64,
            symmUint64,
            symmFloat16,
            symmFloat32,
            symmFloat64,
            symmBfloat16,
            symmFloat8e4m3,
            symmFloat8e5m2,
        ];
        assert_eq!(c_types.len(), DataType::ALL.len());
        for (c, d) in c_types.iter().zip(DataType::ALL) {
            assert_eq!(*c as u32, d as u32, "{c:?} vs {d:?}");
            assert_eq!(
                format!("{c:?}").to_lowercase(),
                format!("symm{d:?}").to_lowercase()
            );
        }
        use symmRedOp_t::*;
        let c_ops = [symmSum, symmProd, symmMax, symmMin, symmAvg];
        assert_eq!(c_ops.len(), RedOp::ALL.len());
        for (c, d) in c_ops.iter().zip(RedOp::ALL) {
            assert_eq!(*c as u32, d as u32);
            assert_eq!(format!("{c:?}"), format!("symm{d:?}"));
        }
    }

    #[test]
    fn every_result_has_a_description() {
        for raw in (0..=6).chain(8..=11) {
            let r = symmResult_t::from_raw(raw).expect("codes 0..=6 and 8..=11 exist");
            assert!(!r.description().to_bytes().is_empty());
        }
        assert_eq!(symmResult_t::from_raw(7), None);
        assert_eq!(symmResult_t::from_raw(12), None);
        assert_eq!(symmResult_t::from_raw(-1), None);
    }
}

/// The arguments of a collective call, as the C ABI takes them.
#[derive(Clone, Copy, Debug)]
pub struct CollectiveArgs {
    /// `sendbuff`.
    pub send: u64,
    /// `recvbuff`.
    pub recv: u64,
    /// Elements per segment (`count`, `sendcount` or `recvcount`).
    pub count: usize,
    /// The C data type.
    pub datatype: symmDataTypeRaw,
    /// The C operator (ignored by collectives that reduce nothing).
    pub op: symmRedOpRaw,
    /// The root (ignored by collectives without one).
    pub root: c_int,
}
