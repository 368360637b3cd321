//! Initialization, devices, primary contexts, peer access, error strings.

use crate::state::{self, context_handle, current, current_device, set_current};
use crate::util::{CuResult, Rng, entry, non_null, put};
use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute as A, CUresult, CUuuid, cudaError_enum as E,
};
use std::ffi::{c_char, c_int, c_uint};

/// The CUDA version this driver reports (12.8).
const DRIVER_VERSION: c_int = 12080;

/// Bytes of memory each simulated device reports.
const TOTAL_MEMORY: usize = 80 << 30;

/// The value of device attribute `attribute` (a `CUdevice_attribute`) on a device with
/// `sms` multiprocessors, ordinal `ordinal`; `None` for attributes the simulation does not
/// model.
fn attribute(attribute: u32, sms: u32, ordinal: u32) -> Option<c_int> {
    let table: &[(A, c_int)] = &[
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, i32::MAX),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535),
        (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152),
        (A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536),
        (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
        (A::CU_DEVICE_ATTRIBUTE_MAX_PITCH, i32::MAX),
        (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536),
        (A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1_980_000),
        (A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512),
        (A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1),
        (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, sms as c_int),
        (A::CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0),
        (A::CU_DEVICE_ATTRIBUTE_INTEGRATED, 0),
        (A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
        (A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0),
        (A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, ordinal as c_int + 1),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0),
        (A::CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2_619_000),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120),
        (A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20),
        (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
        (A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3),
        (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
        (A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            233_472,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            65536,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0),
        (A::CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0),
        (A::CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0),
        (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0),
        (A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1),
        (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1),
        (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH, 0),
        (
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            232_448,
        ),
        (A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0),
        (
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            1,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            1,
        ),
        (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0),
        (
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED,
            0,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
        (A::CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0),
        (
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
            0,
        ),
        (
            A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            1024,
        ),
        (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0),
        (A::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0),
        (A::CU_DEVICE_ATTRIBUTE_MPS_ENABLED, 0),
    ];
    table
        .iter()
        .find(|(a, _)| *a as u32 == attribute)
        .map(|&(_, v)| v)
}

/// The UUID of device `ordinal`: distinct per ordinal, the same in every process.
pub(crate) fn uuid(ordinal: u32) -> [u8; 16] {
    let mut rng = Rng::new(0x5359_4d4d_0000_0000 | ordinal as u64);
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&rng.next().to_le_bytes());
    bytes[8..].copy_from_slice(&rng.next().to_le_bytes());
    bytes
}

/// `cuInit`: initialize the driver and start the simulated devices (flags must be 0).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    entry("cuInit", || {
        if flags != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        state::init(crate::engine::spawn).map(|_| ())
    })
}

/// `cuDriverGetVersion`: 12080.
///
/// # Safety
/// `version` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    // SAFETY: the caller's output pointer (function contract).
    entry("cuDriverGetVersion", || unsafe {
        put(version, DRIVER_VERSION)
    })
}

/// `cuDeviceGetCount`: `SYMM_SIM_DEVICES`.
///
/// # Safety
/// `count` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    entry("cuDeviceGetCount", || {
        let n = state::driver()?.options.devices;
        // SAFETY: the caller's output pointer.
        unsafe { put(count, n as c_int) }
    })
}

/// `cuDeviceGet`: the device of `ordinal` (a device is its ordinal).
///
/// # Safety
/// `device` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    entry("cuDeviceGet", || {
        let d = state::driver()?.lock().check_device(ordinal)?;
        // SAFETY: the caller's output pointer.
        unsafe { put(device, d as CUdevice) }
    })
}

/// `cuDeviceGetName`.
///
/// # Safety
/// `name` is valid for `len` bytes of writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(
    name: *mut c_char,
    len: c_int,
    device: CUdevice,
) -> CUresult {
    entry("cuDeviceGetName", || {
        let d = state::driver()?.lock().check_device(device)?;
        non_null(name)?;
        if len <= 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let text = format!("symm-sim GPU {d} (simulated sm_90)");
        let n = text.len().min(len as usize - 1);
        // SAFETY: `name` holds `len` bytes (function contract); `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), name.cast::<u8>(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// `cuDeviceTotalMem_v2`: 80 GiB.
///
/// # Safety
/// `bytes` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        state::driver()?.lock().check_device(device)?;
        // SAFETY: the caller's output pointer.
        unsafe { put(bytes, TOTAL_MEMORY) }
    })
}

/// `cuDeviceGetAttribute`: compute capability 9.0, `SimConfig::sms` multiprocessors,
/// cooperative launch, unified addressing, VMM and POSIX file descriptor handles supported;
/// fabric handles, clusters, managed memory and memory pools not.
///
/// # Safety
/// `value` is valid for one write; `attribute` is a `CUdevice_attribute`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute_id: u32,
    device: CUdevice,
) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        let driver = state::driver()?;
        let d = driver.lock().check_device(device)?;
        let v = attribute(attribute_id, driver.config.sms, d).ok_or_else(|| {
            eprintln!("symm-sim: cuDeviceGetAttribute: attribute {attribute_id} is not modeled");
            E::CUDA_ERROR_INVALID_VALUE
        })?;
        // SAFETY: the caller's output pointer.
        unsafe { put(value, v) }
    })
}

fn get_uuid(out: *mut CUuuid, device: CUdevice) -> CuResult<()> {
    let d = state::driver()?.lock().check_device(device)?;
    let bytes = uuid(d).map(|b| b as c_char);
    // SAFETY: the caller's output pointer (contract of both UUID entry points).
    unsafe { put(out, CUuuid { bytes }) }
}

