#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "harness/runner.hpp"
#include "impls/gemm/gemm.hpp"

using namespace memtrade;
namespace fs = std::filesystem;

namespace {

Case gemm_case(int64_t m, int64_t n, int64_t k, const char* dtype = "fp32") {
  Case c;
  c.suite = "gemm";
  c.params = Json{{"m", m}, {"n", n}, {"k", k}, {"dtype", dtype}};
  c.id = case_id(c.params);
  c.x = static_cast<double>(n);
  return c;
}

const Impl& impl_named(const Technique& t, const std::string& name) {
  for (const auto& i : t.impls)
    if (i.name == name) return i;
  throw Error("no impl " + name);
}

}  // namespace

TEST(Runner, PeakBytesAreExactAndRepeatable) {
  const auto& tech = registry().get("gemm");
  const Case c = gemm_case(20, 12, 36);
  const auto problem = tech.prepare(c);
  auto dev = make_cpu_device();
  const std::size_t io = (20 * 36 + 36 * 12 + 20 * 12) * sizeof(float);
  for (int round = 0; round < 2; ++round) {
    const Record r = measure(tech, impl_named(tech, "reference"), c, *problem, *dev, 3, 1e-4, {});
    ASSERT_EQ(r.status, "ok") << r.detail;
    // Inputs and output are live before the call; the reference adds one float64 accumulator row.
    EXPECT_EQ(r.counter("peak_bytes"), io + 12 * sizeof(double));
    EXPECT_EQ(r.counter("peak_extra_bytes"), 12 * sizeof(double));
    EXPECT_EQ(r.counter("peak_bytes_io"), io);
    EXPECT_EQ(r.counter("peak_bytes_workspace"), 12 * sizeof(double));
    EXPECT_EQ(r.times_s.size(), 3u);
    EXPECT_LT(r.counter("rel_l2_err"), 1e-6);
  }
  EXPECT_EQ(dev->memory().total().live, 0u);  // every workload freed what it took
}

TEST(Runner, CapacityTooSmallIsRecordedAsOom) {
  const auto& tech = registry().get("gemm");
  const Case c = gemm_case(64, 64, 64);
  const auto problem = tech.prepare(c);
  auto dev = make_cpu_device();
  dev->memory().set_capacity(64 * 64 * 4 * 2);  // room for A and B, not C
  const Record r = measure(tech, impl_named(tech, "openblas"), c, *problem, *dev, 3, 1e-4, {});
  EXPECT_EQ(r.status, "oom");
  EXPECT_NE(r.detail.find("exceeds capacity 32768 B"), std::string::npos) << r.detail;
  EXPECT_EQ(r.counter("oom_requested_bytes"), 64 * 64 * 4);
  EXPECT_TRUE(r.times_s.empty());
  EXPECT_EQ(dev->memory().total().live, 0u);  // the partial workload was unwound
}

TEST(Runner, RunSuitesWritesEveryCaseAndGoesOnAfterOom) {
  const auto dir = fs::temp_directory_path() / "memtrade_runner_suites";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "mini.json") << R"({"suite": "mini", "technique": "gemm", "x_param": "n",
    "profiles": {"quick": {"repetitions": 2, "min_time_s": 0.0001, "grid": [{"n": [8, 64, 16], "dtype": ["fp32"]}]},
                 "full": {"grid": [{"n": [8], "dtype": ["fp32"]}]}}})";
  RunOptions o;
  o.suites = {"mini"};
  o.backend = "cpu";
  o.suites_dir = dir;
  o.out = fs::temp_directory_path() / "memtrade_runner_results.json";
  o.capacity = 8192;  // n=64 needs 48 KiB
  o.verbose = false;
  const auto sum = run_suites(registry(), o);
  EXPECT_EQ(sum.oom, 2);  // both CPU implementations at n=64
  EXPECT_EQ(sum.ok, 4);   // n=8 and n=16 ran, before and after the oom
  const auto loaded = load_results(o.out);
  ASSERT_EQ(loaded.cases.size(), 6u);
  EXPECT_EQ(loaded.cases[2].status, "oom");
  EXPECT_EQ(loaded.cases[5].status, "ok");
  EXPECT_EQ(loaded.cases[5].times_s.size(), 2u);
  EXPECT_EQ(loaded.context["memtrade"]["capacity_bytes"], 8192);

  o.suites = {"nonexistent"};
  EXPECT_THROW(run_suites(registry(), o), Error);
  o.suites = {"mini"};
  o.profile = "huge";
  EXPECT_THROW(run_suites(registry(), o), Error);
}
