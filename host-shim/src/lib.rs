//! # symm — host shim
//!
//! The C ABI of symm (`libsymm.a`, `libsymm.so`, `ffi-headers/symm.h`), NCCL-shaped. Data flows
//! one way:
//!
//! C ABI ([`ffi::api`]) → now or at the group's end ([`group`]) → validation and plan
//! ([`collective`], [`plan`], pure) → numbering and agreement ([`agree`], [`comm`]) → launch
//! ([`launch`], the schedule as pure data) → executor ([`backend`]: CUDA driver, host threads,
//! or the checking model) → kernel (`symm-device`). `docs/ARCHITECTURE.md` has the layers.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod abi;
pub mod agree;
pub mod backend;
pub mod collective;
pub mod comm;
pub mod config;
pub mod error;
pub mod ffi;
pub mod group;
pub mod launch;
pub mod log;
pub mod mutation;
pub mod plan;
pub mod ptx;
#[cfg(target_os = "linux")]
pub mod transport;
pub mod window;

pub use abi::*;
pub use ffi::api::*;
