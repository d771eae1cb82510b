// wgmma.cuh: warpgroup matrix multiply-accumulate (wgmma, sm_90a) and register reallocation.
//
// Defines: ts::wgmma_desc_sw128 (shared-memory matrix descriptor, 128-byte swizzle),
//          ts::wgmma_desc_advance,
//          ts::wgmma_fence, ts::wgmma_commit, ts::wgmma_wait<N>, ts::wgmma_fence_acc,
//          ts::wgmma_fence_operand,
//          ts::wgmma_ss<Elem, N, kTransB>, ts::wgmma_rs<Elem, N, kTransB> (m64nNk16, f32 +=
//          Elem x Elem), ts::wgmma_ss_kmajor<Elem, N> (K-major operands of every GEMM type:
//          f16, bf16, tf32, fp8e4m3, fp8e5m2, int8), ts::wgmma_k<Elem>, ts::WgmmaAcc<Elem>,
//          ts::setmaxnreg_inc<R> / setmaxnreg_dec<R>.
//
// A warpgroup is 4 consecutive warps starting at a warp index divisible by 4; every wgmma_* call
// is collective over it. One instruction computes D[64 x N] (+)= A[64 x 16] B[16 x N]:
//   * D (f32, N/2 registers per thread): warp w of the group owns rows 16w..16w+15; for each
//     8-column block i, registers 4i+0, 4i+1 hold row 16w + lane/4, columns 8i + 2(lane%4) + {0,1},
//     and 4i+2, 4i+3 the same columns of row 16w + 8 + lane/4 (the mma.sync m16n8 C layout).
//   * A from registers: 4 x 32-bit (2 elements each), the mma.sync m16n8k16 A fragment of the
//     warp's 16 rows: a0 (row g, k 2t..2t+1), a1 (row g+8), a2 (row g, k 8+2t..), a3 (row g+8, k
//     8+2t..), g = lane/4, t = lane%4. So the D registers 8k..8k+7 of one GEMM, packed in pairs,
//     are exactly the A fragment of k-step k of the next GEMM (FlashAttention's P = softmax(S)).
//   * A and B from shared memory: a 64-bit descriptor (wgmma_desc_sw128) of a tile stored as
//     128-byte rows (64 two-byte elements) swizzled as TMA's CU_TENSOR_MAP_SWIZZLE_128B writes them
//     (16-byte chunk c of row r stored at chunk c ^ (r % 8); tiles 1024-byte aligned).
//     K-major operand (kTransB = 0; A is always K-major here): rows are M (or N), the 128-byte row
//     holds 64 consecutive k; one instruction reads 16 k = 32 bytes, so step k by adding 32 bytes to
//     the start address; 8-row groups are 1024 bytes apart (stride byte offset).
//     N-major B (kTransB = 1, e.g. V[key][d] as B[k = key][n = d]): rows are k, the 128-byte row
//     holds 64 consecutive n; 8-row groups of k are 1024 bytes apart (stride byte offset), and the
//     next 64 columns of n sit `leading` bytes further (the next 64-column block of the tile).
//
// Ordering rules (PTX ISA, "Asynchronous warpgroup level matrix multiply-accumulate"):
//   wgmma_fence() before the first wgmma of a batch whenever the accumulator or A registers were
//   written by ordinary instructions; wgmma_commit() closes the batch; wgmma_wait<N>() waits until
//   at most N batches are pending. Until then the accumulators must not be touched; wrap them in
//   wgmma_fence_acc so the compiler does not move reads or writes across the asynchronous window.
#pragma once

#include "tessera/common.cuh"
#include "tessera/dtype.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TS_HAS_WGMMA 1

#include "tessera/wgmma_ops.cuh"

