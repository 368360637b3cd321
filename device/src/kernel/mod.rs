//! The typed device API for users' kernels: a kernel written with it reaches its own and its
//! peers' windows, and runs symm's in-kernel collectives, without `unsafe`.
//!
//! The three contracts that raw device code leaves to its author are types here:
//!
//! * **Who may reach a barrier.** A kernel's body receives the block's token, a [`Block`],
//!   made once per thread by the entry that [`kernel!`](crate::kernel!) writes. Every barrier
//!   (a frame's, an in-kernel collective's, [`Block::any`]) takes `&mut Block`. The thread's
//!   index exists only inside [`Block::per_thread`] and [`Frame::per_thread`], whose work is a
//!   `fn` pointer (it captures nothing, so it cannot reach the block or a frame) over arguments
//!   that are `Send` (a reference to a `Block`, a `Frame` or a `Slot` is not); what it computes comes back
//!   as a [`Varying`], which only a lane can read and only [`Block::any`] / [`Block::all`]
//!   make uniform. So, outside those functions, control flow is the same on every thread of
//!   the block, and every thread reaches every barrier.
//! * **Peer access stays in bounds, aligned, in range and in its window.** A window comes into a
//!   kernel as a [`WindowArg`] (which the host makes from a window it keeps alive for the
//!   launch) and is opened once per kernel with [`Block::window`], which checks its context.
//!   Inside, [`Win`], [`Peer`], [`Span`] and [`Slot`] carry the window's brand (a fresh
//!   lifetime per opening), so a peer or a span of one window is a type error on another.
//!   Peers are made only by [`Win::peer`] (`rank < world`) and spans only by [`Win::span`]
//!   (inside the window, which is the same size on every rank; every rank's base is 16-byte
//!   aligned, so an element offset is aligned for every element type); an access checks its
//!   index against its span.
//! * **Peer access happens only inside a barrier frame every rank enters.** A peer's window is
//!   reachable only through a [`PeerLane`], which exists only inside [`Frame::per_thread`]; a
//!   [`Frame`] is lent to the body of [`Slot::frame`] between a cross-rank barrier that opens it
//!   and one that closes it, so it cannot be dropped, forgotten or kept open. The slot is
//!   borrowed meanwhile, so an in-kernel collective (which borrows the slot) cannot run inside
//!   a frame. Frames share the window's barrier epochs with symm's launched kernels, so a
//!   user's kernel and symm's collectives interleave on one window in stream order.
//!
//! Every barrier here (a frame's, an in-kernel collective's, [`barrier`]) is one of every block
//! of every rank: the window's grid barrier, then the cross-rank barrier of the block's index.
//!
//! These hold for a kernel that reaches the device only through this module (the crate's lower
//! layers reach barriers and thread indices without the token). Threads that touch one element
//! between two barriers, and ranks or blocks making different sequences on a window, are the
//! kernel author's to get right. `docs/DEVICE_API.md` says what exactly the types leave to run
//! time and to the author.

mod collective;
mod frame;
mod tiles;
mod window;

pub use crate::numeric::element::{Bf16, Element, F8E4M3, F8E5M2, F16};
pub use crate::numeric::ops::{Avg, Max, Min, Prod, ReduceOp, Sum};
pub use crate::sync::barrier::Aborted;
pub use collective::{all_gather, all_reduce, barrier};
pub use frame::{Frame, PeerLane, Slot};
pub use tiles::{BlockStats, TileId};
pub use window::{Invalid, Peer, Span, Win, WindowArg};

use crate::arch;
use crate::sync::grid::block_range;
use core::marker::PhantomData;

/// The calling block, as one of its threads holds it: the token every block-wide step takes.
/// One per thread, made by the entry point [`kernel!`](crate::kernel!) writes; neither `Send`,
/// `Sync` nor `Copy`.
pub struct Block {
    block: u32,
    blocks: u32,
    threads: u32,
    _per_thread: PhantomData<*mut ()>,
}

