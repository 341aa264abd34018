#include "harness/stats.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/common.hpp"

namespace memtrade::stats {

namespace {

void check_sample(const std::vector<double>& v, const char* what) {
  if (v.empty()) throw Error(std::string(what) + ": empty sample");
  for (double x : v)
    if (std::isnan(x)) throw Error(std::string(what) + ": sample contains NaN");
}

// P(U <= k) under the null hypothesis for samples of sizes n and m, no ties.
//
// Under the null every one of the C(n+m, n) orderings of the pooled sample is equally likely.
// U counts the pairs (a_i, b_j) with a_i > b_j; writing u_i for the number of b's below the
// i-th smallest a gives 0 <= u_1 <= ... <= u_n <= m and U = sum u_i, so the number of orderings
// with U = u is the number of partitions of u into at most n parts, each at most m. Their
// generating function is the Gaussian binomial coefficient
//     [n+m choose n]_q = prod_{i=1..n} (1 - q^(m+i)) / (1 - q^i),
// built here one factor at a time. After factor i the coefficients are those of [m+i choose i]_q:
// non-negative integers, exact in double while below 2^53. Coefficient d only depends on
// coefficients <= d, so the series is truncated at degree k (the caller passes the lower tail,
// k <= n*m/2).
double mwu_exact_cdf(std::size_t n, std::size_t m, std::size_t k) {
  if (n > m) std::swap(n, m);  // fewer factors; the distribution is symmetric in n and m
  std::vector<double> c(k + 1, 0.0);
  c[0] = 1.0;
  double total = 1.0;  // C(m+i, i) after step i
  for (std::size_t i = 1; i <= n; ++i) {
    // Multiply by (1 - q^(m+i)), high degrees first so c[d - (m+i)] is still the old value.
    for (std::size_t d = k; d >= m + i; --d) c[d] -= c[d - (m + i)];
    // Divide by (1 - q^i), i.e. multiply by 1 + q^i + q^2i + ...: a running sum with stride i.
    for (std::size_t d = i; d <= k; ++d) c[d] += c[d - i];
    total = total * static_cast<double>(m + i) / static_cast<double>(i);
  }
  double below = 0.0;
  for (double x : c) below += x;
  return below / total;
}

// Standard normal upper tail P(Z > z).
double normal_sf(double z) { return 0.5 * std::erfc(z / std::sqrt(2.0)); }

}  // namespace

double median(std::vector<double> v) {
  check_sample(v, "median");
  const std::size_t h = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + h, v.end());
  if (v.size() % 2 == 1) return v[h];
  // Even n: the other middle value is the largest of the lower half.
  const double lo = *std::max_element(v.begin(), v.begin() + h);
  return lo + (v[h] - lo) / 2;  // no overflow for huge values
}

double mean(const std::vector<double>& v) {
  check_sample(v, "mean");
  double s = 0.0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  check_sample(v, "stddev");
  if (v.size() < 2) throw Error("stddev: need at least 2 values for a sample standard deviation");
  // Two passes (deviations from the mean) to avoid the cancellation of sum(x^2) - n*mean^2.
  const double m = mean(v);
  double ss = 0.0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(v.size() - 1));
}

double min_possible_p(std::size_t n1, std::size_t n2) {
  double c = 1;
  for (std::size_t i = 1; i <= n1; ++i) c = c * static_cast<double>(n2 + i) / static_cast<double>(i);
  return std::min(1.0, 2.0 / c);
}

double cv(const std::vector<double>& v) {
  if (v.size() < 2) {
    check_sample(v, "cv");
    return 0;
  }
  const double m = mean(v);
  return m != 0 ? stddev(v) / std::abs(m) : 0;
}

