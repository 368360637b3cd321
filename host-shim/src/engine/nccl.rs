//! `symmCommWindowRegisterNccl`: a window over bytes of an NCCL registered window
//! (`ncclCommWindowRegister`, NCCL 2.29 or newer). Every peer's address comes from
//! `ncclGetPeerDevicePointer`; the signal pads are a small `ncclMemAlloc` allocation registered
//! as an NCCL window of its own, deregistered and freed with the symm window.
//!
//! When the communicator's ranks span several load/store teams (NVLink domains: NCCL's
//! `nLsaTeams`, the same on every rank) some peers have no address, and with NCCL 2.32.3 or
//! newer the window is an engine window (`OwnerKind::NcclEngine`, context tag `Nccl`): only
//! device functions linked with NCCL's device bitcode run on it, reaching those peers through
//! NCCL's GPU-Initiated Networking. The adapter then makes the `ncclDevComm` they use (GIN
//! contexts, full connection, VA and strong signals), copies it to device memory, and registers
//! the pads with `NCCL_WIN_STRICT_ORDERING` (GIN's VA signals live there). Since every rank
//! reads the same team count, every rank takes the same path, and `ncclDevCommCreate`,
//! collective, is called on all or none. Before 2.32.3 a peer without an address is refused.

use super::{Library, function, open};
use crate::backend::Backend;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::window::Window;
use crate::window::owner::{Owner, OwnerKind, PeerView, PeerWindow};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

/// The environment variable naming the NCCL library to load.
pub(crate) const LIBRARY_ENV: &str = "SYMM_NCCL_LIBRARY";
/// The oldest NCCL with `ncclGetPeerDevicePointer`.
pub(crate) const MIN_VERSION: c_int = 22900;
/// `NCCL_WIN_COLL_SYMMETRIC`.
const WIN_COLL_SYMMETRIC: c_int = 1;
/// `NCCL_WIN_STRICT_ORDERING`: the pads of an engine window hold GIN's VA signals.
const WIN_STRICT_ORDERING: c_int = 2;
/// The NCCL whose structures the engine's host and device sides are written against (the
/// `version` of [`DevCommRequirements`] and [`CommProperties`], and the `ncclDevComm` layout
/// `symm_device::engine::nccl` reads): 2.32.3. Engine windows need this NCCL or a newer one
/// (an older one refuses structures of a newer version).
const ENGINE_VERSION: c_int = 23203;
/// The oldest NCCL that makes engine windows (see [`ENGINE_VERSION`]).
pub(crate) const MIN_ENGINE_VERSION: c_int = ENGINE_VERSION;
/// `NCCL_API_MAGIC`.
const API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_GIN_CONNECTION_FULL`: every rank connected to every other.
const GIN_CONNECTION_FULL: c_int = 1;
/// `NCCL_GIN_TYPE_NONE`: no GIN (in [`CommProperties`]), any (in [`DevCommRequirements`]).
const GIN_TYPE_NONE: c_int = 0;
/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF_INT: c_int = c_int::MIN;
/// Bytes of NCCL 2.32's `ncclDevComm`.
pub(crate) const DEV_COMM_BYTES: usize = 248;

/// NCCL 2.32's `ncclCommProperties_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CommProperties {
    size: usize,
    magic: u32,
    version: u32,
    rank: c_int,
    n_ranks: c_int,
    cuda_dev: c_int,
    nvml_dev: c_int,
    device_api_support: bool,
    multimem_support: bool,
    gin_type: c_int,
    n_lsa_teams: c_int,
    host_rma_support: bool,
    railed_gin_type: c_int,
    comm_hash: u64,
    gin_min_stride: c_int,
    gin_connection_type: c_int,
    gin_support: [bool; 64],
    dev_comm_runtime_version_size: usize,
    cft_support: bool,
    cft_multicast_support: bool,
    cft_counted_support: bool,
}

