//! The scale model: a host-only simulation of the all-gather and reduce-scatter schedules at
//! rank counts far beyond one machine, and the cost model's predictions for them.
//!
//! **What is proven.** For PAT the schedule is the one the kernels run: the transfers come from
//! `symm_device::symmetric::pat` (the functions the kernels call), and the reduce-scatter
//! partials are formed with the kernels' rule ([`pat::reduce_scatter_receives`], inbox slots
//! from [`pat::inbox_slot`]). The simulation checks, chunk by chunk, that
//!
//! * all-gather: every rank ends with every segment, receives each exactly once, and a sender
//!   only forwards a segment it received at an earlier step (the kernel waits for the data
//!   flags of every earlier step before it sends);
//! * reduce-scatter: every rank's result contains every rank's contribution exactly once; a
//!   partial is sent only once, after every child's partial it combines has landed; every inbox
//!   slot is written once per round before it is read, and read exactly once;
//! * both: what a sender sends at a step is what its receiver expects at that step (the two
//!   sides are computed separately by the kernels).
//!
//! The check has two forms. [`prove_pat_all_gather_every_rank`] and
//! [`prove_pat_reduce_scatter_every_rank`] simulate every rank's buffers (quadratic: used up to
//! a few hundred ranks). [`prove_pat_all_gather`] and [`prove_pat_reduce_scatter`] first check
//! that every rank's schedule is rank 0's rotated by its rank number (every step, every rank, and
//! both sides of every transfer), so that every rank's state is rank 0's rotated, and then
//! simulate rank 0 chunk by chunk: linear per step, used for every count from 1 to 4096. The
//! direct kernels (one-shot stores for all-gather, loads for reduce-scatter) are simulated for
//! every rank ([`prove_direct_all_gather`], [`prove_direct_reduce_scatter`]).
//!
//! **What is predicted.** Steps, bytes each rank sends, and the time `crate::plan::GPU_MODEL`
//! predicts with its best block count (up to 64), for every algorithm. The kernels themselves
//! run up to `MAX_RANKS` (64) ranks; beyond that the numbers are the model's extrapolation.
//! `symm-perf scale-model` renders them as a table and a plot in `bench/`.

use symm_device::symmetric::pat::{self, Transfer};

/// What a proof established about a schedule on `n` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proof {
    /// Ranks.
    pub n: u32,
    /// Steps (dependent rounds of communication).
    pub steps: u32,
    /// Distinct peers each rank sends to.
    pub peers_per_rank: u32,
    /// Segments (or partials) each rank sends to other ranks.
    pub segments_per_rank: u64,
}

/// A PAT schedule as the proofs see it: the kernels' functions ([`KERNEL_SCHEDULE`]), or a
/// variant (the tests check that the proofs reject broken ones). Crate-private, as are the
/// table's constants, so that the C header stays free of them.
#[derive(Clone, Copy)]
pub(crate) struct PatSchedule {
    /// Steps for `n` ranks.
    pub steps: fn(u32) -> u32,
    /// All-gather: what `(n, rank, step)` sends.
    pub gather_send: fn(u32, u32, u32) -> Transfer,
    /// All-gather: what `(n, rank, step)` receives.
    pub gather_receive: fn(u32, u32, u32) -> Transfer,
    /// Reduce-scatter: what `(n, rank, step)` sends.
    pub scatter_send: fn(u32, u32, u32) -> Transfer,
    /// Reduce-scatter: what `(n, rank, step)` receives.
    pub scatter_receive: fn(u32, u32, u32) -> Transfer,
    /// Reduce-scatter: whether the partial at `(n, offset)` takes a child at `step`.
    pub scatter_receives: fn(u32, u32, u32) -> bool,
    /// Reduce-scatter: inbox slot of `(step, offset)`.
    pub inbox_slot: fn(u32, u32) -> u32,
}

/// The schedule the kernels run.
pub(crate) const KERNEL_SCHEDULE: PatSchedule = PatSchedule {
    steps: pat::steps,
    gather_send: pat::all_gather_send,
    gather_receive: pat::all_gather_receive,
    scatter_send: pat::reduce_scatter_send,
    scatter_receive: pat::reduce_scatter_receive,
    scatter_receives: pat::reduce_scatter_receives,
    inbox_slot: pat::inbox_slot,
};

fn rotate(t: Transfer, by: u32, n: u32) -> Transfer {
    let add = |x: u32| ((x as u64 + by as u64) % n as u64) as u32;
    Transfer {
        peer: add(t.peer),
        first: add(t.first),
        segments: t.segments,
    }
}

