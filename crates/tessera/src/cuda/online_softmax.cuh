// tessera/online_softmax.cuh: the one online-softmax state shared by softmax, attention
// (forward and paged decode) and split-KV merges.
//
// Defines: ts::OnlineSoftmax {m, d} with empty / update / update_chunk / rescale / merge / lse,
//          ts::softmax_shift(m), ts::exp2_shifted(x, shift),
//          ts::shfl_xor(OnlineSoftmax, int), ts::warp_allreduce_softmax<kWidth>,
//          ts::block_allreduce_softmax<kThreads>.
//
// Domain: log2. Inputs are pre-multiplied by scale * log2(e) (computed once on the host), so
//   m = max_j x_j,   d = sum_j 2^(x_j - m),   LSE (natural log) = (m + log2 d) * ln 2.
// Attention keeps its output accumulator o beside the state and multiplies it by the factor
// that rescale / update return whenever m grows (o_new = o * factor + p * v).
//
// Special values (the same rules as the softmax kernels and the CPU references):
//   * Empty state: m = -inf, d = 0 (OnlineSoftmax::empty()). A row whose every input is -inf
//     stays empty: d = 0, lse() = -inf. Merging two empty states gives an empty state, never
//     NaN, because the shift subtracted from -inf is 0 (softmax_shift) rather than -inf.
//   * +inf inputs: m = +inf and every +inf input counts 2^0 = 1 in d (x - m is taken as 0
//     where x == m == +inf, so +inf - +inf never makes a NaN); finite inputs then count 0.
//   * NaN inputs: m becomes NaN (NaN-propagating max) and stays NaN through every later
//     update and merge; d is then meaningless but finite, lse() is NaN. Callers test m for NaN
//     (or just let it flow into their outputs).
//   Implementation: 2^(x - m) is evaluated as exp2(min(x - shift, 0)) with shift = m, or 0 when
//   m = -inf. fminf drops the NaN of +inf - +inf (giving 2^0 = 1) and clamps rounding noise; the
//   true NaN case is carried by m instead.
#pragma once
#include "tessera/common.cuh"
#include "tessera/math.cuh"
#include "tessera/reduce.cuh"

namespace ts {

/// The value subtracted from inputs before exp2 for a running max m: m itself, or 0 when
/// m = -inf (nothing seen yet / every input -inf) so that -inf - shift is -inf, not NaN.
TS_DEVICE float softmax_shift(float m) { return m == kNegInf ? 0.0f : m; }

/// 2^(x - shift) for x <= m, by the rules above (x == shift == +inf gives 1). Subnormal results
/// are flushed; use exp2_approx_denorm(fminf(x - shift, 0)) where the value is itself an output.
TS_DEVICE float exp2_shifted(float x, float shift) { return exp2_approx(fminf(x - shift, 0.0f)); }

struct OnlineSoftmax {
  float m;  // running max, log2 domain (-inf: empty)
  float d;  // sum of 2^(x - m) over the inputs seen

  TS_DEVICE static OnlineSoftmax empty() { return OnlineSoftmax{kNegInf, 0.0f}; }
  TS_DEVICE bool is_empty() const { return m == kNegInf; }

  /// Moves the reference point to m_new (>= m, NaN allowed) and returns the factor 2^(m - m_new)
  /// by which d, and any accumulator kept beside the state, were scaled (0 when the state was
  /// empty, 1 when m == m_new == +inf).
  TS_DEVICE float rescale(float m_new) {
    const float factor = exp2_shifted(m, softmax_shift(m_new));
    d *= factor;
    m = m_new;
    return factor;
  }

  /// Adds one input. Returns the rescale factor of the old state (see rescale).
  TS_DEVICE float update(float x) {
    const float factor = rescale(max_nan(m, x));
    d += exp2_shifted(x, softmax_shift(m));
    return factor;
  }

  /// Adds N inputs with a single rescale (one exp2 per input plus one). Returns the factor.
  template <int N>
  TS_DEVICE float update_chunk(const Array<float, N>& x) {
    float mx = x[0];
#pragma unroll
    for (int i = 1; i < N; ++i) mx = max_nan(mx, x[i]);
    const float factor = rescale(max_nan(m, mx));
    const float shift = softmax_shift(m);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) s += exp2_shifted(x[i], shift);
    d += s;
    return factor;
  }

  /// Combines with another state (commutative bit for bit: a.merge(b) == b.merge(a)).
  TS_DEVICE void merge(const OnlineSoftmax& o) {
    const float m_new = max_nan(m, o.m);
    const float shift = softmax_shift(m_new);
    // __fmul_rn keeps both products unfused, so the sum does not depend on the operand order
    // (lanes of a butterfly reduction then agree exactly).
    d = __fmul_rn(d, exp2_shifted(m, shift)) + __fmul_rn(o.d, exp2_shifted(o.m, shift));
    m = m_new;
  }

  /// log2(sum_j 2^x_j): -inf when empty (-inf + log2(0) = -inf), +inf when m = +inf, NaN when
  /// m is NaN.
  TS_DEVICE float lse_log2() const { return m + log2_approx(d); }
  /// Natural-log LSE of the original inputs: ln(sum_j e^(x_j / log2 e)) = lse_log2() * ln 2.
  TS_DEVICE float lse() const { return lse_log2() * kLn2; }
};

TS_DEVICE OnlineSoftmax shfl_xor(const OnlineSoftmax& s, int lane_mask) {
  return OnlineSoftmax{shfl_xor(s.m, lane_mask), shfl_xor(s.d, lane_mask)};
}

struct OnlineSoftmaxMergeOp {
  TS_DEVICE OnlineSoftmax operator()(OnlineSoftmax a, const OnlineSoftmax& b) const {
    a.merge(b);
    return a;
  }
};

/// Merges the states of each aligned group of kWidth lanes; every lane gets the result.
template <int kWidth = kWarpSize>
TS_DEVICE OnlineSoftmax warp_allreduce_softmax(OnlineSoftmax s) {
  return warp_allreduce<kWidth>(s, OnlineSoftmaxMergeOp{});
}

/// Merges the states of a block of kThreads threads through smem[kThreads / 32] (reuse rule of
/// reduce.cuh: alternate two buffers or separate reuses by a barrier).
template <int kThreads>
TS_DEVICE OnlineSoftmax block_allreduce_softmax(OnlineSoftmax s, OnlineSoftmax* smem) {
  return block_allreduce<kThreads>(s, OnlineSoftmaxMergeOp{}, OnlineSoftmax::empty(), smem);
}

}  // namespace ts
