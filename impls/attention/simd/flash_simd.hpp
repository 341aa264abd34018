// The CPU flash attention kernels in portable SIMD (Google Highway), compiled for every target and
// dispatched at run time to the best one this CPU supports (AVX-512, AVX2+FMA, SSE4, ... or scalar;
// common/simd/targets.hpp restricts it). Semantics, layout and workspace as attention.hpp's
// flash_forward_cpu / flash_backward_cpu, which call these; `scale` is s.scale().
//
// Every tile product is one register-blocked kernel, C = init + A B with A read by broadcast and B by
// vector loads (R rows x CV vectors of accumulators, sized for the target's register file); the online
// softmax, the recomputed probabilities and the score gradients are vectorized with a polynomial exp
// (tile_math.hpp's exp_approx, step for step).
#pragma once

#include <cstdint>

#include "impls/attention/dims.hpp"

namespace memtrade::attention::simd {

// How the backward splits its work. two: pass 1 gives each key tile's dK and dV, pass 2 each query tile's
// dQ (recomputing S and dP); parallel over tiles. one: each (batch, KV head) runs its key tiles in order
// and also adds dS K into its fp32 dQ rows, so S and dP are computed once (5 tile products per tile pair
// instead of 7); parallel over KV heads. fp32 accumulates in the output. 16-bit dtypes accumulate in dq32,
// caller-owned scratch of dq32_floats floats (FlashAttention-2's dq_accum, per thread): each thread needs
// one KV head's query rows, group x n x d floats; with less room they take two passes. Both give the same
// bits. automatic: one where it applies and every thread has a KV head of its own.
enum class BackwardPasses { automatic, one, two };

void flash_forward(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots, float* lse);
void flash_backward(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots,
                    const float* lse, float* delta, BackwardPasses passes = BackwardPasses::automatic,
                    float* dq32 = nullptr, int64_t dq32_floats = 0);

// y[i] = the kernels' vector exp of x[i] on the dispatched target (for tests against exp_approx).
void exp_approx_lanes(const float* x, float* y, int64_t n);

}  // namespace memtrade::attention::simd
