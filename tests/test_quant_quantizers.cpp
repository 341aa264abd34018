// impls/quant quantizers: RTN, GPTQ and AWQ against each other on synthetic layers with outlier input
// channels, grid membership of their outputs, parameter bookkeeping, edge cases (ragged groups and
// blocks, dead channels, non-finite inputs) and determinism; the synthetic calibration generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "datasets/corpus.hpp"
#include "model/train.hpp"
#include "impls/quant/calibration.hpp"
#include "impls/quant/formats.hpp"
#include "impls/quant/quantizers.hpp"
#include "tests/test_util.hpp"

using namespace memtrade;
using namespace memtrade::quant;
using memtrade::test::error_of;

namespace {

Spec int4(int64_t g) { return Spec{Format::int4, g, false, true}; }
Spec int4_asym(int64_t g) { return Spec{Format::int4_asym, g, false, true}; }

// A layer and its calibration set: weights N(0, 1/K), activations N(0, 1) with 1% outlier channels.
struct Layer {
  int64_t N, K, n;
  std::vector<float> W, X;
};

Layer make_layer(int64_t N, int64_t K, int64_t n, uint64_t seed, double outlier_fraction = 0.01) {
  return Layer{N, K, n, synthetic_weights(N, K, seed), synthetic_activations(n, K, seed + 1, outlier_fraction)};
}

double mse(const Layer& L, const std::vector<float>& Wq) {
  return layer_output_mse(L.W.data(), Wq.data(), L.N, L.K, L.X.data(), L.n);
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int64_t groups_per_row(const Spec& s, int64_t K) {
  const int64_t G = group_size(s, K);
  return (K + G - 1) / G;
}

// Every deq value is a grid point of its group: qdq(deq) == deq, and the parameter count matches the layout.
void expect_on_grid(const Spec& s, const QuantResult& r, int64_t N, int64_t K) {
  ASSERT_EQ(r.deq.size(), static_cast<std::size_t>(N * K));
  ASSERT_EQ(static_cast<int64_t>(r.params.size()), layout(s, N, K).num_params());
  const int64_t G = group_size(s, K), ng = groups_per_row(s, K);
  int64_t off = 0;
  for (int64_t row = 0; row < N; ++row)
    for (int64_t c = 0; c < K; ++c) {
      const GroupParams& p = r.params.size() == 1 ? r.params[0] : r.params[row * ng + c / G];
      const float v = r.deq[row * K + c];
      ASSERT_TRUE(std::isfinite(v)) << "row " << row << " col " << c;
      if (qdq(s, v, p) != v && ++off <= 5) ADD_FAILURE() << "off grid: row " << row << " col " << c << " value " << v;
    }
  EXPECT_EQ(off, 0);
}

// Storing (deq, params) with formats' quantize and decoding gives deq back bit for bit.
void expect_round_trips(const Spec& s, const QuantResult& r, int64_t N, int64_t K) {
  const QLayout L = layout(s, N, K);
  std::vector<uint8_t> blob(L.total_bytes());
  quantize(L, r.deq.data(), blob.data(), r.params.data());
  std::vector<float> back(static_cast<std::size_t>(N * K));
  dequantize(L, blob.data(), back.data());
  EXPECT_TRUE(bitwise_equal(back, r.deq));
}

// ---------------------------------------------------------------- calibration data

TEST(QuantCalibration, DeterministicWithOutlierChannels) {
  const int64_t n = 512, K = 400;
  const auto a = synthetic_activations(n, K, 7), b = synthetic_activations(n, K, 7);
  EXPECT_TRUE(bitwise_equal(a, b));
  EXPECT_FALSE(bitwise_equal(a, synthetic_activations(n, K, 8)));
  const auto outliers = synthetic_outlier_channels(K, 7);
  ASSERT_EQ(outliers.size(), 4u);  // 1% of 400
  std::vector<double> rms(K, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; ++k) rms[k] += static_cast<double>(a[i * K + k]) * a[i * K + k] / n;
  for (int64_t k = 0; k < K; ++k) {
    const bool outlier = std::find(outliers.begin(), outliers.end(), k) != outliers.end();
    const double r = std::sqrt(rms[k]);
    if (outlier) {
      EXPECT_GT(r, 20.0) << "channel " << k;
      EXPECT_LT(r, 110.0) << "channel " << k;
    } else {
      EXPECT_NEAR(r, 1.0, 0.15) << "channel " << k;
    }
  }
  EXPECT_TRUE(synthetic_outlier_channels(K, 7, 0.0).empty());
  EXPECT_EQ(synthetic_outlier_channels(50, 7, 0.001).size(), 1u);  // at least one when the fraction is > 0
}

// shared_factors = r: every channel keeps unit variance (times its outlier factor), now with share 0.9
// of it in r common directions, so channels correlate; r = 0 is the independent draw, bit for bit.
TEST(QuantCalibration, SharedFactorsCorrelateChannelsAtUnitVariance) {
  const int64_t n = 8192, K = 64, r = 4;
  EXPECT_TRUE(bitwise_equal(synthetic_activations(n, K, 7, 0.0), synthetic_activations(n, K, 7, 0.0, 50, 0, 0.9)));
  auto stats = [&](const std::vector<float>& x) {  // (max |variance - 1|, mean |off-diagonal correlation|)
    std::vector<double> cov(K * K, 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b) cov[a * K + b] += static_cast<double>(x[i * K + a]) * x[i * K + b] / n;
    double var_dev = 0, corr = 0;
    for (int64_t a = 0; a < K; ++a) {
      var_dev = std::max(var_dev, std::abs(cov[a * K + a] - 1.0));
      for (int64_t b = 0; b < K; ++b)
        if (a != b) corr += std::abs(cov[a * K + b]) / std::sqrt(cov[a * K + a] * cov[b * K + b]) / (K * (K - 1));
    }
    return std::pair{var_dev, corr};
  };
  const auto [dev0, corr0] = stats(synthetic_activations(n, K, 7, 0.0));
  const auto [dev4, corr4] = stats(synthetic_activations(n, K, 7, 0.0, 50, r));
  std::printf("[ measured ] max |var - 1|: %.3f independent, %.3f with %lld factors; mean |corr| %.4f, %.4f\n", dev0,
              dev4, static_cast<long long>(r), corr0, corr4);
  EXPECT_LT(dev0, 0.1);
  EXPECT_LT(dev4, 0.1);  // each channel's loadings are normalized: sampling noise only
  EXPECT_LT(corr0, 0.02);  // sampling noise only: about sqrt(2 / (pi n)) = 0.009
  // Share 0.9 over 4 factors: corr(a, b) = 0.9 cos(B_a, B_b), and |cos| of random directions in 4
  // dimensions is 1 / (sqrt(pi) Gamma(5/2)) = 0.42 on average: about 0.38.
  EXPECT_GT(corr4, 0.3);
  EXPECT_THROW(synthetic_activations(4, K, 3, 0.01, 50, -1), Error);
  EXPECT_THROW(synthetic_activations(4, K, 3, 0.01, 50, 4, 1.5), Error);
}

TEST(QuantCalibration, WeightsHaveStdOneOverSqrtK) {
  const int64_t N = 64, K = 1024;
  const auto w = synthetic_weights(N, K, 3);
  double sum = 0, sq = 0;
  for (const float v : w) sum += v, sq += static_cast<double>(v) * v;
  const double mean = sum / w.size(), sd = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(sd * std::sqrt(static_cast<double>(K)), 1.0, 0.02);
  EXPECT_TRUE(bitwise_equal(w, synthetic_weights(N, K, 3)));
  EXPECT_THROW(synthetic_weights(0, K, 3), Error);
  EXPECT_THROW(synthetic_activations(4, K, 3, 1.5), Error);
}

// ---------------------------------------------------------------- layer_output_mse

TEST(QuantMse, MatchesDirectComputation) {
  const Layer L = make_layer(5, 7, 3, 11);
  std::vector<float> Wq = L.W;
  for (std::size_t i = 0; i < Wq.size(); ++i) Wq[i] += 0.01f * static_cast<float>((i % 5) - 2.0);
  double want = 0;
  for (int64_t s = 0; s < L.n; ++s)
    for (int64_t r = 0; r < L.N; ++r) {
      double d = 0;
      for (int64_t k = 0; k < L.K; ++k)
        d += static_cast<double>(L.X[s * L.K + k]) * (static_cast<double>(L.W[r * L.K + k]) - Wq[r * L.K + k]);
      want += d * d;
    }
  want /= static_cast<double>(L.n * L.N);
  EXPECT_NEAR(mse(L, Wq), want, 1e-12 * want);
  EXPECT_EQ(mse(L, L.W), 0.0);
}

// ---------------------------------------------------------------- RTN

TEST(QuantRtn, EqualsPerValueQdqOfFittedGroups) {
  const int64_t N = 6, K = 200;  // 200 = 128 + 72: a short last group
  const auto W = synthetic_weights(N, K, 21);
  for (const Spec s : {int4(128), int4(32), int4_asym(64), Spec{Format::int8, 128, false, true},
                       Spec{Format::fp8_e4m3, 128, false, true}, Spec{Format::fp8_e5m2, 128, false, false},
                       Spec{Format::nf4, 64, false, true}}) {
    SCOPED_TRACE(spec_name(s));
    const QuantResult r = quantize_rtn(s, W.data(), N, K);
    EXPECT_TRUE(r.in_scale.empty());
    if (quant::detail::per_tensor(s)) {
      ASSERT_EQ(r.params.size(), 1u);
      const GroupParams p = fit_group(s, W.data(), N * K);
      EXPECT_EQ(r.params[0].scale, p.scale);
      for (int64_t i = 0; i < N * K; ++i) ASSERT_EQ(r.deq[i], qdq(s, W[i], p)) << i;
    } else {
      const int64_t G = group_size(s, K), ng = groups_per_row(s, K);
      ASSERT_EQ(r.params.size(), static_cast<std::size_t>(N * ng));
      for (int64_t row = 0; row < N; ++row)
        for (int64_t g = 0; g < ng; ++g) {
          const int64_t c0 = g * G, c1 = std::min(c0 + G, K);
          const GroupParams p = fit_group(s, W.data() + row * K + c0, c1 - c0);
          EXPECT_EQ(r.params[row * ng + g].scale, p.scale);
          EXPECT_EQ(r.params[row * ng + g].zero, p.zero);
          for (int64_t c = c0; c < c1; ++c) ASSERT_EQ(r.deq[row * K + c], qdq(s, W[row * K + c], p)) << row << "," << c;
        }
    }
    expect_on_grid(s, r, N, K);
    expect_round_trips(s, r, N, K);
  }
}

TEST(QuantRtn, Nf4DoubleQuantMatchesFormatsRoundTrip) {
  const int64_t N = 8, K = 192;
  const auto W = synthetic_weights(N, K, 22);
  const Spec s{Format::nf4, 64, true, true};
  const QuantResult r = quantize_rtn(s, W.data(), N, K);
  const QLayout L = layout(s, N, K);
  std::vector<uint8_t> blob(L.total_bytes());
  quantize(L, W.data(), blob.data(), nullptr);
  std::vector<float> want(static_cast<std::size_t>(N * K));
  dequantize(L, blob.data(), want.data());
  EXPECT_TRUE(bitwise_equal(r.deq, want));
  ASSERT_EQ(static_cast<int64_t>(r.params.size()), N * L.groups_per_row);
  expect_on_grid(s, r, N, K);
}

// ---------------------------------------------------------------- GPTQ

struct Ratio {
  const char* name;
  Spec spec;
  GptqOptions opt;
};

TEST(QuantGptq, LowersOutputErrorBelowRtn) {
  const Layer L = make_layer(64, 256, 512, 100);
  GptqOptions act;
  act.act_order = true;
  for (const Ratio c :
       {Ratio{"int4 g128 sym", int4(128), {}}, Ratio{"int4 g128 asym", int4_asym(128), {}},
        Ratio{"int4 g32 sym", int4(32), {}}, Ratio{"int4 g32 asym", int4_asym(32), {}},
        Ratio{"int4 g128 sym act_order", int4(128), act}, Ratio{"int4 g128 asym act_order", int4_asym(128), act},
        Ratio{"int8 per-row", Spec{Format::int8, 128, false, true}, {}},
        Ratio{"nf4 g64", Spec{Format::nf4, 64, false, true}, {}},
        Ratio{"fp8 e4m3 per-row", Spec{Format::fp8_e4m3, 128, false, true}, {}}}) {
    SCOPED_TRACE(c.name);
    const double e_rtn = mse(L, quantize_rtn(c.spec, L.W.data(), L.N, L.K).deq);
    const QuantResult g = quantize_gptq(c.spec, L.W.data(), L.N, L.K, L.X.data(), L.n, c.opt);
    const double e_gptq = mse(L, g.deq);
    std::printf("[ measured ] %-26s RTN mse %.4e  GPTQ mse %.4e  GPTQ/RTN %.3f\n", c.name, e_rtn, e_gptq,
                e_gptq / e_rtn);
    EXPECT_LT(e_gptq, 0.9 * e_rtn);
    expect_on_grid(c.spec, g, L.N, L.K);
    expect_round_trips(c.spec, g, L.N, L.K);
  }
}

// The blocked, Cholesky-based GPTQ against the textbook sequential update (OBQ form): after quantizing
// column i, w_F -= (w_i - q_i) / Hinv_ii * Hinv_{i,F} and Hinv loses row/column i by Gaussian elimination.
TEST(QuantGptq, MatchesSequentialInverseHessianUpdate) {
  const Layer L = make_layer(16, 96, 256, 300, 0.03);
  const Spec s = int4_asym(32);
  GptqOptions opt;
  opt.block = 40;  // blocks do not align with the groups
  const QuantResult g = quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, opt);

  const int64_t K = L.K;
  std::vector<double> H(K * K, 0.0);
  for (int64_t a = 0; a < K; ++a)
    for (int64_t b = 0; b < K; ++b) {
      double acc = 0;
      for (int64_t i = 0; i < L.n; ++i) acc += static_cast<double>(L.X[i * K + a]) * L.X[i * K + b];
      H[a * K + b] = 2.0 * acc / L.n;
    }
  double md = 0;
  for (int64_t i = 0; i < K; ++i) md += H[i * K + i];
  for (int64_t i = 0; i < K; ++i) H[i * K + i] += 0.01 * md / K;
  // Gauss-Jordan inverse.
  std::vector<double> A = H, Inv(K * K, 0.0);
  for (int64_t i = 0; i < K; ++i) Inv[i * K + i] = 1;
  for (int64_t c = 0; c < K; ++c) {
    const double piv = A[c * K + c];
    for (int64_t j = 0; j < K; ++j) A[c * K + j] /= piv, Inv[c * K + j] /= piv;
    for (int64_t r = 0; r < K; ++r) {
      if (r == c) continue;
      const double f = A[r * K + c];
      for (int64_t j = 0; j < K; ++j) A[r * K + j] -= f * A[c * K + j], Inv[r * K + j] -= f * Inv[c * K + j];
    }
  }
  int64_t differ = 0;
  std::vector<float> ref(L.N * K);
  for (int64_t row = 0; row < L.N; ++row) {
    std::vector<double> w(L.W.begin() + row * K, L.W.begin() + (row + 1) * K), Hi = Inv;
    GroupParams p;
    for (int64_t i = 0; i < K; ++i) {
      if (i % 32 == 0) {
        std::vector<float> grp(w.begin() + i, w.begin() + i + 32);
        p = fit_group(s, grp.data(), 32);
      }
      const float q = qdq(s, static_cast<float>(w[i]), p);
      ref[row * K + i] = q;
      const double d = Hi[i * K + i], e = (w[i] - q) / d;
      for (int64_t j = i + 1; j < K; ++j) w[j] -= e * Hi[i * K + j];
      for (int64_t a = i + 1; a < K; ++a)
        for (int64_t b = i + 1; b < K; ++b) Hi[a * K + b] -= Hi[a * K + i] * Hi[i * K + b] / d;
    }
    for (int64_t i = 0; i < K; ++i) differ += ref[row * K + i] != g.deq[row * K + i];
  }
  std::printf("[ measured ] blocked GPTQ vs sequential reference: %lld of %lld values differ\n",
              static_cast<long long>(differ), static_cast<long long>(L.N * K));
  // Rounding-order differences may flip a value that sits on a rounding boundary, nothing more.
  EXPECT_LE(differ, L.N * K / 200) << differ << " of " << L.N * K << " values differ";
  EXPECT_NEAR(mse(L, g.deq), mse(L, ref), 0.01 * mse(L, ref));
}

TEST(QuantGptq, BlockSizeDoesNotChangeTheResult) {
  const Layer L = make_layer(32, 256, 384, 400);
  const Spec s = int4(64);
  GptqOptions a, b, c;
  a.block = 1;
  b.block = 48;  // groups of 64 cross block ends: blocks are cut at group starts
  c.block = 1024;
  const auto ra = quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, a);
  for (const GptqOptions& o : {b, c}) {
    const auto r = quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, o);
    int64_t differ = 0;
    for (std::size_t i = 0; i < r.deq.size(); ++i) differ += r.deq[i] != ra.deq[i];
    std::printf("[ measured ] block %lld vs block 1: %lld of %zu values differ\n", static_cast<long long>(o.block),
                static_cast<long long>(differ), r.deq.size());
    EXPECT_LE(differ, static_cast<int64_t>(r.deq.size() / 200)) << "block " << o.block;
  }
}

