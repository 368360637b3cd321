//! The frame shared by the low-latency (LL) kernels: open a call for a batch's lines (8 data
//! bytes each; a task's lines start at its first cell), push this block's lines of each task
//! into every rank, and close the call. What each kernel does with the lines it takes differs
//! (reduce, or copy).

use super::{Grid, KernelStatus, block_range};
use crate::arch;
use crate::context::SymmContext;
use crate::numeric::element::Element;
use crate::sync::ll::LlCall;
use crate::sync::signal_pad::LL_LINES;

/// This block's part of an LL call: the batch's lines `[lo, hi)`.
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
    /// Open this block's part of an LL call over `lines` lines (a batch's); `Err` with the
    /// kernel's status when they exceed the LL buffers (nothing touched), or when the period
    /// clear's barrier was abandoned. Every thread of the block calls it.
    ///
    /// It does not look at the abort word, which may live in host memory (a round trip across
    /// PCIe, on the critical path of every LL call). An LL kernel that starts on a window
    /// already aborted is harmless: it stores only into the LL line buffers of the ranks'
    /// signal pads (device memory that outlives every kernel that writes into it: a pad is
    /// freed with the last window referencing it, and a peer process's pad stays mapped here
    /// until this rank's own teardown, which waits for this rank's kernels), its own receive
    /// buffer and its own call counters — never into a peer's user memory, unlike the barrier
    /// kernels, which look at the word during their start barrier, before their body (see
    /// `sync::barrier`). Its waits look at the abort word every
    /// `POLLS_PER_ABORT_LOOK` polls and give up on it. The one cross-rank barrier an LL call
    /// may pass (the period clear, once in 2^32 calls) looks first (`LlCall::begin`). Lines a
    /// late call stores may overwrite a peer's unread lines of an earlier call of the same
    /// parity: that peer's wait then gives up (the flags differ), never takes them.
    ///
    /// # Safety
    /// `ctx` is host-built, with pads sized by `signal_pad_bytes(world_size)`; `grid` comes
    /// from `for_virtual_rank`.
    #[inline(always)]
    pub(crate) unsafe fn open(
        ctx: &'a SymmContext,
        grid: Grid,
        lines: u64,
    ) -> Result<Self, KernelStatus> {
        if lines > LL_LINES as u64 {
            return Err(KernelStatus::InvalidLaunch);
        }
        // A call without lines is not an LL call: it must not take a call number, because the
        // double-buffering argument needs every peer to read at least one line of each call
        // (see `sync::ll`). Uniform: every thread, block and rank sees the same count.
        if lines == 0 {
            return Err(KernelStatus::Completed);
        }
        // SAFETY: forwarded contract; grid.block < grid.blocks <= MAX_BLOCKS
        // (for_virtual_rank).
        let call = unsafe { LlCall::begin(ctx, grid) }.map_err(|_| KernelStatus::Aborted)?;
        let (lo, hi) = block_range(lines, grid.block, grid.blocks);
        Ok(LlLines { call, lo, hi })
    }

    /// Pack the lines holding elements `[first, end)` of a task's `count` elements at `send`
    /// (8 bytes a line, the last one zero-padded; `first` starts a line) and put each into
    /// every rank's line buffer, the task's line `l` as the call's line `first_line + l`.
    ///
    /// # Safety
    /// `send` holds `count` elements; `ctx` is the context the call was opened on; the lines
    /// `first_line + [first / per_line, ⌈end / per_line⌉)` lie inside the call's lines.
    #[inline(always)]
    pub(crate) unsafe fn push<T: Element>(
        &self,
        ctx: &SymmContext,
        send: *const T,
        count: u64,
        first: u64,
        end: u64,
        first_line: u64,
    ) {
        let size = core::mem::size_of::<T>() as u64;
        let per_line = per_line::<T>();
        let end_line = end.div_ceil(Ord::max(per_line, 1));
        let mut line = first / Ord::max(per_line, 1) + arch::thread_idx_x() as u64;
        while line < end_line {
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
                // SAFETY: peer < world; the line lies inside the call's lines (<= LL_LINES).
                unsafe { self.call.put(peer, first_line + line, data) };
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
