#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/simd/convert.hpp"
#include "common/simd/targets.hpp"

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
