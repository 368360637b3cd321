//! The device thread: the one thread of the process that owns the [`Simulator`]. It starts
//! the stream operations that are ready, in an order drawn from the seeded generator, runs the
//! simulator, completes operations as their grids finish, and turns faults into sticky
//! context errors. When every grid waits, it lets virtual time follow real time and wakes the
//! grids now and then (another process or a host thread may store to the memory they watch),
//! and reports a stall that lasts.

use crate::state::{CopySource, Driver, OpKind, Query, State, trace};
use crate::util::Rng;
use cudarc::driver::sys::{CUresult, cudaError_enum as E};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use symm_sim::{GridId, Launch, RunOutcome, Simulator};

/// Instructions per [`Simulator::run`] call between looks at the queue.
const BUDGET: u64 = 20_000;

/// How often a stalled simulator's sleeping threads are woken to look at memory again (another
/// process or a host thread may have stored to what they watch).
const WAKE_PERIOD: Duration = Duration::from_millis(1);

/// Start the device thread of `driver`.
pub(crate) fn spawn(driver: &'static Driver) {
    std::thread::Builder::new()
        .name("symm-sim-device".into())
        .spawn(move || Engine::new(driver).run())
        .expect("starting the simulated device's thread");
}

/// A grid the driver launched.
struct Grid {
    op: u64,
    device: u32,
    name: String,
}

/// A stall episode: from the first `Stalled` until something happens (an operation starts or
/// completes, a grid finishes or faults, the grids do real work).
struct Stall {
    /// Real and virtual time when it began: while it lasts, virtual time follows real time.
    since: Instant,
    virtual_ns: u64,
    /// Reported as a possible deadlock.
    reported: bool,
    /// When the sleeping threads were last woken.
    last_wake: Instant,
    /// The simulated threads' stores at the last `Stalled`: threads that only woke, polled
    /// and slept again since (however many instructions that took) did not end the episode.
    stores: u64,
}

/// The device thread's state.
struct Engine {
    driver: &'static Driver,
    sim: Simulator,
    rng: Rng,
    grids: HashMap<GridId, Grid>,
    /// Grids whose context failed: still in the simulator, their completion ignored.
    abandoned: HashSet<GridId>,
    stall: Option<Stall>,
    /// Start every ready operation in the next round (after a stall).
    start_all: bool,
    /// When the last heartbeat was traced (`SYMM_SIM_TRACE`).
    heartbeat: Instant,
}

/// Real time between two heartbeats in the trace (what the grids are doing while nothing
/// completes).
const HEARTBEAT: Duration = Duration::from_secs(2);

/// The sticky error for a fault report (its first line says what happened).
pub(crate) fn fault_code(report: &str) -> CUresult {
    let what = report.lines().next().unwrap_or("").to_ascii_lowercase();
    if what.contains("misaligned") {
        E::CUDA_ERROR_MISALIGNED_ADDRESS
    } else if what.contains("out-of-bounds")
        || what.contains("may not access")
        || what.contains("address")
    {
        E::CUDA_ERROR_ILLEGAL_ADDRESS
    } else if what.contains("unsupported") || what.contains("illegal instruction") {
        E::CUDA_ERROR_ILLEGAL_INSTRUCTION
    } else {
        E::CUDA_ERROR_LAUNCH_FAILED
    }
}

impl Engine {
    fn new(driver: &'static Driver) -> Engine {
        Engine {
            driver,
            sim: Simulator::new(driver.config.clone(), driver.memory.clone()),
            rng: Rng::new(driver.config.seed),
            grids: HashMap::new(),
            abandoned: HashSet::new(),
            stall: None,
            start_all: false,
            heartbeat: Instant::now(),
        }
    }

