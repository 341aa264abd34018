// Weight-quantization formats: element encode/decode (host and device), per-group parameter fitting,
// and the byte layout of one quantized matrix.
//
// Conventions. A weight matrix W is [rows = N out features] x [cols = K in features], row-major, as
// nn.Linear.weight, and y = W x. Groups run along K inside one row: group g of row r covers columns
// [g*G, min((g+1)*G, K)). When G does not divide K the last group of every row is shorter (K mod G
// columns); it has its own parameters like any other group. Parameter arrays are ordered (row, group),
// row-major.
//
// Formats (q = stored code, s = scale, z = zero point; dequantized value x = s * (q - z) unless noted):
//   int8       per output row (G = K), symmetric: s = amax / 127, q = clamp(rint(x / s), -127, 127), z = 0.
//              Scale stored fp16.
//   int4       per group, symmetric with GPTQ's grid: s = 2 amax / 15, z = 8, q = clamp(rint(x / s) + 8, 0, 15),
//              representable values s * [-8 .. 7]. The step is 15/14 finer than amax / 7 and the code -8 is
//              used; +amax maps to 7.5 steps and is clipped to 7, an error of half a step, so every value of
//              the group stays within s / 2. Same convention as GPTQ checkpoints. Scale stored fp16.
//   int4_asym  per group, asymmetric (GPTQ/AWQ): the range is [min(mn, 0), max(mx, 0)] (it always contains
//              0, as in GPTQ, so an all-positive group is not clipped and 0 is exact), s = (hi - lo) / 15,
//              z = clamp(rint(-lo / s), 0, 15), q = clamp(rint(x / s) + z, 0, 15). Scale fp16, zero 4-bit.
//   fp8_e4m3,  OCP FP8, scale per output row (per_channel) or one per tensor, fp32: s = amax / fp8_max,
//   fp8_e5m2   q = fp8(x / s) rounded to nearest even and saturated to the largest finite value
//              (448 / 57344), x = decode(q) * s.
//   nf4        QLoRA NormalFloat4: blocks of G (default 64) along K, absmax a per block stored fp32,
//              q = index of the code nearest to x / a (an exact tie between two codes goes to the lower
//              code), x = code[q] * a. With double quantization the absmax values of the whole matrix get
//              their mean m subtracted and are quantized to int8 symmetric (absmax / 127, rint) in blocks of
//              256 consecutive absmax values (row-major (row, group) order, last block shorter) with an
//              fp32 scale per block; the 4-bit codes are chosen against the dequantized absmax
//              a' = max(q8 * s8 + m, 0), which is the value decoding uses.
//
// Rounding: rint (round half to even) throughout, on host and device. fp16 scales are rounded UP to the
// next fp16 value (never below the exact quotient), so the rounded scale never shrinks the range and
// every value of a group stays within half a step. fit_group returns parameters already in storage
// precision, so qdq(s, w, fit_group(...)) equals dequantize(quantize(...)) bit for bit.
//
// A group whose scale is 0 (an all-zero group; a nonzero group always gets a nonzero scale because the
// scale rounds up) encodes every value as the code of zero and decodes to exact zeros.
#pragma once

#include <math.h>
#include <string.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "common/common.hpp"
#include "common/dtype.hpp"

