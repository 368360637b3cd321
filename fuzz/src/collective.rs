//! Collectives: the model's validation of one rank's call (where it reads and writes, or a
//! refusal), a single call with arbitrary arguments, and the same collective on every rank of
//! a communicator (symmetric buffers in its windows, with deliberate deviations), queued in a
//! group whose end runs them.

use crate::driver::{INVALID_ARGUMENT, OK, TIMEOUT, anything};
use crate::harness::Harness;
use crate::input::CallSpec;
use crate::model::{Call, Checked, Pending, Win};
use crate::numeric::{self, TYPES};
use crate::select::{count_value, raw_enum};
use std::ffi::c_int;
use std::ptr::null_mut;
use symm::*;

/// The collective every rank of a communicator calls (before each rank's deviations), and
/// where its buffers lie: windows named by registration, offsets in bytes.
struct AllRankShape {
    kind: u8,
    dtype: c_int,
    op: c_int,
    /// Element size (1 for an invalid type).
    es: u64,
    count: usize,
    /// The window of the buffer holding all ranks' shares.
    whole_seq: Option<u64>,
    whole_offset: u64,
    /// The window of the other buffer (`None` in place, or without windows).
    share_seq: Option<u64>,
    share_offset: u64,
    in_place: bool,
}

impl Harness {
    /// The model's validation of one rank's collective call: where it reads and writes, or
    /// `None` when it must fail with `symmInvalidArgument`.
    fn validate(&self, at: (usize, usize), call: &Call) -> Option<Checked> {
        let elem = *TYPES.get(usize::try_from(call.dtype).ok()?)?;
        let reduce = match call.kind {
            1 => None,
            _ => Some(numeric::reduce_op(u8::try_from(call.op).ok()?)?),
        };
        let es = elem.size() as u64;
        let nranks = self.cliques[at.0].nranks() as u64;
        let rank = at.1 as u64;
        let bytes = (call.count as u64).checked_mul(es)?;
        let windows = &self.rank(at).windows;
        let find = |address: u64, len: u64| -> Option<Win> {
            if address == 0 {
                return None;
            }
            let w = *windows.iter().find(|w| {
                address >= w.base
                    && address
                        .checked_add(len)
                        .is_some_and(|e| e <= w.base + w.size)
            })?;
            (address - w.base).is_multiple_of(es).then_some(w)
        };
        let overlap = |a: u64, al: u64, b: u64, bl: u64| a < b + bl && b < a + al;
        let (send_len, recv_len, in_place) = match call.kind {
            0 => {
                call.send.checked_add(bytes)?;
                call.recv.checked_add(bytes)?;
                (bytes, bytes, call.send == call.recv)
            }
            1 => {
                call.send.checked_add(bytes)?;
                let total = bytes.checked_mul(nranks)?;
                call.recv.checked_add(total)?;
                (bytes, total, call.send == call.recv + rank * bytes)
            }
            _ => {
                call.recv.checked_add(bytes)?;
                let total = bytes.checked_mul(nranks)?;
                call.send.checked_add(total)?;
                (total, bytes, call.recv == call.send + rank * bytes)
            }
        };
        let send_window = find(call.send, send_len)?;
        let recv_window = find(call.recv, recv_len)?;
        if !in_place && overlap(call.send, send_len, call.recv, recv_len) {
            return None;
        }
        Some(Checked {
            elem,
            reduce,
            bytes,
            total: bytes * if call.kind == 0 { 1 } else { nranks },
            send_seq: send_window.seq,
            recv_seq: recv_window.seq,
        })
    }

