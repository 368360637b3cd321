//! [`Simulator`]: one simulated GPU, its state (grids, resident blocks, threads) and its
//! interface to the driver: launching grids, running them, time, counters, aborting. How it
//! schedules, parks, keeps barriers, makes blocks resident and reports faults is in the
//! modules of those concepts ([`crate::schedule`], [`crate::sleep`], [`crate::barrier`],
//! [`crate::residency`], [`crate::fault`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use crate::config::SimConfig;
use crate::error::{SimError, sim_err};
use crate::exec::{self, Thread};
use crate::ir::slot;
use crate::memory::{self, AddressSpace};
use crate::module::{KernelId, Module};
use crate::residency::{Device, MAX_BLOCK_THREADS, Sm, blocks_per_sm_for, regs_per_warp};
use crate::rng::Rng;
use crate::schedule::{Policy, Sched};
use crate::weak;

/// A grid started by [`Simulator::launch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GridId(pub u64);

/// A launch: the kernel, its shape and its parameter values (one byte buffer per `.param`,
/// sizes as [`Module::kernel_params`] says).
#[derive(Clone, Debug)]
pub struct Launch {
    /// The device it runs on (its SMs, its access rights).
    pub device: u32,
    /// The module holding the kernel.
    pub module: Arc<Module>,
    /// The kernel.
    pub kernel: KernelId,
    /// Blocks (x, y, z).
    pub grid: [u32; 3],
    /// Threads per block (x, y, z).
    pub block: [u32; 3],
    /// One buffer per parameter.
    pub params: Vec<Vec<u8>>,
}

/// What [`Simulator::run`] stopped on.
#[derive(Clone, Debug)]
pub enum RunOutcome {
    /// These grids finished (every thread exited).
    Finished(Vec<GridId>),
    /// No grid is running.
    Idle,
    /// The step budget ran out with grids still running.
    Budget,
    /// Every live thread waits (spins on memory no running thread will store to, or a block
    /// barrier other threads cannot reach, or a block not resident waits for residency):
    /// only a store from outside (host, another process) or more virtual time can help.
    /// [`Simulator::stall_report`] says who waits where (built only when asked: stalls are
    /// frequent while kernels wait on each other, reports rare).
    Stalled,
    /// A grid faulted (trap, out-of-bounds access, unsupported instruction, bad barrier use):
    /// the report names the kernel, block, thread, PTX line and seed. The grid is gone.
    Fault(GridId, String),
}

/// Counters of a simulation ([`Simulator::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Instructions executed (all threads).
    pub instructions: u64,
    /// Scheduling decisions (a thread ran until its next switch).
    pub slices: u64,
    /// `nanosleep`s that parked their thread.
    pub sleeps_parked: u64,
    /// Loads that returned an older store (weak memory).
    pub stale_reads: u64,
    /// Loads and atomics GPU threads executed on host memory ([`AddressSpace::map_host`]).
    pub host_reads: u64,
}

/// One simulated GPU: the grids running on it and the scheduler. Not `Sync`: one OS thread
/// drives it.
#[derive(Debug)]
pub struct Simulator {
    // Crate-visible: the `impl Simulator` blocks of the scheduling, sleep, barrier, residency
    // and fault modules work on this state.
    pub(crate) config: SimConfig,
    pub(crate) mem: memory::MemView,
    pub(crate) rng: Rng,
    pub(crate) policy: Policy,
    pub(crate) now: u64,
    /// Instructions executed towards the next nanosecond.
    pub(crate) time_frac: u64,
    /// Threads of resident blocks not exited.
    pub(crate) live_threads: u64,
    pub(crate) instructions: u64,
    pub(crate) slices: u64,
    pub(crate) parks: u64,
    /// Host-memory reads that cost time, and when the PCIe link is free again.
    pub(crate) host_reads: u64,
    pub(crate) host_link_free_at: u64,
    /// Wake-ups of threads parked by host reads (also in `timers`).
    pub(crate) host_read_timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    pub(crate) trace: u64,
    pub(crate) next_grid: u64,
    pub(crate) next_token: u32,
    pub(crate) grids: Vec<Option<Grid>>,
    /// Live grid slots in launch order.
    pub(crate) grid_order: Vec<u32>,
    pub(crate) blocks: Vec<Option<Block>>,
    pub(crate) free_blocks: Vec<u32>,
    pub(crate) threads: Vec<Option<Box<Thread>>>,
    pub(crate) free_threads: Vec<u32>,
    pub(crate) devices: Vec<Device>,
    pub(crate) run_list: Vec<u32>,
    pub(crate) run_pos: Vec<u32>,
    /// Scheduling state by thread slot.
    pub(crate) sched: Vec<Sched>,
    /// PCT: `heap_key(priority, thread)` of runnable threads (lazily cleaned).
    pub(crate) heap: BinaryHeap<u64>,
    pub(crate) timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    pub(crate) pct_countdown: u64,
    pub(crate) stores: exec::Stores,
    pub(crate) weak: Option<weak::Weak>,
    pub(crate) finished: Vec<GridId>,
    pub(crate) faults: Vec<(GridId, String)>,
    pub(crate) strict_barriers: bool,
}

