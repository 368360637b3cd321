//! The PTX built by `cargo xtask ptx`, embedded so that building libsymm needs no nvptx
//! toolchain. `ptx-out/` holds it gzip-compressed (a sixth of the size, in the repository and
//! in libsymm); a target's text is decompressed once per process, the first time it is used.

use symm_artifacts::{gzip, split};

use std::sync::OnceLock;

/// The targets this build embeds (the crate's features `ptx-sm80`, `ptx-sm90`, `ptx-sm100a`,
/// all on by default): name and compressed PTX. sm_80 (Ampere) is also JIT-compiled for newer
/// GPUs without their own PTX; sm_90 serves Hopper and newer non-`a` targets; sm_100a is
/// Blackwell B200/GB200 (CLC instructions).
const TARGETS: &[(&str, &[u8])] = &[
    #[cfg(feature = "ptx-sm80")]
    ("sm_80", include_bytes!("../../../ptx-out/symm_sm80.ptx.gz")),
    #[cfg(feature = "ptx-sm90")]
    ("sm_90", include_bytes!("../../../ptx-out/symm_sm90.ptx.gz")),
    #[cfg(feature = "ptx-sm100a")]
    (
        "sm_100a",
        include_bytes!("../../../ptx-out/symm_sm100a.ptx.gz"),
    ),
];

/// The PTX targets this build embeds.
pub fn embedded_targets() -> Vec<&'static str> {
    TARGETS.iter().map(|(name, _)| *name).collect()
}

/// The targets that ship SASS (a cubin of every kernel, assembled from the target's PTX by the
/// pinned ptxas of `cargo xtask ptx`; gzip-compressed): the driver loads it without a JIT
/// compilation at each kernel's first use. Every target ships it (each cubin adds about
/// 2.5 MB to every binary that embeds libsymm); a GPU no cubin runs on (10.3, 12.x)
/// JIT-compiles the PTX. A build with `SYMM_SASS_TARGETS` set embeds only the targets it names
/// (`build.rs`; the GPU bundle embeds sm_90 only), and one without the feature `sass`, or
/// without a target's PTX, embeds none of that target.
const SASS: &[(&str, &[u8])] = &[
    #[cfg(symm_sass_sm_80)]
    (
        "sm_80",
        include_bytes!("../../../ptx-out/symm_sm80.cubin.gz"),
    ),
    #[cfg(symm_sass_sm_90)]
    (
        "sm_90",
        include_bytes!("../../../ptx-out/symm_sm90.cubin.gz"),
    ),
    #[cfg(symm_sass_sm_100a)]
    (
        "sm_100a",
        include_bytes!("../../../ptx-out/symm_sm100a.cubin.gz"),
    ),
];

/// The SASS (cubin) of target `target`, decompressed once per process; `None` for a target
/// without shipped SASS or an embedded file that does not decompress.
pub fn sass(target: &str) -> Option<&'static [u8]> {
    static IMAGES: [OnceLock<Option<Vec<u8>>>; SASS.len()] =
        [const { OnceLock::new() }; SASS.len()];
    let slot = SASS.iter().position(|(name, _)| *name == target)?;
    IMAGES[slot]
        .get_or_init(|| gzip::decompress(SASS[slot].1).ok())
        .as_deref()
}

/// The shipped SASS that runs on a GPU of compute capability `major.minor`, the same target
/// as `target_for_capability`'s PTX: a cubin runs on its own major version from its minor
/// version up (sm_80 on 8.x, sm_90 on 9.x), and an arch-specific one (sm_100a) on its own
/// version only. `None` where none runs or this build does not embed it (such a GPU
/// JIT-compiles the PTX).
pub fn sass_target_for_capability(major: i32, minor: i32) -> Option<&'static str> {
    let target = match (major, minor) {
        (8, _) => "sm_80",
        (9, _) => "sm_90",
        (10, 0) => "sm_100a",
        _ => return None,
    };
    SASS.iter()
        .any(|(name, _)| *name == target)
        .then_some(target)
}