namespace memtrade::quant {

enum class Format { int8, int4, int4_asym, fp8_e4m3, fp8_e5m2, nf4 };

// What a format is, as data: one row per format. The layout, the RTN fit, the parameter checks and the
// names read this table; only the element codec (encode_value / decode_value) and the kernels'
// vectorized decoders are written per format.
enum class ScaleType : uint8_t { f16, f32 };
enum class ZeroPoint : uint8_t {
  none,     // codes are signed or symmetric: w = scale * decode(q)
  fixed8,   // 4-bit codes 0..15 centred on 8: w = scale * (q - 8)
  packed4,  // a 4-bit integer zero point per group, packed two per byte: w = scale * (q - z)
};
struct FormatTraits {
  const char* name;
  int code_bits;          // 8 or 4 (two codes per byte, element 2i in the low nibble)
  bool grouped;           // one scale per (row, group of `default_group` along K); else one per row
  int64_t default_group;  // grouped formats
  ScaleType scale;        // storage of a scale (fp16 scales are rounded up so amax stays in range)
  ZeroPoint zero;
  float qmax;             // RTN: scale = amax / qmax (int4-asym: (max - min) / qmax)
  bool per_tensor_option; // "-tensor": one scale for the whole matrix
};
inline constexpr FormatTraits kFormatTraits[] = {
    /* int8      */ {"int8", 8, false, 0, ScaleType::f16, ZeroPoint::none, 127.f, false},
    /* int4      */ {"int4", 4, true, 128, ScaleType::f16, ZeroPoint::fixed8, 7.5f, false},  // 2 amax / 15
    /* int4_asym */ {"int4-asym", 4, true, 128, ScaleType::f16, ZeroPoint::packed4, 15.f, false},
    /* fp8_e4m3  */ {"fp8-e4m3", 8, false, 0, ScaleType::f32, ZeroPoint::none, 448.f, true},
    /* fp8_e5m2  */ {"fp8-e5m2", 8, false, 0, ScaleType::f32, ZeroPoint::none, 57344.f, true},
    /* nf4       */ {"nf4", 4, true, 64, ScaleType::f32, ZeroPoint::none, 1.f, false},  // scale = absmax
};
MT_HD constexpr const FormatTraits& traits(Format f) { return kFormatTraits[static_cast<int>(f)]; }
MT_HD constexpr bool four_bit(Format f) { return traits(f).code_bits == 4; }

struct Spec {
  Format format = Format::int8;
  int64_t group = 128;        // int4 / int4_asym / nf4 group size along K; int8 and fp8 ignore it
  bool double_quant = false;  // nf4 only
  bool per_channel = true;    // fp8: one scale per output row, else one per tensor
};

// RTN parameters of one group. zero: int4_asym's integer zero point (0..15), 8 for int4, else 0.
struct GroupParams {
  float scale = 0;
  float zero = 0;
};

// Calls fn.template operator()<F>() with f as a compile-time constant (kernels templated on the format).
template <class Fn>
void with_format(Format f, Fn&& fn) {
  switch (f) {
    case Format::int8: fn.template operator()<Format::int8>(); return;
    case Format::int4: fn.template operator()<Format::int4>(); return;
    case Format::int4_asym: fn.template operator()<Format::int4_asym>(); return;
    case Format::fp8_e4m3: fn.template operator()<Format::fp8_e4m3>(); return;
    case Format::fp8_e5m2: fn.template operator()<Format::fp8_e5m2>(); return;
    case Format::nf4: fn.template operator()<Format::nf4>(); return;
  }
}

// Each OpenMP thread's contiguous share [r0, r1) of rows [0, n): fn(r0, r1) once per thread, for kernels
// that keep per-thread state (a permuted copy of x).
template <class Fn>
void rows_per_thread(int64_t n, Fn&& fn) {
#if defined(_OPENMP)
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    fn(n * t / nt, n * (t + 1) / nt);
  }
#else
  fn(int64_t{0}, n);
#endif
}

// Default nf4 block size (bitsandbytes) and the double-quantization block.
inline constexpr int64_t nf4_default_group = 64;
inline constexpr int64_t nf4_dq_block = 256;

inline constexpr float fp8_e4m3_max = kFormatTraits[static_cast<int>(Format::fp8_e4m3)].qmax;
inline constexpr float fp8_e5m2_max = kFormatTraits[static_cast<int>(Format::fp8_e5m2)].qmax;

// ---------------------------------------------------------------------------------------------
// Element codecs (host and device; pure arithmetic and bit manipulation, identical everywhere).

