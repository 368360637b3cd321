//! Residency: the SM resources blocks occupy (threads, registers, block slots), how many
//! blocks of a kernel fit on an SM, and the life of a block: made resident in launch and index
//! order while it fits, non-preemptively, until its last thread exits or its grid is removed.

use crate::exec::{TState, Thread};
use crate::ir::slot;
use crate::schedule::Sched;
use crate::simulator::{Block, Simulator};

/// Threads per SM.
const SM_THREADS: u32 = 2048;
/// Registers per SM.
const SM_REGS: u32 = 65536;
/// Resident blocks per SM.
const SM_BLOCKS: u32 = 32;
/// Threads per block at most.
pub(crate) const MAX_BLOCK_THREADS: u32 = 1024;

/// Registers one warp of a kernel using `regs` registers per thread occupies (allocated in
/// units of 256 per warp).
pub(crate) fn regs_per_warp(regs: u32) -> u32 {
    (regs.max(1) * 32).div_ceil(256) * 256
}

/// Blocks of `block_threads` threads fitting on one SM at `regs` registers per thread.
pub(crate) fn blocks_per_sm_for(regs: u32, block_threads: u32) -> u32 {
    if block_threads == 0 || block_threads > MAX_BLOCK_THREADS || regs > 255 {
        return 0;
    }
    let warps = block_threads.div_ceil(32);
    let by_threads = SM_THREADS / (warps * 32);
    let by_regs = SM_REGS / (warps * regs_per_warp(regs));
    by_threads.min(by_regs).min(SM_BLOCKS)
}

/// Resource use of one SM.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sm {
    pub threads: u32,
    pub regs: u32,
    pub blocks: u32,
}

/// One device's SMs.
#[derive(Debug)]
pub(crate) struct Device {
    pub id: u32,
    pub sms: Vec<Sm>,
}

impl Simulator {
    /// Thread `tid` exited: its block finishes with its last thread, and a barrier the rest
    /// of the block waits at completes without it.
    pub(crate) fn thread_exit(&mut self, tid: u32) {
        self.make_unrunnable(tid, TState::Exited);
        let t = self.threads[tid as usize].as_mut().expect("thread");
        t.regs = Box::new([]);
        t.frames = Vec::new();
        let b = t.block;
        let weak_id = t.weak_id;
        if let Some(w) = self.weak.as_mut() {
            w.thread_exit(weak_id);
        }
        let block = self.blocks[b as usize].as_mut().expect("block");
        block.live -= 1;
        self.live_threads -= 1;
        if block.live == 0 {
            self.finish_block(b);
        } else if block.arrived > 0 && block.arrived == block.live {
            // Exited threads do not take part in barriers (PTX: non-exited threads).
            self.release_barrier(b);
        }
    }

    /// Remove block `b`: its local memory unmapped, its threads freed, its SM resources
    /// returned.
    fn free_block(&mut self, b: u32) -> Block {
        let mut block = self.blocks[b as usize].take().expect("block");
        if let Some(words) = block.local.take() {
            let base = (words.as_ptr() as u64).div_ceil(16) * 16;
            let len = (words.len() as u64 - 2) * 8;
            self.mem.space.unmap(base, len);
        }
        self.live_threads -= block.live as u64;
        for &tid in &block.threads {
            self.make_unrunnable(tid, TState::Exited);
            self.threads[tid as usize] = None;
            self.free_threads.push(tid);
        }
        let grid = self.grids[block.grid as usize].as_mut().expect("grid");
        grid.blocks.retain(|&x| x != b);
        let (rt, rr) = (grid.res_threads, grid.res_regs);
        let dev = self
            .devices
            .iter_mut()
            .find(|d| d.id == block.device)
            .expect("device");
        let sm = &mut dev.sms[block.sm as usize];
        sm.threads -= rt;
        sm.regs -= rr;
        sm.blocks -= 1;
        self.free_blocks.push(b);
        block
    }

    /// Block `b` finished: its grid finishes with its last block; waiting blocks may now
    /// fit.
    fn finish_block(&mut self, b: u32) {
        let block = self.free_block(b);
        let g = block.grid;
        let grid = self.grids[g as usize].as_ref().expect("grid");
        if grid.blocks.is_empty() && grid.next_block == grid.total_blocks {
            self.finished.push(grid.id);
            self.remove_grid(g);
        }
        self.start_blocks();
    }

    /// Forget grid slot `g` (its blocks are gone).
    fn remove_grid(&mut self, g: u32) {
        let grid = self.grids[g as usize].take().expect("grid");
        if let Some(w) = self.weak.as_mut() {
            w.grid_done(grid.weak_grid.0);
        }
        self.grid_order.retain(|&x| x != g);
    }

