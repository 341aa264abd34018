#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "harness/ab.hpp"
#include "harness/compare.hpp"
#include "test_util.hpp"

using namespace memtrade;

namespace {

LoadedResults sample(const std::string& machine = "cpu|test machine|2 cores") {
  LoadedResults r;
  r.path = "sample.json";
  r.context = Json{{"memtrade", {{"machine_class", {{"cpu", machine}}}}}};
  for (const char* name : {"gemm/n=64,dtype=fp32/openblas", "gemm/n=128,dtype=fp32/openblas"}) {
    Summary s;
    s.name = name;
    s.suite = s.technique = "gemm";
    s.impl = "openblas";
    s.backend = "cpu";
    s.status = "ok";
    s.counters = {{"peak_bytes", 49152}, {"peak_extra_bytes", 0}, {"peak_bytes_io", 49152},
                  {"max_abs_err", 1e-6}, {"rel_l2_err", 2e-7}, {"nan_count", 0}};
    for (int i = 0; i < 9; ++i) s.times_s.push_back(1e-3 * (1 + 0.01 * ((i * 7) % 5)));
    r.cases.push_back(s);
  }
  return r;
}

// k independent runs of one build: each run's times are the sample's, shifted by a run-level factor
// (what varies between processes) times `factor` (a real slowdown).
std::vector<LoadedResults> runs(int k, double factor, unsigned seed = 1) {
  std::vector<LoadedResults> out;
  for (int i = 0; i < k; ++i) {
    auto r = sample();
    r.path = "run-" + std::to_string(seed) + "-" + std::to_string(i) + ".json";
    const double run_shift = 1 + 0.02 * (((i + 3 * static_cast<int>(seed)) * 5) % 7) / 6.0;  // 0..2% per run
    for (auto& c : r.cases)
      for (auto& t : c.times_s) t *= run_shift * factor;
    out.push_back(r);
  }
  return out;
}

const CompareRow* row_of(const CompareResult& r, const std::string& name, const std::string& metric) {
  for (const auto& row : r.rows)
    if (row.name == name && row.metric == metric) return &row;
  return nullptr;
}

int regressions_named(const CompareResult& r, const std::string& name, const std::string& metric) {
  int n = 0;
  for (const auto& row : r.rows) n += row.regression && row.name == name && row.metric == metric;
  return n;
}

}  // namespace

TEST(Compare, IdenticalResultsAreClean) {
  const auto r = compare_results(sample(), sample(), {});
  EXPECT_EQ(r.regressions, 0);
  EXPECT_GT(r.checks, 10);
  EXPECT_NE(format_compare(r, false).find("clean"), std::string::npos);
}

TEST(Compare, MarkdownPutsTheSummaryAndRegressionsFirstAndFoldsImprovements) {
  auto cur = sample();
  cur.cases[1].counters["peak_bytes"] += 1;  // a regression
  cur.cases[0].counters["peak_bytes"] -= 1;  // an improvement
  const auto r = compare_results(sample(), cur, {});
  ASSERT_EQ(r.regressions, 1);
  const std::string md = format_compare(r, true);
  EXPECT_EQ(md.rfind("**memtrade compare**: 1 regression(s) in ", 0), 0u) << md;
  const auto heading = md.find("### Regressions (1)");
  const auto regression = md.find("| gemm/n=128,dtype=fp32/openblas | peak_bytes |");
  const auto fold = md.find("<details><summary>Improvements (1)</summary>");
  const auto improvement = md.find("| gemm/n=64,dtype=fp32/openblas | peak_bytes |");
  ASSERT_NE(heading, std::string::npos) << md;
  ASSERT_NE(fold, std::string::npos) << md;
  EXPECT_LT(heading, regression);
  EXPECT_LT(regression, fold);
  EXPECT_LT(fold, improvement);
  EXPECT_NE(md.find("**regression**"), std::string::npos) << md;
  // Nothing to report: the summary says clean and the regressions section says none.
  const std::string clean = format_compare(compare_results(sample(), sample(), {}), true);
  EXPECT_NE(clean.find(": clean"), std::string::npos) << clean;
  EXPECT_NE(clean.find("### Regressions (0)\n\nNone."), std::string::npos) << clean;
  EXPECT_EQ(clean.find("<details>"), std::string::npos) << clean;
}

TEST(Compare, OneByteOfMemoryGrowthIsARegression) {
  auto cur = sample();
  cur.cases[1].counters["peak_bytes"] += 1;
  const auto r = compare_results(sample(), cur, {});
  EXPECT_EQ(r.regressions, 1);
  EXPECT_EQ(regressions_named(r, "gemm/n=128,dtype=fp32/openblas", "peak_bytes"), 1);
  EXPECT_NE(format_compare(r, false).find("gemm/n=128,dtype=fp32/openblas"), std::string::npos);
  CompareOptions tolerant;
  tolerant.memory_tolerance_bytes = 1;
  EXPECT_EQ(compare_results(sample(), cur, tolerant).regressions, 0);
  // Shrinking is an improvement, not a regression.
  cur.cases[1].counters["peak_bytes"] -= 2;
  EXPECT_EQ(compare_results(sample(), cur, {}).regressions, 0);
}

