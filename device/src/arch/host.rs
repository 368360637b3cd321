//! `arch` on the host: a CUDA grid emulated with OS threads.
//!
//! [`run_grid`] starts `grid × block` threads; each knows its indices through a thread-local,
//! the threads of one block share a `BlockBarrier`, and memory operations map to
//! `core::sync::atomic` with the same orderings. Spin-waits yield the CPU, so that many ranks'
//! grids can share a two-core machine.
//!
//! Under `--cfg loom` the same functions run inside a loom model instead: grid threads are
//! `loom::thread`s, the block barrier is a `loom::sync` mutex and condition variable, memory
//! operations act on loom objects keyed by address (see `loom_model`), `nanosleep` yields to
//! loom's scheduler and the global timer stays at 0, so that bounded waits never time out and a
//! protocol that never completes shows up as loom's branch limit.

use core::cell::Cell;
use core::sync::atomic::Ordering;
#[cfg(not(loom))]
use core::sync::atomic::{AtomicU32, AtomicU64};
#[cfg(loom)]
use loom::sync::atomic::AtomicU32;
#[cfg(loom)]
use loom::sync::{Condvar, Mutex};
#[cfg(not(loom))]
use std::sync::{Condvar, Mutex, OnceLock};
#[cfg(not(loom))]
use std::time::Instant;

#[cfg(loom)]
#[path = "loom_model.rs"]
mod loom_model;
#[cfg(loom)]
pub use loom_model::{
    Mutation, WordKind, load_plain_u32, load_plain_u64, model_word, mutate, mutated,
    store_plain_u32, store_plain_u64,
};

/// A reusable barrier for the threads of one emulated block, with an OR-reduction.
struct BlockBarrier {
    threads: u32,
    state: Mutex<BarrierState>,
    released: Condvar,
}

struct BarrierState {
    arrived: u32,
    generation: u64,
    accumulated_or: bool,
    result_or: bool,
    /// A thread of the block panicked: the others must not wait for it at the barrier.
    broken: bool,
}

impl BlockBarrier {
    fn new(threads: u32) -> Self {
        BlockBarrier {
            threads,
            state: Mutex::new(BarrierState {
                arrived: 0,
                generation: 0,
                accumulated_or: false,
                result_or: false,
                broken: false,
            }),
            released: Condvar::new(),
        }
    }

    fn wait_or(&self, pred: bool) -> bool {
        // A barrier of one thread orders nothing: spare it the lock.
        if self.threads == 1 {
            return pred;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        assert!(!state.broken, "another thread of the block panicked");
        state.accumulated_or |= pred;
        state.arrived += 1;
        if state.arrived == self.threads {
            state.result_or = state.accumulated_or;
            state.accumulated_or = false;
            state.arrived = 0;
            state.generation = state.generation.wrapping_add(1);
            let result = state.result_or;
            drop(state);
            self.released.notify_all();
            return result;
        }
        let generation = state.generation;
        while state.generation == generation {
            assert!(!state.broken, "another thread of the block panicked");
            state = self.released.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.result_or
    }

    /// A thread of the block panicked: every thread waiting at the barrier, or reaching it
    /// later, panics too, so that the grid ends.
    #[cfg(not(loom))]
    fn break_for_all(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).broken = true;
        self.released.notify_all();
    }
}

#[derive(Clone, Copy)]
struct Coordinates {
    thread: u32,
    block: u32,
    block_dim: u32,
    grid_dim: u32,
    barrier: *const BlockBarrier,
    /// Whether this thread's run of the kernel made its block token (`kernel::Block`).
    token_taken: bool,
}

// SAFETY: the pointer is only dereferenced by the threads of the grid that set it (threads of
// `run_grid`'s scope, or the caller of `run_on_this_thread` until it returns), while the barrier
// it points to is alive; BlockBarrier itself is Sync (Mutex + Condvar).
unsafe impl Send for Coordinates {}

#[cfg(not(loom))]
std::thread_local! {
    static COORDINATES: Cell<Option<Coordinates>> = const { Cell::new(None) };
}

#[cfg(loom)]
loom::thread_local! {
    static COORDINATES: Cell<Option<Coordinates>> = Cell::new(None);
}

/// Mark the calling emulated thread's kernel as having made its block token: `true` the first
/// time in a run of a kernel, `false` after (a kernel's entry called again inside the kernel).
///
/// # Panics
/// Outside an emulated grid.
pub fn take_block_token() -> bool {
    COORDINATES.with(|c| {
        let mut coordinates = c
            .get()
            .expect("a kernel's entry called outside arch::host::run_grid");
        let first = !coordinates.token_taken;
        coordinates.token_taken = true;
        c.set(Some(coordinates));
        first
    })
}

fn coordinates() -> Coordinates {
    COORDINATES
        .with(Cell::get)
        .expect("symm-device arch function called outside arch::host::run_grid")
}

/// Run `kernel` on every thread of a `grid × block` grid of OS threads and return when all
/// have finished. Inside `kernel`, the `arch` functions describe the calling thread.
///
/// # Panics
/// If `grid` or `block` is zero, or if a kernel thread panics.
pub fn run_grid(grid: u32, block: u32, kernel: &(dyn Fn() + Sync)) {
    assert!(grid > 0 && block > 0, "empty grid {grid}x{block}");
    let barriers: std::vec::Vec<BlockBarrier> =
        (0..grid).map(|_| BlockBarrier::new(block)).collect();
    #[cfg(loom)]
    {
        loom_model::touch();
        let mut threads = std::vec::Vec::new();
        for (block_index, barrier) in barriers.iter().enumerate() {
            for thread in 0..block {
                let coords = Coordinates {
                    thread,
                    block: block_index as u32,
                    block_dim: block,
                    grid_dim: grid,
                    barrier,
                    token_taken: false,
                };
                // SAFETY: every thread is joined below, before `run_grid` returns: the kernel and
                // the barriers outlive them (a panic in one ends the whole loom execution).
                let kernel = unsafe {
                    core::mem::transmute::<&(dyn Fn() + Sync), &'static (dyn Fn() + Sync)>(kernel)
                };
                threads.push(loom::thread::spawn(move || {
                    COORDINATES.with(|c| c.set(Some(coords)));
                    kernel();
                }));
            }
        }
        for thread in threads {
            thread.join().expect("an emulated GPU thread panicked");
        }
    }
    #[cfg(not(loom))]
    {
        let coordinates = barriers
            .iter()
            .enumerate()
            .flat_map(|(block_index, barrier)| {
                (0..block).map(move |thread| Coordinates {
                    thread,
                    block: block_index as u32,
                    block_dim: block,
                    grid_dim: grid,
                    barrier,
                    token_taken: false,
                })
            });
        workers::run_all(coordinates, kernel);
    }
}

/// While held, the threads that ran a grid ([`run_grid`]) stay, idle, for the next grid, so
/// that a launch creates no thread; when the last lease of the process is dropped, the idle
/// ones end (and a grid run while none is held ends its threads with it). The host backend
/// holds one per communicator.
#[cfg(not(loom))]
#[must_use = "the workers stay only while the lease is held"]
pub struct WorkerLease {
    /// The process that took the lease: a child made by `fork` inherits the lease but not the
    /// pool it counts in.
    pid: u32,
}

#[cfg(not(loom))]
impl WorkerLease {
    /// Keep the grids' threads of this process until the lease is dropped.
    pub fn acquire() -> Self {
        workers::lease(1);
        WorkerLease {
            pid: std::process::id(),
        }
    }
}

#[cfg(not(loom))]
impl Drop for WorkerLease {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            workers::lease(-1);
        }
    }
}