    /// One rank's collective with arbitrary arguments.
    pub(crate) fn single_collective(&mut self, handle: symmComm_t, call: Call) {
        let at = self.locate(handle);
        let checked = at.and_then(|at| self.validate(at, &call));
        let Some(at) = at else {
            self.issue_collective(handle, &call, &[INVALID_ARGUMENT]);
            return;
        };
        let alone = self.cliques[at.0].nranks() == 1;
        let Some(checked) = checked else {
            self.issue_collective(handle, &call, &[INVALID_ARGUMENT]);
            // A refused call is still the rank's call: its peers are out of step with it
            // (outside a group), or the group is refused at its end.
            self.refused_on(at.0, alone);
            return;
        };
        let tainted = self.cliques[at.0].tainted;
        if (call.count == 0 || tainted) && !alone {
            // Numbered on this rank alone, or on a communicator that may have failed.
            self.refused_on(at.0, alone);
        }
        if self.group_depth > 0 {
            if call.count > 0 && !alone && !self.may_block(at.0) {
                return;
            }
            let expected = if tainted { anything() } else { vec![OK] };
            let result = self.issue_collective(handle, &call, &expected);
            if result != OK {
                // Refused (a failed communicator): the group is refused at its end.
                self.refused_on(at.0, alone);
            }
            if result == OK && call.count > 0 {
                self.rank_mut(at).queued += 1;
                self.pending.push(Pending::Collective {
                    clique: at.0,
                    rank: at.1,
                    call,
                    checked,
                    symmetric: alone,
                });
            }
            return;
        }
        if call.count == 0 {
            let expected = if tainted { anything() } else { vec![OK] };
            self.issue_collective(handle, &call, &expected);
            return;
        }
        if tainted || !alone {
            if !self.may_block(at.0) {
                return;
            }
            let expected = if tainted { anything() } else { vec![TIMEOUT] };
            let result = self.issue_collective(handle, &call, &expected);
            if result != OK {
                self.cliques[at.0].tainted = true;
            }
            return;
        }
        // One rank alone: runs now.
        self.fill_inputs(at, &call, &checked);
        let before = self.snapshot();
        let inputs = self.read_inputs(&[(at.1, call, checked)], at.0);
        self.issue_collective(handle, &call, &[OK]);
        self.check_results(at.0, &[(at.1, call, checked)], &inputs, &before);
    }

    /// A collective call on clique `c` that its peers do not match (or a refused call): inside
    /// a group, the group's end is uncertain (a refused call refuses the whole group, on every
    /// clique); outside one, a clique of several ranks is tainted at once.
    pub(crate) fn refused_on(&mut self, c: usize, alone: bool) {
        if self.group_depth > 0 {
            if !self.group_unsure.contains(&c) {
                self.group_unsure.push(c);
            }
        } else if !alone {
            self.cliques[c].tainted = true;
        }
    }

    /// The same collective on every rank of clique `c` (with `variant`'s deviations).
    pub(crate) fn collective_all(
        &mut self,
        c: usize,
        spec: CallSpec,
        whole: (u8, u16),
        share: (u8, u16),
        variant: u8,
    ) {
        let shape = self.all_rank_shape(c, spec, whole, share);
        let calls = self.all_rank_calls(c, &shape, variant);
        self.issue_all_rank_calls(c, calls);
    }

    /// The collective `spec` names on clique `c`, its buffers in the `whole.0`-th and
    /// `share.0`-th windows of its first live rank (offsets in elements), and its count.
    fn all_rank_shape(
        &self,
        c: usize,
        spec: CallSpec,
        whole: (u8, u16),
        share: (u8, u16),
    ) -> AllRankShape {
        let clique = &self.cliques[c];
        let n = clique.nranks();
        let reference = clique.first_alive().expect("a live clique");
        let kind = spec.kind % 3;
        let dtype = raw_enum(spec.dtype);
        let es = usize::try_from(dtype)
            .ok()
            .and_then(|d| TYPES.get(d))
            .map_or(1, |k| k.size() as u64);
        let ref_windows = &self.rank((c, reference)).windows;
        let window_seq = |index: u8| -> Option<u64> {
            (!ref_windows.is_empty()).then(|| ref_windows[index as usize % ref_windows.len()].seq)
        };
        let whole_seq = window_seq(whole.0);
        let share_seq = if share.0 == 0xFF {
            None
        } else {
            window_seq(share.0)
        };
        let whole_offset = whole.1 as u64 * es;
        let share_offset = share.1 as u64 * es;
        let count = if spec.count == 0xFFFC {
            // As many as fit after the offsets.
            let room = |seq: Option<u64>, offset: u64| {
                seq.and_then(|s| ref_windows.iter().find(|w| w.seq == s))
                    .map_or(0, |w| w.size.saturating_sub(offset))
            };
            let whole_room = room(whole_seq, whole_offset) / es;
            let whole_count = if kind == 0 {
                whole_room
            } else {
                whole_room / n as u64
            };
            let share_count = if share.0 == 0xFF {
                whole_count
            } else {
                room(share_seq, share_offset) / es
            };
            whole_count.min(share_count) as usize
        } else {
            count_value(spec.count, 0)
        };
        AllRankShape {
            kind,
            dtype,
            op: raw_enum(spec.op),
            es,
            count,
            whole_seq,
            whole_offset,
            share_seq,
            share_offset,
            in_place: share.0 == 0xFF,
        }
    }

