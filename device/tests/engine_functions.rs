//! The device functions on engine windows (`BackendTag::Nvshmem`: no peer reachable by loads
//! and stores), run on the host emulation against a stand-in engine that copies between the
//! ranks' memories as NVSHMEM's put-with-signal does. Each rank's grid is a separate launch.
//! The results are compared bit for bit with the native device functions on the same inputs
//! (themselves checked against the launched kernels and f64 references in
//! `triton_functions.rs`), and with references computed here.

mod harness;

use harness::{Ranks, Rng};
use std::sync::atomic::{AtomicU64, Ordering};
use symm_device::arch::host::run_grid;
use symm_device::context::{BackendTag, CONTEXT_VERSION, ENGINE_COMM, ENGINE_SIGNALS, SymmContext};
use symm_device::engine::{Place, SignalEngine, inbox_slot_bytes};
use symm_device::sync::abort::{
    ABORT_INVALID_LAUNCH, ABORT_PEER_FAILED, ABORT_TIMED_OUT, timed_out_peer,
};
use symm_device::sync::signal_pad::signal_pad_bytes;
use symm_device::triton::{
    status, symm_all_gather_device, symm_all_reduce_device, symm_any_all_reduce_device,
    symm_any_barrier_device, symm_engine_all_gather_device, symm_engine_all_reduce_device,
    symm_engine_barrier_device,
};
use symm_device::{DataType, RedOp};

const SECOND: u64 = 1_000_000_000;
const OPS: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Chunk([u8; 16]);

fn aligned(bytes: usize) -> Vec<Chunk> {
    vec![Chunk([0; 16]); bytes.div_ceil(16)]
}

/// `world` ranks whose windows and pads only the engine connects: every context's peer tables
/// hold 0 for every other rank.
struct EngineRanks {
    windows: Vec<Vec<Chunk>>,
    pads: Vec<Vec<Chunk>>,
    aborts: Vec<u32>,
    /// Per rank, its own `[bases; world]` and `[pads; world]` tables (0 for peers).
    tables: Vec<Vec<u64>>,
    contexts: Vec<SymmContext>,
    window_bytes: usize,
}

impl EngineRanks {
    fn new(world: usize, window_bytes: usize, timeout_ns: u64) -> Box<EngineRanks> {
        let mut ranks = Box::new(EngineRanks {
            windows: (0..world).map(|_| aligned(window_bytes)).collect(),
            pads: (0..world)
                .map(|_| aligned(signal_pad_bytes(world)))
                .collect(),
            aborts: vec![0; world],
            tables: Vec::new(),
            contexts: Vec::new(),
            window_bytes,
        });
        for rank in 0..world {
            let base = ranks.windows[rank].as_mut_ptr() as u64;
            let pad = ranks.pads[rank].as_mut_ptr() as u64;
            let mut table = vec![0u64; 2 * world];
            table[rank] = base;
            table[world + rank] = pad;
            ranks.tables.push(table);
            let _ = pad;
        }
        for rank in 0..world {
            let table = ranks.tables[rank].as_ptr() as u64;
            let base = ranks.windows[rank].as_ptr() as u64;
            let pad = ranks.pads[rank].as_ptr() as u64;
            let abort = &mut ranks.aborts[rank] as *mut u32 as u64;
            ranks.contexts.push(SymmContext {
                backend: BackendTag::Nvshmem as u32,
                version: CONTEXT_VERSION,
                rank: rank as u32,
                world_size: world as u32,
                local_base: base,
                window_size: window_bytes as u64,
                peer_bases: table,
                peer_signal_pads: table + 8 * world as u64,
                signal_pad_size: signal_pad_bytes(world) as u64,
                abort_flag: abort,
                timeout_ns,
                engine: [base, pad, 0],
            });
        }
        ranks
    }

    fn world(&self) -> usize {
        self.windows.len()
    }

    /// Make every context an NCCL engine context: the engine words are handles the stand-in
    /// never dereferences (a data window, a pad window, a device communicator).
    fn as_nccl(&mut self) {
        for context in &mut self.contexts {
            context.backend = BackendTag::Nccl as u32;
            context.engine = [0xd000, 0x5000, 0xc000];
        }
    }

    fn engine<const NCCL: bool>(&self) -> FakeEngine<NCCL> {
        FakeEngine::new(
            self.windows
                .iter()
                .map(|w| (w.as_ptr() as u64, (w.len() * 16) as u64))
                .collect(),
            self.pads
                .iter()
                .map(|p| (p.as_ptr() as u64, (p.len() * 16) as u64))
                .collect(),
        )
    }

    fn context_address(&self, rank: usize) -> i64 {
        &self.contexts[rank] as *const SymmContext as i64
    }

