//! `symmCommWindowRegisterNccl`: a window over bytes of an NCCL registered window
//! (`ncclCommWindowRegister`, NCCL 2.29 or newer). Every peer's address comes from
//! `ncclGetPeerDevicePointer` (NULL for a peer outside this rank's load/store team, which is
//! refused); the signal pads are a small `ncclMemAlloc` allocation registered as an NCCL window
//! of its own, deregistered and freed with the symm window.

use super::{Library, function, open};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::window::Window;
use crate::window::owner::{Owner, OwnerKind, PeerView, PeerWindow};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Arc;

/// The environment variable naming the NCCL library to load.
pub(crate) const LIBRARY_ENV: &str = "SYMM_NCCL_LIBRARY";
/// The oldest NCCL with `ncclGetPeerDevicePointer`.
pub(crate) const MIN_VERSION: c_int = 22900;
/// `NCCL_WIN_COLL_SYMMETRIC`.
const WIN_COLL_SYMMETRIC: c_int = 1;

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type CommQuery = unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int;
type GetPeerDevicePointer =
    unsafe extern "C" fn(*mut c_void, usize, c_int, *mut *mut c_void) -> c_int;
type MemAlloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type MemFree = unsafe extern "C" fn(*mut c_void) -> c_int;
type WindowRegister =
    unsafe extern "C" fn(*mut c_void, *mut c_void, usize, *mut *mut c_void, c_int) -> c_int;
type WindowDeregister = unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int;

/// The NCCL functions the adapter calls.
struct Nccl {
    library: Arc<Library>,
    version: c_int,
    error_string: GetErrorString,
    count: CommQuery,
    user_rank: CommQuery,
    peer_pointer: GetPeerDevicePointer,
    mem_alloc: MemAlloc,
    mem_free: MemFree,
    register: WindowRegister,
    deregister: WindowDeregister,
}

impl Nccl {
    fn load() -> Result<Nccl> {
        let library = open(
            "NCCL (libnccl.so.2)",
            "libnccl.so.2",
            crate::config::nccl_library(),
            LIBRARY_ENV,
        )?;
        // SAFETY: each type is the function's signature in nccl.h.
        let nccl = unsafe {
            let get_version: GetVersion = function(&library, "ncclGetVersion")?;
            let mut version = 0;
            get_version(&mut version);
            if version < MIN_VERSION {
                return Err(Error::new(
                    crate::abi::symmResult_t::symmUnsupported,
                    format!(
                        "{} is NCCL version code {version}: symm's windows over NCCL windows \
                         need ncclGetPeerDevicePointer, NCCL 2.29 ({MIN_VERSION}) or newer",
                        library.name
                    ),
                ));
            }
            Nccl {
                version,
                error_string: function(&library, "ncclGetErrorString")?,
                count: function(&library, "ncclCommCount")?,
                user_rank: function(&library, "ncclCommUserRank")?,
                peer_pointer: function(&library, "ncclGetPeerDevicePointer")?,
                mem_alloc: function(&library, "ncclMemAlloc")?,
                mem_free: function(&library, "ncclMemFree")?,
                register: function(&library, "ncclCommWindowRegister")?,
                deregister: function(&library, "ncclCommWindowDeregister")?,
                library,
            }
        };
        Ok(nccl)
    }