    /// Each live rank's call of `shape` on clique `c` (rank, handle, call), with `variant`'s
    /// deviations: a rank with another count or collective, a rank that does not call.
    fn all_rank_calls(
        &self,
        c: usize,
        shape: &AllRankShape,
        variant: u8,
    ) -> Vec<(usize, symmComm_t, Call)> {
        let n = self.cliques[c].nranks();
        let mut calls = Vec::new();
        for r in 0..n {
            let Some(rank) = &self.cliques[c].ranks[r] else {
                continue;
            };
            match variant {
                5 if r == n - 1 && n > 1 => continue,
                6 if r != 0 => continue,
                _ => {}
            }
            let base_of = |seq: Option<u64>| {
                seq.and_then(|s| rank.windows.iter().find(|w| w.seq == s))
                    .map_or(0, |w| w.base)
            };
            let deviant = n > 1 && r == 1 % n;
            let kind = if variant == 4 && deviant {
                (shape.kind + 1) % 3
            } else {
                shape.kind
            };
            let count = if variant == 3 && deviant {
                shape.count.wrapping_add(1)
            } else {
                shape.count
            };
            let whole_address = base_of(shape.whole_seq).wrapping_add(shape.whole_offset);
            let bytes = (count as u64).wrapping_mul(shape.es);
            let other = if shape.in_place {
                None
            } else {
                Some(base_of(shape.share_seq).wrapping_add(shape.share_offset))
            };
            let (send, recv) = match kind {
                0 => (whole_address, other.unwrap_or(whole_address)),
                1 => (
                    other.unwrap_or(whole_address.wrapping_add((r as u64).wrapping_mul(bytes))),
                    whole_address,
                ),
                _ => (
                    whole_address,
                    other.unwrap_or(whole_address.wrapping_add((r as u64).wrapping_mul(bytes))),
                ),
            };
            calls.push((
                r,
                rank.handle,
                Call {
                    kind,
                    dtype: shape.dtype,
                    op: shape.op,
                    count,
                    send,
                    recv,
                },
            ));
        }
        calls
    }

    /// Issue the ranks' `calls` of one collective on clique `c` in a group (their own, when
    /// none is open): each valid call is queued for the group's end, each invalid one refused.
    fn issue_all_rank_calls(&mut self, c: usize, calls: Vec<(usize, symmComm_t, Call)>) {
        let n = self.cliques[c].nranks();
        let tainted = self.cliques[c].tainted;
        let checked: Vec<Option<Checked>> = calls
            .iter()
            .map(|(r, _, call)| self.validate((c, *r), call))
            .collect();
        // Calls deferred to the group's end; fewer than every rank: the others wait in vain.
        let deferred = calls
            .iter()
            .zip(&checked)
            .filter(|((_, _, call), ch)| ch.is_some() && call.count > 0)
            .count();
        let partial = deferred < n || !self.cliques[c].all_alive();
        if n > 1 && deferred > 0 && (tainted || partial) && !self.may_block(c) {
            return;
        }
        let own_group = self.group_depth == 0;
        if own_group {
            self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
            self.group_depth += 1;
        }
        // Calls the library numbers in ways the model does not follow (counts of 0 beside
        // others, a tainted communicator's calls) or refuses (which refuses the group).
        // A count of 0 is a call too: its signature (kind, type, op) is compared with its
        // peers', so count-0 calls that differ are a mismatch the model does not follow.
        let has_zero = calls.iter().any(|(_, _, call)| call.count == 0);
        let calls_differ = calls.windows(2).any(|pair| {
            let (a, b) = (&pair[0].2, &pair[1].2);
            (a.kind, a.dtype, a.op, a.count) != (b.kind, b.dtype, b.op, b.count)
        });
        // Count-0 calls not every rank makes leave the ranks' call numbers out of step.
        let some_ranks_skip = calls.len() < n || !self.cliques[c].all_alive();
        if (n > 1 && ((has_zero && (calls_differ || some_ranks_skip)) || tainted))
            || checked.iter().any(Option::is_none)
        {
            self.refused_on(c, n == 1);
        }
        for ((r, handle, call), checked) in calls.into_iter().zip(checked) {
            let Some(checked) = checked else {
                self.issue_collective(handle, &call, &[INVALID_ARGUMENT]);
                continue;
            };
            self.fill_inputs((c, r), &call, &checked);
            let expected = if tainted { anything() } else { vec![OK] };
            let result = self.issue_collective(handle, &call, &expected);
            if result != OK {
                // Refused (a failed communicator): the group is refused at its end.
                self.refused_on(c, n == 1);
            }
            if result == OK && call.count > 0 {
                self.rank_mut((c, r)).queued += 1;
                self.pending.push(Pending::Collective {
                    clique: c,
                    rank: r,
                    call,
                    checked,
                    symmetric: true,
                });
            }
        }
        if own_group {
            self.group_end();
        }
    }
}
