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

/// `true` when the grid and the blocks are one-dimensional (y and z extents of 1).
#[inline(always)]
pub fn launch_is_one_dimensional() -> bool {
    // SAFETY: reading special registers has no preconditions.
    unsafe {
        nvptx::_grid_dim_y() == 1
            && nvptx::_grid_dim_z() == 1
            && nvptx::_block_dim_y() == 1
            && nvptx::_block_dim_z() == 1
    }
}

/// Block-wide barrier (`barrier.sync 0`). Every thread of the block must call it.
///
/// The non-`.aligned` form: inline assembly is not `convergent` to LLVM, which may duplicate
/// or sink it into divergent paths; this form stays correct when threads of a warp reach the
/// barrier at different instructions.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a block barrier has no memory-safety preconditions; callers keep control flow
    // uniform so that every thread of the block arrives.
    unsafe { asm!("barrier.sync 0;") }
}

/// Block-wide barrier that returns whether `pred` was true on any thread of the block
/// (`barrier.red.or.pred`, non-`.aligned` as for [`sync_threads`]). The result is the same on
/// every thread.
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
            "barrier.red.or.pred %p_out, 0, %p_in;",
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

/// System-scope relaxed load of a `u32` (`ld.relaxed.sys.u32`): a strong load that orders
/// nothing else, so the thread does not wait for it until its value is used (an acquire load
/// also invalidates the L1 and keeps later loads behind it).
///
/// # Safety
/// `ptr` must be a valid, 4-byte aligned generic address of global or host-mapped memory.
#[inline(always)]
pub unsafe fn load_relaxed_sys_u32(ptr: *const u32) -> u32 {
    let value: u32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "ld.relaxed.sys.u32 {v}, [{p}];",
            v = out(reg32) value,
            p = in(reg64) ptr,
            options(nostack),
        );
    }
    value
}

/// System-scope acquire-release fence (`fence.acq_rel.sys`): orders this thread's memory
/// operations before it against those after it, for observers on any GPU or the host.
#[inline(always)]
pub fn fence_acq_rel_sys() {
    // SAFETY: a fence has no memory-safety preconditions.
    unsafe { asm!("fence.acq_rel.sys;", options(nostack)) };
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

/// Store a 16-byte LL line `[a, b, c, d]` as two 8-byte elements `b:a` and `d:c` with one
/// vector store (`st.relaxed.sys.v2.b64`). Each 8-byte element is a single-copy-atomic
/// strong access in the PTX memory model (the elements of a vector access are not atomic
/// together, and `.u32` elements would be atomic only 4 bytes at a time), so a reader that
/// sees the flag in an element's upper half has that element's data.
///
/// # Safety
/// `ptr` must be a valid, 16-byte aligned generic address of global memory.
#[inline(always)]
pub unsafe fn store_line(ptr: *mut [u32; 4], line: [u32; 4]) {
    let lo = line[0] as u64 | (line[1] as u64) << 32;
    let hi = line[2] as u64 | (line[3] as u64) << 32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "st.relaxed.sys.v2.b64 [{p}], {{{lo}, {hi}}};",
            p = in(reg64) ptr,
            lo = in(reg64) lo,
            hi = in(reg64) hi,
            options(nostack),
        );
    }
}

/// Load a 16-byte LL line as two single-copy-atomic 8-byte elements with one vector load
/// (`ld.relaxed.sys.v2.b64`; see [`store_line`]).
///
/// # Safety
/// As for [`store_line`].
#[inline(always)]
pub unsafe fn load_line(ptr: *const [u32; 4]) -> [u32; 4] {
    let (lo, hi): (u64, u64);
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "ld.relaxed.sys.v2.b64 {{{lo}, {hi}}}, [{p}];",
            p = in(reg64) ptr,
            lo = out(reg64) lo,
            hi = out(reg64) hi,
            options(nostack),
        );
    }
    [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32]
}

/// Sleep for about `ns` nanoseconds (`nanosleep.u32`, sm_70+).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no memory is touched.
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nomem, nostack)) }
}

