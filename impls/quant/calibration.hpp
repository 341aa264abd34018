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
std::vector<float> synthetic_activations(int64_t n, int64_t K, uint64_t seed, double outlier_fraction = 0.01,
                                         double outlier_scale = 50);

// The outlier channels synthetic_activations(n, K, seed, outlier_fraction, ...) uses, ascending.
std::vector<int64_t> synthetic_outlier_channels(int64_t K, uint64_t seed, double outlier_fraction = 0.01);

// Weights W [N x K] row-major, N(0, 1/K) entries (std 1/sqrt(K), the scale of a
// variance-preserving linear layer).
std::vector<float> synthetic_weights(int64_t N, int64_t K, uint64_t seed);

}  // namespace memtrade::quant
