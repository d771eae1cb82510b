// gemm_glu_interleave.cu: builds the GLU weight layout of gemm::Glu from the concatenated gate
// and up weights, once per weight (plan once, run many):
//   rows (B stored [2N, K], the LLM layout): out[2j + h][c] = in[h N + j][c]   (in = [Wg; Wu])
//   cols (B stored [K, 2N]):                 out[r][2j + h] = in[r][h N + j]   (in = [Wg | Wu])
// for h = 0 (gate), 1 (up). Both matrices contiguous row-major, `rows` x `cols` as stored.
// Elements are moved as kBytes-byte words (any dtype: a copy moves bits).
//
// One thread per output element (grid-stride over rows x cols, 64-bit indices): the writes are
// coalesced, the reads two coalesced streams (rows) or two half-rate strided streams (cols).
// Roofline: a copy, 2 x rows x cols x kBytes bytes; a one-time cost beside any GEMM using it.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_glu_interleave.cu is compiled with a generated preamble (gemm/glu.rs)"
#endif
#include "tessera/common.cuh"

/// Mirrored by `InterleaveParams` in gemm/glu.rs (48 bytes).
struct InterleaveParams {
  const void* src;
  void* dst;
  long long rows, cols;  // of the stored matrices
  long long n;           // N: half of the interleaved dimension
  int interleave_rows;   // 1: rows (B [2N, K]); 0: columns (B [K, 2N])
  int pad_;
};
static_assert(sizeof(InterleaveParams) == 48, "InterleaveParams layout (glu.rs)");

namespace {
constexpr int kThreads = 256;
template <int B> struct WordOf;
template <> struct WordOf<1> { using type = uint8_t; };
template <> struct WordOf<2> { using type = uint16_t; };
template <> struct WordOf<4> { using type = uint32_t; };
template <> struct WordOf<8> { using type = uint64_t; };
using Word = typename WordOf<kBytes>::type;
}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads) gemm_glu_interleave(const __grid_constant__ InterleaveParams p) {
  const Word* src = static_cast<const Word*>(p.src);
  Word* dst = static_cast<Word*>(p.dst);
  const long long total = p.rows * p.cols;
  const long long stride = (long long)gridDim.x * kThreads;
  for (long long i = (long long)blockIdx.x * kThreads + threadIdx.x; i < total; i += stride) {
    const long long r = i / p.cols;
    const long long c = i - r * p.cols;
    long long from;
    if (p.interleave_rows) {
      from = ((r & 1) * p.n + (r >> 1)) * p.cols + c;
    } else {
      from = r * p.cols + (c & 1) * p.n + (c >> 1);
    }
    dst[i] = src[from];
  }
}
