//! The element types of windows and the reduction operators, typed: a window's data type comes
//! from its element type, so no call takes a data type argument.

use crate::abi::{symmDataType_t, symmRedOp_t};

mod sealed {
    /// Only the element types the kernels support implement [`super::Element`].
    pub trait Sealed {}
}

/// A type the collectives move and reduce: a plain number whose every bit pattern is a value
/// (so windows may be read and written as bytes). Sealed: implemented for `i8`, `u8`, `i32`,
/// `u32`, `i64`, `u64`, `f32` and `f64`.
pub trait Element: Copy + Default + Send + Sync + 'static + sealed::Sealed {
    /// The C ABI's data type of `Self`.
    const DATA_TYPE: symmDataType_t;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DATA_TYPE: symmDataType_t = symmDataType_t::$d;
        }
    )*};
}

element! {
    i8 => symmInt8,
    u8 => symmUint8,
    i32 => symmInt32,
    u32 => symmUint32,
    i64 => symmInt64,
    u64 => symmUint64,
    f32 => symmFloat32,
    f64 => symmFloat64,
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum,
    /// Product (integers wrap).
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average: the sum divided by the number of ranks (integers: the exact sum, truncated
    /// toward zero).
    Avg,
}

impl ReduceOp {
    /// The C ABI's operator.
    pub const fn to_raw(self) -> symmRedOp_t {
        match self {
            ReduceOp::Sum => symmRedOp_t::symmSum,
            ReduceOp::Prod => symmRedOp_t::symmProd,
            ReduceOp::Max => symmRedOp_t::symmMax,
            ReduceOp::Min => symmRedOp_t::symmMin,
            ReduceOp::Avg => symmRedOp_t::symmAvg,
        }
    }
}
