// tessera/attention_params.cuh: the launch parameters every attention-forward kernel takes, and
// the per-(batch, head) addressing and mask rules they share. Mirrored field for field by
// `AttentionParams` in attention/plan.rs (size checked there); change both together.
//
// Problem: O[b, i, h, :] = softmax_j(S[b, h, i, j]) V[b, j, h / group, :] with
//   S = Q[b, i, h, :] . K[b, j, h / group, :] * scale          (group = heads_q / heads_kv)
//   S = softcap * tanh(S / softcap)                              when softcap > 0
//   S = -inf where key j is masked for query i (see ts::AttnMask).
// Accumulation and softmax state in f32; LSE (natural log) = ln sum_j exp(S_ij), -inf when
// every key is masked (then O = 0).
//
// Addressing: strides in elements, the last dimension contiguous.
//   padded batch (cu_seqlens_q == nullptr): row i of sequence b is at b * stride_b + i * stride_n,
//     every sequence has seqlen_q queries and seqlen_k keys;
//   varlen (cu_seqlens_q != nullptr): row i of sequence b is at (cu_seqlens_q[b] + i) * stride_n,
//     lengths are cu_seqlens[b + 1] - cu_seqlens[b]; seqlen_q / seqlen_k are the maxima.
//   LSE: lse[h * lse_stride_h + b * lse_stride_b + row_offset_q + i] with row_offset_q = 0
//     (padded) or cu_seqlens_q[b] (varlen); the host sets the strides for [B, Hq, Nq] or
//     [Hq, total_q].
//   Split-KV partials (num_splits > 1): split s writes its normalised output and LSE to
//     o_partial[((s * heads_q + h) * partial_rows + prow) * head_dim_padded + d] and
//     lse_partial[(s * heads_q + h) * partial_rows + prow], prow = b * seqlen_q + i (padded) or
//     cu_seqlens_q[b] + i (varlen); the combine kernel merges them into o and lse.
//   Hopper tail launch (tail_meta != nullptr): partial_rows rows without a head dimension,
//     o_partial[(s * partial_rows + row) * head_dim_padded + d], lse_partial[s * partial_rows +
//     row], and tail_meta[3 * row .. 3 * row + 2] = {b, h, i} names the output row.
#pragma once
#include "tessera/common.cuh"

namespace ts {

struct AttentionParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;                // nullptr: not requested
  const int* cu_seqlens_q;   // nullptr: padded batch
  const int* cu_seqlens_k;   // nullptr iff cu_seqlens_q is
  float* o_partial;          // split-KV workspace (num_splits > 1), else nullptr
  float* lse_partial;
  long long q_stride_b, q_stride_n, q_stride_h;
  long long k_stride_b, k_stride_n, k_stride_h;
  long long v_stride_b, v_stride_n, v_stride_h;
  long long o_stride_b, o_stride_n, o_stride_h;
  long long lse_stride_b, lse_stride_h;
  long long partial_rows;    // B * seqlen_q (padded) or total_q (varlen); tail launch: its rows
  int batch;
  int heads_q;
  int heads_kv;
  int seqlen_q;              // padded: every sequence; varlen: the maximum
  int seqlen_k;
  int head_dim;              // the real D (the kernel's compiled D may be larger, zero-padded)
  int window_left;           // keys allowed left of the diagonal; -1 = unbounded
  int window_right;          // keys allowed right of the diagonal; -1 = unbounded (causal: 0)
  float scale_log2;          // scale * log2(e), when softcap == 0
  float softcap_scale;       // scale / softcap (the tanh argument factor), when softcap > 0
  float softcap_log2;        // softcap * log2(e), when softcap > 0
  int num_splits;            // 1 = no split-KV
  int q_tiles;               // query tiles per (batch, head) = ceil(seqlen_q / kernel BLOCK_M)
  int head_group;            // Ampere work order: (batch, head) pairs per section (flash_sm80.cu)
  int* tail_meta;            // Hopper tail launch (flash_sm90.cu): {b, h, i} per partial row, b < 0
                             // for rows no item wrote; nullptr otherwise
};

/// One (batch, head) problem after resolving the batch layout.
struct AttnSeq {
  int len_q;                 // queries of this sequence
  int len_k;                 // keys of this sequence
  long long row_q;           // row offset of the sequence's first query (lse / partial rows)
  long long q_off, k_off, v_off, o_off;  // element offsets of (b, row 0, head) in q, k, v, o
};

TS_DEVICE AttnSeq attn_seq(const AttentionParams& p, int b, int h) {
  AttnSeq s;
  const int hk = h / (p.heads_q / p.heads_kv);
  long long start_q, start_k;
  if (p.cu_seqlens_q != nullptr) {
    start_q = p.cu_seqlens_q[b];
    start_k = p.cu_seqlens_k[b];
    s.len_q = p.cu_seqlens_q[b + 1] - (int)start_q;
    s.len_k = p.cu_seqlens_k[b + 1] - (int)start_k;
    s.row_q = start_q;
    s.q_off = start_q * p.q_stride_n;
    s.k_off = start_k * p.k_stride_n;
    s.v_off = start_k * p.v_stride_n;
    s.o_off = start_q * p.o_stride_n;
  } else {
    s.len_q = p.seqlen_q;
    s.len_k = p.seqlen_k;
    s.row_q = (long long)b * p.seqlen_q;
    s.q_off = b * p.q_stride_b;
    s.k_off = b * p.k_stride_b;
    s.v_off = b * p.v_stride_b;
    s.o_off = b * p.o_stride_b;
  }
  s.q_off += h * p.q_stride_h;
  s.k_off += hk * p.k_stride_h;
  s.v_off += hk * p.v_stride_h;
  s.o_off += h * p.o_stride_h;
  return s;
}

/// The key range query i may see, bottom-right aligned as FlashAttention >= 2.1: with
/// shift = len_k - len_q, key j is visible iff
///   j >= i + shift - window_left   (when window_left >= 0) and
///   j <= i + shift + window_right  (when window_right >= 0), and 0 <= j < len_k.
struct AttnMask {
  int shift, left, right, len_k;
  TS_DEVICE static AttnMask of(const AttentionParams& p, const AttnSeq& s) {
    return AttnMask{s.len_k - s.len_q, p.window_left, p.window_right, s.len_k};
  }
  /// First visible key of query i (may exceed last_key: nothing visible).
  TS_DEVICE int first_key(int i) const { return left < 0 ? 0 : max(0, i + shift - left); }
  /// One past the last visible key of query i.
  TS_DEVICE int end_key(int i) const { return right < 0 ? len_k : min(len_k, max(0, i + shift + right + 1)); }
  TS_DEVICE bool visible(int i, int j) const { return j >= first_key(i) && j < end_key(i); }
};

/// Pre-softmax score in the log2 domain from the raw dot product q.k.
TS_DEVICE float attn_score_log2(const AttentionParams& p, float dot) {
  return p.softcap_log2 > 0.0f ? p.softcap_log2 * tanhf(dot * p.softcap_scale) : dot * p.scale_log2;
}

}  // namespace ts