namespace ts {

/// Descriptor of a 128-byte-swizzled shared-memory operand starting at shared address `addr`
/// (bytes); `leading` = byte distance between 64-column blocks for an N-major B (pass 16 for
/// K-major operands, where the field is unused),
/// stride between 8-row groups = 1024 bytes.
TS_DEVICE uint64_t wgmma_desc_sw128(uint32_t addr, uint32_t leading) {
  uint64_t d = 0;
  d |= (uint64_t)((addr & 0x3ffff) >> 4);            // bits 0-13: start address / 16
  d |= (uint64_t)((leading >> 4) & 0x3fff) << 16;    // bits 16-29: leading byte offset / 16
  d |= (uint64_t)(1024 >> 4) << 32;                  // bits 32-45: stride byte offset / 16
  d |= (uint64_t)1 << 62;                            // bits 62-63: 1 = 128-byte swizzle
  return d;
}

/// `desc` moved `bytes` (a multiple of 16) further along its start address: k-steps and column
/// blocks of one tile from one descriptor, with a single 32-bit add (the 14-bit start field
/// cannot carry: every shared address is below 256 KiB).
TS_DEVICE uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = uint32_t(desc) + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | lo;
}

/// Orders earlier register writes before the following wgmma instructions.
TS_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
/// Closes the batch of wgmma instructions issued since the last commit.
TS_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/// Waits until at most N committed batches are still running.
template <int N>
TS_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

