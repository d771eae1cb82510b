// cluster.cuh: thread-block clusters and distributed shared memory (sm_90+).
//
// A cluster is a group of CTAs (launched with a cluster-dimension attribute, see
// `LaunchConfig::clustered` on the Rust side) that the hardware schedules on one GPC at the same
// time. They may read and write each other's shared memory ("distributed shared memory"): map a
// local shared-memory address to the same offset in CTA `rank` with `map_shared_rank`, then use
// the `::cluster` loads/stores. `cluster_sync` is a full barrier of every thread of every CTA of
// the cluster with release/acquire ordering of shared memory (cluster scope).
//
// Rules the callers keep:
// * every thread of every CTA of the cluster calls `cluster_sync` the same number of times;
// * a CTA must not exit while another may still read or write its shared memory: end with a
//   `cluster_sync` after the last remote access (or wait until every incoming st_async_cluster
//   has completed on the barrier it signals).
//
// Everything here is PTX ISA 7.8+ for sm_90; on older targets these functions are absent, so a
// kernel that uses them is compiled only for sm_90 and newer.
#pragma once

#include "tessera/common.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TS_HAS_CLUSTERS 1

namespace ts {

/// Rank of this CTA in its cluster, 0 .. cluster_size() - 1.
TS_DEVICE uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

/// CTAs per cluster.
TS_DEVICE uint32_t cluster_size() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}

/// Index of this cluster in the grid (x) and the number of clusters (x).
TS_DEVICE uint32_t cluster_index_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
TS_DEVICE uint32_t cluster_count_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}

/// Barrier over all threads of the cluster; orders shared-memory accesses at cluster scope.
TS_DEVICE void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n\t"
      "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/// The 32-bit shared-memory address of a generic pointer into this CTA's shared memory.
TS_DEVICE uint32_t shared_address(const void* p) {
  uint64_t a;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
  return static_cast<uint32_t>(a);
}

/// The address of the same shared-memory offset in the CTA of rank `rank` of this cluster.
TS_DEVICE uint32_t map_shared_rank(uint32_t local_address, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local_address), "r"(rank));
  return r;
}

/// Loads a float from (possibly another CTA's) shared memory at a cluster address.
TS_DEVICE float ld_shared_cluster(uint32_t cluster_address) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_address) : "memory");
  return v;
}

/// Stores a float to (possibly another CTA's) shared memory at a cluster address.
TS_DEVICE void st_shared_cluster(uint32_t cluster_address, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(cluster_address), "f"(v) : "memory");
}

/// Stores two floats into the shared memory of a cluster CTA (a cluster address from
/// map_shared_rank) asynchronously: the store completes 8 bytes on that CTA's mbarrier at
/// cluster address `bar` (which announced them with mbar_arrive_expect_tx), so the receiver
/// waits on its own barrier instead of a cluster barrier. No fence: the mbarrier carries the
/// ordering (the receiver waits with ts::mbar_wait_cluster).
TS_DEVICE void st_async_cluster(uint32_t cluster_address, float a, float b, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(
                   cluster_address),
               "f"(a), "f"(b), "r"(bar)
               : "memory");
}

/// st_async_cluster of one 32-bit word: 4 bytes complete on the barrier at cluster address `bar`.
TS_DEVICE void st_async_cluster_u32(uint32_t cluster_address, uint32_t v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(cluster_address),
               "r"(v), "r"(bar)
               : "memory");
}

}  // namespace ts
#endif
