//! Narrow binary float formats and their conversions to and from f32, in software: round to
//! nearest, ties to even; subnormals kept; NaN kept as NaN. Overflow gives infinity in formats
//! that have one (float16, bfloat16, e5m2) and saturates to the largest finite value in
//! float8 e4m3, which has no infinity (as CUDA's `satfinite` conversions do). On the GPU,
//! float16 uses the hardware conversions (`cvt`), which round the same way; so does e4m3 on
//! sm_89 and newer, and e5m2 widens through binary16 (its top byte).

/// A narrow float format: exponent and mantissa widths, and whether the all-ones exponent
/// encodes infinities and NaNs (IEEE-like) or ordinary numbers (e4m3, whose only NaN is
/// S.1111.111).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// Exponent bits.
    pub exponent_bits: u32,
    /// Mantissa bits.
    pub mantissa_bits: u32,
    /// `true` for IEEE-like encodings.
    pub ieee_like: bool,
}

/// IEEE binary16.
pub const FLOAT16: Format = Format {
    exponent_bits: 5,
    mantissa_bits: 10,
    ieee_like: true,
};
/// bfloat16.
pub const BFLOAT16: Format = Format {
    exponent_bits: 8,
    mantissa_bits: 7,
    ieee_like: true,
};
/// OCP float8 e4m3 (finite).
pub const FLOAT8_E4M3: Format = Format {
    exponent_bits: 4,
    mantissa_bits: 3,
    ieee_like: false,
};
/// OCP float8 e5m2.
pub const FLOAT8_E5M2: Format = Format {
    exponent_bits: 5,
    mantissa_bits: 2,
    ieee_like: true,
};

impl Format {
    const fn bias(self) -> i32 {
        (1 << (self.exponent_bits - 1)) - 1
    }

    const fn exponent_mask(self) -> u32 {
        (1 << self.exponent_bits) - 1
    }

    const fn sign_bit(self) -> u32 {
        1 << (self.exponent_bits + self.mantissa_bits)
    }

    /// Bits of the largest finite value (positive).
    pub const fn max_finite_bits(self) -> u32 {
        if self.ieee_like {
            ((self.exponent_mask() - 1) << self.mantissa_bits) | ((1 << self.mantissa_bits) - 1)
        } else {
            (self.exponent_mask() << self.mantissa_bits) | ((1 << self.mantissa_bits) - 2)
        }
    }

