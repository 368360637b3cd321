//! The process environment the library reads when it creates a communicator, the timeouts of
//! the communicators, and the limits on what one input may do.

use std::time::Duration;

/// `SYMM_TIMEOUT_MS` of the patient communicators (see `Clique`): `SYMM_FUZZ_TIMEOUT_MS`
/// when set, else 5000 (well-formed collectives must finish within it even on a loaded
/// machine).
pub fn timeout_ms() -> u64 {
    static TIMEOUT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        std::env::var("SYMM_FUZZ_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .filter(|ms| *ms > 0)
            .unwrap_or(5000)
    })
}

/// `SYMM_TIMEOUT_MS` of the other communicators, where the calls that time out are made.
pub const FAST_TIMEOUT_MS: u64 = 50;

/// Set the bound of the communicators created next. Only the fuzzing thread creates
/// communicators and changes the variable.
pub(crate) fn use_timeout(ms: u64) {
    // SAFETY: the library reads its variables through `std::env`, which synchronizes with
    // `set_var`; no other thread of this process reads the environment through libc while
    // inputs run (the library's bootstrap threads make no such calls).
    unsafe { std::env::set_var("SYMM_TIMEOUT_MS", ms.to_string()) };
}

/// Calls per input that may wait for the timeout (each costs [`timeout_ms`]).
pub(crate) const BLOCKING_BUDGET: u32 = 2;

/// Most live communicators (ranks) at once.
pub(crate) const MAX_LIVE_RANKS: usize = 8;

/// Most allocations per rank.
pub(crate) const MAX_ALLOCATIONS: usize = 4;

/// Most operations run per input.
pub(crate) const MAX_OPS: usize = 64;

/// Longest any call may take: a wait is bounded by the timeout; a group may wait once per
/// queued item, and the machine may be busy.
pub(crate) fn call_bound() -> Duration {
    Duration::from_millis(timeout_ms() * 4)
}

/// Set the environment the library reads when it creates a communicator (once per process).
pub fn configure_environment() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before the first communicator exists; the library reads these
        // variables only while creating communicators, which happens after this returns.
        unsafe {
            std::env::set_var("SYMM_BACKEND", "host");
            std::env::set_var("SYMM_BOOTSTRAP_TIMEOUT_MS", "5000");
            // Strict windows: the inputs pass made-up and stale pointers, which a call
            // outside the windows would stage (copy from) instead of refusing; staging itself
            // is tested in tests/tests/staging.rs.
            std::env::set_var("SYMM_STRICT_WINDOWS", "1");
            std::env::remove_var("SYMM_ALGO");
            std::env::remove_var("SYMM_COMM_ID");
        }
    });
}

/// Threads of this process.
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}
