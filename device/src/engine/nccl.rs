//! `SignalEngine` over NCCL's GPU-Initiated Networking (GIN), for kernels linked with NCCL's
//! device bitcode (`libnccl_device.bc`, NCCL ≥ 2.32): the symbols are resolved when Triton
//! links the kernel. Only in the Triton-linkable library: symm's own kernels never reference
//! NCCL.
//!
//! The context's engine words: [`crate::context::ENGINE_DATA`] is the data's `ncclWindow_t`,
//! [`crate::context::ENGINE_SIGNALS`]
//! the pads' `ncclWindow_t` (registered with `NCCL_WIN_STRICT_ORDERING`, as GIN's VA signals
//! need), [`crate::context::ENGINE_COMM`] a device pointer to the job's `ncclDevComm` (made
//! with GIN contexts). The symm window may begin at any offset of its NCCL window (and the pad
//! of its pad window): the engine finds it as `local_base` minus `ncclGetLocalPointer` of the
//! window's start. Puts go `(window, offset)` to `(window, offset)` on the world team (team
//! rank = symm rank); signals are VA signals in the pad window, added with `ncclGinSignalAdd`
//! and read with `ncclGinReadSignalVA` (every access to a signal word goes through GIN, as NCCL
//! requires of VA signals).
//!
//! The C entry points take `ncclTeam` and `ncclCoopAny` by value, which NCCL's bitcode lowers to
//! `byval` pointers; Rust's own lowering of a by-value aggregate differs, so they are declared
//! here as pointers to the caller's copy (what a `byval` argument is at the call).

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
use super::{Place, SignalEngine};
#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
use crate::context::{BackendTag, ENGINE_COMM, ENGINE_DATA, ENGINE_SIGNALS, SymmContext};

/// `ncclGinSignalAdd` of `ncclGinSignalOp_t`.
pub const SIGNAL_ADD: i32 = 1;
/// `NCCL_GIN_SIGNAL_TYPE_VA` of `ncclGinSignalType`.
pub const SIGNAL_TYPE_VA: i32 = 1;
/// `ncclGinSegmentTypeDevice` of `ncclGinSegmentType_t`.
pub const SEGMENT_DEVICE: i32 = 0;
/// `cuda::thread_scope_thread`.
pub const SCOPE_THREAD: i32 = 10;
/// `cuda::thread_scope_device`.
pub const SCOPE_DEVICE: i32 = 1;
/// `cuda::memory_order_acquire`.
pub const ORDER_ACQUIRE: i32 = 2;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: i32 = 0;
/// The fastest SM clock of a supported GPU, rounded up (GHz): a wait of the context's
/// timeout in nanoseconds is at most this many cycles per nanosecond.
pub const MAX_CLOCK_GHZ: u64 = 2;
/// `NCCL_GIN_BACKEND_MASK_ALL` of a Hopper build with CUDA ≥ 12.2: the proxy, GDAKI, GPI and
/// EFA GDA backends (bits 2 to 5 of `ncclNetDeviceType`).
pub const BACKEND_MASK_ALL: u32 = 0b11_1100;
/// The GIN context every program of symm's engine protocol uses (the device communicator is
/// made with at least one).
pub const GIN_CONTEXT: i32 = 0;

/// NCCL's GIN device API over the context's windows and device communicator. Made empty per
/// device-function call (each thread its own); the first operation sets the GIN handle up
/// (`ncclGin_C_init`), once the call's context was checked.
#[derive(Default)]
pub struct Nccl {
    #[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
    ready: core::cell::Cell<bool>,
    #[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
    gin: core::cell::UnsafeCell<api::GinC>,
    /// Where the symm window and this rank's pad begin in their NCCL windows.
    #[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
    starts: core::cell::Cell<(u64, u64)>,
}

impl core::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Nccl")
    }
}

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
mod api {
    use core::ffi::c_void;

    /// `ncclGin_C` (48 bytes in NCCL 2.32, 8-aligned; room is left for growth).
    #[repr(C, align(8))]
    pub struct GinC(pub [u8; 64]);

    impl Default for GinC {
        fn default() -> GinC {
            GinC([0; 64])
        }
    }

    /// `ncclCoopAny` (24 bytes, 8-aligned).
    #[repr(C, align(8))]
    pub struct CoopAny(pub [u8; 24]);

