//! Across processes: VMM memory shared through POSIX file descriptors, the built library
//! loaded as `libcuda.so.1` by cudarc, calls before `cuInit`.

mod common;

use common::*;
use cudarc::driver::sys::{self, cudaError_enum as E};
use std::ffi::c_void;
use std::ptr::null_mut;
use symm_fake_cuda::*;

const GRANULARITY: usize = 2 << 20;

/// Map allocation `handle` (of `size` bytes) read/write for `device`; returns its address.
fn map(handle: u64, size: usize, device: i32) -> u64 {
    let mut base = 0;
    // SAFETY: a fresh reservation for a valid handle.
    unsafe {
        ok(cuMemAddressReserve(&mut base, size, 0, 0, 0));
        ok(cuMemMap(base, size, 0, handle, 0));
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        ok(cuMemSetAccess(base, size, &access, 1));
    }
    base
}

#[test]
fn vmm_memory_is_shared_with_another_process_through_a_file_descriptor() {
    const NAME: &str = "vmm_memory_is_shared_with_another_process_through_a_file_descriptor";
    const POSIX_FD: u32 = 1;
    if is_child(NAME) {
        // The importing process: map the memory, check the parent's values, add one to each
        // with a kernel, write a reply.
        context(2);
        let fd: i32 = std::env::var("SYMM_SIM_TEST_FD").unwrap().parse().unwrap();
        let mut handle = 0;
        // SAFETY: the descriptor was inherited from the parent.
        unsafe {
            ok(cuMemImportFromShareableHandle(
                &mut handle,
                std::ptr::without_provenance_mut(fd as usize),
                POSIX_FD,
            ));
            libc::close(fd);
        }
        let base = map(handle, GRANULARITY, 2);
        let values = download(base, 256);
        assert_eq!(values, (0..256).collect::<Vec<u32>>());
        let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
        let f = function(module, "add_one");
        let (mut data, mut n) = (base, 256u32);
        let mut params: [*mut c_void; 2] =
            [(&mut data as *mut u64).cast(), (&mut n as *mut u32).cast()];
        // SAFETY: parameters as the kernel declares; the range is mapped for device 2.
        unsafe {
            ok(cuLaunchKernel(
                f,
                2,
                1,
                1,
                128,
                1,
                1,
                0,
                null_mut(),
                params.as_mut_ptr(),
                null_mut(),
            ));
            ok(cuCtxSynchronize());
        }
        upload(base + 4096, &[0xfeed]);
        return;
    }
    context(0);
    let prop = sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        win32HandleMetaData: null_mut(),
        // SAFETY: plain data.
        allocFlags: unsafe { std::mem::zeroed() },
    };
    let mut handle = 0;
    // SAFETY: a valid property structure.
    ok(unsafe { cuMemCreate(&mut handle, GRANULARITY, &prop, 0) });
    let base = map(handle, GRANULARITY, 0);
    upload(base, &(0..256).collect::<Vec<u32>>());
    let mut fd: i32 = -1;
    // SAFETY: writes one int; the descriptor is inherited by the child (close-on-exec
    // cleared) and closed here after.
    unsafe {
        ok(cuMemExportToShareableHandle(
            (&mut fd as *mut i32).cast(),
            handle,
            POSIX_FD,
            0,
        ));
        assert_eq!(libc::fcntl(fd, libc::F_SETFD, 0), 0);
    }
    let (passed, output) = child(NAME, &[("SYMM_SIM_TEST_FD", &fd.to_string())]);
    // SAFETY: ours, closed once.
    unsafe { libc::close(fd) };
    assert!(passed, "{output}");
    assert_eq!(download(base, 256), (1..257).collect::<Vec<u32>>());
    assert_eq!(download(base + 4096, 1), vec![0xfeed]);
    // SAFETY: the mapping made above.
    unsafe {
        ok(cuMemUnmap(base, GRANULARITY));
        ok(cuMemAddressFree(base, GRANULARITY));
        ok(cuMemRelease(handle));
    }
}

#[test]
fn cudarc_loads_the_library_as_libcuda() {
    const NAME: &str = "cudarc_loads_the_library_as_libcuda";
    if is_child(NAME) {
        use cudarc::driver::result;
        // SAFETY: cudarc calls into the library found on LD_LIBRARY_PATH (this crate's).
        unsafe {
            assert!(sys::is_culib_present());
            result::init().unwrap();
            assert_eq!(result::device::get_count().unwrap(), 3);
            let device = result::device::get(1).unwrap();
            let context = result::primary_ctx::retain(device).unwrap();
            result::ctx::set_current(context).unwrap();
            let major = result::device::get_attribute(
                device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )
            .unwrap();
            assert_eq!(major, 9);
            let p = result::malloc_sync(64).unwrap();
            result::memcpy_htod_sync(p, &[1u32, 2, 3]).unwrap();
            let stream = result::stream::create(result::stream::StreamKind::NonBlocking).unwrap();
            result::memset_d8_async(p + 8, 0, 4, stream).unwrap();
            result::stream::synchronize(stream).unwrap();
            let mut out = [0u32; 3];
            result::memcpy_dtoh_sync(&mut out, p).unwrap();
            assert_eq!(out, [1, 2, 0]);
            result::stream::destroy(stream).unwrap();
            result::free_sync(p).unwrap();
            let e = result::DriverError(E::CUDA_ERROR_ILLEGAL_ADDRESS);
            assert_eq!(
                e.error_string().unwrap().to_str().unwrap(),
                "an illegal memory access was encountered"
            );
            // A function the library does not export fails loudly, naming it.
            let missing = std::panic::catch_unwind(|| {
                let mut pool = null_mut();
                sys::cuMemPoolCreate(&mut pool, std::ptr::null())
            })
            .unwrap_err();
            let message = missing.downcast_ref::<String>().unwrap();
            assert!(
                message.contains("Missing symbol cuMemPoolCreate"),
                "{message}"
            );
        }
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let library = deps.join("libsymm_fake_cuda.so");
    assert!(library.exists(), "{} not built", library.display());
    let dir = std::env::temp_dir().join(format!("symm-sim-libcuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&library, &link).unwrap();
    }
    let (passed, output) = child(
        NAME,
        &[
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
            ("SYMM_SIM_DEVICES", "3"),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(passed, "{output}");
}

#[test]
fn calls_before_init_fail() {
    const NAME: &str = "calls_before_init_fail";
    if is_child(NAME) {
        // SAFETY: plain calls with valid output pointers.
        unsafe {
            let mut n = 0;
            assert_eq!(cuDeviceGetCount(&mut n), E::CUDA_ERROR_NOT_INITIALIZED);
            let mut p = 0;
            assert_eq!(cuMemAlloc_v2(&mut p, 64), E::CUDA_ERROR_NOT_INITIALIZED);
            assert_eq!(cuCtxSynchronize(), E::CUDA_ERROR_NOT_INITIALIZED);
            let mut text = std::ptr::null();
            ok(cuGetErrorName(0, &mut text));
            assert_eq!(cuInit(1), E::CUDA_ERROR_INVALID_VALUE);
            ok(cuInit(0));
            ok(cuDeviceGetCount(&mut n));
            assert_eq!(n, 8);
            assert_eq!(cuMemAlloc_v2(&mut p, 64), E::CUDA_ERROR_INVALID_CONTEXT);
        }
        return;
    }
    let (passed, output) = child(NAME, &[]);
    assert!(passed, "{output}");
}