fn segment_of(t: &Transfer, j: u32, n: u32) -> u32 {
    ((t.first as u64 + j as u64) % n as u64) as u32
}

/// Every rank's schedule of one PAT collective (`send` / `receive`: the schedule's functions of
/// `(n, rank, step)`) is rank 0's rotated, and every send matches its receiver's receive.
fn check_symmetry(
    steps: fn(u32) -> u32,
    send_of: fn(u32, u32, u32) -> Transfer,
    receive_of: fn(u32, u32, u32) -> Transfer,
    n: u32,
) -> Result<(), String> {
    for k in 0..steps(n) {
        let zero = send_of(n, 0, k);
        for rank in 0..n {
            let send = send_of(n, rank, k);
            if send != rotate(zero, rank, n) {
                return Err(format!(
                    "n {n} step {k}: rank {rank} sends {send:?}, not rank 0's rotated"
                ));
            }
            let receive = receive_of(n, send.peer, k);
            if receive.peer != rank || receive.first != send.first {
                return Err(format!(
                    "n {n} step {k}: rank {rank} sends {send:?} but rank {} expects {receive:?}",
                    send.peer
                ));
            }
            if receive.segments != send.segments || send.peer == rank {
                return Err(format!(
                    "n {n} step {k}: rank {rank}: bad transfer {send:?}"
                ));
            }
        }
    }
    Ok(())
}

/// PAT all-gather on `n` ranks (any `n >= 1`): the symmetry check, then rank 0's buffer chunk
/// by chunk. Linear per step after the symmetry check.
pub fn prove_pat_all_gather(n: u32) -> Result<Proof, String> {
    prove_all_gather_schedule(&KERNEL_SCHEDULE, n)
}

/// [`prove_pat_all_gather`] for schedule `s`.
pub(crate) fn prove_all_gather_schedule(s: &PatSchedule, n: u32) -> Result<Proof, String> {
    check_symmetry(s.steps, s.gather_send, s.gather_receive, n)?;
    // Step at which rank 0 got each segment (0 for its own: "before step 0" is 0, steps are
    // numbered from 1 here).
    let mut arrived: Vec<Option<u32>> = vec![None; n as usize];
    arrived[0] = Some(0);
    let mut sent = 0u64;
    for k in 0..(s.steps)(n) {
        let receive = (s.gather_receive)(n, 0, k);
        for j in 0..receive.segments {
            let segment = segment_of(&receive, j, n);
            // The sender holds segment `segment` exactly when rank 0 holds segment
            // `segment - sender` (rotation); it must have had it before this step.
            let at_sender = (segment + n - receive.peer) % n;
            match arrived[at_sender as usize] {
                Some(step) if step <= k => {}
                _ => {
                    return Err(format!(
                        "n {n} step {k}: rank {} forwards segment {segment} before it has it",
                        receive.peer
                    ));
                }
            }
            if arrived[segment as usize].is_some() {
                return Err(format!("n {n} step {k}: segment {segment} received twice"));
            }
            arrived[segment as usize] = Some(k + 1);
        }
        sent += (s.gather_send)(n, 0, k).segments as u64;
    }
    if let Some(missing) = arrived.iter().position(Option::is_none) {
        return Err(format!("n {n}: segment {missing} never arrives"));
    }
    Ok(Proof {
        n,
        steps: (s.steps)(n),
        peers_per_rank: distinct_peers(s, n, |k| (s.gather_send)(n, 0, k).peer),
        segments_per_rank: sent,
    })
}

fn distinct_peers(s: &PatSchedule, n: u32, peer: impl Fn(u32) -> u32) -> u32 {
    let mut peers: Vec<u32> = (0..(s.steps)(n)).map(peer).collect();
    peers.sort_unstable();
    peers.dedup();
    peers.len() as u32
}

/// PAT all-gather on `n` ranks, every rank's receive buffer simulated (quadratic).
pub fn prove_pat_all_gather_every_rank(n: u32) -> Result<(), String> {
    prove_all_gather_schedule_every_rank(&KERNEL_SCHEDULE, n)
}