TEST(Compare, DoubledTimesOverFiveRunsAreARegressionOnlyWhenTimeGates) {
  const auto gated = compare_runs(runs(5, 1.0), runs(5, 2.0, 2), {});
  EXPECT_EQ(regressions_named(gated, "gemm/n=64,dtype=fp32/openblas", "time"), 1);
  EXPECT_EQ(gated.regressions, 2);  // both cases slowed
  EXPECT_EQ(gated.current_runs, 5);
  CompareOptions report_only;
  report_only.time_gate = false;
  const auto r = compare_runs(runs(5, 1.0), runs(5, 2.0, 2), report_only);
  EXPECT_EQ(r.regressions, 0);
  EXPECT_EQ(row_of(r, "gemm/n=64,dtype=fp32/openblas", "time")->verdict, "slower");
  // Faster is listed, never a regression.
  EXPECT_EQ(compare_runs(runs(5, 2.0), runs(5, 1.0, 2), {}).regressions, 0);
}

TEST(Compare, IdenticalBuildsOverFiveRunsAreClean) {
  EXPECT_EQ(compare_runs(runs(5, 1.0), runs(5, 1.0, 2), {}).regressions, 0);
}

TEST(Compare, ASlowdownBelowTheMinimumEffectIsNotARegression) {
  // 4% slower in every run: significant (the runs separate completely) but under the 5% effect.
  EXPECT_EQ(compare_runs(runs(5, 1.0), runs(5, 1.04, 1), {}).regressions, 0);
  EXPECT_EQ(compare_runs(runs(5, 1.0), runs(5, 1.10, 1), {}).regressions, 2);
  // A per-case minimum effect.
  CompareOptions o;
  o.min_effect_for = {{"n=64,", 0.2}};
  const auto r = compare_runs(runs(5, 1.0), runs(5, 1.10, 1), o);
  EXPECT_EQ(regressions_named(r, "gemm/n=64,dtype=fp32/openblas", "time"), 0);
  EXPECT_EQ(regressions_named(r, "gemm/n=128,dtype=fp32/openblas", "time"), 1);
  o.min_effect_for = {{"([", 0.2}};
  EXPECT_THROW(compare_runs(runs(5, 1.0), runs(5, 1.10, 1), o), Error);
}

TEST(Compare, OneRunPerSideListsTimeButNeverGatesIt) {
  // The repetitions inside one process are not independent samples of a build's speed.
  auto cur = sample();
  for (auto& t : cur.cases[0].times_s) t *= 2;
  const auto r = compare_results(sample(), cur, {});
  EXPECT_EQ(r.regressions, 0);
  EXPECT_EQ(row_of(r, "gemm/n=64,dtype=fp32/openblas", "time")->verdict, "slower");
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes[0].find("not gated"), std::string::npos) << r.notes[0];
  // Three runs a side cannot reach p < 0.01 either (smallest p = 0.1).
  EXPECT_EQ(compare_runs(runs(3, 1.0), runs(3, 2.0, 2), {}).regressions, 0);
}

TEST(Compare, TimeIsNotComparedAcrossMachineClasses) {
  auto cur = runs(5, 3.0, 2);
  for (auto& r : cur) r.context["memtrade"]["machine_class"]["cpu"] = "cpu|another machine|64 cores";
  const auto r = compare_runs(runs(5, 1.0), cur, {});
  EXPECT_EQ(r.regressions, 0);
  EXPECT_FALSE(r.same_machine_class);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes[0].find("machine class"), std::string::npos);
}

TEST(Compare, TimesFromDifferentCpuSettingsCarryANote) {
  auto base = runs(5, 1.0), cur = runs(5, 1.0, 2);
  for (auto& r : base) r.context["memtrade"]["huge_pages"] = "off";
  for (auto& r : cur) r.context["memtrade"]["huge_pages"] = "madvise";
  for (auto& r : base) r.context["memtrade"]["simd_target"] = "AVX3";
  for (auto& r : cur) r.context["memtrade"]["simd_target"] = "AVX3";
  const auto r = compare_runs(base, cur, {});
  EXPECT_EQ(r.regressions, 0);
  const auto note = std::find_if(r.notes.begin(), r.notes.end(),
                                 [](const std::string& n) { return n.find("different settings") != std::string::npos; });
  ASSERT_NE(note, r.notes.end());
  EXPECT_NE(note->find("huge_pages 'off' -> 'madvise'"), std::string::npos) << *note;
  EXPECT_EQ(note->find("simd_target"), std::string::npos) << *note;  // the same on both sides
  // Same settings (or none recorded): no note.
  const auto same = compare_runs(runs(5, 1.0), runs(5, 1.0, 2), {});
  for (const auto& n : same.notes) EXPECT_EQ(n.find("different settings"), std::string::npos) << n;
}

