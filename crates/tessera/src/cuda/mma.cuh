// tessera/mma.cuh: warp-level tensor-core primitives of sm_80+ (ldmatrix, mma.sync) and the
// register packing their operands need.
//
// Defines: ts::ldmatrix_x4 / ts::ldmatrix_x4_trans (four 8x8 b16 matrices from shared memory),
//          ts::mma_m16n8k16<Elem> (D += A * B, f16 or bf16 inputs, f32 accumulators),
//          ts::MmaAcc<Elem>, ts::mma_k32bytes<Elem> (D += A * B over 32 bytes of k: f16 / bf16
//          m16n8k16, tf32 m16n8k8, int8 and fp8 m16n8k32),
//          ts::mma_m8n8k4_f64 (D += A * B in f64, DMMA),
//          ts::mma_m16n8k8_f64 / ts::mma_m16n8k16_f64 (D += A * B in f64: one sm_90 DMMA; four
//          or eight m8n8k4 before sm_90),
//          ts::pack2<Elem>(lo, hi) (two floats -> one f16x2 / bf16x2 register),
//          ts::pack_a_fragment<Elem> (an accumulator pair packed as the A fragment of the next
//          MMA), ts::quad_row_max (a row's max over the accumulator tile and its lane quad),
//          ts::movmatrix_trans (transposes an 8x8 b16 matrix held in registers),
//          ts::exp2_row<kClamp> (a row of score accumulators to probabilities, in place),
//          ts::lane_row_sum (the lane's part of a row's sum).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
// t = lane % 4:
//   A (16 x 16, row major), 4 registers of 2 elements:
//     a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col": each column n stored k-contiguous), 2 registers:
//     b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]
//   C/D (16 x 8, f32), 4 registers: c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]
// ldmatrix.x4: lane l gives the shared address (ts::smem_addr, async_copy.cuh) of row (l % 8)
// of matrix (l / 8), 16 bytes each; result register j holds matrix j with lane l owning row
// l / 4, elements 2(l % 4) and 2(l % 4) + 1 (with .trans: column l / 4, rows 2(l % 4) and
// 2(l % 4) + 1), which is exactly an A register, or a B register of a row-major [n][k] (plain)
// or [k][n] (.trans) tile.
// An m16n8k16 accumulator pair covering 16 consecutive columns is therefore, after pack2, the
// A fragment of the next MMA (FlashAttention keeps P in registers this way).
#pragma once
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/async_copy.cuh"
#include "tessera/online_softmax.cuh"  // ts::exp2_fma, ts::shfl_xor, ts::max_nan

namespace ts {

/// Loads four 8x8 matrices of 16-bit elements (one 16-byte row address per lane, see above).
TS_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// As ldmatrix_x4, each matrix transposed (B operands from a row-major [k][n] tile).
TS_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// Transposes an 8x8 matrix of 16-bit elements held one register per lane (lane l: row l / 4,
/// elements 2(l % 4) and 2(l % 4) + 1, the layout of ldmatrix and of a packed accumulator pair):
/// afterwards lane l holds column l / 4, rows 2(l % 4) and 2(l % 4) + 1. A packed accumulator
/// block C[m][n] (8 of its rows) thereby becomes a B register of a following MMA whose k runs
/// over C's m: B[k = m][n] = C[m][n] (paged decode: S^T's keys become the k of V^T P^T). sm_75+.
TS_DEVICE uint32_t movmatrix_trans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}

/// d += a * b for one m16n8k16 tile, f32 accumulators, Elem = ts::f16 or ts::bf16 inputs.
template <typename Elem>
TS_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  static_assert(is_same_v<Elem, f16> || is_same_v<Elem, bf16>, "mma_m16n8k16: f16 or bf16");
  if constexpr (is_same_v<Elem, f16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// Four fp8 bytes (byte 0 lowest) -> two f16x2 registers, lo = bytes 0, 1 and hi = bytes 2, 3,
/// exactly: e4m3 by cvt (sm_89+), e5m2 as the high byte of an f16.
template <typename Elem>
TS_DEVICE void fp8x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (is_same_v<Elem, fp8e4m3>) {
    e4m3x4_to_f16x4(w, lo, hi);
  } else {
    lo = __byte_perm(w, 0u, 0x1404);  // (0, byte 0, 0, byte 1)
    hi = __byte_perm(w, 0u, 0x3424);  // (0, byte 2, 0, byte 3)
  }
}

/// The mma accumulator of an operand type: s32 for int8, f32 otherwise.
template <typename Elem>
using MmaAcc = conditional_t<is_same_v<Elem, int8_t>, int, float>;