/// NCCL 2.32's `ncclDevCommRequirements_t`.
#[repr(C)]
struct DevCommRequirements {
    size: usize,
    magic: u32,
    version: u32,
    resource_requirements_list: *mut c_void,
    team_requirements_list: *mut c_void,
    lsa_multimem: bool,
    barrier_count: c_int,
    lsa_barrier_count: c_int,
    rail_gin_barrier_count: c_int,
    lsa_ll_a2a_block_count: c_int,
    lsa_ll_a2a_slot_count: c_int,
    gin_force_enable: bool,
    gin_context_count: c_int,
    gin_signal_count: c_int,
    gin_counter_count: c_int,
    gin_connection_type: c_int,
    gin_exclusive_contexts: bool,
    gin_queue_depth: c_int,
    gin_traffic_class: c_int,
    world_gin_barrier_count: c_int,
    gin_strong_signals_required: bool,
    gin_va_signals_required: bool,
    gin_custom_stride: c_int,
    gin_type: c_int,
    use_runtime_version: bool,
    cft_caps: c_int,
    cft_barrier_count: c_int,
}

// The layouts of NCCL 2.32.3's nccl.h and nccl_device/host.h (sizes and offsets as its C
// compiler lays them out).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<CommProperties>() == 152);
    assert!(offset_of!(CommProperties, gin_type) == 36);
    assert!(offset_of!(CommProperties, n_lsa_teams) == 40);
    assert!(offset_of!(CommProperties, comm_hash) == 56);
    assert!(offset_of!(CommProperties, gin_support) == 72);
    assert!(offset_of!(CommProperties, dev_comm_runtime_version_size) == 136);
    assert!(offset_of!(CommProperties, cft_counted_support) == 146);
    assert!(size_of::<DevCommRequirements>() == 120);
    assert!(offset_of!(DevCommRequirements, lsa_multimem) == 32);
    assert!(offset_of!(DevCommRequirements, gin_context_count) == 60);
    assert!(offset_of!(DevCommRequirements, gin_connection_type) == 72);
    assert!(offset_of!(DevCommRequirements, gin_strong_signals_required) == 92);
    assert!(offset_of!(DevCommRequirements, gin_type) == 100);
    assert!(offset_of!(DevCommRequirements, use_runtime_version) == 104);
    assert!(offset_of!(DevCommRequirements, cft_barrier_count) == 112);
};

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
type QueryProperties = unsafe extern "C" fn(*mut c_void, *mut CommProperties) -> c_int;
type DevCommCreate =
    unsafe extern "C" fn(*mut c_void, *const DevCommRequirements, *mut c_void) -> c_int;
