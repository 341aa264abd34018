#include <gtest/gtest.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/simd/convert.hpp"
#include "common/simd/grad_add.hpp"
#include "common/simd/targets.hpp"
#include "precision/policies.hpp"

using namespace memtrade;

// The bulk conversions of common/simd/convert.hpp, on every SIMD target this machine runs, equal the scalar
// ones bit for bit: every 16-bit pattern widened, and fp32 inputs around every rounding decision of both
// formats (each 16-bit high half with low halves at and beside the bf16 and fp16 ties, and the fp16
// subnormal range's ties) plus a million random patterns narrowed. Odd lengths cover the scalar tails.

TEST(Convert, BulkConversionsEqualTheScalarOnesOnEveryTarget) {
  std::vector<uint16_t> all16(65536 + 3);
  for (size_t i = 0; i < all16.size(); ++i) all16[i] = static_cast<uint16_t>(i);
  std::vector<uint32_t> f32bits;
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x0FFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFu, 0x8000u, 0x8001u,
                        0xA000u, 0xE000u, 0xF000u, 0xFFFFu})
      f32bits.push_back(hi << 16 | lo);
  std::mt19937 rng(7);
  for (int i = 0; i < 1000003; ++i) f32bits.push_back(static_cast<uint32_t>(rng()));
  std::vector<float> f32(f32bits.size());
  std::memcpy(f32.data(), f32bits.data(), f32bits.size() * 4);
  for (int64_t t : simd::available_targets()) {
    simd::restrict_to(t);
    const std::string target = simd::name_of(t);
    std::vector<float> wide(all16.size());
    simd::to_f32(reinterpret_cast<const bf16_t*>(all16.data()), wide.data(), static_cast<int64_t>(all16.size()));
    int bad = 0;
    for (size_t i = 0; i < all16.size() && bad < 5; ++i)
      if (detail::float_as_bits(wide[i]) != detail::float_as_bits(bf16_bits_to_float(all16[i]))) {
        ADD_FAILURE() << target << " bf16 0x" << std::hex << all16[i] << " -> 0x" << detail::float_as_bits(wide[i]);
        ++bad;
      }
    simd::to_f32(reinterpret_cast<const f16_t*>(all16.data()), wide.data(), static_cast<int64_t>(all16.size()));
    for (size_t i = 0; i < all16.size() && bad < 5; ++i)
      if (detail::float_as_bits(wide[i]) != detail::float_as_bits(half_bits_to_float(all16[i]))) {
        ADD_FAILURE() << target << " fp16 0x" << std::hex << all16[i] << " -> 0x" << detail::float_as_bits(wide[i]);
        ++bad;
      }
    std::vector<bf16_t> nb(f32.size());
    std::vector<f16_t> nh(f32.size());
    simd::from_f32(f32.data(), nb.data(), static_cast<int64_t>(f32.size()));
    simd::from_f32(f32.data(), nh.data(), static_cast<int64_t>(f32.size()));
    for (size_t i = 0; i < f32.size() && bad < 5; ++i) {
      if (nb[i].bits != float_to_bf16_bits(f32[i])) {
        ADD_FAILURE() << target << " 0x" << std::hex << f32bits[i] << " -> bf16 0x" << nb[i].bits;
        ++bad;
      }
      if (nh[i].bits != float_to_half_bits(f32[i])) {
        ADD_FAILURE() << target << " 0x" << std::hex << f32bits[i] << " -> fp16 0x" << nh[i].bits;
        ++bad;
      }
    }
  }
  simd::restrict_to(0);
}