/// The PTX text of target `target` ("sm_80", "sm_90" or "sm_100a"), or `None` for another
/// name or an embedded file that does not decompress (a build defect, reported as no PTX
/// rather than a panic).
pub fn text(target: &str) -> Option<&'static str> {
    static TEXTS: [OnceLock<Option<String>>; TARGETS.len()] =
        [const { OnceLock::new() }; TARGETS.len()];
    let slot = TARGETS.iter().position(|(name, _)| *name == target)?;
    TEXTS[slot]
        .get_or_init(|| {
            gzip::decompress(TARGETS[slot].1)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
        })
        .as_deref()
}

/// The PTX targets that run on a GPU of compute capability `major.minor`, preferred first: an
/// arch-specific target (`a`) on its own version only, the others JIT-compiled forward; none
/// below sm_80.
pub fn targets_for_capability(major: i32, minor: i32) -> &'static [&'static str] {
    match (major, minor) {
        (10, 0) => &["sm_100a", "sm_90", "sm_80"],
        (m, _) if m >= 9 => &["sm_90", "sm_80"],
        (8, _) => &["sm_80"],
        _ => &[],
    }
}

/// The name of the PTX to load on a GPU of compute capability `major.minor`: the preferred of
/// [`targets_for_capability`] that this build embeds, or `None`.
pub fn target_for_capability(major: i32, minor: i32) -> Option<&'static str> {
    targets_for_capability(major, minor)
        .iter()
        .copied()
        .find(|t| TARGETS.iter().any(|(name, _)| name == t))
}

