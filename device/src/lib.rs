//! # symm-device
//!
//! Device-side code of symm, written once and compiled twice:
//!
//! * for `nvptx64-nvidia-cuda` (PTX, and LLVM bitcode for Triton), where [`arch`] is inline
//!   PTX and `core::arch::nvptx`;
//! * for the host, where [`arch`] runs a grid as OS threads, so that the very same kernels run
//!   on a CPU (this is what CI executes).
//!
//! Layers, bottom to top (data and calls flow one way; `cargo xtask layers` checks the
//! imports against the same six layers in `docs/ARCHITECTURE.md`):
//!
//! 1. [`arch`] — the only module with inline assembly and intrinsics: thread/block indices,
//!    block barriers, scoped acquire/release memory operations, fences, sleep and the global
//!    timer.
//! 2. [`numeric`] and [`types`] — element types, reductions and the data-type codes.
//! 3. [`context`] ([`SymmContext`]) and [`sync`] — the window as kernels see it; safe
//!    primitives built on `arch`: bounded waits and the cross-rank barrier on signal pads.
//! 4. [`scheduler`] — tile scheduling with Cluster Launch Control as types.
//! 5. [`symmetric`] — the collective kernels, generic over element type and reduction.
//! 6. [`exports`] — the `extern "ptx-kernel"` entry points that appear in the PTX,
//!    [`triton`] — the device functions that Triton kernels (or any device code) link from the
//!    Triton-linkable LLVM IR, and [`mod@kernel`] — the typed API users' own kernels are written
//!    in (no `unsafe` in the kernel's code).
//!
//! [`SymmContext`] is the `#[repr(C)]` description of one symmetric window that every kernel
//! receives as a 64-bit pointer.

#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

/// Run `$body` once for each listed index, bound to `$i` as a constant: a loop unrolled by
/// hand, so that arrays indexed by `$i` stay in registers on the GPU (LLVM's unroller gives up
/// on bodies with calls or wide conversions, and a dynamically indexed array lives in local
/// memory).
macro_rules! unroll {
    ($i:ident in [$($n:literal)*] => $body:block) => {
        $({
            let $i: usize = $n;
            $body
        })*
    };
}

pub mod arch;
pub mod context;
pub mod exports;
pub mod kernel;
pub mod numeric;
pub mod scheduler;
pub mod symmetric;
pub mod sync;
pub mod triton;
pub mod types;

pub use context::{BackendTag, SymmContext};
pub use types::{DataType, RedOp};

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
