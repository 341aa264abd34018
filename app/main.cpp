// memtrade: the command-line entry point.
//   memtrade list
//   memtrade run --suite S[,S...]|all [--profile quick|full] [--backend cpu|cuda|auto] --out F [options]
//   memtrade compare BASELINE CURRENT [--time gate|report] [--markdown F] [--json F] [options]
//   memtrade ab --baseline-bin OLD --candidate-bin NEW --suite S [--runs K] [options]
//   memtrade gate-selftest [--trials T] [--runs K]
//   memtrade report RESULTS... [--baseline B] -o report.html
//   memtrade probe [--backend cpu|cuda|auto]
// Exit codes: 0 success, 1 regressions found (compare), 2 usage error or unreadable/malformed input.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/blas.hpp"
#include "harness/ab.hpp"
#include "harness/compare.hpp"
#include "harness/probe.hpp"
#include "harness/runner.hpp"
#include "app/techniques.hpp"
#include "memtrade/build_info.hpp"

using namespace memtrade;

namespace {

struct Usage : Error {
  using Error::Error;
};

const char* kMainHelp =
    "memtrade: reference vs optimized implementations of LLM memory techniques, measured for\n"
    "peak memory, throughput and numeric error, with regression checks against baselines.\n\n"
    "usage: memtrade <command> [options]   (memtrade <command> --help for details)\n\n"
    "commands:\n"
    "  list      suites, profiles, techniques and implementations\n"
    "  run       run suites and write a results file (Google Benchmark JSON)\n"
    "  compare   compare a results file (or several runs) with a baseline; exit 1 on regressions\n"
    "  ab        time two builds against each other, alternating runs on this machine; exit 1 on regressions\n"
    "  gate-selftest  false-alarm and detection rates of the time gate on calibrated slowdowns\n"
    "  report    write a self-contained HTML report from results files\n"
    "  probe     measure this machine's GEMM and copy ceilings\n"
    "  tune      measure and store machine-specific settings (attention's naive/flash crossover)\n"
    "  --version the version and build\n";

#define COMPARE_OPTIONS_HELP \
  "  --time gate|report     time regressions gate (default) or are only reported\n" \
  "  --memory-tolerance N   bytes a memory metric may grow (default 0)\n" \
  "  --untracked-allowance N  bytes untracked_bytes may grow (default 65536)\n" \
  "  --error-ratio R        rel_l2_err regression factor (default 2)\n" \
  "  --error-floor A        rel_l2_err increase that never counts (default 0) ...\n" \
  "  --error-floor-u U      ... nor one below U unit roundoffs of the case dtype (default 2)\n" \
  "  --alpha P              level of the one-sided test over the runs (default 0.01)\n" \
  "  --time-stat min|median  a run's time of a case: its fastest repetition (default) or their median\n" \
  "  --min-effect F         smallest slowdown of the median run that counts (default 0.05)\n" \
  "  --min-effect-for RE=F  the minimum effect for cases whose name matches RE (repeatable, first match)\n" \
  "  --max-cv C             a run whose repetitions' coefficient of variation exceeds C is unstable (0.25)\n" \
  "  --min-cpu-share S      a CPU run is pre-empted (unstable) when one repetition's CPU/wall falls\n" \
  "                         below S times the run's best (default 0.5)\n"

const std::map<std::string, std::string> kHelp = {
    {"list", "usage: memtrade list [TECHNIQUE] [--suites-dir D]\n"
             "  Without TECHNIQUE: the suites with their profiles and case counts, and every implementation.\n"
             "  With TECHNIQUE: its axes (type, allowed values, default, meaning), implementations and metrics.\n"},
    {"run",
     "usage: memtrade run --suite S[,S...]|all --out F [options]\n"
     "  --suite S          suite name(s), comma-separated, or 'all'\n"
     "  --profile P        case grid profile (quick, full, ...; default quick)\n"
     "  --backend B        cpu | cuda | auto (default auto: both; CUDA cases record 'skipped' without a device)\n"
     "  --out F            results file (F.partial holds the finished cases while running; F is replaced at the end)\n"
     "  --capacity SIZE    device memory capacity, e.g. 24GiB, 80GB, 1048576; cases that need more record 'oom'\n"
     "  --repetitions N    repetitions per case (default from the profile)\n"
     "  --filter REGEX     run only records whose name (suite/case/impl) matches REGEX (ECMAScript, searched)\n"
     "  --set KEY=VALUE    override a case parameter in every case (repeatable; checked against the\n"
     "                     technique's axes, see memtrade list TECHNIQUE); VALUE is JSON or a plain string\n"
     "  --suites-dir D     where suite files live (default: the source tree's suites/)\n"
     "  --no-probe         skip measuring the machine's ceilings (no frac_of_* counters)\n"
     "  --list             print the records the selection would run (suite/case/impl) and exit\n"
     "  --quiet            no per-case lines\n"},
    {"compare",
     "usage: memtrade compare BASELINE CURRENT [options]\n"
     "  BASELINE and CURRENT are each a results file, a comma-separated list of them, or a folder (every\n"
     "  *.json in it): several files are independent runs of one build. Memory, error and counters come from\n"
     "  the first file of each side (memory must be equal in every CURRENT run); time is tested on the runs'\n"
     "  medians and gates only with enough runs for the test (5 per side at alpha 0.01).\n"
     COMPARE_OPTIONS_HELP
     "  --allow-missing        cases missing from CURRENT are listed, not regressions\n"
     "  --paired               file i of BASELINE and file i of CURRENT are one round (ab's lockstep output):\n"
     "                         time is tested on the rounds' ratios (signed-rank; 7 rounds reach p < 0.01)\n"
     "  --markdown F           also write the table as markdown\n"
     "  --json F               also write every check as JSON (what report --baseline uses)\n"
     "  exit: 0 clean, 1 regressions, 2 unreadable or malformed input\n"},
    {"ab",
     "usage: memtrade ab --baseline-bin OLD --candidate-bin NEW --suite S [options]\n"
     "  Each round runs OLD and NEW at once in lockstep (`run --no-probe`, one process each): they take turns\n"
     "  timing each case, one repetition each while the other waits, so both share the machine's speed of\n"
     "  the moment. Time is judged on the rounds' ratios (one-sided signed-rank test and the minimum\n"
     "  effect) in two stages: K screening rounds pick the suspects, fresh rounds confirm them; memory and\n"
     "  error as `compare` does. Cases whose time test was inconclusive because runs were pre-empted or\n"
     "  too spread (`unstable`) are run again, alone.\n"
     "  --runs K               screening rounds (default 7)\n"
     "  --no-lockstep          whole runs one after the other (ABBA), judged unpaired (Mann-Whitney U)\n"
     "  --retries N            extra rounds for unstable cases (default 2)\n"
     "  --screen-alpha P       level at which the K rounds pick suspects (default 0.05); each suspect gets\n"
     "  --confirm-runs M       M fresh rounds, alone (default 14), and its slowdown is a regression only when\n"
     "                         those rounds, judged on their own, are significant at --alpha with the minimum\n"
     "                         effect (disjoint rounds: a false alarm per case at most 0.05 x 0.01);\n"
     "                         --confirm-runs 0 gates on the K rounds alone, at --alpha\n"
     "  --out-dir D            where the runs' results files go (default build/ab; earlier run-*.json removed)\n"
     "  --baseline-env N=V     environment for OLD's runs only (repeatable); --candidate-env likewise\n"
     "  --suite, --profile, --backend (default cpu), --filter, --set, --repetitions, --suites-dir: as for run\n"
     COMPARE_OPTIONS_HELP
     "  --markdown F, --json F as for compare\n"
     "  exit: 0 clean, 1 regressions, 2 usage error or a failed run\n"},
    {"gate-selftest",
     "usage: memtrade gate-selftest [--trials T] [--runs K] [--slowdowns F,F] [--out-dir D]\n"
     "  The time gate's power and false-alarm rate, measured: T times, `ab` of this binary against itself on\n"
     "  the calibrate suite's selftest profile (a copy and a multiply-add chain), with the candidate doing\n"
     "  1.00x the work (every flag is a false alarm) and each factor of --slowdowns (default 1.10,1.25;\n"
     "  every flag is a detection). Prints the rates; exit 1 when a false alarm occurred or the detection\n"
     "  rate is below 95% at 1.25x or 80% at 1.10x. Default T = 10, K = 7 lockstep rounds (15-20 minutes).\n"},
    {"report",
     "usage: memtrade report RESULTS... [--baseline B] -o report.html\n"
     "  One self-contained HTML file: plots per technique, claims, regressions against B (compared with\n"
     "  the last RESULTS, time report-only), run context, and trends when several RESULTS are given.\n"},
    {"tune", "usage: memtrade tune\n  Re-measures every technique's machine-specific setting on the CPU and stores it.\n"},
    {"probe", "usage: memtrade probe [--backend cpu|cuda|auto] [--out F]\n  Measures GEMM rates and copy bandwidth.\n"},
};

std::size_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw Usage("bad size '" + s + "' (examples: 1048576, 512MiB, 24GiB, 80GB)");
  }
  const std::string unit = s.substr(pos);
  static const std::map<std::string, double> units = {{"", 1},         {"B", 1},          {"KiB", 1024.0},
                                                      {"MiB", 1 << 20}, {"GiB", 1 << 30},  {"TiB", 1099511627776.0},
                                                      {"KB", 1e3},     {"MB", 1e6},       {"GB", 1e9},
                                                      {"TB", 1e12}};
  auto it = units.find(unit);
  const double bytes = v * (it == units.end() ? 0.0 : it->second);
  // At least one byte, and small enough to be a size_t (also rejects inf and nan).
  if (it == units.end() || !(bytes >= 1 && bytes < 1.8e19))
    throw Usage("bad size '" + s + "' (examples: 1048576, 512MiB, 24GiB, 80GB)");
  return static_cast<std::size_t>(bytes);
}