TEST(QuantGptq, RaggedKAgainstBlockAndGroup) {
  // K = 200: not a multiple of the block (128) nor of the groups (32, 48, 128).
  const Layer L = make_layer(24, 200, 400, 500);
  for (const Spec s : {int4(32), int4(48), int4_asym(128), Spec{Format::nf4, 64, false, true},
                       Spec{Format::fp8_e4m3, 128, false, false}}) {
    for (const bool act : {false, true}) {
      SCOPED_TRACE(spec_name(s) + (act ? " act_order" : ""));
      GptqOptions opt;
      opt.act_order = act;
      const auto g = quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, opt);
      expect_on_grid(s, g, L.N, L.K);
      expect_round_trips(s, g, L.N, L.K);
      EXPECT_LT(mse(L, g.deq), mse(L, quantize_rtn(s, L.W.data(), L.N, L.K).deq));
    }
  }
}

TEST(QuantGptq, ActOrderUsesStaticGroupsOfTheOriginalWeights) {
  const Layer L = make_layer(8, 128, 256, 600);
  const Spec s = int4_asym(32);
  GptqOptions opt;
  opt.act_order = true;
  const auto g = quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, opt);
  const auto r = quantize_rtn(s, L.W.data(), L.N, L.K);
  ASSERT_EQ(g.params.size(), r.params.size());
  for (std::size_t i = 0; i < g.params.size(); ++i) {
    EXPECT_EQ(g.params[i].scale, r.params[i].scale);
    EXPECT_EQ(g.params[i].zero, r.params[i].zero);
  }
}

