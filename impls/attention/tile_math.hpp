// Attention tile math shared by the CPU and CUDA implementations (host and device).
//
// Forward recurrence for one query row over key tiles (FlashAttention-2):
//   m' = max(m, max_j s_j);  p_j = exp(s_j - m');  c = exp(m - m');  l = c l + sum_j p_j;  o = c o + sum_j p_j v_j
// and at the end o /= l, lse = m + log l. Masked scores are -inf. A row with no unmasked key keeps
// m = -inf: it is defined as o = 0 with lse = +inf (so that exp(s - lse) = 0 in the backward pass).
// Backward, per element: p = exp(s - lse), ds = p (dp - delta) with delta = rowsum(dO * O).
#pragma once

#include <math.h>

#include "common/common.hpp"
#include "common/dtype.hpp"

// Vectorize a host loop with OpenMP SIMD (the CPU flash build); nothing on the device.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#define MT_PRAGMA(x) _Pragma(#x)
#define MT_SIMD_MAX(v) MT_PRAGMA(omp simd reduction(max : v))
#define MT_SIMD_SUM(v) MT_PRAGMA(omp simd reduction(+ : v))
#else
#define MT_SIMD_MAX(v)
#define MT_SIMD_SUM(v)
#endif

namespace memtrade::attention {

// exp(x) for x <= 88 in plain arithmetic, so that CPU loops over it vectorize: Cody-Waite reduction
// x = k ln2 + r (|r| <= ln2 / 2), a degree-7 Taylor polynomial for e^r (truncation < 3e-9), then the
// exponent k placed in the float's bits. Relative error about 2 ulp; exactly 0 below -87.3 (so a
// masked score of -inf gives p = 0), +inf is not an input here (scores have their row max subtracted).
MT_HD float exp_approx(float x) {
  const float xc = x < -87.3f ? -87.3f : x;  // not fmaxf: a NaN must stay NaN
  const float k = floorf(xc * 1.44269504088896341f + 0.5f);
  const float r = (xc - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;  // ln2 split hi + lo
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const float scale = memtrade::detail::bits_as_float(static_cast<uint32_t>(static_cast<int32_t>(k) + 127) << 23);
  return x < -87.3f ? 0.f : p * scale;
}

// Query row i (of nq) may attend key j (of nk) under the causal mask aligned to the bottom right
// (the last query sees every key), as FlashAttention defines it for nq != nk.
MT_HD bool causal_allows(int64_t i, int64_t j, int64_t nq, int64_t nk) { return j <= i + (nk - nq); }

// The online-softmax step for one score under a running max: the factor that rescales what was
// accumulated under m_old once the max is m_new, and the probability of score s under m_new. While
// every score so far is masked (m_new = -inf) nothing is added and nothing rescaled.
MT_HD float softmax_rescale(float m_old, float m_new) { return m_new == -INFINITY ? 1.f : exp_approx(m_old - m_new); }
MT_HD float softmax_prob(float s, float m_new) { return m_new == -INFINITY ? 0.f : exp_approx(s - m_new); }

// One key tile of the online softmax for one row. `s` holds the tile's scaled scores (-inf where
// masked) and is overwritten with p_j. Updates the running max m and sum l; returns the factor c by
// which the row's output accumulator must be rescaled before adding sum_j p_j v_j.
MT_HD float online_softmax_tile(float* s, int count, float& m, float& l) {
  float tile_max = -INFINITY;
  MT_SIMD_MAX(tile_max)
  for (int j = 0; j < count; ++j) tile_max = fmaxf(tile_max, s[j]);
  const float m_new = fmaxf(m, tile_max);
  const float c = softmax_rescale(m, m_new);  // m = -inf, m_new finite: c = 0, the accumulators were empty
  float sum = 0.f;
  MT_SIMD_SUM(sum)
  for (int j = 0; j < count; ++j) {
    s[j] = softmax_prob(s[j], m_new);
    sum += s[j];
  }
  l = c * l + sum;
  m = m_new;
  return c;
}

// 1 / l for the final normalisation; 0 for a fully masked row (its output is defined as 0).
MT_HD float inverse_row_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }

// The saved log-sum-exp of a row: m + log l, or +inf for a fully masked row.
MT_HD float row_lse(float m, float l) { return l > 0.f ? m + logf(l) : INFINITY; }

// Recomputed probability from a score and the row's lse (masked scores are -inf: p = 0).
MT_HD float prob_from_lse(float s, float lse) { return exp_approx(s - lse); }

// Gradient of the score: dS = P (dP - delta).
MT_HD float score_grad(float p, float dp, float delta) { return p * (dp - delta); }

}  // namespace memtrade::attention