    /// `ncclTeam`.
    #[repr(C)]
    pub struct Team {
        pub ranks: i32,
        pub rank: i32,
        pub stride: i32,
    }

    unsafe extern "C" {
        pub fn ncclGin_C_init(net: *mut GinC, backend_mask: u32, comm: *const c_void, context: i32);
        pub fn ncclCoopAnyInitCta(coop: *mut CoopAny);
        pub fn ncclCoopAnyInitThread(coop: *mut CoopAny);
        #[allow(clippy::too_many_arguments)]
        pub fn ncclGinPut_v3(
            net: *const GinC,
            team: *const Team,
            peer: i32,
            dst_window: *const c_void,
            dst_offset: u64,
            src_window: *const c_void,
            src_offset: u64,
            bytes: u64,
            signal_type: i32,
            signal_window: *const c_void,
            signal_offset: u64,
            signal_id: i32,
            strong: bool,
            signal_op: i32,
            signal_op_arg: u64,
            counter: bool,
            counter_id: i32,
            coop: *const CoopAny,
            descriptor_given: bool,
            descriptor: *mut c_void,
            given_release: i32,
            required_release: i32,
            options: u32,
            segment_type: i32,
        );
        #[allow(clippy::too_many_arguments)]
        pub fn ncclGinSignal_v3(
            net: *const GinC,
            team: *const Team,
            peer: i32,
            signal_type: i32,
            signal_window: *const c_void,
            signal_offset: u64,
            signal_id: i32,
            strong: bool,
            signal_op: i32,
            signal_op_arg: u64,
            coop: *const CoopAny,
            descriptor_given: bool,
            descriptor: *mut c_void,
            given_release: i32,
            required_release: i32,
            options: u32,
        );
        pub fn ncclGinReadSignalVA(
            net: *const GinC,
            signal_window: *const c_void,
            signal_offset: u64,
            bits: i32,
            order: i32,
        ) -> u64;
        pub fn ncclGinFlushTimeout(
            net: *const GinC,
            coop: *const CoopAny,
            order: i32,
            is_descriptor: bool,
            descriptor: *mut core::ffi::c_void,
            timeout_cycles: u64,
        ) -> i32;
        pub fn ncclGetLocalPointer(window: *const c_void, offset: u64) -> *mut c_void;
    }
}

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
impl Nccl {
    /// The GIN handle of `ctx`'s device communicator, and where the symm window and this
    /// rank's pad begin in their NCCL windows (the symm window may lie at any offset of the
    /// NCCL window it was registered over: `local_base` minus NCCL's local address of the
    /// window's start). Set up by the first call; no panic path, unlike a `OnceCell`, whose
    /// re-entrance check the escaping pointer keeps alive.
    #[inline(always)]
    fn gin(&self, ctx: &SymmContext) -> *const api::GinC {
        if !self.ready.get() {
            // SAFETY: the engine words are the NCCL windows of this window's data and pads
            // (an accepted context); rank < world_size.
            let starts = unsafe {
                let data = api::ncclGetLocalPointer(ctx.engine[ENGINE_DATA] as *const _, 0);
                let pads = api::ncclGetLocalPointer(ctx.engine[ENGINE_SIGNALS] as *const _, 0);
                (
                    ctx.local_base.wrapping_sub(data as u64),
                    ctx.peer_signal_pad(ctx.rank).wrapping_sub(pads as u64),
                )
            };
            self.starts.set(starts);
            // SAFETY: `ENGINE_COMM` is a device pointer to the job's `ncclDevComm` (an
            // accepted context); the handle is this thread's own and written in place before
            // any use.
            unsafe {
                api::ncclGin_C_init(
                    self.gin.get(),
                    BACKEND_MASK_ALL,
                    ctx.engine[ENGINE_COMM] as *const _,
                    GIN_CONTEXT,
                )
            };
            self.ready.set(true);
        }
        self.gin.get()
    }

    /// The world team: team rank = symm rank (the host checks that NCCL's ranks are symm's).
    #[inline(always)]
    fn world(ctx: &SymmContext) -> api::Team {
        api::Team {
            ranks: ctx.world_size as i32,
            rank: ctx.rank as i32,
            stride: 1,
        }
    }

