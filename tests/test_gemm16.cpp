// The 16-bit training GEMM (model/gemm16.hpp) on every SIMD target: against float64 products of the same
// 16-bit operands, within the fp32 summation bound; every transpose, tails of rows, columns and k (several
// blocks of k); accumulation into C; C rounded to the operands' type; the same bits on every thread
// count and on every target with fused multiply-add; NaN and infinity carried through.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/common.hpp"
#include "common/simd/targets.hpp"
#include "datasets/random.hpp"
#include "model/gemm16.hpp"

namespace memtrade {
namespace {

struct Shape {
  bool ta, tb;
  int64_t m, n, k;
};

std::string name(const Shape& s) {
  return std::string(s.ta ? "T" : "N") + (s.tb ? "T" : "N") + " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
         " k=" + std::to_string(s.k);
}

template <class T>
struct Problem {
  Shape s;
  std::vector<T> A, B;
  std::vector<double> ref, mag;  // op(A) op(B) and sum |a b| per element, in float64

  explicit Problem(const Shape& sh, uint64_t seed) : s(sh), A(sh.m * sh.k), B(sh.k * sh.n) {
    for (std::size_t i = 0; i < A.size(); ++i) A[i] = from_f32<T>(static_cast<float>(datasets::normal(seed, i)));
    for (std::size_t i = 0; i < B.size(); ++i) B[i] = from_f32<T>(static_cast<float>(datasets::normal(seed + 1, i)));
    ref.assign(s.m * s.n, 0.0);
    mag.assign(s.m * s.n, 0.0);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j)
        for (int64_t p = 0; p < s.k; ++p) {
          const double x = to_f32(a(i, p)) * static_cast<double>(to_f32(b(p, j)));
          ref[i * s.n + j] += x;
          mag[i * s.n + j] += std::fabs(x);
        }
  }
  int64_t lda() const { return s.ta ? s.m : s.k; }
  int64_t ldb() const { return s.tb ? s.k : s.n; }
  T a(int64_t i, int64_t p) const { return s.ta ? A[p * s.m + i] : A[i * s.k + p]; }
  T b(int64_t p, int64_t j) const { return s.tb ? B[j * s.k + p] : B[p * s.n + j]; }

