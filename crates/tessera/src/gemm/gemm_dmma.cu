// gemm_dmma.cu: fp64 GEMM on the sm_80+ fp64 tensor cores (DMMA: mma.sync m16n8k16 f64 on sm_90,
// m8n8k4 before), a cp.async multistage pipeline, f64 accumulate, fused epilogue in f64
// (gemm_params.cuh), any M, N, K, layouts, leading dimensions and alignment.
//
//   D[z] = act(alpha * A[z] @ B[z] + beta * C[z] + bias) + R[z], every operand double.
//   A row-major or column-major, B [K, N] or [N, K] (run-time flags p.a_col_major,
//   p.b_col_major; they change only how the global loads walk an operand).
//
// CTA tile kBM x kBN x kBK = 128 x 128 x 16, 8 warps as 4 (M) x 2 (N), each warp 32 x 64 of D:
// 2 m16 x 8 n8 tiles, 64 f64 accumulators (128 registers) per thread; one CTA per SM
// (__launch_bounds__(256, 1)). Grid (N tiles, M tiles, batch).
//
// Fragments (mma.cuh; PTX ISA "Matrix Fragments for mma.m16n8k8 / m16n8k16" of .f64), g =
// lane / 4, t = lane % 4, c = 0 .. kMmaK / 4 - 1:
//   a[2c + h] = A[g + 8h][kk = t + 4c], b[c] = B[kk = t + 4c][g], d[2h + e] = D[g + 8h][2t + e].
// sm_90 runs one m16n8k16 DMMA per m16 x n8 tile and K tile (kMmaK = 16). sm_80/86/89 have only
// m8n8k4 (a = A[g][t], b = B[t][g], d = D[g][2t + e]): two k8 steps per K tile, each m16n8k8 made
// of four m8n8k4 on the same registers (ts::mma_m16n8k8_f64: rows g and g + 8, c = 0 and 1).
// The MMA's kk is only a summation index, so step s maps it onto the tile's physical k as
// k = 4t + (kMmaK / 4) s + c: a lane's k of one step are adjacent pairs in memory, and each pair
// comes in one 16-byte shared load (A row g + 8h: a[h], a[2 + h]; B row g: b[0], b[1]; k16
// loads the two pairs 4t, 4t + 1 and 4t + 2, 4t + 3). Over the lanes' t and the steps this
// covers every k of the tile exactly once, and A and B agree on each k (both use the lane's t).
//
// Shared memory: kStages (preamble: 3, or 4 on request on sm_80/90) stages of an A tile
// [128 m][16 k] and a B tile [128 n][16 k], k contiguous for both (row-major A, B stored [N, K]:
// copied as is; column-major A, B [K, N]: transposed by the copy), 16 KiB each: 96 KiB at three
// stages (dynamic, opt-in above 48 KiB; fits sm_86/89's 99 KiB), 128 KiB at four. A row is 8 chunks of 16 bytes (2 doubles), exactly the 32 banks; chunk c of row r is
// stored at chunk c ^ (r % 8). That XOR keeps every access at the minimum number of wavefronts:
//   - fragment loads (16 bytes a lane: 8 lanes per wavefront): lanes 0-7 of a quarter warp read
//     rows r, r + 1 (r even) at logical chunks 2t + j, t = 0..3: one parity class of chunks for
//     row r (XOR with an even r % 8 keeps the parity) and the other for row r + 1 (an odd r % 8
//     flips it): all 8 chunks, conflict-free. Fragment rows start at multiples of 8: r % 8 = g.
//   - copies of a k-contiguous operand: 16-byte cp.async, a quarter warp writes one row's 8
//     chunks (or 8-byte cp.async when the operand is not 16-byte aligned: a half warp, one row).
//   - copies of an m- (n-) contiguous operand, which transposes: 8-byte cp.async, lane l takes
//     row l % 8 (+ 8 per slot) and k l / 8 (+ 4 per warp pair), so a half warp writes rows
//     r..r+7 at 2 adjacent k, i.e. one logical chunk of 8 rows whose r % 8 differ: 8 chunks x 2
//     doubles, 16 distinct slots. In global memory a warp reads 4 runs of 64 bytes (2 sectors).
// gemm/dmma.rs's tests replay these maps on the CPU: the products of every fragment against
// a reference, every tile element written once, and the bank pattern of every access.
//
// Pipeline: tiles kt + 1 .. kt + kStages - 1 are in flight (one cp.async group each) while tile
// kt is multiplied; one __syncthreads per K tile. Tails: an element past M, N or K is
// zero-filled by cp.async (src-size 0; its address, possibly outside the operand, is not read)
// and a 16-byte chunk straddling K copies only its first double; nothing outside an operand is
// read, and the epilogue writes only rows < M and columns < N. 16-byte copies are used for a
// k-contiguous operand when its (batch) base address is 16-byte aligned and its leading
// dimension even (checked per CTA, uniform); every other case copies 8-byte doubles, which are
// always aligned.
//
// Roofline: 2 M N K flops. DMMA peak: A100 19.5 TFLOP/s (64 FMA/clk/SM), H100 SXM ~67 TFLOP/s
// (128 FMA/clk/SM). A K tile brings (128 + 128) x 16 x 8 = 32 KiB into shared memory for
// 2 x 128 x 128 x 16 flops: 16 flops per byte from L2, i.e. ~4.2 TB/s of L2 -> SM traffic at the
// H100 peak (the 128 x 128 tile is the largest whose f64 accumulators fit one CTA's registers).
// Shared memory per K tile: 32 KiB written + 8 warps x 24 16-byte loads x 32 lanes = 96 KiB read,
// 1024 wavefronts against 2048 clocks of DMMA at the H100 peak.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_dmma.cu is compiled with a generated preamble (gemm/dmma.rs)"
#endif
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/async_copy.cuh"
#include "tessera/mma.cuh"
#include "tessera/gemm_params.cuh"