RunComparison compare_runs(const std::vector<double>& a, const std::vector<double>& b) {
  RunComparison r{};
  r.baseline_median = median(a);
  r.candidate_median = median(b);
  r.ratio = r.candidate_median / r.baseline_median;
  const MannWhitney mw = mann_whitney_u(a, b);
  r.p = mw.p_two_sided;
  r.p_slower = mw.p_less;  // the baseline's times smaller: the candidate slower
  r.p_faster = mw.p_greater;
  r.min_p = min_possible_p(a.size(), b.size()) / 2;
  return r;
}

RunComparison compare_pairs(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw Error("compare_pairs: the two sides must have one value per round");
  check_sample(a, "compare_pairs");
  check_sample(b, "compare_pairs");
  std::vector<double> log_ratio, ratio;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] > 0) || !(b[i] > 0)) throw Error("compare_pairs: times must be positive");
    ratio.push_back(b[i] / a[i]);
    log_ratio.push_back(std::log(b[i] / a[i]));
  }
  RunComparison r{};
  r.baseline_median = median(a);
  r.candidate_median = median(b);
  r.ratio = median(ratio);
  const SignedRank w = wilcoxon_signed_rank(log_ratio);
  r.p_slower = w.p_greater;
  r.p_faster = w.p_less;
  r.p = std::min(1.0, 2 * std::min(w.p_greater, w.p_less));
  r.min_p = std::ldexp(1.0, -static_cast<int>(std::min<std::size_t>(a.size(), 1000)));
  return r;
}

SignedRank wilcoxon_signed_rank(const std::vector<double>& d_in) {
  check_sample(d_in, "wilcoxon_signed_rank");
  std::vector<double> d;
  for (double x : d_in)
    if (x != 0) d.push_back(x);
  SignedRank res{0, 1, 1, d.size(), false};
  if (d.empty()) return res;  // no evidence either way
  const std::size_t n = d.size();
  // Rank |d| (1-based, ties get the average rank); W+ sums the ranks of the positive differences.
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t l, std::size_t r) { return std::abs(d[l]) < std::abs(d[r]); });
  double tie_term = 0;
  std::vector<std::size_t> rank2(n);  // twice each |d|'s rank: average ranks of ties are half integers
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && std::abs(d[order[j]]) == std::abs(d[order[i]])) ++j;
    const std::size_t r2 = i + 1 + j;  // twice the average of the ranks i+1 .. j
    for (std::size_t k = i; k < j; ++k) {
      rank2[k] = r2;
      if (d[order[k]] > 0) res.w_plus += static_cast<double>(r2) / 2;
    }
    const double t = static_cast<double>(j - i);
    tie_term += t * t * t - t;
    i = j;
  }
  const double dn = static_cast<double>(n);
  const double total = dn * (dn + 1) / 2;
  if (n <= 50) {
    // Under the null each of the 2^n sign patterns of these ranks is equally likely (with ties: of the
    // tied ranks, the conditional distribution); count[s] = how many give 2 W+ = s. Counts stay below
    // 2^50: exact in double.
    res.exact = true;
    const auto max_s = static_cast<std::size_t>(2 * total);
    std::vector<double> count(max_s + 1, 0.0);
    count[0] = 1;
    for (std::size_t r2 : rank2)
      for (std::size_t x = max_s; x >= r2; --x) count[x] += count[x - r2];
    const auto w2 = static_cast<std::size_t>(std::llround(2 * res.w_plus));
    double le = 0, ge = 0;
    for (std::size_t x = 0; x <= max_s; ++x) {
      if (x <= w2) le += count[x];
      if (x >= w2) ge += count[x];
    }
    const double all = std::ldexp(1.0, static_cast<int>(n));
    res.p_less = le / all;
    res.p_greater = ge / all;
  } else {
    const double mean = total / 2;
    const double sd = std::sqrt(dn * (dn + 1) * (2 * dn + 1) / 24 - tie_term / 48);
    res.p_greater = sd > 0 ? normal_sf((res.w_plus - mean) / sd) : 0.5;
    res.p_less = sd > 0 ? normal_sf((mean - res.w_plus) / sd) : 0.5;
  }
  return res;
}

