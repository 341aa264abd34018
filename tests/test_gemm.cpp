#include <gtest/gtest.h>

#include "app/techniques.hpp"
#include "common/blas.hpp"
#include "gemm_check.hpp"

using namespace memtrade;
using memtrade::test::gemm_case;

namespace {

const Impl& impl_named(const std::string& name) {
  for (const auto& i : registry().get("gemm").impls)
    if (i.name == name) return i;
  throw Error("no impl " + name);
}

ErrorStats run_impl(const std::string& name, const Case& c, const Problem& p, Device& dev) {
  auto w = impl_named(name).make(c, p, dev);
  w->run();
  return w->error();
}

}  // namespace

class GemmCpu : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(GemmCpu, ReferenceAndOpenBlasMatchTheFloat64Oracle) {
  const auto [m, n, k] = GetParam();
  const Case c = gemm_case(m, n, k, "fp32");
  const auto problem = registry().get("gemm").prepare(c);
  const auto& p = problem_as<gemm::GemmProblem>(*problem);
  auto dev = make_cpu_device();
  // The reference accumulates in float64: only the final rounding to fp32 remains (half an ulp).
  const auto ref = run_impl("reference", c, *problem, *dev);
  EXPECT_LE(ref.max_rel, 0x1p-24);
  EXPECT_TRUE(ref.finite());
  // OpenBLAS accumulates in fp32: held to 2x a plain fp32-accumulating loop plus a small floor.
  const auto blas = run_impl("openblas", c, *problem, *dev);
  const auto same = test::same_precision_reference_error(p);
  const auto v = within_tolerance(blas, same, {2.0, 1e-6});
  EXPECT_TRUE(v.pass) << v.why;
  EXPECT_EQ(dev->memory().total().live, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmCpu,
                         ::testing::Values(std::tuple{1, 1, 1}, std::tuple{37, 53, 29}, std::tuple{64, 64, 64},
                                           std::tuple{5, 130, 257}, std::tuple{600, 24, 40}));

TEST(Gemm, OracleCoversSampledRowsOfLargeOutputs) {
  const auto problem = registry().get("gemm").prepare(gemm_case(600, 8, 8, "fp32"));
  const auto& p = problem_as<gemm::GemmProblem>(*problem);
  ASSERT_EQ(p.rows.size(), 128u);
  EXPECT_EQ(p.rows.front(), 0);
  EXPECT_EQ(p.rows.back(), 599);
  auto dev = make_cpu_device();
  auto w = impl_named("openblas").make(gemm_case(600, 8, 8, "fp32"), *problem, *dev);
  w->run();
  EXPECT_LT(w->error().rel_l2, 1e-6);
}

TEST(Gemm, ImpossibleCasesAreClearErrors) {
  const auto& tech = registry().get("gemm");
  EXPECT_THROW(tech.validate(gemm_case(0, 4, 4, "fp32")), Error);
  EXPECT_THROW(tech.validate(gemm_case(4, -4, 4, "fp32")), Error);
  EXPECT_THROW(tech.validate(gemm_case(4, 4, 4, "int8")), Error);
  EXPECT_THROW(tech.validate(gemm_case(4, 4, 4, "fp128")), Error);
  try {
    tech.validate(gemm_case(4, 4, 0, "fp32"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("impossible shape"), std::string::npos) << e.what();
  }
}

TEST(Gemm, CpuImplementationsDeclineLowPrecisionInputs) {
  const Case c = gemm_case(8, 8, 8, "bf16");
  EXPECT_FALSE(impl_named("openblas").not_applicable(c).empty());
  EXPECT_FALSE(impl_named("reference").not_applicable(c).empty());
#ifdef MEMTRADE_WITH_CUDA  // CUDA implementations are registered by their .cu files
  EXPECT_TRUE(impl_named("cublas").not_applicable(c).empty());
#endif
}

TEST(Gemm, WorkCountsFlopsAndBytes) {
  const Case c = gemm_case(2, 3, 4, "fp32");
  const auto problem = registry().get("gemm").prepare(c);
  auto dev = make_cpu_device();
  auto w = impl_named("openblas").make(c, *problem, *dev);
  EXPECT_EQ(w->work().flops, 2.0 * 2 * 3 * 4);
  EXPECT_EQ(w->work().bytes, (2 * 4 + 4 * 3 + 2 * 3) * 4.0);
  EXPECT_EQ(w->work().gemm_dtype, "fp32");
}

TEST(Gemm, OpenBlasKernelsNarrowerThanTheCpuAreNamed) {
  using memtrade::blas::narrower_kernels_note;
  const std::string forced = narrower_kernels_note("Haswell", 3, "Haswell");
  EXPECT_NE(forced.find("runs its Haswell kernels on a CPU with AVX-512 because $OPENBLAS_CORETYPE is Haswell: unset it"),
            std::string::npos)
      << forced;
  const std::string chosen = narrower_kernels_note("Zen", 3, nullptr);
  EXPECT_NE(chosen.find("set $OPENBLAS_CORETYPE to an AVX-512 kernel set (SkylakeX)"), std::string::npos) << chosen;
  const std::string generic = narrower_kernels_note("Prescott", 2, nullptr);
  EXPECT_NE(generic.find("on a CPU with AVX2 + FMA: set $OPENBLAS_CORETYPE to an AVX2 + FMA kernel set (Haswell)"),
            std::string::npos)
      << generic;
  for (const char* wide : {"SkylakeX", "Cooperlake", "SapphireRapids"}) EXPECT_EQ(narrower_kernels_note(wide, 3, wide), "");
  EXPECT_EQ(narrower_kernels_note("Haswell", 2, "Haswell"), "");  // as wide as the CPU
  EXPECT_EQ(narrower_kernels_note("Prescott", 1, nullptr), "");   // a CPU without AVX2: nothing wider to run
}
