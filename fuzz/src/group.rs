//! The end of a group. `symmGroupEnd` of a nested group only closes it; the end of the
//! outermost one completes what the group queued, in named steps: the registrations that
//! complete, the collectives that agree and launch, the result code that follows, the call,
//! then the model's state after it (queued calls released, windows completed or dropped,
//! cliques tainted) and the data checks of what ran.

use crate::check::output_len;
use crate::driver::{INVALID_ARGUMENT, INVALID_USAGE, OK, TIMEOUT, anything};
use crate::harness::Harness;
use crate::model::{Call, Checked, Pending, Snapshot, WINDOW_ALIGNMENT};
use std::collections::HashMap;
use std::ptr::null_mut;
use symm::*;

/// A registration deposited in the group that ends.
struct GroupRegistration {
    clique: usize,
    rank: usize,
    /// The window handle.
    handle: usize,
    /// The model predicts that it completes.
    completes: bool,
}

/// The collectives of a group, by clique: the k-th call of every rank of a clique is one.
type Instances<'a> = Vec<(usize, Vec<&'a Pending>)>;

/// What the model predicts of the group's result, built step by step.
struct Prediction {
    /// The codes of the parts that fail, in the order found: the first is the group's.
    codes: Vec<Vec<symmResult_t>>,
    /// The model does not know the group's result (or what it did).
    uncertain: bool,
}

impl Prediction {
    /// The codes `symmGroupEnd` may return.
    fn expected(&self) -> Vec<symmResult_t> {
        if self.uncertain {
            anything()
        } else {
            self.codes.first().cloned().unwrap_or_else(|| vec![OK])
        }
    }
}

/// How the ranks' calls of one collective instance relate.
struct Agreement {
    /// Same kind, type, count (and operator, but for an all-gather).
    agree: bool,
    /// Every call was issued as part of a well-formed all-rank call.
    symmetric: bool,
    /// Every window they use is complete, or completes in this group.
    windows_complete: bool,
}

/// What the model predicts of the group's collectives.
struct Launches {
    /// The calls of some collective disagree: the library refuses the group.
    mismatch: bool,
    /// Cliques with a collective that not every rank called.
    partial_mismatch: Vec<usize>,
    /// The collectives that launch: (clique, every rank called it).
    launches: Vec<(usize, bool)>,
}

/// The one collective a group runs, when the model checks its results.
struct SingleRun {
    clique: usize,
    /// Each rank's part, by rank.
    parts: Vec<(usize, Call, Checked)>,
    /// Their inputs, read before the group ends.
    inputs: Vec<Vec<u8>>,
}

impl Harness {
    /// `symmGroupEnd`: refused outside a group, closes a nested one, completes the outermost.
    pub(crate) fn group_end(&mut self) {
        if self.group_depth == 0 {
            self.expect("symmGroupEnd", &[INVALID_USAGE], null_mut(), || {
                symmGroupEnd()
            });
            return;
        }
        if self.group_depth > 1 {
            self.expect("symmGroupEnd", &[OK], null_mut(), || symmGroupEnd());
            self.group_depth -= 1;
            return;
        }
        self.end_outermost_group();
    }

    /// The end of the outermost group: predict, call, settle the model, check the data.
    fn end_outermost_group(&mut self) {
        self.group_depth = 0;
        let pending = std::mem::take(&mut self.pending);
        let group_unsure = self.taint_unsure_cliques();
        let mut prediction = Prediction {
            codes: Vec::new(),
            uncertain: group_unsure,
        };
        let registered = self.predict_registrations(&pending, &mut prediction);
        let instances = collective_instances(&pending);
        let launches = self.predict_collectives(&instances, &registered, &mut prediction);
        let single = self.single_run(&instances, &launches, prediction.uncertain);
        let before = self.snapshot();
        let (result, uncertain) = self.call_group_end(&pending, &prediction);

        self.release_queued(&pending);
        self.settle_registrations(registered, uncertain);
        let touched: Vec<usize> = instances.iter().map(|(c, _)| *c).collect();
        if group_unsure
            || (launches.mismatch && !launches.partial_mismatch.is_empty())
            || uncertain
            || result == TIMEOUT
            || result != OK && !launches.mismatch
        {
            for c in &touched {
                self.cliques[*c].tainted = true;
            }
        }
        if launches.mismatch || result != OK {
            // Nothing launched (mismatch) or nothing the model can check: no byte of any
            // window may have changed when nothing was launched.
            if launches.mismatch && !uncertain {
                self.check_unchanged(usize::MAX, &[], &before);
            }
            return;
        }
        match single {
            Some(run) => self.check_results(run.clique, &run.parts, &run.inputs, &before),
            None => self.check_outside_outputs(&instances, &touched, &before),
        }
    }

