//! Kernels on the simulated GPU through the driver: launches, stream ordering against
//! running grids, cooperative limits, faults and sticky errors, capture of launches.

mod common;

use common::*;
use cudarc::driver::sys::{self, cudaError_enum as E};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm_fake_cuda::*;

/// Launch `add_one(data, n)` on `stream` with `blocks` blocks of `threads`.
fn add_one(
    f: sys::CUfunction,
    data: u64,
    n: u32,
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
) {
    let (mut data, mut n) = (data, n);
    let mut params: [*mut c_void; 2] =
        [(&mut data as *mut u64).cast(), (&mut n as *mut u32).cast()];
    // SAFETY: the parameters match the kernel's signature and are copied at launch.
    ok(unsafe {
        cuLaunchKernel(
            f,
            blocks,
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

/// Launch `wait_then_write(flag, expect, out, value)` (one thread) on `stream`.
fn wait_then_write(
    f: sys::CUfunction,
    flag: u64,
    expect: u32,
    out: u64,
    value: u32,
    stream: sys::CUstream,
) {
    let (mut flag, mut expect, mut out, mut value) = (flag, expect, out, value);
    let mut params: [*mut c_void; 4] = [
        (&mut flag as *mut u64).cast(),
        (&mut expect as *mut u32).cast(),
        (&mut out as *mut u64).cast(),
        (&mut value as *mut u32).cast(),
    ];
    // SAFETY: the parameters match the kernel's signature and are copied at launch.
    ok(unsafe {
        cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
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
fn launches_run_in_stream_order() {
    let _serial = serial();
    context(0);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let f = function(module, "add_one");
    let n = 1000u32;
    let data = alloc(4 * n as usize);
    upload(data, &vec![0; n as usize]);
    let s = stream(1);
    for _ in 0..5 {
        add_one(f, data, n, n.div_ceil(128), 128, s);
    }
    // SAFETY: a stream of this context.
    ok(unsafe { cuStreamSynchronize(s) });
    assert_eq!(download(data, n as usize), vec![5; n as usize]);
    // SAFETY: handles made here.
    unsafe {
        let mut regs = 0;
        ok(cuFuncGetAttribute(&mut regs, 4, f));
        assert!(regs > 0);
        ok(cuFuncLoad(f));
        let mut blocks = 0;
        ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut blocks,
            f,
            128,
            0,
        ));
        assert!(blocks > 0);
        ok(cuModuleUnload(module));
    }
}

#[test]
fn a_later_stream_operation_waits_for_a_running_kernel() {
    let _serial = serial();
    context(1);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let wait = function(module, "wait_then_write");
    // SAFETY: a mapped host flag, written by this thread while the kernel spins on it.
    unsafe {
        let mut host: *mut c_void = null_mut();
        ok(cuMemHostAlloc(&mut host, 4, 3));
        (host as *mut u32).write_volatile(0);
        let out = alloc(4);
        let copy = alloc(4);
        upload(out, &[0]);
        let s = stream(1);
        let e = event(0);
        wait_then_write(wait, host as u64, 1, out, 42, s);
        ok(cuEventRecord(e, s));
        let other = stream(1);
        ok(cuStreamWaitEvent(other, e, 0));
        ok(cuMemcpyDtoDAsync_v2(copy, out, 4, other));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(cuStreamQuery(s), E::CUDA_ERROR_NOT_READY);
        assert_eq!(cuEventQuery(e), E::CUDA_ERROR_NOT_READY);
        assert_eq!(cuStreamQuery(other), E::CUDA_ERROR_NOT_READY);
        (host as *mut u32).write_volatile(1);
        ok(cuStreamSynchronize(other));
        assert_eq!(download(copy, 1), vec![42]);
        ok(cuMemFreeHost(host));
    }
}

#[test]
fn a_missing_wait_shows_up_as_a_wrong_result() {
    let _serial = serial();
    context(2);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let wait = function(module, "wait_then_write");
    // SAFETY: as above.
    unsafe {
        let mut host: *mut c_void = null_mut();
        ok(cuMemHostAlloc(&mut host, 4, 3));
        (host as *mut u32).write_volatile(0);
        let (out, copy) = (alloc(4), alloc(4));
        upload(out, &[0]);
        upload(copy, &[7]);
        let (s, other) = (stream(1), stream(1));
        wait_then_write(wait, host as u64, 1, out, 42, s);
        // No wait: the copy runs while the kernel still spins.
        ok(cuMemcpyDtoDAsync_v2(copy, out, 4, other));
        ok(cuStreamSynchronize(other));
        assert_eq!(download(copy, 1), vec![0]);
        (host as *mut u32).write_volatile(1);
        ok(cuStreamSynchronize(s));
        ok(cuMemFreeHost(host));
    }
}

#[test]
fn cooperative_launches_must_fit() {
    let _serial = serial();
    context(3);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let f = function(module, "add_one");
    let data = alloc(4);
    let (mut d, mut n) = (data, 0u32);
    let mut params: [*mut c_void; 2] = [(&mut d as *mut u64).cast(), (&mut n as *mut u32).cast()];
    // SAFETY: handles made here; parameters as the kernel declares.
    unsafe {
        let mut per_sm = 0;
        ok(cuOccupancyMaxActiveBlocksPerMultiprocessor(
            &mut per_sm,
            f,
            256,
            0,
        ));
        assert!(per_sm > 0);
        let mut sms = 0;
        ok(cuDeviceGetAttribute(
            &mut sms,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as u32,
            3,
        ));
        let fits = (per_sm * sms) as u32;
        let cooperative = || {
            let mut a: sys::CUlaunchAttribute = std::mem::zeroed();
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            a.value.cooperative = 1;
            a
        };
        let cluster = |x| {
            let mut a: sys::CUlaunchAttribute = std::mem::zeroed();
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            a.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y: 1, z: 1 };
            a
        };
        let mut launch = |blocks: u32, mut attribute: sys::CUlaunchAttribute| {
            let config = sys::CUlaunchConfig {
                gridDimX: blocks,
                gridDimY: 1,
                gridDimZ: 1,
                blockDimX: 256,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: 0,
                hStream: null_mut(),
                attrs: &mut attribute,
                numAttrs: 1,
            };
            cuLaunchKernelEx(&config, f, params.as_mut_ptr(), null_mut())
        };
        assert_eq!(
            launch(fits + 1, cooperative()),
            E::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
        );
        ok(launch(fits, cooperative()));
        // Clusters are not simulated.
        assert_eq!(launch(2, cluster(2)), E::CUDA_ERROR_NOT_SUPPORTED);
        ok(launch(2, cluster(1)));
        // A block that does not fit on a multiprocessor (1024 threads at the default 80
        // registers each), and bad shapes.
        assert_eq!(
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                1024,
                1,
                1,
                0,
                null_mut(),
                params.as_mut_ptr(),
                null_mut()
            ),
            E::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        );
        assert_eq!(
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                null_mut(),
                params.as_mut_ptr(),
                null_mut()
            ),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            cuLaunchKernel(
                f,
                0,
                1,
                1,
                32,
                1,
                1,
                0,
                null_mut(),
                params.as_mut_ptr(),
                null_mut()
            ),
            E::CUDA_ERROR_INVALID_VALUE
        );
        ok(cuCtxSynchronize());
    }
}

#[test]
fn captured_launches_replay() {
    let _serial = serial();
    context(4);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let f = function(module, "add_one");
    let n = 256u32;
    let data = alloc(4 * n as usize);
    upload(data, &vec![0; n as usize]);
    // SAFETY: handles made here.
    unsafe {
        let s = stream(0);
        ok(cuStreamBeginCapture_v2(s, 0));
        add_one(f, data, n, 2, 128, s);
        add_one(f, data, n, 2, 128, s);
        let mut graph = null_mut();
        ok(cuStreamEndCapture(s, &mut graph));
        // Nothing ran during the capture.
        assert_eq!(download(data, n as usize), vec![0; n as usize]);
        let mut exec = null_mut();
        ok(cuGraphInstantiateWithFlags(&mut exec, graph, 0));
        for _ in 0..10 {
            ok(cuGraphLaunch(exec, s));
        }
        ok(cuStreamSynchronize(s));
        assert_eq!(download(data, n as usize), vec![20; n as usize]);
        ok(cuGraphExecDestroy(exec));
        ok(cuGraphDestroy(graph));
    }
}

#[test]
fn a_fault_makes_the_context_error_sticky() {
    let _serial = serial();
    context(7);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let f = function(module, "store_to");
    let mut address = 0x10u64;
    let mut params: [*mut c_void; 1] = [(&mut address as *mut u64).cast()];
    // SAFETY: the kernel stores to an unmapped address; the simulator catches it.
    unsafe {
        ok(cuLaunchKernel(
            f,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        ));
        assert_eq!(cuCtxSynchronize(), E::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(cuStreamQuery(null_mut()), E::CUDA_ERROR_ILLEGAL_ADDRESS);
        let mut p = 0;
        assert_eq!(cuMemAlloc_v2(&mut p, 64), E::CUDA_ERROR_ILLEGAL_ADDRESS);
        assert_eq!(
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                null_mut(),
                params.as_mut_ptr(),
                null_mut()
            ),
            E::CUDA_ERROR_ILLEGAL_ADDRESS
        );
    }
    // Other devices are unaffected.
    context(0);
    let data = alloc(4);
    upload(data, &[3]);
    assert_eq!(download(data, 1), vec![3]);
}

#[test]
fn vmm_access_is_per_device() {
    let _serial = serial();
    context(5);
    let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
    let f = function(module, "add_one");
    let g = 2usize << 20;
    // SAFETY: VMM objects made here; the kernel runs on device 5, granted access, then on
    // device 6, which is not (and faults, poisoning device 6, which no other test uses).
    unsafe {
        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: 5,
            },
            win32HandleMetaData: null_mut(),
            allocFlags: std::mem::zeroed(),
        };
        let mut handle = 0;
        ok(cuMemCreate(&mut handle, g, &prop, 0));
        let mut base = 0;
        ok(cuMemAddressReserve(&mut base, g, 0, 0, 0));
        ok(cuMemMap(base, g, 0, handle, 0));
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        ok(cuMemSetAccess(base, g, &access, 1));
        upload(base, &[0; 64]);
        add_one(f, base, 64, 1, 64, null_mut());
        ok(cuCtxSynchronize());
        assert_eq!(download(base, 64), vec![1; 64]);
        // Device 6 was not granted access: its kernel faults.
        context(6);
        let f6 = function(
            load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}")),
            "add_one",
        );
        add_one(f6, base, 64, 1, 64, null_mut());
        assert_eq!(cuCtxSynchronize(), E::CUDA_ERROR_ILLEGAL_ADDRESS);
        context(5);
        assert_eq!(download(base, 64), vec![1; 64]);
        ok(cuMemUnmap(base, g));
        ok(cuMemAddressFree(base, g));
        ok(cuMemRelease(handle));
    }
}

#[test]
fn a_stall_longer_than_the_deadlock_limit_is_reported_and_can_fail() {
    const NAME: &str = "a_stall_longer_than_the_deadlock_limit_is_reported_and_can_fail";
    if is_child(NAME) {
        context(0);
        let module = load_module(PTX).unwrap_or_else(|(c, log)| panic!("{c:?}: {log}"));
        let wait = function(module, "wait_then_write");
        let flag = alloc(4);
        upload(flag, &[0]);
        wait_then_write(wait, flag, 1, flag, 2, null_mut());
        let start = Instant::now();
        // SAFETY: plain synchronization.
        let r = unsafe { cuCtxSynchronize() };
        assert_eq!(r, E::CUDA_ERROR_LAUNCH_TIMEOUT);
        assert!(start.elapsed() < Duration::from_secs(20));
        return;
    }
    let (passed, output) = child(
        NAME,
        &[
            ("SYMM_SIM_DEADLOCK", "fail"),
            ("SYMM_SIM_DEADLOCK_MS", "300"),
            ("SYMM_SIM_SEED", "1234"),
        ],
    );
    assert!(passed, "{output}");
    assert!(output.contains("symm-sim: deadlock?"), "{output}");
    assert!(output.contains("seed 1234"), "{output}");
}
