// Numeric error against a higher-precision oracle, and the tolerance rule.
//
// Every technique's output is compared with a float64 oracle. The rule for an
// optimized low-precision result (the one FlashAttention's tests use): its
// error may be at most `factor` times the error of the reference computed in
// the same low precision, plus a small absolute floor. A NaN or Inf where the
// oracle is finite always fails.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace memtrade {

struct ErrorStats {
  double max_abs = 0;    // max |x - r|
  double max_rel = 0;    // max |x - r| / max(|r|, 1e-6 * rms(r))
  double rel_l2 = 0;     // ||x - r||_2 / ||r||_2  (||x - r||_2 when r is all zero)
  std::size_t nan_count = 0;  // NaN in x where r is finite
  std::size_t inf_count = 0;  // +-Inf in x where r is finite
  std::size_t n = 0;
  // Non-finite values where the oracle is finite make every error +Inf, so no threshold can pass them.
  bool finite() const { return nan_count == 0 && inf_count == 0; }
};

// Throws memtrade::Error on a size mismatch or a non-finite oracle value.
ErrorStats error_stats(std::span<const double> x, std::span<const double> oracle);

struct Tolerance {
  double factor = 2.0;     // allowed multiple of the same-precision reference's error
  double abs_floor = 1e-5;  // absolute slack for results the reference gets (nearly) exact
};

struct Verdict {
  bool pass = false;
  std::string why;  // the numbers behind the verdict, for test and report output
};

// optimized.max_abs <= factor * reference.max_abs + abs_floor, and no NaN/Inf in `optimized`.
Verdict within_tolerance(const ErrorStats& optimized, const ErrorStats& reference, Tolerance tol = {});

// Per-element rule |x - r| <= atol + rtol * |r| (llm.c's check); reports the first failing index.
Verdict all_close(std::span<const double> x, std::span<const double> oracle, double atol, double rtol);

}  // namespace memtrade