// OCP FP8 E4M3 (bias 7, no Inf, NaN = S.1111.111) and E5M2 (bias 15, Inf = S.11111.00).
// Encode: round to nearest even, saturate to the largest finite value (Inf too), any NaN -> 0x7F,
// exactly as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...).
namespace fp8_detail {
template <int EBITS, int MBITS>
MT_HD uint8_t fp8_encode(float f) {
  constexpr int bias = (1 << (EBITS - 1)) - 1;
  constexpr uint32_t max_code = EBITS == 4 ? 0x7Eu : 0x7Bu;
  // float bits of the largest finite fp8 value and of the smallest fp8 normal
  constexpr uint32_t max_bits = EBITS == 4 ? 0x43E00000u /* 448 */ : 0x47600000u /* 57344 */;
  constexpr uint32_t min_normal_bits = static_cast<uint32_t>(127 - bias + 1) << 23;
  const uint32_t x = memtrade::detail::float_as_bits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7Fu;  // any NaN -> the canonical NaN 0x7F (a NaN in both formats)
  if (a > max_bits) {
    // Above the largest finite value (including Inf): rounds to it or beyond; saturate.
    return static_cast<uint8_t>(sign | max_code);
  }
  if (a >= min_normal_bits) {
    // Normal: rebias the exponent and round the mantissa to MBITS bits; a carry bumps the exponent.
    uint32_t r = memtrade::detail::shift_right_rne(a - (static_cast<uint32_t>(127 - bias) << 23), 23 - MBITS);
    if (r > max_code) r = max_code;
    return static_cast<uint8_t>(sign | r);
  }
  // Subnormal or zero: round(|f| / 2^-(bias - 1 + MBITS)). |f| = M * 2^(e - 150), M the 24-bit significand.
  const uint32_t e = a >> 23;
  if (e == 0) return static_cast<uint8_t>(sign);  // fp32 subnormal: far below half the smallest fp8 subnormal
  const uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
  const int s = 150 - (bias - 1 + MBITS) - static_cast<int>(e);
  if (s > 31) return static_cast<uint8_t>(sign);
  return static_cast<uint8_t>(sign | memtrade::detail::shift_right_rne(m, static_cast<unsigned>(s)));
}

// Decode: place exponent and mantissa in a float's bits and multiply by 2^(127 - bias); the product
// is exact, and an fp8 subnormal lands on an fp32 subnormal that the multiply scales exactly.
template <int EBITS, int MBITS>
MT_HD float fp8_decode(uint8_t c) {
  const uint32_t mag = c & 0x7Fu;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  if constexpr (EBITS == 4) {
    if (mag == 0x7Fu) return memtrade::detail::bits_as_float(sign | 0x7FC00000u);
  } else {
    if (mag >= 0x7Cu)
      return memtrade::detail::bits_as_float(sign | 0x7F800000u | (mag > 0x7Cu ? 0x00400000u : 0u) |
                                             ((mag & 0x3u) << 21));
  }
  constexpr float pow2 = EBITS == 4 ? 0x1p120f : 0x1p112f;  // 2^(127 - bias)
  const float v = memtrade::detail::bits_as_float(mag << (23 - MBITS)) * pow2;
  return memtrade::detail::bits_as_float(memtrade::detail::float_as_bits(v) | sign);
}
}  // namespace fp8_detail

MT_HD uint8_t fp8_e4m3_encode(float f) { return fp8_detail::fp8_encode<4, 3>(f); }
MT_HD uint8_t fp8_e5m2_encode(float f) { return fp8_detail::fp8_encode<5, 2>(f); }
MT_HD float fp8_e4m3_decode(uint8_t c) { return fp8_detail::fp8_decode<4, 3>(c); }
MT_HD float fp8_e5m2_decode(uint8_t c) { return fp8_detail::fp8_decode<5, 2>(c); }

// The 16 NF4 code values (bitsandbytes / QLoRA), ascending; code 7 is exactly 0.
MT_HD float nf4_code(int i) {
  constexpr float codes[16] = {-1.0f,
                               -0.6961928009986877f,
                               -0.5250730514526367f,
                               -0.39491748809814453f,
                               -0.28444138169288635f,
                               -0.18477343022823334f,
                               -0.09105003625154495f,
                               0.0f,
                               0.07958029955625534f,
                               0.16093020141124725f,
                               0.24611230194568634f,
                               0.33791524171829224f,
                               0.44070982933044434f,
                               0.5626170039176941f,
                               0.7229568362236023f,
                               1.0f};
  return codes[i & 15];
}

// Index of the NF4 code nearest to x (x normally in [-1, 1]; beyond it clamps to the end codes).
// Binary search over the 15 midpoints (c[i] + c[i+1]) / 2; x equal to a midpoint goes to the lower code.
MT_HD int nf4_encode(float x) {
  int lo = 0;  // answer in [lo, lo + 15]
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int step = 8; step >= 1; step >>= 1) {
    const int i = lo + step - 1;  // midpoint between codes i and i + 1
    const float mid = 0.5f * (nf4_code(i) + nf4_code(i + 1));
    if (x > mid) lo += step;
  }
  return lo;
}