/// A running grid.
#[derive(Debug)]
pub(crate) struct Grid {
    pub id: GridId,
    pub module: Arc<Module>,
    pub kernel: u32,
    pub device: u32,
    pub dims: [u32; 3],
    pub block_dims: [u32; 3],
    pub params: Box<[u8]>,
    pub entry_pc: u32,
    pub next_block: u64,
    pub total_blocks: u64,
    /// Live block slots.
    pub blocks: Vec<u32>,
    /// Register file template (constants, `%ntid`, `%nctaid` filled in).
    pub template: Box<[u64]>,
    pub threads_per_block: u32,
    /// Weak memory: the grid's id and the finish count it sees.
    pub weak_grid: (u32, u32),
    /// SM resources one block takes: threads (warp-rounded) and registers.
    pub res_threads: u32,
    pub res_regs: u32,
}

/// A resident block.
#[derive(Debug)]
pub(crate) struct Block {
    pub grid: u32,
    pub ctaid: [u32; 3],
    pub device: u32,
    pub sm: u32,
    pub threads: Vec<u32>,
    pub live: u32,
    /// Barrier: threads arrived, the instruction, how many had a true predicate, who waits.
    pub arrived: u32,
    pub bar_pc: u32,
    pub bar_true: u32,
    pub waiting: Vec<u32>,
    /// Weak-memory block id.
    pub weak_block: u32,
    /// The block's local memory (every thread's frame, one after another), mapped for the
    /// block's device while the block lives; `None` when the module has no `.local`
    /// variables.
    pub local: Option<Box<[std::sync::atomic::AtomicU64]>>,
}

