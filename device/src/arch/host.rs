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
            state = self.released.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.result_or
    }
}

#[derive(Clone, Copy)]
struct Coordinates {
    thread: u32,
    block: u32,
    block_dim: u32,
    grid_dim: u32,
    barrier: *const BlockBarrier,
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
    std::thread::scope(|scope| {
        for (block_index, barrier) in barriers.iter().enumerate() {
            for thread in 0..block {
                let coords = Coordinates {
                    thread,
                    block: block_index as u32,
                    block_dim: block,
                    grid_dim: grid,
                    barrier,
                };
                std::thread::Builder::new()
                    .name(std::format!("symm-b{block_index}t{thread}"))
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, move || {
                        COORDINATES.with(|c| c.set(Some(coords)));
                        kernel();
                        COORDINATES.with(|c| c.set(None));
                    })
                    .expect("spawning an emulated GPU thread");
            }
        }
    });
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

/// Release store of a `u32` (system scope on the GPU).
///
/// # Safety
/// As for [`load_acquire_sys_u32`], and `ptr` must be valid for writes.
pub unsafe fn store_release_sys_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { atomic_u32(ptr) }.store(value, release())
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
        Ok(previous) | Err(previous) => previous,
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

    #[test]
    fn timer_is_monotonic() {
        let a = global_timer_ns();
        nanosleep(20_000);
        assert!(global_timer_ns() >= a + 20_000);
    }
}