// Splits argv into positionals and --options; `flags` lists options that take no value.
struct Args {
  std::vector<std::string> pos;
  std::map<std::string, std::string> opt;
  std::map<std::string, std::vector<std::string>> all;  // every value of an option given more than once
  Args(int argc, char** argv, int first, const std::vector<std::string>& valued, const std::vector<std::string>& flags) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.size() > 1 && a[0] == '-') {
        std::string value;
        if (auto eq = a.find('='); eq != std::string::npos) {
          value = a.substr(eq + 1);
          a = a.substr(0, eq);
        }
        if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
          opt[a] = "1";
        } else if (std::find(valued.begin(), valued.end(), a) != valued.end()) {
          if (value.empty()) {
            if (i + 1 >= argc) throw Usage("option " + a + " needs a value");
            value = argv[++i];
          }
          opt[a] = value;
          all[a].push_back(value);
        } else {
          throw Usage("unknown option '" + a + "'");
        }
      } else {
        pos.push_back(a);
      }
    }
  }
  bool has(const std::string& k) const { return opt.count(k) > 0; }
  std::string get(const std::string& k, const std::string& d = "") const { return has(k) ? opt.at(k) : d; }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

double parse_number(const std::string& s, const std::string& what) {
  try {
    std::size_t pos = 0;
    double v = std::stod(s, &pos);
    if (pos == s.size()) return v;
  } catch (...) {
  }
  throw Usage("option " + what + " needs a number, got '" + s + "'");
}

