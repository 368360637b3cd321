//! `arch` on the host: a CUDA grid emulated with OS threads.
//!
//! [`run_grid`] starts `grid × block` threads; each knows its indices through a thread-local,
//! the threads of one block share a [`BlockBarrier`], and memory operations map to
//! `core::sync::atomic` with the same orderings. Spin-waits yield the CPU, so that many ranks'
//! grids can share a two-core machine.

use core::cell::Cell;
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

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

// SAFETY: the pointer is only dereferenced by threads of `run_grid`'s scope, while the barrier
// it points to is alive; BlockBarrier itself is Sync (Mutex + Condvar).
unsafe impl Send for Coordinates {}

std::thread_local! {
    static COORDINATES: Cell<Option<Coordinates>> = const { Cell::new(None) };
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
    std::thread::scope(|scope| {
        for (barrier, current) in barriers.iter() {
            for thread in 0..block {
                let next = &next;
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, move || {
                        loop {
                            if thread == 0 {
                                current
                                    .store(next.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
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
                        }
                    })
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

/// Block-wide barrier. Every thread of the block must call it.
pub fn sync_threads() {
    sync_threads_or(false);
}

/// Block-wide barrier returning whether `pred` was true on any thread of the block.
pub fn sync_threads_or(pred: bool) -> bool {
    let barrier = coordinates().barrier;
    // SAFETY: the barrier lives in `run_grid`'s frame, which outlives every thread of the
    // scope that reads these coordinates.
    unsafe { &*barrier }.wait_or(pred)
}

/// Acquire load of a `u32` (system scope on the GPU).
///
/// # Safety
/// `ptr` must be valid for reads and 4-byte aligned, and only accessed atomically while other
/// threads may write it.
pub unsafe fn load_acquire_sys_u32(ptr: *const u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { AtomicU32::from_ptr(ptr as *mut u32) }.load(Ordering::Acquire)
}

/// Release store of a `u32` (system scope on the GPU).
///
/// # Safety
/// As for [`load_acquire_sys_u32`], and `ptr` must be valid for writes.
pub unsafe fn store_release_sys_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { AtomicU32::from_ptr(ptr) }.store(value, Ordering::Release)
}

/// Store a 16-byte LL line as two atomic 8-byte halves (`[a, b]` and `[c, d]`), the guarantee
/// the GPU's vector store gives.
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
        core::sync::atomic::AtomicU64::from_ptr(halves).store(lo, Ordering::Release);
        core::sync::atomic::AtomicU64::from_ptr(halves.add(1)).store(hi, Ordering::Release);
    }
}

/// Load a 16-byte LL line as two atomic 8-byte halves.
///
/// # Safety
/// As for [`store_line`], for reads.
pub unsafe fn load_line(ptr: *const [u32; 4]) -> [u32; 4] {
    let halves = ptr as *mut u64;
    // SAFETY: the caller guarantees validity and alignment.
    let (lo, hi) = unsafe {
        (
            core::sync::atomic::AtomicU64::from_ptr(halves).load(Ordering::Acquire),
            core::sync::atomic::AtomicU64::from_ptr(halves.add(1)).load(Ordering::Acquire),
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
    unsafe { AtomicU32::from_ptr(ptr) }.fetch_add(value, Ordering::Relaxed)
}

/// Relaxed atomic exchange on a `u32`; returns the previous value.
///
/// # Safety
/// As for [`store_release_sys_u32`].
pub unsafe fn atomic_exchange_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    // SAFETY: the caller guarantees validity and alignment; AtomicU32 has u32's layout.
    unsafe { AtomicU32::from_ptr(ptr) }.swap(value, Ordering::Relaxed)
}

/// Give the CPU away for about `ns` nanoseconds: yields for short waits, sleeps for long ones.
pub fn nanosleep(ns: u32) {
    if ns >= 10_000 {
        std::thread::sleep(core::time::Duration::from_nanos(ns as u64));
    } else {
        std::thread::yield_now();
    }
}

/// Nanoseconds since an arbitrary, process-wide origin (the global timer).
pub fn global_timer_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
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
