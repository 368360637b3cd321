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
    atomic_add_gpu_u32, atomic_exchange_gpu_u32, block_dim_x, block_idx_x, global_timer_ns,
    grid_dim_x, load_acquire_sys_u32, load_line, nanosleep, store_line, store_release_sys_u32,
    sync_threads, sync_threads_or, thread_idx_x,
};
