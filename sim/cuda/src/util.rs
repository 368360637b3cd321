//! Helpers shared by the entry points: error plumbing, panic containment, output pointers,
//! handle encoding and the scheduler's random numbers.

use cudarc::driver::sys::{CUresult, cudaError_enum as E};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The result of a driver operation: a value or the `CUresult` the entry point returns.
pub(crate) type CuResult<T> = Result<T, CUresult>;

/// Run the body of entry point `name`, turning its result into a `CUresult` and a panic into
/// `CUDA_ERROR_UNKNOWN` (a panic never crosses the C ABI).
pub(crate) fn entry(name: &str, body: impl FnOnce() -> CuResult<()>) -> CUresult {
    count_call(name);
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => E::CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(no message)");
            eprintln!("symm-sim: internal error in {name}: {what}");
            E::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Report a driver function the simulation does not model and fail it.
pub(crate) fn not_supported(what: &str) -> CUresult {
    eprintln!("symm-sim: {what} is not implemented");
    E::CUDA_ERROR_NOT_SUPPORTED
}

/// Write `value` through the caller's output pointer, or fail with `CUDA_ERROR_INVALID_VALUE`
/// when it is null.
///
/// # Safety
/// A non-null `out` is valid for a write of one `T` (the caller's contract with the driver).
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> CuResult<()> {
    if out.is_null() {
        return Err(E::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and valid for writes (function contract); unaligned writes are
    // tolerated for C callers that pack their structures.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Fail with `CUDA_ERROR_INVALID_VALUE` when `p` is null.
pub(crate) fn non_null<T>(p: *const T) -> CuResult<()> {
    if p.is_null() {
        Err(E::CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// The kinds of object a handle names; part of the handle's value, so a handle of one kind
/// passed where another is expected is rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Context = 1,
    Stream = 2,
    Event = 3,
    Module = 4,
    Function = 5,
    Graph = 6,
    GraphExec = 7,
    Allocation = 8,
    Link = 9,
}

/// High bits shared by every handle this driver makes (never a valid user-space pointer, never
/// 0, 1 or 2, the special stream handles).
const HANDLE_TAG: u64 = 0x5e5e_0000_0000_0000;

/// The handle of object `id` of `kind`.
pub(crate) fn handle(kind: Kind, id: u64) -> u64 {
    HANDLE_TAG | ((kind as u64) << 40) | (id & ((1 << 40) - 1))
}

/// The id of a handle of `kind`, or `None` when the value is not such a handle.
pub(crate) fn handle_id(kind: Kind, value: u64) -> Option<u64> {
    if value & !((1 << 48) - 1) == HANDLE_TAG && (value >> 40) & 0xff == kind as u64 {
        Some(value & ((1 << 40) - 1))
    } else {
        None
    }
}

/// A small seeded generator (SplitMix64) for the device thread's scheduling choices.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c909)
    }

    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Shuffle `items` (Fisher-Yates).
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// Calls of each driver function so far, by name (see [`crate::symm_sim_driver_calls`]).
static CALLS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn count_call(name: &str) {
    let mut calls = CALLS.lock().unwrap_or_else(|e| e.into_inner());
    match calls.get_mut(name) {
        Some(n) => *n += 1,
        None => {
            calls.insert(name.to_string(), 1);
        }
    }
}

/// The calls counted so far, by name.
pub(crate) fn call_counts() -> std::collections::BTreeMap<String, u64> {
    CALLS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_kinds_do_not_mix() {
        let h = handle(Kind::Stream, 77);
        assert_eq!(handle_id(Kind::Stream, h), Some(77));
        assert_eq!(handle_id(Kind::Event, h), None);
        assert_eq!(handle_id(Kind::Stream, 0), None);
        assert_eq!(handle_id(Kind::Stream, 2), None);
        assert!(h > 2);
    }

    #[test]
    fn entry_contains_panics() {
        assert_eq!(entry("t", || Ok(())), E::CUDA_SUCCESS);
        assert_eq!(
            entry("t", || Err(E::CUDA_ERROR_INVALID_VALUE)),
            E::CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(entry("t", || panic!("boom")), E::CUDA_ERROR_UNKNOWN);
    }

    #[test]
    fn rng_is_deterministic() {
        let (mut a, mut b) = (Rng::new(5), Rng::new(5));
        for _ in 0..10 {
            assert_eq!(a.next(), b.next());
        }
        let mut v: Vec<u32> = (0..20).collect();
        a.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..20).collect::<Vec<_>>());
    }
}