/// The threads that run grids: a pool of this process, so that a grid of `n` threads runs on
/// `n` threads that are idle or new, each dedicated to one of its threads until it ends (a
/// grid's threads wait for each other: they must all run at once).
#[cfg(not(loom))]
mod workers {
    use super::{COORDINATES, Coordinates};
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::{Arc, Condvar, Mutex};

    /// One thread of a grid, for any idle worker.
    struct Job {
        kernel: *const (dyn Fn() + Sync + 'static),
        coordinates: Coordinates,
        grid: Arc<GridEnd>,
    }

    // SAFETY: `kernel` points to a `Sync` closure that `run_all` keeps alive until every job of
    // its grid has ended (it waits for `grid` to count them); `Coordinates` is `Send`.
    unsafe impl Send for Job {}

    /// The threads of a grid still running, and whether one panicked.
    struct GridEnd {
        state: Mutex<(usize, bool)>,
        ended: Condvar,
    }

    struct Pool {
        /// The process that made this pool: a child made by `fork` has none of its threads.
        pid: u32,
        state: Mutex<PoolState>,
        work: Condvar,
    }

    struct PoolState {
        jobs: VecDeque<Job>,
        /// Idle workers that no queued job has claimed yet.
        unclaimed: usize,
        /// Leases held ([`super::WorkerLease`]).
        leases: usize,
        /// Workers made so far (their names).
        made: usize,
        /// The workers made while a lease was held: they end when the last lease is dropped,
        /// which waits for them to be gone (see [`lease`]). Workers made with no lease held end
        /// with their grid and are detached.
        kept: std::vec::Vec<std::thread::JoinHandle<()>>,
    }

    static POOL: AtomicPtr<Pool> = AtomicPtr::new(core::ptr::null_mut());

