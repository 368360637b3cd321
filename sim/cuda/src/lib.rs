//! A fake CUDA driver: the driver functions symm's CUDA backend and GPU tests call,
//! implemented over the simulated GPU of `symm-sim`.
//!
//! Built as a `cdylib` with the real driver's SONAME and laid out as one library,
//! `libcuda.so.1` with `libcuda.so` a link to it (`cargo xtask sim`), it lets programs that use
//! the CUDA driver API through `dlopen` (cudarc, libsymm's cuda backend, CUDA's runtime) or by
//! linking `-lcuda` run on the simulated GPU, one driver per process whichever name each part
//! opens it by:
//!
//! * `SYMM_SIM_DEVICES` devices (default 8) of compute capability 9.0, with
//!   `SYMM_SIM_SMS` multiprocessors each, peer access between all of them.
//! * Flat memory: a device pointer is a host address of the process. `cuMemAlloc` and
//!   `cuMemHostAlloc` hand out host memory registered with the simulator; the VMM functions
//!   map memfds, so POSIX file descriptor handles share memory between processes as on a GPU.
//!   `cuMemSetAccess` grants access to exactly the devices named.
//! * Asynchronous streams and events: every stream operation is queued and run later by one
//!   device thread per process, which owns the simulator and picks among the operations CUDA
//!   allows to run next (stream order, event waits, the legacy default stream's implicit
//!   synchronization) in an order drawn from the seed (`SYMM_SIM_SEED`).
//! * Stream capture into graphs (modes, fork and join through events, the illegal operations
//!   that invalidate a capture) and graph replay.
//! * `cuMemFree` and `cuMemFreeHost` wait for the device's queued work first, as the driver
//!   does in practice; with `SYMM_SIM_STRICT_FREE=1` they do not (the driver's reference
//!   promises no such wait), and a kernel still using the memory faults.
//! * A kernel fault puts the context into a sticky error state, as on a GPU. A stall longer
//!   than `SYMM_SIM_DEADLOCK_MS` (default 2000) is reported on stderr with the seed; with
//!   `SYMM_SIM_DEADLOCK=fail` the stalled grids fail instead of waiting.
//!
//! * Every driver call is counted by name: [`symm_sim_driver_calls`] (not a CUDA function)
//!   returns the total and writes the table, so that a test can measure a library's driver
//!   calls per operation.
//! * Kernels' loads and atomics on pinned host memory are counted ([`symm_sim_host_reads`]);
//!   with `SYMM_SIM_HOST_READ_NS` (a PCIe round trip, e.g. 1000) and
//!   `SYMM_SIM_HOST_READ_GAP_NS` (the link's time per read, e.g. 4; reads queue behind each
//!   other) each one also costs virtual time, as on a GPU. Both default to 0.
//!
//! Functions not listed in [`api`] are not exported: cudarc then reports the missing symbol.
//! Exported functions the simulation does not model print `symm-sim: … is not implemented`
//! and return `CUDA_ERROR_NOT_SUPPORTED`.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_snake_case)]

pub mod api;
mod engine;
mod state;
mod util;

pub use api::device::*;
pub use api::errors::*;
pub use api::memory::*;
pub use api::module::*;
pub use api::stream::*;
pub use api::vmm::*;

/// Loads and atomics that GPU threads executed on pinned host memory so far (published by the
/// device thread after each stretch of simulation).
pub(crate) static HOST_READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Loads and atomics that kernels of this process executed on pinned host memory
/// (`cuMemHostAlloc`) so far: on a GPU each is a round trip across PCIe. Not a CUDA function:
/// a program finds it with `dlsym` when it runs on the simulated GPU.
#[unsafe(no_mangle)]
pub extern "C" fn symm_sim_host_reads() -> u64 {
    HOST_READS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Driver calls made by this process so far: returns their number and writes a table of
/// `name count` lines (NUL-terminated, cut to `len` bytes) into `out` when it is not NULL.
/// Not a CUDA function: a program finds it with `dlsym` when it runs on the simulated GPU.
///
/// # Safety
/// A non-null `out` is valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symm_sim_driver_calls(out: *mut std::ffi::c_char, len: usize) -> u64 {
    let counts = util::call_counts();
    if !out.is_null() && len > 0 {
        let table: String = counts
            .iter()
            .map(|(name, n)| format!("{name} {n}\n"))
            .collect();
        let bytes = table.as_bytes();
        let n = bytes.len().min(len - 1);
        // SAFETY: `out` holds `len` bytes (contract); `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), n);
            *out.add(n) = 0;
        }
    }
    counts.values().sum()
}
