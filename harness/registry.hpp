// The registry: techniques, their implementations and their claim checks.
//
// A technique (gemm, attention, ...) provides:
//   - validate(case): throws memtrade::Error for an impossible case (bad shapes, unknown options);
//   - prepare(case): the host inputs and the float64 oracle, built once per case and shared by
//     every implementation (a Problem);
//   - implementations, each with a role (reference / optimized / vendor) and a backend, that turn
//     (case, problem, device) into a Workload whose run() is the measured call;
//   - claim checks: functions that judge a published claim from the suite's records.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/device.hpp"
#include "harness/metrics.hpp"
#include "harness/schema.hpp"

namespace memtrade {

using Json = nlohmann::ordered_json;

enum class Role : uint8_t { reference, optimized, vendor };
std::string_view role_name(Role r);

// One point of a suite's grid.
struct Case {
  std::string suite;
  std::string id;  // "n=256,dtype=fp32": the parameters in grid order
  Json params;     // {"n": 256, "dtype": "fp32"}
  double x = 0;    // the value of the suite's x parameter (the size axis of plots)

  // Typed parameter access; a missing or mistyped key throws Error naming the case.
  int64_t integer(const std::string& key) const;
  int64_t integer(const std::string& key, int64_t fallback) const;
  std::string text(const std::string& key) const;
  std::string text(const std::string& key, const std::string& fallback) const;
  bool flag(const std::string& key, bool fallback) const;
};

// Per-call amount of work, for throughput counters.
struct Work {
  double flops = 0;       // floating-point operations per call
  double bytes = 0;       // fewest bytes the call must move through memory
  std::string gemm_dtype;  // which GEMM ceiling the flops are compared with ("fp32", "bf16", ...); empty: none
  double items = 0;        // domain units per call (e.g. tokens), reported as <item_unit>_per_s
  std::string item_unit;   // "tokens", ...
  bool cold_cache = false;  // memory-bound: the caches are flushed before every timed call
  // The bytes are (nearly all) read once, in order: a matvec's weights, a decode step's KV cache. Such a
  // call is also compared with the read-stream ceiling (frac_of_read_ceiling), which on small machines is
  // well below the copy ceiling.
  bool read_stream = false;
};

// Host-side inputs and oracle of one case, shared by its implementations.
class Problem {
 public:
  virtual ~Problem() = default;
};

class Workload {
 public:
  virtual ~Workload() = default;
  virtual void run() = 0;              // the measured call; must give the same result every time
  virtual ErrorStats error() = 0;      // error of the last run's output against the float64 oracle
  virtual Work work() const = 0;
  // Further figures of the last run (e.g. per-output errors), added to the record's counters.
  virtual void add_counters(std::map<std::string, double>& /*counters*/) {}
  // Provenance of the last run that is not a number (e.g. the corpus checksum), stored as the
  // record's status_detail.
  virtual std::string detail() { return {}; }
};

struct Impl {
  std::string technique, name;
  Role role = Role::reference;
  Backend backend = Backend::cpu;
  std::string description;
  // Returns "" when the implementation covers the case, else why not (such cases are not run).
  std::function<std::string(const Case&)> not_applicable = [](const Case&) { return std::string(); };
  // Allocates inputs and outputs on the device. May throw OutOfMemory, Skip or Error.
  std::function<std::unique_ptr<Workload>(const Case&, const Problem&, Device&)> make;
};

// A finished (case, implementation) measurement, as the results file and the claim checks see it.
struct Record {
  std::string name;  // suite/case_id/impl
  std::string suite, technique, impl;
  Role role = Role::reference;
  Backend backend = Backend::cpu;
  Case kase;
  std::string status = "ok";  // ok | oom | skipped | error
  std::string detail;
  std::map<std::string, double> counters;  // peak_bytes, rel_l2_err, tflops, ...
  std::vector<double> times_s;             // one per repetition (seconds per call)
  std::vector<double> cpu_times_s;         // CPU seconds of the calling thread per call, one per repetition
  std::vector<int64_t> iterations;         // iterations behind each repetition
  double counter(const std::string& key, double fallback = 0) const;
};

// A published claim, as data in the suite file.
struct ClaimSpec {
  std::string id, statement, source, expected;
  Json data;  // whatever else the check needs (thresholds, cases to compare)
};
struct ClaimResult {
  std::string measured;
  std::string verdict;  // reproduced | not_reproduced | inconclusive | out_of_scope | error (harness/claims.hpp)
  std::string note;
};
using ClaimCheck = std::function<ClaimResult(const ClaimSpec&, const std::vector<Record>&)>;

// How an implementation's error against the float64 oracle is judged (the parity test runs it on
// every implementation of every technique). By default: the case's reference implementation (role
// reference, same case) must itself stay within `reference_bound` (rel_l2_err; by default
// 8 unit roundoffs of the case's "dtype" parameter, fp32 when it has none), and every other
// implementation within FlashAttention's rule of it (`tol`). NaN or Inf where the oracle is finite
// always fails. A technique may replace the bound, the tolerance or the whole judgement.
struct ErrorRule {
  Tolerance tol;
  std::function<double(const Case&, const Problem&)> reference_bound;
  // For an implementation that computes something other than the reference by design (quant's
  // packed-a16 rounds the activations to int16): the most that approximation can move an output (max
  // abs), derived per case, added to the tolerance's floor. Unset or 0: no allowance.
  std::function<double(const Case&, const Problem&, const Impl&)> approximation;
  std::function<Verdict(const Case&, const Problem&, const Impl&, const ErrorStats& err, const ErrorStats& ref)> judge;
  // Outputs judged one by one (attention: o, dq, dk, dv): an optimized implementation's output P is held to
  // the rule against the reference's output P (counters max_abs_err_P, rel_l2_err_P), not its worst output
  // against the reference's worst, which can be another output. Empty: the whole-record statistics.
  std::vector<std::string> parts;
};

struct Technique {
  std::string name;
  std::string description;
  std::function<void(const Case&)> validate = [](const Case&) {};
  std::function<std::unique_ptr<Problem>(const Case&)> prepare;
  std::vector<Impl> impls;
  std::map<std::string, ClaimCheck> claims;
  // The axes a suite file may set, and the technique's own counters (the harness declares the
  // counters it adds to every record: harness_metrics()).
  Schema schema;
  ErrorRule error_rule;
  // Optional: measures and stores a machine-specific setting (e.g. attention's naive/flash crossover);
  // returns a one-line description. Run by `memtrade tune`.
  std::function<std::string(Device&)> tune;
};

// Self-registration: an implementation file registers itself, so adding an implementation is adding
// its file (a .cu file is compiled, and so listed, only with the CUDA backend):
//   MEMTRADE_IMPLEMENTATION(typed_impl<MyProblem>("attention", "flash", Role::optimized, Backend::cpu,
//                                                 "what it is", make_flash_cpu))
// Registry::add puts a technique's registered implementations before those its register.cpp lists, and
// orders them by backend (cpu first), then role (reference first), then as linked or listed.
std::vector<Impl>& registered_impls();
struct ImplRegistrar {
  explicit ImplRegistrar(Impl i) { registered_impls().push_back(std::move(i)); }
};
#define MT_CONCAT_(a, b) a##b
#define MT_CONCAT(a, b) MT_CONCAT_(a, b)
#define MEMTRADE_IMPLEMENTATION(...)                                                          \
  namespace {                                                                                 \
  const ::memtrade::ImplRegistrar MT_CONCAT(memtrade_impl_registrar_, __LINE__){__VA_ARGS__}; \
  }

// The judgement of ErrorRule for one implementation's error `err`, given the reference's `ref` on the
// same case (for the reference itself, err and ref are the same).
Verdict judge_error(const Technique& t, const Case& c, const Problem& p, const Impl& impl, const ErrorStats& err,
                    const ErrorStats& ref);

// judge_error output by output when the technique names parts and both sides carry a part's counters
// (max_abs_err_P, rel_l2_err_P: each output against the same output of the reference), else over the
// whole-record statistics. counters / ref_counters: the two sides' counters (Workload::add_counters).
Verdict judge_outputs(const Technique& t, const Case& c, const Problem& p, const Impl& impl, const ErrorStats& err,
                      const std::map<std::string, double>& counters, const ErrorStats& ref,
                      const std::map<std::string, double>& ref_counters);

// Checks a case's parameters against the technique's schema; `where` names their source.
void check_case(const Technique& t, const Case& c, const std::string& where);

class Registry {
 public:
  void add(Technique t);  // throws on a duplicate name
  const Technique& get(const std::string& name) const;  // throws Error listing the known techniques
  const std::vector<Technique>& all() const { return techniques_; }

 private:
  std::vector<Technique> techniques_;
};


// The registry of the memtrade program is built by its composition root (app/techniques.hpp).

// Cast helper for an implementation's make(): the technique's own Problem type.
template <class P>
const P& problem_as(const Problem& p) {
  return dynamic_cast<const P&>(p);
}

// An implementation whose factory (a function or a lambda: (const P&, Device&) -> unique_ptr<Workload>)
// takes the technique's own Problem type P.
template <class P, class F>
Impl typed_impl(std::string technique, std::string name, Role role, Backend backend, std::string description,
                F factory) {
  Impl i;
  i.technique = std::move(technique);
  i.name = std::move(name);
  i.role = role;
  i.backend = backend;
  i.description = std::move(description);
  i.make = [factory](const Case&, const Problem& p, Device& dev) -> std::unique_ptr<Workload> {
    return factory(problem_as<P>(p), dev);
  };
  return i;
}

template <class P>
Impl typed_impl(std::string technique, std::string name, Role role, Backend backend, std::string description,
                std::unique_ptr<Workload> (*factory)(const P&, Device&)) {
  return typed_impl<P, decltype(factory)>(std::move(technique), std::move(name), role, backend, std::move(description),
                                          factory);
}

}  // namespace memtrade
