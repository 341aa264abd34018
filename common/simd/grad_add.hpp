// A weight gradient's contribution added in place, counting what the fp16 policies report: portable SIMD
// dispatched at run time, the scalar loop's sums and counts exactly on every target.
#pragma once

#include <cstdint>

#include "common/dtype.hpp"

namespace memtrade::simd {

struct GradAddCounts {
  int64_t nonzero = 0;        // contributions != 0 (NaN included)
  int64_t f16_underflow = 0;  // of those, the ones fp16 would round to zero (dtype.hpp's f16_rounds_to_zero)
};

// g[i] += r[i] for i in [0, n); 16-bit g widened, added in fp32 and rounded once per element (the bits
// of widening the row, adding and narrowing it).
GradAddCounts grad_add(const float* r, float* g, int64_t n);
GradAddCounts grad_add(const float* r, bf16_t* g, int64_t n);
GradAddCounts grad_add(const float* r, f16_t* g, int64_t n);

}  // namespace memtrade::simd
