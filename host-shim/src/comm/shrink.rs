//! `symmCommShrink`: a new communicator of the ranks of a parent that are not excluded (the
//! survivors of a lost rank), without the parent's bootstrap root, whose process may be the
//! one that was lost.
//!
//! Only the survivors call it, every one with the same exclusion list. New ranks follow the
//! parent's order. The new communicator's rank 0 (the first survivor) makes it:
//! * ranks of one process (`symmCommInitAll`'s): every survivor's rank, in this process, handed
//!   over through the clique's all-gather among the survivors (which first compares their
//!   lists);
//! * ranks joined through the bootstrap: it starts a new root in its own process and hands
//!   the root's id to the other survivors directly: to those of its process in memory, to
//!   those of other processes of this machine over their authenticated descriptor sockets
//!   (the channel window memory travels on). They join it; then they compare their lists over
//!   the new communicator, and every survivor fails if they differ.
//!
//! With [`SYMM_SHRINK_ABORT`] the parent is first revoked (its in-flight work ends on every
//! rank). Either way the parent's `symmMemAlloc` allocations of this rank move to the new
//! communicator: the survivors register the same memory, with its data, on it (and free it
//! there).

use super::split::{self, Config};
use super::{Comm, Joining};
use crate::abi::{SYMM_SHRINK_ABORT, SYMM_SHRINK_DEFAULT, symmResult_t};
use crate::error::{Error, Result};
use crate::transport::bootstrap::UniqueId;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The numbers of shrinks' exchanges ([`exchange_tag`]: this bit, a mix of the list and the
/// shrink's number, and the round; window registrations use small numbers, splits `1 << 61`).
const SHRINK_TAG: u64 = 1 << 60;

/// The all-gather tag of the survivors' lists over the new communicator's bootstrap.
const CHECK_TAG: u64 = (1 << 60) - 1;

/// Refuse flags other than [`SYMM_SHRINK_DEFAULT`] and [`SYMM_SHRINK_ABORT`].
pub fn check_flags(flags: i32) -> Result<()> {
    if flags != SYMM_SHRINK_DEFAULT && flags != SYMM_SHRINK_ABORT {
        return Err(Error::invalid_argument(format!(
            "shrinkFlags = {flags}: must be SYMM_SHRINK_DEFAULT (0) or SYMM_SHRINK_ABORT (1)"
        )));
    }
    Ok(())
}

/// The surviving ranks of `nranks` once `exclude` is taken out (parent ranks, in order), or
/// why the list is refused.
pub fn survivors(nranks: usize, exclude: &[i32]) -> Result<Vec<usize>> {
    let mut excluded = vec![false; nranks];
    for (i, &r) in exclude.iter().enumerate() {
        if r < 0 || r as usize >= nranks {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList[{i}] = {r}: must be in [0, {nranks})"
            )));
        }
        if std::mem::replace(&mut excluded[r as usize], true) {
            return Err(Error::invalid_argument(format!(
                "excludeRanksList[{i}] = {r}: listed twice"
            )));
        }
    }
    let survivors: Vec<usize> = (0..nranks).filter(|&r| !excluded[r]).collect();
    if survivors.is_empty() {
        return Err(Error::invalid_argument(
            "excludeRanksList excludes every rank: nothing is left to shrink to",
        ));
    }
    Ok(survivors)
}

/// A `symmCommShrink` call: its arguments (validated) and its number among this rank's
/// shrinks with the same list ([`take_number`]).
#[derive(Clone, Debug)]
pub struct Request {
    /// The ranks left out.
    pub exclude: Vec<i32>,
    /// Its number.
    pub number: u64,
    /// The new communicator's settings.
    pub config: Config,
    /// `shrinkFlags`.
    pub flags: i32,
}

/// The number of `parent`'s next shrink with `exclude` (the `n`-th of every survivor with one
/// list is one shrink): taken when the call is made, also when it is refused later or queued
/// in a group, so that the survivors' shrinks stay paired. Keyed by the list, so that a rank
/// left out of one shrink does not disturb the numbers of a later one.
pub fn take_number(parent: &Comm, exclude: &[i32]) -> u64 {
    let mut list = exclude.to_vec();
    list.sort_unstable();
    let mut shrinks = parent.shrinks.lock().unwrap_or_else(|e| e.into_inner());
    let next = shrinks.entry(list).or_insert(0);
    *next += 1;
    *next - 1
}

