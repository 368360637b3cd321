//! Chooses the shipped SASS to embed (`src/ptx/mod.rs`): with the feature `sass`, that of
//! every target whose PTX is embedded (features `ptx-sm80`, `ptx-sm90`, `ptx-sm100a`), unless
//! `SYMM_SASS_TARGETS` names a subset (comma-separated, e.g. `sm_90`; empty: none), which
//! `cargo xtask gpu-bundle` uses to keep the archive a GPU machine is sent small. Each
//! embedded target sets `cfg(symm_sass_<target>)`.

fn main() {
    const SASS_TARGETS: [&str; 3] = ["sm_80", "sm_90", "sm_100a"];
    let chosen = std::env::var("SYMM_SASS_TARGETS").ok();
    let feature = |name: &str| std::env::var_os(format!("CARGO_FEATURE_{name}")).is_some();
    for target in SASS_TARGETS {
        println!("cargo::rustc-check-cfg=cfg(symm_sass_{target})");
        let ptx_feature = format!("PTX_{}", target.replace('_', "").to_uppercase());
        let embed = feature("SASS")
            && feature(&ptx_feature)
            && chosen
                .as_deref()
                .is_none_or(|list| list.split(',').any(|t| t.trim() == target));
        if embed {
            println!("cargo:rustc-cfg=symm_sass_{target}");
        }
    }
    if let Some(list) = &chosen {
        for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if !SASS_TARGETS.contains(&t) {
                panic!("SYMM_SASS_TARGETS: unknown target {t:?} (known: {SASS_TARGETS:?})");
            }
        }
    }
    println!("cargo:rerun-if-env-changed=SYMM_SASS_TARGETS");
    println!("cargo:rerun-if-changed=build.rs");
}
