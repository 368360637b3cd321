//! Faults and stall reports: [`FaultKind`], the report of a faulting thread (kernel, grid,
//! block, thread, PTX line, call chain, seed) and the report of who waits where after a
//! stall.

use std::cmp::Reverse;
use std::fmt::Write as _;

use crate::demangle::demangle;
use crate::exec::TState;
use crate::simulator::Simulator;

/// What kind of fault a [`RunOutcome::Fault`] report describes (its report starts with the
/// kind's prefix: `illegal address:`, `misaligned address:`, `trap`, `barrier misuse:`).
///
/// [`RunOutcome::Fault`]: crate::RunOutcome::Fault
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// An access outside every mapped range, or to a range the device may not access.
    IllegalAddress,
    /// An access not aligned to its size.
    MisalignedAddress,
    /// `trap` (a Rust panic in the kernel).
    Trap,
    /// An instruction the simulator cannot execute (normally rejected at load already).
    IllegalInstruction,
    /// Barrier misuse (threads of one block at different barriers, mixed forms).
    Barrier,
    /// A data race (weak memory with race reports on).
    DataRace,
    /// Anything else.
    Other,
}

impl FaultKind {
    /// The kind of the fault `report` (of a [`RunOutcome::Fault`]) describes.
    ///
    /// [`RunOutcome::Fault`]: crate::RunOutcome::Fault
    pub fn of(report: &str) -> FaultKind {
        if report.starts_with("illegal address:") {
            FaultKind::IllegalAddress
        } else if report.starts_with("misaligned address:") {
            FaultKind::MisalignedAddress
        } else if report.starts_with("data race:") {
            FaultKind::DataRace
        } else if report.starts_with("trap") {
            FaultKind::Trap
        } else if report.starts_with("illegal instruction:") {
            FaultKind::IllegalInstruction
        } else if report.starts_with("barrier misuse:") {
            FaultKind::Barrier
        } else {
            FaultKind::Other
        }
    }
}

/// Threads parked alike: count, an example block and thread, the addresses watched.
type StallGroup = (u32, u32, u32, Vec<u64>);

impl Simulator {
    /// The seed and virtual time, as every report ends.
    fn seed_line(&self) -> String {
        format!(
            "seed {0} (SYMM_SIM_SEED={0:#x}{1}), virtual time {2} ns",
            self.config.seed,
            if self.config.weak_memory {
                " SYMM_SIM_WEAK=1"
            } else {
                ""
            },
            self.now
        )
    }

    /// Where thread `tid` is: kernel, grid, block, thread, line, call chain.
    fn locate(&self, tid: u32, pc: u32) -> String {
        let t = self.threads[tid as usize].as_ref().expect("thread");
        let grid = self.grids[t.grid as usize].as_ref().expect("grid");
        let block = self.blocks[t.block as usize].as_ref().expect("block");
        let prog = &grid.module.prog;
        let kernel = &prog.kernels[grid.kernel as usize].name;
        let [bx, by, _] = grid.block_dims;
        let lane = t.lane;
        let tid3 = [lane % bx, (lane / bx) % by, lane / (bx * by)];
        let line = prog.lines.get(pc as usize).copied().unwrap_or(0);
        let text = prog.line_text.get(&line).map_or("", |s| s);
        let mut chain = Vec::new();
        if let Some(f) = prog.func_at(pc) {
            chain.push(demangle(&f.name));
        }
        for fr in t.frames.iter().rev() {
            let call_pc = fr.ret_pc.saturating_sub(1);
            if let Some(f) = prog.func_at(call_pc) {
                chain.push(format!(
                    "{} (line {})",
                    demangle(&f.name),
                    prog.lines[call_pc as usize]
                ));
            }
        }
        format!(
            "  kernel {kernel} (grid {}, device {}), block ({}, {}, {}), thread ({}, {}, {})\n  at line {line}: {text}\n  in {}",
            grid.id.0,
            grid.device,
            block.ctaid[0],
            block.ctaid[1],
            block.ctaid[2],
            tid3[0],
            tid3[1],
            tid3[2],
            chain.join(", called from ")
        )
    }

