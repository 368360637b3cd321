//! Shareable device memory through the CUDA virtual memory management (VMM) API, made the
//! way NCCL's `ncclMemAlloc` makes it: physical memory from `cuMemCreate`, created with
//! exportable handle types (a POSIX file descriptor, plus a fabric handle where the device
//! offers one), mapped at a reserved address range. Ranks in other processes import the
//! handle and map the same physical memory into their own address space.
//!
//! # How it is meant to be used
//!
//! * **Allocation** (`symmMemAlloc`): [`device_caps`] → [`plan_allocation`] →
//!   [`VmmAllocation::create`]; the user's buffer is [`VmmAllocation::address`]. When the
//!   driver refuses fabric handles, `create` falls back to a POSIX file descriptor alone
//!   ([`AllocationPlan::without_fabric`]), as NCCL does.
//! * **Export** (window registration): for a window at `offset` bytes into the allocation,
//!   [`VmmAllocation::handle_message`] builds the [`ExportedHandle`] whose
//!   [`ExportedHandle::encode`] bytes go to every peer. With [`HandleKind::PosixFd`] the file
//!   descriptor from [`VmmAllocation::export_posix_fd`] travels beside the message over a Unix
//!   socket (`SCM_RIGHTS`); with [`HandleKind::Fabric`] the handle from
//!   [`VmmAllocation::export_fabric`] is inside the message.
//! * **Import** (in every peer): [`ExportedHandle::decode`], then
//!   [`ImportedMapping::import_fd`] or [`ImportedMapping::import_fabric`];
//!   [`ImportedMapping::address`] is the peer's window in this process. Ranks of the same
//!   process on other devices need no import: [`VmmAllocation::set_access`] grants them access.
//! * **Release** (window deregistration, communicator destroy): drop each [`ImportedMapping`]
//!   once no queued work uses it; drop the [`VmmAllocation`] at `symmMemFree`. The physical
//!   memory lives until its last mapping, in any process, is gone.
//!
//! Each value keeps a reference to its device's primary context and makes that context
//! current for its own driver calls (the caller's current context is restored). Setup calls
//! run with the thread's stream-capture mode relaxed, so they are safe while the caller
//! captures a graph; zeroing uses a private non-blocking stream.
//!
//! The planning ([`plan_allocation`]) and the handle message ([`ExportedHandle`]) are pure.
//! The driver steps are written against a small private trait so that their clean-up on
//! every error path is tested without a GPU.

use super::driver::{
    PrimaryContext, cuda_error, device_attribute, driver, guarded, outside_capture,
};
use crate::error::{Error, Result};
use cudarc::driver::{DriverError, result, sys};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

// ---------------------------------------------------------------------------------------
// Planning (pure)
// ---------------------------------------------------------------------------------------

/// The shareable handle types an allocation is created with (`CU_MEM_HANDLE_TYPE_*` bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleTypes {
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: peers on the same node import a file
    /// descriptor passed over a Unix socket.
    pub posix_fd: bool,
    /// `CU_MEM_HANDLE_TYPE_FABRIC`: peers import a 64-byte handle (multi-node NVLink, IMEX).
    pub fabric: bool,
}

impl HandleTypes {
    /// The `CUmemAllocationHandleType` bits (POSIX fd = 1, fabric = 8).
    pub fn bits(self) -> u32 {
        let mut bits = 0;
        if self.posix_fd {
            bits |= sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
        }
        if self.fabric {
            bits |= sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
        }
        bits
    }

    /// As the driver's type.
    fn to_cuda(self) -> sys::CUmemAllocationHandleType {
        sys::CUmemAllocationHandleType_enum(self.bits())
    }
}

/// What a device offers for shareable allocations, as the driver reports it (see
/// [`device_caps`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// The device (`CUdevice`).
    pub device: sys::CUdevice,
    /// The device's UUID (`cuDeviceGetUuid`).
    pub uuid: [u8; 16],
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub vmm_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub posix_fd_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED` (false on drivers that do not know
    /// the attribute).
    pub fabric_supported: bool,
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`: allocations are created
    /// `gpuDirectRDMACapable`, as NCCL does.
    pub gpu_direct_rdma_with_cuda_vmm: bool,
    /// `cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)` in bytes (0 when
    /// VMM is unsupported).
    pub recommended_granularity: usize,
    /// `cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)` in bytes (0 when VMM
    /// is unsupported).
    pub minimum_granularity: usize,
}

/// How one shareable allocation is to be made (see [`plan_allocation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationPlan {
    /// Handle types requested from `cuMemCreate`.
    pub handle_types: HandleTypes,
    /// Granularity in bytes (a power of two): the size is a multiple of it and the address
    /// range is aligned to it.
    pub granularity: usize,
    /// Bytes to create and map: the requested size rounded up to `granularity`.
    pub size: usize,
    /// Create the allocation `gpuDirectRDMACapable`.
    pub gpu_direct_rdma: bool,
}

impl AllocationPlan {
    /// The fallback when creating with fabric handles fails (NCCL's behaviour): the same
    /// plan with a POSIX file descriptor alone. `None` when the plan has no fabric handle or
    /// nothing would be left without it.
    pub fn without_fabric(&self) -> Option<AllocationPlan> {
        (self.handle_types.fabric && self.handle_types.posix_fd).then_some(AllocationPlan {
            handle_types: HandleTypes {
                posix_fd: true,
                fabric: false,
            },
            ..*self
        })
    }
}

/// Plan a shareable allocation of `requested` bytes on the device described by `caps`.
///
/// Errors: `symmUnsupported` when the device has no VMM support or can export memory neither
/// as a POSIX file descriptor nor as a fabric handle, or reports an unusable granularity;
/// `symmInvalidArgument` for 0 bytes or a size that overflows when rounded up.
pub fn plan_allocation(requested: usize, caps: DeviceCaps) -> Result<AllocationPlan> {
    let device = caps.device;
    if !caps.vmm_supported {
        return Err(Error::unsupported(format!(
            "device {device} does not support CUDA virtual memory management \
             (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): its memory cannot \
             be shared with other processes"
        )));
    }
    if !caps.posix_fd_supported && !caps.fabric_supported {
        return Err(Error::unsupported(format!(
            "device {device} can export memory neither as a POSIX file descriptor nor as a \
             fabric handle"
        )));
    }
    if requested == 0 {
        return Err(Error::invalid_argument(
            "size is 0: a shareable allocation needs at least one byte",
        ));
    }
    let granularity = granularity(caps)?;
    let size = requested
        .checked_next_multiple_of(granularity)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "size {requested} overflows when rounded up to the allocation granularity \
             ({granularity} bytes) of device {device}"
            ))
        })?;
    Ok(AllocationPlan {
        handle_types: HandleTypes {
            posix_fd: caps.posix_fd_supported,
            fabric: caps.fabric_supported,
        },
        granularity,
        size,
        gpu_direct_rdma: caps.gpu_direct_rdma_with_cuda_vmm,
    })
}

/// The granularity to use: the recommended one when it is a power of two and at least the
/// minimum (then a multiple of it), else the minimum, which must be a power of two.
fn granularity(caps: DeviceCaps) -> Result<usize> {
    let minimum = caps.minimum_granularity;
    if !minimum.is_power_of_two() {
        return Err(Error::unsupported(format!(
            "device {} reports a minimum allocation granularity of {minimum} bytes, not a \
             power of two",
            caps.device
        )));
    }
    let recommended = caps.recommended_granularity;
    Ok(if recommended.is_power_of_two() && recommended >= minimum {
        recommended
    } else {
        minimum
    })
}

