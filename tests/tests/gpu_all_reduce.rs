//! The GPU set: f32 sum all-reduce on the cuda backend, several ranks on one GPU. CI has no
//! GPU and does not run these (they are `#[ignore]`d). On a GPU machine:
//!
//! ```text
//! SYMM_BACKEND=cuda cargo test -p symm-tests --test gpu_all_reduce -- --ignored
//! ```
//!
//! Buffers are filled and read back with the CUDA driver (cudarc, loaded at run time).

use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_tests::*;

fn cuda_ranks(nranks: usize) -> Vec<symmComm_t> {
    let comms = init_all(nranks);
    assert_eq!(
        backend(comms[0]),
        "cuda",
        "run the GPU set with SYMM_BACKEND=cuda"
    );
    // SAFETY: device 0 exists (the comm was created on it); its primary context is retained by
    // the library for the process.
    unsafe {
        let device = result::device::get(0).unwrap();
        let context = result::primary_ctx::retain(device).unwrap();
        result::ctx::set_current(context).unwrap();
    }
    comms
}

fn upload(ptr: *mut u8, values: &[f32]) {
    // SAFETY: `ptr` is device memory from symmMemAlloc with room for `values`.
    unsafe { result::memcpy_htod_sync(ptr as sys::CUdeviceptr, values) }.unwrap();
}

fn download(ptr: *const u8, count: usize) -> Vec<f32> {
    let mut out = vec![0f32; count];
    // SAFETY: `ptr` is device memory from symmMemAlloc holding `count` floats.
    unsafe { result::memcpy_dtoh_sync(&mut out, ptr as sys::CUdeviceptr) }.unwrap();
    out
}

fn synchronize() {
    // SAFETY: a context is current (see `cuda_ranks`).
    unsafe { sys::cuCtxSynchronize() }.result().unwrap();
}

fn run_and_check(buffers: &[RankBuffer], count: usize, send: usize, recv: usize, seed: u64) {
    let nranks = buffers.len();
    let mut rng = Rng(seed);
    let inputs: Vec<Vec<f32>> = (0..nranks)
        .map(|_| (0..count).map(|_| rng.unit_f32()).collect())
        .collect();
    for (b, input) in buffers.iter().zip(&inputs) {
        // SAFETY: offsets inside the window (checked by the callers' sizes).
        upload(unsafe { b.base.add(send) }, input);
    }
    check(symmGroupStart(), null_mut());
    for b in buffers {
        // SAFETY: offsets inside the window.
        let (s, r) = unsafe { (b.base.add(send), b.base.add(recv)) };
        check(all_reduce_f32_sum(b.comm, s, r, count), b.comm);
    }
    check(symmGroupEnd(), null_mut());
    synchronize();
    // SAFETY: offsets inside the window.
    let results: Vec<Vec<f32>> = buffers
        .iter()
        .map(|b| download(unsafe { b.base.add(recv) }, count))
        .collect();
    assert_matches_f64_sum(&inputs, &results, &format!("{nranks} ranks, count {count}"));
}

#[test]
#[ignore = "needs a CUDA GPU: SYMM_BACKEND=cuda cargo test --test gpu_all_reduce -- --ignored"]
fn gpu_f32_sum_2_4_8_ranks_on_one_gpu() {
    for nranks in [2, 3, 4, 8] {
        let comms = cuda_ranks(nranks);
        let max = (1 << 20) + 5;
        let buffers = alloc_windows(&comms, 4 * (2 * max + 64));
        for (k, count) in [1usize, 7, 1023, 4099, max].into_iter().enumerate() {
            let seed = (nranks * 10 + k) as u64;
            run_and_check(&buffers, count, 0, 0, seed);
            run_and_check(&buffers, count, 16, 16, seed + 1);
            run_and_check(&buffers, count, 4, 4 * (count + 8), seed + 2);
        }
        teardown(buffers);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: SYMM_BACKEND=cuda cargo test --test gpu_all_reduce -- --ignored"]
fn gpu_same_buffers_1000_times() {
    let comms = cuda_ranks(8);
    let buffers = alloc_windows(&comms, 1 << 16);
    for iteration in 0..1000 {
        run_and_check(&buffers, 256, 0, 0, iteration);
    }
    teardown(buffers);
}

#[test]
#[ignore = "needs a CUDA GPU: SYMM_BACKEND=cuda cargo test --test gpu_all_reduce -- --ignored"]
fn gpu_missing_peer_raises_the_abort_word_instead_of_hanging() {
    // Default SYMM_TIMEOUT_MS (10 s) applies.
    let comms = cuda_ranks(2);
    let buffers = alloc_windows(&comms, 4096);
    let b = &buffers[0];
    let start = Instant::now();
    check(all_reduce_f32_sum(b.comm, b.base, b.base, 64), b.comm);
    synchronize();
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the kernel did not give up"
    );
    let mut ctx: *const c_void = std::ptr::null();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommGetDeviceContext(b.comm, b.window, &mut ctx) },
        b.comm,
    );
    let mut image = [0u8; 96];
    // SAFETY: the context is 96 bytes of device memory.
    unsafe { result::memcpy_dtoh_sync(&mut image, ctx as sys::CUdeviceptr) }.unwrap();
    let abort_flag = u64::from_ne_bytes(image[56..64].try_into().unwrap());
    let mut word = [0u32; 1];
    // SAFETY: the abort word is a u32 in device memory.
    unsafe { result::memcpy_dtoh_sync(&mut word, abort_flag) }.unwrap();
    assert_eq!(word[0], 1, "abort word not raised");
    teardown(buffers);
}
