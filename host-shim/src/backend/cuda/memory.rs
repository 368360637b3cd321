//! Memory through the cuda backend: device allocations (zeroed), copies between device
//! addresses on a caller's stream, downloads and uploads on a device's setup stream, mapped
//! host flags, host memory registered for kernels, and which addresses a device's kernels
//! reach. Every allocation made here is freed again when a later step of the same call fails.

use super::CudaBackend;
use crate::backend::Flag;
use crate::backend::driver::{cuda_error, driver, guarded, outside_capture};
use crate::error::Result;
use cudarc::driver::{DriverError, result, sys};
use std::ffi::c_void;

impl CudaBackend {
    /// See [`Backend::alloc_zeroed`](crate::backend::Backend::alloc_zeroed). Safe to call while the
    /// caller captures a graph (see [`outside_capture`]): zeroed on the device's setup stream,
    /// synchronously.
    pub fn alloc_zeroed(&self, ordinal: i32, bytes: usize) -> Result<u64> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: a fresh allocation of `bytes`, zeroed on the setup stream (never
            // captured) before use, and freed again (this context current) if zeroing fails.
            driver("cuMemAlloc", || unsafe {
                let address = OwnedDeviceMemory(result::malloc_sync(bytes)?);
                result::memset_d8_async(address.0, 0, bytes, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)?;
                Ok(address.into_raw())
            })
        })
    }

    /// See [`Backend::copy`](crate::backend::Backend::copy): enqueued on the caller's `stream`
    /// (captured when the stream captures).
    ///
    /// # Safety
    ///
    /// As [`Backend::copy`](crate::backend::Backend::copy).
    pub unsafe fn copy(
        &self,
        ordinal: i32,
        stream: u64,
        copy: &crate::plan::staging::Copy,
    ) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: the caller's contract (both ranges valid until the copy has run, disjoint);
        // `stream` is the caller's stream of the collective.
        driver("cuMemcpyAsync", || unsafe {
            sys::cuMemcpyAsync(
                copy.dst,
                copy.src,
                copy.bytes as usize,
                stream as sys::CUstream,
            )
            .result()
        })
    }

    /// See [`Backend::free`](crate::backend::Backend::free).
    pub fn free(&self, ordinal: i32, address: u64) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: `address` came from `alloc_zeroed` and is freed once (callers own it).
            driver("cuMemFree", || unsafe { result::free_sync(address) })
        })
    }

    /// See [`Backend::download`](crate::backend::Backend::download). Safe during a capture, as
    /// `alloc_zeroed`.
    pub fn download(&self, ordinal: i32, address: u64, out: &mut [u8]) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: callers pass an allocation holding `out.len()` bytes; the copy completes
            // before `out` is used again (synchronized).
            driver("cuMemcpyDtoH", || unsafe {
                result::memcpy_dtoh_async(out, address, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)
            })
        })
    }

    /// See [`Backend::upload`](crate::backend::Backend::upload). Safe during a capture, as
    /// `alloc_zeroed`.
    pub fn upload(&self, ordinal: i32, address: u64, bytes: &[u8]) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        outside_capture(|| {
            // SAFETY: callers pass an allocation with room for `bytes`; the copy completes
            // before `bytes` goes out of scope (synchronized).
            driver("cuMemcpyHtoD", || unsafe {
                result::memcpy_htod_async(address, bytes, device.setup_stream)?;
                result::stream::synchronize(device.setup_stream)
            })
        })
    }

    /// Allocate mapped, pinned host memory for a `u32` flag.
    pub fn alloc_flag(&self, ordinal: i32) -> Result<Flag> {
        let device_handle = self.device(ordinal)?;
        let _context = device_handle.context.enter()?;
        let mut host: *mut c_void = std::ptr::null_mut();
        let mut device: sys::CUdeviceptr = 0;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a 4-byte mapped host allocation, zeroed before use (freed again if its
        // mapping cannot be had); the device pointer is the mapping of that allocation.
        driver("cuMemHostAlloc", || unsafe {
            sys::cuMemHostAlloc(&mut host, 4, flags).result()?;
            let allocation = OwnedHostMemory(host);
            (host as *mut u32).write(0);
            sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0).result()?;
            allocation.into_raw();
            Ok(())
        })?;
        Ok(Flag {
            host: host as u64,
            device,
        })
    }

    /// Free a flag from [`CudaBackend::alloc_flag`].
    pub fn free_flag(&self, ordinal: i32, flag: Flag) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: allocated by `alloc_flag`, freed once.
        driver("cuMemFreeHost", || unsafe {
            sys::cuMemFreeHost(flag.host as *mut c_void).result()
        })
    }

    /// Page-lock `bytes` of host memory at `host` and map it for kernels of every device
    /// (`cuMemHostRegister`, portable and device-mapped); its device address.
    pub fn register_host(&self, ordinal: i32, host: u64, bytes: usize) -> Result<u64> {
        let device_handle = self.device(ordinal)?;
        let _context = device_handle.context.enter()?;
        let mut device: sys::CUdeviceptr = 0;
        let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP | sys::CU_MEMHOSTREGISTER_PORTABLE;
        // SAFETY: the caller's live, page-aligned mapping of `bytes`, which stays mapped until
        // `unregister_host`; the device pointer is the mapping of that range.
        driver("cuMemHostRegister", || unsafe {
            sys::cuMemHostRegister_v2(host as *mut c_void, bytes, flags).result()
        })?;
        // SAFETY: the range registered above; on failure it is unregistered again.
        let mapped = driver("cuMemHostGetDevicePointer", || unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut device, host as *mut c_void, 0).result()
        });
        if let Err(e) = mapped {
            // SAFETY: registered above, unregistered once.
            let _ = unsafe { sys::cuMemHostUnregister(host as *mut c_void) };
            return Err(e);
        }
        Ok(device)
    }

    /// Undo [`CudaBackend::register_host`].
    pub fn unregister_host(&self, ordinal: i32, host: u64) -> Result<()> {
        let device = self.device(ordinal)?;
        let _context = device.context.enter()?;
        // SAFETY: registered by `register_host`, unregistered once.
        driver("cuMemHostUnregister", || unsafe {
            sys::cuMemHostUnregister(host as *mut c_void).result()
        })
    }

    /// Whether kernels on device `ordinal` reach `[address, address + bytes)` (`bytes > 0`):
    /// memory the driver knows at its first and its last byte (device memory, pinned or
    /// registered host memory, managed memory, a VMM mapping), or any memory where the device
    /// reaches pageable host memory. Pageable host memory elsewhere is not reachable: a
    /// kernel's access to it faults, and the fault is sticky. Access rights are not checked:
    /// a VMM mapping this device was not granted, or another device's memory without peer
    /// access, passes here and faults in the kernel, as it would in NCCL.
    pub fn reaches(&self, ordinal: i32, address: u64, bytes: u64) -> Result<bool> {
        let device = self.device(ordinal)?;
        if device.pageable_access {
            return Ok(true);
        }
        let _context = device.context.enter()?;
        for at in [address, address + bytes.max(1) - 1] {
            let mut kind: u32 = 0;
            // SAFETY: the memory-type attribute is a 32-bit CUmemorytype written to `kind`;
            // the driver only looks the address up.
            let looked_up = guarded("cuPointerGetAttribute", || unsafe {
                sys::cuPointerGetAttribute(
                    (&mut kind as *mut u32).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    at,
                )
                .result()
            })?;
            match looked_up {
                Ok(()) => {}
                Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => return Ok(false),
                Err(DriverError(code)) => {
                    return Err(cuda_error("cuPointerGetAttribute", code));
                }
            }
        }
        Ok(true)
    }
}