/// [`prove_pat_all_gather_every_rank`] for schedule `s`.
pub(crate) fn prove_all_gather_schedule_every_rank(s: &PatSchedule, n: u32) -> Result<(), String> {
    let size = n as usize;
    // arrived[rank][segment]: the step after which `rank` holds `segment` (0: its own).
    let mut arrived: Vec<Vec<Option<u32>>> = (0..size)
        .map(|rank| {
            let mut row = vec![None; size];
            row[rank] = Some(0);
            row
        })
        .collect();
    for k in 0..(s.steps)(n) {
        for rank in 0..n {
            let send = (s.gather_send)(n, rank, k);
            let receive = (s.gather_receive)(n, send.peer, k);
            if receive.peer != rank || receive.first != send.first {
                return Err(format!(
                    "n {n} step {k}: rank {rank} and its receiver disagree"
                ));
            }
            for j in 0..send.segments {
                let segment = segment_of(&send, j, n) as usize;
                if !matches!(arrived[rank as usize][segment], Some(step) if step <= k) {
                    return Err(format!(
                        "n {n} step {k}: rank {rank} sends segment {segment} before it has it"
                    ));
                }
                let slot = &mut arrived[send.peer as usize][segment];
                if slot.is_some() {
                    return Err(format!(
                        "n {n} step {k}: rank {} receives segment {segment} twice",
                        send.peer
                    ));
                }
                *slot = Some(k + 1);
            }
        }
    }
    for (rank, row) in arrived.iter().enumerate() {
        if let Some(missing) = row.iter().position(Option::is_none) {
            return Err(format!("n {n}: rank {rank} never gets segment {missing}"));
        }
    }
    Ok(())
}

/// One rank's reduce-scatter state in the simulation: contributor lists of its partials (by
/// offset), its inbox, and which partials it has sent.
struct ScatterRank {
    /// Contributors of the partial sent for each offset (`None`: not sent yet).
    sent: Vec<Option<Vec<u32>>>,
    /// Inbox slots: contributors of the partial that landed there, and whether it was read.
    inbox: Vec<Option<(Vec<u32>, bool)>>,
}

impl ScatterRank {
    fn new(n: u32) -> Self {
        ScatterRank {
            sent: vec![None; n as usize],
            inbox: vec![None; n.saturating_sub(1) as usize],
        }
    }

    /// The partial at `offset` as the kernel forms it before sending it at `step` (or, for
    /// offset 0 after the last step, `step` = 0 and every child): own contribution `me`, then
    /// the children of the steps above `from_step` that the offset receives at, each read once
    /// from a slot written before.
    fn form(
        &mut self,
        s: &PatSchedule,
        n: u32,
        me: u32,
        offset: u32,
        from_step: u32,
        what: &str,
    ) -> Result<Vec<u32>, String> {
        let mut contributors = vec![me];
        for k in (from_step..(s.steps)(n)).rev() {
            if !(s.scatter_receives)(n, offset, k) {
                continue;
            }
            let slot = (s.inbox_slot)(k, offset) as usize;
            match self.inbox.get_mut(slot) {
                Some(Some((list, read))) if !*read => {
                    *read = true;
                    contributors.extend_from_slice(list);
                }
                Some(Some(_)) => {
                    return Err(format!("{what}: slot {slot} read twice"));
                }
                _ => {
                    return Err(format!("{what}: slot {slot} read before it was written"));
                }
            }
        }
        Ok(contributors)
    }

    fn land(&mut self, slot: u32, contributors: Vec<u32>, what: &str) -> Result<(), String> {
        match self.inbox.get_mut(slot as usize) {
            Some(entry @ None) => {
                *entry = Some((contributors, false));
                Ok(())
            }
            Some(Some(_)) => Err(format!("{what}: slot {slot} written twice")),
            None => Err(format!("{what}: slot {slot} outside the inbox")),
        }
    }

    /// The partial this rank sends at `step` for `offset`, formed and recorded once.
    fn send(
        &mut self,
        s: &PatSchedule,
        n: u32,
        me: u32,
        offset: u32,
        step: u32,
        what: &str,
    ) -> Result<(), String> {
        if self.sent[offset as usize].is_some() {
            return Err(format!("{what}: offset {offset} sent twice"));
        }
        let partial = self.form(s, n, me, offset, step + 1, what)?;
        self.sent[offset as usize] = Some(partial);
        Ok(())
    }

    /// The final result: every slot must have been read exactly once, and the result must
    /// hold every rank once.
    fn finish(mut self, s: &PatSchedule, n: u32, me: u32, what: &str) -> Result<(), String> {
        let result = self.form(s, n, me, 0, 0, what)?;
        if let Some(slot) = self
            .inbox
            .iter()
            .position(|entry| !matches!(entry, Some((_, true))))
        {
            return Err(format!("{what}: slot {slot} never written or never read"));
        }
        if let Some(offset) = (1..n).find(|&d| self.sent[d as usize].is_none()) {
            return Err(format!(
                "{what}: the partial at offset {offset} is never sent"
            ));
        }
        let mut seen = vec![false; n as usize];
        for &c in &result {
            if std::mem::replace(&mut seen[c as usize], true) {
                return Err(format!("{what}: rank {c}'s contribution counted twice"));
            }
        }
        if result.len() != n as usize {
            return Err(format!(
                "{what}: {} of {n} contributions in the result",
                result.len()
            ));
        }
        Ok(())
    }
}

