//! Virtual memory management: physical memory is a memfd, address reservations are
//! `PROT_NONE` mappings, `cuMemMap` maps the memfd shared over the reservation, and
//! `cuMemSetAccess` registers the mapping for exactly the devices named. POSIX file
//! descriptor handles are the memfd itself, so processes share memory as on a GPU.

use crate::state::{self, Allocation, Region, RegionKind};
use crate::util::{CuResult, Kind, entry, handle, non_null, put};
use cudarc::driver::sys::{
    CUdeviceptr, CUmemAccessDesc, CUmemAllocationProp, CUmemGenericAllocationHandle, CUresult,
    cudaError_enum as E,
};
use std::ffi::{c_int, c_ulonglong, c_void};

/// Allocation granularity (minimum and recommended), as on an H100.
pub(crate) const GRANULARITY: u64 = 2 << 20;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
const FABRIC: u32 = 8;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const PINNED: u32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

/// The fields of a `CUmemAllocationProp` the simulation uses, read as integers (a C caller
/// may pass enum values Rust's enums do not have).
struct Prop {
    kind: u32,
    handle_types: u32,
    location_kind: u32,
    location_id: c_int,
}

/// Read `prop`.
///
/// # Safety
/// A non-null `prop` points to a `CUmemAllocationProp`.
unsafe fn read_prop(prop: *const CUmemAllocationProp) -> CuResult<Prop> {
    non_null(prop)?;
    // SAFETY: a valid structure (function contract); the enum fields are `u32`-sized and read
    // as integers.
    unsafe {
        Ok(Prop {
            kind: std::ptr::addr_of!((*prop).type_).cast::<u32>().read(),
            handle_types: std::ptr::addr_of!((*prop).requestedHandleTypes)
                .cast::<u32>()
                .read(),
            location_kind: std::ptr::addr_of!((*prop).location.type_)
                .cast::<u32>()
                .read(),
            location_id: std::ptr::addr_of!((*prop).location.id).read(),
        })
    }
}

/// Validate `prop`: pinned memory on an existing device; fabric handles are not supported.
fn check_prop(prop: &Prop) -> CuResult<()> {
    let state = state::driver()?.lock();
    if prop.kind != PINNED || prop.location_kind != LOCATION_DEVICE {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    state.check_device(prop.location_id)?;
    Ok(())
}

/// `cuMemGetAllocationGranularity`: 2 MiB.
///
/// # Safety
/// `granularity` is valid for one write; `prop` points to a `CUmemAllocationProp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const CUmemAllocationProp,
    option: u32,
) -> CUresult {
    entry("cuMemGetAllocationGranularity", || {
        // SAFETY: the caller's structure.
        let prop = unsafe { read_prop(prop) }?;
        check_prop(&prop)?;
        if option > 1 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller's output pointer.
        unsafe { put(granularity, GRANULARITY as usize) }
    })
}

/// `cuMemCreate`: a memfd of `size` bytes (a multiple of the granularity). Fabric handles are
/// refused with `CUDA_ERROR_NOT_SUPPORTED` (the devices report them unsupported).
///
/// # Safety
/// `out` is valid for one write; `prop` points to a `CUmemAllocationProp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    out: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemCreate", || {
        // SAFETY: the caller's structure.
        let prop = unsafe { read_prop(prop) }?;
        check_prop(&prop)?;
        non_null(out)?;
        if flags != 0 || size == 0 || !(size as u64).is_multiple_of(GRANULARITY) {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        if prop.handle_types & !POSIX_FD != 0 {
            return Err(if prop.handle_types & FABRIC != 0 {
                E::CUDA_ERROR_NOT_SUPPORTED
            } else {
                E::CUDA_ERROR_INVALID_VALUE
            });
        }
        // SAFETY: a NUL-terminated name; creates a new descriptor owned by the allocation.
        let fd = unsafe { libc::memfd_create(c"symm-sim-vmm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        }
        // SAFETY: `fd` was just created and is ours.
        if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
            // SAFETY: as above, closed once.
            unsafe { libc::close(fd) };
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let mut state = state::driver()?.lock();
        let h = handle(Kind::Allocation, state.new_id());
        state.allocations.insert(
            h,
            Allocation {
                fd,
                size: size as u64,
                handle_types: prop.handle_types,
            },
        );
        // SAFETY: the caller's output pointer.
        unsafe { put(out, h) }
    })
}

/// `cuMemRelease`: drop the handle (mappings keep the memory alive).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(h: CUmemGenericAllocationHandle) -> CUresult {
    entry("cuMemRelease", || {
        let allocation = state::driver()?
            .lock()
            .allocations
            .remove(&h)
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the allocation owned its descriptor; closed once.
        unsafe { libc::close(allocation.fd) };
        Ok(())
    })
}