// Integer grids. rint is round-half-to-even on host and device.
MT_HD float clampf_(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Quantize one value given its group's (storage-precision) parameters. Returns the code as stored:
// int8 as its two's complement byte, int4/int4_asym the 4-bit code 0..15, fp8 the byte, nf4 0..15.
// A scale of 0 (or a nonpositive nf4 absmax) yields the code of exact zero.
MT_HD uint8_t encode_value(Format f, float w, float scale, float zero) {
  switch (f) {
    case Format::int8: {
      if (!(scale != 0.f)) return 0;
      const float q = clampf_(rintf(w / scale), -127.f, 127.f);
      return static_cast<uint8_t>(static_cast<int8_t>(q));
    }
    case Format::int4:
    case Format::int4_asym: {
      if (!(scale != 0.f)) return static_cast<uint8_t>(zero);
      const float q = clampf_(rintf(w / scale) + zero, 0.f, 15.f);
      return static_cast<uint8_t>(q);
    }
    case Format::fp8_e4m3: return scale != 0.f ? fp8_e4m3_encode(w / scale) : uint8_t{0};
    case Format::fp8_e5m2: return scale != 0.f ? fp8_e5m2_encode(w / scale) : uint8_t{0};
    case Format::nf4: return static_cast<uint8_t>(scale != 0.f ? nf4_encode(w / scale) : 7);
  }
  return 0;
}

// Dequantize one stored code. int formats: scale * (q - zero), exact in fp32 (an fp16 scale times an
// integer of at most 8 bits); fp8: decode(q) * scale; nf4: code[q] * scale.
MT_HD float decode_value(Format f, uint8_t q, float scale, float zero) {
  switch (f) {
    case Format::int8: return scale * static_cast<float>(static_cast<int8_t>(q));
    case Format::int4:
    case Format::int4_asym: return scale * (static_cast<float>(q) - zero);
    case Format::fp8_e4m3: return fp8_e4m3_decode(q) * scale;
    case Format::fp8_e5m2: return fp8_e5m2_decode(q) * scale;
    case Format::nf4: return nf4_code(q) * scale;
  }
  return 0.f;
}

// Nibble access for the 4-bit formats: element 2i in the low nibble of byte i, 2i+1 in the high one.
MT_HD uint8_t nibble(const uint8_t* row, int64_t k) {
  const uint8_t b = row[k >> 1];
  return (k & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0x0F);
}

// Dequantized nf4 absmax under double quantization: max(q8 * s8 + mean, 0) (two separate roundings,
// no fma, so host and device agree). An absmax is never negative: a block whose absmax is within s8 / 2
// of zero may come out below zero, and is clamped to 0 (its values were at most s8 / 2 anyway).
MT_HD float nf4_dq_absmax(int8_t q8, float s8, float mean) {
#if defined(__CUDA_ARCH__)
  const float a = __fadd_rn(__fmul_rn(static_cast<float>(q8), s8), mean);
#else
  // The product is exact in double and rounded once to float, and no fma can span the conversion: the
  // same two roundings, without a store and reload (a volatile) in the kernels' per-group loops.
  const float t = static_cast<float>(static_cast<double>(q8) * static_cast<double>(s8));
  const float a = t + mean;
#endif
  return a > 0.f ? a : 0.f;
}

// Quantize one value to the grid and dequantize it (host and device).
MT_HD float qdq(const Spec& s, float w, const GroupParams& p) {
  return decode_value(s.format, encode_value(s.format, w, p.scale, p.zero), p.scale, p.zero);
}

// ---------------------------------------------------------------------------------------------
// Host API.

// Parameters of one group of n values by round-to-nearest, in storage precision (fp16 scales rounded
// up). nf4: scale = absmax (fp32), without double quantization (that needs the whole matrix). fp8: for
// a per-tensor spec pass the whole tensor. Throws Error for a NaN/Inf value (naming its index in the
// group) or an fp16 scale overflow.
GroupParams fit_group(const Spec& s, const float* w, int64_t n);

// Effective group size along K for a matrix with `cols` columns: K for int8 and fp8, else
// min(Spec.group, K).
int64_t group_size(const Spec& s, int64_t cols);

// "int8", "int4" (g128), "int4-g64", "int4-asym", "int4-asym-g64", "fp8-e4m3", "fp8-e5m2",
// "fp8-e4m3-tensor", "nf4" (g64), "nf4-g128", "nf4-dq", "nf4-dq-g128". Error (listing the forms) otherwise.
Spec parse_spec(std::string_view name);
std::string spec_name(const Spec& s);  // canonical name; parse_spec(spec_name(s)) == s
const char* format_name(Format f);
// Each row's codes and parameters follow from that row's weights alone (no per-tensor scale, no nf4 double
// quantization across rows), so matrices stacked row-wise quantize as each does alone.
bool rows_independent(const Spec& s);

// One byte range inside a blob.
struct Section {
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

// The layout of ONE contiguous blob holding a quantized [rows x cols] matrix. Sections start at
// multiples of 16 bytes (for 128-bit loads); the padding between them is counted in total_bytes.
//   codes     rows * row_bytes: int8 / fp8 one byte per weight (row_bytes = K); int4 / int4_asym / nf4
//             two per byte (row_bytes = ceil(K/2), odd K pads the last high nibble with the zero code).
//   scales    int8: rows fp16; int4 / int4_asym: rows*groups fp16; nf4: rows*groups fp32 absmax, or with
//             double quantization rows*groups int8; fp8: rows fp32 (per channel) or 1 fp32 (per tensor).
//   zeros     int4_asym only: per row ceil(groups/2) bytes of packed 4-bit zero points (same nibble order).
//   dq_scales nf4 double quantization: ceil(rows*groups / 256) fp32.
//   dq_mean   nf4 double quantization: one fp32.
struct QLayout {
  Spec spec;
  int64_t rows = 0, cols = 0;
  int64_t group = 0;           // effective group size (see group_size)
  int64_t groups_per_row = 0;  // ceil(cols / group)
  int64_t row_bytes = 0;       // bytes of packed codes per row
  int64_t zero_row_bytes = 0;  // int4_asym: bytes of packed zero points per row
  Section codes, scales, zeros, dq_scales, dq_mean;
  std::size_t total = 0;

  std::size_t total_bytes() const { return total; }
  double bits_per_weight() const { return 8.0 * static_cast<double>(total) / (static_cast<double>(rows) * cols); }
  // Number of GroupParams quantize() takes: rows * groups_per_row, except fp8 per tensor: 1.
  int64_t num_params() const;
};

inline constexpr std::size_t section_align = 16;

QLayout layout(const Spec& s, int64_t rows, int64_t cols);

// Quantize W [rows x cols] into blob (layout.total_bytes() bytes; padding bytes are zeroed). params:
// one per (row, group) in row-major order (layout.num_params()), already in storage precision (e.g. from
// GPTQ/AWQ); nullptr fits them by RTN. nf4 double quantization requires params == nullptr. Throws
// Error naming the row and column of a NaN/Inf weight.
void quantize(const QLayout& L, const float* W, uint8_t* blob, const GroupParams* params = nullptr);

// Dequantize the whole matrix into W [rows x cols].
void dequantize(const QLayout& L, const uint8_t* blob, float* W);

// An unaligned little-endian load of a T at byte address p (host and device).
template <class T>
MT_HD T load_bytes(const uint8_t* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

// Parameters (scale, zero) of group g of row r as stored in a blob (for nf4-dq the dequantized
// absmax). Host and device: the CPU and CUDA kernels read their parameters through this.
MT_HD GroupParams stored_params(const QLayout& L, const uint8_t* blob, int64_t r, int64_t g) {
  const int64_t i = r * L.groups_per_row + g;
  GroupParams p;
  switch (L.spec.format) {
    case Format::int8: p.scale = to_float(load_bytes<f16_t>(blob + L.scales.offset + 2 * r)); break;
    case Format::int4:
      p.scale = to_float(load_bytes<f16_t>(blob + L.scales.offset + 2 * i));
      p.zero = 8.f;
      break;
    case Format::int4_asym:
      p.scale = to_float(load_bytes<f16_t>(blob + L.scales.offset + 2 * i));
      p.zero = static_cast<float>(nibble(blob + L.zeros.offset + r * L.zero_row_bytes, g));
      break;
    case Format::fp8_e4m3:
    case Format::fp8_e5m2: p.scale = load_bytes<float>(blob + L.scales.offset + 4 * (L.spec.per_channel ? r : 0)); break;
    case Format::nf4:
      if (L.spec.double_quant)
        p.scale = nf4_dq_absmax(static_cast<int8_t>(blob[L.scales.offset + i]),
                                load_bytes<float>(blob + L.dq_scales.offset + 4 * (i / nf4_dq_block)),
                                load_bytes<float>(blob + L.dq_mean.offset));
      else
        p.scale = load_bytes<float>(blob + L.scales.offset + 4 * i);
      break;
  }
  return p;
}

}  // namespace memtrade::quant