// ---------------------------------------------------------------------------------------
// The handle message (pure)
// ---------------------------------------------------------------------------------------

/// How a peer imports the allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    /// A POSIX file descriptor, sent beside the message (`SCM_RIGHTS`), not inside it.
    PosixFd,
    /// A fabric handle (`CUmemFabricHandle`), inside the message.
    Fabric([u8; 64]),
}

/// What a rank sends its peers at window registration so that they can map its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportedHandle {
    /// How to import the allocation.
    pub kind: HandleKind,
    /// Bytes of the whole allocation (a multiple of `granularity`).
    pub size: u64,
    /// Allocation granularity in bytes (a power of two); the importer aligns its address
    /// range to it.
    pub granularity: u64,
    /// Offset of the window within the allocation (less than `size`).
    pub offset: u64,
    /// UUID of the exporting device.
    pub device_uuid: [u8; 16],
}

/// First bytes of every message.
const MAGIC: [u8; 4] = *b"SVMM";
/// Version of the layout below.
const VERSION: u16 = 1;
/// Kind code of [`HandleKind::PosixFd`].
const KIND_POSIX_FD: u16 = 1;
/// Kind code of [`HandleKind::Fabric`].
const KIND_FABRIC: u16 = 2;
/// Bytes of a fabric handle.
const FABRIC_BYTES: usize = 64;
/// Bytes before the kind-specific part: magic, version (u16), kind (u16), size, granularity,
/// offset (u64 each), device UUID (16). Integers are little-endian.
const HEADER_BYTES: usize = 4 + 2 + 2 + 8 + 8 + 8 + 16;

impl ExportedHandle {
    /// Bytes of an encoded message of this kind.
    pub fn encoded_len(kind: &HandleKind) -> usize {
        match kind {
            HandleKind::PosixFd => HEADER_BYTES,
            HandleKind::Fabric(_) => HEADER_BYTES + FABRIC_BYTES,
        }
    }

    /// The message as bytes (see [`ExportedHandle::decode`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::encoded_len(&self.kind));
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        let kind = match self.kind {
            HandleKind::PosixFd => KIND_POSIX_FD,
            HandleKind::Fabric(_) => KIND_FABRIC,
        };
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.granularity.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.device_uuid);
        if let HandleKind::Fabric(handle) = &self.kind {
            out.extend_from_slice(handle);
        }
        out
    }

    /// Parse and check a message from [`ExportedHandle::encode`]: exact length for its kind,
    /// known magic, version and kind, and a valid shape (see [`ExportedHandle::validate`]).
    /// Anything else is `symmInvalidArgument`.
    pub fn decode(bytes: &[u8]) -> Result<ExportedHandle> {
        let bad = |what: String| Error::invalid_argument(format!("VMM handle message: {what}"));
        let mut rest = bytes;
        let header_short = || {
            bad(format!(
                "{} bytes, shorter than the {HEADER_BYTES}-byte header",
                bytes.len()
            ))
        };
        let magic: [u8; 4] = take(&mut rest).ok_or_else(header_short)?;
        if magic != MAGIC {
            return Err(bad(format!("bad magic {magic:02x?}")));
        }
        let version = u16::from_le_bytes(take(&mut rest).ok_or_else(header_short)?);
        if version != VERSION {
            return Err(bad(format!(
                "version {version}, this library reads version {VERSION}"
            )));
        }
        let kind = u16::from_le_bytes(take(&mut rest).ok_or_else(header_short)?);
        let size = u64::from_le_bytes(take(&mut rest).ok_or_else(header_short)?);
        let granularity = u64::from_le_bytes(take(&mut rest).ok_or_else(header_short)?);
        let offset = u64::from_le_bytes(take(&mut rest).ok_or_else(header_short)?);
        let device_uuid: [u8; 16] = take(&mut rest).ok_or_else(header_short)?;
        let kind = match kind {
            KIND_POSIX_FD => HandleKind::PosixFd,
            KIND_FABRIC => HandleKind::Fabric(take(&mut rest).ok_or_else(|| {
                bad(format!(
                    "{} bytes, a fabric handle message has {}",
                    bytes.len(),
                    HEADER_BYTES + FABRIC_BYTES
                ))
            })?),
            other => return Err(bad(format!("unknown handle kind {other}"))),
        };
        if !rest.is_empty() {
            return Err(bad(format!(
                "{} bytes, a message of this kind has {}",
                bytes.len(),
                Self::encoded_len(&kind)
            )));
        }
        let message = ExportedHandle {
            kind,
            size,
            granularity,
            offset,
            device_uuid,
        };
        message.validate()?;
        Ok(message)
    }

    /// Check the shape: the granularity is a nonzero power of two, the size a nonzero
    /// multiple of it that fits in this process's address space, the offset inside the size.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Error::invalid_argument(format!("VMM handle message: {what}"));
        let (size, granularity, offset) = (self.size, self.granularity, self.offset);
        if !granularity.is_power_of_two() {
            return Err(bad(format!(
                "granularity {granularity} is not a nonzero power of two"
            )));
        }
        if !size.is_multiple_of(granularity) {
            return Err(bad(format!(
                "size {size} is not a multiple of the granularity {granularity}"
            )));
        }
        if offset >= size {
            return Err(bad(format!(
                "offset {offset} is not inside the allocation of {size} bytes"
            )));
        }
        if usize::try_from(size).is_err() {
            return Err(bad(format!("size {size} does not fit in this process")));
        }
        Ok(())
    }

    /// Size and granularity as `usize` (checked by [`ExportedHandle::validate`] first).
    fn mapping_sizes(&self) -> Result<(usize, usize)> {
        self.validate()?;
        let size = usize::try_from(self.size)
            .map_err(|_| Error::invalid_argument("VMM handle message: size too large"))?;
        let granularity = usize::try_from(self.granularity)
            .map_err(|_| Error::invalid_argument("VMM handle message: granularity too large"))?;
        Ok((size, granularity))
    }
}

/// The first `N` bytes of `rest` (advancing it), or `None` when fewer remain.
fn take<const N: usize>(rest: &mut &[u8]) -> Option<[u8; N]> {
    let (head, tail) = rest.split_first_chunk::<N>()?;
    *rest = tail;
    Some(*head)
}

// ---------------------------------------------------------------------------------------
// Driver plumbing
// ---------------------------------------------------------------------------------------

/// Whether `cuMemCreate` failing with `code` means "no fabric handles here", after which
/// NCCL retries with a POSIX file descriptor alone.
fn fabric_refused(code: sys::CUresult) -> bool {
    matches!(
        code,
        sys::cudaError_enum::CUDA_ERROR_NOT_PERMITTED
            | sys::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED
    )
}