/// Pins accumulator registers: the compiler may not move their uses across this point.
template <int R>
TS_DEVICE void wgmma_fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
/// The same for s32 accumulators (int8 operands).
template <int R>
TS_DEVICE void wgmma_fence_acc(int (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

/// Pins the A-operand registers of wgmma_rs calls (K k-steps of 4 words): the compiler may not
/// move their reads or writes across this point (place it after the wgmma_wait that retires them,
/// before they are written again).
template <int K>
TS_DEVICE void wgmma_fence_operand(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(a[k][q])::"memory");
}

/// D[64 x N] (+)= A B, A and B from shared memory (descriptors).
template <typename E, int N, int kTransB>
TS_DEVICE void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(is_same_v<E, f16> || is_same_v<E, bf16>, "wgmma_ss: f16 or bf16");
  static_assert(N == 64 || N == 128 || N == 176 || N == 192 || N == 256, "wgmma_ss: N in {64, 128, 176, 192, 256}");
  constexpr bool h = is_same_v<E, f16>;
  if constexpr (N == 64) {
    if constexpr (h) wgmma_detail::m64n64k16_ss_f16<kTransB>(d, desc_a, desc_b, scale_d);
    else wgmma_detail::m64n64k16_ss_bf16<kTransB>(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 128) {
    if constexpr (h) wgmma_detail::m64n128k16_ss_f16<kTransB>(d, desc_a, desc_b, scale_d);
    else wgmma_detail::m64n128k16_ss_bf16<kTransB>(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 176) {
    if constexpr (h) wgmma_detail::m64n176k16_ss_f16<kTransB>(d, desc_a, desc_b, scale_d);
    else wgmma_detail::m64n176k16_ss_bf16<kTransB>(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 192) {
    if constexpr (h) wgmma_detail::m64n192k16_ss_f16<kTransB>(d, desc_a, desc_b, scale_d);
    else wgmma_detail::m64n192k16_ss_bf16<kTransB>(d, desc_a, desc_b, scale_d);
  } else {
    if constexpr (h) wgmma_detail::m64n256k16_ss_f16<kTransB>(d, desc_a, desc_b, scale_d);
    else wgmma_detail::m64n256k16_ss_bf16<kTransB>(d, desc_a, desc_b, scale_d);
  }
}

/// D[64 x N] (+)= A B, A from registers (the warp's m16k16 fragment), B from shared memory.
template <typename E, int N, int kTransB>
TS_DEVICE void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  static_assert(is_same_v<E, f16> || is_same_v<E, bf16>, "wgmma_rs: f16 or bf16");
  static_assert(N == 64 || N == 128 || N == 176 || N == 192 || N == 256, "wgmma_rs: N in {64, 128, 176, 192, 256}");
  constexpr bool h = is_same_v<E, f16>;
  if constexpr (N == 64) {
    if constexpr (h) wgmma_detail::m64n64k16_rs_f16<kTransB>(d, a, desc_b, scale_d);
    else wgmma_detail::m64n64k16_rs_bf16<kTransB>(d, a, desc_b, scale_d);
  } else if constexpr (N == 128) {
    if constexpr (h) wgmma_detail::m64n128k16_rs_f16<kTransB>(d, a, desc_b, scale_d);
    else wgmma_detail::m64n128k16_rs_bf16<kTransB>(d, a, desc_b, scale_d);
  } else if constexpr (N == 176) {
    if constexpr (h) wgmma_detail::m64n176k16_rs_f16<kTransB>(d, a, desc_b, scale_d);
    else wgmma_detail::m64n176k16_rs_bf16<kTransB>(d, a, desc_b, scale_d);
  } else if constexpr (N == 192) {
    if constexpr (h) wgmma_detail::m64n192k16_rs_f16<kTransB>(d, a, desc_b, scale_d);
    else wgmma_detail::m64n192k16_rs_bf16<kTransB>(d, a, desc_b, scale_d);
  } else {
    if constexpr (h) wgmma_detail::m64n256k16_rs_f16<kTransB>(d, a, desc_b, scale_d);
    else wgmma_detail::m64n256k16_rs_bf16<kTransB>(d, a, desc_b, scale_d);
  }
}

/// Elements of E that one wgmma k-step reads: 32 bytes of each 128-byte row (k16 for 16-bit
/// operands, k8 for tf32, k32 for fp8 and int8), so a k-step always advances a descriptor by 32.
template <typename E>
constexpr int wgmma_k = 32 / int(sizeof(E));

/// The accumulator type of operand type E: int (s32) for int8, float otherwise.
template <typename E>
struct WgmmaAcc {
  using type = float;
};
template <>
struct WgmmaAcc<int8_t> {
  using type = int;
};

/// D[64 x N] (+)= A B with A and B K-major in shared memory, for every GEMM operand type: f16 and
/// bf16 (m64nNk16), float read as tf32 by the tensor core (m64nNk8: the low 13 mantissa bits are
/// ignored), fp8e4m3 / fp8e5m2 (m64nNk32, f32 accumulators), int8 (m64nNk32, s32 accumulators).
/// Only f16 / bf16 have an N-major form (wgmma_ss's kTransB); the others take N in {128, 256}.
template <typename E, int N>
TS_DEVICE void wgmma_ss_kmajor(typename WgmmaAcc<E>::type (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                               int scale_d) {
  if constexpr (sizeof(E) == 2) {
    wgmma_ss<E, N, 0>(d, desc_a, desc_b, scale_d);
  } else {
    static_assert(N == 128 || N == 256, "wgmma_ss_kmajor: N in {128, 256} for tf32, fp8 and int8");
    static_assert(is_same_v<E, float> || is_same_v<E, fp8e4m3> || is_same_v<E, fp8e5m2> || is_same_v<E, int8_t>,
                  "wgmma_ss_kmajor: f16, bf16, float (tf32), fp8e4m3, fp8e5m2 or int8_t");
    constexpr bool wide = N == 256;
    if constexpr (is_same_v<E, float>) {
      if constexpr (wide) wgmma_detail::m64n256k8_ss_tf32(d, desc_a, desc_b, scale_d);
      else wgmma_detail::m64n128k8_ss_tf32(d, desc_a, desc_b, scale_d);
    } else if constexpr (is_same_v<E, fp8e4m3>) {
      if constexpr (wide) wgmma_detail::m64n256k32_ss_e4m3(d, desc_a, desc_b, scale_d);
      else wgmma_detail::m64n128k32_ss_e4m3(d, desc_a, desc_b, scale_d);
    } else if constexpr (is_same_v<E, fp8e5m2>) {
      if constexpr (wide) wgmma_detail::m64n256k32_ss_e5m2(d, desc_a, desc_b, scale_d);
      else wgmma_detail::m64n128k32_ss_e5m2(d, desc_a, desc_b, scale_d);
    } else {
      if constexpr (wide) wgmma_detail::m64n256k32_ss_s8(d, desc_a, desc_b, scale_d);
      else wgmma_detail::m64n128k32_ss_s8(d, desc_a, desc_b, scale_d);
    }
  }
}

/// Raises this warpgroup's register budget to R per thread (collective over the warpgroup; the
/// kernel must be compiled with a register cap, e.g. __launch_bounds__(threads, 1)).
template <int R>
TS_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}
/// Lowers this warpgroup's register budget to R per thread, releasing the rest to the SM.
template <int R>
TS_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

}  // namespace ts

#endif
