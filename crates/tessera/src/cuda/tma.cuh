// tma.cuh: the tensor memory accelerator (TMA, `cp.async.bulk.tensor`, sm_90+): whole tiles
// copied between global and shared memory by the copy engine, described by a tensor map.
//
// Defines: ts::TensorMap (the 128-byte CUtensorMap, built on the host by cuTensorMapEncodeTiled
//          and passed inside a `__grid_constant__` kernel parameter), ts::tma_prefetch_map,
//          ts::tma_load_4d (with an L2 cache policy: ts::L2Evict, ts::l2_policy of async_copy.cuh),
//          ts::tma_load_4d_multicast (one copy into several CTAs of a cluster),
//          ts::tma_store_4d, ts::tma_store_commit, ts::tma_store_wait_read,
//          ts::tma_store_wait_read_pending<N> (a ring of store buffers), ts::tma_store_wait_all.
//
// Coordinates are element indices per tensor-map dimension, innermost first; boxes that run past
// the tensor's extent are zero-filled on load and clipped on store. The shared-memory tile must
// be aligned to the swizzle span (1024 bytes for 128-byte swizzle). A load completes on an
// mbarrier: announce the box's bytes with mbar_arrive_expect_tx before (or with) the copies.
#pragma once

#include "tessera/common.cuh"
#include "tessera/mbarrier.cuh"
#include "tessera/async_copy.cuh"  // ts::L2Evict, ts::l2_policy

namespace ts {

/// A CUtensorMap: opaque, 128 bytes, 64-byte aligned.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

}  // namespace ts

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TS_HAS_TMA 1

namespace ts {

/// Prefetches the tensor map (a `__grid_constant__` parameter) into the descriptor cache.
TS_DEVICE void tma_prefetch_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

/// Copies the box at (c0, c1, c2, c3) of a 4-D tensor map into shared `dst`; its bytes complete
/// on `bar`; the lines it brings into L2 take `policy` (l2_policy).
TS_DEVICE void tma_load_4d(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3,
                           uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
}

/// tma_load_4d into every CTA of the cluster whose bit is set in `cta_mask` (bit r: rank r):
/// the box lands at `dst`'s offset in each of their shared memories and its bytes complete on
/// the barrier at `bar`'s offset in each (announce them there). One L2 read serves them all.
TS_DEVICE void tma_load_4d_multicast(void* dst, const TensorMap* map, uint64_t* bar, int c0, int c1, int c2, int c3,
                                     uint16_t cta_mask, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%3, %4, %5, %6}], [%2], %7, %8;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask),
      "l"(policy)
      : "memory");
}

/// Copies shared `src` to the box at (c0, c1, c2, c3) of a 4-D tensor map (clipped at the
/// tensor's extent). Call fence_proxy_async after writing `src` with ordinary stores.
TS_DEVICE void tma_store_4d(const TensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

/// Closes the group of bulk stores issued so far by this thread.
TS_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

/// Waits until this thread's bulk stores have finished reading shared memory.
TS_DEVICE void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

/// Waits until at most the N most recent of this thread's bulk store groups may still read
/// shared memory: with N + 1 store buffers used in turn, the buffer about to be rewritten is free.
template <int N>
TS_DEVICE void tma_store_wait_read_pending() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

/// Waits until this thread's bulk stores have completed (written to global memory).
TS_DEVICE void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

}  // namespace ts

#endif
