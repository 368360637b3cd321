//! Gives `libsymm.so` its SONAME on Linux (`symm_artifacts::soname`), so that programs linked against it
//! record the compatible version and `cargo xtask install` can lay it out as a system library.
//!
//! Also chooses the shipped SASS to embed (`src/ptx/mod.rs`): every target's, unless
//! `SYMM_SASS_TARGETS` names a subset (comma-separated, e.g. `sm_90`; empty: none), which
//! `cargo xtask gpu-bundle` uses to keep the archive a GPU machine is sent small. Each
//! embedded target sets `cfg(symm_sass_<target>)`.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-soname,{}",
            symm_artifacts::soname(&version)
        );
    }
    const SASS_TARGETS: [&str; 3] = ["sm_80", "sm_90", "sm_100a"];
    let chosen = std::env::var("SYMM_SASS_TARGETS").ok();
    for target in SASS_TARGETS {
        println!("cargo::rustc-check-cfg=cfg(symm_sass_{target})");
        let embed = chosen
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
