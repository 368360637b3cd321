//! Bounded waits: every spin on a flag that another rank sets ends, at the latest, when the
//! global timer passes a deadline.

use crate::arch;

/// How a bounded wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The flag reached the target.
    Reached,
    /// The deadline passed first.
    TimedOut,
    /// Another thread of this rank raised the abort word meanwhile.
    Aborted,
}

/// Polls of a flag between two looks at the timer (and a sleep). Under loom every poll
/// yields, so that loom's scheduler runs the other threads.
pub(crate) const POLLS_PER_CHECK: u32 = if cfg!(loom) { 1 } else { 64 };

/// Polls of a flag between two looks at the abort word. The abort word lives in pinned host
/// memory: on a GPU each look is a read across PCIe, and thousands of waiting threads looking
/// every 64 polls made the LL all-reduce 10-40x slower on an H200 (bench/RESULTS.md). A wait
/// looks every 8192 polls: an abort is noticed a few milliseconds later instead (polls past
/// the 4096th sleep 20 us every 64), far within any timeout; a timeout still ends the wait on
/// time (the timer is read every [`POLLS_PER_CHECK`] polls).
pub(crate) const POLLS_PER_ABORT_LOOK: u32 = if cfg!(loom) { 1 } else { 128 * POLLS_PER_CHECK };
const _: () = assert!(POLLS_PER_ABORT_LOOK.is_multiple_of(POLLS_PER_CHECK));

/// Polls after which a wait gives the CPU away for longer: on the GPU a 20 µs sleep, on the
/// host a block until the flag or the abort word is stored to (`arch::host::park_u32`).
pub const PARK_AFTER_POLLS: u32 = 4096;

/// [`PARK_AFTER_POLLS`] on the host when a communicator of the process has more ranks than the
/// machine has cores (`arch::host::park_sooner`): four yields. A rank that keeps polling then
/// holds a core the rank it waits for needs: a broadcast of 1 KiB among 4 processes on 2
/// cores, each call after a barrier, ran at 0.77-0.97 of gloo's speed parking after 4096
/// polls, at 0.98-1.07 after 256 (bench/RESULTS.md). With a core per rank, early parking
/// costs calls back to back a wake-up each (6-12 µs became 20-48 µs for 2 processes).
pub const PARK_AFTER_POLLS_OVERSUBSCRIBED: u32 = 256;

/// `true` when `value` is at or past `target` in wrap-around (serial number) order.
#[inline(always)]
pub fn reached(value: u32, target: u32) -> bool {
    value.wrapping_sub(target) as i32 >= 0
}

/// Spin until the `u32` at `flag` reaches `target` (wrap-safe), the abort word at `abort`
/// becomes non-zero, or `timeout_ns` pass. After 4096 polls (fewer on an oversubscribed host) the wait parks
/// between looks: a 20 µs sleep on the GPU; on the host, a block until a store to the flag or
/// the abort word wakes it (`arch::host::park_u32`), so that waiting ranks leave the CPU to
/// the ones they wait for.
///
/// # Safety
/// `flag` and `abort` must be valid, aligned addresses of `u32`s that other threads only
/// access atomically.
pub unsafe fn wait_until_reached(
    flag: *const u32,
    target: u32,
    abort: *const u32,
    timeout_ns: u64,
) -> WaitOutcome {
    let start = arch::global_timer_ns();
    let mut polls: u32 = 0;
    loop {
        // SAFETY: the caller guarantees `flag` is valid and atomically accessed.
        if reached(unsafe { arch::load_acquire_sys_u32(flag) }, target) {
            return WaitOutcome::Reached;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(POLLS_PER_CHECK) {
            if polls.is_multiple_of(POLLS_PER_ABORT_LOOK)
                // SAFETY: as for `flag`.
                && unsafe { arch::load_acquire_sys_u32(abort) } != 0
            {
                return WaitOutcome::Aborted;
            }
            if arch::global_timer_ns().wrapping_sub(start) > timeout_ns {
                return WaitOutcome::TimedOut;
            }
            // SAFETY: as for `flag` and `abort`.
            unsafe { pause(flag, target, abort, polls) };
        }
    }
}

/// Give the CPU away between two looks at the flag: a short sleep, and a 20 µs one once the
/// wait has lasted [`PARK_AFTER_POLLS`] polls (the GPU, and loom, whose scheduler a sleep
/// yields to).
///
/// # Safety
/// As for [`wait_until_reached`].
#[cfg(any(target_arch = "nvptx64", loom))]
#[inline(always)]
unsafe fn pause(_flag: *const u32, _target: u32, _abort: *const u32, polls: u32) {
    arch::nanosleep(if polls >= PARK_AFTER_POLLS {
        20_000
    } else {
        100
    });
}

/// Give the CPU away between two looks at the flag: a yield, and once the wait has lasted
/// [`PARK_AFTER_POLLS`] polls (fewer once `arch::host::park_sooner` asked it), a park until a store to the flag or to the abort word wakes the
/// thread (`arch::host::park_u32`).
///
/// # Safety
/// As for [`wait_until_reached`].
#[cfg(not(any(target_arch = "nvptx64", loom)))]
#[inline(always)]
unsafe fn pause(flag: *const u32, target: u32, abort: *const u32, polls: u32) {
    if polls >= PARK_AFTER_POLLS.min(arch::host::polls_before_park()) {
        // SAFETY: forwarded contract.
        let seen = unsafe { arch::load_relaxed_sys_u32(flag) };
        if !reached(seen, target) {
            // SAFETY: forwarded contract; a store after the load above makes the park return
            // at once (the futex compares the word with `seen`).
            unsafe { arch::host::park_u32(flag, seen, abort) };
        }
    } else {
        arch::nanosleep(100);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn serial_number_order() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(0, u32::MAX));
        assert!(reached(3, u32::MAX - 2));
        assert!(!reached(u32::MAX, 0));
    }

    #[test]
    fn times_out_on_a_flag_nobody_sets() {
        let flag = 0u32;
        let abort = 0u32;
        let start = std::time::Instant::now();
        // SAFETY: both are live locals, accessed only here.
        let outcome = unsafe { wait_until_reached(&flag, 1, &abort, 5_000_000) };
        assert_eq!(outcome, WaitOutcome::TimedOut);
        assert!(start.elapsed() >= std::time::Duration::from_millis(5));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }

    #[test]
    fn sees_abort() {
        let flag = 0u32;
        let abort = 1u32;
        // SAFETY: both are live locals, accessed only here.
        let outcome = unsafe { wait_until_reached(&flag, 1, &abort, u64::MAX) };
        assert_eq!(outcome, WaitOutcome::Aborted);
    }
}
