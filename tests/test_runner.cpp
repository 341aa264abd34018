// The runner on a toy technique (tests/toy_technique.hpp): exact peaks, oom as a result, suite files
// checked against the schema, --set overrides and the --filter regex, throughput as fractions of the
// copy and read-stream ceilings. Links no real technique.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "harness/heap_probe.hpp"
#include "harness/probe.hpp"
#include "harness/runner.hpp"
#include "toy_technique.hpp"
#include "test_util.hpp"

using namespace memtrade;
using memtrade::test::toy_case;
namespace fs = std::filesystem;

namespace {

const Registry& toy_registry() {
  static const Registry r = [] {
    Registry reg;
    reg.add(test::toy_technique());
    return reg;
  }();
  return r;
}

const Impl& impl_named(const Technique& t, const std::string& name) {
  for (const auto& i : t.impls)
    if (i.name == name) return i;
  throw Error("no impl " + name);
}

fs::path suite_dir(const std::string& name, const std::string& body) {
  const auto dir = test::scratch_dir() / ("runner_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / (name + ".json")) << body;
  return dir;
}

RunOptions options(const fs::path& dir, const std::string& suite) {
  RunOptions o;
  o.suites = {suite};
  o.backend = "cpu";
  o.suites_dir = dir;
  o.out = dir.string() + "_results.json";
  o.verbose = false;
  o.repetitions = 2;
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Runner, PeakBytesAreExactAndRepeatable) {
  const auto& tech = toy_registry().get("toy");
  const Case c = toy_case(20);
  const auto problem = tech.prepare(c);
  auto dev = make_cpu_device();
  for (int round = 0; round < 2; ++round) {
    const Record r = measure(tech, impl_named(tech, "reference"), c, *problem, *dev, 3, 1e-4, {});
    ASSERT_EQ(r.status, "ok") << r.detail;
    // x and y are live before the call; the reference adds a float64 scratch of n values.
    EXPECT_EQ(r.counter("peak_bytes"), 2 * 20 * sizeof(float) + 20 * sizeof(double));
    EXPECT_EQ(r.counter("peak_extra_bytes"), 20 * sizeof(double));
    EXPECT_EQ(r.counter("peak_bytes_io"), 2 * 20 * sizeof(float));
    EXPECT_EQ(r.counter("peak_bytes_workspace"), 20 * sizeof(double));
    EXPECT_EQ(r.times_s.size(), 3u);
    EXPECT_EQ(r.counter("rel_l2_err"), 0.0);
  }
  EXPECT_EQ(dev->memory().total().live, 0u);  // every workload freed what it took
}

TEST(Runner, HeapAllocatedOutsideTheTrackedPoolsIsRecorded) {
  if (!heap_probe::available()) GTEST_SKIP() << "no heap probe in this build (sanitizers own malloc)";
  const auto& tech = toy_registry().get("toy");
  auto dev = make_cpu_device();
  Case c = toy_case(20);
  const auto clean = tech.prepare(c);
  Record r = measure(tech, impl_named(tech, "reference"), c, *clean, *dev, 2, 1e-4, {});
  ASSERT_EQ(r.status, "ok") << r.detail;
  // The tracked scratch (and the pool's own bookkeeping) is not untracked memory.
  EXPECT_EQ(r.counter("untracked_bytes", -1), 0.0);
  c.params["untracked"] = 2 << 20;
  const auto leaky = tech.prepare(c);
  r = measure(tech, impl_named(tech, "reference"), c, *leaky, *dev, 2, 1e-4, {});
  ASSERT_EQ(r.status, "ok") << r.detail;
  EXPECT_GE(r.counter("untracked_bytes"), 2 << 20);
  EXPECT_LT(r.counter("untracked_bytes"), (2 << 20) + 4096);
  // The tracked peak does not see it.
  EXPECT_EQ(r.counter("peak_extra_bytes"), 20 * sizeof(double));
}

TEST(Runner, CpuTimeIsMeasuredPerRepetitionNotCopiedFromWallTime) {
  const auto& tech = toy_registry().get("toy");
  auto dev = make_cpu_device();
  const Case c = toy_case(1 << 16);
  const auto problem = tech.prepare(c);
  const Record r = measure(tech, impl_named(tech, "twice"), c, *problem, *dev, 3, 1e-3, {});
  ASSERT_EQ(r.status, "ok") << r.detail;
  ASSERT_EQ(r.cpu_times_s.size(), r.times_s.size());
  bool differs = false;
  for (std::size_t i = 0; i < r.times_s.size(); ++i) {
    EXPECT_GT(r.cpu_times_s[i], 0);
    differs |= r.cpu_times_s[i] != r.times_s[i];
  }
  EXPECT_TRUE(differs);
}

TEST(Runner, CapacityTooSmallIsRecordedAsOom) {
  const auto& tech = toy_registry().get("toy");
  const Case c = toy_case(64);
  const auto problem = tech.prepare(c);
  auto dev = make_cpu_device();
  dev->memory().set_capacity(64 * 4 * 2 + 100);  // room for x and y, not the scratch
  const Record r = measure(tech, impl_named(tech, "reference"), c, *problem, *dev, 3, 1e-4, {});
  EXPECT_EQ(r.status, "oom");
  EXPECT_NE(r.detail.find("exceeds capacity 612 B"), std::string::npos) << r.detail;
  EXPECT_EQ(r.counter("oom_requested_bytes"), 64 * 8);
  EXPECT_TRUE(r.times_s.empty());
  EXPECT_EQ(dev->memory().total().live, 0u);  // the partial workload was unwound
}

TEST(Runner, RunSuitesWritesEveryCaseAndGoesOnAfterOom) {
  const auto dir = suite_dir("mini", R"({"suite": "mini", "technique": "toy", "x_param": "n",
    "profiles": {"quick": {"repetitions": 2, "min_time_s": 0.0001, "grid": [{"n": [8, 64, 16]}]},
                 "full": {"grid": [{"n": [8]}]}}})");
  RunOptions o = options(dir, "mini");
  o.capacity = 2 * 64 * 4 + 100;  // n=64 fits x and y, not the reference's scratch
  const auto sum = run_suites(toy_registry(), o);
  EXPECT_EQ(sum.oom, 1);
  EXPECT_EQ(sum.ok, 5);  // n=8 and n=16 ran, before and after the oom
  const auto loaded = load_results(o.out);
  ASSERT_EQ(loaded.cases.size(), 6u);
  EXPECT_EQ(loaded.cases[2].status, "oom");
  EXPECT_EQ(loaded.cases[3].status, "ok");  // the in-place implementation fits
  EXPECT_EQ(loaded.cases[5].times_s.size(), 2u);
  EXPECT_EQ(loaded.context["memtrade"]["capacity_bytes"], o.capacity.value());

  o.suites = {"nonexistent"};
  EXPECT_THROW(run_suites(toy_registry(), o), Error);
  o.suites = {"mini"};
  o.profile = "huge";
  EXPECT_THROW(run_suites(toy_registry(), o), Error);
}

TEST(Runner, SuiteFileKeysAreCheckedAgainstTheSchema) {
  // A typo in any profile (here the one not run) is an error naming the file, profile, key and hint.
  const auto dir = suite_dir("typo", R"({"suite": "typo", "technique": "toy", "x_param": "n",
    "profiles": {"quick": {"grid": [{"n": [8]}]}, "full": {"grid": [{"n": [8], "scael": [2.0]}]}}})");
  const std::string msg = error_of([&] { run_suites(toy_registry(), options(dir, "typo")); });
  EXPECT_NE(msg.find("typo.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("profile 'full'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'scael' (did you mean 'scale'?)"), std::string::npos) << msg;

  const auto dir2 = suite_dir("type", R"({"suite": "type", "technique": "toy", "x_param": "n",
    "profiles": {"quick": {"grid": [{"n": [8], "scale": ["2"]}]}}})");
  const std::string msg2 = error_of([&] { run_suites(toy_registry(), options(dir2, "type")); });
  EXPECT_NE(msg2.find("key 'scale' must be a number, got \"2\""), std::string::npos) << msg2;

  const auto dir3 = suite_dir("range", R"({"suite": "range", "technique": "toy", "x_param": "n",
    "profiles": {"quick": {"grid": [{"n": [0]}]}}})");
  const std::string msg3 = error_of([&] { run_suites(toy_registry(), options(dir3, "range")); });
  EXPECT_NE(msg3.find("key 'n' is 0, outside integer >= 1"), std::string::npos) << msg3;
}

