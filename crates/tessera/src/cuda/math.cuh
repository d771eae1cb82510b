// tessera/math.cuh: fast f32 math as named PTX wrappers.
//
// Defines: ts::exp2_approx (ex2.approx.ftz.f32), ts::exp2_approx_denorm (ex2.approx.f32),
//          ts::log2_approx (lg2.approx.ftz.f32), ts::fast_rcp (rcp.approx.ftz.f32),
//          ts::max_nan / ts::min_nan (NaN-propagating max/min), ts::is_nan.
//
// Accuracy (PTX ISA, "Floating point instructions"): ex2.approx has a maximum relative error
// of about 2 ulp over the whole range; lg2.approx an absolute error of about 2^-22 in the
// result; rcp.approx about 1 ulp. That meets the f32 budget (rel_l2 < 1e-5) with room.
//
// `.ftz` flushes subnormal inputs and results to sign-preserving zero. exp2_approx therefore
// returns 0 for x < -126 (results below 2^-126 ~ 1.18e-38); exp2_approx_denorm keeps subnormal
// results (ptxas adds a range fix-up of a few instructions around MUFU.EX2). Use the
// denormal-keeping form where the exponential itself is an output (softmax probabilities);
// the flushing form is fine inside sums that are >= 1 (online-softmax denominators).
#pragma once
#include "tessera/common.cuh"

namespace ts {

/// 2^x, fast (MUFU.EX2), subnormal results flushed to 0. exp2_approx(-inf) = 0, (+inf) = +inf.
TS_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// 2^x, fast, with subnormal results kept (correct down to 2^-149).
TS_DEVICE float exp2_approx_denorm(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// log2(x), fast (MUFU.LG2), subnormal inputs flushed: log2_approx(0) = -inf,
/// log2_approx(x < 0) = NaN, log2_approx(+inf) = +inf.
TS_DEVICE float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// 1/x, fast (MUFU.RCP, ~1 ulp). fast_rcp(0) = +inf, fast_rcp(+inf) = 0.
TS_DEVICE float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

TS_DEVICE bool is_nan(float x) { return x != x; }

/// max(a, b) that returns NaN when either input is NaN (fmaxf would drop it).
TS_DEVICE float max_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? kNaN : fmaxf(a, b);
#endif
}

/// min(a, b) that returns NaN when either input is NaN.
TS_DEVICE float min_nan(float a, float b) {
#if __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? kNaN : fminf(a, b);
#endif
}

}  // namespace ts