/// The module to load for kernel `kernel` from the PTX of target `target` ("sm_80", "sm_90"
/// or "sm_100a"): that kernel and what it calls only (see [`split`]); `None` if that PTX has
/// no such kernel. The files are indexed once per process.
pub fn kernel_module(target: &str, kernel: &str) -> Option<String> {
    static INDEXES: [OnceLock<split::PtxIndex<'static>>; TARGETS.len()] =
        [const { OnceLock::new() }; TARGETS.len()];
    let slot = TARGETS.iter().position(|(name, _)| *name == target)?;
    let ptx = text(target)?;
    INDEXES[slot]
        .get_or_init(|| split::PtxIndex::new(ptx))
        .kernel_module(kernel)
}

/// The `.param` types (`"u32"`, `"u64"`, …) of kernel `name` in `ptx`, in order; `None` if
/// `ptx` declares no such `.entry`.
pub fn entry_param_types<'a>(ptx: &'a str, name: &str) -> Option<Vec<&'a str>> {
    let header = format!(".entry {name}(");
    let mut lines = ptx.lines().skip_while(|line| !line.contains(&header));
    lines.next()?;
    Some(
        lines
            .map(str::trim)
            .take_while(|line| !line.starts_with(')'))
            .filter_map(|line| line.strip_prefix(".param"))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(|ty| ty.trim_start_matches('.'))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_parameters_are_read_from_the_ptx() {
        let ptx = ".visible .entry symm_k(\n\t.param .u32 symm_k_param_0,\n\t.param .u64 \
                   symm_k_param_1\n)\n{\n}\n.visible .entry symm_k2()\n{\n}\n";
        assert_eq!(entry_param_types(ptx, "symm_k"), Some(vec!["u32", "u64"]));
        assert_eq!(entry_param_types(ptx, "symm_k2"), Some(vec![]));
        assert_eq!(entry_param_types(ptx, "symm"), None);
        let sm90 = text("sm_90").unwrap();
        assert_eq!(
            entry_param_types(sm90, "symm_clc_fixed_grid").map(|t| t.len()),
            Some(8)
        );
    }

    use crate::plan::KernelId;
    use symm_device::symmetric::Algorithm;
    use symm_device::{DataType, RedOp};

    /// Every target's name and PTX.
    fn targets() -> Vec<(&'static str, &'static str)> {
        TARGETS
            .iter()
            .map(|(name, _)| (*name, text(name).expect("the embedded PTX decompresses")))
            .collect()
    }

    /// The shipped SASS: every cubin decompresses, is a CUDA ELF image for its target, and
    /// holds every kernel of the target's PTX (by name).
    #[test]
    fn every_sass_target_ships_sass_of_every_kernel() {
        for (name, _) in SASS {
            let ptx = text(name).expect("the embedded PTX decompresses");
            let image = sass(name).expect("the embedded SASS decompresses");
            assert!(image.starts_with(b"\x7fELF"), "{name}: not an ELF image");
            // e_flags (offset 48 in a 64-bit ELF): the SM number in its low bits (CUDA ELF
            // ABI version 1) or bits 8-15 (ABI version 2 and later).
            let flags = u32::from_le_bytes(image[48..52].try_into().unwrap());
            let sm: u32 = name
                .trim_start_matches("sm_")
                .trim_end_matches('a')
                .parse()
                .unwrap();
            assert!(
                flags & 0xFF == sm || (flags >> 8) & 0xFF == sm,
                "{name}: e_flags {flags:#x} name another SM"
            );
            let kernels = split::PtxIndex::new(ptx).kernels();
            assert!(kernels.len() > 100, "{name}: {} kernels", kernels.len());
            // The image's NUL-delimited strings, read once: a kernel's name is one of them.
            let strings: std::collections::HashSet<&[u8]> =
                image.split(|&b| b == 0).skip(1).collect();
            for kernel in kernels {
                assert!(
                    strings.contains(kernel.as_bytes()),
                    "{name}: no {kernel} in the SASS"
                );
            }
        }
    }

    #[test]
    fn sass_ships_for_every_target_and_runs_where_its_ptx_would() {
        if option_env!("SYMM_SASS_TARGETS").is_some() {
            // A build that embeds a subset on purpose (the GPU bundle).
            return;
        }
        assert_eq!(SASS.len(), 3, "every target's SASS is embedded");
        assert_eq!(sass_target_for_capability(8, 0), Some("sm_80"));
        assert_eq!(sass_target_for_capability(8, 6), Some("sm_80"));
        assert_eq!(sass_target_for_capability(8, 9), Some("sm_80"));
        assert_eq!(sass_target_for_capability(9, 0), Some("sm_90"));
        assert_eq!(sass_target_for_capability(10, 0), Some("sm_100a"));
        // sm_100a code is arch-specific: a 10.3 GPU runs the sm_90 PTX, JIT-compiled.
        assert_eq!(sass_target_for_capability(10, 3), None);
        assert_eq!(sass_target_for_capability(12, 0), None);
        assert_eq!(sass_target_for_capability(7, 5), None);
        for (major, minor) in [(7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (10, 3), (12, 0)] {
            if let Some(target) = sass_target_for_capability(major, minor) {
                assert_eq!(target_for_capability(major, minor), Some(target));
                assert!(sass(target).is_some(), "{target}: no shipped SASS");
            }
        }
    }

    #[test]
    fn every_target_decompresses_and_is_its_own_target() {
        for (name, ptx) in targets() {
            assert!(ptx.contains(&format!("\n.target {name}")), "{name}");
        }
        assert_eq!(text("sm_70"), None);
        assert_eq!(target_for_capability(7, 5), None);
        assert_eq!(target_for_capability(9, 0), Some("sm_90"));
        assert_eq!(target_for_capability(10, 0), Some("sm_100a"));
        assert_eq!(target_for_capability(12, 0), Some("sm_90"));
        assert_eq!(target_for_capability(8, 6), Some("sm_80"));
    }

    fn sm100a() -> &'static str {
        text("sm_100a").expect("sm_100a PTX")
    }

    /// The PTX names of `algorithms` for every dtype × op.
    fn kernel_names(algorithms: &[Algorithm]) -> Vec<String> {
        let mut names = Vec::new();
        for &algorithm in algorithms {
            for dtype in DataType::ALL {
                for op in RedOp::ALL {
                    let kernel = KernelId {
                        algorithm,
                        dtype,
                        op,
                    };
                    names.push(kernel.ptx_name());
                }
            }
        }
        names
    }

    #[test]
    fn every_ptx_holds_every_kernel_the_planner_can_pick() {
        let kernels = kernel_names(&Algorithm::ALL);
        for (name, ptx) in targets() {
            assert!(ptx.contains(&format!(".target {name}")), "{name}");
            // The entries' names, read once (not a search of the whole text per kernel).
            let entries: std::collections::HashSet<&str> = ptx
                .split(".visible .entry ")
                .skip(1)
                .filter_map(|rest| rest.split_once('(').map(|(entry, _)| entry))
                .collect();
            for kernel in &kernels {
                assert!(entries.contains(kernel.as_str()), "{name} lacks {kernel}");
            }
            // The Triton device functions live in ptx-out/symm_triton.ll.gz only.
            assert!(!ptx.contains("symm_all_reduce("), "{name}");
        }
    }

    /// Every entry's body in `ptx`, by name (read once, where a test looks up many).
    fn entries(ptx: &str) -> std::collections::HashMap<&str, &str> {
        ptx.split(".entry ")
            .skip(1)
            .filter_map(|rest| {
                let (name, _) = rest.split_once('(')?;
                let end = rest.find("// -- End function")?;
                Some((name, &rest[..end]))
            })
            .collect()
    }

    /// The body of entry `name` in `ptx`.
    fn entry<'a>(ptx: &'a str, name: &str) -> &'a str {
        let start = ptx
            .find(&format!(".entry {name}("))
            .unwrap_or_else(|| panic!("{name} missing"));
        let body = &ptx[start..];
        let end = body.find("// -- End function").expect("entry ends");
        &body[..end]
    }

    /// FileCheck-style: each pattern must appear after the previous one; `!pattern` must not
    /// appear between its neighbours.
    fn check_sequence(text: &str, patterns: &[&str]) {
        let mut at = 0;
        let mut forbidden: Vec<&str> = Vec::new();
        for pattern in patterns {
            if let Some(p) = pattern.strip_prefix('!') {
                forbidden.push(p);
                continue;
            }
            let found = text[at..]
                .find(pattern)
                .unwrap_or_else(|| panic!("CHECK: {pattern:?} not found after offset {at}"));
            for f in forbidden.drain(..) {
                assert!(
                    !text[at..at + found].contains(f),
                    "CHECK-NOT: {f:?} before {pattern:?}"
                );
            }
            at += found + pattern.len();
        }
    }

    #[test]
    fn every_reduction_kernel_has_a_sixteen_byte_path_for_every_width() {
        let kernels = kernel_names(&[
            Algorithm::OneShotAllReduce,
            Algorithm::TwoShotAllReduce,
            Algorithm::ReduceScatter,
        ]);
        for (name, ptx) in targets() {
            let bodies = entries(ptx);
            for kernel in &kernels {
                let body = bodies
                    .get(kernel.as_str())
                    .unwrap_or_else(|| panic!("{name}: {kernel} missing"));
                // LLVM spells a 16-byte access v4.b32 or v2.b64.
                let sixteen = |op: &str| {
                    body.contains(&format!("{op}.v4.b32")) || body.contains(&format!("{op}.v2.b64"))
                };
                assert!(
                    sixteen("ld") && sixteen("st"),
                    "{name} {kernel} has no 16-byte loads and stores"
                );
                assert!(
                    !body.contains(".local"),
                    "{name} {kernel} uses local memory"
                );
            }
        }
    }

    #[test]
    fn hardware_clc_loop_has_the_required_instruction_sequence() {
        let body = entry(sm100a(), "symm_clc_hardware_greedy");
        check_sequence(
            body,
            &[
                "mbarrier.init.shared::cta.b64",
                "fence.mbarrier_init.release.cluster;",
                "barrier.sync",
                // Each request: acquire fence, arm, submit, wait, decode, release fence.
                "fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;",
                "mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64",
                "!multicast",
                "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.b128",
                "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64",
                "!get_first_ctaid",
                "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128",
                "@%clc_ok clusterlaunchcontrol.query_cancel.get_first_ctaid.v4.b32.b128",
                "fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;",
            ],
        );
    }

    #[test]
    fn clustered_clc_loop_multicasts_and_syncs_the_cluster() {
        let body = entry(sm100a(), "symm_clc_hardware_clustered_greedy");
        check_sequence(
            body,
            &[
                "mbarrier.init.shared::cta.b64",
                "barrier.cluster.arrive.release.aligned;",
                "barrier.cluster.wait.acquire.aligned;",
                // Before each request: block barrier, cluster sync, acquire fence.
                "barrier.cluster.arrive.release.aligned;",
                "fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;",
                // Every CTA arms its barrier; the cluster's first CTA submits, multicast.
                "%cluster_ctarank",
                "mbarrier.arrive.expect_tx.relaxed.cta.shared::cta.b64",
                "clusterlaunchcontrol.try_cancel.async.shared::cta.mbarrier::complete_tx::bytes.multicast::cluster::all.b128",
                "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64",
                "clusterlaunchcontrol.query_cancel.is_canceled.pred.b128",
                "fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;",
                // The CTA's position in the cluster is added to the stolen id.
                "%cluster_ctarank",
            ],
        );
    }

    #[test]
    fn clc_instructions_only_in_the_sm100a_ptx() {
        for needle in [
            "clusterlaunchcontrol.try_cancel",
            "clusterlaunchcontrol.query_cancel",
            "fence.proxy.async",
            "mbarrier.try_wait",
        ] {
            assert!(sm100a().contains(needle), "sm_100a lacks {needle}");
        }
        for (name, ptx) in &targets()[..2] {
            assert!(
                !ptx.contains("clusterlaunchcontrol"),
                "{name} has CLC instructions"
            );
            assert!(
                !ptx.contains("symm_clc_hardware_"),
                "{name} has hardware kernels"
            );
            assert!(ptx.contains(".entry symm_clc_software_greedy("), "{name}");
        }
        for policy in symm_device::scheduler::workload::POLICIES {
            assert!(sm100a().contains(&format!(".entry symm_clc_hardware_{policy}(")));
            assert!(
                text("sm_90")
                    .unwrap()
                    .contains(&format!(".entry symm_clc_software_{policy}("))
            );
        }
    }

    #[test]
    fn kernel_modules_come_from_the_named_target() {
        let module = kernel_module("sm_100a", "symm_clc_hardware_greedy").expect("sm_100a");
        assert!(module.contains(".target sm_100a") && module.contains("try_cancel"));
        assert!(kernel_module("sm_90", "symm_clc_hardware_greedy").is_none());
        let module = kernel_module("sm_80", "symm_all_gather").expect("sm_80");
        assert!(module.contains(".target sm_80"));
        assert!(kernel_module("sm_75", "symm_all_gather").is_none());
    }

    #[test]
    fn every_kernel_of_the_shipped_ptx_is_cut_out_with_its_callees() {
        for (_, ptx) in targets() {
            let index = split::PtxIndex::new(ptx);
            let kernels = index.kernels();
            assert!(kernels.len() > 200);
            for kernel in kernels {
                let module = index.kernel_module(kernel).expect("defined");
                assert_eq!(module.matches(".entry ").count(), 1, "{kernel}");
                // Every called function is defined in the module.
                for line in module
                    .lines()
                    .filter(|l| l.trim_start().starts_with("call"))
                {
                    let callee = line
                        .split([' ', '\t', ',', ';', '(', ')'])
                        .find(|t| t.starts_with("_R") || t.starts_with("symm_"));
                    if let Some(callee) = callee {
                        assert!(
                            module.contains(&format!(" {callee}(")),
                            "{kernel}: {callee} not defined"
                        );
                    }
                }
            }
        }
    }
}
