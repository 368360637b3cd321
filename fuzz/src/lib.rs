//! Fuzzing of C ABI call sequences against a reference model.
//!
//! An input is a sequence of [`input::Op`]s. [`run_input`] replays it through the library's
//! exported `extern "C"` functions, exactly as a C program calls them: communicators of 1–4
//! ranks on the host backend (made by `symmCommInitAll`, or by `symmGetUniqueId` and
//! `symmCommInitRank` with one thread per rank), allocations, windows, the three collectives,
//! groups, teardown and error queries, with arguments that are valid, stale (destroyed, freed,
//! deregistered), foreign (another rank's or communicator's), NULL or made up. Its
//! communicators are strict (`SYMM_STRICT_WINDOWS=1`): a buffer outside every window is
//! refused, not staged.
//!
//! Before every call the model ([`Harness`]) predicts its result code from what the earlier
//! calls left: which handles are live, which allocations and windows each rank holds, which
//! registrations are complete, what is queued in the open group. A well-formed collective is
//! issued by every rank of a communicator inside a group (one thread drives all ranks); an
//! ill-formed one is a single call that must fail validation without touching memory (a refused
//! call still counts as its rank's call, so on a communicator of several ranks it taints the
//! communicator, or makes its group's end uncertain). After a
//! collective ran, every receive buffer is checked against a reference computed independently
//! (integers exactly, floats in f64 within an error bound), and every byte of every allocation
//! outside the receive buffers must be unchanged.
//!
//! A call that can only time out (a collective or registration some rank does not join) is
//! predicted as `symmTimeout`; a communicator that timed out is *tainted*: from then on the
//! model accepts any result there but `symmInternalError`, and no call may outlive its bound.
//! Such calls are limited per input, since each waits for `SYMM_TIMEOUT_MS`.
//!
//! Failure is a panic: a result other than the predicted one, wrong data, a changed byte, a
//! call that blocks far past its bound, `symmInternalError` (a panic caught at the FFI
//! boundary), or an invalid error string; and, under the sanitizer, any memory error.
//!
//! The modules, by concept:
//!
//! * [`input`] — the input format, and [`numeric`] — element types and reference reductions;
//! * `config` — the process environment, timeouts and per-input limits;
//! * `model` — the model's state: communicators, ranks, allocations, windows, queued work;
//! * `harness` — [`Harness`]: the model of one input, running each operation and tearing down;
//! * `select` — what a selector of the input names (a handle, an address, a window);
//! * `driver` — making a C call and comparing its result code with the prediction;
//! * `comm` — communicators: creation, misuse, destruction, queries;
//! * `memory` — allocations and window registration;
//! * `collective` — validating and issuing collectives;
//! * `check` — the data checks: fresh inputs, receive buffers against the reference, bytes
//!   outside them unchanged;
//! * `group` — the end of a group: predicting what it completes, then settling the model;
//! * [`stats`] — what the inputs run so far exercised.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod input;
pub mod numeric;
pub mod stats;

mod check;
mod collective;
mod comm;
mod config;
mod driver;
mod group;
mod harness;
mod memory;
mod model;
mod select;

pub use config::{FAST_TIMEOUT_MS, configure_environment, timeout_ms};
pub use harness::Harness;

use input::{Op, Reader};

/// Run one input: decode it, replay it against the model, tear everything down.
pub fn run_input(data: &[u8]) {
    configure_environment();
    let mut harness = Harness::new(data);
    let mut reader = Reader::new(data);
    let mut ran = 0;
    while let Some(op) = Op::decode(&mut reader) {
        if ran == config::MAX_OPS {
            break;
        }
        ran += 1;
        harness.run(op);
    }
    harness.finish();
}