std::string metric_line(const Metric& m) {
  char buf[256];
  std::string gate(gate_name(m.gate));
  if (m.gate == Gate::ratio) gate += " x" + format_number(m.ratio) + ", floor " + format_number(m.floor);
  if (m.gate == Gate::bound) gate += " " + format_number(m.floor);
  std::snprintf(buf, sizeof buf, "  %-28s %-10s %-7s %-22s %s\n", m.name.c_str(), m.unit.c_str(),
                std::string(better_name(m.better)).c_str(), gate.c_str(), m.help.c_str());
  return buf;
}

int cmd_list_technique(const Technique& t) {
  std::printf("%s: %s\n\naxes (suite file keys):\n", t.name.c_str(), t.description.c_str());
  for (const auto& p : t.schema.params)
    std::printf("  %-16s %-44s %s\n", p.name.c_str(), p.describe().c_str(), p.help.c_str());
  std::printf("\nimplementations:\n");
  for (const auto& i : t.impls)
    std::printf("  %-20s %-10s %-5s %s\n", i.name.c_str(), std::string(role_name(i.role)).c_str(),
                std::string(backend_name(i.backend)).c_str(), i.description.c_str());
  std::printf("\nmetrics of this technique (name, unit, better, compare rule, meaning):\n");
  for (const auto& m : t.schema.metrics) std::printf("%s", metric_line(m).c_str());
  std::printf("\nmetrics of every record (the harness's):\n");
  for (const auto& m : harness_metrics()) std::printf("%s", metric_line(m).c_str());
  return 0;
}