// The stochastic fp32 -> bf16 rounding on every target equals precision::round_bf16_stochastic bit for bit
// over the same inputs as above (every high half, NaN payloads whose sum with the bits would carry into
// the sign, the largest finite values that can round up to Inf), with random bits and the extreme ones.
TEST(Convert, StochasticBf16RoundingEqualsTheScalarOneOnEveryTarget) {
  std::vector<uint32_t> f32bits, random;
  std::mt19937 rng(11);
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0xFFFFu}) {
      f32bits.push_back(hi << 16 | lo);
      random.push_back(static_cast<uint32_t>(rng()));
      f32bits.push_back(hi << 16 | lo);
      random.push_back(lo & 1 ? 0xFFFFu : 0xFFFF0000u);  // the largest addend, and none (high bits only)
    }
  for (int i = 0; i < 100003; ++i) {
    f32bits.push_back(static_cast<uint32_t>(rng()));
    random.push_back(static_cast<uint32_t>(rng()));
  }
  std::vector<float> f32(f32bits.size());
  std::memcpy(f32.data(), f32bits.data(), f32bits.size() * 4);
  for (int64_t t : simd::available_targets()) {
    simd::restrict_to(t);
    std::vector<bf16_t> out(f32.size());
    simd::from_f32_stochastic(f32.data(), random.data(), out.data(), static_cast<int64_t>(f32.size()));
    int bad = 0;
    for (size_t i = 0; i < f32.size() && bad < 5; ++i)
      if (out[i].bits != precision::round_bf16_stochastic(f32[i], random[i]).bits) {
        ADD_FAILURE() << simd::name_of(t) << " 0x" << std::hex << f32bits[i] << " bits 0x" << random[i] << " -> 0x" << out[i].bits;
        ++bad;
      }
  }
  simd::restrict_to(0);
}

// grad_add (common/simd/grad_add.hpp) on every target: the scalar loop's sums bit for bit and its counts
// exactly, over contributions at and beside fp16's round-to-zero threshold 2^-25, zeros of both signs,
// subnormals, NaN and Inf, random patterns, and lengths that leave every tail size.
TEST(GradAdd, SumsAndCountsEqualTheScalarLoopOnEveryTarget) {
  const float t = 0x1p-25f;
  std::vector<float> special = {0.f, -0.f, t, -t, std::nextafter(t, 1.f), -std::nextafter(t, 1.f), std::nextafter(t, 0.f),
                                1e-45f, -1e-45f, 1.f, -3.5f, INFINITY, -INFINITY, NAN, 6e-8f, 3e-8f};
  std::mt19937 rng(11);
  std::vector<float> r, g0;
  for (int i = 0; i < 4099; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    float v;
    std::memcpy(&v, &bits, 4);
    r.push_back(i % 3 == 0 ? special[static_cast<size_t>(i / 3) % special.size()] : (i % 3 == 1 ? v : std::ldexp(v, -100)));
    g0.push_back(static_cast<float>(i % 7) - 3.f);
  }
  for (int64_t n : {0, 1, 7, 15, 16, 17, 33, 4099}) {
    std::vector<float> want = g0;
    int64_t nonzero = 0, under = 0;
    for (int64_t i = 0; i < n; ++i) {
      nonzero += r[i] != 0.f;
      under += r[i] != 0.f && f16_rounds_to_zero(r[i]);
      want[i] += r[i];
    }
    for (int64_t target : simd::available_targets()) {
      simd::restrict_to(target);
      std::vector<float> got = g0;
      const simd::GradAddCounts c = simd::grad_add(r.data(), got.data(), n);
      EXPECT_EQ(c.nonzero, nonzero) << simd::name_of(target) << " n=" << n;
      EXPECT_EQ(c.f16_underflow, under) << simd::name_of(target) << " n=" << n;
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * 4)) << simd::name_of(target) << " n=" << n;
      // 16-bit gradients: each element widened, added and rounded once, as the scalar conversions do
      auto check16 = [&](auto tag) {
        using G = decltype(tag);
        std::vector<G> g16(g0.size()), want16(g0.size());
        for (size_t i = 0; i < g0.size(); ++i) {
          g16[i] = from_f32<G>(g0[i] + std::ldexp(r[(i * 7) % r.size()], -3));  // rounding work to do
          want16[i] = static_cast<int64_t>(i) < n ? from_f32<G>(to_f32(g16[i]) + r[i]) : g16[i];
        }
        const simd::GradAddCounts c16 = simd::grad_add(r.data(), g16.data(), n);
        EXPECT_EQ(c16.nonzero, nonzero) << simd::name_of(target) << " n=" << n;
        EXPECT_EQ(c16.f16_underflow, under) << simd::name_of(target) << " n=" << n;
        EXPECT_EQ(0, std::memcmp(g16.data(), want16.data(), want16.size() * sizeof(G)))
            << simd::name_of(target) << " n=" << n << (std::is_same_v<G, bf16_t> ? " bf16" : " fp16");
      };
      check16(bf16_t{});
      check16(f16_t{});
    }
  }
  simd::restrict_to(0);
}
