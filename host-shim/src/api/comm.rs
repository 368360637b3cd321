//! A rank of a communicator, and groups.

use super::Result;
use crate::abi::{SYMM_UNIQUE_ID_BYTES, symmComm_t, symmUniqueId};
use crate::error::Error;
use crate::log::{Level, Subsys};
use std::sync::Arc;

/// Names a communicator: made once (by the rank that opens the bootstrap root) and passed to
/// every rank's [`Comm::init_rank`], as bytes when the ranks are other processes.
#[derive(Clone, Copy)]
pub struct UniqueId(pub(crate) symmUniqueId);

impl UniqueId {
    /// A new id: starts the bootstrap root in this process (with `SYMM_COMM_ID` set, the id of
    /// that address, whose root rank 0 opens), as `symmGetUniqueId`.
    pub fn new() -> Result<UniqueId> {
        crate::comm::new_unique_id()
            .map(UniqueId)
            .map_err(|e| e.in_function("UniqueId::new"))
    }

    /// The id as bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; SYMM_UNIQUE_ID_BYTES] {
        self.0.internal.map(|b| b as u8)
    }

    /// The id from [`UniqueId::to_bytes`].
    pub fn from_bytes(bytes: &[u8; SYMM_UNIQUE_ID_BYTES]) -> UniqueId {
        UniqueId(symmUniqueId {
            internal: bytes.map(|b| b as std::ffi::c_char),
        })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// A rank of a communicator. Dropping it destroys it (as `symmCommDestroy`; [`Comm::destroy`]
/// returns the error, if any). A rank's calls come from one thread at a time: a second thread
/// entering a call while another is in one is refused with an error, never run.
pub struct Comm {
    pub(crate) inner: Arc<crate::comm::Comm>,
    destroyed: bool,
}

impl Comm {
    fn new(inner: Arc<crate::comm::Comm>) -> Comm {
        Comm {
            inner,
            destroyed: false,
        }
    }

    /// Join rank `rank` of the `nranks`-rank communicator `id` names (one thread or process
    /// per rank): returns once every rank has joined, or fails at the wait bound
    /// (`SYMM_TIMEOUT_MS`). As `symmCommInitRank`.
    pub fn init_rank(nranks: usize, id: &UniqueId, rank: usize) -> Result<Comm> {
        let name = "Comm::init_rank";
        if crate::group::active() {
            return Err(Error::invalid_usage(
                "inside a group: it returns only once every rank joined, so one thread cannot \
                 join several ranks; use one thread per rank, or Comm::init_all",
            )
            .in_function(name));
        }
        let nranks = i32::try_from(nranks).map_err(|_| {
            Error::invalid_argument(format!("nranks = {nranks} is too large")).in_function(name)
        })?;
        let rank = i32::try_from(rank).map_err(|_| {
            Error::invalid_argument(format!("rank = {rank} is too large")).in_function(name)
        })?;
        crate::comm::init_rank(nranks, &id.0, rank)
            .map(Comm::new)
            .map_err(|e| e.in_function(name))
    }

    /// Join the communicator a launcher describes in this process's environment (torchrun,
    /// `mpirun` with the variables exported, Slurm scripts), as `symmCommInitFromEnv`: the
    /// rank from `RANK` (else `SYMM_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`), the number of
    /// ranks from `WORLD_SIZE` (else `SYMM_WORLD_SIZE`, `OMPI_COMM_WORLD_SIZE`, `PMI_SIZE`),
    /// the bootstrap root at `SYMM_COMM_ID` (`host:port`), else at `MASTER_ADDR`, port
    /// `MASTER_PORT + 1`, which rank 0 opens; the secret from `SYMM_COMM_SECRET`. The device is
    /// the current one. An error names the variable that is missing or malformed.
    pub fn from_env() -> Result<Comm> {
        let name = "Comm::from_env";
        let launcher = crate::config::launcher().map_err(|e| e.in_function(name))?;
        Comm::from_launcher(&launcher, name)
    }

    /// [`Comm::from_env`] reading the launcher's variables from `vars` (name, value) instead
    /// of the environment (later pairs win); the other `SYMM_*` settings still come from the
    /// environment.
    pub fn from_vars<N, V>(vars: impl IntoIterator<Item = (N, V)>) -> Result<Comm>
    where
        N: AsRef<str>,
        V: AsRef<str>,
    {
        let name = "Comm::from_vars";
        let vars: Vec<(String, String)> = vars
            .into_iter()
            .map(|(n, v)| (n.as_ref().to_string(), v.as_ref().to_string()))
            .collect();
        let launcher =
            crate::config::parse_launcher_pairs(&vars).map_err(|e| e.in_function(name))?;
        Comm::from_launcher(&launcher, name)
    }

    fn from_launcher(launcher: &crate::config::Launcher, name: &str) -> Result<Comm> {
        if crate::group::active() {
            return Err(Error::invalid_usage(
                "inside a group: it returns only once every rank joined, so one thread cannot \
                 join several ranks",
            )
            .in_function(name));
        }
        crate::comm::init_from_launcher(launcher)
            .map(Comm::new)
            .map_err(|e| e.in_function(name))
    }

    /// Every rank of a new communicator, in this process: rank `i` on device `devices[i]`
    /// (devices may repeat). As `symmCommInitAll`; one thread then drives every rank, making
    /// their calls inside [`group`].
    pub fn init_all(devices: &[i32]) -> Result<Vec<Comm>> {
        if devices.is_empty() {
            return Err(Error::invalid_argument("devices is empty").in_function("Comm::init_all"));
        }
        let comms = crate::comm::init_all(devices).map_err(|e| e.in_function("Comm::init_all"))?;
        Ok(comms.into_iter().map(Comm::new).collect())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.inner.clique.nranks
    }

    /// The CUDA device ordinal of this rank (0 on the host backend).
    pub fn device(&self) -> i32 {
        self.inner.device
    }

    /// The backend: `"cuda"`, `"host"` or `"model"`.
    pub fn backend(&self) -> &'static str {
        self.inner.clique.backend.kind().name()
    }

    /// The communicator's handle for the C ABI (valid while `self` lives), to mix C calls with
    /// this API.
    pub fn as_raw(&self) -> symmComm_t {
        self.inner.handle()
    }

    /// Split this communicator (as `symmCommSplit`; every rank calls it, one thread per rank):
    /// the ranks passing one `color` form one new communicator, ranked by `key` (ties by their
    /// rank here); `None` as the color takes part without joining any (`SYMM_SPLIT_NOCOLOR`),
    /// and gets `None`. The new communicators inherit this one's settings. One thread driving
    /// every rank splits them with [`Comm::split_all`].
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>> {
        let name = "Comm::split";
        if crate::group::active() {
            return Err(Error::invalid_usage(
                "inside a group: one thread driving every rank splits them with Comm::split_all",
            )
            .in_function(name));
        }
        let request = split_color(color).map(|color| (color, key, Default::default()));
        crate::comm::split::split(&self.inner, request)
            .map(|made| made.map(Comm::new))
            .map_err(|e| self.record(e.in_function(name)))
    }

    /// Split every rank of a communicator this thread drives (`comms`, as [`Comm::init_all`]
    /// made them; one (color, key) per rank, as [`Comm::split`] takes them) in one group: each
    /// rank's new communicator, in `comms`' order.
    pub fn split_all(comms: &[Comm], colors: &[(Option<u32>, i32)]) -> Result<Vec<Option<Comm>>> {
        let name = "Comm::split_all";
        if comms.len() != colors.len() {
            return Err(Error::invalid_argument(format!(
                "{} comms but {} (color, key) pairs",
                comms.len(),
                colors.len()
            ))
            .in_function(name));
        }
        let mut handles: Vec<symmComm_t> = vec![std::ptr::null_mut(); comms.len()];
        let outs: Vec<crate::group::SplitOut> = handles
            .iter_mut()
            .map(|h| crate::group::SplitOut(h as *mut symmComm_t))
            .collect();
        let ended = group(|| {
            for ((comm, &(color, key)), out) in comms.iter().zip(colors).zip(outs) {
                let request = split_color(color).map(|color| (color, key, Default::default()));
                crate::group::defer(crate::group::Deferred::Split(crate::group::Split {
                    comm: comm.inner.clone(),
                    number: crate::comm::split::take_number(&comm.inner),
                    request,
                    out,
                }));
            }
            Ok(())
        });
        // Every communicator the group made is owned here, also when the group failed (then
        // they are destroyed on the way out).
        let made: Vec<Option<Comm>> = handles
            .into_iter()
            .map(|handle| crate::comm::Comm::from_handle(handle).ok().map(Comm::new))
            .collect();
        ended.map_err(|e| e.in_function(name))?;
        Ok(made)
    }

    /// Shrink this communicator (as `symmCommShrink`): every rank that remains calls it with
    /// the same `exclude` list (ranks of this communicator; the excluded ones do not call it),
    /// and gets its rank of a new communicator of the remaining ranks in their order, with
    /// this one's settings. [`ShrinkMode::Abort`] first stops this communicator's pending work
    /// on every rank (after a failure); [`ShrinkMode::Wait`] lets it complete.
    pub fn shrink(&self, exclude: &[usize], mode: ShrinkMode) -> Result<Comm> {
        let name = "Comm::shrink";
        let refuse = |e: Error| self.record(e.in_function(name));
        if crate::group::active() {
            return Err(refuse(Error::invalid_usage(
                "inside a group: every remaining rank shrinks on its own thread",
            )));
        }
        let exclude: Vec<i32> = exclude
            .iter()
            .map(|&r| {
                i32::try_from(r).map_err(|_| {
                    Error::invalid_argument(format!("exclude holds rank {r}: at most {}", i32::MAX))
                })
            })
            .collect::<Result<_>>()
            .map_err(refuse)?;
        let flags = match mode {
            ShrinkMode::Wait => crate::abi::SYMM_SHRINK_DEFAULT,
            ShrinkMode::Abort => crate::abi::SYMM_SHRINK_ABORT,
        };
        crate::comm::shrink::survivors(self.inner.clique.nranks, &exclude).map_err(refuse)?;
        self.inner.refuse_if_queued_in_group(name).map_err(refuse)?;
        // Numbered now, whatever happens to the call, so that the remaining ranks' next shrinks
        // with this list pair up (as `symmCommShrink` does).
        let number = crate::comm::shrink::take_number(&self.inner, &exclude);
        let request = crate::comm::shrink::Request {
            exclude,
            number,
            config: Default::default(),
            flags,
        };
        crate::comm::shrink::shrink(&self.inner, &request, false)
            .map(Comm::new)
            .map_err(refuse)
    }

    /// Revoke this communicator (as `symmCommRevoke`): its work stops on every rank and its
    /// later collectives are refused; windows and memory can still be freed, and
    /// [`Comm::shrink`] and [`Comm::split`] still work. Returns once this rank's work has ended.
    pub fn revoke(&self) -> Result<()> {
        crate::comm::revoke(&self.inner, crate::abi::SYMM_REVOKE_DEFAULT)
            .map_err(|e| self.record(e.in_function("Comm::revoke")))
    }

    /// This communicator's failure, if it failed (as `symmCommGetAsyncError`): a peer's
    /// failure, a timeout, an abort, a revoke, or a misuse it found. `Ok(())` while it works.
    pub fn async_error(&self) -> Result<()> {
        match crate::comm::failure::async_error(&self.inner.machine()) {
            None => Ok(()),
            Some(error) => Err(self.record(error)),
        }
    }

    /// Wait until every collective this rank enqueued has completed, then refuse later
    /// collectives and windows (as `symmCommFinalize`); dropping or [`Comm::destroy`] frees
    /// it. Returns the communicator's failure, if it failed.
    pub fn finalize(&self) -> Result<()> {
        crate::comm::finalize(&self.inner).map_err(|e| self.record(e.in_function("Comm::finalize")))
    }

    /// Abort this rank (as `symmCommAbort`): the communicator fails on every rank, naming this
    /// rank's abort (every rank's pending work ends promptly, later calls fail), and this rank
    /// is freed. A watchdog thread that must abort while another thread's call on the rank
    /// waits calls `symmCommAbort(comm.as_raw())` instead (it may come from any thread).
    pub fn abort(mut self) -> Result<()> {
        self.destroyed = true;
        crate::comm::abort(&self.inner).map_err(|e| e.in_function("Comm::abort"))
    }

    /// Destroy this rank (as `symmCommDestroy`), returning the error, if any.
    pub fn destroy(mut self) -> Result<()> {
        self.destroyed = true;
        crate::comm::destroy(&self.inner).map_err(|e| e.in_function("Comm::destroy"))
    }

    /// Record `error` as this rank's last error (`symmGetLastError`) and return it.
    pub(crate) fn record(&self, error: Error) -> Error {
        self.inner.set_last_error(&error.message);
        error
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        if let Err(e) = crate::comm::destroy(&self.inner) {
            crate::log!(
                Level::Warn,
                Subsys::Init,
                Some(self.inner.rank),
                "dropping a Comm: {e} (call Comm::destroy to see the error)"
            );
        }
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("backend", &self.backend())
            .finish()
    }
}

