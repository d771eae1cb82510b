// async_copy.cuh: asynchronous global -> shared copies (cp.async, sm_80+).
//
// `cp_async_16` starts a 16-byte copy that bypasses registers (LDGSTS); a thread may start many
// before waiting, so one thread keeps far more bytes in flight than with ordinary loads.
// `cp_async_commit` closes the group of copies started so far; `cp_async_wait_all` waits for
// every group of this thread, cp_async_wait<N> for all but the N most recent groups
// (cp_async_wait_pending(n) the same with n folded to a constant in an unrolled loop).
// cp_async_16_zfill zero-fills a chunk whose source lies beyond a tensor's end (cp_async_16_zfill_at:
// at a compile-time offset from both addresses; cp_async_16_zfill_bytes: a partial chunk;
// cp_async_8 / cp_async_8_zfill: one 8-byte element, e.g. a double). The copied data
// is visible to other threads only after a barrier that follows the wait.
//
// Both addresses must be 16-byte aligned (8-byte aligned for the 8-byte copies). `.cg` caches
// the line in L2 only (streamed data).
// `cp_async_16_hint` gives the lines it brings into L2 an eviction priority (`l2_policy`: evict
// first for data read once, evict last for data many CTAs re-read; createpolicy, sm_80+).
// `prefetch_l2_bulk` (sm_90+) asks for a contiguous range to be brought into L2, without a
// destination or a wait.
#pragma once

#include "tessera/common.cuh"

namespace ts {

/// The 32-bit shared-state-space address of a generic pointer into shared memory.
TS_DEVICE uint32_t smem_addr(const void* p) {
  uint64_t s;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(p));
  return (uint32_t)s;
}

/// Starts a 16-byte copy from global `src` to shared `dst` (both 16-byte aligned).
TS_DEVICE void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

/// As cp_async_16, to the 32-bit shared address `dst` (ts::smem_addr).
TS_DEVICE void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

/// As cp_async_16 to the shared address `dst`, but copies 16 bytes only when `valid` and
/// otherwise writes 16 zero bytes without reading `src` (the src-size operand is 0; PTX ISA,
/// cp.async): tails of a tile are zero-filled by the same instruction, and `src` may then point
/// past the tensor (no select of a safe address per copy).
TS_DEVICE void cp_async_16_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

/// As cp_async_16_zfill, copying only the first `bytes` (0..16) bytes of the chunk and zero-filling
/// the rest (a row's ragged end: the source is never read past `src + bytes`).
TS_DEVICE void cp_async_16_zfill_bytes(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

/// cp_async_16_zfill of the chunk kOffset bytes past both `dst` and `src` (kOffset a multiple
/// of 16). The offset is an immediate of the instruction, so chunks of one row share a single
/// 64-bit source address (ptxas does not always fold `src + kOffset` itself).
template <int kOffset>
TS_DEVICE void cp_async_16_zfill_at(uint32_t dst, const void* src, bool valid) {
  static_assert(kOffset % 16 == 0, "16-byte chunks");
  if constexpr (kOffset == 0) {
    cp_async_16_zfill(dst, src, valid);
  } else {
    asm volatile("cp.async.cg.shared.global [%0+%3], [%1+%3], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0),
                 "n"(kOffset)
                 : "memory");
  }
}

/// The eviction priority an L2 cache policy gives the lines it covers: kLast for data many CTAs
/// re-read (attention's K and V), kFirst for data read once, kNormal the default.
enum class L2Evict { kFirst, kNormal, kLast };

/// An L2 cache policy for tma_load_4d and cp_async_16_hint (createpolicy.fractional with fraction
/// 1: it applies to every line the copy brings in; kNormal for a copy with no preference).
template <L2Evict kEvict>
TS_DEVICE uint64_t l2_policy() {
  uint64_t policy;
  if constexpr (kEvict == L2Evict::kLast) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else if constexpr (kEvict == L2Evict::kFirst) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

/// As cp_async_16 to the shared address `dst`; the lines it brings into L2 take `policy`
/// (l2_policy).
TS_DEVICE void cp_async_16_hint(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(policy)
               : "memory");
}

/// Starts an 8-byte copy from global `src` to the shared address `dst` (both 8-byte aligned;
/// `.ca`: cached in L1, for small reused data such as per-page scales).
TS_DEVICE void cp_async_8(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
}

/// As cp_async_8 when `valid`; otherwise writes 8 zero bytes without reading `src` (src-size 0,
/// as cp_async_16_zfill): one double of a tile's tail. `.ca` is the only cache operator an
/// 8-byte cp.async takes (`.cg` requires 16 bytes).
TS_DEVICE void cp_async_8_zfill(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(valid ? 8 : 0) : "memory");
}

/// Closes the current group of asynchronous copies.
TS_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

/// Waits until every asynchronous copy group of this thread has completed.
TS_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

/// Waits until at most N of this thread's most recent copy groups are still in flight (a
/// pipeline of S stages waits with N = S - 2 before reading the oldest stage).
template <int N>
TS_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// cp_async_wait<n> for n in 0..7 given as a value (the instruction takes an immediate): in an
/// unrolled loop n folds to a constant and the switch disappears. n > 7 waits as for 7, n < 0 as
/// for 0 (waiting for more never breaks a caller's ordering).
TS_DEVICE void cp_async_wait_pending(int n) {
  switch (n) {
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    case 7: cp_async_wait<7>(); break;
    default:
      if (n > 7) cp_async_wait<7>();
      else cp_async_wait<0>();
      break;
  }
}

/// Starts an L2 prefetch of `bytes` (a multiple of 16) of global memory at `src` (16-byte
/// aligned): one bulk request the SM's copy engine splits (cp.async.bulk.prefetch, sm_90+; no
/// effect on older GPUs). A hint: nothing waits for it and nothing is guaranteed to stay in L2.
TS_DEVICE void prefetch_l2_bulk(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#else
  (void)src;
  (void)bytes;
#endif
}

}  // namespace ts