/// IEEE binary16 bits to f32 (`cvt.f32.f16`, every target: exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let out: f32;
    // SAFETY: a conversion between registers.
    unsafe {
        asm!(
            "cvt.f32.f16 {out}, {h};",
            out = out(reg32) out,
            h = in(reg16) bits,
            options(pure, nomem, nostack),
        )
    }
    out
}

/// f32 to IEEE binary16 bits (`cvt.rn.f16.f32`: round to nearest even, overflow to infinity,
/// subnormals kept).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    let out: u16;
    // SAFETY: a conversion between registers.
    unsafe {
        asm!(
            "cvt.rn.f16.f32 {h}, {x};",
            h = out(reg16) out,
            x = in(reg32) x,
            options(pure, nomem, nostack),
        )
    }
    out
}

/// OCP float8 e4m3 bits to f32 (`cvt.rn.f16x2.e4m3x2`, sm_89+, then `cvt.f32.f16`: both
/// exact).
#[cfg(target_feature = "sm_89")]
#[inline(always)]
pub fn e4m3_to_f32(byte: u8) -> f32 {
    let pair: u32;
    // SAFETY: a conversion between registers.
    unsafe {
        asm!(
            "cvt.rn.f16x2.e4m3x2 {pair}, {byte};",
            pair = out(reg32) pair,
            byte = in(reg16) byte as u16,
            options(pure, nomem, nostack),
        )
    }
    f16_to_f32(pair as u16)
}

/// f32 to OCP float8 e4m3 bits (`cvt.rn.satfinite.e4m3x2.f32`, sm_89+: round to nearest
/// even, magnitudes above 448 (infinity too) to ±448, NaN to `0x7F`).
#[cfg(target_feature = "sm_89")]
#[inline(always)]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let pair: u16;
    // SAFETY: a conversion between registers.
    unsafe {
        asm!(
            "cvt.rn.satfinite.e4m3x2.f32 {pair}, {zero}, {x};",
            pair = out(reg16) pair,
            zero = in(reg32) 0.0f32,
            x = in(reg32) x,
            options(pure, nomem, nostack),
        )
    }
    pair as u8
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

/// Relaxed, GPU-scope atomic add on a `u32` in global memory; returns the previous value.
///
/// # Safety
/// `ptr` must be a valid, 4-byte aligned generic address of global memory.
#[inline(always)]
pub unsafe fn atomic_add_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "atom.relaxed.gpu.add.u32 {o}, [{p}], {v};",
            o = out(reg32) old,
            p = in(reg64) ptr,
            v = in(reg32) value,
            options(nostack),
        );
    }
    old
}

/// Acquire-release, system-scope atomic add on a `u32` (`atom.acq_rel.sys.add.u32`); returns
/// the previous value: what the calling thread wrote or saw before is published with the add,
/// and what the writers of earlier values published is visible after it.
///
/// # Safety
/// As for [`store_release_sys_u32`].
#[inline(always)]
pub unsafe fn atomic_add_acq_rel_sys_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "atom.acq_rel.sys.add.u32 {o}, [{p}], {v};",
            o = out(reg32) old,
            p = in(reg64) ptr,
            v = in(reg32) value,
            options(nostack),
        );
    }
    old
}

/// Relaxed, GPU-scope atomic exchange on a `u32` in global memory; returns the previous value.
///
/// # Safety
/// As for [`atomic_add_gpu_u32`].
#[inline(always)]
pub unsafe fn atomic_exchange_gpu_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "atom.relaxed.gpu.exch.b32 {o}, [{p}], {v};",
            o = out(reg32) old,
            p = in(reg64) ptr,
            v = in(reg32) value,
            options(nostack),
        );
    }
    old
}

/// Release, system-scope compare-and-swap on a `u32` (`atom.release.sys.cas.b32`): writes
/// `new` when the word holds `expected`; returns the previous value either way.
///
/// # Safety
/// As for [`store_release_sys_u32`].
#[inline(always)]
pub unsafe fn compare_exchange_sys_u32(ptr: *mut u32, expected: u32, new: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller guarantees `ptr` is valid and aligned.
    unsafe {
        asm!(
            "atom.release.sys.cas.b32 {o}, [{p}], {e}, {n};",
            o = out(reg32) old,
            p = in(reg64) ptr,
            e = in(reg32) expected,
            n = in(reg32) new,
            options(nostack),
        );
    }
    old
}

