// Synthetic calibration data for the weight quantizers: activations with a few
// large-magnitude input channels and Gaussian weights. Both are pure functions of
// their arguments (counter-based random numbers, datasets/random.hpp), so every
// platform and standard library produces the same bits. They stand in for
// activations captured from a trained model; the quantizers take plain arrays and
// do not depend on where the data came from.
#pragma once

#include <cstdint>
#include <vector>

namespace memtrade::quant {

// Activations X [n x K] row-major. Every entry is N(0, 1); round(outlier_fraction * K)
// input channels (at least one when outlier_fraction > 0) are multiplied by a
// per-channel factor drawn log-uniformly from [outlier_scale / 2, 2 * outlier_scale]
// (25x-100x for the default 50), the systematic outlier features that LLM.int8()
// reports in transformer activations. The outlier channels are a seeded random subset.
// With shared_factors = r > 0 the channels are correlated, as a model's hidden states are:
// entry (i, k) before the outlier factor is sqrt(1 - share) e_ik + sqrt(share / r) sum_j f_ij B_jk
// with e and f independent N(0, 1) (f per row) and each channel's loadings B_k an N(0, 1) draw
// scaled to squared norm r, so every channel still has unit variance, a share `factor_share` of it
// in r directions common to all channels (correlation share x cos(B_a, B_b)). With
// independent channels (r = 0) the expected Hessian X^T X / n is diagonal, and minimizing the
// layer-output error over a per-weight grid is then RTN again: GPTQ's error feedback can only fit
// the sample's noise. Correlated channels are where it has something to exploit.
std::vector<float> synthetic_activations(int64_t n, int64_t K, uint64_t seed, double outlier_fraction = 0.01,
                                         double outlier_scale = 50, int64_t shared_factors = 0,
                                         double factor_share = 0.9);

// The outlier channels synthetic_activations(n, K, seed, outlier_fraction, ...) uses, ascending.
std::vector<int64_t> synthetic_outlier_channels(int64_t K, uint64_t seed, double outlier_fraction = 0.01);

// Weights W [N x K] row-major, N(0, 1/K) entries (std 1/sqrt(K), the scale of a
// variance-preserving linear layer).
std::vector<float> synthetic_weights(int64_t N, int64_t K, uint64_t seed);

}  // namespace memtrade::quant
