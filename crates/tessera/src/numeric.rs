//! Host conversions between f32/f64 and the storage dtypes, shared by every operator's CPU
//! reference, verification and benchmark code.
//!
//! - OCP FP8 E4M3 ("e4m3fn": no infinities, NaN = `S.1111.111`, largest finite value 448) and
//!   E5M2 (IEEE-like: infinities, NaNs, largest finite value 57344), bit-exact with the device's
//!   `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` (src/cuda/dtype.cuh): round to nearest even, values
//!   beyond the largest finite one (and +-inf) saturate to it, NaN stays NaN.
//! - Little-endian storage elements of any float dtype ([`load`], [`store`]): fp16 and bf16
//!   through the `half` crate (round to nearest even), fp8 through the functions above.

use half::{bf16, f16};

use crate::dtype::DType;

/// E4M3 bits -> f32 (exact).
pub fn e4m3_to_f32(bits: u8) -> f32 {
    let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((bits >> 3) & 0x0f) as i32;
    let man = (bits & 0x07) as f32;
    if exp == 0x0f && bits & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6) // subnormal
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// f32 -> E4M3 bits: round to nearest even, saturating to +-448; NaN -> 0x7f.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7e;
    }
    // the magnitudes 0..=0x7e are increasing: find the two neighbours of a
    let mut lo = 0u8;
    let mut hi = 0x7eu8;
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if e4m3_to_f32(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (vl, vh) = (e4m3_to_f32(lo), e4m3_to_f32(hi));
    let pick = if a - vl < vh - a {
        lo
    } else if a - vl > vh - a {
        hi
    } else if lo % 2 == 0 {
        lo // tie: the even mantissa
    } else {
        hi
    };
    let pick = if a <= vl { lo } else { pick };
    sign | pick
}

/// Largest finite E5M2 value.
pub const E5M2_MAX: f32 = 57344.0;

/// E5M2 bits -> f32 (exact: an E5M2 code is the high byte of an f16).
pub fn e5m2_to_f32(bits: u8) -> f32 {
    f16::from_bits((bits as u16) << 8).to_f32()
}

/// f32 -> E5M2 bits: round to nearest even, saturating to +-57344 (infinities included, as
/// `satfinite` does); NaN -> 0x7f.
pub fn f32_to_e5m2(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let u = x.to_bits();
    let sign = ((u >> 24) & 0x80) as u8;
    let a = u & 0x7fff_ffff;
    let mag = if a > E5M2_MAX.to_bits() {
        0x7b // beyond 57344, inf included: saturate
    } else if a < 0x3880_0000 {
        // below 2^-14 (the smallest normal): the subnormal grid of step 2^-16; rounding up to
        // 4 steps gives 0x04 = 2^-14, exactly the first normal encoding
        (f32::from_bits(a) * 65536.0).round_ties_even() as u32
    } else {
        // keep 2 mantissa bits with round to nearest even, then rebias the exponent 127 -> 15
        ((a + 0xf_ffff + ((a >> 21) & 1)) >> 21) - ((127 - 15) << 2)
    };
    sign | mag as u8
}

/// Element `idx` (in elements) of little-endian storage `bytes` of float dtype `dtype`, as f64
/// (exact; fp8 without any scale). Panics for a dtype that is not a float type.
pub fn load(dtype: DType, bytes: &[u8], idx: usize) -> f64 {
    let at = |n: usize| &bytes[n * idx..n * (idx + 1)];
    match dtype {
        DType::F64 => f64::from_le_bytes(at(8).try_into().unwrap()),
        DType::F32 => f32::from_le_bytes(at(4).try_into().unwrap()) as f64,
        DType::F16 => f16::from_bits(u16::from_le_bytes(at(2).try_into().unwrap())).to_f64(),
        DType::BF16 => bf16::from_bits(u16::from_le_bytes(at(2).try_into().unwrap())).to_f64(),
        DType::F8E4M3 => e4m3_to_f32(bytes[idx]) as f64,
        DType::F8E5M2 => e5m2_to_f32(bytes[idx]) as f64,
        d => panic!("not a float dtype: {d}"),
    }
}

