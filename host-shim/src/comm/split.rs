//! `symmCommSplit`: new communicators from the ranks of a parent, by color, ordered by key.
//!
//! A collective call of the parent (every rank calls it, with its color and key):
//! 1. the ranks all-gather their (color, key) over the parent ([`gather`]: the bootstrap root
//!    for ranks made by `symmCommInitRank`, the clique for `symmCommInitAll`'s);
//! 2. every rank computes the members of its color, in the order of (key, parent rank)
//!    ([`members`]: pure);
//! 3. each new communicator's rank 0 makes it: in a clique whose ranks all run in this
//!    process, the communicator's ranks themselves ([`build_local`]); else a new bootstrap
//!    root in its own process, whose id the other members join ([`super::join`]), so that the
//!    child does not depend on the process that made the parent's id;
//! 4. a second all-gather hands each member what its rank 0 made (or the error that stopped
//!    it), and every member returns the same outcome.
//!
//! A rank with color [`SYMM_SPLIT_NOCOLOR`] takes part in both all-gathers and gets no
//! communicator.

use super::{Comm, Joining, ROOT_JOIN_TIMEOUT, keep_root};
use crate::abi::{SYMM_CONFIG_MAGIC, SYMM_CONFIG_UNDEF_INT, SYMM_SPLIT_NOCOLOR, symmConfig_t};
use crate::abi::{symmComm_t, symmResult_t};
use crate::error::{Error, Result};
use crate::transport::bootstrap::{self, UniqueId};
use crate::transport::link::RankLink;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The all-gather tags of splits on ranks joined through the bootstrap: the `n`-th split of a
/// communicator uses `SPLIT_TAG | 2n` and `SPLIT_TAG | 2n + 1` (window registrations use
/// small numbers, their confirmations `1 << 62`).
const SPLIT_TAG: u64 = 1 << 61;

/// What a [`symmConfig_t`] asks of a new communicator (`None`: inherit or default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Fewest blocks per rank.
    pub min_blocks: Option<u32>,
    /// Most blocks per rank.
    pub max_blocks: Option<u32>,
}

impl Config {
    /// Validate a C caller's configuration (`None`: NULL).
    pub fn from_c(config: Option<&symmConfig_t>) -> Result<Config> {
        let Some(config) = config else {
            return Ok(Config::default());
        };
        if config.magic != SYMM_CONFIG_MAGIC || config.size != std::mem::size_of::<symmConfig_t>() {
            return Err(Error::invalid_argument(
                "config was not made with SYMM_CONFIG_INITIALIZER (its size or magic is wrong)",
            ));
        }
        if config.blocking != SYMM_CONFIG_UNDEF_INT && config.blocking != 1 {
            return Err(Error::invalid_argument(format!(
                "config->blocking = {}: symm's communicators are blocking (1); non-blocking \
                 ones are not supported",
                config.blocking
            )));
        }
        let blocks = |name: &str, value: i32| match value {
            SYMM_CONFIG_UNDEF_INT => Ok(None),
            n if n > 0 => Ok(Some(n as u32)),
            n => Err(Error::invalid_argument(format!(
                "config->{name} = {n}: must be at least 1 (or SYMM_CONFIG_UNDEF_INT)"
            ))),
        };
        let min_blocks = blocks("minCTAs", config.minCTAs)?;
        let max_blocks = blocks("maxCTAs", config.maxCTAs)?;
        if let (Some(min), Some(max)) = (min_blocks, max_blocks)
            && min > max
        {
            return Err(Error::invalid_argument(format!(
                "config->minCTAs = {min} is above config->maxCTAs = {max}"
            )));
        }
        Ok(Config {
            min_blocks,
            max_blocks,
        })
    }
}

/// The members of the new communicator of `rank`, parent ranks in new-rank order, from every
/// rank's (color, key): ranks of its color, by key, then by parent rank. `None` for
/// [`SYMM_SPLIT_NOCOLOR`].
pub fn members(parts: &[(i32, i32)], rank: usize) -> Option<Vec<usize>> {
    let color = parts[rank].0;
    if color == SYMM_SPLIT_NOCOLOR {
        return None;
    }
    let mut members: Vec<usize> = (0..parts.len()).filter(|&r| parts[r].0 == color).collect();
    members.sort_by_key(|&r| (parts[r].1, r));
    Some(members)
}