    /// This process's pool. A child made by `fork` inherits its parent's pointer but none of
    /// its threads (and maybe a lock held at the fork): it makes its own, leaving the parent's
    /// untouched.
    fn pool() -> &'static Pool {
        let pid = std::process::id();
        loop {
            let current = POOL.load(Ordering::Acquire);
            // SAFETY: pools are leaked, never freed: a non-null pointer stays valid.
            if let Some(pool) = unsafe { current.as_ref() }
                && pool.pid == pid
            {
                return pool;
            }
            let fresh = std::boxed::Box::into_raw(std::boxed::Box::new(Pool {
                pid,
                state: Mutex::new(PoolState {
                    jobs: VecDeque::new(),
                    unclaimed: 0,
                    leases: 0,
                    made: 0,
                    kept: std::vec::Vec::new(),
                }),
                work: Condvar::new(),
            }));
            if POOL
                .compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: `fresh` was never shared.
                drop(unsafe { std::boxed::Box::from_raw(fresh) });
            }
        }
    }

    fn lock(pool: &Pool) -> std::sync::MutexGuard<'_, PoolState> {
        pool.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count a lease in (`+1`) or out (`-1`); the last one out ends the idle workers and
    /// waits until their threads are gone.
    ///
    /// The wait is for `fork`: a thread that is starting or ending holds a lock of the standard
    /// library for a moment, and a child forked at that moment inherits it held, so that every
    /// thread the child then starts waits forever (a process that tears its communicators down
    /// and then forks, as Python's multiprocessing does, met this). Once the last lease is
    /// dropped, no worker of the pool is starting or ending. The wait ends early when a lease
    /// is taken again meanwhile (the workers then stay).
    pub(super) fn lease(change: i32) {
        let pool = pool();
        let mut state = lock(pool);
        state.leases = if change > 0 {
            state.leases + 1
        } else {
            state.leases.saturating_sub(1)
        };
        if state.leases != 0 {
            return;
        }
        let mut ending = core::mem::take(&mut state.kept);
        drop(state);
        pool.work.notify_all();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !ending.is_empty() {
            // `is_finished` turns true when the thread's function has returned; `join` then
            // waits the moment more until the thread is gone.
            let (finished, running): (std::vec::Vec<_>, std::vec::Vec<_>) =
                ending.into_iter().partition(|h| h.is_finished());
            for handle in finished {
                let _ = handle.join();
            }
            ending = running;
            if ending.is_empty() {
                break;
            }
            let state = lock(pool);
            if state.leases != 0 || std::time::Instant::now() > deadline {
                // A lease was taken again (the rest stay, kept for the next last lease), or a
                // worker is still running a grid: leave the rest detached.
                let mut state = state;
                if state.leases != 0 {
                    state.kept.extend(ending);
                }
                return;
            }
            drop(state);
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// Run `kernel` once with each of `coordinates` as the calling thread's, all at once, and
    /// return when every one has ended.
    ///
    /// # Panics
    /// If a thread cannot be made, or if `kernel` panicked on any of them.
    pub(super) fn run_all(
        coordinates: impl Iterator<Item = Coordinates>,
        kernel: &(dyn Fn() + Sync),
    ) {
        let pool = pool();
        // SAFETY: the jobs' pointers to the kernel are used only until `grid` counts every job
        // ended, which this function waits for before it returns (also when a job panicked).
        let kernel: *const (dyn Fn() + Sync + 'static) = unsafe {
            core::mem::transmute::<&(dyn Fn() + Sync), &'static (dyn Fn() + Sync)>(kernel)
        };
        let grid = Arc::new(GridEnd {
            state: Mutex::new((0, false)),
            ended: Condvar::new(),
        });
        let jobs: std::vec::Vec<Job> = coordinates
            .map(|coordinates| Job {
                kernel,
                coordinates,
                grid: grid.clone(),
            })
            .collect();
        let count = jobs.len();
        *grid.state.lock().unwrap_or_else(|e| e.into_inner()) = (count, false);
        let mut state = lock(pool);
        // Every job gets a worker of its own: idle ones, then new ones, all of them before any
        // job is queued, so that a grid that cannot have all its threads runs none.
        let claimed = count.min(state.unclaimed);
        state.unclaimed -= claimed;
        for made in claimed..count {
            let name = std::format!("symm-worker-{}", state.made);
            let spawned = std::thread::Builder::new()
                .name(name)
                .stack_size(256 * 1024)
                .spawn(move || work(pool));
            match spawned {
                Err(e) => {
                    // The claimed and the new workers stay idle, for later grids.
                    state.unclaimed += made;
                    drop(state);
                    pool.work.notify_all();
                    panic!("spawning an emulated GPU thread: {e}");
                }
                Ok(handle) if state.leases > 0 => state.kept.push(handle),
                Ok(_) => {}
            }
            state.made += 1;
        }
        state.jobs.extend(jobs);
        drop(state);
        pool.work.notify_all();
        let mut end = grid.state.lock().unwrap_or_else(|e| e.into_inner());
        while end.0 > 0 {
            end = grid.ended.wait(end).unwrap_or_else(|e| e.into_inner());
        }
        assert!(!end.1, "an emulated GPU thread panicked");
    }

    /// A worker: run jobs while there are any or a lease is held; end when idle without one.
    fn work(pool: &'static Pool) {
        let mut state = lock(pool);
        loop {
            if let Some(job) = state.jobs.pop_front() {
                drop(state);
                COORDINATES.with(|c| c.set(Some(job.coordinates)));
                // SAFETY: the kernel is alive until this job is counted ended (below).
                let kernel = unsafe { &*job.kernel };
                let panicked =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(kernel)).is_err();
                COORDINATES.with(|c| c.set(None));
                if panicked {
                    // SAFETY: the block's barrier lives in `run_grid`'s frame until every job of
                    // the grid, this one included, is counted ended.
                    unsafe { &*job.coordinates.barrier }.break_for_all();
                }
                state = lock(pool);
                state.unclaimed += 1;
                drop(state);
                {
                    let mut end = job.grid.state.lock().unwrap_or_else(|e| e.into_inner());
                    end.0 -= 1;
                    end.1 |= panicked;
                    if end.0 == 0 {
                        job.grid.ended.notify_all();
                    }
                }
                drop(job);
                state = lock(pool);
            } else if state.leases == 0 {
                // Idle with no lease held: end, unless a job was queued for this worker.
                if state.unclaimed > 0 {
                    state.unclaimed -= 1;
                    return;
                }
                state = pool.work.wait(state).unwrap_or_else(|e| e.into_inner());
            } else {
                state = pool.work.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

/// Run `kernel` as a grid of one block of one thread, on the calling thread: what a launch
/// that serves one rank with one thread needs, without creating a thread. The calling thread
/// must not be inside a grid already.
///
/// # Panics
/// If called from a thread of a grid, or if `kernel` panics (the panic propagates, after the
/// thread's coordinates are cleared).
#[cfg(not(loom))]
pub fn run_on_this_thread(kernel: &dyn Fn()) {
    assert!(
        COORDINATES.with(Cell::get).is_none(),
        "arch::host::run_on_this_thread inside a grid"
    );
    let barrier = BlockBarrier::new(1);
    let coords = Coordinates {
        thread: 0,
        block: 0,
        block_dim: 1,
        grid_dim: 1,
        barrier: &barrier,
        token_taken: false,
    };
    /// Clears the coordinates when the kernel returns or unwinds.
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            COORDINATES.with(|c| c.set(None));
        }
    }
    COORDINATES.with(|c| c.set(Some(coords)));
    let _clear = Clear;
    kernel();
}

/// Run a `grid × block` grid as a GPU does when not every block fits: at most `resident`
/// blocks run at once, and block `i + resident` starts when a running block exits, in index
/// order. Kernels that wait for other blocks of the same grid must not use this.
///
/// # Panics
/// If `grid`, `block` or `resident` is zero, or if a kernel thread panics.
pub fn run_grid_with_residency(grid: u32, block: u32, resident: u32, kernel: &(dyn Fn() + Sync)) {
    assert!(
        grid > 0 && block > 0 && resident > 0,
        "empty grid {grid}x{block}/{resident}"
    );
    let resident = resident.min(grid);
    let next = AtomicU32::new(0);
    let barriers: std::vec::Vec<(BlockBarrier, AtomicU32)> = (0..resident)
        .map(|_| (BlockBarrier::new(block), AtomicU32::new(0)))
        .collect();
    let run_blocks = |barrier: &BlockBarrier, current: &AtomicU32, thread: u32| loop {
        if thread == 0 {
            current.store(next.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        }
        barrier.wait_or(false);
        let index = current.load(Ordering::Relaxed);
        if index >= grid {
            break;
        }
        let coords = Coordinates {
            thread,
            block: index,
            block_dim: block,
            grid_dim: grid,
            barrier,
            token_taken: false,
        };
        COORDINATES.with(|c| c.set(Some(coords)));
        kernel();
        COORDINATES.with(|c| c.set(None));
        barrier.wait_or(false);
    };
    #[cfg(loom)]
    {
        loom_model::touch();
        type RunBlocks<'a> = &'a (dyn Fn(&BlockBarrier, &AtomicU32, u32) + Sync);
        type Blocks<'a> = &'a [(BlockBarrier, AtomicU32)];
        let run_blocks: RunBlocks<'_> = &run_blocks;
        // SAFETY: every thread is joined below, before this frame, which owns the closure, the
        // barriers and the block counters, returns (a panic in one ends the whole execution).
        let (run_blocks, barriers) = unsafe {
            (
                core::mem::transmute::<RunBlocks<'_>, RunBlocks<'static>>(run_blocks),
                core::mem::transmute::<Blocks<'_>, Blocks<'static>>(&barriers[..]),
            )
        };
        let mut threads = std::vec::Vec::new();
        for (barrier, current) in barriers.iter() {
            for thread in 0..block {
                threads.push(loom::thread::spawn(move || {
                    run_blocks(barrier, current, thread)
                }));
            }
        }
        for thread in threads {
            thread.join().expect("an emulated GPU thread panicked");
        }
    }
    #[cfg(not(loom))]
    std::thread::scope(|scope| {
        for (barrier, current) in barriers.iter() {
            for thread in 0..block {
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, move || run_blocks(barrier, current, thread))
                    .expect("spawning an emulated GPU thread");
            }
        }
    });
}

/// Index of the calling thread in its block (x).
pub fn thread_idx_x() -> u32 {
    coordinates().thread
}

/// Index of the calling block in the grid (x).
pub fn block_idx_x() -> u32 {
    coordinates().block
}

/// Number of threads per block (x).
pub fn block_dim_x() -> u32 {
    coordinates().block_dim
}

/// `true` when the calling thread is its block's only one (the host backend's fast mode): the
/// copy loops then move their whole range as one copy per destination (a `memcpy`), where a
/// loop of units runs at a fraction of the memory's speed on one core.
pub fn single_thread_block() -> bool {
    block_dim_x() == 1
}

/// Number of blocks in the grid (x).
pub fn grid_dim_x() -> u32 {
    coordinates().grid_dim
}

/// `true` when the grid and the blocks are one-dimensional: always, for an emulated grid.
pub fn launch_is_one_dimensional() -> bool {
    true
}

/// Block-wide barrier. Every thread of the block must call it.
pub fn sync_threads() {
    sync_threads_or(false);
}

/// Block-wide barrier returning whether `pred` was true on any thread of the block.
pub fn sync_threads_or(pred: bool) -> bool {
    let barrier = coordinates().barrier;
    // SAFETY: the barrier lives in the frame of `run_grid` (or `run_on_this_thread`), which
    // outlives every thread that reads these coordinates.
    unsafe { &*barrier }.wait_or(pred)
}

/// Acquire load of a `u32` (system scope on the GPU).
///
/// # Safety
/// `ptr` must be valid for reads and 4-byte aligned, and only accessed atomically while other
/// threads may write it.
pub unsafe fn load_acquire_sys_u32(ptr: *const u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr as *mut u32) }.load(acquire())
}