/// A location on `device`.
fn device_location(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

/// The properties of pinned device memory on `device` with `types` handles.
fn allocation_prop(
    device: sys::CUdevice,
    types: HandleTypes,
    gpu_direct_rdma: bool,
) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: types.to_cuda(),
        location: device_location(device),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: u8::from(gpu_direct_rdma),
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `device`'s UUID.
pub fn device_uuid(device: sys::CUdevice) -> Result<[u8; 16]> {
    let uuid = driver("cuDeviceGetUuid", || result::device::get_uuid(device))?;
    Ok(uuid.bytes.map(|b| b as u8))
}

/// What `device` offers for shareable allocations (see [`DeviceCaps`]). The granularities
/// are queried for the handle types a plan would request; if that query fails with fabric
/// handles included, fabric is reported unsupported.
pub fn device_caps(device: sys::CUdevice) -> Result<DeviceCaps> {
    let context = PrimaryContext::retain(device)?;
    let _entered = context.enter()?;
    let attribute = |attribute| device_attribute(device, attribute).map(|value| value != 0);
    use sys::CUdevice_attribute as A;
    let vmm_supported = attribute(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)?;
    let posix_fd_supported =
        attribute(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)?;
    // Drivers that do not know an attribute reject it: then it is unsupported.
    let fabric_supported =
        attribute(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED).unwrap_or(false);
    let gpu_direct_rdma_with_cuda_vmm =
        attribute(A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED).unwrap_or(false);
    let mut caps = DeviceCaps {
        device,
        uuid: device_uuid(device)?,
        vmm_supported,
        posix_fd_supported,
        fabric_supported,
        gpu_direct_rdma_with_cuda_vmm,
        recommended_granularity: 0,
        minimum_granularity: 0,
    };
    if !vmm_supported || !(posix_fd_supported || fabric_supported) {
        return Ok(caps);
    }
    let granularities = |types: HandleTypes| -> Result<(usize, usize)> {
        let prop = allocation_prop(device, types, gpu_direct_rdma_with_cuda_vmm);
        let query = |option| {
            driver("cuMemGetAllocationGranularity", || {
                let mut granularity = 0usize;
                // SAFETY: `prop` is fully initialized; writes one usize.
                unsafe { sys::cuMemGetAllocationGranularity(&mut granularity, &prop, option) }
                    .result()?;
                Ok(granularity)
            })
        };
        use sys::CUmemAllocationGranularity_flags as G;
        Ok((
            query(G::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)?,
            query(G::CU_MEM_ALLOC_GRANULARITY_MINIMUM)?,
        ))
    };
    let types = HandleTypes {
        posix_fd: posix_fd_supported,
        fabric: fabric_supported,
    };
    let (recommended, minimum) = match granularities(types) {
        Ok(g) => g,
        Err(_) if types.fabric && types.posix_fd => {
            caps.fabric_supported = false;
            granularities(HandleTypes {
                posix_fd: true,
                fabric: false,
            })?
        }
        Err(e) => return Err(e),
    };
    caps.recommended_granularity = recommended;
    caps.minimum_granularity = minimum;
    Ok(caps)
}

/// The VMM steps of creating, mapping and releasing memory, each one driver call. The real
/// implementation is [`Driver`]; tests use a fake to check the clean-up on every error path.
/// Callers pass only handles and ranges that they made through the same implementation.
trait Vmm {
    /// `cuMemCreate` with the plan's size and handle types.
    fn create(
        &self,
        device: sys::CUdevice,
        plan: &AllocationPlan,
    ) -> std::result::Result<u64, DriverError>;
    /// `cuMemAddressReserve`.
    fn reserve(&self, size: usize, alignment: usize) -> std::result::Result<u64, DriverError>;
    /// `cuMemMap` of the whole allocation at `address`.
    fn map(&self, address: u64, size: usize, handle: u64) -> std::result::Result<(), DriverError>;
    /// `cuMemSetAccess`: read/write for `devices`.
    fn set_access(
        &self,
        address: u64,
        size: usize,
        devices: &[sys::CUdevice],
    ) -> std::result::Result<(), DriverError>;
    /// Zero the range, complete when this returns.
    fn zero(&self, address: u64, size: usize) -> std::result::Result<(), DriverError>;
    /// `cuMemUnmap`.
    fn unmap(&self, address: u64, size: usize) -> std::result::Result<(), DriverError>;
    /// `cuMemAddressFree`.
    fn address_free(&self, address: u64, size: usize) -> std::result::Result<(), DriverError>;
    /// `cuMemRelease`.
    fn release(&self, handle: u64) -> std::result::Result<(), DriverError>;
}

/// The CUDA driver (a context of the device is current on the calling thread).
struct Driver;

impl Vmm for Driver {
    fn create(
        &self,
        device: sys::CUdevice,
        plan: &AllocationPlan,
    ) -> std::result::Result<u64, DriverError> {
        let prop = allocation_prop(device, plan.handle_types, plan.gpu_direct_rdma);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is fully initialized and outlives the call; writes one handle.
        unsafe { sys::cuMemCreate(&mut handle, plan.size, &prop, 0) }.result()?;
        Ok(handle)
    }

    fn reserve(&self, size: usize, alignment: usize) -> std::result::Result<u64, DriverError> {
        let mut address: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; no fixed address is requested (0), no flags.
        unsafe { sys::cuMemAddressReserve(&mut address, size, alignment, 0, 0) }.result()?;
        Ok(address)
    }

    fn map(&self, address: u64, size: usize, handle: u64) -> std::result::Result<(), DriverError> {
        // SAFETY: a range reserved by `reserve` and a handle from `create` or an import
        // (trait contract); the driver checks sizes and alignment.
        unsafe { sys::cuMemMap(address, size, 0, handle, 0) }.result()
    }

    fn set_access(
        &self,
        address: u64,
        size: usize,
        devices: &[sys::CUdevice],
    ) -> std::result::Result<(), DriverError> {
        let descriptors: Vec<sys::CUmemAccessDesc> = devices
            .iter()
            .map(|&device| sys::CUmemAccessDesc {
                location: device_location(device),
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: a range mapped by `map`; the descriptor array has `len` entries and
        // outlives the call.
        unsafe { sys::cuMemSetAccess(address, size, descriptors.as_ptr(), descriptors.len()) }
            .result()
    }

    fn zero(&self, address: u64, size: usize) -> std::result::Result<(), DriverError> {
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)?;
        // SAFETY: the range is mapped and readable/writable by this device (set before); the
        // stream is private and synchronized before the range is used.
        let zeroed = unsafe {
            result::memset_d8_async(address, 0, size, stream)
                .and_then(|()| result::stream::synchronize(stream))
        };
        // SAFETY: created above and destroyed once; its work is complete or failed.
        let destroyed = unsafe { result::stream::destroy(stream) };
        zeroed.and(destroyed)
    }

    fn unmap(&self, address: u64, size: usize) -> std::result::Result<(), DriverError> {
        // SAFETY: a range mapped by `map` (trait contract), unmapped once.
        unsafe { sys::cuMemUnmap(address, size) }.result()
    }

    fn address_free(&self, address: u64, size: usize) -> std::result::Result<(), DriverError> {
        // SAFETY: a range from `reserve` (trait contract), freed once.
        unsafe { sys::cuMemAddressFree(address, size) }.result()
    }

    fn release(&self, handle: u64) -> std::result::Result<(), DriverError> {
        // SAFETY: a handle from `create` or an import (trait contract), released once.
        unsafe { sys::cuMemRelease(handle) }.result()
    }
}

/// A handle with its mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    handle: u64,
    address: u64,
    handle_types: HandleTypes,
}

/// Create the physical memory of `plan`: with all its handle types, and again without fabric
/// when the driver refuses fabric (`CUDA_ERROR_NOT_PERMITTED`, `CUDA_ERROR_NOT_SUPPORTED`).
fn create_handle(
    vmm: &impl Vmm,
    device: sys::CUdevice,
    plan: &AllocationPlan,
) -> Result<(u64, HandleTypes)> {
    let what = format!("cuMemCreate ({} bytes on device {device})", plan.size);
    match guarded(&what, || vmm.create(device, plan))? {
        Ok(handle) => Ok((handle, plan.handle_types)),
        Err(DriverError(code)) => match plan.without_fabric() {
            Some(fallback) if fabric_refused(code) => {
                let what = format!("{what} without fabric handles (refused with {code:?})");
                let handle = driver(&what, || vmm.create(device, &fallback))?;
                Ok((handle, fallback.handle_types))
            }
            _ => Err(cuda_error(&what, code)),
        },
    }
}

/// Reserve an address range for `handle`, map it, give `access` read/write access and, if
/// `zero`, zero it. On failure everything done here is undone (the handle is kept).
fn map_handle(
    vmm: &impl Vmm,
    handle: u64,
    size: usize,
    alignment: usize,
    access: &[sys::CUdevice],
    zero: bool,
) -> Result<u64> {
    let address = driver("cuMemAddressReserve", || vmm.reserve(size, alignment))?;
    if let Err(e) = driver("cuMemMap", || vmm.map(address, size, handle)) {
        let _ = driver("cuMemAddressFree", || vmm.address_free(address, size));
        return Err(e);
    }
    let ready = driver("cuMemSetAccess", || vmm.set_access(address, size, access)).and_then(|()| {
        if zero {
            driver("zeroing (cuMemsetD8Async)", || vmm.zero(address, size))
        } else {
            Ok(())
        }
    });
    if let Err(e) = ready {
        let _ = driver("cuMemUnmap", || vmm.unmap(address, size));
        let _ = driver("cuMemAddressFree", || vmm.address_free(address, size));
        return Err(e);
    }
    Ok(address)
}

/// Create, map, make accessible to `device` and zero the memory of `plan`; on failure
/// nothing is left behind.
fn create_mapping(vmm: &impl Vmm, device: sys::CUdevice, plan: &AllocationPlan) -> Result<Mapping> {
    let (handle, handle_types) = create_handle(vmm, device, plan)?;
    match map_handle(vmm, handle, plan.size, plan.granularity, &[device], true) {
        Ok(address) => Ok(Mapping {
            handle,
            address,
            handle_types,
        }),
        Err(e) => {
            let _ = driver("cuMemRelease", || vmm.release(handle));
            Err(e)
        }
    }
}

/// Map an imported `handle` for `device`; on failure the handle is released too.
fn map_import(
    vmm: &impl Vmm,
    handle: u64,
    size: usize,
    alignment: usize,
    device: sys::CUdevice,
) -> Result<u64> {
    map_handle(vmm, handle, size, alignment, &[device], false).inspect_err(|_| {
        let _ = driver("cuMemRelease", || vmm.release(handle));
    })
}

/// Unmap, free the address range, release the handle: each step tried even if an earlier
/// one failed; the first error is returned.
fn unmap_and_release(vmm: &impl Vmm, address: u64, size: usize, handle: u64) -> Result<()> {
    let unmapped = driver("cuMemUnmap", || vmm.unmap(address, size));
    let freed = driver("cuMemAddressFree", || vmm.address_free(address, size));
    let released = driver("cuMemRelease", || vmm.release(handle));
    unmapped.and(freed).and(released)
}

// ---------------------------------------------------------------------------------------
// Allocations and imports
// ---------------------------------------------------------------------------------------

/// Shareable device memory: physical memory from `cuMemCreate` mapped at its own address
/// range, readable and writable by its device, zeroed. Dropping it unmaps the range, frees it
/// and releases the handle (best effort); peers' imports keep the physical memory alive.
#[derive(Debug)]
pub struct VmmAllocation {
    address: u64,
    size: usize,
    granularity: usize,
    handle: sys::CUmemGenericAllocationHandle,
    handle_types: HandleTypes,
    ordinal: i32,
    device: sys::CUdevice,
    uuid: [u8; 16],
    /// Dropped after `Drop::drop` has unmapped everything.
    context: PrimaryContext,
}

// SAFETY: the fields are plain driver handles and numbers; driver calls on them may be made
// from any thread (the context is made current for each), and no method mutates `self`.
unsafe impl Send for VmmAllocation {}
// SAFETY: as above.
unsafe impl Sync for VmmAllocation {}

impl VmmAllocation {
    /// Create the memory of `plan` (from [`plan_allocation`]) on `device` (device `ordinal`,
    /// kept for the caller's bookkeeping): `cuMemCreate` (pinned device memory with the plan's
    /// handle types, retried without fabric when the driver refuses it), `cuMemAddressReserve`
    /// aligned to the granularity, `cuMemMap`, `cuMemSetAccess` (read/write for `device`),
    /// then zeroed and synchronized on a private stream. On failure every step already done
    /// is undone. Safe while the caller captures a graph.
    pub fn create(ordinal: i32, device: sys::CUdevice, plan: AllocationPlan) -> Result<Self> {
        if plan.size == 0
            || !plan.granularity.is_power_of_two()
            || !plan.size.is_multiple_of(plan.granularity)
        {
            return Err(Error::invalid_argument(format!(
                "allocation plan of {} bytes at granularity {} is not valid",
                plan.size, plan.granularity
            )));
        }
        let context = PrimaryContext::retain(device)?;
        let entered = context.enter()?;
        let uuid = device_uuid(device)?;
        let mapping = outside_capture(|| create_mapping(&Driver, device, &plan))?;
        drop(entered);
        Ok(VmmAllocation {
            address: mapping.address,
            size: plan.size,
            granularity: plan.granularity,
            handle: mapping.handle,
            handle_types: mapping.handle_types,
            ordinal,
            device,
            uuid,
            context,
        })
    }

    /// Device address of the first byte.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Bytes mapped (the planned, rounded-up size).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Allocation granularity in bytes.
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// The handle types the memory was created with (fabric may have been dropped, see
    /// [`VmmAllocation::create`]).
    pub fn handle_types(&self) -> HandleTypes {
        self.handle_types
    }

    /// The generic allocation handle (`CUmemGenericAllocationHandle`).
    pub fn handle(&self) -> sys::CUmemGenericAllocationHandle {
        self.handle
    }

    /// The device ordinal given to [`VmmAllocation::create`].
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The device (`CUdevice`).
    pub fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// The device's UUID.
    pub fn device_uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Give `devices` (other devices of this process, with peer access to this one)
    /// read/write access to the whole allocation; other devices' access is unchanged.
    pub fn set_access(&self, devices: &[sys::CUdevice]) -> Result<()> {
        if devices.is_empty() {
            return Ok(());
        }
        let _entered = self.context.enter()?;
        outside_capture(|| {
            driver("cuMemSetAccess", || {
                Driver.set_access(self.address, self.size, devices)
            })
        })
    }

    /// The message peers need to map the window at `offset` bytes into this allocation,
    /// imported as `kind` (for [`HandleKind::Fabric`], the bytes of
    /// [`VmmAllocation::export_fabric`]). `symmInvalidUsage` if the memory was not created
    /// with that kind of handle, `symmInvalidArgument` if `offset` is outside it.
    pub fn handle_message(&self, kind: HandleKind, offset: u64) -> Result<ExportedHandle> {
        let granted = match kind {
            HandleKind::PosixFd => self.handle_types.posix_fd,
            HandleKind::Fabric(_) => self.handle_types.fabric,
        };
        if !granted {
            return Err(Error::invalid_usage(format!(
                "the allocation at {:#x} was not created with {} handles",
                self.address,
                kind_name(&kind)
            )));
        }
        let message = ExportedHandle {
            kind,
            size: self.size as u64,
            granularity: self.granularity as u64,
            offset,
            device_uuid: self.uuid,
        };
        message.validate()?;
        Ok(message)
    }

    /// A new POSIX file descriptor for the memory (`cuMemExportToShareableHandle`), to be sent
    /// to peers with `SCM_RIGHTS`; close it once sent. `symmInvalidUsage` if the memory was
    /// not created with that handle type.
    pub fn export_posix_fd(&self) -> Result<OwnedFd> {
        if !self.handle_types.posix_fd {
            return Err(Error::invalid_usage(format!(
                "the allocation at {:#x} was not created with POSIX file descriptor handles",
                self.address
            )));
        }
        let _entered = self.context.enter()?;
        let fd = outside_capture(|| {
            driver(
                "cuMemExportToShareableHandle (POSIX file descriptor)",
                || {
                    let mut fd: c_int = -1;
                    // SAFETY: for a POSIX file descriptor the driver writes one int at the
                    // pointer; `handle` is this allocation's, alive while `self` is.
                    unsafe {
                        sys::cuMemExportToShareableHandle(
                        (&mut fd as *mut c_int).cast::<c_void>(),
                        self.handle,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                        0,
                    )
                    }
                    .result()?;
                    Ok(fd)
                },
            )
        })?;
        if fd < 0 {
            return Err(Error::internal(format!(
                "cuMemExportToShareableHandle returned file descriptor {fd}"
            )));
        }
        // SAFETY: the driver made a new descriptor, owned by the caller from now on.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The memory's fabric handle (`cuMemExportToShareableHandle`, `CU_MEM_HANDLE_TYPE_FABRIC`).
    /// `symmInvalidUsage` if fabric handles were not granted.
    pub fn export_fabric(&self) -> Result<[u8; 64]> {
        if !self.handle_types.fabric {
            return Err(Error::invalid_usage(format!(
                "the allocation at {:#x} was not created with fabric handles",
                self.address
            )));
        }
        let _entered = self.context.enter()?;
        outside_capture(|| {
            driver("cuMemExportToShareableHandle (fabric)", || {
                let mut fabric = sys::CUmemFabricHandle {
                    data: [0; FABRIC_BYTES],
                };
                // SAFETY: for a fabric handle the driver writes one `CUmemFabricHandle` at the
                // pointer; `handle` is this allocation's, alive while `self` is.
                unsafe {
                    sys::cuMemExportToShareableHandle(
                        (&mut fabric as *mut sys::CUmemFabricHandle).cast::<c_void>(),
                        self.handle,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                        0,
                    )
                }
                .result()?;
                Ok(fabric.data)
            })
        })
    }
}

impl Drop for VmmAllocation {
    fn drop(&mut self) {
        // Best effort: try every step even when the context cannot be entered.
        let _entered = self.context.enter();
        let _ =
            outside_capture(|| unmap_and_release(&Driver, self.address, self.size, self.handle));
    }
}

/// The name of a handle kind in messages.
fn kind_name(kind: &HandleKind) -> &'static str {
    match kind {
        HandleKind::PosixFd => "POSIX file descriptor",
        HandleKind::Fabric(_) => "fabric",
    }
}

/// A peer's allocation mapped into this process for one device. Dropping it unmaps the range,
/// frees it and releases the imported handle (best effort); no queued work may use it then.
#[derive(Debug)]
pub struct ImportedMapping {
    base: u64,
    size: usize,
    offset: u64,
    handle: sys::CUmemGenericAllocationHandle,
    /// Dropped after `Drop::drop` has unmapped everything.
    context: PrimaryContext,
}

// SAFETY: plain driver handles and numbers; driver calls on them may be made from any thread
// (the context is made current for each), and no method mutates `self`.
unsafe impl Send for ImportedMapping {}
// SAFETY: as above.
unsafe impl Sync for ImportedMapping {}

impl ImportedMapping {
    /// Import the allocation described by `message` (kind [`HandleKind::PosixFd`]) from the
    /// file descriptor `fd` received beside it, and map it for `device`: the whole
    /// allocation, read/write. `fd` is closed when this returns (the import holds its own
    /// reference to the memory).
    pub fn import_fd(device: sys::CUdevice, fd: OwnedFd, message: &ExportedHandle) -> Result<Self> {
        if message.kind != HandleKind::PosixFd {
            return Err(Error::invalid_argument(
                "VMM handle message: a fabric handle message was given to the POSIX file \
                 descriptor import",
            ));
        }
        let raw = usize::try_from(fd.as_raw_fd())
            .map_err(|_| Error::invalid_argument("negative file descriptor"))?;
        // The driver takes the descriptor's value in the pointer-sized handle argument.
        let os_handle: *mut c_void = std::ptr::without_provenance_mut(raw);
        let mapping = Self::import(device, message, "POSIX file descriptor", || {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `os_handle` carries an open descriptor (owned by `fd`, alive during the
            // call); writes one handle.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    os_handle,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            }
            .result()?;
            Ok(handle)
        });
        drop(fd);
        mapping
    }

    /// Import the allocation described by `message` (kind [`HandleKind::Fabric`]) and map it
    /// for `device`: the whole allocation, read/write.
    pub fn import_fabric(device: sys::CUdevice, message: &ExportedHandle) -> Result<Self> {
        let HandleKind::Fabric(data) = message.kind else {
            return Err(Error::invalid_argument(
                "VMM handle message: a POSIX file descriptor message was given to the fabric \
                 import",
            ));
        };
        Self::import(device, message, "fabric", || {
            let mut fabric = sys::CUmemFabricHandle { data };
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: for a fabric handle the driver reads one `CUmemFabricHandle` at the
            // pointer, alive during the call; writes one handle.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    (&mut fabric as *mut sys::CUmemFabricHandle).cast::<c_void>(),
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
                )
            }
            .result()?;
            Ok(handle)
        })
    }

    /// Import with `import_handle`, then map (see [`map_import`]).
    fn import(
        device: sys::CUdevice,
        message: &ExportedHandle,
        kind: &str,
        import_handle: impl FnOnce() -> std::result::Result<u64, DriverError>,
    ) -> Result<Self> {
        let (size, granularity) = message.mapping_sizes()?;
        let context = PrimaryContext::retain(device)?;
        let entered = context.enter()?;
        let what = format!("cuMemImportFromShareableHandle ({kind}, {size} bytes)");
        let (handle, base) = outside_capture(|| {
            let handle = driver(&what, import_handle)?;
            let base = map_import(&Driver, handle, size, granularity, device)?;
            Ok((handle, base))
        })?;
        drop(entered);
        Ok(ImportedMapping {
            base,
            size,
            offset: message.offset,
            handle,
            context,
        })
    }

    /// Address of the peer's window in this process: the mapping's base plus the window's
    /// offset.
    pub fn address(&self) -> u64 {
        self.base + self.offset
    }

    /// Address where the whole allocation is mapped.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Bytes mapped (the whole allocation).
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for ImportedMapping {
    fn drop(&mut self) {
        // Best effort: try every step even when the context cannot be entered.
        let _entered = self.context.enter();
        let _ = outside_capture(|| unmap_and_release(&Driver, self.base, self.size, self.handle));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::symmResult_t;
    use std::cell::RefCell;
    use std::collections::BTreeSet;
    use sys::cudaError_enum as E;

    const MIB2: usize = 2 << 20;

    fn caps() -> DeviceCaps {
        DeviceCaps {
            device: 3,
            uuid: [7; 16],
            vmm_supported: true,
            posix_fd_supported: true,
            fabric_supported: false,
            gpu_direct_rdma_with_cuda_vmm: false,
            recommended_granularity: MIB2,
            minimum_granularity: MIB2,
        }
    }

    const POSIX: HandleTypes = HandleTypes {
        posix_fd: true,
        fabric: false,
    };
    const BOTH: HandleTypes = HandleTypes {
        posix_fd: true,
        fabric: true,
    };
    const FABRIC: HandleTypes = HandleTypes {
        posix_fd: false,
        fabric: true,
    };

    // ----- planning -----

    #[test]
    fn plan_rounds_up_to_the_recommended_granularity() {
        for (requested, size) in [
            (1, MIB2),
            (MIB2 - 1, MIB2),
            (MIB2, MIB2),
            (MIB2 + 1, 2 * MIB2),
            (5 * MIB2, 5 * MIB2),
        ] {
            let plan = plan_allocation(requested, caps()).unwrap();
            assert_eq!(plan.size, size, "{requested}");
            assert_eq!(plan.granularity, MIB2);
            assert_eq!(plan.handle_types, POSIX);
            assert!(!plan.gpu_direct_rdma);
        }
        let mut c = caps();
        c.minimum_granularity = 64 << 10;
        let plan = plan_allocation(100, c).unwrap();
        assert_eq!((plan.size, plan.granularity), (MIB2, MIB2));
    }

    #[test]
    fn plan_falls_back_to_the_minimum_granularity_when_the_recommended_one_is_unusable() {
        for recommended in [0, 3 << 20, 32 << 10] {
            let mut c = caps();
            c.minimum_granularity = 64 << 10;
            c.recommended_granularity = recommended;
            let plan = plan_allocation(1, c).unwrap();
            assert_eq!((plan.size, plan.granularity), (64 << 10, 64 << 10));
        }
        for minimum in [0, 3 << 20] {
            let mut c = caps();
            c.minimum_granularity = minimum;
            let e = plan_allocation(1, c).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmUnsupported);
            assert!(e.message.contains("device 3"), "{}", e.message);
        }
    }

    #[test]
    fn plan_rejects_no_vmm_no_handle_type_zero_and_overflow() {
        let mut c = caps();
        c.vmm_supported = false;
        let e = plan_allocation(1, c).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmUnsupported);
        assert!(e.message.contains("device 3"), "{}", e.message);

        let mut c = caps();
        c.posix_fd_supported = false;
        let e = plan_allocation(1, c).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmUnsupported);
        assert!(e.message.contains("device 3"), "{}", e.message);

        let e = plan_allocation(0, caps()).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);

        for requested in [usize::MAX, usize::MAX - MIB2 + 2] {
            let e = plan_allocation(requested, caps()).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmInvalidArgument, "{requested}");
        }
        let last = usize::MAX - MIB2 + 1;
        assert_eq!(plan_allocation(last, caps()).unwrap().size, last);
    }

    #[test]
    fn plan_requests_fabric_where_supported_with_a_posix_fd_fallback() {
        let mut c = caps();
        c.fabric_supported = true;
        c.gpu_direct_rdma_with_cuda_vmm = true;
        let plan = plan_allocation(10, c).unwrap();
        assert_eq!(plan.handle_types, BOTH);
        assert!(plan.gpu_direct_rdma);
        let fallback = plan.without_fabric().unwrap();
        assert_eq!(
            fallback,
            AllocationPlan {
                handle_types: POSIX,
                ..plan
            }
        );
        assert_eq!(fallback.without_fabric(), None);

        c.posix_fd_supported = false;
        let plan = plan_allocation(10, c).unwrap();
        assert_eq!(plan.handle_types, FABRIC);
        assert_eq!(plan.without_fabric(), None);
    }

    #[test]
    fn handle_type_bits_and_allocation_properties() {
        assert_eq!(POSIX.bits(), 1);
        assert_eq!(FABRIC.bits(), 8);
        assert_eq!(BOTH.bits(), 9);
        assert_eq!(
            HandleTypes {
                posix_fd: false,
                fabric: false
            }
            .bits(),
            0
        );
        let prop = allocation_prop(5, BOTH, true);
        assert_eq!(
            prop.type_,
            sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        );
        assert_eq!(prop.requestedHandleTypes.0, 9);
        assert_eq!(
            prop.location.type_,
            sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        assert_eq!(prop.location.id, 5);
        assert!(prop.win32HandleMetaData.is_null());
        assert_eq!(prop.allocFlags.gpuDirectRDMACapable, 1);
        assert_eq!(prop.allocFlags.compressionType, 0);
        assert_eq!(
            allocation_prop(0, POSIX, false)
                .allocFlags
                .gpuDirectRDMACapable,
            0
        );
    }

    // ----- the handle message -----

    fn posix_message() -> ExportedHandle {
        ExportedHandle {
            kind: HandleKind::PosixFd,
            size: 4 * MIB2 as u64,
            granularity: MIB2 as u64,
            offset: 4096,
            device_uuid: *b"0123456789abcdef",
        }
    }

    fn fabric_message() -> ExportedHandle {
        let mut handle = [0u8; 64];
        for (i, b) in handle.iter_mut().enumerate() {
            *b = (i * 7 + 1) as u8;
        }
        ExportedHandle {
            kind: HandleKind::Fabric(handle),
            size: MIB2 as u64,
            granularity: MIB2 as u64,
            offset: 0,
            device_uuid: [0xee; 16],
        }
    }

    /// xorshift64*: deterministic pseudo-random numbers for the fuzz tests.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn assert_invalid(bytes: &[u8]) {
        match ExportedHandle::decode(bytes) {
            Err(e) => {
                assert_eq!(e.code, symmResult_t::symmInvalidArgument, "{}", e.message);
                assert!(e.message.starts_with("VMM handle message"), "{}", e.message);
            }
            Ok(m) => panic!("{bytes:02x?} decoded as {m:?}"),
        }
    }

    #[test]
    fn message_round_trips() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut messages = vec![posix_message(), fabric_message()];
        for _ in 0..200 {
            let granularity = 1u64 << rng.below(40);
            let chunks = 1 + rng.next() % 1000;
            let size = granularity * chunks;
            let mut uuid = [0u8; 16];
            uuid.iter_mut().for_each(|b| *b = rng.next() as u8);
            let kind = if rng.below(2) == 0 {
                HandleKind::PosixFd
            } else {
                let mut handle = [0u8; 64];
                handle.iter_mut().for_each(|b| *b = rng.next() as u8);
                HandleKind::Fabric(handle)
            };
            messages.push(ExportedHandle {
                kind,
                size,
                granularity,
                offset: rng.next() % size,
                device_uuid: uuid,
            });
        }
        for m in messages {
            let bytes = m.encode();
            assert_eq!(bytes.len(), ExportedHandle::encoded_len(&m.kind));
            assert_eq!(ExportedHandle::decode(&bytes), Ok(m));
        }
        assert_eq!(posix_message().encode().len(), 48);
        assert_eq!(fabric_message().encode().len(), 112);
    }

    #[test]
    fn message_layout_is_fixed() {
        let bytes = posix_message().encode();
        assert_eq!(&bytes[0..4], b"SVMM");
        assert_eq!(&bytes[4..6], &[1, 0]);
        assert_eq!(&bytes[6..8], &[1, 0]);
        assert_eq!(&bytes[8..16], &(4 * MIB2 as u64).to_le_bytes());
        assert_eq!(&bytes[16..24], &(MIB2 as u64).to_le_bytes());
        assert_eq!(&bytes[24..32], &4096u64.to_le_bytes());
        assert_eq!(&bytes[32..48], b"0123456789abcdef");
        let bytes = fabric_message().encode();
        assert_eq!(&bytes[6..8], &[2, 0]);
        assert_eq!(&bytes[48..], &fabric_message_handle()[..]);
    }

    fn fabric_message_handle() -> [u8; 64] {
        match fabric_message().kind {
            HandleKind::Fabric(h) => h,
            HandleKind::PosixFd => unreachable!(),
        }
    }

    #[test]
    fn every_truncation_and_extension_is_rejected() {
        for m in [posix_message(), fabric_message()] {
            let bytes = m.encode();
            for len in 0..bytes.len() {
                assert_invalid(&bytes[..len]);
            }
            for extra in [0u8, 0xff] {
                let mut longer = bytes.clone();
                longer.push(extra);
                assert_invalid(&longer);
            }
        }
        // A POSIX fd header followed by a fabric handle, and a fabric header without one.
        let mut posix_long = posix_message().encode();
        posix_long.extend_from_slice(&[0; 64]);
        assert_invalid(&posix_long);
        assert_invalid(&fabric_message().encode()[..48]);
    }

    #[test]
    fn malformed_fields_are_rejected() {
        let patch = |m: ExportedHandle, at: usize, value: &[u8]| {
            let mut bytes = m.encode();
            bytes[at..at + value.len()].copy_from_slice(value);
            bytes
        };
        assert_invalid(&patch(posix_message(), 0, b"XVMM"));
        assert_invalid(&patch(posix_message(), 4, &2u16.to_le_bytes()));
        assert_invalid(&patch(posix_message(), 4, &0u16.to_le_bytes()));
        for kind in [0u16, 3, 0xffff] {
            assert_invalid(&patch(posix_message(), 6, &kind.to_le_bytes()));
        }
        let with = |size: u64, granularity: u64, offset: u64| ExportedHandle {
            size,
            granularity,
            offset,
            ..posix_message()
        };
        let g = MIB2 as u64;
        for bad in [
            with(g, 0, 0),              // zero granularity
            with(3 * 1000, 3000, 0),    // not a power of two
            with(g + 4096, g, 0),       // size not a multiple
            with(0, g, 0),              // empty allocation
            with(g, g, g),              // offset at the end
            with(g, g, u64::MAX),       // offset far outside
            with(u64::MAX, 1 << 63, 0), // size not a multiple
        ] {
            assert_invalid(&bad.encode());
            assert_eq!(
                bad.validate().unwrap_err().code,
                symmResult_t::symmInvalidArgument
            );
        }
        // The largest shapes are valid on a 64-bit host.
        let big = with(1 << 63, 1 << 63, (1 << 63) - 1);
        assert_eq!(ExportedHandle::decode(&big.encode()), Ok(big));
    }

    #[test]
    fn random_bytes_never_panic_and_accepted_ones_are_canonical() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let len = match rng.below(4) {
                0 => 48,
                1 => 112,
                _ => rng.below(160),
            };
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // Give some inputs a valid prefix so that the checks after it are reached.
            if len >= 8 && rng.below(2) == 0 {
                bytes[..4].copy_from_slice(b"SVMM");
                bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
                bytes[6..8].copy_from_slice(&(1 + rng.below(2) as u16).to_le_bytes());
                // ... and sometimes a valid shape, so that whole messages are accepted.
                if len >= 32 && rng.below(2) == 0 {
                    let granularity = 1u64 << rng.below(30);
                    let size = granularity * (1 + rng.next() % 64);
                    bytes[8..16].copy_from_slice(&size.to_le_bytes());
                    bytes[16..24].copy_from_slice(&granularity.to_le_bytes());
                    bytes[24..32].copy_from_slice(&(rng.next() % size).to_le_bytes());
                }
            }
            if let Ok(m) = ExportedHandle::decode(&bytes) {
                accepted += 1;
                assert_eq!(m.encode(), bytes);
            }
        }
        assert!(accepted > 100, "{accepted}");
    }

    #[test]
    fn mutated_messages_are_rejected_or_canonical() {
        let mut rng = Rng(42);
        for base in [posix_message(), fabric_message()] {
            let bytes = base.encode();
            for _ in 0..5_000 {
                let mut mutated = bytes.clone();
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(mutated.len());
                    mutated[at] ^= 1 << rng.below(8);
                }
                match ExportedHandle::decode(&mutated) {
                    Ok(m) => assert_eq!(m.encode(), mutated),
                    Err(e) => assert_eq!(e.code, symmResult_t::symmInvalidArgument),
                }
            }
        }
    }

    // ----- driver plumbing -----

    #[test]
    fn fabric_is_refused_only_by_not_permitted_or_not_supported() {
        assert!(fabric_refused(E::CUDA_ERROR_NOT_PERMITTED));
        assert!(fabric_refused(E::CUDA_ERROR_NOT_SUPPORTED));
        assert!(!fabric_refused(E::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!fabric_refused(E::CUDA_ERROR_INVALID_VALUE));
    }

    /// A fake driver: hands out handles and address ranges, records every call, fails the
    /// calls listed in `failures` (each entry once, in order of the calls), and tracks what
    /// is live so that leaks show.
    #[derive(Default)]
    struct Fake {
        failures: RefCell<Vec<(&'static str, sys::CUresult)>>,
        calls: RefCell<Vec<String>>,
        next: RefCell<u64>,
        handles: RefCell<BTreeSet<u64>>,
        reserved: RefCell<BTreeSet<u64>>,
        mapped: RefCell<BTreeSet<u64>>,
    }

    impl Fake {
        fn failing(failures: &[(&'static str, sys::CUresult)]) -> Self {
            Fake {
                failures: RefCell::new(failures.to_vec()),
                ..Fake::default()
            }
        }

        fn step(&self, name: &'static str, detail: String) -> std::result::Result<(), DriverError> {
            self.calls.borrow_mut().push(format!("{name}{detail}"));
            let mut failures = self.failures.borrow_mut();
            if let Some(i) = failures.iter().position(|(n, _)| *n == name) {
                return Err(DriverError(failures.remove(i).1));
            }
            Ok(())
        }

        fn fresh(&self) -> u64 {
            let mut next = self.next.borrow_mut();
            *next += 1;
            *next * 0x1000_0000
        }

        fn calls(&self) -> Vec<String> {
            self.calls.borrow().clone()
        }

        fn nothing_live(&self) -> bool {
            self.handles.borrow().is_empty()
                && self.reserved.borrow().is_empty()
                && self.mapped.borrow().is_empty()
        }
    }

    impl Vmm for Fake {
        fn create(
            &self,
            _device: sys::CUdevice,
            plan: &AllocationPlan,
        ) -> std::result::Result<u64, DriverError> {
            self.step("create", format!("({})", plan.handle_types.bits()))?;
            let handle = self.fresh();
            self.handles.borrow_mut().insert(handle);
            Ok(handle)
        }

        fn reserve(&self, size: usize, alignment: usize) -> std::result::Result<u64, DriverError> {
            self.step("reserve", String::new())?;
            assert!(alignment.is_power_of_two() && size.is_multiple_of(alignment));
            let address = self.fresh();
            self.reserved.borrow_mut().insert(address);
            Ok(address)
        }

        fn map(
            &self,
            address: u64,
            _size: usize,
            handle: u64,
        ) -> std::result::Result<(), DriverError> {
            self.step("map", String::new())?;
            assert!(self.reserved.borrow().contains(&address));
            assert!(self.handles.borrow().contains(&handle));
            assert!(self.mapped.borrow_mut().insert(address));
            Ok(())
        }

        fn set_access(
            &self,
            address: u64,
            _size: usize,
            devices: &[sys::CUdevice],
        ) -> std::result::Result<(), DriverError> {
            self.step("set_access", format!("{devices:?}"))?;
            assert!(self.mapped.borrow().contains(&address));
            Ok(())
        }

        fn zero(&self, address: u64, _size: usize) -> std::result::Result<(), DriverError> {
            self.step("zero", String::new())?;
            assert!(self.mapped.borrow().contains(&address));
            Ok(())
        }

        fn unmap(&self, address: u64, _size: usize) -> std::result::Result<(), DriverError> {
            self.step("unmap", String::new())?;
            assert!(self.mapped.borrow_mut().remove(&address));
            Ok(())
        }

        fn address_free(&self, address: u64, _size: usize) -> std::result::Result<(), DriverError> {
            self.step("address_free", String::new())?;
            assert!(
                !self.mapped.borrow().contains(&address),
                "freed while mapped"
            );
            assert!(self.reserved.borrow_mut().remove(&address));
            Ok(())
        }

        fn release(&self, handle: u64) -> std::result::Result<(), DriverError> {
            self.step("release", String::new())?;
            assert!(self.handles.borrow_mut().remove(&handle));
            Ok(())
        }
    }

    fn plan(types: HandleTypes) -> AllocationPlan {
        AllocationPlan {
            handle_types: types,
            granularity: MIB2,
            size: 2 * MIB2,
            gpu_direct_rdma: false,
        }
    }

    #[test]
    fn create_maps_zeroes_and_releases_in_order() {
        let fake = Fake::default();
        let m = create_mapping(&fake, 4, &plan(BOTH)).unwrap();
        assert_eq!(m.handle_types, BOTH);
        assert_eq!(
            fake.calls(),
            ["create(9)", "reserve", "map", "set_access[4]", "zero"]
        );
        unmap_and_release(&fake, m.address, 2 * MIB2, m.handle).unwrap();
        assert_eq!(&fake.calls()[5..], ["unmap", "address_free", "release"]);
        assert!(fake.nothing_live());
    }

    #[test]
    fn create_retries_without_fabric_only_when_fabric_is_refused() {
        for code in [E::CUDA_ERROR_NOT_PERMITTED, E::CUDA_ERROR_NOT_SUPPORTED] {
            let fake = Fake::failing(&[("create", code)]);
            let m = create_mapping(&fake, 0, &plan(BOTH)).unwrap();
            assert_eq!(m.handle_types, POSIX);
            assert_eq!(&fake.calls()[..2], ["create(9)", "create(1)"]);
        }
        // Another error is reported as is, without a retry.
        let fake = Fake::failing(&[("create", E::CUDA_ERROR_OUT_OF_MEMORY)]);
        let e = create_mapping(&fake, 0, &plan(BOTH)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmOutOfMemory);
        assert_eq!(fake.calls(), ["create(9)"]);
        // No fallback without fabric in the plan, or with nothing left without it.
        for types in [POSIX, FABRIC] {
            let fake = Fake::failing(&[("create", E::CUDA_ERROR_NOT_SUPPORTED)]);
            let e = create_mapping(&fake, 0, &plan(types)).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmUnhandledCudaError);
            assert_eq!(fake.calls().len(), 1);
        }
        // The retry fails too: its error, naming the first.
        let fake = Fake::failing(&[
            ("create", E::CUDA_ERROR_NOT_PERMITTED),
            ("create", E::CUDA_ERROR_OUT_OF_MEMORY),
        ]);
        let e = create_mapping(&fake, 0, &plan(BOTH)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmOutOfMemory);
        assert!(
            e.message.contains("CUDA_ERROR_NOT_PERMITTED"),
            "{}",
            e.message
        );
        assert!(fake.nothing_live());
    }

    #[test]
    fn a_failure_at_any_step_leaves_nothing_behind() {
        for (step, undo) in [
            ("create", &[][..]),
            ("reserve", &["release"][..]),
            ("map", &["address_free", "release"][..]),
            ("set_access", &["unmap", "address_free", "release"][..]),
            ("zero", &["unmap", "address_free", "release"][..]),
        ] {
            let fake = Fake::failing(&[(step, E::CUDA_ERROR_OUT_OF_MEMORY)]);
            let e = create_mapping(&fake, 0, &plan(POSIX)).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmOutOfMemory, "{step}");
            let calls = fake.calls();
            let failed = calls.iter().position(|c| c.starts_with(step)).unwrap();
            assert_eq!(&calls[failed + 1..], undo, "{step}");
            assert!(fake.nothing_live(), "{step}");
        }
    }

    #[test]
    fn a_failed_import_mapping_releases_the_imported_handle() {
        for step in ["reserve", "map", "set_access"] {
            let fake = Fake::default();
            let handle = fake.create(0, &plan(POSIX)).unwrap();
            fake.failures
                .borrow_mut()
                .push((step, E::CUDA_ERROR_INVALID_VALUE));
            let e = map_import(&fake, handle, 2 * MIB2, MIB2, 1).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmUnhandledCudaError);
            assert!(fake.nothing_live(), "{step}");
        }
        let fake = Fake::default();
        let handle = fake.create(0, &plan(POSIX)).unwrap();
        let address = map_import(&fake, handle, 2 * MIB2, MIB2, 1).unwrap();
        assert_eq!(
            &fake.calls()[1..],
            ["reserve", "map", "set_access[1]"],
            "an import is not zeroed"
        );
        unmap_and_release(&fake, address, 2 * MIB2, handle).unwrap();
        assert!(fake.nothing_live());
    }

    #[test]
    fn release_tries_every_step_and_reports_the_first_error() {
        let fake = Fake::default();
        let m = create_mapping(&fake, 0, &plan(POSIX)).unwrap();
        fake.failures
            .borrow_mut()
            .push(("unmap", E::CUDA_ERROR_INVALID_VALUE));
        let e = unmap_and_release(&fake, m.address, 2 * MIB2, m.handle).unwrap_err();
        assert!(e.message.starts_with("cuMemUnmap"), "{}", e.message);
        assert_eq!(&fake.calls()[5..], ["unmap", "address_free", "release"]);
    }

    #[test]
    fn without_a_driver_every_entry_is_an_error_not_a_panic() {
        if crate::backend::driver::library_present() {
            return;
        }
        let e = device_caps(0).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmNoDevice, "{}", e.message);
        let e = VmmAllocation::create(0, 0, plan(POSIX)).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmNoDevice, "{}", e.message);
        let e = ImportedMapping::import_fabric(0, &fabric_message()).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmNoDevice, "{}", e.message);
    }

    #[test]
    fn wrong_message_kinds_are_rejected_before_any_driver_call() {
        let (reader, _writer) = std::io::pipe().unwrap();
        let fd = OwnedFd::from(reader);
        let e = ImportedMapping::import_fd(0, fd, &fabric_message()).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let e = ImportedMapping::import_fabric(0, &posix_message()).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let bad = ExportedHandle {
            offset: 1 << 40,
            ..fabric_message()
        };
        let e = ImportedMapping::import_fabric(0, &bad).unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
        let e = VmmAllocation::create(
            0,
            0,
            AllocationPlan {
                size: 0,
                ..plan(POSIX)
            },
        )
        .unwrap_err();
        assert_eq!(e.code, symmResult_t::symmInvalidArgument);
    }
}
