//! The memory of the host `arch` layer under `--cfg loom`.
//!
//! Kernels address memory by raw `u64` addresses, while loom can only track its own objects.
//! This module keeps, per loom execution, a registry from address to a loom object, declared by
//! the test ([`model_word`]) with the value the raw memory holds then, on the model's main
//! thread before the grid starts (loom counts an object's creation as an access by its
//! creator):
//!
//! * words accessed atomically (`*_acquire_sys`, `*_release_sys`, `atomic_*_gpu`) become
//!   `loom::sync::atomic::AtomicU32`, the halves of LL lines `AtomicU64`;
//! * words accessed plainly (`arch::load_plain_*` / `arch::store_plain_*`, the epoch and LL
//!   call counters, the scheduler's response slots) become `loom::cell::UnsafeCell`s, so that
//!   loom's causality checker reports a plain access that is not ordered after a conflicting
//!   one. A plain read of a word that is otherwise atomic is a relaxed load, as a volatile
//!   load is on the GPU (the software source's epoch, read at the start of a launch while the
//!   launch's last block may already store the next one).
//!
//! The registry lives in a `loom::lazy_static`, so it starts empty in every execution; it is
//! touched first by `run_grid` on the model's main thread, before any grid thread starts, so
//! its own initialisation orders nothing that the model does not already order. It also holds
//! the [`Mutation`]s a test asked for.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32 as StdAtomicU32, Ordering as StdOrdering};

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64};

/// A deliberate weakening of the protocols that loom tests switch on to show that they catch
/// it. Only exists under `--cfg loom`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Mutation {
    /// `store_release_sys_u32` and `store_line` store with `Relaxed` instead of `Release`.
    ReleaseAsRelaxed = 1,
    /// `load_acquire_sys_u32` and `load_line` load with `Relaxed` instead of `Acquire`.
    AcquireAsRelaxed = 2,
    /// `CrossRankBarrier::finish` leaves out the block barrier after the epoch store.
    FinishWithoutClosingBarrier = 4,
    /// `LlCall::end` leaves out the block barrier after the call-counter stores.
    LlEndWithoutClosingBarrier = 8,
    /// `LlCall::begin` never clears the other parity's lines at the end of a flag period.
    LlSkipPeriodClear = 16,
    /// `PatRounds::wait_ready` returns at once: a PAT sender stores into its receiver without
    /// waiting for it to enter the round.
    PatSkipReadyWait = 32,
    /// `CrossRankBarrier::sync_unanimous` writes the rank's vote after the barrier instead of
    /// before it: a peer may read the previous vote.
    VoteAfterBarrier = 64,
    /// `Pairs::post` publishes a send in the receiver's `posted` word before it writes the
    /// descriptor.
    P2pPostBeforeDescriptor = 128,
    /// `Pairs::receive` stores the sender's `done` word before it copies the bytes.
    P2pDoneBeforeCopy = 256,
    /// `Pairs::post` reuses a descriptor slot without waiting for the receiver to finish the
    /// send that held it.
    P2pSkipSlotWait = 512,
    /// `Pairs::fill_piece` and `Pairs::ring_slot_free` reuse a ring slot without waiting for
    /// the receiver to copy out the piece that held it.
    P2pRingSkipDrainWait = 1024,
    /// `Pairs::drain_piece` tells the sender a piece is copied out before it copies it.
    P2pRingDrainBeforeCopy = 2048,
}

#[derive(Clone)]
enum Word {
    Atomic32(Arc<AtomicU32>),
    Atomic64(Arc<AtomicU64>),
    Plain32(Arc<UnsafeCell<u32>>),
    Plain64(Arc<UnsafeCell<u64>>),
}

struct Registry {
    words: Mutex<HashMap<u64, Word>>,
    mutations: StdAtomicU32,
}

// SAFETY: loom runs the threads of one execution one at a time, on one OS thread, and every
// access to a registered object is tracked by loom itself; the registry's map is behind a mutex
// that is never held across a loom operation.
unsafe impl Send for Registry {}
// SAFETY: as above.
unsafe impl Sync for Registry {}

loom::lazy_static! {
    static ref REGISTRY: Registry = Registry {
        words: Mutex::new(HashMap::new()),
        mutations: StdAtomicU32::new(0),
    };
}

/// Create the registry of this execution (from `run_grid`, before any grid thread starts).
pub(super) fn touch() {
    let _ = &*REGISTRY;
}

/// Ask for `mutation` in the rest of this loom execution (call it at the start of the model's
/// closure, on its main thread).
pub fn mutate(mutation: Mutation) {
    REGISTRY
        .mutations
        .fetch_or(mutation as u32, StdOrdering::Relaxed);
}

/// `true` when the running loom execution asked for `mutation`.
pub fn mutated(mutation: Mutation) -> bool {
    REGISTRY.mutations.load(StdOrdering::Relaxed) & mutation as u32 != 0
}

/// What a word of memory stands for in a loom model (see [`model_word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordKind {
    /// A `u32` accessed atomically (plain reads are relaxed loads).
    AtomicU32,
    /// A `u64` accessed atomically (an LL line half).
    AtomicU64,
    /// A `u32` accessed plainly, checked for races.
    PlainU32,
    /// A `u64` accessed plainly, checked for races.
    PlainU64,
}

