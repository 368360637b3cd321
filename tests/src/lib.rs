//! Test support: a thin, checked Rust view of the C ABI, so that tests read like the C they
//! stand for. Everything here goes through the exported `extern "C"` functions.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod ptx_lint;

use std::ffi::{CStr, c_int, c_void};
use symm::*;

/// Panic with the library's message unless `result` is success.
#[track_caller]
pub fn check(result: symmResult_t, comm: symmComm_t) {
    if result != symmResult_t::symmSuccess {
        panic!("{result:?}: {}", last_error(comm));
    }
}

/// `comm`'s asynchronous error (`symmCommGetAsyncError`).
// The library validates the handle before any use, so passing any pointer is safe.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn async_error(comm: symmComm_t) -> symmResult_t {
    let mut error = symmResult_t::symmInternalError;
    // SAFETY: valid out-pointer.
    check(unsafe { symmCommGetAsyncError(comm, &mut error) }, comm);
    error
}

/// `symmGetLastError(comm)` as a String.
pub fn last_error(comm: symmComm_t) -> String {
    // SAFETY: symmGetLastError never returns NULL and returns a NUL-terminated string.
    unsafe { CStr::from_ptr(symmGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

/// `nranks` ranks in this process (all on device 0).
pub fn init_all(nranks: usize) -> Vec<symmComm_t> {
    let mut comms = vec![std::ptr::null_mut(); nranks];
    let devices = vec![0 as c_int; nranks];
    // SAFETY: both arrays hold nranks elements.
    check(
        unsafe { symmCommInitAll(comms.as_mut_ptr(), nranks as c_int, devices.as_ptr()) },
        std::ptr::null_mut(),
    );
    comms
}

/// The backend name of `comm`.
// The library validates the handle before any use, so passing any pointer is safe.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn backend(comm: symmComm_t) -> String {
    let mut name = std::ptr::null();
    // SAFETY: `name` is a valid out-pointer.
    check(unsafe { symmCommGetBackend(comm, &mut name) }, comm);
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// One rank's allocation, registered as a window.
pub struct RankBuffer {
    /// The rank.
    pub comm: symmComm_t,
    /// Base of the allocation (== the window base).
    pub base: *mut u8,
    /// Bytes.
    pub bytes: usize,
    /// The window.
    pub window: symmWindow_t,
}

// SAFETY: the handles and host pointers are used by one thread at a time in the tests.
unsafe impl Send for RankBuffer {}

/// Allocate `bytes` on every rank (not registered yet).
pub fn alloc(comms: &[symmComm_t], bytes: usize) -> Vec<RankBuffer> {
    comms
        .iter()
        .map(|&comm| {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            check(unsafe { symmMemAlloc(comm, &mut ptr, bytes) }, comm);
            RankBuffer {
                comm,
                base: ptr.cast(),
                bytes,
                window: std::ptr::null_mut(),
            }
        })
        .collect()
}

/// Register every buffer as a window, one thread driving all ranks (in a group).
pub fn register_all(buffers: &mut [RankBuffer]) {
    check(symmGroupStart(), std::ptr::null_mut());
    register_in_group(buffers);
    check(symmGroupEnd(), std::ptr::null_mut());
}

/// Allocate `bytes` on every rank and register it as a window (in a group).
pub fn alloc_windows(comms: &[symmComm_t], bytes: usize) -> Vec<RankBuffer> {
    let mut buffers = alloc(comms, bytes);
    register_all(&mut buffers);
    buffers
}

/// `symmAllReduce` of `count` float32 with sum on the default stream.
// The library validates every pointer before use, so passing any pointer is safe.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn all_reduce_f32_sum(
    comm: symmComm_t,
    send: *const u8,
    recv: *mut u8,
    count: usize,
) -> symmResult_t {
    symmAllReduce(
        send.cast(),
        recv.cast(),
        count,
        symmDataType_t::symmFloat32 as i32,
        symmRedOp_t::symmSum as i32,
        comm,
        std::ptr::null_mut(),
    )
}

/// Check every rank's `results` against the sum of `inputs` computed in f64, within the error
/// bound of a sequential f32 sum ((n - 1)·eps·Σ|x|, plus the rounding of the final value), and
/// check that all ranks hold bitwise-identical results.
#[track_caller]
pub fn assert_matches_f64_sum(inputs: &[Vec<f32>], results: &[Vec<f32>], case: &str) {
    let nranks = inputs.len();
    for i in 0..inputs[0].len() {
        let exact: f64 = inputs.iter().map(|x| x[i] as f64).sum();
        let magnitude: f64 = inputs.iter().map(|x| (x[i] as f64).abs()).sum();
        let tolerance = nranks as f64 * f32::EPSILON as f64 * magnitude + f64::MIN_POSITIVE;
        let got = results[0][i] as f64;
        assert!(
            (got - exact).abs() <= tolerance,
            "{case}: element {i} = {got}, expected {exact}"
        );
        for (rank, r) in results.iter().enumerate() {
            assert_eq!(
                r[i].to_bits(),
                results[0][i].to_bits(),
                "{case}: rank {rank} differs from rank 0 at element {i}"
            );
        }
    }
}

/// Two ranks driven by this thread all-reduce (f32 sum, in place, grouped) 1000 elements of
/// rank + 1 for `rounds` rounds, each result checked (3.0 everywhere); then teardown. The child
/// process of the tests that read what the library logs.
pub fn two_rank_grouped_all_reduces(rounds: usize) {
    let comms = init_all(2);
    let buffers = alloc_windows(&comms, 4000);
    for _ in 0..rounds {
        for (r, b) in buffers.iter().enumerate() {
            // SAFETY: host memory of the window.
            unsafe { write_f32(b.base, &vec![r as f32 + 1.0; 1000]) };
        }
        check(symmGroupStart(), std::ptr::null_mut());
        for b in &buffers {
            check(all_reduce_f32_sum(b.comm, b.base, b.base, 1000), b.comm);
        }
        check(symmGroupEnd(), std::ptr::null_mut());
        for b in &buffers {
            // SAFETY: host memory of the window.
            assert_eq!(unsafe { read_f32(b.base, 1000) }, vec![3.0; 1000]);
        }
    }
    teardown(buffers);
}

/// Deregister, free and destroy.
pub fn teardown(buffers: Vec<RankBuffer>) {
    for b in buffers {
        check(symmCommWindowDeregister(b.comm, b.window), b.comm);
        check(symmMemFree(b.comm, b.base.cast()), b.comm);
        check(symmCommDestroy(b.comm), std::ptr::null_mut());
    }
}

/// A small deterministic generator (SplitMix64), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A float in [-1, 1).
    pub fn unit_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `nranks` vectors of `count` random floats in [-1, 1), reproducible from `seed`.
pub fn random_inputs(nranks: usize, count: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    (0..nranks)
        .map(|_| (0..count).map(|_| rng.unit_f32()).collect())
        .collect()
}

/// Select the host backend for this test process, before any communicator exists. Every
/// host-backend test calls this first.
pub fn use_host_backend() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before any communicator is created; the library reads the
        // environment only while creating communicators, which every test does after this
        // call returns (Once blocks concurrent callers until then).
        unsafe { std::env::set_var("SYMM_BACKEND", "host") };
    });
}

