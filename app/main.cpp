// memtrade: the command-line entry point.
//   memtrade list
//   memtrade run --suite S[,S...]|all [--profile quick|full] [--backend cpu|cuda|auto] --out F [options]
//   memtrade compare BASELINE CURRENT [--time gate|report] [--markdown F] [--json F] [options]
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
    "  compare   compare a results file with a baseline; exit 1 on regressions\n"
    "  report    write a self-contained HTML report from results files\n"
    "  probe     measure this machine's GEMM and copy ceilings\n"
    "  tune      measure and store machine-specific settings (attention's naive/flash crossover)\n";

const std::map<std::string, std::string> kHelp = {
    {"list", "usage: memtrade list [TECHNIQUE] [--suites-dir D]\n"
             "  Without TECHNIQUE: the suites with their profiles and case counts, and every implementation.\n"
             "  With TECHNIQUE: its axes (type, allowed values, default, meaning), implementations and metrics.\n"},
    {"run",
     "usage: memtrade run --suite S[,S...]|all --out F [options]\n"
     "  --suite S          suite name(s), comma-separated, or 'all'\n"
     "  --profile P        case grid profile (quick, full, ...; default quick)\n"
     "  --backend B        cpu | cuda | auto (default auto: both; CUDA cases record 'skipped' without a device)\n"
     "  --out F            results file (rewritten after every case)\n"
     "  --capacity SIZE    device memory capacity, e.g. 24GiB, 80GB, 1048576; cases that need more record 'oom'\n"
     "  --repetitions N    repetitions per case (default from the profile)\n"
     "  --filter REGEX     run only records whose name (suite/case/impl) matches REGEX (ECMAScript, searched)\n"
     "  --set KEY=VALUE    override a case parameter in every case (repeatable; checked against the\n"
     "                     technique's axes, see memtrade list TECHNIQUE); VALUE is JSON or a plain string\n"
     "  --suites-dir D     where suite files live (default: the source tree's suites/)\n"
     "  --quiet            no per-case lines\n"},
    {"compare",
     "usage: memtrade compare BASELINE CURRENT [options]\n"
     "  --time gate|report     time regressions gate (default) or are only reported (noisy shared runners)\n"
     "  --memory-tolerance N   bytes a memory metric may grow (default 0)\n"
     "  --error-ratio R        rel_l2_err regression factor (default 2)\n"
     "  --error-floor A        rel_l2_err increase that never counts (default 0) ...\n"
     "  --error-floor-u U      ... nor one below U unit roundoffs of the case dtype (default 2)\n"
     "  --alpha P              significance level of the Mann-Whitney U test (default 0.01)\n"
     "  --min-effect F         smallest median slowdown that counts (default 0.10)\n"
     "  --allow-missing        cases missing from CURRENT are listed, not regressions\n"
     "  --markdown F           also write the table as markdown\n"
     "  --json F               also write every check as JSON (what report --baseline uses)\n"
     "  exit: 0 clean, 1 regressions, 2 unreadable or malformed input\n"},
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

int cmd_run(const Args& a) {
  if (!a.pos.empty()) throw Usage("unexpected argument '" + a.pos[0] + "'");
  if (!a.has("--suite")) throw Usage("run needs --suite");
  if (!a.has("--out")) throw Usage("run needs --out");
  RunOptions o;
  o.suites = split(a.get("--suite"), ',');
  o.profile = a.get("--profile", "quick");
  o.backend = a.get("--backend", "auto");
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "auto")
    throw Usage("unknown backend '" + o.backend + "' (expected cpu, cuda or auto)");
  o.out = a.get("--out");
  if (a.has("--suites-dir")) o.suites_dir = a.get("--suites-dir");
  if (a.has("--capacity")) o.capacity = parse_size(a.get("--capacity"));
  if (a.has("--repetitions")) {
    const double r = parse_number(a.get("--repetitions"), "--repetitions");
    if (r < 1 || r != static_cast<int>(r)) throw Usage("--repetitions must be a whole number >= 1");
    o.repetitions = static_cast<int>(r);
  }
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
  auto s = run_suites(registry(), o);
  return s.error > 0 ? 3 : 0;
}

int cmd_compare(const Args& a) {
  if (a.pos.size() != 2) throw Usage("compare needs BASELINE and CURRENT");
  CompareOptions o;
  const std::string tm = a.get("--time", "gate");
  if (tm != "gate" && tm != "report") throw Usage("--time takes gate or report, got '" + tm + "'");
  o.time_gate = tm == "gate";
  if (a.has("--memory-tolerance")) o.memory_tolerance_bytes = parse_number(a.get("--memory-tolerance"), "--memory-tolerance");
  if (a.has("--error-ratio")) o.error_ratio = parse_number(a.get("--error-ratio"), "--error-ratio");
  if (a.has("--error-floor")) o.error_floor = parse_number(a.get("--error-floor"), "--error-floor");
  if (a.has("--error-floor-u")) o.error_floor_u = parse_number(a.get("--error-floor-u"), "--error-floor-u");
  if (a.has("--alpha")) o.time_alpha = parse_number(a.get("--alpha"), "--alpha");
  if (a.has("--min-effect")) o.time_min_effect = parse_number(a.get("--min-effect"), "--min-effect");
  o.allow_missing = a.has("--allow-missing");
  const auto base = load_results(a.pos[0]);
  const auto cur = load_results(a.pos[1]);
  const auto r = compare_results(base, cur, o);
  std::printf("compare %s -> %s\n%s", a.pos[0].c_str(), a.pos[1].c_str(), format_compare(r, false).c_str());
  if (a.has("--markdown")) std::ofstream(a.get("--markdown")) << format_compare(r, true);
  if (a.has("--json")) std::ofstream(a.get("--json")) << compare_to_json(r).dump(1) << "\n";
  return r.regressions > 0 ? 1 : 0;
}

int cmd_report(const Args& a) {
  if (a.pos.empty()) throw Usage("report needs at least one results file");
  if (!a.has("-o")) throw Usage("report needs -o report.html");
  for (const auto& p : a.pos) load_results(p);  // a clear error before Python starts
  const auto script = std::filesystem::path(build::source_dir) / "scripts" / "report.py";
  std::string cmd = "python3 '" + script.string() + "'";
  for (const auto& p : a.pos) cmd += " '" + p + "'";
  std::string compare_json;
  if (a.has("--baseline")) {
    CompareOptions o;
    o.time_gate = false;
    o.allow_missing = true;
    const auto r = compare_results(load_results(a.get("--baseline")), load_results(a.pos.back()), o);
    compare_json = a.get("-o") + ".compare.json";
    std::ofstream(compare_json) << compare_to_json(r).dump(1) << "\n";
    cmd += " --compare '" + compare_json + "'";
  }
  cmd += " -o '" + a.get("-o") + "'";
  const int rc = std::system(cmd.c_str());
  if (!compare_json.empty()) std::filesystem::remove(compare_json);
  if (rc != 0) {
    std::fprintf(stderr, "memtrade report: the report script failed (%s)\n", cmd.c_str());
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
  if (a.has("--out")) std::ofstream(a.get("--out")) << j.dump(1) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
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
                          {"--quiet"}));
    if (cmd == "compare")
      return cmd_compare(Args(argc, argv, 2,
                              {"--time", "--memory-tolerance", "--error-ratio", "--error-floor", "--error-floor-u", "--alpha",
                               "--min-effect", "--markdown", "--json"},
                              {"--allow-missing"}));
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
