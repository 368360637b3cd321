//! Gives `libsymm.so` its SONAME on Linux (`symm_artifacts::soname`), so that programs linked
//! against it record the compatible version and `cargo xtask install` can lay it out as a
//! system library.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-soname,{}",
            symm_artifacts::soname(&version)
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
}