/// Read `count` f32 at `ptr`.
///
/// # Safety
/// `ptr` is valid for `count` reads of f32 (host memory).
pub unsafe fn read_f32(ptr: *const u8, count: usize) -> Vec<f32> {
    // SAFETY: forwarded contract; `read_unaligned` tolerates any offset.
    (0..count)
        .map(|i| unsafe { (ptr as *const f32).add(i).read_unaligned() })
        .collect()
}

/// Write `values` at `ptr`.
///
/// # Safety
/// `ptr` is valid for `values.len()` writes of f32 (host memory).
pub unsafe fn write_f32(ptr: *mut u8, values: &[f32]) {
    for (i, v) in values.iter().enumerate() {
        // SAFETY: forwarded contract.
        unsafe { (ptr as *mut f32).add(i).write_unaligned(*v) };
    }
}

/// A unique id as hex text (to hand it to a child process through its environment).
pub fn id_to_hex(id: &symmUniqueId) -> String {
    id.internal
        .iter()
        .map(|c| format!("{:02x}", *c as u8))
        .collect()
}

/// The unique id written by [`id_to_hex`].
pub fn id_from_hex(text: &str) -> symmUniqueId {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    for (i, c) in id.internal.iter_mut().enumerate() {
        *c = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex") as std::ffi::c_char;
    }
    id
}