TEST(Compare, SpreadOrPreemptedRunsAreUnstableNotRegressions) {
  CompareOptions med;
  med.time_stat = CompareOptions::RunStat::median;
  // By the median, a run whose repetitions spread wider than max_cv is left out; by the minimum (the
  // default) the slow repetition does not matter.
  Summary s = sample().cases[0];
  EXPECT_TRUE(summarize_run(s, med).stable);
  s.times_s[0] *= 4;
  const RunTime spread = summarize_run(s, med);
  EXPECT_FALSE(spread.stable);
  EXPECT_NE(spread.why.find("spread"), std::string::npos);
  EXPECT_TRUE(summarize_run(s, {}).stable);
  // A CPU repetition whose process got half the CPU of the best one was pre-empted: by the median the run
  // is unstable; by the minimum only when that repetition is the fastest (every repetition was).
  s = sample().cases[0];
  s.cpu_times_s = s.times_s;
  EXPECT_TRUE(summarize_run(s, med).stable);
  s.cpu_times_s[2] = 0.3 * s.times_s[2];
  const RunTime pre = summarize_run(s, med);
  EXPECT_FALSE(pre.stable);
  EXPECT_NE(pre.why.find("pre-empted"), std::string::npos);
  EXPECT_TRUE(summarize_run(s, {}).stable);
  const auto fastest = std::min_element(s.times_s.begin(), s.times_s.end()) - s.times_s.begin();
  s.cpu_times_s[fastest] = 0.3 * s.times_s[fastest];
  EXPECT_FALSE(summarize_run(s, {}).stable);

  // Two of five candidate runs unstable: the three left cannot reach p < 0.01 -> unstable, not a
  // regression, and named for a retry.
  auto cur = runs(5, 2.0, 2);
  for (int i : {0, 1}) cur[i].cases[0].times_s[0] *= 10;
  const auto r = compare_runs(runs(5, 1.0), cur, med);
  EXPECT_EQ(regressions_named(r, "gemm/n=64,dtype=fp32/openblas", "time"), 0);
  EXPECT_EQ(row_of(r, "gemm/n=64,dtype=fp32/openblas", "time")->verdict, "unstable");
  ASSERT_EQ(r.unstable.size(), 1u);
  EXPECT_EQ(r.unstable[0], "gemm/n=64,dtype=fp32/openblas");
  // The other case is unaffected.
  EXPECT_EQ(regressions_named(r, "gemm/n=128,dtype=fp32/openblas", "time"), 1);
}

TEST(Compare, MemoryMustBeEqualInEveryCurrentRun) {
  auto cur = runs(3, 1.0, 2);
  cur[2].cases[1].counters["peak_bytes"] += 64;
  const auto r = compare_runs(runs(3, 1.0), cur, {});
  EXPECT_EQ(regressions_named(r, "gemm/n=128,dtype=fp32/openblas", "peak_bytes"), 1);
  EXPECT_NE(row_of(r, "gemm/n=128,dtype=fp32/openblas", "peak_bytes")->detail.find("not repeatable"), std::string::npos);
}

TEST(Compare, UntrackedBytesGrowthBeyondTheAllowanceIsARegression) {
  auto base = sample(), cur = sample();
  base.cases[0].counters["untracked_bytes"] = 524296;  // OpenBLAS's threaded buffer
  cur.cases[0].counters["untracked_bytes"] = 524296 + 131072;
  EXPECT_EQ(compare_results(base, cur, {}).regressions, 0);  // within a quarter of the baseline
  base.cases[1].counters["untracked_bytes"] = 0;
  cur.cases[1].counters["untracked_bytes"] = 65537;  // one byte past the 64 KiB allowance
  EXPECT_EQ(regressions_named(compare_results(base, cur, {}), "gemm/n=128,dtype=fp32/openblas", "untracked_bytes"), 1);
  cur.cases[1].counters["untracked_bytes"] = 65536;
  cur.cases[0].counters["untracked_bytes"] = 524296 + 2 * 1048576;
  EXPECT_EQ(regressions_named(compare_results(base, cur, {}), "gemm/n=64,dtype=fp32/openblas", "untracked_bytes"), 1);
  CompareOptions loose;
  loose.untracked_allowance_bytes = 4 << 20;
  EXPECT_EQ(compare_results(base, cur, loose).regressions, 0);
  // Shrinking is "improved" only beyond the same allowance: 32 B less is "ok".
  cur.cases[1].counters["untracked_bytes"] = 0;
  base.cases[1].counters["untracked_bytes"] = 32;
  EXPECT_EQ(row_of(compare_results(base, cur, {}), "gemm/n=128,dtype=fp32/openblas", "untracked_bytes")->verdict, "ok");
  base.cases[1].counters["untracked_bytes"] = 65537;
  EXPECT_EQ(row_of(compare_results(base, cur, {}), "gemm/n=128,dtype=fp32/openblas", "untracked_bytes")->verdict, "improved");
}

