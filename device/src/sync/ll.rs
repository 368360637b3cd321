//! Low-latency (LL) lines: 8 data bytes travel with their flag, so a reader needs no barrier —
//! it waits for the line itself (bounded, like every wait on a peer).

use crate::arch;
use crate::context::SymmContext;
use crate::sync::barrier::Aborted;
use crate::sync::signal_pad::{ll_count_slot, ll_flag, ll_line};
use crate::sync::wait::WaitOutcome;

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
        if polls.is_multiple_of(64) {
            let begun = *start.get_or_insert_with(arch::global_timer_ns);
            // SAFETY: forwarded contract.
            if unsafe { arch::load_acquire_sys_u32(abort) } != 0 {
                return Err(WaitOutcome::Aborted);
            }
            if arch::global_timer_ns().wrapping_sub(begun) > timeout_ns {
                return Err(WaitOutcome::TimedOut);
            }
            arch::nanosleep(if polls >= 4096 { 20_000 } else { 100 });
        }
    }
}

/// One block's part of one LL call: its call count (hence flag and buffer parity), read at the
/// start and advanced at the end.
pub struct LlCall<'a> {
    ctx: &'a SymmContext,
    own_pad: u64,
    count_slot: *mut u64,
    calls: u64,
    flag: u32,
    parity: u32,
}

impl<'a> LlCall<'a> {
    /// Start block `block`'s part of the next LL call on `ctx`. Every thread of the block calls
    /// it.
    ///
    /// # Safety
    /// `ctx` is host-built, with pads sized by `signal_pad_bytes(world_size)`; `block <
    /// MAX_BLOCKS`.
    #[inline(always)]
    pub unsafe fn begin(ctx: &'a SymmContext, block: u32) -> Self {
        // SAFETY: rank < world_size (caller's contract).
        let own_pad = unsafe { ctx.peer_signal_pad(ctx.rank) };
        let count_slot = ll_count_slot(own_pad, block);
        // SAFETY: the slot lies in this rank's pad; only this block writes it, in `end`, after
        // every thread read it.
        let calls = unsafe { core::ptr::read_volatile(count_slot) };
        LlCall {
            ctx,
            own_pad,
            count_slot,
            calls,
            flag: ll_flag(calls),
            parity: (calls & 1) as u32,
        }
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
        unsafe {
            wait_line(at, self.flag, abort, self.ctx.timeout_ns).map_err(|outcome| {
                if outcome == WaitOutcome::TimedOut {
                    arch::store_release_sys_u32(abort, 1);
                }
                Aborted
            })
        }
    }

    /// End the block's part: agree on the outcome across the block and advance the count.
    #[inline(always)]
    pub fn end(self, failed: bool) -> Result<(), Aborted> {
        let failed = arch::sync_threads_or(failed);
        if arch::thread_idx_x() == 0 {
            // SAFETY: the slot lies in this rank's pad; every thread read it before the
            // barrier above.
            unsafe { core::ptr::write_volatile(self.count_slot, self.calls.wrapping_add(1)) };
        }
        if failed { Err(Aborted) } else { Ok(()) }
    }
}
