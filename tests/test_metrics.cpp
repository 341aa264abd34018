#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/common.hpp"
#include "harness/metrics.hpp"
#include "harness/registry.hpp"
#include "harness/runner.hpp"

using namespace memtrade;

TEST(Metrics, ExactMatchIsZeroError) {
  const std::vector<double> r = {1, -2, 3};
  const auto s = error_stats(r, r);
  EXPECT_EQ(s.max_abs, 0);
  EXPECT_EQ(s.max_rel, 0);
  EXPECT_EQ(s.rel_l2, 0);
  EXPECT_TRUE(s.finite());
}

TEST(Metrics, EachMetricMeasuresWhatItSays) {
  const std::vector<double> r = {1, -2, 4, 0.5};
  const std::vector<double> x = {1.1, -2, 4, 0.45};
  const auto s = error_stats(x, r);
  EXPECT_NEAR(s.max_abs, 0.1, 1e-12);
  EXPECT_NEAR(s.max_rel, 0.1, 1e-12);  // 0.1/1 and 0.05/0.5 tie
  const double l2 = std::sqrt(0.01 + 0.0025) / std::sqrt(1 + 4 + 16 + 0.25);
  EXPECT_NEAR(s.rel_l2, l2, 1e-12);
  EXPECT_EQ(s.n, 4u);
}

TEST(Metrics, EachMetricCanFail) {
  const std::vector<double> r = {1, 1, 1, 1};
  // max_abs catches one large error that rel_l2 dilutes.
  const std::vector<double> spike = {1, 1, 1, 1.5};
  EXPECT_FALSE(error_stats(spike, r).max_abs <= 0.1);
  // max_rel catches a small value's error that max_abs and rel_l2 miss.
  const std::vector<double> rs = {1000, 1000, 1000, 1e-3};
  const std::vector<double> xs = {1000, 1000, 1000, 2e-3};
  const auto s = error_stats(xs, rs);
  EXPECT_LE(s.max_abs, 1e-3);
  EXPECT_LT(s.rel_l2, 1e-6);
  EXPECT_GE(s.max_rel, 0.99);
  // rel_l2 catches a uniform bias that stays under a per-element absolute bound.
  const std::vector<double> bias = {1.05, 1.05, 1.05, 1.05};
  EXPECT_NEAR(error_stats(bias, r).rel_l2, 0.05, 1e-12);
}

TEST(Metrics, NanAndInfNeverPass) {
  const std::vector<double> r = {1, 2, 3};
  const std::vector<double> x = {1, std::nan(""), std::numeric_limits<double>::infinity()};
  const auto s = error_stats(x, r);
  EXPECT_EQ(s.nan_count, 1u);
  EXPECT_EQ(s.inf_count, 1u);
  EXPECT_FALSE(s.finite());
  EXPECT_TRUE(std::isinf(s.max_abs));
  EXPECT_TRUE(std::isinf(s.rel_l2));
  ErrorStats ref;  // a perfect reference: the bound is just the floor
  const auto v = within_tolerance(s, ref, {2.0, 1e30});
  EXPECT_FALSE(v.pass) << v.why;
  EXPECT_FALSE(all_close(x, r, 1e30, 1e30).pass);
}

TEST(Metrics, OracleMustBeFiniteAndSizesMustMatch) {
  const std::vector<double> r = {1, std::nan("")};
  EXPECT_THROW(error_stats(r, r), Error);
  const std::vector<double> a = {1, 2}, b = {1};
  EXPECT_THROW(error_stats(a, b), Error);
}

TEST(Metrics, ToleranceRuleIsFactorTimesReferencePlusFloor) {
  ErrorStats ref;
  ref.max_abs = 1e-3;
  ErrorStats opt;
  opt.max_abs = 2e-3 + 0.9e-5;
  EXPECT_TRUE(within_tolerance(opt, ref, {2.0, 1e-5}).pass);
  opt.max_abs = 2e-3 + 1.1e-5;
  const auto v = within_tolerance(opt, ref, {2.0, 1e-5});
  EXPECT_FALSE(v.pass);
  EXPECT_NE(v.why.find("bound"), std::string::npos);
}