/// `cuMemAddressReserve`: an inaccessible (`PROT_NONE`) range aligned as asked (at least the
/// granularity); the address hint is ignored.
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressReserve(
    out: *mut CUdeviceptr,
    size: usize,
    alignment: usize,
    _hint: CUdeviceptr,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemAddressReserve", || {
        let driver = state::driver()?;
        non_null(out)?;
        let size = size as u64;
        let alignment = (alignment as u64).max(GRANULARITY);
        if flags != 0
            || size == 0
            || !size.is_multiple_of(GRANULARITY)
            || !alignment.is_power_of_two()
        {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let span = size + alignment;
        // SAFETY: a new inaccessible private mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span as usize,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        }
        let start = p as u64;
        let base = start.next_multiple_of(alignment);
        // SAFETY: trims the parts of the mapping just made outside `[base, base + size)`.
        unsafe {
            if base > start {
                libc::munmap(start as *mut c_void, (base - start) as usize);
            }
            let end = base + size;
            if start + span > end {
                libc::munmap(end as *mut c_void, (start + span - end) as usize);
            }
        }
        driver.lock().reservations.insert(base, size);
        // SAFETY: the caller's output pointer.
        unsafe { put(out, base) }
    })
}

/// `cuMemAddressFree`: the whole reservation, with nothing mapped in it.
///
/// # Safety
/// No pointer is dereferenced by the caller's contract (the range is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAddressFree(address: CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemAddressFree", || {
        let mut state = state::driver()?.lock();
        if state.reservations.get(&address) != Some(&(size as u64)) {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let end = address + size as u64;
        if state.regions.range(address..end).next().is_some() {
            eprintln!(
                "symm-sim: cuMemAddressFree of {address:#x} while parts of it are still mapped"
            );
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        state.reservations.remove(&address);
        // SAFETY: the reservation made by `cuMemAddressReserve`, with nothing mapped in it.
        unsafe { libc::munmap(address as *mut c_void, size) };
        Ok(())
    })
}

/// `cuMemMap`: map `size` bytes of allocation `h` from `offset` at `address`, inside a
/// reservation, over nothing already mapped. Not accessible until `cuMemSetAccess`.
///
/// # Safety
/// No pointer is dereferenced by the caller's contract (the range is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemMap(
    address: CUdeviceptr,
    size: usize,
    offset: usize,
    h: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemMap", || {
        let mut state = state::driver()?.lock();
        let (size, offset) = (size as u64, offset as u64);
        let fd = {
            let a = state
                .allocations
                .get(&h)
                .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
            if flags != 0
                || size == 0
                || !size.is_multiple_of(GRANULARITY)
                || !offset.is_multiple_of(GRANULARITY)
                || offset.checked_add(size).is_none_or(|e| e > a.size)
            {
                return Err(E::CUDA_ERROR_INVALID_VALUE);
            }
            a.fd
        };
        let end = address
            .checked_add(size)
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        let reserved = state
            .reservations
            .range(..=address)
            .next_back()
            .is_some_and(|(&b, &l)| end <= b + l);
        if !reserved {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let overlaps = state
            .regions
            .range(..end)
            .next_back()
            .is_some_and(|(&b, r)| b + r.len > address);
        if overlaps {
            return Err(E::CUDA_ERROR_ALREADY_MAPPED);
        }
        // SAFETY: `[address, end)` lies in a reservation of ours with nothing mapped in it; the
        // descriptor is the allocation's, `offset + size` within its size.
        let p = unsafe {
            libc::mmap(
                address as *mut c_void,
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
        }
        state.regions.insert(
            address,
            Region {
                len: size,
                kind: RegionKind::Vmm {
                    handle: h,
                    access: 0,
                },
            },
        );
        Ok(())
    })
}