TEST(Compare, CountersTheBaselineLacksAreListedAsNew) {
  auto cur = sample();
  cur.cases[0].counters["peak_bytes_kv"] = 4096;
  const auto r = compare_results(sample(), cur, {});
  EXPECT_EQ(r.regressions, 0);
  ASSERT_NE(row_of(r, "gemm/n=64,dtype=fp32/openblas", "peak_bytes_kv"), nullptr);
  EXPECT_EQ(row_of(r, "gemm/n=64,dtype=fp32/openblas", "peak_bytes_kv")->verdict, "new_metric");
  // Listed, not counted among the checks.
  const auto same = compare_results(sample(), sample(), {});
  EXPECT_EQ(r.checks, same.checks);
  EXPECT_EQ(r.listed, same.listed + 1);
  EXPECT_NE(format_compare(r, false).find(" checks (time gates; 1 baseline and 1 current run(s)), " +
                                          std::to_string(r.listed) + " listed, not compared: clean"),
            std::string::npos)
      << format_compare(r, false);
}

TEST(Compare, ErrorGrowthNeedsRatioAndAFloorInUnitRoundoffs) {
  auto cur = sample();
  cur.cases[0].counters["rel_l2_err"] = 3.9e-7;  // 1.95x: under the ratio
  EXPECT_EQ(compare_results(sample(), cur, {}).regressions, 0);
  cur.cases[0].counters["rel_l2_err"] = 5e-7;  // 2.5x and +3e-7, above 2 fp32 unit roundoffs (1.2e-7)
  EXPECT_EQ(regressions_named(compare_results(sample(), cur, {}), "gemm/n=64,dtype=fp32/openblas", "rel_l2_err"), 1);
  // The same growth on a bf16 case is below 2 bf16 unit roundoffs (7.8e-3).
  auto base16 = sample(), cur16 = sample();
  base16.cases[0].params = cur16.cases[0].params = Json{{"n", 64}, {"dtype", "bf16"}};
  cur16.cases[0].counters["rel_l2_err"] = 5e-7;
  EXPECT_EQ(compare_results(base16, cur16, {}).regressions, 0);
  cur16.cases[0].counters["rel_l2_err"] = 9e-3;
  EXPECT_EQ(compare_results(base16, cur16, {}).regressions, 1);
  // max_abs_err depends on the summation order: a 10x change is listed, not a regression.
  cur = sample();
  cur.cases[0].counters["max_abs_err"] = 1e-5;
  auto r = compare_results(sample(), cur, {});
  EXPECT_EQ(r.regressions, 0);
  bool listed = false;
  for (const auto& row : r.rows) listed = listed || (row.metric == "max_abs_err" && row.verdict == "changed");
  EXPECT_TRUE(listed);
  cur = sample();
  cur.cases[0].counters["rel_l2_err"] = std::nan("");
  r = compare_results(sample(), cur, {});
  EXPECT_EQ(regressions_named(r, "gemm/n=64,dtype=fp32/openblas", "rel_l2_err"), 1);
  cur = sample();
  cur.cases[0].counters["nan_count"] = 3;
  EXPECT_EQ(compare_results(sample(), cur, {}).regressions, 1);
}

TEST(Compare, AnErrorVerdictTurningBadIsARegression) {
  auto base = sample(), cur = sample();
  base.cases[0].counters["error_ok"] = 1;
  cur.cases[0].counters["error_ok"] = 0;
  cur.cases[0].detail = "error rule failed: max_abs 3e-3 vs bound 1e-3";
  auto r = compare_results(base, cur, {});
  ASSERT_EQ(regressions_named(r, "gemm/n=64,dtype=fp32/openblas", "error_ok"), 1);
  // A baseline without verdicts (older files): a failing verdict still is one.
  r = compare_results(sample(), cur, {});
  EXPECT_EQ(regressions_named(r, "gemm/n=64,dtype=fp32/openblas", "error_ok"), 1);
  // Failing in both: listed, not a new regression.
  base.cases[0].counters["error_ok"] = 0;
  EXPECT_EQ(compare_results(base, cur, {}).regressions, 0);
}

