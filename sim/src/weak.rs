//! Weak memory: per-location store histories with happens-before knowledge (in the style of
//! C11Tester / loom), so that relaxed, volatile and plain loads may read older stores that
//! coherence and happens-before allow.
//!
//! **Knowledge instead of full vector clocks.** A simulation has tens of thousands of threads,
//! so a thread's happens-before knowledge is a sparse map with two kinds of entries:
//! *block phases* (`block b → p`: every event of every thread of block `b` before the
//! block's `p`-th barrier completed is known) and *thread epochs* (`thread t → e`: the first
//! `e` stores of `t` are known). Barriers join the knowledge of a block's threads and advance
//! the block's phase, which also covers (and prunes) the thread entries of that block; a
//! release store carries a snapshot of the writer's knowledge, which an acquire load that
//! reads it joins. Stores of grids that finished before a launch are visible to the new
//! grid's threads (stream and event order imply completion); stores of grids still running
//! are not, unless ordered by release/acquire.
//!
//! **Locations.** A location is an aligned address with a size (a vector access is one
//! location per element). The newest store is always in real memory; a history is trusted
//! only while its newest value equals real memory (anything else — a host write, another
//! process, an access of another size — resets it to the current value).
//!
//! **Races.** Every location also keeps the loads made since its newest store. A plain
//! (`ld`/`st` without `.relaxed`, `.volatile`, `.acquire` or `.release`) access that conflicts
//! with another thread's access of the location (one of them a store) and is not ordered with
//! it by happens-before is a data race, which the PTX memory model leaves undefined: it is
//! reported (as a fault naming both accesses) unless `SYMM_SIM_RACES=0`. Two strong accesses
//! never race (scopes are not modelled). A value written from outside (host, another process)
//! carries the finished grids' stores to a thread that acquires it (CUDA orders such writes
//! after the work they follow).
//!
//! Limits of the race check. It can miss races: only the newest store and the last 16 loads
//! since it are compared, a load that returns an older store is checked against the newest
//! one, a thread that exited counts as ordered before its block's later barriers, and every
//! grid that finished before a launch counts as ordered before it (not only those its stream
//! and events order). It can report races the PTX model does not have, in patterns symm's
//! kernels do not use: release pattern 2 (a strong store after a release on the same
//! location, read by an acquire), observation order (a plain access ordered only by a strong
//! read that saw a strong store), and an access of another size that resets a location's
//! history (and the release knowledge it carried).
//!
//! **Choices.** A load may return any store from the newest one that happens-before it (or
//! the newest it or its thread already saw: coherence) up to the newest, biased to stale
//! ones. Read-modify-writes read the newest. A thread that read a stale value and then sleeps
//! (`nanosleep`) sees at least the newest values of those locations afterwards (eventual
//! visibility), and its sleep is not a park.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::fx::FxMap;
use crate::ir::sem;
use crate::memory::{host_load, host_rmw, host_store};
use crate::rng::Rng;

/// Thread entries have this bit set in their key.
const THREAD: u32 = 1 << 31;
/// The key of the finish count up to which finished grids' stores are known (block ids start
/// at 1).
const FLOOR: u32 = 0;
/// Stores kept per location.
const HISTORY: usize = 8;
/// Threads whose coherence position is kept per location.
const SEEN: usize = 32;
/// Loads kept per location for race detection (since its newest store).
const READS: usize = 16;

/// Sparse happens-before knowledge: sorted `(key, value)`.
#[derive(Clone, Debug, Default)]
struct Know(Vec<(u32, u32)>);

impl Know {
    fn get(&self, key: u32) -> u32 {
        match self.0.binary_search_by_key(&key, |e| e.0) {
            Ok(i) => self.0[i].1,
            Err(_) => 0,
        }
    }

