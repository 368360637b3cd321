//! `symmCommWindowRegisterNvshmem`: a window over bytes of NVSHMEM's symmetric heap
//! (`nvshmem_malloc`), in a job whose PEs are the communicator's ranks (PE `r` is rank `r`).
//! Every peer's address comes from the host's `nvshmem_ptr`. When every PE is reachable by
//! loads and stores the window is native (symm's kernels run on it); when `nvshmem_ptr` gives
//! no address for some PE (another machine, a GPU without peer access) it is an engine window
//! (`OwnerKind::NvshmemEngine`, context tag `Nvshmem`): only device functions linked with
//! NVSHMEM's device bitcode run on it, reaching those PEs through NVSHMEM. The signal pads are
//! a small `nvshmem_malloc` allocation, freed (`nvshmem_free`, collective) with the symm window.

use super::{Library, function, open};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::window::Window;
use crate::window::owner::{Owner, OwnerKind, PeerView, PeerWindow};
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The environment variable naming the NVSHMEM host library to load.
pub(crate) const LIBRARY_ENV: &str = "SYMM_NVSHMEM_LIBRARY";
/// `NVSHMEM_STATUS_IS_INITIALIZED` of `nvshmemx_init_status`.
const STATUS_IS_INITIALIZED: c_int = 2;

type Query = unsafe extern "C" fn() -> c_int;
type Pointer = unsafe extern "C" fn(*const c_void, c_int) -> *mut c_void;
type Malloc = unsafe extern "C" fn(usize) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void);

/// The NVSHMEM functions the adapter calls.
struct Nvshmem {
    library: Arc<Library>,
    my_pe: Query,
    n_pes: Query,
    pointer: Pointer,
    malloc: Malloc,
    free: Free,
}

impl Nvshmem {
    fn load() -> Result<Nvshmem> {
        let library = open(
            "NVSHMEM (libnvshmem_host.so.3)",
            "libnvshmem_host.so.3",
            crate::config::nvshmem_library(),
            LIBRARY_ENV,
        )?;
        // SAFETY: each type is the function's signature in nvshmem.h / nvshmemx.h.
        unsafe {
            let status: Query = function(&library, "nvshmemx_init_status")?;
            if status() < STATUS_IS_INITIALIZED {
                return Err(Error::invalid_usage(format!(
                    "NVSHMEM ({}) is not initialized in this process: call nvshmem_init (or \
                     nvshmemx_init_attr) first",
                    library.name
                )));
            }
            Ok(Nvshmem {
                my_pe: function(&library, "nvshmem_my_pe")?,
                n_pes: function(&library, "nvshmem_n_pes")?,
                pointer: function(&library, "nvshmem_ptr")?,
                malloc: function(&library, "nvshmem_malloc")?,
                free: function(&library, "nvshmem_free")?,
                library,
            })
        }
    }

    /// Every PE's address of the symmetric address `address`, as this process maps it (0 for
    /// a PE not reachable by loads and stores).
    fn peer_addresses(&self, address: *const c_void, nranks: usize) -> Vec<u64> {
        (0..nranks)
            // SAFETY: a symmetric address (the caller's contract), a PE of the job.
            .map(|pe| unsafe { (self.pointer)(address, pe as c_int) } as u64)
            .collect()
    }
}

/// The signal pads of a window over NVSHMEM's heap: an `nvshmem_malloc` allocation, freed
/// (collectively) with the symm window.
struct NvshmemPads {
    nvshmem: Arc<Nvshmem>,
    memory: usize,
}

impl Drop for NvshmemPads {
    fn drop(&mut self) {
        // SAFETY: from nvshmem_malloc, freed once, after every kernel of the symm window
        // (the window waits for its launches).
        unsafe { (self.nvshmem.free)(self.memory as *mut c_void) };
    }
}

/// `symmCommWindowRegisterNvshmem` on one rank: the window over `bytes` bytes at the
/// symmetric address `address`.
///
/// Every rank checks its part first and the ranks agree that all did
/// ([`super::agree_prepared`]) before any calls `nvshmem_malloc`, which waits for every PE.
pub fn register(comm: &Arc<Comm>, address: *mut c_void, bytes: usize) -> Result<Arc<Window>> {
    const CALL: &str = "symmCommWindowRegisterNvshmem";
    super::refuse_in_group(CALL)?;
    let prepared = prepare(comm, address, bytes);
    super::agree_prepared(
        comm,
        CALL,
        &prepared.as_ref().map(|_| ()).map_err(Clone::clone),
    )?;
    let nvshmem = prepared?;
    let nranks = comm.clique.nranks;
    let bases = nvshmem.peer_addresses(address, nranks);
    let pad_bytes = symm_device::sync::signal_pad::signal_pad_bytes(nranks);
    // SAFETY: collective over the job's PEs: every rank makes this call.
    let memory = unsafe { (nvshmem.malloc)(pad_bytes) };
    if memory.is_null() {
        // The peers that got their pads are on their way to the registration: refused in its
        // place, so that theirs fails at once.
        return Err(crate::group::refuse_peer_window(
            comm,
            Error::new(
                crate::abi::symmResult_t::symmOutOfMemory,
                format!("nvshmem_malloc of the window's {pad_bytes}-byte signal pad failed"),
            ),
        ));
    }
    let pads = nvshmem.peer_addresses(memory, nranks);
    let resources = NvshmemPads {
        nvshmem: nvshmem.clone(),
        memory: memory as usize,
    };
    // This rank's view of reachability; the registration makes the window an engine window
    // on every rank when any rank lacks an address for a peer.
    let kind = if bases.contains(&0) || pads.contains(&0) {
        OwnerKind::NvshmemEngine
    } else {
        OwnerKind::Nvshmem
    };
    // The engine words of an NVSHMEM context: the window's and the pads' symmetric addresses;
    // PE r is rank r (checked above), so no PE map.
    let engine = [address as u64, memory as u64, 0];
    crate::group::register_peer_window(
        comm,
        PeerWindow {
            owner: Owner {
                kind,
                offset: address as u64,
            },
            base: address as u64,
            size: bytes as u64,
            view: PeerView {
                bases,
                pads,
                pad_bytes: pad_bytes as u64,
                engine,
            },
            resources: Some(Box::new(resources)),
        },
    )
}

/// This rank's part of a registration that needs no other rank: the arguments, NVSHMEM loaded
/// and initialized, its PEs the communicator's ranks.
fn prepare(comm: &Arc<Comm>, address: *mut c_void, bytes: usize) -> Result<Arc<Nvshmem>> {
    if address.is_null() {
        return Err(Error::invalid_argument("symAddr is NULL"));
    }
    if bytes == 0 {
        return Err(Error::invalid_argument("bytes is 0"));
    }
    let nvshmem = Arc::new(Nvshmem::load()?);
    let nranks = comm.clique.nranks;
    // SAFETY: NVSHMEM is initialized (checked by `load`).
    let (pe, pes) = unsafe { ((nvshmem.my_pe)(), (nvshmem.n_pes)()) };
    if pes as usize != nranks || pe as usize != comm.rank {
        return Err(Error::invalid_argument(format!(
            "this process is NVSHMEM PE {pe} of {pes}, this communicator rank {} of {nranks} \
             ({}): symm rank r must be PE r of a job of the same ranks",
            comm.rank, nvshmem.library.name
        )));
    }
    Ok(nvshmem)
}
