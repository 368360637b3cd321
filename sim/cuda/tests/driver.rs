//! The driver functions: devices, contexts, memory (with kernels on registered host memory),
//! streams, events, capture and replay, VMM, errors.

mod common;

use common::*;
use cudarc::driver::sys::{self, CUdevice_attribute as A, cudaError_enum as E};
use std::ffi::{CStr, c_void};
use std::ptr::null_mut;
use symm_fake_cuda::*;

#[test]
fn devices_and_attributes() {
    let _serial = serial();
    context(0);
    // SAFETY: plain queries with valid output pointers.
    unsafe {
        let mut n = 0;
        ok(cuDeviceGetCount(&mut n));
        assert_eq!(n, 8);
        let mut dev = 0;
        assert_eq!(cuDeviceGet(&mut dev, 8), E::CUDA_ERROR_INVALID_DEVICE);
        let attr = |a: A, d: i32| {
            let mut v = -1;
            ok(cuDeviceGetAttribute(&mut v, a as u32, d));
            v
        };
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 3), 9);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 3), 0);
        assert!(attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0) > 0);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0), 1);
        assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), 1);
        assert_eq!(
            attr(
                A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                0
            ),
            1
        );
        assert_eq!(
            attr(
                A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                0
            ),
            1
        );
        assert_eq!(
            attr(A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0),
            0
        );
        let mut v = 0;
        assert_eq!(
            cuDeviceGetAttribute(&mut v, 1_000_000, 0),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuDeviceGetAttribute(&mut v, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE as u32, 99),
            E::CUDA_ERROR_INVALID_DEVICE
        );
        let uuid = |d| {
            let mut u = sys::CUuuid { bytes: [0; 16] };
            ok(cuDeviceGetUuid(&mut u, d));
            u.bytes
        };
        assert_eq!(uuid(2), uuid(2));
        assert_ne!(uuid(2), uuid(3));
        let mut can = 0;
        ok(cuDeviceCanAccessPeer(&mut can, 0, 1));
        assert_eq!(can, 1);
        ok(cuDeviceCanAccessPeer(&mut can, 1, 1));
        assert_eq!(can, 0);
        let mut name = [0 as std::ffi::c_char; 64];
        ok(cuDeviceGetName(name.as_mut_ptr(), 64, 0));
        assert!(
            CStr::from_ptr(name.as_ptr())
                .to_str()
                .unwrap()
                .contains("symm-sim")
        );
    }
}