TEST(Runner, FilterIsARegexAndSetOverridesParameters) {
  const auto dir = suite_dir("sel", R"({"suite": "sel", "technique": "toy", "x_param": "n",
    "profiles": {"quick": {"min_time_s": 0.0001, "grid": [{"n": [8, 16, 32]}]}}})");
  RunOptions o = options(dir, "sel");
  o.filter = "n=(8|32)/tw";
  EXPECT_EQ(run_suites(toy_registry(), o).ok, 2);
  auto loaded = load_results(o.out);
  ASSERT_EQ(loaded.cases.size(), 2u);
  EXPECT_EQ(loaded.cases[0].name, "sel/n=8/twice");
  EXPECT_EQ(loaded.cases[1].name, "sel/n=32/twice");

  o.filter = "(";
  EXPECT_NE(error_of([&] { run_suites(toy_registry(), o); }).find("not a valid regular expression"), std::string::npos);

  // --set n=4 makes the three cases one; --set scale=3 adds a parameter.
  o.filter = "";
  o.overrides = {{"n", 4}, {"scale", 3.0}};
  EXPECT_EQ(run_suites(toy_registry(), o).ok, 2);
  loaded = load_results(o.out);
  ASSERT_EQ(loaded.cases.size(), 2u);
  EXPECT_EQ(loaded.cases[0].name, "sel/n=4,scale=3.0/reference");
  o.overrides = {{"nn", 4}};
  EXPECT_NE(error_of([&] { run_suites(toy_registry(), o); }).find("unknown key 'nn' (did you mean 'n'?)"),
            std::string::npos);
}

