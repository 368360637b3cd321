//! What the inputs run so far exercised (for the replay test and debugging).

use std::sync::atomic::{AtomicU64, Ordering};

/// Collectives whose results were checked against the reference.
pub static CHECKED_COLLECTIVES: AtomicU64 = AtomicU64::new(0);
/// Calls that returned the predicted error.
pub static PREDICTED_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Calls that timed out as predicted, or on a tainted communicator.
pub static TIMEOUTS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn add(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The three counters.
pub fn read() -> (u64, u64, u64) {
    (
        CHECKED_COLLECTIVES.load(Ordering::Relaxed),
        PREDICTED_ERRORS.load(Ordering::Relaxed),
        TIMEOUTS.load(Ordering::Relaxed),
    )
}
