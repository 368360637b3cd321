//! Device and mapped host memory, copies and memsets. Memory is flat: a device pointer is a
//! host address of this process, registered with the simulator's address space.

use crate::state::{self, CopySource, OpKind, Region, RegionKind, current_device};
use crate::util::{CuResult, entry, non_null, not_supported, put};
use cudarc::driver::sys::{self, CUdeviceptr, CUresult, CUstream, cudaError_enum as E};
use std::ffi::{c_uchar, c_uint, c_void};
use std::sync::Arc;

/// Bytes of a page.
pub(crate) const PAGE: u64 = 4096;

/// `len` rounded up to whole pages.
pub(crate) fn round_to_page(len: u64) -> u64 {
    len.div_ceil(PAGE) * PAGE
}

/// Fresh zeroed read/write memory of `len` bytes (whole pages).
pub(crate) fn map_anonymous(len: u64) -> CuResult<u64> {
    // SAFETY: a new private anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            round_to_page(len) as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(E::CUDA_ERROR_OUT_OF_MEMORY);
    }
    Ok(p as u64)
}

/// Unregister `[base, base + len)` from the simulator and unmap its pages, on the device
/// thread (so no kernel instruction is under way), after which the range may be reused.
fn release_memory(base: u64, len: u64) -> CuResult<()> {
    let driver = state::driver()?;
    let memory = driver.memory.clone();
    driver.on_device(move |_| {
        memory.unmap(base, len);
        // SAFETY: the range was mapped by `map_anonymous` for this allocation, which the
        // caller frees once; no kernel runs while the device thread does this.
        unsafe { libc::munmap(base as *mut c_void, round_to_page(len) as usize) };
    });
    Ok(())
}

/// Unregister `[base, base + len)` from the simulator on the device thread (so no kernel
/// instruction is under way), leaving the memory itself to its owner.
fn forbid_memory(base: u64, len: u64) -> CuResult<()> {
    let driver = state::driver()?;
    let memory = driver.memory.clone();
    driver.on_device(move |_| memory.unmap(base, len));
    Ok(())
}

/// The operations a call that releases memory waits for: all queued ones, as the driver
/// does in practice, or none with `SYMM_SIM_STRICT_FREE=1`.
fn free_targets(driver: &state::Driver, state: &state::State) -> Vec<u64> {
    if driver.options.strict_free {
        Vec::new()
    } else {
        state.ops.keys().copied().collect()
    }
}

/// `cuMemAlloc_v2`: host memory (page aligned) registered as device memory of every device.
///
/// # Safety
/// `address` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(address: *mut CUdeviceptr, bytes: usize) -> CUresult {
    entry("cuMemAlloc_v2", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let d = state.current_healthy()?;
        state.check_capture_safe("cuMemAlloc_v2")?;
        non_null(address)?;
        if bytes == 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let base = map_anonymous(bytes as u64)?;
        state.regions.insert(
            base,
            Region {
                len: bytes as u64,
                kind: RegionKind::Device,
            },
        );
        driver.memory.map(
            base,
            bytes as u64,
            &format!("cuMemAlloc of {bytes} bytes on device {d}"),
            u64::MAX,
        );
        // SAFETY: the caller's output pointer.
        unsafe { put(address, base) }
    })
}

/// `cuMemFree_v2`: wait for the current device's queued work (as the driver does; not with
/// `SYMM_SIM_STRICT_FREE=1`), then unregister and unmap.
///
/// # Safety
/// No pointer is dereferenced by the caller's contract (the address is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(address: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let d = state.current_healthy()?;
        state.check_capture_safe("cuMemFree_v2")?;
        if address == 0 {
            return Ok(());
        }
        let len = match state.regions.get(&address) {
            Some(r) if r.kind == RegionKind::Device => r.len,
            _ => return Err(E::CUDA_ERROR_INVALID_VALUE),
        };
        let targets: Vec<u64> = if driver.options.strict_free {
            Vec::new()
        } else {
            state
                .ops
                .iter()
                .filter(|(_, op)| op.device == d)
                .map(|(&id, _)| id)
                .collect()
        };
        let mut state = driver.wait_ops(state, Some(d), &targets)?;
        state.regions.remove(&address);
        drop(state);
        release_memory(address, len)
    })
}

/// `cuMemHostAlloc`: pinned host memory mapped for every device (flags `PORTABLE`,
/// `DEVICEMAP`, `WRITECOMBINED` accepted).
///
/// # Safety
/// `host` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    host: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostAlloc", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        state.current_healthy()?;
        state.check_capture_safe("cuMemHostAlloc")?;
        non_null(host)?;
        if bytes == 0 || flags & !0x7 != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let base = map_anonymous(bytes as u64)?;
        state.regions.insert(
            base,
            Region {
                len: bytes as u64,
                kind: RegionKind::Host,
            },
        );
        driver.memory.map_host(
            base,
            bytes as u64,
            &format!("cuMemHostAlloc of {bytes} bytes"),
            u64::MAX,
        );
        // SAFETY: the caller's output pointer.
        unsafe { put(host, base as *mut c_void) }
    })
}

