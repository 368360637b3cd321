//! `SignalEngine` over NVSHMEM's device API, for kernels linked with NVSHMEM's device bitcode
//! (`libnvshmem_device*.bc`): the symbols are resolved when Triton links the kernel, and the
//! module needs `nvshmemx_cumodule_init` before its first launch (`symm.triton` does both).
//! Only in the Triton-linkable library: symm's own kernels never reference NVSHMEM.

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
use super::{Place, SignalEngine};
#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
use crate::context::{BackendTag, ENGINE_DATA, ENGINE_SIGNALS, SymmContext};

/// `NVSHMEM_SIGNAL_ADD` of `nvshmemx_signal_op_t`.
pub const SIGNAL_ADD: i32 = 10;
/// `NVSHMEM_CMP_GE` of `nvshmem_cmp_type`.
pub const CMP_GE: i32 = 5;

/// The NVSHMEM device API (PE numbers are symm ranks: the host refuses a window whose ranks
/// are not the job's PEs in order).
#[derive(Clone, Copy, Debug, Default)]
pub struct Nvshmem;

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
mod api {
    use core::ffi::c_void;

    unsafe extern "C" {
        pub fn nvshmemx_putmem_signal_nbi_block(
            dest: *mut c_void,
            source: *const c_void,
            bytes: usize,
            signal: *mut u64,
            value: u64,
            operation: i32,
            pe: i32,
        );
        pub fn nvshmemx_signal_op(signal: *mut u64, value: u64, operation: i32, pe: i32);
        pub fn nvshmem_uint64_test(word: *mut u64, comparison: i32, value: u64) -> i32;
        pub fn nvshmem_quiet();
    }
}

/// The symmetric address of `place` (NVSHMEM's symmetric addresses are this PE's own).
#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
#[inline(always)]
fn address(ctx: &SymmContext, place: Place) -> u64 {
    match place {
        Place::Data(offset) => ctx.engine[ENGINE_DATA] + offset,
        Place::Pad(offset) => ctx.engine[ENGINE_SIGNALS] + offset,
    }
}

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
// SAFETY: NVSHMEM delivers a put-with-signal's data before its signal, its signal operations
// are atomic, and `nvshmem_quiet` completes the calling PE's puts.
unsafe impl SignalEngine for Nvshmem {
    const TAG: BackendTag = BackendTag::Nvshmem;

    /// The signal words' symmetric address is 16-byte aligned.
    #[inline(always)]
    fn accepts(ctx: &SymmContext) -> bool {
        ctx.engine[ENGINE_SIGNALS].is_multiple_of(16)
    }

    #[inline(always)]
    unsafe fn put_with_signal(
        &self,
        ctx: &SymmContext,
        dest: Place,
        src: u64,
        bytes: u64,
        signal: u64,
        pe: u32,
    ) {
        // SAFETY: forwarded contract (symmetric ranges and word, a PE of the job); the source
        // is this PE's window data.
        unsafe {
            api::nvshmemx_putmem_signal_nbi_block(
                address(ctx, dest) as *mut _,
                (ctx.local_base + src) as *const _,
                bytes as usize,
                address(ctx, Place::Pad(signal)) as *mut u64,
                1,
                SIGNAL_ADD,
                pe as i32,
            )
        }
    }

    #[inline(always)]
    unsafe fn signal_add(&self, ctx: &SymmContext, signal: u64, pe: u32) {
        // SAFETY: forwarded contract.
        unsafe {
            api::nvshmemx_signal_op(
                address(ctx, Place::Pad(signal)) as *mut u64,
                1,
                SIGNAL_ADD,
                pe as i32,
            )
        }
    }

    #[inline(always)]
    unsafe fn signal_reached(&self, ctx: &SymmContext, signal: u64, target: u64) -> bool {
        // SAFETY: forwarded contract.
        unsafe {
            api::nvshmem_uint64_test(address(ctx, Place::Pad(signal)) as *mut u64, CMP_GE, target)
                != 0
        }
    }

    #[inline(always)]
    /// `nvshmem_quiet`, which has no bounded form: it waits on NVSHMEM's own terms.
    unsafe fn quiet(&self, _: &SymmContext) -> bool {
        // SAFETY: device code of an NVSHMEM job (forwarded contract).
        unsafe { api::nvshmem_quiet() };
        true
    }
}
