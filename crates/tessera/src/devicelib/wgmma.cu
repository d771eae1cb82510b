// wgmma.cu: device-library test of the Hopper warpgroup MMA wrappers of wgmma.cuh (sm_90a):
// ts::wgmma_desc_sw128, ts::wgmma_desc_advance, ts::wgmma_ss / ts::wgmma_rs at N = 64, and the
// fence / commit / wait rules, with the shared-memory operands laid out as flash_sm90.cu's TMA
// loads leave them (128-byte rows of 64 elements, CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk c of
// row r stored at chunk c ^ (r % 8), tiles 1024-byte aligned).
//
// What it checks. One warpgroup (128 threads) computes D[64][64] = A[64][64] B[64][64] (f32) as
// four m64n64k16 k-steps, with the descriptors built as flash_sm90.cu's issue_qk / issue_pv do:
//   kRegsA = 0 (issue_qk): A and B both K-major from shared memory (B staged transposed: row n
//              holds B[0..63][n]); k-step kk advances both descriptors by 32 bytes;
//              ts::wgmma_ss<Elem, 64, 0>.
//   kRegsA = 1 (issue_pv): A from registers (each warp's m16k16 fragment, the mma.sync A layout:
//              warp w rows 16w.., a0 = A[16w+g][16kk+2t..], a1 = row +8, a2 = k +8, a3 = both),
//              B N-major from shared memory (row k holds B[k][0..63]); k-step kk advances the B
//              descriptor by 16 rows = 2048 bytes; ts::wgmma_rs<Elem, 64, 1>.
// The accumulators start as NaN and the first k-step passes scale_d = 0, so it must overwrite
// them. D is stored from the documented accumulator layout (warp w rows 16w.., register 4i + {0,1}
// row 16w + g, columns 8i + 2t + {0,1}; 4i + {2,3} row 16w + 8 + g). Global memory holds A
// row-major [m][k], B row-major [k][n] (Elem), D row-major [m][n] (f32); the CPU reference is the
// f64 product (devicelib::reference::matmul). The operands are staged by ordinary stores into the
// swizzled layout, then fence.proxy.async and a barrier hand them to the async proxy (wgmma).
//
// Launch (devicelib::verify): grid = 1, block = 128 threads, dynamic shared memory kSmemBytes
// (two 8 KiB tiles + 1 KiB of alignment slack). Preamble: Elem (ts::f16 or ts::bf16), kRegsA.
#include "tessera/wgmma.cuh"
#include "tessera/mbarrier.cuh"  // ts::fence_proxy_async

#ifndef TS_GENERATED_PREAMBLE
using Elem = ts::f16;
constexpr int kRegsA = 0;
#endif

#if !defined(TS_HAS_WGMMA) || !defined(TS_HAS_MBARRIER)
#error "wgmma.cu needs sm_90a"
#endif

struct WgmmaTestParams {
  const Elem* a;  // [64][64], row-major [m][k]
  const Elem* b;  // [64][64], row-major [k][n]
  float* d;       // [64][64], row-major [m][n]
};
static_assert(sizeof(WgmmaTestParams) == 24, "devicelib::verify WgmmaTestParams");


constexpr int kTileBytes = 64 * 128;
constexpr int kSmemBytes = 2 * kTileBytes + 1024;
static_assert(kSmemBytes <= 48 * 1024, "no opt-in shared memory needed");

/// Byte offset of element (r, c) of a tile of 128-byte rows in the 128-byte swizzle.
TS_DEVICE int swizzled_offset(int r, int c) {
  const int byte = c * (int)sizeof(Elem);
  return r * 128 + (((byte / 16) ^ (r % 8)) * 16) + byte % 16;
}

TS_DEVICE uint32_t pair_from_global(const Elem* x, int lo, int hi) {
  if constexpr (ts::is_same_v<Elem, ts::f16>) return ts::pack_f16x2(ts::to_float(x[lo]), ts::to_float(x[hi]));
  else return ts::pack_bf16x2(ts::to_float(x[lo]), ts::to_float(x[hi]));
}

extern "C" __global__ void __launch_bounds__(128) devicelib_wgmma(const __grid_constant__ WgmmaTestParams p) {
  unsigned char* raw = ts::dynamic_smem<unsigned char>();
  const uint32_t pad = (1024u - (ts::smem_addr(raw) & 1023u)) & 1023u;
  unsigned char* sa = raw + pad;  // A tile (kRegsA = 0 only), 1024-byte aligned
  unsigned char* sb = sa + kTileBytes;
  const int tid = threadIdx.x;

  // Stage the operands: element e = tid + 128 j of the row-major global tile (r = e / 64, c = e % 64).
  for (int e = tid; e < 64 * 64; e += 128) {
    const int r = e / 64, c = e % 64;
    if constexpr (kRegsA == 0) {
      *reinterpret_cast<Elem*>(sa + swizzled_offset(r, c)) = p.a[e];  // row m = r, k = c
      *reinterpret_cast<Elem*>(sb + swizzled_offset(c, r)) = p.b[e];  // K-major: row n = c, k = r
    } else {
      *reinterpret_cast<Elem*>(sb + swizzled_offset(r, c)) = p.b[e];  // N-major: row k = r, n = c
    }
  }
  ts::fence_proxy_async();  // these generic-proxy stores before the async-proxy reads of wgmma
  __syncthreads();

  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = ts::kNaN;  // scale_d = 0 of the first k-step must overwrite

  if constexpr (kRegsA == 0) {
    const uint64_t da0 = ts::wgmma_desc_sw128(ts::smem_addr(sa), 16);
    const uint64_t db0 = ts::wgmma_desc_sw128(ts::smem_addr(sb), 16);
    ts::wgmma_fence_acc(d);
    ts::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ts::wgmma_ss<Elem, 64, 0>(d, ts::wgmma_desc_advance(da0, kk * 32), ts::wgmma_desc_advance(db0, kk * 32),
                                kk > 0 ? 1 : 0);
    }
    ts::wgmma_commit();
    ts::wgmma_wait<0>();
    ts::wgmma_fence_acc(d);
  } else {
    uint32_t a[4][4];
    const Elem* arow = p.a + (16 * warp + g) * 64;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int k = 16 * kk + 2 * t;
      a[kk][0] = pair_from_global(arow, k, k + 1);
      a[kk][1] = pair_from_global(arow + 8 * 64, k, k + 1);
      a[kk][2] = pair_from_global(arow, k + 8, k + 9);
      a[kk][3] = pair_from_global(arow + 8 * 64, k + 8, k + 9);
    }
    // leading byte offset: the next 64-column block of B (unused at N = 64, set as issue_pv does)
    const uint64_t db0 = ts::wgmma_desc_sw128(ts::smem_addr(sb), 64 * 128);
    ts::wgmma_fence_acc(d);
    ts::wgmma_fence_operand(a);
    ts::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ts::wgmma_rs<Elem, 64, 1>(d, a[kk], ts::wgmma_desc_advance(db0, kk * 16 * 128), kk > 0 ? 1 : 0);
    }
    ts::wgmma_commit();
    ts::wgmma_wait<0>();
    ts::wgmma_fence_acc(d);
    ts::wgmma_fence_operand(a);
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = 16 * warp + g, col = 8 * i + 2 * t;
    p.d[row * 64 + col] = d[4 * i + 0];
    p.d[row * 64 + col + 1] = d[4 * i + 1];
    p.d[(row + 8) * 64 + col] = d[4 * i + 2];
    p.d[(row + 8) * 64 + col + 1] = d[4 * i + 3];
  }
}
