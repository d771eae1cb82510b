// tessera/dtype.cuh: storage dtypes and their conversions to and from f32.
//
// Defines: ts::f16, ts::bf16, ts::fp8e4m3, ts::fp8e5m2 (storage-only structs holding the raw
//          bits; arithmetic is always done in f32),
//          ts::to_float(x) for float, double and every storage type,
//          ts::convert<To>(From), ts::from_float<T>(float) (round to nearest even; fp8 saturates to the largest finite
//          value, NaN stays NaN),
//          pair conversions used by the vector code: ts::pack_f16x2 / unpack_f16x2,
//          pack_bf16x2 / unpack_bf16x2, pack_e4m3x2 / unpack_e4m3x2, pack_e5m2x2 / unpack_e5m2x2
//          (element 0 in the low half, as in memory), and the fp8 -> f16x2 register
//          conversions of the paged decode kernels: e4m3x2_to_f16x2, e4m3x4_to_f16x4,
//          e4m3_interleave_to_f16x2.
//
// Conversions are PTX `cvt` where the target has it:
//   f16  <-> f32   cvt.f32.f16 / cvt.rn.f16.f32 / cvt.rn.f16x2.f32          (all targets)
//   bf16  -> f32   a 16-bit shift (exact)                                      (all targets)
//   f32  -> bf16   cvt.rn.bf16.f32 / cvt.rn.bf16x2.f32                         (sm_80+)
//   fp8e4m3 <-> f32 cvt.rn.satfinite.e4m3x2.f32 / cvt.rn.f16x2.e4m3x2         (sm_89+)
//   fp8e5m2 <-> f32 cvt.rn.satfinite.e5m2x2.f32; decode: e5m2 is the high byte of an f16
// Before sm_89 the fp8 conversions use the portable bit manipulation below, which gives the
// same results as the hardware (round to nearest even, satfinite: |x| beyond the largest
// finite value and +-inf become +-max, NaN becomes the NaN pattern 0x7f/0xff).
#pragma once
#include "tessera/common.cuh"

namespace ts {

// ---- storage types ----------------------------------------------------------------------
/// IEEE binary16. Storage only: convert with to_float / from_float.
struct alignas(2) f16 {
  uint16_t bits;
};
/// bfloat16 (the high half of an f32). Storage only.
struct alignas(2) bf16 {
  uint16_t bits;
};
/// OCP FP8 E4M3 ("fn": no infinities, NaN = S.1111.111, max 448). Storage only.
struct fp8e4m3 {
  uint8_t bits;
};
/// OCP FP8 E5M2 (IEEE-like: infinities and NaNs, max 57344). Storage only.
struct fp8e5m2 {
  uint8_t bits;
};
static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2 && sizeof(fp8e4m3) == 1 && sizeof(fp8e5m2) == 1,
              "storage type sizes");