/// d += a * b over 32 bytes of k for one m16 x n8 tile: m16n8k16 for f16 / bf16, m16n8k8 .tf32
/// for float (its low 13 mantissa bits are ignored), m16n8k32 for int8 (s32 accumulate, wrapping)
/// and for fp8 e4m3 / e5m2 (sm_89+). The fragments of the four shapes cover the same bytes of
/// K-major operands (gemm_sm80.cu), so one ldmatrix addressing feeds each.
template <typename Elem>
TS_DEVICE void mma_k32bytes(MmaAcc<Elem> (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (is_same_v<Elem, f16> || is_same_v<Elem, bf16>) {
    mma_m16n8k16<Elem>(d, a, b0, b1);
  } else if constexpr (is_same_v<Elem, float>) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else if constexpr (is_same_v<Elem, int8_t>) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(is_same_v<Elem, fp8e4m3> || is_same_v<Elem, fp8e5m2>, "mma_k32bytes: f16, bf16, tf32, int8, fp8");
#if __CUDA_ARCH__ >= 900
    // sm_90 runs fp8 on wgmma only; ptxas emulates fp8 mma.sync (and spills). Instead: each fp8
    // register (4 k values) becomes two f16x2 (exact), and two f16 m16n8k16 take the low and high
    // pairs. A thread's k slot 2t of the f16 shape then holds k 4t (and 16 + 4t) in A and in B
    // alike, so the reduction over k is the same sum in another order.
    uint32_t alo[4], ahi[4], blo[2], bhi[2];
#pragma unroll
    for (int j = 0; j < 4; ++j) fp8x4_to_f16x4<Elem>(a[j], alo[j], ahi[j]);
    fp8x4_to_f16x4<Elem>(b0, blo[0], bhi[0]);
    fp8x4_to_f16x4<Elem>(b1, blo[1], bhi[1]);
    mma_m16n8k16<f16>(d, alo, blo[0], blo[1]);
    mma_m16n8k16<f16>(d, ahi, bhi[0], bhi[1]);
#elif __CUDA_ARCH__ >= 890
    if constexpr (is_same_v<Elem, fp8e4m3>) {
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
#else
    static_assert(sizeof(Elem) == 0, "fp8 mma.sync needs sm_89 or newer (the plan builds no fp8 variant below)");
#endif
  }
}

/// d += a * b for one m8n8k4 tile of f64 (DMMA, sm_80+), with g = lane / 4 and t = lane % 4:
/// a = A[g][t] (8 x 4, row major), b = B[t][g] (4 x 8, "col"), d = {D[g][2t], D[g][2t + 1]}.
TS_DEVICE void mma_m8n8k4_f64(double (&d)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
               : "+d"(d[0]), "+d"(d[1])
               : "d"(a), "d"(b));
}

/// d += a * b for one m16n8k8 tile of f64, with g = lane / 4 and t = lane % 4 (PTX ISA,
/// "Matrix Fragments for mma.m16n8k8" of .f64; CUTLASS's SM90_16x8x8_F64F64F64F64_TN traits):
///   a[2c + h] = A[g + 8h][t + 4c]   (16 x 8, row major; h, c in {0, 1})
///   b[c]      = B[t + 4c][g]        (8 x 8, "col")
///   d[2h + e] = D[g + 8h][2t + e]   (16 x 8)
/// sm_90+ has the shape (PTX ISA 7.8): one DMMA instruction. Before sm_90 the same registers
/// feed four m8n8k4 DMMAs (a = A[g][t], b = B[t][g], d = D[g][2t, 2t + 1]): rows g (h = 0) and
/// g + 8 (h = 1) times k slice c, which sums the same products (in another order).
TS_DEVICE void mma_m16n8k8_f64(double (&d)[4], const double (&a)[4], const double (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
#else
  double lo[2] = {d[0], d[1]};
  double hi[2] = {d[2], d[3]};
  mma_m8n8k4_f64(lo, a[0], b[0]);
  mma_m8n8k4_f64(hi, a[1], b[0]);
  mma_m8n8k4_f64(lo, a[2], b[1]);
  mma_m8n8k4_f64(hi, a[3], b[1]);
  d[0] = lo[0];
  d[1] = lo[1];
  d[2] = hi[0];
  d[3] = hi[1];
#endif
}

/// d += a * b for one m16n8k16 tile of f64 (PTX ISA, "Matrix Fragments for mma.m16n8k16" of
/// .f64; CUTLASS's SM90_16x8x16_F64F64F64F64_TN traits), g = lane / 4, t = lane % 4:
///   a[2c + h] = A[g + 8h][t + 4c]   (16 x 16, row major; h in {0, 1}, c in 0..3)
///   b[c]      = B[t + 4c][g]        (16 x 8, "col")
///   d[2h + e] = D[g + 8h][2t + e]   (16 x 8)
/// One DMMA on sm_90+; before, two mma_m16n8k8_f64 (k = t + 4c for c = 0, 1, then c = 2, 3:
/// a[0..3], b[0..1] and a[4..7], b[2..3] are exactly their fragments).
TS_DEVICE void mma_m16n8k16_f64(double (&d)[4], const double (&a)[8], const double (&b)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, %11}, "
      "{%12, %13, %14, %15}, {%0, %1, %2, %3};"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]), "d"(b[0]),
        "d"(b[1]), "d"(b[2]), "d"(b[3]));