/// Relaxed load of a `u32` (system scope on the GPU): a strong load that orders nothing else.
///
/// # Safety
/// As for [`load_acquire_sys_u32`].
pub unsafe fn load_relaxed_sys_u32(ptr: *const u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr as *mut u32) }.load(Ordering::Relaxed)
}

/// Acquire-release fence (system scope on the GPU).
pub fn fence_acq_rel_sys() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::AcqRel);
    #[cfg(not(loom))]
    core::sync::atomic::fence(Ordering::AcqRel);
}

/// Release store of a `u32` (system scope on the GPU).
///
/// # Safety
/// As for [`load_acquire_sys_u32`], and `ptr` must be valid for writes.
pub unsafe fn store_release_sys_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr) }.store(value, release());
    wake_all(ptr);
}

/// Store a 16-byte LL line as two atomic 8-byte halves (`[a, b]` and `[c, d]`), the guarantee
/// the GPU's vector store gives. Relaxed, as the PTX (`st.relaxed.sys.v2.b64`): an LL line
/// orders nothing but itself, so loom checks the program the GPU runs.
///
/// # Safety
/// `ptr` must be valid for writes and 16-byte aligned, and only accessed through these
/// functions while other threads may access it.
pub unsafe fn store_line(ptr: *mut [u32; 4], line: [u32; 4]) {
    let halves = ptr as *mut u64;
    let lo = line[0] as u64 | (line[1] as u64) << 32;
    let hi = line[2] as u64 | (line[3] as u64) << 32;
    // SAFETY: the caller guarantees validity and alignment; AtomicU64 has u64's layout.
    unsafe {
        atomic_u64(halves).store(lo, Ordering::Relaxed);
        atomic_u64(halves.add(1)).store(hi, Ordering::Relaxed);
    }
}

