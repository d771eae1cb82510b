// tessera/gemm_epilogue.cuh: the fused GEMM epilogue shared by every GEMM kernel (sm_80
// mma.sync, SIMT, skinny, DMMA and the sm_90a wgmma kernel). Handed to NVRTC as the named header
// "tessera/gemm_epilogue.cuh" (gemm::DEVICE_HEADERS); header-free like src/cuda/.
//
// Defines (global namespace, every name prefixed gemm_/kGemm; also reachable as ts::gemm_epilogue,
//          ts::kActRelu, ...):
//          kGemmActNone .. kGemmActSilu (activation codes, = gemm::Activation::code() in Rust),
//          gemm_activate<kActivation>(x),
//          gemm_epilogue<kActivation, kHasBias, kHasC, kHasResidual>(acc, alpha, beta, c, bias,
//          residual), both in f32, and their forms in any T (gemm_activate_t, gemm_epilogue_t:
//          float or double, for the fp64 GEMM); gemm_glu_t<kActivation, kHasBias>(gate, up,
//          alpha, bias_gate, bias_up), the GLU epilogue (below).
//
// Order (cuBLASLt's, and the CPU reference's in gemm/reference.rs):
//     d = act(alpha * acc + beta * c + bias) + residual
// i.e. the bias is added before the activation and the residual after it; a term whose flag is
// false is absent (not added as zero, so -0 and NaN/Inf behave as if it did not exist). `acc` is
// the f32 accumulator of sum_k A[m,k] B[k,n]; `c` is C[m,n] and `residual` R[m,n] converted to
// f32, `bias` is bias[n] (one value per output column). The caller converts d to the output type.
//
// Activations, all in f32 and NaN-propagating (a NaN input gives a NaN output):
//   1 relu       x < 0 ? 0 : x                      (NaN < 0 is false, so NaN passes through)
//   2 gelu_erf   0.5 x (1 + erf(x / sqrt 2))        (torch gelu(approximate='none'))
//                computed as 0.5 x erfc(-x / sqrt 2): the same function without the
//                cancellation of 1 + erf near -1 (x < -2 lost up to 1e-4 relative in f32)
//   3 gelu_tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (approximate='tanh')
//                computed as x / (1 + exp(-2 u)), u the tanh argument, for the same reason
//   4 silu       x / (1 + exp(-x))                  (x sigmoid(x); -0 for x -> -inf ... -88)
// GLU epilogue (SwiGLU / GeGLU; gemm::Glu in Rust): B has 2N columns, column 2j the gate and
// column 2j + 1 the up projection of output column j, so the accumulators of a column pair give
//     d = act(alpha * acc_gate + bias_gate) * (alpha * acc_up + bias_up)
// with act = silu (SwiGLU), gelu_erf or gelu_tanh (GeGLU); no C or residual term.
// erfcf/expf (erfc/exp in double) are NVRTC's built-in device math (full precision,
// not the __ intrinsics); the sigmoid forms' division is __fdividef in f32 (gemm_over_one_plus:
// the IEEE division's slow path for huge denominators). fmaf(beta, c, alpha * acc): one rounding
// for the C term. kFastExp (f32 only; kernels set it for 16-bit and 8-bit outputs) takes exp
// as ex2.approx.ftz of x log2 e (relative error below 2^-21 + 2^-23 |x|, i.e. < 1.1e-5 over the
// range where the sigmoid is not 0 or 1): a tenth of a bf16/f16 output's rounding at most,
// and a third of expf's instructions in an epilogue whose elements are otherwise a handful of
// FMAs. f32 and f64 outputs keep expf / exp.
#pragma once
#include "tessera/common.cuh"

constexpr int kGemmActNone = 0;
constexpr int kGemmActRelu = 1;
constexpr int kGemmActGeluErf = 2;
constexpr int kGemmActGeluTanh = 3;
constexpr int kGemmActSilu = 4;

