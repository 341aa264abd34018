// Attention tile math shared by the CPU and CUDA implementations (host and device).
//
// Forward recurrence for one query row over key tiles (FlashAttention-2):
//   m' = max(m, max_j s_j);  p_j = exp(s_j - m');  c = exp(m - m');  l = c l + sum_j p_j;  o = c o + sum_j p_j v_j
// and at the end o /= l, lse = m + log l. Masked scores are -inf. A row with no unmasked key keeps
// m = -inf: it is defined as o = 0 with lse = +inf (so that exp(s - lse) = 0 in the backward pass).
// Backward, per element: p = exp(s - lse), ds = p (dp - delta) with delta = rowsum(dO * O).
#pragma once

#include <math.h>

#include "harness/common.hpp"

namespace memtrade::attn {

// Query row i (of nq) may attend key j (of nk) under the causal mask aligned to the bottom right
// (the last query sees every key), as FlashAttention defines it for nq != nk.
MT_HD bool causal_allows(int64_t i, int64_t j, int64_t nq, int64_t nk) { return j <= i + (nk - nq); }

// One key tile of the online softmax for one row. `s` holds the tile's scaled scores (-inf where
// masked) and is overwritten with p_j. Updates the running max m and sum l; returns the factor c by
// which the row's output accumulator must be rescaled before adding sum_j p_j v_j.
MT_HD float online_softmax_tile(float* s, int count, float& m, float& l) {
  float tile_max = -INFINITY;
  for (int j = 0; j < count; ++j) tile_max = fmaxf(tile_max, s[j]);
  const float m_new = fmaxf(m, tile_max);
  if (m_new == -INFINITY) {  // everything so far is masked: nothing to add, nothing to rescale
    for (int j = 0; j < count; ++j) s[j] = 0.f;
    return 1.f;
  }
  const float c = expf(m - m_new);  // m = -inf gives c = 0: the accumulators were empty
  float sum = 0.f;
  for (int j = 0; j < count; ++j) {
    s[j] = expf(s[j] - m_new);
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
MT_HD float prob_from_lse(float s, float lse) { return s == -INFINITY ? 0.f : expf(s - lse); }

// Gradient of the score: dS = P (dP - delta).
MT_HD float score_grad(float p, float dp, float delta) { return p * (dp - delta); }

}  // namespace memtrade::attn
