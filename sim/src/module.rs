//! [`Module`]: a PTX module parsed and lowered at load, its kernels and their parameters.

use crate::error::{SimError, sim_err};
use crate::parse::{self, Program};

/// A parsed and lowered PTX module.
#[derive(Debug)]
pub struct Module {
    pub(crate) prog: Program,
}

/// A `.entry` of a [`Module`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelId(pub u32);

/// One `.param` of a kernel: its size and alignment in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// Bytes.
    pub size: usize,
    /// Alignment in bytes.
    pub align: usize,
}

/// Static facts about a kernel (for `cuFuncGetAttribute`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// Static `.shared` bytes (always 0: shared memory is rejected at load).
    pub shared_bytes: u32,
    /// `.local` bytes per thread (always 0: local memory is rejected at load).
    pub local_bytes: u32,
    /// Parameter bytes.
    pub param_bytes: u32,
    /// Lowered instructions of the kernel and the functions it calls.
    pub instructions: u32,
}

impl Module {
    /// Parse and lower PTX text (one or more `.entry`/`.func`); an error names the line.
    pub fn load(ptx: &str) -> Result<Module, SimError> {
        let prog = parse::parse(ptx).map_err(|e| sim_err(format!("PTX rejected: {e}")))?;
        Ok(Module { prog })
    }

    /// The `.entry` named `name`.
    pub fn kernel(&self, name: &str) -> Option<KernelId> {
        self.prog
            .kernels
            .iter()
            .position(|k| k.name == name)
            .map(|i| KernelId(i as u32))
    }

    /// The parameters of `kernel`, in declaration order.
    pub fn kernel_params(&self, kernel: KernelId) -> &[ParamInfo] {
        self.prog
            .kernels
            .get(kernel.0 as usize)
            .map_or(&[], |k| &k.params[..])
    }

    /// The module-level `.global`/`.const` variables: (name, address, bytes). Their bytes are
    /// host memory owned by the module (initialized from the PTX); the driver maps each range
    /// for the devices the module is loaded on, and unmaps it when the module is unloaded.
    pub fn globals(&self) -> impl Iterator<Item = (&str, u64, u64)> {
        self.prog
            .globals
            .iter()
            .map(|g| (g.name.as_str(), g.address, g.size))
    }

    /// The names of the module's kernels, in file order.
    pub fn kernel_names(&self) -> Vec<&str> {
        self.prog.kernels.iter().map(|k| k.name.as_str()).collect()
    }

    /// Static facts about `kernel`, `None` for an id not of this module.
    pub fn kernel_info(&self, kernel: KernelId) -> Option<KernelInfo> {
        let k = self.prog.kernels.get(kernel.0 as usize)?;
        Some(KernelInfo {
            shared_bytes: 0,
            local_bytes: 0,
            param_bytes: k.param_bytes as u32,
            instructions: self.prog.code.len() as u32,
        })
    }

    /// Instructions of the lowered module (all functions).
    pub fn instruction_count(&self) -> usize {
        self.prog.code.len()
    }
}