/// Load a 16-byte LL line as two atomic 8-byte halves, relaxed as the PTX
/// (`ld.relaxed.sys.v2.b64`).
///
/// # Safety
/// As for [`store_line`], for reads.
pub unsafe fn load_line(ptr: *const [u32; 4]) -> [u32; 4] {
    let halves = ptr as *mut u64;
    // SAFETY: the caller guarantees validity and alignment.
    let (lo, hi) = unsafe {
        (
            atomic_u64(halves).load(Ordering::Relaxed),
            atomic_u64(halves.add(1)).load(Ordering::Relaxed),
        )
    };
    [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32]
}

/// Relaxed atomic add on a `u32`; returns the previous value.
///
/// # Safety
/// As for [`store_release_sys_u32`].
pub unsafe fn atomic_add_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr) }.fetch_add(value, Ordering::Relaxed)
}

/// Acquire-release atomic add on a `u32` (system scope on the GPU); returns the previous
/// value.
///
/// # Safety
/// As for [`store_release_sys_u32`].
pub unsafe fn atomic_add_acq_rel_sys_u32(ptr: *mut u32, value: u32) -> u32 {
    // Each half weakened under loom as the release stores and acquire loads are.
    let ordering = match (release(), acquire()) {
        (Ordering::Release, Ordering::Acquire) => Ordering::AcqRel,
        (Ordering::Release, _) => Ordering::Release,
        (_, Ordering::Acquire) => Ordering::Acquire,
        _ => Ordering::Relaxed,
    };
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr) }.fetch_add(value, ordering)
}

/// Relaxed atomic exchange on a `u32`; returns the previous value.
///
/// # Safety
/// As for [`store_release_sys_u32`].
pub unsafe fn atomic_exchange_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr) }.swap(value, Ordering::Relaxed)
}