TEST(Compare, DeclaredMetricsAreGatedByTheirRule) {
  auto base = sample(), cur = sample();
  cur.context["memtrade"]["suites"] = Json::parse(R"({"gemm": {"metrics": [
      {"name": "val_loss", "better": "lower", "gate": "ratio", "ratio": 1.02, "floor": 0},
      {"name": "diverged", "better": "lower", "gate": "zero"},
      {"name": "weight_bytes", "better": "lower", "gate": "exact"},
      {"name": "tokens_per_s", "better": "higher", "gate": "time"},
      {"name": "curve_*", "better": "-", "gate": "report"}]}})");
  for (auto* r : {&base, &cur})
    r->cases[0].counters.insert({{"val_loss", 2.0}, {"diverged", 0}, {"weight_bytes", 1000}, {"tokens_per_s", 500},
                                 {"curve_00", 3.0}});
  EXPECT_EQ(compare_results(base, cur, {}).regressions, 0);
  const std::string n = "gemm/n=64,dtype=fp32/openblas";
  cur.cases[0].counters["val_loss"] = 2.03;  // +1.5%: within 1.02x
  EXPECT_EQ(compare_results(base, cur, {}).regressions, 0);
  cur.cases[0].counters["val_loss"] = 4.0;  // a doubled loss
  EXPECT_EQ(regressions_named(compare_results(base, cur, {}), n, "val_loss"), 1);
  cur.cases[0].counters["val_loss"] = 2.0;
  cur.cases[0].counters["diverged"] = 1;
  EXPECT_EQ(regressions_named(compare_results(base, cur, {}), n, "diverged"), 1);
  cur.cases[0].counters["diverged"] = 0;
  cur.cases[0].counters["weight_bytes"] = 1001;  // one byte more
  EXPECT_EQ(regressions_named(compare_results(base, cur, {}), n, "weight_bytes"), 1);
  cur.cases[0].counters["weight_bytes"] = 999;  // fewer: fine
  cur.cases[0].counters["tokens_per_s"] = 100;  // throughput is timing: listed only
  cur.cases[0].counters["curve_00"] = 30;
  EXPECT_EQ(compare_results(base, cur, {}).regressions, 0);
  cur.cases[0].counters.erase("val_loss");  // a gated metric that disappeared
  EXPECT_EQ(regressions_named(compare_results(base, cur, {}), n, "val_loss"), 1);
}

TEST(Compare, MissingNewAndStatusChangedCasesAreListed) {
  auto cur = sample();
  cur.cases.pop_back();
  Summary extra = sample().cases[0];
  extra.name = "gemm/n=256,dtype=fp32/openblas";
  cur.cases.push_back(extra);
  auto r = compare_results(sample(), cur, {});
  EXPECT_EQ(r.regressions, 1);  // the missing case
  bool saw_new = false, saw_missing = false;
  for (const auto& row : r.rows) {
    saw_new |= row.verdict == "new";
    saw_missing |= row.verdict == "missing";
  }
  EXPECT_TRUE(saw_new && saw_missing);
  CompareOptions allow;
  allow.allow_missing = true;
  EXPECT_EQ(compare_results(sample(), cur, allow).regressions, 0);

  cur = sample();
  cur.cases[0].status = "oom";
  cur.cases[0].detail = "out of memory";
  r = compare_results(sample(), cur, {});
  EXPECT_EQ(regressions_named(r, "gemm/n=64,dtype=fp32/openblas", "status"), 1);
  // oom -> ok is a change, not a regression.
  EXPECT_EQ(compare_results(cur, sample(), {}).regressions, 0);
}

TEST(Compare, EveryRepetitionEntryIsRead) {
  const auto path = test::scratch_dir() / "reps.json";
  // Three repetition entries of one case: counters differ (as Google Benchmark's own do); the median
  // is kept; a null in any entry stays NaN; cpu_time is read per repetition.
  std::ofstream(path) << R"({"benchmarks": [
    {"name": "a", "run_type": "iteration", "real_time": 10, "cpu_time": 20, "time_unit": "ns", "x_per_s": 5, "y": 1},
    {"name": "a", "run_type": "iteration", "real_time": 12, "cpu_time": 22, "time_unit": "ns", "x_per_s": 9, "y": null},
    {"name": "a", "run_type": "iteration", "real_time": 11, "cpu_time": 21, "time_unit": "ns", "x_per_s": 7, "y": 1},
    {"name": "a_median", "run_type": "aggregate", "real_time": 11, "time_unit": "ns", "x_per_s": 100}]})";
  const auto r = load_results(path);
  ASSERT_EQ(r.cases.size(), 1u);
  EXPECT_EQ(r.cases[0].counters.at("x_per_s"), 7);
  EXPECT_TRUE(std::isnan(r.cases[0].counters.at("y")));
  ASSERT_EQ(r.cases[0].cpu_times_s.size(), 3u);
  EXPECT_DOUBLE_EQ(r.cases[0].cpu_times_s[1], 22e-9);
}

