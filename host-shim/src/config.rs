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

/// `SYMM_MIN_BLOCKS` and `SYMM_MAX_BLOCKS`: the fewest and the most blocks per rank the planner
/// gives a kernel (as NCCL's `NCCL_MIN_CTAS` and `NCCL_MAX_CTAS` bound its channels), within
/// what lets the ranks sharing a GPU be resident at once; unset: 1 and no bound.
pub fn block_bounds() -> Result<(u32, u32)> {
    parse_block_bounds(
        std::env::var("SYMM_MIN_BLOCKS").ok().as_deref(),
        std::env::var("SYMM_MAX_BLOCKS").ok().as_deref(),
    )
}

/// Parse `SYMM_MIN_BLOCKS` and `SYMM_MAX_BLOCKS` (`None`: unset) into (fewest, most).
pub fn parse_block_bounds(min: Option<&str>, max: Option<&str>) -> Result<(u32, u32)> {
    let parse = |name: &str, value: Option<&str>, unset: u32| match value.map(str::trim) {
        None | Some("") => Ok(unset),
        Some(text) => match text.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(Error::invalid_argument(format!(
                "{name}={text:?} is not a positive number of blocks"
            ))),
        },
    };
    let min = parse("SYMM_MIN_BLOCKS", min, 1)?;
    let max = parse("SYMM_MAX_BLOCKS", max, u32::MAX)?;
    if min > max {
        return Err(Error::invalid_argument(format!(
            "SYMM_MIN_BLOCKS={min} exceeds SYMM_MAX_BLOCKS={max}"
        )));
    }
    Ok((min, max))
}

/// How the host backend runs kernels (`SYMM_HOST_MODE`). Both run the same kernel code with
/// the same bounded waits and failure semantics; they differ in how many OS threads a launch
/// uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostMode {
    /// `fast` (the default, for users' CPU tensors): a block of one thread and one block per
    /// rank, so that a launch serving one rank runs on the calling thread (no thread is
    /// created, no block barrier is shared).
    Fast,
    /// `testing`: blocks of 8 threads, up to 2 per rank,
    /// every thread an OS thread: the interleavings that the tests rely on to find ordering
    /// bugs.
    Testing,
}

impl HostMode {
    /// Threads per block.
    pub fn threads(self) -> u32 {
        match self {
            HostMode::Fast => 1,
            HostMode::Testing => 8,
        }
    }

    /// Most blocks per rank.
    pub fn max_blocks(self) -> u32 {
        match self {
            HostMode::Fast => 1,
            HostMode::Testing => 2,
        }
    }

    /// The value `SYMM_HOST_MODE` names it by.
    pub fn name(self) -> &'static str {
        match self {
            HostMode::Fast => "fast",
            HostMode::Testing => "testing",
        }
    }
}

/// `SYMM_HOST_MODE`: `fast` (unset) or `testing`.
pub fn host_mode() -> Result<HostMode> {
    parse_host_mode(std::env::var("SYMM_HOST_MODE").ok().as_deref())
}

