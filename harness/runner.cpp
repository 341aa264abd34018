#include "harness/runner.hpp"


#include <benchmark/benchmark.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <mutex>
#include <regex>
#include <string_view>
#include <thread>

#include "common/blas.hpp"
#include "common/simd/targets.hpp"
#include "harness/heap_probe.hpp"
#include "harness/lockstep.hpp"

#include "harness/probe.hpp"
#include "harness/stats.hpp"

namespace memtrade {

namespace {

// Collects Google Benchmark's per-repetition runs instead of printing them.
class Collector final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (r.run_type == Run::RT_Iteration) runs_.push_back(r);
  }
  std::vector<Run> runs_;
};

constexpr int kColdCallsPerRepetition = 10;

// CPU time of the calling thread (as Google Benchmark's cpu_time). The process clock would add the
// OpenMP workers, but the kernel brings other threads' time up to date only at scheduler ticks, so over
// a call shorter than a tick it jumps in tick-sized steps (CPU/wall of 10 on a 2-core machine).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One invocation of the benchmark function: Google Benchmark makes several per repetition (growing
// the iteration count) and reports the last.
struct Invocation {
  int64_t iterations = 0;
  double wall_s = 0, cpu_s = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::string format_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600, static_cast<int>(s) % 3600 / 60);
  return buf;
}

// A heap probe window that closes even when the call throws.
struct HeapWindow {
  bool on;
  explicit HeapWindow(bool open) : on(open) {
    if (on) heap_probe::begin();
  }
  std::size_t close() {
    if (!on) return 0;
    on = false;
    return heap_probe::end();
  }
  ~HeapWindow() { close(); }
};

// turn_name: the record's name under ab's lockstep, where each invocation waits for its turn so that the
// other build's invocation of the same case runs right before or after it.
void time_with_gbench(Record& rec, Workload& w, Device& dev, int repetitions, double min_time_s, bool cold,
                      const std::string& turn_name) {
  std::vector<Invocation> calls;
  std::vector<double> flush_rates;  // bytes/s of each cold call's flush, where the device times it
  auto* b = benchmark::RegisterBenchmark(rec.name.c_str(), [&](benchmark::State& st) {
    LockstepTurn turn(turn_name);
    Invocation inv;
    for (auto _ : st) {
      if (cold) {  // outside the timed region
        const double rate = dev.flush_caches();
        if (rate > 0) flush_rates.push_back(rate);
      }
      const double c0 = thread_cpu_s();
      const double t = dev.time_call([&] { w.run(); });
      inv.cpu_s += thread_cpu_s() - c0;
      inv.wall_s += t;
      ++inv.iterations;
      st.SetIterationTime(t);
    }
    calls.push_back(inv);
  });
  b->UseManualTime()->Repetitions(repetitions)->Unit(benchmark::kNanosecond);
  // Cold-cache calls: a fixed number per repetition. min_time counts only the timed calls, so a short
  // call would be repeated thousands of times, each after a flush of twice the last-level cache (on a
  // 260 MiB-L3 host, one quant case took 90 s).
  if (cold) b->Iterations(kColdCallsPerRepetition);
  else b->MinTime(min_time_s);
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::ClearRegisteredBenchmarks();
  std::size_t next = 0;
  for (const auto& r : collector.runs_) {
    if (r.error_occurred) throw Error("timing failed: " + r.error_message);
    rec.times_s.push_back(r.GetAdjustedRealTime() * 1e-9);
    rec.iterations.push_back(r.iterations);
    // The invocation behind this repetition: the next one with its iteration count and time.
    while (next < calls.size() && !(calls[next].iterations == r.iterations &&
                                    std::abs(calls[next].wall_s - r.real_accumulated_time) <= 1e-9 * calls[next].wall_s + 1e-15))
      ++next;
    if (next == calls.size()) throw Error("timing: no invocation matches a reported repetition");
    rec.cpu_times_s.push_back(calls[next].cpu_s / static_cast<double>(r.iterations));
    ++next;
  }
  if (rec.times_s.empty()) throw Error("timing produced no repetitions");
  if (!flush_rates.empty()) rec.counters["flush_read_gbytes_per_s"] = stats::median(flush_rates) * 1e-9;
}

