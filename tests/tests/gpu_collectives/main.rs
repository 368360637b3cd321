//! The GPU set: every collective (the broadcast from every root), data type and operator on
//! the cuda backend, several ranks on one GPU, checked against references computed on the
//! host; CUDA-graph capture and replay; the bounded wait; the software work source. CI has no
//! GPU and does not run these (they are `#[ignore]`d). On a GPU machine, once per algorithm
//! choice:
//!
//! ```text
//! for a in auto ll oneshot twoshot pat; do
//!   SYMM_ALGO=$a SYMM_BACKEND=cuda cargo test -p symm-tests --test gpu_collectives -- --ignored
//! done
//! ```
//!
//! On the simulated GPU (`cargo xtask sim --test`), with knobs that shrink the set (every
//! kernel still runs): `SYMM_GPU_TEST_MAX_COUNT` (the largest count), `SYMM_GPU_TEST_REPEATS`
//! (repetitions), `SYMM_GPU_TEST_SUBSET=1` (each data type and operator at one rank count,
//! rotating through all of them, instead of at every one) and `SYMM_GPU_TEST_MAX_TILES` (the
//! software work source's largest tile count, with less work per tile).
//!
//! Buffers are filled and read back with the CUDA driver (cudarc, loaded at run time).
//!
//! The layout: this file holds the helpers every module uses (the ranks on the cuda backend,
//! copies to and from device memory, the knobs above) and the `gpu_test!` macro; `reference`
//! is the host reference the results are checked against and `sweep` the cases the data-type
//! sweeps run; the tests, by subject, are in `all_reduce`, `gather_scatter`, `point_to_point`,
//! `graphs`, `streams`, `failures`, `multi_process` and `kernels`; `per_rank` drives each rank
//! from its own thread; `probes` reads the simulated GPU's counters, with the tests that do.

use cudarc::driver::{result, sys};
use std::ptr::null_mut;
use symm::*;
use symm_tests::*;

/// A test that needs a CUDA GPU: ignored unless asked for (`--ignored`, or the `gpu` nextest
/// profile's `--run-ignored only`), with the command that runs it.
macro_rules! gpu_test {
    ($(#[$meta:meta])* fn $name:ident() $body:block) => {
        $(#[$meta])*
        #[test]
        #[ignore = "needs a CUDA GPU: SYMM_BACKEND=cuda cargo test --test gpu_collectives -- --ignored"]
        fn $name() $body
    };
}

mod all_reduce;
mod failures;
mod gather_scatter;
mod graphs;
mod kernels;
mod multi_process;
mod per_rank;
mod point_to_point;
mod probes;
mod reference;
mod streams;
mod sweep;

fn cuda_ranks(nranks: usize) -> Vec<symmComm_t> {
    let comms = init_all(nranks);
    assert_eq!(
        backend(comms[0]),
        "cuda",
        "run the GPU set with SYMM_BACKEND=cuda"
    );
    cuda_context();
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

fn upload_bytes(ptr: *mut u8, bytes: &[u8]) {
    // SAFETY: `ptr` is device memory from symmMemAlloc with room for `bytes`.
    unsafe { result::memcpy_htod_sync(ptr as sys::CUdeviceptr, bytes) }.unwrap();
}

fn download_bytes(ptr: *const u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: `ptr` is device memory from symmMemAlloc holding `len` bytes.
    unsafe { result::memcpy_dtoh_sync(&mut out, ptr as sys::CUdeviceptr) }.unwrap();
    out
}

/// The largest count the set checks: 1 Mi + 5 elements, or `SYMM_GPU_TEST_MAX_COUNT` (the
/// simulated GPU runs the set with a smaller one; never below 4100).
fn largest_count() -> usize {
    std::env::var("SYMM_GPU_TEST_MAX_COUNT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or((1 << 20) + 5, |n| n.max(4100))
}

/// `default` repetitions, or `SYMM_GPU_TEST_REPEATS` (the simulated GPU runs fewer).
fn repeats(default: u64) -> u64 {
    std::env::var("SYMM_GPU_TEST_REPEATS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(default)
}

/// Whether this run forces the low-latency all-reduce (`SYMM_ALGO=ll`).
fn forced_low_latency() -> bool {
    std::env::var("SYMM_ALGO").is_ok_and(|v| v == "ll")
}

/// `count` float32 or int32 elements, or under `SYMM_ALGO=ll` where they exceed the
/// low-latency buffers the largest count with an odd tail that fits them: for the tests whose
/// subject is not the size (streams, teardown, call sequences), so that they run under every
/// algorithm.
fn count_under_forced_algorithm(count: usize) -> usize {
    let fits = symm_device::sync::signal_pad::LL_MAX_BYTES / 4;
    if forced_low_latency() && count > fits {
        fits - 3
    } else {
        count
    }
}

/// Issue one call per rank (`issue(rank, buffer)`) in a group, then wait for the GPU.
fn run_group(issue: impl Fn(usize, &RankBuffer) -> symmResult_t, buffers: &[RankBuffer]) {
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        check(issue(rank, b), b.comm);
    }
    check(symmGroupEnd(), null_mut());
    synchronize();
}

/// Multiprocessors of `device`.
fn multiprocessors(device: i32) -> usize {
    let mut sms = 0;
    // SAFETY: writes one int of a device that exists.
    unsafe {
        sys::cuDeviceGetAttribute(
            &mut sms,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            result::device::get(device).unwrap(),
        )
        .result()
        .unwrap();
    }
    sms as usize
}