/// The exchange number of `request`'s shrink (round `round`): the list and its number, mixed
/// (survivors that passed different lists use different numbers, and wait for each other
/// in vain rather than meet).
fn exchange_tag(request: &Request, round: u64) -> u64 {
    let mut list = request.exclude.clone();
    list.sort_unstable();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in list
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .chain(request.number.to_le_bytes())
    {
        h = (h ^ byte as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    SHRINK_TAG | ((h & ((1 << 58) - 1)) << 1) | round
}

/// `symmCommShrink` on `parent`, whose rank must survive: this rank of the new communicator.
/// `held`: the caller's group end holds `parent` (it runs its queued shrinks this way);
/// otherwise the caller refused it while calls of `parent` are queued in an open group.
pub fn shrink(parent: &Arc<Comm>, request: &Request, held: bool) -> Result<Arc<Comm>> {
    if parent.span.get().is_some() {
        return Err(super::span::unsupported("symmCommShrink"));
    }
    let exclude = &request.exclude;
    check_flags(request.flags)?;
    let survivors = survivors(parent.clique.nranks, exclude)?;
    let Some(new_rank) = survivors.iter().position(|&r| r == parent.rank) else {
        return Err(Error::invalid_argument(format!(
            "excludeRanksList holds this rank ({}): only the ranks that remain call \
             symmCommShrink",
            parent.rank
        )));
    };
    if let Some(link) = &parent.link {
        // Checked by every survivor before anything, so that none waits for a hand-over that
        // cannot come.
        let own = &link.peers[parent.rank].node;
        if let Some(&r) = survivors.iter().find(|&&r| &link.peers[r].node != own) {
            return Err(Error::unsupported(format!(
                "symmCommShrink: rank {r} runs on another machine than rank {}; a shrink hands \
                 the new root's id over on one machine only",
                parent.rank
            )));
        }
    }
    super::refuse_if_finalized(parent, "symmCommShrink")?;
    if request.flags == SYMM_SHRINK_ABORT {
        let cause = format!(
            "rank {} shrank the communicator with SYMM_SHRINK_ABORT (excluding ranks \
             {exclude:?}): its work was aborted and its collectives are refused",
            parent.rank
        );
        super::revoke_with(parent, cause, ("symmCommShrink", !held))?;
    }
    let _call = if held {
        None
    } else {
        Some(parent.enter_call("symmCommShrink")?)
    };
    let mut sorted = exclude.clone();
    sorted.sort_unstable();
    let list: Vec<u8> = sorted.iter().flat_map(|r| r.to_le_bytes()).collect();
    let made = match &parent.link {
        None => local(parent, &survivors, new_rank, request, &list)?,
        Some(_) => linked(parent, &survivors, new_rank, request, &list)?,
    };
    move_allocations(parent, &made);
    Ok(made)
}

/// The new rank of ranks of one process: an all-gather among the survivors compares their
/// lists, then the first survivor makes every survivor's rank and a second hands them over.
fn local(
    parent: &Arc<Comm>,
    survivors: &[usize],
    new_rank: usize,
    request: &Request,
    list: &[u8],
) -> Result<Arc<Comm>> {
    let config = request.config;
    let clique = &parent.clique;
    let ranks = (new_rank, survivors.len());
    let alive = |i: usize| {
        super::clique_comms(clique)
            .iter()
            .any(|c| c.rank == survivors[i])
    };
    // Each survivor's parent rank and list: slot i must hold survivor i.
    let part = [&(parent.rank as u32).to_le_bytes()[..], list].concat();
    let parts = clique.gatherings.gather(
        ("symmCommShrink", exchange_tag(request, 0)),
        ranks,
        &part,
        clique.timeout,
        alive,
    )?;
    if let Some((i, _)) = parts
        .iter()
        .enumerate()
        .find(|(i, p)| p.get(..4) != Some(&(survivors[*i] as u32).to_le_bytes()[..]))
    {
        return Err(Error::invalid_usage(format!(
            "rank {}: the ranks that remain passed different excludeRanksList (the place of \
             rank {} is taken by another)",
            parent.rank, survivors[i]
        )));
    }
    let lists: Vec<Vec<u8>> = parts.iter().map(|p| p[4..].to_vec()).collect();
    check_lists(parent.rank, survivors, &lists)?;
    let made = (new_rank == 0).then(|| split::make(parent, survivors, config));
    let outcome = match &made {
        None => Vec::new(),
        Some(Ok((handles, _))) => [&[1u8][..], handles].concat(),
        Some(Err(e)) => [&[0u8][..], e.message.as_bytes()].concat(),
    };
    let outcomes = match clique.gatherings.gather(
        ("symmCommShrink", exchange_tag(request, 1)),
        ranks,
        &outcome,
        clique.timeout,
        alive,
    ) {
        Ok(outcomes) => outcomes,
        Err(e) => {
            if let Some(Ok((_, built))) = made {
                for comm in built {
                    let _ = super::destroy(&comm);
                }
            }
            return Err(e);
        }
    };
    if let Some(Err(e)) = made {
        return Err(e);
    }
    match outcomes[0].split_first() {
        Some((1, handles)) => split::take_local(handles, new_rank),
        Some((0, message)) => Err(Error::new(
            symmResult_t::symmRemoteError,
            format!(
                "rank {}: rank {} (the new communicator's rank 0) could not make it: {}",
                parent.rank,
                survivors[0],
                String::from_utf8_lossy(message)
            ),
        )),
        _ => Err(Error::internal(
            "a shrink's rank 0 sent a malformed outcome",
        )),
    }
}

/// The new rank of ranks joined through the bootstrap: the first survivor starts a new root
/// and hands its id over directly; every survivor joins it, then they compare their lists.
fn linked(
    parent: &Arc<Comm>,
    survivors: &[usize],
    new_rank: usize,
    request: &Request,
    list: &[u8],
) -> Result<Arc<Comm>> {
    let config = request.config;
    let link = parent.link.as_ref().expect("a linked rank");
    let timeout = parent.clique.timeout;
    let deadline = Instant::now() + timeout;
    let first = survivors[0];
    let seq = exchange_tag(request, 0);
    let key = (link.id.encode(), *link.session(), seq);
    let id = if new_rank == 0 {
        let (id, _) = split::make(parent, survivors, config)?;
        let local = survivors[1..].iter().filter(|&&r| link.is_local(r)).count();
        if local > 0 {
            LOCAL_IDS.publish(key, id.clone(), local);
        }
        for &r in &survivors[1..] {
            if !link.is_local(r) {
                link.send_bytes(seq, r, &id, timeout).map_err(|e| {
                    Error::new(
                        e.code,
                        format!(
                            "rank {}: handing the new communicator's id to rank {r}: {}",
                            parent.rank, e.message
                        ),
                    )
                })?;
            }
        }
        id
    } else if link.is_local(first) {
        LOCAL_IDS.take(key, deadline).ok_or_else(|| {
            Error::new(
                symmResult_t::symmTimeout,
                format!(
                    "rank {}: rank {first} (the new communicator's rank 0) did not hand its id \
                     over within {} ms",
                    parent.rank,
                    timeout.as_millis()
                ),
            )
        })?
    } else {
        link.receive_bytes(seq, first as u32, deadline)
            .map_err(|e| {
                Error::new(
                    e.code,
                    format!(
                        "rank {}: waiting for the new communicator's id from rank {first} (its \
                         rank 0): {}",
                        parent.rank, e.message
                    ),
                )
            })?
    };
    let id: &[u8; crate::abi::SYMM_UNIQUE_ID_BYTES] = id
        .as_slice()
        .try_into()
        .map_err(|_| Error::internal("a shrink's rank 0 sent a malformed id"))?;
    let id = UniqueId::decode(id)?;
    let joining = Joining {
        backend: parent.clique.backend.clone(),
        device: parent.device,
        bounds: split::bounds(parent, config),
        timeout,
        join_timeout: timeout,
    };
    let made = super::join(survivors.len(), &id, new_rank, joining)?;
    let new_link = made.link.as_ref().expect("a joined rank");
    let lists = new_link
        .contribute(CHECK_TAG, list)
        .and_then(|()| new_link.gathered(CHECK_TAG, timeout));
    if let Err(e) = lists.and_then(|lists| check_lists(parent.rank, survivors, &lists)) {
        let _ = super::destroy(&made);
        return Err(e);
    }
    Ok(made)
}

/// Every survivor passed the same exclusion list, or the error every one of them returns.
fn check_lists(rank: usize, survivors: &[usize], lists: &[Vec<u8>]) -> Result<()> {
    match lists.iter().position(|l| *l != lists[0]) {
        None => Ok(()),
        Some(i) => {
            let show = |bytes: &[u8]| -> Vec<i32> {
                bytes
                    .chunks_exact(4)
                    .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect()
            };
            Err(Error::invalid_usage(format!(
                "rank {rank}: the ranks that remain passed different excludeRanksList: rank {} \
                 excluded {:?}, rank {} excluded {:?}",
                survivors[0],
                show(&lists[0]),
                survivors[i],
                show(&lists[i])
            )))
        }
    }
}

/// Move this rank's allocations from `parent` to `made`, where the survivors register and free
/// them (the parent's windows on them stay until deregistered; its collectives are refused).
fn move_allocations(parent: &Comm, made: &Comm) {
    // The point-to-point window's allocation stays: the parent's window lives on it.
    let kept = super::pairs::allocation(parent);
    let allocations = {
        let mut state = parent.lock();
        let mut allocations = std::mem::take(&mut state.allocations);
        if let Some(allocation) = kept.and_then(|kept| allocations.remove(&kept)) {
            state.allocations.insert(allocation.address, allocation);
        }
        allocations
    };
    for allocation in allocations.values() {
        made.clique.allocations.insert(allocation);
    }
    made.lock().allocations.extend(allocations);
}

/// A shrink of a communicator: the parent's unique id and session (random for every
/// communicator, also one made again with the same `SYMM_COMM_ID`) and the exchange number.
type ShrinkKey = ([u8; crate::abi::SYMM_UNIQUE_ID_BYTES], [u8; 32], u64);

/// New communicators' ids that a shrink's rank 0 hands to the survivors of its own process.
struct LocalIds {
    /// The id, and how many survivors are still to take it.
    ids: Mutex<BTreeMap<ShrinkKey, (Vec<u8>, usize)>>,
    changed: Condvar,
}

static LOCAL_IDS: LocalIds = LocalIds {
    ids: Mutex::new(BTreeMap::new()),
    changed: Condvar::new(),
};

impl LocalIds {
    /// Publish `id` under `key` for `takers` survivors.
    fn publish(&self, key: ShrinkKey, id: Vec<u8>, takers: usize) {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.insert(key, (id, takers));
        self.changed.notify_all();
    }

    /// The id published under `key`, waiting until `deadline`.
    fn take(&self, key: ShrinkKey, deadline: Instant) -> Option<Vec<u8>> {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some((id, takers)) = ids.get_mut(&key) {
                let id = id.clone();
                *takers -= 1;
                if *takers == 0 {
                    ids.remove(&key);
                }
                return Some(id);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            ids = self
                .changed
                .wait_timeout(ids, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survivors_follow_the_parent_order_and_lists_are_checked() {
        assert_eq!(survivors(4, &[2]).unwrap(), [0, 1, 3]);
        assert_eq!(survivors(4, &[0, 3]).unwrap(), [1, 2]);
        assert_eq!(survivors(2, &[]).unwrap(), [0, 1]);
        for (list, needle) in [
            (&[4][..], "excludeRanksList[0] = 4"),
            (&[-1][..], "excludeRanksList[0] = -1"),
            (&[1, 1][..], "listed twice"),
            (&[0, 1][..], "every rank"),
        ] {
            let e = survivors(2, list).unwrap_err();
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
        }
    }

    #[test]
    fn different_lists_are_refused_naming_both() {
        let a: Vec<u8> = [2i32].iter().flat_map(|r| r.to_le_bytes()).collect();
        let b: Vec<u8> = [3i32].iter().flat_map(|r| r.to_le_bytes()).collect();
        assert!(check_lists(0, &[0, 1], &[a.clone(), a.clone()]).is_ok());
        let e = check_lists(0, &[0, 1], &[a, b]).unwrap_err();
        assert!(
            e.message
                .contains("rank 0 excluded [2], rank 1 excluded [3]"),
            "{}",
            e.message
        );
    }
}
