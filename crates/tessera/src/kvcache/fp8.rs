//! Host conversions of OCP FP8 E4M3 ("e4m3fn": no infinities, NaN = `S.1111.111`, largest
//! finite value 448), bit-exact with the device's `cvt.rn.satfinite.e4m3x2.f32`: round to
//! nearest even, values beyond +-448 (and +-inf) saturate to +-448, NaN stays NaN.

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
}