/// Release compare-and-swap on a `u32` (system scope on the GPU): writes `new` when the word
/// holds `expected`; returns the previous value either way.
///
/// # Safety
/// As for [`store_release_sys_u32`].
pub unsafe fn compare_exchange_sys_u32(ptr: *mut u32, expected: u32, new: u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    match unsafe { atomic_u32(ptr) }.compare_exchange(expected, new, release(), Ordering::Relaxed) {
        Ok(previous) => {
            wake_all(ptr);
            previous
        }
        Err(previous) => previous,
    }
}

/// The `u32` at `ptr` as an atomic: the memory itself, or its loom stand-in under loom.
///
/// # Safety
/// `ptr` must be valid for reads and writes, aligned, and only accessed atomically while other
/// threads may access it.
#[cfg(not(loom))]
#[inline(always)]
unsafe fn atomic_u32<'a>(ptr: *mut u32) -> &'a AtomicU32 {
    // SAFETY: forwarded contract; AtomicU32 has u32's layout.
    unsafe { AtomicU32::from_ptr(ptr) }
}

#[cfg(loom)]
use loom_model::{atomic_u32, atomic_u64};

/// The `u64` at `ptr` as an atomic (see [`atomic_u32`]).
///
/// # Safety
/// As for [`atomic_u32`].
#[cfg(not(loom))]
#[inline(always)]
unsafe fn atomic_u64<'a>(ptr: *mut u64) -> &'a AtomicU64 {
    // SAFETY: forwarded contract; AtomicU64 has u64's layout.
    unsafe { AtomicU64::from_ptr(ptr) }
}

/// The ordering of a release store (weakened to relaxed under loom by
/// `Mutation::ReleaseAsRelaxed`).
#[inline(always)]
fn release() -> Ordering {
    #[cfg(loom)]
    if mutated(Mutation::ReleaseAsRelaxed) {
        return Ordering::Relaxed;
    }
    Ordering::Release
}

/// The ordering of an acquire load (weakened to relaxed under loom by
/// `Mutation::AcquireAsRelaxed`).
#[inline(always)]
fn acquire() -> Ordering {
    #[cfg(loom)]
    if mutated(Mutation::AcquireAsRelaxed) {
        return Ordering::Relaxed;
    }
    Ordering::Acquire
}

/// Give the CPU away for about `ns` nanoseconds: yields for short waits, sleeps for long ones.
/// Under loom: yields to the model's scheduler.
#[cfg(loom)]
pub fn nanosleep(_ns: u32) {
    loom::thread::yield_now();
}

/// Give the CPU away for about `ns` nanoseconds: yields for short waits, sleeps for long ones.
#[cfg(not(loom))]
pub fn nanosleep(ns: u32) {
    if ns >= 10_000 {
        std::thread::sleep(core::time::Duration::from_nanos(ns as u64));
    } else {
        std::thread::yield_now();
    }
}

/// Give the CPU away until the `u32` at `flag` may no longer hold `seen`, the abort word at
/// `abort` may have been raised, or [`PARK_LIMIT_NS`] pass. The thread blocks in the kernel (Linux: `futex_waitv` on both words,
/// shared futexes, so that a store from another process wakes it too) until a store through
/// this module ([`store_release_sys_u32`], [`compare_exchange_sys_u32`]) or [`wake_all`]
/// changes either word; elsewhere it sleeps. A spurious return is harmless: callers look at the
/// flag, the abort word and their deadline again.
///
/// # Safety
/// As for [`load_acquire_sys_u32`], for both words.
#[cfg(not(loom))]
pub unsafe fn park_u32(flag: *const u32, seen: u32, abort: *const u32) {
    let ns = PARK_LIMIT_NS;
    #[cfg(target_os = "linux")]
    // SAFETY: forwarded contract.
    unsafe {
        futex::wait_either(flag, seen, abort, ns)
    };
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (flag, seen, abort);
        std::thread::sleep(core::time::Duration::from_nanos(ns.min(20_000)));
    }
}

/// The most polls a host wait makes before it parks ([`park_u32`]), for the whole process:
/// no bound until [`park_sooner`] sets one (the wait's own count applies).
#[cfg(not(loom))]
static POLLS_BEFORE_PARK: AtomicU32 = AtomicU32::new(u32::MAX);

/// From now on, every host wait of this process parks after at most `polls` polls (the
/// lowest bound any caller set holds). The host backend asks it of a process whose
/// communicator has more ranks than the machine has cores: a waiter that keeps polling then
/// holds a core that the rank it waits for needs.
#[cfg(not(loom))]
pub fn park_sooner(polls: u32) {
    POLLS_BEFORE_PARK.fetch_min(polls, Ordering::Relaxed);
}

/// The bound [`park_sooner`] set on the polls before a park (`u32::MAX`: none).
#[cfg(not(loom))]
pub fn polls_before_park() -> u32 {
    POLLS_BEFORE_PARK.load(Ordering::Relaxed)
}

/// The longest a host thread stays parked ([`park_u32`]) before it looks at its flag, its abort
/// word and its deadline again, should no store wake it: a wait's deadline is kept to within
/// this much.
#[cfg(not(loom))]
pub const PARK_LIMIT_NS: u64 = 1_000_000;

