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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The numbers of shrinks' exchanges: in-process all-gathers `SHRINK_TAG | 2n` and
/// `SHRINK_TAG | 2n + 1`, descriptor messages `SHRINK_TAG | n` (window registrations use small
/// numbers, splits `1 << 61`).
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

/// `symmCommShrink` on `parent`, whose rank must survive: this rank of the new communicator.
/// Outside a group the caller refuses it while calls of `parent` are queued in an open group
/// (a group's end runs its queued shrinks through here).
pub fn shrink(
    parent: &Arc<Comm>,
    exclude: &[i32],
    config: Config,
    flags: i32,
) -> Result<Arc<Comm>> {
    check_flags(flags)?;
    let survivors = survivors(parent.clique.nranks, exclude)?;
    let Some(new_rank) = survivors.iter().position(|&r| r == parent.rank) else {
        return Err(Error::invalid_argument(format!(
            "excludeRanksList holds this rank ({}): only the ranks that remain call \
             symmCommShrink",
            parent.rank
        )));
    };
    super::refuse_if_finalized(parent, "symmCommShrink")?;
    if flags == SYMM_SHRINK_ABORT {
        let cause = format!(
            "rank {} shrank the communicator with SYMM_SHRINK_ABORT (excluding ranks \
             {exclude:?}): its work was aborted and its collectives are refused",
            parent.rank
        );
        super::revoke_with(parent, cause, "symmCommShrink")?;
    }
    let _call = parent.enter_call("symmCommShrink")?;
    let n = parent.shrinks.fetch_add(1, Ordering::AcqRel);
    let mut sorted = exclude.to_vec();
    sorted.sort_unstable();
    let list: Vec<u8> = sorted.iter().flat_map(|r| r.to_le_bytes()).collect();
    let made = match &parent.link {
        None => local(parent, &survivors, new_rank, n, &list, config)?,
        Some(_) => linked(parent, &survivors, new_rank, n, &list, config)?,
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
    n: u64,
    list: &[u8],
    config: Config,
) -> Result<Arc<Comm>> {
    let clique = &parent.clique;
    let ranks = (new_rank, survivors.len());
    let alive = |i: usize| {
        super::clique_comms(clique)
            .iter()
            .any(|c| c.rank == survivors[i])
    };
    let lists =
        clique
            .gatherings
            .gather(SHRINK_TAG | (2 * n), ranks, list, clique.timeout, alive)?;
    check_lists(parent.rank, survivors, &lists)?;
    let made = (new_rank == 0).then(|| split::make(parent, survivors, config));
    let outcome = match &made {
        None => Vec::new(),
        Some(Ok((handles, _))) => [&[1u8][..], handles].concat(),
        Some(Err(e)) => [&[0u8][..], e.message.as_bytes()].concat(),
    };
    let outcomes = match clique.gatherings.gather(
        SHRINK_TAG | (2 * n + 1),
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
    n: u64,
    list: &[u8],
    config: Config,
) -> Result<Arc<Comm>> {
    let link = parent.link.as_ref().expect("a linked rank");
    let timeout = parent.clique.timeout;
    let deadline = Instant::now() + timeout;
    let first = survivors[0];
    let key = (link.id.encode(), n);
    let seq = SHRINK_TAG | n;
    let id = if new_rank == 0 {
        let (id, _) = split::make(parent, survivors, config)?;
        let local = survivors[1..].iter().filter(|&&r| link.is_local(r)).count();
        if local > 0 {
            LOCAL_IDS.publish(key, id.clone(), local);
        }
        for &r in &survivors[1..] {
            if !link.is_local(r) {
                if link.peers[r].node != link.peers[parent.rank].node {
                    return Err(Error::unsupported(format!(
                        "symmCommShrink: rank {r} runs on another machine; a shrink hands the \
                         new root's id over on this machine only"
                    )));
                }
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
    let (allocations, shared) = {
        let mut state = parent.lock();
        (
            std::mem::take(&mut state.allocations),
            std::mem::take(&mut state.shared),
        )
    };
    let mut state = made.lock();
    state.allocations.extend(allocations);
    state.shared.extend(shared);
}

/// A shrink of a communicator: the parent's unique id and the shrink's number.
type ShrinkKey = ([u8; crate::abi::SYMM_UNIQUE_ID_BYTES], u64);

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
    fn publish(
        &self,
        key: ([u8; crate::abi::SYMM_UNIQUE_ID_BYTES], u64),
        id: Vec<u8>,
        takers: usize,
    ) {
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