/// A rank's `symmCommSplit` as called: its color, key and configuration, or why its arguments
/// were refused. A refused call still takes part in the exchange, so that every rank fails
/// at once, naming it, instead of waiting for it.
pub type Request = Result<(i32, i32, Config)>;

/// `symmCommSplit` on `parent` (outside a group): this rank's new communicator, or `None` for
/// [`SYMM_SPLIT_NOCOLOR`].
pub fn split(parent: &Arc<Comm>, request: Request) -> Result<Option<Arc<Comm>>> {
    let _call = parent.enter_call("symmCommSplit")?;
    parent.refuse_if_queued_in_group("symmCommSplit")?;
    split_numbered(parent, take_number(parent), request)
}

/// The number of `parent`'s next split (the `n`-th split of every rank is one split): taken
/// when the call is made, also when a group queues it, so that a group's splits keep their
/// call order.
pub fn take_number(parent: &Comm) -> u64 {
    parent.splits.fetch_add(1, Ordering::AcqRel)
}

/// Split `n` of `parent`, for a caller that holds `parent` (a group's end runs its queued
/// splits this way).
pub fn split_numbered(parent: &Arc<Comm>, n: u64, request: Request) -> Result<Option<Arc<Comm>>> {
    if parent.span.get().is_some() {
        return Err(super::span::unsupported("symmCommSplit"));
    }
    // A failed or revoked communicator splits too: the exchanges go through the bootstrap
    // (or this process), not its kernels, and the new communicators start in step.
    let request = request.and_then(|request| {
        super::refuse_if_finalized(parent, "symmCommSplit")?;
        Ok(request)
    });
    let parts = gather(
        parent,
        "symmCommSplit",
        SPLIT_TAG | (2 * n),
        &encode_part(&request),
    )?
    .iter()
    .enumerate()
    .map(|(r, bytes)| decode_part(r, bytes))
    .collect::<Result<Vec<Part>>>()?;
    let (color, key, _) = request?;
    if let Some((r, why)) = parts.iter().enumerate().find_map(|(r, p)| match p {
        Part::Refused(why) => Some((r, why)),
        Part::Called { .. } => None,
    }) {
        return Err(Error::new(
            symmResult_t::symmRemoteError,
            format!("rank {}: rank {r} refused its split: {why}", parent.rank),
        ));
    }
    let called: Vec<(i32, i32)> = parts
        .iter()
        .map(|p| match p {
            Part::Called { color, key, .. } => (*color, *key),
            Part::Refused(_) => unreachable!("refusals returned above"),
        })
        .collect();
    debug_assert_eq!(called[parent.rank], (color, key));
    let members = members(&called, parent.rank);
    // The new communicator's settings are its rank 0's (every member uses the same).
    let config = match (&members, &parts) {
        (Some(members), parts) => match &parts[members[0]] {
            Part::Called { config, .. } => *config,
            Part::Refused(_) => unreachable!("refusals returned above"),
        },
        _ => Config::default(),
    };
    let made = match &members {
        Some(members) if members[0] == parent.rank => Some(make(parent, members, config)),
        _ => None,
    };
    let outcome = match &made {
        None => Vec::new(),
        Some(Ok((bytes, _))) => [&[1u8][..], bytes].concat(),
        Some(Err(e)) => [&[0u8][..], e.message.as_bytes()].concat(),
    };
    let outcomes = match gather(parent, "symmCommSplit", SPLIT_TAG | (2 * n + 1), &outcome) {
        Ok(outcomes) => outcomes,
        Err(e) => {
            // Nobody takes what this rank made.
            if let Some(Ok((_, built))) = made {
                for comm in built {
                    let _ = super::destroy(&comm);
                }
            }
            return Err(e);
        }
    };
    let Some(members) = members else {
        return Ok(None);
    };
    if let Some(Err(e)) = made {
        return Err(e);
    }
    let new_rank = members
        .iter()
        .position(|&r| r == parent.rank)
        .expect("a member of its own color");
    match outcomes[members[0]].split_first() {
        Some((1, made)) if parent.link.is_none() => take_local(made, new_rank).map(Some),
        Some((1, id)) => {
            let id: &[u8; crate::abi::SYMM_UNIQUE_ID_BYTES] = id
                .try_into()
                .map_err(|_| Error::internal("a split's rank 0 sent a malformed id"))?;
            let id = UniqueId::decode(id)?;
            let joining = Joining {
                backend: parent.clique.backend.clone(),
                device: parent.device,
                bounds: bounds(parent, config),
                timeout: parent.clique.timeout,
                join_timeout: parent.clique.timeout,
            };
            super::join(members.len(), &id, new_rank, joining).map(Some)
        }
        Some((0, message)) => Err(Error::new(
            symmResult_t::symmRemoteError,
            format!(
                "rank {}: rank {} (the new communicator's rank 0) could not make it: {}",
                parent.rank,
                members[0],
                String::from_utf8_lossy(message)
            ),
        )),
        _ => Err(Error::internal("a split's rank 0 sent a malformed outcome")),
    }
}

