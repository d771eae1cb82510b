// memory_order.cuh: GPU-scope message passing between CTAs through global memory.
//
// Defines: ts::st_release_gpu (u64), ts::ld_acquire_gpu (u64), ts::ld_relaxed_gpu (f32),
//          ts::nanosleep.
//
// The pattern (PTX ISA, "Memory Consistency Model"): a writer stores its payload with ordinary
// or relaxed stores, then a flag with st_release_gpu; a reader polls the flag with
// ld_acquire_gpu until it sees the value, then reads the payload with ld_relaxed_gpu (strong
// loads, never served from a stale L1 line). Release/acquire at .gpu scope makes every write
// before the release visible to every read after the acquire, across CTAs of any SM.
//
// Rule the callers keep: a CTA that polls for another CTA's flag must only wait for CTAs that
// are resident at the same time (one wave of the grid), or the wait never ends.
// Needs sm_70+ (the .release / .acquire / .relaxed qualifiers).
#pragma once

#include "tessera/common.cuh"

namespace ts {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
/// *p = v with release semantics at GPU scope.
TS_DEVICE void st_release_gpu(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/// *p with acquire semantics at GPU scope.
TS_DEVICE unsigned long long ld_acquire_gpu(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// *p as a strong relaxed load at GPU scope.
TS_DEVICE float ld_relaxed_gpu(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

/// Suspends the thread for about `ns` nanoseconds (a polite spin-wait).
TS_DEVICE void nanosleep(unsigned ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }
#endif

}  // namespace ts