/// Wake every thread parked ([`park_u32`]) on the `u32` at `ptr`, in any process that maps
/// it. The stores of this module call it; the host calls it after writing a word that kernels
/// park on by other means (the abort word).
#[cfg(not(loom))]
pub fn wake_all(ptr: *const u32) {
    #[cfg(target_os = "linux")]
    futex::wake_all(ptr);
    #[cfg(not(target_os = "linux"))]
    let _ = ptr;
}

/// Under loom there are no parked threads to wake.
#[cfg(loom)]
pub fn wake_all(_ptr: *const u32) {}

/// Linux futexes on words of memory that other processes may map: never `FUTEX_PRIVATE_FLAG`.
#[cfg(all(not(loom), target_os = "linux"))]
mod futex {
    use core::sync::atomic::{AtomicBool, Ordering};

    /// `struct futex_waitv` of `<linux/futex.h>`.
    #[repr(C)]
    struct WaitV {
        val: u64,
        uaddr: u64,
        flags: u32,
        reserved: u32,
    }

    /// `FUTEX2_SIZE_U32`: the word is a `u32` (and, without `FUTEX2_PRIVATE`, may be shared).
    const FUTEX2_SIZE_U32: u32 = 0x02;

    /// Set once `futex_waitv` (Linux 5.16) turned out to be missing.
    static NO_WAITV: AtomicBool = AtomicBool::new(false);

    /// Without `futex_waitv`, a park on the flag alone lasts at most this long, so that a raised
    /// abort word is seen about as soon.
    const ABORT_LOOK_NS: u64 = 200_000;

    /// Block until the `u32` at `flag` may differ from `seen` or the one at `abort` from 0, a
    /// wake on either, or `ns` nanoseconds.
    ///
    /// # Safety
    /// Both addresses are valid, aligned `u32`s.
    pub(super) unsafe fn wait_either(flag: *const u32, seen: u32, abort: *const u32, ns: u64) {
        if !NO_WAITV.load(Ordering::Relaxed) {
            let words = [
                WaitV {
                    val: seen as u64,
                    uaddr: flag as u64,
                    flags: FUTEX2_SIZE_U32,
                    reserved: 0,
                },
                WaitV {
                    val: 0,
                    uaddr: abort as u64,
                    flags: FUTEX2_SIZE_U32,
                    reserved: 0,
                },
            ];
            let mut now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `now` is a valid timespec to write.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
            let total = now.tv_nsec as u64 + ns;
            let deadline = libc::timespec {
                tv_sec: now.tv_sec + (total / 1_000_000_000) as libc::time_t,
                tv_nsec: (total % 1_000_000_000) as _,
            };
            // SAFETY: `words` and `deadline` outlive the call; the kernel only reads them, and
            // only reads the two words (the caller guarantees they are valid).
            let result = unsafe {
                libc::syscall(
                    libc::SYS_futex_waitv,
                    words.as_ptr(),
                    words.len() as libc::c_uint,
                    0 as libc::c_uint,
                    &deadline as *const libc::timespec,
                    libc::CLOCK_MONOTONIC,
                )
            };
            if result >= 0 {
                return;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                // A word already differs, the deadline passed, or a signal came: look again.
                Some(libc::EAGAIN | libc::ETIMEDOUT | libc::EINTR) => return,
                // An older kernel, or a sandbox (seccomp) that refuses the call it does not
                // know: park on the flag alone from now on.
                Some(libc::ENOSYS | libc::EPERM) => NO_WAITV.store(true, Ordering::Relaxed),
                // Anything else: never spin; sleep as the GPU does.
                _ => {
                    std::thread::sleep(core::time::Duration::from_nanos(ns.min(20_000)));
                    return;
                }
            }
        }
        let timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: ns.min(ABORT_LOOK_NS) as _,
        };
        // SAFETY: as above; FUTEX_WAIT reads the word at `flag` only.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                flag,
                libc::FUTEX_WAIT,
                seen,
                &timeout as *const libc::timespec,
            )
        };
    }

    /// Wake every waiter on the `u32` at `ptr`.
    pub(super) fn wake_all(ptr: *const u32) {
        // SAFETY: FUTEX_WAKE does not access the word; it only names the queue to wake.
        unsafe { libc::syscall(libc::SYS_futex, ptr, libc::FUTEX_WAKE, i32::MAX) };
    }
}

/// Nanoseconds since an arbitrary origin (the global timer). Under loom it stays at 0: waits
/// never time out, and a protocol that never completes exceeds loom's branch limit instead.
#[cfg(loom)]
pub fn global_timer_ns() -> u64 {
    0
}

