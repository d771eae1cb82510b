// gemm_splitk.cu: the second pass of a split-K GEMM: D = epilogue(sum over s of
// workspace[s][z][M][N]), summing the splits in order 0, 1, ... (deterministic: the same bits on
// every run), then the fused epilogue of gemm_params.cuh.
//
// One thread per element of D (grid-stride over batch x M x N); reads splits x 4 bytes and writes
// one Out per element, so its cost is that of streaming the workspace once.
#ifndef TS_GENERATED_PREAMBLE
#error "gemm_splitk.cu is compiled with a generated preamble (gemm/skinny.rs)"
#endif
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"
#include "tessera/gemm_params.cuh"

constexpr int kThreads = 256;

extern "C" __global__ void __launch_bounds__(kThreads) gemm_splitk_reduce(const __grid_constant__ GemmParams p) {
  ts::wait_prior_grids();  // programmatic dependent launch: no global access before this
  ts::allow_dependent_grids();
  const long long plane = (long long)p.m * p.n;
  const long long total = plane * p.batch;
  const long long stride = (long long)gridDim.x * kThreads;
  for (long long i = (long long)blockIdx.x * kThreads + ts::thread_id(); i < total; i += stride) {
    float acc = 0.0f;
    for (int s = 0; s < p.splits; ++s) acc += p.workspace[s * total + i];
    const int z = (int)(i / plane);
    const long long e = i - z * plane;
    ts::gemm_store<Out, float>(p, z, (int)(e / p.n), (int)(e % p.n), acc);
  }
}