    /// What a `trap` of thread `tid` reports: the Rust panic function it called, if any.
    pub(crate) fn trap_message(&self, tid: u32) -> String {
        let t = self.threads[tid as usize].as_ref().expect("thread");
        let grid = self.grids[t.grid as usize].as_ref().expect("grid");
        let prog = &grid.module.prog;
        // The outermost panicking function names the panic.
        let mut panic = None;
        for fr in &t.frames {
            let f = &prog.funcs[prog.calls[fr.site as usize].func as usize];
            let name = demangle(&f.name);
            if name.contains("panicking") {
                panic = Some(name);
                break;
            }
        }
        match panic {
            Some(p) => format!("trap: Rust panic {p}"),
            None => "trap".to_string(),
        }
    }

    /// Fault thread `tid`'s grid with the report `what` and where the thread is; the grid
    /// is removed.
    pub(crate) fn fault_thread(&mut self, tid: u32, what: &str) {
        let pc = self.threads[tid as usize].as_ref().expect("thread").pc;
        let report = format!("{what}\n{}\n  {}", self.locate(tid, pc), self.seed_line());
        let g = self.threads[tid as usize].as_ref().expect("thread").grid;
        let id = self.grids[g as usize].as_ref().expect("grid").id;
        self.kill_grid(g);
        self.faults.push((id, report));
    }

    /// Who waits where, after a [`RunOutcome::Stalled`]: groups of threads parked alike (the
    /// PTX line, the addresses they watch), blocks waiting for residency, the seed.
    ///
    /// [`RunOutcome::Stalled`]: crate::RunOutcome::Stalled
    pub fn stall_report(&self) -> String {
        let mut out = format!(
            "stalled: every live thread waits; only a store from outside or more virtual time can help ({})\n",
            self.seed_line()
        );
        if let Some(Reverse((at, _, _))) = self
            .timers
            .iter()
            .filter(|Reverse((_, tid, tok))| self.sleeping_with(*tid, *tok))
            .min()
        {
            let _ = writeln!(out, "next nanosleep wake-up at {at} ns");
        }
        for &g in &self.grid_order {
            let grid = self.grids[g as usize].as_ref().expect("grid");
            let prog = &grid.module.prog;
            let _ = writeln!(
                out,
                "grid {} kernel {} on device {}: {} resident blocks, {} blocks waiting for residency",
                grid.id.0,
                prog.kernels[grid.kernel as usize].name,
                grid.device,
                grid.blocks.len(),
                grid.total_blocks - grid.next_block
            );
            // (kind, line, first watched address) → (count, example block, example lane)
            let mut groups: std::collections::BTreeMap<(u8, u32, u64), StallGroup> =
                std::collections::BTreeMap::new();
            for &b in &grid.blocks {
                let block = self.blocks[b as usize].as_ref().expect("block");
                for &tid in &block.threads {
                    let t = self.threads[tid as usize].as_ref().expect("thread");
                    let (kind, pc) = match self.sched[tid as usize].state {
                        TState::Sleeping => (0u8, t.pc.saturating_sub(1)),
                        TState::Barrier => (1, t.bar_pc),
                        _ => continue,
                    };
                    let line = prog.lines.get(pc as usize).copied().unwrap_or(0);
                    let first = t.watch.first().copied().unwrap_or(0) << 3;
                    let e = groups.entry((kind, line, first)).or_insert((
                        0,
                        block.ctaid[0],
                        t.lane,
                        t.watch.iter().map(|g| g << 3).collect(),
                    ));
                    e.0 += 1;
                }
            }
            for ((kind, line, _), (count, bx, lane, watch)) in groups {
                let text = prog.line_text.get(&line).map_or("", |s| s);
                if kind == 0 {
                    let mut addrs: Vec<String> =
                        watch.iter().take(4).map(|a| format!("{a:#x}")).collect();
                    if watch.len() > 4 {
                        addrs.push(format!("+{} more", watch.len() - 4));
                    }
                    let _ = writeln!(
                        out,
                        "  {count} threads sleep at line {line} `{text}` (e.g. block {bx} thread {lane}), having read [{}]",
                        addrs.join(", ")
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "  {count} threads wait at the barrier at line {line} `{text}` (e.g. block {bx} thread {lane})"
                    );
                }
            }
        }
        out
    }
}