    /// Bits of a quiet NaN with the given sign bit.
    pub const fn nan_bits(self, sign: u32) -> u32 {
        if self.ieee_like {
            sign | (self.exponent_mask() << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))
        } else {
            sign | (self.exponent_mask() << self.mantissa_bits) | ((1 << self.mantissa_bits) - 1)
        }
    }

    /// `true` for bfloat16, the top half of an f32 (same exponent): its conversions are a
    /// shift and an integer rounding (a handful of instructions, where the general path takes
    /// a hundred or more on the GPU). Constant for every format, so the branch folds away.
    #[inline(always)]
    const fn is_f32_top_half(self) -> bool {
        self.exponent_bits == 8 && self.mantissa_bits == 7 && self.ieee_like
    }

    /// `true` for IEEE binary16, which the GPU converts with one instruction on every target.
    #[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
    #[inline(always)]
    const fn is_float16(self) -> bool {
        self.exponent_bits == 5 && self.mantissa_bits == 10 && self.ieee_like
    }

    /// `true` for OCP float8 e4m3, which sm_89 and newer convert in hardware (`satfinite`:
    /// the same saturation as the software conversion here).
    #[cfg_attr(not(target_feature = "sm_89"), allow(dead_code))]
    #[inline(always)]
    const fn is_e4m3(self) -> bool {
        self.exponent_bits == 4 && self.mantissa_bits == 3 && !self.ieee_like
    }

    /// `true` for OCP float8 e5m2: binary16's top byte, so the GPU widens it with binary16's
    /// conversion. (Its hardware narrowing saturates where this one gives infinity: not used.)
    #[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
    #[inline(always)]
    const fn is_e5m2(self) -> bool {
        self.exponent_bits == 5 && self.mantissa_bits == 2 && self.ieee_like
    }

    /// Decode `bits` (in the low bits) to f32 (exact: every value is representable).
    #[inline(always)]
    pub fn to_f32(self, bits: u32) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        if self.is_float16() {
            return crate::arch::f16_to_f32(bits as u16);
        }
        #[cfg(target_arch = "nvptx64")]
        if self.is_e5m2() {
            return crate::arch::f16_to_f32(((bits & 0xFF) << 8) as u16);
        }
        #[cfg(target_feature = "sm_89")]
        if self.is_e4m3() {
            return crate::arch::e4m3_to_f32(bits as u8);
        }
        if self.is_f32_top_half() {
            if bits & 0x7F80 == 0x7F80 && bits & 0x7F != 0 {
                return f32::NAN;
            }
            return f32::from_bits((bits & 0xFFFF) << 16);
        }
        let m = self.mantissa_bits;
        let sign = if bits & self.sign_bit() != 0 {
            -1.0f32
        } else {
            1.0
        };
        let exponent = (bits >> m) & self.exponent_mask();
        let mantissa = bits & ((1 << m) - 1);
        if exponent == self.exponent_mask() {
            if self.ieee_like {
                return if mantissa == 0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                };
            } else if mantissa == (1 << m) - 1 {
                return f32::NAN;
            }
        }
        let (significand, power) = if exponent == 0 {
            (mantissa, 1 - self.bias() - m as i32)
        } else {
            (
                mantissa | (1 << m),
                exponent as i32 - self.bias() - m as i32,
            )
        };
        if power < -126 {
            sign * (significand as f32 * pow2_normal(power + 64)) * pow2_normal(-64)
        } else {
            sign * significand as f32 * pow2_normal(power)
        }
    }

    /// Encode `x`, rounding to nearest, ties to even.
    #[inline(always)]
    pub fn from_f32(self, x: f32) -> u32 {
        // The GPU's conversion differs only in the NaN it gives (0x7FFF for any NaN).
        #[cfg(target_arch = "nvptx64")]
        if self.is_float16() {
            return crate::arch::f32_to_f16(x) as u32;
        }
        // The same bits as below for every input but a NaN, which may lose its sign here.
        #[cfg(target_feature = "sm_89")]
        if self.is_e4m3() {
            return crate::arch::f32_to_e4m3(x) as u32;
        }
        let m = self.mantissa_bits;
        let raw = x.to_bits();
        let sign = if raw >> 31 != 0 { self.sign_bit() } else { 0 };
        if x.is_nan() {
            return self.nan_bits(sign);
        }
        if self.is_f32_top_half() {
            // Round the low half away, to nearest, ties to the even top half; a carry into
            // the exponent is right (up to infinity). No overflow: |raw| <= 0x7F80_0000.
            return (raw + 0x7FFF + ((raw >> 16) & 1)) >> 16;
        }
        let magnitude = raw & 0x7FFF_FFFF;
        let field = magnitude >> 23;
        let (significand, exponent) = if field == 0 {
            (magnitude as u64, -126)
        } else {
            (
                (magnitude & 0x7F_FFFF | 0x80_0000) as u64,
                field as i32 - 127,
            )
        };
        if field == 0xFF {
            return sign | self.overflow_bits();
        }
        // Position of the result's last mantissa bit relative to the f32 significand.
        let min_normal_exponent = 1 - self.bias();
        let encoded = if exponent >= min_normal_exponent && significand >= 1 << 23 {
            let combined = (((exponent + self.bias()) as u64) << 23) | (significand & 0x7F_FFFF);
            round_shift(combined, 23 - m)
        } else {
            let shift = (23 - m) as i32 + min_normal_exponent - exponent;
            if shift > 40 {
                0
            } else {
                round_shift(significand, shift as u32)
            }
        };
        if encoded > self.max_finite_bits() as u64 {
            sign | self.overflow_bits()
        } else {
            sign | encoded as u32
        }
    }

    const fn overflow_bits(self) -> u32 {
        if self.ieee_like {
            self.exponent_mask() << self.mantissa_bits
        } else {
            self.max_finite_bits()
        }
    }
}

