//! The SONAME of libsymm, from the crate version: `libsymm.so.0.<minor>` while the major version
//! is 0 (whose minor versions break compatibility), `libsymm.so.<major>` from 1.0. Shared by
//! `build.rs` (which links it into `libsymm.so`) and `cargo xtask install` (which lays out the
//! links), so the two never disagree.

/// The SONAME for `version` (`major.minor.patch`).
pub fn soname(version: &str) -> String {
    let mut parts = version.split('.');
    let major = parts.next().unwrap_or("0");
    let minor = parts.next().unwrap_or("0");
    if major == "0" {
        format!("libsymm.so.0.{minor}")
    } else {
        format!("libsymm.so.{major}")
    }
}
