//! Element types and reduction operators, with the numeric values of the C ABI.

/// Element type of a collective. Values match `symmDataType_t` in `symm.h`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// Signed 8-bit integer.
    Int8 = 0,
    /// Unsigned 8-bit integer.
    Uint8 = 1,
    /// Signed 32-bit integer.
    Int32 = 2,
    /// Unsigned 32-bit integer.
    Uint32 = 3,
    /// Signed 64-bit integer.
    Int64 = 4,
    /// Unsigned 64-bit integer.
    Uint64 = 5,
    /// IEEE 754 binary16.
    Float16 = 6,
    /// IEEE 754 binary32.
    Float32 = 7,
    /// IEEE 754 binary64.
    Float64 = 8,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    Bfloat16 = 9,
    /// OCP float8 e4m3 (finite, no infinities).
    Float8E4M3 = 10,
    /// OCP float8 e5m2.
    Float8E5M2 = 11,
}

impl DataType {
    /// Every data type, in numeric order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8E4M3,
        DataType::Float8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Short name, as in kernel names (`f32`, `bf16`, `f8e4m3`, …).
    pub const fn short_name(self) -> &'static str {
        match self {
            DataType::Int8 => "i8",
            DataType::Uint8 => "u8",
            DataType::Int32 => "i32",
            DataType::Uint32 => "u32",
            DataType::Int64 => "i64",
            DataType::Uint64 => "u64",
            DataType::Float16 => "f16",
            DataType::Float32 => "f32",
            DataType::Float64 => "f64",
            DataType::Bfloat16 => "bf16",
            DataType::Float8E4M3 => "f8e4m3",
            DataType::Float8E5M2 => "f8e5m2",
        }
    }

    /// `true` for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8E4M3
                | DataType::Float8E5M2
        )
    }

    /// The data type with this C ABI value, if any.
    pub const fn from_raw(raw: u32) -> Option<DataType> {
        if (raw as usize) < Self::ALL.len() {
            Some(Self::ALL[raw as usize])
        } else {
            None
        }
    }
}

/// Reduction operator. Values match `symmRedOp_t` in `symm.h`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Maximum.
    Max = 2,
    /// Minimum.
    Min = 3,
    /// Sum divided by the number of ranks.
    Avg = 4,
}

impl RedOp {
    /// Every operator, in numeric order.
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// Short name, as in kernel names.
    pub const fn short_name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }

    /// The operator with this C ABI value, if any.
    pub const fn from_raw(raw: u32) -> Option<RedOp> {
        if (raw as usize) < Self::ALL.len() {
            Some(Self::ALL[raw as usize])
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_round_trip() {
        for dt in DataType::ALL {
            assert_eq!(DataType::from_raw(dt as u32), Some(dt));
        }
        for op in RedOp::ALL {
            assert_eq!(RedOp::from_raw(op as u32), Some(op));
        }
        assert_eq!(DataType::from_raw(12), None);
        assert_eq!(DataType::from_raw(u32::MAX), None);
        assert_eq!(RedOp::from_raw(5), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(DataType::Float32.size_bytes(), 4);
        assert_eq!(DataType::Bfloat16.size_bytes(), 2);
        assert_eq!(DataType::Float8E5M2.size_bytes(), 1);
        assert_eq!(DataType::Uint64.size_bytes(), 8);
    }
}
