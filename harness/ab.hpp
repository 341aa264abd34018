// A/B timing of two builds on one machine, as a CI job runs it before a merge. By default each round
// starts both builds' runs at once in lockstep (lockstep.hpp): every case is timed by one build right
// after the other while the other waits, and time is judged on the per-round pairs (signed-rank test of
// the ratios, compare_pairs), so that the machine's drift between rounds cancels. Without lockstep the
// two builds run one after the other (ABBA order), each round a separate process per build, judged on
// the two sets of runs. Either way each run writes its own results file. Cases whose time verdict is
// `unstable` (pre-empted or too spread runs left out, so the test is inconclusive) are run again, in
// the same order and for them alone, up to `retries` times.
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
  std::filesystem::path out_dir = "build/ab";
  CompareOptions compare;
  bool verbose = true;
};

struct AbResult {
  CompareResult compare;
  std::vector<std::filesystem::path> baseline_files, candidate_files;
  int rounds = 0;
};

// Throws Error when a binary is missing or a run fails (a run that records failed cases still counts).
AbResult run_ab(const AbOptions& o);

// An ECMAScript pattern matching exactly these names.
std::string exact_names_pattern(const std::vector<std::string>& names);

}  // namespace memtrade
