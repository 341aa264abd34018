// AdamW on the CPU over fp32 master weights and moments, as ZeRO-Offload runs it on the host (DeepSpeed's
// CPU Adam is the anchor): one fused pass per element reads the gradient (fp32, bf16 or fp16, times the
// inverse loss scale), the master weight and both moments, and writes them back together with the
// working copy of the weight rounded to its storage type. Tiled (16K elements, a tile's stores stay in
// cache), OpenMP over tiles, portable SIMD (Google Highway) dispatched at run time.
//
// The arithmetic is layers.hpp's adamw_step operation for operation (decoupled weight decay, then both
// moments, then the bias-corrected update; no fused multiply-add), so every SIMD target gives the scalar
// reference's bits and an offloaded step gives the device step's. bf16-pure's variant (bf16 weights and
// moments, no master, stochastic rounding) is the same pass over 16-bit state, below.
#pragma once

#include <cstdint>

#include "common/dtype.hpp"

namespace memtrade::model {

struct AdamStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0;
  float bc1 = 1, bc2 = 1;  // 1 - beta^t (adam_bias_corrections)
  float grad_scale = 1;    // the gradient is multiplied by this first (the inverse loss scale)
};

// One step over n parameters. G, W: float, bf16_t or f16_t; `weights` may be null (no working copy).
template <class G, class W>
void cpu_adamw(const AdamStep& s, float* master, float* m, float* v, const G* grad, W* weights, int64_t n);

// The same with adamw_step one element at a time (OpenMP over elements): the reference.
template <class G, class W>
void cpu_adamw_scalar(const AdamStep& s, float* master, float* m, float* v, const G* grad, W* weights, int64_t n);

// bf16-pure's AdamW: bf16 weights, gradients and moments, no master copy. Each element is widened, updated
// with adamw_step in fp32, its moments rounded to nearest even, and its weight rounded stochastically
// (precision::round_bf16_stochastic) with the bits mix64(seed ^ mix64(counter + i)) for element i, so the
// result is a pure function of (seed, counter, inputs) on every target and thread count. The trainer passes
// counter = step x trainable parameters + the tensor's offset.
void cpu_adamw_bf16_sr(const AdamStep& s, bf16_t* weights, bf16_t* m, bf16_t* v, const bf16_t* grad, int64_t n,
                       uint64_t seed, uint64_t counter);
// The same one element at a time: the reference.
void cpu_adamw_bf16_sr_scalar(const AdamStep& s, bf16_t* weights, bf16_t* m, bf16_t* v, const bf16_t* grad,
                              int64_t n, uint64_t seed, uint64_t counter);

}  // namespace memtrade::model