    fn raise(&mut self, key: u32, value: u32) {
        match self.0.binary_search_by_key(&key, |e| e.0) {
            Ok(i) => self.0[i].1 = self.0[i].1.max(value),
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    fn join(&mut self, other: &[(u32, u32)]) {
        if other.is_empty() {
            return;
        }
        let mut out = Vec::with_capacity(self.0.len() + other.len());
        let (a, b) = (&self.0, other);
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            if j == b.len() || (i < a.len() && a[i].0 < b[j].0) {
                out.push(a[i]);
                i += 1;
            } else if i == a.len() || b[j].0 < a[i].0 {
                out.push(b[j]);
                j += 1;
            } else {
                out.push((a[i].0, a[i].1.max(b[j].1)));
                i += 1;
                j += 1;
            }
        }
        self.0 = out;
    }
}

/// One store in a location's history.
#[derive(Clone, Debug)]
struct Rec {
    value: u64,
    /// Position in the location's modification order.
    seq: u32,
    /// The writer's grid (visibility after it finished).
    grid: u32,
    /// Writer thread (`u32::MAX`: the value found in memory, visible to everyone), its store
    /// epoch, its block and the block phase at the store.
    thread: u32,
    epoch: u32,
    block: u32,
    phase: u32,
    /// Knowledge a release store (or an RMW continuing a release sequence) publishes.
    rel: Option<Arc<[(u32, u32)]>>,
    /// A strong (not plain) store, and its PTX line.
    strong: bool,
    line: u32,
}

/// A load kept for race detection: who, where in its thread's history, how.
#[derive(Clone, Copy, Debug)]
struct Read {
    thread: u32,
    /// The epoch of the thread's next store (knowing it means knowing this load).
    epoch: u32,
    block: u32,
    phase: u32,
    grid: u32,
    strong: bool,
    line: u32,
}

/// A location's history.
#[derive(Debug, Default)]
struct Loc {
    bytes: u32,
    next_seq: u32,
    recs: Vec<Rec>,
    /// Threads' coherence positions: (thread, newest seq seen).
    seen: Vec<(u32, u32)>,
    /// Loads since the newest store (race detection).
    reads: Vec<Read>,
}

impl Loc {
    /// Forget the history: the current value, visible to everyone. It was written from outside
    /// the simulated threads (a host copy or store, another process), which CUDA orders after
    /// the grids finished so far: a thread that acquires it knows their stores (`floor`).
    fn reset(&mut self, bytes: u32, value: u64, floor: u32) {
        self.bytes = bytes;
        self.recs.clear();
        self.seen.clear();
        self.reads.clear();
        self.recs.push(Rec {
            value,
            seq: self.next_seq,
            grid: 0,
            thread: u32::MAX,
            epoch: 0,
            block: 0,
            phase: 0,
            rel: Some(Arc::from([(FLOOR, floor)])),
            strong: true,
            line: 0,
        });
        self.next_seq += 1;
    }

    fn see(&mut self, thread: u32, seq: u32) {
        if let Some(e) = self.seen.iter_mut().find(|e| e.0 == thread) {
            e.1 = e.1.max(seq);
            return;
        }
        if self.seen.len() >= SEEN {
            // Too many readers to track: only the newest store stays readable (its writer is
            // kept, for race checks).
            let last = self.recs.pop().expect("history");
            self.recs.clear();
            self.recs.push(last);
            self.seen.clear();
        }
        self.seen.push((thread, seq));
    }

