// append.cu: writes new K and V rows of a whole batch into a paged KV cache in one launch.
//
// Input: K and V [N, Hkv, D] (any row and head strides, the last dim contiguous) of dtype In,
// packed by sequence: rows append_indptr[b] .. append_indptr[b + 1] belong to sequence b, whose
// length seq_lens[b] already counts them. Row i of sequence b goes to logical position
//   t = seq_lens[b] - n_b + (i - append_indptr[b]),   n_b = append_indptr[b + 1] - append_indptr[b]
// i.e. page page_indices[page_indptr[b] + t / T], offset t % T (kvcache_params.cuh), K in half 0
// and V in half 1 of the page. Decode (one row per sequence) and chunked prefill (many) alike.
//
// Work: one thread per 16-byte chunk of 8 input elements (vector path: pointers 16-byte aligned,
// strides and D multiples of 8) or per element (scalar path), over (row, K|V, head, chunk);
// the row's sequence is found by a binary search in append_indptr (B + 1 entries, L1-resident).
// An fp8 cache stores round(x / scale) with the page's scale for (head, K|V), saturated to
// +-448 (e4m3's largest finite value).
//
// Roofline: reads and writes N * Hkv * D * 2 elements once; for a decode step (N = batch) the
// launch itself dominates.
#include "tessera/dtype.cuh"
#include "tessera/kvcache_params.cuh"
#include "tessera/vec.cuh"

namespace {

using namespace ts;

constexpr int kFp8 = is_same_v<Cache, fp8e4m3>;
static_assert(kFp8 || is_same_v<Cache, In>, "the cache stores the input dtype or e4m3");

/// Two In elements of a 32-bit word -> two floats.
TS_DEVICE Array<float, 2> unpack_in(uint32_t w) {
  if constexpr (is_same_v<In, f16>) return unpack_f16x2(w);
  else return unpack_bf16x2(w);
}

/// The sequence owning packed row i: the last b with append_indptr[b] <= i.
TS_DEVICE int sequence_of(const int* indptr, int batch, int i) {
  int lo = 0;
  int hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(indptr + mid) <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/// Element offset in the cache of (row i of the input, K|V half kv, head h, column 0).
struct Slot {
  long long offset;  // elements
  int page;
};

TS_DEVICE Slot slot_of(const AppendParams& p, int i, int kv, int h) {
  const int b = sequence_of(p.append_indptr, p.batch, i);
  const int first = __ldg(p.append_indptr + b);
  const int n_b = __ldg(p.append_indptr + b + 1) - first;
  const int t = __ldg(p.tables.seq_lens + b) - n_b + (i - first);
  const int page = __ldg(p.tables.page_indices + __ldg(p.tables.page_indptr + b) + t / p.page_size);
  const long long off = (((long long)page * 2 + kv) * p.page_size + t % p.page_size) * p.heads_kv + h;
  return Slot{off * p.head_dim, page};
}

TS_DEVICE float inv_scale_of(const AppendParams& p, int page, int h, int kv) {
  return kFp8 ? 1.0f / p.scales[((long long)page * p.heads_kv + h) * 2 + kv] : 1.0f;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) paged_append(const __grid_constant__ ts::AppendParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  ts::allow_dependent_grids();
  const long long idx = (long long)blockIdx.x * kThreads + threadIdx.x;
  const int per_row = p.vector_ok ? p.head_dim / 8 : p.head_dim;  // work units per (row, kv, head)
  const long long units = (long long)p.tokens * 2 * p.heads_kv * per_row;
  if (idx >= units) return;
  const int u = (int)(idx % per_row);
  const int h = (int)(idx / per_row % p.heads_kv);
  const int kv = (int)(idx / ((long long)per_row * p.heads_kv) % 2);
  const int i = (int)(idx / ((long long)per_row * p.heads_kv * 2));
  const In* src = static_cast<const In*>(kv == 0 ? p.k : p.v) + (long long)i * (kv == 0 ? p.k_stride_n : p.v_stride_n) +
                  (long long)h * (kv == 0 ? p.k_stride_h : p.v_stride_h);
  const Slot s = slot_of(p, i, kv, h);
  Cache* dst = static_cast<Cache*>(p.cache) + s.offset;
  if (p.vector_ok) {
    const U32x4 x = ld_global_b128(src + u * 8);
    if constexpr (kFp8) {
      const float inv = inv_scale_of(p, s.page, h, kv);
      const uint32_t w[4] = {x.x, x.y, x.z, x.w};
      uint32_t packed[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const Array<float, 2> a = unpack_in(w[2 * j]);
        const Array<float, 2> c = unpack_in(w[2 * j + 1]);
        packed[j] = (uint32_t)pack_e4m3x2(a[0] * inv, a[1] * inv) | ((uint32_t)pack_e4m3x2(c[0] * inv, c[1] * inv) << 16);
      }
      st_global_b64(dst + u * 8, U32x2{packed[0], packed[1]});
    } else {
      st_global_b128(dst + u * 8, x);
    }
  } else {
    dst[u] = from_float<Cache>(to_float(src[u]) * inv_scale_of(p, s.page, h, kv));
  }
}