impl Block {
    /// The calling thread's token of its block.
    ///
    /// # Safety
    /// Called once per thread, at the kernel's entry, by every thread of every block of the
    /// launch (what [`kernel!`](crate::kernel!) writes), so that every thread of a block
    /// holds one token and makes the same sequence of block-wide steps. On the host emulation a
    /// second token in one run of a kernel panics (a kernel's entry called inside a kernel).
    #[inline(always)]
    pub unsafe fn enter() -> Block {
        #[cfg(not(target_arch = "nvptx64"))]
        assert!(
            arch::host::take_block_token(),
            "a kernel's entry was called inside a kernel (one block token per thread and run)"
        );
        Block {
            block: arch::block_idx_x(),
            blocks: arch::grid_dim_x(),
            threads: arch::block_dim_x(),
            _per_thread: PhantomData,
        }
    }

    /// This block's index in the grid.
    #[inline(always)]
    pub fn index(&self) -> u32 {
        self.block
    }

    /// Blocks in the grid.
    #[inline(always)]
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// Threads in the block.
    #[inline(always)]
    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// Run `work` on every thread of the block with `args`: the thread's [`Lane`] is the only
    /// place its index is known. What each thread returns comes back as a [`Varying`].
    #[inline(always)]
    pub fn per_thread<A: Send, R: Send>(&self, args: A, work: fn(Lane<'_>, A) -> R) -> Varying<R> {
        Varying(work(Lane::of(self), args))
    }

    /// `true` on every thread when `value` is `true` on any thread of the block (a block-wide
    /// barrier).
    #[inline(always)]
    pub fn any(&mut self, value: Varying<bool>) -> bool {
        arch::sync_threads_or(value.0)
    }

    /// `true` on every thread when `value` is `true` on every thread of the block (a
    /// block-wide barrier).
    #[inline(always)]
    pub fn all(&mut self, value: Varying<bool>) -> bool {
        !arch::sync_threads_or(!value.0)
    }

    /// Wait until every thread of the block reached this point (a block-wide barrier): what
    /// the block's threads wrote to their own window before it is visible to all of them
    /// after it.
    #[inline(always)]
    pub fn sync(&mut self) {
        arch::sync_threads();
    }
}

/// One thread of a block, inside [`Block::per_thread`]: its index, and its own window's
/// elements.
pub struct Lane<'a> {
    thread: u32,
    threads: u32,
    block: u32,
    blocks: u32,
    _lane: PhantomData<&'a ()>,
    _per_thread: PhantomData<*mut ()>,
}

impl Lane<'_> {
    #[inline(always)]
    fn of(block: &Block) -> Self {
        Lane {
            thread: arch::thread_idx_x(),
            threads: block.threads,
            block: block.block,
            blocks: block.blocks,
            _lane: PhantomData,
            _per_thread: PhantomData,
        }
    }

    /// This thread's index in its block.
    #[inline(always)]
    pub fn thread(&self) -> u32 {
        self.thread
    }

    /// Threads in the block.
    #[inline(always)]
    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// This thread's index in the grid: `block · threads + thread`.
    #[inline(always)]
    pub fn global(&self) -> u64 {
        self.block as u64 * self.threads as u64 + self.thread as u64
    }

    /// Threads in the grid.
    #[inline(always)]
    pub fn grid_threads(&self) -> u64 {
        self.blocks as u64 * self.threads as u64
    }

    /// This thread's block's index in the grid.
    #[inline(always)]
    pub fn block(&self) -> u32 {
        self.block
    }

    /// Blocks in the grid.
    #[inline(always)]
    pub fn blocks(&self) -> u32 {
        self.blocks
    }

    /// The indices of `0..len` this thread handles when the grid shares `len` items: its
    /// block's contiguous part (the same part block `b` of every rank takes) strided by the
    /// block's threads, so no two threads of a rank touch one index between two barriers.
    #[inline(always)]
    pub fn share(&self, len: u64) -> core::iter::StepBy<core::ops::Range<u64>> {
        // A window holds at most 2^64 bytes, so `len` of any span fits the partition's
        // arithmetic; larger lengths are clamped rather than overflow.
        let (lo, hi) = block_range(len.min(u64::MAX / 2), self.block, self.blocks);
        (lo.saturating_add(self.thread as u64)..hi).step_by(self.threads.max(1) as usize)
    }

    /// Element `index` of `span` in this rank's window, or `None` past the span.
    #[inline(always)]
    pub fn read<'w, T: Element>(
        &self,
        win: Win<'w, T>,
        span: Span<'w, T>,
        index: u64,
    ) -> Option<T> {
        win.read(win.me(), span, index)
    }

    /// Store `value` as element `index` of `span` in this rank's window: `false` (nothing
    /// stored) past the span.
    #[inline(always)]
    pub fn write<'w, T: Element>(
        &self,
        win: Win<'w, T>,
        span: Span<'w, T>,
        index: u64,
        value: T,
    ) -> bool {
        win.write(win.me(), span, index, value)
    }
}

