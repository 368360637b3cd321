//! An independent reference for collective results: element types decoded by hand (no code of
//! the library), integers exactly (wrapping as documented), floats in f64 with an error bound.

use std::sync::OnceLock;

/// How an element type stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A two's-complement or unsigned integer of `bits` bits.
    Int {
        /// Width.
        bits: u32,
        /// Signed.
        signed: bool,
    },
    /// A binary float: exponent and mantissa widths, and whether the all-ones exponent is
    /// normal (float8 e4m3: no infinity, only S.1111.111 is NaN).
    Float {
        /// Exponent bits.
        exponent: u32,
        /// Mantissa bits.
        mantissa: u32,
        /// e4m3's finite-only encoding.
        finite_only: bool,
    },
}

/// The element types, by `symmDataType_t` value.
pub const TYPES: [Kind; 12] = [
    Kind::Int {
        bits: 8,
        signed: true,
    },
    Kind::Int {
        bits: 8,
        signed: false,
    },
    Kind::Int {
        bits: 32,
        signed: true,
    },
    Kind::Int {
        bits: 32,
        signed: false,
    },
    Kind::Int {
        bits: 64,
        signed: true,
    },
    Kind::Int {
        bits: 64,
        signed: false,
    },
    Kind::Float {
        exponent: 5,
        mantissa: 10,
        finite_only: false,
    },
    Kind::Float {
        exponent: 8,
        mantissa: 23,
        finite_only: false,
    },
    Kind::Float {
        exponent: 11,
        mantissa: 52,
        finite_only: false,
    },
    Kind::Float {
        exponent: 8,
        mantissa: 7,
        finite_only: false,
    },
    Kind::Float {
        exponent: 4,
        mantissa: 3,
        finite_only: true,
    },
    Kind::Float {
        exponent: 5,
        mantissa: 2,
        finite_only: false,
    },
];

/// Reduction operators, by `symmRedOp_t` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average (integers: exact sum / ranks, truncated toward zero).
    Avg,
}

/// `symmRedOp_t` value → operator.
pub fn reduce_op(raw: u8) -> Option<Reduce> {
    [
        Reduce::Sum,
        Reduce::Prod,
        Reduce::Max,
        Reduce::Min,
        Reduce::Avg,
    ]
    .get(raw as usize)
    .copied()
}

impl Kind {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Kind::Int { bits, .. } => bits as usize / 8,
            Kind::Float {
                exponent, mantissa, ..
            } => (1 + exponent + mantissa) as usize / 8,
        }
    }

    /// Read element `i` of `bytes` as raw bits.
    pub fn bits_at(self, bytes: &[u8], i: usize) -> u64 {
        let n = self.size();
        let mut raw = [0u8; 8];
        raw[..n].copy_from_slice(&bytes[i * n..(i + 1) * n]);
        u64::from_le_bytes(raw)
    }

    /// Write raw bits as element `i` of `bytes`.
    pub fn set_bits_at(self, bytes: &mut [u8], i: usize, bits: u64) {
        let n = self.size();
        bytes[i * n..(i + 1) * n].copy_from_slice(&bits.to_le_bytes()[..n]);
    }

    /// An integer's value.
    pub fn int_value(self, bits: u64) -> i128 {
        match self {
            Kind::Int { bits: 64, signed } => {
                if signed {
                    bits as i64 as i128
                } else {
                    bits as i128
                }
            }
            Kind::Int { bits: w, signed } => {
                let mask = (1u64 << w) - 1;
                let v = bits & mask;
                if signed && v >> (w - 1) != 0 {
                    v as i128 - (1i128 << w)
                } else {
                    v as i128
                }
            }
            Kind::Float { .. } => unreachable!("int_value of a float type"),
        }
    }

    /// An integer value wrapped to this type, as raw bits.
    pub fn int_bits(self, value: i128) -> u64 {
        match self {
            Kind::Int { bits, .. } => {
                let v = value as u128 as u64;
                if bits == 64 {
                    v
                } else {
                    v & ((1u64 << bits) - 1)
                }
            }
            Kind::Float { .. } => unreachable!("int_bits of a float type"),
        }
    }

    /// A float's value (NaN and infinities as in f64).
    pub fn float_value(self, bits: u64) -> f64 {
        let Kind::Float {
            exponent,
            mantissa,
            finite_only,
        } = self
        else {
            unreachable!("float_value of an integer type")
        };
        let sign = if bits >> (exponent + mantissa) & 1 != 0 {
            -1.0
        } else {
            1.0
        };
        let e = (bits >> mantissa) & ((1 << exponent) - 1);
        let m = bits & ((1 << mantissa) - 1);
        let bias = (1i32 << (exponent - 1)) - 1;
        let max_e = (1u64 << exponent) - 1;
        let magnitude = if e == 0 {
            m as f64 * 2f64.powi(1 - bias - mantissa as i32)
        } else if e == max_e && !finite_only {
            if m == 0 { f64::INFINITY } else { f64::NAN }
        } else if e == max_e && m == (1 << mantissa) - 1 {
            f64::NAN
        } else {
            (1.0 + m as f64 / (1u64 << mantissa) as f64) * 2f64.powi(e as i32 - bias)
        };
        sign * magnitude
    }

    /// Relative rounding error of one rounding to this float type (half an ulp).
    pub fn epsilon(self) -> f64 {
        match self {
            Kind::Float { mantissa, .. } => 2f64.powi(-(mantissa as i32) - 1),
            Kind::Int { .. } => 0.0,
        }
    }

    /// The smallest positive normal value (an absolute error allowance near zero).
    pub fn min_normal(self) -> f64 {
        match self {
            Kind::Float { exponent, .. } => 2f64.powi(2 - (1 << (exponent - 1))),
            Kind::Int { .. } => 0.0,
        }
    }

    /// Raw bits of the small integer `v` (-4..=4), exactly representable in every float type.
    pub fn small_float_bits(self, v: i32) -> u64 {
        static TABLES: OnceLock<Vec<[u64; 9]>> = OnceLock::new();
        let tables = TABLES.get_or_init(|| {
            TYPES
                .iter()
                .map(|kind| {
                    let mut table = [0u64; 9];
                    if let Kind::Float {
                        exponent, mantissa, ..
                    } = *kind
                    {
                        let width = 1 + exponent + mantissa;
                        for (slot, value) in table.iter_mut().zip(-4i32..=4) {
                            *slot = if width > 16 {
                                if width == 32 {
                                    (value as f32).to_bits() as u64
                                } else {
                                    (value as f64).to_bits()
                                }
                            } else {
                                (0..1u64 << width)
                                    .find(|b| kind.float_value(*b) == value as f64)
                                    .expect("small integers are representable")
                            };
                        }
                    }
                    table
                })
                .collect()
        });
        let index = TYPES.iter().position(|k| *k == self).expect("a known type");
        tables[index][(v.clamp(-4, 4) + 4) as usize]
    }
}

