// Small-sample statistics for the regression checker: location/spread summaries and the
// Mann-Whitney U test, two- and one-sided (scipy.stats.mannwhitneyu semantics, method='auto').
#pragma once

#include <vector>

namespace memtrade::stats {

// All functions throw memtrade::Error on an empty sample or one containing NaN.
double median(std::vector<double> v);        // middle value; mean of the two middle values for even n
double mean(const std::vector<double>& v);
double stddev(const std::vector<double>& v);  // sample standard deviation (divides by n - 1); needs n >= 2

struct MannWhitney {
  double u;            // U statistic of sample a: the number of pairs (a_i, b_j) with a_i > b_j, ties count 1/2
  double p_two_sided;  // in [0, 1]
  double p_less;       // one-sided: a tends to be smaller than b (scipy's alternative='less')
  double p_greater;    // one-sided: a tends to be larger than b
  bool exact;          // p from the exact null distribution (else the normal approximation)
};

// Two-sided Mann-Whitney U test of a against b, as scipy.stats.mannwhitneyu(a, b,
// alternative='two-sided', method='auto'): the exact p-value when there are no ties and either
// sample has at most 8 values, otherwise the normal approximation with tie and continuity
// corrections. Infinite values are allowed (they just rank first or last).
MannWhitney mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b);

// Smallest two-sided p an exact U test can reach with samples of these sizes: 2 / C(n1 + n2, n1)
// (one-sided: half of it).
double min_possible_p(std::size_t n1, std::size_t n2);

// Coefficient of variation (sample stddev / mean); 0 for a single value.
double cv(const std::vector<double>& v);

// Time of two builds, each measured by independent runs (one value per run, e.g. the run's median):
// the effect is the ratio of the medians of the runs (candidate / baseline), the significance the
// one-sided Mann-Whitney U tests over the runs (slower, faster; the two-sided p as well). Repetitions inside one run are not independent
// samples of what varies between runs (placement, frequency, the neighbours' load), so the test is
// never made on them.
struct RunComparison {
  double baseline_median, candidate_median, ratio;
  double p;         // two-sided Mann-Whitney U over the run values
  double p_slower;  // one-sided: the candidate's runs tend to be slower (the regression test)
  double p_faster;  // one-sided: they tend to be faster
  double min_p;     // the smallest one-sided p these sample sizes allow; no verdict when min_p >= alpha
};
RunComparison compare_runs(const std::vector<double>& baseline_runs, const std::vector<double>& candidate_runs);

// One-sample Wilcoxon signed-rank test of the differences d, as scipy.stats.wilcoxon(d,
// zero_method='wilcox', correction=False, method='auto'): zeros are dropped; the exact p-value when
// at most 50 remain (with tied |d|, over the sign patterns of the tied ranks), otherwise the normal
// approximation with the tie correction.
struct SignedRank {
  double w_plus;     // sum of the ranks of |d| over the positive differences
  double p_greater;  // one-sided: d tends to be positive (scipy's alternative='greater')
  double p_less;     // one-sided: d tends to be negative
  std::size_t n;     // non-zero differences used
  bool exact;
};
SignedRank wilcoxon_signed_rank(const std::vector<double>& d);

// Time of two builds measured in paired rounds (round i: one baseline and one candidate value taken
// moments apart, ab's lockstep order), so that what drifts between rounds (the neighbours' load, the
// clock) cancels in each pair's ratio. The effect is the median of the per-round ratios
// candidate/baseline; the significance the one-sided signed-rank tests on their logarithms. The
// smallest one-sided p with n pairs is 2^-n (7 pairs reach p < 0.01).
RunComparison compare_pairs(const std::vector<double>& baseline, const std::vector<double>& candidate);

}  // namespace memtrade::stats
