// decode_combine.cu: merges the split-KV partials of paged_decode.cu.
//
// A sequence b cut into n > 1 key chunks (partial slots first .. first + n - 1, kvcache_params.cuh)
// left, for every KV head kvh and query row r, n normalised partial outputs o_i (f32, D
// columns) and natural-log LSEs lse_i (-inf for a chunk that saw no visible key; o_i = 0).
// The online-softmax merge:
//   x_i = lse_i * log2(e),  m = max_i x_i,  d = sum_i 2^(x_i - m)
//   O   = sum_i (2^(x_i - m) / d) o_i       LSE = (m + log2 d) ln 2
// A row no chunk saw (m = -inf) gets O = 0 and LSE = -inf.
//
// Work: one warp per (b, kvh, r), item w = (b * Hkv + kvh) * rows + r, kThreads / 32 per CTA.
// Lanes first fold the LSEs of items lane, lane + 32, ... into one ts::OnlineSoftmax each and
// merge them across the warp; then lane l accumulates columns [l * kVec, (l + 1) * kVec) over
// the items. Sequences with a single item were written by paged_decode directly: skipped.
#include "tessera/kvcache_params.cuh"
#include "tessera/math.cuh"
#include "tessera/mma.cuh"
#include "tessera/online_softmax.cuh"
#include "tessera/vec.cuh"

namespace {

using namespace ts;

constexpr int kVec = kHeadDim / kWarpSize;  // columns per lane
static_assert(kHeadDim % kWarpSize == 0 && kVec <= 8, "head dim: a multiple of 32, <= 256");
static_assert(kThreads % kWarpSize == 0, "whole warps");

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) decode_combine(const __grid_constant__ ts::DecodeParams p) {
  const long long w = (long long)blockIdx.x * (kThreads / kWarpSize) + warp_id();
  if (w >= (long long)p.batch * p.heads_kv * p.rows) return;  // whole warps exit together
  const int r = (int)(w % p.rows);
  const int kvh = (int)(w / p.rows % p.heads_kv);
  const int b = (int)(w / ((long long)p.rows * p.heads_kv));
  const int first = p.item_indptr[b];
  const int n = p.item_indptr[b + 1] - first;
  if (n <= 1) return;
  const int lane = lane_id();
  // partial row of item i: (i * Hkv + kvh) * rows + r
  auto part_row = [&](int i) { return ((long long)i * p.heads_kv + kvh) * p.rows + r; };

  OnlineSoftmax st = OnlineSoftmax::empty();
  for (int i = first + lane; i < first + n; i += kWarpSize) st.update(p.lse_partial[part_row(i)] * kLog2e);
  st = warp_allreduce_softmax(st);
  const float shift = softmax_shift(st.m);
  const float inv_d = st.d > 0.0f ? 1.0f / st.d : 0.0f;

  float o[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) o[j] = 0.0f;
  for (int i = first; i < first + n; ++i) {
    const float wgt = exp2_shifted(p.lse_partial[part_row(i)] * kLog2e, shift) * inv_d;
    if (wgt == 0.0f) continue;  // an empty chunk (or one negligible against the others)
    const float* src = p.o_partial + part_row(i) * kHeadDim + lane * kVec;
#pragma unroll
    for (int j = 0; j < kVec; ++j) o[j] += wgt * src[j];
  }

  const int qi = r / p.group;
  const int h = kvh * p.group + r % p.group;
  Elem* dst = static_cast<Elem*>(p.o) + b * p.o_stride_b + qi * p.o_stride_n + h * p.o_stride_h + lane * kVec;
#pragma unroll
  for (int j = 0; j < kVec; j += 2) *reinterpret_cast<uint32_t*>(dst + j) = pack2<Elem>(o[j], o[j + 1]);
  if (p.lse != nullptr && lane == 0) p.lse[((long long)b * p.q_len + qi) * p.heads_q + h] = st.lse();
}