    /// The `ncclWindow_t` and offset of `place` (after [`Nccl::gin`] set the starts up).
    #[inline(always)]
    fn window(&self, ctx: &SymmContext, place: Place) -> (*const core::ffi::c_void, u64) {
        let (data, pads) = self.starts.get();
        match place {
            Place::Data(offset) => (ctx.engine[ENGINE_DATA] as *const _, data + offset),
            Place::Pad(offset) => (ctx.engine[ENGINE_SIGNALS] as *const _, pads + offset),
        }
    }
}

#[cfg(all(target_arch = "nvptx64", feature = "triton-library"))]
// SAFETY: a GIN put with a VA signal delivers its bytes before the signal is seen (weak
// signal: the bundled put settled); a strong signal add is atomic and seen only after every
// earlier put of this context to that peer settled; `ncclGinFlushTimeout` completes the
// block's puts as far as their sources, or says it gave up (it does not say they settled
// remotely: the trait asks no more).
unsafe impl SignalEngine for Nccl {
    const TAG: BackendTag = BackendTag::Nccl;

    /// A device communicator is named.
    #[inline(always)]
    fn accepts(ctx: &SymmContext) -> bool {
        ctx.engine[ENGINE_COMM] != 0
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
        let gin = self.gin(ctx);
        let team = Self::world(ctx);
        let mut coop = api::CoopAny([0; 24]);
        let (dst_window, dst_offset) = self.window(ctx, dest);
        let (src_window, src_offset) = self.window(ctx, Place::Data(src));
        let (signal_window, signal_offset) = self.window(ctx, Place::Pad(signal));
        // SAFETY: forwarded contract (ranges and word in the windows, a rank of the team);
        // every thread of the block calls it alike (the CTA is the put's cooperative group).
        unsafe {
            api::ncclCoopAnyInitCta(&mut coop);
            api::ncclGinPut_v3(
                gin,
                &team,
                pe as i32,
                dst_window,
                dst_offset,
                src_window,
                src_offset,
                bytes,
                SIGNAL_TYPE_VA,
                signal_window,
                signal_offset,
                0,
                false,
                SIGNAL_ADD,
                1,
                false,
                0,
                &coop,
                false,
                core::ptr::null_mut(),
                SCOPE_THREAD,
                SCOPE_DEVICE,
                0,
                SEGMENT_DEVICE,
            )
        }
    }

    #[inline(always)]
    unsafe fn signal_add(&self, ctx: &SymmContext, signal: u64, pe: u32) {
        let gin = self.gin(ctx);
        let team = Self::world(ctx);
        let mut coop = api::CoopAny([0; 24]);
        let (signal_window, signal_offset) = self.window(ctx, Place::Pad(signal));
        // SAFETY: forwarded contract; one thread (its own cooperative group).
        unsafe {
            api::ncclCoopAnyInitThread(&mut coop);
            api::ncclGinSignal_v3(
                gin,
                &team,
                pe as i32,
                SIGNAL_TYPE_VA,
                signal_window,
                signal_offset,
                0,
                true,
                SIGNAL_ADD,
                1,
                &coop,
                false,
                core::ptr::null_mut(),
                SCOPE_THREAD,
                SCOPE_DEVICE,
                0,
            )
        }
    }

    #[inline(always)]
    unsafe fn signal_reached(&self, ctx: &SymmContext, signal: u64, target: u64) -> bool {
        let gin = self.gin(ctx);
        let (signal_window, signal_offset) = self.window(ctx, Place::Pad(signal));
        // SAFETY: forwarded contract: a signal word of this rank's pad window.
        unsafe {
            api::ncclGinReadSignalVA(gin, signal_window, signal_offset, 64, ORDER_ACQUIRE) >= target
        }
    }

    /// `ncclGinFlushTimeout`, bounded by the context's timeout in SM clock cycles at
    /// [`MAX_CLOCK_GHZ`] (a slower clock waits longer, still bounded).
    #[inline(always)]
    unsafe fn quiet(&self, ctx: &SymmContext) -> bool {
        let gin = self.gin(ctx);
        let mut coop = api::CoopAny([0; 24]);
        let cycles = ctx.timeout_ns.saturating_mul(MAX_CLOCK_GHZ);
        // SAFETY: device code of the job's device communicator; every thread of the block;
        // no descriptor.
        unsafe {
            api::ncclCoopAnyInitCta(&mut coop);
            api::ncclGinFlushTimeout(
                gin,
                &coop,
                ORDER_ACQUIRE,
                false,
                core::ptr::null_mut(),
                cycles,
            ) == NCCL_SUCCESS
        }
    }
}
