//! Elements chosen at run time by [`DataType`]: encode from and decode to f64, for host code
//! that fills and checks buffers (tests, benchmarks). Integers wrap on encoding; floats round
//! to nearest even (through f32 for the narrow formats).

use super::element::{Bf16, F8E4M3, F8E5M2, F16};
use crate::types::DataType;

/// Encode `value` as one element of `dtype` into `out[..dtype.size_bytes()]`, native endian.
pub fn encode(dtype: DataType, value: f64, out: &mut [u8]) {
    let size = dtype.size_bytes();
    let wide = value as i128;
    match dtype {
        DataType::Int8 | DataType::Uint8 => out[0] = wide as u8,
        DataType::Int32 | DataType::Uint32 => {
            out[..4].copy_from_slice(&(wide as u32).to_ne_bytes())
        }
        DataType::Int64 | DataType::Uint64 => {
            out[..8].copy_from_slice(&(wide as u64).to_ne_bytes())
        }
        DataType::Float16 => out[..2].copy_from_slice(&F16::from_f32(value as f32).0.to_ne_bytes()),
        DataType::Bfloat16 => {
            out[..2].copy_from_slice(&Bf16::from_f32(value as f32).0.to_ne_bytes())
        }
        DataType::Float32 => out[..4].copy_from_slice(&(value as f32).to_ne_bytes()),
        DataType::Float64 => out[..8].copy_from_slice(&value.to_ne_bytes()),
        DataType::Float8E4M3 => out[0] = F8E4M3::from_f32(value as f32).0,
        DataType::Float8E5M2 => out[0] = F8E5M2::from_f32(value as f32).0,
    }
    debug_assert!(out.len() >= size);
}

/// Decode one element of `dtype` from `bytes[..dtype.size_bytes()]`.
pub fn decode(dtype: DataType, bytes: &[u8]) -> f64 {
    let b2 = || u16::from_ne_bytes([bytes[0], bytes[1]]);
    let b4 = || [bytes[0], bytes[1], bytes[2], bytes[3]];
    let b8 = || {
        let mut a = [0u8; 8];
        a.copy_from_slice(&bytes[..8]);
        a
    };
    match dtype {
        DataType::Int8 => bytes[0] as i8 as f64,
        DataType::Uint8 => bytes[0] as f64,
        DataType::Int32 => i32::from_ne_bytes(b4()) as f64,
        DataType::Uint32 => u32::from_ne_bytes(b4()) as f64,
        DataType::Int64 => i64::from_ne_bytes(b8()) as f64,
        DataType::Uint64 => u64::from_ne_bytes(b8()) as f64,
        DataType::Float16 => F16(b2()).to_f32() as f64,
        DataType::Bfloat16 => Bf16(b2()).to_f32() as f64,
        DataType::Float32 => f32::from_ne_bytes(b4()) as f64,
        DataType::Float64 => f64::from_ne_bytes(b8()),
        DataType::Float8E4M3 => F8E4M3(bytes[0]).to_f32() as f64,
        DataType::Float8E5M2 => F8E5M2(bytes[0]).to_f32() as f64,
    }
}

/// The value `value` becomes once stored as `dtype` (wrapped or rounded).
pub fn representable(dtype: DataType, value: f64) -> f64 {
    let mut bytes = [0u8; 8];
    encode(dtype, value, &mut bytes);
    decode(dtype, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_wraps() {
        for dtype in DataType::ALL {
            assert_eq!(representable(dtype, 3.0), 3.0, "{dtype:?}");
        }
        assert_eq!(representable(DataType::Int8, 130.0), -126.0);
        assert_eq!(representable(DataType::Uint8, 256.0), 0.0);
        assert_eq!(representable(DataType::Float8E4M3, 1000.0), 448.0);
        assert_eq!(
            representable(DataType::Float16, 1.0 / 3.0),
            F16::from_f32(1.0 / 3.0).to_f32() as f64
        );
    }
}