/// `value >> shift`, rounded to nearest, ties to even.
#[inline(always)]
fn round_shift(value: u64, shift: u32) -> u64 {
    if shift == 0 {
        return value;
    }
    let kept = value >> shift;
    let rest = value & ((1u64 << shift) - 1);
    let half = 1u64 << (shift - 1);
    if rest > half || (rest == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// 2^power as f32 for -126 <= power <= 127.
#[inline(always)]
fn pow2_normal(power: i32) -> f32 {
    f32::from_bits(((power + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    const ALL: [(Format, u32); 4] = [
        (FLOAT16, 16),
        (BFLOAT16, 16),
        (FLOAT8_E4M3, 8),
        (FLOAT8_E5M2, 8),
    ];

    /// Every finite value of a format, decoded independently in f64 from the definition.
    fn finite_values(format: Format, width: u32) -> Vec<(u32, f64)> {
        let m = format.mantissa_bits;
        let bias = format.bias();
        (0..1u32 << width)
            .filter_map(|bits| {
                let e = (bits >> m) & format.exponent_mask();
                let f = bits & ((1 << m) - 1);
                let special =
                    e == format.exponent_mask() && (format.ieee_like || f == (1 << m) - 1);
                if special {
                    return None;
                }
                let magnitude = if e == 0 {
                    f as f64 * 2f64.powi(1 - bias - m as i32)
                } else {
                    (1.0 + f as f64 / (1u64 << m) as f64) * 2f64.powi(e as i32 - bias)
                };
                let negative = bits & format.sign_bit() != 0;
                Some((bits, if negative { -magnitude } else { magnitude }))
            })
            .collect()
    }

    #[test]
    fn decoding_matches_the_definition() {
        for (format, width) in ALL {
            for (bits, value) in finite_values(format, width) {
                assert_eq!(format.to_f32(bits) as f64, value, "{format:?} {bits:#x}");
            }
        }
        assert!(FLOAT16.to_f32(0x7C00).is_infinite());
        assert!(FLOAT16.to_f32(0x7E00).is_nan());
        assert!(FLOAT8_E4M3.to_f32(0x7F).is_nan());
        assert_eq!(FLOAT8_E4M3.to_f32(0x7E), 448.0);
        assert_eq!(FLOAT8_E5M2.to_f32(0x7B), 57344.0);
    }

    /// Nearest finite value (values sorted by value), ties to the even encoding.
    fn nearest(sorted: &[(u32, f64)], x: f64) -> u32 {
        let i = sorted.partition_point(|v| v.1 < x);
        let mut best: Option<(u32, f64)> = None;
        for &(bits, v) in &sorted[i.saturating_sub(2)..(i + 2).min(sorted.len())] {
            let d = (v - x).abs();
            match best {
                None => best = Some((bits, d)),
                Some((b, bd)) => {
                    if d < bd || (d == bd && (bits & 1) == 0 && (b & 1) == 1) {
                        best = Some((bits, d));
                    }
                }
            }
        }
        best.expect("values are not empty").0
    }

    #[test]
    fn encoding_rounds_to_nearest_even() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for (format, width) in ALL {
            let mut values = finite_values(format, width);
            values.sort_by(|a, b| a.1.total_cmp(&b.1));
            let max = format.to_f32(format.max_finite_bits()) as f64;
            // Every representable value and every midpoint between neighbours.
            let mut samples: Vec<f64> = values.iter().map(|v| v.1).collect();
            let mut sorted: Vec<f64> = samples.clone();
            sorted.sort_by(f64::total_cmp);
            sorted.dedup();
            for w in sorted.windows(2) {
                samples.push((w[0] + w[1]) / 2.0);
            }
            // And random f32 within range.
            for _ in 0..20_000 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = (state >> 11) as f64 / (1u64 << 53) as f64;
                samples.push((t * 2.0 - 1.0) * max * 1.01);
            }
            for x in samples {
                let x32 = x as f32;
                if x32 as f64 != x {
                    continue; // only exact f32 inputs have an unambiguous answer
                }
                let got = format.from_f32(x32);
                let ulp_top = max - format.to_f32(format.max_finite_bits() - 1) as f64;
                if x.abs() >= max + ulp_top / 2.0 {
                    let expected = if format.ieee_like {
                        format.exponent_mask() << format.mantissa_bits
                    } else {
                        format.max_finite_bits()
                    };
                    assert_eq!(
                        got & !format.sign_bit(),
                        expected,
                        "{format:?} overflow {x}"
                    );
                    continue;
                }
                let want = nearest(&values, x);
                let same_zero = format.to_f32(got) == 0.0 && format.to_f32(want) == 0.0;
                assert!(
                    got == want || same_zero,
                    "{format:?}: {x} -> {got:#x}, want {want:#x}"
                );
            }
            assert!(format.to_f32(format.from_f32(f32::NAN)).is_nan());
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(FLOAT16.from_f32(1.0), 0x3C00);
        assert_eq!(FLOAT16.from_f32(65504.0), 0x7BFF);
        assert_eq!(FLOAT16.from_f32(65520.0), 0x7C00);
        assert_eq!(FLOAT16.from_f32(5.960_464_5e-8), 0x0001);
        assert_eq!(BFLOAT16.from_f32(1.0), 0x3F80);
        assert_eq!(BFLOAT16.from_f32(f32::MAX), 0x7F80);
        assert_eq!(FLOAT8_E4M3.from_f32(1000.0), 0x7E);
        assert_eq!(FLOAT8_E4M3.from_f32(-1000.0), 0xFE);
        assert_eq!(FLOAT8_E5M2.from_f32(1.0e6), 0x7C);
        assert_eq!(FLOAT8_E4M3.from_f32(f32::INFINITY), 0x7E);
        assert_eq!(FLOAT16.from_f32(f32::NEG_INFINITY), 0xFC00);
    }
}