void add_throughput(Record& rec, const Work& work, Backend backend, const Ceilings& ceilings) {
  const double t = stats::median(rec.times_s);
  if (!(t > 0)) return;
  const std::string be(backend_name(backend));
  if (work.flops > 0) {
    rec.counters["flops"] = work.flops;
    rec.counters["tflops"] = work.flops / t * 1e-12;
    if (!work.gemm_dtype.empty()) {
      auto it = ceilings.find(be + "_" + work.gemm_dtype + "_gemm_flops");
      if (it != ceilings.end() && it->second > 0) rec.counters["frac_of_gemm_ceiling"] = work.flops / t / it->second;
    }
  }
  if (work.items > 0 && !work.item_unit.empty()) rec.counters[work.item_unit + "_per_s"] = work.items / t;
  if (work.bytes > 0) {
    rec.counters["bytes_moved"] = work.bytes;
    rec.counters["gbytes_per_s"] = work.bytes / t * 1e-9;
    auto it = ceilings.find(be + "_copy_bytes_per_s");
    if (it != ceilings.end() && it->second > 0) rec.counters["frac_of_copy_ceiling"] = work.bytes / t / it->second;
    if (work.read_stream) {
      it = ceilings.find(be + "_read_bytes_per_s");
      if (it != ceilings.end() && it->second > 0) rec.counters["frac_of_read_ceiling"] = work.bytes / t / it->second;
      // Against what memory delivered to the flushes right before the calls: the ceilings are probed once
      // per run, and on a VM the memory rate can move by 1.7x from one case to the next.
      const double flush = rec.counter("flush_read_gbytes_per_s") * 1e9;
      if (flush > 0) rec.counters["frac_of_flush_read"] = work.bytes / t / flush;
    }
  }
}

// A record's name for the console: parameter values longer than 16 characters (corpus checksums)
// shortened to their first 8, and the backend when it is not the CPU.
// The console's name for a record: suite, the parameters that vary among the suite's cases (values
// longer than 16 characters, such as checksums, cut to 8), implementation and a non-CPU backend.
std::string short_label(const Record& r, const std::vector<Case>& suite_cases) {
  std::string params;
  for (const auto& [key, value] : r.kase.params.items()) {
    bool varies = false;
    for (const Case& other : suite_cases) varies = varies || !other.params.contains(key) || other.params.at(key) != value;
    if (!varies) continue;
    std::string v = value.is_string() ? value.get<std::string>() : value.dump();
    if (v.size() > 16) v = v.substr(0, 8) + "...";
    params += (params.empty() ? "" : ",") + key + "=" + v;
  }
  std::string out = r.suite + "/" + (params.empty() ? "" : params + "/") + r.impl;
  return r.backend == Backend::cpu ? out : out + " (" + std::string(backend_name(r.backend)) + ")";
}

std::string summary_line(const Record& r, const std::string& previous_reason) {
  char buf[512];
  if (r.status != "ok") {
    const std::string reason = r.detail == previous_reason && !r.detail.empty() ? "(same reason as above)" : r.detail;
    std::snprintf(buf, sizeof buf, "%-7s %s", r.status.c_str(), reason.c_str());
    return buf;
  }
  const double t = stats::median(r.times_s);
  std::snprintf(buf, sizeof buf, "ok      peak %-11s extra %-11s median %9.3f ms  rel_l2 %.2e",
                format_bytes(r.counter("peak_bytes")).c_str(), format_bytes(r.counter("peak_extra_bytes")).c_str(),
                t * 1e3, r.counter("rel_l2_err", std::nan("")));
  std::string s = buf;
  if (r.counters.count("error_ok") && r.counter("error_ok") == 0) s += "  ERROR RULE FAILED";
  if (r.counters.count("tflops")) {
    std::snprintf(buf, sizeof buf, "  %.3f TFLOP/s", r.counter("tflops"));
    s += buf;
  }
  if (r.counters.count("frac_of_gemm_ceiling")) {
    std::snprintf(buf, sizeof buf, " (%.0f%% of GEMM ceiling)", 100 * r.counter("frac_of_gemm_ceiling"));
    s += buf;
  }
  return s;
}

