//! [`Harness`]: the model and the handles of one input. It runs each operation (each kind is
//! handled in the module of its concept), keeps the log of operations that a failure prints,
//! spends the blocking budget, and tears everything down at the end of the input.

use crate::config::{BLOCKING_BUDGET, call_bound, thread_count};
use crate::driver::{OK, c_text};
use crate::input::Op;
use crate::model::{Call, Clique, Pending};
use crate::numeric::Rng;
use crate::select::{alloc_size, count_value, raw_enum};
use std::ffi::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;

/// The model and the handles of one input.
pub struct Harness {
    pub(crate) cliques: Vec<Clique>,
    pub(crate) stale_comms: Vec<usize>,
    pub(crate) stale_pointers: Vec<u64>,
    pub(crate) group_depth: u32,
    pub(crate) pending: Vec<Pending>,
    /// Cliques (of several ranks) on which a collective of the open group was refused when it
    /// was called, or made with count 0 where others may not be: the library refuses the
    /// whole group at its end, or numbers the calls in a way the model does not follow, so
    /// the group's end is uncertain and those cliques are tainted (see
    /// `symm::agree::Call`).
    pub(crate) group_unsure: Vec<usize>,
    pub(crate) blocking_left: u32,
    pub(crate) rng: Rng,
    pub(crate) log: Vec<String>,
    /// Threads of the process when the input started.
    pub(crate) threads_at_start: usize,
}

impl Harness {
    /// An empty model for the input `data` (which seeds the buffer contents).
    pub(crate) fn new(data: &[u8]) -> Self {
        let seed = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Harness {
            cliques: Vec::new(),
            stale_comms: Vec::new(),
            stale_pointers: Vec::new(),
            group_depth: 0,
            pending: Vec::new(),
            group_unsure: Vec::new(),
            blocking_left: BLOCKING_BUDGET,
            rng: Rng(seed),
            log: Vec::new(),
            threads_at_start: thread_count(),
        }
    }

    /// Panic with the sequence so far.
    #[track_caller]
    pub(crate) fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(24).rev().collect();
        panic!(
            "{what}\nlast operations:\n  {}",
            tail.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }

    /// Spend one unit of the blocking budget; `false` when none is left.
    pub(crate) fn may_block(&mut self, clique: usize) -> bool {
        if self.cliques[clique].patient || self.blocking_left == 0 {
            return false;
        }
        self.blocking_left -= 1;
        true
    }

    /// Run one operation.
    pub fn run(&mut self, op: Op) {
        self.log.push(format!("{op:?}"));
        match op {
            Op::InitAll { nranks } => self.init_all(1 + nranks as usize % 4, nranks & 0x80 == 0),
            Op::InitUniqueId { nranks } => self.init_unique_id(1 + nranks as usize % 4),
            Op::Alloc { comm, size } => {
                let handle = self.pick_comm(comm);
                self.alloc(handle, alloc_size(size));
            }
            Op::AllocAll { clique, size } => {
                if let Some(c) = self.pick_clique(clique) {
                    for r in 0..self.cliques[c].nranks() {
                        if let Some(rank) = &self.cliques[c].ranks[r] {
                            let handle = rank.handle;
                            self.alloc(handle, alloc_size(size));
                        }
                    }
                }
            }
            Op::Free { comm, ptr } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let address = self.pick_buffer(owner, ptr);
                self.free(handle, address);
            }
            Op::Register {
                comm,
                ptr,
                size,
                flags,
            } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let address = self.pick_buffer(owner, ptr);
                let size = match size {
                    0xFFFF => self.rest_of_allocation(owner, address),
                    s => s as usize,
                };
                self.register(handle, address, size, flags, false);
            }
            Op::RegisterAll {
                clique,
                alloc,
                offset,
                size,
            } => self.register_all(clique, alloc, offset, size),
            Op::Deregister { comm, win } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let window = self.pick_window(owner, win);
                self.deregister(handle, window, false);
            }
            Op::DeregisterAll { clique, win, free } => self.deregister_all(clique, win, free),
            Op::Collective {
                comm,
                call,
                send,
                recv,
            } => {
                let handle = self.pick_comm(comm);
                let owner = self.locate(handle);
                let call = Call {
                    kind: call.kind % 3,
                    dtype: raw_enum(call.dtype),
                    op: raw_enum(call.op),
                    count: count_value(call.count, 4096),
                    send: self.pick_buffer(owner, send),
                    recv: self.pick_buffer(owner, recv),
                };
                self.single_collective(handle, call);
            }
            Op::CollectiveAll {
                clique,
                call,
                whole,
                whole_offset,
                share,
                share_offset,
                variant,
            } => {
                if let Some(c) = self.pick_clique(clique) {
                    self.collective_all(
                        c,
                        call,
                        (whole, whole_offset),
                        (share, share_offset),
                        variant,
                    );
                }
            }
            Op::GroupStart => {
                if self.group_depth < 4 {
                    self.expect("symmGroupStart", &[OK], null_mut(), || symmGroupStart());
                    self.group_depth += 1;
                }
            }
            Op::GroupEnd => self.group_end(),
            Op::Destroy { comm } => {
                let handle = self.pick_comm(comm);
                self.destroy(handle);
            }
            Op::DestroyAll { clique } => {
                if let Some(c) = self.pick_clique(clique) {
                    let handles: Vec<symmComm_t> = self.cliques[c]
                        .ranks
                        .iter()
                        .flatten()
                        .map(|r| r.handle)
                        .collect();
                    for handle in handles {
                        self.destroy(handle);
                    }
                }
            }
            Op::Query { comm, what, win } => self.query(comm, what, win),
            Op::ErrorString { code } => {
                let text = c_text(symmGetErrorString(code as i8 as c_int));
                assert!(!text.is_empty(), "empty error string for {code}");
            }
            Op::InitRankMisuse { what } => self.init_rank_misuse(what),
        }
    }

    /// End open groups and destroy every communicator left.
    pub fn finish(&mut self) {
        while self.group_depth > 0 {
            self.log.push("(end of input) GroupEnd".into());
            self.group_end();
        }
        let handles: Vec<symmComm_t> = self
            .live_ranks()
            .into_iter()
            .map(|at| self.rank(at).handle)
            .collect();
        for handle in handles {
            self.log.push("(end of input) Destroy".into());
            self.destroy(handle);
        }
        // Every thread the library started for this input ends: kernels' threads at once,
        // bootstrap roots shortly after their ranks left. (Waiting also keeps LeakSanitizer,
        // which checks right after the input, from seeing the bookkeeping of a thread that is
        // still exiting as a leak.)
        let deadline = Instant::now() + call_bound();
        while thread_count() > self.threads_at_start {
            if Instant::now() > deadline {
                self.fail(format!(
                    "{} threads run after every communicator was destroyed, {} before the input",
                    thread_count(),
                    self.threads_at_start
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
