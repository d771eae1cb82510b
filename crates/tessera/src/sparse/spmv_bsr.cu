// spmv_bsr.cu: y = alpha * A x + beta * y for a block-sparse A (BSR or Blocked-ELL, square
// kBlock x kBlock blocks; sparse/bsr.rs launches it), deterministic.
//
// Layout. As spmm_bsr.cu (the same BsrParams: x in `b`, y in `c`, n = 1): block k's values
// row-major at values + k * kBlock^2; BSR when ell_width == 0, else Blocked-ELL with -1 padding
// slots last in each block row. x is never read past cols, y never written past rows. Sums in
// Acc (double for double, else float), in a fixed order: bitwise reproducible. beta == 0 does
// not read y.
//
// Work mapping. A warp per block row. kLanes = 32 / kBlock lanes per row of the block row
// (adjacent lanes): lane l takes row i = l / kLanes and, of the row's (block, column) pairs
// taken in order, every kLanes-th from l % kLanes; the kLanes partial sums of a row are reduced
// with shuffles and the first lane writes y. kBlockThreads / 32 block rows per CTA. No shared
// memory.
//
// Roofline. Memory bound: every stored value (padding inside blocks included) once, x gathered
// per (block, column) pair (from L1/L2: kBlock consecutive elements per block), y once.
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Val = float;
using Idx = int;
constexpr int kBlock = 16;
constexpr int kBlockThreads = 256;
#endif

using Acc = ts::conditional_t<ts::is_same_v<Val, double>, double, float>;
constexpr int kWarps = kBlockThreads / 32;
constexpr int kLanes = 32 / kBlock;  // lanes per row of a block row
static_assert(kBlock == 2 || kBlock == 4 || kBlock == 8 || kBlock == 16 || kBlock == 32, "kBlock: 2..32, power of 2");

struct BsrParams {
  const Idx* block_offsets;
  const Idx* block_indices;
  const Val* values;
  const Val* b;  // x
  Val* c;        // y
  long long rows;
  long long cols;
  long long n;
  long long ldb;
  long long ldc;
  long long block_rows;
  long long ell_width;
  double alpha;
  double beta;
};
static_assert(sizeof(BsrParams) == 112, "BsrParams and its Rust mirror (bsr.rs) differ");

extern "C" __global__ void __launch_bounds__(kBlockThreads) spmv_bsr(const __grid_constant__ BsrParams p) {
  const long long br = (long long)blockIdx.x * kWarps + threadIdx.x / 32;
  if (br >= p.block_rows) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const int i = lane / kLanes, s = lane % kLanes;
  long long begin, end;
  if (p.ell_width > 0) {
    begin = br * p.ell_width;
    end = begin + p.ell_width;
  } else {
    begin = (long long)p.block_offsets[br];
    end = (long long)p.block_offsets[br + 1];
  }
  Acc sum = 0;
  const long long pairs = (end - begin) * kBlock;
  for (long long q = s; q < pairs; q += kLanes) {
    const long long k = begin + q / kBlock;
    const int j = (int)(q % kBlock);
    const long long bc = (long long)p.block_indices[k];
    if (bc < 0) break;  // Blocked-ELL padding: the rest of the row is padding too
    const long long col = bc * kBlock + j;
    if (col < p.cols) sum += ts::convert<Acc>(p.values[k * (kBlock * kBlock) + i * kBlock + j]) * ts::convert<Acc>(p.b[col]);
  }
#pragma unroll
  for (int m = kLanes / 2; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
  const long long row = br * kBlock + i;
  if (s == 0 && row < p.rows) {
    Acc out = (Acc)p.alpha * sum;
    if (p.beta != 0.0) out += (Acc)p.beta * ts::convert<Acc>(p.c[row]);
    p.c[row] = ts::convert<Val>(out);
  }
}