int cmd_list(const Args& a) {
  if (a.pos.size() > 1) throw Usage("list takes at most one technique");
  if (a.pos.size() == 1) return cmd_list_technique(registry().get(a.pos[0]));
  const auto dir = a.has("--suites-dir") ? std::filesystem::path(a.get("--suites-dir")) : default_suites_dir();
  std::printf("suites (%s):\n", dir.c_str());
  for (const auto& s : load_all_suites(dir)) {
    std::printf("  %-12s technique %-10s", s.name.c_str(), s.technique.c_str());
    for (const auto& p : s.profiles) std::printf("  %s: %zu cases", p.name.c_str(), p.cases.size());
    std::printf("\n");
  }
  std::printf("implementations:\n");
  for (const auto& t : registry().all())
    for (const auto& i : t.impls)
      std::printf("  %-10s %-14s %-10s %-5s %s\n", t.name.c_str(), i.name.c_str(), std::string(role_name(i.role)).c_str(),
                  std::string(backend_name(i.backend)).c_str(), i.description.c_str());
  auto cs = cuda_status();
  std::printf("cuda: %s\n", cs.available ? (cs.gpu_name + ", driver " + cs.driver).c_str() : cs.reason.c_str());
  return 0;
}

// An option that takes a whole number >= lo (fallback when absent).
int whole_number(const Args& a, const char* key, int fallback, int lo) {
  if (!a.has(key)) return fallback;
  const double v = parse_number(a.get(key), key);
  if (v < lo || v != static_cast<int>(v)) throw Usage(std::string(key) + " must be a whole number >= " + std::to_string(lo));
  return static_cast<int>(v);
}

int cmd_run(const Args& a) {
  if (!a.pos.empty()) throw Usage("unexpected argument '" + a.pos[0] + "'");
  if (!a.has("--suite")) throw Usage("run needs --suite");
  if (!a.has("--out") && !a.has("--list")) throw Usage("run needs --out");
  RunOptions o;
  o.suites = split(a.get("--suite"), ',');
  o.profile = a.get("--profile", "quick");
  o.backend = a.get("--backend", "auto");
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "auto")
    throw Usage("unknown backend '" + o.backend + "' (expected cpu, cuda or auto)");
  o.out = a.get("--out");
  if (a.has("--suites-dir")) o.suites_dir = a.get("--suites-dir");
  if (a.has("--capacity")) o.capacity = parse_size(a.get("--capacity"));
  if (a.has("--repetitions")) o.repetitions = whole_number(a, "--repetitions", 1, 1);
  o.filter = a.get("--filter");
  if (a.all.count("--set"))
    for (const auto& kv : a.all.at("--set")) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) throw Usage("--set takes KEY=VALUE, got '" + kv + "'");
      const std::string text = kv.substr(eq + 1);
      Json v = Json::parse(text, nullptr, false);
      if (v.is_discarded() || v.is_object() || v.is_array() || v.is_null()) v = text;  // a plain string
      o.overrides.emplace_back(kv.substr(0, eq), v);
    }
  o.verbose = !a.has("--quiet");
  o.probe = !a.has("--no-probe");
  o.list_only = a.has("--list");
  auto s = run_suites(registry(), o);
  return s.error > 0 ? 3 : 0;
}