/// `cuMemHostGetDevicePointer_v2`: the same address, for memory of `cuMemHostAlloc` or
/// `cuMemHostRegister_v2` (flags must be 0).
///
/// # Safety
/// `device` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    device: *mut CUdeviceptr,
    host: *mut c_void,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostGetDevicePointer_v2", || {
        let state = state::driver()?.lock();
        state.current_healthy()?;
        if flags != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        match state.region(host as u64, 1) {
            Some((_, r)) if r.kind.is_pinned_host() => {}
            _ => return Err(E::CUDA_ERROR_INVALID_VALUE),
        }
        // SAFETY: the caller's output pointer.
        unsafe { put(device, host as u64) }
    })
}

/// `cuMemFreeHost`: wait for all queued work (as the driver does; not with
/// `SYMM_SIM_STRICT_FREE=1`), then unmap.
///
/// # Safety
/// No pointer is dereferenced by the caller's contract (the address is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(host: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let d = state.current_healthy()?;
        state.check_capture_safe("cuMemFreeHost")?;
        let address = host as u64;
        let len = match state.regions.get(&address) {
            Some(r) if r.kind == RegionKind::Host => r.len,
            _ => return Err(E::CUDA_ERROR_INVALID_VALUE),
        };
        let targets = free_targets(driver, &state);
        let mut state = driver.wait_ops(state, Some(d), &targets)?;
        state.regions.remove(&address);
        drop(state);
        release_memory(address, len)
    })
}

/// The `CU_MEMHOSTREGISTER_*` flags `cuMemHostRegister_v2` accepts: `PORTABLE`, `DEVICEMAP`,
/// `IOMEMORY` and `READ_ONLY`.
const HOST_REGISTER_FLAGS: c_uint = sys::CU_MEMHOSTREGISTER_PORTABLE
    | sys::CU_MEMHOSTREGISTER_DEVICEMAP
    | sys::CU_MEMHOSTREGISTER_IOMEMORY
    | sys::CU_MEMHOSTREGISTER_READ_ONLY;

/// `cuMemHostRegister_v2`: page-lock the caller's host memory `[host, host + bytes)` and map
/// it for every device, at the same address (`cuMemHostGetDevicePointer_v2`). The caller keeps
/// the memory; `cuMemHostUnregister` gives it back. Flags `PORTABLE`, `DEVICEMAP`, `IOMEMORY`
/// and `READ_ONLY` are accepted (kernels' stores to `READ_ONLY` memory are not refused). A
/// range overlapping registered or allocated memory is refused with
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
///
/// # Safety
/// `[host, host + bytes)` is readable and writable memory of this process that stays mapped
/// until it is unregistered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostRegister_v2(
    host: *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    entry("cuMemHostRegister_v2", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        state.current_healthy()?;
        state.check_capture_safe("cuMemHostRegister_v2")?;
        let base = host as u64;
        if base == 0 || bytes == 0 || flags & !HOST_REGISTER_FLAGS != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let len = bytes as u64;
        let end = base.checked_add(len).ok_or(E::CUDA_ERROR_INVALID_VALUE)?;
        // Regions do not overlap, so the last one starting before `end` is the only candidate.
        if let Some((&b, r)) = state.regions.range(..end).next_back()
            && b + r.len > base
        {
            return Err(E::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        // Reserved device address ranges (`cuMemAddressReserve`) are not host memory.
        if let Some((&b, &size)) = state.reservations.range(..end).next_back()
            && b + size > base
        {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        state.regions.insert(
            base,
            Region {
                len,
                kind: RegionKind::RegisteredHost,
            },
        );
        driver.memory.map_host(
            base,
            len,
            &format!("cuMemHostRegister of {bytes} bytes at {base:#x}"),
            u64::MAX,
        );
        Ok(())
    })
}

/// `cuMemHostUnregister`: wait for all queued work (as `cuMemFreeHost` does; not with
/// `SYMM_SIM_STRICT_FREE=1`), then make the range registered at `host` inaccessible to kernels
/// again. The memory itself stays the caller's, mapped and unchanged.
///
/// # Safety
/// No pointer is dereferenced (the address is checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostUnregister(host: *mut c_void) -> CUresult {
    entry("cuMemHostUnregister", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let d = state.current_healthy()?;
        state.check_capture_safe("cuMemHostUnregister")?;
        let address = host as u64;
        if address == 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let len = match state.regions.get(&address) {
            Some(r) if r.kind == RegionKind::RegisteredHost => r.len,
            _ => return Err(E::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        };
        let targets = free_targets(driver, &state);
        let mut state = driver.wait_ops(state, Some(d), &targets)?;
        state.regions.remove(&address);
        drop(state);
        forbid_memory(address, len)
    })
}