#[test]
fn contexts_are_per_thread() {
    let _serial = serial();
    let ctx1 = context(1);
    // SAFETY: plain driver calls with valid output pointers; contexts are handles.
    unsafe {
        let mut dev = -1;
        ok(cuCtxGetDevice(&mut dev));
        assert_eq!(dev, 1);
        std::thread::spawn(|| {
            let mut current = 1 as sys::CUcontext;
            ok(cuCtxGetCurrent(&mut current));
            assert!(current.is_null());
            let mut dev = 0;
            assert_eq!(cuCtxGetDevice(&mut dev), E::CUDA_ERROR_INVALID_CONTEXT);
            let mut s = null_mut();
            assert_eq!(cuStreamCreate(&mut s, 0), E::CUDA_ERROR_INVALID_CONTEXT);
        })
        .join()
        .unwrap();
        let ctx2 = context(2);
        assert_eq!(cuCtxEnablePeerAccess(ctx1, 0), E::CUDA_SUCCESS);
        assert_eq!(
            cuCtxEnablePeerAccess(ctx1, 0),
            E::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        );
        assert_eq!(cuCtxEnablePeerAccess(ctx2, 0), E::CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(
            cuCtxSetCurrent(0x1234 as sys::CUcontext),
            E::CUDA_ERROR_INVALID_CONTEXT
        );
        ok(cuCtxSetCurrent(null_mut()));
        let mut current = 1 as sys::CUcontext;
        ok(cuCtxGetCurrent(&mut current));
        assert!(current.is_null());
    }
}

#[test]
fn error_strings() {
    let _serial = serial();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: valid output pointer; the strings are static.
    unsafe {
        ok(cuGetErrorString(
            E::CUDA_ERROR_ILLEGAL_ADDRESS as u32,
            &mut text,
        ));
        assert_eq!(
            CStr::from_ptr(text).to_str().unwrap(),
            "an illegal memory access was encountered"
        );
        ok(cuGetErrorName(
            E::CUDA_ERROR_STREAM_CAPTURE_UNJOINED as u32,
            &mut text,
        ));
        assert_eq!(
            CStr::from_ptr(text).to_str().unwrap(),
            "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"
        );
        assert_eq!(
            cuGetErrorString(123_456, &mut text),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert!(text.is_null());
    }
}

#[test]
fn memory_copies_and_memsets() {
    let _serial = serial();
    context(0);
    let n = 1000;
    let a = alloc(4 * n);
    let b = alloc(4 * n);
    assert_eq!(a % 256, 0);
    let values: Vec<u32> = (0..n as u32).collect();
    upload(a, &values);
    assert_eq!(download(a, n), values);
    // SAFETY: ranges inside the allocations; legacy stream.
    unsafe {
        ok(cuMemcpyDtoD_v2(b, a, 4 * n));
        assert_eq!(download(b, n), values);
        ok(cuMemsetD8_v2(b, 0xff, 8));
        let got = download(b, 3);
        assert_eq!(got, vec![u32::MAX, u32::MAX, 2]);
        let s = stream(1);
        ok(cuMemsetD8Async(a, 0, 4 * n, s));
        let mut out = vec![7u32; n];
        ok(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), a, 4 * n, s));
        // To pageable memory the asynchronous copy returns once done, as CUDA's does.
        assert!(out.iter().all(|&v| v == 0));
        ok(cuStreamSynchronize(s));
        // Bad ranges are refused.
        assert_eq!(
            cuMemcpyHtoD_v2(a + 4 * n as u64 - 4, values.as_ptr().cast(), 8),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemsetD8Async(0x1000, 0, 4, s),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemFree_v2(a + 4), E::CUDA_ERROR_INVALID_VALUE);
        ok(cuStreamDestroy_v2(s));
        ok(cuMemFree_v2(a));
        ok(cuMemFree_v2(b));
        assert_eq!(cuMemFree_v2(a), E::CUDA_ERROR_INVALID_VALUE);
    }
}

#[test]
fn mapped_host_memory() {
    let _serial = serial();
    context(0);
    // SAFETY: a mapped host allocation of 64 bytes, used inside its bounds.
    unsafe {
        let mut host: *mut c_void = null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        ok(cuMemHostAlloc(&mut host, 64, flags));
        let mut device = 0;
        ok(cuMemHostGetDevicePointer_v2(&mut device, host, 0));
        assert_eq!(device, host as u64);
        ok(cuMemsetD8_v2(device, 3, 4));
        // The memset of pinned host memory is synchronous.
        assert_eq!((host as *const u32).read_volatile(), 0x0303_0303);
        let mut other = 0;
        assert_eq!(
            cuMemHostGetDevicePointer_v2(&mut other, 0x10 as *mut c_void, 0),
            E::CUDA_ERROR_INVALID_VALUE
        );
        ok(cuMemFreeHost(host));
    }
}

/// Launch `f` with one block of `threads` on `stream`.
fn launch(f: sys::CUfunction, threads: u32, stream: sys::CUstream, params: &mut [*mut c_void]) {
    // SAFETY: the caller passes parameters matching the kernel's signature; they are copied
    // at launch.
    ok(unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            threads,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            null_mut(),
        )
    });
}

