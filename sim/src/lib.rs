//! A simulated GPU: parses the PTX symm ships and executes kernels on the CPU, every GPU
//! thread of every running grid interleaved on one OS thread by a seeded, adversarial
//! scheduler.
//!
//! The address space is flat: a device address is a host address (the fake CUDA driver in
//! `sim/cuda` hands out host memory as device memory). Every access a kernel makes is checked
//! against the [`AddressSpace`] the driver maintains.
//!
//! This is the interface the fake driver (`symm-sim-cuda`) programs against:
//! [`Module::load`] → [`Module::kernel`] → [`Simulator::launch`] → [`Simulator::run`].
//!
//! # Execution model
//!
//! - **Interpretation.** PTX is lowered at [`Module::load`] to a compact pre-decoded form
//!   (resolved register slots, immediates as constant slots, resolved branch targets and call
//!   sites). Anything not implemented is rejected there, naming the line.
//! - **Scheduling.** Only memory and synchronisation instructions (`ld`, `st`, `atom`,
//!   `barrier`, `nanosleep`) are interleaving points: a thread runs straight through pure
//!   arithmetic. Plain (weak) loads are interleaving points only under a quarter of the
//!   seeds: in data-race-free code they cannot change an outcome, and weak mode explores
//!   racy reads anyway. Each scheduling decision either takes the runnable thread of highest priority
//!   (PCT: random priorities, lowered at random change points) or, with a per-seed
//!   probability, a uniformly random runnable thread for a random burst of interleaving
//!   points. Every choice comes from [`SimConfig::seed`]: the same seed and the same launches
//!   give the same execution.
//! - **Virtual time.** `%globaltimer` is virtual: every live GPU thread runs one instruction
//!   per nanosecond, i.e. time advances by 1 ns per *L* instructions executed in the whole
//!   simulation, *L* being the number of live threads of resident blocks (at least 1). It
//!   moves otherwise only by [`Simulator::advance_time_to`].
//! - **Spinning.** `nanosleep` parks a thread until virtual time reaches its wake-up, or until
//!   another thread stores to a location (8-byte granule) it loaded since its previous
//!   `nanosleep` (a store between that load and the sleep makes the sleep return at once).
//!   When every live thread is parked (sleeping, at a barrier, or its block waiting for
//!   residency) [`Simulator::run`] returns [`RunOutcome::Stalled`] without moving time.
//! - **Residency.** Blocks occupy SM resources (threads, registers, block slots) from start
//!   to exit, non-preemptively, started in launch and index order.
//! - **Barriers.** `barrier.sync` / `barrier.red` complete when every non-exited thread of
//!   the block arrived (PTX: exited threads do not take part). Threads of one block waiting
//!   at different barrier instructions, or mixing `barrier.red` with `barrier.sync`, is a
//!   fault (see [`Simulator::set_strict_barriers`]).
//! - **Memory.** Every access is checked against the [`AddressSpace`] (mapped, allowed for the
//!   device, aligned to its size; a vector access to its whole size) and goes to real host
//!   memory through atomic accesses. With [`SimConfig::weak_memory`], per-location store
//!   histories with happens-before knowledge let relaxed, volatile and plain loads return
//!   older stores that coherence and happens-before allow (biased to stale ones);
//!   `st.release` / release atomics publish, `ld.acquire` / acquire atomics join, barriers
//!   join the block; read-modify-writes read the newest store; vector elements are separate
//!   locations. The newest value is always in real memory. Data races (a plain access and a
//!   conflicting access of another thread that happens-before does not order) are faults
//!   naming both accesses, unless [`SimConfig::races`] is off.
//! - **Faults** ([`RunOutcome::Fault`], classified by [`FaultKind::of`]) name the kernel,
//!   grid, block, thread, PTX line and text, the call chain (a `trap` names the Rust panic
//!   function that raised it) and the seed; the grid is removed.
//!
//! # Layout
//!
//! One module per concept. The interface: `config` ([`SimConfig`]), `error` ([`SimError`]),
//! `module` ([`Module`]), `memory` ([`AddressSpace`], the checked host accesses) and
//! `simulator` ([`Simulator`], [`Launch`], [`RunOutcome`]). Interpretation: `lex`, `parse`
//! and `parse::lower` (PTX text to the pre-decoded form of `ir`), `exec` (runs one thread).
//! The simulator's concepts, each an `impl Simulator` block of its own: `schedule`, `sleep`,
//! `barrier`, `residency`, `fault` ([`FaultKind`], the reports; with `demangle`). Weak
//! memory: `weak`. Helpers: `rng`, `fx`.

#![deny(unsafe_op_in_unsafe_fn)]

mod barrier;
mod config;
mod demangle;
mod error;
mod exec;
mod fault;
mod fx;
mod ir;
mod lex;
mod memory;
mod module;
mod parse;
mod residency;
mod rng;
mod schedule;
mod simulator;
mod sleep;
mod weak;

pub use config::SimConfig;
pub use error::SimError;
pub use fault::FaultKind;
pub use memory::AddressSpace;
pub use module::{KernelId, KernelInfo, Module, ParamInfo};
pub use simulator::{GridId, Launch, RunOutcome, SimStats, Simulator};

/// The driver shares these between its threads.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    shared::<Module>();
    shared::<AddressSpace>();
    const fn movable<T: Send>() {}
    movable::<Simulator>();
};
