// common/dtype.hpp against an independent oracle: the host paths of CUDA's own cuda_fp16.h /
// cuda_bf16.h conversions, compiled here by the host compiler (no GPU or nvcc needed). Those host
// paths are integer implementations of round-to-nearest-even, like ours but written separately.
//
// NaN: the oracle returns a canonical NaN (0x7FFF, sign and payload dropped) while dtype.hpp keeps
// sign and top payload bits and sets the quiet bit. So for NaN inputs we only require that both
// results are NaN, and check our own NaN rule separately.
#include "common/dtype.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

using namespace memtrade;

namespace {

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t oracle_f16(float f) { return __half_raw(__float2half_rn(f)).x; }
uint16_t oracle_bf16(float f) { return __nv_bfloat16_raw(__float2bfloat16_rn(f)).x; }
float oracle_f16_to_float(uint16_t h) {
  __half_raw r;
  r.x = h;
  return __half2float(__half(r));
}
float oracle_bf16_to_float(uint16_t b) {
  __nv_bfloat16_raw r;
  r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}

bool is_nan16(uint16_t h, bool bf) { return bf ? (h & 0x7FFF) > 0x7F80 : (h & 0x7FFF) > 0x7C00; }

// Compares one float -> 16-bit conversion with the oracle; returns false (and records a failure
// with the input bits) on mismatch. Reporting stops after a few failures to keep output short.
struct Checker {
  bool bf;
  long checked = 0, failures = 0;
  void operator()(float f) {
    ++checked;
    const uint16_t got = bf ? float_to_bf16_bits(f) : float_to_half_bits(f);
    const uint16_t want = bf ? oracle_bf16(f) : oracle_f16(f);
    const bool ok = std::isnan(f) ? (is_nan16(got, bf) && is_nan16(want, bf)) : got == want;
    if (!ok && ++failures <= 10)
      ADD_FAILURE() << (bf ? "bf16" : "fp16") << " of float bits 0x" << std::hex << fbits(f) << " (" << f
                    << "): got 0x" << got << ", oracle 0x" << want;
  }
};

// Every finite 16-bit value v, the midpoints to both neighbours (exact ties) and those midpoints
// +-1 float ulp, plus v +-1 float ulp. `to_float` decodes the format; `max_mag` is the largest
// finite magnitude pattern, whose upper neighbour is taken as the next power of two (the value
// the format would have with an unbounded exponent), so that midpoint is the overflow threshold.
template <class Decode>
void check_ties(Checker& check, Decode to_float, uint16_t max_mag) {
  for (uint32_t mag = 0; mag <= max_mag; ++mag) {
    const double v = to_float(static_cast<uint16_t>(mag));
    const double up = mag == max_mag ? std::ldexp(1.0, std::ilogb(v) + 1) : to_float(static_cast<uint16_t>(mag + 1));
    const double down = mag == 0 ? -to_float(1) : to_float(static_cast<uint16_t>(mag - 1));
    for (double sign : {1.0, -1.0}) {
      const float fv = static_cast<float>(sign * v);
      check(fv);
      check(std::nextafter(fv, -INFINITY));
      check(std::nextafter(fv, INFINITY));
      for (double nb : {up, down}) {
        const double mid_d = sign * (v + nb) / 2;
        const float mid = static_cast<float>(mid_d);
        ASSERT_EQ(static_cast<double>(mid), mid_d) << "midpoint not exact in float";
        check(mid);
        check(std::nextafter(mid, -INFINITY));
        check(std::nextafter(mid, INFINITY));
      }
    }
  }
}

// Random float bit patterns with a fixed seed. Half are uniform over all 2^32 patterns (mostly
// huge/tiny values, ~0.4% NaN); the rest have the exponent drawn near the 16-bit formats' ranges
// so that normals, subnormals, underflow and overflow of fp16 are all well covered.
void check_random(Checker& check, int n) {
  std::mt19937 rng(12345);
  for (int i = 0; i < n; ++i) {
    uint32_t u = rng();
    if (i & 1) {
      const uint32_t exp = 127 - 30 + rng() % 50;  // 2^-30 .. 2^19
      u = (u & 0x807FFFFFu) | (exp << 23);
    }
    check(bitsf(u));
  }
}

}  // namespace

TEST(DType, NamesSizesParse) {
  const DType all[] = {DType::f64, DType::f32, DType::f16, DType::bf16, DType::i32, DType::i8, DType::u8};
  const char* names[] = {"fp64", "fp32", "fp16", "bf16", "int32", "int8", "uint8"};
  const std::size_t sizes[] = {8, 4, 2, 2, 4, 1, 1};
  for (int i = 0; i < 7; ++i) {
    EXPECT_STREQ(dtype_name(all[i]), names[i]);
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    EXPECT_EQ(parse_dtype(names[i]), all[i]);
  }
  static_assert(dtype_size(DType::bf16) == 2);
  EXPECT_THROW(parse_dtype("float16"), Error);
  EXPECT_THROW(parse_dtype(""), Error);
  try {
    parse_dtype("fp8");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown dtype 'fp8' (expected one of fp64, fp32, fp16, bf16, int32, int8, uint8)");
  }
}

