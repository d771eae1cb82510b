//! CPU references of the device-library tests, written from the number formats and the matrix
//! definitions alone (never from the kernels' fragment mappings).
//!
//! * [`matmul`]: the f64 product of row-major matrices (mma.sync and wgmma tests).
//! * [`e5m2_to_f32`] / [`f32_to_e5m2`]: OCP FP8 E5M2 (IEEE-like, infinities and NaNs, largest
//!   finite 57344), encoding round-to-nearest-even with saturation to +-57344 (`.satfinite`:
//!   +-inf saturate too) and NaN -> 0x7f, found by searching the code table. This is kept apart
//!   from [`crate::numeric::f32_to_e5m2`] on purpose: that one is the same bit arithmetic as the
//!   device's portable conversion, so it cannot referee it. E4M3 is [`crate::numeric`] (a
//!   table search already).
//! * [`float_sweep`]: the floats the conversion test encodes.
//! * [`box_of`]: the part of a row-major matrix a TMA box covers, zeros outside it.

use crate::numeric::e4m3_to_f32;
use crate::testdata::{random_matrix, Dist};

/// `C[m][n] = sum_k A[m][k] B[k][n]` for row-major `A` (m x k) and `B` (k x n), in f64.
pub fn matmul(a: &[f64], b: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    assert_eq!(a.len(), m * k, "matmul: A is not m x k");
    assert_eq!(b.len(), k * n, "matmul: B is not k x n");
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    c
}

/// E5M2 bits -> f32 (exact): sign, 5 exponent bits (bias 15), 2 mantissa bits; exponent 31 is
/// infinity (mantissa 0) or NaN.
pub fn e5m2_to_f32(bits: u8) -> f32 {
    let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((bits >> 2) & 0x1f) as i32;
    let man = (bits & 0x03) as f32;
    if exp == 0x1f {
        return if bits & 0x03 == 0 {
            sign * f32::INFINITY
        } else {
            f32::NAN
        };
    }
    if exp == 0 {
        sign * man / 4.0 * 2f32.powi(-14) // subnormal
    } else {
        sign * (1.0 + man / 4.0) * 2f32.powi(exp - 15)
    }
}

/// Largest finite E5M2 magnitude code (57344).
pub const E5M2_MAX_CODE: u8 = 0x7b;

/// f32 -> E5M2 bits: round to nearest even, saturating to +-57344 (+-inf too); NaN -> 0x7f.
pub fn f32_to_e5m2(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= e5m2_to_f32(E5M2_MAX_CODE) {
        return sign | E5M2_MAX_CODE;
    }
    sign | round_to_codes(a, E5M2_MAX_CODE, e5m2_to_f32)
}