/// Device memory from `cuMemAlloc` in the current context, freed on drop (with that context
/// entered) unless handed over by [`OwnedDeviceMemory::into_raw`]: what frees an allocation
/// when a later step of the call that made it fails.
struct OwnedDeviceMemory(sys::CUdeviceptr);

impl OwnedDeviceMemory {
    /// The allocation's address, now owned by the caller (who frees it).
    fn into_raw(self) -> sys::CUdeviceptr {
        let address = self.0;
        std::mem::forget(self);
        address
    }
}

impl Drop for OwnedDeviceMemory {
    fn drop(&mut self) {
        // SAFETY: an allocation of the current context, not handed over, freed once, here.
        let _ = unsafe { result::free_sync(self.0) };
    }
}

/// Pinned host memory from `cuMemHostAlloc`, freed on drop unless handed over by
/// [`OwnedHostMemory::into_raw`] (as [`OwnedDeviceMemory`]).
struct OwnedHostMemory(*mut c_void);

impl OwnedHostMemory {
    /// The allocation, now owned by the caller (who frees it).
    fn into_raw(self) -> *mut c_void {
        let host = self.0;
        std::mem::forget(self);
        host
    }
}

impl Drop for OwnedHostMemory {
    fn drop(&mut self) {
        // SAFETY: a `cuMemHostAlloc` allocation, not handed over, freed once, here.
        let _ = unsafe { sys::cuMemFreeHost(self.0) };
    }
}
