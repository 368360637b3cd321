//! Settings read from the environment when a communicator is created.

use crate::error::{Error, Result};
use std::time::Duration;

/// Default bound of every wait on a peer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(10_000);

/// `SYMM_TIMEOUT_MS`: bound of every wait on another rank (kernels and host rendezvous).
pub fn timeout() -> Result<Duration> {
    match std::env::var("SYMM_TIMEOUT_MS") {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(Error::invalid_argument(format!(
                "SYMM_TIMEOUT_MS={text:?} is not a positive number of milliseconds"
            ))),
        },
    }
}
