// tessera/online_softmax.cuh: the one online-softmax state shared by softmax, attention
// (forward and paged decode) and split-KV merges.
//
// Defines: ts::OnlineSoftmax {m, d} with empty / update / update_chunk / update_chunk_fma /
//          rescale / merge / lse,
//          ts::softmax_shift(m), ts::exp2_shifted(x, shift), ts::shifted_fma / ts::exp2_fma /
//          ts::exp2_fma_unclamped, ts::clamp_may_act(m), ts::softmax_prob_bias<OutT> /
//          ts::softmax_prob_scale<OutT>, ts::LazyStep / ts::kLazyRescaleSlack,
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
//
// Rounding: a caller that feeds the same inputs twice (a max/sum pass, then an output pass) must
// feed bit-identical values. Pre-multiply with __fmul_rn(x, scale_log2e), never a plain `*`
// that the compiler may fuse into an FMA in one pass and not in the other: then x - m of the
// max element is the product's rounding error instead of 0, a relative error of ~|x| * 2^-24 in
// every output (seen as 1e-3 on an H200 for |x| ~ 1e5).
#pragma once
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/math.cuh"
#include "tessera/reduce.cuh"

namespace ts {

/// The value subtracted from inputs before exp2 for a running max m: m itself, or 0 when
/// m = -inf (nothing seen yet / every input -inf) so that -inf - shift is -inf, not NaN.
TS_DEVICE float softmax_shift(float m) { return m == kNegInf ? 0.0f : m; }

/// 2^(x - shift) for x <= m, by the rules above (x == shift == +inf gives 1). Subnormal results
/// are flushed; use exp2_approx_denorm(fminf(x - shift, 0)) where the value is itself an output.
TS_DEVICE float exp2_shifted(float x, float shift) { return exp2_approx(fminf(x - shift, 0.0f)); }

/// x * s - m for a row whose max is m = max_j round(x_j * s) (pass -softmax_shift(m) as
/// neg_shift), with the product left unrounded (one FMA), clamped at 1:
///   * the max element gives its product's rounding residual (|r| <= ulp(m) / 2) instead of 0,
///     and every other element the exact difference rounded once, so rows of huge logits
///     (|x * s| ~ 1e5, where round(x * s) alone is off by ~2^-8) keep full relative accuracy as
///     long as every pass evaluates the same expression;
///   * +inf - +inf = NaN becomes 1 (fminf drops NaN): every +inf input then weighs 2^1 and the
///     row normalises to 1/k each; finite inputs in such a row give -inf, weight 0;
///   * -inf inputs give -inf (m = -inf takes neg_shift = 0).
/// The clamp never touches a regular value while |m| < 2^24 (the residual stays below 1/2).
TS_DEVICE float shifted_fma(float x, float s, float neg_shift) { return fminf(fmaf(x, s, neg_shift), 1.0f); }
/// Whether shifted_fma's clamp can act on any input of a row (or chunk) whose max is m =
/// max_j round(x_j * s): not while m is finite with |m| < 2^22 (the max element's residual is
/// then at most ulp(m) / 2 <= 1/8 and every other difference is below it; a shift b - m with a
/// bias b <= 1, as softmax.cu's warp path uses, rounds by at most 1/4 more, so the result stays
/// below b + 3/8 < b + 1), so the clamp matters only for rows holding +inf
/// (m = +inf), NaN (m = NaN) or huge logits. Kernels branch on it once per row or chunk (uniform
/// across the row's threads) and drop the clamp where it cannot act: the same terms bit for bit,
/// one instruction less per element.
TS_DEVICE bool clamp_may_act(float m) { return !(fabsf(m) < 0x1p22f); }
/// Softmax outputs of type OutT are 2^(d + b) * (2^-b / sum) with d = x * s - m <= 0 and the bias
/// b = softmax_prob_bias<OutT>: MUFU.EX2 (ex2.approx.ftz) flushes results below 2^-126, and b = 1
/// moves that limit to outputs below 2^-127 (~5.9e-39), so every output >= 1e-38 is kept (as a
/// subnormal from the final non-ftz multiply) for one FADD, instead of the four-instruction range
/// fix-up of ex2.approx without .ftz. fp16 outputs flush below 2^-24 anyway: b = 0.
template <typename OutT>
inline constexpr float softmax_prob_bias = is_same_v<OutT, f16> ? 0.0f : 1.0f;
/// 2^-softmax_prob_bias<OutT>, the factor folded into 1 / sum.
template <typename OutT>
inline constexpr float softmax_prob_scale = softmax_prob_bias<OutT> == 0.0f ? 1.0f : 0.5f;
/// 2^shifted_fma(x, s, neg_shift), flushing subnormal results (a term of a sum >= 1).
TS_DEVICE float exp2_fma(float x, float s, float neg_shift) { return exp2_approx(shifted_fma(x, s, neg_shift)); }
/// 2^(x * s - m) without the clamp of shifted_fma, for the attention kernels, whose scores are
/// finite for finite inputs (the softmax issue rate bounds them: one instruction less per score).
/// A +inf score (only from inf inputs) makes +inf - +inf = NaN, so its row's output is NaN, as
/// in torch's softmax; -inf (masked) scores still give 0.
TS_DEVICE float exp2_fma_unclamped(float x, float s, float neg_shift) { return exp2_approx(fmaf(x, s, neg_shift)); }

/// The slack of the attention kernels (terms up to 2^8). Each skips its accumulator's rescale
/// when no row of a warp moved (a warp-uniform branch; a per-row branch cost the Ampere kernel
/// more than it saved: attention/NOTES.md, `d08c751`).
constexpr float kLazyRescaleSlack = 8.0f;

/// Lazy rescaling, for kernels that keep an accumulator beside the state (attention): the
/// running max m moves to a chunk's candidate max m_cand (>= m) only when m_cand exceeds m by
/// more than kLazyRescaleSlack (log2 units). Otherwise m stays, nothing needs rescaling (the
/// factor is exactly 1), and the chunk's terms 2^(x - m) may reach 2^slack, which f32 sums and
/// f16/bf16 P operands hold exactly as well as terms <= 1 (same relative precision). An empty
/// state (m = -inf), a NaN candidate or +inf twice always moves (the rise is +inf or NaN, and
/// NaN <= slack is false), so the special-value rules above are unchanged. The normalised output
/// and the LSE (m + log2 d) do not depend on which reference max was used.
///
/// LazyStep is one row's step, split so that a kernel computes the factor only in the rare
/// branch that rescales its accumulator: on the common path a row costs the rise, one compare
/// and one select (max), not an exponential and a multiply of d.
struct LazyStep {
  float rise;  // m_cand - m

