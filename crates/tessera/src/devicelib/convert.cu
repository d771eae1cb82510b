// convert.cu: device-library test of the storage-dtype conversions of dtype.cuh, both directions,
// on every target (sm_89+ takes the cvt instructions, older GPUs the portable bit manipulation;
// the *_portable functions are also run on every target, as the spec of the hardware).
//
// What it checks (each output against devicelib::reference, bit for bit; any NaN matches NaN):
//   decode, all 256 fp8 codes i, into p.fp8_dec[j][256] (f32):
//     j = 0 to_float(fp8e4m3), 1 unpack_e4m3x2 (codes i & ~1, i | 1 in one pair), 2
//     e4m3_bits_to_float_portable, 3 to_float(fp8e5m2), 4 unpack_e5m2x2;
//   fp8 -> f16 registers, into p.fp8_f16[j][256] (f16 bits):
//     j = 0 e4m3x2_to_f16x2 (pair as above), 1 e4m3x4_to_f16x4 (codes i & ~3 .. i | 3 in one
//     word), 2 e4m3_interleave_to_f16x2 (rows x = codes 8b .. 8b + 3, y = 8b + 4 .. 8b + 7 of
//     block b = i / 8: element i % 8 = 2q + h is byte q of x (h = 0) or of y (h = 1));
//   decode, all 65536 f16 and bf16 codes i, into p.half_dec[j][65536] (f32):
//     j = 0 to_float(f16), 1 unpack_f16x2 (pair i & ~1, i | 1), 2 to_float(bf16), 3 unpack_bf16x2;
//   encode, the p.n floats p.x (n even: random bit patterns and values, every fp8 value and
//   rounding midpoint, saturation bounds, +-0, +-inf, NaN, subnormals), into
//     p.fp8_enc[j][n] (bytes): j = 0 from_float<fp8e4m3>, 1 pack_e4m3x2 (x[2m], x[2m + 1] in one
//     pair), 2 float_to_e4m3_bits_portable, 3 from_float<fp8e5m2>, 4 pack_e5m2x2, 5
//     float_to_e5m2_bits_portable;
//     p.half_enc[j][n] (16-bit): j = 0 from_float<f16>, 1 pack_f16x2, 2 from_float<bf16>,
//     3 pack_bf16x2.
//
// Launch (devicelib::verify): a grid-stride loop over max(n, 65536): any grid, block = 256, no
// shared memory. sm_80+ (every CI target).
#include "tessera/dtype.cuh"

struct ConvertParams {
  const float* x;      // [n]
  uint8_t* fp8_enc;    // [6][n]
  uint16_t* half_enc;  // [4][n]
  float* fp8_dec;      // [5][256]
  uint16_t* fp8_f16;   // [3][256]
  float* half_dec;     // [4][65536]
  int n;
};
static_assert(sizeof(ConvertParams) == 56, "devicelib::verify ConvertParams");


extern "C" __global__ void __launch_bounds__(256) devicelib_convert(const __grid_constant__ ConvertParams p) {
  const int total = p.n > 65536 ? p.n : 65536;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    if (i < p.n) {
      const float x = p.x[i];
      const int lo = i & ~1;
      const float xl = p.x[lo], xh = p.x[lo + 1];
      const int half = (i & 1) * 8;
      const size_t n = (size_t)p.n;
      p.fp8_enc[0 * n + i] = ts::from_float<ts::fp8e4m3>(x).bits;
      p.fp8_enc[1 * n + i] = (uint8_t)(ts::pack_e4m3x2(xl, xh) >> half);
      p.fp8_enc[2 * n + i] = (uint8_t)ts::float_to_e4m3_bits_portable(x);
      p.fp8_enc[3 * n + i] = ts::from_float<ts::fp8e5m2>(x).bits;
      p.fp8_enc[4 * n + i] = (uint8_t)(ts::pack_e5m2x2(xl, xh) >> half);
      p.fp8_enc[5 * n + i] = (uint8_t)ts::float_to_e5m2_bits_portable(x);
      p.half_enc[0 * n + i] = ts::from_float<ts::f16>(x).bits;
      p.half_enc[1 * n + i] = (uint16_t)(ts::pack_f16x2(xl, xh) >> (2 * half));
      p.half_enc[2 * n + i] = ts::from_float<ts::bf16>(x).bits;
      p.half_enc[3 * n + i] = (uint16_t)(ts::pack_bf16x2(xl, xh) >> (2 * half));
    }
    if (i < 65536) {
      const uint32_t pair = (uint32_t)(i & ~1) | ((uint32_t)(i | 1) << 16);
      p.half_dec[0 * 65536 + i] = ts::to_float(ts::f16{(uint16_t)i});
      p.half_dec[1 * 65536 + i] = ts::unpack_f16x2(pair)[i & 1];
      p.half_dec[2 * 65536 + i] = ts::to_float(ts::bf16{(uint16_t)i});
      p.half_dec[3 * 65536 + i] = ts::unpack_bf16x2(pair)[i & 1];
    }
    if (i < 256) {
      const uint16_t pair = (uint16_t)((i & ~1) | ((i | 1) << 8));
      p.fp8_dec[0 * 256 + i] = ts::to_float(ts::fp8e4m3{(uint8_t)i});
      p.fp8_dec[1 * 256 + i] = ts::unpack_e4m3x2(pair)[i & 1];
      p.fp8_dec[2 * 256 + i] = ts::e4m3_bits_to_float_portable((uint32_t)i);
      p.fp8_dec[3 * 256 + i] = ts::to_float(ts::fp8e5m2{(uint8_t)i});
      p.fp8_dec[4 * 256 + i] = ts::unpack_e5m2x2(pair)[i & 1];

      p.fp8_f16[0 * 256 + i] = (uint16_t)(ts::e4m3x2_to_f16x2(pair) >> ((i & 1) * 16));
      const uint32_t b0 = (uint32_t)(i & ~3);
      const uint32_t word = b0 | ((b0 + 1) << 8) | ((b0 + 2) << 16) | ((b0 + 3) << 24);
      uint32_t w_lo, w_hi;
      ts::e4m3x4_to_f16x4(word, w_lo, w_hi);
      p.fp8_f16[1 * 256 + i] = (uint16_t)(((i & 2) ? w_hi : w_lo) >> ((i & 1) * 16));
      const uint32_t base = (uint32_t)(i & ~7);
      const uint32_t x = base | ((base + 1) << 8) | ((base + 2) << 16) | ((base + 3) << 24);
      const uint32_t y = x + 0x04040404u;  // codes base + 4 .. base + 7 (no byte carries: base % 8 == 0)
      uint32_t inter[4];
      ts::e4m3_interleave_to_f16x2(x, y, inter);
      const int q = (i % 8) / 2;
      uint32_t w = inter[0];
      if (q == 1) w = inter[1];
      if (q == 2) w = inter[2];
      if (q == 3) w = inter[3];
      p.fp8_f16[2 * 256 + i] = (uint16_t)(w >> ((i & 1) * 16));
    }
  }
}
