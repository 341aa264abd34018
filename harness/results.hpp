// Results files: Google Benchmark JSON with memtrade's figures as counters.
//
// {"context": {...Google Benchmark's keys..., "memtrade": {suites, profile, backend, git_commit,
//   compiler, build_type, cpu_model, gpu_name, machine_class, ceilings, ...}},
//  "benchmarks": [one entry per repetition (run_type "iteration") and the median/mean/stddev/cv
//   aggregates, each carrying status and counters; a case that did not run ok has one entry with
//   its status ("oom", "skipped", "error") and status_detail],
//  "claims": [{id, statement, source, expected, measured, verdict, note}]}
//
// The writer keeps the run in `F.partial` (rewritten atomically after every case: a crash loses at most
// the case in progress, and what finished is readable there) and replaces F only at the end (finish()),
// so an earlier results file F survives a run that is killed or fails. Non-finite counters are written
// as null.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "harness/registry.hpp"

namespace memtrade {

// Machine ceilings measured by `memtrade probe`: keys like cpu_fp32_gemm_flops, cpu_copy_bytes_per_s,
// cuda_bf16_gemm_flops, cuda_copy_bytes_per_s.
using Ceilings = std::map<std::string, double>;

struct RunInfo {
  std::vector<std::string> suites;
  Json suite_meta = Json::object();  // suite -> {technique, x_param, x_label, description}
  std::string profile, backend;
  std::optional<std::size_t> capacity;
  Ceilings ceilings;
  int repetitions = 0;
};

// Google Benchmark's context plus memtrade's (git commit, compiler, machine, ceilings, ...).
Json build_context(const RunInfo& info);
// The machine classes this process would record: {"cpu": "...", "cuda": "..."} (cuda only with a device).
Json machine_classes();

// Throws Error unless `path` can be written (a file in a folder that exists or can be made, not a folder).
void check_writable(const std::filesystem::path& path);

class ResultsWriter {
 public:
  ResultsWriter(std::filesystem::path path, Json context);
  void add(const Record& r);
  void add_claim(const ClaimSpec& spec, const ClaimResult& result);
  void flush() const;   // F.partial
  void finish() const;  // F.partial -> F

 private:
  std::filesystem::path path_;
  Json doc_;
};

// The benchmark entries of one record (repetitions + aggregates, or one status entry).
Json record_entries(const Record& r);

// A results file read back, one Summary per benchmark name.
struct Summary {
  std::string name, suite, technique, impl, backend, status, detail;
  Json params = Json::object();             // the case's parameters
  std::map<std::string, double> counters;  // NaN where the file holds null
  std::vector<double> times_s;             // per repetition
  std::vector<double> cpu_times_s;         // per repetition, the calling thread's CPU time (empty when not recorded)
};
struct LoadedResults {
  std::filesystem::path path;
  Json context;
  std::vector<Summary> cases;  // in file order
  Json claims = Json::array();
};
// Throws ResultsError naming the file and the problem on unreadable or malformed input.
class ResultsError : public Error {
 public:
  using Error::Error;
};
LoadedResults load_results(const std::filesystem::path& path);

}  // namespace memtrade
