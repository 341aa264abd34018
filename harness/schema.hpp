// A technique's declared axes (case parameters) and metrics (counters), as nvbench declares axes.
//
// Every key a suite file may set is a Param: its type, the values or range it allows, its default and
// a one-line meaning. Suite files and `memtrade run --set` overrides are checked against the schema when
// they are loaded, so a typo ("causl") or a wrong type is an error naming the file, the profile and the
// key (with the nearest known key as a hint) instead of a silently defaulted run.
//
// Every counter a technique reports is a Metric: its unit, which direction is better and how `compare`
// gates it. The harness declares the counters it adds to every record (peak bytes, errors, throughput);
// a technique declares only its own.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace memtrade {

using Json = nlohmann::ordered_json;

enum class ParamType : uint8_t { integer, number, text, boolean };
std::string_view param_type_name(ParamType t);

struct Param {
  std::string name;
  ParamType type = ParamType::integer;
  Json fallback;                // the default; null: the parameter is required; derived(...): computed
  std::string help;             // one line
  std::vector<Json> choices;    // allowed values; empty: any value of the type (within min/max)
  std::optional<double> min, max;  // inclusive range for numbers

  // Throws Error "<where>: key 'name' ..." when v has the wrong type or is not allowed.
  void check(const Json& v, const std::string& where) const;
  std::string describe() const;  // "integer >= 1, default 1"
};

// A default computed from other parameters, e.g. derived("n") for "m defaults to n".
Json derived(const std::string& from);
bool is_derived(const Json& fallback);
// No default, required only when another parameter has a value (e.g. the trained model's config keys
// when model = "trained"); a case without it otherwise reads a fallback of its own.
Json required_when(const std::string& key, const Json& value);

// Named constructors keep the declarations in a technique's register.cpp one line each.
Param int_param(std::string name, std::string help, Json fallback = nullptr, std::optional<double> min = 1,
                std::optional<double> max = std::nullopt);
Param num_param(std::string name, std::string help, Json fallback = nullptr, std::optional<double> min = std::nullopt,
                std::optional<double> max = std::nullopt);
Param text_param(std::string name, std::string help, Json fallback = nullptr, std::vector<Json> choices = {});
Param bool_param(std::string name, std::string help, bool fallback);

enum class Better : uint8_t { lower, higher, none };
// How `compare` judges a counter against the baseline:
//   exact    any growth is a regression (tracked bytes);
//   ratio    a regression beyond `ratio` times the baseline, if the change also exceeds `floor`;
//   bound    a regression when the value passes `floor` (an absolute limit);
//   zero     must stay 0;
//   time     process-level timing statistics (medians of runs, effect size);
//   report   listed, never a regression.
enum class Gate : uint8_t { exact, ratio, bound, zero, time, report };
std::string_view better_name(Better b);
std::string_view gate_name(Gate g);

struct Metric {
  std::string name;  // a counter name, or a prefix ending in '*' ("peak_bytes_*", "curve_loss_step_*")
  std::string unit;  // "bytes", "1" (a ratio or count), "s", "nats/byte", ...
  Better better = Better::lower;
  Gate gate = Gate::report;
  double ratio = 2.0, floor = 0.0;
  std::string help;
  bool matches(const std::string& counter) const;
};

struct Schema {
  std::vector<Param> params;
  std::vector<Metric> metrics;

  const Param* param(const std::string& name) const;
  // The metric that declares `counter` (exact names before prefixes), or nullptr.
  const Metric* metric(const std::string& counter) const;
  // Checks one case's parameters: every key must be declared and allowed, every required key present.
  // `where` names the source ("suite file F, profile P"); errors name the key and suggest the nearest.
  void check(const Json& params, const std::string& where) const;
};

// Copies between a device and its host where no link is measured (the CPU backend: one memory): the
// bytes' time at PCIe 4 x16 (25 GB/s) and PCIe 5 x16 (50 GB/s), as the counters offload_modelled_pcie4_s
// and offload_modelled_pcie5_s (report only), labelled MODELLED; `what` says which bytes.
inline constexpr double kPcie4BytesPerS = 25e9, kPcie5BytesPerS = 50e9;
std::vector<Metric> modelled_link_metrics(const std::string& what);
void add_modelled_link_time(std::map<std::string, double>& counters, double bytes);

// The counters the runner adds to every record (memory, error, throughput), declared once.
const std::vector<Metric>& harness_metrics();

// The closest of `known` to `word` by edit distance, or "" when none is close (at most a third of the
// word's letters differ).
std::string nearest(const std::string& word, const std::vector<std::string>& known);

}  // namespace memtrade