namespace {
// The toy's y = 2 x, reporting its bytes as a read stream timed with cold caches (as a matvec is) when
// `reads` is set.
class StreamWorkload final : public Workload {
 public:
  StreamWorkload(const test::ToyProblem& p, Device& dev, bool reads) : inner_(p, dev, false), reads_(reads) {}
  void run() override { inner_.run(); }
  ErrorStats error() override { return inner_.error(); }
  Work work() const override {
    Work w = inner_.work();
    w.read_stream = reads_;
    w.cold_cache = reads_;
    return w;
  }

 private:
  test::ToyWorkload inner_;
  bool reads_;
};
}  // namespace

TEST(Runner, BandwidthIsComparedWithTheCopyCeilingAndReadStreamsAlsoWithTheReadCeilingAndTheirFlushes) {
  Technique tech = test::toy_technique();
  tech.impls.clear();
  for (bool reads : {false, true})
    tech.impls.push_back(typed_impl<test::ToyProblem>(
        "toy", reads ? "reads" : "copies", reads ? Role::optimized : Role::reference, Backend::cpu, "",
        [reads](const test::ToyProblem& p, Device& dev) { return std::make_unique<StreamWorkload>(p, dev, reads); }));
  const Case c = toy_case(1 << 12);
  const auto problem = tech.prepare(c);
  auto dev = make_cpu_device();
  const Ceilings ceilings{{"cpu_copy_bytes_per_s", 4e9}, {"cpu_read_bytes_per_s", 1e9}, {"cuda_read_bytes_per_s", 1.0}};
  for (const auto& impl : tech.impls) {
    const Record r = measure(tech, impl, c, *problem, *dev, 2, 1e-4, ceilings);
    ASSERT_EQ(r.status, "ok") << r.detail;
    const double rate = r.counter("gbytes_per_s") * 1e9;
    ASSERT_GT(rate, 0);
    EXPECT_DOUBLE_EQ(r.counter("frac_of_copy_ceiling"), rate / 4e9);
    if (impl.name == "reads") {
      EXPECT_DOUBLE_EQ(r.counter("frac_of_read_ceiling"), rate / 1e9);  // the cpu ceiling, not cuda's
      // The cold calls' flushes were timed: the read stream is also set against what they read.
      const double flush = r.counter("flush_read_gbytes_per_s") * 1e9;
      EXPECT_GT(flush, 1e8);
      EXPECT_LT(flush, 1e13);
      EXPECT_DOUBLE_EQ(r.counter("frac_of_flush_read"), rate / flush);
    } else {
      EXPECT_EQ(r.counter("frac_of_read_ceiling", -1), -1) << "a call that writes is not a read stream";
      EXPECT_EQ(r.counter("flush_read_gbytes_per_s", -1), -1) << "warm calls have no flush";
      EXPECT_EQ(r.counter("frac_of_flush_read", -1), -1);
    }
  }
}

TEST(Runner, ProbeMeasuresAReadStreamBesideTwoCopies) {
  const Ceilings c = probe_cpu();
  ASSERT_TRUE(c.count("cpu_read_bytes_per_s"));
  ASSERT_TRUE(c.count("cpu_copy_bytes_per_s"));
  // Plausible for any machine this runs on: more than 100 MB/s, less than 10 TB/s.
  EXPECT_GT(c.at("cpu_read_bytes_per_s"), 1e8);
  EXPECT_LT(c.at("cpu_read_bytes_per_s"), 1e13);
  // The copy ceiling is the faster of the two copies, each measured and kept.
  ASSERT_TRUE(c.count("cpu_memcpy_bytes_per_s") && c.count("cpu_stream_copy_bytes_per_s"));
  for (const char* k : {"cpu_memcpy_bytes_per_s", "cpu_stream_copy_bytes_per_s"}) {
    EXPECT_GT(c.at(k), 1e8) << k;
    EXPECT_LT(c.at(k), 1e13) << k;
  }
  EXPECT_EQ(c.at("cpu_copy_bytes_per_s"), std::max(c.at("cpu_memcpy_bytes_per_s"), c.at("cpu_stream_copy_bytes_per_s")));
}