/// Offsets a rank sends at reduce-scatter step `k`, and the receiver's inbox slot of each.
fn scatter_sends(s: &PatSchedule, n: u32, k: u32) -> impl Iterator<Item = (u32, u32)> {
    let slot = s.inbox_slot;
    (0..pat::step_segments(n, k)).map(move |j| ((1 << k) + j, slot(k, j)))
}

/// PAT reduce-scatter on `n` ranks (any `n >= 1`): the symmetry check, then rank 0's partials
/// and inbox, contribution by contribution (a child's partial is rank 0's partial at the
/// child's offset, rotated by the child's rank).
pub fn prove_pat_reduce_scatter(n: u32) -> Result<Proof, String> {
    prove_reduce_scatter_schedule(&KERNEL_SCHEDULE, n)
}

/// [`prove_pat_reduce_scatter`] for schedule `s`.
pub(crate) fn prove_reduce_scatter_schedule(s: &PatSchedule, n: u32) -> Result<Proof, String> {
    check_symmetry(s.steps, s.scatter_send, s.scatter_receive, n)?;
    let mut zero = ScatterRank::new(n);
    let mut sent = 0u64;
    for k in (0..(s.steps)(n)).rev() {
        let what = format!("n {n} step {k}");
        for (offset, _) in scatter_sends(s, n, k) {
            zero.send(s, n, 0, offset, k, &what)?;
            sent += 1;
        }
        let receive = (s.scatter_receive)(n, 0, k);
        let child = receive.peer;
        for j in 0..receive.segments {
            let segment = segment_of(&receive, j, n);
            // The child's offset of this segment; its partial is rank 0's partial there,
            // rotated by `child`.
            let child_offset = (segment + n - child) % n;
            let partial = zero.sent[child_offset as usize]
                .as_ref()
                .ok_or_else(|| {
                    format!("{what}: child {child} has not formed offset {child_offset}")
                })?
                .iter()
                .map(|c| (c + child) % n)
                .collect();
            zero.land((s.inbox_slot)(k, j), partial, &what)?;
        }
    }
    zero.finish(s, n, 0, &format!("n {n} result"))?;
    Ok(Proof {
        n,
        steps: (s.steps)(n),
        peers_per_rank: distinct_peers(s, n, |k| (s.scatter_send)(n, 0, k).peer),
        segments_per_rank: sent,
    })
}

/// PAT reduce-scatter on `n` ranks, every rank's partials and inbox simulated.
pub fn prove_pat_reduce_scatter_every_rank(n: u32) -> Result<(), String> {
    prove_reduce_scatter_schedule_every_rank(&KERNEL_SCHEDULE, n)
}

/// [`prove_pat_reduce_scatter_every_rank`] for schedule `s`.
pub(crate) fn prove_reduce_scatter_schedule_every_rank(
    s: &PatSchedule,
    n: u32,
) -> Result<(), String> {
    let mut ranks: Vec<ScatterRank> = (0..n).map(|_| ScatterRank::new(n)).collect();
    for k in (0..(s.steps)(n)).rev() {
        for rank in 0..n {
            let what = format!("n {n} step {k} rank {rank}");
            for (offset, _) in scatter_sends(s, n, k) {
                ranks[rank as usize].send(s, n, rank, offset, k, &what)?;
            }
        }
        for rank in 0..n {
            let what = format!("n {n} step {k} rank {rank}");
            let send = (s.scatter_send)(n, rank, k);
            let receive = (s.scatter_receive)(n, send.peer, k);
            if receive.peer != rank || receive.first != send.first {
                return Err(format!("{what}: sender and receiver disagree"));
            }
            for (offset, slot) in scatter_sends(s, n, k) {
                let partial = ranks[rank as usize].sent[offset as usize]
                    .clone()
                    .unwrap_or_default();
                ranks[send.peer as usize].land(slot, partial, &what)?;
            }
        }
    }
    for (rank, state) in ranks.into_iter().enumerate() {
        state.finish(s, n, rank as u32, &format!("n {n} rank {rank} result"))?;
    }
    Ok(())
}