    /// Taint the cliques whose calls in this group the model does not follow; `true` when
    /// there are any (the group's end is uncertain).
    fn taint_unsure_cliques(&mut self) -> bool {
        let unsure = std::mem::take(&mut self.group_unsure);
        let group_unsure = !unsure.is_empty();
        for c in unsure {
            self.cliques[c].tainted = true;
        }
        group_unsure
    }

    /// Registrations: the k-th of every rank of a clique is one; it completes when every
    /// rank deposited its k-th in this group, with the same size.
    fn predict_registrations(
        &self,
        pending: &[Pending],
        prediction: &mut Prediction,
    ) -> Vec<GroupRegistration> {
        let mut registered = Vec::new();
        for p in pending {
            let Pending::Register {
                clique,
                rank,
                handle,
                seq,
                size,
                ..
            } = *p
            else {
                continue;
            };
            let cl = &self.cliques[clique];
            if cl.tainted {
                prediction.uncertain = true;
                registered.push(GroupRegistration {
                    clique,
                    rank,
                    handle,
                    completes: false,
                });
                continue;
            }
            let deposits: Vec<(u64, u64)> = pending
                .iter()
                .filter_map(|q| match *q {
                    Pending::Register {
                        clique: qc,
                        seq: qs,
                        size: qsize,
                        base: qbase,
                        ..
                    } if qc == clique && qs == seq => Some((qsize, qbase)),
                    _ => None,
                })
                .collect();
            let code = if deposits.len() < cl.nranks() || !cl.all_alive() {
                if cl.linked {
                    prediction.uncertain = true;
                    vec![TIMEOUT, symmResult_t::symmRemoteError]
                } else {
                    vec![TIMEOUT]
                }
            } else if deposits.iter().any(|(s, _)| *s != size)
                || deposits
                    .iter()
                    .any(|(_, b)| !b.is_multiple_of(WINDOW_ALIGNMENT))
            {
                // Sizes that differ, or a base that is not 16-byte aligned on some rank.
                if cl.linked {
                    prediction.uncertain = true;
                }
                vec![INVALID_ARGUMENT]
            } else {
                vec![OK]
            };
            registered.push(GroupRegistration {
                clique,
                rank,
                handle,
                completes: code == [OK],
            });
            if code != [OK] {
                prediction.codes.push(code);
            }
        }
        registered
    }

    /// Which of the group's collectives launch, which disagree, and the codes that follow.
    fn predict_collectives(
        &self,
        instances: &Instances,
        registered: &[GroupRegistration],
        prediction: &mut Prediction,
    ) -> Launches {
        let mut mismatch = false;
        let mut partial_mismatch: Vec<usize> = Vec::new();
        let mut launches: Vec<(usize, bool)> = Vec::new(); // (clique, certain success)
        for (clique, parts) in instances {
            let cl = &self.cliques[*clique];
            let Agreement {
                agree,
                symmetric,
                windows_complete,
            } = self.agreement(*clique, parts, registered);
            if cl.tainted || !symmetric {
                prediction.uncertain = true;
                continue;
            }
            let full = parts.len() == cl.nranks() && cl.all_alive();
            if !full {
                // If the group is refused (a mismatch), its calls count as refused on these
                // ranks only: out of step.
                partial_mismatch.push(*clique);
            }
            if !agree {
                mismatch = true;
                continue;
            }
            if !windows_complete {
                prediction.uncertain = true;
                continue;
            }
            launches.push((*clique, full));
        }
        if mismatch {
            prediction.codes.push(vec![INVALID_USAGE]);
        } else {
            for (_, full) in &launches {
                if !full {
                    prediction.codes.push(vec![TIMEOUT]);
                }
            }
        }
        Launches {
            mismatch,
            partial_mismatch,
            launches,
        }
    }

    /// How the `parts` (the ranks' calls) of one collective of `clique` relate.
    fn agreement(
        &self,
        clique: usize,
        parts: &[&Pending],
        registered: &[GroupRegistration],
    ) -> Agreement {
        let cl = &self.cliques[clique];
        let mut agree = true;
        let mut symmetric = true;
        let mut windows_complete = true;
        let first = match parts[0] {
            Pending::Collective { call, .. } => *call,
            _ => unreachable!(),
        };
        for p in parts {
            let Pending::Collective {
                call,
                checked,
                symmetric: s,
                rank,
                ..
            } = p
            else {
                unreachable!()
            };
            symmetric &= *s;
            agree &= call.kind == first.kind
                && call.dtype == first.dtype
                && call.count == first.count
                && (call.kind == 1 || call.op == first.op);
            for seq in [checked.send_seq, checked.recv_seq] {
                let complete_now = cl.ranks[*rank]
                    .as_ref()
                    .and_then(|r| r.windows.iter().find(|w| w.seq == seq))
                    .is_some_and(|w| {
                        w.complete
                            || registered.iter().any(|g| {
                                g.clique == clique
                                    && g.rank == *rank
                                    && g.handle == w.handle
                                    && g.completes
                            })
                    });
                windows_complete &= complete_now;
            }
        }
        Agreement {
            agree,
            symmetric,
            windows_complete,
        }
    }