MannWhitney mann_whitney_u(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || b.empty()) throw Error("mann_whitney_u: both samples must be non-empty");
  for (const auto* s : {&a, &b})
    for (double x : *s)
      if (std::isnan(x)) throw Error("mann_whitney_u: samples must not contain NaN");

  const std::size_t n1 = a.size(), n2 = b.size(), n = n1 + n2;

  // Rank the pooled sample (1-based), giving each group of equal values the average of the ranks
  // it spans. R1 is the rank sum of sample a; each tie group of size t adds t^3 - t to the tie term.
  std::vector<std::pair<double, bool>> pooled;  // (value, from a)
  pooled.reserve(n);
  for (double x : a) pooled.emplace_back(x, true);
  for (double x : b) pooled.emplace_back(x, false);
  std::sort(pooled.begin(), pooled.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
  double r1 = 0.0, tie_term = 0.0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && pooled[j].first == pooled[i].first) ++j;
    const double avg_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;  // ranks i+1 .. j
    for (std::size_t k = i; k < j; ++k)
      if (pooled[k].second) r1 += avg_rank;
    const double t = static_cast<double>(j - i);
    tie_term += t * t * t - t;
    i = j;
  }
  const bool ties = tie_term > 0;

  // U1 = R1 - n1(n1+1)/2; U1 + U2 = n1*n2. The two-sided p-value is twice the upper tail at
  // max(U1, U2) (equivalently the lower tail at min(U1, U2): the null distribution is symmetric).
  const double nn = static_cast<double>(n1) * static_cast<double>(n2);
  const double u1 = r1 - static_cast<double>(n1) * static_cast<double>(n1 + 1) / 2;
  const double u_max = std::max(u1, nn - u1);

  MannWhitney res{u1, 1.0, 1.0, 1.0, false};
  if (!ties && (n1 <= 8 || n2 <= 8)) {
    // Exact: P(U >= u_max) = P(U <= n1*n2 - u_max). Without ties U is an integer.
    res.exact = true;
    const auto k = static_cast<std::size_t>(std::llround(nn - u_max));
    res.p_two_sided = 2 * mwu_exact_cdf(n1, n2, k);
    // One-sided: P(U1 <= u1) (a smaller) and P(U1 >= u1) = P(U1 <= n1*n2 - u1) (a larger).
    res.p_less = mwu_exact_cdf(n1, n2, static_cast<std::size_t>(std::llround(u1)));
    res.p_greater = mwu_exact_cdf(n1, n2, static_cast<std::size_t>(std::llround(nn - u1)));
  } else {
    // Normal approximation: under the null U has mean n1*n2/2 and variance
    //   n1*n2/12 * ((n+1) - sum(t^3 - t) / (n(n-1)))   (tie-corrected).
    // The continuity correction subtracts 1/2 from u_max - mean, which always enlarges p.
    const double dn = static_cast<double>(n);
    const double var = nn / 12 * ((dn + 1) - tie_term / (dn * (dn - 1)));
    const double sd = std::sqrt(std::max(var, 0.0));
    // sd == 0 when every value is equal; then u_max equals the mean and z = -0.5/0 = -inf: p = 1.
    res.p_two_sided = sd > 0 ? 2 * normal_sf((u_max - nn / 2 - 0.5) / sd) : 1.0;
    res.p_less = sd > 0 ? normal_sf((nn / 2 - u1 - 0.5) / sd) : 1.0;
    res.p_greater = sd > 0 ? normal_sf((u1 - nn / 2 - 0.5) / sd) : 1.0;
  }
  res.p_less = std::clamp(res.p_less, 0.0, 1.0);
  res.p_greater = std::clamp(res.p_greater, 0.0, 1.0);
  // Twice a tail can exceed 1 when u_max is at (or, with the correction, near) the centre.
  res.p_two_sided = std::clamp(res.p_two_sided, 0.0, 1.0);
  return res;
}

}  // namespace memtrade::stats