const std::vector<std::string> kCompareValued = {"--time",   "--memory-tolerance", "--untracked-allowance", "--error-ratio",
                                                 "--error-floor", "--error-floor-u", "--alpha", "--min-effect",
                                                 "--min-effect-for", "--max-cv", "--min-cpu-share", "--time-stat", "--markdown", "--json"};

CompareOptions compare_options(const Args& a) {
  CompareOptions o;
  const std::string tm = a.get("--time", "gate");
  if (tm != "gate" && tm != "report") throw Usage("--time takes gate or report, got '" + tm + "'");
  o.time_gate = tm == "gate";
  o.paired = a.has("--paired");
  if (const std::string ts = a.get("--time-stat", "min"); ts == "median") o.time_stat = CompareOptions::RunStat::median;
  else if (ts != "min") throw Usage("--time-stat takes min or median, got '" + ts + "'");
  auto number = [&](const char* key, double& into, double lo, double hi) {
    if (!a.has(key)) return;
    into = parse_number(a.get(key), key);
    if (!(into >= lo && into <= hi))
      throw Usage(std::string("option ") + key + " must be in [" + format_number(lo) + ", " + format_number(hi) + "]");
  };
  number("--memory-tolerance", o.memory_tolerance_bytes, 0, 1e18);
  number("--untracked-allowance", o.untracked_allowance_bytes, 0, 1e18);
  number("--error-ratio", o.error_ratio, 1, 1e9);
  number("--error-floor", o.error_floor, 0, 1e9);
  number("--error-floor-u", o.error_floor_u, 0, 1e12);
  number("--alpha", o.time_alpha, 1e-12, 1);
  number("--min-effect", o.time_min_effect, 0, 100);
  number("--max-cv", o.max_cv, 0, 100);
  number("--min-cpu-share", o.min_cpu_share, 0, 1);
  if (a.all.count("--min-effect-for"))
    for (const auto& kv : a.all.at("--min-effect-for")) {
      const auto eq = kv.rfind('=');
      if (eq == std::string::npos || eq == 0) throw Usage("--min-effect-for takes REGEX=F, got '" + kv + "'");
      o.min_effect_for.emplace_back(kv.substr(0, eq), parse_number(kv.substr(eq + 1), "--min-effect-for"));
    }
  o.allow_missing = a.has("--allow-missing");
  return o;
}

// A side of a comparison: a results file, a comma-separated list of them, or a folder of *.json runs.
std::vector<LoadedResults> load_side(const std::string& spec) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(spec)) {
    for (const auto& e : std::filesystem::directory_iterator(spec))
      if (e.path().extension() == ".json") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) throw Usage("folder '" + spec + "' holds no *.json results files");
  } else {
    for (const auto& f : split(spec, ',')) files.emplace_back(f);
  }
  if (files.empty()) throw Usage("no results file in '" + spec + "'");
  std::vector<LoadedResults> out;
  for (const auto& f : files) out.push_back(load_results(f));
  return out;
}

// Writes `text` to `path` or throws naming it (an output a nightly job expects must not go missing silently).
void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw Error("cannot write " + path);
}

int write_compare(const Args& a, const CompareResult& r, const std::string& title) {
  std::printf("%s\n%s", title.c_str(), format_compare(r, false).c_str());
  if (a.has("--markdown")) write_file(a.get("--markdown"), format_compare(r, true));
  if (a.has("--json")) write_file(a.get("--json"), compare_to_json(r).dump(1) + "\n");
  return r.regressions > 0 ? 1 : 0;
}

