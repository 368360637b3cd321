//! Helpers of the simulator's tests: PTX kernel text, host buffers mapped into an address
//! space, running to the end.

#![allow(dead_code)]

use std::sync::Arc;

use symm_sim::{AddressSpace, GridId, Launch, Module, RunOutcome, SimConfig, Simulator};

/// A kernel `name` with parameters `params` (PTX text) and body `body`, with plenty of
/// registers declared.
pub fn kernel(name: &str, params: &str, body: &str) -> String {
    format!(
        ".version 7.8\n.target sm_90\n.address_size 64\n\n.visible .entry {name}({params})\n{{\n\
\t.reg .pred \t%p<32>;\n\t.reg .b16 \t%rs<32>;\n\t.reg .b32 \t%r<64>;\n\t.reg .b64 \t%rd<64>;\n\n{body}\n\tret;\n}}\n"
    )
}

/// A zeroed host buffer of `words` u64, mapped for every device.
pub struct Buffer {
    pub data: Box<[u64]>,
}

impl Buffer {
    pub fn new(space: &AddressSpace, words: usize, what: &str) -> Buffer {
        let mut data = vec![0u64; words].into_boxed_slice();
        space.map(data.as_mut_ptr() as u64, (words * 8) as u64, what, u64::MAX);
        Buffer { data }
    }

    pub fn addr(&self) -> u64 {
        self.data.as_ptr() as u64
    }

    /// Word `i`, read as the kernels wrote it.
    pub fn get(&self, i: usize) -> u64 {
        // SAFETY: in bounds; the simulator runs on this thread and is not running now.
        unsafe { std::ptr::read_volatile(self.data.as_ptr().add(i)) }
    }

    /// Set word `i`.
    pub fn set(&mut self, i: usize, v: u64) {
        self.data[i] = v;
    }

    /// Set the 32-bit word `i`.
    pub fn set32(&mut self, i: usize, v: u32) {
        let word = &mut self.data[i / 2];
        let shift = (i % 2) * 32;
        *word = (*word & !(0xFFFF_FFFF << shift)) | (v as u64) << shift;
    }

    /// The 32-bit word `i`.
    pub fn get32(&self, i: usize) -> u32 {
        // SAFETY: in bounds (two u32 per u64); nothing else writes now.
        unsafe { std::ptr::read_volatile((self.data.as_ptr() as *const u32).add(i)) }
    }
}

/// A simulator with seed `seed` over a fresh address space.
pub fn sim(seed: u64) -> (Simulator, Arc<AddressSpace>) {
    let space = Arc::new(AddressSpace::new());
    let config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    (Simulator::new(config, space.clone()), space)
}

/// Launch `kernel` of `module` with u64 parameters.
pub fn launch(
    sim: &mut Simulator,
    module: &Arc<Module>,
    kernel: &str,
    grid: u32,
    block: u32,
    params: &[u64],
) -> GridId {
    launch_on(sim, 0, module, kernel, grid, block, params)
}

/// Launch on device `device`; parameters sized as the kernel declares them.
pub fn launch_on(
    sim: &mut Simulator,
    device: u32,
    module: &Arc<Module>,
    kernel: &str,
    grid: u32,
    block: u32,
    params: &[u64],
) -> GridId {
    let id = module.kernel(kernel).expect("kernel");
    let infos = module.kernel_params(id);
    let params = params
        .iter()
        .zip(infos)
        .map(|(v, info)| v.to_le_bytes()[..info.size].to_vec())
        .collect();
    sim.launch(Launch {
        device,
        module: module.clone(),
        kernel: id,
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        params,
    })
    .expect("launch")
}

/// Run until idle: Ok, or the fault/stall/budget report. Stalls with sleepers let time
/// pass (at most `max_waits` times).
pub fn run_to_end(sim: &mut Simulator) -> Result<(), String> {
    let mut waits = 0;
    loop {
        match sim.run(1 << 28) {
            RunOutcome::Finished(_) => {}
            RunOutcome::Idle => return Ok(()),
            RunOutcome::Budget => return Err("budget".into()),
            RunOutcome::Fault(_, r) => return Err(r),
            RunOutcome::Stalled => {
                waits += 1;
                match sim.next_wakeup_ns() {
                    Some(t) if waits < 10_000 => sim.advance_time_to(t),
                    _ => return Err(sim.stall_report()),
                }
            }
        }
    }
}

/// Load `text`, panicking with the error.
pub fn module(text: &str) -> Arc<Module> {
    Arc::new(Module::load(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}
