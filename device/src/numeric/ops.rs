//! Reductions, generic over the accumulator, and the accumulator arithmetic.

use crate::types::RedOp;

/// Arithmetic of an accumulator. Integer accumulators wrap.
pub trait Accumulator: Copy + super::sealed::SealedAccumulator {
    /// Zero.
    const ZERO: Self;
    /// `self + other`.
    fn add(self, other: Self) -> Self;
    /// `self * other`.
    fn mul(self, other: Self) -> Self;
    /// The larger (floats: the non-NaN one if one is NaN).
    fn max(self, other: Self) -> Self;
    /// The smaller (floats: the non-NaN one if one is NaN).
    fn min(self, other: Self) -> Self;
    /// `self / nranks` (integers: truncated toward zero).
    fn div_ranks(self, nranks: u32) -> Self;
}

macro_rules! float_accumulator {
    ($($t:ty),*) => {$(
        impl super::sealed::SealedAccumulator for $t {}

        impl Accumulator for $t {
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn add(self, other: Self) -> Self { self + other }
            #[inline(always)]
            fn mul(self, other: Self) -> Self { self * other }
            #[inline(always)]
            fn max(self, other: Self) -> Self { <$t>::max(self, other) }
            #[inline(always)]
            fn min(self, other: Self) -> Self { <$t>::min(self, other) }
            #[inline(always)]
            fn div_ranks(self, nranks: u32) -> Self { self / nranks as $t }
        }
    )*};
}

macro_rules! integer_accumulator {
    ($($t:ty),*) => {$(
        impl super::sealed::SealedAccumulator for $t {}

        impl Accumulator for $t {
            const ZERO: Self = 0;
            #[inline(always)]
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            #[inline(always)]
            fn mul(self, other: Self) -> Self { self.wrapping_mul(other) }
            #[inline(always)]
            fn max(self, other: Self) -> Self { Ord::max(self, other) }
            #[inline(always)]
            fn min(self, other: Self) -> Self { Ord::min(self, other) }
            #[inline(always)]
            fn div_ranks(self, nranks: u32) -> Self {
                // `nranks` is at least 1 (contexts are checked); `max` lets the compiler see
                // it, so no division-by-zero panic path is emitted.
                self.wrapping_div(nranks.max(1) as $t)
            }
        }
    )*};
}

float_accumulator!(f32, f64);
integer_accumulator!(i64, u64, i128, u128);

/// A reduction: how two ranks' values combine, and what happens after the last one.
pub trait ReduceOp: 'static + super::sealed::SealedOp {
    /// The C ABI operator.
    const OP: RedOp;
    /// Combine the running value with the next rank's.
    fn combine<A: Accumulator>(acc: A, next: A) -> A;
    /// Finish after all `nranks` values were combined.
    #[inline(always)]
    fn finish<A: Accumulator>(acc: A, nranks: u32) -> A {
        let _ = nranks;
        acc
    }
}

/// Sum.
pub struct Sum;
/// Product.
pub struct Prod;
/// Maximum.
pub struct Max;
/// Minimum.
pub struct Min;
/// Sum divided by the number of ranks.
pub struct Avg;

impl super::sealed::SealedOp for Sum {}

impl ReduceOp for Sum {
    const OP: RedOp = RedOp::Sum;
    #[inline(always)]
    fn combine<A: Accumulator>(acc: A, next: A) -> A {
        acc.add(next)
    }
}

impl super::sealed::SealedOp for Prod {}

impl ReduceOp for Prod {
    const OP: RedOp = RedOp::Prod;
    #[inline(always)]
    fn combine<A: Accumulator>(acc: A, next: A) -> A {
        acc.mul(next)
    }
}

impl super::sealed::SealedOp for Max {}

impl ReduceOp for Max {
    const OP: RedOp = RedOp::Max;
    #[inline(always)]
    fn combine<A: Accumulator>(acc: A, next: A) -> A {
        acc.max(next)
    }
}

impl super::sealed::SealedOp for Min {}

impl ReduceOp for Min {
    const OP: RedOp = RedOp::Min;
    #[inline(always)]
    fn combine<A: Accumulator>(acc: A, next: A) -> A {
        acc.min(next)
    }
}

impl super::sealed::SealedOp for Avg {}

impl ReduceOp for Avg {
    const OP: RedOp = RedOp::Avg;
    #[inline(always)]
    fn combine<A: Accumulator>(acc: A, next: A) -> A {
        acc.add(next)
    }
    #[inline(always)]
    fn finish<A: Accumulator>(acc: A, nranks: u32) -> A {
        acc.div_ranks(nranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_arithmetic_wraps_and_truncates() {
        assert_eq!(Accumulator::add(u64::MAX, 2u64), 1);
        assert_eq!(Accumulator::mul(i64::MIN, -1i64), i64::MIN);
        assert_eq!(Accumulator::div_ranks(-7i64, 2), -3);
        assert_eq!(Accumulator::div_ranks(7u64, 2), 3);
        assert_eq!(Avg::finish(Avg::combine(3i64, 4), 2), 3);
    }

    #[test]
    fn float_max_min_ignore_nan() {
        assert_eq!(Max::combine(f32::NAN, 1.0f32), 1.0);
        assert_eq!(Min::combine(2.0f64, f64::NAN), 2.0);
        assert_eq!(Avg::finish(Avg::combine(1.0f32, 2.0), 2), 1.5);
    }
}
