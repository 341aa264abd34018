// Suites: a technique's case grid, kept as data in suites/<name>.json.
//
//   {"suite": "gemm", "technique": "gemm", "description": "...",
//    "x_param": "n", "x_label": "matrix size n (M = N = K)",
//    "profiles": {"quick": {"repetitions": 9, "min_time_s": 0.02,
//                           "grid": [{"n": [64, 128], "dtype": ["fp32", "bf16"]}]},
//                 "full": {...}},
//    "claims": [{"id": "...", "statement": "...", "source": "...", "expected": "...", ...}]}
//
// Each grid entry is a cartesian product of its axes, in the order written; a profile's cases are
// the union of its grid entries. Every applicable implementation runs on every case.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "harness/registry.hpp"

namespace memtrade {

struct Profile {
  std::string name;
  int repetitions = 9;
  double min_time_s = 0.02;
  std::optional<std::size_t> capacity;  // device pool capacity for the profile's run ("capacity_bytes")
  std::vector<Case> cases;
};

struct SuiteSpec {
  std::string name, technique, description, x_param, x_label;
  std::filesystem::path file;
  std::vector<Profile> profiles;
  std::vector<ClaimSpec> claims;
  const Profile& profile(const std::string& name) const;  // throws Error listing the profiles
};

// Parses and validates one suite file; every problem throws Error naming the file.
SuiteSpec load_suite(const std::filesystem::path& file);
// The suites directory: $MEMTRADE_SUITES, else the source tree's suites/.
std::filesystem::path default_suites_dir();
// Every suites/*.json, sorted by name.
std::vector<SuiteSpec> load_all_suites(const std::filesystem::path& dir);
// "n=256,dtype=fp32"
std::string case_id(const Json& params);

}  // namespace memtrade