/// One rank's contribution to a split's first exchange.
enum Part {
    /// Its arguments.
    Called {
        color: i32,
        key: i32,
        config: Config,
    },
    /// Why its call was refused.
    Refused(String),
}

/// The bytes of this rank's [`Part`]: 1, color, key, fewest and most blocks (0: unset); or 0
/// and the refusal's message.
fn encode_part(request: &Request) -> Vec<u8> {
    match request {
        Ok((color, key, config)) => {
            let mut out = vec![1];
            for word in [
                *color as u32,
                *key as u32,
                config.min_blocks.unwrap_or(0),
                config.max_blocks.unwrap_or(0),
            ] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out
        }
        Err(e) => [&[0u8][..], e.message.as_bytes()].concat(),
    }
}

fn decode_part(rank: usize, bytes: &[u8]) -> Result<Part> {
    let malformed = || Error::internal(format!("rank {rank} sent a malformed split contribution"));
    match bytes.split_first() {
        Some((1, words)) if words.len() == 16 => {
            let word =
                |i: usize| u32::from_le_bytes(words[4 * i..4 * i + 4].try_into().expect("4 bytes"));
            let blocks = |w: u32| (w != 0).then_some(w);
            Ok(Part::Called {
                color: word(0) as i32,
                key: word(1) as i32,
                config: Config {
                    min_blocks: blocks(word(2)),
                    max_blocks: blocks(word(3)),
                },
            })
        }
        Some((0, message)) => Ok(Part::Refused(String::from_utf8_lossy(message).into_owned())),
        _ => Err(malformed()),
    }
}

/// Refuse a color that is neither non-negative nor [`SYMM_SPLIT_NOCOLOR`].
pub fn check_color(color: i32) -> Result<()> {
    if color < 0 && color != SYMM_SPLIT_NOCOLOR {
        return Err(Error::invalid_argument(format!(
            "color = {color}: must be non-negative, or SYMM_SPLIT_NOCOLOR"
        )));
    }
    Ok(())
}

/// The block bounds of a new communicator of `parent`'s ranks: `config`'s, else the parent's
/// (an inherited bound gives way to the other, set one).
pub(super) fn bounds(parent: &Comm, config: Config) -> (u32, u32) {
    match (config.min_blocks, config.max_blocks) {
        (Some(min), Some(max)) => (min, max),
        (Some(min), None) => (min, parent.clique.max_blocks.max(min)),
        (None, Some(max)) => (parent.clique.min_blocks.min(max), max),
        (None, None) => (parent.clique.min_blocks, parent.clique.max_blocks),
    }
}

/// What rank 0 of a new communicator hands its members: in a clique of this process, the
/// handles of every member's new rank (and the ranks, to free if nobody takes them); else a
/// unique id whose root runs in this process.
pub(super) fn make(
    parent: &Arc<Comm>,
    members: &[usize],
    config: Config,
) -> Result<(Vec<u8>, Vec<Arc<Comm>>)> {
    if parent.link.is_none() {
        let comms = build_local(parent, members, config)?;
        let handles = comms
            .iter()
            .flat_map(|c| (c.handle() as usize as u64).to_le_bytes())
            .collect();
        return Ok((handles, comms));
    }
    let id = new_root(parent.link.as_ref())?;
    Ok((id.encode().to_vec(), Vec::new()))
}