namespace {

constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kBK = 16;
constexpr int kThreads = 256;
constexpr int kWarpsM = 4;
constexpr int kWarpsN = 2;
constexpr int kWarpTileM = kBM / kWarpsM;  // 32
constexpr int kWarpTileN = kBN / kWarpsN;  // 64
constexpr int kMmaM = kWarpTileM / 16;     // 2 m16 tiles
constexpr int kMmaN = kWarpTileN / 8;      // 8 n8 tiles
// The DMMA shape's k: sm_90 has f64 m16n8k16 (one instruction per m16 x n8 tile and K tile,
// the shape of CUTLASS's sm_90 DGEMM); before sm_90 a k8 step (four m8n8k4) keeps fewer
// fragment registers live for the same instructions.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kMmaK = 16;
#else
constexpr int kMmaK = 8;
#endif
constexpr int kKSteps = kBK / kMmaK;       // k steps per K tile
constexpr int kStepChunks = kMmaK / 8;     // 16-byte loads per fragment row and k step
constexpr int kChunk = 2;                  // doubles per 16-byte chunk
constexpr int kRowChunks = kBK / kChunk;   // 8: a tile row is exactly the 32 banks
constexpr int kTileElems = kBM * kBK;      // per operand and stage (A and B tiles have one size)
constexpr int kBytes = (int)sizeof(double);
static_assert(kBN * kBK == kTileElems, "A and B tiles share one size");
static_assert(kWarpsM * kWarpsN * 32 == kThreads, "8 warps");
static_assert(kRowChunks == 8, "the swizzle XORs the 3 low chunk bits with r % 8");
static_assert(kBM == 128 && kBN == 128 && kBK == 16, "the copy index maps below assume 128 x 16 tiles");

/// Element offset of chunk `c` of row `r` in a [rows][kBK] tile (swizzled: chunk c ^ (r % 8)).
TS_DEVICE int swz(int r, int c) { return r * kBK + ((c ^ (r & 7)) * kChunk); }

/// The copies one thread makes of one operand's tiles: kSlots (8) doubles, or 4 chunks of two
/// when `vec16`, at rows row(i) = r + i * row_step of the tile (slot i) and one k (or chunk).
/// Three maps, chosen once per CTA (uniform; see the header for their bank patterns):
///   k-contiguous, 16-byte: chunk c = tid % 8 of rows tid / 8 + 32 i (a quarter warp: one row);
///   k-contiguous, 8-byte: k = tid % 16 of rows tid / 16 + 16 i (a half warp: one row);
///   row-contiguous (transposed): row l % 8 + 64 (w % 2) + 8 i, k = l / 8 + 4 (w / 2) for lane
///   l of warp w (a half warp: 8 rows x 2 adjacent k; a warp reads 4 runs of 64 bytes).
/// Slot i's source is `src + i * slot_step`, its destination `dst + i * dst_step`; each K tile
/// moves `src` by `tile_step`. Everything but `src` is fixed for the whole K loop. A copy with
/// nothing to read (row past M or N, k past K) has src-size 0: its source address, which may
/// then lie outside the operand, is not read (ts::cp_async_16_zfill).
struct Loader {
  static constexpr int kSlots = 8;
  const double* src;   // slot 0 of the current K tile
  long long slot_step, tile_step;
  int k_first;         // the thread's k (first k of its chunk) within a K tile
  int slots_valid;     // slots whose row lies inside the operand (M or N)
  uint32_t dst;        // slot 0's byte offset in a stage's tile
  uint32_t dst_step;
  bool vec16;

