// A/B timing of two builds on one machine, as a CI job runs it before a merge: the baseline and the
// candidate binaries are run alternately (ABBA order, so a drift of the machine's speed during the
// session falls on both), each run a separate process writing its own results file, then compared
// with compare_runs (time on the run medians, see compare.hpp). Cases whose time verdict is
// `unstable` (pre-empted or too spread runs left out, so the test is inconclusive) are run again,
// in the same alternating order and for them alone, up to `retries` times.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "harness/compare.hpp"

namespace memtrade {

struct AbOptions {
  std::filesystem::path baseline_bin, candidate_bin;
  std::vector<std::string> baseline_env, candidate_env;  // NAME=VALUE set for that side's runs only
  std::vector<std::string> run_args;                     // passed to `run` (--suite, --profile, --set, ...)
  std::string filter;                                    // run's --filter
  int runs = 5;
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

// Runs a program with these arguments, without a shell (paths with quotes or spaces pass as they are),
// and waits for it: its exit status, 128 + the signal, or 127 when it could not be started.
int run_program(const std::vector<std::string>& args);

// An ECMAScript pattern matching exactly these names.
std::string exact_names_pattern(const std::vector<std::string>& names);

}  // namespace memtrade
