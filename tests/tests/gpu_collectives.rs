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

use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_device::DataType;
use symm_device::numeric::dynamic::{decode, encode, representable};
use symm_tests::*;

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

fn run_and_check(buffers: &[RankBuffer], count: usize, send: usize, recv: usize, seed: u64) {
    let nranks = buffers.len();
    if forced_low_latency() && 4 * count > symm_device::sync::signal_pad::LL_MAX_BYTES {
        assert_low_latency_refuses(buffers, count, send, recv);
        return;
    }
    let inputs = random_inputs(nranks, count, seed);
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

gpu_test! {
    fn gpu_f32_sum_2_4_8_ranks_on_one_gpu() {
        for nranks in [2, 3, 4, 8] {
            let comms = cuda_ranks(nranks);
            let max = largest_count();
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
}

gpu_test! {
    fn gpu_same_buffers_1000_times() {
        let comms = cuda_ranks(8);
        let buffers = alloc_windows(&comms, 1 << 16);
        for iteration in 0..repeats(1000) {
            run_and_check(&buffers, 256, 0, 0, iteration);
        }
        teardown(buffers);
    }
}

gpu_test! {
    fn gpu_missing_peer_raises_the_abort_word_instead_of_hanging() {
        // Default SYMM_TIMEOUT_MS (10 s) applies.
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        let b = &buffers[0];
        let start = Instant::now();
        // Rank 0 launches alone while rank 1 shares the GPU: a separate launch, which needs a
        // non-blocking stream (the NULL stream is refused).
        let mut stream = null_mut();
        // SAFETY: a context is current (see `cuda_ranks`); the stream is destroyed below.
        unsafe { sys::cuStreamCreate(&mut stream, 1) }
            .result()
            .unwrap();
        let (f32_, sum) = (
            symmDataType_t::symmFloat32 as i32,
            symmRedOp_t::symmSum as i32,
        );
        let p = b.base as *mut c_void;
        check(
            symmAllReduce(p, p, 64, f32_, sum, b.comm, stream.cast()),
            b.comm,
        );
        synchronize();
        // SAFETY: created above, idle after the synchronize.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
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
        // Raised as a timeout that names the peer it waited for (rank 1).
        assert_eq!(
            word[0] & 0xFF,
            symm_device::symmetric::ABORT_TIMED_OUT,
            "abort word not raised as a timeout: {:#x}",
            word[0]
        );
        assert_eq!(
            symm_device::symmetric::timed_out_peer(word[0]),
            Some(1),
            "the abort word names the wrong peer: {:#x}",
            word[0]
        );
        teardown(buffers);
    }
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

fn encode_all(dtype: DataType, values: &[f64]) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut bytes = vec![0u8; values.len() * size];
    for (chunk, v) in bytes.chunks_mut(size).zip(values) {
        encode(dtype, *v, chunk);
    }
    bytes
}

fn decode_all(dtype: DataType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks(dtype.size_bytes())
        .map(|chunk| decode(dtype, chunk))
        .collect()
}

/// Threads for the sweeps' host-side work (inputs, encoding, the reference check): at the
/// largest count that work, not the GPU, is most of a sweep's time (3600 all-reduces of up
/// to 8 ranks x 8 MiB took 78.6 s on an H100 machine, one thread).
fn host_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
}

/// `[f(0), .., f(n - 1)]`, computed on up to [`host_threads`] threads.
fn parallel_map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = host_threads().min(n).max(1);
    let per = n.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        let parts: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || (t * per..((t + 1) * per).min(n)).map(f).collect()))
            .collect();
        parts
            .into_iter()
            .flat_map(|part| -> Vec<T> { part.join().expect("a host worker panicked") })
            .collect()
    })
}

/// The message of the first `i` in `0..n` (lowest index) for which `wrong(i)` has one, the
/// indices checked in parallel chunks.
fn first_wrong(n: usize, wrong: impl Fn(usize) -> Option<String> + Sync) -> Option<String> {
    let chunks = (host_threads() * 4).min(n).max(1);
    let per = n.div_ceil(chunks);
    parallel_map(chunks, |c| {
        (c * per..((c + 1) * per).min(n)).find_map(&wrong)
    })
    .into_iter()
    .flatten()
    .next()
}

/// Each rank's `count` inputs ([`input_value`] at `seed`), generated in parallel.
fn rank_inputs(dtype: DataType, nranks: usize, count: usize, seed: u64) -> Vec<Vec<f64>> {
    parallel_map(nranks, |r| {
        (0..count).map(|i| input_value(dtype, r, i, seed)).collect()
    })
}

/// Upload each rank's inputs, encoded as `dtype`, at `offset(rank)` of its window.
fn upload_inputs(
    buffers: &[RankBuffer],
    dtype: DataType,
    inputs: &[Vec<f64>],
    offset: impl Fn(usize) -> usize,
) {
    let encoded = parallel_map(inputs.len(), |r| encode_all(dtype, &inputs[r]));
    for (r, (b, bytes)) in buffers.iter().zip(&encoded).enumerate() {
        // SAFETY: offsets inside the window (the callers size it with window_bytes).
        upload_bytes(unsafe { b.base.add(offset(r)) }, bytes);
    }
}

/// `None` when every element `i` of `got` is the reduction with `op` of element `first + i`
/// of every rank's `inputs`; else the first wrong element, named with `case`.
fn wrong_reduction(
    dtype: DataType,
    op: i32,
    inputs: &[Vec<f64>],
    first: usize,
    got: &[f64],
    case: &str,
) -> Option<String> {
    assert!(inputs.len() <= MAX_TEST_RANKS);
    first_wrong(got.len(), |i| {
        let mut column = [0.0f64; MAX_TEST_RANKS];
        for (c, x) in column.iter_mut().zip(inputs) {
            *c = x[first + i];
        }
        let want = expected(dtype, op, &column[..inputs.len()]);
        (got[i] != want).then(|| format!("{case}: element {i}: got {}, expected {want}", got[i]))
    })
}

/// Most ranks a sweep runs (the largest of [`RANKS`]), for the reference check's stack column.
const MAX_TEST_RANKS: usize = {
    let mut most = 0;
    let mut i = 0;
    while i < RANKS.len() {
        if RANKS[i] > most {
            most = RANKS[i];
        }
        i += 1;
    }
    most
};

/// The sweeps' parallel host-side helpers (no GPU): results in order, the lowest wrong index
/// reported whichever chunk finds it, and a single wrong element anywhere is found.
#[test]
fn host_helpers_keep_order_and_find_the_first_wrong_element() {
    let n = 10_007;
    assert_eq!(
        parallel_map(n, |i| i * 3),
        (0..n).map(|i| i * 3).collect::<Vec<_>>()
    );
    assert_eq!(parallel_map(0, |i| i), Vec::<usize>::new());
    assert_eq!(first_wrong(n, |_| None::<String>), None);
    let wrong_from =
        |k: usize| move |i: usize| (i >= k && i.is_multiple_of(7)).then(|| i.to_string());
    assert_eq!(first_wrong(n, wrong_from(9_000)), Some("9002".to_string()));
    assert_eq!(first_wrong(n, wrong_from(0)), Some("0".to_string()));
    let dtype = DataType::Float32;
    let inputs = rank_inputs(dtype, 3, 2 * n, 7);
    let got: Vec<f64> = (0..n)
        .map(|i| {
            expected(
                dtype,
                0,
                &[inputs[0][n + i], inputs[1][n + i], inputs[2][n + i]],
            )
        })
        .collect();
    assert_eq!(wrong_reduction(dtype, 0, &inputs, n, &got, "c"), None);
    for bad in [0, n / 2, n - 1] {
        let mut off = got.clone();
        off[bad] += 1.0;
        let message = wrong_reduction(dtype, 0, &inputs, n, &off, "c").expect("caught");
        assert!(
            message.starts_with(&format!("c: element {bad}:")),
            "{message}"
        );
    }
    // The wrong segment (offset) is caught too.
    assert!(wrong_reduction(dtype, 0, &inputs, 0, &got, "c").is_some());
}

fn is_integer(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::Int8
            | DataType::Uint8
            | DataType::Int32
            | DataType::Uint32
            | DataType::Int64
            | DataType::Uint64
    )
}

/// Inputs whose sums, products, minima and maxima are exact in every type for up to 8 ranks
/// (|sum| <= 8 or <= 16 unsigned, products of {-1, 0, 1} or wrapping integers), so the
/// expected value is exact: {-1, 0, 1}, or {0, 1, 2} for unsigned types.
fn input_value(dtype: DataType, rank: usize, index: usize, seed: u64) -> f64 {
    let pick = (index as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(seed ^ (rank as u64 * 0xBF58_476D))
        >> 61;
    let v = (pick % 3) as f64;
    if matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64) {
        v
    } else {
        v - 1.0
    }
}

/// The reduction of `column` with `op` as the kernels define it: integers exact then wrapped
/// (avg: exact sum / n, truncated); floats accumulated in f32 (f64 for float64) then rounded
/// to the type, avg = sum / n in the accumulator.
fn expected(dtype: DataType, op: i32, column: &[f64]) -> f64 {
    let n = column.len() as f64;
    let sum: f64 = column.iter().sum();
    let value = match op {
        0 => sum,
        1 => column.iter().product(),
        2 => column.iter().copied().fold(f64::MIN, f64::max),
        3 => column.iter().copied().fold(f64::MAX, f64::min),
        _ if is_integer(dtype) => (sum / n).trunc(),
        _ if dtype == DataType::Float64 => sum / n,
        _ => (sum as f32 / n as f32) as f64,
    };
    representable(dtype, value)
}

/// Where a case puts its buffers, in bytes from the window base.
#[derive(Clone, Copy, Debug)]
struct At {
    send: usize,
    recv: usize,
}

impl At {
    /// Rank `rank`'s offset for the buffer that, in place, is its own `segment`-byte segment
    /// of the other buffer (all-gather's send, reduce-scatter's receive); `out_of_place`
    /// otherwise.
    fn rank_offset(self, rank: usize, segment: usize, out_of_place: usize) -> usize {
        if self.send == self.recv {
            self.send + rank * segment
        } else {
            out_of_place
        }
    }
}

/// The placements every case runs with: in place and aligned, out of place and aligned, out
/// of place at offsets that are multiples of the element size but not of 16.
fn placements(size: usize, send_bytes: usize, recv_bytes: usize) -> [At; 3] {
    let region = send_bytes.max(recv_bytes).next_multiple_of(256);
    [
        At { send: 0, recv: 0 },
        At {
            send: 256,
            recv: 512 + region,
        },
        At {
            send: 3 * size,
            recv: 512 + region + 5 * size,
        },
    ]
}

