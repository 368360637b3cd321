//! Low-latency (LL) lines: 8 data bytes travel with their flag, so a reader needs no barrier —
//! it waits for the line itself (bounded, like every wait on a peer).

use crate::arch;
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
