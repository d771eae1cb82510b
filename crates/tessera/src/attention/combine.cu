// combine.cu: merges the split-KV partials of the attention forward kernels.
//
// Split s of num_splits wrote, for every query row and head, its normalised partial output
// o_s (f32, kHeadDim columns of which p.head_dim hold data) and its natural-log LSE lse_s
// (-inf when the split saw no visible key; then o_s = 0). The merge is the online-softmax rule:
//   lse = ln sum_s e^(lse_s)            (computed as m + ln sum_s e^(lse_s - m), m = max_s lse_s)
//   O   = sum_s e^(lse_s - lse) o_s      (Elem; only the first p.head_dim columns are stored)
// and lse is written when p.lse. A row that no split saw (m = -inf) gets O = 0 and LSE = -inf.
//
// Work: one warp per (partial row, head), item w = row * Hq + h, kThreads / 32 items per CTA,
// grid ceil(partial_rows * Hq / (kThreads / 32)) (plan.rs `run`). Lane l reads the LSEs of
// splits l, l + 32 (<= MAX_SPLITS = 64) and covers the kHeadDim / 32 contiguous columns
// [l * kVec, (l + 1) * kVec) of every split's partial row.
// Partial layout (attention_params.cuh): o_partial[((s * Hq + h) * partial_rows + row) *
// kHeadDim + d], lse_partial[(s * Hq + h) * partial_rows + row], row = b * seqlen_q + i (padded)
// or the packed row (varlen). Hopper tail launch (p.tail_meta != nullptr): one warp per partial
// row (no head dimension), o_partial[(s * partial_rows + row) * kHeadDim + d], and tail_meta
// names the row's (b, h, i); rows with b < 0 or i past the sequence are skipped.
#include "tessera/attention_params.cuh"
#include "tessera/math.cuh"
#include "tessera/online_softmax.cuh"
#include "tessera/reduce.cuh"

namespace {

using namespace ts;

constexpr int kVec = kHeadDim / kWarpSize;  // columns per lane
constexpr int kMaxSplits = 2 * kWarpSize;    // splits one warp's LSE reads cover
static_assert(kHeadDim % kWarpSize == 0 && kHeadDim <= 256, "compiled head dim: a multiple of 32, <= 256");
static_assert(kThreads % kWarpSize == 0, "whole warps");

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) flash_combine(const __grid_constant__ ts::AttentionParams p) {
  const bool tail = p.tail_meta != nullptr;
  const int heads = tail ? 1 : p.heads_q;  // head dimension of the partial layout
  const long long item = (long long)blockIdx.x * (kThreads / kWarpSize) + warp_id();
  if (item >= p.partial_rows * heads) return;  // whole warps exit together
  const long long row = item / heads;
  int h = (int)(item % heads);
  long long tail_o_off = 0, tail_lse_off = 0;
  if (tail) {
    // the row's place; rows no item wrote (b < 0) or past their sequence hold no partials
    const int b = p.tail_meta[3 * row];
    h = p.tail_meta[3 * row + 1];
    const int i = p.tail_meta[3 * row + 2];
    if (b < 0) return;  // warp-uniform, like every exit here
    const AttnSeq seq = attn_seq(p, b, h);
    if (i >= seq.len_q) return;
    tail_o_off = seq.o_off - h * p.o_stride_h + (long long)i * p.o_stride_n;
    tail_lse_off = (p.cu_seqlens_q != nullptr ? seq.row_q : (long long)b * p.lse_stride_b) + i;
  }
  const int lane = lane_id();
  const int splits = min(p.num_splits, kMaxSplits);
  const long long split_stride = (long long)heads * p.partial_rows;  // rows between splits
  const long long first = (tail ? 0 : (long long)h * p.partial_rows) + row;  // split 0's row

  // lse = m + ln sum_s 2^((lse_s - m) log2 e), in the log2 domain
  float x[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int s = lane + k * kWarpSize;
    x[k] = s < splits ? p.lse_partial[first + s * split_stride] * kLog2e : kNegInf;
  }
  const float m = warp_allreduce_max(max_nan(x[0], x[1]));
  const float shift = softmax_shift(m);
  const float sum = warp_allreduce_sum(exp2_shifted(x[0], shift) + exp2_shifted(x[1], shift));
  const float inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;

  float o[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) o[j] = 0.0f;
  for (int s = 0; s < splits; ++s) {
    // every lane needs split s's weight: it lives in lane s % 32, slot s / 32
    const float xs = __shfl_sync(kFullMask, s < kWarpSize ? x[0] : x[1], s % kWarpSize);
    const float w = exp2_shifted(xs, shift) * inv_sum;
    if (w == 0.0f) continue;  // an empty split (or one negligible against the others)
    const float* src = p.o_partial + (first + s * split_stride) * kHeadDim + lane * kVec;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (lane * kVec + j < p.head_dim) o[j] += w * src[j];  // the padding columns were never written
    }
  }

  // output row: from tail_meta, else row = b * seqlen_q + i (padded) or the packed row (varlen)
  long long o_off;
  long long lse_off;
  if (tail) {
    o_off = tail_o_off;
    lse_off = tail_lse_off;
  } else if (p.cu_seqlens_q != nullptr) {
    o_off = row * p.o_stride_n;
    lse_off = row;
  } else {
    const long long b = row / p.seqlen_q;
    const long long i = row % p.seqlen_q;
    o_off = b * p.o_stride_b + i * p.o_stride_n;
    lse_off = b * p.lse_stride_b + i;
  }
  Elem* dst = static_cast<Elem*>(p.o) + o_off + h * p.o_stride_h;
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int c = lane * kVec + j;
    if (c < p.head_dim) dst[c] = from_float<Elem>(o[j]);
  }
  if (p.lse != nullptr && lane == 0) {
    // ln sum = (m + log2 sum) ln 2; m = -inf (no split saw a key) gives -inf
    p.lse[h * p.lse_stride_h + lse_off] = OnlineSoftmax{m, sum}.lse();
  }
}
