//! Low-latency (LL) lines: 8 data bytes travel with their flag, so a reader needs no barrier —
//! it waits for the line itself (bounded, like every wait on a peer).

use super::abort::{abort_timed_out_waiting_for, raise_timeout};
use super::grid::{Grid, block_range};
use crate::arch;
use crate::context::SymmContext;
use crate::sync::barrier::{Aborted, CrossRankBarrier, block_sees_abort, mark_out_of_step};
use crate::sync::signal_pad::{
    MAX_BLOCKS, ll_clears_other_parity, ll_count_slot, ll_flag, ll_line, ll_parity_lines,
};
use crate::sync::wait::{POLLS_PER_ABORT_LOOK, POLLS_PER_CHECK, WaitOutcome};

/// Write `data` with `flag` into the line at `line`.
///
/// # Safety
/// `line` is a valid, 16-byte aligned LL line that readers access only through [`wait_line`].
#[inline(always)]
pub unsafe fn put_line(line: *mut [u32; 4], data: u64, flag: u32) {
    // SAFETY: forwarded contract.
    unsafe { arch::store_line(line, [data as u32, flag, (data >> 32) as u32, flag]) }
}

/// Wait until the line at `line` carries `flag` in both halves and return its data; gives up
/// when this rank's abort word is raised or `timeout_ns` pass.
///
/// # Safety
/// `line` is a valid, 16-byte aligned LL line; `abort` a valid `u32` accessed atomically.
#[inline(always)]
pub unsafe fn wait_line(
    line: *const [u32; 4],
    flag: u32,
    abort: *const u32,
    timeout_ns: u64,
) -> Result<u64, WaitOutcome> {
    let mut start = None;
    let mut polls: u32 = 0;
    loop {
        // SAFETY: forwarded contract.
        let [lo, f1, hi, f2] = unsafe { arch::load_line(line) };
        if f1 == flag && f2 == flag {
            return Ok(lo as u64 | (hi as u64) << 32);
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(POLLS_PER_CHECK) {
            let begun = *start.get_or_insert_with(arch::global_timer_ns);
            if polls.is_multiple_of(POLLS_PER_ABORT_LOOK)
                // SAFETY: forwarded contract.
                && unsafe { arch::load_acquire_sys_u32(abort) } != 0
            {
                return Err(WaitOutcome::Aborted);
            }
            if arch::global_timer_ns().wrapping_sub(begun) > timeout_ns {
                return Err(WaitOutcome::TimedOut);
            }
            arch::nanosleep(if polls >= 4096 { 20_000 } else { 100 });
        }
    }
}

/// [`wait_line`]; on a timeout, raise the abort word naming `source`.
///
/// # Safety
/// As for [`wait_line`].
#[inline(always)]
unsafe fn wait_line_or_abort(
    line: *const [u32; 4],
    flag: u32,
    abort: *mut u32,
    timeout_ns: u64,
    source: u32,
) -> Result<u64, Aborted> {
    // SAFETY: forwarded contract.
    unsafe {
        wait_line(line, flag, abort, timeout_ns).map_err(|outcome| {
            if outcome == WaitOutcome::TimedOut {
                raise_timeout(abort, abort_timed_out_waiting_for(source));
            }
            Aborted
        })
    }
}

/// What `wait_line_out_of_line` returns when its wait gave up. A line may carry these bits
/// as data too: the caller then looks at the line again (see `LlCall::take_out_of_line`).
/// Public for the tests that send it as data.
pub const GAVE_UP: u64 = 0x7ff4_dead_7ff4_dead;

/// [`wait_line_or_abort`], never inlined, returning 8 bytes (a wider return value is a
/// struct in PTX): the line's data, or [`GAVE_UP`] when the wait gave up (which always leaves
/// the abort word raised: it was raised already, or the timeout raised it).
///
/// # Safety
/// As for [`wait_line`].
#[inline(never)]
unsafe fn wait_line_out_of_line(
    line: *const [u32; 4],
    flag: u32,
    abort: *mut u32,
    timeout_ns: u64,
    source: u32,
) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { wait_line_or_abort(line, flag, abort, timeout_ns, source) }.unwrap_or(GAVE_UP)
}

