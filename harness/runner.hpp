// The runner: every applicable implementation on every case of a suite's profile.
//
// Per (case, implementation), in this order:
//   1. make the workload (inputs and outputs allocated on the device);
//   2. memory pass: reset the pool's peak, make one call, read the peak (peak_bytes, the increase
//      over what was live before the call as peak_extra_bytes, and per-tag peaks);
//   3. error pass: the output of that call against the float64 oracle;
//   4. timing: Google Benchmark repetitions of the call, manual time from the device (CUDA events
//      on the GPU), min_time per repetition from the profile.
// An OutOfMemory anywhere makes the record "oom", Skip "skipped", any other exception "error";
// the run goes on with the next case.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "harness/results.hpp"
#include "harness/suite.hpp"

namespace memtrade {

struct RunOptions {
  std::vector<std::string> suites;  // names; "all" for every suite
  std::string profile = "quick";
  std::string backend = "auto";  // cpu | cuda | auto (both; CUDA records "skipped" without a device)
  std::filesystem::path out;
  std::filesystem::path suites_dir;
  std::optional<std::size_t> capacity;  // device pool capacity in bytes
  std::optional<int> repetitions;       // overrides the profile's
  std::string filter;                   // run only records whose name (suite/case/impl) matches this regex
  // key=value overrides of case parameters (checked against the technique's schema), applied to every
  // case of the selected suites' profile; cases that become equal run once.
  std::vector<std::pair<std::string, Json>> overrides;
  bool verbose = true;
  bool probe = true;  // measure the machine's GEMM and copy ceilings first (frac_of_* counters need them)
  bool list_only = false;  // print the records the selection would run (suite/case/impl) and return
};

struct RunSummary {
  int ok = 0, oom = 0, skipped = 0, error = 0;
};

RunSummary run_suites(const Registry& reg, const RunOptions& opts);

// The technique's ErrorRule on a finished record (`earlier`: the records of the suite so far, where the
// case's reference ran first): counter error_ok = 1 or 0, and the failed rule's numbers appended to
// the record's detail. Not judged (no counter) when no reference of the case ran.
void judge_record(const Technique& t, const Impl& impl, const Case& c, const Problem& p,
                  const std::vector<Record>& earlier, Record& rec);

// Checks every profile of a suite file against its technique's schema; throws Error naming the file,
// the profile, the case and the key.
void check_suite(const Registry& reg, const SuiteSpec& s);

// A profile's cases with `overrides` applied (ids and x recomputed, duplicates dropped), checked
// against the schema.
std::vector<Case> apply_overrides(const Technique& t, const SuiteSpec& s, const Profile& p,
                                  const std::vector<std::pair<std::string, Json>>& overrides);

// One (case, implementation) measurement: the steps above. Exposed for tests.
Record measure(const Technique& tech, const Impl& impl, const Case& c, const Problem& problem, Device& dev,
               int repetitions, double min_time_s, const Ceilings& ceilings);

}  // namespace memtrade
