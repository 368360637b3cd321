//! The PTX built by `cargo xtask ptx`, embedded so that building libsymm needs no nvptx
//! toolchain.

/// PTX for sm_80 (Ampere), also JIT-compiled for newer GPUs without their own PTX.
pub const SM80: &str = include_str!("../../ptx-out/symm_sm80.ptx");
/// PTX for sm_90 (Hopper and newer non-`a` targets).
pub const SM90: &str = include_str!("../../ptx-out/symm_sm90.ptx");
/// PTX for sm_100a (Blackwell B200/GB200: CLC instructions).
pub const SM100A: &str = include_str!("../../ptx-out/symm_sm100a.ptx");

/// The PTX to load on a GPU of compute capability `major.minor`, with its name, or `None`
/// below sm_80.
pub fn for_capability(major: i32, minor: i32) -> Option<(&'static str, &'static str)> {
    match (major, minor) {
        (10, 0) => Some(("sm_100a", SM100A)),
        (m, _) if m >= 9 => Some(("sm_90", SM90)),
        (8, _) => Some(("sm_80", SM80)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plan::KernelId;
    use symm_device::symmetric::dispatch::Algorithm;
    use symm_device::{DataType, RedOp};

    #[test]
    fn every_ptx_holds_every_kernel_the_planner_can_pick() {
        for (name, ptx) in [("sm_80", SM80), ("sm_90", SM90), ("sm_100a", SM100A)] {
            assert!(ptx.contains(&format!(".target {name}")), "{name}");
            for algorithm in [
                Algorithm::OneShotAllReduce,
                Algorithm::TwoShotAllReduce,
                Algorithm::ReduceScatter,
                Algorithm::AllGather,
            ] {
                for dtype in DataType::ALL {
                    for op in RedOp::ALL {
                        let kernel = KernelId {
                            algorithm,
                            dtype,
                            op,
                        }
                        .ptx_name();
                        assert!(
                            ptx.contains(&format!(".visible .entry {kernel}(")),
                            "{name} lacks {kernel}"
                        );
                    }
                }
            }
            assert!(ptx.contains(".visible .func  (.param .b32 func_retval0) symm_all_reduce("));
        }
    }

    #[test]
    fn capability_picks_a_ptx() {
        assert_eq!(for_capability(9, 0).unwrap().0, "sm_90");
        assert_eq!(for_capability(10, 0).unwrap().0, "sm_100a");
        assert_eq!(for_capability(12, 0).unwrap().0, "sm_90");
        assert_eq!(for_capability(8, 6).unwrap().0, "sm_80");
        assert!(for_capability(7, 5).is_none());
    }
}
