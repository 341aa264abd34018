// Bulk fp32 <-> bf16 / fp16 conversions in portable SIMD, dispatched at run time; bit for bit the scalar
// conversions of dtype.hpp (round to nearest even, subnormals, Inf, quiet NaN) on every target. Highway
// code converts in registers with convert-inl.h instead.
#pragma once

#include <cstdint>

#include "common/dtype.hpp"

namespace memtrade::simd {

void to_f32(const bf16_t* src, float* dst, int64_t n);
void to_f32(const f16_t* src, float* dst, int64_t n);
void from_f32(const float* src, bf16_t* dst, int64_t n);
void from_f32(const float* src, f16_t* dst, int64_t n);
// fp32 -> bf16 rounded stochastically with the low 16 bits of random[i] (precision::round_bf16_stochastic).
void from_f32_stochastic(const float* src, const uint32_t* random, bf16_t* dst, int64_t n);

}  // namespace memtrade::simd