TEST(QuantGptq, DeadInputChannel) {
  Layer L = make_layer(16, 128, 256, 700);
  for (const int64_t dead : {0, 5, 127})
    for (int64_t i = 0; i < L.n; ++i) L.X[i * L.K + dead] = 0.f;
  for (const bool act : {false, true}) {
    GptqOptions opt;
    opt.act_order = act;
    const Spec s = int4_asym(32);
    const auto g = quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, opt);
    expect_on_grid(s, g, L.N, L.K);
    // The dead column's weights become 0, which is on every int4_asym grid.
    for (int64_t r = 0; r < L.N; ++r)
      for (const int64_t dead : {0, 5, 127}) EXPECT_EQ(g.deq[r * L.K + dead], 0.f);
    EXPECT_LT(mse(L, g.deq), mse(L, quantize_rtn(s, L.W.data(), L.N, L.K).deq));
  }
  const auto a = quantize_awq(int4(32), L.W.data(), L.N, L.K, L.X.data(), L.n);
  for (const float v : a.deq) ASSERT_TRUE(std::isfinite(v));
  for (const float v : a.in_scale) ASSERT_TRUE(std::isfinite(v) && v > 0);
  // All of X zero: every channel is dead; H = I and the weights quantize to zeros.
  std::vector<float> Z(L.n * L.K, 0.f);
  const auto z = quantize_gptq(int4(32), L.W.data(), L.N, L.K, Z.data(), L.n);
  for (const float v : z.deq) ASSERT_EQ(v, 0.f);
}

