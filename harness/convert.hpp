// Elementwise dtype conversion between a tensor and an fp32 host buffer (CPU backend), OpenMP.
#pragma once

#include "harness/tensor.hpp"

namespace memtrade {

void tensor_to_f32(const TensorView& src, float* dst);      // dst[i] = float(src[i])
void tensor_from_f32(const float* src, const TensorView& dst);  // dst[i] = round_to_dtype(src[i])

}  // namespace memtrade