Record blank_record(const Impl& impl, const Case& c) {
  Record r;
  r.name = c.suite + "/" + c.id + "/" + impl.name;
  r.suite = c.suite;
  r.technique = impl.technique;
  r.impl = impl.name;
  r.role = impl.role;
  r.backend = impl.backend;
  r.kase = c;
  return r;
}

}  // namespace

// On the console, a step that takes longer than a few seconds says when it started and when it ended,
// so that a run training a model for minutes is not silent. Prints nothing for short steps.
class SlowNote {
 public:
  SlowNote(bool on, std::string what) : what_(std::move(what)) {
    if (!on) return;
    watcher_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, std::chrono::seconds(3), [this] { return done_; })) return;
      std::printf("%s... ", what_.c_str());
      std::fflush(stdout);
      printed_ = true;
    });
  }
  ~SlowNote() {
    if (!watcher_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_one();
    watcher_.join();
    if (printed_) std::printf("done in %s  ", format_duration(seconds_since(start_)).c_str());
  }
  SlowNote(const SlowNote&) = delete;
  SlowNote& operator=(const SlowNote&) = delete;

 private:
  std::string what_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false, printed_ = false;
  std::thread watcher_;
};

Record measure(const Technique&, const Impl& impl, const Case& c, const Problem& problem, Device& dev,
               int repetitions, double min_time_s, const Ceilings& ceilings) {
  Record rec = blank_record(impl, c);
  TrackedAllocator& pool = dev.memory();
  TrackedAllocator& host = dev.host();
  try {
    const auto backend_before = dev.backend_used_bytes();
    auto w = impl.make(c, problem, dev);

    // Memory pass: one call between a peak reset and a peak read.
    dev.synchronize();
    pool.reset_peak();
    host.reset_peak();
    const std::size_t live_before = pool.total().live;
    const std::size_t host_before = host.total().live;
    // On the CPU the heap probe counts what the call allocated outside the tracked pools.
    HeapWindow heap(impl.backend == Backend::cpu && heap_probe::available());
    w->run();
    dev.synchronize();
    if (heap.on) rec.counters["untracked_bytes"] = static_cast<double>(heap.close());
    const UsageStats total = pool.total();
    rec.counters["peak_bytes"] = static_cast<double>(total.peak);
    rec.counters["peak_extra_bytes"] = static_cast<double>(total.peak - live_before);
    for (std::size_t t = 0; t < kTagCount; ++t) {
      const auto s = pool.by_tag(static_cast<Tag>(t));
      if (s.peak > 0) rec.counters["peak_bytes_" + std::string(tag_name(static_cast<Tag>(t)))] = static_cast<double>(s.peak);
    }
    const UsageStats hs = host.total();
    if (hs.peak > 0) {
      rec.counters["host_peak_bytes"] = static_cast<double>(hs.peak);
      rec.counters["host_peak_extra_bytes"] = static_cast<double>(hs.peak - host_before);
      for (std::size_t t = 0; t < kTagCount; ++t) {
        const auto s = host.by_tag(static_cast<Tag>(t));
        if (s.peak > 0)
          rec.counters["host_peak_bytes_" + std::string(tag_name(static_cast<Tag>(t)))] = static_cast<double>(s.peak);
      }
    }
    if (backend_before) {
      // What the driver saw allocated while the workload is alive, beside what the allocator tracked:
      // a gap larger than allocation granularity means memory escaped the tracked pools.
      rec.counters["cuda_meminfo_delta_bytes"] = static_cast<double>(*dev.backend_used_bytes()) - *backend_before;
      rec.counters["cuda_tracked_live_bytes"] = static_cast<double>(pool.total().live);
    }

    // Error pass.
    const ErrorStats e = w->error();
    rec.counters["max_abs_err"] = e.max_abs;
    rec.counters["max_rel_err"] = e.max_rel;
    rec.counters["rel_l2_err"] = e.rel_l2;
    rec.counters["nan_count"] = static_cast<double>(e.nan_count);
    rec.counters["inf_count"] = static_cast<double>(e.inf_count);
    w->add_counters(rec.counters);
    rec.detail = w->detail();

    // Timing.
    const Work work = w->work();
    if (work.cold_cache) rec.counters["cold_cache"] = 1;
    time_with_gbench(rec, *w, dev, repetitions, min_time_s, work.cold_cache,
                     rec.name + (impl.backend == Backend::cpu ? "" : " (" + std::string(backend_name(impl.backend)) + ")"));
    add_throughput(rec, w->work(), impl.backend, ceilings);
  } catch (const OutOfMemory& e) {
    rec.status = "oom";
    rec.detail = e.what();
    rec.counters.clear();
    rec.counters["oom_requested_bytes"] = static_cast<double>(e.requested);
    rec.counters["oom_live_bytes"] = static_cast<double>(e.live);
  } catch (const Skip& e) {
    rec.status = "skipped";
    rec.detail = e.what();
    rec.counters.clear();
  } catch (const std::exception& e) {
    rec.status = "error";
    rec.detail = e.what();
    rec.counters.clear();
  }
  // Guard bytes (when on): an out-of-bounds write by the workload fails its record.
  std::string overrun;
  for (TrackedAllocator* a : {&pool, &host})
    for (const auto& v : a->guard_violations()) overrun += (overrun.empty() ? "" : "; ") + v;
  if (!overrun.empty()) {
    pool.clear_guard_violations();
    host.clear_guard_violations();
    rec.status = "error";
    rec.detail = "guard bytes: " + overrun;
    rec.counters.clear();
  }
  rec.times_s.resize(rec.status == "ok" ? rec.times_s.size() : 0);
  rec.cpu_times_s.resize(rec.times_s.size());
  return rec;
}