/// Parse `SYMM_HOST_MODE` (`None`: unset).
pub fn parse_host_mode(value: Option<&str>) -> Result<HostMode> {
    match value.map(str::trim) {
        None | Some("") | Some("fast") => Ok(HostMode::Fast),
        Some("testing") => Ok(HostMode::Testing),
        Some(other) => Err(Error::invalid_argument(format!(
            "SYMM_HOST_MODE={other:?}: expected fast or testing"
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

/// Default size of a communicator's staging window ([`staging_bytes`]).
pub(crate) const DEFAULT_STAGING_BYTES: u64 = 4 << 20;

/// Smallest staging window: room for one element of the widest type from every rank, twice,
/// at the most ranks.
pub(crate) const MIN_STAGING_BYTES: u64 = 4096;

/// `SYMM_STAGING_BYTES`: the size of the window each communicator makes at its creation to
/// stage collectives whose buffers lie outside every registered window (a multiple of 256, at
/// least [`MIN_STAGING_BYTES`]; `0`: no staging window, such calls are refused); unset:
/// [`DEFAULT_STAGING_BYTES`]. `SYMM_STRICT_WINDOWS=1` also means none.
pub fn staging_bytes() -> Result<u64> {
    parse_staging(
        std::env::var("SYMM_STAGING_BYTES").ok().as_deref(),
        std::env::var("SYMM_STRICT_WINDOWS").ok().as_deref(),
    )
}

/// Parse `SYMM_STAGING_BYTES` and `SYMM_STRICT_WINDOWS` (`None`: unset) into the staging
/// window's size (0: none).
pub fn parse_staging(bytes: Option<&str>, strict: Option<&str>) -> Result<u64> {
    match strict.map(str::trim) {
        None | Some("") | Some("0") => {}
        Some("1") => return Ok(0),
        Some(other) => {
            return Err(Error::invalid_argument(format!(
                "SYMM_STRICT_WINDOWS={other:?}: expected 0 or 1"
            )));
        }
    }
    match bytes.map(str::trim) {
        None | Some("") => Ok(DEFAULT_STAGING_BYTES),
        Some(text) => match text.parse::<u64>() {
            Ok(0) => Ok(0),
            Ok(n) if (MIN_STAGING_BYTES..=1 << 40).contains(&n) => Ok(n / 256 * 256),
            _ => Err(Error::invalid_argument(format!(
                "SYMM_STAGING_BYTES={text:?}: expected 0 (no staging) or a number of bytes from \
                 {MIN_STAGING_BYTES} to 2^40"
            ))),
        },
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

/// What a launcher (torchrun, `mpirun` with the variables exported, a Slurm script) says a
/// process joins: its rank, the number of ranks, and where rank 0 opens the bootstrap root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    /// This process's rank.
    pub rank: i32,
    /// The number of ranks.
    pub nranks: i32,
    /// `host:port` of the bootstrap root.
    pub address: String,
    /// Where the address came from, for errors (`SYMM_COMM_ID`, or `MASTER_ADDR`/`MASTER_PORT`).
    pub address_from: &'static str,
    /// `SYMM_COMM_SECRET`, when set.
    pub secret: Option<String>,
}

/// The launcher's variables of this process's environment ([`parse_launcher`]).
pub fn launcher() -> Result<Launcher> {
    parse_launcher(|name| std::env::var(name).ok())
}

/// The launcher's description in `pairs` (name, value) instead of the environment, as
/// [`parse_launcher`] reads it; of two pairs with one name the later wins.
pub fn parse_launcher_pairs(pairs: &[(String, String)]) -> Result<Launcher> {
    parse_launcher(|name| {
        pairs
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    })
}

/// The launcher's description in the variables `var` gives (`None`: unset), as
/// `torch.distributed`'s `env://` reads them:
///
/// - the rank: `RANK`, else `SYMM_RANK`, else `OMPI_COMM_WORLD_RANK`, else `PMI_RANK`;
/// - the number of ranks: `WORLD_SIZE`, else `SYMM_WORLD_SIZE`, else `OMPI_COMM_WORLD_SIZE`,
///   else `PMI_SIZE`;
/// - the root: `SYMM_COMM_ID` (`host:port`) when set, else `MASTER_ADDR` at port
///   `MASTER_PORT + 1` (`MASTER_PORT` itself is the port of torchrun's own store);
/// - the secret: `SYMM_COMM_SECRET` when set (without it anyone who reaches the address can
///   join).
///
/// Errors name the variable that is missing or malformed.
pub fn parse_launcher(var: impl Fn(&str) -> Option<String>) -> Result<Launcher> {
    let number = |names: &[&str], what: &str| -> Result<i32> {
        for name in names {
            if let Some(text) = var(name) {
                return text.trim().parse::<i32>().map_err(|_| {
                    Error::invalid_argument(format!("{name}={text:?} is not an integer"))
                });
            }
        }
        Err(Error::invalid_argument(format!(
            "{what}: none of {} is set",
            names.join(", ")
        )))
    };
    let rank = number(
        &["RANK", "SYMM_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"],
        "the rank",
    )?;
    let nranks = number(
        &[
            "WORLD_SIZE",
            "SYMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_SIZE",
            "PMI_SIZE",
        ],
        "the number of ranks",
    )?;
    let secret = var("SYMM_COMM_SECRET");
    if let Some(address) = var("SYMM_COMM_ID").filter(|a| !a.trim().is_empty()) {
        return Ok(Launcher {
            rank,
            nranks,
            address: address.trim().to_string(),
            address_from: "SYMM_COMM_ID",
            secret,
        });
    }
    let master = var("MASTER_ADDR")
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .ok_or_else(|| {
            Error::invalid_argument(
                "the bootstrap address: set SYMM_COMM_ID=host:port, or MASTER_ADDR and \
                 MASTER_PORT",
            )
        })?;
    let text = var("MASTER_PORT").ok_or_else(|| {
        Error::invalid_argument(
            "MASTER_ADDR is set but MASTER_PORT is not set (the bootstrap port: the root listens at \
             MASTER_PORT + 1; or set SYMM_COMM_ID=host:port)",
        )
    })?;
    let port = match text.trim().parse::<u32>() {
        Ok(port) if (1..65535).contains(&port) => port,
        _ => {
            return Err(Error::invalid_argument(format!(
                "MASTER_PORT={text:?} is not a port below 65535"
            )));
        }
    };
    let host = if master.contains(':') && !master.starts_with('[') {
        format!("[{master}]")
    } else {
        master
    };
    Ok(Launcher {
        rank,
        nranks,
        address: format!("{host}:{}", port + 1),
        address_from: "MASTER_ADDR and MASTER_PORT (the root listens at MASTER_PORT + 1)",
        secret,
    })
}

/// `SYMM_BACKEND`, trimmed (`None`: unset); [`crate::backend::select`] parses it.
pub fn backend_name() -> Option<String> {
    std::env::var("SYMM_BACKEND")
        .ok()
        .map(|v| v.trim().to_string())
}

/// `SYMM_JIT_PTX`: set and not `0`, kernels load from the PTX even where shipped SASS runs.
pub fn jit_ptx() -> bool {
    std::env::var_os("SYMM_JIT_PTX").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `SYMM_COMM_ID` when set and not blank, with `SYMM_COMM_SECRET` (`None`: unset), for
/// [`crate::transport::bootstrap::UniqueId::from_env`] to parse.
pub fn comm_id() -> Option<(String, Option<String>)> {
    let text = std::env::var("SYMM_COMM_ID").ok()?;
    (!text.trim().is_empty()).then(|| (text, std::env::var("SYMM_COMM_SECRET").ok()))
}

/// `SYMM_SOCKET_ADDR` when set and not blank (`None`: unset), for the bootstrap to parse.
pub fn socket_address() -> Option<String> {
    std::env::var("SYMM_SOCKET_ADDR")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// `SYMM_HOST_ID`: the text that names this process's machine instead of the kernel's boot id,
/// when set and not empty (one machine then plays several, for tests).
pub fn host_id() -> Option<String> {
    std::env::var("SYMM_HOST_ID").ok().filter(|v| !v.is_empty())
}

/// `SYMM_NCCL_LIBRARY`: the NCCL library the NCCL window adapter loads, when set and not empty.
pub fn nccl_library() -> Option<String> {
    std::env::var("SYMM_NCCL_LIBRARY")
        .ok()
        .filter(|v| !v.is_empty())
}

/// What carries a communicator's legs between machines (its rails).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rails {
    /// The ranks' own authenticated sockets (a bootstrap root per rail), the data through the
    /// host.
    Sockets,
    /// NCCL's host API (`libnccl`, loaded at run time): a communicator per rail, its calls on
    /// the caller's stream.
    Nccl,
}

/// `SYMM_RAILS` (`sockets` or `nccl`); unset or empty: `default` (the backend's: sockets on the
/// host backend, NCCL on the cuda backend).
pub fn rails(default: Rails) -> Result<Rails> {
    match std::env::var("SYMM_RAILS").ok().as_deref().map(str::trim) {
        None | Some("") => Ok(default),
        Some("sockets") => Ok(Rails::Sockets),
        Some("nccl") => Ok(Rails::Nccl),
        Some(other) => Err(Error::invalid_argument(format!(
            "SYMM_RAILS={other:?}: must be sockets or nccl"
        ))),
    }
}

/// `SYMM_NVSHMEM_LIBRARY`: the NVSHMEM host library the NVSHMEM window adapter loads, when set
/// and not empty.
pub fn nvshmem_library() -> Option<String> {
    std::env::var("SYMM_NVSHMEM_LIBRARY")
        .ok()
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::symmResult_t;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn launchers_are_read_as_torchrun_describes_them() {
        let torchrun = [
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("SYMM_RANK", "9"),
        ];
        let l = parse_launcher(vars(&torchrun)).unwrap();
        assert_eq!((l.rank, l.nranks), (3, 4));
        assert_eq!(l.address, "10.0.0.1:29501");
        assert_eq!(l.secret, None);
        let v6 = [
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MASTER_ADDR", "::1"),
            ("MASTER_PORT", "7"),
            ("SYMM_COMM_SECRET", "s"),
        ];
        let l = parse_launcher(vars(&v6)).unwrap();
        assert_eq!((l.rank, l.nranks, l.address.as_str()), (0, 2, "[::1]:8"));
        assert_eq!(l.secret.as_deref(), Some("s"));
        let id = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("SYMM_COMM_ID", " host:5 "),
            ("MASTER_ADDR", "ignored"),
        ];
        let l = parse_launcher(vars(&id)).unwrap();
        assert_eq!(
            (l.address.as_str(), l.address_from),
            ("host:5", "SYMM_COMM_ID")
        );
    }

    #[test]
    fn launcher_errors_name_the_variable() {
        let cases: [(&[(&str, &str)], &str); 6] = [
            (&[("WORLD_SIZE", "2")], "none of RANK, SYMM_RANK"),
            (&[("RANK", "0")], "none of WORLD_SIZE"),
            (
                &[("RANK", "x"), ("WORLD_SIZE", "2")],
                "RANK=\"x\" is not an integer",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2")],
                "set SYMM_COMM_ID=host:port",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
                "MASTER_PORT is not set",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", "65535"),
                ],
                "MASTER_PORT=\"65535\"",
            ),
        ];
        for (pairs, message) in cases {
            let e = parse_launcher(vars(pairs)).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmInvalidArgument);
            assert!(e.message.contains(message), "{pairs:?}: {}", e.message);
        }
    }

    #[test]
    fn staging_sizes() {
        assert_eq!(parse_staging(None, None).unwrap(), DEFAULT_STAGING_BYTES);
        assert_eq!(parse_staging(Some("0"), None).unwrap(), 0);
        assert_eq!(parse_staging(Some("5000"), Some("0")).unwrap(), 4864);
        assert_eq!(parse_staging(None, Some("1")).unwrap(), 0);
        assert_eq!(parse_staging(Some("5000"), Some("1")).unwrap(), 0);
        for bad in ["100", "-1", "lots"] {
            let e = parse_staging(Some(bad), None).unwrap_err();
            assert!(e.message.contains("SYMM_STAGING_BYTES"), "{}", e.message);
        }
        let e = parse_staging(None, Some("yes")).unwrap_err();
        assert!(e.message.contains("SYMM_STRICT_WINDOWS"), "{}", e.message);
    }

    #[test]
    fn host_modes() {
        assert_eq!(parse_host_mode(None).unwrap(), HostMode::Fast);
        assert_eq!(parse_host_mode(Some(" fast")).unwrap(), HostMode::Fast);
        assert_eq!(parse_host_mode(Some("testing")).unwrap(), HostMode::Testing);
        let bad = parse_host_mode(Some("quick")).unwrap_err();
        assert_eq!(bad.code, symmResult_t::symmInvalidArgument);
        assert!(bad.message.contains("SYMM_HOST_MODE"), "{}", bad.message);
        assert_eq!(
            (HostMode::Fast.threads(), HostMode::Fast.max_blocks()),
            (1, 1)
        );
    }

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

    #[test]
    fn block_bound_values() {
        assert_eq!(parse_block_bounds(None, None).unwrap(), (1, u32::MAX));
        assert_eq!(
            parse_block_bounds(Some(" 4 "), None).unwrap(),
            (4, u32::MAX)
        );
        assert_eq!(parse_block_bounds(Some(""), Some("8")).unwrap(), (1, 8));
        assert_eq!(parse_block_bounds(Some("3"), Some("3")).unwrap(), (3, 3));
        for (min, max, named) in [
            (Some("0"), None, "SYMM_MIN_BLOCKS"),
            (None, Some("-1"), "SYMM_MAX_BLOCKS"),
            (Some("two"), None, "SYMM_MIN_BLOCKS"),
            (None, Some("1.5"), "SYMM_MAX_BLOCKS"),
            (Some("9"), Some("8"), "exceeds SYMM_MAX_BLOCKS"),
        ] {
            let e = parse_block_bounds(min, max).unwrap_err();
            assert_eq!(e.code, symmResult_t::symmInvalidArgument);
            assert!(e.message.contains(named), "{min:?} {max:?}: {}", e.message);
        }
    }
}
