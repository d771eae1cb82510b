// tessera/vec.cuh: vectorised global loads/stores and register packs.
//
// Defines: ts::CacheLoad / ts::CacheStore (cache hints),
//          ts::ld_global_b128 / b64 / b32 / b16 / b8 and ts::st_global_b128 / ... (raw PTX),
//          ts::Pack<T, N> (N elements of T in one 1/2/4/8/16-byte access),
//          ts::load_pack<N, hint>(const T*), ts::store_pack<hint>(T*, Pack),
//          ts::to_floats(Pack) -> Array<float, N>, ts::from_floats<T>(Array<float, N>) -> Pack,
//          ts::store_floats<hint>(T*, Array<float, N>) (convert + store, split into <= 16 B).
//
// Ordering: every load and store is an `asm volatile`, and stores also clobber "memory", so the
// compiler keeps them in program order. A thread that loads an element and then stores to the
// same address (an in-place kernel) therefore always reads the old value. ptxas still overlaps
// independent loads, so issue all loads of a batch before consuming any of them.
//
// Alignment: a Pack access of B bytes needs a B-byte aligned address (the caller guarantees it:
// 16-byte aligned base pointers and strides that are multiples of N).
#pragma once
#include "tessera/common.cuh"
#include "tessera/dtype.cuh"