TEST(Compare, UnreadableFilesAreResultsErrorsNamingTheFile) {
  const auto dir = test::scratch_dir();
  const auto trunc = dir / "memtrade_truncated.json";
  std::ofstream(trunc) << R"({"context": {}, "benchmarks": [{"name": "a", "real_ti)";
  try {
    load_results(trunc);
    FAIL();
  } catch (const ResultsError& e) {
    EXPECT_NE(std::string(e.what()).find("memtrade_truncated.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
  }
  const auto nolist = dir / "memtrade_nolist.json";
  std::ofstream(nolist) << R"({"context": {}})";
  EXPECT_THROW(load_results(nolist), ResultsError);
  EXPECT_THROW(load_results(dir / "memtrade_does_not_exist.json"), ResultsError);
  const auto badtime = dir / "memtrade_badtime.json";
  std::ofstream(badtime) << R"({"benchmarks": [{"name": "a", "real_time": "fast", "time_unit": "ns"}]})";
  EXPECT_THROW(load_results(badtime), ResultsError);
}

TEST(Compare, ADifferentDispatchChoiceIsNotComparedNotARegression) {
  auto base = sample(), cur = sample();
  base.cases[0].counters["choice_flash"] = 0;
  cur.cases[0].counters["choice_flash"] = 1;
  cur.cases[0].counters["peak_bytes"] += 4096;  // the other implementation's memory
  const auto r = compare_results(base, cur, {});
  EXPECT_EQ(r.regressions, 0);
  bool listed = false;
  for (const auto& row : r.rows) listed |= row.metric == "choice_flash" && row.verdict == "not_compared";
  EXPECT_TRUE(listed);
  cur.cases[0].counters["choice_flash"] = 0;  // same choice: the growth counts again
  EXPECT_EQ(compare_results(base, cur, {}).regressions, 1);
}

TEST(Compare, AClaimLeavingReproducedIsARegressionUnlessItsDataChanged) {
  auto with_claim = [](const std::string& verdict, const Json& spec) {
    auto r = sample();
    r.claims = Json::array({Json{{"id", "int4-mmlu"}, {"verdict", verdict}, {"measured", "m"}, {"note", "n"},
                                 {"spec", spec}}});
    return r;
  };
  const Json spec = {{"id", "int4-mmlu"}, {"band", {0.005, 0.01}}};
  auto r = compare_results(with_claim("reproduced", spec), with_claim("reproduced", spec), {});
  EXPECT_EQ(r.regressions, 0);
  r = compare_results(with_claim("reproduced", spec), with_claim("inconclusive", spec), {});
  EXPECT_EQ(regressions_named(r, "claim/int4-mmlu", "verdict"), 1);
  // The claim's suite entry changed (a new band): listed, not gated.
  Json wider = spec;
  wider["band"] = {0.0, 0.02};
  r = compare_results(with_claim("reproduced", spec), with_claim("inconclusive", wider), {});
  EXPECT_EQ(r.regressions, 0);
  EXPECT_EQ(row_of(r, "claim/int4-mmlu", "verdict")->verdict, "verdict_changed");
  // Other changes are listed; an error verdict always gates.
  r = compare_results(with_claim("not_reproduced", spec), with_claim("inconclusive", spec), {});
  EXPECT_EQ(r.regressions, 0);
  r = compare_results(with_claim("not_reproduced", spec), with_claim("error", spec), {});
  EXPECT_EQ(regressions_named(r, "claim/int4-mmlu", "verdict"), 1);
  // A claim gone from the current results is missing; a new one is listed (an error one gates).
  r = compare_results(with_claim("reproduced", spec), sample(), {});
  EXPECT_EQ(regressions_named(r, "claim/int4-mmlu", "verdict"), 1);
  r = compare_results(sample(), with_claim("error", spec), {});
  EXPECT_EQ(regressions_named(r, "claim/int4-mmlu", "verdict"), 1);
  r = compare_results(sample(), with_claim("reproduced", spec), {});
  EXPECT_EQ(r.regressions, 0);
}

TEST(Compare, PairedRoundsCancelTheMachinesDriftBetweenRounds) {
  // Seven rounds; the machine's speed drifts by up to 30% between rounds, equally for both builds of a
  // round (lockstep). The candidate is 8% slower in every round.
  const double drift[] = {1.0, 1.3, 0.95, 1.2, 1.05, 1.28, 0.9};
  std::vector<LoadedResults> base, cur;
  for (int i = 0; i < 7; ++i) {
    auto a = sample(), b = sample();
    a.path = "baseline/run-" + std::to_string(i) + ".json";
    b.path = "candidate/run-" + std::to_string(i) + ".json";
    for (auto& c : a.cases)
      for (auto& t : c.times_s) t *= drift[i];
    for (auto& c : b.cases)
      for (auto& t : c.times_s) t *= drift[i] * 1.08;
    base.push_back(a);
    cur.push_back(b);
  }
  const std::string name = "gemm/n=64,dtype=fp32/openblas";
  CompareOptions paired;
  paired.paired = true;
  const auto r = compare_runs(base, cur, paired);
  EXPECT_EQ(regressions_named(r, name, "time"), 1);
  ASSERT_NE(row_of(r, name, "time"), nullptr);
  EXPECT_NE(row_of(r, name, "time")->detail.find("median of 7 paired rounds"), std::string::npos)
      << row_of(r, name, "time")->detail;
  EXPECT_EQ(row_of(r, name, "time")->change, "+8.0%");
  // Unpaired, the same runs overlap: no verdict.
  EXPECT_EQ(regressions_named(compare_runs(base, cur, {}), name, "time"), 0);
  // Identical builds under the same drift: clean.
  EXPECT_EQ(compare_runs(base, base, paired).regressions, 0);
  // A round with an unstable half drops the whole pair: 6 pairs cannot reach p < 0.01.
  cur[3].cases[0].times_s[0] *= 10;
  paired.time_stat = CompareOptions::RunStat::median;  // (by the minimum one slow repetition is no instability)
  const auto r6 = compare_runs(base, cur, paired);
  EXPECT_EQ(regressions_named(r6, name, "time"), 0);
  EXPECT_EQ(row_of(r6, name, "time")->verdict, "unstable");
}

TEST(Compare, RunTimeIsTheFastestRepetitionUnlessTheMedianIsAsked) {
  // A burst of interference slows six of nine repetitions by 40%: the median moves, the minimum does not.
  Summary s = sample().cases[0];
  const double fastest = *std::min_element(s.times_s.begin(), s.times_s.end());
  for (int i = 3; i < 9; ++i) s.times_s[i] *= 1.4;
  EXPECT_EQ(summarize_run(s, {}).value, fastest);
  CompareOptions med;
  med.time_stat = CompareOptions::RunStat::median;
  EXPECT_GT(summarize_run(s, med).value, 1.3 * fastest);
}

namespace {

// Paired rounds of the sample: round i's two halves share the machine's drift; `slow(case, round)` is
// the candidate's factor.
template <class Slow>
std::pair<std::vector<LoadedResults>, std::vector<LoadedResults>> paired_rounds(int k, Slow slow, int first = 0) {
  std::vector<LoadedResults> base, cur;
  for (int i = first; i < first + k; ++i) {
    auto a = sample(), b = sample();
    a.path = "baseline/run-" + std::to_string(i) + ".json";
    b.path = "candidate/run-" + std::to_string(i) + ".json";
    const double drift = 1 + 0.1 * ((i * 3) % 7) / 6.0;
    for (std::size_t c = 0; c < a.cases.size(); ++c) {
      for (auto& t : a.cases[c].times_s) t *= drift;
      for (auto& t : b.cases[c].times_s) t *= drift * slow(c, i);
    }
    base.push_back(a);
    cur.push_back(b);
  }
  return {base, cur};
}

}  // namespace

TEST(Ab, ARegressionStandsOnlyWhenTheFreshRoundsFlagItToo) {
  const std::string c0 = "gemm/n=64,dtype=fp32/openblas", c1 = "gemm/n=128,dtype=fp32/openblas";
  CompareOptions o;
  o.paired = true;
  o.time_alpha = 0.05;
  // Screening: both cases 8% slower in all 7 rounds. Confirmation (14 fresh rounds): only c0 still is.
  auto [sb, sc] = paired_rounds(7, [](std::size_t, int) { return 1.08; });
  const auto screen = compare_runs(sb, sc, o);
  ASSERT_EQ(screen.regressions, 2);
  ASSERT_EQ(screen.time_regressions.size(), 2u);
  EXPECT_EQ(screen.time_regressions[0].second, c0);  // record names, for run --filter
  auto [cb, cc] = paired_rounds(14, [](std::size_t c, int) { return c == 0 ? 1.08 : 1.0; }, 7);
  o.time_alpha = 0.01;
  const auto confirm = compare_runs(cb, cc, o);
  const auto r = confirm_time_regressions(screen, confirm, 14, 0.05, 0.01);
  EXPECT_EQ(r.regressions, 1);
  ASSERT_EQ(r.time_regressions.size(), 1u);
  EXPECT_EQ(r.time_regressions[0].first, c0);
  EXPECT_EQ(regressions_named(r, c0, "time"), 1);
  EXPECT_NE(row_of(r, c0, "time")->detail.find("confirmed by 14 fresh round(s)"), std::string::npos);
  EXPECT_NE(row_of(r, c0, "time")->detail.find("median of 14 paired rounds"), std::string::npos);
  EXPECT_EQ(row_of(r, c1, "time")->verdict, "slower");
  EXPECT_NE(row_of(r, c1, "time")->detail.find("not confirmed"), std::string::npos);
  EXPECT_EQ(row_of(r, c1, "time")->change, "+0.0%");  // the fresh rounds' figure
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes.back().find("2 case(s) slower in the screening rounds"), std::string::npos) << r.notes.back();
  EXPECT_NE(r.notes.back().find("1 confirmed"), std::string::npos) << r.notes.back();
  // Fresh rounds with no stable run of c0 (every repetition of every candidate run pre-empted) leave it
  // unstable, not a regression; a suspect the fresh rounds did not time keeps the screen's verdict.
  auto pre_empted = cc;
  for (auto& run : pre_empted) {
    auto& s = run.cases[0];
    s.cpu_times_s.assign(s.times_s.size(), 0.0);
    for (std::size_t i = 0; i < s.times_s.size(); ++i) s.cpu_times_s[i] = i == 0 ? 1e-6 * s.times_s[i] : s.times_s[i];
  }
  const auto u = confirm_time_regressions(screen, compare_runs(cb, pre_empted, o), 14, 0.05, 0.01);
  EXPECT_EQ(row_of(u, c0, "time")->verdict, "unstable") << row_of(u, c0, "time")->detail;
  EXPECT_FALSE(row_of(u, c0, "time")->regression);
  EXPECT_NE(std::find(u.unstable.begin(), u.unstable.end(), c0), u.unstable.end());
  auto only_c1 = cc;
  for (auto* side : {&cb, &only_c1})
    for (auto& run : *side) run.cases.erase(run.cases.begin());
  const auto m = confirm_time_regressions(screen, compare_runs(cb, only_c1, o), 14, 0.05, 0.01);
  EXPECT_EQ(regressions_named(m, c0, "time"), 1);
  EXPECT_NE(row_of(m, c0, "time")->detail.find("not timed in the confirmation rounds"), std::string::npos);
}