    fn seen_by(&self, thread: u32) -> u32 {
        self.seen.iter().find(|e| e.0 == thread).map_or(0, |e| e.1)
    }
}

/// One thread's weak-memory state.
#[derive(Debug, Default)]
struct WThread {
    know: Know,
    epoch: u32,
    phase: u32,
    block: u32,
    grid: u32,
    /// Stores of grids finished at or before this finish count are visible.
    floor: u32,
    /// Locations read stale since the last sleep.
    stale: Vec<u64>,
    live: bool,
    /// Block index and thread index (x, y, z each), for race reports.
    site: [u32; 6],
}

/// The weak-memory model state.
#[derive(Debug)]
pub(crate) struct Weak {
    rng: Rng,
    locs: FxMap<u64, Loc>,
    threads: Vec<WThread>,
    /// Block of each thread id.
    blocks: u32,
    /// Joined knowledge of the threads at each block's barrier.
    barrier: FxMap<u32, Know>,
    /// Finish count at which each grid finished (0: running), by grid id.
    finished_at: Vec<u32>,
    finishes: u32,
    /// Grid of each block id (index `block - 1`).
    block_grid: Vec<u32>,
    /// Joined knowledge of each running grid's exited threads, by grid id.
    grid_know: FxMap<u32, Know>,
    /// What finished grids knew of grids still running then (what a grid's threads acquired
    /// is known to every later launch, as stream and event order make it).
    finished_know: Know,
    /// The knowledge each grid's threads start with, by grid id.
    start_know: FxMap<u32, Arc<[(u32, u32)]>>,
    /// Stale values returned (statistics).
    pub stale_reads: u64,
    /// Report data races (`SYMM_SIM_RACES`, default on).
    pub report_races: bool,
    /// The PTX line of the access being made (set by the executor before each access).
    pub line: u32,
    /// A data race the last access made, described (taken by the executor).
    pub race: Option<String>,
    /// "kernel K (grid G, device D)" by grid id, for race reports.
    grid_labels: FxMap<u32, Arc<str>>,
}

impl Weak {
    pub fn new(seed: u64) -> Weak {
        Weak {
            rng: Rng::new(seed),
            locs: FxMap::default(),
            threads: Vec::new(),
            blocks: 0,
            barrier: FxMap::default(),
            finished_at: vec![0],
            finishes: 0,
            block_grid: Vec::new(),
            grid_know: FxMap::default(),
            finished_know: Know::default(),
            start_know: FxMap::default(),
            stale_reads: 0,
            report_races: true,
            line: 0,
            race: None,
            grid_labels: FxMap::default(),
        }
    }

    /// A new grid (`label` names it in race reports): its id and the finish count its threads
    /// see stores up to.
    pub fn new_grid(&mut self, label: String) -> (u32, u32) {
        self.finished_at.push(0);
        let grid = (self.finished_at.len() - 1) as u32;
        self.grid_labels.insert(grid, label.into());
        if !self.finished_know.0.is_empty() {
            self.start_know
                .insert(grid, self.finished_know.0.clone().into());
        }
        (grid, self.finishes)
    }

    /// Grid `grid` finished (or was removed): its stores become visible to later launches, and
    /// so does what its threads knew of grids still running.
    pub fn grid_done(&mut self, grid: u32) {
        self.finishes += 1;
        self.finished_at[grid as usize] = self.finishes;
        self.start_know.remove(&grid);
        if let Some(know) = self.grid_know.remove(&grid) {
            self.finished_know.join(&know.0);
        }
        // Entries about finished grids are covered by their finish.
        let (finished_at, block_grid, threads) =
            (&self.finished_at, &self.block_grid, &self.threads);
        let running = |g: u32| finished_at.get(g as usize).is_some_and(|&f| f == 0);
        self.finished_know.0.retain(|&(k, _)| {
            if k & THREAD != 0 {
                threads
                    .get((k & !THREAD) as usize)
                    .is_some_and(|t| running(t.grid))
            } else {
                block_grid
                    .get(k.wrapping_sub(1) as usize)
                    .is_some_and(|&g| running(g))
            }
        });
    }

    /// A new block id.
    pub fn new_block(&mut self) -> u32 {
        self.blocks += 1;
        self.blocks
    }

    /// A new thread of block `block` of grid `grid` (from [`Weak::new_grid`]); `site` is its
    /// block index and thread index, for race reports.
    pub fn new_thread(&mut self, block: u32, (grid, floor): (u32, u32), site: [u32; 6]) -> u32 {
        if self.block_grid.len() < block as usize {
            self.block_grid.resize(block as usize, 0);
        }
        self.block_grid[block as usize - 1] = grid;
        let know = self
            .start_know
            .get(&grid)
            .map_or_else(Know::default, |k| Know(k.to_vec()));
        self.threads.push(WThread {
            know,
            block,
            grid,
            floor,
            live: true,
            site,
            ..WThread::default()
        });
        (self.threads.len() - 1) as u32
    }

    pub fn thread_exit(&mut self, th: u32) {
        let know = self.snapshot(th);
        let grid = self.threads[th as usize].grid;
        self.grid_know.entry(grid).or_default().join(&know.0);
        let t = &mut self.threads[th as usize];
        t.know = Know::default();
        t.stale = Vec::new();
        t.live = false;
    }