TEST(DType, Limits) {
  EXPECT_EQ(fp16_max, half_bits_to_float(0x7BFF));
  EXPECT_EQ(fp16_min_normal, half_bits_to_float(0x0400));
  EXPECT_EQ(fp16_min_subnormal, half_bits_to_float(0x0001));
  EXPECT_EQ(bf16_max, bf16_bits_to_float(0x7F7F));
  EXPECT_EQ(bf16_min_normal, bf16_bits_to_float(0x0080));
  EXPECT_EQ(bf16_min_subnormal, bf16_bits_to_float(0x0001));
}

TEST(DType, AllHalfPatternsToFloat) {
  int failures = 0;
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float got = half_bits_to_float(static_cast<uint16_t>(h));
    const float want = oracle_f16_to_float(static_cast<uint16_t>(h));
    const bool ok = std::isnan(want) ? std::isnan(got) : fbits(got) == fbits(want);
    if (!ok && ++failures <= 10) ADD_FAILURE() << "fp16 0x" << std::hex << h;
    // Widening is exact, so narrowing back must round-trip (NaN: stays NaN).
    const uint16_t back = float_to_half_bits(got);
    if (std::isnan(got))
      EXPECT_TRUE(is_nan16(back, false));
    else
      EXPECT_EQ(back, h);
  }
  EXPECT_EQ(failures, 0);
}

TEST(DType, AllBf16PatternsToFloat) {
  int failures = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float got = bf16_bits_to_float(static_cast<uint16_t>(b));
    const float want = oracle_bf16_to_float(static_cast<uint16_t>(b));
    const bool ok = std::isnan(want) ? std::isnan(got) : fbits(got) == fbits(want);
    if (!ok && ++failures <= 10) ADD_FAILURE() << "bf16 0x" << std::hex << b;
    const uint16_t back = float_to_bf16_bits(got);
    if (std::isnan(got))
      EXPECT_TRUE(is_nan16(back, true));
    else
      EXPECT_EQ(back, b);
  }
  EXPECT_EQ(failures, 0);
}

TEST(DType, FloatToHalfTiesAndNeighbours) {
  Checker check{false};
  check_ties(check, [](uint16_t h) { return static_cast<double>(half_bits_to_float(h)); }, 0x7BFF);
  EXPECT_EQ(check.checked, 0x7C00L * 18);
  EXPECT_EQ(check.failures, 0);
}

TEST(DType, FloatToBf16TiesAndNeighbours) {
  Checker check{true};
  check_ties(check, [](uint16_t b) { return static_cast<double>(bf16_bits_to_float(b)); }, 0x7F7F);
  EXPECT_EQ(check.checked, 0x7F80L * 18);
  EXPECT_EQ(check.failures, 0);
}

TEST(DType, FloatToHalfRandom) {
  Checker check{false};
  check_random(check, 2'000'000);
  EXPECT_EQ(check.failures, 0);
}

TEST(DType, FloatToBf16Random) {
  Checker check{true};
  check_random(check, 2'000'000);
  EXPECT_EQ(check.failures, 0);
}

// The one-compare underflow test agrees with the conversion on every float whose magnitude is within
// 2^-28 .. 2^-22 (each side of the threshold 2^-25, every bit pattern), on zeros, Inf, NaN and 10M random bits.
TEST(DType, F16RoundsToZeroMatchesConversion) {
  auto agrees = [](uint32_t b) {
    const float f = bitsf(b);
    return f16_rounds_to_zero(f) == ((float_to_half_bits(f) & 0x7FFFu) == 0);
  };
  int64_t zeros = 0;
  for (uint32_t b = fbits(0x1p-28f); b <= fbits(0x1p-22f); ++b)
    for (uint32_t sign : {0u, 0x80000000u}) {
      ASSERT_TRUE(agrees(b | sign)) << std::hexfloat << bitsf(b | sign);
      zeros += f16_rounds_to_zero(bitsf(b | sign));
    }
  EXPECT_EQ(zeros, 2 * static_cast<int64_t>(fbits(0x1p-25f) - fbits(0x1p-28f) + 1));  // up to 2^-25 inclusive
  for (uint32_t b : {0u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x00000001u}) EXPECT_TRUE(agrees(b));
  EXPECT_FALSE(f16_rounds_to_zero(std::numeric_limits<float>::quiet_NaN()));
  std::mt19937 rng(7);
  for (int i = 0; i < 10'000'000; ++i) ASSERT_TRUE(agrees(rng())) << i;
}

