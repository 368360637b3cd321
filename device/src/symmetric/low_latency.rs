//! The frame shared by the low-latency (LL) kernels: open a call for a payload of `count`
//! elements (lines of 8 data bytes), push this block's lines into every rank, and close the
//! call. What each kernel does with the lines it takes differs (reduce, or copy).

use super::{Grid, KernelStatus, block_range};
use crate::arch;
use crate::context::SymmContext;
use crate::numeric::element::Element;
use crate::sync::barrier::block_sees_abort;
use crate::sync::ll::LlCall;
use crate::sync::signal_pad::LL_LINES;

/// This block's part of an LL call over `count` elements of `T`: lines `[lo, hi)`.
pub(crate) struct LlLines<'a> {
    /// The call (flag, buffer parity, call counter).
    pub call: LlCall<'a>,
    /// First line of this block.
    pub lo: u64,
    /// End of this block's lines.
    pub hi: u64,
}

/// Elements of `T` per 8-byte line.
#[inline(always)]
pub(crate) const fn per_line<T>() -> u64 {
    8 / core::mem::size_of::<T>() as u64
}

impl<'a> LlLines<'a> {
    /// Open this block's part of an LL call for `count` elements of `T`; `Err` with the
    /// kernel's status when the payload exceeds the LL buffers (nothing touched) or the window
    /// is already aborted. Every thread of the block calls it.
    ///
    /// # Safety
    /// `ctx` is host-built, with pads sized by `signal_pad_bytes(world_size)`; `grid` comes
    /// from `for_virtual_rank`.
    #[inline(always)]
    pub(crate) unsafe fn open<T>(
        ctx: &'a SymmContext,
        grid: Grid,
        count: u64,
    ) -> Result<Self, KernelStatus> {
        let lines = count.div_ceil(per_line::<T>());
        if lines > LL_LINES as u64 {
            return Err(KernelStatus::InvalidLaunch);
        }
        // A call without lines is not an LL call: it must not take a call number, because the
        // double-buffering argument needs every peer to read at least one line of each call
        // (see `sync::ll`). Uniform: every thread, block and rank sees the same count.
        if lines == 0 {
            return Err(KernelStatus::Completed);
        }
        // SAFETY: the context is valid (caller's contract); the whole block takes this branch.
        if unsafe { block_sees_abort(ctx) } {
            return Err(KernelStatus::Aborted);
        }
        // SAFETY: forwarded contract; grid.block < grid.blocks <= MAX_BLOCKS
        // (for_virtual_rank).
        let call = unsafe { LlCall::begin(ctx, grid) }.map_err(|_| KernelStatus::Aborted)?;
        let (lo, hi) = block_range(lines, grid.block, grid.blocks);
        Ok(LlLines { call, lo, hi })
    }

    /// Pack this block's lines of the `count` elements at `send` (8 bytes a line, the last one
    /// zero-padded) and put each into every rank's line buffer.
    ///
    /// # Safety
    /// `send` holds `count` elements; `ctx` is the context the call was opened on.
    #[inline(always)]
    pub(crate) unsafe fn push<T: Element>(&self, ctx: &SymmContext, send: *const T, count: u64) {
        let size = core::mem::size_of::<T>() as u64;
        let per_line = per_line::<T>();
        let mut line = self.lo + arch::thread_idx_x() as u64;
        while line < self.hi {
            let mut data = 0u64;
            for e in 0..per_line {
                let index = line * per_line + e;
                if index < count {
                    // SAFETY: index < count: inside the send buffer.
                    let value = unsafe { send.add(index as usize).read() };
                    data |= value.to_bits() << (e * size * 8);
                }
            }
            for peer in 0..ctx.world_size {
                // SAFETY: peer < world, line < lines <= LL_LINES.
                unsafe { self.call.put(peer, line, data) };
            }
            line += arch::block_dim_x() as u64;
        }
    }

    /// Close the call; `failed` when a take timed out.
    #[inline(always)]
    pub(crate) fn close(self, failed: bool) -> KernelStatus {
        match self.call.end(failed) {
            Ok(()) => KernelStatus::Completed,
            Err(_) => KernelStatus::Aborted,
        }
    }
}