const RANKS: [usize; 4] = [2, 3, 4, 8];
/// The counts every collective is checked at: small, odd tails, and [`largest_count`].
fn counts() -> [usize; 5] {
    [1, 7, 1023, 4099, largest_count()]
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

/// `SYMM_GPU_TEST_SUBSET=1`: run case `index` of a rank-count sweep only at one rank count
/// (`index` rotates through them), so every kernel still runs, at a quarter of the cost.
fn runs_at(nranks: usize, index: usize) -> bool {
    let subset = std::env::var("SYMM_GPU_TEST_SUBSET").is_ok_and(|v| v == "1");
    !subset || RANKS[index % RANKS.len()] == nranks
}

/// Window bytes for the largest case of any collective: 8-byte elements, the biggest count,
/// up to 8 ranks' segments for all-gather and reduce-scatter.
fn window_bytes(nranks: usize, count: usize) -> usize {
    2 * 8 * nranks * count + 4096
}

/// Under `SYMM_ALGO=ll`, an all-reduce of more than the LL buffers hold is refused on every
/// rank with `symmInvalidArgument` (at the call or at the group's end), nothing runs, and the
/// communicators stay usable (the callers go on with smaller counts).
fn assert_low_latency_refuses(buffers: &[RankBuffer], count: usize, send: usize, recv: usize) {
    check(symmGroupStart(), null_mut());
    let mut refused = 0;
    for b in buffers {
        // SAFETY: offsets inside the window.
        let (s, r) = unsafe { (b.base.add(send), b.base.add(recv)) };
        let result = all_reduce_f32_sum(b.comm, s, r, count);
        if result != symmResult_t::symmSuccess {
            assert_eq!(
                result,
                symmResult_t::symmInvalidArgument,
                "{}",
                last_error(b.comm)
            );
            refused += 1;
        }
    }
    let end = symmGroupEnd();
    assert!(
        refused == buffers.len() || end == symmResult_t::symmInvalidArgument,
        "SYMM_ALGO=ll with {count} f32: {refused} of {} calls refused, group end {end:?}",
        buffers.len()
    );
    for b in buffers {
        assert_eq!(
            async_error(b.comm),
            symmResult_t::symmSuccess,
            "{}",
            last_error(b.comm)
        );
    }
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

gpu_test! {
    fn gpu_all_reduce_every_dtype_and_op() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let buffers = alloc_windows(&comms, window_bytes(1, largest_count()));
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for op in 0..5 {
                    if !runs_at(nranks, d * 5 + op as usize) {
                        continue;
                    }
                    for (k, count) in counts().into_iter().enumerate() {
                        if forced_low_latency()
                            && count * size > symm_device::sync::signal_pad::LL_MAX_BYTES
                        {
                            // SYMM_ALGO=ll refuses payloads beyond the LL buffers (plan tests).
                            continue;
                        }
                        for at in placements(size, count * size, count * size) {
                            let seed = (nranks * 1000 + k * 10 + op as usize) as u64;
                            let inputs = rank_inputs(dtype, nranks, count, seed);
                            upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                            run_group(
                                |_, b| {
                                    // SAFETY: offsets inside the window.
                                    let (s, r) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
                                    symmAllReduce(
                                        s.cast(),
                                        r.cast(),
                                        count,
                                        dtype as i32,
                                        op,
                                        b.comm,
                                        null_mut(),
                                    )
                                },
                                &buffers,
                            );
                            // SAFETY: offsets inside the window.
                            let outputs: Vec<Vec<u8>> = buffers
                                .iter()
                                .map(|b| download_bytes(unsafe { b.base.add(at.recv) }, count * size))
                                .collect();
                            let case = format!("{nranks} ranks {dtype:?} op {op} count {count} {at:?}");
                            for out in &outputs[1..] {
                                assert!(out == &outputs[0], "{case}: ranks differ");
                            }
                            let got = decode_all(dtype, &outputs[0]);
                            if let Some(wrong) = wrong_reduction(dtype, op, &inputs, 0, &got, &case) {
                                panic!("{wrong}");
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    /// `symmReduce` of every data type × operator (rotating over the rank counts), every root in
    /// turn, every placement: the root's result against the reference; every other rank's send
    /// buffer unchanged and its receive buffer (NULL on every other call) untouched.
    fn gpu_reduce_every_dtype_and_op_to_every_root() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let buffers = alloc_windows(&comms, window_bytes(1, largest_count()));
            let mut case_index = 0usize;
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for op in 0..5 {
                    if !runs_at(nranks, d * 5 + op as usize) {
                        continue;
                    }
                    for (k, count) in counts().into_iter().enumerate() {
                        for at in placements(size, count * size, count * size) {
                            let root = case_index % nranks;
                            case_index += 1;
                            let seed = (nranks * 1000 + k * 10 + op as usize) as u64;
                            let inputs = rank_inputs(dtype, nranks, count, seed);
                            upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                            let stale = vec![0xA5u8; count * size];
                            if at.recv != at.send {
                                for b in &buffers {
                                    // SAFETY: offsets inside the window.
                                    upload_bytes(unsafe { b.base.add(at.recv) }, &stale);
                                }
                            }
                            let null_off_root = case_index.is_multiple_of(2);
                            run_group(
                                |rank, b| {
                                    // SAFETY: offsets inside the window.
                                    let (s, r) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
                                    let r = if rank != root && null_off_root {
                                        null_mut()
                                    } else {
                                        r
                                    };
                                    symmReduce(
                                        s.cast(),
                                        r.cast(),
                                        count,
                                        dtype as i32,
                                        op,
                                        root as i32,
                                        b.comm,
                                        null_mut(),
                                    )
                                },
                                &buffers,
                            );
                            let case = format!(
                                "reduce: {nranks} ranks {dtype:?} op {op} count {count} root {root} {at:?}"
                            );
                            // SAFETY: offsets inside the window.
                            let out = download_bytes(
                                unsafe { buffers[root].base.add(at.recv) },
                                count * size,
                            );
                            let got = decode_all(dtype, &out);
                            if let Some(wrong) = wrong_reduction(dtype, op, &inputs, 0, &got, &case) {
                                panic!("{wrong}");
                            }
                            for (rank, b) in buffers.iter().enumerate() {
                                if rank == root {
                                    continue;
                                }
                                // SAFETY: offsets inside the window.
                                let sent = download_bytes(unsafe { b.base.add(at.send) }, count * size);
                                assert!(
                                    sent == encode_all(dtype, &inputs[rank]),
                                    "{case}: rank {rank}'s send buffer changed"
                                );
                                if at.recv != at.send {
                                    // SAFETY: offsets inside the window.
                                    let received =
                                        download_bytes(unsafe { b.base.add(at.recv) }, count * size);
                                    assert!(
                                        received == stale,
                                        "{case}: rank {rank}'s receive buffer was written"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    fn gpu_all_gather_and_reduce_scatter_every_dtype() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let max = largest_count();
            let buffers = alloc_windows(&comms, window_bytes(nranks, max));
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for (k, count) in counts().into_iter().enumerate() {
                    if !runs_at(nranks, d + k) {
                        continue;
                    }
                    let segment = count * size;
                    for at in placements(size, nranks * segment, nranks * segment) {
                        let seed = (nranks * 100 + count) as u64;
                        // All-gather: rank r's `count` elements land in segment r of every rank.
                        let inputs = rank_inputs(dtype, nranks, count, seed);
                        upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                        if at.send == at.recv {
                            // In place: the send buffer is the rank's own segment of the output.
                            upload_inputs(&buffers, dtype, &inputs, |r| at.recv + r * segment);
                        }
                        run_group(
                            |rank, b| {
                                let send = at.rank_offset(rank, segment, at.send);
                                // SAFETY: offsets inside the window.
                                let (s, r) = unsafe { (b.base.add(send), b.base.add(at.recv)) };
                                symmAllGather(
                                    s.cast(),
                                    r.cast(),
                                    count,
                                    dtype as i32,
                                    b.comm,
                                    null_mut(),
                                )
                            },
                            &buffers,
                        );
                        let case = format!("all_gather {nranks} ranks {dtype:?} count {count} {at:?}");
                        let all: Vec<u8> =
                            parallel_map(nranks, |r| encode_all(dtype, &inputs[r])).concat();
                        for b in &buffers {
                            // SAFETY: offsets inside the window.
                            let out = download_bytes(unsafe { b.base.add(at.recv) }, nranks * segment);
                            assert!(out == all, "{case}");
                        }

                        // Reduce-scatter (sum): rank r receives the sum of segment r over ranks.
                        let inputs = rank_inputs(dtype, nranks, nranks * count, seed + 1);
                        upload_inputs(&buffers, dtype, &inputs, |_| at.send);
                        run_group(
                            |rank, b| {
                                let recv = at.rank_offset(rank, segment, at.recv);
                                // SAFETY: offsets inside the window.
                                let (s, r) = unsafe { (b.base.add(at.send), b.base.add(recv)) };
                                symmReduceScatter(
                                    s.cast(),
                                    r.cast(),
                                    count,
                                    dtype as i32,
                                    0,
                                    b.comm,
                                    null_mut(),
                                )
                            },
                            &buffers,
                        );
                        let case =
                            format!("reduce_scatter {nranks} ranks {dtype:?} count {count} {at:?}");
                        for (rank, b) in buffers.iter().enumerate() {
                            let recv = at.rank_offset(rank, segment, at.recv);
                            // SAFETY: offsets inside the window.
                            let got = decode_all(
                                dtype,
                                &download_bytes(unsafe { b.base.add(recv) }, segment),
                            );
                            let case = format!("{case}: rank {rank}");
                            let first = rank * count;
                            if let Some(wrong) = wrong_reduction(dtype, 0, &inputs, first, &got, &case)
                            {
                                panic!("{wrong}");
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    /// Broadcast of every data type, at every count and placement, the root rotating so that each
    /// rank count sees every root: the root's bytes, exactly, on every rank; nothing written past
    /// the receive buffer; the other ranks' send buffers (NULL on some calls) untouched.
    fn gpu_broadcast_every_dtype_from_every_root() {
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let max = largest_count();
            let buffers = alloc_windows(&comms, window_bytes(1, max));
            let mut case_index = 0usize;
            for (d, dtype) in DataType::ALL.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for (k, count) in counts().into_iter().enumerate() {
                    if !runs_at(nranks, d + k) {
                        continue;
                    }
                    let bytes = count * size;
                    for at in placements(size, bytes, bytes) {
                        let root = case_index % nranks;
                        case_index += 1;
                        let seed = (nranks * 100 + count + d) as u64;
                        let inputs: Vec<Vec<u8>> = parallel_map(nranks, |r| {
                            let values: Vec<f64> =
                                (0..count).map(|i| input_value(dtype, r, i, seed)).collect();
                            encode_all(dtype, &values)
                        });
                        let guard = vec![0x5Au8; 16];
                        for (b, input) in buffers.iter().zip(&inputs) {
                            // SAFETY: offsets inside the window (window_bytes).
                            unsafe {
                                if at.send != at.recv {
                                    upload_bytes(b.base.add(at.recv), &vec![0xA5; bytes]);
                                }
                                upload_bytes(b.base.add(at.send), input);
                                upload_bytes(b.base.add(at.recv + bytes), &guard);
                            }
                        }
                        run_group(
                            |rank, b| {
                                // SAFETY: offsets inside the window.
                                let (s, r) = unsafe { (b.base.add(at.send), b.base.add(at.recv)) };
                                let s = if rank != root && case_index.is_multiple_of(2) {
                                    std::ptr::null_mut()
                                } else {
                                    s
                                };
                                symmBroadcast(
                                    s.cast(),
                                    r.cast(),
                                    count,
                                    dtype as i32,
                                    root as i32,
                                    b.comm,
                                    null_mut(),
                                )
                            },
                            &buffers,
                        );
                        let case = format!(
                            "broadcast {nranks} ranks {dtype:?} count {count} root {root} {at:?}"
                        );
                        for (rank, b) in buffers.iter().enumerate() {
                            // SAFETY: offsets inside the window.
                            let out = download_bytes(unsafe { b.base.add(at.recv) }, bytes + 16);
                            assert!(out[..bytes] == inputs[root][..], "{case}: rank {rank}");
                            assert!(
                                out[bytes..] == guard[..],
                                "{case}: rank {rank}: past the end"
                            );
                            if at.send != at.recv {
                                // SAFETY: offsets inside the window.
                                let sent = download_bytes(unsafe { b.base.add(at.send) }, bytes);
                                assert!(sent == inputs[rank], "{case}: rank {rank}'s sendbuff");
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    /// All-to-all, gather and scatter of a data type of each size, at every count, the root
    /// rotating: every rank's send and receive regions (and 16 guard bytes after them) compared
    /// byte for byte with a reference built from the inputs; the ranks that do not use a buffer
    /// pass NULL for it on every other call.
    fn gpu_all_to_all_gather_and_scatter() {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Coll {
            AllToAll,
            Gather,
            Scatter,
        }
        for nranks in RANKS {
            let comms = cuda_ranks(nranks);
            let buffers = alloc_windows(&comms, window_bytes(nranks, largest_count().min(70_001)));
            let mut case_index = 0usize;
            let dtypes = [
                DataType::Uint8,
                DataType::Bfloat16,
                DataType::Float32,
                DataType::Float64,
            ];
            // Whole windows are compared on the host: the largest count is kept to 70001.
            let counts = counts().map(|c| c.min(70_001));
            for (d, dtype) in dtypes.into_iter().enumerate() {
                let size = dtype.size_bytes();
                for (k, count) in counts.into_iter().enumerate() {
                    if !runs_at(nranks, d + k) {
                        continue;
                    }
                    let whole = nranks * count * size;
                    // The send region first, one element past 64 bytes; the receive region after it.
                    let send = 64 + size;
                    let recv = (send + whole + 64).next_multiple_of(16) + size;
                    let span = recv + whole + 16;
                    for coll in [Coll::AllToAll, Coll::Gather, Coll::Scatter] {
                        let root = case_index % nranks;
                        case_index += 1;
                        let before: Vec<Vec<u8>> = parallel_map(nranks, |r| {
                            (0..span)
                                .map(|i| (i * 131 + r * 7 + case_index * 13) as u8)
                                .collect()
                        });
                        for (b, bytes) in buffers.iter().zip(&before) {
                            upload_bytes(b.base, bytes);
                        }
                        let null_off_root = case_index.is_multiple_of(2);
                        run_group(
                            |rank, b| {
                                // SAFETY: offsets inside the window (window_bytes).
                                let (s, d) = unsafe { (b.base.add(send), b.base.add(recv)) };
                                let unused = rank != root && null_off_root;
                                match coll {
                                    Coll::AllToAll => symmAlltoAll(
                                        s.cast(),
                                        d.cast(),
                                        count,
                                        dtype as i32,
                                        b.comm,
                                        null_mut(),
                                    ),
                                    Coll::Gather => symmGather(
                                        s.cast(),
                                        if unused { null_mut() } else { d.cast() },
                                        count,
                                        dtype as i32,
                                        root as i32,
                                        b.comm,
                                        null_mut(),
                                    ),
                                    Coll::Scatter => symmScatter(
                                        if unused { null_mut() } else { s.cast() },
                                        d.cast(),
                                        count,
                                        dtype as i32,
                                        root as i32,
                                        b.comm,
                                        null_mut(),
                                    ),
                                }
                            },
                            &buffers,
                        );
                        let share = count * size;
                        let mut want = before.clone();
                        match coll {
                            Coll::AllToAll => {
                                for (p, window) in want.iter_mut().enumerate() {
                                    for (r, sender) in before.iter().enumerate() {
                                        window[recv + r * share..][..share]
                                            .copy_from_slice(&sender[send + p * share..][..share]);
                                    }
                                }
                            }
                            Coll::Gather => {
                                for (r, sender) in before.iter().enumerate() {
                                    want[root][recv + r * share..][..share]
                                        .copy_from_slice(&sender[send..][..share]);
                                }
                            }
                            Coll::Scatter => {
                                for (p, window) in want.iter_mut().enumerate() {
                                    window[recv..][..share]
                                        .copy_from_slice(&before[root][send + p * share..][..share]);
                                }
                            }
                        }
                        let case =
                            format!("{coll:?} {nranks} ranks {dtype:?} count {count} root {root}");
                        for (rank, b) in buffers.iter().enumerate() {
                            let got = download_bytes(b.base, span);
                            if let Some(at) = (0..span).find(|&i| got[i] != want[rank][i]) {
                                panic!(
                                    "{case}: rank {rank}, byte {at}: {} instead of {}",
                                    got[at], want[rank][at]
                                );
                            }
                        }
                    }
                }
            }
            teardown(buffers);
        }
    }
}

gpu_test! {
    fn gpu_graph_capture_then_replay_with_new_inputs() {
        let nranks = 4;
        // An odd count with a tail; under SYMM_ALGO=ll, one that fits the LL buffers.
        let count = if forced_low_latency() { 4091 } else { 4099 };
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 4 * count + 4096);
        replay_graph(
            &buffers,
            repeats(200),
            |stream| {
                check(symmGroupStart(), null_mut());
                for b in &buffers {
                    let r = symmAllReduce(
                        b.base.cast(),
                        b.base.cast(),
                        count,
                        DataType::Float32 as i32,
                        0,
                        b.comm,
                        stream.cast(),
                    );
                    check(r, b.comm);
                }
                check(symmGroupEnd(), null_mut());
            },
            |replay, run| {
                let inputs = random_inputs(nranks, count, replay);
                for (b, input) in buffers.iter().zip(&inputs) {
                    upload(b.base, input);
                }
                run();
                let results: Vec<Vec<f32>> = buffers.iter().map(|b| download(b.base, count)).collect();
                assert_matches_f64_sum(&inputs, &results, &format!("graph replay {replay}"));
            },
        );
        teardown(buffers);
    }
}

gpu_test! {
    /// A reduce, a gather, a scatter and an all-to-all (each its own group over 4 ranks, roots 1,
    /// 2 and 3) captured in one graph, replayed with new int32 inputs each time: every result
    /// exact, every replay.
    fn gpu_graph_capture_of_rooted_and_segment_collectives() {
        let nranks: usize = 4;
        let count: usize = 257;
        let int32 = DataType::Int32 as i32;
        let whole = 4 * nranks * count;
        // The send region, then the receive regions of the reduce, gather, scatter, all-to-all.
        let region = whole.next_multiple_of(256);
        let (send, reduced, gathered, scattered, exchanged) =
            (0, region, 2 * region, 3 * region, 4 * region);
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 5 * region + 4096);
        let (reduce_root, gather_root, scatter_root) = (1usize, 2usize, 3usize);
        let at = |b: &RankBuffer, offset: usize| -> *mut c_void {
            // SAFETY: offsets inside the window (5 regions).
            unsafe { b.base.add(offset).cast() }
        };
        let ints = |bytes: Vec<u8>| -> Vec<i32> {
            bytes
                .chunks(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        };
        replay_graph(
            &buffers,
            repeats(50),
            |stream| {
                let s = stream.cast();
                for call in 0..4 {
                    check(symmGroupStart(), null_mut());
                    for b in &buffers {
                        let r = match call {
                            0 => symmReduce(
                                at(b, send),
                                at(b, reduced),
                                count,
                                int32,
                                0,
                                reduce_root as i32,
                                b.comm,
                                s,
                            ),
                            1 => symmGather(
                                at(b, send),
                                at(b, gathered),
                                count,
                                int32,
                                gather_root as i32,
                                b.comm,
                                s,
                            ),
                            2 => symmScatter(
                                at(b, send),
                                at(b, scattered),
                                count,
                                int32,
                                scatter_root as i32,
                                b.comm,
                                s,
                            ),
                            _ => symmAlltoAll(at(b, send), at(b, exchanged), count, int32, b.comm, s),
                        };
                        check(r, b.comm);
                    }
                    check(symmGroupEnd(), null_mut());
                }
            },
            |replay, run| {
                let mut rng = Rng(replay + 1);
                let inputs: Vec<Vec<i32>> = (0..nranks)
                    .map(|_| (0..nranks * count).map(|_| rng.next_u64() as i32).collect())
                    .collect();
                for (b, input) in buffers.iter().zip(&inputs) {
                    let bytes: Vec<u8> = input.iter().flat_map(|v| v.to_ne_bytes()).collect();
                    upload_bytes(at(b, send).cast(), &bytes);
                }
                run();
                let case = format!("graph replay {replay}");
                let sum: Vec<i32> = (0..count)
                    .map(|i| inputs.iter().fold(0i32, |a, x| a.wrapping_add(x[i])))
                    .collect();
                let got = ints(download_bytes(
                    at(&buffers[reduce_root], reduced).cast(),
                    4 * count,
                ));
                assert!(got == sum, "{case}: reduce");
                let got = ints(download_bytes(
                    at(&buffers[gather_root], gathered).cast(),
                    whole,
                ));
                let want: Vec<i32> = inputs.iter().flat_map(|x| x[..count].to_vec()).collect();
                assert!(got == want, "{case}: gather");
                for (p, b) in buffers.iter().enumerate() {
                    let got = ints(download_bytes(at(b, scattered).cast(), 4 * count));
                    assert!(
                        got == inputs[scatter_root][p * count..][..count],
                        "{case}: scatter to {p}"
                    );
                    let got = ints(download_bytes(at(b, exchanged).cast(), whole));
                    let want: Vec<i32> = inputs
                        .iter()
                        .flat_map(|x| x[p * count..][..count].to_vec())
                        .collect();
                    assert!(got == want, "{case}: all-to-all at {p}");
                }
            },
        );
        teardown(buffers);
    }
}

/// Capture `issue(stream)` (calls on a new stream) into a CUDA graph, then `replays` times run
/// `replay(k, run)`, where `run` launches the graph and waits for it; then every rank's
/// asynchronous error must be success.
/// Every rank sends `count` f32 to each rank `shift` ahead and receives from the rank `shift`
/// behind, for each shift of `shifts` in turn, in one group over `buffers`: rank `r`'s `k`-th
/// message leaves from slot `k` of its window and lands in slot `shifts.len() + k` (slots of
/// `count + 5` elements, so that the two sides' offsets differ from the collectives' layout).
fn issue_ring(buffers: &[RankBuffer], count: usize, shifts: &[usize], stream: sys::CUstream) {
    let nranks = buffers.len();
    let slot = count + 5;
    check(symmGroupStart(), null_mut());
    for (rank, b) in buffers.iter().enumerate() {
        for (k, shift) in shifts.iter().enumerate() {
            let to = (rank + shift) % nranks;
            let from = (rank + nranks - shift % nranks) % nranks;
            // SAFETY: slots inside the window (sized by the callers).
            let (send, recv) = unsafe {
                (
                    b.base.add(4 * k * slot),
                    b.base.add(4 * (shifts.len() + k) * slot),
                )
            };
            let f32_ = DataType::Float32 as i32;
            let s = stream.cast();
            check(
                symmSend(send.cast(), count, f32_, to as i32, b.comm, s),
                b.comm,
            );
            check(
                symmRecv(recv.cast(), count, f32_, from as i32, b.comm, s),
                b.comm,
            );
        }
    }
    check(symmGroupEnd(), null_mut());
}

/// Check the receive slots of [`issue_ring`] against the inputs each rank sent (`inputs[r][k]`
/// its `k`-th message).
fn check_ring(
    buffers: &[RankBuffer],
    count: usize,
    shifts: &[usize],
    inputs: &[Vec<Vec<f32>>],
    what: &str,
) {
    let nranks = buffers.len();
    let slot = count + 5;
    for (rank, b) in buffers.iter().enumerate() {
        for (k, shift) in shifts.iter().enumerate() {
            let from = (rank + nranks - shift % nranks) % nranks;
            // SAFETY: a slot inside the window.
            let got = download(unsafe { b.base.add(4 * (shifts.len() + k) * slot) }, count);
            assert!(
                got == inputs[from][k],
                "{what}: rank {rank}, message {k} from rank {from} (count {count})"
            );
        }
    }
}

/// Random messages, `shifts.len()` per rank, uploaded into the send slots of [`issue_ring`].
fn ring_inputs(
    buffers: &[RankBuffer],
    count: usize,
    shifts: &[usize],
    seed: u64,
) -> Vec<Vec<Vec<f32>>> {
    let slot = count + 5;
    buffers
        .iter()
        .enumerate()
        .map(|(rank, b)| {
            (0..shifts.len())
                .map(|k| {
                    let values =
                        random_inputs(1, count, seed * 1000 + (rank * 64 + k) as u64).remove(0);
                    // SAFETY: a slot inside the window.
                    upload(unsafe { b.base.add(4 * k * slot) }, &values);
                    values
                })
                .collect()
        })
        .collect()
}

gpu_test! {
    /// Sends and receives between ranks of one GPU in groups (one launch serving every rank):
    /// rings both ways and to oneself, empty messages, odd tails, messages on four channels, and
    /// more sends to one peer than a channel has slots; repeated on the same windows, exact.
    fn gpu_send_and_recv_rings_on_one_gpu() {
        let nranks = 4;
        let comms = cuda_ranks(nranks);
        let largest = 300_017;
        let buffers = alloc_windows(&comms, 4 * 2 * 12 * (largest + 5) + 4096);
        let cases: [(usize, Vec<usize>); 5] = [
            (0, vec![1, 3]),
            (1, vec![1, 3, 0]),
            (4099, vec![1, 2, 3]),
            (largest, vec![1, 3]),
            (1029, vec![1; 11]),
        ];
        for round in 0..repeats(3) {
            for (count, shifts) in &cases {
                let inputs = ring_inputs(&buffers, *count, shifts, round);
                issue_ring(&buffers, *count, shifts, null_mut());
                synchronize();
                check_ring(&buffers, *count, shifts, &inputs, &format!("round {round}"));
            }
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// A group of sends and receives (a ring both ways) captured in a graph and replayed with new
    /// inputs: every replay pairs anew (the sequence numbers live in device memory), exact.
    fn gpu_graph_capture_of_send_and_recv() {
        let nranks = 4;
        let count = 70_001;
        let shifts = [1, 3];
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 4 * 4 * (count + 5) + 4096);
        replay_graph(
            &buffers,
            repeats(50),
            |stream| issue_ring(&buffers, count, &shifts, stream),
            |replay, run| {
                let inputs = ring_inputs(&buffers, count, &shifts, replay + 7);
                run();
                check_ring(
                    &buffers,
                    count,
                    &shifts,
                    &inputs,
                    &format!("graph replay {replay}"),
                );
            },
        );
        teardown(buffers);
    }
}

gpu_test! {
    /// All-to-all-v with its counts in device memory, 4 ranks on one GPU: a large call (many
    /// blocks, segments of odd lengths) checked against the reference, then a group captured in a
    /// graph and replayed 30 times with new counts and data written before each replay: the
    /// kernel reads the counts at each replay, no host synchronization, exact.
    fn gpu_all_to_all_v_with_device_counts_and_graph_replays() {
        let nranks = 4;
        let element = 4usize;
        let bound = 100_003usize;
        let (send, recv) = (0usize, (bound * element).div_ceil(256) * 256);
        let table = recv + (bound * element).div_ceil(256) * 256;
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, table + 4096);
        let f32_type = symmDataType_t::symmFloat32 as i32;
        let counts_of = |seed: u64| -> Vec<Vec<i64>> {
            let mut rng = Rng(seed);
            let share = (bound / nranks) as u64;
            (0..nranks)
                .map(|_| {
                    (0..nranks)
                        .map(|_| match rng.next_u64() % 4 {
                            0 => 0,
                            1 => share as i64,
                            _ => (rng.next_u64() % (share + 1)) as i64,
                        })
                        .collect()
                })
                .collect()
        };
        let plant = |seed: u64, counts: &[Vec<i64>]| -> Vec<Vec<u8>> {
            buffers
                .iter()
                .enumerate()
                .map(|(rank, b)| {
                    let data: Vec<u8> = (0..bound * element)
                        .map(|i| (i * 5 + rank * 17 + seed as usize * 3 + i / 509) as u8)
                        .collect();
                    let row: Vec<u8> = counts[rank].iter().flat_map(|v| v.to_ne_bytes()).collect();
                    // SAFETY: offsets inside the window.
                    unsafe {
                        put_bytes(b.base.add(send), &data);
                        put_bytes(b.base.add(table), &row);
                    }
                    data
                })
                .collect()
        };
        let check_all = |counts: &[Vec<i64>], data: &[Vec<u8>], what: &str| {
            for (rank, b) in buffers.iter().enumerate() {
                let mut want = Vec::new();
                let mut rows = vec![0i64; 2 * nranks];
                for from in 0..nranks {
                    let start = counts[from][..rank].iter().sum::<i64>() as usize * element;
                    let n = counts[from][rank] as usize * element;
                    rows[from] = counts[from][rank];
                    rows[nranks + from] = (want.len() / element) as i64;
                    want.extend_from_slice(&data[from][start..start + n]);
                }
                // SAFETY: offsets inside the window.
                let (got, got_table) = unsafe {
                    (
                        get_bytes(b.base.add(recv), want.len()),
                        get_bytes(b.base.add(table + 8 * nranks), 16 * nranks),
                    )
                };
                assert!(got == want, "{what}: rank {rank}'s received segments");
                let got_rows: Vec<i64> = got_table
                    .chunks(8)
                    .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                assert_eq!(got_rows, rows, "{what}: rank {rank}'s rows 1 and 2");
            }
        };
        let issue = |stream: sys::CUstream| {
            check(symmGroupStart(), null_mut());
            for b in &buffers {
                // SAFETY: offsets inside the window.
                let result = unsafe {
                    symmAlltoAllvDevice(
                        b.base.add(send).cast(),
                        bound,
                        b.base.add(recv).cast(),
                        bound,
                        b.base.add(table).cast(),
                        f32_type,
                        b.comm,
                        stream.cast(),
                    )
                };
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
        };
        let counts = counts_of(1);
        let data = plant(1, &counts);
        issue(null_mut());
        // SAFETY: a context is current (the windows were made in it).
        unsafe { sys::cuCtxSynchronize() }.result().unwrap();
        check_all(&counts, &data, "a call");
        replay_graph(&buffers, repeats(30), issue, |replay, run| {
            let counts = counts_of(replay + 2);
            let data = plant(replay + 2, &counts);
            run();
            check_all(&counts, &data, &format!("graph replay {replay}"));
        });
        teardown(buffers);
    }
}

fn replay_graph(
    buffers: &[RankBuffer],
    replays: u64,
    issue: impl FnOnce(sys::CUstream),
    mut replay: impl FnMut(u64, &dyn Fn()),
) {
    // SAFETY: stream, graph and exec handles are created, used and destroyed here, in the
    // current context.
    unsafe {
        let mut stream = null_mut();
        sys::cuStreamCreate(&mut stream, 0).result().unwrap();
        let capture = Capture::begin(stream);
        issue(stream);
        let graph = capture.end();
        let mut exec = null_mut();
        sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .result()
            .unwrap();
        for k in 0..replays {
            replay(k, &|| {
                sys::cuGraphLaunch(exec, stream).result().unwrap();
                sys::cuStreamSynchronize(stream).result().unwrap();
            });
        }
        sys::cuGraphExecDestroy(exec).result().unwrap();
        sys::cuGraphDestroy(graph).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    for b in buffers {
        let mut error = symmResult_t::symmSuccess;
        // SAFETY: valid out-pointer.
        check(unsafe { symmCommGetAsyncError(b.comm, &mut error) }, b.comm);
        assert_eq!(error, symmResult_t::symmSuccess);
    }
}

/// A stream capture in the global mode (as PyTorch's graphs capture), ended when dropped: a
/// test that fails inside it would otherwise leave it open, and every later test of the run
/// would fail allocating (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` from the driver's
/// allocations while a global capture is open).
struct Capture(sys::CUstream);

impl Capture {
    fn begin(stream: sys::CUstream) -> Capture {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a stream of the current context, not capturing.
        unsafe { sys::cuStreamBeginCapture_v2(stream, mode) }
            .result()
            .unwrap();
        Capture(stream)
    }

    /// End the capture and return its graph.
    fn end(self) -> sys::CUgraph {
        let stream = self.0;
        std::mem::forget(self);
        let mut graph = null_mut();
        // SAFETY: the stream is capturing (begun by `begin`, not ended since).
        unsafe { sys::cuStreamEndCapture(stream, &mut graph) }
            .result()
            .unwrap();
        graph
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let mut graph = null_mut();
        // SAFETY: as in `end`; an invalidated capture ends with an error and no graph.
        unsafe {
            if sys::cuStreamEndCapture(self.0, &mut graph) == sys::CUresult::CUDA_SUCCESS
                && !graph.is_null()
            {
                sys::cuGraphDestroy(graph);
            }
        }
    }
}

gpu_test! {
    /// Kernels load from the shipped SASS on a GPU it runs on (compute capability 8.x, 9.x, 10.0),
    /// with no JIT compilation; the simulated GPU refuses binary images, and there they come from
    /// the PTX (the fallback a driver older than the SASS's ptxas takes). The call is right either
    /// way.
    fn gpu_kernels_load_from_the_shipped_sass_where_it_runs() {
        let backend = symm::internals::select_backend().unwrap();
        let symm::internals::Backend::Cuda(cuda) = &*backend else {
            panic!("run with SYMM_BACKEND=cuda");
        };
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        run_group(
            |_, b| {
                symmAllReduce(
                    b.base.cast(),
                    b.base.cast(),
                    5,
                    DataType::Float32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    null_mut(),
                )
            },
            &buffers,
        );
        let from_sass = cuda.kernels_from_sass(0);
        let simulated = simulator_symbol(c"symm_sim_driver_calls").is_some();
        let jit_asked = std::env::var_os("SYMM_JIT_PTX").is_some_and(|v| !v.is_empty() && v != "0");
        let (mut major, mut minor) = (0, 0);
        // SAFETY: device 0 exists (the ranks above run on it); writes two ints.
        unsafe {
            cudarc::driver::sys::cuDeviceGetAttribute(
                &mut major,
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                0,
            );
            cudarc::driver::sys::cuDeviceGetAttribute(
                &mut minor,
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                0,
            );
        }
        let sass_runs = symm::internals::sass_target_for_capability(major, minor).is_some();
        let expected = !simulated && !jit_asked && sass_runs;
        assert_eq!(
            from_sass,
            Some(expected),
            "compute capability {major}.{minor}, simulated {simulated}, SYMM_JIT_PTX {jit_asked}"
        );
        teardown(buffers);
    }
}

gpu_test! {
    fn gpu_software_work_source_runs_every_tile_exactly_once() {
        use symm_device::scheduler::workload::{LINEAR_SKEW, ONE_HEAVY_IN_64, POLICIES, UNIFORM};
        use symm_perf::work_stealing::{self, Config, Variant};
        let backend = symm::internals::select_backend().unwrap();
        assert_eq!(backend.kind().name(), "cuda", "run with SYMM_BACKEND=cuda");
        // SYMM_GPU_TEST_MAX_TILES (the simulated GPU): fewer tiles, each with less work; the
        // exactly-once property does not depend on how long a tile takes.
        let max_tiles = std::env::var("SYMM_GPU_TEST_MAX_TILES")
            .ok()
            .and_then(|v| v.parse::<u32>().ok());
        let (work_iterations, prologue_iterations, iterations) = match max_tiles {
            Some(_) => (4, 8, 1),
            None => (50, 100, 3),
        };
        let mut tile_counts: Vec<u32> = [1, 7, 1000, 10_000]
            .into_iter()
            .map(|t| max_tiles.map_or(t, |m| t.min(m.max(1))))
            .collect();
        tile_counts.dedup();
        for tiles in tile_counts {
            for imbalance in [UNIFORM, LINEAR_SKEW, ONE_HEAVY_IN_64] {
                let config = Config {
                    tiles,
                    imbalance,
                    work_iterations,
                    prologue_iterations,
                    threads: 128,
                    iterations,
                    device: 0,
                };
                let variants = std::iter::once(Variant::FixedGrid)
                    .chain(POLICIES.iter().map(|p| Variant::Software(p)));
                for variant in variants {
                    let report = work_stealing::run(&backend, variant, &config).unwrap();
                    assert!(
                        report.exactly_once,
                        "{} tiles {tiles} imbalance {imbalance}",
                        variant.ptx_name()
                    );
                }
            }
        }
    }
}

gpu_test! {
    /// Teardown right after a collective, without synchronizing its stream first: a large
    /// out-of-place all-reduce from each rank's send window into its receive window, all ranks on
    /// one stream of the caller's in a group (one launch, directly on that stream, not on the
    /// library's internal stream), then at once every send window deregistered and its memory
    /// freed. Deregistration waits for every stream a collective on the window was enqueued on,
    /// so the kernel never reads freed memory, and the sums are right. (Run it on the simulated
    /// GPU with `SYMM_SIM_STRICT_FREE=1`, where `cuMemFree` frees at once and a kernel reading
    /// freed memory faults; without it, the driver's implicit wait in `cuMemFree`, which the
    /// window's teardown calls, hides a missing wait.)
    fn gpu_teardown_right_after_a_collective_waits_for_the_callers_stream() {
        let nranks = 2;
        let count = count_under_forced_algorithm(largest_count());
        let bytes = 4 * count;
        let comms = cuda_ranks(nranks);
        let sends = alloc_windows(&comms, bytes);
        let recvs = alloc_windows(&comms, bytes);
        let stream = non_blocking_stream();
        let inputs = random_inputs(nranks, count, 4242);
        for (b, input) in sends.iter().zip(&inputs) {
            upload(b.base, input);
        }
        check(symmGroupStart(), null_mut());
        for (send, recv) in sends.iter().zip(&recvs) {
            let result = symmAllReduce(
                send.base.cast(),
                recv.base.cast(),
                count,
                symmDataType_t::symmFloat32 as i32,
                symmRedOp_t::symmSum as i32,
                send.comm,
                stream.cast(),
            );
            check(result, send.comm);
        }
        check(symmGroupEnd(), null_mut());
        // At once: nothing has synchronized the stream.
        for send in &sends {
            check(symmCommWindowDeregister(send.comm, send.window), send.comm);
            check(symmMemFree(send.comm, send.base.cast()), send.comm);
        }
        // SAFETY: the stream is this test's. A kernel fault would be its (sticky) error.
        unsafe { sys::cuStreamSynchronize(stream) }
            .result()
            .unwrap();
        for &comm in &comms {
            assert_eq!(
                async_error(comm),
                symmResult_t::symmSuccess,
                "{}",
                last_error(comm)
            );
        }
        let results: Vec<Vec<f32>> = recvs.iter().map(|b| download(b.base, count)).collect();
        assert_matches_f64_sum(&inputs, &results, &format!("{nranks} ranks, count {count}"));
        // SAFETY: created above, idle after the synchronization.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        teardown(recvs);
    }
}

gpu_test! {
    /// The ranks of one device driven from one thread in a group, each on its own non-blocking
    /// stream (one launch on the library's internal stream, ordered with the callers' streams
    /// by events). What each caller queues after the collective on its own stream — here a copy
    /// of the result — must see the result; nothing else is synchronized before it is read.
    fn gpu_group_with_a_stream_per_rank_orders_later_work_on_each_stream() {
        let nranks = 4;
        let count = count_under_forced_algorithm(4099);
        let bytes = 4 * count;
        let (send, recv, copy) = (
            0,
            bytes.next_multiple_of(256),
            2 * bytes.next_multiple_of(256),
        );
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, copy + bytes + 4096);
        let streams: Vec<sys::CUstream> = (0..nranks).map(|_| non_blocking_stream()).collect();
        for iteration in 0..repeats(100) {
            let inputs = random_inputs(nranks, count, 7000 + iteration);
            for (b, input) in buffers.iter().zip(&inputs) {
                // SAFETY: offsets inside the window.
                upload(unsafe { b.base.add(send) }, input);
            }
            check(symmGroupStart(), null_mut());
            for (b, &stream) in buffers.iter().zip(&streams) {
                // SAFETY: offsets inside the window.
                let (s, r) = unsafe { (b.base.add(send), b.base.add(recv)) };
                let result = symmAllReduce(
                    s.cast(),
                    r.cast(),
                    count,
                    symmDataType_t::symmFloat32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    stream.cast(),
                );
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
            for (b, &stream) in buffers.iter().zip(&streams) {
                // SAFETY: device ranges inside the window; the stream is this test's.
                unsafe {
                    sys::cuMemcpyDtoDAsync_v2(
                        b.base.add(copy) as sys::CUdeviceptr,
                        b.base.add(recv) as sys::CUdeviceptr,
                        bytes,
                        stream,
                    )
                    .result()
                    .unwrap();
                    sys::cuStreamSynchronize(stream).result().unwrap();
                }
            }
            // SAFETY: offsets inside the window.
            let results: Vec<Vec<f32>> = buffers
                .iter()
                .map(|b| download(unsafe { b.base.add(copy) }, count))
                .collect();
            assert_matches_f64_sum(&inputs, &results, &format!("iteration {iteration}"));
        }
        for stream in streams {
            // SAFETY: created above; idle after the synchronizations.
            unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread per rank, every rank of the device on its own non-blocking stream: separate
    /// launches that wait for each other on the device, which the library allows only when the
    /// occupancy API proves that all of them are resident at once (its grids are sized so).
    fn gpu_one_thread_per_rank_each_on_its_own_stream() {
        let nranks = 8;
        let comms = cuda_ranks(nranks);
        let max = count_under_forced_algorithm(4099);
        let bytes = (4 * max).next_multiple_of(256);
        let buffers = alloc_windows(&comms, 2 * bytes + 4096);
        let iterations = repeats(50);
        std::thread::scope(|scope| {
            for (rank, b) in buffers.iter().enumerate() {
                let (comm, base) = (b.comm as usize, b.base as usize);
                scope.spawn(move || {
                    cuda_context();
                    let (comm, base) = (comm as symmComm_t, base as *mut u8);
                    let stream = non_blocking_stream();
                    for iteration in 0..iterations {
                        // Small (low-latency) and larger calls alternate.
                        let count = if iteration % 2 == 0 { 255 } else { max };
                        let inputs = random_inputs(nranks, count, 9000 + iteration);
                        upload(base, &inputs[rank]);
                        // SAFETY: offsets inside the window.
                        let recv = unsafe { base.add(bytes) };
                        let result = symmAllReduce(
                            base.cast(),
                            recv.cast(),
                            count,
                            symmDataType_t::symmFloat32 as i32,
                            symmRedOp_t::symmSum as i32,
                            comm,
                            stream.cast(),
                        );
                        check(result, comm);
                        // SAFETY: the stream is this thread's.
                        unsafe { sys::cuStreamSynchronize(stream) }
                            .result()
                            .unwrap();
                        let got = download(recv, count);
                        assert_matches_f64_sum(
                            &inputs,
                            &[got],
                            &format!("rank {rank} iteration {iteration}"),
                        );
                    }
                    // SAFETY: created above, idle after the synchronization.
                    unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
                });
            }
        });
        teardown(buffers);
    }
}

gpu_test! {
    /// A seeded sequence of 300 mixed calls on one window of 3 ranks — all-reduce (sum,
    /// max, min), all-gather, reduce-scatter, broadcast and reduce of int32, in place and out of
    /// place, at counts
    /// that pick every algorithm — each reading what earlier calls wrote on the device (nothing is
    /// uploaded between calls, so a kernel that reads a stale value is caught), checked against a
    /// host model of the window every 10 calls and at the end. Int32 sums wrap exactly, and 3
    /// ranks never wrap every value to zero.
    fn gpu_sequence_of_mixed_calls_on_one_window() {
        const NRANKS: usize = 3;
        const COUNTS: [usize; 6] = [1, 5, 255, 1023, 1537, 4099];
        let max = *COUNTS.iter().max().unwrap();
        // Two regions of NRANKS × max elements; calls go between them or stay in one.
        let region = NRANKS * max;
        let comms = cuda_ranks(NRANKS);
        let buffers = alloc_windows(&comms, 2 * 4 * region + 4096);
        let mut rng = Rng(0x5E0_0E5C);
        let mut model: Vec<Vec<i32>> = (0..NRANKS)
            .map(|_| {
                (0..2 * region)
                    .map(|_| rng.next_u64() as i32 >> 8)
                    .collect()
            })
            .collect();
        for (b, m) in buffers.iter().zip(&model) {
            upload_bytes(
                b.base,
                &m.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>(),
            );
        }
        let int32 = DataType::Int32 as i32;
        let calls = 300;
        for call in 0..calls {
            let count =
                count_under_forced_algorithm(COUNTS[(rng.next_u64() % COUNTS.len() as u64) as usize]);
            let kind = rng.next_u64() % 5;
            let op = [0, 2, 3][(rng.next_u64() % 3) as usize];
            let in_place = rng.next_u64().is_multiple_of(2);
            let from = (rng.next_u64() % 2) as usize * region;
            let to = if in_place { from } else { region - from };
            let root = if kind >= 3 {
                (rng.next_u64() % NRANKS as u64) as usize
            } else {
                0
            };
            check(symmGroupStart(), null_mut());
            for (rank, b) in buffers.iter().enumerate() {
                // Element offsets: all-gather sends its own segment in place, reduce-scatter
                // receives into its own segment in place.
                let (send, recv) = match kind {
                    1 if in_place => (to + rank * count, to),
                    2 if in_place => (from, from + rank * count),
                    _ => (from, to),
                };
                // SAFETY: element offsets inside the two regions of the window.
                let (s, r) = unsafe { (b.base.add(4 * send).cast(), b.base.add(4 * recv).cast()) };
                let result = match kind {
                    0 => symmAllReduce(s, r, count, int32, op, b.comm, null_mut()),
                    1 => symmAllGather(s, r, count, int32, b.comm, null_mut()),
                    2 => symmReduceScatter(s, r, count, int32, op, b.comm, null_mut()),
                    4 => {
                        // Off the root, recvbuff is not used: NULL on every other call.
                        let r = if rank != root && call % 2 == 1 {
                            null_mut()
                        } else {
                            r
                        };
                        symmReduce(s, r, count, int32, op, root as i32, b.comm, null_mut())
                    }
                    _ => {
                        // Off the root, sendbuff is ignored: NULL on every other call.
                        let s = if rank != root && call % 2 == 1 {
                            std::ptr::null()
                        } else {
                            s
                        };
                        symmBroadcast(s, r, count, int32, root as i32, b.comm, null_mut())
                    }
                };
                check(result, b.comm);
            }
            check(symmGroupEnd(), null_mut());
            // The model, from the inputs as they were before the call.
            let before = model.clone();
            let reduce = |values: &mut dyn Iterator<Item = i32>| -> i32 {
                match op {
                    0 => values.fold(0i32, i32::wrapping_add),
                    2 => values.max().unwrap(),
                    _ => values.min().unwrap(),
                }
            };
            for (rank, m) in model.iter_mut().enumerate() {
                match kind {
                    0 => {
                        for i in 0..count {
                            m[to + i] = reduce(&mut before.iter().map(|x| x[from + i]));
                        }
                    }
                    1 => {
                        for (peer, x) in before.iter().enumerate() {
                            let send = if in_place { to + peer * count } else { from };
                            m[to + peer * count..to + (peer + 1) * count]
                                .copy_from_slice(&x[send..send + count]);
                        }
                    }
                    3 => m[to..to + count].copy_from_slice(&before[root][from..from + count]),
                    4 if rank == root => {
                        for i in 0..count {
                            m[to + i] = reduce(&mut before.iter().map(|x| x[from + i]));
                        }
                    }
                    4 => {}
                    _ => {
                        let recv = if in_place { from + rank * count } else { to };
                        for i in 0..count {
                            m[recv + i] =
                                reduce(&mut before.iter().map(|x| x[from + rank * count + i]));
                        }
                    }
                }
            }
            if call % 10 == 9 || call + 1 == calls {
                synchronize();
                for (rank, (b, m)) in buffers.iter().zip(&model).enumerate() {
                    let got: Vec<i32> = download_bytes(b.base, 2 * 4 * region)
                        .chunks(4)
                        .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                        .collect();
                    if let Some(i) = (0..got.len()).find(|&i| got[i] != m[i]) {
                        panic!(
                            "after call {call} (the last: kind {kind} op {op} count {count} \
                             in place {in_place} root {root}): rank {rank} element {i} = {}, \
                             expected {}",
                            got[i], m[i]
                        );
                    }
                }
            }
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread per rank (separate launches on separate non-blocking streams, so one rank's
    /// kernel may start while a peer's previous kernel still runs), 60 in-place int32
    /// sums chained on the device: each call reads what the previous calls of every rank wrote,
    /// ordered only by the kernels' cross-rank barriers. After call k every element is
    /// 3^(k-1) × the sum of the initial values (wrapping), checked every 10 calls.
    fn gpu_threads_chain_in_place_all_reduces() {
        const NRANKS: usize = 3;
        // Low-latency and one-shot calls alternate on the window (under SYMM_ALGO=ll, all fit the
        // low-latency buffers of 16 KiB per rank). The largest count gives each block of a one-shot
        // call (up to 5 blocks per rank on a 16-SM device) more than one round of packs, so with
        // every rank in place the ranks share the work out instead of taking rounds.
        let (max, counts) = if forced_low_latency() {
            (4093, vec![4093, 255, 1537])
        } else {
            (5 * 4096 + 3, vec![4099, 255, 1537, 5 * 4096 + 3])
        };
        let comms = cuda_ranks(NRANKS);
        let buffers = alloc_windows(&comms, 4 * max + 4096);
        let initial: Vec<Vec<i32>> = (0..NRANKS)
            .map(|r| {
                let mut rng = Rng(0xC4A1 + r as u64);
                (0..max).map(|_| rng.next_u64() as i32 >> 4).collect()
            })
            .collect();
        for (b, x) in buffers.iter().zip(&initial) {
            upload_bytes(
                b.base,
                &x.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>(),
            );
        }
        // Element i after the calls so far (every call covers a prefix of the buffer).
        let calls = 60;
        let schedule: Vec<usize> = (0..calls).map(|k| counts[k % counts.len()]).collect();
        let expected_after = |k: usize| -> Vec<i32> {
            let mut v: Vec<Vec<i32>> = initial.clone();
            for &count in &schedule[..k] {
                let sums: Vec<i32> = (0..count)
                    .map(|i| v.iter().fold(0i32, |a, x| a.wrapping_add(x[i])))
                    .collect();
                for x in v.iter_mut() {
                    x[..count].copy_from_slice(&sums);
                }
            }
            v.swap_remove(0)
        };
        let checkpoints: Vec<(usize, Vec<i32>)> = (1..=calls)
            .filter(|k| k % 10 == 0 || *k == calls)
            .map(|k| (k, expected_after(k)))
            .collect();
        std::thread::scope(|scope| {
            for (rank, b) in buffers.iter().enumerate() {
                let (comm, base) = (b.comm as usize, b.base as usize);
                let (schedule, checkpoints) = (&schedule, &checkpoints);
                scope.spawn(move || {
                    cuda_context();
                    let (comm, base) = (comm as symmComm_t, base as *mut u8);
                    let stream = non_blocking_stream();
                    for (k, &count) in schedule.iter().enumerate() {
                        let result = symmAllReduce(
                            base.cast(),
                            base.cast(),
                            count,
                            DataType::Int32 as i32,
                            symmRedOp_t::symmSum as i32,
                            comm,
                            stream.cast(),
                        );
                        check(result, comm);
                        if let Some((_, want)) = checkpoints.iter().find(|(c, _)| *c == k + 1) {
                            // SAFETY: the stream is this thread's.
                            unsafe { sys::cuStreamSynchronize(stream) }
                                .result()
                                .unwrap();
                            let got: Vec<i32> = download_bytes(base, 4 * max)
                                .chunks(4)
                                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                                .collect();
                            if let Some(i) = (0..max).find(|&i| got[i] != want[i]) {
                                panic!(
                                    "rank {rank} after call {}: element {i} = {}, expected {}",
                                    k + 1,
                                    got[i],
                                    want[i]
                                );
                            }
                        }
                    }
                    // SAFETY: the stream is this thread's; created above.
                    unsafe {
                        sys::cuStreamSynchronize(stream).result().unwrap();
                        sys::cuStreamDestroy_v2(stream).result().unwrap();
                    }
                });
            }
        });
        teardown(buffers);
    }
}

/// A rank's window of device memory, as integers (to cross threads); every method runs on a
/// thread with the device's context current and uses the caller's stream.
#[derive(Clone, Copy)]
struct GpuRank {
    comm: usize,
    base: usize,
}

impl GpuRank {
    fn of(buffers: &[RankBuffer]) -> Vec<GpuRank> {
        buffers
            .iter()
            .map(|b| GpuRank {
                comm: b.comm as usize,
                base: b.base as usize,
            })
            .collect()
    }

    fn comm(self) -> symmComm_t {
        self.comm as symmComm_t
    }

    fn at(self, bytes: usize) -> *mut u8 {
        (self.base + bytes) as *mut u8
    }

    /// Fill `count` floats at byte `offset` with `value`.
    fn fill(self, offset: usize, count: usize, value: f32) {
        upload(self.at(offset), &vec![value; count]);
    }

    /// `count` floats at byte `offset`, once `stream` has finished.
    fn read(self, offset: usize, count: usize, stream: sys::CUstream) -> Vec<f32> {
        // SAFETY: the stream is the caller's; a failed kernel ends, it does not fault.
        unsafe { sys::cuStreamSynchronize(stream) }
            .result()
            .unwrap();
        download(self.at(offset), count)
    }

    /// In-place all-reduce (sum) of `count` floats at byte `offset`, on `stream`.
    fn all_reduce(self, offset: usize, count: usize, stream: sys::CUstream) -> symmResult_t {
        let p = self.at(offset).cast();
        symmAllReduce(
            p,
            p,
            count,
            symmDataType_t::symmFloat32 as i32,
            symmRedOp_t::symmSum as i32,
            self.comm(),
            stream.cast(),
        )
    }
}

/// Run `work(stream)` on this thread with the device's context current and a new non-blocking
/// stream, then wait for the stream and destroy it.
fn on_own_stream<T>(work: impl FnOnce(sys::CUstream) -> T) -> T {
    cuda_context();
    let stream = non_blocking_stream();
    let out = work(stream);
    // SAFETY: the stream was created above and is used by nobody else.
    unsafe {
        sys::cuStreamSynchronize(stream).result().unwrap();
        sys::cuStreamDestroy_v2(stream).result().unwrap();
    }
    out
}

/// Run `work(rank, stream)` on one thread per rank, each with the device's context current and
/// its own non-blocking stream, and collect what each returns.
fn per_rank_on_streams<T: Send>(
    ranks: &[GpuRank],
    work: impl Fn(usize, GpuRank, sys::CUstream) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let work = &work;
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(r, &rank)| scope.spawn(move || on_own_stream(|stream| work(r, rank, stream))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

gpu_test! {
    /// The new user's report on the cuda backend (a thread and a stream per rank): rank 0
    /// all-reduces 1024 floats, rank 1 only 512, then both all-reduce 16 elements of 10·(r+1).
    /// Launches do not wait for the kernels, so the rank that launched first may see its calls
    /// accepted; but the communicator fails on both ranks (the asynchronous error says so), the
    /// refused rank is told why, no later call is accepted once a rank knows of the failure, and
    /// nothing ever returns success with a stale pairing (21.0 where 30.0 is right).
    fn gpu_a_mismatch_between_threads_fails_the_communicator_on_every_rank() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 8192);
        let ranks = GpuRank::of(&buffers);
        let outcomes = per_rank_on_streams(&ranks, |r, rank, stream| {
            rank.fill(0, 1024, 1.0);
            let count = if r == 0 { 1024 } else { 512 };
            let first = rank.all_reduce(0, count, stream);
            let first_message = last_error(rank.comm());
            rank.read(0, 1, stream);
            let status_after_first = async_error(rank.comm());
            rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
            let second = rank.all_reduce(0, 16, stream);
            let second_message = last_error(rank.comm());
            let data = rank.read(0, 16, stream);
            (
                first,
                first_message,
                status_after_first,
                second,
                second_message,
                data,
            )
        });
        let refused: Vec<usize> = (0..2)
            .filter(|&r| outcomes[r].0 != symmResult_t::symmSuccess)
            .collect();
        assert!(!refused.is_empty(), "both mismatched calls were accepted");
        for (r, (first, first_message, after_first, second, second_message, data)) in
            outcomes.iter().enumerate()
        {
            if *first != symmResult_t::symmSuccess {
                assert!(
                    first_message.contains("symmAllReduce of 1024") && first_message.contains("of 512"),
                    "rank {r}: {first_message}"
                );
                // A rank that knows of the failure accepts nothing more.
                assert_ne!(*after_first, symmResult_t::symmSuccess, "rank {r}");
            }
            if *after_first != symmResult_t::symmSuccess {
                assert_ne!(
                    *second,
                    symmResult_t::symmSuccess,
                    "rank {r}'s call after the failure was accepted: {data:?}"
                );
                assert!(
                    second_message.contains("the communicator has failed"),
                    "rank {r}: {second_message}"
                );
            }
            // Whatever was accepted, the communicator has failed on this rank.
            assert_ne!(
                async_error(ranks[r].comm()),
                symmResult_t::symmSuccess,
                "rank {r}: the communicator did not fail (second call's data {data:?})"
            );
            if *second == symmResult_t::symmSuccess {
                assert_ne!(data, &vec![21.0; 16], "rank {r} paired with a stale call");
            }
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// A call refused on one rank for a bad argument (beyond its window) while its peer made the
    /// call, on the cuda backend: the refusal is still that rank's call, so neither rank's next
    /// call pairs with the peer's stale one; the communicator fails on both. Ranks that all
    /// refuse the same call stay in step and go on.
    fn gpu_a_call_refused_on_one_rank_is_still_its_call() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        let ranks = GpuRank::of(&buffers);
        let refused = per_rank_on_streams(&ranks, |_, rank, stream| rank.all_reduce(0, 5000, stream));
        assert!(
            refused
                .iter()
                .all(|r| *r == symmResult_t::symmInvalidArgument),
            "{refused:?}"
        );
        let sums = per_rank_on_streams(&ranks, |r, rank, stream| {
            rank.fill(0, 64, r as f32 + 1.0);
            (rank.all_reduce(0, 64, stream), rank.read(0, 64, stream))
        });
        for (result, data) in &sums {
            assert_eq!(*result, symmResult_t::symmSuccess);
            assert_eq!(data, &vec![3.0; 64]);
        }
        let outcomes = per_rank_on_streams(&ranks, |r, rank, stream| {
            rank.fill(0, 64, r as f32 + 1.0);
            let first = if r == 0 {
                rank.all_reduce(0, 64, stream)
            } else {
                rank.all_reduce(4000, 64, stream)
            };
            rank.read(0, 1, stream);
            rank.fill(0, 64, 10.0 * (r as f32 + 1.0));
            let second = rank.all_reduce(0, 64, stream);
            (first, second, rank.read(0, 64, stream))
        });
        assert_eq!(outcomes[1].0, symmResult_t::symmInvalidArgument);
        assert_ne!(
            outcomes[1].1,
            symmResult_t::symmSuccess,
            "{:?}",
            outcomes[1].2
        );
        for (r, (_, _, data)) in outcomes.iter().enumerate() {
            assert_ne!(
                async_error(ranks[r].comm()),
                symmResult_t::symmSuccess,
                "rank {r}: {data:?}"
            );
            // Rank 0's second call (#3) may have been accepted before rank 1's refusal was known;
            // it then ends with the failure, never with a stale pairing (rank 1's 2.0 + 10.0).
            assert_ne!(data, &vec![12.0; 64], "rank {r} paired with a stale call");
        }
        teardown(buffers);
    }
}

gpu_test! {
    /// One thread driving both ranks in a group, on the cuda backend: rank 0's all-reduce is valid
    /// and rank 1's overruns its window. The whole group is refused before anything is launched,
    /// `symmGroupEnd` returns the bad argument's error, and the communicator stays usable.
    fn gpu_a_bad_call_in_a_group_refuses_the_group_and_keeps_the_communicator() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 4096);
        let ranks = GpuRank::of(&buffers);
        let stream = non_blocking_stream();
        ranks[0].fill(0, 16, 1.0);
        ranks[1].fill(0, 16, 2.0);
        check(symmGroupStart(), null_mut());
        check(ranks[0].all_reduce(0, 16, stream), ranks[0].comm());
        assert_eq!(
            ranks[1].all_reduce(4090, 16, stream),
            symmResult_t::symmInvalidArgument
        );
        let end = symmGroupEnd();
        let message = last_error(null_mut());
        assert_eq!(end, symmResult_t::symmInvalidArgument, "{message}");
        assert!(
            message.contains("nothing of this group was launched"),
            "{message}"
        );
        assert_eq!(ranks[0].read(0, 16, stream), vec![1.0; 16], "something ran");
        for rank in &ranks {
            assert_eq!(async_error(rank.comm()), symmResult_t::symmSuccess);
        }
        check(symmGroupStart(), null_mut());
        for (r, rank) in ranks.iter().enumerate() {
            rank.fill(0, 16, 10.0 * (r as f32 + 1.0));
            check(rank.all_reduce(0, 16, stream), rank.comm());
        }
        check(symmGroupEnd(), null_mut());
        for rank in &ranks {
            assert_eq!(rank.read(0, 16, stream), vec![30.0; 16]);
        }
        // SAFETY: created above, idle after the reads.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        teardown(buffers);
    }
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

gpu_test! {
    /// More ranks on one GPU than it holds blocks of the kernel at once, driven from one thread
    /// in a group (one cooperative launch, whose blocks wait for each other): the group is refused
    /// with `symmInvalidUsage` naming the residency, before its calls are numbered. Nothing is
    /// launched, no communicator is failed, and teardown completes. (The driver's
    /// `CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE` after the numbering failed the communicator on
    /// every rank.) Five ranks need a device of one multiprocessor, which holds at most four blocks
    /// of 512 threads: the simulated GPU with `SYMM_SIM_SMS=1`; skipped on a larger one.
    fn gpu_more_ranks_on_one_gpu_than_it_holds_blocks_are_refused_before_launch() {
        let nranks = 5;
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, 4096);
        if multiprocessors(0) > 1 {
            eprintln!("skipped: needs a device of one multiprocessor (SYMM_SIM_SMS=1)");
            teardown(buffers);
            return;
        }
        let ranks = GpuRank::of(&buffers);
        let stream = non_blocking_stream();
        for (r, rank) in ranks.iter().enumerate() {
            rank.fill(0, 16, r as f32 + 1.0);
        }
        let launches = || {
            simulator_call_counter().map(|counter| {
                let (_, table) = driver_calls(counter);
                table
                    .iter()
                    .filter(|(name, _)| name.starts_with("cuLaunch"))
                    .map(|(_, n)| n)
                    .sum::<u64>()
            })
        };
        let launched_before = launches();
        check(symmGroupStart(), null_mut());
        for rank in &ranks {
            check(rank.all_reduce(0, 16, stream), rank.comm());
        }
        let end = symmGroupEnd();
        let message = last_error(null_mut());
        assert_eq!(end, symmResult_t::symmInvalidUsage, "{message}");
        assert!(
            message.contains("must be resident at once") && message.contains("holds only"),
            "{message}"
        );
        assert_eq!(launches(), launched_before, "a kernel was launched");
        for (r, rank) in ranks.iter().enumerate() {
            assert_eq!(
                rank.read(0, 16, stream),
                vec![r as f32 + 1.0; 16],
                "rank {r}: something ran"
            );
            assert_eq!(
                async_error(rank.comm()),
                symmResult_t::symmSuccess,
                "rank {r}: {}",
                last_error(rank.comm())
            );
        }
        // SAFETY: created above, idle after the reads.
        unsafe { sys::cuStreamDestroy_v2(stream) }.result().unwrap();
        teardown(buffers);
    }
}

gpu_test! {
    /// Two threads of rank 0 start all-reduces on one communicator at the same moment (region A
    /// with n floats, region B with 2n, each thread on its own stream) while rank 1 calls A then B,
    /// on the cuda backend. The library numbers and launches a rank's calls in one order (a second
    /// thread entering a collective while another's is being launched is refused), so whatever the
    /// interleaving, no call is accepted and then completes with another call's data: a call
    /// whose rank's communicator did not fail returned the right sum.
    fn gpu_two_threads_on_one_rank_never_pair_wrongly() {
        let sizes: &[usize] = if largest_count() < 64 * 1024 {
            &[1024, 4096]
        } else {
            &[1024, 4096, 16 * 1024, 64 * 1024]
        };
        let rounds = repeats(6).min(6);
        let (mut clean, mut failed) = (0, 0);
        for &n in sizes {
            for round in 0..rounds {
                let comms = cuda_ranks(2);
                let buffers = alloc_windows(&comms, 4 * 3 * n + 4096);
                let ranks = GpuRank::of(&buffers);
                let (a, b) = (0usize, 4 * n);
                let value =
                    |r: usize, region: usize| (100 * (r + 1) + 10 * region) as f32 + round as f32;
                for (r, rank) in ranks.iter().enumerate() {
                    rank.fill(a, n, value(r, 1));
                    rank.fill(b, 2 * n, value(r, 2));
                }
                let want = |region: usize| value(0, region) + value(1, region);
                let start = std::sync::Barrier::new(3);
                // (rank, region, result, data once its stream finished, message)
                let results: Vec<(usize, usize, symmResult_t, Vec<f32>, String)> =
                    std::thread::scope(|scope| {
                        let start = &start;
                        let call = |r: usize, rank: GpuRank, region: usize, stream| {
                            let (offset, count) = if region == 1 { (a, n) } else { (b, 2 * n) };
                            let result = rank.all_reduce(offset, count, stream);
                            let message = last_error(rank.comm());
                            (r, region, result, rank.read(offset, count, stream), message)
                        };
                        let mut handles = Vec::new();
                        for region in [1, 2] {
                            let rank = ranks[0];
                            handles.push(scope.spawn(move || {
                                on_own_stream(|stream| {
                                    start.wait();
                                    vec![call(0, rank, region, stream)]
                                })
                            }));
                        }
                        let rank = ranks[1];
                        handles.push(scope.spawn(move || {
                            on_own_stream(|stream| {
                                start.wait();
                                vec![call(1, rank, 1, stream), call(1, rank, 2, stream)]
                            })
                        }));
                        handles
                            .into_iter()
                            .flat_map(|h| h.join().unwrap())
                            .collect()
                    });
                let healthy: Vec<bool> = ranks
                    .iter()
                    .map(|rank| async_error(rank.comm()) == symmResult_t::symmSuccess)
                    .collect();
                for (r, region, result, data, message) in &results {
                    if *result == symmResult_t::symmSuccess && healthy[*r] {
                        if let Some(x) = data.iter().find(|x| **x != want(*region)) {
                            panic!(
                                "n {n} round {round}: rank {r}'s region {region} succeeded with {x} \
                                 where {} is right",
                                want(*region)
                            );
                        }
                    } else if *result != symmResult_t::symmSuccess
                        && message.starts_with("symmAllReduce: comm is in use by another thread")
                    {
                        // (The last error is the rank's, shared by its two threads: a call that
                        // succeeded may find the other thread's refusal there.)
                        assert_eq!(*result, symmResult_t::symmInvalidUsage, "{message}");
                        assert!(
                            message.matches("symmAllReduce").count() >= 2,
                            "the refusal does not name both calls: {message}"
                        );
                    }
                }
                if healthy.iter().all(|h| *h) {
                    clean += 1;
                } else {
                    failed += 1;
                }
                teardown(buffers);
            }
        }
        eprintln!("{clean} rounds completed, {failed} failed the communicator (never wrongly paired)");
    }
}

gpu_test! {
    /// The refusal made certain: thread A of rank 0 holds the rank with a call queued in its open
    /// group while thread B of rank 0 makes another call. B is refused at once with
    /// `symmInvalidUsage` naming both calls, nothing of B's runs, and the communicator fails on
    /// both ranks, so A's group and rank 1's call end in an error, never in a wrong pairing.
    fn gpu_a_second_thread_is_refused_while_another_holds_the_rank() {
        let comms = cuda_ranks(2);
        let buffers = alloc_windows(&comms, 8192);
        let ranks = GpuRank::of(&buffers);
        for (r, rank) in ranks.iter().enumerate() {
            rank.fill(0, 512, 1.0 + r as f32);
            rank.fill(4096, 256, 10.0 + r as f32);
        }
        let queued = std::sync::Barrier::new(2);
        let refused = std::sync::Barrier::new(2);
        let (group_end, (b_result, b_message, b_data)) = std::thread::scope(|scope| {
            let (queued, refused) = (&queued, &refused);
            let rank = ranks[0];
            let a = scope.spawn(move || {
                on_own_stream(|stream| {
                    check(symmGroupStart(), null_mut());
                    check(rank.all_reduce(0, 512, stream), rank.comm());
                    queued.wait();
                    refused.wait();
                    let end = symmGroupEnd();
                    rank.read(0, 1, stream);
                    end
                })
            });
            let b = scope.spawn(move || {
                on_own_stream(|stream| {
                    queued.wait();
                    let result = rank.all_reduce(4096, 256, stream);
                    let message = last_error(rank.comm());
                    refused.wait();
                    (result, message, rank.read(4096, 256, stream))
                })
            });
            (a.join().unwrap(), b.join().unwrap())
        });
        assert_eq!(b_result, symmResult_t::symmInvalidUsage, "{b_message}");
        assert!(
            b_message.starts_with("symmAllReduce: comm is in use by another thread")
                && b_message.contains("symmAllReduce of 256")
                && b_message.contains("symmAllReduce of 512"),
            "{b_message}"
        );
        assert_eq!(b_data, vec![10.0; 256], "the refused call ran");
        // Rank 1 makes its first call: it must not pair with anything of rank 0's.
        let (peer, peer_data) = on_own_stream(|stream| {
            (
                ranks[1].all_reduce(0, 512, stream),
                ranks[1].read(0, 512, stream),
            )
        });
        assert_ne!(group_end, symmResult_t::symmSuccess, "thread A's group ran");
        assert_ne!(peer, symmResult_t::symmSuccess, "rank 1: {peer_data:?}");
        for rank in &ranks {
            assert_ne!(async_error(rank.comm()), symmResult_t::symmSuccess);
        }
        teardown(buffers);
    }
}

/// Environment of a rank this file's multi-process tests start in a child process:
/// `scenario,rank,nranks,device,ranks on its GPU,id in hex`.
const CHILD_RANK_ENV: &str = "SYMM_GPU_TEST_CHILD";

/// Make `device`'s primary context current on this thread (the device `symmCommInitRank`
/// joins with).
fn use_device(device: i32) {
    // SAFETY: the caller checked that `device` exists; its primary context is retained for
    // the process.
    unsafe {
        result::init().unwrap();
        let cu = result::device::get(device).unwrap();
        let context = result::primary_ctx::retain(cu).unwrap();
        result::ctx::set_current(context).unwrap();
    }
}

fn device_count() -> i32 {
    let mut count = 0;
    // SAFETY: writes one int; the library initialized the driver.
    unsafe {
        result::init().unwrap();
        sys::cuDeviceGetCount(&mut count).result().unwrap();
    }
    count
}

/// One rank of a communicator of several processes, on `device`, whose GPU holds `on_gpu` of
/// the ranks (in any process): join, check that the grids of every rank on the GPU fit it at
/// once, register a window and run three all-reduces of small integers (exact in f32),
/// checked against the sum over the ranks.
fn multi_process_rank(rank: usize, nranks: usize, device: i32, on_gpu: usize, id: symmUniqueId) {
    use_device(device);
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, nranks as i32, id, rank as i32) },
        null_mut(),
    );
    assert_eq!(
        backend(comm),
        "cuda",
        "run the GPU set with SYMM_BACKEND=cuda"
    );
    let sms = multiprocessors(device);
    let max_blocks = symm::internals::Comm::from_handle(comm).unwrap().max_blocks as usize;
    assert!(
        max_blocks * on_gpu <= sms,
        "rank {rank}: {on_gpu} ranks of up to {max_blocks} blocks each on a GPU of {sms} SMs"
    );
    let count = 1000;
    let mut buffer = alloc(&[comm], 8 * count);
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffer);
    check(symmGroupEnd(), null_mut());
    let base = buffer[0].base;
    let value = |r: usize, round: usize, i: usize| ((r + 1 + round) * (i % 7 + 1)) as f32;
    for round in 0..3 {
        let input: Vec<f32> = (0..count).map(|i| value(rank, round, i)).collect();
        upload(base, &input);
        // SAFETY: both halves of the window.
        check(
            all_reduce_f32_sum(comm, base, unsafe { base.add(4 * count) }, count),
            comm,
        );
        synchronize();
        // SAFETY: the second half of the window.
        let got = download(unsafe { base.add(4 * count) }, count);
        for (i, g) in got.iter().enumerate() {
            let want: f32 = (0..nranks).map(|r| value(r, round, i)).sum();
            assert_eq!(*g, want, "rank {rank}, round {round}, element {i}");
        }
    }
    teardown(buffer);
}

/// Run ranks `here` (with their devices) in threads of this process and `children` in
/// child processes, one each, of a communicator of `here.len() + children.len()` ranks;
/// `on_gpu(rank)` is how many ranks share that rank's GPU.
fn run_multi_process(
    scenario: &str,
    here: &[(usize, i32)],
    children: &[(usize, i32)],
    on_gpu: fn(usize) -> usize,
) {
    let nranks = here.len() + children.len();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    let processes: Vec<_> = children
        .iter()
        .map(|&(rank, device)| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "gpu_child_rank_of_a_multi_process_test",
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(
                    CHILD_RANK_ENV,
                    format!(
                        "{scenario},{rank},{nranks},{device},{},{}",
                        on_gpu(rank),
                        id_to_hex(&id)
                    ),
                )
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::scope(|scope| {
        for &(rank, device) in here {
            scope.spawn(move || multi_process_rank(rank, nranks, device, on_gpu(rank), id));
        }
    });
    for (mut child, (rank, _)) in processes.into_iter().zip(children) {
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "{scenario}: rank {rank}'s process: {status}"
        );
    }
}

gpu_test! {
    /// The rank a multi-process test started in this process (does nothing when run by itself).
    fn gpu_child_rank_of_a_multi_process_test() {
        let Ok(text) = std::env::var(CHILD_RANK_ENV) else {
            return;
        };
        let fields: Vec<&str> = text.split(',').collect();
        let number = |i: usize| fields[i].parse::<usize>().unwrap();
        multi_process_rank(
            number(1),
            number(2),
            number(3) as i32,
            number(4),
            id_from_hex(fields[5]),
        );
    }
}

gpu_test! {
    /// One process drives two GPUs (ranks 0 and 1 on devices 0 and 1) and another process holds
    /// rank 2 (device 2): windows and signal pads are then CUDA VMM memory, which a device may
    /// touch only when `cuMemSetAccess` names it, so rank 0's kernel reading rank 1's window
    /// needs device 0 to be granted access to it (peer access between the contexts does not
    /// cover VMM memory). On the simulated GPU, a missing grant is an illegal address.
    fn gpu_a_process_with_two_gpus_and_a_rank_in_another_process() {
        if device_count() < 3 {
            eprintln!("skipped: needs 3 devices");
            return;
        }
        run_multi_process("two-gpus-here", &[(0, 0), (1, 1)], &[(2, 2)], |_| 1);
    }
}

gpu_test! {
    /// Two processes, one rank each, on one GPU: each rank's grids are sized for both ranks of
    /// the GPU (a rank of another process on the same GPU counts, found by the GPU's UUID), and
    /// the all-reduces are right.
    fn gpu_two_processes_on_one_gpu_size_their_grids_for_both() {
        run_multi_process("one-gpu-two-processes", &[(0, 0)], &[(1, 0)], |_| 2);
    }
}

gpu_test! {
    /// One thread per rank on one GPU, rank 0 issuing its collectives back to back while rank 1
    /// lags (a pause before each call): rank 0's kernel n+1 waits on its stream for its kernel n,
    /// which spins until rank 1's kernel n runs. Were kernel n+1 to enter a hardware queue ahead of
    /// rank 1's kernel n, that kernel could never start; the library paces launches so that it
    /// cannot. On the simulated GPU run it with `SYMM_SIM_HW_QUEUES=1` (every stream's kernels
    /// in one first-in-first-out queue, the worst aliasing `CUDA_DEVICE_MAX_CONNECTIONS` allows).
    fn gpu_a_rank_running_ahead_never_queues_before_a_lagging_peer() {
        let nranks = 2;
        let calls = 4;
        let count = 64;
        let region = 4 * count;
        let comms = cuda_ranks(nranks);
        let buffers = alloc_windows(&comms, calls * region);
        let ranks = GpuRank::of(&buffers);
        let results = per_rank_on_streams(&ranks, |rank, gpu, stream| {
            for k in 0..calls {
                gpu.fill(k * region, count, ((rank + 1) * (k + 1)) as f32);
            }
            for k in 0..calls {
                if rank == 1 {
                    std::thread::sleep(Duration::from_millis(300));
                }
                check(gpu.all_reduce(k * region, count, stream), gpu.comm());
            }
            (0..calls)
                .map(|k| gpu.read(k * region, count, stream))
                .collect::<Vec<_>>()
        });
        for (rank, regions) in results.iter().enumerate() {
            for (k, values) in regions.iter().enumerate() {
                let want = (3 * (k + 1)) as f32;
                assert!(
                    values.iter().all(|v| *v == want),
                    "rank {rank}, call {k}: {:?}, want {want}",
                    &values[..4]
                );
            }
        }
        for b in &buffers {
            assert_eq!(
                async_error(b.comm),
                symmResult_t::symmSuccess,
                "{}",
                last_error(b.comm)
            );
        }
        teardown(buffers);
    }
}

/// The address of `symbol`, a function the fake libcuda of the simulated GPU exports besides
/// the driver's (sim/cuda/src/lib.rs); `None` on a real driver.
fn simulator_symbol(symbol: &std::ffi::CStr) -> Option<*mut c_void> {
    unsafe extern "C" {
        fn dlopen(name: *const std::ffi::c_char, flags: std::ffi::c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, symbol: *const std::ffi::c_char) -> *mut c_void;
    }
    const RTLD_LAZY: std::ffi::c_int = 1;
    const RTLD_NOLOAD: std::ffi::c_int = 4;
    // SAFETY: looks up a library the process loaded already (NOLOAD) and one of its symbols.
    unsafe {
        [c"libcuda.so", c"libcuda.so.1"]
            .into_iter()
            .map(|name| dlopen(name.as_ptr(), RTLD_LAZY | RTLD_NOLOAD))
            .filter(|library| !library.is_null())
            .map(|library| dlsym(library, symbol.as_ptr()))
            .find(|address| !address.is_null())
    }
}

/// The simulated GPU's count of driver calls (`symm_sim_driver_calls`): `None` on a real
/// driver.
fn simulator_call_counter() -> Option<unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> u64> {
    simulator_symbol(c"symm_sim_driver_calls").map(|address| {
        // SAFETY: the fake libcuda's function has this signature.
        unsafe {
            std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> u64,
            >(address)
        }
    })
}

/// The simulated GPU's count of kernel reads of pinned host memory (`symm_sim_host_reads`):
/// `None` on a real driver.
fn simulator_host_reads() -> Option<extern "C" fn() -> u64> {
    simulator_symbol(c"symm_sim_host_reads").map(|address| {
        // SAFETY: the fake libcuda's function has this signature.
        unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> u64>(address) }
    })
}

/// Driver calls so far, and the table by function.
fn driver_calls(
    counter: unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> u64,
) -> (u64, Vec<(String, u64)>) {
    let mut text = vec![0 as std::ffi::c_char; 1 << 16];
    // SAFETY: the buffer holds its length in bytes.
    let total = unsafe { counter(text.as_mut_ptr(), text.len()) };
    // SAFETY: NUL-terminated by the counter.
    let text = unsafe { std::ffi::CStr::from_ptr(text.as_ptr()) }.to_string_lossy();
    let table = text
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(name, n)| (name.to_string(), n.parse().unwrap()))
        .collect();
    (total, table)
}

/// Reads of pinned host memory (the abort word) per grouped LL all-reduce of 256 bytes on
/// `nranks` ranks of the one GPU, after a warm-up call, counted by the simulated GPU (`None` on
/// a real GPU).
fn ll_all_reduce_host_reads_per_call(nranks: usize) -> Option<f64> {
    let count = 64;
    let comms = cuda_ranks(nranks);
    let host_reads = simulator_host_reads()?;
    let buffers = alloc_windows(&comms, 8 * count);
    let grouped = || {
        run_group(
            |_, b| {
                // SAFETY: both halves of the window.
                let recv = unsafe { b.base.add(4 * count) };
                symmAllReduce(
                    b.base.cast(),
                    recv.cast(),
                    count,
                    symmDataType_t::symmFloat32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    null_mut(),
                )
            },
            &buffers,
        )
    };
    grouped();
    let calls = 5;
    let before = host_reads();
    for _ in 0..calls {
        grouped();
    }
    Some((host_reads() - before) as f64 / calls as f64)
}

gpu_test! {
    /// Reads of pinned host memory by the kernels of a grouped LL all-reduce of 256 bytes (the
    /// planner's LL size; one block per rank), counted by the simulated GPU when its host reads
    /// cost time (`SYMM_SIM_HOST_READ_NS`; skipped otherwise, and on a real GPU). Each is a round
    /// trip across PCIe on a GPU.
    /// * 1 rank, whose kernel never waits: none. The kernels looked at the abort word at their
    ///   start (one read per block, on the critical path of every call): 1 per call.
    /// * 8 ranks: only waits that last past `POLLS_PER_ABORT_LOOK` polls read it, which the
    ///   simulated threads reach far sooner than a GPU's (their polls cost little virtual time):
    ///   0 to 167 per call over seeds 1-8, with the same spread at 2 ranks (0 to 16). A wait
    ///   that read the word after every miss made 482 at the `sim --test` seed (and the LL
    ///   all-reduce 10-40x slower on an H200).
    fn gpu_ll_all_reduce_reads_host_memory_only_when_a_wait_lasts() {
        let costed = std::env::var("SYMM_SIM_HOST_READ_NS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|ns| ns > 0);
        if !costed {
            eprintln!("skipped: needs the simulated GPU with SYMM_SIM_HOST_READ_NS set");
            return;
        }
        let Some(one) = ll_all_reduce_host_reads_per_call(1) else {
            eprintln!("skipped: counts host-memory reads on the simulated GPU only");
            return;
        };
        eprintln!("host-memory reads per 1-rank LL all-reduce of 256 bytes: {one:.1}");
        assert!(one < 0.5, "{one} host-memory reads per 1-rank call");
        let eight = ll_all_reduce_host_reads_per_call(8).expect("the simulated GPU");
        eprintln!("host-memory reads per 8-rank LL all-reduce of 256 bytes: {eight:.1}");
        assert!(eight <= 256.0, "{eight} host-memory reads per 8-rank call");
    }
}

/// Most driver calls one grouped all-reduce of 8 ranks on one GPU may make, after the
/// first (NCCL makes about one launch per device).
const DRIVER_CALLS_PER_GROUPED_ALL_REDUCE: u64 = 10;

gpu_test! {
    /// The host path's cost in driver calls: a grouped all-reduce of 1 KiB on each of 8 ranks of
    /// one GPU, after a warm-up, counted by the simulated GPU's driver (skipped on a real one).
    fn gpu_driver_calls_per_grouped_all_reduce() {
        let nranks = 8;
        let count = 256;
        let comms = cuda_ranks(nranks);
        let Some(counter) = simulator_call_counter() else {
            eprintln!("skipped: counts driver calls on the simulated GPU only");
            return;
        };
        let buffers = alloc_windows(&comms, 8 * count);
        let stream = non_blocking_stream();
        let grouped = || {
            check(symmGroupStart(), null_mut());
            for b in &buffers {
                // SAFETY: both halves of the window.
                let recv = unsafe { b.base.add(4 * count) };
                let r = symmAllReduce(
                    b.base.cast(),
                    recv.cast(),
                    count,
                    symmDataType_t::symmFloat32 as i32,
                    symmRedOp_t::symmSum as i32,
                    b.comm,
                    stream.cast(),
                );
                check(r, b.comm);
            }
            check(symmGroupEnd(), null_mut());
        };
        for _ in 0..3 {
            grouped();
        }
        // SAFETY: the stream was created above.
        unsafe { sys::cuStreamSynchronize(stream) }
            .result()
            .unwrap();
        let calls = 10;
        let (before, table_before) = driver_calls(counter);
        for _ in 0..calls {
            grouped();
        }
        let (after, table_after) = driver_calls(counter);
        // SAFETY: created above; idle after the synchronization.
        unsafe {
            sys::cuStreamSynchronize(stream).result().unwrap();
            sys::cuStreamDestroy_v2(stream).result().unwrap();
        }
        let per_call = (after - before) as f64 / calls as f64;
        let mut breakdown: Vec<String> = table_after
            .iter()
            .filter_map(|(name, n)| {
                let old = table_before
                    .iter()
                    .find(|(o, _)| o == name)
                    .map_or(0, |(_, o)| *o);
                (*n > old).then(|| format!("{name} {:.1}", (*n - old) as f64 / calls as f64))
            })
            .collect();
        breakdown.sort();
        eprintln!(
            "driver calls per grouped all-reduce of {nranks} ranks x {} bytes: {per_call:.1} ({})",
            4 * count,
            breakdown.join(", ")
        );
        assert!(
            per_call <= DRIVER_CALLS_PER_GROUPED_ALL_REDUCE as f64,
            "{per_call:.1} driver calls per grouped all-reduce ({}), at most {DRIVER_CALLS_PER_GROUPED_ALL_REDUCE}",
            breakdown.join(", ")
        );
        teardown(buffers);
    }
}