TEST(QuantGptq, SingularHessianWithoutDampingIsAnError) {
  // Columns 0 and 1 are identical: H is exactly singular at leading minor 2.
  const std::vector<float> X = {2, 2, 1, 0, 0, 0, 0, 1};  // [2 x 4]
  const std::vector<float> W = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, 0.6f, -0.7f, 0.8f};
  GptqOptions opt;
  opt.damp = 0;
  const std::string msg = error_of([&] { quantize_gptq(int4(4), W.data(), 2, 4, X.data(), 2, opt); });
  EXPECT_NE(msg.find("positive definite"), std::string::npos) << msg;
  EXPECT_NO_THROW(quantize_gptq(int4(4), W.data(), 2, 4, X.data(), 2));  // the default damping fixes it
}

TEST(QuantGptq, RejectsBadOptions) {
  const Layer L = make_layer(4, 32, 16, 800);
  auto run = [&](const Spec& s, GptqOptions o) { quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, o); };
  GptqOptions neg;
  neg.damp = -0.1;
  GptqOptions zero_block;
  zero_block.block = 0;
  EXPECT_NE(error_of([&] { run(int4(32), neg); }).find("damp"), std::string::npos);
  EXPECT_NE(error_of([&] { run(int4(32), zero_block); }).find("block"), std::string::npos);
  EXPECT_NE(error_of([&] { run(Spec{Format::nf4, 64, true, true}, {}); }).find("double"), std::string::npos);
  EXPECT_THROW(quantize_gptq(int4(32), L.W.data(), 0, L.K, L.X.data(), L.n), Error);
  EXPECT_THROW(quantize_gptq(int4(32), L.W.data(), L.N, L.K, L.X.data(), 0), Error);
}