    /// `Ok` for `ncclSuccess`, else an error naming `call` and NCCL's description.
    fn check(&self, result: c_int, call: &str) -> Result<()> {
        if result == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns NULL or a static NUL-terminated string.
        let text = unsafe {
            let text = (self.error_string)(result);
            if text.is_null() {
                String::from("unknown error")
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        Err(Error::new(
            crate::abi::symmResult_t::symmSystemError,
            format!(
                "{call} failed with NCCL error {result} ({text}; {} version {})",
                self.library.name, self.version
            ),
        ))
    }

    /// Every rank's address of `offset` in `window`, as this process maps it (0 for a peer
    /// NCCL cannot reach by loads and stores).
    fn peer_addresses(
        &self,
        window: *mut c_void,
        offset: usize,
        nranks: usize,
    ) -> Result<Vec<u64>> {
        (0..nranks)
            .map(|peer| {
                let mut address = std::ptr::null_mut();
                // SAFETY: a window of this communicator (the caller's contract) and a valid
                // out-pointer.
                let result =
                    unsafe { (self.peer_pointer)(window, offset, peer as c_int, &mut address) };
                self.check(result, &format!("ncclGetPeerDevicePointer(peer {peer})"))?;
                Ok(address as u64)
            })
            .collect()
    }
}

/// The signal pads of a window over an NCCL window: an `ncclMemAlloc` allocation registered
/// as an NCCL window, deregistered (collective) and freed with the symm window.
struct NcclPads {
    nccl: Arc<Nccl>,
    comm: usize,
    memory: usize,
    window: usize,
}

impl Drop for NcclPads {
    fn drop(&mut self) {
        // SAFETY: made by `register` with this communicator; released once, after every
        // kernel of the symm window that used them (the window waits for its launches).
        unsafe {
            if self.window != 0 {
                let _ =
                    (self.nccl.deregister)(self.comm as *mut c_void, self.window as *mut c_void);
            }
            let _ = (self.nccl.mem_free)(self.memory as *mut c_void);
        }
    }
}

/// `symmCommWindowRegisterNccl` on one rank: the window over `bytes` bytes at `offset` of the
/// NCCL window `nccl_window` of `nccl_comm`, whose ranks must be `comm`'s.
pub fn register(
    comm: &Arc<Comm>,
    nccl_comm: *mut c_void,
    nccl_window: *mut c_void,
    offset: usize,
    bytes: usize,
) -> Result<Arc<Window>> {
    if nccl_comm.is_null() {
        return Err(Error::invalid_argument("ncclComm is NULL"));
    }
    if nccl_window.is_null() {
        return Err(Error::invalid_argument("ncclWindow is NULL"));
    }
    if bytes == 0 {
        return Err(Error::invalid_argument("bytes is 0"));
    }
    super::refuse_in_group("symmCommWindowRegisterNccl")?;
    let nccl = Arc::new(Nccl::load()?);
    let nranks = comm.clique.nranks;
    let (mut count, mut rank) = (0, 0);
    // SAFETY: a communicator handle of NCCL (the caller's contract) and valid out-pointers.
    unsafe {
        nccl.check((nccl.count)(nccl_comm, &mut count), "ncclCommCount")?;
        nccl.check((nccl.user_rank)(nccl_comm, &mut rank), "ncclCommUserRank")?;
    }
    if count as usize != nranks || rank as usize != comm.rank {
        return Err(Error::invalid_argument(format!(
            "ncclComm is rank {rank} of {count}, this communicator rank {} of {nranks}: symm \
             rank r must be NCCL rank r of a communicator of the same ranks",
            comm.rank
        )));
    }
    let bases = nccl.peer_addresses(nccl_window, offset, nranks)?;
    let pad_bytes = symm_device::sync::signal_pad::signal_pad_bytes(nranks);
    let mut memory = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let allocated = unsafe { (nccl.mem_alloc)(&mut memory, pad_bytes) };
    nccl.check(allocated, "ncclMemAlloc")?;
    let mut pads = NcclPads {
        nccl: nccl.clone(),
        comm: nccl_comm as usize,
        memory: memory as usize,
        window: 0,
    };
    let mut pad_window = std::ptr::null_mut();
    // SAFETY: memory from ncclMemAlloc of `pad_bytes` bytes; a valid out-pointer.
    let registered = unsafe {
        (nccl.register)(
            nccl_comm,
            memory,
            pad_bytes,
            &mut pad_window,
            WIN_COLL_SYMMETRIC,
        )
    };
    nccl.check(registered, "ncclCommWindowRegister (the signal pads)")?;
    pads.window = pad_window as usize;
    let pad_addresses = nccl.peer_addresses(pad_window, 0, nranks)?;
    crate::group::register_peer_window(
        comm,
        PeerWindow {
            owner: Owner {
                kind: OwnerKind::Nccl,
                offset: offset as u64,
            },
            base: bases[comm.rank],
            size: bytes as u64,
            view: PeerView {
                bases,
                pads: pad_addresses,
                pad_bytes: pad_bytes as u64,
                engine: [0; 3],
            },
            resources: Some(Box::new(pads)),
        },
    )
}
