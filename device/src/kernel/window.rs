//! A window inside a user's kernel: the argument the host passes ([`WindowArg`]), its opening
//! ([`super::Block::window`]), and the branded handles that checked accesses take ([`Win`],
//! [`Peer`], [`Span`]).

use super::frame::Slot;
use super::{Block, Element};
use crate::arch;
use crate::context::{BackendTag, CONTEXT_VERSION, SymmContext};
use crate::symmetric::{context_is_valid, raise_invalid_launch};
use crate::sync::signal_pad::MAX_BLOCKS;
use core::marker::PhantomData;
use core::ops::Range;

/// Alignment of every rank's window base: the host refuses a registration whose base is not a
/// multiple of it on some rank, and [`super::Block::window`] checks it again.
const BASE_ALIGNMENT: u64 = 16;

/// A window of elements of `T`, as a kernel parameter: the device address of this rank's
/// context of the window (64 bits, what `symmCommGetDeviceContext` gives), which the host
/// passes for a window it keeps alive until the launch completes. It is not `Copy`, so a kernel
/// opens each window argument once.
#[repr(transparent)]
pub struct WindowArg<T: Element> {
    context: u64,
    element: PhantomData<fn() -> T>,
}

impl<T: Element> WindowArg<T> {
    /// The argument for the context at `context`.
    ///
    /// # Safety
    /// `context` is 0 or the device address of a context the host built for a window of this
    /// rank that outlives the kernel's launch, whose elements the kernel treats as `T`.
    pub const unsafe fn from_context_address(context: u64) -> Self {
        WindowArg {
            context,
            element: PhantomData,
        }
    }

    /// The context's address, as the launch passes it.
    pub const fn context_address(&self) -> u64 {
        self.context
    }
}

/// A window argument refused by [`super::Block::window`] (on every thread of the block alike):
/// a null context, another engine's, a layout of another version, a rank or world size past
/// the kernels' limits, a base that is not 16-byte aligned on some rank, or a grid that is not
/// one-dimensional with at most 64 blocks (the barrier slots a window has). The window's abort
/// word is raised (a non-null context), so its peers' waits end and the host reports the
/// window failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalid;

impl Block {
    /// Open window `arg` for `body`, which receives the block back, the window ([`Win`]) and
    /// this block's barrier slot of it ([`Slot`]), all branded with a lifetime of their own:
    /// nothing of one window can be used with another, nor leave `body`. The context is
    /// checked first (see [`Invalid`]); every thread of the block gets the same answer.
    #[inline(always)]
    pub fn window<T: Element, R>(
        &mut self,
        arg: WindowArg<T>,
        body: impl for<'w> FnOnce(&mut Block, Win<'w, T>, Slot<'w, T>) -> R,
    ) -> Result<R, Invalid> {
        let address = arg.context;
        if address == 0 {
            return Err(Invalid);
        }
        // SAFETY: a non-null argument is the address of a host-built context that outlives the
        // launch (`WindowArg::from_context_address`'s contract).
        let ctx: &SymmContext = unsafe { &*(address as *const SymmContext) };
        let valid = ctx.backend == BackendTag::Native as u32
            && ctx.version == CONTEXT_VERSION
            && context_is_valid(ctx)
            && arch::launch_is_one_dimensional()
            && self.blocks as usize <= MAX_BLOCKS
            && self.block < self.blocks
            && ctx.window_size.is_multiple_of(size_of::<T>() as u64)
            && bases_aligned(ctx);
        if !valid {
            if arch::thread_idx_x() == 0 {
                // SAFETY: a host-built context (above).
                unsafe { raise_invalid_launch(address) };
            }
            return Err(Invalid);
        }
        let win = Win {
            ctx,
            brand: PhantomData,
        };
        let slot = Slot::new(ctx, self.block);
        Ok(body(self, win, slot))
    }
}

/// `true` when every rank's window base is [`BASE_ALIGNMENT`]-aligned.
#[inline(always)]
fn bases_aligned(ctx: &SymmContext) -> bool {
    (0..ctx.world_size).all(|peer| {
        // SAFETY: peer < world_size (checked by the caller's `context_is_valid` first) and
        // the table is the host's.
        unsafe { ctx.peer_base(peer) }.is_multiple_of(BASE_ALIGNMENT)
    })
}

/// An open window of elements of `T` (branded `'w`): this rank's place in it and the checked
/// handles to reach it.
pub struct Win<'w, T: Element> {
    ctx: &'w SymmContext,
    brand: PhantomData<fn(&'w ()) -> &'w T>,
}

impl<T: Element> Clone for Win<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Element> Copy for Win<'_, T> {}

impl<'w, T: Element> Win<'w, T> {
    /// This rank.
    #[inline(always)]
    pub fn rank(&self) -> u32 {
        self.ctx.rank
    }