// ---------------------------------------------------------------- AWQ

TEST(QuantAwq, NoWorseThanRtnAndBetterWithOutlierChannels) {
  const Layer L = make_layer(64, 256, 512, 100);
  for (const Ratio c : {Ratio{"int4 g128 sym", int4(128), {}}, Ratio{"int4 g128 asym", int4_asym(128), {}},
                        Ratio{"int4 g32 sym", int4(32), {}}, Ratio{"nf4 g64", Spec{Format::nf4, 64, false, true}, {}},
                        Ratio{"nf4-dq g64", Spec{Format::nf4, 64, true, true}, {}},
                        Ratio{"int8 per-row", Spec{Format::int8, 128, false, true}, {}}}) {
    SCOPED_TRACE(c.name);
    const double e_rtn = mse(L, quantize_rtn(c.spec, L.W.data(), L.N, L.K).deq);
    const QuantResult a = quantize_awq(c.spec, L.W.data(), L.N, L.K, L.X.data(), L.n);
    const double e_awq = mse(L, a.deq);
    std::printf("[ measured ] %-26s RTN mse %.4e  AWQ mse %.4e  AWQ/RTN %.3f (ratio %.2f)\n", c.name, e_rtn, e_awq,
                e_awq / e_rtn, a.awq_ratio);
    EXPECT_LT(e_awq, e_rtn);
    EXPECT_GT(a.awq_ratio, 0.0);
    ASSERT_EQ(a.in_scale.size(), static_cast<std::size_t>(L.K));
  }
  // Without outlier channels (and for one layer that RTN already fits well) AWQ still never loses.
  const Layer flat = make_layer(64, 256, 512, 101, 0.0);
  const double e_rtn = mse(flat, quantize_rtn(int4(128), flat.W.data(), flat.N, flat.K).deq);
  const QuantResult a = quantize_awq(int4(128), flat.W.data(), flat.N, flat.K, flat.X.data(), flat.n);
  std::printf("[ measured ] %-26s RTN mse %.4e  AWQ mse %.4e  AWQ/RTN %.3f (ratio %.2f)\n", "int4 g128 no outliers",
              e_rtn, mse(flat, a.deq), mse(flat, a.deq) / e_rtn, a.awq_ratio);
  EXPECT_LE(mse(flat, a.deq), e_rtn);
}

