//! Parked threads: `nanosleep` parks a thread until another thread stores to what it read
//! or virtual time reaches its wake-up; a load from host memory parks it for the PCIe round
//! trip. The timers, the watch lists and the wake-ups.

use std::cmp::Reverse;

use crate::exec::TState;
use crate::schedule::Sched;
use crate::simulator::Simulator;

/// Drop the entries of a list of parks (`(thread, park token)`, just pushed to) whose park has
/// ended, each time the list doubles: only live parks stay (the one just pushed included: its
/// thread sleeps with that token already). Without it, a list no store drains — a granule one
/// thread polls alone, the sleepers that read too much to track — grows by one entry per
/// sleep without bound.
fn prune_parks(parks: &mut Vec<(u32, u32)>, sched: &[Sched]) {
    let len = parks.len();
    if len >= 16 && len.is_power_of_two() {
        parks.retain(|&(w, tok)| {
            sched
                .get(w as usize)
                .is_some_and(|s| s.state == TState::Sleeping && s.token == tok)
        });
    }
}

impl Simulator {
    /// Memory may have changed from outside (host copies, other processes): spinning threads
    /// look again.
    pub fn wake_all(&mut self) {
        for tid in 0..self.threads.len() as u32 {
            if self.threads[tid as usize].is_some()
                && self.sched[tid as usize].state == TState::Sleeping
            {
                self.make_runnable(tid);
            }
        }
    }

    /// The earliest virtual time at which a sleeping thread wakes up by itself, if any
    /// sleeps (what [`Simulator::advance_time_to`] would need to reach to make progress
    /// after a [`RunOutcome::Stalled`] with sleepers).
    ///
    /// [`RunOutcome::Stalled`]: crate::RunOutcome::Stalled
    pub fn next_wakeup_ns(&mut self) -> Option<u64> {
        while let Some(&Reverse((at, tid, token))) = self.timers.peek() {
            if self.sleeping_with(tid, token) {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    /// Drop timer entries of sleeps that already ended (woken early by a store, or the thread
    /// exited) once they outnumber the threads.
    fn compact_timers(&mut self) {
        if self.timers.len() <= 2 * self.sched.len() + 4096 {
            return;
        }
        let sched = &self.sched;
        self.timers.retain(|&Reverse((_, tid, token))| {
            sched
                .get(tid as usize)
                .is_some_and(|s| s.state == TState::Sleeping && s.token == token)
        });
    }

    /// Wake the sleepers whose wake-up time has come.
    pub(crate) fn wake_timers(&mut self) {
        while let Some(&Reverse((at, tid, token))) = self.timers.peek() {
            if at > self.now {
                break;
            }
            self.timers.pop();
            if self.sleeping_with(tid, token) {
                self.make_runnable(tid);
            }
        }
    }

    /// Wake the sleepers that stores woke (those still parked with the same token).
    pub(crate) fn process_woken(&mut self) {
        while let Some((tid, token)) = self.stores.woken.pop() {
            if self.sleeping_with(tid, token) {
                self.make_runnable(tid);
            }
        }
    }

    /// Park thread `tid` for `nanosleep` of `ns` ns: until a store to a granule it read since
    /// its previous sleep, or its wake-up time; not at all when something it read changed
    /// already (or, with weak memory, when it read stale values).
    pub(crate) fn thread_sleep(&mut self, tid: u32, ns: u64) {
        let t = self.threads[tid as usize].as_mut().expect("thread");
        if let Some(w) = self.weak.as_mut()
            && w.on_sleep(t.weak_id)
        {
            // It read stale values: it looks again (and sees newer ones) instead of parking.
            t.reads.clear();
            t.reads_overflow = None;
            return;
        }
        let reads = std::mem::take(&mut t.reads);
        let overflow = t.reads_overflow.take();
        let stores = &self.stores;
        let stored_since = reads
            .iter()
            .any(|(g, seq)| stores.map.get(g).is_some_and(|e| e.last > *seq))
            || overflow.is_some_and(|seq| stores.seq > seq);
        if stored_since {
            // Something it read changed since: the sleep ends at once.
            t.reads = reads;
            t.reads.clear();
            return;
        }
        let token = self.token();
        self.sched[tid as usize].token = token;
        let t = self.threads[tid as usize].as_mut().expect("thread");
        t.wake_at = self.now.saturating_add(ns);
        t.watch.clear();
        t.watch.extend(reads.iter().map(|&(g, _)| g));
        let wake_at = t.wake_at;
        let mut reads = reads;
        reads.clear();
        t.reads = reads;
        self.make_unrunnable(tid, TState::Sleeping);
        self.parks += 1;
        let t = self.threads[tid as usize].as_ref().expect("thread");
        for &g in &t.watch {
            let e = self.stores.map.entry(g).or_default();
            e.watchers.push((tid, token));
            prune_parks(&mut e.watchers, &self.sched);
        }
        if overflow.is_some() {
            self.stores.any.push((tid, token));
            prune_parks(&mut self.stores.any, &self.sched);
        }
        self.timers.push(Reverse((wake_at, tid, token)));
        self.compact_timers();
    }

    /// Park `tid` for a read from host memory: it waits for the PCIe link to be free (reads
    /// queue behind each other, [`SimConfig::host_read_gap_ns`] each), then for the round
    /// trip ([`SimConfig::host_read_ns`]). Stores do not wake it, and what it read before
    /// stays watched for its next `nanosleep`.
    ///
    /// [`SimConfig::host_read_gap_ns`]: crate::SimConfig::host_read_gap_ns
    /// [`SimConfig::host_read_ns`]: crate::SimConfig::host_read_ns
    pub(crate) fn thread_host_read(&mut self, tid: u32) {
        let issued = self.now.max(self.host_link_free_at);
        self.host_link_free_at = issued.saturating_add(self.config.host_read_gap_ns);
        let wake_at = self
            .host_link_free_at
            .saturating_add(self.config.host_read_ns);
        let token = self.token();
        self.sched[tid as usize].token = token;
        let t = self.threads[tid as usize].as_mut().expect("thread");
        t.wake_at = wake_at;
        t.watch.clear();
        self.make_unrunnable(tid, TState::Sleeping);
        self.timers.push(Reverse((wake_at, tid, token)));
        self.compact_timers();
        self.host_read_timers.push(Reverse((wake_at, tid, token)));
    }

    /// `true` while a thread waits for a read from host memory.
    pub(crate) fn host_read_pending(&mut self) -> bool {
        while let Some(&Reverse((_, tid, token))) = self.host_read_timers.peek() {
            if self.sleeping_with(tid, token) {
                return true;
            }
            self.host_read_timers.pop();
        }
        false
    }
}