/// Cluster Launch Control and the asynchronous-proxy operations it needs (sm_100a and newer
/// `a` targets only). The response slots and their mbarriers live in static shared memory
/// declared here; slot `i` is 16 bytes at `symm_clc_response + 16 i`, its mbarrier 8 bytes at
/// `symm_clc_mbarrier + 8 i`.
#[cfg(target_feature = "sm_100a")]
pub mod clc {
    use core::arch::{asm, global_asm};

    /// Response slots (and so requests in flight) per block.
    pub const SLOTS: u32 = 2;

    global_asm!(
        ".shared .align 16 .b8 symm_clc_response[32];",
        ".shared .align 8 .b8 symm_clc_mbarrier[16];"
    );

    /// Initialize slot `slot`'s mbarrier (arrival count 1) and make it visible to the async
    /// proxy. One thread per block, before any request; a block barrier must follow.
    ///
    /// # Safety
    /// `slot < SLOTS`; called once per block, by one thread.
    #[inline(always)]
    pub unsafe fn init_mbarrier(slot: u32) {
        // SAFETY: the mbarrier is a valid 8-byte shared location (slot < SLOTS).
        unsafe {
            asm!(
                "{{",
                ".reg .b64 %clc_bar;",
                "mov.u64 %clc_bar, symm_clc_mbarrier;",
                "mad.wide.u32 %clc_bar, {s}, 8, %clc_bar;",
                "mbarrier.init.shared::cta.b64 [%clc_bar], 1;",
                "fence.mbarrier_init.release.cluster;",
                "}}",
                s = in(reg32) slot,
                options(nostack),
            );
        }
    }

    /// Fence before a request: generic-proxy accesses of the response slot are ordered before
    /// the asynchronous write of the next response.
    #[inline(always)]
    pub fn fence_acquire_async() {
        // SAFETY: a fence has no memory-safety preconditions.
        unsafe {
            asm!(
                "fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;",
                options(nostack)
            )
        }
    }

    /// Fence after a response was decoded: releases the slot for the next asynchronous write.
    #[inline(always)]
    pub fn fence_release_async() {
        // SAFETY: a fence has no memory-safety preconditions.
        unsafe {
            asm!(
                "fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;",
                options(nostack)
            )
        }
    }

    /// Arm slot `slot`'s mbarrier for a 16-byte response and, when `submit`, issue the
    /// cancellation request into the slot. `multicast`: the cluster variant (the response
    /// reaches the same slot of every CTA of the cluster; every CTA arms, one submits).
    ///
    /// # Safety
    /// One thread per CTA calls it, `slot < SLOTS`, the slot's mbarrier is initialized, no
    /// request is in flight on the slot, and no failed response was observed by this CTA.
    #[inline(always)]
    pub unsafe fn request(slot: u32, multicast: bool, submit: bool) {
        // SAFETY: forwarded contract; addresses are the static shared slots.
        unsafe {
            asm!(
                "{{",
                ".reg .b64 %clc_bar;",
                "mov.u64 %clc_bar, symm_clc_mbarrier;",
                "mad.wide.u32 %clc_bar, {s}, 8, %clc_bar;",
                "mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64 _, [%clc_bar], 16;",
                "}}",
                s = in(reg32) slot,
                options(nostack),
            );
            if !submit {
                return;
            }
            // The two variants differ only in the instruction; addresses are computed alike.
            macro_rules! try_cancel {
                ($instruction:literal) => {
                    asm!(
                        "{{",
                        ".reg .b64 %clc_resp;",
                        ".reg .b64 %clc_bar;",
                        "mov.u64 %clc_resp, symm_clc_response;",
                        "mad.wide.u32 %clc_resp, {s}, 16, %clc_resp;",
                        "mov.u64 %clc_bar, symm_clc_mbarrier;",
                        "mad.wide.u32 %clc_bar, {s}, 8, %clc_bar;",
                        $instruction,
                        "}}",
                        s = in(reg32) slot,
                        options(nostack),
                    )
                };
            }
            if multicast {
                try_cancel!(
                    "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.multicast::cluster::all.b128 [%clc_resp], [%clc_bar];"
                );
            } else {
                try_cancel!(
                    "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128 [%clc_resp], [%clc_bar];"
                );
            }
        }
    }