    /// Whether store `r` happens-before the current point of thread `th`.
    fn covered(&self, th: u32, r: &Rec) -> bool {
        self.knows(th, r.thread, r.epoch, r.block, r.phase, r.grid)
    }

    /// Whether an event of thread `thread` (before its store `epoch`, in block phase `phase`
    /// of `block`, in grid `grid`) happens-before the current point of thread `th`.
    fn knows(&self, th: u32, thread: u32, epoch: u32, block: u32, phase: u32, grid: u32) -> bool {
        if thread == u32::MAX || thread == th {
            return true;
        }
        let t = &self.threads[th as usize];
        let done = self.finished_at[grid as usize];
        (done != 0 && done <= t.floor.max(t.know.get(FLOOR)))
            || t.know.get(block) > phase
            || t.know.get(THREAD | thread) >= epoch
    }

    /// "kernel K (grid G, device D), block (x, y, z), thread (x, y, z)" of weak thread `th`.
    fn describe(&self, th: u32) -> String {
        let t = &self.threads[th as usize];
        let s = t.site;
        format!(
            "{}, block ({}, {}, {}), thread ({}, {}, {})",
            self.grid_labels
                .get(&t.grid)
                .map_or("a finished kernel", |l| l),
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            s[5]
        )
    }

    /// Record a data race between this access of `th` and an earlier one of `other`.
    #[allow(clippy::too_many_arguments)]
    fn report(
        &mut self,
        addr: u64,
        bytes: u32,
        this: &str,
        this_strong: bool,
        other: u32,
        other_kind: &str,
        other_strong: bool,
        other_line: u32,
    ) {
        if self.race.is_some() {
            return;
        }
        let how = |strong: bool| if strong { "strong" } else { "plain" };
        self.race = Some(format!(
            "data race: a {} {this} of {bytes} bytes at {addr:#x} and a {} {other_kind} of it by \
             {} at PTX line {other_line}, not ordered by happens-before (plain accesses to \
             memory another thread writes need a release/acquire or a barrier between them)",
            how(this_strong),
            how(other_strong),
            self.describe(other),
        ));
    }

    /// Check a load of `th` against the newest store of `addr`.
    fn check_load(&mut self, th: u32, addr: u64, bytes: u32, strong: bool) {
        let Some(last) = self.locs.get(&addr).and_then(|l| l.recs.last()) else {
            return;
        };
        if (strong && last.strong) || self.covered(th, last) {
            return;
        }
        let (other, line, other_strong) = (last.thread, last.line, last.strong);
        self.report(
            addr,
            bytes,
            "load",
            strong,
            other,
            "store",
            other_strong,
            line,
        );
    }

    /// Check a store of `th` against the newest store of `addr` and the loads since.
    fn check_store(&mut self, th: u32, addr: u64, bytes: u32, strong: bool) {
        let Some(loc) = self.locs.get(&addr) else {
            return;
        };
        let mut found = None;
        if let Some(last) = loc.recs.last()
            && !(strong && last.strong)
            && !self.covered(th, last)
        {
            found = Some((last.thread, "store", last.strong, last.line));
        }
        if found.is_none() {
            found = loc
                .reads
                .iter()
                .find(|r| {
                    let both_strong = strong && r.strong;
                    !both_strong && !self.knows(th, r.thread, r.epoch, r.block, r.phase, r.grid)
                })
                .map(|r| (r.thread, "load", r.strong, r.line));
        }
        if let Some((other, kind, other_strong, line)) = found {
            self.report(
                addr,
                bytes,
                "store",
                strong,
                other,
                kind,
                other_strong,
                line,
            );
        }
    }

    /// Keep a load of `th` for race checks of later stores.
    fn note_read(&mut self, th: u32, addr: u64, strong: bool) {
        let t = &self.threads[th as usize];
        let read = Read {
            thread: th,
            epoch: t.epoch + 1,
            block: t.block,
            phase: t.phase,
            grid: t.grid,
            strong,
            line: self.line,
        };
        let Some(loc) = self.locs.get_mut(&addr) else {
            return;
        };
        if let Some(r) = loc
            .reads
            .iter_mut()
            .find(|r| r.thread == th && r.strong == strong)
        {
            // A later load of the same thread and kind: whatever is ordered after it is
            // ordered after the earlier one too.
            *r = read;
            return;
        }
        if loc.reads.len() >= READS {
            loc.reads.remove(0);
        }
        loc.reads.push(read);
    }

