// Deterministic, counter-based random data: value i of stream `seed` is a pure
// function of (seed, i), so every backend, thread count and tile order sees the
// same numbers. Generate on the host, copy to the device.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "common/common.hpp"

namespace memtrade::datasets {

// SplitMix64 finaliser: a well-mixed 64-bit hash.
MT_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
MT_HD double uniform01(uint64_t seed, uint64_t i) {
  return static_cast<double>(mix64(seed * 0xD1B54A32D192ED03ull ^ mix64(i)) >> 11) * 0x1.0p-53;
}

// Standard normal via Box-Muller over two independent uniforms.
MT_HD double normal(uint64_t seed, uint64_t i) {
  const double u1 = 1.0 - uniform01(seed, 2 * i);  // (0, 1]: log is finite
  const double u2 = uniform01(seed, 2 * i + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

inline void fill_uniform(std::span<double> out, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = lo + (hi - lo) * uniform01(seed, i);
}

inline void fill_normal(std::span<double> out, uint64_t seed, double mean = 0.0, double stddev = 1.0) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = mean + stddev * normal(seed, i);
}

}  // namespace memtrade::datasets