namespace {

ErrorStats stats_of(const Record& r) {
  ErrorStats e;
  e.max_abs = r.counter("max_abs_err");
  e.max_rel = r.counter("max_rel_err");
  e.rel_l2 = r.counter("rel_l2_err");
  e.nan_count = static_cast<std::size_t>(r.counter("nan_count"));
  e.inf_count = static_cast<std::size_t>(r.counter("inf_count"));
  return e;
}

}  // namespace

void judge_record(const Technique& t, const Impl& impl, const Case& c, const Problem& p,
                  const std::vector<Record>& earlier, Record& rec) {
  const Record* ref = nullptr;
  if (impl.role != Role::reference)
    for (Backend be : {impl.backend, Backend::cpu})
      for (const auto& r : earlier)
        if (!ref && r.kase.id == c.id && r.role == Role::reference && r.backend == be && r.status == "ok") ref = &r;
  if (impl.role != Role::reference && !ref) return;  // the reference did not run here (--filter): not judged
  const ErrorStats e = stats_of(rec);
  const Verdict v = ref ? judge_outputs(t, c, p, impl, e, rec.counters, stats_of(*ref), ref->counters)
                        : judge_error(t, c, p, impl, e, e);
  rec.counters["error_ok"] = v.pass ? 1 : 0;
  if (!v.pass) rec.detail += (rec.detail.empty() ? "" : "; ") + ("error rule failed: " + v.why);
}

void check_suite(const Registry& reg, const SuiteSpec& s) {
  const Technique& t = reg.get(s.technique);
  for (const auto& p : s.profiles)
    for (const auto& c : p.cases) check_case(t, c, "suite file " + s.file.string() + ", profile '" + p.name + "'");
}

