//! Numbers the kernels move and reduce: the narrow float formats (software conversions, the
//! same bits on the GPU and the host), the [`element::Element`] trait that maps every
//! `symmDataType_t` to a storage type and an accumulator, and the reductions of
//! [`ops`].
//!
//! Accumulation rules (documented in `symm.h` terms):
//! * float16, bfloat16, float8 e4m3/e5m2 accumulate in f32 and round once, at the end;
//! * float32 in f32, float64 in f64;
//! * 8- and 32-bit integers accumulate in 64 bits, 64-bit integers in 128 bits; sum and prod
//!   wrap (two's complement) when the result is narrowed; avg is the exact sum divided by the
//!   number of ranks, truncated toward zero.

pub mod dynamic;
pub mod element;
pub mod ops;
pub mod small_float;

/// The seal of [`element::Element`], [`ops::Accumulator`] and [`ops::ReduceOp`]: the kernels'
/// element types, accumulators and operators are this crate's only (a user's type could break
/// the sizes and alignments the kernels rely on).
pub(crate) mod sealed {
    /// Implemented for this crate's element types only.
    pub trait Sealed {}
    /// Implemented for this crate's accumulators only.
    pub trait SealedAccumulator {}
    /// Implemented for this crate's operators only.
    pub trait SealedOp {}
}