/// Sources whose lines `LlCall::take_round` loads together (the `unroll!` lists there and in
/// the LL kernels have this many indices): 4 independent 16-byte loads in flight per thread
/// (NCCL's LL receive polls the peers' lines of a step together). 8 took the LL kernels past
/// 128 registers, the most a 512-thread block may use.
pub const LL_ROUND: usize = 4;

/// One block's part of one LL call: the window's LL call number (hence flag and buffer
/// parity), read at the start and advanced at the end.
pub struct LlCall<'a> {
    ctx: &'a SymmContext,
    own_pad: u64,
    grid: Grid,
    calls: u64,
    flag: u32,
    parity: u32,
}

impl<'a> LlCall<'a> {
    /// Start block `grid.block`'s part of the next LL call on `ctx`. Every thread of the block
    /// calls it. At the end of each period of flags (once in 2^32 calls of a parity) the call
    /// first clears this rank's line buffers of the other parity and passes a cross-rank
    /// barrier, so that no line left from an earlier period can carry a flag of the next one;
    /// `Err` when that barrier was abandoned.
    ///
    /// # Safety
    /// `ctx` is host-built, with pads sized by `signal_pad_bytes(world_size)`; `grid.block <
    /// grid.blocks <= MAX_BLOCKS`; every rank makes the same sequence of LL calls on the window
    /// with the same grid, each after its previous one completed (stream order).
    #[inline(always)]
    pub unsafe fn begin(ctx: &'a SymmContext, grid: Grid) -> Result<Self, Aborted> {
        // SAFETY: rank < world_size (caller's contract).
        let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
        // SAFETY: the slot lies in this rank's pad; it is written only in `end`, after every
        // thread of the block read it, and by the previous LL call on the window.
        let calls = unsafe { arch::load_plain_u64(ll_count_slot(own_pad, grid.block)) };
        if ll_clears_other_parity(calls) && !arch::mutated!(LlSkipPeriodClear) {
            // The period clear passes a cross-rank barrier, whose arrivals barrier kernels
            // consume too. Once in 2^32 calls, so it looks at the abort word before
            // announcing (the barrier kernels look only while they wait, see
            // `sync::barrier`): a call that starts on an aborted window announces nothing,
            // and, being a barrier behind its peers now, marks the window out of step so that
            // no later kernel announces either. The LL frame does not look at the abort word
            // otherwise (see `symmetric::low_latency::LlLines::open`).
            // SAFETY: the context is host-built (caller's contract); the whole block takes
            // this branch.
            if unsafe { block_sees_abort(ctx) } {
                // SAFETY: the pad is this rank's (caller's contract).
                unsafe { mark_out_of_step(own_pad) };
                return Err(Aborted);
            }
            // SAFETY: forwarded contract.
            unsafe { clear_parity(ctx, own_pad, grid, (calls & 1) as u32 ^ 1) }?;
        }
        Ok(LlCall {
            ctx,
            own_pad,
            grid,
            calls,
            flag: ll_flag(calls),
            parity: (calls & 1) as u32,
        })
    }

    /// The flag of this call (tests and diagnostics).
    pub fn flag(&self) -> u32 {
        self.flag
    }

    /// Write `data` as line `line` from this rank into `peer`'s buffer.
    ///
    /// # Safety
    /// `peer < world_size` and `line < LL_LINES`.
    #[inline(always)]
    pub unsafe fn put(&self, peer: u32, line: u64, data: u64) {
        // SAFETY: forwarded contract; the line lies in the peer's pad.
        unsafe {
            let pad = self.ctx.peer_signal_pad(peer);
            put_line(
                ll_line(pad, self.ctx.world_size, self.parity, self.ctx.rank, line),
                data,
                self.flag,
            );
        }
    }