    /// Test whether slot `slot`'s mbarrier completed phase `parity` (acquire).
    ///
    /// # Safety
    /// `slot < SLOTS` and its mbarrier is initialized.
    #[inline(always)]
    pub unsafe fn try_wait(slot: u32, parity: u32) -> bool {
        let done: u32;
        // SAFETY: forwarded contract.
        unsafe {
            asm!(
                "{{",
                ".reg .b64 %clc_bar;",
                ".reg .pred %clc_p;",
                "mov.u64 %clc_bar, symm_clc_mbarrier;",
                "mad.wide.u32 %clc_bar, {s}, 8, %clc_bar;",
                "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 %clc_p, [%clc_bar], {q};",
                "selp.u32 {d}, 1, 0, %clc_p;",
                "}}",
                s = in(reg32) slot,
                q = in(reg32) parity,
                d = out(reg32) done,
                options(nostack),
            );
        }
        done != 0
    }

    /// Decode slot `slot`'s response in one asm block (no 128-bit or predicate register class
    /// exists outside it): `Some(first ctaid.x)` when a cluster was canceled. The ctaid of a
    /// failed response is never read (the query is predicated on success).
    ///
    /// # Safety
    /// `slot < SLOTS` and the slot's mbarrier completed for this response.
    #[inline(always)]
    pub unsafe fn query(slot: u32) -> Option<u32> {
        let canceled: u32;
        let x: u32;
        // SAFETY: forwarded contract.
        unsafe {
            asm!(
                "{{",
                ".reg .b64 %clc_resp;",
                ".reg .b128 %clc_r;",
                ".reg .pred %clc_ok;",
                ".reg .b32 %clc_y, %clc_z, %clc_w;",
                "mov.u64 %clc_resp, symm_clc_response;",
                "mad.wide.u32 %clc_resp, {s}, 16, %clc_resp;",
                "ld.shared.b128 %clc_r, [%clc_resp];",
                "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128 %clc_ok, %clc_r;",
                "selp.u32 {c}, 1, 0, %clc_ok;",
                "mov.u32 {x}, 0;",
                "@%clc_ok clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128 {{{x}, %clc_y, %clc_z, %clc_w}}, %clc_r;",
                "}}",
                s = in(reg32) slot,
                c = out(reg32) canceled,
                x = out(reg32) x,
                options(nostack),
            );
        }
        if canceled != 0 { Some(x) } else { None }
    }

    /// This CTA's rank in its cluster.
    #[inline(always)]
    pub fn cluster_cta_rank() -> u32 {
        let r: u32;
        // SAFETY: reading a special register.
        unsafe { asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r, options(nomem, nostack)) }
        r
    }

    /// CTAs per cluster.
    #[inline(always)]
    pub fn cluster_size() -> u32 {
        let r: u32;
        // SAFETY: reading a special register.
        unsafe {
            asm!("mov.u32 {r}, %cluster_nctarank;", r = out(reg32) r, options(nomem, nostack))
        }
        r
    }

    /// Cluster-wide barrier (every thread of every CTA of the cluster).
    #[inline(always)]
    pub fn cluster_sync() {
        // SAFETY: a barrier has no memory-safety preconditions; callers keep it uniform.
        unsafe {
            asm!("barrier.cluster.arrive.release.aligned;");
            asm!("barrier.cluster.wait.acquire.aligned;");
        }
    }
}

/// `true` where the calling thread is its block's only one and moves a contiguous range as
/// one copy: never on a GPU, whose copy loops keep the block's threads on interleaved units
/// (each warp's accesses coalesce).
#[inline(always)]
pub fn single_thread_block() -> bool {
    false
}
