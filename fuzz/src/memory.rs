//! Memory: `symmMemAlloc` and `symmMemFree`, and window registration
//! (`symmCommWindowRegister`, on one rank or on every rank of a communicator in a group) and
//! deregistration. Each predicts the result from the allocations and windows of the rank,
//! makes the call, and updates the model.

use crate::config::MAX_ALLOCATIONS;
use crate::driver::{INVALID_ARGUMENT, INVALID_USAGE, OK, TIMEOUT, anything};
use crate::harness::Harness;
use crate::model::{Allocation, Pending, WINDOW_ALIGNMENT, Win};
use std::ffi::c_void;
use std::ptr::null_mut;
use symm::*;

impl Harness {
    /// `symmMemAlloc` of `size` bytes on `handle`.
    pub(crate) fn alloc(&mut self, handle: symmComm_t, size: usize) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) if self.rank(at).allocations.len() >= MAX_ALLOCATIONS => return,
            Some(_) if size == 0 || size > isize::MAX as usize - 4096 => vec![INVALID_ARGUMENT],
            Some(_) if size > 1 << 20 => return,
            Some(_) => vec![OK],
        };
        let mut ptr: *mut c_void = null_mut();
        // SAFETY: valid out-pointer.
        let result = self.expect("symmMemAlloc", &expected, handle, || unsafe {
            symmMemAlloc(handle, &mut ptr, size)
        });
        if result == OK {
            let at = at.expect("a live rank");
            if ptr.is_null() || !(ptr as usize).is_multiple_of(8) {
                self.fail(format!("symmMemAlloc returned {ptr:?}"));
            }
            // SAFETY: the library returned `size` bytes of host memory, zeroed.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, size) };
            if bytes.iter().any(|b| *b != 0) {
                self.fail("symmMemAlloc memory is not zeroed".into());
            }
            self.rank_mut(at).allocations.push(Allocation {
                base: ptr as u64,
                size,
            });
        }
    }

    /// `symmMemFree` of `address` on `handle`.
    pub(crate) fn free(&mut self, handle: symmComm_t, address: u64) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) => {
                let rank = self.rank(at);
                if rank.queued > 0 {
                    vec![INVALID_USAGE]
                } else if address == 0 {
                    vec![INVALID_ARGUMENT]
                } else {
                    match rank.allocations.iter().find(|a| a.base == address) {
                        None => vec![INVALID_ARGUMENT],
                        Some(a) => {
                            let end = a.base + a.size as u64;
                            if rank
                                .windows
                                .iter()
                                .any(|w| w.base < end && a.base < w.base + w.size)
                            {
                                vec![INVALID_USAGE]
                            } else {
                                vec![OK]
                            }
                        }
                    }
                }
            }
        };
        let result = self.expect("symmMemFree", &expected, handle, || {
            symmMemFree(handle, address as *mut c_void)
        });
        if result == OK {
            let at = at.expect("a live rank");
            self.rank_mut(at).allocations.retain(|a| a.base != address);
            self.mark_pointer_stale(address);
        }
    }

    /// `[address, +size)` is non-empty, lies in one allocation of the rank `at`, and overlaps
    /// none of its windows.
    fn fits_unregistered(&self, at: (usize, usize), address: u64, size: usize) -> bool {
        let rank = self.rank(at);
        let end = address.checked_add(size as u64);
        address != 0
            && size != 0
            && end.is_some_and(|end| {
                rank.allocations
                    .iter()
                    .any(|a| a.base <= address && end <= a.base + a.size as u64)
                    && !rank
                        .windows
                        .iter()
                        .any(|w| address < w.base + w.size && w.base < end)
            })
    }

    /// `symmCommWindowRegister` on one rank (`in_all`: part of a registration of every rank).
    pub(crate) fn register(
        &mut self,
        handle: symmComm_t,
        address: u64,
        size: usize,
        flags: u8,
        in_all: bool,
    ) {
        let at = self.locate(handle);
        let win_flags = if flags & 1 != 0 {
            0
        } else if flags & 4 != 0 {
            SYMM_WIN_COLL_SYMMETRIC | 2
        } else {
            SYMM_WIN_COLL_SYMMETRIC
        };
        let null_out = flags & 2 != 0;
        let valid_args = at.is_some_and(|at| {
            win_flags == SYMM_WIN_COLL_SYMMETRIC && self.fits_unregistered(at, address, size)
        });
        let (expected, blocking) = self.predict_register(at, null_out, valid_args, address, in_all);
        if blocking && !self.may_block(at.map_or(0, |a| a.0)) {
            return;
        }
        let takes_seq = !null_out && valid_args;
        let mut win: symmWindow_t = null_mut();
        let out = if null_out {
            null_mut()
        } else {
            &mut win as *mut symmWindow_t
        };
        // SAFETY: `out` is NULL or a valid out-pointer.
        let result = self.expect("symmCommWindowRegister", &expected, handle, || unsafe {
            symmCommWindowRegister(handle, address as *mut c_void, size, out, win_flags)
        });
        let Some(at) = at else { return };
        self.record_registration(at, takes_seq, result, win, address, size);
    }

    /// The results a registration on the rank `at` may return, and whether it may wait for
    /// the timeout.
    fn predict_register(
        &self,
        at: Option<(usize, usize)>,
        null_out: bool,
        valid_args: bool,
        address: u64,
        in_all: bool,
    ) -> (Vec<symmResult_t>, bool) {
        let mut blocking = false;
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(_) if null_out => vec![INVALID_ARGUMENT],
            Some(at) if !valid_args => {
                if self.cliques[at.0].linked && self.cliques[at.0].tainted {
                    // A failed registration through the bootstrap refuses the later ones.
                    vec![INVALID_ARGUMENT, INVALID_USAGE]
                } else {
                    vec![INVALID_ARGUMENT]
                }
            }
            Some(at) => {
                let clique = &self.cliques[at.0];
                let alone = clique.nranks() == 1;
                if self.group_depth > 0 {
                    // Deposited now, completed at the group's end.
                    if !in_all {
                        blocking = !alone;
                    }
                    if clique.tainted { anything() } else { vec![OK] }
                } else if clique.tainted {
                    blocking = !alone;
                    anything()
                } else if alone {
                    // Completed now: a base that is not 16-byte aligned fails it.
                    if address.is_multiple_of(WINDOW_ALIGNMENT) {
                        vec![OK]
                    } else {
                        vec![INVALID_ARGUMENT]
                    }
                } else {
                    // Outside a group nobody else can join it: it times out.
                    blocking = true;
                    if clique.linked {
                        vec![TIMEOUT, symmResult_t::symmRemoteError]
                    } else {
                        vec![TIMEOUT]
                    }
                }
            }
        };
        (expected, blocking)
    }

    /// The model after a registration of the rank `at` returned `result` (`takes_seq`: its
    /// arguments were valid, so it took a sequence number unless refused outright).
    fn record_registration(
        &mut self,
        at: (usize, usize),
        takes_seq: bool,
        result: symmResult_t,
        win: symmWindow_t,
        address: u64,
        size: usize,
    ) {
        if takes_seq && result != INVALID_USAGE {
            // A call that got past validation took a registration sequence number.
            self.rank_mut(at).next_seq += 1;
        }
        let seq = self.rank(at).next_seq.wrapping_sub(1);
        // Past validation, only completing the registration fails with INVALID_ARGUMENT (a
        // misaligned base): through the bootstrap, that refuses the later registrations.
        let failed_completion = takes_seq && result == INVALID_ARGUMENT;
        if result == TIMEOUT || result == symmResult_t::symmRemoteError || failed_completion {
            if self.cliques[at.0].linked {
                self.cliques[at.0].tainted = true;
            }
            return;
        }
        if result != OK {
            return;
        }
        if win.is_null() {
            self.fail("symmCommWindowRegister succeeded without a window".into());
        }
        let in_group = self.group_depth > 0;
        self.rank_mut(at).windows.push(Win {
            handle: win as usize,
            base: address,
            size: size as u64,
            seq,
            complete: !in_group,
        });
        if in_group {
            self.rank_mut(at).queued += 1;
            self.pending.push(Pending::Register {
                clique: at.0,
                rank: at.1,
                handle: win as usize,
                seq,
                size: size as u64,
                base: address,
            });
        }
    }

    /// Register the `alloc`-th allocation at `offset` on every rank of the clique `clique`
    /// names, in a group.
    pub(crate) fn register_all(&mut self, clique: u8, alloc: u8, offset: u16, size: u16) {
        let Some(c) = self.pick_clique(clique) else {
            return;
        };
        let targets = self.register_targets(c, alloc, offset, size);
        // Every rank deposits the same registration, or someone waits for the timeout.
        let clique = &self.cliques[c];
        let seqs: Vec<u64> = clique.ranks.iter().flatten().map(|r| r.next_seq).collect();
        let aligned = clique.all_alive()
            && !clique.tainted
            && seqs.windows(2).all(|w| w[0] == w[1])
            && targets
                .iter()
                .all(|&(r, _, address, bytes)| self.fits_unregistered((c, r), address, bytes));
        if !aligned && clique.nranks() > 1 && !self.may_block(c) {
            return;
        }
        let own_group = self.group_depth == 0;
        if own_group {
            self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
            self.group_depth += 1;
        }
        for (_, handle, address, bytes) in targets {
            self.register(handle, address, bytes, 0, true);
        }
        if own_group {
            self.group_end();
        }
    }

    /// What each live rank of clique `c` registers: (rank, handle, address, bytes) of the
    /// `alloc`-th allocation at `offset` (0 and 0 for a rank without allocations).
    fn register_targets(
        &self,
        c: usize,
        alloc: u8,
        offset: u16,
        size: u16,
    ) -> Vec<(usize, symmComm_t, u64, usize)> {
        let mut targets = Vec::new();
        for r in 0..self.cliques[c].nranks() {
            let Some(rank) = &self.cliques[c].ranks[r] else {
                continue;
            };
            let handle = rank.handle;
            let (address, bytes) = match rank
                .allocations
                .get(alloc as usize % rank.allocations.len().max(1))
            {
                None => (0, 0),
                Some(a) => {
                    let address = a.base + offset as u64;
                    let bytes = if size == 0xFFFF {
                        (a.size as u64).saturating_sub(offset as u64) as usize
                    } else {
                        size as usize
                    };
                    (address, bytes)
                }
            };
            targets.push((r, handle, address, bytes));
        }
        targets
    }

    /// `symmCommWindowDeregister` of `window` on `handle`, then (`then_free`) `symmMemFree`
    /// of the allocation that holds it.
    pub(crate) fn deregister(&mut self, handle: symmComm_t, window: symmWindow_t, then_free: bool) {
        let at = self.locate(handle);
        let expected = match at {
            None => vec![INVALID_ARGUMENT],
            Some(at) => {
                let rank = self.rank(at);
                if rank.queued > 0 {
                    vec![INVALID_USAGE]
                } else if window.is_null()
                    || !rank.windows.iter().any(|w| w.handle == window as usize)
                {
                    vec![INVALID_ARGUMENT]
                } else {
                    vec![OK]
                }
            }
        };
        let result = self.expect("symmCommWindowDeregister", &expected, handle, || {
            symmCommWindowDeregister(handle, window)
        });
        if result != OK {
            return;
        }
        let at = at.expect("a live rank");
        let removed = {
            let rank = self.rank_mut(at);
            let i = rank
                .windows
                .iter()
                .position(|w| w.handle == window as usize);
            i.map(|i| rank.windows.remove(i))
        };
        self.mark_pointer_stale(window as u64);
        if then_free && let Some(w) = removed {
            let base = self
                .rank(at)
                .allocations
                .iter()
                .find(|a| a.base <= w.base && w.base < a.base + a.size as u64)
                .map(|a| a.base);
            if let Some(base) = base {
                self.free(handle, base);
            }
        }
    }

    /// Deregister the `win`-th window of every rank of the clique `clique` names (by the
    /// first live rank's registration), then free its allocations when `free` is odd.
    pub(crate) fn deregister_all(&mut self, clique: u8, win: u8, free: u8) {
        let Some(c) = self.pick_clique(clique) else {
            return;
        };
        let reference = self.cliques[c].first_alive().expect("a live clique");
        let windows = &self.rank((c, reference)).windows;
        if windows.is_empty() {
            return;
        }
        let seq = windows[win as usize % windows.len()].seq;
        for r in 0..self.cliques[c].nranks() {
            let Some(rank) = &self.cliques[c].ranks[r] else {
                continue;
            };
            let handle = rank.handle;
            let window = rank
                .windows
                .iter()
                .find(|w| w.seq == seq)
                .map_or(null_mut(), |w| w.handle as symmWindow_t);
            self.deregister(handle, window, free & 1 != 0);
        }
    }
}
