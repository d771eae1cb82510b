// mbarrier.cuh: shared-memory transaction barriers (mbarrier, sm_90+) for producer/consumer
// pipelines fed by the copy engine (TMA).
//
// Defines: ts::mbar_init, ts::mbar_init_fence, ts::mbar_arrive, ts::mbar_arrive_if,
//          ts::mbar_arrive_expect_tx, ts::mbar_arrive_cluster_if, ts::mbar_arrive_cluster_release,
//          ts::mbar_wait, ts::mbar_wait_cluster, ts::fence_proxy_async,
//          ts::named_barrier_sync / named_barrier_arrive.
//
// An mbarrier is one 8-byte word in shared memory. It completes a *phase* when `count` arrivals
// have been made and every byte announced with `expect_tx` has landed (TMA copies signal their
// bytes with `complete_tx`). Phases alternate parity 0, 1, 0, ...; `mbar_wait(bar, parity)`
// returns once the phase of that parity has completed. A fresh barrier is in phase 0, so a
// producer waiting on an "empty" barrier with parity 1 passes at once (the slot starts empty).
//
// Initialisation: one thread calls mbar_init for each barrier, then mbar_init_fence, then the
// block synchronises (__syncthreads) before anyone waits or a copy signals the barrier; when
// other CTAs of a cluster signal it (st_async_cluster, multicast copies), the whole cluster
// synchronises (cluster_sync) instead.
#pragma once

#include "tessera/async_copy.cuh"  // ts::smem_addr
#include "tessera/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TS_HAS_MBARRIER 1

namespace ts {

/// Initialises the barrier at `bar` to expect `count` arrivals per phase.
TS_DEVICE void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

/// Makes barrier initialisation visible to the copy engine (async proxy) and other threads.
TS_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

/// One arrival (release semantics: this thread's earlier shared-memory reads/writes are ordered
/// before the phase completes).
TS_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

/// One arrival when `pred` is true, as a predicated instruction rather than a branch (a branch
/// around an arrive between a wgmma and its wait makes ptxas serialise the wgmma, C7520).
TS_DEVICE void mbar_arrive_if(uint64_t* bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n}\n" ::"r"(smem_addr(bar)),
      "r"((int)pred)
      : "memory");
}

/// One arrival when `pred` is true on the barrier at `cluster_bar`, a shared::cluster address
/// (ts::map_shared_rank: this or another CTA of the cluster). Default semantics (release at CTA
/// scope), as for a local slot release: `.release.cluster` makes ptxas put a GPU-wide MEMBAR in
/// front of every arrival. Nothing here orders this thread's earlier reads before what the
/// other CTA does once it sees the arrival (the arrival does not wait for a load in flight):
/// callers release memory whose reads have completed, e.g. wgmma operands after
/// wgmma.wait_group. For a word read with an ordinary load use mbar_arrive_cluster_release.
TS_DEVICE void mbar_arrive_cluster_if(uint32_t cluster_bar, bool pred) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %1, 0;\n"
      "@p mbarrier.arrive.shared::cluster.b64 _, [%0];\n}\n" ::"r"(cluster_bar),
      "r"((int)pred)
      : "memory");
}

/// One arrival on the barrier at `cluster_bar` (shared::cluster address) with release semantics
/// at cluster scope: this thread's earlier loads and stores are performed before another CTA
/// that waits on the barrier sees the arrival (ptxas emits a MEMBAR first). For handing back a
/// word another CTA will overwrite, once per message, not per pipeline slot.
TS_DEVICE void mbar_arrive_cluster_release(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

/// One arrival that also announces `bytes` of copies that will complete on this barrier.
TS_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

/// The spin loop of mbar_wait / mbar_wait_cluster: try_wait with acquire at `scope`.
#define TS_MBAR_WAIT_LOOP(scope)                                                    \
  "{\n"                                                                             \
  ".reg .pred done;\n"                                                              \
  "TS_MBAR_WAIT:\n"                                                                 \
  "mbarrier.try_wait.parity.acquire." scope ".shared::cta.b64 done, [%0], %1;\n"   \
  "@!done bra TS_MBAR_WAIT;\n"                                                      \
  "}\n"

/// Spins until the phase with parity `parity` (0 or 1) of the barrier has completed
/// (acquire semantics: data the phase guarded is visible afterwards).
TS_DEVICE void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(TS_MBAR_WAIT_LOOP("cta")::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

/// mbar_wait for a barrier whose bytes other CTAs of the cluster complete (st_async_cluster):
/// acquire at cluster scope, so their data is visible once the phase has completed.
TS_DEVICE void mbar_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(TS_MBAR_WAIT_LOOP("cluster")::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

/// Orders this thread's ordinary shared-memory accesses before later async-proxy accesses
/// (TMA, wgmma operands) of the same memory, and vice versa.
TS_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/// Waits on named barrier `id` (1..15; 0 is __syncthreads) until `threads` threads (a multiple
/// of 32) have arrived or synced on it.
TS_DEVICE void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// Arrives on named barrier `id` without waiting (the other side calls named_barrier_sync).
TS_DEVICE void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace ts

#endif