/// The VMM mappings that tile `[address, address + size)` exactly: (base, length, access).
fn mappings_covering(
    state: &state::State,
    address: u64,
    size: u64,
) -> CuResult<Vec<(u64, u64, u64)>> {
    let end = address
        .checked_add(size)
        .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
    let mut next = address;
    let mut found = Vec::new();
    for (&base, r) in state.regions.range(address..end) {
        let RegionKind::Vmm { access, .. } = r.kind else {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        };
        if base != next || base + r.len > end {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        found.push((base, r.len, access));
        next = base + r.len;
    }
    if size == 0 || next != end {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(found)
}

/// `cuMemSetAccess`: set the access of the devices named (read-only access is treated as
/// read/write; `PROT_NONE` revokes) over whole mappings; other devices keep theirs. Kernels
/// on devices without access fault.
///
/// # Safety
/// `desc` points to `count` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemSetAccess(
    address: CUdeviceptr,
    size: usize,
    desc: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    entry("cuMemSetAccess", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        non_null(desc)?;
        if count == 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let (mut named, mut granted) = (0u64, 0u64);
        for i in 0..count {
            // SAFETY: `desc` holds `count` descriptors (function contract); enum fields are
            // read as integers.
            let (kind, id, flags) = unsafe {
                let d = desc.add(i);
                (
                    std::ptr::addr_of!((*d).location.type_).cast::<u32>().read(),
                    std::ptr::addr_of!((*d).location.id).read(),
                    std::ptr::addr_of!((*d).flags).cast::<u32>().read(),
                )
            };
            if kind != LOCATION_DEVICE || flags > 3 || flags == 2 {
                return Err(E::CUDA_ERROR_INVALID_VALUE);
            }
            let device = state.check_device(id)?;
            named |= 1 << device;
            if flags != 0 {
                granted |= 1 << device;
            }
        }
        let mappings = mappings_covering(&state, address, size as u64)?;
        for (base, len, old) in mappings {
            let new = (old & !named) | granted;
            if let Some(r) = state.regions.get_mut(&base)
                && let RegionKind::Vmm { access, .. } = &mut r.kind
            {
                *access = new;
            }
            if old == 0 && new != 0 {
                driver
                    .memory
                    .map(base, len, &format!("VMM mapping at {base:#x}"), new);
            } else if old != 0 && new == 0 {
                driver.memory.unmap(base, len);
            } else if old != new {
                driver.memory.set_devices(base, len, new);
            }
        }
        Ok(())
    })
}

/// `cuMemUnmap`: whole mappings only; the range becomes reserved (inaccessible) again. Done on
/// the device thread, between kernel instructions.
///
/// # Safety
/// No pointer is dereferenced by the caller's contract (the range is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemUnmap(address: CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemUnmap", || {
        let driver = state::driver()?;
        let mappings = {
            let mut state = driver.lock();
            let mappings = mappings_covering(&state, address, size as u64)?;
            for &(base, _, _) in &mappings {
                state.regions.remove(&base);
            }
            mappings
        };
        let memory = driver.memory.clone();
        driver.on_device(move |_| {
            for (base, len, access) in mappings {
                if access != 0 {
                    memory.unmap(base, len);
                }
            }
            // SAFETY: the range was mapped by `cuMemMap` inside a reservation of ours; it is
            // replaced by an inaccessible mapping again, between kernel instructions.
            unsafe {
                libc::mmap(
                    address as *mut c_void,
                    size,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
        });
        Ok(())
    })
}

/// `cuMemExportToShareableHandle`: for a POSIX file descriptor, a new descriptor of the
/// memfd (the caller owns it). Fabric handles are not supported.
///
/// # Safety
/// For a POSIX file descriptor, `out` is valid for the write of one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    out: *mut c_void,
    h: CUmemGenericAllocationHandle,
    kind: u32,
    flags: c_ulonglong,
) -> CUresult {
    entry("cuMemExportToShareableHandle", || {
        let state = state::driver()?.lock();
        let a = state
            .allocations
            .get(&h)
            .ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        match kind {
            POSIX_FD if a.handle_types & POSIX_FD != 0 => {
                non_null(out)?;
                // SAFETY: duplicates the allocation's open descriptor.
                let fd = unsafe { libc::fcntl(a.fd, libc::F_DUPFD_CLOEXEC, 0) };
                if fd < 0 {
                    return Err(E::CUDA_ERROR_OPERATING_SYSTEM);
                }
                // SAFETY: the caller's output (an int for this handle type).
                unsafe { put(out.cast::<c_int>(), fd) }
            }
            FABRIC => Err(E::CUDA_ERROR_NOT_SUPPORTED),
            _ => Err(E::CUDA_ERROR_INVALID_VALUE),
        }
    })
}

/// `cuMemImportFromShareableHandle`: for a POSIX file descriptor (passed in the pointer
/// argument), an allocation of its own duplicate of the descriptor, sized by `fstat`.
///
/// # Safety
/// For a POSIX file descriptor, `os_handle` carries the descriptor's value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    out: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    kind: u32,
) -> CUresult {
    entry("cuMemImportFromShareableHandle", || {
        let driver = state::driver()?;
        non_null(out)?;
        match kind {
            POSIX_FD => {}
            FABRIC => return Err(E::CUDA_ERROR_NOT_SUPPORTED),
            _ => return Err(E::CUDA_ERROR_INVALID_VALUE),
        }
        let fd = c_int::try_from(os_handle as usize).map_err(|_| E::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `stat` is plain data; all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: writes one `stat` into our buffer; a bad descriptor fails.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: duplicates the caller's open descriptor; the duplicate is ours.
        let own = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if own < 0 {
            return Err(E::CUDA_ERROR_OPERATING_SYSTEM);
        }
        let mut state = driver.lock();
        let h = handle(Kind::Allocation, state.new_id());
        state.allocations.insert(
            h,
            Allocation {
                fd: own,
                size: st.st_size as u64,
                handle_types: POSIX_FD,
            },
        );
        // SAFETY: the caller's output pointer.
        unsafe { put(out, h) }
    })
}