/// The direct all-gather (every rank stores its segment into every rank, between two barriers),
/// every rank simulated: each rank gets each segment once, from its owner.
pub fn prove_direct_all_gather(n: u32) -> Result<Proof, String> {
    let mut got = vec![0u32; n as usize * n as usize];
    for source in 0..n {
        for target in 0..n {
            got[(target * n + source) as usize] += 1;
        }
    }
    if let Some(i) = got.iter().position(|&c| c != 1) {
        return Err(format!(
            "n {n}: rank {} gets segment {} {} times",
            i as u32 / n,
            i as u32 % n,
            got[i]
        ));
    }
    Ok(Proof {
        n,
        steps: 1,
        peers_per_rank: n.saturating_sub(1),
        segments_per_rank: n.saturating_sub(1) as u64,
    })
}

/// The direct reduce-scatter (rank `r` loads segment `r` from every rank after a barrier),
/// every rank simulated: each result holds every contribution once.
pub fn prove_direct_reduce_scatter(n: u32) -> Result<Proof, String> {
    for target in 0..n {
        let mut seen = vec![0u32; n as usize];
        for source in 0..n {
            seen[source as usize] += 1;
        }
        if let Some(c) = seen.iter().position(|&c| c != 1) {
            return Err(format!("n {n}: rank {target} counts rank {c} wrongly"));
        }
    }
    Ok(Proof {
        n,
        steps: 1,
        peers_per_rank: n.saturating_sub(1),
        segments_per_rank: n.saturating_sub(1) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PAT all-gather and reduce-scatter proven for every rank count from 1 to 4096 (rank 0's
    /// buffers after the symmetry check), and every rank simulated up to 64 ranks (what the
    /// kernels run).
    #[test]
    fn pat_schedules_are_correct_for_1_to_4096_ranks() {
        for n in 1..=4096 {
            let gather = prove_pat_all_gather(n).unwrap();
            let scatter = prove_pat_reduce_scatter(n).unwrap();
            assert_eq!(gather.segments_per_rank, n as u64 - 1);
            assert_eq!(scatter.segments_per_rank, n as u64 - 1);
            assert_eq!(gather.steps, pat::steps(n));
            assert!(gather.peers_per_rank <= gather.steps);
        }
        for n in 1..=64 {
            prove_pat_all_gather_every_rank(n).unwrap();
            prove_pat_reduce_scatter_every_rank(n).unwrap();
            prove_direct_all_gather(n).unwrap();
            prove_direct_reduce_scatter(n).unwrap();
        }
    }

    /// The proofs reject broken schedules: a step that sends one segment too many, a receiver
    /// expecting other segments than its sender sends, a partial formed without one of its
    /// children, and a schedule one step short.
    #[test]
    fn the_proofs_reject_wrong_schedules() {
        fn extra(n: u32, rank: u32, k: u32) -> Transfer {
            let mut t = pat::all_gather_send(n, rank, k);
            if k + 1 == pat::steps(n) {
                t.segments += 1;
            }
            t
        }
        fn shifted(n: u32, rank: u32, k: u32) -> Transfer {
            let mut t = pat::all_gather_receive(n, rank, k);
            t.first = (t.first + 1) % n;
            t
        }
        fn forgets_a_child(n: u32, offset: u32, k: u32) -> bool {
            pat::reduce_scatter_receives(n, offset, k) && !(offset == 1 && k == 2)
        }
        fn one_step_short(n: u32) -> u32 {
            pat::steps(n).saturating_sub(1)
        }
        let broken = [
            PatSchedule {
                gather_send: extra,
                ..KERNEL_SCHEDULE
            },
            PatSchedule {
                gather_receive: shifted,
                ..KERNEL_SCHEDULE
            },
            PatSchedule {
                scatter_receives: forgets_a_child,
                ..KERNEL_SCHEDULE
            },
            PatSchedule {
                steps: one_step_short,
                ..KERNEL_SCHEDULE
            },
        ];
        for (i, s) in broken.iter().enumerate() {
            for n in [6, 8, 13] {
                let gather = prove_all_gather_schedule(s, n).is_err();
                let gather_all = prove_all_gather_schedule_every_rank(s, n).is_err();
                let scatter = prove_reduce_scatter_schedule(s, n).is_err();
                let scatter_all = prove_reduce_scatter_schedule_every_rank(s, n).is_err();
                assert_eq!(gather, gather_all, "schedule {i} n {n}");
                assert_eq!(scatter, scatter_all, "schedule {i} n {n}");
                let expected = match i {
                    0 | 1 => (true, false),
                    2 => (false, true),
                    _ => (true, true),
                };
                assert_eq!((gather, scatter), expected, "schedule {i} n {n}");
            }
        }
    }
}