std::vector<Case> apply_overrides(const Technique& t, const SuiteSpec& s, const Profile& p,
                                  const std::vector<std::pair<std::string, Json>>& overrides) {
  if (overrides.empty()) return p.cases;
  std::vector<Case> out;
  for (Case c : p.cases) {
    for (const auto& [k, v] : overrides) c.params[k] = v;
    c.id = case_id(c.params);
    check_case(t, c, "--set on suite " + s.name + ", profile '" + p.name + "'");
    if (!c.params.contains(s.x_param) || !c.params[s.x_param].is_number())
      throw Error("--set: suite " + s.name + " needs a numeric '" + s.x_param + "'");
    c.x = c.params[s.x_param].get<double>();
    bool seen = false;
    for (const auto& o : out) seen = seen || o.id == c.id;
    if (!seen) out.push_back(std::move(c));
  }
  return out;
}

namespace {
// The count of one record status (ok, oom, skipped, error; anything else counts as error).
int& count_of(RunSummary& s, const std::string& status) {
  return status == "ok" ? s.ok : status == "oom" ? s.oom : status == "skipped" ? s.skipped : s.error;
}
void tally(RunSummary& s, const std::string& status, int n = 1) { count_of(s, status) += n; }

std::string s_join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& x : v) out += (out.empty() ? "" : ",") + x;
  return out;
}
}  // namespace

