//! The scheduler: the run loop of [`Simulator::run`], which thread runs next (PCT
//! priorities or a random burst, per the seed's [`Policy`]) and the set of runnable threads.
//! Only memory and synchronisation instructions are interleaving points.

use crate::exec::{self, Ctx, Stop, TState};
use crate::rng::Rng;
use crate::simulator::{RunOutcome, Simulator};

/// A thread's scheduling state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sched {
    pub state: TState,
    /// PCT priority.
    pub prio: u32,
    /// Bumped whenever the thread parks or becomes runnable (stale wake-ups are ignored).
    pub token: u32,
    /// Whether the heap holds an entry for it, and at which priority.
    pub in_heap: bool,
    pub heap_prio: u32,
}

/// The priority-heap key of `tid` at `prio` (ties: lower slot first).
pub(crate) fn heap_key(prio: u32, tid: u32) -> u64 {
    (prio as u64) << 32 | (!tid) as u64
}

/// Scheduling policy parameters drawn from the seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Chance (of 65536) that a decision picks a uniformly random thread.
    pub random: u32,
    /// Longest random burst, in interleaving points.
    pub burst: u64,
    /// Mean interleaving points between PCT priority changes.
    pub pct_mean: u64,
    /// Whether plain (weak) loads are interleaving points too.
    pub plain_load_points: bool,
}

impl Policy {
    /// A policy drawn from `rng` (the simulator's first draws).
    pub(crate) fn draw(rng: &mut Rng) -> Policy {
        Policy {
            random: [0, 4096, 16384, 65536][rng.below(4) as usize],
            burst: [1, 4, 32, 256][rng.below(4) as usize],
            pct_mean: [16, 256, 4096, 65536][rng.below(4) as usize],
            plain_load_points: rng.below(4) == 0,
        }
    }
}

impl Simulator {
    /// Run the running grids for at most `max_steps` instructions.
    pub fn run(&mut self, max_steps: u64) -> RunOutcome {
        self.mem.refresh();
        let mut executed = 0u64;
        loop {
            if !self.faults.is_empty() {
                let (g, r) = self.faults.remove(0);
                return RunOutcome::Fault(g, r);
            }
            if !self.finished.is_empty() {
                return RunOutcome::Finished(std::mem::take(&mut self.finished));
            }
            if self.grid_order.is_empty() {
                return RunOutcome::Idle;
            }
            self.wake_timers();
            self.process_woken();
            if self.run_list.is_empty() {
                // A read from host memory ends at a known time whatever real time does: move
                // to the first wake-up (a `nanosleep` may end first) instead of stalling.
                if self.host_read_pending()
                    && let Some(at) = self.next_wakeup_ns()
                {
                    self.advance_time_to(at);
                    continue;
                }
                return RunOutcome::Stalled;
            }
            if executed >= max_steps {
                return RunOutcome::Budget;
            }
            let (tid, points, pct) = self.pick();
            let limit = (max_steps - executed).min(1 << 16);
            let (stop, n) = self.run_slice(tid, points, limit);
            executed += n;
            if pct {
                self.count_down_priority_change(tid, points);
            }
            self.after_slice(tid, stop);
        }
    }

    /// Run thread `tid` for one slice (at most `points` interleaving points, about `limit`
    /// instructions), then account for it: virtual time, counters, the trace hash. Returns why
    /// the thread stopped and how many instructions it ran.
    fn run_slice(&mut self, tid: u32, points: u32, limit: u64) -> (Stop, u64) {
        let mut t = self.threads[tid as usize].take().expect("live thread");
        let grid = self.grids[t.grid as usize].as_ref().expect("live grid");
        let mut ctx = Ctx {
            mem: &mut self.mem,
            device: grid.device,
            params: &grid.params,
            now: self.now,
            frac: self.time_frac,
            live: self.live_threads.max(1),
            stores: &mut self.stores,
            weak: self.weak.as_mut(),
            plain_load_points: self.policy.plain_load_points,
            host_reads_cost: self.config.host_read_ns > 0 || self.config.host_read_gap_ns > 0,
            host_reads: 0,
        };
        let (stop, n) = exec::run(&mut t, &grid.module.prog, &mut ctx, points, limit);
        self.host_reads += ctx.host_reads;
        let pc = t.pc;
        self.threads[tid as usize] = Some(t);
        self.time_frac += n;
        let live = self.live_threads.max(1);
        self.now += self.time_frac / live;
        self.time_frac %= live;
        self.instructions += n;
        self.slices += 1;
        self.trace = (self.trace ^ (tid as u64) ^ ((pc as u64) << 24) ^ (n << 44))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
        (stop, n)
    }

