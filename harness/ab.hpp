// A/B timing of two builds on one machine, as a CI job runs it before a merge. By default each round
// starts both builds' runs at once in lockstep (lockstep.hpp): every case is timed by one build right
// after the other while the other waits, and time is judged on the per-round pairs (signed-rank test of
// the ratios, compare_pairs), so that the machine's drift between rounds cancels. Without lockstep the
// two builds run one after the other (ABBA order), each round a separate process per build, judged on
// the two sets of runs. Either way each run writes its own results file. Cases whose time verdict is
// `unstable` (pre-empted or too spread runs left out, so the test is inconclusive) are run again, in
// the same order and for them alone, up to `retries` times.
//
// Time is gated in two stages, so that a compare of many cases keeps its family-wise false-alarm rate
// low without losing power. The `runs` rounds screen every case at the lenient `screen_alpha`; the cases
// they flag as slower are run again, alone, for `confirm_runs` fresh rounds, and a time regression
// stands only when those fresh rounds, judged on their own, flag it too at `compare.time_alpha` (with
// the same minimum effect). The two stages use disjoint rounds, so while rounds are independent the
// chance of a false alarm for a case that did not change is at most screen_alpha x time_alpha (0.05 x
// 0.01 = 5e-4), and over m cases at most m times that (a slowdown of one side's processes lasting the
// whole session is not independent between rounds and is not covered); a slowdown is caught when both stages see it, and the longer confirmation has
// more power than the screen. `confirm_runs` = 0 gates on the screening rounds alone, at time_alpha.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "harness/compare.hpp"
#include "harness/process.hpp"

namespace memtrade {

struct AbOptions {
  std::filesystem::path baseline_bin, candidate_bin;
  std::vector<std::string> baseline_env, candidate_env;  // NAME=VALUE set for that side's runs only
  std::vector<std::string> run_args;                     // passed to `run` (--suite, --profile, --set, ...)
  std::string filter;                                    // run's --filter
  int runs = 7;  // rounds; 7 pairs are the fewest with which the signed-rank test reaches p < 0.01
  // Both builds run at once, each case timed by one right after the other, and time is judged on the
  // per-round pairs (lockstep.hpp); false: whole runs one after the other (ABBA), judged unpaired.
  bool lockstep = true;
  int retries = 2;
  double screen_alpha = 0.05;  // level of the screening rounds' test (the stage that picks suspects)
  int confirm_runs = 14;       // fresh rounds for the suspects (14 pairs: the signed-rank test at 0.01
                               // tolerates a few faster rounds; 7 would need every round slower)
  std::filesystem::path out_dir = "build/ab";
  CompareOptions compare;
  bool verbose = true;
};

struct AbResult {
  CompareResult compare;
  std::vector<std::filesystem::path> baseline_files, candidate_files;  // every run, confirmation rounds last
  int rounds = 0;
  int confirm_rounds = 0;                   // of `rounds`, those run to confirm suspects
  std::vector<std::string> suspects;        // record names the screening flagged as slower
};

// The verdicts of a two-stage time gate: `screen` judged every case on the screening rounds,
// `confirm` the suspects on fresh rounds alone. Each time regression of `screen` stands only when
// `confirm` has it too; otherwise its row becomes `slower` ("not confirmed", or `unstable` when the
// fresh rounds were), with both stages' figures in the detail. Other rows are the screen's.
CompareResult confirm_time_regressions(CompareResult screen, const CompareResult& confirm, int confirm_rounds,
                                       double screen_alpha, double confirm_alpha);

// Throws Error when a binary is missing or a run fails (a run that records failed cases still counts).
AbResult run_ab(const AbOptions& o);

// An ECMAScript pattern matching exactly these names.
std::string exact_names_pattern(const std::vector<std::string>& names);

}  // namespace memtrade