// ---- small PTX wrappers -----------------------------------------------------------------
/// f32 product rounded to nearest with subnormals kept even under -ftz=true.
TS_DEVICE float mul_rn_keep_denormals(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
/// Round to the nearest integer (ties to even), as an int.
TS_DEVICE int round_to_int(float x) {
  int r;
  asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
TS_DEVICE float f16_bits_to_float(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
TS_DEVICE uint16_t float_to_f16_bits(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// ---- bf16 -------------------------------------------------------------------------------
TS_DEVICE float bf16_bits_to_float(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
TS_DEVICE uint16_t float_to_bf16_bits(float f) {
#if __CUDA_ARCH__ >= 800
  uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
#else
  // Round to nearest even on the bit pattern; NaN becomes a quiet NaN of the same sign.
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// ---- fp8, portable bit manipulation (used before sm_89, and as the spec of the hardware) --
/// E4M3 bits -> f32 (exact). The 7 magnitude bits, placed at the top of an f32 mantissa with a
/// zero exponent, are the value times 2^-120 (subnormal inputs included), so one multiply by
/// 2^120 rebiases both normal and subnormal encodings.
TS_DEVICE float e4m3_bits_to_float_portable(uint32_t v) {
  const uint32_t mag = v & 0x7fu;
  const float two_pow_120 = __uint_as_float((127u + 120u) << 23);
  float f = mul_rn_keep_denormals(__uint_as_float(mag << 20), two_pow_120);
  if (mag == 0x7fu) f = kNaN;
  return __uint_as_float(__float_as_uint(f) | ((v & 0x80u) << 24));
}
/// f32 -> E4M3 bits, round to nearest even, satfinite.
TS_DEVICE uint32_t float_to_e4m3_bits_portable(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t mag;
  if (a > 0x7f800000u) {
    mag = 0x7fu;                                   // NaN
  } else if (a > 0x43e00000u) {
    mag = 0x7eu;                                   // > 448 (incl. inf): saturate to 448
  } else if (a < 0x3c800000u) {
    // below 2^-6: subnormal grid of step 2^-9; rounding 8 steps up gives 0x08 = 2^-6, which
    // is exactly the first normal encoding.
    mag = (uint32_t)round_to_int(__uint_as_float(a) * 512.0f);
  } else {
    // keep 3 mantissa bits with round to nearest even, then rebias the exponent 127 -> 7.
    mag = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  }
  return sign | mag;
}
/// f32 -> E5M2 bits, round to nearest even, satfinite.
TS_DEVICE uint32_t float_to_e5m2_bits_portable(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  uint32_t mag;
  if (a > 0x7f800000u) {
    mag = 0x7fu;                                   // NaN
  } else if (a > 0x47600000u) {
    mag = 0x7bu;                                   // > 57344 (incl. inf): saturate to 57344
  } else if (a < 0x38800000u) {
    mag = (uint32_t)round_to_int(__uint_as_float(a) * 65536.0f);   // below 2^-14, step 2^-16
  } else {
    mag = ((a + 0xfffffu + ((a >> 21) & 1u)) >> 21) - ((127u - 15u) << 2);
  }
  return sign | mag;
}

// ---- fp8 --------------------------------------------------------------------------------
/// E5M2 is the high byte of an f16, so decoding is exact on every target.
TS_DEVICE float e5m2_bits_to_float(uint32_t v) { return f16_bits_to_float((uint16_t)(v << 8)); }

TS_DEVICE float e4m3_bits_to_float(uint32_t v) {
#if __CUDA_ARCH__ >= 890
  float f;
  asm("{\n\t.reg .b32 h2;\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.f16x2.e4m3x2 h2, %1;\n\t"
      "mov.b32 {lo, hi}, h2;\n\t"
      "cvt.f32.f16 %0, lo;\n\t}"
      : "=f"(f)
      : "h"((uint16_t)(v & 0xffu)));
  return f;
#else
  return e4m3_bits_to_float_portable(v);
#endif
}

/// Two floats -> two E4M3 bytes (lo in bits 0..7, hi in bits 8..15).
TS_DEVICE uint16_t pack_e4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint16_t)(float_to_e4m3_bits_portable(lo) | (float_to_e4m3_bits_portable(hi) << 8));
#endif
}
TS_DEVICE uint16_t pack_e5m2x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  uint16_t r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint16_t)(float_to_e5m2_bits_portable(lo) | (float_to_e5m2_bits_portable(hi) << 8));
#endif
}
TS_DEVICE uint32_t float_to_e4m3_bits(float f) { return pack_e4m3x2(f, 0.0f) & 0xffu; }
TS_DEVICE uint32_t float_to_e5m2_bits(float f) { return pack_e5m2x2(f, 0.0f) & 0xffu; }

/// Two E4M3 bytes -> two floats.
TS_DEVICE Array<float, 2> unpack_e4m3x2(uint16_t v) {
  Array<float, 2> r;
#if __CUDA_ARCH__ >= 890
  asm("{\n\t.reg .b32 h2;\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.f16x2.e4m3x2 h2, %2;\n\t"
      "mov.b32 {lo, hi}, h2;\n\t"
      "cvt.f32.f16 %0, lo;\n\t"
      "cvt.f32.f16 %1, hi;\n\t}"
      : "=f"(r[0]), "=f"(r[1])
      : "h"(v));
#else
  r[0] = e4m3_bits_to_float_portable(v & 0xffu);
  r[1] = e4m3_bits_to_float_portable((uint32_t)v >> 8);
#endif
  return r;
}
/// Two E4M3 bytes -> one f16x2 register (lo in bits 0..15): exact, one cvt on sm_89+.
TS_DEVICE uint32_t e4m3x2_to_f16x2(uint16_t v) {
#if __CUDA_ARCH__ >= 890
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(v));
  return r;
#else
  return (uint32_t)float_to_f16_bits(e4m3_bits_to_float_portable(v & 0xffu)) |
         ((uint32_t)float_to_f16_bits(e4m3_bits_to_float_portable((uint32_t)v >> 8)) << 16);
#endif
}
/// Four E4M3 bytes (byte 0 lowest) -> two f16x2 registers: lo = bytes 0, 1, hi = bytes 2, 3.
/// Exact; on sm_89+ two cvt reading the register halves directly (no shifts or masks).
TS_DEVICE void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if __CUDA_ARCH__ >= 890
  asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
      "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  lo = e4m3x2_to_f16x2((uint16_t)(w & 0xffffu));
  hi = e4m3x2_to_f16x2((uint16_t)(w >> 16));
#endif
}
/// Two rows x, y of four E4M3 bytes each -> four f16x2 registers pairing the rows column by
/// column: out[j] = (x byte j, y byte j), x in the low half. Exact (two byte permutes, four cvt):
/// the operand of an MMA whose k dimension runs across rows of a row-major fp8 tile.
TS_DEVICE void e4m3_interleave_to_f16x2(uint32_t x, uint32_t y, uint32_t (&out)[4]) {
  e4m3x4_to_f16x4(__byte_perm(x, y, 0x5140), out[0], out[1]);  // (x0, y0, x1, y1)
  e4m3x4_to_f16x4(__byte_perm(x, y, 0x7362), out[2], out[3]);  // (x2, y2, x3, y3)
}
TS_DEVICE Array<float, 2> unpack_e5m2x2(uint16_t v) {
  Array<float, 2> r;
  r[0] = e5m2_bits_to_float(v & 0xffu);
  r[1] = e5m2_bits_to_float((uint32_t)v >> 8);
  return r;
}