type DevCommDestroy = unsafe extern "C" fn(*mut c_void, *const c_void) -> c_int;

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
        let nccl = (self.error_string, &*self.library, self.version);
        crate::comm::span::nccl::check_result(nccl, result, call)
    }

    /// Whether `comm`'s windows are engine windows: its ranks span several load/store teams
    /// (NCCL's `nLsaTeams`, the same on every rank), with NCCL 2.32.3 or newer. Refused when
    /// they would be and this NCCL cannot reach the other teams from a kernel (no device API
    /// or no GIN).
    fn engine_needed(&self, comm: *mut c_void) -> Result<bool> {
        if self.version < MIN_ENGINE_VERSION {
            return Ok(false);
        }
        // SAFETY: the function's signature in nccl_device/host.h.
        let query: QueryProperties = unsafe { function(&self.library, "ncclCommQueryProperties")? };
        // SAFETY: every field is an integer, a bool or an array of bools: all zero is valid.
        let mut properties: CommProperties = unsafe { std::mem::zeroed() };
        properties.size = std::mem::size_of::<CommProperties>();
        properties.magic = API_MAGIC;
        properties.version = ENGINE_VERSION as u32;
        // SAFETY: a communicator of NCCL (the caller's contract); a properties struct of the
        // version it names.
        let queried = unsafe { query(comm, &mut properties) };
        self.check(queried, "ncclCommQueryProperties")?;
        if properties.n_lsa_teams <= 1 {
            return Ok(false);
        }
        if !properties.device_api_support || properties.gin_type == GIN_TYPE_NONE {
            return Err(Error::new(
                crate::abi::symmResult_t::symmUnsupported,
                format!(
                    "the NCCL communicator's ranks span {} load/store teams (NVLink domains) and \
                     this NCCL ({} version {}) has {}: symm's windows over it need every peer \
                     reachable by loads and stores, or NCCL's GPU-Initiated Networking for the \
                     peers that are not",
                    properties.n_lsa_teams,
                    self.library.name,
                    self.version,
                    if properties.device_api_support {
                        "no GIN (GPU-Initiated Networking)"
                    } else {
                        "no device API support"
                    }
                ),
            ));
        }
        Ok(true)
    }

    /// Make `comm`'s `ncclDevComm` for the engine protocol into `dev_comm` (collective: every
    /// rank calls it, see [`Nccl::engine_needed`]): one GIN context, every rank connected, VA
    /// and strong signals.
    fn create_dev_comm(&self, comm: *mut c_void, dev_comm: &mut DevComm) -> Result<()> {
        let requirements = DevCommRequirements {
            size: std::mem::size_of::<DevCommRequirements>(),
            magic: API_MAGIC,
            version: ENGINE_VERSION as u32,
            resource_requirements_list: std::ptr::null_mut(),
            team_requirements_list: std::ptr::null_mut(),
            lsa_multimem: false,
            barrier_count: 0,
            lsa_barrier_count: 0,
            rail_gin_barrier_count: 0,
            lsa_ll_a2a_block_count: 0,
            lsa_ll_a2a_slot_count: 0,
            gin_force_enable: false,
            gin_context_count: 1,
            gin_signal_count: 0,
            gin_counter_count: 0,
            gin_connection_type: GIN_CONNECTION_FULL,
            gin_exclusive_contexts: false,
            gin_queue_depth: 0,
            gin_traffic_class: UNDEF_INT,
            world_gin_barrier_count: 0,
            gin_strong_signals_required: true,
            gin_va_signals_required: true,
            gin_custom_stride: 1,
            gin_type: GIN_TYPE_NONE,
            use_runtime_version: false,
            cft_caps: 0,
            cft_barrier_count: 0,
        };
        // SAFETY: a communicator of NCCL; requirements of the version they name; room for
        // that version's ncclDevComm, aligned as it is.
        let created =
            unsafe { (dev_comm.create)(comm, &requirements, dev_comm.host.0.as_mut_ptr().cast()) };
        self.check(
            created,
            "ncclDevCommCreate (GIN, for the peers in other NVLink domains)",
        )?;
        dev_comm.created = true;
        // The device functions read it as NCCL 2.32.3 lays it out: a device communicator of
        // another layout (NCCL_DEV_API_JIT=1 makes the runtime's own) is refused.
        let version = u32::from_ne_bytes(dev_comm.host.0[4..8].try_into().expect("4 bytes"));
        if version != ENGINE_VERSION as u32 {
            return Err(Error::new(
                crate::abi::symmResult_t::symmUnsupported,
                format!(
                    "ncclDevCommCreate made a device communicator of version {version}, not \
                     the {ENGINE_VERSION} symm's device functions read (is NCCL_DEV_API_JIT \
                     set?)"
                ),
            ));
        }
        Ok(())
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

/// What a window over an NCCL window holds of NCCL's: its signal pads, an `ncclMemAlloc`
/// allocation registered as an NCCL window, and for an engine window the `ncclDevComm` and its
/// copy in device memory; released with the symm window (the device communicator first).
struct NcclResources {
    nccl: Arc<Nccl>,
    comm: usize,
    memory: usize,
    window: usize,
    dev_comm: Option<DevComm>,
}

/// An `ncclDevComm` as NCCL 2.32 lays it out (its fields are 8-byte aligned).
#[repr(C, align(8))]
struct DevCommBytes([u8; DEV_COMM_BYTES]);

/// An engine window's `ncclDevComm` (made once every rank prepared), and its copy in device
/// memory (the context's `ENGINE_COMM`, allocated beforehand).
struct DevComm {
    host: Box<DevCommBytes>,
    created: bool,
    create: DevCommCreate,
    destroy: DevCommDestroy,
    backend: Arc<Backend>,
    device: i32,
    address: u64,
}

impl Drop for NcclResources {
    fn drop(&mut self) {
        // SAFETY: made by `register` with this communicator; released once, after every
        // kernel of the symm window that used them (the window waits for its launches).
        unsafe {
            if let Some(dev_comm) = self.dev_comm.take() {
                if dev_comm.created {
                    let _ = (dev_comm.destroy)(
                        self.comm as *mut c_void,
                        dev_comm.host.0.as_ptr().cast(),
                    );
                }
                let _ = dev_comm.backend.free(dev_comm.device, dev_comm.address);
            }
            if self.window != 0 {
                let _ =
                    (self.nccl.deregister)(self.comm as *mut c_void, self.window as *mut c_void);
            }
            let _ = (self.nccl.mem_free)(self.memory as *mut c_void);
        }
    }
}

/// What one rank prepares alone, before the NCCL collective calls of a registration: NCCL
/// loaded and its ranks checked, every rank's address, the pads' memory, and for an engine
/// window the device memory of the device communicator's copy.
struct Prepared {
    bases: Vec<u64>,
    resources: NcclResources,
}

/// `symmCommWindowRegisterNccl` on one rank: the window over `bytes` bytes at `offset` of the
/// NCCL window `nccl_window` of `nccl_comm`, whose ranks must be `comm`'s.
///
/// Every rank first prepares alone and the ranks agree that all did
/// ([`super::agree_prepared`]): NCCL's collective calls (the pads' window registration, the
/// device communicator) wait for every rank without a bound, so no rank enters them unless
/// every rank will. A failure inside them is refused in the registration's place, reaching the
/// peers that got past them at once; a rank still inside one is NCCL's to release
/// (`ncclCommAbort`).
pub fn register(
    comm: &Arc<Comm>,
    nccl_comm: *mut c_void,
    nccl_window: *mut c_void,
    offset: usize,
    bytes: usize,
) -> Result<Arc<Window>> {
    const CALL: &str = "symmCommWindowRegisterNccl";
    super::refuse_in_group(CALL)?;
    let prepared = prepare(comm, nccl_comm, nccl_window, offset, bytes);
    super::agree_prepared(
        comm,
        CALL,
        &prepared.as_ref().map(|_| ()).map_err(Clone::clone),
    )?;
    let Prepared { bases, resources } = prepared?;
    let nccl = resources.nccl.clone();
    let lacks_address = bases.contains(&0) && resources.dev_comm.is_none();
    let peers = collective_part(comm, bases, resources, nccl_window, offset, bytes)
        .map_err(|e| crate::group::refuse_peer_window(comm, e))?;
    crate::group::register_peer_window(comm, peers).map_err(|mut e| {
        if lacks_address && nccl.version < MIN_ENGINE_VERSION {
            e.message.push_str(&format!(
                " (NCCL 2.32.3 or newer reaches such peers through GIN, in an engine window: \
                 {} is version {})",
                nccl.library.name, nccl.version
            ));
        }
        e
    })
}

/// This rank's part of a registration that needs no other rank (see [`register`]).
fn prepare(
    comm: &Arc<Comm>,
    nccl_comm: *mut c_void,
    nccl_window: *mut c_void,
    offset: usize,
    bytes: usize,
) -> Result<Prepared> {
    if nccl_comm.is_null() {
        return Err(Error::invalid_argument("ncclComm is NULL"));
    }
    if nccl_window.is_null() {
        return Err(Error::invalid_argument("ncclWindow is NULL"));
    }
    if bytes == 0 {
        return Err(Error::invalid_argument("bytes is 0"));
    }
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
    let engine = nccl.engine_needed(nccl_comm)?;
    let bases = nccl.peer_addresses(nccl_window, offset, nranks)?;
    let pad_bytes = symm_device::sync::signal_pad::signal_pad_bytes(nranks);
    let mut memory = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let allocated = unsafe { (nccl.mem_alloc)(&mut memory, pad_bytes) };
    nccl.check(allocated, "ncclMemAlloc")?;
    let mut resources = NcclResources {
        nccl: nccl.clone(),
        comm: nccl_comm as usize,
        memory: memory as usize,
        window: 0,
        dev_comm: None,
    };
    if engine {
        // SAFETY: the functions' signatures in nccl_device/host.h.
        let (create, destroy) = unsafe {
            (
                function::<DevCommCreate>(&nccl.library, "ncclDevCommCreate")?,
                function::<DevCommDestroy>(&nccl.library, "ncclDevCommDestroy")?,
            )
        };
        let backend = comm.clique.backend.clone();
        let address = backend.alloc_zeroed(comm.device, DEV_COMM_BYTES)?;
        resources.dev_comm = Some(DevComm {
            host: Box::new(DevCommBytes([0; DEV_COMM_BYTES])),
            created: false,
            create,
            destroy,
            backend,
            device: comm.device,
            address,
        });
    }
    Ok(Prepared { bases, resources })
}

/// The part of a registration that calls NCCL's collectives, once every rank prepared: the
/// pads registered as an NCCL window and, for an engine window, the device communicator made
/// and copied to device memory. The window before its registration.
fn collective_part(
    comm: &Arc<Comm>,
    bases: Vec<u64>,
    mut resources: NcclResources,
    nccl_window: *mut c_void,
    offset: usize,
    bytes: usize,
) -> Result<PeerWindow> {
    let nccl = resources.nccl.clone();
    let nccl_comm = resources.comm as *mut c_void;
    let pad_bytes = symm_device::sync::signal_pad::signal_pad_bytes(comm.clique.nranks);
    let flags = if resources.dev_comm.is_some() {
        WIN_COLL_SYMMETRIC | WIN_STRICT_ORDERING
    } else {
        WIN_COLL_SYMMETRIC
    };
    let mut pad_window = std::ptr::null_mut();
    // SAFETY: memory from ncclMemAlloc of `pad_bytes` bytes; a valid out-pointer.
    let registered = unsafe {
        (nccl.register)(
            nccl_comm,
            resources.memory as *mut c_void,
            pad_bytes,
            &mut pad_window,
            flags,
        )
    };
    nccl.check(registered, "ncclCommWindowRegister (the signal pads)")?;
    resources.window = pad_window as usize;
    let pads = nccl.peer_addresses(pad_window, 0, comm.clique.nranks)?;
    let (kind, words) = match resources.dev_comm.as_mut() {
        Some(dev_comm) => {
            nccl.create_dev_comm(nccl_comm, dev_comm)?;
            dev_comm
                .backend
                .upload(dev_comm.device, dev_comm.address, &dev_comm.host.0)?;
            // The engine words of an NCCL context: the data's and the pads' NCCL windows, and
            // the device communicator.
            let words = [nccl_window as u64, pad_window as u64, dev_comm.address];
            (OwnerKind::NcclEngine, words)
        }
        None => (OwnerKind::Nccl, [0; 3]),
    };
    Ok(PeerWindow {
        owner: Owner {
            kind,
            offset: offset as u64,
        },
        base: bases[comm.rank],
        size: bytes as u64,
        view: PeerView {
            bases,
            pads,
            pad_bytes: pad_bytes as u64,
            engine: words,
        },
        resources: Some(Box::new(resources)),
    })
}
