// tessera/reduce.cuh: warp, sub-warp and block all-reductions.
//
// Defines: ts::shfl_xor (float, int, double, overloadable for state structs such as OnlineSoftmax),
//          ts::MaxOp / ts::MinOp (NaN-propagating), ts::SumOp (each with its kIdentity),
//          ts::warp_allreduce<kWidth>(v, op), ts::warp_allreduce_max / _sum<kWidth>(v),
//          ts::block_allreduce<kThreads>(v, op, identity, smem),
//          ts::block_allreduce_max / _sum<kThreads>(v, smem).
//
// Sub-warp reductions: warp_allreduce<kWidth> with kWidth in {1, 2, 4, 8, 16, 32} reduces over
// each aligned group of kWidth consecutive lanes (butterfly over xor offsets kWidth/2 .. 1, which
// never leave the group), so a warp can own 32/kWidth rows at once. Every lane receives its
// group's result.
//
// Convergence: the shuffles use the full-warp mask. All 32 lanes of the warp must call the
// reduction together (lanes whose row is out of range take part with the identity element).
//
// Block reductions go through `smem`, which must hold kThreads/32 elements. They contain one
// __syncthreads() and return the result in every thread. Between two calls that use the same
// `smem` buffer there must be another __syncthreads() (or another block reduction on a different
// buffer): alternate two buffers to avoid an extra barrier.
#pragma once
#include "tessera/common.cuh"
#include "tessera/math.cuh"

namespace ts {

TS_DEVICE float shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }
TS_DEVICE int shfl_xor(int v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }
TS_DEVICE double shfl_xor(double v, int lane_mask) { return __shfl_xor_sync(kFullMask, v, lane_mask); }

/// max with NaN propagation: a NaN anywhere makes the reduction NaN. Identity -inf.
struct MaxOp {
  static constexpr float kIdentity = kNegInf;
  TS_DEVICE float operator()(float a, float b) const { return max_nan(a, b); }
};
/// min with NaN propagation. Identity +inf.
struct MinOp {
  static constexpr float kIdentity = kPosInf;
  TS_DEVICE float operator()(float a, float b) const { return min_nan(a, b); }
};
/// Sum. Identity 0.
struct SumOp {
  static constexpr float kIdentity = 0.0f;
  TS_DEVICE float operator()(float a, float b) const { return a + b; }
};

/// All-reduce over each aligned group of kWidth lanes.
template <int kWidth = kWarpSize, typename T, typename Op>
TS_DEVICE T warp_allreduce(T v, Op op) {
  static_assert(is_pow2(kWidth) && kWidth <= kWarpSize,
                "warp_allreduce: kWidth must be 1, 2, 4, 8, 16 or 32");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) v = op(v, shfl_xor(v, offset));
  return v;
}
template <int kWidth = kWarpSize>
TS_DEVICE float warp_allreduce_max(float v) { return warp_allreduce<kWidth>(v, MaxOp{}); }
template <int kWidth = kWarpSize>
TS_DEVICE float warp_allreduce_sum(float v) { return warp_allreduce<kWidth>(v, SumOp{}); }

/// All-reduce over a block of kThreads threads (a multiple of 32, at most 1024), through
/// `smem[kThreads / 32]`. See the header comment for the buffer reuse rule.
template <int kThreads, typename T, typename Op>
TS_DEVICE T block_allreduce(T v, Op op, T identity, T* smem) {
  static_assert(kThreads % kWarpSize == 0 && kThreads <= 1024, "block_allreduce: kThreads");
  constexpr int kWarps = kThreads / kWarpSize;
  v = warp_allreduce<kWarpSize>(v, op);
  if constexpr (kWarps == 1) {
    return v;
  } else {
    if (lane_id() == 0) smem[warp_id()] = v;
    __syncthreads();
    // Every warp reduces the kWarps partials itself (no second barrier, no broadcast).
    constexpr int kWidth = next_pow2(kWarps);
    const int i = lane_id() & (kWidth - 1);
    T w = (i < kWarps) ? smem[i] : identity;
    return warp_allreduce<kWidth>(w, op);
  }
}
template <int kThreads>
TS_DEVICE float block_allreduce_max(float v, float* smem) {
  return block_allreduce<kThreads>(v, MaxOp{}, kNegInf, smem);
}
template <int kThreads>
TS_DEVICE float block_allreduce_sum(float v, float* smem) {
  return block_allreduce<kThreads>(v, SumOp{}, 0.0f, smem);
}

}  // namespace ts