// Out of sample: GPTQ and AWQ minimize the layer-output error on their calibration rows. On rows of the
// same distribution that they never saw, AWQ (one scale per input channel: few degrees of freedom)
// keeps its advantage over RTN; GPTQ's in-sample figure flatters it. On these synthetic activations
// (1% outlier channels) it is 0.35x RTN on its own 256 rows and 1.47x on new ones; with 4096 rows,
// 0.95x and 1.07x: it does not beat RTN out of sample here, where the channels are independent (see
// GptqGainsOutOfSampleOnlyOnCorrelatedChannels). The quant suite records both (calib_output_mse,
// heldout_output_mse).
TEST(QuantQuantizers, OutOfSampleErrorAgainstRtn) {
  const int64_t N = 64, K = 256, held_rows = 512;
  for (const int64_t calib_rows : {256, 4096}) {
    const Layer all = make_layer(N, K, calib_rows + held_rows, 100);
    const std::vector<float> held(all.X.begin() + calib_rows * K, all.X.end());
    auto held_mse = [&](const std::vector<float>& deq) {
      return layer_output_mse(all.W.data(), deq.data(), N, K, held.data(), held_rows);
    };
    auto calib_mse = [&](const std::vector<float>& deq) {
      return layer_output_mse(all.W.data(), deq.data(), N, K, all.X.data(), calib_rows);
    };
    const Spec spec = int4(128);
    const auto rtn = quantize_rtn(spec, all.W.data(), N, K).deq;
    const auto gptq = quantize_gptq(spec, all.W.data(), N, K, all.X.data(), calib_rows).deq;
    const auto awq = quantize_awq(spec, all.W.data(), N, K, all.X.data(), calib_rows).deq;
    std::printf("[ measured ] %lld calibration rows, K = %lld: GPTQ/RTN output mse %.3f on them, %.3f held out; "
                "AWQ/RTN %.3f, %.3f\n", static_cast<long long>(calib_rows), static_cast<long long>(K),
                calib_mse(gptq) / calib_mse(rtn), held_mse(gptq) / held_mse(rtn), calib_mse(awq) / calib_mse(rtn),
                held_mse(awq) / held_mse(rtn));
    EXPECT_LT(calib_mse(gptq), calib_mse(rtn));
    EXPECT_LT(held_mse(awq), held_mse(rtn));
    // The in-sample ratio is the optimistic one, and more calibration rows shrink the gap.
    EXPECT_GT(held_mse(gptq) / held_mse(rtn), calib_mse(gptq) / calib_mse(rtn));
  }
}

// Why GPTQ does not beat RTN out of sample above: with independent channels the Hessian's expectation
// is diagonal, and minimizing sum_k H_kk (w_k - q_k)^2 over a per-weight grid is RTN; what GPTQ fits
// beyond it is the sample's noise. With channels correlated through shared factors (as a model's hidden
// states are) its error feedback has real structure to use, and it wins on rows it never saw.
TEST(QuantQuantizers, GptqGainsOutOfSampleOnlyOnCorrelatedChannels) {
  const int64_t N = 64, K = 256, calib_rows = 2048, held_rows = 512;
  GptqOptions act;
  act.act_order = true;
  double gain[2] = {0, 0};
  for (const int64_t factors : {0, 16}) {
    const auto W = synthetic_weights(N, K, 100);
    const auto X = synthetic_activations(calib_rows + held_rows, K, 101, 0.01, 50, factors);
    const float* held = X.data() + calib_rows * K;
    auto held_mse = [&](const std::vector<float>& deq) { return layer_output_mse(W.data(), deq.data(), N, K, held, held_rows); };
    const Spec spec = int4(128);
    const double rtn = held_mse(quantize_rtn(spec, W.data(), N, K).deq);
    const double gptq = held_mse(quantize_gptq(spec, W.data(), N, K, X.data(), calib_rows).deq);
    const double ordered = held_mse(quantize_gptq(spec, W.data(), N, K, X.data(), calib_rows, act).deq);
    const double awq = held_mse(quantize_awq(spec, W.data(), N, K, X.data(), calib_rows).deq);
    std::printf("[ measured ] %lld shared factors, held-out output mse / RTN's: GPTQ %.3f, act_order %.3f, AWQ %.3f\n",
                static_cast<long long>(factors), gptq / rtn, ordered / rtn, awq / rtn);
    gain[factors > 0] = rtn / std::min(gptq, ordered);
    EXPECT_LT(awq, rtn);  // AWQ's per-channel scales help either way (the outlier channels)
  }
  EXPECT_LT(gain[0], 1.25) << "independent channels: GPTQ within sampling noise of RTN";
  EXPECT_GT(gain[1], 3.0) << "correlated channels: GPTQ well below RTN";
}