    /// Ranks of the communicator.
    #[inline(always)]
    pub fn world(&self) -> u32 {
        self.ctx.world_size
    }

    /// Elements of `T` in the window (the same on every rank).
    #[inline(always)]
    pub fn len(&self) -> u64 {
        self.ctx.window_size / size_of::<T>() as u64
    }

    /// `true` for a window of no element.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// This rank, as a peer.
    #[inline(always)]
    pub fn me(&self) -> Peer<'w> {
        Peer {
            rank: self.ctx.rank,
            brand: PhantomData,
        }
    }

    /// Rank `rank` of the window, or `None` past the world.
    #[inline(always)]
    pub fn peer(&self, rank: u32) -> Option<Peer<'w>> {
        (rank < self.ctx.world_size).then_some(Peer {
            rank,
            brand: PhantomData,
        })
    }

    /// Elements `elements` of the window (on every rank: the window has the same size on
    /// each), or `None` when the range is reversed or leaves the window.
    #[inline(always)]
    pub fn span(&self, elements: Range<u64>) -> Option<Span<'w, T>> {
        (elements.start <= elements.end && elements.end <= self.len()).then(|| Span {
            start: elements.start,
            len: elements.end - elements.start,
            brand: PhantomData,
        })
    }

    /// Address of element `index` of `span` in `peer`'s window, or `None` past the span.
    #[inline(always)]
    fn address(&self, peer: Peer<'w>, span: Span<'w, T>, index: u64) -> Option<*mut u8> {
        if index >= span.len {
            return None;
        }
        // SAFETY: `peer.rank < world_size` (a `Peer` is made only by `me` and `peer`) and the
        // table is the host's.
        let base = unsafe { self.ctx.peer_base(peer.rank) };
        // In the window: `span.start + index < span.start + span.len <= len()`.
        Some((base + (span.start + index) * size_of::<T>() as u64) as *mut u8)
    }

    /// Element `index` of `span` in `peer`'s window.
    #[inline(always)]
    pub(super) fn read(&self, peer: Peer<'w>, span: Span<'w, T>, index: u64) -> Option<T> {
        let at = self.address(peer, span, index)?;
        // SAFETY: inside `peer`'s window (checked in `address`), aligned for `T` (every base is
        // 16-byte aligned, checked when the window was opened, and the offset is a multiple of
        // `T`'s size, which the sealed element types keep at 1, 2, 4 or 8, equal to their
        // alignment). The access is atomic; it races only with accesses the kernel's author
        // leaves unordered (docs/DEVICE_API.md, "What the types cannot carry").
        let bits = unsafe { arch::relaxed::load_bits(at, size_of::<T>()) };
        Some(T::from_bits(bits))
    }

    /// Store `value` as element `index` of `span` in `peer`'s window: `false` past the span.
    #[inline(always)]
    pub(super) fn write(&self, peer: Peer<'w>, span: Span<'w, T>, index: u64, value: T) -> bool {
        let Some(at) = self.address(peer, span, index) else {
            return false;
        };
        // SAFETY: as in `read`, valid for writes (window memory).
        unsafe { arch::relaxed::store_bits(at, size_of::<T>(), value.to_bits()) };
        true
    }
}

/// A rank of an open window (branded `'w`): made only by [`Win::me`] and [`Win::peer`], so it
/// is always below the window's world size.
pub struct Peer<'w> {
    rank: u32,
    brand: PhantomData<fn(&'w ()) -> &'w ()>,
}

impl Clone for Peer<'_> {
    fn clone(&self) -> Self {
        *self
    }
}

impl Copy for Peer<'_> {}

impl Peer<'_> {
    /// The rank.
    #[inline(always)]
    pub fn rank(&self) -> u32 {
        self.rank
    }
}

/// Elements of an open window (branded `'w`), the same on every rank: made only by
/// [`Win::span`], so it lies inside the window.
pub struct Span<'w, T: Element> {
    start: u64,
    len: u64,
    brand: PhantomData<fn(&'w ()) -> &'w T>,
}

impl<T: Element> Clone for Span<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Element> Copy for Span<'_, T> {}

impl<'w, T: Element> Span<'w, T> {
    /// Elements.
    #[inline(always)]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// `true` for a span of no element.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The span's first element, as an index of the window.
    #[inline(always)]
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Elements `elements` of this span, or `None` when the range is reversed or leaves it.
    #[inline(always)]
    pub fn sub(&self, elements: Range<u64>) -> Option<Span<'w, T>> {
        (elements.start <= elements.end && elements.end <= self.len).then(|| Span {
            start: self.start + elements.start,
            len: elements.end - elements.start,
            brand: PhantomData,
        })
    }
}
