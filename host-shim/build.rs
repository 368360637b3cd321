//! Gives `libsymm.so` its SONAME on Linux, so that programs linked against it record the
//! compatible version (`libsymm.so.0.<minor>` while the major version is 0, whose minor
//! versions break compatibility; `libsymm.so.<major>` from 1.0) and `cargo xtask install`
//! can lay it out as a system library.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
        let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
        let soname = if major == "0" {
            format!("libsymm.so.0.{minor}")
        } else {
            format!("libsymm.so.{major}")
        };
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
