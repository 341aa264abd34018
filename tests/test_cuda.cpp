// CUDA numerics. Built with the CUDA backend; every test skips, printing why, when no device is usable.
#include <gtest/gtest.h>

#include "gemm_check.hpp"

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
