// memory_order.cuh: message passing through global memory without fences: between CTAs (GPU
// scope, tagged words) and between the threads of one CTA (CTA scope, after a barrier).
//
// Defines: ts::st_relaxed_gpu_v2 (2 x u64), ts::ld_relaxed_gpu_v2 (2 x u64), ts::st_relaxed_cta,
// ts::ld_relaxed_cta (i32), ts::nanosleep.
//
// The pattern (PTX ISA, "Memory Consistency Model"): strong (relaxed, .gpu scope) accesses to an
// aligned 64-bit scalar are single-copy atomic, and a vector access is a set of such scalar
// accesses in unspecified order. So a message that fits 2 x 64 bits, each word carrying its own
// copy of a tag that no earlier message in that slot carried, needs no release / acquire: the
// writer stores both words with one st_relaxed_gpu_v2, a reader polls with ld_relaxed_gpu_v2
// until both words carry the tag, and then holds the whole message (each word whole, both of
// the same write). A release store would have to wait for every earlier write of the thread
// (the split-row softmax measured slower with it: softmax/NOTES.md, `dcef6c9`).
//
// Rules the callers keep: a slot is written at most once per tag (so a reader never has to order
// a later write after its read); a CTA that polls for another CTA's message only waits for CTAs
// that are resident at the same time (one wave of the grid), or the wait never ends.
//
// Inside one CTA (st_relaxed_cta / ld_relaxed_cta): a word one thread writes and others read after
// a release / acquire hand-over (an mbarrier phase the writer arrives on after the store, or a
// bar.sync) needs only CTA-scope strong accesses; the barrier orders them. A .cta load may be
// served by the SM's L1 (SASS LDG.E.STRONG.SM), where a volatile one (.sys) goes to L2 and
// beyond: the attention work slot read this way measured faster, most on short rows
// (attention/NOTES.md, `f4a2dc9`).
// Needs sm_70+ (the .relaxed qualifier).
#pragma once

#include "tessera/common.cuh"

namespace ts {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
/// p[0] = a, p[1] = b (p 16-byte aligned): two strong relaxed 64-bit stores at GPU scope.
TS_DEVICE void st_relaxed_gpu_v2(unsigned long long* p, unsigned long long a, unsigned long long b) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}

/// (p[0], p[1]) (p 16-byte aligned): two strong relaxed 64-bit loads at GPU scope (never served
/// from a stale L1 line).
TS_DEVICE void ld_relaxed_gpu_v2(const unsigned long long* p, unsigned long long& a, unsigned long long& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p) : "memory");
}

/// *p = v: a strong relaxed 32-bit store at CTA scope (read by threads of the same CTA after a
/// barrier the writer arrives on after this store).
TS_DEVICE void st_relaxed_cta(int* p, int v) {
  asm volatile("st.relaxed.cta.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/// *p: a strong relaxed 32-bit load at CTA scope (after the acquiring wait of the hand-over).
TS_DEVICE int ld_relaxed_cta(const int* p) {
  int v;
  asm volatile("ld.relaxed.cta.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// Suspends the thread for about `ns` nanoseconds (a polite spin-wait).
TS_DEVICE void nanosleep(unsigned ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }
#endif

}  // namespace ts
