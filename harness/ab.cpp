#include "harness/ab.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace memtrade {

namespace {

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

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

AbResult run_ab(const AbOptions& o) {
  for (const auto* bin : {&o.baseline_bin, &o.candidate_bin})
    if (!std::filesystem::is_regular_file(*bin) || access(bin->c_str(), X_OK) != 0)
      throw Error("ab: '" + bin->string() + "' is not an executable file");
  if (o.runs < 1) throw Error("ab: --runs must be at least 1");
  check_env(o.baseline_env);
  check_env(o.candidate_env);
  const auto dir_a = o.out_dir / "baseline", dir_b = o.out_dir / "candidate";
  for (const auto& d : {dir_a, dir_b}) {
    std::filesystem::create_directories(d);
    for (const auto& f : std::filesystem::directory_iterator(d))  // runs of an earlier session must not mix in
      if (f.path().filename().string().rfind("run-", 0) == 0) std::filesystem::remove(f.path());
  }
  AbResult res;
  auto run_one = [&](bool candidate, const std::string& filter, int round) {
    auto& files = candidate ? res.candidate_files : res.baseline_files;
    char name[32];
    std::snprintf(name, sizeof name, "run-%02zu.json", files.size());
    const auto out = (candidate ? dir_b : dir_a) / name;
    std::string cmd = "env";
    for (const auto& kv : candidate ? o.candidate_env : o.baseline_env) cmd += " " + quoted(kv);
    cmd += " " + quoted((candidate ? o.candidate_bin : o.baseline_bin).string()) + " run --quiet --no-probe --out " +
           quoted(out.string());
    for (const auto& a : o.run_args) cmd += " " + quoted(a);
    if (!filter.empty()) cmd += " --filter " + quoted(filter);
    const auto t0 = std::chrono::steady_clock::now();
    const int status = std::system(cmd.c_str());
    const int rc = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    // 3: the run finished but recorded failed cases; they show up in the comparison.
    if (rc != 0 && rc != 3)
      throw Error("ab: the " + std::string(candidate ? "candidate" : "baseline") + " run failed (exit " +
                  std::to_string(rc) + "): " + cmd);
    files.push_back(out);
    if (o.verbose)
      std::printf("ab: round %d %-9s %s (%.1f s)\n", round, candidate ? "candidate" : "baseline", out.c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  };
  auto rounds = [&](const std::string& filter) {
    for (int i = 0; i < o.runs; ++i) {
      ++res.rounds;
      // ABBA: the first of a pair alternates, so a trend in the machine's speed hits both sides alike.
      const bool candidate_first = res.rounds % 2 == 0;
      run_one(candidate_first, filter, res.rounds);
      run_one(!candidate_first, filter, res.rounds);
    }
  };
  auto compare = [&] {
    std::vector<LoadedResults> a, b;
    for (const auto& f : res.baseline_files) a.push_back(load_results(f));
    for (const auto& f : res.candidate_files) b.push_back(load_results(f));
    res.compare = compare_runs(a, b, o.compare);
  };
  rounds(o.filter);
  compare();
  for (int retry = 0; retry < o.retries && !res.compare.unstable.empty(); ++retry) {
    if (o.verbose)
      std::printf("ab: %zu case(s) unstable; %d more rounds for them\n", res.compare.unstable.size(), o.runs);
    rounds(exact_names_pattern(res.compare.unstable));
    compare();
  }
  return res;
}

}  // namespace memtrade
