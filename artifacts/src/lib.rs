//! # symm-artifacts
//!
//! The formats of what symm's build ships, in one place for the three programs that write and
//! read them: libsymm (reads the embedded PTX and SASS, cuts one kernel's module; symm-c names
//! its SONAME in its build script), `cargo xtask` (writes `ptx-out/`, checks every kernel's module,
//! lays out the installed library's links) and the simulated GPU's tests (load kernels from the
//! shipped PTX). Pure data processing, std and miniz_oxide only.

#![warn(missing_docs)]

pub mod gzip;
pub mod soname;
pub mod split;

pub use soname::soname;