/// `cuDeviceGetUuid`: distinct per ordinal, the same in every process.
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut CUuuid, device: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid", || get_uuid(out, device))
}

/// `cuDeviceGetUuid_v2`: as [`cuDeviceGetUuid`].
///
/// # Safety
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(out: *mut CUuuid, device: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid_v2", || get_uuid(out, device))
}

/// `cuDeviceCanAccessPeer`: 1 for two distinct devices.
///
/// # Safety
/// `can` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(
    can: *mut c_int,
    device: CUdevice,
    peer: CUdevice,
) -> CUresult {
    entry("cuDeviceCanAccessPeer", || {
        let state = state::driver()?.lock();
        let (a, b) = (state.check_device(device)?, state.check_device(peer)?);
        // SAFETY: the caller's output pointer.
        unsafe { put(can, c_int::from(a != b)) }
    })
}

/// `cuDevicePrimaryCtxRetain`: the device's primary context (one per device), retained.
///
/// # Safety
/// `context` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    context: *mut CUcontext,
    device: CUdevice,
) -> CUresult {
    entry("cuDevicePrimaryCtxRetain", || {
        let mut state = state::driver()?.lock();
        let d = state.check_device(device)?;
        non_null(context)?;
        state.devices[d as usize].primary_refs += 1;
        // SAFETY: the caller's output pointer.
        unsafe { put(context, context_handle(d) as CUcontext) }
    })
}

/// `cuDevicePrimaryCtxRelease_v2`: drop a reference (the context itself stays usable).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(device: CUdevice) -> CUresult {
    entry("cuDevicePrimaryCtxRelease_v2", || {
        let mut state = state::driver()?.lock();
        let d = state.check_device(device)?;
        let refs = &mut state.devices[d as usize].primary_refs;
        if *refs == 0 {
            return Err(E::CUDA_ERROR_INVALID_CONTEXT);
        }
        *refs -= 1;
        Ok(())
    })
}

/// `cuCtxSetCurrent`: bind a primary context (or none, for null) to this thread.
///
/// # Safety
/// No pointer is dereferenced (the context is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(context: CUcontext) -> CUresult {
    entry("cuCtxSetCurrent", || {
        let state = state::driver()?.lock();
        if context.is_null() {
            set_current(None);
        } else {
            set_current(Some(state.context_device(context as u64)?));
        }
        Ok(())
    })
}

/// `cuCtxGetCurrent`: this thread's context, or null.
///
/// # Safety
/// `context` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut CUcontext) -> CUresult {
    entry("cuCtxGetCurrent", || {
        state::driver()?;
        let value = current().map_or(std::ptr::null_mut(), |d| context_handle(d) as CUcontext);
        // SAFETY: the caller's output pointer.
        unsafe { put(context, value) }
    })
}

/// `cuCtxGetDevice`: the current context's device.
///
/// # Safety
/// `device` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    entry("cuCtxGetDevice", || {
        state::driver()?;
        let d = current_device()?;
        // SAFETY: the caller's output pointer.
        unsafe { put(device, d as CUdevice) }
    })
}

/// `cuCtxSynchronize`: wait for every operation queued so far on the current context's
/// device; its sticky error after a fault.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    entry("cuCtxSynchronize", || {
        let driver = state::driver()?;
        let mut state = driver.lock();
        let d = state.current_healthy()?;
        state.check_capture_safe("cuCtxSynchronize")?;
        let targets: Vec<u64> = state
            .ops
            .iter()
            .filter(|(_, op)| op.device == d)
            .map(|(&id, _)| id)
            .collect();
        driver.wait_ops(state, Some(d), &targets).map(|_| ())
    })
}

/// `cuCtxEnablePeerAccess`: let the current context's kernels access `peer`'s memory.
///
/// # Safety
/// No pointer is dereferenced (the context is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint) -> CUresult {
    entry("cuCtxEnablePeerAccess", || {
        let mut state = state::driver()?.lock();
        let d = state.current_healthy()?;
        if flags != 0 {
            return Err(E::CUDA_ERROR_INVALID_VALUE);
        }
        let p = state.context_device(peer as u64)?;
        if p == d {
            return Err(E::CUDA_ERROR_INVALID_DEVICE);
        }
        let peers = &mut state.devices[d as usize].peers;
        if *peers & (1 << p) != 0 {
            return Err(E::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        *peers |= 1 << p;
        Ok(())
    })
}

/// `cuCtxDisablePeerAccess`.
///
/// # Safety
/// No pointer is dereferenced (the context is a handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer: CUcontext) -> CUresult {
    entry("cuCtxDisablePeerAccess", || {
        let mut state = state::driver()?.lock();
        let d = state.current_healthy()?;
        let p = state.context_device(peer as u64)?;
        let peers = &mut state.devices[d as usize].peers;
        if *peers & (1 << p) == 0 {
            return Err(E::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        *peers &= !(1 << p);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_distinct_and_stable() {
        assert_eq!(uuid(3), uuid(3));
        let all: std::collections::HashSet<[u8; 16]> = (0..64).map(uuid).collect();
        assert_eq!(all.len(), 64);
    }

    #[test]
    fn attributes_the_backend_reads_are_modeled() {
        let a = |x: A| attribute(x as u32, 7, 0);
        assert_eq!(a(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), Some(9));
        assert_eq!(a(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), Some(7));
        assert_eq!(
            a(A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
            Some(1)
        );
        assert_eq!(
            a(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED),
            Some(0)
        );
        assert_eq!(attribute(100_000, 7, 0), None);
    }
}