    /// Make blocks resident while they fit, grids in launch order, blocks in index order.
    pub(crate) fn start_blocks(&mut self) {
        for oi in 0..self.grid_order.len() {
            let g = self.grid_order[oi];
            loop {
                let grid = self.grids[g as usize].as_ref().expect("grid");
                if grid.next_block >= grid.total_blocks {
                    break;
                }
                let (rt, rr) = (grid.res_threads, grid.res_regs);
                let dev = self
                    .devices
                    .iter_mut()
                    .find(|d| d.id == grid.device)
                    .expect("device");
                let Some(sm) = dev.sms.iter().position(|s| {
                    s.threads + rt <= SM_THREADS && s.regs + rr <= SM_REGS && s.blocks < SM_BLOCKS
                }) else {
                    break;
                };
                let s = &mut dev.sms[sm];
                s.threads += rt;
                s.regs += rr;
                s.blocks += 1;
                self.create_block(g, sm as u32);
            }
        }
    }

    /// Make the grid's next block resident on SM `sm` (resources already taken): its local
    /// memory, its threads (runnable, each with a random PCT priority).
    fn create_block(&mut self, g: u32, sm: u32) {
        let grid = self.grids[g as usize].as_mut().expect("grid");
        let lin = grid.next_block;
        grid.next_block += 1;
        let [gx, gy, _] = grid.dims.map(|d| d as u64);
        let ctaid = [
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ];
        let b = self.free_blocks.pop().unwrap_or_else(|| {
            self.blocks.push(None);
            self.blocks.len() as u32 - 1
        });
        grid.blocks.push(b);
        let [bx, by, _] = grid.block_dims;
        let n = grid.threads_per_block;
        let entry = grid.entry_pc;
        let device = grid.device;
        let weak_grid = grid.weak_grid;
        let weak_block = self.weak.as_mut().map_or(0, |w| w.new_block());
        // Local memory: one frame per thread, 16-byte aligned.
        let frame = grid.module.prog.local_frame.div_ceil(16) * 16;
        let local: Option<Box<[std::sync::atomic::AtomicU64]>> = (frame > 0).then(|| {
            (0..(frame / 8 * n as u64 + 2) as usize)
                .map(|_| Default::default())
                .collect()
        });
        let local_base = local.as_ref().map_or(0, |words| {
            let base = (words.as_ptr() as u64).div_ceil(16) * 16;
            self.mem.space.map(
                base,
                frame * n as u64,
                &format!("local memory of block {ctaid:?}"),
                1u64.checked_shl(device).unwrap_or(0),
            );
            base
        });
        let mut tids = Vec::with_capacity(n as usize);
        for lane in 0..n {
            let mut regs = grid.template.clone();
            regs[slot::LOCAL_BASE as usize] = local_base + lane as u64 * frame;
            let tid3 = [lane % bx, (lane / bx) % by, lane / (bx * by)];
            for d in 0..3 {
                regs[(slot::TID + d) as usize] = tid3[d as usize] as u64;
                regs[(slot::CTAID + d) as usize] = ctaid[d as usize] as u64;
            }
            let prio = (self.rng.next_u64() as u32) | 0x8000_0000;
            let weak_id = self.weak.as_mut().map_or(0, |w| {
                let site = [ctaid[0], ctaid[1], ctaid[2], tid3[0], tid3[1], tid3[2]];
                w.new_thread(weak_block, weak_grid, site)
            });
            let t = Box::new(Thread {
                regs,
                pc: entry,
                frames: Vec::new(),
                grid: g,
                block: b,
                lane,
                reads: Vec::new(),
                reads_overflow: None,
                wake_at: 0,
                watch: Vec::new(),
                bar_dest: slot::SINK,
                bar_pred: false,
                bar_pc: 0,
                weak_id,
            });
            let sched = Sched {
                state: TState::Exited,
                prio,
                token: 0,
                in_heap: false,
                heap_prio: 0,
            };
            let tid = match self.free_threads.pop() {
                Some(tid) => {
                    self.threads[tid as usize] = Some(t);
                    self.sched[tid as usize] = sched;
                    tid
                }
                None => {
                    self.threads.push(Some(t));
                    self.sched.push(sched);
                    self.run_pos.push(u32::MAX);
                    self.threads.len() as u32 - 1
                }
            };
            tids.push(tid);
        }
        for &tid in &tids {
            self.make_runnable(tid);
        }
        self.live_threads += n as u64;
        self.blocks[b as usize] = Some(Block {
            grid: g,
            ctaid,
            device,
            sm,
            threads: tids,
            live: n,
            arrived: 0,
            bar_pc: 0,
            bar_true: 0,
            waiting: Vec::new(),
            weak_block,
            local,
        });
    }

    /// Remove grid slot `g` with all its blocks at once (a fault or an abort).
    pub(crate) fn kill_grid(&mut self, g: u32) {
        let blocks = self.grids[g as usize]
            .as_ref()
            .expect("grid")
            .blocks
            .clone();
        for b in blocks {
            self.free_block(b);
        }
        self.remove_grid(g);
        self.start_blocks();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_formula() {
        assert_eq!(blocks_per_sm_for(80, 512), 1);
        assert_eq!(blocks_per_sm_for(32, 256), 8);
        assert_eq!(blocks_per_sm_for(32, 32), 32);
        assert_eq!(blocks_per_sm_for(255, 1024), 0);
        assert_eq!(blocks_per_sm_for(64, 1024), 1);
        assert_eq!(blocks_per_sm_for(80, 2000), 0);
    }
}