    /// The history of `addr`, consistent with real memory value `cur`.
    fn loc(&mut self, addr: u64, bytes: u32, cur: u64) -> &mut Loc {
        if self.locs.len() > 1 << 22 {
            self.locs.clear();
        }
        let floor = self.finishes;
        let loc = self.locs.entry(addr).or_default();
        if loc.bytes != bytes || loc.recs.last().is_none_or(|r| r.value != cur) {
            loc.reset(bytes, cur, floor);
        }
        loc
    }

    pub fn load(&mut self, th: u32, addr: u64, bytes: u32, s: u8) -> u64 {
        // SAFETY: the caller checked `addr` against the address space.
        let cur = unsafe { host_load(addr, bytes, Ordering::Acquire) };
        let strong = s != sem::WEAK;
        let Some(loc) = self.locs.get(&addr) else {
            if self.report_races {
                self.loc(addr, bytes, cur);
                self.note_read(th, addr, strong);
            }
            return cur;
        };
        if loc.bytes != bytes || loc.recs.last().is_none_or(|r| r.value != cur) {
            self.loc(addr, bytes, cur);
            if self.report_races {
                self.note_read(th, addr, strong);
            }
            return cur;
        }
        if self.report_races {
            self.check_load(th, addr, bytes, strong);
        }
        let loc = &self.locs[&addr];
        let n = loc.recs.len();
        let mut lo = 0;
        if n > 1 {
            for i in (0..n).rev() {
                if self.covered(th, &loc.recs[i]) {
                    lo = i;
                    break;
                }
            }
            let seen = loc.seen_by(th);
            while lo < n - 1 && loc.recs[lo].seq < seen {
                lo += 1;
            }
        }
        let idx = if lo + 1 >= n {
            n - 1
        } else if self.rng.chance(32768) {
            lo
        } else {
            lo + self.rng.below((n - lo) as u64) as usize
        };
        let loc = self.locs.get_mut(&addr).expect("location");
        let rec = loc.recs[idx].clone();
        loc.see(th, rec.seq);
        if idx + 1 < n {
            self.stale_reads += 1;
            self.threads[th as usize].stale.push(addr);
        }
        if s == sem::ACQUIRE
            && let Some(rel) = &rec.rel
        {
            self.threads[th as usize].know.join(rel);
        }
        if self.report_races {
            self.note_read(th, addr, strong);
        }
        rec.value
    }

    /// The knowledge thread `th` publishes with a release now.
    fn snapshot(&self, th: u32) -> Know {
        let t = &self.threads[th as usize];
        let mut k = t.know.clone();
        // What the thread sees of finished grids travels with its releases too.
        k.raise(FLOOR, t.floor);
        // Everything up to now, this release included (its store takes epoch + 1): loads
        // made since the thread's last store are known too.
        k.raise(THREAD | th, t.epoch + 1);
        k.raise(t.block, t.phase);
        k
    }

    fn push(
        &mut self,
        th: u32,
        addr: u64,
        rel: Option<Arc<[(u32, u32)]>>,
        value: u64,
        strong: bool,
    ) {
        let line = self.line;
        let t = &mut self.threads[th as usize];
        t.epoch += 1;
        let rec = Rec {
            value,
            seq: 0,
            grid: t.grid,
            thread: th,
            epoch: t.epoch,
            block: t.block,
            phase: t.phase,
            rel,
            strong,
            line,
        };
        let loc = self.locs.get_mut(&addr).expect("location");
        loc.reads.clear();
        let seq = loc.next_seq;
        loc.next_seq += 1;
        loc.recs.push(Rec { seq, ..rec });
        if loc.recs.len() > HISTORY {
            loc.recs.remove(0);
        }
        loc.see(th, seq);
    }