/// What [`Comm::shrink`] does with the communicator's pending work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShrinkMode {
    /// Let it complete first (`SYMM_SHRINK_DEFAULT`): every remaining rank is healthy.
    #[default]
    Wait,
    /// Stop it on every rank first (`SYMM_SHRINK_ABORT`): after a rank failed or left.
    Abort,
}

/// The C ABI's color of `color` (`None`: `SYMM_SPLIT_NOCOLOR`), refused past `i32::MAX`.
fn split_color(color: Option<u32>) -> Result<i32> {
    match color {
        None => Ok(crate::abi::SYMM_SPLIT_NOCOLOR),
        Some(c) => i32::try_from(c)
            .map_err(|_| Error::invalid_argument(format!("color = {c}: at most {}", i32::MAX))),
    }
}

/// Run `body` as a group (`symmGroupStart` … `symmGroupEnd`): the calls it makes are queued,
/// and run together when it returns (window registrations complete, collectives launch, each
/// rank's sends and receives run as one batch). One thread driving several ranks makes every
/// rank's part of a collective inside one group. The group ends also when `body` fails or
/// panics; `body`'s error comes first, else the group's.
pub fn group<R>(body: impl FnOnce() -> Result<R>) -> Result<R> {
    /// Ends the group on unwind.
    struct EndOnUnwind(bool);
    impl Drop for EndOnUnwind {
        fn drop(&mut self) {
            if self.0 {
                let _ = crate::group::end();
            }
        }
    }
    crate::group::start().map_err(|e| e.in_function("group"))?;
    let mut guard = EndOnUnwind(true);
    let result = body();
    guard.0 = false;
    let ended = crate::group::end().map_err(|e| e.in_function("group"));
    match (result, ended) {
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(e),
        (Ok(value), Ok(())) => Ok(value),
    }
}