    /// The one collective the group runs, with its inputs read now, when the model is sure
    /// it runs alone and completes (else `None`).
    fn single_run(
        &self,
        instances: &Instances,
        launches: &Launches,
        uncertain: bool,
    ) -> Option<SingleRun> {
        let single = !uncertain
            && !launches.mismatch
            && instances.len() == 1
            && launches.launches.len() == 1
            && launches.launches[0].1;
        if !single {
            return None;
        }
        let mut parts: Vec<(usize, Call, Checked)> = instances[0]
            .1
            .iter()
            .map(|p| match p {
                Pending::Collective {
                    rank,
                    call,
                    checked,
                    ..
                } => (*rank, *call, *checked),
                _ => unreachable!(),
            })
            .collect();
        parts.sort_by_key(|p| p.0);
        let inputs = self.read_inputs(&parts, instances[0].0);
        Some(SingleRun {
            clique: instances[0].0,
            parts,
            inputs,
        })
    }

    /// `symmGroupEnd`, expecting the prediction; on a communicator with the short bound, a
    /// well-formed group may time out too. Returns the result, and whether the model is now
    /// uncertain of what the group did.
    fn call_group_end(&self, pending: &[Pending], prediction: &Prediction) -> (symmResult_t, bool) {
        let fast = pending.iter().any(|p| {
            let (Pending::Register { clique, .. } | Pending::Collective { clique, .. }) = *p;
            !self.cliques[clique].patient
        });
        let mut expected = prediction.expected();
        if fast && !expected.contains(&TIMEOUT) {
            expected.push(TIMEOUT);
        }
        let result = self.expect("symmGroupEnd", &expected, null_mut(), || symmGroupEnd());
        let uncertain = prediction.uncertain
            || (fast
                && result == TIMEOUT
                && !prediction.codes.iter().any(|c| c.contains(&TIMEOUT)));
        (result, uncertain)
    }

    /// Every call the group queued is no longer queued on its rank.
    fn release_queued(&mut self, pending: &[Pending]) {
        for p in pending {
            let (Pending::Register { clique, rank, .. } | Pending::Collective { clique, rank, .. }) =
                *p;
            if let Some(r) = self.cliques[clique].ranks[rank].as_mut() {
                r.queued = r.queued.saturating_sub(1);
            }
        }
    }

    /// Each registration of the group completed (its window is complete) or failed (its
    /// window is gone; through the bootstrap, that taints the clique). Where the model is
    /// `uncertain` or the clique tainted, the library is asked.
    fn settle_registrations(&mut self, registered: Vec<GroupRegistration>, uncertain: bool) {
        for GroupRegistration {
            clique,
            rank,
            handle,
            completes,
        } in registered
        {
            let tainted = self.cliques[clique].tainted || uncertain;
            let complete = if tainted {
                self.window_is_complete((clique, rank), handle)
            } else {
                completes
            };
            let Some(r) = self.cliques[clique].ranks[rank].as_mut() else {
                continue;
            };
            if complete {
                if let Some(w) = r.windows.iter_mut().find(|w| w.handle == handle) {
                    w.complete = true;
                }
            } else {
                r.windows.retain(|w| w.handle != handle);
                if self.cliques[clique].linked {
                    self.cliques[clique].tainted = true;
                }
            }
        }
    }

    /// Several collectives ran: only what none of them writes must be unchanged (checked
    /// when they all ran on one clique, the `touched` one).
    fn check_outside_outputs(&self, instances: &Instances, touched: &[usize], before: &Snapshot) {
        let mut outputs = Vec::new();
        for (_, parts) in instances {
            for p in parts {
                if let Pending::Collective {
                    rank,
                    call,
                    checked,
                    ..
                } = p
                {
                    outputs.push((*rank, call.recv, output_len(call, checked)));
                }
            }
        }
        if touched.windows(2).all(|w| w[0] == w[1]) {
            let c = touched.first().copied().unwrap_or(usize::MAX);
            self.check_unchanged(c, &outputs, before);
        }
    }
}

/// The collectives of `pending`: the k-th call of every rank of a clique is one instance.
fn collective_instances(pending: &[Pending]) -> Instances<'_> {
    let mut instances: Instances = Vec::new();
    let mut calls_of: HashMap<(usize, usize), usize> = Default::default();
    let mut index_of: HashMap<(usize, usize), usize> = Default::default();
    for p in pending {
        let Pending::Collective { clique, rank, .. } = *p else {
            continue;
        };
        let k = calls_of.entry((clique, rank)).or_insert(0);
        let key = (clique, *k);
        *k += 1;
        let i = *index_of.entry(key).or_insert_with(|| {
            instances.push((clique, Vec::new()));
            instances.len() - 1
        });
        instances[i].1.push(p);
    }
    instances
}
