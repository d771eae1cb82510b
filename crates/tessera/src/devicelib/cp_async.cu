// cp_async.cu: device-library test of the cp.async wrappers of async_copy.cuh (sm_80+) in a
// multistage global -> shared pipeline: ts::cp_async_16 (generic shared pointer),
// ts::cp_async_16_zfill (shared address; a chunk past the end is zero-filled without reading its
// source, which points past the input), ts::cp_async_commit, ts::cp_async_wait<kStages - 2>,
// ts::cp_async_wait_all.
//
// What it checks. p.n floats (a multiple of 4) are streamed in tiles of 512 (one 16-byte chunk
// per thread) through a ring of kStages shared-memory slots, the loads of tile t + kStages - 1
// in flight while tile t is consumed: the prologue issues kStages - 1 tiles; iteration t waits
// until at most kStages - 2 groups are pending (tile t has landed), synchronises the block (tile t
// visible to every thread; everyone done with tile t - 1, whose slot is refilled next), issues
// tile t + kStages - 1 (an empty group past the end, so the count stays uniform) and copies tile t
// to p.out[t], each thread reading another thread's chunk ((tid + 37 t + 1) % 128). Full tiles
// use cp_async_16, the last (partial) tile cp_async_16_zfill. p.out has p.tiles * 512 floats:
// the copy of the input, then the zeros of the last tile's fill.
//
// Launch (devicelib::verify): grid = 1, block = 128, static shared memory kStages * 2 KiB.
// Preamble: kStages (3 or 4).
#include "tessera/async_copy.cuh"

#ifndef TS_GENERATED_PREAMBLE
constexpr int kStages = 3;
#endif

struct CpAsyncParams {
  const float* in;  // [n]
  float* out;       // [tiles][512]
  int n;
  int tiles;
};
static_assert(sizeof(CpAsyncParams) == 24, "devicelib::verify CpAsyncParams");


constexpr int kThreads = 128;
constexpr int kTile = kThreads * 4;
static_assert(kStages >= 2 && kStages <= 8, "cp.async ring of 2..8 stages");

extern "C" __global__ void __launch_bounds__(kThreads) devicelib_cp_async(const __grid_constant__ CpAsyncParams p) {
  __shared__ alignas(16) float ring[kStages][kTile];
  const int tid = threadIdx.x;
  auto issue = [&](int t) {
    if (t < p.tiles) {
      const int e = t * kTile + tid * 4;
      float* dst = &ring[t % kStages][tid * 4];
      if ((t + 1) * kTile <= p.n) {
        ts::cp_async_16(dst, p.in + e);
      } else {
        ts::cp_async_16_zfill(ts::smem_addr(dst), p.in + e, e < p.n);
      }
    }
    ts::cp_async_commit();
  };

  for (int t = 0; t < kStages - 1; ++t) issue(t);
  for (int t = 0; t < p.tiles; ++t) {
    ts::cp_async_wait<kStages - 2>();
    __syncthreads();
    issue(t + kStages - 1);
    const int chunk = (tid + 37 * t + 1) % kThreads;
    const float4 v = *reinterpret_cast<const float4*>(&ring[t % kStages][chunk * 4]);
    *reinterpret_cast<float4*>(p.out + (size_t)t * kTile + chunk * 4) = v;
  }
  ts::cp_async_wait_all();
}