  /// The loader of an operand with rows row0 .. rows - 1 (A: m, B: n) at `g` (batch entry),
  /// leading dimension `ld`, k-contiguous (`k_fast`: element (row, k) at g[row * ld + k]) or
  /// row-contiguous (g[k * ld + row]).
  TS_DEVICE Loader(const double* g, long long ld, int row0, int rows, bool k_fast) {
    const int tid = ts::thread_id();
    vec16 = k_fast && ((reinterpret_cast<uintptr_t>(g) | (uintptr_t)(ld * kBytes)) & 15) == 0;
    int r, step, kk;
    if (vec16) {
      r = tid / kRowChunks;
      step = kThreads / kRowChunks;  // 32
      kk = (tid % kRowChunks) * kChunk;
    } else if (k_fast) {
      r = tid / kBK;
      step = kThreads / kBK;  // 16
      kk = tid % kBK;
    } else {
      const int lane = ts::lane_id(), w = ts::warp_id();
      r = (lane & 7) + 64 * (w & 1);
      step = 8;
      kk = (lane >> 3) + 4 * (w >> 1);
    }
    static_assert(kThreads / kRowChunks * 4 == kBM && kThreads / kBK * kSlots == kBM, "slots cover the tile");
    k_first = kk;
    const int row = row0 + r;
    slots_valid = row < rows ? ts::min_c(kSlots, (rows - row + step - 1) / step) : 0;
    if (k_fast) {
      src = g + (long long)row * ld + kk;
      slot_step = (long long)step * ld;
      tile_step = kBK;
    } else {
      src = g + (long long)kk * ld + row;
      slot_step = step;
      tile_step = (long long)kBK * ld;
    }
    // the rows of a thread's slots differ by multiples of 8: one swizzle (r % 8) for all
    dst = (uint32_t)((swz(r, kk / kChunk) + kk % kChunk) * kBytes);
    dst_step = (uint32_t)(step * kBK * kBytes);
  }