/// Nanoseconds since an arbitrary, process-wide origin (the global timer).
#[cfg(not(loom))]
pub fn global_timer_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicU64;

    #[test]
    fn indices_cover_the_grid() {
        let seen = AtomicU64::new(0);
        run_grid(3, 5, &|| {
            assert_eq!(grid_dim_x(), 3);
            assert_eq!(block_dim_x(), 5);
            let id = block_idx_x() * 5 + thread_idx_x();
            seen.fetch_or(1 << id, Ordering::Relaxed);
        });
        assert_eq!(seen.load(Ordering::Relaxed), (1u64 << 15) - 1);
    }

    #[test]
    fn barrier_or_is_uniform_and_reusable() {
        run_grid(2, 4, &|| {
            for round in 0..50u32 {
                let any = sync_threads_or(thread_idx_x() == round % 4 && round % 3 == 0);
                assert_eq!(any, round % 3 == 0);
            }
        });
    }

    /// A thread parked on a word and an abort word, for up to 10 s; returns how long it was
    /// parked when `store` (run 20 ms later on another thread) changes one of them.
    #[cfg(target_os = "linux")]
    fn parked_until(store: fn(*mut u32, *mut u32)) -> std::time::Duration {
        use std::boxed::Box;
        let words: &'static mut [u32; 2] = Box::leak(Box::new([0u32; 2]));
        let (flag, abort) = (&mut words[0] as *mut u32, &mut words[1] as *mut u32);
        let (flag_at, abort_at) = (flag as usize, abort as usize);
        let storer = std::thread::spawn(move || {
            std::thread::sleep(core::time::Duration::from_millis(20));
            store(flag_at as *mut u32, abort_at as *mut u32);
        });
        let start = Instant::now();
        // SAFETY: both words are leaked (live for ever) and accessed atomically only.
        unsafe { super::futex::wait_either(flag, 0, abort, 10_000_000_000) };
        let parked = start.elapsed();
        storer.join().unwrap();
        parked
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_release_store_wakes_a_parked_thread() {
        // SAFETY: the word is live (leaked) and accessed atomically only.
        let parked = parked_until(|flag, _| unsafe { store_release_sys_u32(flag, 1) });
        assert!(parked < core::time::Duration::from_secs(5), "{parked:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_raised_abort_word_wakes_a_parked_thread() {
        // SAFETY: the word is live (leaked) and accessed atomically only.
        let parked = parked_until(|_, abort| unsafe {
            compare_exchange_sys_u32(abort, 0, 7);
        });
        assert!(parked < core::time::Duration::from_secs(5), "{parked:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_host_store_wakes_a_parked_thread_through_wake_all() {
        // SAFETY: the word is live (leaked), aligned, and accessed atomically only.
        let parked = parked_until(|_, abort| unsafe {
            AtomicU32::from_ptr(abort).store(1, Ordering::Release);
            wake_all(abort);
        });
        assert!(parked < core::time::Duration::from_secs(5), "{parked:?}");
    }

    #[test]
    fn a_park_on_a_word_that_already_changed_returns_at_once() {
        let (flag, abort) = (1u32, 0u32);
        let start = Instant::now();
        // SAFETY: both are live locals, accessed only here.
        unsafe { park_u32(&flag, 0, &abort) };
        assert!(start.elapsed() < core::time::Duration::from_millis(500));
    }

    #[test]
    fn grids_under_a_lease_reuse_their_threads() {
        let _lease = WorkerLease::acquire();
        let ids = || {
            let ids = Mutex::new(std::vec::Vec::new());
            // One block: its threads meet at the barrier, so each must run on its own thread.
            run_grid(1, 6, &|| {
                let id = std::thread::current().id();
                ids.lock().unwrap().push(id);
                sync_threads();
            });
            ids.into_inner().unwrap()
        };
        let first = ids();
        assert_eq!(first.len(), 6);
        let mut distinct = first.clone();
        distinct.sort_by_key(|id| std::format!("{id:?}"));
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            6,
            "a grid's threads run at once, each on its own"
        );
        // Other tests of this binary run grids meanwhile and may take the idle workers between
        // two grids: some later grid reuses a thread of the first.
        let reused = (0..20).any(|_| ids().iter().any(|id| first.contains(id)));
        assert!(reused, "no worker of {first:?} reused in 20 grids");
    }

    #[test]
    fn a_panicking_grid_thread_panics_the_caller_and_the_pool_goes_on() {
        let _lease = WorkerLease::acquire();
        let outcome = std::panic::catch_unwind(|| {
            run_grid(1, 2, &|| {
                if thread_idx_x() == 1 {
                    panic!("deliberate");
                }
            })
        });
        assert!(outcome.is_err());
        let ran = AtomicU32::new(0);
        run_grid(2, 2, &|| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_panicking_thread_ends_its_block_s_barrier_for_the_others() {
        let _lease = WorkerLease::acquire();
        let outcome = std::panic::catch_unwind(|| {
            run_grid(1, 3, &|| {
                if thread_idx_x() == 2 {
                    panic!("deliberate");
                }
                // Threads 0 and 1 would wait here for thread 2 for ever.
                sync_threads();
            })
        });
        assert!(outcome.is_err());
    }

    #[test]
    fn timer_is_monotonic() {
        let a = global_timer_ns();
        nanosleep(20_000);
        assert!(global_timer_ns() >= a + 20_000);
    }
}