    /// Wait for line `line` from `source` in this rank's buffer. `Err` when the wait was
    /// abandoned (on a timeout the abort word is raised).
    ///
    /// # Safety
    /// `source < world_size` and `line < LL_LINES`.
    #[inline(always)]
    pub unsafe fn take(&self, source: u32, line: u64) -> Result<u64, Aborted> {
        let at = ll_line(self.own_pad, self.ctx.world_size, self.parity, source, line);
        let abort = self.ctx.abort_flag as *mut u32;
        // SAFETY: the line lies in this rank's pad; the abort word is the context's.
        unsafe { wait_line_or_abort(at, self.flag, abort, self.ctx.timeout_ns, source) }
    }

    /// Take line `line` from every source, [`LL_ROUND`] sources at a time
    /// (`LlCall::take_round`), and call `each(source, data)` for each in rank order. `Err`
    /// when a wait was abandoned (`each` then saw only the sources before it).
    ///
    /// # Safety
    /// `line < LL_LINES`.
    #[inline(always)]
    pub unsafe fn take_every_source(
        &self,
        line: u64,
        mut each: impl FnMut(u32, u64),
    ) -> Result<(), Aborted> {
        let mut first_source = 0;
        while first_source < self.ctx.world_size {
            // SAFETY: first_source < world_size; forwarded contract.
            let round = unsafe { self.take_round(first_source, line) }?;
            // The list has LL_ROUND indices (a shorter one would skip sources).
            const _: () = assert!(LL_ROUND == 4);
            unroll!(i in [0 1 2 3] => {
                let source = first_source + i as u32;
                if source < self.ctx.world_size {
                    each(source, round[i]);
                }
            });
            first_source += LL_ROUND as u32;
        }
        Ok(())
    }

    /// [`LlCall::take`] through one out-of-line function (scalar arguments, so that nothing of
    /// the call goes to local memory): the slow path of [`LlCall::take_round`], called from
    /// each of its unrolled sources.
    ///
    /// # Safety
    /// As for [`LlCall::take`].
    #[inline(always)]
    unsafe fn take_out_of_line(&self, source: u32, line: u64) -> Result<u64, Aborted> {
        let at = ll_line(self.own_pad, self.ctx.world_size, self.parity, source, line);
        let abort = self.ctx.abort_flag as *mut u32;
        // SAFETY: as in `take`.
        let data =
            unsafe { wait_line_out_of_line(at, self.flag, abort, self.ctx.timeout_ns, source) };
        if data != GAVE_UP {
            return Ok(data);
        }
        // Either the line's data is GAVE_UP's bits or the wait gave up. The line is in this
        // rank's own pad (device memory: a cheap look, where the abort word is a read across
        // PCIe). Once it carries this call's flag it keeps it until this rank's call ends (the
        // source writes this line again only in its call after next, which needs a line of this
        // rank's next call), so a line that carries the flag now with these bits is the data.
        // Such a line that arrived just after this thread's wait timed out is taken too: the
        // data is this call's, and the abort word is raised already, so the host reports the
        // timeout whatever the kernel's status says. A line without the flag: given up.
        // SAFETY: as in `take`; LL lines are read only through `load_line`.
        let [lo, f1, hi, f2] = unsafe { arch::load_line(at) };
        if f1 == self.flag && f2 == self.flag && (lo as u64 | (hi as u64) << 32) == GAVE_UP {
            Ok(GAVE_UP)
        } else {
            Err(Aborted)
        }
    }