  /// Starts the copies of the current K tile (k0 = its first k, k = K) into the tile at `smem`
  /// (shared address) and moves on to the next K tile. Elements past M, N or K are zero-filled.
  TS_DEVICE void load(uint32_t smem, int k0, int k) {
    const int k_left = k - (k0 + k_first);  // valid k of the thread's chunk (<= 0: none)
    if (vec16) {
      const int bytes = k_left <= 0 ? 0 : ts::min_c(kChunk, k_left) * kBytes;
#pragma unroll
      for (int i = 0; i < kSlots / 2; ++i) {
        const bool ok = i < slots_valid && bytes > 0;
        ts::cp_async_16_zfill_bytes(smem + dst + i * dst_step, src + i * slot_step, ok ? bytes : 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const bool ok = i < slots_valid && k_left > 0;
        ts::cp_async_8_zfill(smem + dst + i * dst_step, src + i * slot_step, ok);
      }
    }
    src += tile_step;
  }
};

/// Starts the copies of K tile `kt` into stage `s` (tiles are loaded in order: each Loader
/// steps on by one tile per call).
TS_DEVICE void load_stage(Loader& a, Loader& b, int k, uint32_t smem, int s, int kt) {
  const uint32_t sa = smem + s * 2 * kTileElems * kBytes;
  a.load(sa, kt * kBK, k);
  b.load(sa + kTileElems * kBytes, kt * kBK, k);
}

/// 16 bytes of shared memory: one lane's two adjacent k of a fragment.
TS_DEVICE ts::Array<double, 2> load_pair(const double* tile, int offset) {
  return *reinterpret_cast<const ts::Array<double, 2>*>(tile + offset);
}

/// The DMMA of one m16 x n8 tile and k step, by the fragments' size (kMmaK = 8 or 16).
TS_DEVICE void dmma(double (&d)[4], const double (&a)[4], const double (&b)[2]) { ts::mma_m16n8k8_f64(d, a, b); }
TS_DEVICE void dmma(double (&d)[4], const double (&a)[8], const double (&b)[4]) { ts::mma_m16n8k16_f64(d, a, b); }

}  // namespace

extern "C" __global__ void __launch_bounds__(kThreads, 1) gemm_dmma(const __grid_constant__ GemmParams p) {
  const int z = blockIdx.z;
  const int m0 = blockIdx.y * kBM;
  const int n0 = blockIdx.x * kBN;
  const double* A = static_cast<const double*>(p.a) + z * p.stride_a;
  const double* B = static_cast<const double*>(p.b) + z * p.stride_b;
  // row-major A [M, K] and B stored [N, K] are k-contiguous
  Loader load_a(A, p.lda, m0, p.m, p.a_col_major == 0);
  Loader load_b(B, p.ldb, n0, p.n, p.b_col_major != 0);

  double* tiles = ts::dynamic_smem<double>();
  const uint32_t smem = ts::smem_addr(tiles);
  const int lane = ts::lane_id();
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp_m = ts::warp_id() / kWarpsN;
  const int warp_n = ts::warp_id() % kWarpsN;
  const int k_tiles = (p.k + kBK - 1) / kBK;

  // Fragment offsets (elements, within a stage) of logical chunk 2t + j (j = 0, 1): A row
  // warp_m * kWarpTileM + g (+ 16 mi + 8 h), B row warp_n * kWarpTileN + g (+ 8 nj). Those rows
  // differ from the first by multiples of 8, so they share its swizzle (r % 8 = g).
  int a_off[2], b_off[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    a_off[j] = swz(warp_m * kWarpTileM + g, 2 * t + j);
    b_off[j] = kTileElems + swz(warp_n * kWarpTileN + g, 2 * t + j);
  }

  double acc[kMmaM][kMmaN][4];
#pragma unroll
  for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
    for (int nj = 0; nj < kMmaN; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][nj][e] = 0.0;

  // prologue: tiles 0 .. kStages - 2 in flight, one group each (empty groups keep the count)
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(load_a, load_b, p.k, smem, s, s);
    ts::cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    ts::cp_async_wait<kStages - 2>();  // tile kt has landed (for this thread)
    __syncthreads();                   // ... for every thread; and stage (kt - 1) % kStages is free
    const int next = kt + kStages - 1;
    if (next < k_tiles) load_stage(load_a, load_b, p.k, smem, next % kStages, next);
    ts::cp_async_commit();

    const double* stage = tiles + (kt % kStages) * 2 * kTileElems;
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      // k step s covers k = 4t + (kMmaK / 4) s + c, c = 0 .. kMmaK / 4 - 1 (kk = t + 4c): the
      // 16-byte chunks 2t + j, j = kStepChunks s + q, element c % 2 of chunk q = c / 2. The A
      // fragments of the step are loaded first, then one n8 tile's B fragment at a time.
      double fa[kMmaM][kMmaK / 2];
#pragma unroll
      for (int q = 0; q < kStepChunks; ++q)
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const ts::Array<double, 2> v = load_pair(stage, a_off[kStepChunks * s + q] + (mi * 16 + 8 * h) * kBK);
            fa[mi][4 * q + h] = v[0];      // c = 2q
            fa[mi][4 * q + 2 + h] = v[1];  // c = 2q + 1
          }
#pragma unroll
      for (int nj = 0; nj < kMmaN; ++nj) {
        double fb[kMmaK / 4];
#pragma unroll
        for (int q = 0; q < kStepChunks; ++q) {
          const ts::Array<double, 2> v = load_pair(stage, b_off[kStepChunks * s + q] + nj * 8 * kBK);
          fb[2 * q] = v[0];
          fb[2 * q + 1] = v[1];
        }
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi) dmma(acc[mi][nj], fa[mi], fb);
      }
    }
  }
  ts::cp_async_wait_all();

  // epilogue: accumulator e of tile (mi, nj) is D[g + 8 (e / 2)][2 t + e % 2] of that tile
#pragma unroll
  for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
    for (int nj = 0; nj < kMmaN; ++nj)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + warp_m * kWarpTileM + mi * 16 + g + 8 * (e >> 1);
        const int col = n0 + warp_n * kWarpTileN + nj * 8 + 2 * t + (e & 1);
        if (row < p.m && col < p.n) ts::gemm_store<double, double>(p, z, row, col, acc[mi][nj][e]);
      }
}
