// mma_sync.cu: device-library test of the sm_80 warp-level tensor-core wrappers of mma.cuh:
// ts::mma_m16n8k16<Elem> (f32 accumulators), ts::pack2<Elem>, ts::ldmatrix_x4,
// ts::ldmatrix_x4_trans and ts::movmatrix_trans.
//
// What it checks. Each CTA is one warp and computes its own product C[16][16] = A[16][16] B[16][16]
// as two m16n8k16 MMAs (n-block 0 = columns 0..7, n-block 1 = columns 8..15), accumulators
// starting at 0. Global memory always holds the canonical layouts: A row-major [m][k], B
// row-major [k][n] (Elem), C row-major [m][n] (f32), tile `blockIdx.x` at offset 256 elements
// per tile. p.mode picks how the fragments are formed (devicelib::verify MmaMode):
//   0 fragments     straight from global memory by the PTX fragment layout (g = lane / 4,
//                   t = lane % 4): A regs {A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]},
//                   B regs {B[2t..2t+1][g], B[2t+8..2t+9][g]}, each pair packed by ts::pack2 from
//                   floats (exact: the values are Elem already);
//   1 ldmatrix      A staged row-major [m][k] and B staged transposed [n][k] in shared memory,
//                   both read with ldmatrix_x4 (the ".col" B operand read as rows of n);
//   2 ldmatrix.trans A staged transposed [k][m] and B staged [k][n], both read with
//                   ldmatrix_x4_trans;
//   3 movmatrix     A as mode 1; B staged [k][n] read with plain ldmatrix_x4 (lane l: row k =
//                   l / 4) and every register transposed in registers with movmatrix_trans.
// The accumulators are stored by the C fragment layout: c0, c1 = C[g][2t..], c2, c3 = C[g+8][2t..].
// A fragment, ldmatrix address or transpose mix-up permutes C and fails the comparison with the
// CPU product (devicelib::reference::matmul).
//
// Shared tiles have rows of kStride = 24 elements (48 bytes: 16-byte aligned as ldmatrix needs,
// but not 32 bytes apart), so a wrong row address reads the wrong data instead of a neighbour's
// copy of it.
//
// Launch (devicelib::verify): grid = p.tiles CTAs, block = 32 threads, no dynamic shared memory.
// Preamble: Elem (ts::f16 or ts::bf16). sm_80+.
#include "tessera/mma.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Elem = ts::f16;
#endif

struct MmaTestParams {
  const Elem* a;  // [tiles][16][16], row-major [m][k]
  const Elem* b;  // [tiles][16][16], row-major [k][n]
  float* c;       // [tiles][16][16], row-major [m][n]
  int tiles;
  int mode;
};
static_assert(sizeof(MmaTestParams) == 32, "devicelib::verify MmaTestParams");


constexpr int kStride = 24;

/// The 32-bit register holding x[lo], x[hi] of a tile in global memory (lo in the low half).
TS_DEVICE uint32_t pair_from_global(const Elem* x, int lo, int hi) {
  return ts::pack2<Elem>(ts::to_float(x[lo]), ts::to_float(x[hi]));
}

