//! # symm — host shim
//!
//! Two front ends over one implementation, both at the crate root:
//!
//! - **The Rust API**: [`Comm`], typed [`Window`]s of an [`Element`] type, collectives and
//!   sends and receives on a [`Scope`] that holds the windows until their work has run
//!   ([`scope`], in the shape of `std::thread::scope`), [`group`]s as closures, and
//!   `Result<_, `[`Error`]`>`.
//! - **The C ABI** (`libsymm.a`, `libsymm.so`, `ffi-headers/symm.h`), NCCL-shaped: its
//!   functions (`symmCommInitRank`, `symmAllReduce`, …) and types (`symmResult_t`,
//!   `symmDataType_t`, …), with the C names, for C callers and for Rust programs that call it
//!   as C does.
//!
//! ```
//! # fn main() -> Result<(), symm::Error> {
//! use symm::{Comm, ReduceOp, Stream, Window, group, scope};
//!
//! let (n, count) = (4, 1 << 16);
//! let comms = Comm::init_all(&[0; 4])?; // 4 ranks on GPU 0 (CPU threads on the host backend)
//! // Typed windows: the length and the element type go with them.
//! let mut wins: Vec<Window<f32>> = group(|| comms.iter().map(|c| c.window(count)).collect())?;
//! for (r, w) in wins.iter_mut().enumerate() {
//!     w.write(0, &vec![r as f32 + 1.0; count])?;
//! }
//! scope(|s| {
//!     // Bound for the whole scope: nothing else touches the windows until their work ran.
//!     let bound: Vec<_> = wins.iter_mut().map(|w| s.bind(w, Stream::default_stream())).collect();
//!     group(|| bound.iter().try_for_each(|b| s.all_reduce(b.all(), b.all(), ReduceOp::Sum)))
//! })??;
//! assert!(wins[0].to_vec()?.iter().all(|v| *v == (n * (n + 1) / 2) as f32));
//! # Ok(())
//! # }
//! ```
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
mod engine;
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
    pub use crate::backend::cuda::launched_param_types;
    pub use crate::backend::host::HostBackend;
    pub use crate::backend::kernel::{KernelArg, KernelLaunch};
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
