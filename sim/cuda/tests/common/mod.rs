//! Helpers of the fake driver's tests: they call the driver functions through the rlib, with
//! the C ABI types of cudarc.

#![allow(dead_code)]

use cudarc::driver::sys::{self, CUresult, cudaError_enum as E};
use std::ffi::{CString, c_void};
use symm_fake_cuda::*;

/// Serialize the tests of a binary: captures in global mode forbid allocations in every
/// thread of the process, so tests must not overlap.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Panic unless `r` is `CUDA_SUCCESS`.
#[track_caller]
pub fn ok(r: CUresult) {
    assert_eq!(r, E::CUDA_SUCCESS);
}

/// Initialize the driver and make device `device`'s primary context current on this thread.
pub fn context(device: i32) -> sys::CUcontext {
    // SAFETY: plain driver calls with valid output pointers.
    unsafe {
        ok(cuInit(0));
        let mut dev = 0;
        ok(cuDeviceGet(&mut dev, device));
        let mut ctx = std::ptr::null_mut();
        ok(cuDevicePrimaryCtxRetain(&mut ctx, dev));
        ok(cuCtxSetCurrent(ctx));
        ctx
    }
}

/// A stream of the current context (`flags` 0: blocking, 1: non-blocking).
pub fn stream(flags: u32) -> sys::CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: valid output pointer.
    ok(unsafe { cuStreamCreate(&mut s, flags) });
    s
}

/// An event of the current context.
pub fn event(flags: u32) -> sys::CUevent {
    let mut e = std::ptr::null_mut();
    // SAFETY: valid output pointer.
    ok(unsafe { cuEventCreate(&mut e, flags) });
    e
}

/// `bytes` of device memory of the current context.
pub fn alloc(bytes: usize) -> u64 {
    let mut p = 0;
    // SAFETY: valid output pointer.
    ok(unsafe { cuMemAlloc_v2(&mut p, bytes) });
    p
}

/// Copy `values` to device memory at `dst` (synchronous API).
pub fn upload(dst: u64, values: &[u32]) {
    // SAFETY: the slice is readable for its size.
    ok(unsafe { cuMemcpyHtoD_v2(dst, values.as_ptr().cast(), std::mem::size_of_val(values)) });
}

/// Read `count` words of device memory at `src` (synchronous API).
pub fn download(src: u64, count: usize) -> Vec<u32> {
    let mut out = vec![0u32; count];
    // SAFETY: the vector is writable for its size.
    ok(unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), src, count * 4) });
    out
}

/// Load PTX text as a module of the current context; the error log on failure.
pub fn load_module(ptx: &str) -> Result<sys::CUmodule, (CUresult, String)> {
    let image = CString::new(ptx).unwrap();
    let mut log = vec![0u8; 4096];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER as u32,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES as u32,
    ];
    let mut values: [*mut c_void; 2] = [
        log.as_mut_ptr().cast(),
        std::ptr::without_provenance_mut(log.len()),
    ];
    let mut module = std::ptr::null_mut();
    // SAFETY: NUL-terminated image; two options with their values; the log outlives the call.
    let r = unsafe {
        cuModuleLoadDataEx(
            &mut module,
            image.as_ptr().cast(),
            2,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if r == E::CUDA_SUCCESS {
        Ok(module)
    } else {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        Err((r, String::from_utf8_lossy(&log[..end]).into_owned()))
    }
}

/// The function `name` of `module`.
pub fn function(module: sys::CUmodule, name: &str) -> sys::CUfunction {
    let name = CString::new(name).unwrap();
    let mut f = std::ptr::null_mut();
    // SAFETY: valid output pointer; NUL-terminated name.
    ok(unsafe { cuModuleGetFunction(&mut f, module, name.as_ptr()) });
    f
}

/// Run this test binary again as a child process running only test `name`, with `env`;
/// returns (success, stderr).
pub fn child(name: &str, env: &[(&str, &str)]) -> (bool, String) {
    let exe = std::env::current_exe().unwrap();
    let mut command = std::process::Command::new(exe);
    command.args([
        "--exact",
        name,
        "--nocapture",
        "--test-threads=1",
        "--include-ignored",
    ]);
    command.env("SYMM_SIM_TEST_CHILD", name);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().unwrap();
    let stderr =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), stderr)
}

/// `true` in a child started by [`child`] for test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var("SYMM_SIM_TEST_CHILD").is_ok_and(|v| v == name)
}

/// Kernels used by the tests (PTX for sm_90).
pub const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

// data[i] += 1 for i < n
.visible .entry add_one(
    .param .u64 p_data,
    .param .u32 p_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [p_data];
    ld.param.u32 %r1, [p_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.u32 %r6, [%rd4];
    add.u32 %r7, %r6, 1;
    st.global.u32 [%rd4], %r7;
DONE:
    ret;
}

// poll (with a back-off) until *flag == expect, then *out = value
.visible .entry wait_then_write(
    .param .u64 p_flag,
    .param .u32 p_expect,
    .param .u64 p_out,
    .param .u32 p_value
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [p_flag];
    ld.param.u32 %r1, [p_expect];
    ld.param.u64 %rd2, [p_out];
    ld.param.u32 %r2, [p_value];
LOOP:
    ld.volatile.global.u32 %r3, [%rd1];
    setp.eq.u32 %p1, %r3, %r1;
    @%p1 bra DONE;
    nanosleep.u32 100;
    bra LOOP;
DONE:
    st.global.u32 [%rd2], %r2;
    ret;
}

// *p = 1
.visible .entry store_to(
    .param .u64 p_addr
)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p_addr];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"#;