TEST(Metrics, AllCloseReportsTheFirstFailingIndex) {
  const std::vector<double> r = {1, 2, 3};
  const std::vector<double> x = {1, 2.5, 3};
  const auto v = all_close(x, r, 0.1, 0.1);
  EXPECT_FALSE(v.pass);
  EXPECT_NE(v.why.find("index 1"), std::string::npos) << v.why;
  EXPECT_TRUE(all_close(x, r, 0.5, 0).pass);
}

TEST(Metrics, ApproximationAllowanceWidensTheFloorOfItsImplementationOnly) {
  Technique t;
  t.error_rule.approximation = [](const Case&, const Problem&, const Impl& i) { return i.name == "approx" ? 1e-3 : 0.0; };
  Impl approx, other;
  approx.name = "approx";
  approx.role = other.role = Role::optimized;
  other.name = "other";
  const Case c;
  const Problem p;
  ErrorStats ref;
  ref.max_abs = 1e-3;
  ErrorStats opt;
  opt.max_abs = 2e-3 + 1e-5 + 0.9e-3;  // beyond the tolerance, inside tolerance + allowance
  EXPECT_TRUE(judge_error(t, c, p, approx, opt, ref).pass);
  EXPECT_FALSE(judge_error(t, c, p, other, opt, ref).pass);
  opt.max_abs = 2e-3 + 1e-5 + 1.1e-3;
  EXPECT_FALSE(judge_error(t, c, p, approx, opt, ref).pass);
  opt.max_abs = 0;
  opt.nan_count = 1;  // NaN fails whatever the allowance
  EXPECT_FALSE(judge_error(t, c, p, approx, opt, ref).pass);
}

// With parts (attention's o, dq, dk, dv) each output is held to the rule against the same output of the
// reference: an optimized O error of 3e-3 passes against a reference O error of 2e-3 even when the
// reference's worst output (dq, by relative L2) has a max abs error of only 1e-3.
TEST(Metrics, PartsAreJudgedAgainstTheSameOutputOfTheReference) {
  Technique t;
  t.error_rule.parts = {"o", "dq"};
  Impl ref_impl, opt_impl;
  ref_impl.role = Role::reference;
  opt_impl.role = Role::optimized;
  Case c;
  c.id = "case";
  const Problem p;
  Record ref;
  ref.kase = c;
  ref.role = Role::reference;
  ref.counters = {{"max_abs_err", 1e-3}, {"rel_l2_err", 2e-3}, {"max_abs_err_o", 2e-3}, {"rel_l2_err_o", 1e-3},
                  {"max_abs_err_dq", 1e-3}, {"rel_l2_err_dq", 2e-3}};
  Record opt;
  opt.kase = c;
  opt.role = Role::optimized;
  opt.counters = {{"max_abs_err", 3e-3}, {"rel_l2_err", 3e-3}, {"max_abs_err_o", 3e-3}, {"rel_l2_err_o", 3e-3},
                  {"max_abs_err_dq", 1.5e-3}, {"rel_l2_err_dq", 2e-3}};
  const std::vector<Record> earlier = {ref};
  judge_record(t, opt_impl, c, p, earlier, opt);
  EXPECT_EQ(opt.counter("error_ok"), 1) << opt.detail;

  opt.counters["max_abs_err_dq"] = 2.5e-3;  // beyond 2 x 1e-3 + 1e-5: dq fails on its own
  opt.detail.clear();
  judge_record(t, opt_impl, c, p, earlier, opt);
  EXPECT_EQ(opt.counter("error_ok"), 0);
  EXPECT_NE(opt.detail.find("dq: "), std::string::npos) << opt.detail;

  t.error_rule.parts.clear();  // without parts: the whole-record statistics, worst against worst
  opt.counters["max_abs_err_dq"] = 1.5e-3;
  opt.detail.clear();
  judge_record(t, opt_impl, c, p, earlier, opt);
  EXPECT_EQ(opt.counter("error_ok"), 0);
}
