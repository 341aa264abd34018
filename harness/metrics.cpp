#include "harness/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "common/common.hpp"

namespace memtrade {

ErrorStats error_stats(std::span<const double> x, std::span<const double> oracle) {
  if (x.size() != oracle.size())
    throw Error("error_stats: result has " + std::to_string(x.size()) + " values, oracle has " +
                std::to_string(oracle.size()));
  ErrorStats s;
  s.n = x.size();
  double ref_sq = 0;
  for (std::size_t i = 0; i < oracle.size(); ++i) {
    if (!std::isfinite(oracle[i])) throw Error("error_stats: oracle value " + std::to_string(i) + " is not finite");
    ref_sq += oracle[i] * oracle[i];
  }
  const double rel_floor = 1e-6 * std::sqrt(ref_sq / std::max<std::size_t>(1, s.n));
  double diff_sq = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) { ++s.nan_count; continue; }
    if (std::isinf(x[i])) { ++s.inf_count; continue; }
    const double d = std::abs(x[i] - oracle[i]);
    s.max_abs = std::max(s.max_abs, d);
    const double denom = std::max(std::abs(oracle[i]), rel_floor);
    if (denom > 0) s.max_rel = std::max(s.max_rel, d / denom);
    diff_sq += d * d;
  }
  s.rel_l2 = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  if (!s.finite()) s.max_abs = s.max_rel = s.rel_l2 = std::numeric_limits<double>::infinity();
  return s;
}

Verdict within_tolerance(const ErrorStats& optimized, const ErrorStats& reference, Tolerance tol) {
  char buf[256];
  if (!optimized.finite()) {
    std::snprintf(buf, sizeof buf, "%zu NaN and %zu Inf values where the oracle is finite", optimized.nan_count,
                  optimized.inf_count);
    return {false, buf};
  }
  const double bound = tol.factor * reference.max_abs + tol.abs_floor;
  std::snprintf(buf, sizeof buf, "max_abs %.3e vs bound %.3e (= %.1f x reference %.3e + %.1e)", optimized.max_abs,
                bound, tol.factor, reference.max_abs, tol.abs_floor);
  return {optimized.max_abs <= bound, buf};
}

Verdict all_close(std::span<const double> x, std::span<const double> oracle, double atol, double rtol) {
  if (x.size() != oracle.size()) return {false, "size mismatch"};
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double d = std::abs(x[i] - oracle[i]);
    if (!(d <= atol + rtol * std::abs(oracle[i]))) {  // NaN fails: the comparison is false
      char buf[200];
      std::snprintf(buf, sizeof buf, "index %zu: got %.9g, expected %.9g (|diff| %.3e > %.3e)", i, x[i], oracle[i], d,
                    atol + rtol * std::abs(oracle[i]));
      return {false, buf};
    }
  }
  return {true, "all " + std::to_string(x.size()) + " values within tolerance"};
}

}  // namespace memtrade