TEST(QuantAwq, ResultIsRtnOfScaledWeights) {
  const Layer L = make_layer(16, 160, 256, 900);
  const Spec s = int4_asym(32);
  const QuantResult a = quantize_awq(s, L.W.data(), L.N, L.K, L.X.data(), L.n);
  std::vector<float> scaled(L.W.size());
  for (int64_t r = 0; r < L.N; ++r)
    for (int64_t k = 0; k < L.K; ++k) scaled[r * L.K + k] = L.W[r * L.K + k] * a.in_scale[k];
  const QuantResult r = quantize_rtn(s, scaled.data(), L.N, L.K);
  ASSERT_EQ(r.params.size(), a.params.size());
  for (std::size_t i = 0; i < r.params.size(); ++i) {
    EXPECT_EQ(r.params[i].scale, a.params[i].scale);
    EXPECT_EQ(r.params[i].zero, a.params[i].zero);
  }
  for (int64_t rr = 0; rr < L.N; ++rr)
    for (int64_t k = 0; k < L.K; ++k) ASSERT_EQ(a.deq[rr * L.K + k], r.deq[rr * L.K + k] / a.in_scale[k]);
  // s is normalised so that max(s) * min(s) = 1.
  const auto [lo, hi] = std::minmax_element(a.in_scale.begin(), a.in_scale.end());
  EXPECT_NEAR(static_cast<double>(*lo) * *hi, 1.0, 1e-5);
  // The outlier channels (larger mean |x|) get the largest scales.
  ASSERT_GT(a.awq_ratio, 0.0);
  const auto outliers = synthetic_outlier_channels(L.K, 901);
  float normal_max = 0;
  for (int64_t k = 0; k < L.K; ++k)
    if (std::find(outliers.begin(), outliers.end(), k) == outliers.end())
      normal_max = std::max(normal_max, a.in_scale[k]);
  for (const int64_t c : outliers) EXPECT_GT(a.in_scale[c], normal_max) << c;
}

// AWQ's clipping search keeps the scale search's result (s, ratio) and, group by group of the scaled
// weights, a step no larger than RTN's and a fit whose own output error on the calibration rows, computed here
// directly from the rows (the search uses their Gram matrix), is no larger than the unclipped group's.
// Out of sample it lowers the layer's error for each format it is defined for.
TEST(QuantAwq, ClipNeverWidensAGroupAndLowersItsOwnError) {
  const int64_t N = 24, K = 256, n = 512, held_rows = 512;
  const auto W = synthetic_weights(N, K, 910);
  const auto X = synthetic_activations(n + held_rows, K, 911);
  AwqOptions clip;
  clip.clip = true;
  for (const Spec s : {int4(64), int4_asym(128), Spec{Format::nf4, 64, false, true}}) {
    SCOPED_TRACE(spec_name(s));
    const QuantResult a = quantize_awq(s, W.data(), N, K, X.data(), n);
    const QuantResult c = quantize_awq(s, W.data(), N, K, X.data(), n, clip);
    ASSERT_EQ(c.in_scale, a.in_scale);
    ASSERT_EQ(c.awq_ratio, a.awq_ratio);
    ASSERT_EQ(c.params.size(), a.params.size());
    const int64_t G = group_size(s, K), groups = K / G;
    int clipped = 0;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        const GroupParams &pc = c.params[r * groups + g], &pa = a.params[r * groups + g];
        EXPECT_LE(pc.scale, pa.scale) << r << "/" << g;  // the step (int4, int4-asym) or the absmax (nf4)
        clipped += pc.scale < pa.scale;
        double e_c = 0, e_a = 0;  // sum over the rows of the group's share of the output error, in x / s and W s
        for (int64_t t = 0; t < n; ++t) {
          double dc = 0, da = 0;
          for (int64_t k = g * G; k < (g + 1) * G; ++k) {
            const double xs = static_cast<double>(X[t * K + k]) / c.in_scale[k], s_k = c.in_scale[k];
            const double w = static_cast<double>(W[r * K + k]) * s_k;
            dc += xs * (static_cast<double>(c.deq[r * K + k]) * s_k - w);
            da += xs * (static_cast<double>(a.deq[r * K + k]) * s_k - w);
          }
          e_c += dc * dc;
          e_a += da * da;
        }
        EXPECT_LE(e_c, e_a * (1 + 1e-9)) << r << "/" << g;
      }
    EXPECT_GT(clipped, 0) << "some group is clipped";
    const float* held = X.data() + n * K;
    const double held_a = layer_output_mse(W.data(), a.deq.data(), N, K, held, held_rows);
    const double held_c = layer_output_mse(W.data(), c.deq.data(), N, K, held, held_rows);
    std::printf("[ measured ] %-14s held-out output mse: AWQ %.4e, with clipping %.4e (%.3fx); %d of %lld groups clipped\n",
                spec_name(s).c_str(), held_a, held_c, held_c / held_a, clipped, static_cast<long long>(N * groups));
    EXPECT_LT(held_c, held_a);
  }
  for (const char* name : {"int8", "nf4-dq", "fp8-e4m3"})
    EXPECT_THROW(quantize_awq(parse_spec(name), W.data(), N, K, X.data(), n, clip), Error) << name;
}

