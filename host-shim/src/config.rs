//! Settings read from the environment when a communicator is created.

use crate::error::{Error, Result};
use std::time::Duration;
use symm_device::symmetric::Algorithm;

/// Default bound of every wait on a peer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(10_000);

/// `SYMM_ALGO`: an algorithm forced for every call: all-reduce `ll`, `oneshot`, `twoshot`, or
/// `pat` for all-gather and reduce-scatter (each value ignored by the other collectives); `auto`
/// or unset: the cost model picks.
pub fn forced_algorithm() -> Result<Option<Algorithm>> {
    parse_forced_algorithm(std::env::var("SYMM_ALGO").ok().as_deref())
}

/// Parse `SYMM_ALGO` (`None`: unset, `auto` or empty).
pub fn parse_forced_algorithm(value: Option<&str>) -> Result<Option<Algorithm>> {
    match value.map(str::trim) {
        None | Some("") | Some("auto") => Ok(None),
        Some("ll") | Some("oneshot_ll") => Ok(Some(Algorithm::OneShotLlAllReduce)),
        Some("oneshot") | Some("one_shot") => Ok(Some(Algorithm::OneShotAllReduce)),
        Some("twoshot") | Some("two_shot") => Ok(Some(Algorithm::TwoShotAllReduce)),
        Some("pat") => Ok(Some(Algorithm::PatAllGather)),
        Some(other) => Err(Error::invalid_argument(format!(
            "SYMM_ALGO={other:?}: expected ll, oneshot, twoshot, pat or auto"
        ))),
    }
}

/// `SYMM_TIMEOUT_MS`: bound of every wait on another rank (kernels and host rendezvous).
pub fn timeout() -> Result<Duration> {
    parse_timeout(std::env::var("SYMM_TIMEOUT_MS").ok().as_deref())
}

/// `SYMM_BOOTSTRAP_TIMEOUT_MS`: how long `symmCommInitRank` waits for every rank to join
/// (processes a launcher starts may come up seconds apart); unset: [`timeout`].
pub fn bootstrap_timeout() -> Result<Duration> {
    match std::env::var("SYMM_BOOTSTRAP_TIMEOUT_MS") {
        Ok(text) => parse_timeout(Some(&text)).map_err(|_| {
            Error::invalid_argument(format!(
                "SYMM_BOOTSTRAP_TIMEOUT_MS={text:?} is not a positive number of milliseconds"
            ))
        }),
        Err(_) => timeout(),
    }
}

/// Parse a `SYMM_TIMEOUT_MS` value (`None`: unset).
pub fn parse_timeout(value: Option<&str>) -> Result<Duration> {
    match value {
        None => Ok(DEFAULT_TIMEOUT),
        Some(text) => match text.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(Error::invalid_argument(format!(
                "SYMM_TIMEOUT_MS={text:?} is not a positive number of milliseconds"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::symmResult_t;

    #[test]
    fn timeout_values() {
        assert_eq!(parse_timeout(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            parse_timeout(Some("250")).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_timeout(Some(" 7 ")).unwrap(),
            Duration::from_millis(7)
        );
        for bad in ["0", "-5", "ten", "", "1.5"] {
            let e = parse_timeout(Some(bad)).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmInvalidArgument);
            assert!(e.message.contains("SYMM_TIMEOUT_MS"), "{bad}");
        }
    }
}
