// tessera/common.cuh: the base of tessera's header-free device library.
//
// Defines: int8_t..uint64_t, size_t, uintptr_t (global namespace, no system headers),
//          TS_DEVICE, ts::is_same_v, ts::conditional_t, ts::bool_constant,
//          ts::ceil_div, ts::round_up, ts::is_pow2, ts::log2_floor, ts::next_pow2,
//          ts::thread_id / lane_id / warp_id / num_warps, ts::kWarpSize, ts::kFullMask,
//          ts::kLog2e, ts::kLn2, ts::kNegInf, ts::kPosInf, ts::kNaN (constexpr floats),
//          ts::Array<T, N> (register array), ts::bit_cast, ts::dynamic_smem<T>(),
//          ts::wait_prior_grids / ts::allow_dependent_grids (programmatic dependent launch).
//
// Every kernel is compiled by NVRTC with `--std=c++17 -default-device`; the headers of
// src/cuda/ are handed to NVRTC as named headers `tessera/<file>`. Nothing here includes a
// CUDA toolkit header: NVRTC's builtins (threadIdx, __shfl_xor_sync, __int_as_float,
// __builtin_bit_cast, ...) are all we rely on. Inline PTX lives only in small named
// wrappers in these headers, never in a kernel file.
#pragma once

// ---- fixed-width integers ---------------------------------------------------------------
// `long long` (not `long`) for the 64-bit types: NVRTC follows the host ABI and `long` is
// 32 bits on Windows. A redeclaration with the same type is legal, so a kernel that also gets
// these from elsewhere still compiles.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef decltype(sizeof(0)) size_t;
typedef unsigned long long uintptr_t;

static_assert(sizeof(int8_t) == 1 && sizeof(int16_t) == 2 && sizeof(int32_t) == 4 && sizeof(int64_t) == 8,
              "fixed-width integer sizes");
static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8, "tessera kernels are 64-bit only");

/// Every device-library function: inlined into the kernel, no call overhead, no ABI.
#define TS_DEVICE __device__ __forceinline__

namespace ts {

// ---- constants --------------------------------------------------------------------------
constexpr int kWarpSize = 32;
constexpr uint32_t kFullMask = 0xffffffffu;
/// log2(e) and ln(2), rounded to f32. Softmax kernels work in the log2 domain:
/// exp(x) = exp2(x * kLog2e); the host passes `scale * log2(e)` pre-multiplied.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

/// IEEE special values from their bit patterns, i.e. __int_as_float(0xff800000) etc., but
/// usable in constant expressions (NVRTC's __builtin_bit_cast is constexpr).
constexpr float kNegInf = __builtin_bit_cast(float, 0xff800000u);
constexpr float kPosInf = __builtin_bit_cast(float, 0x7f800000u);
constexpr float kNaN = __builtin_bit_cast(float, 0x7fffffffu);
static_assert(kNegInf < 0.0f && kPosInf > 0.0f && !(kNaN == kNaN), "special float constants");

// ---- type traits (no <type_traits>) ----------------------------------------------------
template <typename A, typename B>
inline constexpr bool is_same_v = false;
template <typename A>
inline constexpr bool is_same_v<A, A> = true;
template <bool C, typename A, typename B>
struct conditional { using type = A; };
template <typename A, typename B>
struct conditional<false, A, B> { using type = B; };
template <bool C, typename A, typename B>
using conditional_t = typename conditional<C, A, B>::type;
/// A compile-time bool as a type, e.g. to hand a generic lambda a constant it branches on with
/// `if constexpr (decltype(flag)::value)`.
template <bool B>
struct bool_constant { static constexpr bool value = B; };

// ---- integer helpers --------------------------------------------------------------------
template <typename T>
TS_DEVICE constexpr T ceil_div(T a, T b) { return (a + b - 1) / b; }
template <typename T>
TS_DEVICE constexpr T round_up(T a, T b) { return ceil_div(a, b) * b; }
TS_DEVICE constexpr bool is_pow2(long long x) { return x > 0 && (x & (x - 1)) == 0; }
/// floor(log2(x)) for x >= 1, usable in constant expressions.
TS_DEVICE constexpr int log2_floor(long long x) { return x <= 1 ? 0 : 1 + log2_floor(x >> 1); }
/// Smallest power of two >= x (x >= 1), usable in constant expressions.
TS_DEVICE constexpr int next_pow2(int x) { return x <= 1 ? 1 : 2 * next_pow2((x + 1) / 2); }
template <typename T>
TS_DEVICE constexpr T min_c(T a, T b) { return a < b ? a : b; }
template <typename T>
TS_DEVICE constexpr T max_c(T a, T b) { return a < b ? b : a; }

// ---- thread indexing (1-D blocks) -------------------------------------------------------
TS_DEVICE int thread_id() { return (int)threadIdx.x; }
TS_DEVICE int lane_id() { return (int)threadIdx.x & (kWarpSize - 1); }
TS_DEVICE int warp_id() { return (int)threadIdx.x / kWarpSize; }
TS_DEVICE int num_warps() { return (int)blockDim.x / kWarpSize; }

// ---- bit casts --------------------------------------------------------------------------
/// Reinterprets the bytes of `from` as a `To` of the same size (C++20 std::bit_cast; NVRTC
/// provides the builtin). Free on registers and well defined, unlike pointer punning.
template <typename To, typename From>
TS_DEVICE constexpr To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast: sizes differ");
  return __builtin_bit_cast(To, from);
}

