//! The architecture layer: the only place with inline assembly and intrinsics.
//!
//! Everything above this module is written against these functions. On `nvptx64` they are
//! single PTX instructions; on the host they emulate a CUDA grid with OS threads (see
//! [`host::run_grid`]). Semantics, on both:
//!
//! * indices are those of the calling thread inside the running grid (x dimension only);
//! * [`sync_threads`] / [`sync_threads_or`] are block-wide barriers that every thread of the
//!   block must reach (uniform control flow);
//! * the `*_acquire_sys` / `*_release_sys` operations are system-scope, so they order memory
//!   between ranks that live on different GPUs or on the host.

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub use host::{
    atomic_add_acq_rel_sys_u32, atomic_add_gpu_u32, atomic_exchange_gpu_u32, block_dim_x,
    block_idx_x, compare_exchange_sys_u32, fence_acq_rel_sys, global_timer_ns, grid_dim_x,
    launch_is_one_dimensional, load_acquire_sys_u32, load_line, load_relaxed_sys_u32, nanosleep,
    single_thread_block, store_line, store_release_sys_u32, sync_threads, sync_threads_or,
    thread_idx_x,
};

#[cfg(loom)]
pub use host::{load_plain_u32, load_plain_u64, store_plain_u32, store_plain_u64};
#[cfg(not(loom))]
pub use plain::*;

/// Plain (non-atomic) accesses to words whose readers and writers are ordered by block barriers
/// or by launch order (barrier epochs, LL call counters, scheduler response slots). Volatile, so
/// that each is one memory instruction; under loom they are checked for data races instead.
#[cfg(not(loom))]
mod plain {
    /// Plain read of the `u32` at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and aligned, and no write may race with the read.
    #[inline(always)]
    pub unsafe fn load_plain_u32(ptr: *const u32) -> u32 {
        // SAFETY: forwarded contract.
        unsafe { core::ptr::read_volatile(ptr) }
    }

    /// Plain write of the `u32` at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes and aligned, and no other access may race with the write.
    #[inline(always)]
    pub unsafe fn store_plain_u32(ptr: *mut u32, value: u32) {
        // SAFETY: forwarded contract.
        unsafe { core::ptr::write_volatile(ptr, value) }
    }

    /// Plain read of the `u64` at `ptr`.
    ///
    /// # Safety
    /// As for [`load_plain_u32`].
    #[inline(always)]
    pub unsafe fn load_plain_u64(ptr: *const u64) -> u64 {
        // SAFETY: forwarded contract.
        unsafe { core::ptr::read_volatile(ptr) }
    }

    /// Plain write of the `u64` at `ptr`.
    ///
    /// # Safety
    /// As for [`store_plain_u32`].
    #[inline(always)]
    pub unsafe fn store_plain_u64(ptr: *mut u64, value: u64) {
        // SAFETY: forwarded contract.
        unsafe { core::ptr::write_volatile(ptr, value) }
    }
}

/// Relaxed atomic accesses to values of 1, 2, 4 or 8 bytes (an element of a window, as users'
/// kernels reach their own and their peers' windows): `ld/st.relaxed.sys` on the GPU, atomics
/// on the host, so that accesses racing on one value give an old or a new value, never
/// undefined behaviour, in Rust's model as in PTX's. Ordering between ranks comes from the
/// barriers around them.
pub mod relaxed {
    use core::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

    /// The `size`-byte value at `ptr`, zero-extended.
    ///
    /// # Safety
    /// `size` is 1, 2, 4 or 8; `ptr` is valid for reads of `size` bytes and aligned to
    /// `size`, and accessed only atomically while other threads may write it.
    #[inline(always)]
    pub unsafe fn load_bits(ptr: *const u8, size: usize) -> u64 {
        // SAFETY: valid and aligned for the access, and only accessed atomically (caller's
        // contract); each atomic type has its integer's size and alignment.
        unsafe {
            match size {
                1 => AtomicU8::from_ptr(ptr as *mut u8).load(Ordering::Relaxed) as u64,
                2 => AtomicU16::from_ptr(ptr as *mut u16).load(Ordering::Relaxed) as u64,
                4 => AtomicU32::from_ptr(ptr as *mut u32).load(Ordering::Relaxed) as u64,
                8 => AtomicU64::from_ptr(ptr as *mut u64).load(Ordering::Relaxed),
                _ => unreachable!("an element of {size} bytes"),
            }
        }
    }

    /// Store the low `size` bytes of `bits` at `ptr`.
    ///
    /// # Safety
    /// As for [`load_bits`], valid for writes.
    #[inline(always)]
    pub unsafe fn store_bits(ptr: *mut u8, size: usize, bits: u64) {
        // SAFETY: as in `load_bits`.
        unsafe {
            match size {
                1 => AtomicU8::from_ptr(ptr).store(bits as u8, Ordering::Relaxed),
                2 => AtomicU16::from_ptr(ptr as *mut u16).store(bits as u16, Ordering::Relaxed),
                4 => AtomicU32::from_ptr(ptr as *mut u32).store(bits as u32, Ordering::Relaxed),
                8 => AtomicU64::from_ptr(ptr as *mut u64).store(bits, Ordering::Relaxed),
                _ => unreachable!("an element of {size} bytes"),
            }
        }
    }
}

/// `true` when a loom test asked for the named `Mutation` (a deliberate weakening of a
/// protocol, to show that the loom tests catch it); `false`, at compile time, outside loom.
#[cfg(loom)]
macro_rules! mutated {
    ($mutation:ident) => {
        $crate::arch::host::mutated($crate::arch::host::Mutation::$mutation)
    };
}

/// `true` when a loom test asked for the named `Mutation`; `false`, at compile time, outside
/// loom.
#[cfg(not(loom))]
macro_rules! mutated {
    ($mutation:ident) => {
        false
    };
}

pub(crate) use mutated;
