// Regression check of one results file against a baseline, metric by metric:
//   memory (peak_*): exact; any growth beyond the stated tolerance is a regression.
//   numeric error, judged against the oracle first: error_ok (the technique's ErrorRule against the
//     float64 oracle, recorded by the runner; machine-independent) turning 0 is a regression. Against
//     the baseline second: rel_l2_err is a regression above ratio x baseline when the increase also
//     exceeds a floor of error_floor_u unit roundoffs of the case dtype (fp32 when it has none);
//     max_abs_err and max_rel_err depend on the summation order (and near-zero denominators) and are
//     listed, not gated. NaN/Inf where the baseline was finite always is a regression; nan_count /
//     inf_count: any increase.
//   declared metrics: every other counter a technique declares (in the results context) is gated by its
//     declared rule: exact (any change in the worse direction), ratio (beyond ratio x baseline and the
//     floor, in the worse direction), bound (past the floor), zero (must stay 0); time and report
//     metrics are not compared (throughput follows time, which is tested on run medians).
//   time: two-sided Mann-Whitney U over the repetitions, a regression when p < alpha AND the median
//     slowed by more than the minimum effect; only against a baseline of the same machine class.
//   status: ok -> oom/error/skipped is a regression; missing cases are regressions unless allowed.
//   choice: a case whose choice_* counter (a dispatcher's decision) differs from the baseline's ran a
//     different implementation; it is listed as not compared.
#pragma once

#include <string>
#include <vector>

#include "harness/results.hpp"

namespace memtrade {

struct CompareOptions {
  bool time_gate = true;             // false: time differences are reported, never regressions
  double memory_tolerance_bytes = 0;  // growth allowed per memory metric
  double error_ratio = 2.0;
  double error_floor = 0;     // absolute floor of rel_l2_err growth
  double error_floor_u = 2;   // ... and in unit roundoffs of the case dtype
  double time_alpha = 0.01;
  double time_min_effect = 0.10;  // 10% slower median
  bool allow_missing = false;
};

struct CompareRow {
  std::string name, metric;
  Json baseline, current;
  std::string change;   // "+12.5%", "+4096 B", ...
  std::string verdict;  // ok | regression | improved | slower | faster | missing | new | status_changed | not_compared
  std::string detail;
  bool regression = false;
};

struct CompareResult {
  std::string baseline_path, current_path;
  bool time_gate = true;
  bool same_machine_class = true;
  std::vector<std::string> notes;  // machine-class mismatches, too few repetitions, ...
  std::vector<CompareRow> rows;    // every check made, ok ones included
  int regressions = 0;
  int checks = 0;
};

CompareResult compare_results(const LoadedResults& baseline, const LoadedResults& current, const CompareOptions& opts);
// The non-ok rows as a table (terminal or GitHub markdown), with a summary line.
std::string format_compare(const CompareResult& r, bool markdown);
Json compare_to_json(const CompareResult& r);

}  // namespace memtrade
