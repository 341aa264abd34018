// CUDA numerics. Built with the CUDA backend; every test skips, printing why, when no device is usable.
#include <gtest/gtest.h>

#include "attention_check.hpp"
#include "gemm_check.hpp"
#include "harness/runner.hpp"
#include "impls/attention/attention.hpp"

using namespace memtrade;
using memtrade::test::gemm_case;

#define REQUIRE_CUDA()                                                  \
  do {                                                                  \
    const auto s = cuda_status();                                       \
    if (!s.available) GTEST_SKIP() << s.reason;                         \
  } while (0)

class GemmCuda : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GemmCuda, MatchesTheOracleWithinTheSamePrecisionRule) {
  REQUIRE_CUDA();
  const auto& [impl_name, dtype] = GetParam();
  auto dev = make_cuda_device();
  const auto& tech = registry().get("gemm");
  const Impl* impl = nullptr;
  for (const auto& i : tech.impls)
    if (i.name == impl_name) impl = &i;
  ASSERT_NE(impl, nullptr);
  for (auto [m, n, k] : {std::tuple{37, 53, 29}, std::tuple{128, 128, 128}, std::tuple{1, 300, 17}}) {
    const Case c = gemm_case(m, n, k, dtype.c_str());
    const auto problem = tech.prepare(c);
    auto w = impl->make(c, *problem, *dev);
    w->run();
    dev->synchronize();
    const auto err = w->error();
    const auto same = test::same_precision_reference_error(problem_as<gemm::GemmProblem>(*problem));
    const auto v = within_tolerance(err, same, {2.0, dtype == "fp32" ? 1e-6 : 1e-3});
    EXPECT_TRUE(v.pass) << impl_name << " " << c.id << ": " << v.why;
  }
}

INSTANTIATE_TEST_SUITE_P(ImplsAndDtypes, GemmCuda,
                         ::testing::Combine(::testing::Values("cuda-naive", "cublas"),
                                            ::testing::Values("fp32", "bf16", "fp16")));

TEST(CudaDevice, TrackedPeakAndMemGetInfoAgreeOnALargeBuffer) {
  REQUIRE_CUDA();
  auto dev = make_cuda_device();
  const auto before = *dev->backend_used_bytes();
  {
    Buffer b(dev->memory(), 256u << 20, Tag::workspace);
    const auto during = *dev->backend_used_bytes();
    EXPECT_GE(during - before, 256u << 20);
    EXPECT_LT(during - before, (256u << 20) + (64u << 20));  // allocation granularity, not a leak
  }
  EXPECT_EQ(dev->memory().total().peak, 256u << 20);
  dev->memory().set_capacity(1u << 20);
  EXPECT_THROW(Buffer(dev->memory(), 2u << 20, Tag::io), OutOfMemory);
}

namespace {
const Impl& attention_impl(const std::string& name) {
  for (const auto& i : registry().get("attention").impls)
    if (i.name == name && i.backend == Backend::cuda) return i;
  throw Error("no CUDA attention impl " + name);
}
}  // namespace

class AttentionCuda : public ::testing::TestWithParam<std::tuple<std::string, bool, int, int>> {};

TEST_P(AttentionCuda, FlashWithinTwiceNaiveAndMemoryModelExact) {
  REQUIRE_CUDA();
  const auto [dtype, causal, h_kv, d] = GetParam();
  auto dev = make_cuda_device();
  const auto& tech = registry().get("attention");
  for (const auto& [n, nk] : {std::pair{37, 44}, {130, 130}, {96, 40}}) {  // 96 over 40, causal: empty rows
    const Case c = test::attn_case(Json{{"b", 2}, {"h", 4}, {"h_kv", h_kv}, {"n", n}, {"n_kv", nk}, {"d", d},
                                       {"causal", causal}, {"dtype", dtype}, {"pass", "fwd_bwd"}});
    const auto problem = tech.prepare(c);
    const attn::Dims s = attn::case_dims(c);
    std::map<std::string, std::map<std::string, double>> errs;
    for (const char* impl : {"naive", "flash"}) {
      const Record r = measure(tech, attention_impl(impl), c, *problem, *dev, 1, 1e-4, {});
      ASSERT_EQ(r.status, "ok") << impl << " " << c.id << ": " << r.detail;
      const auto m = std::string(impl) == "naive" ? attn::naive_memory(s, Backend::cuda) : attn::flash_memory(s, Backend::cuda);
      EXPECT_EQ(r.counter("peak_bytes"), m.live_before + m.extra) << impl << " " << c.id;
      EXPECT_EQ(r.counter("peak_extra_bytes"), m.extra) << impl << " " << c.id;
      EXPECT_EQ(r.counter("nan_count") + r.counter("inf_count"), 0) << impl << " " << c.id;
      errs[impl] = r.counters;
    }
    const double floor = dtype == "fp32" ? 1e-5 : 1e-3;
    for (const char* t : {"o", "dq", "dk", "dv"}) {
      const std::string key = std::string("max_abs_err_") + t;
      EXPECT_LE(errs["flash"].at(key), 2 * errs["naive"].at(key) + floor) << c.id << " " << key;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Options, AttentionCuda,
                         ::testing::Combine(::testing::Values(std::string("fp32"), std::string("bf16"), std::string("fp16")), ::testing::Bool(),
                                            ::testing::Values(4, 1), ::testing::Values(64, 128, 40)));