/// A copy of `len` bytes; `stream` is `None` for the synchronous functions (which use the
/// current context's legacy stream). Follows the driver's documented synchronization: copies
/// to host memory (synchronous, or asynchronous to pageable memory) and synchronous copies
/// from pinned memory wait for completion; an asynchronous copy from pageable memory stages
/// the bytes at once; device-to-device copies never wait. A synchronous copy from pageable
/// memory first waits for the stream's earlier work, stages the bytes and waits for the copy
/// to land (with `SYMM_SIM_STRICT_COPIES=1` it returns before, which CUDA allows).
#[allow(clippy::too_many_arguments)]
fn copy(
    call: &str,
    dst: u64,
    src: u64,
    len: usize,
    device_dst: bool,
    device_src: bool,
    stream: Option<u64>,
) -> CuResult<()> {
    let driver = state::driver()?;
    let mut state = driver.lock();
    let sid = state.memory_op_stream(call, stream)?;
    if len == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    let n = len as u64;
    if device_dst {
        state.check_device_memory(dst, n)?;
    }
    if device_src {
        state.check_device_memory(src, n)?;
    }
    let sync = stream.is_none();
    let device = state.streams[&sid].device;
    let capturing = state.streams[&sid].capture.is_some();
    let src_pageable = !device_src && state.region(src, n).is_none();
    let dst_pageable = !device_dst && state.region(dst, n).is_none();
    if sync && src_pageable && !capturing {
        let deps = state.entry_deps(sid);
        state = driver.wait_ops(state, Some(device), &deps)?;
    }
    let source = if src_pageable && !capturing {
        // SAFETY: the caller's host buffer holds `len` readable bytes (function contract).
        let bytes = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
        CopySource::Staged(Arc::new(bytes.to_vec()))
    } else {
        CopySource::Address(src)
    };
    let op = state.submit(
        sid,
        OpKind::Copy {
            dst,
            src: source,
            len: n,
            device_dst,
            device_src,
        },
    )?;
    driver.work.notify_all();
    let wait = (!device_dst && (sync || dst_pageable))
        || (sync && device_dst && !device_src && (!src_pageable || !driver.options.strict_copies));
    if let Some(op) = op
        && wait
    {
        drop(driver.wait_ops(state, Some(device), &[op])?);
    }
    Ok(())
}

/// Whether `address` is device-accessible memory (for the unified `cuMemcpy`).
fn is_device(address: u64) -> CuResult<bool> {
    Ok(state::driver()?.lock().region(address, 1).is_some())
}

/// `cuMemcpyHtoD_v2`.
///
/// # Safety
/// `src` holds `bytes` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    entry("cuMemcpyHtoD_v2", || {
        copy("cuMemcpyHtoD_v2", dst, src as u64, bytes, true, false, None)
    })
}

/// `cuMemcpyDtoH_v2`.
///
/// # Safety
/// `dst` holds `bytes` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    entry("cuMemcpyDtoH_v2", || {
        copy("cuMemcpyDtoH_v2", dst as u64, src, bytes, false, true, None)
    })
}

/// `cuMemcpyDtoD_v2`.
///
/// # Safety
/// No host pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    entry("cuMemcpyDtoD_v2", || {
        copy("cuMemcpyDtoD_v2", dst, src, bytes, true, true, None)
    })
}

/// `cuMemcpy`: unified addressing (each side is device memory when registered).
///
/// # Safety
/// Host sides hold `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    entry("cuMemcpy", || {
        copy(
            "cuMemcpy",
            dst,
            src,
            bytes,
            is_device(dst)?,
            is_device(src)?,
            None,
        )
    })
}

/// `cuMemcpyHtoDAsync_v2`.
///
/// # Safety
/// `src` holds `bytes` readable bytes (until the copy completes when pinned).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    entry("cuMemcpyHtoDAsync_v2", || {
        copy(
            "cuMemcpyHtoDAsync_v2",
            dst,
            src as u64,
            bytes,
            true,
            false,
            Some(stream as u64),
        )
    })
}

/// `cuMemcpyDtoHAsync_v2`.
///
/// # Safety
/// `dst` holds `bytes` writable bytes until the copy completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    entry("cuMemcpyDtoHAsync_v2", || {
        copy(
            "cuMemcpyDtoHAsync_v2",
            dst as u64,
            src,
            bytes,
            false,
            true,
            Some(stream as u64),
        )
    })
}