/// Register every buffer as a window in the calling thread's open group (completed by its
/// `symmGroupEnd`).
pub fn register_in_group(buffers: &mut [RankBuffer]) {
    for b in buffers.iter_mut() {
        // SAFETY: valid out-pointer; the buffer is a live allocation of this comm.
        check(
            unsafe {
                symmCommWindowRegister(
                    b.comm,
                    b.base.cast(),
                    b.bytes,
                    &mut b.window,
                    SYMM_WIN_COLL_SYMMETRIC,
                )
            },
            b.comm,
        );
    }
}

/// `nranks` ranks of `id` joined by `symmCommInitRank`, one thread each (returns once all
/// joined).
pub fn join_threads(id: symmUniqueId, nranks: usize) -> Vec<symmComm_t> {
    let handles: Vec<_> = (0..nranks)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut comm = std::ptr::null_mut();
                // SAFETY: valid out-pointer.
                check(
                    unsafe { symmCommInitRank(&mut comm, nranks as i32, id, rank as i32) },
                    std::ptr::null_mut(),
                );
                comm as usize
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("a joining thread") as symmComm_t)
        .collect()
}

/// Run `body(rank, comm)` for every rank of `comms`, each on a thread of its own, and return
/// the results in rank order (a panicking rank fails the caller).
pub fn on_rank_threads<R: Send>(
    comms: &[symmComm_t],
    body: impl Fn(usize, symmComm_t) -> R + Sync,
) -> Vec<R> {
    // Handles cross threads as addresses: the library looks every handle up.
    let addresses: Vec<usize> = comms.iter().map(|&c| c as usize).collect();
    let body = &body;
    std::thread::scope(|scope| {
        let threads: Vec<_> = addresses
            .iter()
            .enumerate()
            .map(|(rank, &c)| scope.spawn(move || body(rank, c as symmComm_t)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank thread failed"))
            .collect()
    })
}

/// Re-run the calling test binary's ignored test `test` alone in a child process, on the host
/// backend with `SYMM_DEBUG=INFO` and `env` set (settings read when a communicator is created
/// hold for the whole process, so each value needs its own); its output.
pub fn rerun_ignored_test(test: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", test, "--nocapture"])
        .env("SYMM_BACKEND", "host")
        .env("SYMM_DEBUG", "INFO");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("re-running the test binary")
}

/// What one rank reported of a call that was expected to fail: its result, how long the call
/// took, and its message (see [`print_outcome`], [`parse_outcome`]).
#[derive(Clone, Debug)]
pub struct RankOutcome {
    /// The rank.
    pub rank: usize,
    /// The call's result.
    pub result: symmResult_t,
    /// How long the call took.
    pub took: std::time::Duration,
    /// `symmGetLastError` after it.
    pub message: String,
}

/// Print `outcome` as one line a parent reads back with [`parse_outcome`].
pub fn print_outcome(result: symmResult_t, took: std::time::Duration, message: &str) {
    println!(
        "outcome {} {} {}",
        result as i32,
        took.as_micros(),
        message.replace('\n', " ")
    );
}

/// The outcome rank `rank` printed with [`print_outcome`] in `log`.
pub fn parse_outcome(rank: usize, log: &str) -> Option<RankOutcome> {
    let line = log
        .lines()
        .find_map(|l| l.find("outcome ").map(|at| &l[at + 8..]))?;
    let fields: Vec<&str> = line.splitn(3, ' ').collect();
    Some(RankOutcome {
        rank,
        result: symmResult_t::from_raw(fields.first()?.parse().ok()?)?,
        took: std::time::Duration::from_micros(fields.get(1)?.parse().ok()?),
        message: fields.get(2).unwrap_or(&"").to_string(),
    })
}

/// Run the calling test binary's ignored test `child` as one process per entry of `ranks`
/// (each entry: that rank's environment, on top of this process's), all at once; wait for
/// each (killed after `limit`) and return its success and its output. The output is read
/// while it runs, so a chatty child never blocks on a full pipe.
pub fn run_rank_processes(
    child: &str,
    ranks: &[Vec<(String, String)>],
    limit: std::time::Duration,
) -> Vec<(bool, String)> {
    let children: Vec<std::process::Child> = ranks
        .iter()
        .map(|env| {
            let mut command = std::process::Command::new(std::env::current_exe().unwrap());
            command
                .args([
                    "--include-ignored",
                    "--exact",
                    child,
                    "--nocapture",
                    "--test-threads=1",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            for (name, value) in env {
                command.env(name, value);
            }
            command.spawn().expect("starting a rank process")
        })
        .collect();
    let waiters: Vec<_> = children
        .into_iter()
        .map(|child| {
            let pid = child.id();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(child.wait_with_output());
            });
            (pid, rx)
        })
        .collect();
    let deadline = std::time::Instant::now() + limit;
    waiters
        .into_iter()
        .map(|(pid, rx)| {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let output = match rx.recv_timeout(left) {
                Ok(output) => output.expect("waiting for a rank process"),
                Err(_) => {
                    // SAFETY: signals a child started above, not reaped yet (its waiter still
                    // runs).
                    unsafe { kill(pid as i32, 9) };
                    rx.recv().unwrap().expect("waiting for a rank process")
                }
            };
            let mut log = String::from_utf8_lossy(&output.stdout).into_owned();
            log.push_str(&String::from_utf8_lossy(&output.stderr));
            (output.status.success(), log)
        })
        .collect()
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Select the backend for this test process before any communicator exists: the cuda backend
/// when `SYMM_BACKEND=cuda` is set (a GPU, or the simulated GPU), else the host backend.
pub fn use_backend_from_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var("SYMM_BACKEND").as_deref() != Ok("cuda") {
            // SAFETY: runs once, before any communicator is created (Once blocks concurrent
            // callers until then); the library reads the environment only then.
            unsafe { std::env::set_var("SYMM_BACKEND", "host") };
        }
    });
}

