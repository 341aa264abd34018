#include "harness/results.hpp"

#include "common/blas.hpp"
#include "common/simd/targets.hpp"

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "harness/host_pages.hpp"
#include "harness/stats.hpp"
#include "memtrade/build_info.hpp"

namespace memtrade {

namespace {

std::string shell_line(const std::string& cmd) {
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return {};
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p.get())) out += buf;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      return pos == std::string::npos ? line : line.substr(pos + 2);
    }
  return "unknown CPU";
}

std::string iso_now() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

}  // namespace

Json machine_classes() {
  Json m = Json::object();
  m["cpu"] = "cpu|" + cpu_model() + "|" + std::to_string(std::thread::hardware_concurrency()) + " cores";
  auto cs = cuda_status();
  if (cs.available) m["cuda"] = "cuda|" + cs.gpu_name + "|driver " + cs.driver + "|runtime " + cs.runtime;
  return m;
}

Json build_context(const RunInfo& info) {
  Json c = Json::object();
  const auto& cpu = benchmark::CPUInfo::Get();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  c["date"] = iso_now();
  c["host_name"] = host;
  c["executable"] = "memtrade";
  c["num_cpus"] = cpu.num_cpus;
  c["mhz_per_cpu"] = static_cast<int>(cpu.cycles_per_second / 1e6);
  c["cpu_scaling_enabled"] = cpu.scaling == benchmark::CPUInfo::ENABLED;
  Json caches = Json::array();
  for (const auto& ca : cpu.caches)
    caches.push_back({{"type", ca.type}, {"level", ca.level}, {"size", ca.size}, {"num_sharing", ca.num_sharing}});
  c["caches"] = caches;
  c["library_build_type"] = std::string(build::build_type) == "Debug" ? "debug" : "release";

  Json m = Json::object();
  m["version"] = build::version;
  m["suites"] = info.suite_meta;
  m["profile"] = info.profile;
  m["backend"] = info.backend;
  m["capacity_bytes"] = info.capacity ? Json(*info.capacity) : Json(nullptr);
  m["repetitions"] = info.repetitions;
  const std::string git = std::string("git -C '") + build::source_dir + "' ";
  m["git_commit"] = shell_line(git + "rev-parse --verify -q HEAD 2>/dev/null");
  m["git_dirty"] = !shell_line(git + "status --porcelain --untracked-files=no 2>/dev/null").empty();
  m["compiler"] = build::cxx_compiler;
  m["cxx_flags"] = build::cxx_flags;
  m["cuda_compiler"] = build::cuda_compiler;
  m["cuda_architectures"] = build::cuda_architectures;
  m["build_type"] = build::build_type;
  m["cpu_model"] = cpu_model();
  m["simd_target"] = simd::target_name();  // the runtime-dispatched kernels' instruction set ($MEMTRADE_SIMD)
  m["blas_core"] = blas::core();            // OpenBLAS's kernel set ($OPENBLAS_CORETYPE)
  if (const std::string n = blas::narrower_kernels_note(); !n.empty()) m["blas_note"] = n;
  m["huge_pages"] = huge_pages_mode();      // 2 MiB pages for the harness's large host buffers
  m["cpu_cores"] = std::thread::hardware_concurrency();
  auto cs = cuda_status();
  m["gpu_name"] = cs.available ? Json(cs.gpu_name) : Json(nullptr);
  m["gpu_driver"] = cs.available ? Json(cs.driver) : Json(nullptr);
  m["cuda_runtime"] = cs.available ? Json(cs.runtime) : Json(nullptr);
  m["cuda_status"] = cs.available ? "available" : cs.reason;
  m["machine_class"] = machine_classes();
  Json ceil = Json::object();
  for (const auto& [k, v] : info.ceilings) ceil[k] = number_or_null(v);
  m["ceilings"] = ceil;
  c["memtrade"] = m;
  return c;
}

