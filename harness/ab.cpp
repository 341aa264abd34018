#include "harness/ab.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "harness/lockstep.hpp"

namespace memtrade {

namespace {


void check_env(const std::vector<std::string>& env) {
  for (const auto& kv : env)
    if (kv.find('=') == std::string::npos || kv.front() == '=')
      throw Error("ab: an environment setting must be NAME=VALUE, got '" + kv + "'");
}

}  // namespace

std::string exact_names_pattern(const std::vector<std::string>& names) {
  std::string p = "^(";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i) p += '|';
    for (char ch : names[i]) {
      if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) p += '\\';
      p += ch;
    }
  }
  return p + ")$";
}

CompareResult confirm_time_regressions(CompareResult screen, const CompareResult& confirm, int confirm_rounds,
                                       double screen_alpha, double confirm_alpha) {
  auto g = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  const std::string rounds = std::to_string(confirm_rounds) + " fresh round(s)";
  int confirmed = 0;
  std::vector<std::pair<std::string, std::string>> kept;
  for (const auto& [id, name] : screen.time_regressions) {
    auto row = std::find_if(screen.rows.begin(), screen.rows.end(),
                            [&](const CompareRow& r) { return r.name == id && r.metric == "time"; });
    if (row == screen.rows.end()) continue;
    auto again = std::find_if(confirm.rows.begin(), confirm.rows.end(),
                              [&](const CompareRow& r) { return r.name == id && r.metric == "time"; });
    const std::string screened = "screening rounds (p < " + g(screen_alpha) + "): " + row->detail;
    if (again == confirm.rows.end()) {  // the fresh rounds have no time for it: the screen's verdict stands
      row->detail = "not timed in the confirmation rounds; " + screened;
      kept.emplace_back(id, name);
      continue;
    }
    row->baseline = again->baseline;
    row->current = again->current;
    row->change = again->change;
    if (again->regression) {
      ++confirmed;
      kept.emplace_back(id, name);
      row->detail = "confirmed by " + rounds + " (p < " + g(confirm_alpha) + "): " + again->detail + "; " + screened;
    } else {
      row->regression = false;
      row->verdict = again->verdict == "unstable" ? "unstable" : "slower";
      if (row->verdict == "unstable") screen.unstable.push_back(name);
      row->detail = "not confirmed by " + rounds + " (" + again->detail + "); " + screened;
    }
  }
  const auto flagged = screen.time_regressions.size();
  screen.time_regressions = kept;
  screen.regressions = static_cast<int>(std::count_if(screen.rows.begin(), screen.rows.end(),
                                                      [](const CompareRow& r) { return r.regression; }));
  if (flagged)
    screen.notes.push_back("time: " + std::to_string(flagged) + " case(s) slower in the screening rounds (p < " +
                           g(screen_alpha) + "), " + std::to_string(confirmed) + " confirmed by " + rounds +
                           " judged alone (p < " + g(confirm_alpha) + ")");
  return screen;
}