    fn write(&mut self, rank: usize, offset: usize, bytes: &[u8]) {
        let window = self.window(rank);
        window[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn read(&mut self, rank: usize, offset: usize, len: usize) -> Vec<u8> {
        self.window(rank)[offset..offset + len].to_vec()
    }

    fn window(&mut self, rank: usize) -> &mut [u8] {
        let bytes = self.window_bytes;
        let chunks = &mut self.windows[rank];
        // SAFETY: 16-byte aligned plain bytes.
        unsafe { std::slice::from_raw_parts_mut(chunks.as_mut_ptr().cast(), bytes) }
    }

    fn abort_word(&self, rank: usize) -> u32 {
        // SAFETY: a live word; no grid runs while the test looks.
        unsafe { std::ptr::read_volatile(&self.aborts[rank]) }
    }

    /// Run `body(rank)` on every thread of a separate `programs × threads` grid per rank in
    /// `active`, the grids concurrently; each rank's status (every thread's must agree).
    fn run(
        &self,
        programs: u32,
        threads: u32,
        active: &[usize],
        body: &(dyn Fn(usize) -> i32 + Sync),
    ) -> Vec<i32> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = active
                .iter()
                .map(|&rank| {
                    scope.spawn(move || {
                        let results = std::sync::Mutex::new(Vec::new());
                        run_grid(programs, threads, &|| {
                            let result = body(rank);
                            results.lock().unwrap().push(result);
                        });
                        let results = results.into_inner().unwrap();
                        assert!(
                            results.iter().all(|r| *r == results[0]),
                            "rank {rank}: threads disagree on the status: {results:?}"
                        );
                        results[0]
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn run_all(
        &self,
        programs: u32,
        threads: u32,
        body: &(dyn Fn(usize) -> i32 + Sync),
    ) -> Vec<i32> {
        let all: Vec<usize> = (0..self.world()).collect();
        self.run(programs, threads, &all, body)
    }
}

/// A stand-in for an engine's device API (NVSHMEM's, or NCCL's GIN when `NCCL`) over the ranks'
/// host memories: a place in the data or pad is the target rank's memory at that offset. A put
/// is queued to a "NIC" thread that delivers queued puts in random order, reading the source
/// only then, and adds to the put's signal after copying (the data before the signal, as
/// `nvshmemx_putmem_signal_nbi_block` and GIN's signalled puts guarantee); `quiet` waits until
/// every queued put was delivered. So a source reused before `quiet` is caught. With
/// `gives_up` set, `quiet` returns at once saying it gave up (as NCCL's bounded flush does at
/// its timeout).
struct FakeEngine<const NCCL: bool> {
    windows: Vec<(u64, u64)>,
    pads: Vec<(u64, u64)>,
    nic: std::sync::Arc<Nic>,
    worker: Option<std::thread::JoinHandle<()>>,
    gives_up: std::sync::atomic::AtomicBool,
}

/// A put not delivered yet: destination, source, bytes, signal (destination and signal as the
/// target maps them).
type QueuedPut = (u64, u64, u64, u64);

/// The puts not delivered yet, and whether the stand-in is dropped.
struct Nic {
    queue: std::sync::Mutex<(Vec<QueuedPut>, bool)>,
    changed: std::sync::Condvar,
}

/// The stand-in engine of NVSHMEM contexts.
type FakeNvshmem = FakeEngine<false>;
/// The stand-in engine of NCCL contexts.
type FakeNccl = FakeEngine<true>;

impl<const NCCL: bool> FakeEngine<NCCL> {
    fn new(windows: Vec<(u64, u64)>, pads: Vec<(u64, u64)>) -> FakeEngine<NCCL> {
        let nic = std::sync::Arc::new(Nic {
            queue: std::sync::Mutex::new((Vec::new(), false)),
            changed: std::sync::Condvar::new(),
        });
        let worker = {
            let nic = nic.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(99);
                loop {
                    let mut queue = nic.queue.lock().unwrap();
                    while queue.0.is_empty() && !queue.1 {
                        queue = nic.changed.wait(queue).unwrap();
                    }
                    if queue.0.is_empty() {
                        return;
                    }
                    let pick = (rng.next_u64() % queue.0.len() as u64) as usize;
                    let (to, src, bytes, signal) = queue.0.swap_remove(pick);
                    // SAFETY: both ranges lie in live memories of the model (a rank waits for
                    // its puts in `quiet` before its call returns).
                    unsafe { std::ptr::copy(src as *const u8, to as *mut u8, bytes as usize) };
                    // SAFETY: an aligned signal word of a live pad.
                    unsafe { AtomicU64::from_ptr(signal as *mut u64) }
                        .fetch_add(1, Ordering::Release);
                    nic.changed.notify_all();
                    drop(queue);
                    std::thread::yield_now();
                }
            })
        };
        FakeEngine {
            windows,
            pads,
            nic,
            worker: Some(worker),
            gives_up: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The address of `bytes` bytes at `place` in `pe`'s memory (checked to lie in it).
    fn translate(&self, place: Place, bytes: u64, pe: u32) -> u64 {
        let ((base, len), offset) = match place {
            Place::Data(offset) => (self.windows[pe as usize], offset),
            Place::Pad(offset) => (self.pads[pe as usize], offset),
        };
        assert!(
            offset + bytes <= len,
            "{place:?} + {bytes} leaves rank {pe}'s region"
        );
        base + offset
    }
}

impl<const NCCL: bool> Drop for FakeEngine<NCCL> {
    fn drop(&mut self) {
        self.nic.queue.lock().unwrap().1 = true;
        self.nic.changed.notify_all();
        let _ = self.worker.take().map(|w| w.join());
    }
}

// SAFETY: a put's bytes are copied before its signal is added (release), adds are atomic, and
// `quiet` returns once every queued put was delivered.
unsafe impl<const NCCL: bool> SignalEngine for FakeEngine<NCCL> {
    const TAG: BackendTag = if NCCL {
        BackendTag::Nccl
    } else {
        BackendTag::Nvshmem
    };

    fn accepts(ctx: &SymmContext) -> bool {
        if NCCL {
            ctx.engine[ENGINE_COMM] != 0
        } else {
            ctx.engine[ENGINE_SIGNALS].is_multiple_of(16)
        }
    }

    unsafe fn put_with_signal(
        &self,
        ctx: &SymmContext,
        dest: Place,
        src: u64,
        bytes: u64,
        signal: u64,
        pe: u32,
    ) {
        symm_device::arch::host::sync_threads();
        if symm_device::arch::host::thread_idx_x() == 0 {
            let to = self.translate(dest, bytes, pe);
            let src = self.translate(Place::Data(src), bytes, ctx.rank);
            let signal = self.translate(Place::Pad(signal), 8, pe);
            self.nic
                .queue
                .lock()
                .unwrap()
                .0
                .push((to, src, bytes, signal));
            self.nic.changed.notify_all();
        }
        symm_device::arch::host::sync_threads();
    }

    unsafe fn signal_add(&self, _: &SymmContext, signal: u64, pe: u32) {
        // SAFETY: an aligned signal word of a live pad.
        unsafe { AtomicU64::from_ptr(self.translate(Place::Pad(signal), 8, pe) as *mut u64) }
            .fetch_add(1, Ordering::Release);
    }

    unsafe fn signal_reached(&self, ctx: &SymmContext, signal: u64, target: u64) -> bool {
        let word = self.translate(Place::Pad(signal), 8, ctx.rank);
        // SAFETY: an aligned signal word of this rank's live pad.
        unsafe { AtomicU64::from_ptr(word as *mut u64) }.load(Ordering::Acquire) >= target
    }

    unsafe fn quiet(&self, _: &SymmContext) -> bool {
        if self.gives_up.load(Ordering::Relaxed) {
            return false;
        }
        let mut queue = self.nic.queue.lock().unwrap();
        while !queue.0.is_empty() {
            queue = self.nic.changed.wait(queue).unwrap();
        }
        true
    }
}

/// Small finite values of `dtype` as bytes (as in `triton_functions.rs`).
fn sample(rng: &mut Rng, dtype: DataType, count: usize) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut out = Vec::with_capacity(count * size);
    for _ in 0..count {
        let small = (rng.next_u64() % 5) as i32 - 2;
        let value: Vec<u8> = match dtype {
            DataType::Float32 => (small as f32).to_le_bytes().to_vec(),
            DataType::Float64 => (small as f64).to_le_bytes().to_vec(),
            DataType::Bfloat16 => ((small as f32).to_bits() >> 16).to_le_bytes()[..2].to_vec(),
            DataType::Float16 => {
                let bits: u16 = [0xC000, 0xBC00, 0, 0x3C00, 0x4000][(small + 2) as usize];
                bits.to_le_bytes().to_vec()
            }
            DataType::Float8E4M3 => vec![[0xC0, 0xB8, 0, 0x38, 0x40][(small + 2) as usize]],
            DataType::Float8E5M2 => vec![[0xC0, 0xBC, 0, 0x3C, 0x40][(small + 2) as usize]],
            _ => (0..size).map(|_| rng.next_u64() as u8).collect(),
        };
        out.extend_from_slice(&value);
    }
    out
}

/// The native device function's all-reduce of `inputs` (rank 0's result).
fn native_all_reduce(inputs: &[Vec<u8>], offset: usize, dtype: DataType, op: RedOp) -> Vec<u8> {
    let world = inputs.len();
    let count = inputs[0].len() / dtype.size_bytes();
    let mut ranks = Ranks::new(world, offset + inputs[0].len() + 64, 5 * SECOND);
    for (r, input) in inputs.iter().enumerate() {
        ranks.write(r, offset, input);
    }
    let shared = &*ranks;
    let statuses = shared.run_per_rank(2, 4, None, &|r| {
        // SAFETY: a live native context; the range fits the window.
        unsafe {
            symm_all_reduce_device(
                shared.context_address(r),
                0,
                offset as i64,
                count as i64,
                op as i32,
                dtype as i32,
            )
        }
    });
    assert!(
        statuses.iter().all(|s| *s == status::SUCCESS),
        "{statuses:?}"
    );
    ranks.read::<u8>(0, offset, inputs[0].len())
}

/// Every data type and operator, 1 to 4 ranks, 1 to 3 programs: the engine all-reduce gives
/// every rank the native one's bits.
#[test]
fn all_reduce_matches_the_native_function_for_every_dtype_and_op() {
    let mut rng = Rng(11);
    for world in 1..=4usize {
        for dtype in DataType::ALL {
            for op in OPS {
                let count = [1usize, 7, 45][(world + dtype as usize + op as usize) % 3];
                let programs = 1 + (dtype as u32 + op as u32) % 3;
                let offset = 32 * dtype.size_bytes();
                let inputs: Vec<Vec<u8>> =
                    (0..world).map(|_| sample(&mut rng, dtype, count)).collect();
                let expected = native_all_reduce(&inputs, offset, dtype, op);
                let mut ranks = EngineRanks::new(world, 4096, 5 * SECOND);
                for (r, input) in inputs.iter().enumerate() {
                    ranks.write(r, offset, input);
                }
                let engine: FakeNvshmem = ranks.engine();
                let shared = &*ranks;
                let statuses = shared.run_all(programs, 4, &|r| {
                    // SAFETY: a live engine context; the range fits the window.
                    unsafe {
                        symm_engine_all_reduce_device(
                            &engine,
                            shared.context_address(r),
                            0,
                            offset as i64,
                            count as i64,
                            op as i32,
                            dtype as i32,
                        )
                    }
                });
                assert!(
                    statuses.iter().all(|s| *s == status::SUCCESS),
                    "{statuses:?}"
                );
                for r in 0..world {
                    assert_eq!(
                        ranks.read(r, offset, inputs[0].len()),
                        expected,
                        "{world} ranks, {programs} programs, {dtype:?} {op:?}, rank {r}"
                    );
                }
            }
        }
    }
}

/// Counts that take many rounds of the inbox: exact integer sums against a reference computed
/// here, with a window offset that is not a multiple of 16.
#[test]
fn all_reduce_in_many_rounds_is_exact() {
    let mut rng = Rng(5);
    for (world, programs) in [(2usize, 1u32), (3, 2), (4, 3)] {
        let slot = inbox_slot_bytes(world, programs as usize);
        let count = 3 * slot / 8 * programs as usize + 13;
        let offset = 8;
        let inputs: Vec<Vec<u64>> = (0..world)
            .map(|_| (0..count).map(|_| rng.next_u64()).collect())
            .collect();
        let mut ranks = EngineRanks::new(world, offset + count * 8 + 64, 10 * SECOND);
        for (r, input) in inputs.iter().enumerate() {
            ranks.write(r, offset, bytemuck_bytes(input));
        }
        let engine: FakeNvshmem = ranks.engine();
        let shared = &*ranks;
        let statuses = shared.run_all(programs, 8, &|r| {
            // SAFETY: a live engine context; the range fits the window.
            unsafe {
                symm_engine_all_reduce_device(
                    &engine,
                    shared.context_address(r),
                    0,
                    offset as i64,
                    count as i64,
                    RedOp::Sum as i32,
                    DataType::Uint64 as i32,
                )
            }
        });
        assert!(
            statuses.iter().all(|s| *s == status::SUCCESS),
            "{statuses:?}"
        );
        let expected: Vec<u64> = (0..count)
            .map(|i| {
                inputs
                    .iter()
                    .fold(0u64, |acc, input| acc.wrapping_add(input[i]))
            })
            .collect();
        for r in 0..world {
            assert_eq!(
                ranks.read(r, offset, count * 8),
                bytemuck_bytes(&expected),
                "{world} ranks, {programs} programs, rank {r}"
            );
        }
    }
}

fn bytemuck_bytes(values: &[u64]) -> &[u8] {
    // SAFETY: u64s viewed as bytes.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), values.len() * 8) }
}

/// All-gather in place and out of place, odd byte counts, 1 to 4 ranks and programs.
#[test]
fn all_gather_is_exact_in_place_and_out_of_place() {
    let mut rng = Rng(3);
    for world in 1..=4usize {
        for (n_bytes, programs) in [(1usize, 1u32), (13, 2), (1000, 3), (4099, 4)] {
            for in_place in [false, true] {
                let recv = 64;
                let send = if in_place {
                    0
                } else {
                    recv + world * n_bytes + 16
                };
                let inputs: Vec<Vec<u8>> = (0..world)
                    .map(|_| (0..n_bytes).map(|_| rng.next_u64() as u8).collect())
                    .collect();
                let mut ranks =
                    EngineRanks::new(world, recv + 2 * world * n_bytes + 64 + n_bytes, 5 * SECOND);
                for (r, input) in inputs.iter().enumerate() {
                    let at = if in_place { recv + r * n_bytes } else { send };
                    ranks.write(r, at, input);
                }
                let engine: FakeNvshmem = ranks.engine();
                let shared = &*ranks;
                let statuses = shared.run_all(programs, 4, &|r| {
                    let send = if in_place { recv + r * n_bytes } else { send };
                    // SAFETY: a live engine context; the ranges fit the window.
                    unsafe {
                        symm_engine_all_gather_device(
                            &engine,
                            shared.context_address(r),
                            send as i64,
                            recv as i64,
                            n_bytes as i64,
                        )
                    }
                });
                assert!(
                    statuses.iter().all(|s| *s == status::SUCCESS),
                    "{statuses:?}"
                );
                let expected: Vec<u8> = inputs.concat();
                for r in 0..world {
                    assert_eq!(
                        ranks.read(r, recv, world * n_bytes),
                        expected,
                        "{world} ranks, {n_bytes} bytes, {programs} programs, in place \
                         {in_place}, rank {r}"
                    );
                }
            }
        }
    }
}

/// One call of [`mixed_calls_with_changing_grids_stay_exact`]: its grid and what it does.
#[derive(Clone)]
enum Mixed {
    /// Max-reduce of each rank's `u64`s at offset 16.
    Reduce(Vec<Vec<u64>>),
    /// All-gather of each rank's bytes from 32 KiB to 40 KiB.
    Gather(Vec<Vec<u8>>),
    Barrier,
}

/// A long sequence of mixed calls on one window, each a separate launch whose grid changes
/// from call to call (the inbox's slots move with the grid). Every rank runs its sequence on
/// its own, as on its own stream, so a rank may be a call ahead of the others: every result
/// exact.
#[test]
fn mixed_calls_with_changing_grids_stay_exact() {
    let world = 3usize;
    let count = 700usize;
    let mut rng = Rng(21);
    let calls: Vec<(u32, Mixed)> = (0..60)
        .map(|call| {
            let programs = 1 + (rng.next_u64() % 4) as u32;
            // Mostly reductions, so that several run back to back with different grids.
            let what = match rng.next_u64() % 5 {
                0..=2 => Mixed::Reduce(
                    (0..world)
                        .map(|_| (0..count).map(|_| rng.next_u64() % 1000).collect())
                        .collect(),
                ),
                3 => {
                    let n = 333 + call;
                    Mixed::Gather(
                        (0..world)
                            .map(|_| (0..n).map(|_| rng.next_u64() as u8).collect())
                            .collect(),
                    )
                }
                _ => Mixed::Barrier,
            };
            (programs, what)
        })
        .collect();
    let ranks = EngineRanks::new(world, 64 * 1024, 10 * SECOND);
    let engine: FakeNvshmem = ranks.engine();
    let bases: Vec<usize> = ranks
        .contexts
        .iter()
        .map(|c| c.local_base as usize)
        .collect();
    let shared = &*ranks;
    std::thread::scope(|scope| {
        for rank in 0..world {
            let (calls, engine, base) = (&calls, &engine, bases[rank]);
            scope.spawn(move || {
                let window = base as *mut u8;
                for (call, (programs, what)) in calls.iter().enumerate() {
                    // SAFETY: this rank's own window, between its launches; peers only put
                    // into it during a call.
                    unsafe {
                        match what {
                            Mixed::Reduce(inputs) => std::ptr::copy_nonoverlapping(
                                inputs[rank].as_ptr().cast::<u8>(),
                                window.add(16),
                                count * 8,
                            ),
                            Mixed::Gather(inputs) => std::ptr::copy_nonoverlapping(
                                inputs[rank].as_ptr(),
                                window.add(32 * 1024),
                                inputs[rank].len(),
                            ),
                            Mixed::Barrier => {}
                        }
                    }
                    let statuses = std::sync::Mutex::new(Vec::new());
                    run_grid(*programs, 4, &|| {
                        let ctx = shared.context_address(rank);
                        // SAFETY: a live engine context; the ranges fit the window.
                        let status = unsafe {
                            match what {
                                Mixed::Reduce(_) => symm_engine_all_reduce_device(
                                    engine,
                                    ctx,
                                    0,
                                    16,
                                    count as i64,
                                    RedOp::Max as i32,
                                    DataType::Uint64 as i32,
                                ),
                                Mixed::Gather(inputs) => symm_engine_all_gather_device(
                                    engine,
                                    ctx,
                                    32 * 1024,
                                    40 * 1024,
                                    inputs[0].len() as i64,
                                ),
                                Mixed::Barrier => symm_engine_barrier_device(engine, ctx),
                            }
                        };
                        statuses.lock().unwrap().push(status);
                    });
                    let statuses = statuses.into_inner().unwrap();
                    assert!(
                        statuses.iter().all(|s| *s == status::SUCCESS),
                        "rank {rank}, call {call}: {statuses:?}"
                    );
                    // SAFETY: as above.
                    unsafe {
                        match what {
                            Mixed::Reduce(inputs) => {
                                let expected: Vec<u64> = (0..count)
                                    .map(|i| inputs.iter().map(|v| v[i]).max().unwrap())
                                    .collect();
                                let got = std::slice::from_raw_parts(window.add(16), count * 8);
                                assert_eq!(
                                    got,
                                    bytemuck_bytes(&expected),
                                    "rank {rank}, call {call}"
                                );
                            }
                            Mixed::Gather(inputs) => {
                                let all = inputs.concat();
                                let got =
                                    std::slice::from_raw_parts(window.add(40 * 1024), all.len());
                                assert_eq!(got, &all[..], "rank {rank}, call {call}");
                            }
                            Mixed::Barrier => {}
                        }
                    }
                }
            });
        }
    });
    assert!((0..world).all(|r| ranks.abort_word(r) == 0));
}

/// A rank that skips a barrier: the others time out within the window's bound and their abort
/// words name the absent rank.
#[test]
fn a_missing_rank_times_out_naming_it() {
    let ranks = EngineRanks::new(3, 1024, SECOND / 5);
    let engine: FakeNvshmem = ranks.engine();
    let statuses = ranks.run(2, 2, &[0, 2], &|r| {
        // SAFETY: a live engine context.
        unsafe { symm_engine_barrier_device(&engine, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::TIMEOUT, status::TIMEOUT]);
    for r in [0, 2] {
        assert_eq!(timed_out_peer(ranks.abort_word(r)), Some(1), "rank {r}");
    }
    // The window is failed: a later call returns at once.
    let later = ranks.run(1, 2, &[0], &|r| {
        // SAFETY: as above.
        unsafe { symm_engine_barrier_device(&engine, ranks.context_address(r)) }
    });
    assert_eq!(later, vec![status::TIMEOUT]);
}

/// The routes: an engine function refuses a native context and a context without engine
/// words; the native function refuses an engine context; the dispatching function takes each
/// context's own route. Every refusal of a valid context fails its window (abort word raised),
/// as a refused argument does.
#[test]
fn routes_follow_the_tag() {
    let mut ranks = EngineRanks::new(2, 1024, SECOND);
    let engine: FakeNvshmem = ranks.engine();
    // Native function on an engine context.
    let statuses = ranks.run_all(1, 2, &|r| {
        // SAFETY: a live context.
        unsafe { symm_all_gather_device(ranks.context_address(r), 0, 64, 8) }
    });
    assert_eq!(statuses, vec![status::UNKNOWN_BACKEND; 2]);
    assert_eq!(
        [ranks.abort_word(0), ranks.abort_word(1)],
        [ABORT_INVALID_LAUNCH; 2]
    );
    // In place: the contexts point at these words.
    ranks.aborts.iter_mut().for_each(|word| *word = 0);
    // The dispatching function on the engine context: the engine's barrier.
    let statuses = ranks.run_all(2, 2, &|r| {
        // SAFETY: a live engine context.
        unsafe { symm_any_barrier_device(&engine, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::SUCCESS; 2]);
    // Without engine words: refused before anything is touched but the abort word.
    ranks.contexts[0].engine[ENGINE_SIGNALS] = 0;
    let statuses = ranks.run(1, 2, &[0], &|r| {
        // SAFETY: a live context.
        unsafe { symm_engine_barrier_device(&engine, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::INVALID_ARGUMENT]);
    assert_eq!(ranks.abort_word(0), ABORT_INVALID_LAUNCH);
    // An unknown tag.
    ranks.contexts[1].backend = 7;
    let statuses = ranks.run(1, 2, &[1], &|r| {
        // SAFETY: a live context.
        unsafe { symm_any_barrier_device(&engine, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::UNKNOWN_BACKEND]);
    assert_eq!(ranks.abort_word(1), ABORT_INVALID_LAUNCH);

    // An engine function on native contexts.
    let refused = Ranks::new(2, 1024, SECOND);
    let statuses = refused.run_per_rank(1, 2, None, &|r| {
        // SAFETY: a live native context.
        unsafe { symm_engine_barrier_device(&engine, refused.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::UNKNOWN_BACKEND; 2]);
    assert!(refused.aborted(0) && refused.aborted(1));
    // The dispatching function runs native contexts natively.
    let mut native = Ranks::new(2, 1024, SECOND);
    native.write(0, 0, &[1u32, 2]);
    native.write(1, 0, &[10u32, 20]);
    let shared = &*native;
    let statuses = shared.run_per_rank(2, 2, None, &|r| {
        // SAFETY: a live native context; the range fits the window.
        unsafe {
            symm_any_all_reduce_device(
                &engine,
                shared.context_address(r),
                0,
                0,
                2,
                RedOp::Sum as i32,
                DataType::Uint32 as i32,
            )
        }
    });
    assert_eq!(statuses, vec![status::SUCCESS; 2]);
    assert_eq!(native.read::<u32>(1, 0, 2), vec![11, 22]);
}

/// A rank whose window is already failed (the host raised its abort word) does not announce
/// itself at a barrier: its call returns at once and its peer times out instead of passing a
/// barrier the failed rank never really reached.
#[test]
fn a_failed_rank_releases_no_peer() {
    let mut ranks = EngineRanks::new(2, 1024, SECOND / 5);
    ranks.aborts[0] = ABORT_PEER_FAILED;
    let engine: FakeNvshmem = ranks.engine();
    let statuses = ranks.run_all(1, 2, &|r| {
        // SAFETY: a live engine context.
        unsafe { symm_engine_barrier_device(&engine, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::TIMEOUT, status::TIMEOUT]);
    assert_eq!(timed_out_peer(ranks.abort_word(1)), Some(0));
}

/// An engine whose completion of the puts gives up (NCCL's bounded flush at the window's
/// timeout): every call fails on every thread with the timeout status, the abort word raised
/// as a timeout naming no peer, instead of a call returning while its puts may still read the
/// caller's bytes.
#[test]
fn a_quiet_that_gives_up_fails_the_call() {
    for call in ["barrier", "all_gather", "all_reduce"] {
        let ranks = EngineRanks::new(2, 1024, SECOND);
        let engine: FakeNvshmem = ranks.engine();
        engine.gives_up.store(true, Ordering::Relaxed);
        let statuses = ranks.run_all(2, 2, &|r| {
            let ctx = ranks.context_address(r);
            // SAFETY: a live engine context; the ranges lie in the window.
            unsafe {
                match call {
                    "barrier" => symm_engine_barrier_device(&engine, ctx),
                    "all_gather" => symm_engine_all_gather_device(&engine, ctx, 0, 64, 32),
                    _ => symm_engine_all_reduce_device(
                        &engine,
                        ctx,
                        0,
                        0,
                        16,
                        RedOp::Sum as i32,
                        DataType::Float32 as i32,
                    ),
                }
            }
        });
        assert_eq!(statuses, vec![status::TIMEOUT, status::TIMEOUT], "{call}");
        for r in 0..2 {
            assert_eq!(ranks.abort_word(r), ABORT_TIMED_OUT, "{call}, rank {r}");
        }
    }
}

/// Several calls in one launch (one grid, programs at their own pace): all-reduce, all-gather,
/// barrier and all-reduce again, every result exact.
#[test]
fn several_calls_in_one_launch() {
    let world = 3usize;
    let count = 1500usize;
    let mut rng = Rng(8);
    let first: Vec<Vec<u64>> = (0..world)
        .map(|_| (0..count).map(|_| rng.next_u64() % 1_000_000).collect())
        .collect();
    let mut ranks = EngineRanks::new(world, 64 * 1024, 10 * SECOND);
    for (r, input) in first.iter().enumerate() {
        ranks.write(r, 0, bytemuck_bytes(input));
    }
    let engine: FakeNvshmem = ranks.engine();
    let recv = 16 * 1024;
    let shared = &*ranks;
    let statuses = shared.run_all(3, 4, &|r| {
        let ctx = shared.context_address(r);
        // SAFETY: a live engine context; every range fits the window.
        unsafe {
            let reduce = |op: RedOp| {
                symm_engine_all_reduce_device(
                    &engine,
                    ctx,
                    0,
                    0,
                    count as i64,
                    op as i32,
                    DataType::Uint64 as i32,
                )
            };
            reduce(RedOp::Sum)
                | symm_engine_all_gather_device(&engine, ctx, 0, recv, 8 * count as i64)
                | symm_engine_barrier_device(&engine, ctx)
                | reduce(RedOp::Max)
        }
    });
    assert_eq!(statuses, vec![status::SUCCESS; world]);
    let sums: Vec<u64> = (0..count)
        .map(|i| first.iter().map(|v| v[i]).sum())
        .collect();
    for r in 0..world {
        // Max over ranks of the sums (the same on every rank) is the sum.
        assert_eq!(
            ranks.read(r, 0, 8 * count),
            bytemuck_bytes(&sums),
            "rank {r}"
        );
        let gathered: Vec<u8> = (0..world)
            .flat_map(|_| bytemuck_bytes(&sums).to_vec())
            .collect();
        assert_eq!(
            ranks.read(r, recv as usize, world * 8 * count),
            gathered,
            "rank {r}"
        );
    }
}

/// NCCL engine contexts (`BackendTag::Nccl`) run the same protocol through their engine, with
/// the same results as the native function, and each engine's functions refuse the other's
/// contexts (and an NCCL context naming no device communicator).
#[test]
fn nccl_contexts_run_the_protocol_and_keep_to_their_tag() {
    let mut rng = Rng(5);
    let (world, count, offset) = (3usize, 301usize, 48usize);
    for dtype in [DataType::Float32, DataType::Int64, DataType::Bfloat16] {
        let inputs: Vec<Vec<u8>> = (0..world).map(|_| sample(&mut rng, dtype, count)).collect();
        let expected = native_all_reduce(&inputs, offset, dtype, RedOp::Sum);
        let mut ranks = EngineRanks::new(world, 16384, 5 * SECOND);
        ranks.as_nccl();
        for (r, input) in inputs.iter().enumerate() {
            ranks.write(r, offset, input);
        }
        let engine: FakeNccl = ranks.engine();
        let shared = &*ranks;
        let statuses = shared.run_all(2, 4, &|r| {
            // SAFETY: a live engine context; the range fits the window.
            unsafe {
                symm_any_all_reduce_device(
                    &engine,
                    shared.context_address(r),
                    0,
                    offset as i64,
                    count as i64,
                    RedOp::Sum as i32,
                    dtype as i32,
                )
            }
        });
        assert_eq!(statuses, vec![status::SUCCESS; world]);
        // The all-gather sends the reduced elements in a launch of its own: its programs split
        // the bytes otherwise than the all-reduce's split the elements (301 elements on 2
        // programs), and a program synchronizes only with its namesakes on the other ranks.
        let statuses = shared.run_all(2, 4, &|r| {
            // SAFETY: as above.
            unsafe {
                symm_engine_all_gather_device(
                    &engine,
                    shared.context_address(r),
                    offset as i64,
                    4096,
                    (count * dtype.size_bytes()) as i64,
                )
            }
        });
        assert_eq!(statuses, vec![status::SUCCESS; world]);
        for r in 0..world {
            assert_eq!(
                ranks.read(r, offset, expected.len()),
                expected,
                "{dtype:?} rank {r}"
            );
            assert_eq!(
                ranks.read(r, 4096, world * expected.len()),
                expected.repeat(world),
                "{dtype:?} rank {r}: all-gather"
            );
        }
    }

    let mut ranks = EngineRanks::new(2, 1024, SECOND);
    ranks.as_nccl();
    let nvshmem: FakeNvshmem = ranks.engine();
    let statuses = ranks.run_all(1, 2, &|r| {
        // SAFETY: a live context.
        unsafe { symm_engine_barrier_device(&nvshmem, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::UNKNOWN_BACKEND; 2]);
    assert_eq!(
        [ranks.abort_word(0), ranks.abort_word(1)],
        [ABORT_INVALID_LAUNCH; 2]
    );
    ranks.aborts.iter_mut().for_each(|word| *word = 0);
    let nccl: FakeNccl = ranks.engine();
    let statuses = ranks.run_all(1, 2, &|r| {
        // SAFETY: a live engine context.
        unsafe { symm_any_barrier_device(&nccl, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::SUCCESS; 2]);
    ranks.contexts[0].engine[ENGINE_COMM] = 0;
    let statuses = ranks.run(1, 2, &[0], &|r| {
        // SAFETY: a live context.
        unsafe { symm_engine_barrier_device(&nccl, ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::INVALID_ARGUMENT]);
    let mut nvshmem_ranks = EngineRanks::new(2, 1024, SECOND);
    let statuses = nvshmem_ranks.run_all(1, 2, &|r| {
        // SAFETY: a live context.
        unsafe { symm_any_barrier_device(&nccl, nvshmem_ranks.context_address(r)) }
    });
    assert_eq!(statuses, vec![status::UNKNOWN_BACKEND; 2]);
    nvshmem_ranks.aborts.iter_mut().for_each(|word| *word = 0);
}