Json record_entries(const Record& r) {
  Json base = Json::object();
  base["name"] = r.name;
  base["run_name"] = r.name;
  base["suite"] = r.suite;
  base["technique"] = r.technique;
  base["impl"] = r.impl;
  base["role"] = role_name(r.role);
  base["backend"] = backend_name(r.backend);
  base["case_id"] = r.kase.id;
  base["case"] = r.kase.params;
  base["x"] = r.kase.x;
  base["status"] = r.status;
  base["status_detail"] = r.detail;
  for (const auto& [k, v] : r.counters) base[k] = number_or_null(v);

  Json out = Json::array();
  if (r.status != "ok" || r.times_s.empty()) {
    Json e = base;
    e["run_type"] = "iteration";
    e["repetitions"] = 0;
    e["repetition_index"] = 0;
    e["threads"] = 1;
    if (r.status != "ok") {
      e["error_occurred"] = true;
      e["error_message"] = r.status + ": " + r.detail;
    }
    out.push_back(e);
    return out;
  }
  const auto n = static_cast<int>(r.times_s.size());
  for (int i = 0; i < n; ++i) {
    Json e = base;
    e["run_type"] = "iteration";
    e["repetitions"] = n;
    e["repetition_index"] = i;
    e["threads"] = 1;
    e["iterations"] = r.iterations.at(i);
    e["real_time"] = r.times_s[i] * 1e9;
    e["cpu_time"] = (i < static_cast<int>(r.cpu_times_s.size()) ? r.cpu_times_s[i] : r.times_s[i]) * 1e9;
    e["time_unit"] = "ns";
    out.push_back(e);
  }
  const double med = stats::median(r.times_s), mu = stats::mean(r.times_s);
  const double sd = n > 1 ? stats::stddev(r.times_s) : 0.0;
  const std::pair<const char*, double> aggs[] = {{"mean", mu}, {"median", med}, {"stddev", sd}, {"cv", mu > 0 ? sd / mu : 0}};
  const bool have_cpu = r.cpu_times_s.size() == r.times_s.size();
  for (const auto& [agg, v] : aggs) {
    Json e = base;
    e["name"] = r.name + "_" + agg;
    e["run_type"] = "aggregate";
    e["aggregate_name"] = agg;
    e["aggregate_unit"] = std::string(agg) == "cv" ? "percentage" : "time";
    e["repetitions"] = n;
    e["threads"] = 1;
    e["real_time"] = std::string(agg) == "cv" ? v : v * 1e9;
    e["cpu_time"] = e["real_time"];
    if (have_cpu && std::string(agg) == "median") e["cpu_time"] = stats::median(r.cpu_times_s) * 1e9;
    if (have_cpu && std::string(agg) == "mean") e["cpu_time"] = stats::mean(r.cpu_times_s) * 1e9;
    e["time_unit"] = "ns";
    out.push_back(e);
  }
  return out;
}

void check_writable(const std::filesystem::path& path) {
  if (path.empty()) throw Error("no results file named");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw Error("results file " + path.string() + " is a folder");
  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), ec);
    if (ec) throw Error("cannot create the folder of results file " + path.string() + ": " + ec.message());
  }
  // The writer's own temporary name: nobody reads it, and the writer replaces it anyway.
  const auto probe = path.string() + ".partial.tmp";
  {
    std::ofstream out(probe, std::ios::trunc);
    if (!out) throw Error("cannot write results file " + path.string() + " (" + probe + " cannot be created)");
  }
  std::filesystem::remove(probe, ec);
}

ResultsWriter::ResultsWriter(std::filesystem::path path, Json context) : path_(std::move(path)) {
  doc_["context"] = std::move(context);
  doc_["benchmarks"] = Json::array();
  doc_["claims"] = Json::array();
  check_writable(path_);
  flush();
}

void ResultsWriter::add(const Record& r) {
  for (auto& e : record_entries(r)) doc_["benchmarks"].push_back(std::move(e));
  flush();
}

void ResultsWriter::add_claim(const ClaimSpec& spec, const ClaimResult& result) {
  doc_["claims"].push_back({{"id", spec.id}, {"statement", spec.statement}, {"source", spec.source},
                            {"expected", spec.expected}, {"measured", result.measured},
                            {"verdict", result.verdict}, {"note", result.note},
                            {"quantity", spec.data.value("quantity", "")}, {"band", spec.data.value("band", Json(nullptr))},
                            {"conditions", spec.data.value("conditions", "")}, {"spec", spec.data}});
  flush();
}