AbResult run_ab(const AbOptions& o) {
  for (const auto* bin : {&o.baseline_bin, &o.candidate_bin})
    if (!std::filesystem::is_regular_file(*bin) || access(bin->c_str(), X_OK) != 0)
      throw Error("ab: '" + bin->string() + "' is not an executable file");
  if (o.runs < 1) throw Error("ab: --runs must be at least 1");
  if (o.confirm_runs < 0) throw Error("ab: --confirm-runs must be at least 0");
  if (!(o.screen_alpha > 0 && o.screen_alpha <= 1)) throw Error("ab: --screen-alpha must be in (0, 1]");
  check_env(o.baseline_env);
  check_env(o.candidate_env);
  const auto dir_a = o.out_dir / "baseline", dir_b = o.out_dir / "candidate";
  for (const auto& d : {dir_a, dir_b}) {
    std::filesystem::create_directories(d);
    for (const auto& f : std::filesystem::directory_iterator(d))  // runs of an earlier session must not mix in
      if (f.path().filename().string().rfind("run-", 0) == 0) std::filesystem::remove(f.path());
  }
  AbResult res;
  // `env NAME=VALUE ... BIN run ARGS`: this side's settings, and no shell in between.
  auto command = [&](bool candidate, std::vector<std::string> run_args) {
    std::vector<std::string> args = {"env"};
    // Notes a run prints on stderr whatever --quiet says (OpenBLAS's narrower kernels) are the same in
    // every round of one side: its first round prints them, later rounds keep quiet. They stay in every
    // results file's context.
    if (res.rounds > 1) args.push_back("MEMTRADE_QUIET_NOTES=1");
    for (const auto& kv : candidate ? o.candidate_env : o.baseline_env) args.push_back(kv);
    args.push_back((candidate ? o.candidate_bin : o.baseline_bin).string());
    args.push_back("run");
    args.insert(args.end(), run_args.begin(), run_args.end());
    args.insert(args.end(), o.run_args.begin(), o.run_args.end());
    return args;
  };
  auto next_out = [&](bool candidate) {
    char name[32];
    std::snprintf(name, sizeof name, "run-%02zu.json", (candidate ? res.candidate_files : res.baseline_files).size());
    return (candidate ? dir_b : dir_a) / name;
  };
  auto with_filter = [](std::vector<std::string> args, const std::string& filter) {
    if (!filter.empty()) {
      args.push_back("--filter");
      args.push_back(filter);
    }
    return args;
  };
  auto check_exit = [&](bool candidate, int rc, const std::vector<std::string>& args) {
    // 3: the run finished but recorded failed cases; they show up in the comparison.
    if (rc == 0 || rc == 3) return;
    std::string cmd;
    for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + a;
    throw Error("ab: the " + std::string(candidate ? "candidate" : "baseline") + " run failed (exit " +
                std::to_string(rc) + "): " + cmd);
  };
  auto run_one = [&](bool candidate, const std::string& filter, int round) {
    const auto out = next_out(candidate);
    const auto args = command(candidate, with_filter({"--quiet", "--no-probe", "--out", out.string()}, filter));
    const auto t0 = std::chrono::steady_clock::now();
    check_exit(candidate, run_program(args), args);
    (candidate ? res.candidate_files : res.baseline_files).push_back(out);
    if (o.verbose)
      std::printf("ab: round %d %-9s %s (%.1f s)\n", round, candidate ? "candidate" : "baseline", out.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  };
  // Lockstep: both runs at once, each case timed by one right after the other (see lockstep.hpp).
  auto lockstep_round = [&](const std::string& filter, int round) {
    const auto out_a = next_out(false), out_b = next_out(true);
    const auto args_a = command(false, with_filter({"--quiet", "--no-probe", "--out", out_a.string()}, filter));
    const auto args_b = command(true, with_filter({"--quiet", "--no-probe", "--out", out_b.string()}, filter));
    auto listing = [&](bool candidate) {
      std::vector<std::string> names;
      std::istringstream in(capture_program(command(candidate, with_filter({"--list"}, filter))));
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) names.push_back(line);
      return names;
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto order_a = listing(false), order_b = listing(true);
    // Which build is started first alternates by round too. How the two processes are started leaves a
    // bias of its own: with identical builds, 4-bit matvecs that fit in L2 ran about 5% slower in one of
    // the two processes round after round (with the baseline always started first, the candidate was
    // slower for nf4 in 29 of 35 rounds; with the order alternated, the process started first was the
    // slower in 29 of 36 round-case pairs). A fixed order makes it a bias of every round, which more
    // rounds cannot remove; alternated, it is noise between rounds that the paired test allows for.
    LockstepChild a, b;
    if (round % 2 == 0) {
      b = start_lockstep_child(args_b, "candidate");
      a = start_lockstep_child(args_a, "baseline");
    } else {
      a = start_lockstep_child(args_a, "baseline");
      b = start_lockstep_child(args_b, "candidate");
    }
    a.order = std::move(order_a);
    b.order = std::move(order_b);
    int pairs = 0;
    try {
      // Which build goes first alternates by invocation and by round.
      pairs = drive_lockstep(a, b, [&](int i) { return (i + round) % 2 == 0; });
    } catch (...) {
      for (auto* c : {&a, &b})
        if (c->exit_status < 0) kill(c->pid, SIGKILL), waitpid(c->pid, nullptr, 0);
      throw;
    }
    check_exit(false, a.exit_status, args_a);
    check_exit(true, b.exit_status, args_b);
    res.baseline_files.push_back(out_a);
    res.candidate_files.push_back(out_b);
    if (o.verbose)
      std::printf("ab: round %d in lockstep: %s, %s (%d timed invocations paired, %.1f s)\n", round, out_a.c_str(), out_b.c_str(),
                  pairs, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  };
  auto rounds = [&](const std::string& filter, int count) {
    for (int i = 0; i < count; ++i) {
      ++res.rounds;
      if (o.lockstep) {
        lockstep_round(filter, res.rounds);
        continue;
      }
      // ABBA: the first of a pair alternates, so a trend in the machine's speed hits both sides alike.
      const bool candidate_first = res.rounds % 2 == 0;
      run_one(candidate_first, filter, res.rounds);
      run_one(!candidate_first, filter, res.rounds);
    }
  };
  // The runs from index `from` on, compared at level alpha.
  auto compare = [&](std::size_t from, double alpha) {
    std::vector<LoadedResults> a, b;
    for (std::size_t i = from; i < res.baseline_files.size(); ++i) a.push_back(load_results(res.baseline_files[i]));
    for (std::size_t i = from; i < res.candidate_files.size(); ++i) b.push_back(load_results(res.candidate_files[i]));
    CompareOptions co = o.compare;
    co.paired = o.lockstep;
    co.time_alpha = alpha;
    return compare_runs(a, b, co);
  };
  const bool two_stage = o.confirm_runs > 0 && o.compare.time_gate;  // report-only time: one stage at alpha
  const double screen_alpha = two_stage ? o.screen_alpha : o.compare.time_alpha;
  rounds(o.filter, o.runs);
  res.compare = compare(0, screen_alpha);
  for (int retry = 0; retry < o.retries && !res.compare.unstable.empty(); ++retry) {
    if (o.verbose)
      std::printf("ab: %zu case(s) unstable; %d more rounds for them\n", res.compare.unstable.size(), o.runs);
    rounds(exact_names_pattern(res.compare.unstable), o.runs);
    res.compare = compare(0, screen_alpha);
  }
  if (!two_stage || res.compare.time_regressions.empty()) return res;
  for (const auto& [id, name] : res.compare.time_regressions) res.suspects.push_back(name);
  if (o.verbose)
    std::printf("ab: %zu case(s) slower in the screening rounds (p < %g); %d fresh rounds for them alone\n",
                res.suspects.size(), screen_alpha, o.confirm_runs);
  const std::size_t from = res.baseline_files.size();
  rounds(exact_names_pattern(res.suspects), o.confirm_runs);
  res.confirm_rounds = o.confirm_runs;
  res.compare = confirm_time_regressions(std::move(res.compare), compare(from, o.compare.time_alpha), o.confirm_runs,
                                         screen_alpha, o.compare.time_alpha);
  return res;
}

}  // namespace memtrade