/// The magnitude code of `a` (finite, >= 0, below the value of `max_code`) among the increasing
/// codes 0..=max_code of `decode`, rounded to nearest with ties to the even code.
fn round_to_codes(a: f32, max_code: u8, decode: fn(u8) -> f32) -> u8 {
    let (mut lo, mut hi) = (0u8, max_code);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if decode(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (vl, vh) = (decode(lo) as f64, decode(hi) as f64);
    let a = a as f64;
    if a <= vl || a - vl < vh - a {
        lo
    } else if a - vl > vh - a {
        hi
    } else if lo % 2 == 0 {
        lo
    } else {
        hi
    }
}

/// Whether `bits` is an E4M3 NaN (S.1111.111).
pub fn e4m3_is_nan(bits: u8) -> bool {
    bits & 0x7f == 0x7f
}

/// Whether `bits` is an E5M2 NaN (exponent 31, mantissa non-zero).
pub fn e5m2_is_nan(bits: u8) -> bool {
    bits & 0x7c == 0x7c && bits & 0x03 != 0
}

/// The floats the conversion test encodes (even count): every E4M3 and E5M2 value and the
/// midpoints between neighbouring magnitudes (round-to-nearest-even ties) with both signs; the
/// saturation bounds and values around them; f16 and bf16 overflow and tie cases; +-0, +-inf,
/// NaNs; f32 subnormals; random values at scales 2^-30 .. 2^30; and random f32 bit patterns
/// (NaN payloads, subnormals, huge values), drawn from `seed`.
pub fn float_sweep(seed: u64) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::new();
    let both = |x: f32, v: &mut Vec<f32>| {
        v.push(x);
        v.push(-x);
    };
    for decode in [e4m3_to_f32 as fn(u8) -> f32, e5m2_to_f32] {
        for code in 0u8..0x7f {
            let (a, b) = (decode(code), decode(code + 1));
            if a.is_finite() {
                both(a, &mut v);
            }
            if a.is_finite() && b.is_finite() {
                let mid = ((a as f64 + b as f64) / 2.0) as f32;
                both(mid, &mut v);
                both(f32::from_bits(mid.to_bits() + 1), &mut v); // just above the tie
                both(f32::from_bits(mid.to_bits() - 1), &mut v); // just below it
            }
        }
    }
    for x in [
        0.0f32,
        f32::INFINITY,
        448.0,
        449.0,
        464.0,
        480.0,
        1e4,
        57344.0,
        61440.0,
        61441.0,
        65504.0,
        65519.0,
        65520.0,
        1e30,
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x0040_0000),
        f32::from_bits(0x007f_ffff),
        2f32.powi(-24),
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        2f32.powi(-10),
        2f32.powi(-11),
        2f32.powi(-16),
        2f32.powi(-17),
        1.0 + 2f32.powi(-8),         // bf16 tie, rounds to even 1.0
        1.0 + 3.0 * 2f32.powi(-8),   // bf16 tie, rounds up to even
        1.0 + 2f32.powi(-11),        // f16 tie
        f32::from_bits(0x7f7f_8000), // bf16 tie at the top: rounds to inf
    ] {
        both(x, &mut v);
    }
    v.push(f32::NAN);
    v.push(f32::from_bits(0xffc0_0001));
    v.push(f32::from_bits(0x7f80_0001)); // signalling NaN
    v.push(f32::from_bits(0x7fbf_ffff));
    // Random values over many binades (normal times 2^e for e in -30..=30).
    let normals: Vec<f64> = random_matrix(seed, 61, 64, 64, Dist::Normal { std: 1.0 });
    for (e, row) in normals.chunks(64).enumerate() {
        for &z in row {
            v.push((z * 2f64.powi(e as i32 - 30)) as f32);
        }
    }
    // Random bit patterns.
    let bits: Vec<f64> = random_matrix(
        seed ^ 0x5eed,
        1,
        4096,
        4096,
        Dist::Uniform {
            lo: 0.0,
            hi: 4_294_967_296.0,
        },
    );
    v.extend(bits.iter().map(|&b| f32::from_bits(b as u32)));
    if v.len() % 2 == 1 {
        v.push(1.0);
    }
    v
}

