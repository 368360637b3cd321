//! # symm — host shim
//!
//! The C ABI of symm (`libsymm.a`, `libsymm.so`, `ffi-headers/symm.h`), NCCL-shaped. Data flows
//! one way:
//!
//! C ABI ([`ffi::api`]) → validation ([`collective`], [`window`], [`comm`], [`group`]) → plan
//! ([`plan`], pure) → launch schedule ([`backend::schedule`], pure data) → executor
//! ([`backend`]: CUDA driver, host threads, or the checking model) → kernel (`symm-device`).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod abi;
pub mod backend;
#[cfg(target_os = "linux")]
pub mod bootstrap;
#[cfg(target_os = "linux")]
pub mod call_records;
pub mod clc;
pub mod collective;
pub mod comm;
pub mod config;
pub mod error;
pub mod failure;
#[cfg(target_os = "linux")]
pub mod fdpass;
pub mod ffi;
pub mod fusion;
pub mod group;
#[cfg(target_os = "linux")]
pub mod link;
pub mod mutation;
pub mod plan;
pub mod ptx;
pub mod scale_model;
#[cfg(target_os = "linux")]
pub mod shareable;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod window;

pub use abi::*;
pub use ffi::api::*;