    fn run(mut self) {
        loop {
            let (queries, batch) = self.next_batch();
            for query in queries {
                self.answer(query);
            }
            if !batch.is_empty() {
                self.stall = None;
            }
            for (id, device, kind) in batch {
                self.start(id, device, kind);
            }
            if self.grids.is_empty() && self.abandoned.is_empty() {
                continue;
            }
            let outcome = self.sim.run(BUDGET);
            crate::HOST_READS.store(
                self.sim.stats().host_reads,
                std::sync::atomic::Ordering::Relaxed,
            );
            self.handle(outcome);
            if self.heartbeat.elapsed() >= HEARTBEAT {
                self.heartbeat = Instant::now();
                let (stats, now) = (self.sim.stats(), self.sim.now_ns());
                let names: Vec<&str> = self.grids.values().map(|g| g.name.as_str()).collect();
                trace(|| {
                    format!(
                        "heartbeat: virtual time {now} ns, {} instructions, {} parks, {}; \
                         grids: {}",
                        stats.instructions,
                        stats.sleeps_parked,
                        if self.stall.is_some() {
                            "stalled"
                        } else {
                            "running"
                        },
                        names.join(", ")
                    )
                });
            }
        }
    }

    /// Wait for something to do; take the queries and the operations to start now.
    #[allow(clippy::type_complexity)]
    fn next_batch(&mut self) -> (Vec<Query>, Vec<(u64, u32, OpKind)>) {
        let driver = self.driver;
        let mut state = driver.lock();
        loop {
            let queries = std::mem::take(&mut state.queries);
            let batch = self.choose(&mut state);
            if !queries.is_empty()
                || !batch.is_empty()
                || !self.grids.is_empty()
                || !self.abandoned.is_empty()
            {
                return (queries, batch);
            }
            state = driver
                .work
                .wait_timeout(state, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Pick ready operations to start: all after a stall, else each with probability 1/2 (at
    /// least one when no grid runs), in a random order. Marks them running.
    fn choose(&mut self, state: &mut State) -> Vec<(u64, u32, OpKind)> {
        let mut ready = state.ready();
        if ready.is_empty() {
            return Vec::new();
        }
        self.rng.shuffle(&mut ready);
        let all = std::mem::take(&mut self.start_all);
        let mut chosen: Vec<u64> = if all {
            ready.clone()
        } else {
            ready
                .iter()
                .copied()
                .filter(|_| self.rng.next() & 1 == 0)
                .collect()
        };
        if chosen.is_empty() && self.grids.is_empty() {
            chosen.push(ready[0]);
        }
        chosen
            .into_iter()
            .map(|id| {
                let op = state.ops.get_mut(&id).expect("ready op");
                op.running = true;
                (id, op.device, op.kind.clone())
            })
            .collect()
    }

    fn answer(&mut self, query: Query) {
        query(&mut self.sim);
    }

    /// Complete operation `id` now.
    fn complete(&mut self, id: u64) {
        let now = self.sim.now_ns();
        let executed = self.sim.stats().instructions;
        trace(|| format!("complete op {id} at {now} ns ({executed} instructions executed so far)"));
        self.driver.lock().complete(id, now);
        self.driver.done.notify_all();
    }

    /// Poison `device`'s context: drop its operations, abandon its grids.
    fn fail_device(&mut self, device: u32, code: CUresult) {
        self.driver.lock().fail_device(device, code);
        let failed: Vec<GridId> = self
            .grids
            .iter()
            .filter(|(_, g)| g.device == device)
            .map(|(&id, _)| id)
            .collect();
        for id in failed {
            self.grids.remove(&id);
            self.abandoned.insert(id);
        }
        self.driver.done.notify_all();
    }

    /// A copy or memset (`what`) reached memory no longer mapped for `device` by the time it
    /// ran: the context fails with an illegal address, as a kernel's access would.
    fn refuse_unmapped(&mut self, device: u32, what: &str) {
        eprintln!(
            "symm-sim: device {device}: {what} touches memory that is no longer mapped for the \
             device"
        );
        self.fail_device(device, E::CUDA_ERROR_ILLEGAL_ADDRESS);
    }

    fn start(&mut self, id: u64, device: u32, kind: OpKind) {
        trace(|| format!("start op {id} (device {device})"));
        match kind {
            OpKind::Kernel(k) => {
                let launch = Launch {
                    device,
                    module: k.module.clone(),
                    kernel: k.kernel,
                    grid: k.grid,
                    block: k.block,
                    params: k.params.clone(),
                };
                match self.sim.launch(launch) {
                    Ok(grid) => {
                        self.grids.insert(
                            grid,
                            Grid {
                                op: id,
                                device,
                                name: k.name.clone(),
                            },
                        );
                    }
                    Err(e) => {
                        eprintln!(
                            "symm-sim: device {device}: launching kernel {} failed: {e} (seed {})",
                            k.name, self.driver.config.seed
                        );
                        self.fail_device(device, E::CUDA_ERROR_LAUNCH_FAILED);
                    }
                }
            }
            OpKind::Copy {
                dst,
                src,
                len,
                device_dst,
                device_src,
            } => {
                let valid = {
                    let state = self.driver.lock();
                    let src_ok = match src {
                        CopySource::Address(a) if device_src => {
                            state.check_device_memory(a, len).is_ok()
                        }
                        _ => true,
                    };
                    src_ok && (!device_dst || state.check_device_memory(dst, len).is_ok())
                };
                if !valid {
                    self.refuse_unmapped(device, &format!("a copy of {len} bytes to {dst:#x}"));
                    return;
                }
                match src {
                    // SAFETY: both ranges were checked when the copy was enqueued (and the
                    // device sides again just now): device memory is host memory of this
                    // process, and host pointers are the caller's, valid until the copy
                    // completes (the driver's contract for asynchronous copies).
                    CopySource::Address(a) => unsafe {
                        std::ptr::copy(a as *const u8, dst as *mut u8, len as usize)
                    },
                    // SAFETY: as above for the destination; the source is our own buffer.
                    CopySource::Staged(bytes) => unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, len as usize)
                    },
                }
                self.sim.wake_all();
                self.complete(id);
            }
            OpKind::Memset { dst, value, len } => {
                let valid = self.driver.lock().check_device_memory(dst, len).is_ok();
                if !valid {
                    self.refuse_unmapped(device, &format!("a memset of {len} bytes at {dst:#x}"));
                    return;
                }
                // SAFETY: a device range checked just now; device memory is host memory.
                unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
                self.sim.wake_all();
                self.complete(id);
            }
            OpKind::Record { .. } | OpKind::Marker => self.complete(id),
        }
    }

    fn handle(&mut self, outcome: RunOutcome) {
        if !matches!(outcome, RunOutcome::Budget | RunOutcome::Stalled) {
            trace(|| format!("simulator: {outcome:?}"));
        }
        match outcome {
            RunOutcome::Finished(grids) => {
                self.stall = None;
                for g in grids {
                    self.abandoned.remove(&g);
                    if let Some(grid) = self.grids.remove(&g) {
                        self.complete(grid.op);
                    }
                }
            }
            RunOutcome::Idle => {
                self.stall = None;
                self.abandoned.clear();
                if !self.grids.is_empty() {
                    eprintln!(
                        "symm-sim: the simulator reports no running grid while {} are launched; \
                         completing them",
                        self.grids.len()
                    );
                    let ops: Vec<u64> = self.grids.drain().map(|(_, g)| g.op).collect();
                    for op in ops {
                        self.complete(op);
                    }
                }
            }
            RunOutcome::Budget => {}
            RunOutcome::Fault(g, report) => {
                self.stall = None;
                self.abandoned.remove(&g);
                if let Some(grid) = self.grids.remove(&g) {
                    eprintln!(
                        "symm-sim: device {}: kernel {} faulted (seed {}):\n{report}",
                        grid.device, grid.name, self.driver.config.seed
                    );
                    self.fail_device(grid.device, fault_code(&report));
                }
            }
            RunOutcome::Stalled => self.stalled(),
        }
    }

    /// Every grid waits. Start what is ready; else let virtual time follow real time (napping
    /// until a sleeping thread's wake-up time or the next periodic wake-up of all of them);
    /// report (and with `SYMM_SIM_DEADLOCK=fail` fail) an episode that lasts.
    fn stalled(&mut self) {
        let driver = self.driver;
        {
            let state = driver.lock();
            if !state.ready().is_empty() || !state.queries.is_empty() {
                self.start_all = true;
                return;
            }
        }
        let stores = self.sim.stores();
        let now = Instant::now();
        if self.stall.as_ref().is_some_and(|s| s.stores != stores) {
            // The grids stored since the last stall (real work, not only polling): a new
            // episode. Polling rounds of thousands of threads can take longer in real time
            // than the virtual time they cover; they must not hold virtual time back, or a
            // kernel's bounded wait would take hours to time out.
            self.stall = None;
        }
        let virtual_now = self.sim.now_ns();
        let stall = self.stall.get_or_insert(Stall {
            since: now,
            virtual_ns: virtual_now,
            reported: false,
            last_wake: now,
            stores,
        });
        let target = |s: &Stall| s.virtual_ns + s.since.elapsed().as_nanos() as u64;
        let next = self.sim.next_wakeup_ns();
        if next.is_none_or(|n| n > target(stall)) {
            // Nothing can happen before real time passes: nap (new work wakes us early).
            let until_timer = next.map_or(WAKE_PERIOD, |n| {
                Duration::from_nanos(n.saturating_sub(target(stall)))
            });
            let until_wake = WAKE_PERIOD.saturating_sub(stall.last_wake.elapsed());
            let nap = until_timer.min(until_wake).max(Duration::from_micros(20));
            let state = driver.lock();
            if state.ready().is_empty() && state.queries.is_empty() {
                let _ = driver.work.wait_timeout(state, nap);
            }
        }
        self.sim.advance_time_to(target(stall));
        if stall.last_wake.elapsed() >= WAKE_PERIOD {
            stall.last_wake = Instant::now();
            self.sim.wake_all();
        }
        let elapsed = stall.since.elapsed();
        let report_now = !stall.reported
            && !self.grids.is_empty()
            && elapsed >= Duration::from_millis(driver.options.deadlock_ms);
        if !report_now {
            return;
        }
        stall.reported = true;
        let names: Vec<String> = self
            .grids
            .values()
            .map(|g| format!("{} (device {})", g.name, g.device))
            .collect();
        eprintln!(
            "symm-sim: deadlock? no progress for {} ms of real time (seed {}); waiting grids: \
             {}\n{}",
            elapsed.as_millis(),
            driver.config.seed,
            names.join(", "),
            self.sim.stall_report()
        );
        if driver.options.deadlock_fail {
            let devices: HashSet<u32> = self.grids.values().map(|g| g.device).collect();
            let mut devices: Vec<u32> = devices.into_iter().collect();
            devices.sort_unstable();
            for device in devices {
                self.fail_device(device, E::CUDA_ERROR_LAUNCH_TIMEOUT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_reports_map_to_cuda_errors() {
        assert_eq!(
            fault_code("out-of-bounds ld.global of 4 bytes at 0x10\n  kernel k"),
            E::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert_eq!(
            fault_code(
                "st of 4 bytes at 0x10 in 'x' [0x0, 0x20) from device 1, which may not access it"
            ),
            E::CUDA_ERROR_ILLEGAL_ADDRESS
        );
        assert_eq!(
            fault_code("trap\n  at ld.global.u32 (address)"),
            E::CUDA_ERROR_LAUNCH_FAILED
        );
        assert_eq!(
            fault_code("misaligned st.global.u64"),
            E::CUDA_ERROR_MISALIGNED_ADDRESS
        );
        assert_eq!(fault_code("trap"), E::CUDA_ERROR_LAUNCH_FAILED);
    }
}