  // C (+)= op(A) op(B) on the current target.
  template <class O>
  void run(std::vector<O>& C, bool acc, int threads) const {
    std::vector<float> wa(simd::gemm16_a_floats(s.m, s.k));
    std::vector<float> wb(simd::gemm16_b_floats(s.n, s.k) + 16);
    float* wbp = wb.data();
    while (reinterpret_cast<uintptr_t>(wbp) % 64) ++wbp;  // packed panels are read with aligned loads
    simd::gemm16(s.ta, s.tb, s.m, s.n, s.k, A.data(), lda(), B.data(), ldb(), C.data(), s.n, acc, wa.data(), wbp,
                 threads);
  }
};

const Shape kShapes[] = {
    {false, true, 37, 45, 300},  {false, false, 37, 45, 300}, {true, false, 37, 45, 300}, {true, true, 37, 45, 300},
    {false, true, 64, 96, 128},  {true, false, 13, 77, 1100},  {false, false, 1, 1, 1},    {false, true, 25, 33, 7},
    {false, false, 12, 64, 513}, {true, false, 3, 130, 2},
};

// fp32 sums of k products of 16-bit values: each product exact, at most k roundings: |err| <= k u sum|ab|.
double bound(int64_t k, double mag) { return 1.01 * static_cast<double>(k) * 0x1p-24 * mag; }

template <class T>
void expect_fp32_within_bound() {
  for (const Shape& s : kShapes) {
    const Problem<T> pr(s, 11);
    std::vector<float> start(s.m * s.n);
    for (std::size_t i = 0; i < start.size(); ++i) start[i] = static_cast<float>(datasets::normal(5, i));
    for (int64_t target : simd::available_targets()) {
      simd::restrict_to(target);
      for (bool acc : {false, true}) {
        std::vector<float> C = start;
        pr.run(C, acc, 2);
        for (int64_t e = 0; e < s.m * s.n; ++e) {
          const double want = pr.ref[e] + (acc ? start[e] : 0.0);
          const double err = std::fabs(static_cast<double>(C[e]) - want);
          ASSERT_LE(err, bound(s.k, pr.mag[e]) + (acc ? 0x1p-24 * std::fabs(want) : 0.0))
              << simd::name_of(target) << " " << name(s) << " acc=" << acc << " element " << e;
        }
      }
    }
    simd::restrict_to(0);
  }
}

TEST(Gemm16, Bf16OperandsWithinTheFp32BoundOnEveryTarget) { expect_fp32_within_bound<bf16_t>(); }
TEST(Gemm16, Fp16OperandsWithinTheFp32BoundOnEveryTarget) { expect_fp32_within_bound<f16_t>(); }

// C in the operands' type: each element the fp32 result rounded once (to within the fp32 bound before
// the rounding, so at most one 16-bit rounding step away from the float64 value's rounding).
template <class T>
void expect_narrow_c() {
  const double u16 = std::is_same_v<T, bf16_t> ? 0x1p-8 : 0x1p-11;
  for (const Shape& s : kShapes) {
    if (s.k > simd::kGemm16KBlock) continue;
    const Problem<T> pr(s, 21);
    std::vector<T> start(s.m * s.n);
    for (std::size_t i = 0; i < start.size(); ++i) start[i] = from_f32<T>(static_cast<float>(datasets::normal(6, i)));
    for (int64_t target : simd::available_targets()) {
      simd::restrict_to(target);
      for (bool acc : {false, true}) {
        std::vector<T> C = start;
        std::vector<float> C32(s.m * s.n);
        for (std::size_t i = 0; i < C32.size(); ++i) C32[i] = to_f32(start[i]);
        pr.run(C, acc, 2);
        pr.run(C32, acc, 2);
        for (int64_t e = 0; e < s.m * s.n; ++e) {  // exactly the fp32 result's rounding, same target
          ASSERT_EQ(to_f32(C[e]), to_f32(from_f32<T>(C32[e])))
              << simd::name_of(target) << " " << name(s) << " acc=" << acc << " element " << e;
          const double want = pr.ref[e] + (acc ? to_f32(start[e]) : 0.0);
          ASSERT_LE(std::fabs(to_f32(C[e]) - want), u16 * std::fabs(want) + 2 * bound(s.k, pr.mag[e]) + 1e-30);
        }
      }
    }
    simd::restrict_to(0);
  }
  // k past one block is refused for a 16-bit C
  const Shape big{false, false, 2, 2, simd::kGemm16KBlock + 1};
  const Problem<T> pr(big, 1);
  std::vector<T> C(4);
  EXPECT_THROW(pr.run(C, false, 1), Error);
}

TEST(Gemm16, Bf16ResultRoundedOnceFromFp32) { expect_narrow_c<bf16_t>(); }
TEST(Gemm16, Fp16ResultRoundedOnceFromFp32) { expect_narrow_c<f16_t>(); }

// Each element is summed in k order by one thread: the thread count does not change a bit, nor does the
// target where it has fused multiply-add (AVX-512 and AVX2 here; SSE4 multiplies and adds separately).
TEST(Gemm16, SameBitsOnEveryThreadCountAndEveryFmaTarget) {
  for (const Shape& s : kShapes) {
    const Problem<bf16_t> pr(s, 31);
    std::vector<float> first;
    std::string first_name;
    for (int64_t target : simd::available_targets()) {
      const std::string t = simd::name_of(target);
      if (t != "AVX3" && t != "AVX3_DL" && t != "AVX3_ZEN4" && t != "AVX3_SPR" && t != "AVX2") continue;
      simd::restrict_to(target);
      for (int threads : {1, 2, 3}) {
        std::vector<float> C(s.m * s.n);
        pr.run(C, false, threads);
        if (first.empty()) {
          first = C;
          first_name = t + " threads 1";
        } else {
          ASSERT_EQ(std::memcmp(C.data(), first.data(), C.size() * sizeof(float)), 0)
              << name(s) << ": " << t << " threads " << threads << " differs from " << first_name;
        }
      }
    }
    simd::restrict_to(0);
  }
}

TEST(Gemm16, EmptySumIsZeroOrLeavesCUnchanged) {
  const Shape s{false, false, 5, 7, 0};
  const Problem<bf16_t> pr(s, 51);
  for (bool acc : {false, true}) {
    std::vector<float> C(s.m * s.n, 3.f);
    std::vector<bf16_t> C16(s.m * s.n, from_f32<bf16_t>(3.f));
    pr.run(C, acc, 2);
    pr.run(C16, acc, 2);
    for (int64_t e = 0; e < s.m * s.n; ++e) {
      EXPECT_EQ(C[e], acc ? 3.f : 0.f) << "acc=" << acc;
      EXPECT_EQ(to_f32(C16[e]), acc ? 3.f : 0.f) << "acc=" << acc;
    }
  }
}

TEST(Gemm16, NonFiniteOperandsPropagate) {
  const Shape s{false, true, 20, 40, 70};
  Problem<bf16_t> pr(s, 41);
  pr.A[3 * s.k + 5] = from_f32<bf16_t>(std::numeric_limits<float>::quiet_NaN());  // row 3
  pr.B[7 * s.k + 9] = from_f32<bf16_t>(std::numeric_limits<float>::infinity());   // column 7
  for (int64_t target : simd::available_targets()) {
    simd::restrict_to(target);
    std::vector<float> C(s.m * s.n);
    pr.run(C, false, 2);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        const float c = C[i * s.n + j];
        if (i == 3) EXPECT_TRUE(std::isnan(c)) << simd::name_of(target) << " " << i << "," << j;
        else if (j == 7) EXPECT_TRUE(std::isinf(c) || std::isnan(c)) << simd::name_of(target) << " " << i << "," << j;
        else EXPECT_TRUE(std::isfinite(c)) << simd::name_of(target) << " " << i << "," << j;
      }
  }
  simd::restrict_to(0);
}

}  // namespace
}  // namespace memtrade