/// A new bootstrap root in this process for a communicator made from one whose rank's link is
/// `link` (kept while its ranks need it), and its id.
pub(crate) fn new_root(link: Option<&RankLink>) -> Result<UniqueId> {
    let listen = match crate::config::socket_address() {
        // Its address, on a port of its own (a port set there is the parent root's).
        Some(_) => std::net::SocketAddr::new(bootstrap::listen_address_from_env()?.ip(), 0),
        // Where this rank reaches the parent's root from: an interface every member's machine
        // reaches too.
        _ => {
            let ip = link
                .and_then(|link| link.local_ip())
                .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
            std::net::SocketAddr::new(ip, 0)
        }
    };
    let secret = bootstrap::random_secret()?;
    let root = bootstrap::start_root(listen, secret, ROOT_JOIN_TIMEOUT)?;
    let id = UniqueId::new(root.address(), secret);
    keep_root(root);
    Ok(id)
}

/// Every member's rank of a new communicator of ranks of this process: a clique of their
/// devices on the parent's backend, as `symmCommInitAll` makes.
fn build_local(parent: &Comm, members: &[usize], config: Config) -> Result<Vec<Arc<Comm>>> {
    let clique = &parent.clique;
    let devices: Vec<i32> = members.iter().map(|&r| clique.devices[r]).collect();
    let clique = super::new_local_clique(
        clique.backend.clone(),
        &devices,
        bounds(parent, config),
        clique.host_mode,
        clique.timeout,
    )?;
    let mut comms = Vec::with_capacity(members.len());
    let destroy_all = |comms: Vec<Arc<Comm>>| {
        for comm in comms {
            let _ = super::destroy(&comm);
        }
    };
    for rank in 0..members.len() {
        match super::new_comm(&clique, rank, None, None) {
            Ok(comm) => comms.push(comm),
            Err(e) => {
                destroy_all(comms);
                return Err(e);
            }
        }
    }
    if let Err(e) = super::staging::attach(&comms) {
        destroy_all(comms);
        return Err(e);
    }
    Ok(comms)
}

/// This member's rank from the handles its rank 0 made in this process.
pub(super) fn take_local(made: &[u8], new_rank: usize) -> Result<Arc<Comm>> {
    let handle = made
        .chunks_exact(8)
        .nth(new_rank)
        .ok_or_else(|| Error::internal("a split's rank 0 sent too few handles"))?;
    let handle = u64::from_le_bytes(handle.try_into().expect("8 bytes")) as usize;
    Comm::from_handle(handle as symmComm_t)
}

/// Every rank's `payload` to the all-gather `tag` of `comm`'s communicator, by rank, within
/// the communicator's timeout (through the bootstrap, or this process for a clique whose ranks
/// all run here); `what` names the call in messages.
pub(crate) fn gather(comm: &Comm, what: &str, tag: u64, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
    let timeout = comm.clique.timeout;
    if let Some(link) = &comm.link {
        link.contribute(tag, payload)?;
        return link.gathered(tag, timeout);
    }
    let ranks = (comm.rank, comm.clique.nranks);
    // Every rank of such a clique is made before any of them can split: one that is no
    // longer live was destroyed or aborted.
    let alive = |r: usize| {
        super::clique_comms(&comm.clique)
            .iter()
            .any(|c| c.rank == r)
    };
    comm.clique
        .gatherings
        .gather((what, tag), ranks, payload, timeout, alive)
}

/// All-gathers among the ranks of a clique whose ranks all run in this process.
#[derive(Default)]
pub struct Gatherings {
    open: std::sync::Mutex<HashMap<u64, Gathering>>,
    changed: std::sync::Condvar,
}

struct Gathering {
    parts: Vec<Option<Vec<u8>>>,
    /// The ranks that deposited, also those that withdrew since (for the timeout's message).
    came: Vec<bool>,
    taken: usize,
}

