//! What a selector of the input names, against the state the earlier operations left: a live
//! rank behind a comm handle, a comm handle (live, destroyed, NULL or made up), a live clique,
//! a buffer address or a window handle (this rank's, another's, stale, NULL or made up); the
//! stale handles and pointers kept for that; and the raw sizes, counts and enum values of
//! the input.

use crate::harness::Harness;
use crate::input::{BufSel, CommSel};
use crate::model::{Rank, Win};
use std::ffi::c_int;
use std::ptr::null_mut;
use symm::{symmComm_t, symmWindow_t};

/// A made-up address that is never a handle or a buffer of the library.
pub(crate) fn made_up_address() -> u64 {
    static NOT_A_HANDLE: u64 = 0;
    &NOT_A_HANDLE as *const u64 as u64
}

impl Harness {
    /// The live (clique, rank) behind a comm handle value.
    pub(crate) fn locate(&self, handle: symmComm_t) -> Option<(usize, usize)> {
        self.cliques.iter().enumerate().find_map(|(c, clique)| {
            clique
                .ranks
                .iter()
                .position(|r| r.as_ref().is_some_and(|r| r.handle == handle))
                .map(|r| (c, r))
        })
    }

    /// Every live (clique, rank).
    pub(crate) fn live_ranks(&self) -> Vec<(usize, usize)> {
        self.cliques
            .iter()
            .enumerate()
            .flat_map(|(c, clique)| {
                clique
                    .ranks
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_some())
                    .map(move |(r, _)| (c, r))
            })
            .collect()
    }

    /// The live rank at (clique, rank).
    pub(crate) fn rank(&self, at: (usize, usize)) -> &Rank {
        self.cliques[at.0].ranks[at.1]
            .as_ref()
            .expect("a live rank")
    }

    /// The live rank at (clique, rank), to change.
    pub(crate) fn rank_mut(&mut self, at: (usize, usize)) -> &mut Rank {
        self.cliques[at.0].ranks[at.1]
            .as_mut()
            .expect("a live rank")
    }

    /// The comm handle `sel` names.
    pub(crate) fn pick_comm(&self, sel: CommSel) -> symmComm_t {
        match sel.kind % 8 {
            0 => null_mut(),
            1 => made_up_address() as symmComm_t,
            2 if !self.stale_comms.is_empty() => {
                self.stale_comms[sel.index as usize % self.stale_comms.len()] as symmComm_t
            }
            _ => {
                let live = self.live_ranks();
                if live.is_empty() {
                    return null_mut();
                }
                self.rank(live[sel.index as usize % live.len()]).handle
            }
        }
    }

    /// Index of a live clique.
    pub(crate) fn pick_clique(&self, index: u8) -> Option<usize> {
        let live: Vec<usize> = (0..self.cliques.len())
            .filter(|c| self.cliques[*c].first_alive().is_some())
            .collect();
        (!live.is_empty()).then(|| live[index as usize % live.len()])
    }

    /// The address `sel` names for the rank `owner` (or for no live rank).
    pub(crate) fn pick_buffer(&self, owner: Option<(usize, usize)>, sel: BufSel) -> u64 {
        let (base, size) = match sel.kind % 8 {
            0 => return 0,
            1 => (0x1000, 0),
            2 if !self.stale_pointers.is_empty() => (
                self.stale_pointers[sel.index as usize % self.stale_pointers.len()],
                0,
            ),
            3 | 2 => {
                let foreign: Vec<Win> = self
                    .live_ranks()
                    .into_iter()
                    .filter(|at| Some(*at) != owner)
                    .flat_map(|at| self.rank(at).windows.clone())
                    .collect();
                if foreign.is_empty() {
                    return 0;
                }
                let w = foreign[sel.index as usize % foreign.len()];
                (w.base, w.size)
            }
            4 => {
                let Some(at) = owner else { return 0 };
                let list = &self.rank(at).allocations;
                if list.is_empty() {
                    return 0;
                }
                let a = list[sel.index as usize % list.len()];
                (a.base, a.size as u64)
            }
            _ => {
                let Some(at) = owner else { return 0 };
                let list = &self.rank(at).windows;
                if list.is_empty() {
                    return 0;
                }
                let w = list[sel.index as usize % list.len()];
                (w.base, w.size)
            }
        };
        match sel.offset {
            0xFFFF => base.wrapping_add(size),
            0xFFFE => base.wrapping_add(u64::MAX - 7),
            offset => base.wrapping_add(offset as u64),
        }
    }

    /// The window handle `sel` names for the rank `owner` (or for no live rank).
    pub(crate) fn pick_window(&self, owner: Option<(usize, usize)>, sel: BufSel) -> symmWindow_t {
        let address = match sel.kind % 8 {
            0 => 0,
            1 => made_up_address(),
            2 if !self.stale_pointers.is_empty() => {
                self.stale_pointers[sel.index as usize % self.stale_pointers.len()]
            }
            3 | 2 => {
                let foreign: Vec<usize> = self
                    .live_ranks()
                    .into_iter()
                    .filter(|at| Some(*at) != owner)
                    .flat_map(|at| {
                        self.rank(at)
                            .windows
                            .iter()
                            .map(|w| w.handle)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                if foreign.is_empty() {
                    0
                } else {
                    foreign[sel.index as usize % foreign.len()] as u64
                }
            }
            _ => match owner {
                Some(at) if !self.rank(at).windows.is_empty() => {
                    let list = &self.rank(at).windows;
                    list[sel.index as usize % list.len()].handle as u64
                }
                _ => 0,
            },
        };
        address as symmWindow_t
    }

    /// Bytes from `address` to the end of the allocation of `owner` that holds it
    /// (`usize::MAX` when none does).
    pub(crate) fn rest_of_allocation(&self, owner: Option<(usize, usize)>, address: u64) -> usize {
        owner
            .and_then(|at| {
                self.rank(at)
                    .allocations
                    .iter()
                    .find(|a| a.base <= address && address < a.base + a.size as u64)
                    .map(|a| (a.base + a.size as u64 - address) as usize)
            })
            .unwrap_or(usize::MAX)
    }

    /// Keep a destroyed comm handle for the selectors of stale handles.
    pub(crate) fn mark_comm_stale(&mut self, handle: symmComm_t) {
        if self.stale_comms.len() < 16 {
            self.stale_comms.push(handle as usize);
        }
    }

    /// Keep a freed pointer or deregistered window handle for the selectors of stale ones.
    pub(crate) fn mark_pointer_stale(&mut self, address: u64) {
        if self.stale_pointers.len() < 16 {
            self.stale_pointers.push(address);
        }
    }
}

/// An allocation size: 0xFFFF is `usize::MAX`, 0xFFFE just over the library's limit.
pub(crate) fn alloc_size(raw: u16) -> usize {
    match raw {
        0xFFFF => usize::MAX,
        0xFFFE => isize::MAX as usize - 4095,
        n => n as usize,
    }
}

/// A count: large special values for the top codes (0xFFFC: `fits`).
pub(crate) fn count_value(raw: u16, fits: usize) -> usize {
    match raw {
        0xFFFF => usize::MAX,
        0xFFFE => 1 << 62,
        0xFFFD => usize::MAX / 2 + 1,
        0xFFFC => fits,
        n => n as usize,
    }
}

/// A raw enum value: 0xFF is -1, anything else as is (values past the last are invalid).
pub(crate) fn raw_enum(raw: u8) -> c_int {
    if raw == 0xFF { -1 } else { raw as c_int }
}