int cmd_compare(const Args& a) {
  if (a.pos.size() != 2) throw Usage("compare needs BASELINE and CURRENT");
  const CompareOptions o = compare_options(a);
  const auto r = compare_runs(load_side(a.pos[0]), load_side(a.pos[1]), o);
  return write_compare(a, r, "compare " + a.pos[0] + " -> " + a.pos[1]);
}

// The `run` options ab passes through to every run.
std::vector<std::string> run_args(const Args& a) {
  std::vector<std::string> out;
  for (const char* k : {"--suite", "--profile", "--repetitions", "--suites-dir", "--capacity"})
    if (a.has(k)) {
      out.push_back(k);
      out.push_back(a.get(k));
    }
  out.push_back("--backend");
  out.push_back(a.get("--backend", "cpu"));
  if (a.all.count("--set"))
    for (const auto& kv : a.all.at("--set")) {
      out.push_back("--set");
      out.push_back(kv);
    }
  return out;
}


int cmd_ab(const Args& a) {
  if (!a.pos.empty()) throw Usage("unexpected argument '" + a.pos[0] + "'");
  for (const char* k : {"--baseline-bin", "--candidate-bin", "--suite"})
    if (!a.has(k)) throw Usage(std::string("ab needs ") + k);
  AbOptions o;
  o.baseline_bin = a.get("--baseline-bin");
  o.candidate_bin = a.get("--candidate-bin");
  if (a.all.count("--baseline-env")) o.baseline_env = a.all.at("--baseline-env");
  if (a.all.count("--candidate-env")) o.candidate_env = a.all.at("--candidate-env");
  o.run_args = run_args(a);
  o.filter = a.get("--filter");
  o.lockstep = !a.has("--no-lockstep");
  o.runs = whole_number(a, "--runs", 7, 1);
  o.retries = whole_number(a, "--retries", 2, 0);
  o.confirm_runs = whole_number(a, "--confirm-runs", 14, 0);
  if (a.has("--screen-alpha")) {
    o.screen_alpha = parse_number(a.get("--screen-alpha"), "--screen-alpha");
    if (!(o.screen_alpha > 0 && o.screen_alpha <= 1)) throw Usage("--screen-alpha must be in (0, 1]");
  }
  o.out_dir = a.get("--out-dir", "build/ab");
  o.compare = compare_options(a);
  const auto r = run_ab(o);
  const std::string confirm =
      r.confirm_rounds ? " (" + std::to_string(r.confirm_rounds) + " of them confirming " +
                             std::to_string(r.suspects.size()) + " suspect case(s))"
                       : "";
  return write_compare(a, r.compare,
                       "ab " + o.baseline_bin.string() + " (baseline) vs " + o.candidate_bin.string() + " (candidate), " +
                           std::to_string(r.rounds) + " rounds" + confirm + "; runs in " + o.out_dir.string());
}