impl Gatherings {
    /// Deposit `rank`'s `payload` to the all-gather `tag` of `nranks` ranks, and wait within
    /// `timeout` for every rank's. A rank that has not come and for which `alive` is `false`
    /// (destroyed or aborted: it never will) ends the wait at once; on either the deposit is
    /// withdrawn and the error names the ranks that did not come.
    pub fn gather(
        &self,
        (what, tag): (&str, u64),
        (rank, nranks): (usize, usize),
        payload: &[u8],
        timeout: Duration,
        alive: impl Fn(usize) -> bool,
    ) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let gathering = open.entry(tag).or_insert_with(|| Gathering {
            parts: vec![None; nranks],
            came: vec![false; nranks],
            taken: 0,
        });
        if gathering.parts.len() != nranks || rank >= nranks || gathering.came[rank] {
            // Ranks that see different participants (a shrink's lists that differ).
            return Err(Error::invalid_usage(format!(
                "rank {rank} of {nranks}: another rank's {what} counts {} ranks or holds this \
                 place: the ranks passed different arguments",
                gathering.parts.len()
            )));
        }
        gathering.parts[rank] = Some(payload.to_vec());
        gathering.came[rank] = true;
        self.changed.notify_all();
        loop {
            let gathering = open
                .get_mut(&tag)
                .ok_or_else(|| Error::internal("an all-gather vanished"))?;
            if gathering.parts.iter().all(Option::is_some) {
                let parts: Vec<Vec<u8>> = gathering.parts.iter().flatten().cloned().collect();
                gathering.taken += 1;
                if gathering.taken == nranks {
                    open.remove(&tag);
                }
                return Ok(parts);
            }
            let missing: Vec<usize> = (0..nranks).filter(|r| !gathering.came[*r]).collect();
            let gone: Vec<usize> = missing.iter().copied().filter(|r| !alive(*r)).collect();
            let now = Instant::now();
            if now >= deadline || !gone.is_empty() {
                gathering.parts[rank] = None;
                if gathering.parts.iter().all(Option::is_none) {
                    open.remove(&tag);
                }
                let message = if gone.is_empty() {
                    format!(
                        "rank {rank}: ranks {missing:?} did not call {what} within {} ms (one \
                         thread driving several ranks calls it for each of them between \
                         symmGroupStart and symmGroupEnd)",
                        timeout.as_millis()
                    )
                } else {
                    format!(
                        "rank {rank}: ranks {gone:?} were destroyed or aborted before their \
                         {what}: it cannot complete"
                    )
                };
                let code = if gone.is_empty() {
                    symmResult_t::symmTimeout
                } else {
                    symmResult_t::symmRemoteError
                };
                return Err(Error::new(code, message));
            }
            // Short slices: a rank destroyed meanwhile wakes no one.
            open = self
                .changed
                .wait_timeout(open, (deadline - now).min(Duration::from_millis(20)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_ordered_by_key_then_parent_rank() {
        // Colors 0 and 1; keys reverse rank 0 and 2, tie between ranks 1 and 3.
        let parts = [(0, 5), (1, 2), (0, 1), (1, 2), (SYMM_SPLIT_NOCOLOR, 0)];
        assert_eq!(members(&parts, 0), Some(vec![2, 0]));
        assert_eq!(members(&parts, 2), Some(vec![2, 0]));
        assert_eq!(members(&parts, 3), Some(vec![1, 3]));
        assert_eq!(members(&parts, 4), None);
    }

    #[test]
    fn a_configuration_is_checked_field_by_field() {
        let good = symmConfig_t {
            size: std::mem::size_of::<symmConfig_t>(),
            magic: SYMM_CONFIG_MAGIC,
            version: 100,
            blocking: SYMM_CONFIG_UNDEF_INT,
            minCTAs: SYMM_CONFIG_UNDEF_INT,
            maxCTAs: 3,
        };
        assert_eq!(Config::from_c(None).unwrap(), Config::default());
        assert_eq!(
            Config::from_c(Some(&good)).unwrap(),
            Config {
                min_blocks: None,
                max_blocks: Some(3)
            }
        );
        for (bad, needle) in [
            (symmConfig_t { size: 8, ..good }, "SYMM_CONFIG_INITIALIZER"),
            (
                symmConfig_t {
                    blocking: 0,
                    ..good
                },
                "blocking",
            ),
            (symmConfig_t { minCTAs: 0, ..good }, "minCTAs = 0"),
            (symmConfig_t { minCTAs: 4, ..good }, "above"),
        ] {
            let e = Config::from_c(Some(&bad)).unwrap_err();
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
        }
    }
}