    /// Take line `line` from up to [`LL_ROUND`] sources at once, `first_source` and the ones
    /// after it (those past the world are left 0): every line is loaded once, back to back, so
    /// the loads are in flight together; only a line that has not arrived yet is then waited
    /// for (bounded, as [`LlCall::take`]). `Err` when a wait was abandoned.
    ///
    /// # Safety
    /// `first_source < world_size` and `line < LL_LINES`.
    #[inline(always)]
    unsafe fn take_round(&self, first_source: u32, line: u64) -> Result<[u64; LL_ROUND], Aborted> {
        let sources = Ord::min(self.ctx.world_size - first_source, LL_ROUND as u32);
        // The lists below have LL_ROUND indices (a shorter one would skip sources).
        const _: () = assert!(LL_ROUND == 4);
        let mut loaded = [[0u32; 4]; LL_ROUND];
        unroll!(i in [0 1 2 3] => {
            if (i as u32) < sources {
                let source = first_source + i as u32;
                let at = ll_line(self.own_pad, self.ctx.world_size, self.parity, source, line);
                // SAFETY: source < world_size, line < LL_LINES: inside this rank's pad; LL
                // lines are read only through `load_line`.
                loaded[i] = unsafe { arch::load_line(at) };
            }
        });
        let mut data = [0u64; LL_ROUND];
        unroll!(i in [0 1 2 3] => {
            if (i as u32) < sources {
                let [lo, f1, hi, f2] = loaded[i];
                data[i] = if f1 == self.flag && f2 == self.flag {
                    lo as u64 | (hi as u64) << 32
                } else {
                    // SAFETY: forwarded contract.
                    unsafe { self.take_out_of_line(first_source + i as u32, line) }?
                };
            }
        });
        Ok(data)
    }

    /// End the block's part: agree on the outcome across the block and advance the window's
    /// call number in this block index's copy and in the copies of the block indices this
    /// launch does not have (`j ≡ block (mod blocks)`), so that every copy holds the same
    /// number whatever grid the next call has. The closing block barrier makes the new number
    /// visible to every thread of the block before any later LL call in the same kernel.
    #[inline(always)]
    pub fn end(self, failed: bool) -> Result<(), Aborted> {
        let failed = arch::sync_threads_or(failed);
        let next = self.calls.wrapping_add(1);
        let mut copy =
            self.grid.block as u64 + arch::thread_idx_x() as u64 * self.grid.blocks as u64;
        while copy < MAX_BLOCKS as u64 {
            // SAFETY: copy < MAX_BLOCKS: the slot lies in this rank's pad. Within this launch
            // only this block writes it (copy ≡ block mod blocks), and every thread of the
            // block read its own copy before the barrier above.
            unsafe { arch::store_plain_u64(ll_count_slot(self.own_pad, copy as u32), next) };
            copy += arch::block_dim_x() as u64 * self.grid.blocks as u64;
        }
        if !arch::mutated!(LlEndWithoutClosingBarrier) {
            arch::sync_threads();
        }
        if failed { Err(Aborted) } else { Ok(()) }
    }
}

/// Clear this block's share of this rank's line buffers of `parity` (every source), then pass
/// a cross-rank barrier: after it, every rank's buffers of that parity are clear, and no peer
/// can write a line of the next call of that parity before it (it must first complete this
/// call, whose barrier needs this rank's block).
///
/// # Safety
/// As for [`LlCall::begin`]; no peer writes lines of `parity` into this rank's pad until this
/// rank's current LL call has written its lines (the double-buffering argument).
#[inline(never)]
unsafe fn clear_parity(
    ctx: &SymmContext,
    own_pad: u64,
    grid: Grid,
    parity: u32,
) -> Result<(), Aborted> {
    let (lines, total) = ll_parity_lines(own_pad, ctx.world_size, parity);
    let (lo, hi) = block_range(total, grid.block, grid.blocks);
    let mut line = lo + arch::thread_idx_x() as u64;
    while line < hi {
        // SAFETY: line < total: inside this rank's buffers of that parity.
        unsafe { arch::store_line(lines.add(line as usize), [0; 4]) };
        line += arch::block_dim_x() as u64;
    }
    // SAFETY: forwarded contract; grid.block < MAX_BLOCKS.
    let barrier = unsafe { CrossRankBarrier::open(ctx, grid.block) }.start()?;
    barrier.finish();
    Ok(())
}