int cmd_gate_selftest(const Args& a) {
  if (!a.pos.empty()) throw Usage("unexpected argument '" + a.pos[0] + "'");
  const int trials = whole_number(a, "--trials", 10, 1);
  const int runs = whole_number(a, "--runs", 7, 1);
  std::vector<double> factors = {1.0};
  for (const auto& f : split(a.get("--slowdowns", "1.10,1.25"), ',')) {
    const double v = parse_number(f, "--slowdowns");
    if (!(v > 1 && v <= 2)) throw Usage("--slowdowns takes factors in (1, 2], got '" + f + "'");
    factors.push_back(v);
  }
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  const std::filesystem::path out = a.get("--out-dir", "build/gate-selftest");
  std::map<double, std::map<std::string, int>> flagged;  // factor -> case -> trials flagged
  std::map<double, int> other;                            // non-time regressions (must stay 0)
  std::map<double, int> unstable;
  for (int t = 1; t <= trials; ++t)
    for (double f : factors) {
      AbOptions o;
      o.baseline_bin = o.candidate_bin = self;
      char scale[64];
      std::snprintf(scale, sizeof scale, "MEMTRADE_CALIBRATE_SCALE=%.4g", f);
      o.baseline_env = {"MEMTRADE_CALIBRATE_SCALE=1"};
      o.candidate_env = {scale};
      o.run_args = {"--suite", "calibrate", "--profile", "selftest", "--backend", "cpu"};
      o.runs = runs;
      o.retries = 1;
      o.out_dir = out;
      o.verbose = false;
      const auto r = run_ab(o);
      for (const auto& row : r.compare.rows) {
        if (row.metric == "time") flagged[f][row.name] += row.regression ? 1 : 0;
        else if (row.regression) ++other[f];
        if (row.metric == "time" && row.verdict == "unstable") ++unstable[f];
      }
      std::printf("trial %d/%d, candidate at %.2fx work: %d regression(s)\n", t, trials, f, r.compare.regressions);
      std::fflush(stdout);
    }
  std::printf("\n%-8s %-40s %s\n", "work", "case", "flagged as a time regression");
  bool pass = true;
  for (const auto& [f, cases] : flagged) {
    int hits = 0, total = 0;
    for (const auto& [name, n] : cases) {
      std::printf("%-8.2f %-40s %d/%d\n", f, name.c_str(), n, trials);
      hits += n;
      total += trials;
    }
    const double rate = total ? static_cast<double>(hits) / total : 0;
    if (f == 1.0) {
      std::printf("  false-alarm rate at 1.00x: %d/%d (target 0)\n", hits, total);
      pass = pass && hits == 0;
    } else {
      const double target = f >= 1.25 ? 0.95 : f >= 1.10 ? 0.80 : 0.0;
      std::printf("  detection rate at %.2fx: %d/%d = %.0f%% (target %.0f%%)\n", f, hits, total, 100 * rate, 100 * target);
      pass = pass && rate >= target;
    }
    if (other[f]) std::printf("  %d non-time regression(s) at %.2fx (memory or error: must be 0)\n", other[f], f);
    if (unstable[f]) std::printf("  %d time check(s) still unstable after a retry\n", unstable[f]);
    pass = pass && other[f] == 0;
  }
  std::printf("gate-selftest: %s\n", pass ? "pass" : "FAIL");
  return pass ? 0 : 1;
}

// The report script: $MEMTRADE_REPORT_SCRIPT, else report.py beside the binary (the build copies it
// there), else the source tree's scripts/report.py.
std::filesystem::path report_script() {
  if (const char* env = std::getenv("MEMTRADE_REPORT_SCRIPT"); env && *env) return env;
  std::error_code ec;
  const auto beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "report.py";
  if (!ec && std::filesystem::is_regular_file(beside)) return beside;
  return std::filesystem::path(build::source_dir) / "scripts" / "report.py";
}

int cmd_report(const Args& a) {
  if (a.pos.empty()) throw Usage("report needs at least one results file");
  if (!a.has("-o")) throw Usage("report needs -o report.html");
  for (const auto& p : a.pos) load_results(p);  // a clear error before Python starts
  const auto script = report_script();
  std::vector<std::string> args = {"python3", script.string()};
  for (const auto& p : a.pos) args.push_back(p);
  std::string compare_json;
  if (a.has("--baseline")) {
    CompareOptions o;
    o.time_gate = false;
    o.allow_missing = true;
    const auto r = compare_results(load_results(a.get("--baseline")), load_results(a.pos.back()), o);
    compare_json = a.get("-o") + ".compare.json";
    write_file(compare_json, compare_to_json(r).dump(1) + "\n");
    args.push_back("--compare");
    args.push_back(compare_json);
    args.push_back("--baseline-results");
    args.push_back(a.get("--baseline"));
  }
  args.push_back("-o");
  args.push_back(a.get("-o"));
  const int rc = run_program(args);
  if (!compare_json.empty()) std::filesystem::remove(compare_json);
  if (rc != 0) {
    std::fprintf(stderr, "memtrade report: the report script %s failed (exit %d)\n", script.c_str(), rc);
    return 2;
  }
  std::printf("report written to %s\n", a.get("-o").c_str());
  return 0;
}