namespace ts {

/// Cache hint of a global load (PTX ISA "Cache operators" / eviction priority).
enum class CacheLoad {
  kDefault,     // ld.global: cached in L1 and L2
  kStreaming,   // ld.global.cs: evict-first, for data read once (last use)
  kNoAllocate,  // ld.global.L1::no_allocate: skip L1, keep L2 (data read again later)
  kL2Only,      // ld.global.cg: cached in L2 only, for data other CTAs of this grid wrote
                // (read after the fence that acquired it; L1 is not coherent across SMs)
};
/// Cache hint of a global store.
enum class CacheStore {
  kDefault,    // st.global (write-back)
  kStreaming,  // st.global.cs: evict-first, for outputs nobody re-reads soon
};

/// 16 bytes as four 32-bit words.
struct alignas(16) U32x4 {
  uint32_t x, y, z, w;
};
/// 8 bytes as two 32-bit words.
struct alignas(8) U32x2 {
  uint32_t x, y;
};

// ---- raw loads ------------------------------------------------------------------------------
template <CacheLoad H = CacheLoad::kDefault>
TS_DEVICE U32x4 ld_global_b128(const void* p) {
  U32x4 v;
  if constexpr (H == CacheLoad::kStreaming) {
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (H == CacheLoad::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (H == CacheLoad::kL2Only) {
    asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}
template <CacheLoad H = CacheLoad::kDefault>
TS_DEVICE U32x2 ld_global_b64(const void* p) {
  U32x2 v;
  if constexpr (H == CacheLoad::kStreaming) {
    asm volatile("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  } else if constexpr (H == CacheLoad::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  } else if constexpr (H == CacheLoad::kL2Only) {
    asm volatile("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  } else {
    asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  }
  return v;
}
template <CacheLoad H = CacheLoad::kDefault>
TS_DEVICE uint32_t ld_global_b32(const void* p) {
  uint32_t v;
  if constexpr (H == CacheLoad::kStreaming) {
    asm volatile("ld.global.cs.u32 %0, [%1];" : "=r"(v) : "l"(p));
  } else if constexpr (H == CacheLoad::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  } else if constexpr (H == CacheLoad::kL2Only) {
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
  } else {
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  }
  return v;
}
template <CacheLoad H = CacheLoad::kDefault>
TS_DEVICE uint16_t ld_global_b16(const void* p) {
  uint16_t v;
  if constexpr (H == CacheLoad::kStreaming) {
    asm volatile("ld.global.cs.u16 %0, [%1];" : "=h"(v) : "l"(p));
  } else if constexpr (H == CacheLoad::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  } else if constexpr (H == CacheLoad::kL2Only) {
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
  } else {
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
  }
  return v;
}
template <CacheLoad H = CacheLoad::kDefault>
TS_DEVICE uint8_t ld_global_b8(const void* p) {
  uint32_t v;  // ld.u8 zero-extends into a 32-bit register
  if constexpr (H == CacheLoad::kStreaming) {
    asm volatile("ld.global.cs.u8 %0, [%1];" : "=r"(v) : "l"(p));
  } else if constexpr (H == CacheLoad::kNoAllocate) {
    asm volatile("ld.global.L1::no_allocate.u8 %0, [%1];" : "=r"(v) : "l"(p));
  } else if constexpr (H == CacheLoad::kL2Only) {
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=r"(v) : "l"(p));
  } else {
    asm volatile("ld.global.u8 %0, [%1];" : "=r"(v) : "l"(p));
  }
  return (uint8_t)v;
}

// ---- raw stores -----------------------------------------------------------------------------
template <CacheStore H = CacheStore::kDefault>
TS_DEVICE void st_global_b128(void* p, U32x4 v) {
  if constexpr (H == CacheStore::kStreaming) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  } else {
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  }
}
template <CacheStore H = CacheStore::kDefault>
TS_DEVICE void st_global_b64(void* p, U32x2 v) {
  if constexpr (H == CacheStore::kStreaming) {
    asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.x), "r"(v.y) : "memory");
  } else {
    asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.x), "r"(v.y) : "memory");
  }
}
template <CacheStore H = CacheStore::kDefault>
TS_DEVICE void st_global_b32(void* p, uint32_t v) {
  if constexpr (H == CacheStore::kStreaming) {
    asm volatile("st.global.cs.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
  } else {
    asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
  }
}
template <CacheStore H = CacheStore::kDefault>
TS_DEVICE void st_global_b16(void* p, uint16_t v) {
  if constexpr (H == CacheStore::kStreaming) {
    asm volatile("st.global.cs.u16 [%0], %1;" :: "l"(p), "h"(v) : "memory");
  } else {
    asm volatile("st.global.u16 [%0], %1;" :: "l"(p), "h"(v) : "memory");
  }
}
template <CacheStore H = CacheStore::kDefault>
TS_DEVICE void st_global_b8(void* p, uint8_t v) {
  const uint32_t w = v;  // st.u8 stores the low byte of a 32-bit register
  if constexpr (H == CacheStore::kStreaming) {
    asm volatile("st.global.cs.u8 [%0], %1;" :: "l"(p), "r"(w) : "memory");
  } else {
    asm volatile("st.global.u8 [%0], %1;" :: "l"(p), "r"(w) : "memory");
  }
}

// ---- packs ----------------------------------------------------------------------------------
/// N elements of T moved by one global access of sizeof(T) * N bytes (1, 2, 4, 8 or 16).
/// Pack<ts::f16, 8>, Pack<ts::bf16, 8>, Pack<float, 4> and Pack<ts::fp8e4m3, 16> are the
/// 16-byte packs; N = 1 is a scalar access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  static constexpr int kSize = N;
  static constexpr int kBytes = (int)sizeof(T) * N;
  static_assert(kBytes == 1 || kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16,
                "Pack: sizeof(T) * N must be 1, 2, 4, 8 or 16 bytes");
  T v[N];

  TS_DEVICE T& operator[](int i) { return v[i]; }
  TS_DEVICE const T& operator[](int i) const { return v[i]; }
};

/// Number of elements of T in one 16-byte access.
template <typename T>
inline constexpr int kPack16 = 16 / (int)sizeof(T);

/// Loads a Pack<T, N> from `p` (aligned to the pack size).
template <int N, CacheLoad H = CacheLoad::kDefault, typename T>
TS_DEVICE Pack<T, N> load_pack(const T* p) {
  using P = Pack<T, N>;
  if constexpr (P::kBytes == 16) {
    return bit_cast<P>(ld_global_b128<H>(p));
  } else if constexpr (P::kBytes == 8) {
    return bit_cast<P>(ld_global_b64<H>(p));
  } else if constexpr (P::kBytes == 4) {
    return bit_cast<P>(ld_global_b32<H>(p));
  } else if constexpr (P::kBytes == 2) {
    return bit_cast<P>(ld_global_b16<H>(p));
  } else {
    return bit_cast<P>(ld_global_b8<H>(p));
  }
}

/// Stores a Pack<T, N> to `p` (aligned to the pack size).
template <CacheStore H = CacheStore::kDefault, typename T, int N>
TS_DEVICE void store_pack(T* p, const Pack<T, N>& v) {
  using P = Pack<T, N>;
  if constexpr (P::kBytes == 16) {
    st_global_b128<H>(p, bit_cast<U32x4>(v));
  } else if constexpr (P::kBytes == 8) {
    st_global_b64<H>(p, bit_cast<U32x2>(v));
  } else if constexpr (P::kBytes == 4) {
    st_global_b32<H>(p, bit_cast<uint32_t>(v));
  } else if constexpr (P::kBytes == 2) {
    st_global_b16<H>(p, bit_cast<uint16_t>(v));
  } else {
    st_global_b8<H>(p, bit_cast<uint8_t>(v));
  }
}

/// Scalar load/store of one element (a Pack of 1).
template <CacheLoad H = CacheLoad::kDefault, typename T>
TS_DEVICE T load_scalar(const T* p) {
  return load_pack<1, H>(p)[0];
}
template <CacheStore H = CacheStore::kDefault, typename T>
TS_DEVICE void store_scalar(T* p, T v) {
  Pack<T, 1> pk;
  pk[0] = v;
  store_pack<H>(p, pk);
}

/// Converts a pack to N floats. 16-bit and 8-bit types are converted pairwise from their words.
template <typename T, int N>
TS_DEVICE Array<float, N> to_floats(const Pack<T, N>& p) {
  Array<float, N> r;
  if constexpr (N % 2 == 0 && (is_same_v<T, f16> || is_same_v<T, bf16>)) {
    const Array<uint32_t, N / 2> w = bit_cast<Array<uint32_t, N / 2>>(p);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const Array<float, 2> f = is_same_v<T, f16> ? unpack_f16x2(w[i]) : unpack_bf16x2(w[i]);
      r[2 * i] = f[0];
      r[2 * i + 1] = f[1];
    }
  } else if constexpr (N % 2 == 0 && (is_same_v<T, fp8e4m3> || is_same_v<T, fp8e5m2>)) {
    const Array<uint16_t, N / 2> w = bit_cast<Array<uint16_t, N / 2>>(p);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const Array<float, 2> f = is_same_v<T, fp8e4m3> ? unpack_e4m3x2(w[i]) : unpack_e5m2x2(w[i]);
      r[2 * i] = f[0];
      r[2 * i + 1] = f[1];
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) r[i] = to_float(p[i]);
  }
  return r;
}