// ---- register array ---------------------------------------------------------------------
/// Alignment of an N-element array of T: the largest power of two dividing its size, capped
/// at 16 bytes (one vector access), so an Array<ts::f16, 8> can be moved with one 128-bit op.
template <typename T, int N>
constexpr int array_align() {
  constexpr int bytes = (int)sizeof(T) * N;
  return (bytes % 16 == 0) ? 16 : (bytes % 8 == 0) ? 8 : (bytes % 4 == 0) ? 4 : (bytes % 2 == 0) ? 2 : 1;
}

/// A fixed-size array meant to live in registers. Index it only with compile-time constants
/// (inside fully unrolled loops), otherwise it is demoted to local memory.
template <typename T, int N>
struct alignas(array_align<T, N>()) Array {
  static_assert(N > 0, "Array: N must be positive");
  static constexpr int kSize = N;
  T data[N];

  TS_DEVICE T& operator[](int i) { return data[i]; }
  TS_DEVICE const T& operator[](int i) const { return data[i]; }
  TS_DEVICE static constexpr int size() { return N; }
  TS_DEVICE void fill(const T& v) {
#pragma unroll
    for (int i = 0; i < N; ++i) data[i] = v;
  }
};

// ---- shared memory ----------------------------------------------------------------------
/// The kernel's dynamic shared memory (`extern __shared__`), 16-byte aligned, as a T*.
template <typename T>
TS_DEVICE T* dynamic_smem() {
  alignas(16) extern __shared__ unsigned char ts_dynamic_smem[];
  return reinterpret_cast<T*>(ts_dynamic_smem);
}

// ---- programmatic dependent launch (sm_90+; no-ops before) -------------------------------
// A kernel launched with LaunchConfig::dependent_launch may start while the previous kernel on
// its stream is still running. It must call wait_prior_grids() before its first global memory
// access (read or write): that waits until the previous grid has completed and its writes are
// visible (a no-op when the launch had no such dependency). allow_dependent_grids() lets the
// next dependent kernel be scheduled once every CTA of this grid has called it or exited; the
// next kernel's own wait still orders its memory accesses after this whole grid.

/// Waits for the grids this one depends on programmatically (griddepcontrol.wait).
TS_DEVICE void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Allows the next programmatically dependent grid to launch (griddepcontrol.launch_dependents).
TS_DEVICE void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace ts
