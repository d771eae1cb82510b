// tessera/kvcache_params.cuh: launch parameters of the paged KV cache kernels (append and the
// two paged decode kernels). Mirrored field for field by `AppendParams` and `DecodeParams` in
// kvcache/{append,decode}.rs (sizes checked there); change both together.
//
// Cache of one layer: [P][2][T][Hkv][D] elements of the cache dtype (K then V of a page
// adjacent, FlashInfer's "NHD" page layout). Logical token t of sequence b lives in page
// page_indices[page_indptr[b] + t / T] at offset t % T. An fp8 cache carries one f32 scale per
// (page, KV head, K|V), stored [P][Hkv][2]: stored = round(x / scale), read = stored * scale.
#pragma once
#include "tessera/common.cuh"

namespace ts {

/// Block tables of a batch in CSR form (FlashInfer's indptr / indices) plus the lengths.
struct PagedTables {
  const int* page_indptr;   // [B + 1]: sequence b owns page_indices[page_indptr[b] .. page_indptr[b + 1])
  const int* page_indices;  // physical page ids, each < num_pages
  const int* seq_lens;      // [B]: tokens in the cache per sequence (including new ones)
};

/// Appends new K/V rows: token i of the packed [N, Hkv, D] inputs belongs to sequence b with
/// append_indptr[b] <= i < append_indptr[b + 1] and goes to logical position
/// seq_lens[b] - (append_indptr[b + 1] - append_indptr[b]) + (i - append_indptr[b]).
struct AppendParams {
  const void* k;             // [N, Hkv, D] input dtype
  const void* v;
  void* cache;               // [P][2][T][Hkv][D] cache dtype
  float* scales;             // fp8: [P][Hkv][2]; else nullptr
  PagedTables tables;
  const int* append_indptr;  // [B + 1]
  long long k_stride_n, k_stride_h;
  long long v_stride_n, v_stride_h;
  int batch;
  int tokens;                // N
  int heads_kv;
  int head_dim;
  int page_size;
  int vector_ok;             // 1: 16-byte vector path (aligned pointers and strides)
};

/// Paged GQA decode. Query rows of a (sequence b, KV head kvh): r = qi * group + hh for query
/// token qi < q_len and query head h = kvh * group + hh. Query token qi sits at position
/// seq_lens[b] - q_len + qi and sees keys 0 ..= that position (causal, speculative decoding).
/// Work item x (blockIdx.y) is chunk k = item_seq[num_items + x] of sequence b = item_seq[x]:
/// keys [k * chunk_tokens, (k + 1) * chunk_tokens), the last chunk of a sequence running to its
/// end. A sequence with one item writes o / lse directly; otherwise its items write normalised
/// partials to slot s = item_indptr[b] + k:
///   o_partial[((s * heads_kv + kvh) * rows + r) * D + d], lse_partial[(s * heads_kv + kvh) * rows + r]
/// and count themselves in chunk_counters[(b * heads_kv + kvh) * row_groups + row_group]; the
/// last to arrive merges the partials and sets the counter back to 0 (so the counters are all 0
/// between launches, as the plan allocated them).
struct DecodeParams {
  const void* q;             // [B, q_len, Hq, D] Elem
  void* o;                   // [B, q_len, Hq, D] Elem
  float* lse;                // [B, q_len, Hq] contiguous, or nullptr
  const void* cache;         // [P][2][T][Hkv][D] cache dtype
  const float* scales;       // fp8: [P][Hkv][2]; else nullptr
  PagedTables tables;
  const int* item_seq;       // [items] sequence ids, then [items] chunk indices
  const int* item_indptr;    // [B + 1]
  float* o_partial;          // workspace (nullptr when no sequence has two items)
  float* lse_partial;
  unsigned int* chunk_counters;  // [B * heads_kv * row_groups], all 0 at launch (nullptr without splits)
  long long q_stride_b, q_stride_n, q_stride_h;
  long long o_stride_b, o_stride_n, o_stride_h;
  int batch;
  int heads_q;
  int heads_kv;
  int group;                 // heads_q / heads_kv
  int q_len;                 // query tokens per sequence (1, or up to 8 for speculative decoding)
  int rows;                  // group * q_len
  int chunk_tokens;          // a multiple of the kernel's tile
  int num_items;
  float scale_log2;          // softmax scale * log2(e)
  int pad_;
};

}  // namespace ts