TEST(QuantAwq, GridOfOneIsRtn) {
  const Layer L = make_layer(8, 64, 32, 950);
  AwqOptions o;
  o.grid = 1;
  const auto a = quantize_awq(int4(32), L.W.data(), L.N, L.K, L.X.data(), L.n, o);
  EXPECT_TRUE(bitwise_equal(a.deq, quantize_rtn(int4(32), L.W.data(), L.N, L.K).deq));
  for (const float v : a.in_scale) EXPECT_EQ(v, 1.f);
  o.grid = 0;
  EXPECT_THROW(quantize_awq(int4(32), L.W.data(), L.N, L.K, L.X.data(), L.n, o), Error);
}

// ---------------------------------------------------------------- shared behaviour

TEST(QuantQuantizers, NonFiniteInputsNameTensorAndIndex) {
  Layer L = make_layer(4, 32, 8, 1000);
  const Spec s = int4(32);
  auto W = L.W;
  W[2 * 32 + 7] = std::numeric_limits<float>::quiet_NaN();
  auto X = L.X;
  X[5 * 32 + 3] = std::numeric_limits<float>::infinity();
  const std::string w_rtn = error_of([&] { quantize_rtn(s, W.data(), 4, 32); });
  const std::string w_gptq = error_of([&] { quantize_gptq(s, W.data(), 4, 32, L.X.data(), 8); });
  const std::string w_awq = error_of([&] { quantize_awq(s, W.data(), 4, 32, L.X.data(), 8); });
  for (const std::string& m : {w_rtn, w_gptq, w_awq}) {
    EXPECT_NE(m.find("W[2, 7]"), std::string::npos) << m;
    EXPECT_NE(m.find("NaN"), std::string::npos) << m;
  }
  const std::string x_gptq = error_of([&] { quantize_gptq(s, L.W.data(), 4, 32, X.data(), 8); });
  const std::string x_awq = error_of([&] { quantize_awq(s, L.W.data(), 4, 32, X.data(), 8); });
  for (const std::string& m : {x_gptq, x_awq}) {
    EXPECT_NE(m.find("X[5, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("Inf"), std::string::npos) << m;
  }
}

TEST(QuantQuantizers, Deterministic) {
  const Layer L = make_layer(48, 320, 256, 1100);
  GptqOptions act;
  act.act_order = true;
  for (const Spec s : {int4(128), int4_asym(32)}) {
    EXPECT_TRUE(bitwise_equal(quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n).deq,
                              quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n).deq));
    EXPECT_TRUE(bitwise_equal(quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, act).deq,
                              quantize_gptq(s, L.W.data(), L.N, L.K, L.X.data(), L.n, act).deq));
    const auto a1 = quantize_awq(s, L.W.data(), L.N, L.K, L.X.data(), L.n);
    const auto a2 = quantize_awq(s, L.W.data(), L.N, L.K, L.X.data(), L.n);
    EXPECT_TRUE(bitwise_equal(a1.deq, a2.deq));
    EXPECT_TRUE(bitwise_equal(a1.in_scale, a2.in_scale));
  }
}

}  // namespace

// GPTQ and AWQ against RTN on a real layer: the down projection of a small model trained on the
// fortunes text, calibrated and evaluated on that layer's captured inputs.
TEST(QuantizersOnTrainedModel, GptqAndAwqBeatRtnOnCapturedActivations) {
  const char* dir = "/usr/share/games/fortunes";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent; apt-get install fortunes";
  const auto corpus = memtrade::datasets::load_fortunes(dir);
  const auto split = memtrade::datasets::split(corpus);
  memtrade::model::Config c;
  c.dim = 64;
  c.layers = 1;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 192;
  c.context = 32;
  memtrade::model::TrainOptions o;
  o.batch = 8;
  o.seq = 32;
  o.lr = 3e-3f;
  const auto w = memtrade::model::train_fp32(c, o, split.train, 60, 1);
  auto dev = memtrade::make_cpu_device();
  auto t = memtrade::model::make_trainer_cpu(c, o, *dev, w);
  const auto in = t->linear_inputs(memtrade::datasets::sample_batch(split.train, 8, 32, 1, 1000));
  const auto L = memtrade::model::param_layout(c);
  const float* wd = w.data() + L.layer[0].wd;  // [dim x ffn]
  const auto& X = in[0][3];                     // [256 x ffn]
  const int64_t n = 256;
  const Spec spec = parse_spec("int4-g64");
  const double rtn = layer_output_mse(wd, quantize_rtn(spec, wd, c.dim, c.ffn).deq.data(), c.dim, c.ffn, X.data(), n);
  const double gptq =
      layer_output_mse(wd, quantize_gptq(spec, wd, c.dim, c.ffn, X.data(), n).deq.data(), c.dim, c.ffn, X.data(), n);
  const double awq =
      layer_output_mse(wd, quantize_awq(spec, wd, c.dim, c.ffn, X.data(), n).deq.data(), c.dim, c.ffn, X.data(), n);
  EXPECT_LT(gptq, rtn);
  EXPECT_LE(awq, rtn);
  std::printf("down_proj int4-g64 layer-output MSE on captured inputs: rtn %.3e gptq %.3e awq %.3e\n", rtn, gptq, awq);
}
