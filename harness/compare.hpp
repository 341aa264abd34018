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
//   time: judged on independent runs, never on the repetitions inside one run. Each side may be
//     several results files (runs of one build, e.g. from `memtrade ab`); a case's time in a run is
//     the median of its repetitions. A run whose repetitions spread too wide (coefficient of
//     variation above max_cv) or whose calling thread got far less CPU in one repetition than in its best
//     (pre-empted: CPU/wall below min_cpu_share of the run's highest) is `unstable` and left out. A
//     regression needs both a one-sided Mann-Whitney U test over the run medians ("the candidate is
//     slower") with p < alpha and a median slowdown above the minimum effect; with too few runs for that p (one file per side)
//     time is listed, never gated. Only against a baseline of the same machine class.
//   untracked_bytes (CPU heap allocated outside the tracked pools during the measured call): growth
//     beyond untracked_allowance_bytes or a quarter of the baseline's figure, whichever is larger, is a
//     regression (library buffers that follow the thread count differ a little between machines).
//   new counters (a new peak tag, a metric the baseline lacks) are listed as new_metric.
//   claims: a verdict leaving `reproduced` while the claim's suite entry is unchanged is a regression, and
//     so is an `error` verdict (a check that failed); other verdict changes are listed.
//   identity: a record is its name and its backend (CPU and CUDA implementations may share a name); rows
//     name a non-CPU record "suite/case/impl (backend)".
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
  double untracked_allowance_bytes = 64 * 1024;  // growth allowed of untracked_bytes
  double error_ratio = 2.0;
  double error_floor = 0;     // absolute floor of rel_l2_err growth
  double error_floor_u = 2;   // ... and in unit roundoffs of the case dtype
  double time_alpha = 0.01;
  double time_min_effect = 0.05;  // 5% slower (median of the runs' values, or of the paired rounds' ratios)
  // A run's time of a case: the fastest of its repetitions (default) or their median. On a shared
  // machine interference only adds time and comes in bursts that can cover most of a run's
  // repetitions, so the minimum varies far less between runs (README, "Regression rules").
  enum class RunStat { min, median } time_stat = RunStat::min;
  // Per-case minimum effects: the first pattern (ECMAScript regex, searched in the case name) that
  // matches sets it.
  std::vector<std::pair<std::string, double>> min_effect_for;
  double max_cv = 0.25;         // a run whose repetitions spread wider is unstable (by the median only)
  double min_cpu_share = 0.5;   // a CPU repetition with CPU/wall below this share of the run's best was pre-empted
  bool allow_missing = false;
  // Run i of the baseline and run i of the current side form a pair (ab's lockstep rounds): time is
  // then judged on the per-round ratios (stats::compare_pairs) instead of the two sets of runs.
  bool paired = false;
};

// One case's time in one run (its repetitions' minimum or median, per CompareOptions::time_stat), and
// whether the run is usable.
struct RunTime {
  double value = 0;
  bool stable = true;
  std::string why;  // why not stable
};
RunTime summarize_run(const Summary& s, const CompareOptions& o);

struct CompareRow {
  std::string name, metric;
  Json baseline, current;
  std::string change;   // "+12.5%", "+4096 B", ...
  std::string verdict;  // ok | regression | improved | slower | faster | unstable | changed | still_failing | missing |
                        // new | new_metric | status_changed | verdict_changed | not_compared
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
  int checks = 0;  // rows compared (or failed outright: a missing case, a new error)
  int listed = 0;  // rows listed, not compared: new cases and counters, other machine class or implementation
  int baseline_runs = 1, current_runs = 1;
  std::vector<std::string> unstable;  // record names (suite/case/impl, for run --filter) whose time verdict needs more stable runs
  // Time regressions as (row name, record name for run --filter).
  std::vector<std::pair<std::string, std::string>> time_regressions;
};

// Several runs per side: memory, error and counters from the first run of each (memory must be equal
// in every current run), time from all of them.
CompareResult compare_runs(const std::vector<LoadedResults>& baseline, const std::vector<LoadedResults>& current,
                           const CompareOptions& opts);
CompareResult compare_results(const LoadedResults& baseline, const LoadedResults& current, const CompareOptions& opts);
// The non-ok rows as a table (terminal or GitHub markdown), with a summary line.
std::string format_compare(const CompareResult& r, bool markdown);
Json compare_to_json(const CompareResult& r);

}  // namespace memtrade