#else
  const double a0[4] = {a[0], a[1], a[2], a[3]};
  const double a1[4] = {a[4], a[5], a[6], a[7]};
  const double b0[2] = {b[0], b[1]};
  const double b1[2] = {b[2], b[3]};
  mma_m16n8k8_f64(d, a0, b0);
  mma_m16n8k8_f64(d, a1, b1);
#endif
}

/// Two floats -> one register of two Elem (lo in the low half, as in memory), round to nearest.
template <typename Elem>
TS_DEVICE uint32_t pack2(float lo, float hi) {
  static_assert(is_same_v<Elem, f16> || is_same_v<Elem, bf16>, "pack2: f16 or bf16");
  if constexpr (is_same_v<Elem, f16>) {
    return pack_f16x2(lo, hi);
  } else {
    return pack_bf16x2(lo, hi);
  }
}

/// The A fragment of k16 step kk of a following MMA from one m16 row block of accumulators
/// (n8 blocks 2 kk and 2 kk + 1 of c, f32), packed to Elem: FlashAttention's P in registers.
template <typename Elem, int kBlocks>
TS_DEVICE void pack_a_fragment(uint32_t (&a)[4], const float (&c)[kBlocks][4], int kk) {
  a[0] = pack2<Elem>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<Elem>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<Elem>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<Elem>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/// NaN-propagating max of row g (r = 0: elements 0, 1 of every n8 block) or g + 8 (r = 1:
/// elements 2, 3) of one m16 row block of accumulators, over all kBlocks n8 blocks: the lane's
/// own elements, then the 4 lanes of its quad (which hold the row's other columns).
template <int kBlocks>
TS_DEVICE float quad_row_max(const float (&c)[kBlocks][4], int r) {
  float mx = kNegInf;
#pragma unroll
  for (int nb = 0; nb < kBlocks; ++nb) mx = max_nan(mx, max_nan(c[nb][2 * r], c[nb][2 * r + 1]));
  mx = max_nan(mx, shfl_xor(mx, 1));
  return max_nan(mx, shfl_xor(mx, 2));
}

/// Row r of one m16 row block's accumulator tile of scores, turned into probabilities in place:
/// c = 2^(c * scale + neg_shift) (ts::exp2_fma, clamped at 2^1, or without the clamp when
/// !kClamp: ts::exp2_fma_unclamped), over all kBlocks n8 blocks. Returns the lane's part of the
/// row sum (the other lanes of its quad hold the rest). `then(nb, c)` sees each probability
/// after it is summed (paged_decode.cu scales it by its fp8 V scale there).
struct NoThen {
  TS_DEVICE void operator()(int, float&) const {}
};
template <bool kClamp, int kBlocks, typename Then = NoThen>
TS_DEVICE float exp2_row(float (&c)[kBlocks][4], int r, float scale, float neg_shift, Then then = {}) {
  float sum = 0.0f;
#pragma unroll
  for (int nb = 0; nb < kBlocks; ++nb)
#pragma unroll
    for (int e = 2 * r; e < 2 * r + 2; ++e) {
      c[nb][e] = kClamp ? exp2_fma(c[nb][e], scale, neg_shift) : exp2_fma_unclamped(c[nb][e], scale, neg_shift);
      // the first term starts the sum (0 + x is an FADD that ptxas keeps: 0 + -0 is +0)
      sum = nb == 0 && e == 2 * r ? c[nb][e] : sum + c[nb][e];
      then(nb, c[nb][e]);
    }
  return sum;
}

/// The lane's part of row r's sum over one row block's accumulator tile, in exp2_row's order (so
/// the same value bit for bit as exp2_row returned for these probabilities).
template <int kBlocks>
TS_DEVICE float lane_row_sum(const float (&c)[kBlocks][4], int r) {
  float sum = c[0][2 * r];
#pragma unroll
  for (int nb = 0; nb < kBlocks; ++nb)
#pragma unroll
    for (int e = 2 * r; e < 2 * r + 2; ++e)
      if (nb > 0 || e > 2 * r) sum += c[nb][e];
  return sum;
}

}  // namespace ts
