// Tests for harness/stats. The Mann-Whitney expectations (U and p) were computed once with
// scipy.stats.mannwhitneyu(a, b, alternative='two-sided', method='auto'), scipy 1.17.1 /
// numpy 2.4.6, and pasted as literals; the comments give scipy's method='exact' p where it differs.
#include "harness/stats.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/common.hpp"

using memtrade::Error;
using namespace memtrade::stats;

namespace {

constexpr double kExactTol = 1e-9;  // relative
constexpr double kAsymTol = 1e-6;   // relative

void expect_mwu(const std::vector<double>& a, const std::vector<double>& b, double u, double p, bool exact) {
  const MannWhitney r = mann_whitney_u(a, b);
  EXPECT_EQ(r.u, u);
  EXPECT_EQ(r.exact, exact);
  EXPECT_NEAR(r.p_two_sided, p, (exact ? kExactTol : kAsymTol) * p);
}

std::vector<double> iota(int from, int to) {  // from .. to-1
  std::vector<double> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST(Stats, Median) {
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(median({2.0, 2.0, 1.0, 7.0, 2.0}), 2.0);
  EXPECT_EQ(median({-1.0, 1.0}), 0.0);
  EXPECT_DOUBLE_EQ(median({1e308, 1.7e308}), 1.35e308);  // no overflow averaging huge values
  EXPECT_EQ(median({-INFINITY, 0.0, INFINITY}), 0.0);
}

TEST(Stats, MeanStddev) {
  EXPECT_EQ(mean({1.0, 2.0, 3.0, 4.0}), 2.5);
  EXPECT_EQ(mean({7.0}), 7.0);
  // Sample variance of 2,4,4,4,5,5,7,9: sum of squared deviations from 5 is 32, / 7.
  EXPECT_DOUBLE_EQ(stddev({2, 4, 4, 4, 5, 5, 7, 9}), std::sqrt(32.0 / 7.0));
  EXPECT_EQ(stddev({3.0, 3.0, 3.0}), 0.0);
  EXPECT_DOUBLE_EQ(stddev({1.0, 2.0}), std::sqrt(0.5));
  // Large offset: a one-pass sum-of-squares formula would lose everything here.
  EXPECT_NEAR(stddev({1e9 + 1, 1e9 + 2, 1e9 + 3}), 1.0, 1e-12);
}

TEST(Stats, SummaryErrors) {
  const std::vector<double> empty;
  const std::vector<double> with_nan = {1.0, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_THROW(median(empty), Error);
  EXPECT_THROW(mean(empty), Error);
  EXPECT_THROW(stddev(empty), Error);
  EXPECT_THROW(stddev({1.0}), Error);
  EXPECT_THROW(median(with_nan), Error);
  EXPECT_THROW(mean(with_nan), Error);
  EXPECT_THROW(stddev(with_nan), Error);
}

TEST(MannWhitney, ExactSeparated) {
  // Fully separated 3 vs 3: the extreme orderings are 2 of C(6,3) = 20, p = 0.1, the smallest
  // p-value 3 per side can give.
  expect_mwu({1, 2, 3}, {4, 5, 6}, 0.0, 0.1, true);
  expect_mwu({4, 5, 6}, {1, 2, 3}, 9.0, 0.1, true);
  // 5 vs 5: 2 / C(10,5) = 2/252.
  expect_mwu({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, 0.0, 0.007936507936507936, true);
  // 1 vs 8: 2/9.
  expect_mwu({0.5}, {1, 2, 3, 4, 5, 6, 7, 8}, 0.0, 0.2222222222222222, true);
  expect_mwu({1.0}, {2.0}, 0.0, 1.0, true);
}

TEST(MannWhitney, ExactOverlapping) {
  expect_mwu({1.1, 2.3, 3.5, 5.0, 7.2}, {2.0, 4.1, 6.3, 8.8, 9.4, 10.0}, 7.0, 0.17748917748917747, true);
  // U exactly at the centre n1*n2/2: twice the tail exceeds 1 and is clamped.
  expect_mwu({1, 4, 5, 8}, {2, 3, 6, 7}, 8.0, 1.0, true);
  // Infinities rank first/last like any value.
  expect_mwu({-INFINITY, 1, 2, INFINITY}, {0, 3, 4, 5, 6}, 7.0, 0.5555555555555556, true);
}

TEST(MannWhitney, ExactUnequalSizes) {
  // One small sample (<= 8) without ties stays exact however large the other one is.
  expect_mwu({0.0012, 0.2987, -0.2741, -0.8906, -0.4547, -0.9916},
             {0.8601,  2.1402,  0.3078,  0.1795,  1.2898,  1.1569,  0.9054,  -0.1305, 0.7707,  1.4953,
              -0.5442, 0.3424,  -1.1012, -0.4895, -1.0417, 0.5649,  -0.4674, 1.0713,  0.9568,  0.6131,
              -1.7168, 0.2613,  0.7515,  0.9133,  -0.7301, 0.3222,  -0.1785, -0.0088, 1.8609,  -0.0075,
              0.7675,  1.6844,  0.2164,  0.6883,  0.9105,  0.8638,  -0.4251, 0.8761,  2.1588,  -0.7471},
             52.0, 0.02490002208860874, true);
  expect_mwu({0.8594, 0.1194, -0.6415, 2.0004, 0.7623, -1.1993, 0.0745, 0.5767},
             {0.1112, 0.9829,  0.2335, 0.9672,  1.7385,  -0.3757, 0.5031, -0.1633, 0.4273,  -0.8872,
              -0.2793, 0.1038, 1.1988, 1.4452,  -1.0235, -0.4946, 0.9469, -1.6924, -0.1632, 0.2027,
              1.557,   0.9894, -0.0272, -0.0686, 0.0498, 1.8235,  -0.128, -0.0037, 0.6526,  0.1792},
             124.0, 0.9022488619013139, true);
  // a = 0.5, 61.5, ..., 427.5 (8 values) against b = 0 .. 499; and the reverse argument order.
  std::vector<double> a8;
  for (int i = 0; i < 8; ++i) a8.push_back(i * 61 + 0.5);
  expect_mwu(a8, iota(0, 500), 1716.0, 0.4982995330231311, true);
  expect_mwu(iota(0, 500), a8, 8 * 500 - 1716.0, 0.4982995330231311, true);
  expect_mwu({499.5, 10.5, 20.5}, iota(0, 500), 532.0, 0.40431837014271915, true);
}

TEST(MannWhitney, AsymptoticNoTies) {
  // Both samples > 8: normal approximation even without ties (scipy's exact p: 4.113533525298231e-05).
  expect_mwu(iota(1, 10), iota(10, 19), 0.0, 0.00041229480206169127, false);
  // scipy's exact p: 1.5821457204897228e-14.
  expect_mwu(iota(0, 25), iota(25, 50), 0.0, 1.4156562248495537e-09, false);
  // scipy's exact p: 0.5480498577416064.
  expect_mwu({-0.1973, -1.1141, -0.0115, -0.4436, 1.1661, 0.6531, -0.0241, 0.6684, -0.3399, 1.0521, -0.0054, 0.5834},
             {-0.5909, 1.0467, -0.9882, -1.3353, 0.3955, -0.1999, 0.8641, 2.9448, -0.1317, 0.0761, 0.9054, 1.193,
              0.5236, 0.4941, 1.4025},
             77.0, 0.5419031799870584, false);
}

TEST(MannWhitney, Ties) {
  // Any tie (within or across samples) selects the tie-corrected normal approximation.
  expect_mwu({1, 2, 2, 3, 4}, {2, 3, 3, 5, 6, 7}, 6.0, 0.11390314458853068, false);
  expect_mwu({0.1, 0.4, 0.4, 0.9, 1.3}, {0.2, 0.4, 1.1, 1.3, 1.3, 2.0, 2.5}, 9.0, 0.18758480505961106, false);
  // Includes 0.0 in a and -0.0 in b, which are equal (a tie).
  expect_mwu({0.5, -1.0, -0.1, 0.0, -1.1, 0.3, -0.9, 1.0, 0.2, 0.1, -0.6, -0.1, -2.0, -1.1, 0.4, -2.1, 0.8, -1.7, 0.8,
              -0.8},
             {1.3, 0.6, -1.0, 1.7, 1.9, 0.4, 0.2, 0.3, -0.5, 1.6, -0.0, 0.4, -0.3, -0.1, -0.8, 1.8, 0.3}, 97.0,
             0.02697508568494576, false);
}

TEST(MannWhitney, OneSidedAgainstScipy) {
  // scipy.stats.mannwhitneyu(a, b, alternative='less' / 'greater').pvalue
  auto one_sided = [](const std::vector<double>& a, const std::vector<double>& b, double less, double greater) {
    const MannWhitney r = mann_whitney_u(a, b);
    EXPECT_NEAR(r.p_less, less, 1e-9 * less);
    EXPECT_NEAR(r.p_greater, greater, 1e-9 * greater);
  };
  one_sided({1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}, 0.003968253968253968, 1.0);
  one_sided({1, 2, 3, 4, 6}, {5, 7, 8, 9, 10}, 0.007936507936507936, 0.996031746031746);
  one_sided({1.1, 2.3, 3.5, 5.0, 7.2}, {2.0, 4.1, 6.3, 8.8, 9.4, 10.0}, 0.08874458874458874, 0.9372294372294372);
  one_sided({1, 2, 2, 3, 4}, {2, 3, 3, 5, 6, 7}, 0.05695157229426534, 0.9613756091726351);            // ties
  one_sided(iota(1, 10), iota(10, 19), 0.00020614740103084563, 0.9998529194692304);                 // normal approx.
}

TEST(MannWhitney, IdenticalSamples) {
  expect_mwu({1, 2, 3, 4}, {1, 2, 3, 4}, 8.0, 1.0, false);
  // All values equal: zero variance, p = 1 (scipy: z = -0.5/0 = -inf, p clipped to 1).
  expect_mwu({5, 5, 5}, {5, 5}, 3.0, 1.0, false);
  expect_mwu({5}, {5}, 0.5, 1.0, false);
}

TEST(MannWhitney, Errors) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(mann_whitney_u({}, {1.0}), Error);
  EXPECT_THROW(mann_whitney_u({1.0}, {}), Error);
  EXPECT_THROW(mann_whitney_u({1.0, nan}, {2.0}), Error);
  EXPECT_THROW(mann_whitney_u({1.0}, {nan, 2.0}), Error);
  try {
    mann_whitney_u({1.0}, {});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "mann_whitney_u: both samples must be non-empty");
  }
}

TEST(MannWhitney, PValuesStayInRange) {
  // Every split of 0..9 into 4 vs 6 (exact path): p in [0, 1], symmetric under swapping a and b.
  for (unsigned mask = 0; mask < 1024; ++mask) {
    if (__builtin_popcount(mask) != 4) continue;
    std::vector<double> a, b;
    for (int i = 0; i < 10; ++i) (mask >> i & 1 ? a : b).push_back(i);
    const MannWhitney ab = mann_whitney_u(a, b), ba = mann_whitney_u(b, a);
    ASSERT_TRUE(ab.exact);
    EXPECT_GE(ab.p_two_sided, 0.0);
    EXPECT_LE(ab.p_two_sided, 1.0);
    EXPECT_EQ(ab.u + ba.u, 24.0);
    EXPECT_NEAR(ab.p_two_sided, ba.p_two_sided, 1e-15);
  }
}

// ---- time over independent runs (compare's time rule) ----

namespace {

// One build's runs: each run has its own speed (a run-level factor, lognormal with sigma_run: the
// placement, frequency and neighbours of that process), and its repetitions vary a little around it.
struct Runs {
  std::vector<double> medians;      // one per run
  std::vector<double> repetitions;  // all repetitions of all runs, pooled
};
Runs draw_runs(std::mt19937_64& rng, int runs, int reps, double factor, double sigma_run, double sigma_rep) {
  std::normal_distribution<double> z(0, 1);
  Runs out;
  for (int r = 0; r < runs; ++r) {
    const double run_speed = factor * std::exp(sigma_run * z(rng));
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) t.push_back(1e-3 * run_speed * std::exp(sigma_rep * z(rng)));
    out.medians.push_back(memtrade::stats::median(t));
    out.repetitions.insert(out.repetitions.end(), t.begin(), t.end());
  }
  return out;
}

// How often compare's rule (p < alpha over the run medians and a slowdown beyond the minimum effect)
// flags a candidate at `factor` times the baseline's work.
double flag_rate(double factor, int trials, bool pooled_repetitions = false, double min_effect = 0.05) {
  std::mt19937_64 rng(12345);
  int flagged = 0;
  for (int t = 0; t < trials; ++t) {
    const Runs a = draw_runs(rng, 5, 9, 1.0, 0.02, 0.005), b = draw_runs(rng, 5, 9, factor, 0.02, 0.005);
    const auto c = pooled_repetitions ? memtrade::stats::compare_runs(a.repetitions, b.repetitions)
                                      : memtrade::stats::compare_runs(a.medians, b.medians);
    flagged += c.p_slower < 0.01 && c.ratio > 1 + min_effect;
  }
  return static_cast<double>(flagged) / trials;
}

}  // namespace

TEST(Stats, MinPossiblePAndCv) {
  EXPECT_DOUBLE_EQ(memtrade::stats::min_possible_p(5, 5), 2.0 / 252);
  EXPECT_DOUBLE_EQ(memtrade::stats::min_possible_p(3, 3), 0.1);
  EXPECT_DOUBLE_EQ(memtrade::stats::min_possible_p(1, 1), 1.0);
  EXPECT_DOUBLE_EQ(memtrade::stats::cv({2.0}), 0.0);
  EXPECT_NEAR(memtrade::stats::cv({1.0, 2.0, 3.0}), 0.5, 1e-15);  // sd 1, mean 2
  EXPECT_THROW(memtrade::stats::cv({}), memtrade::Error);
}

TEST(Stats, RunComparisonIsTheRatioOfTheRunMedians) {
  const auto c = memtrade::stats::compare_runs({1.0, 1.1, 0.9, 0.95, 1.05}, {2.0, 2.2, 1.8, 1.9, 2.1});
  EXPECT_DOUBLE_EQ(c.ratio, 2.0);
  EXPECT_DOUBLE_EQ(c.p, 2.0 / 252);  // complete separation of 5 and 5
  EXPECT_DOUBLE_EQ(c.p_slower, 1.0 / 252);
  EXPECT_DOUBLE_EQ(c.p_faster, 1.0);
  EXPECT_DOUBLE_EQ(c.min_p, 1.0 / 252);
}

TEST(Stats, RunLevelTestHasItsSizeAndPowerWherePooledRepetitionsDoNot) {
  // Identical builds: the run-median test is significant at most about alpha of the time (exact
  // test: 2/252 here), with or without the minimum effect.
  EXPECT_LT(flag_rate(1.0, 2000, false, 0.0), 0.02);
  EXPECT_LT(flag_rate(1.0, 2000), 0.02);
  // Pooling the repetitions of each side treats 45 values as independent when 5 are: with 2% of
  // run-to-run noise the U test calls identical builds different far more often than alpha.
  EXPECT_GT(flag_rate(1.0, 2000, true, 0.0), 0.1);
  // With 2% of run-to-run noise, a 25% slowdown is found nearly always, 10% in most comparisons.
  EXPECT_GT(flag_rate(1.25, 2000), 0.95);
  EXPECT_GT(flag_rate(1.10, 2000), 0.80);
}

// Expectations from scipy.stats.wilcoxon(d, alternative='greater' / 'less'), scipy 1.17.1.
TEST(SignedRank, AgainstScipy) {
  struct Row {
    std::vector<double> d;
    double w_plus, p_greater, p_less;
    bool exact;
  };
  std::vector<double> big;
  for (int i = 0; i < 60; ++i) big.push_back(((i * 37) % 23 - 8) / 10.0 + 0.05 * i);
  const std::vector<Row> rows = {
      {{0.05, 0.02, -0.01, 0.03, 0.04, 0.06, 0.07}, 27, 0.015625, 0.9921875, true},
      {{0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07}, 28, 0.0078125, 1.0, true},  // 2^-7: the floor of 7 pairs
      {{0.1, 0.1, -0.2, 0.3, 0.3, 0.3, -0.1, 0.4}, 30, 0.05859375, 0.96875, true},  // tied |d|
      {{0, 0.2, -0.1, 0.3, 0.5, 0.0, 0.6}, 14, 0.0625, 0.96875, true},              // zeros dropped
      {big, 1806, 2.705073055176049e-11, 0.9999999999729493, false},               // n > 50: normal
  };
  for (const auto& r : rows) {
    const SignedRank w = wilcoxon_signed_rank(r.d);
    EXPECT_EQ(w.w_plus, r.w_plus);
    EXPECT_EQ(w.exact, r.exact);
    EXPECT_NEAR(w.p_greater, r.p_greater, (r.exact ? kExactTol : kAsymTol) * r.p_greater);
    EXPECT_NEAR(w.p_less, r.p_less, (r.exact ? kExactTol : 1e-12));
  }
  EXPECT_THROW(wilcoxon_signed_rank({}), Error);
  EXPECT_THROW(wilcoxon_signed_rank({1.0, std::nan("")}), Error);
  const SignedRank zeros = wilcoxon_signed_rank({0.0, 0.0});
  EXPECT_EQ(zeros.p_greater, 1.0);  // no evidence
}

TEST(SignedRank, PairedComparisonIsTheMedianRatioOfTheRounds) {
  // Each round's pair shares the machine's speed of the moment: 30% drift between rounds, 2-4% slower
  // candidate in every round. The paired test sees it; the unpaired one cannot.
  const std::vector<double> a = {1.0, 1.3, 0.9, 1.2, 1.0, 1.25, 0.95};
  std::vector<double> b;
  const double slow[] = {1.03, 1.02, 1.04, 1.03, 1.02, 1.035, 1.025};
  for (std::size_t i = 0; i < a.size(); ++i) b.push_back(a[i] * slow[i]);
  const RunComparison p = compare_pairs(a, b);
  EXPECT_NEAR(p.ratio, 1.03, 1e-12);
  EXPECT_DOUBLE_EQ(p.p_slower, 1.0 / 128);
  EXPECT_DOUBLE_EQ(p.p_faster, 1.0);
  EXPECT_DOUBLE_EQ(p.min_p, 1.0 / 128);
  EXPECT_GT(compare_runs(a, b).p_slower, 0.1);
  EXPECT_THROW(compare_pairs({1.0}, {1.0, 2.0}), Error);
  EXPECT_THROW(compare_pairs({1.0}, {0.0}), Error);
}

TEST(SignedRank, PairedTestHasItsSizeUnderDrift) {
  // Identical builds under a drifting machine (log-normal round factor, 20%) and 3% pair noise:
  // 7 pairs flag at most about 2^-7 of the time; a 10% slowdown nearly always.
  std::mt19937_64 rng(7);
  std::normal_distribution<double> drift(0, 0.2), noise(0, 0.03);
  auto rate = [&](double factor, int trials) {
    int hits = 0;
    for (int t = 0; t < trials; ++t) {
      std::vector<double> a, b;
      for (int i = 0; i < 7; ++i) {
        const double m = std::exp(drift(rng));
        a.push_back(m * std::exp(noise(rng)));
        b.push_back(factor * m * std::exp(noise(rng)));
      }
      const RunComparison c = compare_pairs(a, b);
      hits += c.p_slower < 0.01 && c.ratio > 1.05;
    }
    return static_cast<double>(hits) / trials;
  };
  EXPECT_LT(rate(1.0, 4000), 0.01);
  EXPECT_GT(rate(1.10, 2000), 0.80);
  EXPECT_GT(rate(1.25, 2000), 0.99);
}
