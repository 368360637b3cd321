//! `arch` on nvptx64: PTX instructions.
//!
//! Notes that shaped this file:
//! * rustc may drop atomic orderings on nvptx (rust-lang/rust#136480), so scoped acquire and
//!   release accesses are written as explicit `ld.acquire` / `st.release` instructions.
//! * inline asm has no predicate register class: predicates are declared inside the block.
//! * barriers sit in their own `asm!` blocks, marked volatile by default, so they are neither
//!   removed nor merged.

use core::arch::asm;
use core::arch::nvptx;

/// Index of the calling thread in its block (x).
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// Index of the calling block in the grid (x).
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// Number of threads per block (x).
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// Number of blocks in the grid (x).
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// Block-wide barrier (`bar.sync 0`). Every thread of the block must call it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a block barrier has no memory-safety preconditions; callers keep control flow
    // uniform so that every thread of the block arrives.
    unsafe { asm!("bar.sync 0;") }
}

/// Block-wide barrier that returns whether `pred` was true on any thread of the block
/// (`bar.red.or.pred`). The result is the same on every thread.
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let out: u32;
    // SAFETY: as for `sync_threads`; predicates are local to the asm block.
    unsafe {
        asm!(
            "{{",
            ".reg .pred %p_in;",
            ".reg .pred %p_out;",
            "setp.ne.u32 %p_in, {v}, 0;",
            "bar.red.or.pred %p_out, 0, %p_in;",
            "selp.u32 {o}, 1, 0, %p_out;",
            "}}",
            v = in(reg32) pred as u32,
            o = out(reg32) out,
        );
    }
    out != 0
}

/// System-scope acquire load of a `u32` (`ld.acquire.sys.u32`).
///
/// # Safety
/// `ptr` must be a valid, 4-byte aligned generic address of global memory.
#[inline(always)]
pub unsafe fn load_acquire_sys_u32(ptr: *const u32) -> u32 {
    let value: u32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "ld.acquire.sys.u32 {v}, [{p}];",
            v = out(reg32) value,
            p = in(reg64) ptr,
            options(nostack),
        );
    }
    value
}

/// System-scope release store of a `u32` (`st.release.sys.u32`).
///
/// # Safety
/// `ptr` must be a valid, 4-byte aligned generic address of global memory.
#[inline(always)]
pub unsafe fn store_release_sys_u32(ptr: *mut u32, value: u32) {
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "st.release.sys.u32 [{p}], {v};",
            p = in(reg64) ptr,
            v = in(reg32) value,
            options(nostack),
        );
    }
}

/// Sleep for about `ns` nanoseconds (`nanosleep.u32`, sm_70+).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no memory is touched.
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nomem, nostack)) }
}

/// The global nanosecond timer (`%globaltimer`).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reading a special register has no preconditions.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) }
    t
}

/// Abort the kernel (`trap`).
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the kernel; nothing runs after it.
    unsafe { asm!("trap;", options(noreturn, nostack)) }
}