    /// PCT: count the `points` interleaving points thread `tid` just passed towards the next
    /// priority change point; at it, `tid` drops to a random low priority.
    fn count_down_priority_change(&mut self, tid: u32, points: u32) {
        self.pct_countdown = self.pct_countdown.saturating_sub(points as u64);
        if self.pct_countdown == 0 {
            self.pct_countdown = 1 + self.rng.below(2 * self.policy.pct_mean);
            let low = (self.rng.next_u64() as u32) >> 1;
            let s = &mut self.sched[tid as usize];
            s.prio = low;
            if s.state == TState::Runnable {
                s.heap_prio = low;
                s.in_heap = true;
                self.heap.push(heap_key(low, tid));
                self.compact_heap();
            }
        }
    }

    /// Act on why thread `tid` stopped: park it at a barrier, in a sleep or a host read, end
    /// it, or fault its grid.
    fn after_slice(&mut self, tid: u32, stop: Stop) {
        match stop {
            Stop::Yield | Stop::Limit => {}
            Stop::Barrier => self.thread_barrier(tid),
            Stop::Sleep(ns) => self.thread_sleep(tid, ns),
            Stop::HostRead => self.thread_host_read(tid),
            Stop::Exit => self.thread_exit(tid),
            Stop::Trap => {
                let what = self.trap_message(tid);
                self.fault_thread(tid, &what);
            }
            Stop::Fault(msg) => self.fault_thread(tid, &msg),
        }
    }

    /// A fresh park token (stale wake-ups carry an old one).
    pub(crate) fn token(&mut self) -> u32 {
        self.next_token = self.next_token.wrapping_add(1);
        self.next_token
    }

    /// Whether thread `tid` still sleeps the park of `token`.
    pub(crate) fn sleeping_with(&self, tid: u32, token: u32) -> bool {
        self.sched
            .get(tid as usize)
            .is_some_and(|s| s.state == TState::Sleeping && s.token == token)
    }

    /// Drop stale entries of the run heap (threads that exited or changed priority since)
    /// once they outnumber the threads: entries below the running threads' priorities are
    /// otherwise never popped, and a long simulation would grow without bound.
    fn compact_heap(&mut self) {
        if self.heap.len() <= 2 * self.sched.len() + 4096 {
            return;
        }
        let sched = &mut self.sched;
        self.heap.retain(|&key| {
            let (prio, tid) = ((key >> 32) as u32, !(key as u32));
            sched
                .get(tid as usize)
                .is_some_and(|s| s.in_heap && s.heap_prio == prio && s.state != TState::Exited)
        });
        for s in sched.iter_mut().filter(|s| s.state == TState::Exited) {
            s.in_heap = false;
        }
    }

    /// Make thread `tid` runnable (a fresh token; into the run heap at its priority and
    /// into the run list).
    pub(crate) fn make_runnable(&mut self, tid: u32) {
        let token = self.token();
        let s = &mut self.sched[tid as usize];
        s.state = TState::Runnable;
        s.token = token;
        if !(s.in_heap && s.heap_prio == s.prio) {
            s.in_heap = true;
            s.heap_prio = s.prio;
            self.heap.push(heap_key(s.prio, tid));
            self.compact_heap();
        }
        if self.run_pos[tid as usize] == u32::MAX {
            self.run_pos[tid as usize] = self.run_list.len() as u32;
            self.run_list.push(tid);
        }
    }

    /// Take thread `tid` out of the run list, now in `state`.
    pub(crate) fn make_unrunnable(&mut self, tid: u32, state: TState) {
        self.sched[tid as usize].state = state;
        let pos = self.run_pos[tid as usize];
        if pos != u32::MAX {
            self.run_list.swap_remove(pos as usize);
            if let Some(&moved) = self.run_list.get(pos as usize) {
                self.run_pos[moved as usize] = pos;
            }
            self.run_pos[tid as usize] = u32::MAX;
        }
    }

    /// The next thread to run, its interleaving points, and whether PCT picked it.
    fn pick(&mut self) -> (u32, u32, bool) {
        if self.rng.chance(self.policy.random) {
            let tid = self.run_list[self.rng.below(self.run_list.len() as u64) as usize];
            let points = 1 + self.rng.below(self.policy.burst);
            return (tid, points as u32, false);
        }
        loop {
            let key = *self.heap.peek().expect("runnable threads");
            let (prio, tid) = ((key >> 32) as u32, !(key as u32));
            let s = &mut self.sched[tid as usize];
            if s.in_heap && s.heap_prio == prio {
                if s.state == TState::Runnable {
                    return (tid, self.pct_countdown.clamp(1, 512) as u32, true);
                }
                s.in_heap = false;
            }
            self.heap.pop();
        }
    }
}
