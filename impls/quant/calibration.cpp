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
                                         double outlier_scale) {
  check_sizes("synthetic_activations", n, K);
  MT_CHECK(std::isfinite(outlier_scale) && outlier_scale > 0, "synthetic_activations: outlier_scale must be positive");
  std::vector<double> factor(static_cast<std::size_t>(K), 1.0);
  for (const int64_t c : synthetic_outlier_channels(K, seed, outlier_fraction))
    factor[c] = outlier_scale * std::exp2(2.0 * datasets::uniform01(seed ^ kFactors, static_cast<uint64_t>(c)) - 1.0);
  std::vector<float> x(static_cast<std::size_t>(n * K));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const auto at = static_cast<uint64_t>(i * K + k);
      x[at] = static_cast<float>(factor[k] * datasets::normal(seed ^ kValues, at));
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
