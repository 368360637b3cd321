//! [`Element`]: the storage type of each `symmDataType_t`, its accumulator, and the
//! conversions between them.

use super::ops::Accumulator;
use super::small_float::{BFLOAT16, FLOAT8_E4M3, FLOAT8_E5M2, FLOAT16};
use crate::types::DataType;
use bytemuck::{Pod, Zeroable};

/// An element type of the collectives: sealed (this crate's 12 types: 1, 2, 4 or 8 bytes,
/// aligned to their size).
pub trait Element: Copy + Send + Sync + 'static + super::sealed::Sealed {
    /// What values are reduced in.
    type Acc: Accumulator;
    /// The C ABI data type.
    const DTYPE: DataType;
    /// Convert to the accumulator (exact).
    fn widen(self) -> Self::Acc;
    /// Convert the reduced value back (rounding to nearest even for floats, wrapping for
    /// integers).
    fn narrow(acc: Self::Acc) -> Self;
    /// The element's bits, zero-extended.
    fn to_bits(self) -> u64;
    /// The element with these (low) bits.
    fn from_bits(bits: u64) -> Self;
}

macro_rules! small_float {
    ($name:ident, $bits:ty, $format:expr, $dtype:ident, $doc:literal) => {
        #[doc = $doc]
        #[repr(transparent)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
        pub struct $name(pub $bits);

        impl $name {
            /// Round `x` to this format.
            #[inline(always)]
            pub fn from_f32(x: f32) -> Self {
                $name($format.from_f32(x) as $bits)
            }
            /// The value as f32 (exact).
            #[inline(always)]
            pub fn to_f32(self) -> f32 {
                $format.to_f32(self.0 as u32)
            }
        }

        impl super::sealed::Sealed for $name {}

        impl Element for $name {
            type Acc = f32;
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn widen(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn narrow(acc: f32) -> Self {
                Self::from_f32(acc)
            }
            #[inline(always)]
            fn to_bits(self) -> u64 {
                self.0 as u64
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                $name(bits as $bits)
            }
        }
    };
}

small_float!(
    F16,
    u16,
    FLOAT16,
    Float16,
    "IEEE binary16, stored as its bits."
);
small_float!(
    Bf16,
    u16,
    BFLOAT16,
    Bfloat16,
    "bfloat16, stored as its bits."
);
small_float!(
    F8E4M3,
    u8,
    FLOAT8_E4M3,
    Float8E4M3,
    "float8 e4m3, stored as its bits."
);
small_float!(
    F8E5M2,
    u8,
    FLOAT8_E5M2,
    Float8E5M2,
    "float8 e5m2, stored as its bits."
);

macro_rules! native {
    ($($t:ty => $acc:ty, $dtype:ident, $bits:ty);* $(;)?) => {$(
        impl super::sealed::Sealed for $t {}

        impl Element for $t {
            type Acc = $acc;
            const DTYPE: DataType = DataType::$dtype;
            #[inline(always)]
            fn widen(self) -> $acc {
                self as $acc
            }
            #[inline(always)]
            fn narrow(acc: $acc) -> Self {
                acc as $t
            }
            #[inline(always)]
            fn to_bits(self) -> u64 {
                <$bits>::from_ne_bytes(self.to_ne_bytes()) as u64
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                <$t>::from_ne_bytes((bits as $bits).to_ne_bytes())
            }
        }
    )*};
}

native! {
    i8 => i64, Int8, u8;
    u8 => u64, Uint8, u8;
    i32 => i64, Int32, u32;
    u32 => u64, Uint32, u32;
    i64 => i128, Int64, u64;
    u64 => u128, Uint64, u64;
    f32 => f32, Float32, u32;
    f64 => f64, Float64, u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_widen_exactly_and_narrow_by_wrapping() {
        assert_eq!(i8::narrow(130), -126);
        assert_eq!(u8::narrow(300), 44);
        assert_eq!(i64::narrow(i64::MAX as i128 + 1), i64::MIN);
        assert_eq!((-5i32).widen(), -5i64);
    }

    #[test]
    fn small_floats_round_trip() {
        assert_eq!(F16::from_f32(1.5).to_f32(), 1.5);
        assert_eq!(Bf16::from_f32(-2.0).to_f32(), -2.0);
        assert_eq!(F8E4M3::from_f32(448.0).to_f32(), 448.0);
        assert_eq!(F8E5M2::from_f32(0.25).to_f32(), 0.25);
        assert_eq!(F16::DTYPE as u32, 6);
    }

    #[test]
    fn bits_round_trip() {
        assert_eq!((-2i8).to_bits(), 0xFE);
        assert_eq!(i8::from_bits(0xFE), -2);
        assert_eq!(<f32 as Element>::from_bits(1.5f32.to_bits() as u64), 1.5);
        assert_eq!(Element::to_bits(-1.0f64), (-1.0f64).to_bits());
        assert_eq!(Bf16::from_bits(0x3F80).to_f32(), 1.0);
    }
}