impl Simulator {
    /// A simulator over `memory`.
    pub fn new(config: SimConfig, memory: Arc<AddressSpace>) -> Simulator {
        let mut rng = Rng::new(config.seed);
        let policy = Policy::draw(&mut rng);
        let pct_countdown = 1 + rng.below(2 * policy.pct_mean);
        let weak = config.weak_memory.then(|| {
            let mut w = weak::Weak::new(rng.next_u64());
            w.report_races = config.races;
            w
        });
        Simulator {
            mem: memory::MemView::new(memory),
            rng,
            policy,
            now: 0,
            time_frac: 0,
            live_threads: 0,
            instructions: 0,
            slices: 0,
            parks: 0,
            host_reads: 0,
            host_link_free_at: 0,
            host_read_timers: BinaryHeap::new(),
            trace: 0,
            next_grid: 1,
            next_token: 0,
            grids: Vec::new(),
            grid_order: Vec::new(),
            blocks: Vec::new(),
            free_blocks: Vec::new(),
            threads: Vec::new(),
            free_threads: Vec::new(),
            devices: Vec::new(),
            run_list: Vec::new(),
            run_pos: Vec::new(),
            sched: Vec::new(),
            heap: BinaryHeap::new(),
            timers: BinaryHeap::new(),
            pct_countdown,
            stores: exec::Stores::default(),
            weak,
            finished: Vec::new(),
            faults: Vec::new(),
            strict_barriers: true,
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Start a grid (its blocks become resident as room allows).
    pub fn launch(&mut self, launch: Launch) -> Result<GridId, SimError> {
        let prog = &launch.module.prog;
        let kernel = prog
            .kernels
            .get(launch.kernel.0 as usize)
            .ok_or_else(|| sim_err(format!("no kernel {:?} in this module", launch.kernel)))?;
        if launch.params.len() != kernel.params.len() {
            return Err(sim_err(format!(
                "{} takes {} parameters, the launch gives {}",
                kernel.name,
                kernel.params.len(),
                launch.params.len()
            )));
        }
        let mut params = vec![0u8; kernel.param_bytes];
        for (k, (value, info)) in launch.params.iter().zip(&kernel.params).enumerate() {
            if value.len() != info.size {
                return Err(sim_err(format!(
                    "{} parameter {k} is {} bytes, the launch gives {}",
                    kernel.name,
                    info.size,
                    value.len()
                )));
            }
            let off = kernel.offsets[k];
            params[off..off + info.size].copy_from_slice(value);
        }
        let threads_per_block = launch.block.iter().try_fold(1u32, |a, &d| a.checked_mul(d));
        let threads_per_block = match threads_per_block {
            Some(n) if (1..=MAX_BLOCK_THREADS).contains(&n) => n,
            _ => {
                return Err(sim_err(format!(
                    "{}: block {:?} is not 1 to {MAX_BLOCK_THREADS} threads",
                    kernel.name, launch.block
                )));
            }
        };
        if launch.grid.contains(&0) {
            return Err(sim_err(format!(
                "{}: empty grid {:?}",
                kernel.name, launch.grid
            )));
        }
        let regs = self.config.registers_per_thread;
        if blocks_per_sm_for(regs, threads_per_block) == 0 {
            return Err(sim_err(format!(
                "{}: a block of {threads_per_block} threads at {regs} registers per thread does not fit on an SM",
                kernel.name
            )));
        }
        let total_blocks = launch.grid.iter().map(|&d| d as u64).product();
        let func = &prog.funcs[kernel.func as usize];
        let mut template = prog.template.clone();
        for d in 0..3 {
            template[(slot::NTID + d) as usize] = launch.block[d as usize] as u64;
            template[(slot::NCTAID + d) as usize] = launch.grid[d as usize] as u64;
        }
        let warps = threads_per_block.div_ceil(32);
        let id = GridId(self.next_grid);
        self.next_grid += 1;
        if !self.devices.iter().any(|d| d.id == launch.device) {
            self.devices.push(Device {
                id: launch.device,
                sms: vec![Sm::default(); self.config.sms.max(1) as usize],
            });
        }
        let grid = Grid {
            id,
            kernel: launch.kernel.0,
            device: launch.device,
            dims: launch.grid,
            block_dims: launch.block,
            params: params.into(),
            entry_pc: func.start,
            next_block: 0,
            total_blocks,
            blocks: Vec::new(),
            template: template.into(),
            threads_per_block,
            weak_grid: match self.weak.as_mut() {
                Some(w) => w.new_grid(format!(
                    "kernel {} (grid {}, device {})",
                    launch.module.prog.kernels[launch.kernel.0 as usize].name, id.0, launch.device
                )),
                None => (0, 0),
            },
            res_threads: warps * 32,
            res_regs: warps * regs_per_warp(regs),
            module: launch.module.clone(),
        };
        let slot_ = match self.grids.iter().position(|g| g.is_none()) {
            Some(s) => {
                self.grids[s] = Some(grid);
                s
            }
            None => {
                self.grids.push(Some(grid));
                self.grids.len() - 1
            }
        } as u32;
        self.grid_order.push(slot_);
        self.start_blocks();
        Ok(id)
    }

    /// Blocks of `block_threads` threads of `kernel` that fit on one SM.
    pub fn blocks_per_sm(&self, module: &Module, kernel: KernelId, block_threads: u32) -> u32 {
        if module.prog.kernels.get(kernel.0 as usize).is_none() {
            return 0;
        }
        blocks_per_sm_for(self.config.registers_per_thread, block_threads)
    }

    /// Virtual `%globaltimer` now, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// Move virtual time forward to at least `ns` (when stalled, the driver lets time pass).
    pub fn advance_time_to(&mut self, ns: u64) {
        self.now = self.now.max(ns);
    }

    /// Stores to global memory executed so far (all threads; atomics included).
    pub fn stores(&self) -> u64 {
        self.stores.seq
    }

    /// Instructions executed so far (all threads).
    pub fn instructions(&self) -> u64 {
        self.instructions
    }

    /// Counters of the simulation so far.
    pub fn stats(&self) -> SimStats {
        SimStats {
            instructions: self.instructions,
            slices: self.slices,
            sleeps_parked: self.parks,
            host_reads: self.host_reads,
            stale_reads: self.weak.as_ref().map_or(0, |w| w.stale_reads),
        }
    }

    /// A hash of the scheduling decisions so far: equal for equal seeds and launches.
    pub fn trace_hash(&self) -> u64 {
        self.trace
    }

    /// Whether threads of one block waiting at *different* non-`.aligned` `barrier.sync`
    /// instructions is a fault (default: yes; PTX allows it, symm's kernels never mean it).
    pub fn set_strict_barriers(&mut self, strict: bool) {
        self.strict_barriers = strict;
    }

    /// Remove running grid `grid` at once (its blocks leave their SMs; no `Finished` or
    /// `Fault` follows for it). Returns whether it was running.
    pub fn abort(&mut self, grid: GridId) -> bool {
        let Some(pos) = self.grid_order.iter().position(|&g| {
            self.grids[g as usize]
                .as_ref()
                .is_some_and(|x| x.id == grid)
        }) else {
            return false;
        };
        let g = self.grid_order[pos];
        self.kill_grid(g);
        self.faults.retain(|(id, _)| *id != grid);
        self.finished.retain(|id| *id != grid);
        true
    }

    /// Grids still running.
    pub fn running_grids(&self) -> Vec<GridId> {
        self.grid_order
            .iter()
            .filter_map(|&g| self.grids[g as usize].as_ref().map(|g| g.id))
            .collect()
    }
}