TEST(DType, HalfSpotChecks) {
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half_bits(65519.996f), 0x7BFF);  // just below the overflow threshold
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00);    // tie between 65504 and 2^16: Inf
  EXPECT_EQ(float_to_half_bits(-65520.0f), 0xFC00);
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7C00);
  EXPECT_EQ(float_to_half_bits(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_half_bits(-INFINITY), 0xFC00);
  EXPECT_EQ(float_to_half_bits(0x1p-14f), 0x0400);           // smallest normal
  EXPECT_EQ(float_to_half_bits(0x1p-24f), 0x0001);           // smallest subnormal
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000);           // tie between 0 and 2^-24: even 0
  EXPECT_EQ(float_to_half_bits(-0x1p-25f), 0x8000);          // ... keeping the sign
  EXPECT_EQ(float_to_half_bits(0x1.000002p-25f), 0x0001);    // just above the tie
  EXPECT_EQ(float_to_half_bits(0x1.8p-24f), 0x0002);         // 1.5 * 2^-24: tie to even 2
  EXPECT_EQ(float_to_half_bits(0x1.4p-23f), 0x0002);         // 2.5 * 2^-24: tie to even 2
  EXPECT_EQ(float_to_half_bits(0x1.FF8p-15f), 0x03FF);       // largest subnormal, 1023 * 2^-24
  EXPECT_EQ(float_to_half_bits(0x1.FFCp-15f), 0x0400);       // 1023.5 * 2^-24: tie, up into the normals
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f), 0x3C00);    // tie to even 1.0
  EXPECT_EQ(float_to_half_bits(1.0f + 0x3p-11f), 0x3C02);    // tie to even 1 + 2^-9
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f + 0x1p-23f), 0x3C01);
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(1e-30f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-1e-30f), 0x8000);
  EXPECT_EQ(fbits(half_bits_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x3555), 0x1.554p-2f);  // fp16 nearest to 1/3
  EXPECT_EQ(half_bits_to_float(0xFC00), -INFINITY);
}

TEST(DType, Bf16SpotChecks) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(1.00390625f), 0x3F80);  // 1 + 2^-8: tie to even 1.0
  EXPECT_EQ(float_to_bf16_bits(1.01171875f), 0x3F82);  // 1 + 3 * 2^-8: tie to even 1 + 2^-6
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);   // rounds up to Inf
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits(0x1.FEp127f), 0x7F7F);  // largest finite bf16
  EXPECT_EQ(float_to_bf16_bits(INFINITY), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(0x1p-133f), 0x0001);     // smallest bf16 subnormal
  EXPECT_EQ(float_to_bf16_bits(0x1p-134f), 0x0000);     // tie to even 0
  EXPECT_EQ(float_to_bf16_bits(0x1.8p-133f), 0x0002);   // tie to even 2
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0xC049), -0x1.92p1f);  // bf16 pi, negated
}

TEST(DType, NaNStaysNaN) {
  // Quiet and signalling NaNs of both signs, including payloads that live only in the bits that
  // are dropped (a naive truncation would turn these into Inf).
  const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7F802000u,
                           0x7F801FFFu, 0x7FFFFFFFu, 0x7F80FFFFu, 0xFF800100u};
  for (uint32_t u : nans) {
    const float f = bitsf(u);
    const uint16_t h = float_to_half_bits(f), b = float_to_bf16_bits(f);
    EXPECT_TRUE(is_nan16(h, false)) << std::hex << u;
    EXPECT_TRUE(is_nan16(b, true)) << std::hex << u;
    EXPECT_EQ(h & 0x8000, (u >> 16) & 0x8000) << "sign kept";
    EXPECT_EQ(b & 0x8000, (u >> 16) & 0x8000) << "sign kept";
    EXPECT_TRUE(h & 0x0200) << "quiet bit";
    EXPECT_TRUE(b & 0x0040) << "quiet bit";
  }
  // Widening keeps sign and payload and sets the quiet bit.
  EXPECT_EQ(fbits(half_bits_to_float(0xFC01)), 0xFFC02000u);
  EXPECT_EQ(fbits(bf16_bits_to_float(0x7F81)), 0x7FC10000u);
}

TEST(DType, GenericHelpers) {
  const float x = 3.14159f;
  EXPECT_EQ(to_f32(x), x);
  EXPECT_EQ(from_f32<float>(x), x);
  EXPECT_EQ(from_f32<f16_t>(x).bits, float_to_half_bits(x));
  EXPECT_EQ(from_f32<bf16_t>(x).bits, float_to_bf16_bits(x));
  EXPECT_EQ(to_f32(to_f16(x)), half_bits_to_float(float_to_half_bits(x)));
  EXPECT_EQ(to_f32(to_bf16(x)), bf16_bits_to_float(float_to_bf16_bits(x)));

  f16_t h[2];
  bf16_t b[2];
  store_f32(&h[1], 0.5f);
  store_f32(&b[1], -0.25f);
  EXPECT_EQ(h[1].bits, 0x3800);
  EXPECT_EQ(b[1].bits, 0xBE80);
  EXPECT_EQ(load_f32(&h[1]), 0.5f);
  EXPECT_EQ(load_f32(&b[1]), -0.25f);
}