/// A fresh unique id (`symmGetUniqueId`), its root in this process.
pub fn new_unique_id() -> symmUniqueId {
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, std::ptr::null_mut());
    id
}

/// `true` when this process runs on the cuda backend (`SYMM_BACKEND=cuda`).
pub fn on_cuda() -> bool {
    std::env::var("SYMM_BACKEND").as_deref() == Ok("cuda")
}

/// Make device 0's primary context (the library's) current on this thread.
pub fn cuda_context() {
    use cudarc::driver::result;
    // SAFETY: device 0 exists (a communicator was made on it); its primary context is retained
    // by the library for the process.
    unsafe {
        let device = result::device::get(0).unwrap();
        let context = result::primary_ctx::retain(device).unwrap();
        result::ctx::set_current(context).unwrap();
    }
}

/// A new stream of the current context, capturing in thread-local mode (the caller ends the
/// capture and destroys the stream). Thread-local: a test binary's other tests run on other
/// threads at the same time, and a global capture would refuse their allocations; the
/// library's own calls on this thread are held to the same rule in either mode.
pub fn capturing_stream() -> cudarc::driver::sys::CUstream {
    use cudarc::driver::sys;
    let mut stream = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the current context is set (`cuda_context`); the stream is
    // new, so nothing else captures on it.
    unsafe {
        sys::cuStreamCreate(&mut stream, 0).result().unwrap();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        sys::cuStreamBeginCapture_v2(stream, mode).result().unwrap();
    }
    stream
}

/// A non-blocking stream of the current context (destroyed by the caller).
pub fn non_blocking_stream() -> cudarc::driver::sys::CUstream {
    use cudarc::driver::sys;
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller made a context current.
    unsafe {
        sys::cuStreamCreate(
            &mut stream,
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
        )
    }
    .result()
    .unwrap();
    stream
}

/// The stream a thread driving its own rank passes: on the cuda backend a non-blocking stream
/// of its own (ranks of one device launched separately must not meet on the legacy stream),
/// destroyed when dropped; NULL on the host backend.
pub struct RankStream(cudarc::driver::sys::CUstream);

impl RankStream {
    /// A stream for the calling thread's rank.
    pub fn new() -> RankStream {
        if !on_cuda() {
            return RankStream(std::ptr::null_mut());
        }
        cuda_context();
        RankStream(non_blocking_stream())
    }

    /// The stream as the C ABI takes it.
    pub fn handle(&self) -> symmStream_t {
        self.0.cast()
    }

    /// The result of a collective that returned `result` on this stream, once its work is
    /// done: on the cuda backend a call that was enqueued (success) completes later, and its
    /// failure (a kernel that gave up) is the communicator's asynchronous error after the
    /// stream's work; `symmGetLastError(comm)` then names it.
    pub fn completed(&self, comm: symmComm_t, result: symmResult_t) -> symmResult_t {
        if result != symmResult_t::symmSuccess || !on_cuda() {
            return result;
        }
        self.synchronize();
        async_error(comm)
    }