  TS_DEVICE static LazyStep of(float m, float m_cand) { return LazyStep{m_cand - m}; }
  /// Whether the reference max moves to m_cand.
  TS_DEVICE bool moved() const { return !(rise <= kLazyRescaleSlack); }
  /// The reference max after the step: m_cand where it moved, else m.
  TS_DEVICE float max(float m, float m_cand) const { return moved() ? m_cand : m; }
  /// 2^(m - m_new), by which d and the accumulator are scaled: exactly 1 where the max stayed,
  /// and where it moved OnlineSoftmax::rescale's factor bit for bit (m - m_new is exactly
  /// -rise; +inf rises give 0, NaN rises 1), except for an empty row that stays empty (rise
  /// -inf - -inf = NaN): 1 instead of 0, where d and the accumulator are 0 either way.
  TS_DEVICE float factor() const { return moved() ? exp2_approx(fminf(-rise, 0.0f)) : 1.0f; }
};

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

  /// Adds the N inputs x_i * s (s = scale_log2e) without rounding the products: `m_chunk` must
  /// be max_i round(x_i * s) (round(s * max x) for s > 0, round(s * min x) for s < 0), and each
  /// term is exp2_fma(x_i, s, -m) (see shifted_fma: +inf inputs weigh 2 here, not 1, so do not
  /// mix this with update() in one row). A later pass reproduces the terms exactly with
  /// shifted_fma(x, s, -softmax_shift(m)). Returns the rescale factor. The clamp is left out
  /// where it cannot act (clamp_may_act): one branch per chunk, the same terms.
  template <int N>
  TS_DEVICE float update_chunk_fma(const Array<float, N>& x, float s, float m_chunk) {
    const float factor = rescale(max_nan(m, m_chunk));
    const float neg_shift = -softmax_shift(m);
    float sum = 0.0f;
    if (clamp_may_act(m)) {
#pragma unroll
      for (int i = 0; i < N; ++i) sum += exp2_fma(x[i], s, neg_shift);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) sum += exp2_approx(fmaf(x[i], s, neg_shift));  // == exp2_fma here
    }
    d += sum;
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