/// Converts N floats to a pack of T (round to nearest even; fp8 satfinite), pairwise where the
/// target has a two-element cvt.
template <typename T, int N>
TS_DEVICE Pack<T, N> from_floats(const Array<float, N>& f) {
  if constexpr (N % 2 == 0 && (is_same_v<T, f16> || is_same_v<T, bf16>)) {
    Array<uint32_t, N / 2> w;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      w[i] = is_same_v<T, f16> ? pack_f16x2(f[2 * i], f[2 * i + 1]) : pack_bf16x2(f[2 * i], f[2 * i + 1]);
    }
    return bit_cast<Pack<T, N>>(w);
  } else if constexpr (N % 2 == 0 && (is_same_v<T, fp8e4m3> || is_same_v<T, fp8e5m2>)) {
    Array<uint16_t, N / 2> w;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      w[i] = is_same_v<T, fp8e4m3> ? pack_e4m3x2(f[2 * i], f[2 * i + 1])
                                   : pack_e5m2x2(f[2 * i], f[2 * i + 1]);
    }
    return bit_cast<Pack<T, N>>(w);
  } else {
    Pack<T, N> p;
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_float<T>(f[i]);
    return p;
  }
}

/// Converts N floats to T and stores them at `p` with accesses of at most 16 bytes: one Pack
/// when N * sizeof(T) <= 16, otherwise 16-byte pieces (then `p` must be 16-byte aligned).
template <CacheStore H = CacheStore::kDefault, typename T, int N>
TS_DEVICE void store_floats(T* p, const Array<float, N>& f) {
  if constexpr (N * (int)sizeof(T) <= 16) {
    store_pack<H>(p, from_floats<T>(f));
  } else {
    constexpr int kPiece = 16 / (int)sizeof(T);
    static_assert(N % kPiece == 0, "store_floats: N * sizeof(T) must be a multiple of 16 bytes");
#pragma unroll
    for (int i = 0; i < N / kPiece; ++i) {
      Array<float, kPiece> piece;
#pragma unroll
      for (int k = 0; k < kPiece; ++k) piece[k] = f[i * kPiece + k];
      store_pack<H>(p + i * kPiece, from_floats<T>(piece));
    }
  }
}

}  // namespace ts