extern "C" __global__ void __launch_bounds__(32) devicelib_mma_sync(const __grid_constant__ MmaTestParams p) {
  __shared__ alignas(16) Elem sa[16 * kStride];
  __shared__ alignas(16) Elem sb[16 * kStride];
  const int tile = blockIdx.x;
  const Elem* a = p.a + tile * 256;
  const Elem* b = p.b + tile * 256;
  const int lane = ts::lane_id();
  const int g = lane / 4, t = lane % 4;

  uint32_t af[4];
  uint32_t bf[2][2];  // [n-block][register]
  if (p.mode == 0) {
    af[0] = pair_from_global(a, g * 16 + 2 * t, g * 16 + 2 * t + 1);
    af[1] = pair_from_global(a, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1);
    af[2] = pair_from_global(a, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9);
    af[3] = pair_from_global(a, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9);
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const int n = nb * 8 + g;
      bf[nb][0] = pair_from_global(b, (2 * t) * 16 + n, (2 * t + 1) * 16 + n);
      bf[nb][1] = pair_from_global(b, (2 * t + 8) * 16 + n, (2 * t + 9) * 16 + n);
    }
  } else {
    // Stage: each lane moves 8 elements of A and 8 of B (element e = lane + 32 j, row-major
    // [r][c] of the global tile) into the layout of the mode.
    const bool a_transposed = p.mode == 2;
    const bool b_transposed = p.mode == 1;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = lane + 32 * j;
      const int r = e / 16, c = e % 16;
      sa[a_transposed ? c * kStride + r : r * kStride + c] = a[e];  // A[m = r][k = c]
      sb[b_transposed ? c * kStride + r : r * kStride + c] = b[e];  // B[k = r][n = c]
    }
    __syncwarp();
    // ldmatrix: lane l gives the address of row l % 8 of matrix l / 8.
    const int row = lane % 8, mat = lane / 8;
    if (p.mode == 2) {
      // Stored At[k][m]: matrix j holds k-rows 8 (j / 2) .. +7, m-columns 8 (j % 2) .. +7, so
      // its transpose is the A register j (a0: m 0-7 k 0-7, a1: m 8-15 k 0-7, a2: m 0-7 k 8-15,
      // a3: m 8-15 k 8-15).
      ts::ldmatrix_x4_trans(af, ts::smem_addr(&sa[(8 * (mat / 2) + row) * kStride + 8 * (mat % 2)]));
    } else {
      // Stored A[m][k]: matrix j = rows 8 (j % 2) .., columns 8 (j / 2) ..: A register j.
      ts::ldmatrix_x4(af, ts::smem_addr(&sa[(8 * (mat % 2) + row) * kStride + 8 * (mat / 2)]));
    }
    uint32_t r4[4];
    if (p.mode == 1) {
      // Stored Bt[n][k]: matrix j = n-rows 8 (j / 2) .., k-columns 8 (j % 2) ..; lane l gets
      // Bt[n = l / 4][k = 2 (l % 4) ..] = B[k][n]: register j is b(j % 2) of n-block j / 2.
      ts::ldmatrix_x4(r4, ts::smem_addr(&sb[(8 * (mat / 2) + row) * kStride + 8 * (mat % 2)]));
    } else if (p.mode == 2) {
      // Stored B[k][n]: matrix j = k-rows 8 (j % 2) .., n-columns 8 (j / 2) ..; transposed, lane l
      // gets column n = l / 4, rows k = 2 (l % 4) ..: again b(j % 2) of n-block j / 2.
      ts::ldmatrix_x4_trans(r4, ts::smem_addr(&sb[(8 * (mat % 2) + row) * kStride + 8 * (mat / 2)]));
    } else {
      // Mode 3: as mode 2 without .trans (lane l: row k = l / 4, columns n = 2 (l % 4) ..), then
      // each register transposed by movmatrix (lane l: column n = l / 4, rows k = 2 (l % 4) ..).
      ts::ldmatrix_x4(r4, ts::smem_addr(&sb[(8 * (mat % 2) + row) * kStride + 8 * (mat / 2)]));
#pragma unroll
      for (int j = 0; j < 4; ++j) r4[j] = ts::movmatrix_trans(r4[j]);
    }
    bf[0][0] = r4[0];
    bf[0][1] = r4[1];
    bf[1][0] = r4[2];
    bf[1][1] = r4[3];
  }

  float* c = p.c + tile * 256;
#pragma unroll
  for (int nb = 0; nb < 2; ++nb) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    ts::mma_m16n8k16<Elem>(d, af, bf[nb][0], bf[nb][1]);
    const int col = nb * 8 + 2 * t;
    c[g * 16 + col] = d[0];
    c[g * 16 + col + 1] = d[1];
    c[(g + 8) * 16 + col] = d[2];
    c[(g + 8) * 16 + col + 1] = d[3];
  }
}
