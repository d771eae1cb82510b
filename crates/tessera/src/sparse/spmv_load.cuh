// tessera/spmv_load.cuh: the lane-group and memory helpers of the CSR SpMV kernels
// (spmv_csr.cu, spmv_merge.cu, spmv_panels.cu).
//
// Defines: group_mask<kWidth>() and group_sum<kWidth>(v) (a group of kWidth lanes per row: its
//          shuffle mask, its butterfly sum), load_stream(p) (a read-once load of an index of 64,
//          32 or 16 bits or of a value, evict-first), load_x<Acc>(x, col) (a gathered x element
//          through the read-only path, converted to the accumulate type), store_y(y, row, sum,
//          alpha, beta) (y[row] = alpha * sum + beta * y[row], y not read when beta == 0),
//          skip_requested(skip) (the product's skip flag is set). Generic in the value, index
//          and accumulate types, so it needs no kernel preamble.
#pragma once
#include "tessera/dtype.cuh"

namespace {

/// The lanes of this thread's group of kWidth (a power of two <= 32, aligned in its warp): the
/// only lanes its shuffles name, so groups that returned early are never waited for.
template <int kWidth>
TS_DEVICE unsigned int group_mask() {
  if constexpr (kWidth >= 32) return 0xffffffffu;
  else return ((1u << kWidth) - 1u) << ((threadIdx.x % 32) & ~(kWidth - 1));
}

/// Sum over the kWidth lanes of a group (every lane gets it), butterfly order: a fixed order.
template <int kWidth, class A>
TS_DEVICE A group_sum(A v) {
  const unsigned int mask = group_mask<kWidth>();
#pragma unroll
  for (int m = kWidth / 2; m > 0; m /= 2) v += __shfl_xor_sync(mask, v, m);
  return v;
}

/// A streaming (read-once) load: evict-first in L1 and L2.
template <class T>
TS_DEVICE T load_stream(const T* p) {
  return __ldcs(p);
}
TS_DEVICE ts::f16 load_stream(const ts::f16* p) {
  ts::f16 v;
  v.bits = __ldcs(reinterpret_cast<const unsigned short*>(p));
  return v;
}
TS_DEVICE ts::bf16 load_stream(const ts::bf16* p) {
  ts::bf16 v;
  v.bits = __ldcs(reinterpret_cast<const unsigned short*>(p));
  return v;
}

/// x[col] through the read-only data path (x is gathered, often more than once), as `A`.
template <class A, class V, class I>
TS_DEVICE A load_x(const V* x, I col) {
  if constexpr (ts::is_same_v<V, double> || ts::is_same_v<V, float>) return (A)__ldg(x + col);
  else {
    V v;
    v.bits = __ldg(reinterpret_cast<const unsigned short*>(x) + col);
    return ts::convert<A>(v);
  }
}

/// y[row] = alpha * sum + beta * y[row] in `A`, rounded once to V (y not read when beta == 0:
/// NaN in y is overwritten, as BLAS).
template <class A, class V>
TS_DEVICE void store_y(V* y, long long row, A sum, double alpha, double beta) {
  A out = ts::convert<A>(alpha) * sum;
  if (beta != 0.0) out += ts::convert<A>(beta) * ts::convert<A>(y[row]);
  y[row] = ts::convert<V>(out);
}

/// Whether a product's skip flag (the kernels' `skip` parameter, `SkipIf` on the host) is set;
/// null means never. Nothing writes the flag while the kernels run, so the answer is the same in
/// every thread of the grid and a kernel that returns on it leaves its counters as they were.
TS_DEVICE bool skip_requested(const double* skip) { return skip != nullptr && *skip != 0.0; }

}  // namespace
