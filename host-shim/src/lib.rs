//! # symm — host shim
//!
//! The C ABI of symm (`libsymm.a`, `libsymm.so`, `ffi-headers/symm.h`), NCCL-shaped: its
//! functions (`symmCommInitRank`, `symmAllReduce`, …) and types (`symmResult_t`,
//! `symmDataType_t`, …) are at the crate root, with the C names, for C callers and for Rust
//! programs that call it as C does.
//!
//! Inside, data flows one way: the C ABI (`ffi::api`) → now or at the group's end (`group`) →
//! validation and plan (`collective`, `plan`, pure) → numbering and agreement (`agree`,
//! `comm`) → launch (`launch`, the schedule as pure data) → executor (`backend`: CUDA driver,
//! host threads, or the checking model) → kernel (`symm-device`). These modules are private;
//! `docs/ARCHITECTURE.md` has the layers and their invariants.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod abi;
mod agree;
mod api;
mod backend;
mod collective;
mod comm;
mod config;
mod error;
mod ffi;
mod group;
mod launch;
mod log;
mod mutation;
mod plan;
mod point_to_point;
mod ptx;
#[cfg(target_os = "linux")]
mod transport;
mod window;

pub use abi::*;
pub use api::*;
pub use ffi::api::*;

/// The internals that the project's own tests and benchmarks drive directly (the planner, the
/// launch model, a communicator's state). Not part of the API: it changes without notice.
#[doc(hidden)]
pub mod internals {
    pub use crate::backend::clc::{
        Config as ClcConfig, Report as ClcReport, Variant as ClcVariant,
    };
    pub use crate::backend::cuda::launched_param_types;
    pub use crate::backend::{Backend, BackendKind, model, select as select_backend};
    pub use crate::comm::Comm;
    pub use crate::error::Error;
    pub use crate::group::fusion;
    pub use crate::launch::schedule::{LaunchSchedule, StreamOp};
    pub use crate::plan::batch::{BatchRequest, plan_batch};
    pub use crate::plan::scale_model;
    pub use crate::plan::{Collective, GPU_MODEL, Limits, Plan, parse_forced_algorithm, plan};
    pub use crate::ptx::{sass_target_for_capability, text as ptx_text};
}