    /// Write `values` at `ptr` (window memory of this rank) in this stream's order, and wait
    /// for it: unlike [`put_f32`], it waits for no other rank's work (on one device, a
    /// context-wide wait also waits for a peer's kernel that waits for this rank).
    pub fn put_f32(&self, ptr: *mut u8, values: &[f32]) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        self.put_bytes(ptr, &bytes);
    }

    /// Read `count` f32 at `ptr` (window memory of this rank) in this stream's order: what
    /// [`RankStream::put_f32`] is to [`put_f32`].
    pub fn get_f32(&self, ptr: *const u8, count: usize) -> Vec<f32> {
        self.get_bytes(ptr, 4 * count)
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Write `bytes` at `ptr` (window memory of this rank) in this stream's order, and wait
    /// for it: unlike [`put_bytes`], it waits for no other rank's work (on one device, a
    /// context-wide wait also waits for a peer's kernel that waits for this rank).
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn put_bytes(&self, ptr: *mut u8, bytes: &[u8]) {
        if !on_cuda() {
            return put_bytes(ptr, bytes);
        }
        // SAFETY: device memory of this rank with room for `bytes`, which outlive the copy (the
        // stream is synchronized before returning).
        unsafe {
            cudarc::driver::sys::cuMemcpyHtoDAsync_v2(
                ptr as cudarc::driver::sys::CUdeviceptr,
                bytes.as_ptr().cast(),
                bytes.len(),
                self.0,
            )
        }
        .result()
        .unwrap();
        self.synchronize();
    }

    /// Read `count` bytes at `ptr` (window memory of this rank) in this stream's order: what
    /// [`RankStream::put_bytes`] is to [`put_bytes`].
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    pub fn get_bytes(&self, ptr: *const u8, count: usize) -> Vec<u8> {
        if !on_cuda() {
            return get_bytes(ptr, count);
        }
        let mut out = vec![0u8; count];
        // SAFETY: device memory of this rank holding `count` bytes; `out` outlives the copy
        // (the stream is synchronized before returning).
        unsafe {
            cudarc::driver::sys::cuMemcpyDtoHAsync_v2(
                out.as_mut_ptr().cast(),
                ptr as cudarc::driver::sys::CUdeviceptr,
                count,
                self.0,
            )
        }
        .result()
        .unwrap();
        self.synchronize();
        out
    }

    /// Wait for the stream's work (nothing to wait for on the host backend).
    pub fn synchronize(&self) {
        if on_cuda() {
            // SAFETY: a stream made by `new`; a context is current.
            unsafe { cudarc::driver::sys::cuStreamSynchronize(self.0) }
                .result()
                .unwrap();
        }
    }
}

impl Default for RankStream {
    fn default() -> Self {
        RankStream::new()
    }
}

impl Drop for RankStream {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: made by `new`, destroyed once; its work is done or abandoned.
            let _ = unsafe { cudarc::driver::sys::cuStreamDestroy_v2(self.0) };
        }
    }
}

/// Allocate `bytes` on `comm` and register them as a window (collective: every rank of the
/// communicator calls it, outside a group); the buffer and the window.
// The library validates the handle before any use, so passing any pointer is safe.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn window_of_bytes(comm: symmComm_t, bytes: usize) -> (*mut c_void, symmWindow_t) {
    let mut buffer: *mut c_void = std::ptr::null_mut();
    let mut window = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the buffer is a live allocation of this comm.
    unsafe {
        check(symmMemAlloc(comm, &mut buffer, bytes), comm);
        check(
            symmCommWindowRegister(comm, buffer, bytes, &mut window, SYMM_WIN_COLL_SYMMETRIC),
            comm,
        );
    }
    (buffer, window)
}