/// Stores `x` rounded to float dtype `dtype` (nearest even; fp8 saturating) as little-endian
/// bytes at the start of `out`. Panics for a dtype that is not a float type.
pub fn store(dtype: DType, x: f32, out: &mut [u8]) {
    match dtype {
        DType::F64 => out[..8].copy_from_slice(&(x as f64).to_le_bytes()),
        DType::F32 => out[..4].copy_from_slice(&x.to_le_bytes()),
        DType::F16 => out[..2].copy_from_slice(&f16::from_f32(x).to_bits().to_le_bytes()),
        DType::BF16 => out[..2].copy_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes()),
        DType::F8E4M3 => out[0] = f32_to_e4m3(x),
        DType::F8E5M2 => out[0] = f32_to_e5m2(x),
        d => panic!("not a float dtype: {d}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_finite_code() {
        for b in 0u8..=255 {
            let x = e4m3_to_f32(b);
            if x.is_nan() {
                assert_eq!(b & 0x7f, 0x7f);
                continue;
            }
            let back = f32_to_e4m3(x);
            // +0 and -0 are distinct codes; every other value maps back to its own code
            assert_eq!(back, b, "code {b:#04x} = {x}");
        }
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
        assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
        assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
        // 1.0 = 0x38, next 1.125 = 0x39; 1.0625 is a tie -> even (0x38); 1.07 -> 0x39
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        // 1.1875 is the tie between 0x39 (1.125) and 0x3a (1.25) -> 0x3a
        assert_eq!(f32_to_e4m3(1.1875), 0x3a);
        // smallest subnormal 2^-9
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(f32_to_e4m3(2f32.powi(-11)), 0x00); // below half of the smallest: 0
    }

    /// The device's portable f32 -> E4M3 (src/cuda/dtype.cuh `float_to_e4m3_bits_portable`),
    /// the specification the host encoder must match.
    fn e4m3_device_spec(f: f32) -> u8 {
        let u = f.to_bits();
        let sign = (u >> 24) & 0x80;
        let a = u & 0x7fff_ffff;
        let mag = if a > 0x7f80_0000 {
            0x7f
        } else if a > 0x43e0_0000 {
            0x7e
        } else if a < 0x3c80_0000 {
            (f32::from_bits(a) * 512.0).round_ties_even() as u32
        } else {
            ((a + 0x7_ffff + ((a >> 20) & 1)) >> 20) - ((127 - 7) << 3)
        };
        (sign | mag) as u8
    }

    #[test]
    fn e4m3_encoder_matches_the_device_spec() {
        // every 2^12th f32 bit pattern (both signs, every exponent), NaNs aside (the host gives
        // +NaN's code for either sign)
        for u in (0..=u32::MAX).step_by(4099) {
            let f = f32::from_bits(u);
            if f.is_nan() {
                assert_eq!(f32_to_e4m3(f), 0x7f);
                continue;
            }
            assert_eq!(f32_to_e4m3(f), e4m3_device_spec(f), "{f:e} ({u:#010x})");
        }
        // every midpoint between neighbouring codes: ties to even
        for b in 0u8..0x7e {
            let mid = (e4m3_to_f32(b) + e4m3_to_f32(b + 1)) / 2.0;
            assert_eq!(f32_to_e4m3(mid), e4m3_device_spec(mid), "tie above {b:#04x}");
            assert_eq!(f32_to_e4m3(mid) % 2, 0, "tie above {b:#04x} rounds to even");
        }
    }

    #[test]
    fn e4m3_nan_codes_and_saturation() {
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        // no infinities: 0x78 and 0xf8 (the IEEE-like inf codes) are +-256
        assert_eq!(e4m3_to_f32(0x78), 256.0);
        assert_eq!(e4m3_to_f32(0xf8), -256.0);
        assert_eq!(f32_to_e4m3(-f32::NAN), 0x7f);
        for x in [448.0f32, 449.0, 464.0, 480.0, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(f32_to_e4m3(x), 0x7e, "{x}");
            assert_eq!(f32_to_e4m3(-x), 0xfe, "{x}");
        }
        assert_eq!(f32_to_e4m3(-0.0), 0x80);
    }

    #[test]
    fn e5m2_round_trips_every_finite_code() {
        let mut finite = 0;
        for b in 0u8..=255 {
            let x = e5m2_to_f32(b);
            match b & 0x7f {
                0x7c => {
                    assert_eq!(
                        x,
                        if b & 0x80 == 0 {
                            f32::INFINITY
                        } else {
                            f32::NEG_INFINITY
                        }
                    );
                    assert_eq!(f32_to_e5m2(x), (b & 0x80) | 0x7b, "inf saturates");
                }
                0x7d..=0x7f => {
                    assert!(x.is_nan(), "{b:#04x}");
                    assert_eq!(f32_to_e5m2(x), 0x7f);
                }
                _ => {
                    assert!(x.is_finite());
                    assert_eq!(f32_to_e5m2(x), b, "code {b:#04x} = {x}");
                    finite += 1;
                }
            }
        }
        assert_eq!(finite, 2 * 124);
    }

    #[test]
    fn e5m2_rounds_to_nearest_even_and_saturates() {
        assert_eq!(e5m2_to_f32(0x7b), E5M2_MAX);
        assert_eq!(e5m2_to_f32(0x3c), 1.0);
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16)); // smallest subnormal
        for x in [E5M2_MAX, 57345.0, 61440.0, 1e30, f32::INFINITY] {
            assert_eq!(f32_to_e5m2(x), 0x7b, "{x}");
            assert_eq!(f32_to_e5m2(-x), 0xfb, "{x}");
        }
        // 1.0 = 0x3c, 1.25 = 0x3d, 1.5 = 0x3e: 1.125 ties to even 0x3c, 1.375 ties to 0x3e
        assert_eq!(f32_to_e5m2(1.125), 0x3c);
        assert_eq!(f32_to_e5m2(1.375), 0x3e);
        assert_eq!(f32_to_e5m2(1.13), 0x3d);
        assert_eq!(f32_to_e5m2(2f32.powi(-18)), 0x00); // below half of the smallest: 0
        assert_eq!(f32_to_e5m2(3.0 * 2f32.powi(-18)), 0x01);
        // the subnormal/normal boundary: 3.5 steps of 2^-16 ties to 4 = 2^-14 (code 0x04)
        assert_eq!(f32_to_e5m2(3.5 * 2f32.powi(-16)), 0x04);
        assert_eq!(f32_to_e5m2(-0.0), 0x80);
        // every midpoint between neighbouring finite codes rounds to the even one
        for b in 0u8..0x7b {
            let mid = (e5m2_to_f32(b) + e5m2_to_f32(b + 1)) / 2.0;
            assert_eq!(f32_to_e5m2(mid) % 2, 0, "tie above {b:#04x}");
        }
    }

    #[test]
    fn load_and_store_every_float_dtype() {
        let x = 1.5f32;
        for d in [
            DType::F64,
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::F8E4M3,
            DType::F8E5M2,
        ] {
            let mut buf = vec![0u8; 3 * d.size()];
            store(d, x, &mut buf[d.size()..]);
            store(d, -0.25, &mut buf[2 * d.size()..]);
            assert_eq!(load(d, &buf, 0), 0.0, "{d}");
            assert_eq!(load(d, &buf, 1), 1.5, "{d}");
            assert_eq!(load(d, &buf, 2), -0.25, "{d}");
        }
        // rounding: fp16 nearest even, bf16 to 8 bits of mantissa, e4m3 saturating
        let mut b = [0u8; 2];
        store(DType::F16, 1.0 + 2f32.powi(-11), &mut b);
        assert_eq!(load(DType::F16, &b, 0), 1.0);
        store(DType::BF16, 1.0 + 3.0 * 2f32.powi(-9), &mut b);
        assert_eq!(load(DType::BF16, &b, 0), 1.0 + 2f64.powi(-7));
        store(DType::F8E4M3, 1000.0, &mut b);
        assert_eq!(load(DType::F8E4M3, &b, 0), 448.0);
        store(DType::F16, f32::NAN, &mut b);
        assert!(load(DType::F16, &b, 0).is_nan());
    }
}