/// erfc / exp / fma of float (the f-suffixed builtins) and of double.
__device__ __forceinline__ float gemm_erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double gemm_erfc(double x) { return erfc(x); }
template <bool kFastExp = false>
__device__ __forceinline__ float gemm_exp(float x) {
  if constexpr (kFastExp) {
    // 2^(x log2 e) by ex2.approx.ftz: a result below 2^-126 flushes to 0, which 1 + e (the only
    // use) cannot tell from the true value
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
  } else {
    return expf(x);
  }
}
template <bool kFastExp = false>
__device__ __forceinline__ double gemm_exp(double x) {
  static_assert(!kFastExp, "gemm_exp: no fast exp in double");
  return exp(x);
}
/// x / (1 + e) for e = exp(...) >= 0 (the sigmoid forms). In float, the fast division (2 ulp):
/// the IEEE one takes a slow path of a few hundred cycles whenever 1 + e exceeds 2^126, which
/// exp(-2u) and exp(-x) do for every clearly negative x (most of a GEMM's negative outputs), and
/// that path cost more than the whole main loop. __fdividef gives 0 (x 0: -0 for x < 0, the
/// limit) for 1 + e > 2^126, where the quotient is below 2^-100 |x| anyway.
__device__ __forceinline__ float gemm_over_one_plus(float x, float e) { return __fdividef(x, 1.0f + e); }
__device__ __forceinline__ double gemm_over_one_plus(double x, double e) { return x / (1.0 + e); }
__device__ __forceinline__ float gemm_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double gemm_fma(double a, double b, double c) { return fma(a, b, c); }

/// The activation with code kActivation applied to x (see the table above), in T = float or
/// double (the fp64 GEMM's epilogue runs in double); kFastExp: exp by __expf (f32, see above).
template <int kActivation, typename T, bool kFastExp = false>
__device__ __forceinline__ T gemm_activate_t(T x) {
  static_assert(kActivation >= kGemmActNone && kActivation <= kGemmActSilu, "gemm_activate: unknown activation code");
  if constexpr (kActivation == kGemmActNone) {
    return x;
  } else if constexpr (kActivation == kGemmActRelu) {
    return x < T(0) ? T(0) : x;
  } else if constexpr (kActivation == kGemmActGeluErf) {
    return T(0.5) * x * gemm_erfc(x * T(-0.70710678118654752440));
  } else if constexpr (kActivation == kGemmActGeluTanh) {
    // 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2 u))
    return gemm_over_one_plus(x, gemm_exp<kFastExp>(T(-1.5957691216057307118) * (x + T(0.044715) * x * x * x)));
  } else {
    return gemm_over_one_plus(x, gemm_exp<kFastExp>(-x));
  }
}

/// d = act(alpha * acc + beta * c + bias) + residual in T, terms absent when their flag is false.
template <int kActivation, bool kHasBias, bool kHasC, bool kHasResidual, typename T, bool kFastExp = false>
__device__ __forceinline__ T gemm_epilogue_t(T acc, T alpha, T beta, T c, T bias, T residual) {
  T x = alpha * acc;
  if constexpr (kHasC) x = gemm_fma(beta, c, x);
  if constexpr (kHasBias) x += bias;
  T d = gemm_activate_t<kActivation, T, kFastExp>(x);
  if constexpr (kHasResidual) d += residual;
  return d;
}

/// The GLU epilogue in T: act(alpha gate + bias_gate) * (alpha up + bias_up), the biases
/// absent when kHasBias is false.
template <int kActivation, bool kHasBias, typename T, bool kFastExp = false>
__device__ __forceinline__ T gemm_glu_t(T gate, T up, T alpha, T bias_gate, T bias_up) {
  T g = alpha * gate;
  T u = alpha * up;
  if constexpr (kHasBias) {
    g += bias_gate;
    u += bias_up;
  }
  return gemm_activate_t<kActivation, T, kFastExp>(g) * u;
}

/// The activation with code kActivation applied to x (see the table above).
template <int kActivation>
__device__ __forceinline__ float gemm_activate(float x) {
  return gemm_activate_t<kActivation, float>(x);
}

/// d = act(alpha * acc + beta * c + bias) + residual, terms absent when their flag is false.
template <int kActivation, bool kHasBias, bool kHasC, bool kHasResidual, bool kFastExp = false>
__device__ __forceinline__ float gemm_epilogue(float acc, float alpha, float beta, float c, float bias,
                                               float residual) {
  return gemm_epilogue_t<kActivation, kHasBias, kHasC, kHasResidual, float, kFastExp>(acc, alpha, beta, c, bias,
                                                                                      residual);
}

// The same names inside namespace ts, for kernels that spell them ts::gemm_epilogue or ts::kActRelu.
namespace ts {
using ::gemm_activate;
using ::gemm_epilogue;
using ::gemm_glu_t;
constexpr int kActNone = kGemmActNone;
constexpr int kActRelu = kGemmActRelu;
constexpr int kActGeluErf = kGemmActGeluErf;
constexpr int kActGeluTanh = kGemmActGeluTanh;
constexpr int kActSilu = kGemmActSilu;
}  // namespace ts
