//! The data checks of a collective: fresh inputs of its element type before it runs, a
//! snapshot of every allocation, then every receive buffer against a reference computed
//! independently (integers exactly, floats in f64 within an error bound) and every other byte
//! unchanged.

use crate::harness::Harness;
use crate::model::{Call, Checked, Snapshot};
use crate::numeric::{self, Kind, Reduce};
use crate::stats;

impl Harness {
    /// Fill a call's input with fresh values of its type.
    pub(crate) fn fill_inputs(&mut self, _at: (usize, usize), call: &Call, checked: &Checked) {
        let (address, len) = input_range(call, checked);
        let n = len as usize / checked.elem.size();
        let mut bytes = vec![0u8; len as usize];
        for i in 0..n {
            let v = self.rng.element(checked.elem);
            checked.elem.set_bits_at(&mut bytes, i, v);
        }
        // SAFETY: the model validated that [address, +len) lies in a live window of this rank
        // (host memory); no collective is running (the harness is the only thread).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), address as *mut u8, bytes.len()) };
    }

    /// Every live allocation's bytes.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.live_ranks()
            .into_iter()
            .flat_map(|at| {
                self.rank(at).allocations.iter().map(move |a| {
                    // SAFETY: a live allocation of `size` bytes of host memory.
                    let bytes = unsafe { std::slice::from_raw_parts(a.base as *const u8, a.size) };
                    ((at.0, at.1, a.base), bytes.to_vec())
                })
            })
            .collect()
    }

    /// The inputs of the parts of one collective (by rank).
    pub(crate) fn read_inputs(&self, parts: &[(usize, Call, Checked)], _c: usize) -> Vec<Vec<u8>> {
        parts
            .iter()
            .map(|(_, call, checked)| {
                let (address, len) = input_range(call, checked);
                // SAFETY: validated to lie in a live window (host memory).
                unsafe { std::slice::from_raw_parts(address as *const u8, len as usize) }.to_vec()
            })
            .collect()
    }

    /// After one collective of clique `c` ran: every receive buffer against the reference,
    /// and every other byte unchanged since `before`.
    pub(crate) fn check_results(
        &self,
        c: usize,
        parts: &[(usize, Call, Checked)],
        inputs: &[Vec<u8>],
        before: &Snapshot,
    ) {
        let outputs: Vec<(usize, u64, u64)> = parts
            .iter()
            .map(|(r, call, checked)| (*r, call.recv, output_len(call, checked)))
            .collect();
        self.check_unchanged(c, &outputs, before);
        stats::add(&stats::CHECKED_COLLECTIVES);
        let n = parts.len();
        let (_, first, checked) = parts[0];
        let elem = checked.elem;
        let count = first.count;
        for (i, (r, call, _)) in parts.iter().enumerate() {
            let len = outputs[i].2 as usize;
            // SAFETY: validated to lie in a live window (host memory); the collective is done.
            let got = unsafe { std::slice::from_raw_parts(call.recv as *const u8, len) };
            for e in 0..len / elem.size() {
                let (sources, element): (Vec<u64>, usize) = match call.kind {
                    0 => (inputs.iter().map(|x| elem.bits_at(x, e)).collect(), e),
                    1 => (vec![elem.bits_at(&inputs[e / count], e % count)], e),
                    _ => (
                        inputs
                            .iter()
                            .map(|x| elem.bits_at(x, r * count + e))
                            .collect(),
                        e,
                    ),
                };
                let actual = elem.bits_at(got, element);
                if !element_matches(call.kind, elem, checked.reduce, &sources, actual) {
                    self.fail(format!(
                        "{} of {n} ranks, {count} x {elem:?} {:?}: rank {r} element {e} = {actual:#x}, inputs {sources:x?}",
                        call.kind_name(),
                        checked.reduce
                    ));
                }
            }
        }
        if first.kind == 0 {
            self.check_all_reduce_agrees(parts, checked.bytes);
        }
    }

    /// Every rank of an all-reduce holds the same bits (`bytes` of them).
    fn check_all_reduce_agrees(&self, parts: &[(usize, Call, Checked)], bytes: u64) {
        let read = |call: &Call| {
            // SAFETY: validated to lie in a live window (host memory); the collective is done.
            unsafe { std::slice::from_raw_parts(call.recv as *const u8, bytes as usize) }.to_vec()
        };
        let reference = read(&parts[0].1);
        for (r, call, _) in &parts[1..] {
            if read(call) != reference {
                self.fail(format!(
                    "all-reduce results of rank {r} differ from rank {}",
                    parts[0].0
                ));
            }
        }
    }

    /// Every byte of every allocation outside `outputs` (rank, address, bytes of clique `c`)
    /// is as in `before`.
    pub(crate) fn check_unchanged(
        &self,
        c: usize,
        outputs: &[(usize, u64, u64)],
        before: &Snapshot,
    ) {
        for ((ci, r, base), old) in before {
            let Some(rank) = self.cliques[*ci].ranks[*r].as_ref() else {
                continue;
            };
            if !rank
                .allocations
                .iter()
                .any(|a| a.base == *base && a.size == old.len())
            {
                continue;
            }
            // SAFETY: still a live allocation of this size (host memory).
            let now = unsafe { std::slice::from_raw_parts(*base as *const u8, old.len()) };
            for (i, (a, b)) in old.iter().zip(now).enumerate() {
                let address = base + i as u64;
                let written = *ci == c
                    && outputs.iter().any(|(orank, start, len)| {
                        orank == r && address >= *start && address < start + len
                    });
                if a != b && !written {
                    self.fail(format!(
                        "byte {i} of allocation {base:#x} of clique {ci} rank {r} changed outside \
                         every receive buffer ({a:#x} -> {b:#x})"
                    ));
                }
            }
        }
    }
}

/// Whether the element `actual` (raw bits) of a collective of `kind` is right for the raw
/// `sources` of every rank: an all-gather copies exactly, a reduction of integers is exact,
/// of floats within the error bound.
fn element_matches(
    kind: u8,
    elem: Kind,
    reduce: Option<Reduce>,
    sources: &[u64],
    actual: u64,
) -> bool {
    match (kind, elem) {
        (1, _) => actual == sources[0],
        (_, Kind::Int { .. }) => {
            let values: Vec<i128> = sources.iter().map(|b| elem.int_value(*b)).collect();
            actual == numeric::reduce_int(elem, reduce.expect("an op"), &values)
        }
        _ => {
            let values: Vec<f64> = sources.iter().map(|b| elem.float_value(*b)).collect();
            let (exact, tolerance) = numeric::reduce_float(elem, reduce.expect("an op"), &values);
            (elem.float_value(actual) - exact).abs() <= tolerance
        }
    }
}

/// Where a call reads its input: (address, bytes).
fn input_range(call: &Call, checked: &Checked) -> (u64, u64) {
    match call.kind {
        0 => (call.send, checked.bytes),
        1 => (call.send, checked.bytes),
        _ => (call.send, checked.total),
    }
}

/// Bytes a call writes at its receive address (all-gather: every rank's share).
pub(crate) fn output_len(call: &Call, checked: &Checked) -> u64 {
    if call.kind == 1 {
        checked.total
    } else {
        checked.bytes
    }
}