/// A value that may differ between the threads of a block (one per [`Lane`]). Only a lane reads
/// it ([`Varying::get`]); [`Block::any`] and [`Block::all`] turn it into a value that is the
/// same on every thread.
#[derive(Clone, Copy)]
pub struct Varying<T>(T);

impl<T> Varying<T> {
    /// This thread's value.
    #[inline(always)]
    pub fn get(self, lane: &Lane<'_>) -> T {
        let _ = lane;
        self.0
    }
}

/// Write a kernel's entry point around a body that receives the block's token:
///
/// ```ignore
/// symm_device::kernel! {
///     /// Add one to every element of the window on every rank.
///     pub fn add_one(block, window: WindowArg<f32>) {
///         let _ = block.window(window, |block, win, _slot| {
///             let all = win.span(0..win.len()).unwrap();
///             block.per_thread((win, all), |lane, (win, all)| {
///                 let mut i = lane.global();
///                 while let Some(v) = lane.read(win, all, i) {
///                     lane.write(win, all, i, v + 1.0);
///                     i += lane.grid_threads();
///                 }
///             });
///         });
///     }
/// }
/// ```
///
/// On `nvptx64` it is an `extern "ptx-kernel"` function named as written (`#[no_mangle]`; the
/// crate enables `abi_ptx`), whose parameters are the listed arguments; on the host a plain
/// function of the same arguments, which the host emulation (`arch::host::run_grid`) runs on
/// every thread of a grid. The only `unsafe` is the token's making, here.
#[macro_export]
macro_rules! kernel {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($block:ident $(, $arg:ident : $ty:ty)* $(,)?) $body:block
    ) => {
        $(#[$meta])*
        #[cfg(target_arch = "nvptx64")]
        #[unsafe(no_mangle)]
        $vis unsafe extern "ptx-kernel" fn $name($($arg: $ty),*) {
            // The body is a safe function of its own: no `unsafe` context leaks into it.
            #[inline(always)]
            fn body($block: &mut $crate::kernel::Block $(, $arg: $ty)*) $body
            $($crate::kernel::param::<$ty>();)*
            // SAFETY: the kernel's entry point, run once by every thread of the launch.
            let mut token = unsafe { $crate::kernel::Block::enter() };
            body(&mut token $(, $arg)*)
        }

        $(#[$meta])*
        #[cfg(not(target_arch = "nvptx64"))]
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($block: &mut $crate::kernel::Block $(, $arg: $ty)*) $body
            $($crate::kernel::param::<$ty>();)*
            // SAFETY: the kernel's entry point: the host emulation runs this function once on
            // every thread of its grid; called outside a grid, or inside a kernel, `enter`
            // panics.
            let mut token = unsafe { $crate::kernel::Block::enter() };
            body(&mut token $(, $arg)*)
        }
    };
}

/// A type a kernel's entry takes as a parameter: a [`WindowArg`] or a number (`u32`, `i32`,
/// `u64`, `i64`, `f32`, `f64`). Sealed: the host passes these bytes, so a parameter cannot be
/// a token, a slot or a reference.
pub trait KernelParam: param_seal::Sealed {}

mod param_seal {
    pub trait Sealed {}
}

macro_rules! number_param {
    ($($t:ty),*) => {$(
        impl param_seal::Sealed for $t {}
        impl KernelParam for $t {}
    )*};
}

number_param!(u32, i32, u64, i64, f32, f64);

impl<T: Element> param_seal::Sealed for WindowArg<T> {}
impl<T: Element> KernelParam for WindowArg<T> {}

/// Compile-time check, in the entry [`kernel!`](crate::kernel!) writes, that a parameter's
/// type is a [`KernelParam`].
#[doc(hidden)]
#[inline(always)]
pub const fn param<T: KernelParam>() {}