int cmd_tune(const Args& a) {
  if (!a.pos.empty()) throw Usage("unexpected argument '" + a.pos[0] + "'");
  auto dev = make_cpu_device();
  for (const auto& t : registry().all())
    if (t.tune) std::printf("%s\n", t.tune(*dev).c_str());
  return 0;
}

int cmd_probe(const Args& a) {
  const std::string be = a.get("--backend", "auto");
  if (be != "cpu" && be != "cuda" && be != "auto") throw Usage("unknown backend '" + be + "'");
  Ceilings c;
  if (be != "cuda")
    if (const std::string n = memtrade::blas::narrower_kernels_note(); !n.empty()) std::printf("note: %s\n", n.c_str());
  if (be != "cuda") c = probe_cpu();
  if (be != "cpu") {
    auto cs = cuda_status();
    if (cs.available) {
      for (const auto& [k, v] : probe_cuda()) c[k] = v;
    } else {
      std::printf("cuda: skipped: %s\n", cs.reason.c_str());
    }
  }
  Json j = Json::object();
  for (const auto& [k, v] : c) {
    j[k] = v;
    const bool flops = k.find("flops") != std::string::npos;
    std::printf("%-24s %10.2f %s\n", k.c_str(), v / (flops ? 1e9 : 1e9), flops ? "GFLOP/s" : "GB/s");
  }
  if (a.has("--out")) write_file(a.get("--out"), j.dump(1) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  memtrade::blas::use_the_cpus_kernels(argv);
  if (argc >= 2 && (std::string(argv[1]) == "--version" || std::string(argv[1]) == "version")) {
    std::printf("memtrade %s (%s build, source %s)\n", build::version, build::build_type, build::source_dir);
    return 0;
  }
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help") {
    std::printf("%s", kMainHelp);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (!kHelp.count(cmd)) {
    std::fprintf(stderr, "memtrade: unknown command '%s'\n\n%s", cmd.c_str(), kMainHelp);
    return 2;
  }
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", kHelp.at(cmd).c_str());
      return 0;
    }
  try {
    if (cmd == "list") return cmd_list(Args(argc, argv, 2, {"--suites-dir"}, {}));
    if (cmd == "run")
      return cmd_run(Args(argc, argv, 2,
                          {"--suite", "--profile", "--backend", "--out", "--capacity", "--repetitions", "--filter",
                           "--set", "--suites-dir"},
                          {"--quiet", "--no-probe", "--list"}));
    if (cmd == "compare") return cmd_compare(Args(argc, argv, 2, kCompareValued, {"--allow-missing", "--paired"}));
    if (cmd == "ab") {
      auto valued = kCompareValued;
      for (const char* k : {"--baseline-bin", "--candidate-bin", "--baseline-env", "--candidate-env", "--runs",
                            "--retries", "--confirm-runs", "--screen-alpha", "--out-dir", "--suite", "--profile", "--backend", "--filter", "--set",
                            "--repetitions", "--suites-dir", "--capacity"})
        valued.push_back(k);
      return cmd_ab(Args(argc, argv, 2, valued, {"--allow-missing", "--no-lockstep"}));
    }
    if (cmd == "gate-selftest")
      return cmd_gate_selftest(Args(argc, argv, 2, {"--trials", "--runs", "--slowdowns", "--out-dir"}, {}));
    if (cmd == "report") return cmd_report(Args(argc, argv, 2, {"--baseline", "-o"}, {}));
    if (cmd == "tune") return cmd_tune(Args(argc, argv, 2, {}, {}));
    if (cmd == "probe") return cmd_probe(Args(argc, argv, 2, {"--backend", "--out"}, {}));
  } catch (const Usage& e) {
    std::fprintf(stderr, "memtrade %s: %s\n\n%s", cmd.c_str(), e.what(), kHelp.at(cmd).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memtrade %s: %s\n", cmd.c_str(), e.what());
    return 2;
  }
  return 2;
}