/// Declare the word at `addr` as a `kind` for the rest of the running loom execution, with the
/// value it holds now. Call it on the model's main thread before `run_grid`: a loom object's
/// creation is an access by its creator, so an object created by a grid thread would race with
/// every other grid thread. Every word the kernels touch through `arch` must be declared.
///
/// # Safety
/// `addr` is valid for reads of the kind's width and aligned; no grid thread runs.
// Loom's cells are neither Send nor Sync; the registry shares them between loom threads, which
// run one at a time on one OS thread (see the `Sync` impl of `Registry`).
#[allow(clippy::arc_with_non_send_sync)]
pub unsafe fn model_word(addr: u64, kind: WordKind) {
    // SAFETY: caller's contract.
    let word = unsafe {
        match kind {
            WordKind::AtomicU32 => Word::Atomic32(Arc::new(AtomicU32::new(
                core::ptr::read_volatile(addr as *const u32),
            ))),
            WordKind::AtomicU64 => Word::Atomic64(Arc::new(AtomicU64::new(
                core::ptr::read_volatile(addr as *const u64),
            ))),
            WordKind::PlainU32 => Word::Plain32(Arc::new(UnsafeCell::new(
                core::ptr::read_volatile(addr as *const u32),
            ))),
            WordKind::PlainU64 => Word::Plain64(Arc::new(UnsafeCell::new(
                core::ptr::read_volatile(addr as *const u64),
            ))),
        }
    };
    REGISTRY
        .words
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(addr, word);
}

fn lookup(addr: u64) -> Word {
    REGISTRY
        .words
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&addr)
        .cloned()
        .unwrap_or_else(|| {
            panic!("loom model: the word at {addr:#x} was not declared with model_word")
        })
}

fn conflict(addr: u64, what: &str) -> ! {
    panic!("loom model: the word at {addr:#x} is {what}")
}

/// The loom atomic standing for the `u32` at `ptr`.
///
/// # Safety
/// None beyond the declaration of the word (unsafe only to match the plain-memory version).
pub(super) unsafe fn atomic_u32(ptr: *mut u32) -> Arc<AtomicU32> {
    match lookup(ptr as u64) {
        Word::Atomic32(atomic) => atomic,
        _ => conflict(
            ptr as u64,
            "accessed atomically but not declared an atomic u32",
        ),
    }
}

/// The loom atomic standing for the `u64` at `ptr` (an LL line half).
///
/// # Safety
/// As for [`atomic_u32`].
pub(super) unsafe fn atomic_u64(ptr: *mut u64) -> Arc<AtomicU64> {
    match lookup(ptr as u64) {
        Word::Atomic64(atomic) => atomic,
        _ => conflict(
            ptr as u64,
            "accessed atomically but not declared an atomic u64",
        ),
    }
}

/// Plain read of the `u32` at `ptr`, checked by loom.
///
/// # Safety
/// None beyond the declaration of the word: the model reads its own object.
pub unsafe fn load_plain_u32(ptr: *const u32) -> u32 {
    match lookup(ptr as u64) {
        // A volatile load on the GPU is a relaxed, system-scope load: model it as one.
        Word::Atomic32(atomic) => atomic.load(std::sync::atomic::Ordering::Relaxed),
        // SAFETY: the cell holds a u32; loom checks the access.
        Word::Plain32(cell) => cell.with(|p| unsafe { *p }),
        _ => conflict(ptr as u64, "read as a plain u32 but declared otherwise"),
    }
}

/// Plain write of the `u32` at `ptr`, checked by loom.
///
/// # Safety
/// None beyond the declaration of the word: the model writes its own object.
pub unsafe fn store_plain_u32(ptr: *mut u32, value: u32) {
    match lookup(ptr as u64) {
        // SAFETY: the cell holds a u32; loom checks the access.
        Word::Plain32(cell) => cell.with_mut(|p| unsafe { *p = value }),
        _ => conflict(ptr as u64, "written as a plain u32 but not declared one"),
    }
}

/// Plain read of the `u64` at `ptr`, checked by loom.
///
/// # Safety
/// None beyond the declaration of the word: the model reads its own object.
pub unsafe fn load_plain_u64(ptr: *const u64) -> u64 {
    match lookup(ptr as u64) {
        // A volatile load on the GPU is a relaxed, system-scope load: model it as one.
        Word::Atomic64(atomic) => atomic.load(std::sync::atomic::Ordering::Relaxed),
        // SAFETY: the cell holds a u64; loom checks the access.
        Word::Plain64(cell) => cell.with(|p| unsafe { *p }),
        _ => conflict(ptr as u64, "read as a plain u64 but declared otherwise"),
    }
}

/// Plain write of the `u64` at `ptr`, checked by loom.
///
/// # Safety
/// None beyond the declaration of the word: the model writes its own object.
pub unsafe fn store_plain_u64(ptr: *mut u64, value: u64) {
    match lookup(ptr as u64) {
        // SAFETY: the cell holds a u64; loom checks the access.
        Word::Plain64(cell) => cell.with_mut(|p| unsafe { *p = value }),
        _ => conflict(ptr as u64, "written as a plain u64 but not declared one"),
    }
}