    pub fn store(&mut self, th: u32, addr: u64, bytes: u32, v: u64, s: u8) {
        // SAFETY: the caller checked `addr` against the address space.
        let cur = unsafe { host_load(addr, bytes, Ordering::Acquire) };
        self.loc(addr, bytes, cur);
        let strong = s != sem::WEAK;
        if self.report_races {
            self.check_store(th, addr, bytes, strong);
        }
        let rel = (s == sem::RELEASE || s == sem::ACQ_REL).then(|| self.snapshot(th).0.into());
        self.push(th, addr, rel, v, strong);
        // SAFETY: as above.
        unsafe { host_store(addr, bytes, v, Ordering::Release) };
    }

    pub fn rmw(
        &mut self,
        th: u32,
        addr: u64,
        bytes: u32,
        s: u8,
        f: &dyn Fn(u64) -> Option<u64>,
    ) -> (u64, bool) {
        let mut new = None;
        // SAFETY: the caller checked `addr` against the address space.
        let old = unsafe {
            host_rmw(addr, bytes, |o| {
                new = f(o);
                new
            })
        };
        self.loc(addr, bytes, old);
        if self.report_races {
            // An atomic is a strong load and, when it writes, a strong store.
            if new.is_some() {
                self.check_store(th, addr, bytes, true);
            } else {
                self.check_load(th, addr, bytes, true);
                self.note_read(th, addr, true);
            }
        }
        let loc = self.locs.get_mut(&addr).expect("location");
        let read = loc.recs.last().expect("history").clone();
        loc.see(th, read.seq);
        if (s == sem::ACQUIRE || s == sem::ACQ_REL)
            && let Some(rel) = &read.rel
        {
            self.threads[th as usize].know.join(rel);
        }
        if let Some(v) = new {
            // A release RMW publishes; any RMW continues the release sequence it read.
            let mut rel: Option<Know> = read.rel.as_deref().map(|r| Know(r.to_vec()));
            if s == sem::RELEASE || s == sem::ACQ_REL {
                let mine = self.snapshot(th);
                match &mut rel {
                    Some(k) => k.join(&mine.0),
                    None => rel = Some(mine),
                }
            }
            self.push(th, addr, rel.map(|k| k.0.into()), v, true);
        }
        (old, new.is_some())
    }

    /// Thread `th` arrives at block `block`'s barrier.
    pub fn barrier_arrive(&mut self, th: u32, block: u32) {
        let know = std::mem::take(&mut self.threads[th as usize].know);
        self.barrier.entry(block).or_default().join(&know.0);
        self.threads[th as usize].know = know;
    }

    /// Thread `th` leaves block `block`'s barrier: it knows what every participant knew and
    /// every event of the block before the barrier.
    pub fn barrier_leave(&mut self, th: u32, block: u32) {
        let joined = self.barrier.get(&block).cloned().unwrap_or_default();
        let t = &mut self.threads[th as usize];
        t.phase += 1;
        let mut know = joined;
        know.raise(block, t.phase);
        // Thread entries of this block are covered by the phase now.
        let threads = &self.threads;
        know.0.retain(|&(k, _)| {
            k & THREAD == 0
                || threads
                    .get((k & !THREAD) as usize)
                    .is_none_or(|t| t.block != block)
        });
        self.threads[th as usize].know = know;
    }

    /// Block `block`'s barrier completed.
    pub fn barrier_done(&mut self, block: u32) {
        self.barrier.remove(&block);
    }

    /// Thread `th` sleeps: whether it read stale values since its last sleep (then it must
    /// not park; it sees at least the newest values of those locations from now on).
    pub fn on_sleep(&mut self, th: u32) -> bool {
        let stale = std::mem::take(&mut self.threads[th as usize].stale);
        if stale.is_empty() {
            return false;
        }
        for addr in &stale {
            if let Some(loc) = self.locs.get_mut(addr)
                && let Some(last) = loc.recs.last()
            {
                let seq = last.seq;
                loc.see(th, seq);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knowledge_joins_by_maximum() {
        let mut a = Know(vec![(1, 3), (5, 1), (THREAD | 2, 7)]);
        a.join(&[(1, 2), (4, 4), (THREAD | 2, 9)]);
        assert_eq!(a.0, vec![(1, 3), (4, 4), (5, 1), (THREAD | 2, 9)]);
        a.raise(0, 1);
        assert_eq!(a.get(0), 1);
        assert_eq!(a.get(7), 0);
    }
}
