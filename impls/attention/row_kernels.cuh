// The row kernels of attention that keeps P ([rows, n_kv] fp32): the masked softmax of each row and
// the score gradient dS = P * (dP - delta). Shared by the naive CUDA attention and the CUDA trainer's
// attention; the math is tile_math.hpp's (host and device). Each including translation unit gets its own
// copy of the kernels (internal linkage).
#pragma once

#include "common/kernels.cuh"
#include "impls/attention/tile_math.hpp"

namespace memtrade::attention {
namespace {

// One block per row of P ([rows, n_kv], rows = b * h * n; the query index is row % n). On entry the row
// holds the scaled scores; on exit the probabilities: masked keys get 0, a fully masked row is all 0.
__global__ void softmax_rows(float* __restrict__ p, int64_t n, int64_t n_kv, bool causal) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % n;
  float* pr = p + row * n_kv;

  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x)
    if (!causal || causal_allows(i, j, n, n_kv)) mx = fmaxf(mx, pr[j]);
  mx = block_reduce<true>(mx, red);

  if (mx == -INFINITY) {  // no key visible (uniform across the block): the row is defined as all zeros
    for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) pr[j] = 0.f;
    return;
  }
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
    const float e = (!causal || causal_allows(i, j, n, n_kv)) ? expf(pr[j] - mx) : 0.f;
    pr[j] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, red);
  const float inv = inverse_row_sum(sum);
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) pr[j] *= inv;
}

// One block per query row: delta = dO_row . O_row, then ds = score_grad(p, dp, delta) in place (ds holds
// dP on entry). Masked entries have p = 0 and so get ds = 0.
__global__ void score_grad_rows(const float* __restrict__ p, float* __restrict__ ds, const float* __restrict__ o,
                                const float* __restrict__ dout, int64_t n_kv, int64_t d) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  float part = 0.f;
  for (int64_t k = threadIdx.x; k < d; k += blockDim.x) part = fmaf(dout[row * d + k], o[row * d + k], part);
  const float delta = block_reduce<false>(part, red);
  const float* pr = p + row * n_kv;
  float* dsr = ds + row * n_kv;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) dsr[j] = score_grad(pr[j], dsr[j], delta);
}

}  // namespace
}  // namespace memtrade::attention