void ResultsWriter::flush() const {
  const auto partial = path_.string() + ".partial", tmp = partial + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error("cannot write results file " + tmp);
    out << doc_.dump(1) << "\n";
    if (!out) throw Error("error writing results file " + tmp);
  }
  std::filesystem::rename(tmp, partial);
}

void ResultsWriter::finish() const {
  flush();
  std::filesystem::rename(path_.string() + ".partial", path_);
}

LoadedResults load_results(const std::filesystem::path& path) {
  auto fail = [&](const std::string& what) -> ResultsError {
    return ResultsError("results file " + path.string() + ": " + what);
  };
  std::ifstream in(path);
  if (!in) throw fail("cannot be opened");
  LoadedResults L;
  L.path = path;
  Json doc;
  try {
    doc = Json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw fail(std::string("not valid JSON (truncated or corrupt): ") + e.what());
  }
  if (!doc.is_object() || !doc.contains("benchmarks") || !doc["benchmarks"].is_array())
    throw fail("no 'benchmarks' list: not a Google Benchmark / memtrade results file");
  L.context = doc.value("context", Json::object());
  if (doc.contains("claims") && doc["claims"].is_array()) L.claims = doc["claims"];
  std::map<std::string, std::size_t> index;
  std::vector<std::map<std::string, std::vector<double>>> values;  // per case: counter -> one value per entry
  for (const auto& e : doc["benchmarks"]) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string())
      throw fail("a benchmark entry without a string 'name'");
    if (e.value("run_type", "iteration") == "aggregate") continue;
    const std::string name = e.value("run_name", e["name"].get<std::string>());
    auto [it, fresh] = index.try_emplace(name, L.cases.size());
    if (fresh) {
      Summary s;
      s.name = name;
      s.suite = e.value("suite", "");
      s.technique = e.value("technique", "");
      s.impl = e.value("impl", "");
      s.backend = e.value("backend", "cpu");
      s.status = e.value("status", e.value("error_occurred", false) ? "error" : "ok");
      s.detail = e.value("status_detail", e.value("error_message", ""));
      if (e.contains("case") && e["case"].is_object()) s.params = e["case"];
      L.cases.push_back(std::move(s));
      values.emplace_back();
    }
    Summary& s = L.cases[it->second];
    // Every repetition entry is read: a counter's value is the median over the entries that carry it
    // (memtrade writes the same value into each; Google Benchmark's own counters vary per repetition).
    static const std::set<std::string> skip_keys = {"repetitions", "repetition_index", "threads", "iterations",
                                                    "real_time", "cpu_time", "x", "family_index",
                                                    "per_family_instance_index"};
    for (const auto& [k, v] : e.items()) {
      if (skip_keys.count(k)) continue;
      if (v.is_number()) values[it->second][k].push_back(v.get<double>());
      else if (v.is_null()) values[it->second][k].push_back(std::nan(""));
    }
    if (s.status == "ok" && e.contains("real_time")) {
      auto seconds = [&](const char* key) {
        if (!e[key].is_number()) throw fail("benchmark '" + name + "' has a non-numeric " + key);
        const std::string unit = e.value("time_unit", "ns");
        const double scale = unit == "ns" ? 1e-9 : unit == "us" ? 1e-6 : unit == "ms" ? 1e-3 : unit == "s" ? 1.0 : -1.0;
        if (scale < 0) throw fail("benchmark '" + name + "' has an unknown time_unit '" + unit + "'");
        return e[key].get<double>() * scale;
      };
      s.times_s.push_back(seconds("real_time"));
      if (e.contains("cpu_time")) s.cpu_times_s.push_back(seconds("cpu_time"));
    }
  }
  for (std::size_t i = 0; i < L.cases.size(); ++i) {
    Summary& s = L.cases[i];
    if (s.cpu_times_s.size() != s.times_s.size()) s.cpu_times_s.clear();
    for (auto& [k, vs] : values[i]) {
      // NaN (null) in any entry stays NaN: a non-finite value must not be hidden by a median.
      bool nan = false;
      for (double v : vs) nan = nan || std::isnan(v);
      s.counters[k] = nan ? std::nan("") : stats::median(vs);
    }
  }
  return L;
}

}  // namespace memtrade