/// `cuMemcpyDtoDAsync_v2`.
///
/// # Safety
/// No host pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    entry("cuMemcpyDtoDAsync_v2", || {
        copy(
            "cuMemcpyDtoDAsync_v2",
            dst,
            src,
            bytes,
            true,
            true,
            Some(stream as u64),
        )
    })
}

/// `cuMemcpyAsync`: unified addressing.
///
/// # Safety
/// Host sides hold `bytes` bytes until the copy completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> CUresult {
    entry("cuMemcpyAsync", || {
        copy(
            "cuMemcpyAsync",
            dst,
            src,
            bytes,
            is_device(dst)?,
            is_device(src)?,
            Some(stream as u64),
        )
    })
}

/// A memset of `len` bytes; `stream` `None` for the synchronous function (legacy stream;
/// it waits only when the target is pinned host memory, as the driver does).
fn memset(call: &str, dst: u64, value: u8, len: usize, stream: Option<u64>) -> CuResult<()> {
    let driver = state::driver()?;
    let mut state = driver.lock();
    let sid = state.memory_op_stream(call, stream)?;
    if len == 0 {
        return Ok(());
    }
    state.check_device_memory(dst, len as u64)?;
    let pinned_host = matches!(state.region(dst, 1), Some((_, r)) if r.kind.is_pinned_host());
    let device = state.streams[&sid].device;
    let op = state.submit(
        sid,
        OpKind::Memset {
            dst,
            value,
            len: len as u64,
        },
    )?;
    driver.work.notify_all();
    if let Some(op) = op
        && stream.is_none()
        && pinned_host
    {
        drop(driver.wait_ops(state, Some(device), &[op])?);
    }
    Ok(())
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// No host pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8Async(
    dst: CUdeviceptr,
    value: c_uchar,
    count: usize,
    stream: CUstream,
) -> CUresult {
    entry("cuMemsetD8Async", || {
        memset("cuMemsetD8Async", dst, value, count, Some(stream as u64))
    })
}

/// `cuMemsetD8_v2`.
///
/// # Safety
/// No host pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: c_uchar, count: usize) -> CUresult {
    entry("cuMemsetD8_v2", || {
        memset("cuMemsetD8_v2", dst, value, count, None)
    })
}

/// `cuMemGetInfo_v2`: 80 GiB total, all free.
///
/// # Safety
/// Both pointers are valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        state::driver()?.lock().current_healthy()?;
        current_device()?;
        // SAFETY: the caller's output pointers.
        unsafe {
            put(free, 80usize << 30)?;
            put(total, 80usize << 30)
        }
    })
}

/// `cuMemAllocManaged`: not modeled.
///
/// # Safety
/// Not dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    _address: *mut CUdeviceptr,
    _bytes: usize,
    _flags: c_uint,
) -> CUresult {
    not_supported("cuMemAllocManaged")
}

/// `cuPointerGetAttribute`: for an address in memory the driver knows (an allocation, pinned
/// or registered host memory, a VMM mapping), its memory type (host for pinned and registered
/// host memory, device otherwise), device pointer (the same address), and the first byte
/// and size of the range holding it; `CUDA_ERROR_INVALID_VALUE` elsewhere (pageable host
/// memory: this device cannot reach it). Other attributes are not modeled.
///
/// # Safety
/// `data` is valid for one write of the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: sys::CUpointer_attribute,
    address: CUdeviceptr,
) -> CUresult {
    use sys::CUpointer_attribute as A;
    entry("cuPointerGetAttribute", || {
        let state = state::driver()?.lock();
        non_null(data)?;
        let Some((base, region)) = state.region(address, 1) else {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        };
        match attribute {
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                let kind = if region.kind.is_pinned_host() {
                    sys::CUmemorytype::CU_MEMORYTYPE_HOST
                } else {
                    sys::CUmemorytype::CU_MEMORYTYPE_DEVICE
                };
                // SAFETY: the caller's output of a 32-bit CUmemorytype.
                unsafe { put(data.cast::<u32>(), kind as u32) }
            }
            A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER | A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => {
                let value = if attribute == A::CU_POINTER_ATTRIBUTE_DEVICE_POINTER {
                    address
                } else {
                    base
                };
                // SAFETY: the caller's output of a CUdeviceptr.
                unsafe { put(data.cast::<CUdeviceptr>(), value) }
            }
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE => {
                // SAFETY: the caller's output of a size_t.
                unsafe { put(data.cast::<usize>(), region.len as usize) }
            }
            _ => Err(E::CUDA_ERROR_NOT_SUPPORTED),
        }
    })
}