/// The `box_rows x box_cols` box at (`row0`, `col0`) (may be negative or run past the edges) of a
/// row-major `rows x cols` matrix, row-major, with zeros where it lies outside the matrix (TMA's
/// out-of-bounds fill).
pub fn box_of(x: &[f64], rows: usize, cols: usize, row0: i64, col0: i64, box_rows: usize, box_cols: usize) -> Vec<f64> {
    let mut out = vec![0.0; box_rows * box_cols];
    for r in 0..box_rows {
        for c in 0..box_cols {
            let (gr, gc) = (row0 + r as i64, col0 + c as i64);
            if gr >= 0 && gc >= 0 && (gr as usize) < rows && (gc as usize) < cols {
                out[r * box_cols + c] = x[gr as usize * cols + gc as usize];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::f32_to_e4m3;

    #[test]
    fn e5m2_round_trips_every_code() {
        for b in 0u8..=255 {
            let x = e5m2_to_f32(b);
            if x.is_nan() {
                assert!(e5m2_is_nan(b), "{b:#04x}");
                assert_eq!(f32_to_e5m2(x), 0x7f);
                continue;
            }
            if x.is_infinite() {
                assert_eq!(f32_to_e5m2(x), (b & 0x80) | E5M2_MAX_CODE, "inf saturates");
                continue;
            }
            assert_eq!(f32_to_e5m2(x), b, "code {b:#04x} = {x}");
        }
    }

    #[test]
    fn e5m2_is_the_high_byte_of_an_f16() {
        for b in 0u8..=255 {
            let via_f16 = half::f16::from_bits((b as u16) << 8).to_f32();
            let x = e5m2_to_f32(b);
            assert!(x == via_f16 || (x.is_nan() && via_f16.is_nan()), "{b:#04x}");
            if !x.is_nan() {
                assert_eq!(x.to_bits(), via_f16.to_bits(), "sign of zero at {b:#04x}");
            }
        }
    }

    #[test]
    fn e5m2_rounds_to_nearest_even_and_saturates() {
        assert_eq!(e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(f32_to_e5m2(61439.0), 0x7b);
        assert_eq!(f32_to_e5m2(1e9), 0x7b);
        assert_eq!(f32_to_e5m2(f32::NEG_INFINITY), 0xfb);
        // 1.0 = 0x3c, 1.25 = 0x3d: 1.125 ties to the even 0x3c, 1.375 to 0x3e
        assert_eq!(f32_to_e5m2(1.0), 0x3c);
        assert_eq!(f32_to_e5m2(1.125), 0x3c);
        assert_eq!(f32_to_e5m2(1.126), 0x3d);
        assert_eq!(f32_to_e5m2(1.375), 0x3e);
        // subnormals: smallest 2^-16; half of it ties to 0, a little more rounds up
        assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
        assert_eq!(f32_to_e5m2(2f32.powi(-17)), 0x00);
        assert_eq!(f32_to_e5m2(2f32.powi(-17) * 1.01), 0x01);
        assert_eq!(f32_to_e5m2(-0.0), 0x80);
    }

    /// The kvcache E4M3 reference the conversion test uses: every code round-trips and the
    /// saturation / NaN rules hold for both signs.
    #[test]
    fn e4m3_reference_round_trips_all_256_codes() {
        for b in 0u8..=255 {
            let x = e4m3_to_f32(b);
            if e4m3_is_nan(b) {
                assert!(x.is_nan());
                assert_eq!(f32_to_e4m3(x), 0x7f);
            } else {
                assert_eq!(f32_to_e4m3(x), b, "{b:#04x}");
            }
        }
        assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xfe);
        assert_eq!(f32_to_e4m3(-1e6), 0xfe);
    }

    #[test]
    fn midpoints_tie_to_even_codes() {
        for code in 0u8..0x7a {
            let (a, b) = (e5m2_to_f32(code), e5m2_to_f32(code + 1));
            let mid = ((a as f64 + b as f64) / 2.0) as f32;
            assert_eq!(f32_to_e5m2(mid), if code % 2 == 0 { code } else { code + 1 });
        }
        for code in 0u8..0x7d {
            let (a, b) = (e4m3_to_f32(code), e4m3_to_f32(code + 1));
            let mid = ((a as f64 + b as f64) / 2.0) as f32;
            assert_eq!(f32_to_e4m3(mid), if code % 2 == 0 { code } else { code + 1 });
        }
    }

    /// Rust ports of dtype.cuh's portable fp8 code (the spec of the hardware conversions, run
    /// before sm_89): they must agree with these references over the whole sweep, or the GPU
    /// case would fail on every target.
    mod portable {
        pub fn e4m3_bits_to_float(v: u32) -> f32 {
            let mag = v & 0x7f;
            let two_pow_120 = f32::from_bits((127 + 120) << 23);
            let mut f = f32::from_bits(mag << 20) * two_pow_120;
            if mag == 0x7f {
                f = f32::NAN;
            }
            f32::from_bits(f.to_bits() | ((v & 0x80) << 24))
        }
        pub fn float_to_e4m3_bits(f: f32) -> u32 {
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
                ((a + 0x7ffff + ((a >> 20) & 1)) >> 20) - ((127 - 7) << 3)
            };
            sign | mag
        }
        pub fn float_to_e5m2_bits(f: f32) -> u32 {
            let u = f.to_bits();
            let sign = (u >> 24) & 0x80;
            let a = u & 0x7fff_ffff;
            let mag = if a > 0x7f80_0000 {
                0x7f
            } else if a > 0x4760_0000 {
                0x7b
            } else if a < 0x3880_0000 {
                (f32::from_bits(a) * 65536.0).round_ties_even() as u32
            } else {
                ((a + 0xfffff + ((a >> 21) & 1)) >> 21) - ((127 - 15) << 2)
            };
            sign | mag
        }
    }

    #[test]
    fn references_agree_with_the_portable_device_code() {
        for code in 0u32..256 {
            let (d, r) = (portable::e4m3_bits_to_float(code), e4m3_to_f32(code as u8));
            assert!(
                d.to_bits() == r.to_bits() || (d.is_nan() && r.is_nan()),
                "decode {code:#04x}"
            );
        }
        for x in float_sweep(3) {
            let (d, r) = (portable::float_to_e4m3_bits(x) as u8, f32_to_e4m3(x));
            assert!(
                d == r || (e4m3_is_nan(d) && e4m3_is_nan(r)),
                "e4m3 of {x:e}: {d:#04x} vs {r:#04x}"
            );
            let (d, r) = (portable::float_to_e5m2_bits(x) as u8, f32_to_e5m2(x));
            assert!(
                d == r || (e5m2_is_nan(d) && e5m2_is_nan(r)),
                "e5m2 of {x:e}: {d:#04x} vs {r:#04x}"
            );
        }
    }

    /// The `half` crate (the f16 / bf16 reference) rounds to nearest even and overflows to inf.
    #[test]
    fn half_crate_rounds_to_nearest_even() {
        use half::{bf16, f16};
        assert_eq!(f16::from_f32(1.0 + 2f32.powi(-11)).to_bits(), 0x3c00);
        assert_eq!(f16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).to_bits(), 0x3c02);
        assert_eq!(f16::from_f32(65519.0).to_bits(), 0x7bff);
        assert_eq!(f16::from_f32(65520.0).to_bits(), 0x7c00);
        assert_eq!(f16::from_f32(2f32.powi(-25)).to_bits(), 0x0000); // tie with 0: even
        assert_eq!(f16::from_f32(3.0 * 2f32.powi(-26)).to_bits(), 0x0001);
        assert_eq!(bf16::from_f32(1.0 + 2f32.powi(-8)).to_bits(), 0x3f80);
        assert_eq!(bf16::from_f32(1.0 + 3.0 * 2f32.powi(-8)).to_bits(), 0x3f82);
        assert_eq!(bf16::from_f32(f32::from_bits(0x7f7f_8000)).to_bits(), 0x7f80);
        assert_eq!(bf16::from_f32(f32::from_bits(0x0000_8001)).to_bits(), 0x0001);
        // subnormal
    }

    #[test]
    fn sweep_is_even_and_covers_the_specials() {
        let s = float_sweep(1);
        assert_eq!(s.len() % 2, 0);
        assert!(s.iter().any(|x| x.is_nan()));
        assert!(s.contains(&f32::INFINITY) && s.contains(&f32::NEG_INFINITY));
        assert!(s.iter().any(|x| x.is_subnormal()));
        assert!(s.iter().any(|x| x.to_bits() == 0x8000_0000));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&s), bits(&float_sweep(1)));
        assert_ne!(bits(&s), bits(&float_sweep(2)));
    }

    #[test]
    fn matmul_and_box() {
        // [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50]
        assert_eq!(
            matmul(&[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0], 2, 2, 2),
            [19.0, 22.0, 43.0, 50.0]
        );
        // 2 x 3 matrix, a 2 x 2 box at (-1, 2): only (0, 2) is inside
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(box_of(&x, 2, 3, -1, 2, 2, 2), [0.0, 0.0, 3.0, 0.0]);
    }
}
