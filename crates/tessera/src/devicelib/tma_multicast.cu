// tma_multicast.cu: device-library test of ts::tma_load_4d_multicast (tma.cuh) in clusters of two
// CTAs (cluster.cuh: cluster_rank, cluster_sync), completing on each CTA's own mbarrier.
//
// What it checks. A row-major tensor of p.rows x 64 ts::f16 (128-byte rows, 128-byte swizzle as
// the attention K/V tiles), tensor map box (64, 16, 1, 1) = half a tile. Cluster q owns the tile
// of rows 32q .. 32q + 31. CTA rank r loads the half of rows 32q + 16r .. + 15 into
// shared offset 16r * 128 (2 KiB, 1024-byte aligned, so the swizzle phase is the tile's) of BOTH
// CTAs (cta_mask 0b11). Each CTA's barrier announces the whole tile's 4 KiB (its own arrival with
// expect_tx; half of the bytes come from the other CTA's copy, which may land before the
// announcement: the phase cannot complete before the CTA's own arrival). After the wait both
// CTAs must hold the whole tile: each writes it, un-swizzled, to p.out[blockIdx.x] (row-major
// [32][64]); rows past p.rows are TMA's zero fill (the last tile is short).
// Barrier initialisation is published to the cluster with cluster_sync before any copy can
// signal it, and a last cluster_sync keeps both CTAs alive until neither is a copy target.
//
// Launch (devicelib::verify): grid = 2 * ceil(rows / 32) CTAs in clusters of 2 (cluster_x = 2),
// block = 128, dynamic shared memory kSmemBytes. sm_90+.
#include "tessera/cluster.cuh"
#include "tessera/dtype.cuh"
#include "tessera/tma.cuh"

#if !defined(TS_HAS_TMA) || !defined(TS_HAS_CLUSTERS)
#error "tma_multicast.cu needs sm_90+"
#endif

struct TmaMulticastParams {
  ts::TensorMap map;
  ts::f16* out;  // [grid][32][64]
};
static_assert(sizeof(TmaMulticastParams) == 192, "devicelib::verify TmaMulticastParams");


constexpr int kRows = 32;       // rows of a tile
constexpr int kHalfRows = 16;   // rows of the map's box: what one CTA loads
constexpr int kTileBytes = kRows * 128;
constexpr int kSmemBytes = kTileBytes + 16 + 1024;  // devicelib::verify tma_smem
static_assert(kSmemBytes <= 48 * 1024, "no opt-in shared memory needed");

extern "C" __global__ void __launch_bounds__(128) devicelib_tma_multicast(const __grid_constant__ TmaMulticastParams p) {
  unsigned char* raw = ts::dynamic_smem<unsigned char>();
  unsigned char* tile = raw + ((1024u - (ts::smem_addr(raw) & 1023u)) & 1023u);  // same offset in both CTAs
  uint64_t* bar = reinterpret_cast<uint64_t*>(tile + kTileBytes);
  const uint32_t rank = ts::cluster_rank();
  const int q = (int)ts::cluster_index_x();

  if (threadIdx.x == 0) {
    ts::mbar_init(bar, 1);
    ts::mbar_init_fence();
  }
  ts::cluster_sync();  // both barriers initialised before either CTA's copy signals them
  if (threadIdx.x == 0) {
    ts::mbar_arrive_expect_tx(bar, kTileBytes);
    ts::tma_load_4d_multicast(tile + rank * kHalfRows * 128, &p.map, bar, 0, q * kRows + (int)rank * kHalfRows, 0, 0,
                              (uint16_t)0b11, ts::l2_policy<ts::L2Evict::kNormal>());
  }
  ts::mbar_wait(bar, 0);

  ts::f16* out = p.out + (size_t)blockIdx.x * kRows * 64;
  for (int e = threadIdx.x; e < kRows * 64; e += blockDim.x) {
    const int r = e / 64, byte = (e % 64) * 2;
    out[e] = *reinterpret_cast<const ts::f16*>(tile + r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16);
  }
  ts::cluster_sync();
}