RunSummary run_suites(const Registry& reg, const RunOptions& opts) {
  simd::apply_env();  // $MEMTRADE_SIMD: measure a narrower instruction set than this CPU's best
  const auto dir = opts.suites_dir.empty() ? default_suites_dir() : opts.suites_dir;
  std::vector<SuiteSpec> suites;
  const auto all = load_all_suites(dir);
  if (opts.suites.empty()) throw Error("no suite named (--suite takes names separated by commas, or all)");
  for (const auto& name : opts.suites) {
    if (std::any_of(suites.begin(), suites.end(), [&](const SuiteSpec& s) { return s.name == name; })) continue;
    if (name == "all") {
      suites = all;
      break;
    }
    bool found = false;
    for (const auto& s : all)
      if (s.name == name) {
        suites.push_back(s);
        found = true;
      }
    if (!found) {
      std::string known;
      for (const auto& s : all) known += (known.empty() ? "" : ", ") + s.name;
      throw Error("unknown suite '" + name + "' (suites: " + known + ")");
    }
  }
  if (opts.backend != "cpu" && opts.backend != "cuda" && opts.backend != "auto")
    throw Error("unknown backend '" + opts.backend + "' (expected cpu, cuda or auto)");
  const bool want_cpu = opts.backend != "cuda", want_cuda = opts.backend != "cpu";
  std::optional<std::regex> filter;
  if (!opts.filter.empty()) {
    try {
      filter.emplace(opts.filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error("--filter '" + opts.filter + "' is not a valid regular expression: " + e.what());
    }
  }
  std::map<std::string, std::vector<Case>> cases;  // per suite, after --set
  for (const auto& s : suites) {
    check_suite(reg, s);
    cases[s.name] = apply_overrides(reg.get(s.technique), s, s.profile(opts.profile), opts.overrides);
  }

  RunInfo info;
  info.profile = opts.profile;
  info.backend = opts.backend;
  info.capacity = opts.capacity;
  for (const auto& s : suites) {
    s.profile(opts.profile);  // fails early on an unknown profile
    reg.get(s.technique);
    info.suites.push_back(s.name);
    const auto& prof = s.profile(opts.profile);
    Json metrics = Json::array();
    for (const auto& m : reg.get(s.technique).schema.metrics)
      metrics.push_back({{"name", m.name}, {"unit", m.unit}, {"better", better_name(m.better)},
                         {"gate", gate_name(m.gate)}, {"ratio", m.ratio}, {"floor", m.floor}});
    info.suite_meta[s.name] = {{"technique", s.technique}, {"x_param", s.x_param}, {"x_label", s.x_label},
                               {"description", s.description}, {"metrics", metrics},
                               {"capacity_bytes", opts.capacity ? Json(*opts.capacity)
                                                  : prof.capacity ? Json(*prof.capacity) : Json(nullptr)}};
    info.repetitions = std::max(info.repetitions, opts.repetitions.value_or(s.profile(opts.profile).repetitions));
  }

  // The records this selection runs, counted before anything is measured (for --list and the progress).
  auto selected = [&](const Technique& tech, const Impl& impl, const Case& c) {
    if (impl.backend == Backend::cpu ? !want_cpu : !want_cuda) return false;
    if (filter && !std::regex_search(c.suite + "/" + c.id + "/" + impl.name, *filter)) return false;
    try {
      tech.validate(c);
      return impl.not_applicable(c).empty();
    } catch (const std::exception&) {
      return true;  // recorded as an error, with the reason
    }
  };
  int planned = 0, done = 0;
  for (const auto& s : suites) {
    const Technique& tech = reg.get(s.technique);
    for (const Case& c : cases.at(s.name))
      for (const Impl& impl : tech.impls)
        if (selected(tech, impl, c)) {
          ++planned;
          if (opts.list_only)
            std::printf("%s/%s/%s%s\n", s.name.c_str(), c.id.c_str(), impl.name.c_str(),
                        impl.backend == Backend::cpu ? "" : (" (" + std::string(backend_name(impl.backend)) + ")").c_str());
        }
  }
  if (planned == 0)
    throw Error("the selection ran nothing (suites " + s_join(info.suites) + ", profile " + opts.profile + ", backend " +
                opts.backend + (opts.filter.empty() ? "" : ", filter '" + opts.filter + "'") +
                "): no case has an implementation that applies; see memtrade list");
  if (opts.list_only) return RunSummary{};
  check_writable(opts.out);  // before the minutes of probing and training
  std::unique_ptr<Device> cpu, cuda;
  std::string cuda_reason;
  if (want_cpu) cpu = make_cpu_device();
  if (want_cuda) {
    try {
      cuda = make_cuda_device();
    } catch (const Skip& e) {
      cuda_reason = e.what();
    }
  }
  // Asked for CUDA alone and none is usable: an error, not a run of skipped cases that exits 0 (a
  // nightly GPU job with a broken driver must fail). --backend auto records the CUDA cases as skipped.
  if (opts.backend == "cuda" && !cuda) throw Error("--backend cuda: no usable CUDA device (" + cuda_reason + ")");
  // $MEMTRADE_QUIET_NOTES: `ab` sets it after a side's first round, so its log carries the note once.
  const char* quiet_notes = std::getenv("MEMTRADE_QUIET_NOTES");
  if (cpu && !(quiet_notes && *quiet_notes && std::string_view(quiet_notes) != "0"))
    if (const std::string n = blas::narrower_kernels_note(); !n.empty()) std::fprintf(stderr, "memtrade: note: %s\n", n.c_str());
  if (opts.verbose && opts.probe) std::printf("memtrade: measuring machine ceilings...\n");
  if (cpu && opts.probe) info.ceilings = probe_cpu();
  if (cuda && opts.probe)
    for (const auto& [k, v] : probe_cuda()) info.ceilings[k] = v;
  ResultsWriter writer(opts.out, build_context(info));
  RunSummary sum;
  const auto run_start = std::chrono::steady_clock::now();
  std::string previous_reason;
  struct SuiteLine {
    std::string name;
    RunSummary sum;
    double seconds;
  };
  std::vector<SuiteLine> per_suite;
  for (const auto& s : suites) {
    const Technique& tech = reg.get(s.technique);
    const Profile& prof = s.profile(opts.profile);
    const int reps = opts.repetitions.value_or(prof.repetitions);
    // The run's --capacity wins; otherwise the profile's own (e.g. a card's size), for this suite only.
    const auto capacity = opts.capacity ? opts.capacity : prof.capacity;
    for (Device* d : {cpu.get(), cuda.get()})
      if (d) {
        d->memory().set_capacity(capacity);
        for (TrackedAllocator* a : {&d->memory(), &d->host()}) a->set_guard_bytes(default_guard_bytes(prof.name == "test"));
      }
    if (opts.verbose && capacity && !opts.capacity)
      std::printf("%s/%s: device capacity %s (from the profile)\n", s.name.c_str(), prof.name.c_str(),
                  format_bytes(static_cast<double>(*capacity)).c_str());
    std::vector<Record> records;
    RunSummary suite_sum;
    const auto suite_start = std::chrono::steady_clock::now();
    for (const Case& c : cases.at(s.name)) {
      std::unique_ptr<Problem> problem;
      std::string problem_error, problem_skip;
      bool problem_tried = false;
      for (const Impl& impl : tech.impls) {
        if (!selected(tech, impl, c)) continue;
        Record rec = blank_record(impl, c);
        try {
          tech.validate(c);
        } catch (const std::exception& e) {
          rec.status = "error";
          rec.detail = e.what();
        }
        const auto record_start = std::chrono::steady_clock::now();
        ++done;
        if (opts.verbose) {
          std::printf("[%d/%d] %s  ", done, planned, short_label(rec, cases.at(s.name)).c_str());
          std::fflush(stdout);
        }
        Device* dev = impl.backend == Backend::cpu ? cpu.get() : cuda.get();
        if (rec.status == "ok" && !dev) {
          rec.status = "skipped";
          rec.detail = cuda_reason;
        }
        if (rec.status == "ok" && !problem_tried) {
          problem_tried = true;
          try {
            SlowNote note(opts.verbose, "preparing the case (training, calibration, oracle)");
            problem = tech.prepare(c);
          } catch (const Skip& e) {  // what the case needs is not here (a model file): recorded, not an error
            problem_skip = e.what();
          } catch (const std::exception& e) {
            problem_error = e.what();
          }
        }
        if (rec.status == "ok" && !problem) {
          rec.status = problem_skip.empty() ? "error" : "skipped";
          rec.detail = problem_skip.empty() ? "preparing the case failed: " + problem_error : problem_skip;
        }
        if (rec.status == "ok") rec = measure(tech, impl, c, *problem, *dev, reps, prof.min_time_s, info.ceilings);
        if (rec.status == "ok") judge_record(tech, impl, c, *problem, records, rec);
        if (opts.verbose) {
          const double took = seconds_since(record_start), elapsed = seconds_since(run_start);
          const double left = elapsed / done * (planned - done);
          std::printf("%s  (%.1f s; %s elapsed, about %s left)\n", summary_line(rec, previous_reason).c_str(), took,
                      format_duration(elapsed).c_str(), format_duration(left).c_str());
          std::fflush(stdout);
        }
        if (rec.status != "ok") previous_reason = rec.detail;
        tally(suite_sum, rec.status);
        writer.add(rec);
        records.push_back(std::move(rec));
      }
    }
    for (const auto& claim : s.claims) {
      ClaimResult res;
      auto it = tech.claims.find(claim.id);
      if (it == tech.claims.end()) {
        res = {"", "out_of_scope", "memtrade has no check for this claim in the " + tech.name + " technique"};
      } else {
        try {
          res = it->second(claim, records);
        } catch (const std::exception& e) {
          res = {"", "error", std::string("the check failed: ") + e.what()};
        }
      }
      writer.add_claim(claim, res);
      if (opts.verbose) std::printf("claim %-14s %-15s %s\n", claim.id.c_str(), res.verdict.c_str(), res.measured.c_str());
    }
    per_suite.push_back({s.name, suite_sum, seconds_since(suite_start)});
    for (const char* st : {"ok", "oom", "skipped", "error"}) tally(sum, st, count_of(suite_sum, st));
  }
  if (opts.verbose && !per_suite.empty()) {
    std::printf("\n%-14s %6s %6s %8s %6s %10s\n", "suite", "ok", "oom", "skipped", "error", "wall");
    for (const auto& p : per_suite)
      std::printf("%-14s %6d %6d %8d %6d %10s\n", p.name.c_str(), p.sum.ok, p.sum.oom, p.sum.skipped, p.sum.error,
                  format_duration(p.seconds).c_str());
  }
  writer.finish();
  if (opts.verbose)
    std::printf("memtrade: %d ok, %d oom, %d skipped, %d error; results in %s\n", sum.ok, sum.oom, sum.skipped,
                sum.error, opts.out.c_str());
  return sum;
}

}  // namespace memtrade
