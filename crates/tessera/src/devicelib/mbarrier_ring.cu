// mbarrier_ring.cu: device-library test of mbarrier phases (mbarrier.cuh, sm_90+) in the
// producer/consumer ring every Hopper kernel runs: ts::mbar_init, mbar_init_fence,
// mbar_arrive_expect_tx + a TMA load (tma.cuh) completing the "full" barrier, ts::mbar_arrive on
// the "empty" barrier, and ts::mbar_wait with the parity of each pass over the ring.
//
// What it checks. A row-major f32 tensor of p.rows x 64 is streamed in tiles of 16 rows (tensor
// map box (64, 16, 1, 1), no swizzle) through kStages shared-memory slots, p.tiles > 2 kStages
// tiles, so every slot's barriers go through several phases of both parities. Warp 0 (lane 0)
// produces: for tile t, slot s = t % kStages, pass n = t / kStages, it waits until the slot is
// empty (parity (n & 1) ^ 1: a fresh barrier passes that at once) and loads the tile onto
// full[s] with its 4 KiB announced. Warps 1 and 2 (64 threads) consume: they wait on full[s] with
// parity n & 1, copy the tile to p.out[t] and each arrive on empty[s] (64 arrivals per phase).
// A wrong parity, a missed expect_tx or an early slot reuse shows as another tile's (or a stale)
// data in p.out; the last tile runs past the tensor and must hold TMA's zero fill there.
//
// Launch (devicelib::verify): grid = 1, block = 96, dynamic shared memory kSmemBytes.
// Preamble: kStages.
#include "tessera/tma.cuh"

#ifndef TS_GENERATED_PREAMBLE
constexpr int kStages = 3;
#endif

#if !defined(TS_HAS_TMA)
#error "mbarrier_ring.cu needs sm_90+"
#endif

struct MbarrierRingParams {
  ts::TensorMap map;
  float* out;  // [tiles][16][64]
  int tiles;
};
static_assert(sizeof(MbarrierRingParams) == 192, "devicelib::verify MbarrierRingParams");


constexpr int kTileRows = 16;
constexpr int kTileElems = kTileRows * 64;
constexpr int kTileBytes = kTileElems * 4;
constexpr int kConsumers = 64;
constexpr int kSmemBytes = kStages * kTileBytes + 2 * kStages * 8 + 1024;
static_assert(kSmemBytes <= 48 * 1024, "no opt-in shared memory needed");

extern "C" __global__ void __launch_bounds__(96) devicelib_mbarrier_ring(const __grid_constant__ MbarrierRingParams p) {
  unsigned char* raw = ts::dynamic_smem<unsigned char>();
  float* slots = reinterpret_cast<float*>(raw + ((1024u - (ts::smem_addr(raw) & 1023u)) & 1023u));
  uint64_t* full = reinterpret_cast<uint64_t*>(slots + kStages * kTileElems);
  uint64_t* empty = full + kStages;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ts::mbar_init(&full[s], 1);
      ts::mbar_init(&empty[s], kConsumers);
    }
    ts::mbar_init_fence();
  }
  __syncthreads();

  if (threadIdx.x < 32) {
    if (threadIdx.x == 0) {
      const uint64_t policy = ts::l2_policy<ts::L2Evict::kFirst>();
      for (int t = 0; t < p.tiles; ++t) {
        const int s = t % kStages;
        const uint32_t pass = (uint32_t)(t / kStages);
        ts::mbar_wait(&empty[s], (pass & 1u) ^ 1u);
        ts::mbar_arrive_expect_tx(&full[s], kTileBytes);
        ts::tma_load_4d(slots + s * kTileElems, &p.map, &full[s], 0, t * kTileRows, 0, 0, policy);
      }
    }
    return;
  }
  const int c = threadIdx.x - 32;
  for (int t = 0; t < p.tiles; ++t) {
    const int s = t % kStages;
    const uint32_t pass = (uint32_t)(t / kStages);
    ts::mbar_wait(&full[s], pass & 1u);
    const float* slot = slots + s * kTileElems;
    float* out = p.out + (size_t)t * kTileElems;
    for (int e = c; e < kTileElems; e += kConsumers) out[e] = slot[e];
    ts::mbar_arrive(&empty[s]);  // release: the reads above happen before the slot is refilled
  }
}
