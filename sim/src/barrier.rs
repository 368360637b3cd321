//! Block barriers (`barrier.sync`, `barrier.red`): arrival, misuse checks and release. A
//! barrier completes when every non-exited thread of the block arrived.

use crate::exec::TState;
use crate::ir::red;
use crate::simulator::Simulator;

impl Simulator {
    /// Thread `tid` arrived at the barrier it noted (`bar_pc`): a fault when the block's
    /// threads wait at barriers that do not go together, else it waits; the last one to arrive
    /// releases the block.
    pub(crate) fn thread_barrier(&mut self, tid: u32) {
        let t = self.threads[tid as usize].as_ref().expect("thread");
        let (b, pc, pred) = (t.block, t.bar_pc, t.bar_pred);
        let block = self.blocks[b as usize].as_ref().expect("block");
        let grid = self.grids[block.grid as usize].as_ref().expect("grid");
        let prog = &grid.module.prog;
        if block.arrived > 0 && block.bar_pc != pc {
            let first = prog.code[block.bar_pc as usize];
            let this = prog.code[pc as usize];
            let (l1, l2) = (prog.lines[block.bar_pc as usize], prog.lines[pc as usize]);
            let problem = if first.aux != this.aux {
                Some(
                    "barrier misuse: barrier.red and barrier.sync (or different reductions) mixed on barrier 0: unpredictable in PTX",
                )
            } else if first.flags & 2 != 0 || this.flags & 2 != 0 {
                Some(
                    "barrier misuse: threads of one block wait at different .aligned barrier instructions: undefined in PTX",
                )
            } else if self.strict_barriers {
                Some("barrier misuse: threads of one block wait at different barrier instructions")
            } else {
                None
            };
            if let Some(p) = problem {
                let msg = format!(
                    "{p} (line {l1} `{}` and line {l2})",
                    prog.line_text.get(&l1).map_or("", |s| s)
                );
                self.fault_thread(tid, &msg);
                return;
            }
        }
        let block = self.blocks[b as usize].as_mut().expect("block");
        if block.arrived == 0 {
            block.bar_pc = pc;
        }
        block.arrived += 1;
        block.bar_true += pred as u32;
        block.waiting.push(tid);
        let release = block.arrived == block.live;
        self.make_unrunnable(tid, TState::Barrier);
        if let Some(w) = self.weak.as_mut() {
            let id = self.threads[tid as usize].as_ref().expect("thread").weak_id;
            let wb = self.blocks[b as usize].as_ref().expect("block").weak_block;
            w.barrier_arrive(id, wb);
        }
        if release {
            self.release_barrier(b);
        }
    }

    /// Release the barrier block `b` waits at: every waiting thread gets the reduction
    /// (`barrier.red`) and runs again.
    pub(crate) fn release_barrier(&mut self, b: u32) {
        let block = self.blocks[b as usize].as_mut().expect("block");
        let grid = self.grids[block.grid as usize].as_ref().expect("grid");
        let inst = grid.module.prog.code[block.bar_pc as usize];
        let value = match inst.aux {
            red::OR => (block.bar_true > 0) as u64,
            red::AND => (block.bar_true == block.arrived) as u64,
            red::POPC => block.bar_true as u64,
            _ => 0,
        };
        let waiting = std::mem::take(&mut block.waiting);
        let wb = block.weak_block;
        block.arrived = 0;
        block.bar_true = 0;
        for &tid in &waiting {
            let t = self.threads[tid as usize].as_mut().expect("thread");
            if inst.aux != red::NONE {
                t.regs[t.bar_dest as usize] = value;
            }
            if let Some(w) = self.weak.as_mut() {
                w.barrier_leave(t.weak_id, wb);
            }
            self.make_runnable(tid);
        }
        if let Some(w) = self.weak.as_mut() {
            w.barrier_done(wb);
        }
        let block = self.blocks[b as usize].as_mut().expect("block");
        block.waiting = waiting;
        block.waiting.clear();
    }
}