// ---- f16 / bf16 pairs -------------------------------------------------------------------
/// Two floats -> f16x2 (lo in bits 0..15), one cvt for both.
TS_DEVICE uint32_t pack_f16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
TS_DEVICE uint32_t pack_bf16x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)float_to_bf16_bits(lo) | ((uint32_t)float_to_bf16_bits(hi) << 16);
#endif
}
TS_DEVICE Array<float, 2> unpack_f16x2(uint32_t v) {
  // One asm on the 32-bit word lets ptxas read each half in place (HADD2.F32 ... .H0_H0 / .H1_H1)
  // instead of first extracting it into its own register.
  Array<float, 2> r;
  asm("{\n\t.reg .b16 lo, hi;\n\t"
      "mov.b32 {lo, hi}, %2;\n\t"
      "cvt.f32.f16 %0, lo;\n\t"
      "cvt.f32.f16 %1, hi;\n\t}"
      : "=f"(r[0]), "=f"(r[1])
      : "r"(v));
  return r;
}
TS_DEVICE Array<float, 2> unpack_bf16x2(uint32_t v) {
  Array<float, 2> r;
  r[0] = __uint_as_float(v << 16);
  r[1] = __uint_as_float(v & 0xffff0000u);
  return r;
}

// ---- the uniform overload set -----------------------------------------------------------
TS_DEVICE float to_float(float x) { return x; }
TS_DEVICE float to_float(double x) { return (float)x; }
TS_DEVICE float to_float(f16 x) { return f16_bits_to_float(x.bits); }
TS_DEVICE float to_float(bf16 x) { return bf16_bits_to_float(x.bits); }
TS_DEVICE float to_float(fp8e4m3 x) { return e4m3_bits_to_float(x.bits); }
TS_DEVICE float to_float(fp8e5m2 x) { return e5m2_bits_to_float(x.bits); }

/// f32 -> T, round to nearest even (fp8: satfinite).
template <typename T>
TS_DEVICE T from_float(float x) {
  if constexpr (is_same_v<T, float>) {
    return x;
  } else if constexpr (is_same_v<T, double>) {
    return (double)x;
  } else if constexpr (is_same_v<T, f16>) {
    return f16{float_to_f16_bits(x)};
  } else if constexpr (is_same_v<T, bf16>) {
    return bf16{float_to_bf16_bits(x)};
  } else if constexpr (is_same_v<T, fp8e4m3>) {
    return fp8e4m3{(uint8_t)float_to_e4m3_bits(x)};
  } else if constexpr (is_same_v<T, fp8e5m2>) {
    return fp8e5m2{(uint8_t)float_to_e5m2_bits(x)};
  } else {
    static_assert(sizeof(T) == 0, "from_float: unsupported storage type");
  }
}

/// From -> To between the storage and compute types: a plain cast between float and double, via
/// f32 (to_float / from_float, round to nearest even) for the 16- and 8-bit storage types; the
/// one conversion the sparse kernels use between values and accumulators.
template <typename To, typename From>
TS_DEVICE To convert(From x) {
  constexpr bool to_wide = is_same_v<To, float> || is_same_v<To, double>;
  constexpr bool from_wide = is_same_v<From, float> || is_same_v<From, double>;
  if constexpr (to_wide && from_wide) {
    return (To)x;
  } else if constexpr (to_wide) {
    return (To)to_float(x);
  } else {
    return from_float<To>(to_float(x));
  }
}

/// True for the storage types handled by this header.
template <typename T>
inline constexpr bool is_storage_type_v = is_same_v<T, float> || is_same_v<T, double> || is_same_v<T, f16> ||
                                          is_same_v<T, bf16> || is_same_v<T, fp8e4m3> ||
                                          is_same_v<T, fp8e5m2>;

}  // namespace ts
