#include "harness/schema.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/common.hpp"

namespace memtrade {

std::string_view param_type_name(ParamType t) {
  switch (t) {
    case ParamType::integer: return "integer";
    case ParamType::number: return "number";
    case ParamType::text: return "string";
    case ParamType::boolean: return "boolean";
  }
  return "?";
}

std::string_view better_name(Better b) {
  switch (b) {
    case Better::lower: return "lower";
    case Better::higher: return "higher";
    case Better::none: return "-";
  }
  return "?";
}

std::string_view gate_name(Gate g) {
  switch (g) {
    case Gate::exact: return "exact";
    case Gate::ratio: return "ratio";
    case Gate::bound: return "bound";
    case Gate::zero: return "zero";
    case Gate::time: return "time";
    case Gate::report: return "report";
  }
  return "?";
}

namespace {

std::string num_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool type_ok(ParamType t, const Json& v) {
  switch (t) {
    case ParamType::integer: return v.is_number_integer();
    case ParamType::number: return v.is_number();
    case ParamType::text: return v.is_string();
    case ParamType::boolean: return v.is_boolean();
  }
  return false;
}

// Edit distance with adjacent transpositions counting as one edit (optimal string alignment).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string nearest(const std::string& word, const std::vector<std::string>& known) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(1, word.size() / 3) + 1;
  for (const auto& k : known) {
    const std::size_t d = edit_distance(word, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

void Param::check(const Json& v, const std::string& where) const {
  const std::string at = where + ": key '" + name + "'";
  if (!type_ok(type, v))
    throw Error(at + " must be " + (type == ParamType::integer ? "an " : "a ") + std::string(param_type_name(type)) +
                ", got " + v.dump());
  if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
    std::string allowed;
    for (const auto& c : choices) allowed += (allowed.empty() ? "" : ", ") + c.dump();
    throw Error(at + " has value " + v.dump() + ", allowed: " + allowed);
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (!std::isfinite(x)) throw Error(at + " must be finite, got " + v.dump());
    if ((min && x < *min) || (max && x > *max)) throw Error(at + " is " + v.dump() + ", outside " + describe());
  }
}

Json derived(const std::string& from) { return Json{{"derived_from", from}}; }
bool is_derived(const Json& fallback) { return fallback.is_object() && fallback.contains("derived_from"); }
Json required_when(const std::string& key, const Json& value) {
  return Json{{"required_when", Json{{"key", key}, {"value", value}}}};
}
namespace {
bool is_conditional(const Json& fallback) { return fallback.is_object() && fallback.contains("required_when"); }
std::string condition_text(const Json& fallback) {
  const Json& w = fallback["required_when"];
  return w["key"].get<std::string>() + " = " + w["value"].dump();
}
}  // namespace

std::string Param::describe() const {
  std::string s(param_type_name(type));
  if (!choices.empty()) {
    s += " in {";
    for (std::size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i].dump();
    s += "}";
  }
  if (min && max) s += " in [" + num_text(*min) + ", " + num_text(*max) + "]";
  else if (min) s += " >= " + num_text(*min);
  else if (max) s += " <= " + num_text(*max);
  if (fallback.is_null()) s += ", required";
  else if (is_derived(fallback)) s += ", default: " + fallback["derived_from"].get<std::string>();
  else if (is_conditional(fallback)) s += ", required when " + condition_text(fallback);
  else s += ", default " + fallback.dump();
  return s;
}

Param int_param(std::string name, std::string help, Json fallback, std::optional<double> min, std::optional<double> max) {
  return Param{std::move(name), ParamType::integer, std::move(fallback), std::move(help), {}, min, max};
}
Param num_param(std::string name, std::string help, Json fallback, std::optional<double> min, std::optional<double> max) {
  return Param{std::move(name), ParamType::number, std::move(fallback), std::move(help), {}, min, max};
}
Param text_param(std::string name, std::string help, Json fallback, std::vector<Json> choices) {
  return Param{std::move(name), ParamType::text, std::move(fallback), std::move(help), std::move(choices), {}, {}};
}
Param bool_param(std::string name, std::string help, bool fallback) {
  return Param{std::move(name), ParamType::boolean, Json(fallback), std::move(help), {}, {}, {}};
}

bool Metric::matches(const std::string& counter) const {
  if (!name.empty() && name.back() == '*') return counter.compare(0, name.size() - 1, name, 0, name.size() - 1) == 0;
  return counter == name;
}

const Param* Schema::param(const std::string& n) const {
  for (const auto& p : params)
    if (p.name == n) return &p;
  return nullptr;
}

const Metric* Schema::metric(const std::string& counter) const {
  for (const auto& m : metrics)
    if (m.name == counter) return &m;
  for (const auto& m : metrics)
    if (m.matches(counter)) return &m;
  return nullptr;
}

void Schema::check(const Json& values, const std::string& where) const {
  std::vector<std::string> known;
  for (const auto& p : params) known.push_back(p.name);
  for (const auto& [key, v] : values.items()) {
    const Param* p = param(key);
    if (!p) {
      const std::string hint = nearest(key, known);
      std::string all;
      for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
      throw Error(where + ": unknown key '" + key + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                  "; known keys: " + all);
    }
    p->check(v, where);
  }
  for (const auto& p : params) {
    if (values.contains(p.name)) continue;
    if (p.fallback.is_null()) throw Error(where + ": required key '" + p.name + "' is missing");
    if (is_conditional(p.fallback)) {
      const Json& w = p.fallback["required_when"];
      const std::string key = w["key"].get<std::string>();
      const Param* on = param(key);
      const Json value = values.contains(key) ? values[key] : on ? on->fallback : Json();
      if (value == w["value"])
        throw Error(where + ": key '" + p.name + "' is required when " + condition_text(p.fallback) + " and is missing");
    }
  }
}

const std::vector<Metric>& harness_metrics() {
  static const std::vector<Metric> m = {
      {"peak_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "tracked peak of the device pool during one call"},
      {"peak_extra_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "peak minus what was live when the call began"},
      {"peak_bytes_*", "bytes", Better::lower, Gate::exact, 0, 0, "tracked peak of one tag (weights, activations, ...)"},
      {"host_peak_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "tracked peak of the host pool"},
      {"host_peak_extra_bytes", "bytes", Better::lower, Gate::exact, 0, 0, "host peak over what was live before"},
      {"host_peak_bytes_*", "bytes", Better::lower, Gate::exact, 0, 0, "tracked peak of one tag in the host pool"},
      {"max_abs_err", "1", Better::lower, Gate::report, 0, 0, "max |x - oracle| (order-dependent: listed, not gated)"},
      {"max_rel_err", "1", Better::lower, Gate::report, 0, 0,
       "max |x - oracle| / max(|oracle|, 1e-6 rms) (near-zero denominators: listed, not gated)"},
      {"rel_l2_err", "1", Better::lower, Gate::ratio, 2, 0,
       "||x - oracle|| / ||oracle||; gated above 2x the baseline and 2 unit roundoffs of the case dtype"},
      {"error_ok", "1", Better::higher, Gate::exact, 0, 0,
       "1 when the error is within the technique's rule against the float64 oracle, machine-independent"},
      {"nan_count", "1", Better::lower, Gate::zero, 0, 0, "NaN outputs where the oracle is finite"},
      {"inf_count", "1", Better::lower, Gate::zero, 0, 0, "Inf outputs where the oracle is finite"},
      {"flops", "flop", Better::none, Gate::report, 0, 0, "floating-point operations per call"},
      {"tflops", "TFLOP/s", Better::higher, Gate::time, 0, 0, "flops / median time"},
      {"frac_of_gemm_ceiling", "1", Better::higher, Gate::report, 0, 0, "tflops over this machine's GEMM rate"},
      {"bytes_moved", "bytes", Better::none, Gate::report, 0, 0, "fewest bytes one call must move"},
      {"gbytes_per_s", "GB/s", Better::higher, Gate::time, 0, 0, "bytes_moved / median time"},
      {"frac_of_copy_ceiling", "1", Better::higher, Gate::report, 0, 0, "GB/s over this machine's copy bandwidth"},
      {"frac_of_read_ceiling", "1", Better::higher, Gate::report, 0, 0,
       "GB/s over this machine's read-stream bandwidth (kernels that only read their bytes)"},
      {"flush_read_gbytes_per_s", "GB/s", Better::none, Gate::report, 0, 0,
       "median rate at which the cache flush before each cold call read memory (CPU)"},
      {"frac_of_flush_read", "1", Better::higher, Gate::report, 0, 0,
       "GB/s of a read-stream call over its flushes' read rate: bandwidth at the same moment"},
      {"tokens_per_s", "tokens/s", Better::higher, Gate::time, 0, 0, "tokens processed per second"},
      {"cold_cache", "1", Better::none, Gate::report, 0, 0, "1 when the caches are flushed before each timed call"},
      {"cuda_meminfo_delta_bytes", "bytes", Better::lower, Gate::report, 0, 0, "cudaMemGetInfo growth while alive"},
      {"cuda_tracked_live_bytes", "bytes", Better::none, Gate::report, 0, 0, "tracked live bytes at that moment"},
      {"oom_requested_bytes", "bytes", Better::none, Gate::report, 0, 0, "the request that exceeded the capacity"},
      {"oom_live_bytes", "bytes", Better::none, Gate::report, 0, 0, "live bytes when it failed"},
  };
  return m;
}

std::vector<Metric> modelled_link_metrics(const std::string& what) {
  return {{"offload_modelled_pcie4_s", "s", Better::lower, Gate::report, 0, 0,
           "MODELLED: " + what + " at 25 GB/s (PCIe 4 x16), not measured"},
          {"offload_modelled_pcie5_s", "s", Better::lower, Gate::report, 0, 0,
           "MODELLED: " + what + " at 50 GB/s (PCIe 5 x16), not measured"}};
}

void add_modelled_link_time(std::map<std::string, double>& counters, double bytes) {
  counters["offload_modelled_pcie4_s"] = bytes / kPcie4BytesPerS;
  counters["offload_modelled_pcie5_s"] = bytes / kPcie5BytesPerS;
}

}  // namespace memtrade