/// Write `values` at `ptr`, window memory of this process: a synchronous copy on the cuda
/// backend (after the work queued on the legacy stream), plain stores on the host backend.
/// Tests pass window memory of their own ranks only (as `read_f32`'s callers vouch).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn put_f32(ptr: *mut u8, values: &[f32]) {
    if on_cuda() {
        cuda_context();
        // SAFETY: `ptr` is device memory from symmMemAlloc with room for `values`; the
        // synchronous copy waits for the work queued on the legacy stream.
        unsafe {
            cudarc::driver::result::memcpy_htod_sync(
                ptr as cudarc::driver::sys::CUdeviceptr,
                values,
            )
        }
        .unwrap();
    } else {
        // SAFETY: host memory from symmMemAlloc with room for `values`; no call is in flight.
        unsafe { write_f32(ptr, values) };
    }
}

/// Read `count` f32 at `ptr`, window memory of this process (on the cuda backend after the
/// context's work).
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn get_f32(ptr: *const u8, count: usize) -> Vec<f32> {
    if on_cuda() {
        cuda_context();
        let mut out = vec![0f32; count];
        // SAFETY: as in `put_f32`.
        unsafe {
            cudarc::driver::sys::cuCtxSynchronize().result().unwrap();
            cudarc::driver::result::memcpy_dtoh_sync(
                &mut out,
                ptr as cudarc::driver::sys::CUdeviceptr,
            )
            .unwrap();
        }
        out
    } else {
        // SAFETY: as in `put_f32`.
        unsafe { read_f32(ptr, count) }
    }
}

/// Write `bytes` at `ptr`, window memory of this process, as [`put_f32`] writes values.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn put_bytes(ptr: *mut u8, bytes: &[u8]) {
    if on_cuda() {
        cuda_context();
        // SAFETY: as in `put_f32`.
        unsafe {
            cudarc::driver::result::memcpy_htod_sync(ptr as cudarc::driver::sys::CUdeviceptr, bytes)
        }
        .unwrap();
    } else {
        // SAFETY: host memory from symmMemAlloc with room for `bytes`; no call is in flight.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
    }
}

/// Read `count` bytes at `ptr`, window memory of this process, as [`get_f32`] reads values.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn get_bytes(ptr: *const u8, count: usize) -> Vec<u8> {
    let mut out = vec![0u8; count];
    if on_cuda() {
        cuda_context();
        // SAFETY: as in `get_f32`.
        unsafe {
            cudarc::driver::sys::cuCtxSynchronize().result().unwrap();
            cudarc::driver::result::memcpy_dtoh_sync(
                &mut out,
                ptr as cudarc::driver::sys::CUdeviceptr,
            )
            .unwrap();
        }
    } else {
        // SAFETY: host memory from symmMemAlloc holding `count` bytes; no call is in flight.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), count) };
    }
    out
}

/// Memory the caller allocated itself, in no window: device memory from `cuMemAlloc` on the
/// cuda backend, a heap buffer on the host backend.
pub struct OwnMemory {
    /// Its first byte.
    pub ptr: *mut u8,
    host: Option<Vec<u8>>,
}

impl OwnMemory {
    /// `bytes` of memory in no window.
    pub fn new(bytes: usize) -> OwnMemory {
        if on_cuda() {
            cuda_context();
            let mut address = 0;
            // SAFETY: valid out-pointer; a context is current.
            unsafe { cudarc::driver::sys::cuMemAlloc_v2(&mut address, bytes) }
                .result()
                .unwrap();
            OwnMemory {
                ptr: address as *mut u8,
                host: None,
            }
        } else {
            let mut host = vec![0u8; bytes];
            OwnMemory {
                ptr: host.as_mut_ptr(),
                host: Some(host),
            }
        }
    }
}

impl Drop for OwnMemory {
    fn drop(&mut self) {
        if self.host.is_none() {
            cuda_context();
            // SAFETY: allocated by `new`, freed once; the tests synchronize their streams
            // before dropping it.
            unsafe { cudarc::driver::sys::cuMemFree_v2(self.ptr as u64) };
        }
    }
}

/// Build the stand-in C library `tests/fakes/<source>` (warnings denied) as `library` in
/// `out_dir` (a test's scratch directory): its path.
pub fn build_fake_library(
    source: &str,
    out_dir: &std::path::Path,
    library: &str,
) -> std::path::PathBuf {
    std::fs::create_dir_all(out_dir).unwrap();
    let library = out_dir.join(library);
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fakes")
        .join(source);
    let status = std::process::Command::new(std::env::var("CC").unwrap_or("cc".into()))
        .args([
            "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-O1", "-o",
        ])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("running the C compiler");
    assert!(status.success(), "building {source:?}");
    library
}
