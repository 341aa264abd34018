// Element types of the benchmark suite and bit-exact fp16 / bf16 conversions.
//
// The conversions are pure integer bit manipulation (no hardware conversion instructions), so
// a value converts to the same bits on every host and device. They round to nearest, ties to
// even; overflow goes to +-Inf; subnormals are handled exactly; signed zeros and Inf are kept;
// a NaN stays a NaN of the same sign with the quiet bit set and the top payload bits kept.
//
// Layouts (sign | exponent | mantissa, exponent bias):
//   fp32: 1 | 8 | 23, bias 127     fp16: 1 | 5 | 10, bias 15     bf16: 1 | 8 | 7, bias 127
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "common/common.hpp"

namespace memtrade {

enum class DType : uint8_t { f64, f32, f16, bf16, i32, i8, u8 };

MT_HD constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i8: return 1;
    case DType::u8: return 1;
  }
  return 0;
}

MT_HD constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f64: return "fp64";
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::i32: return "int32";
    case DType::i8: return "int8";
    case DType::u8: return "uint8";
  }
  return "?";
}

// Unit roundoff u = 2^-(mantissa bits + 1) of the floating-point dtypes (round to nearest); 0 otherwise.
MT_HD constexpr double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64: return 0x1p-53;
    case DType::f32: return 0x1p-24;
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
    default: return 0;
  }
}

// Host only: the inverse of dtype_name.
inline DType parse_dtype(std::string_view s) {
  constexpr DType all[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i32, DType::i8, DType::u8};
  std::string expected;
  for (DType t : all) {
    if (s == dtype_name(t)) return t;
    expected += expected.empty() ? "" : ", ";
    expected += dtype_name(t);
  }
  throw Error("unknown dtype '" + std::string(s) + "' (expected one of " + expected + ")");
}

// Storage types: just the 16 bits. Arithmetic happens in float.
struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
static_assert(sizeof(f16_t) == 2 && std::is_trivially_copyable_v<f16_t>);
static_assert(sizeof(bf16_t) == 2 && std::is_trivially_copyable_v<bf16_t>);

// Limits of the 16-bit formats.
inline constexpr double fp16_max = 65504.0;             // 0x7BFF = (2 - 2^-10) * 2^15
inline constexpr double fp16_min_normal = 0x1p-14;      // 0x0400
inline constexpr double fp16_min_subnormal = 0x1p-24;   // 0x0001
inline constexpr double bf16_max = 0x1.FEp127;          // 0x7F7F = (2 - 2^-7) * 2^127
inline constexpr double bf16_min_normal = 0x1p-126;     // 0x0080
inline constexpr double bf16_min_subnormal = 0x1p-133;  // 0x0001

namespace detail {

MT_HD uint32_t float_as_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);
#endif
}

MT_HD float bits_as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

// v / 2^s rounded to nearest, ties to even (1 <= s <= 31).
MT_HD uint32_t shift_right_rne(uint32_t v, unsigned s) {
  const uint32_t q = v >> s;
  const uint32_t rem = v & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

}  // namespace detail

MT_HD uint16_t float_to_half_bits(float f) {
  const uint32_t x = detail::float_as_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;  // |f|

  if (a > 0x7F800000u)  // NaN: quiet bit 0x0200 plus the top 10 payload bits
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x03FFu));
  // 65520 = 0x477FF000 is halfway between 65504 (largest finite) and 2^16 (which would be the next
  // value); the tie goes to the even one, 2^16, which is out of range: Inf. So >= 65520 is Inf.
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);

  if (a >= 0x38800000u) {
    // Normal fp16 (|f| >= 2^-14): rebias the exponent (127 -> 15: subtract 112 << 23) and round
    // the 23-bit mantissa to 10 bits. A carry out of the mantissa correctly bumps the exponent,
    // and the check above keeps the result finite.
    return static_cast<uint16_t>(sign | detail::shift_right_rne(a - (112u << 23), 13));
  }
  // fp16 subnormal or zero: the result is round(|f| / 2^-24). |f| <= 2^-25 (half the smallest
  // subnormal, ties to the even 0) gives zero, keeping the sign.
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);
  // |f| = m * 2^(e - 150) with m the 24-bit significand, so |f| / 2^-24 = m / 2^(126 - e).
  // Here 102 <= e <= 112, so the shift is 14..24. Rounding up to 0x0400 gives the smallest
  // normal, which is the right encoding.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
  return static_cast<uint16_t>(sign | detail::shift_right_rne(m, 126u - e));
}

MT_HD float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x03FFu;

  if (e == 0x1Fu)  // Inf, or NaN: quiet bit 0x00400000 set, payload kept
    return detail::bits_as_float(sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u));
  if (e != 0)  // normal: rebias the exponent (15 -> 127)
    return detail::bits_as_float(sign | ((e + 112u) << 23) | (m << 13));
  if (m == 0) return detail::bits_as_float(sign);  // signed zero
  // Subnormal m * 2^-24: normalise. With the leading 1 at bit 10 the value is 1.f * 2^(fe - 127)
  // with fe = 113 (= 2^-14) minus the number of shifts.
  uint32_t fe = 113;
  while (!(m & 0x0400u)) {
    m <<= 1;
    --fe;
  }
  return detail::bits_as_float(sign | (fe << 23) | ((m & 0x03FFu) << 13));
}

MT_HD uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = detail::float_as_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u)  // NaN: quiet bit 0x0040 plus the top 7 payload bits
    return static_cast<uint16_t>(sign | 0x7FC0u | ((a >> 16) & 0x007Fu));
  // bf16 is fp32 with the low 16 bits dropped (same exponent range, so subnormals need no special
  // case): round those bits away. A carry propagates into the exponent; from the largest finite
  // values it reaches 0x7F80 = Inf, as it should. Inf itself stays Inf.
  return static_cast<uint16_t>(sign | detail::shift_right_rne(a, 16));
}

MT_HD float bf16_bits_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) x |= 0x00400000u;  // NaN: set the quiet bit
  return detail::bits_as_float(x);
}

// Whether f rounds to a signed zero in fp16 (float_to_half_bits(f) & 0x7FFF == 0): |f| <= 2^-25, half the
// smallest subnormal with the tie going to the even 0. NaN never does. One compare, for counting gradient
// underflow over whole gradients.
MT_HD bool f16_rounds_to_zero(float f) { return (f < 0.f ? -f : f) <= 0x1p-25f; }

MT_HD float to_float(f16_t h) { return half_bits_to_float(h.bits); }
MT_HD float to_float(bf16_t b) { return bf16_bits_to_float(b.bits); }
MT_HD f16_t to_f16(float f) { return f16_t{float_to_half_bits(f)}; }
MT_HD bf16_t to_bf16(float f) { return bf16_t{float_to_bf16_bits(f)}; }

// Generic access for kernels templated on the storage type T in {float, f16_t, bf16_t}.
template <class T>
MT_HD float to_f32(T v) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>,
                "to_f32: T must be float, f16_t or bf16_t");
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return to_float(v);
}

template <class T>
MT_HD T from_f32(float f) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16_t> || std::is_same_v<T, bf16_t>,
                "from_f32: T must be float, f16_t or bf16_t");
  if constexpr (std::is_same_v<T, float>)
    return f;
  else if constexpr (std::is_same_v<T, f16_t>)
    return to_f16(f);
  else
    return to_bf16(f);
}

template <class T>
MT_HD float load_f32(const T* p) {
  return to_f32(*p);
}

template <class T>
MT_HD void store_f32(T* p, float f) {
  *p = from_f32<T>(f);
}

}  // namespace memtrade