#[test]
fn registered_host_memory() {
    let _serial = serial();
    context(4);
    let page = 4096;
    // SAFETY: a fresh memfd of one page mapped twice (shared), as another process maps it;
    // every access stays inside the page; both mappings outlive their registrations.
    unsafe {
        let fd = libc::memfd_create(c"registered".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, page as libc::off_t), 0);
        let map = || {
            let p = libc::mmap(
                null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            p
        };
        // `host` is registered; `other` is the other process's view of the same memory.
        let host = map();
        let other = map();
        let word = |p: *mut c_void, i: usize| p.cast::<u32>().add(i);

        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        assert_eq!(
            cuMemHostRegister_v2(null_mut(), page, flags),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemHostRegister_v2(host, 0, flags),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuMemHostRegister_v2(host, page, 0x10),
            E::CUDA_ERROR_INVALID_VALUE
        );
        let mut device = 0;
        assert_eq!(
            cuMemHostGetDevicePointer_v2(&mut device, host, 0),
            E::CUDA_ERROR_INVALID_VALUE
        );
        // Pageable memory is unknown to the driver; registered, its type is host memory.
        use sys::CUpointer_attribute as P;
        let memory_type = |at: u64| {
            let mut kind = 0u32;
            let code = cuPointerGetAttribute(
                (&mut kind as *mut u32).cast(),
                P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                at,
            );
            (code, kind)
        };
        assert_eq!(memory_type(host as u64).0, E::CUDA_ERROR_INVALID_VALUE);
        ok(cuMemHostRegister_v2(host, page, flags));
        assert_eq!(
            memory_type(host as u64 + page as u64 - 1),
            (
                E::CUDA_SUCCESS,
                sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32
            )
        );
        let (mut start, mut size) = (0u64, 0usize);
        ok(cuPointerGetAttribute(
            (&mut start as *mut u64).cast(),
            P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            word(host, 7) as u64,
        ));
        ok(cuPointerGetAttribute(
            (&mut size as *mut usize).cast(),
            P::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            word(host, 7) as u64,
        ));
        assert_eq!((start, size), (host as u64, page));
        let on_device = alloc(64);
        assert_eq!(
            memory_type(on_device + 63),
            (
                E::CUDA_SUCCESS,
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
            )
        );
        ok(cuMemFree_v2(on_device));
        assert_eq!(memory_type(on_device).0, E::CUDA_ERROR_INVALID_VALUE);
        ok(cuMemHostGetDevicePointer_v2(&mut device, host, 0));
        assert_eq!(device, host as u64);
        ok(cuMemHostGetDevicePointer_v2(
            &mut device,
            word(host, 2).cast(),
            0,
        ));
        assert_eq!(device, word(host, 2) as u64);
        let device = host as u64;

        // Overlapping registered or allocated memory is refused.
        assert_eq!(
            cuMemHostRegister_v2(host, page, 0),
            E::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        assert_eq!(
            cuMemHostRegister_v2(word(host, 256).cast(), 1024, 0),
            E::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        let mut pinned: *mut c_void = null_mut();
        ok(cuMemHostAlloc(&mut pinned, 64, 0));
        assert_eq!(
            cuMemHostRegister_v2(pinned, 64, 0),
            E::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        ok(cuMemFreeHost(pinned));
        let allocated = alloc(64);
        assert_eq!(
            cuMemHostRegister_v2(allocated as *mut c_void, 64, 0),
            E::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        );
        ok(cuMemFree_v2(allocated));

        // Copies and memsets through the device address reach the shared memory.
        word(other, 0).write_volatile(41);
        assert_eq!(download(device, 1), vec![41]);
        ok(cuMemsetD8_v2(device + 4, 5, 4));
        assert_eq!(word(other, 1).read_volatile(), 0x0505_0505);
        upload(device + 8, &[7, 8]);
        assert_eq!(word(other, 2).read_volatile(), 7);
        assert_eq!(word(other, 3).read_volatile(), 8);

        // Kernels of every device reach it: one waits for a flag the other process sets.
        let module = load_module(PTX).unwrap();
        let wait_then_write = function(module, "wait_then_write");
        let s = stream(1);
        let (mut flag, mut expect, mut out, mut value) = (device + 16, 1u32, device + 20, 99u32);
        let mut params: [*mut c_void; 4] = [
            (&mut flag as *mut u64).cast(),
            (&mut expect as *mut u32).cast(),
            (&mut out as *mut u64).cast(),
            (&mut value as *mut u32).cast(),
        ];
        launch(wait_then_write, 1, s, &mut params);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(word(other, 5).read_volatile(), 0);
        word(other, 4).write_volatile(1);
        ok(cuStreamSynchronize(s));
        assert_eq!(word(other, 5).read_volatile(), 99);
        ok(cuStreamDestroy_v2(s));
        ok(cuModuleUnload(module));
        context(5);
        let module = load_module(PTX).unwrap();
        let add_one = function(module, "add_one");
        let (mut data, mut n) = (device, 4u32);
        let mut params: [*mut c_void; 2] =
            [(&mut data as *mut u64).cast(), (&mut n as *mut u32).cast()];
        launch(add_one, 32, null_mut(), &mut params);
        ok(cuCtxSynchronize());
        assert_eq!(word(other, 0).read_volatile(), 42);
        assert_eq!(word(other, 3).read_volatile(), 9);
        ok(cuModuleUnload(module));

        // Registered memory is not the driver's to free.
        assert_eq!(cuMemFreeHost(host), E::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemFree_v2(device), E::CUDA_ERROR_INVALID_VALUE);

        // Unregistering takes the base address; afterwards the memory is the caller's alone.
        assert_eq!(
            cuMemHostUnregister(word(host, 1).cast()),
            E::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        );
        assert_eq!(cuMemHostUnregister(null_mut()), E::CUDA_ERROR_INVALID_VALUE);
        ok(cuMemHostUnregister(host));
        assert_eq!(
            cuMemHostUnregister(host),
            E::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        );
        let mut again = 0;
        assert_eq!(
            cuMemHostGetDevicePointer_v2(&mut again, host, 0),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuMemsetD8_v2(device, 0, 4), E::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(word(host, 0).read_volatile(), 42);
        word(host, 6).write_volatile(3);
        assert_eq!(word(other, 6).read_volatile(), 3);

        // It may be registered again; registration is refused during a global capture.
        ok(cuMemHostRegister_v2(
            host,
            page,
            sys::CU_MEMHOSTREGISTER_READ_ONLY,
        ));
        assert_eq!(download(device + 24, 1), vec![3]);
        ok(cuMemHostUnregister(host));
        // Unregistered, it is pageable memory again.
        assert_eq!(memory_type(host as u64).0, E::CUDA_ERROR_INVALID_VALUE);
        let s = stream(0);
        let mut graph = null_mut();
        ok(cuStreamBeginCapture_v2(s, 0));
        assert_eq!(
            cuMemHostRegister_v2(host, page, 0),
            E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        ok(cuStreamDestroy_v2(s));

        // Kernels may no longer touch it (device 7's context stays faulted; no other test of
        // this binary uses it).
        context(7);
        let module = load_module(PTX).unwrap();
        let add_one = function(module, "add_one");
        launch(add_one, 32, null_mut(), &mut params);
        assert_eq!(cuCtxSynchronize(), E::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(word(other, 0).read_volatile(), 42);
        context(4);

        assert_eq!(libc::munmap(host, page), 0);
        assert_eq!(libc::munmap(other, page), 0);
        assert_eq!(libc::close(fd), 0);
    }
}

#[test]
fn stream_order_and_event_waits_across_streams_and_devices() {
    let _serial = serial();
    context(3);
    let words = 256;
    let src = alloc(4 * words);
    let mid = alloc(4 * words);
    // SAFETY: streams, events and copies inside the allocations.
    unsafe {
        let (s1, s2) = (stream(1), stream(1));
        let e = event(0);
        for round in 0..200u32 {
            let values: Vec<u32> = (0..words as u32).map(|i| i ^ round).collect();
            ok(cuMemcpyHtoDAsync_v2(
                src,
                values.as_ptr().cast(),
                4 * words,
                s1,
            ));
            ok(cuMemcpyDtoDAsync_v2(mid, src, 4 * words, s1));
            ok(cuEventRecord(e, s1));
            ok(cuStreamWaitEvent(s2, e, 0));
            // s2 copies `mid` into memory of device 4, after the wait.
            let dst = {
                let mut d = 0;
                context(4);
                ok(cuMemAlloc_v2(&mut d, 4 * words));
                context(3);
                d
            };
            ok(cuMemcpyDtoDAsync_v2(dst, mid, 4 * words, s2));
            let mut out = vec![0u32; words];
            ok(cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast(),
                dst,
                4 * words,
                s2,
            ));
            assert_eq!(out, values, "round {round}");
            ok(cuStreamSynchronize(s2));
            assert_eq!(cuStreamQuery(s2), E::CUDA_SUCCESS);
            assert_eq!(cuEventQuery(e), E::CUDA_SUCCESS);
            context(4);
            ok(cuMemFree_v2(dst));
            context(3);
        }
        ok(cuEventSynchronize(e));
        ok(cuStreamDestroy_v2(s1));
        ok(cuStreamDestroy_v2(s2));
        ok(cuEventDestroy_v2(e));
        assert_eq!(cuEventQuery(e), E::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamQuery(s1), E::CUDA_ERROR_INVALID_HANDLE);
    }
}

#[test]
fn stream_flags_and_events_timing() {
    let _serial = serial();
    context(0);
    // SAFETY: handles created here.
    unsafe {
        let (blocking, non_blocking) = (stream(0), stream(1));
        let mut flags = 9;
        ok(cuStreamGetFlags(blocking, &mut flags));
        assert_eq!(flags, 0);
        ok(cuStreamGetFlags(non_blocking, &mut flags));
        assert_eq!(flags, 1);
        ok(cuStreamGetFlags(null_mut(), &mut flags));
        assert_eq!(flags, 0);
        let mut s = null_mut();
        assert_eq!(cuStreamCreate(&mut s, 4), E::CUDA_ERROR_INVALID_VALUE);
        let (start, stop) = (event(0), event(0));
        let mut ms = 0f32;
        assert_eq!(
            cuEventElapsedTime(&mut ms, start, stop),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        ok(cuEventRecord(start, blocking));
        ok(cuEventRecord(stop, blocking));
        ok(cuEventSynchronize(stop));
        ok(cuEventElapsedTime(&mut ms, start, stop));
        assert!(ms >= 0.0);
        let untimed = event(2);
        ok(cuEventRecord(untimed, blocking));
        ok(cuEventSynchronize(untimed));
        assert_eq!(
            cuEventElapsedTime(&mut ms, start, untimed),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        // An event of another device cannot be recorded on this device's stream.
        context(1);
        let other = event(0);
        context(0);
        assert_eq!(cuEventRecord(other, blocking), E::CUDA_ERROR_INVALID_HANDLE);
        ok(cuStreamSynchronize(null_mut()));
        ok(cuStreamSynchronize(2 as sys::CUstream));
        ok(cuCtxSynchronize());
    }
}

#[test]
fn capture_records_and_replays_with_new_inputs() {
    let _serial = serial();
    context(5);
    let words = 64;
    let (input, output) = (alloc(4 * words), alloc(4 * words));
    // SAFETY: handles created here; copies inside the allocations.
    unsafe {
        let s = stream(0);
        ok(cuStreamBeginCapture_v2(s, 0));
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        ok(cuStreamIsCapturing(s, &mut status));
        assert_eq!(
            status,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        );
        ok(cuMemsetD8Async(output, 0, 4 * words, s));
        ok(cuMemcpyDtoDAsync_v2(output, input, 4 * words, s));
        // Nothing ran: the output is still untouched while capturing.
        let mut graph = null_mut();
        ok(cuStreamEndCapture(s, &mut graph));
        assert!(!graph.is_null());
        ok(cuStreamIsCapturing(s, &mut status));
        assert_eq!(
            status,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        );
        let mut exec = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut exec, graph, 0));
        for replay in 0..50u32 {
            let values: Vec<u32> = (0..words as u32).map(|i| i * replay).collect();
            upload(input, &values);
            ok(cuGraphLaunch(exec, s));
            ok(cuStreamSynchronize(s));
            assert_eq!(download(output, words), values, "replay {replay}");
        }
        ok(cuGraphExecDestroy(exec));
        ok(cuGraphDestroy(graph));
        assert_eq!(cuGraphDestroy(graph), E::CUDA_ERROR_INVALID_VALUE);
        ok(cuStreamDestroy_v2(s));
    }
}

#[test]
fn capture_forks_and_joins_through_events() {
    let _serial = serial();
    context(5);
    let words = 16;
    let (a, b, c) = (alloc(4 * words), alloc(4 * words), alloc(4 * words));
    // SAFETY: handles created here; copies inside the allocations.
    unsafe {
        // The origin is blocking: the synchronous uploads below (legacy stream) may land after
        // they return, and only blocking streams are ordered after them.
        let (origin, side) = (stream(0), stream(1));
        let (fork, join) = (event(2), event(2));
        ok(cuStreamBeginCapture_v2(origin, 0));
        ok(cuMemcpyDtoDAsync_v2(b, a, 4 * words, origin));
        ok(cuEventRecord(fork, origin));
        ok(cuStreamWaitEvent(side, fork, 0));
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        ok(cuStreamIsCapturing(side, &mut status));
        assert_eq!(
            status,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
        );
        ok(cuMemcpyDtoDAsync_v2(c, b, 4 * words, side));
        // Querying an event recorded in the capture is illegal.
        assert_eq!(cuEventQuery(fork), E::CUDA_ERROR_CAPTURED_EVENT);
        let mut graph = null_mut();
        assert_eq!(
            cuStreamEndCapture(origin, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        assert!(graph.is_null());

        // Again, legally, with the join.
        ok(cuStreamBeginCapture_v2(origin, 0));
        ok(cuMemcpyDtoDAsync_v2(b, a, 4 * words, origin));
        ok(cuEventRecord(fork, origin));
        ok(cuStreamWaitEvent(side, fork, 0));
        ok(cuMemcpyDtoDAsync_v2(c, b, 4 * words, side));
        ok(cuEventRecord(join, side));
        ok(cuStreamWaitEvent(origin, join, 0));
        assert_eq!(
            cuStreamEndCapture(side, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
        );
        ok(cuStreamEndCapture(origin, &mut graph));
        ok(cuStreamIsCapturing(side, &mut status));
        assert_eq!(
            status,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        );
        let mut exec = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut exec, graph, 0));
        for replay in 0..30u32 {
            let values = vec![replay; words];
            upload(a, &values);
            ok(cuGraphLaunch(exec, origin));
            ok(cuStreamSynchronize(origin));
            assert_eq!(download(c, words), values, "replay {replay}");
        }

        // Without the join the capture cannot end.
        ok(cuStreamBeginCapture_v2(origin, 0));
        ok(cuEventRecord(fork, origin));
        ok(cuStreamWaitEvent(side, fork, 0));
        ok(cuMemcpyDtoDAsync_v2(c, b, 4 * words, side));
        assert_eq!(
            cuStreamEndCapture(origin, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        );
        ok(cuStreamIsCapturing(side, &mut status));
        assert_eq!(
            status,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
        );
    }
}

#[test]
fn illegal_calls_during_capture_invalidate_it() {
    let _serial = serial();
    context(6);
    let buffer = alloc(64);
    // SAFETY: handles created here.
    unsafe {
        let s = stream(0);
        let e = event(0);
        let mut graph = null_mut();
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;

        // Synchronizing a capturing stream.
        ok(cuStreamBeginCapture_v2(s, 0));
        assert_eq!(
            cuStreamSynchronize(s),
            E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        ok(cuStreamIsCapturing(s, &mut status));
        assert_eq!(
            status,
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
        );
        assert_eq!(
            cuMemsetD8Async(buffer, 0, 4, s),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );

        // An allocation in global mode; allowed once this thread's mode is relaxed.
        ok(cuStreamBeginCapture_v2(s, 0));
        let mut p = 0;
        assert_eq!(
            cuMemAlloc_v2(&mut p, 64),
            E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        ok(cuStreamBeginCapture_v2(s, 0));
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED as u32;
        ok(cuThreadExchangeStreamCaptureMode(&mut mode));
        assert_eq!(mode, 0);
        ok(cuMemAlloc_v2(&mut p, 64));
        // Uploading through a non-blocking stream is fine (the synchronous copy would use the
        // legacy stream, which synchronizes with the capturing blocking stream).
        let side = stream(1);
        ok(cuMemcpyHtoDAsync_v2(p, [1u32].as_ptr().cast(), 4, side));
        ok(cuStreamSynchronize(side));
        ok(cuStreamDestroy_v2(side));
        ok(cuMemFree_v2(p));
        ok(cuThreadExchangeStreamCaptureMode(&mut mode));
        ok(cuStreamEndCapture(s, &mut graph));
        ok(cuGraphDestroy(graph));

        // Another thread's allocation during a global capture.
        ok(cuStreamBeginCapture_v2(s, 0));
        std::thread::spawn(|| {
            context(6);
            let mut p = 0;
            assert_eq!(
                cuMemAlloc_v2(&mut p, 64),
                E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            );
        })
        .join()
        .unwrap();
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        // ... which a thread-local capture does not mind.
        ok(cuStreamBeginCapture_v2(s, 1));
        std::thread::spawn(|| {
            context(6);
            let mut p = 0;
            ok(cuMemAlloc_v2(&mut p, 64));
            ok(cuMemFree_v2(p));
        })
        .join()
        .unwrap();
        ok(cuStreamEndCapture(s, &mut graph));

        // The legacy stream while a blocking stream captures.
        ok(cuStreamBeginCapture_v2(s, 2));
        assert_eq!(
            cuMemsetD8Async(buffer, 0, 4, null_mut()),
            E::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        );
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );

        // Waiting on an event recorded outside the capture.
        ok(cuEventRecord(e, null_mut()));
        ok(cuStreamBeginCapture_v2(s, 2));
        assert_eq!(
            cuStreamWaitEvent(s, e, 0),
            E::CUDA_ERROR_STREAM_CAPTURE_ISOLATION
        );
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        // The legacy stream cannot be captured; a stream cannot be captured twice.
        assert_eq!(
            cuStreamBeginCapture_v2(null_mut(), 0),
            E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        ok(cuStreamBeginCapture_v2(s, 2));
        assert_eq!(cuStreamBeginCapture_v2(s, 2), E::CUDA_ERROR_ILLEGAL_STATE);
        // Ending from another thread is wrong in global mode but fine in relaxed mode.
        let handle = s as u64;
        std::thread::spawn(move || {
            context(6);
            let mut graph = null_mut();
            ok(cuStreamEndCapture(handle as sys::CUstream, &mut graph));
        })
        .join()
        .unwrap();
        ok(cuStreamBeginCapture_v2(s, 0));
        std::thread::spawn(move || {
            context(6);
            let mut graph = null_mut();
            assert_eq!(
                cuStreamEndCapture(handle as sys::CUstream, &mut graph),
                E::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
            );
        })
        .join()
        .unwrap();
        ok(cuStreamEndCapture(s, &mut graph));
        assert_eq!(
            cuStreamEndCapture(s, &mut graph),
            E::CUDA_ERROR_ILLEGAL_STATE
        );
    }
}

#[test]
fn destroying_a_stream_with_queued_work_completes_it() {
    let _serial = serial();
    context(2);
    let words = 1 << 16;
    let (a, b) = (alloc(4 * words), alloc(4 * words));
    upload(a, &vec![5u32; words]);
    // SAFETY: handles created here; copies inside the allocations.
    unsafe {
        let s = stream(0);
        for _ in 0..20 {
            ok(cuMemcpyDtoDAsync_v2(b, a, 4 * words, s));
        }
        ok(cuStreamDestroy_v2(s));
        ok(cuCtxSynchronize());
        assert_eq!(download(b, words), vec![5u32; words]);
        assert_eq!(cuStreamSynchronize(s), E::CUDA_ERROR_INVALID_HANDLE);
        assert_eq!(cuStreamDestroy_v2(null_mut()), E::CUDA_ERROR_INVALID_HANDLE);
    }
}

#[test]
fn vmm_maps_shares_and_grants_access_per_device() {
    let _serial = serial();
    context(1);
    let g = 2usize << 20;
    // SAFETY: VMM handles and ranges made here; copies inside the mapped range.
    unsafe {
        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes:
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: 1,
            },
            win32HandleMetaData: null_mut(),
            allocFlags: std::mem::zeroed(),
        };
        let mut granularity = 0;
        ok(cuMemGetAllocationGranularity(&mut granularity, &prop, 1));
        assert_eq!(granularity, g);
        let mut handle = 0;
        assert_eq!(
            cuMemCreate(&mut handle, g + 1, &prop, 0),
            E::CUDA_ERROR_INVALID_VALUE
        );
        ok(cuMemCreate(&mut handle, 2 * g, &prop, 0));
        let mut fabric = prop;
        fabric.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        let mut h2 = 0;
        assert_eq!(
            cuMemCreate(&mut h2, g, &fabric, 0),
            E::CUDA_ERROR_NOT_SUPPORTED
        );

        let mut base = 0;
        ok(cuMemAddressReserve(&mut base, 2 * g, g, 0, 0));
        assert_eq!(base % g as u64, 0);
        ok(cuMemMap(base, 2 * g, 0, handle, 0));
        assert_eq!(
            cuMemMap(base, g, 0, handle, 0),
            E::CUDA_ERROR_ALREADY_MAPPED
        );
        // Not accessible before cuMemSetAccess.
        assert_eq!(
            cuMemcpyHtoD_v2(base, [1u32].as_ptr().cast(), 4),
            E::CUDA_ERROR_INVALID_VALUE
        );
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        ok(cuMemSetAccess(base, 2 * g, &access, 1));
        upload(base + g as u64, &[7, 8, 9]);

        // A second mapping of the same memory (an export imported in this process) sees it.
        let mut fd: i32 = -1;
        ok(cuMemExportToShareableHandle(
            (&mut fd as *mut i32).cast(),
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0,
            0,
        ));
        assert!(fd >= 0);
        let mut imported = 0;
        ok(cuMemImportFromShareableHandle(
            &mut imported,
            std::ptr::without_provenance_mut(fd as usize),
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0,
        ));
        libc::close(fd);
        let mut alias = 0;
        ok(cuMemAddressReserve(&mut alias, 2 * g, 0, 0, 0));
        ok(cuMemMap(alias, 2 * g, 0, imported, 0));
        ok(cuMemSetAccess(alias, 2 * g, &access, 1));
        assert_eq!(download(alias + g as u64, 3), vec![7, 8, 9]);

        assert_eq!(cuMemUnmap(base, g), E::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemAddressFree(base, 2 * g), E::CUDA_ERROR_INVALID_VALUE);
        ok(cuMemUnmap(base, 2 * g));
        assert_eq!(
            cuMemcpyDtoH_v2([0u32; 1].as_mut_ptr().cast(), base, 4),
            E::CUDA_ERROR_INVALID_VALUE
        );
        ok(cuMemAddressFree(base, 2 * g));
        ok(cuMemRelease(handle));
        assert_eq!(cuMemRelease(handle), E::CUDA_ERROR_INVALID_VALUE);
        // The alias keeps the memory alive.
        assert_eq!(download(alias + g as u64, 3), vec![7, 8, 9]);
        ok(cuMemUnmap(alias, 2 * g));
        ok(cuMemAddressFree(alias, 2 * g));
        ok(cuMemRelease(imported));
    }
}

#[test]
fn module_load_failures_fill_the_error_log() {
    let _serial = serial();
    context(0);
    let (code, log) = load_module(".version 8.0\n.target sm_90\n.address_size 64\nbogus;\n")
        .expect_err("bogus PTX loads");
    assert_eq!(code, E::CUDA_ERROR_INVALID_PTX);
    assert!(log.starts_with("symm-sim: "), "{log}");
    let (code, _) = load_module("\x7fELF").expect_err("an ELF image loads");
    assert_eq!(code, E::CUDA_ERROR_INVALID_IMAGE);
    // SAFETY: invalid handles are rejected without being dereferenced.
    unsafe {
        assert_eq!(
            cuModuleUnload(0x77 as sys::CUmodule),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuFuncLoad(0x77 as sys::CUfunction),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        let mut v = 0;
        assert_eq!(
            cuFuncGetAttribute(&mut v, 4, 0x77 as sys::CUfunction),
            E::CUDA_ERROR_INVALID_HANDLE
        );
    }
}

#[test]
fn null_pointers_and_bad_handles_are_errors() {
    let _serial = serial();
    context(0);
    // SAFETY: the driver checks every pointer and handle here.
    unsafe {
        assert_eq!(cuDeviceGetCount(null_mut()), E::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuMemAlloc_v2(null_mut(), 16), E::CUDA_ERROR_INVALID_VALUE);
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 0), E::CUDA_ERROR_INVALID_VALUE);
        assert_eq!(
            cuStreamSynchronize(0x5e5e_0200_0000_9999 as sys::CUstream),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuStreamWaitEvent(null_mut(), 0x42 as sys::CUevent, 0),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuEventSynchronize(0x42 as sys::CUevent),
            E::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            cuGraphLaunch(0x42 as sys::CUgraphExec, null_mut()),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuThreadExchangeStreamCaptureMode(null_mut()),
            E::CUDA_ERROR_INVALID_VALUE
        );
        let mut mode = 7u32;
        assert_eq!(
            cuThreadExchangeStreamCaptureMode(&mut mode),
            E::CUDA_ERROR_INVALID_VALUE
        );
    }
}
