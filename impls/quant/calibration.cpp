#include "impls/quant/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "datasets/random.hpp"
#include "common/common.hpp"

namespace memtrade::quant {

namespace {

// Independent streams derived from the caller's seed.
constexpr uint64_t kValues = 0x51A7E5C0FFEE0001ull;
constexpr uint64_t kChannels = 0x51A7E5C0FFEE0002ull;
constexpr uint64_t kFactors = 0x51A7E5C0FFEE0003ull;
constexpr uint64_t kShared = 0x51A7E5C0FFEE0004ull;  // f: each row's shared factors
constexpr uint64_t kMixing = 0x51A7E5C0FFEE0005ull;  // B: each channel's loadings on them

void check_sizes(const char* what, int64_t rows, int64_t cols) {
  MT_CHECK(rows > 0 && cols > 0, std::string(what) + ": sizes must be positive (got " + std::to_string(rows) + " x " +
                                     std::to_string(cols) + ")");
}

}  // namespace

std::vector<int64_t> synthetic_outlier_channels(int64_t K, uint64_t seed, double outlier_fraction) {
  MT_CHECK(K > 0, "synthetic_outlier_channels: K must be positive");
  MT_CHECK(std::isfinite(outlier_fraction) && outlier_fraction >= 0 && outlier_fraction <= 1,
           "synthetic_outlier_channels: outlier_fraction must lie in [0, 1]");
  if (outlier_fraction == 0) return {};
  const int64_t count = std::clamp<int64_t>(std::llround(outlier_fraction * static_cast<double>(K)), 1, K);
  // Partial Fisher-Yates shuffle over the channel indices; the first `count` are the outliers.
  std::vector<int64_t> idx(static_cast<std::size_t>(K));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  for (int64_t i = 0; i < count; ++i) {
    const auto span = static_cast<double>(K - i);
    const int64_t j =
        i + std::min<int64_t>(static_cast<int64_t>(datasets::uniform01(seed ^ kChannels, i) * span), K - i - 1);
    std::swap(idx[i], idx[j]);
  }
  idx.resize(static_cast<std::size_t>(count));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<float> synthetic_activations(int64_t n, int64_t K, uint64_t seed, double outlier_fraction,
                                         double outlier_scale, int64_t shared_factors, double factor_share) {
  check_sizes("synthetic_activations", n, K);
  MT_CHECK(std::isfinite(outlier_scale) && outlier_scale > 0, "synthetic_activations: outlier_scale must be positive");
  MT_CHECK(shared_factors >= 0, "synthetic_activations: shared_factors must not be negative");
  MT_CHECK(std::isfinite(factor_share) && factor_share >= 0 && factor_share <= 1,
           "synthetic_activations: factor_share must lie in [0, 1]");
  std::vector<double> factor(static_cast<std::size_t>(K), 1.0);
  for (const int64_t c : synthetic_outlier_channels(K, seed, outlier_fraction))
    factor[c] = outlier_scale * std::exp2(2.0 * datasets::uniform01(seed ^ kFactors, static_cast<uint64_t>(c)) - 1.0);
  const int64_t r = shared_factors;
  const double own = r > 0 ? std::sqrt(1.0 - factor_share) : 1.0, mixed = r > 0 ? std::sqrt(factor_share / r) : 0.0;
  std::vector<double> B(static_cast<std::size_t>(r * K));
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = datasets::normal(seed ^ kMixing, i);
  for (int64_t k = 0; k < K; ++k) {  // each channel's loadings scaled to squared norm r: variance exactly 1
    double sq = 0;
    for (int64_t j = 0; j < r; ++j) sq += B[j * K + k] * B[j * K + k];
    const double to_r = sq > 0 ? std::sqrt(static_cast<double>(r) / sq) : 0.0;
    for (int64_t j = 0; j < r; ++j) B[j * K + k] *= to_r;
  }
  std::vector<float> x(static_cast<std::size_t>(n * K));
  std::vector<double> row(static_cast<std::size_t>(K));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < K; ++k) row[k] = own * datasets::normal(seed ^ kValues, static_cast<uint64_t>(i * K + k));
    for (int64_t j = 0; j < r; ++j) {
      const double fj = mixed * datasets::normal(seed ^ kShared, static_cast<uint64_t>(i * r + j));
      for (int64_t k = 0; k < K; ++k) row[k] += fj * B[j * K + k];
    }
    for (int64_t k = 0; k < K; ++k) x[i * K + k] = static_cast<float>(factor[k] * row[k]);
  }
  return x;
}

std::vector<float> synthetic_weights(int64_t N, int64_t K, uint64_t seed) {
  check_sizes("synthetic_weights", N, K);
  const double stddev = 1.0 / std::sqrt(static_cast<double>(K));
  std::vector<float> w(static_cast<std::size_t>(N * K));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(stddev * datasets::normal(seed, i));
  return w;
}

}  // namespace memtrade::quant
