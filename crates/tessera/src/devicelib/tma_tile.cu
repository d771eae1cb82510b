// tma_tile.cu: device-library test of the TMA wrappers of tma.cuh with mbarrier.cuh (sm_90+):
// ts::tma_load_4d completing on an mbarrier (mbar_init, mbar_init_fence, mbar_arrive_expect_tx,
// mbar_wait), ts::tma_store_4d / tma_store_commit / tma_store_wait_read, and the shared-memory
// layout the copy engine leaves (no swizzle, or CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk c of
// row r at chunk c ^ (r % 8), the layout wgmma.cuh's descriptors assume).
//
// What it checks. A 2-D row-major tensor of p.rows x p.cols Elem, described by a tensor map of
// dims (cols, rows, 1, 1) and box (kBoxCols, kBoxRows, 1, 1) (devicelib::verify encodes it), is
// cut into boxes whose grid starts at (p.col0, p.row0) = (-16, -8): every edge box runs past the
// tensor, the first ones at negative coordinates. CTA b loads box (bx, by) = (b % p.boxes_x,
// b / p.boxes_x) into shared memory, waits for its bytes on the mbarrier (phase 0), then
//   * writes the whole box, un-swizzled by ordinary shared loads, to p.boxes[b] (row-major
//     [kBoxRows][kBoxCols]): elements outside the tensor must come back as the zeros TMA fills;
//   * loads the box of the same grid shifted to start at (0, 0), (s0, s1) = (c0 - p.col0,
//     c1 - p.row0), into the same tile (mbarrier phase 1) and stores it back there with
//     tma_store_4d through p.out_map (same geometry, another buffer): TMA clips it at the
//     tensor's far edges, and since these boxes tile the plane from (0, 0) exactly once, the
//     output tensor must equal the input. Stores start at non-negative coordinates only: on an
//     H100 (NVRTC 13.0, driver 580) a store whose box starts at negative coordinates stopped
//     the kernel with an illegal-instruction error, where loads zero-fill.
//
// Launch (devicelib::verify): grid = boxes_x * boxes_y, block = 128, dynamic shared memory
// kSmemBytes. Preamble: Elem (float or ts::f16), kBoxCols, kBoxRows, kSwizzle128 (bool; with it
// a box row is exactly 128 bytes).
#include "tessera/tma.cuh"

#ifndef TS_GENERATED_PREAMBLE
using Elem = ts::f16;
constexpr int kBoxCols = 64;
constexpr int kBoxRows = 32;
constexpr bool kSwizzle128 = true;
#endif

#if !defined(TS_HAS_TMA)
#error "tma_tile.cu needs sm_90+"
#endif

struct TmaTileParams {
  ts::TensorMap in_map;
  ts::TensorMap out_map;
  Elem* boxes;  // [grid][kBoxRows][kBoxCols]
  int boxes_x;
  int col0;
  int row0;
};
static_assert(sizeof(TmaTileParams) == 320, "devicelib::verify TmaTileParams");


constexpr int kRowBytes = kBoxCols * (int)sizeof(Elem);
constexpr int kTileBytes = kBoxRows * kRowBytes;
constexpr int kSmemBytes = kTileBytes + 16 + 1024;
static_assert(kSmemBytes <= 48 * 1024, "no opt-in shared memory needed");
static_assert(!kSwizzle128 || kRowBytes == 128, "a 128-byte swizzled box row is 128 bytes");
static_assert(kRowBytes % 16 == 0, "TMA box rows are multiples of 16 bytes");

/// Byte offset of box element (r, c) in shared memory as TMA wrote it.
TS_DEVICE int tile_offset(int r, int c) {
  const int byte = c * (int)sizeof(Elem);
  if constexpr (kSwizzle128) return r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
  else return r * kRowBytes + byte;
}

extern "C" __global__ void __launch_bounds__(128) devicelib_tma_tile(const __grid_constant__ TmaTileParams p) {
  unsigned char* raw = ts::dynamic_smem<unsigned char>();
  unsigned char* tile = raw + ((1024u - (ts::smem_addr(raw) & 1023u)) & 1023u);  // 1024-byte aligned
  uint64_t* bar = reinterpret_cast<uint64_t*>(tile + kTileBytes);
  const int b = blockIdx.x;
  const int c0 = p.col0 + (b % p.boxes_x) * kBoxCols;
  const int c1 = p.row0 + (b / p.boxes_x) * kBoxRows;

  if (threadIdx.x == 0) {
    ts::mbar_init(bar, 1);
    ts::mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ts::tma_prefetch_map(&p.in_map);
    // The whole box counts, zero-filled bytes included.
    ts::mbar_arrive_expect_tx(bar, kTileBytes);
    ts::tma_load_4d(tile, &p.in_map, bar, c0, c1, 0, 0, ts::l2_policy<ts::L2Evict::kNormal>());
  }
  ts::mbar_wait(bar, 0);

  Elem* out = p.boxes + (size_t)b * kBoxRows * kBoxCols;
  for (int e = threadIdx.x; e < kBoxRows * kBoxCols; e += blockDim.x) {
    out[e] = *reinterpret_cast<const Elem*>(tile + tile_offset(e / kBoxCols, e % kBoxCols));
  }
  // Every thread has read the tile before the copy engine overwrites it.
  __syncthreads();
  const int s0 = c0 - p.col0;
  const int s1 = c1 - p.row0;
  if (threadIdx.x == 0) {
    ts::mbar_arrive_expect_tx(bar, kTileBytes);
    ts::tma_load_4d(tile, &p.in_map, bar, s0, s1, 0, 0, ts::l2_policy<ts::L2Evict::kNormal>());
    ts::mbar_wait(bar, 1);
    // The box in shared memory was written by the async proxy (the load) and is read by it.
    ts::tma_store_4d(&p.out_map, tile, s0, s1, 0, 0);
    ts::tma_store_commit();
    ts::tma_store_wait_read();  // shared memory must outlive the store's reads
  }
}