TEST(Ab, TwoStageGateOnGeneratedRoundsKeepsFalseAlarmsBelowTheProductOfTheLevels) {
  // Rounds whose candidate/baseline ratio is log-normal with a 5% spread (above the 3.6% median pair
  // spread measured on the quick kernel suites), the candidate 1.00x (every flag a false alarm), 1.10x
  // or 1.25x (every flag a detection). The gate: 7 screening rounds at 0.05, 14 fresh rounds at 0.01,
  // a 5% minimum effect, through compare_runs and confirm_time_regressions.
  std::mt19937_64 rng(12345);
  std::normal_distribution<double> noise(0, 0.05);
  auto stage = [&](int k, double factor, double alpha, int first) {
    std::vector<LoadedResults> base, cur;
    for (int i = 0; i < k; ++i) {
      LoadedResults a = sample(), b = sample();
      a.path = "b" + std::to_string(first + i);
      b.path = "c" + std::to_string(first + i);
      a.cases.resize(1);
      b.cases.resize(1);
      const double ratio = factor * std::exp(noise(rng));
      for (auto& t : b.cases[0].times_s) t *= ratio;
      base.push_back(std::move(a));
      cur.push_back(std::move(b));
    }
    CompareOptions o;
    o.paired = true;
    o.time_alpha = alpha;
    return compare_runs(base, cur, o);
  };
  const int trials = 4000;
  for (double factor : {1.0, 1.10, 1.25}) {
    int two_stage = 0, one_stage = 0, screened = 0;
    for (int t = 0; t < trials; ++t) {
      const auto screen = stage(7, factor, 0.05, 0);
      one_stage += stage(7, factor, 0.01, 100).regressions;  // the single-stage gate, on rounds of its own
      if (screen.regressions == 0) continue;
      ++screened;
      two_stage += confirm_time_regressions(screen, stage(14, factor, 0.01, 7), 14, 0.05, 0.01).regressions;
    }
    SCOPED_TRACE(testing::Message() << factor << "x: screened " << screened << ", two-stage " << two_stage
                                    << ", one stage at 0.01 " << one_stage << " of " << trials);
    if (factor == 1.0) {
      // At most 0.05 x 0.01 per case by construction: 2 expected in 4000. Confirming on the screening's
      // own rounds would make it the screen's rate.
      EXPECT_LE(two_stage, 8);
      EXPECT_LT(two_stage, screened);
      std::printf("1.00x: screened %d, two-stage %d, one stage %d of %d\n", screened, two_stage, one_stage, trials);
    } else {
      EXPECT_GE(two_stage, trials * (factor > 1.2 ? 0.99 : 0.90));
      // More power than one 7-round stage at 0.01 (which needs all 7 rounds slower), where that misses.
      if (one_stage < trials) {
        EXPECT_GT(two_stage, one_stage);
      }
      std::printf("%.2fx: two-stage %d, one stage %d of %d\n", factor, two_stage, one_stage, trials);
    }
  }
}