/// The expected integer reduction of `values` (one per rank).
pub fn reduce_int(kind: Kind, op: Reduce, values: &[i128]) -> u64 {
    let n = values.len() as i128;
    let v = match op {
        Reduce::Sum => values.iter().fold(0i128, |a, b| a.wrapping_add(*b)),
        Reduce::Prod => values.iter().fold(1i128, |a, b| {
            // Wrap to 64 bits at every step: only the low bits of the result matter.
            (a.wrapping_mul(*b) as u128 as u64) as i128
        }),
        Reduce::Max => *values.iter().max().expect("at least one rank"),
        Reduce::Min => *values.iter().min().expect("at least one rank"),
        Reduce::Avg => values.iter().sum::<i128>() / n,
    };
    kind.int_bits(v)
}

/// The expected float reduction of `values` (exact inputs) and the error allowed for it.
pub fn reduce_float(kind: Kind, op: Reduce, values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let magnitude: f64 = values.iter().map(|v| v.abs()).sum();
    let (exact, spread) = match op {
        Reduce::Sum => (values.iter().sum::<f64>(), magnitude),
        Reduce::Avg => (values.iter().sum::<f64>() / n, magnitude / n),
        Reduce::Prod => {
            let p: f64 = values.iter().product();
            (p, p.abs())
        }
        Reduce::Max => (values.iter().copied().fold(f64::MIN, f64::max), 0.0),
        Reduce::Min => (values.iter().copied().fold(f64::MAX, f64::min), 0.0),
    };
    // Accumulation in float32 or wider (one rounding per rank at most) and one final rounding
    // to the element type.
    let tolerance = (n + 1.0) * 2f64.powi(-24) * spread
        + 2.0 * kind.epsilon() * exact.abs()
        + kind.min_normal();
    (exact, tolerance)
}

/// A small deterministic generator (SplitMix64) for buffer contents.
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Raw bits of a random element: any integer, or a small integer for floats (so that
    /// every result has an exact reference).
    pub fn element(&mut self, kind: Kind) -> u64 {
        let r = self.next_u64();
        match kind {
            Kind::Int { .. } => kind.int_bits(r as i64 as i128),
            Kind::Float { .. } => kind.small_float_bits((r % 9) as i32 - 4),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoders_agree_with_rust_floats() {
        let f32k = TYPES[7];
        for v in [1.5f32, -0.0, 3.0e-39, 65504.0, f32::INFINITY] {
            assert_eq!(f32k.float_value(v.to_bits() as u64), v as f64);
        }
        let f16 = TYPES[6];
        assert_eq!(f16.float_value(0x3C00), 1.0);
        assert_eq!(f16.float_value(0x7BFF), 65504.0);
        assert_eq!(f16.float_value(0x0001), 2f64.powi(-24));
        let e4m3 = TYPES[10];
        assert_eq!(e4m3.float_value(0x7E), 448.0);
        assert!(e4m3.float_value(0x7F).is_nan());
        let e5m2 = TYPES[11];
        assert_eq!(e5m2.float_value(0x7B), 57344.0);
        assert_eq!(e5m2.float_value(0x7C), f64::INFINITY);
        let bf16 = TYPES[9];
        assert_eq!(bf16.float_value(0x3F80), 1.0);
        for kind in TYPES.iter().filter(|k| matches!(k, Kind::Float { .. })) {
            for v in -4..=4 {
                assert_eq!(kind.float_value(kind.small_float_bits(v)), v as f64);
            }
        }
    }

    #[test]
    fn integer_reductions_wrap() {
        let i8k = TYPES[0];
        assert_eq!(reduce_int(i8k, Reduce::Sum, &[100, 100]), 200 & 0xFF);
        assert_eq!(reduce_int(i8k, Reduce::Avg, &[-3, 0]), (-1i8) as u8 as u64);
        let u64k = TYPES[5];
        assert_eq!(
            reduce_int(u64k, Reduce::Avg, &[u64::MAX as i128, u64::MAX as i128]),
            u64::MAX
        );
    }
}
