//! A kernel of libsymm's PTX launched by name, with its arguments checked against the
//! kernel's `.param` list before anything reaches the driver: the way the benchmarks launch
//! the work-stealing kernels of `symm_device::scheduler::workload`, which the library's own
//! calls never launch.

use crate::error::{Error, Result};

/// One kernel argument, of the type the kernel's `.param` list declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelArg {
    /// A `.param .u32`.
    U32(u32),
    /// A `.param .u64` (also a device address).
    U64(u64),
}

impl KernelArg {
    /// The PTX type of the parameter it fills.
    pub fn ptx_type(self) -> &'static str {
        match self {
            KernelArg::U32(_) => "u32",
            KernelArg::U64(_) => "u64",
        }
    }
}

/// Where and how wide a kernel runs.
#[derive(Clone, Copy, Debug)]
pub struct KernelLaunch<'a> {
    /// The CUDA device.
    pub device: i32,
    /// The kernel's name in the PTX.
    pub name: &'a str,
    /// Blocks along x.
    pub blocks: u32,
    /// Threads per block along x.
    pub threads: u32,
    /// CTAs per cluster along x (1: no cluster launch); divides `blocks`.
    pub cluster: u32,
}

/// Refuse `launch` with `args` unless the shape is launchable and `args` match the kernel's
/// `.param` types (`params`: `None` when the PTX has no such kernel).
pub fn check(
    launch: &KernelLaunch<'_>,
    args: &[KernelArg],
    params: Option<Vec<&str>>,
) -> Result<()> {
    if launch.blocks == 0 || !(1..=1024).contains(&launch.threads) {
        return Err(Error::invalid_argument(format!(
            "kernel {}: {} blocks of {} threads: blocks must be >= 1 and threads in 1..=1024",
            launch.name, launch.blocks, launch.threads
        )));
    }
    if !(1..=8).contains(&launch.cluster) || !launch.blocks.is_multiple_of(launch.cluster) {
        return Err(Error::invalid_argument(format!(
            "kernel {}: cluster size {} must be in 1..=8 and divide the block count {}",
            launch.name, launch.cluster, launch.blocks
        )));
    }
    let params = params.ok_or_else(|| {
        Error::invalid_argument(format!("kernel {} is not in libsymm's PTX", launch.name))
    })?;
    let given: Vec<&str> = args.iter().map(|a| a.ptx_type()).collect();
    if given != params {
        return Err(Error::invalid_argument(format!(
            "kernel {} takes parameters {params:?}, given {given:?}",
            launch.name
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::symmResult_t;

    #[test]
    fn shapes_and_arguments_are_checked() {
        let launch = KernelLaunch {
            device: 0,
            name: "k",
            blocks: 4,
            threads: 32,
            cluster: 2,
        };
        let args = [KernelArg::U32(1), KernelArg::U64(2)];
        assert!(check(&launch, &args, Some(vec!["u32", "u64"])).is_ok());
        let refused = [
            check(&launch, &args, Some(vec!["u64", "u32"])),
            check(&launch, &args[..1], Some(vec!["u32", "u64"])),
            check(&launch, &args, None),
            check(
                &KernelLaunch {
                    cluster: 3,
                    ..launch
                },
                &args,
                Some(vec!["u32", "u64"]),
            ),
            check(
                &KernelLaunch {
                    threads: 0,
                    ..launch
                },
                &args,
                Some(vec!["u32", "u64"]),
            ),
            check(
                &KernelLaunch {
                    blocks: 0,
                    ..launch
                },
                &args,
                Some(vec!["u32", "u64"]),
            ),
        ];
        for r in refused {
            assert_eq!(r.unwrap_err().code, symmResult_t::symmInvalidArgument);
        }
    }
}
