// The host AdamW (model/cpu_adam.hpp): every SIMD target gives the scalar reference's bits for every
// gradient and weight type, and ten steps follow a float64 AdamW written from PyTorch's update formula.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/simd/targets.hpp"
#include "datasets/random.hpp"
#include "model/cpu_adam.hpp"
#include "model/layers.hpp"

namespace memtrade {
namespace {

using model::AdamStep;

constexpr int64_t kSizes[] = {1, 22, 64, 1000, 1048577};

AdamStep step_at(int64_t t) {
  AdamStep s;
  s.lr = 1e-3f;
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.grad_scale = 1.f / 1024;
  model::adam_bias_corrections(s.beta1, s.beta2, t, s.bc1, s.bc2);
  return s;
}

template <class T>
std::vector<T> values(int64_t n, uint64_t seed, double scale) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = from_f32<T>(static_cast<float>(scale * datasets::normal(seed, i)));
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
constexpr DType dtype_of_elem() {
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  else if constexpr (std::is_same_v<T, bf16_t>) return DType::bf16;
  else return DType::f16;
}

struct State {
  std::vector<float> p, m, v;
};

template <class G, class W>
void expect_targets_match_scalar(int64_t n, bool specials) {
  auto grad = values<G>(n, 3, 1024.0);
  if (specials && n >= 4) {  // non-finite gradients propagate the same way on every path
    grad[0] = from_f32<G>(std::numeric_limits<float>::infinity());
    grad[n / 2] = from_f32<G>(std::numeric_limits<float>::quiet_NaN());
  }
  State ref{values<float>(n, 1, 1.0), values<float>(n, 2, 0.01), std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) ref.v[i] = static_cast<float>(std::fabs(datasets::normal(4, i))) * 1e-4f;
  std::vector<W> w_ref(n);
  State start = ref;
  model::cpu_adamw_scalar<G, W>(step_at(3), ref.p.data(), ref.m.data(), ref.v.data(), grad.data(), w_ref.data(), n);
  for (int64_t target : simd::available_targets()) {
    simd::restrict_to(target);
    State s = start;
    std::vector<W> w(n);
    model::cpu_adamw<G, W>(step_at(3), s.p.data(), s.m.data(), s.v.data(), grad.data(), w.data(), n);
    const std::string what = simd::name_of(target) + " n=" + std::to_string(n) + " G=" + dtype_name(dtype_of_elem<G>()) + " W=" + dtype_name(dtype_of_elem<W>());
    EXPECT_TRUE(same_bits(s.p, ref.p)) << what << " master";
    EXPECT_TRUE(same_bits(s.m, ref.m)) << what << " m";
    EXPECT_TRUE(same_bits(s.v, ref.v)) << what << " v";
    EXPECT_TRUE(same_bits(w, w_ref)) << what << " weights";
  }
  simd::restrict_to(0);
}

TEST(CpuAdam, EveryTargetEqualsTheScalarReferenceBitForBit) {
  for (int64_t n : kSizes) {
    expect_targets_match_scalar<float, float>(n, false);
    expect_targets_match_scalar<bf16_t, bf16_t>(n, false);
    expect_targets_match_scalar<f16_t, f16_t>(n, false);
  }
  for (int64_t n : {int64_t{1000}, int64_t{16384 + 37}}) {
    expect_targets_match_scalar<float, bf16_t>(n, true);
    expect_targets_match_scalar<float, f16_t>(n, true);
    expect_targets_match_scalar<bf16_t, float>(n, true);
    expect_targets_match_scalar<f16_t, float>(n, true);
    expect_targets_match_scalar<bf16_t, f16_t>(n, true);
    expect_targets_match_scalar<f16_t, bf16_t>(n, true);
    expect_targets_match_scalar<float, float>(n, true);
  }
}

// PyTorch's AdamW (torch.optim.AdamW, foreach=False), in float64:
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
TEST(CpuAdam, TenStepsFollowPyTorchsFormulaInFloat64) {
  for (int64_t n : kSizes) {
    State s{values<float>(n, 1, 1.0), std::vector<float>(n), std::vector<float>(n)};
    std::vector<double> p(s.p.begin(), s.p.end()), m(n), v(n);
    std::vector<float> w(n);
    double max_err = 0, bound = 0;
    for (int64_t t = 1; t <= 10; ++t) {
      const auto grad = values<float>(n, 100 + t, 1024.0);
      const AdamStep st = step_at(t);
      model::cpu_adamw<float, float>(st, s.p.data(), s.m.data(), s.v.data(), grad.data(), w.data(), n);
      const double lr = st.lr, wd = st.weight_decay, b1 = st.beta1, b2 = st.beta2;
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      for (int64_t i = 0; i < n; ++i) {
        const double g = static_cast<double>(grad[i]) * st.grad_scale;
        p[i] *= 1 - lr * wd;
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        p[i] -= (lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + st.eps);
      }
    }
    // Each step rounds the weight and an update of size ~lr a few times in fp32 (u = 2^-24).
    const double u = std::ldexp(1.0, -24);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_FALSE(std::isnan(s.p[i]));
      const double err = std::fabs(s.p[i] - p[i]), b = 10 * 4 * u * (std::fabs(p[i]) + 1e-3);
      max_err = std::max(max_err, err / b);
      bound = std::max(bound, b);
      ASSERT_LE(err, b) << "n=" << n << " i=" << i;
      ASSERT_EQ(w[i], s.p[i]);
    }
  }
}

// bf16-pure's AdamW (bf16 weights and moments, stochastic rounding): every target, and one thread against
// two, give the scalar reference's bits. Random states at several sizes with non-finite gradients; then
// every bf16 pattern as a weight, grown by 0.2% through a negative weight decay so that the updated values
// have low bits to round: subnormals, NaN, Inf, and the largest finite values, which can round up to Inf.
// `updated`, if given, receives the reference's weights.
void expect_bf16_sr_targets_match_scalar(const AdamStep& st, const std::vector<bf16_t>& w0, const std::vector<bf16_t>& grad,
                                         std::vector<bf16_t>* updated = nullptr) {
  const int64_t n = static_cast<int64_t>(w0.size());
  const uint64_t seed = 0x5EEDull, counter = 3 * 1048577ull + 12345;
  auto m0 = values<bf16_t>(n, 2, 1e-3), v0 = std::vector<bf16_t>(n);
  for (int64_t i = 0; i < n; ++i) v0[i] = from_f32<bf16_t>(static_cast<float>(std::fabs(datasets::normal(4, i))) * 1e-4f);
  auto w_ref = w0, m_ref = m0, v_ref = v0;
  model::cpu_adamw_bf16_sr_scalar(st, w_ref.data(), m_ref.data(), v_ref.data(), grad.data(), n, seed, counter);
  if (n >= 64) {
    ASSERT_FALSE(same_bits(w_ref, w0)) << "n=" << n << ": the step left every weight unchanged";
  }
  const int threads_before = omp_get_max_threads();
  for (int64_t target : simd::available_targets()) {
    simd::restrict_to(target);
    for (int threads : {1, 2}) {
      auto w = w0, m = m0, v = v0;
      omp_set_num_threads(threads);
      model::cpu_adamw_bf16_sr(st, w.data(), m.data(), v.data(), grad.data(), n, seed, counter);
      const std::string what = simd::name_of(target) + " n=" + std::to_string(n) + " threads=" + std::to_string(threads);
      EXPECT_TRUE(same_bits(w, w_ref)) << what << " weights";
      EXPECT_TRUE(same_bits(m, m_ref)) << what << " m";
      EXPECT_TRUE(same_bits(v, v_ref)) << what << " v";
    }
  }
  omp_set_num_threads(threads_before);
  simd::restrict_to(0);
  if (updated) *updated = w_ref;
}

TEST(CpuAdam, Bf16PureEveryTargetAndThreadCountEqualsTheScalarReference) {
  for (int64_t n : {int64_t{1}, int64_t{22}, int64_t{64}, int64_t{1000}, int64_t{16384 + 37}, int64_t{1048577}}) {
    auto grad = values<bf16_t>(n, 3, 1e-2);
    if (n >= 8) {
      grad[1] = from_f32<bf16_t>(std::numeric_limits<float>::infinity());
      grad[n / 2] = from_f32<bf16_t>(std::numeric_limits<float>::quiet_NaN());
    }
    expect_bf16_sr_targets_match_scalar(step_at(3), values<bf16_t>(n, 1, 1.0), grad);
  }
  std::vector<bf16_t> every(65536);
  for (int64_t i = 0; i < 65536; ++i) every[i] = bf16_t{static_cast<uint16_t>(i)};
  AdamStep grow = step_at(3);
  grow.weight_decay = -0.002f / grow.lr;
  std::vector<bf16_t> w;
  expect_bf16_sr_targets_match_scalar(grow, every, values<bf16_t>(65536, 3, 1e-2), &w);
  // The pattern sweep reaches the case it is for: some finite weights round up to Inf.
  ASSERT_EQ(w.size(), every.size());
  int to_inf = 0;
  for (int i = 0; i < 65536; ++i) to_inf += (every[i].bits & 0x7FFF) < 0x7F80 && (w[i].bits & 0x7FFF) == 0x7F80;
  EXPECT_GT(to_inf, 0) << "no finite weight rounded up to Inf";
}

// The stochastic rounding is unbiased: a million copies of one parameter, each an update far below one bf16
// step of the weight, average to the fp32 update within 5 standard errors of the rounding; rounding to
// nearest would leave every copy unchanged. Another seed or step gives other bits.
TEST(CpuAdam, Bf16PureRoundingAveragesToTheFp32Update) {
  const int64_t n = 1 << 20;
  const bf16_t w_start = from_f32<bf16_t>(1.f);  // bf16 step above 1: 2^-7
  std::vector<bf16_t> w(n, w_start), m(n, bf16_t{0}), v(n, bf16_t{0}), grad(n, from_f32<bf16_t>(0.5f));
  AdamStep st = step_at(1);
  st.weight_decay = 0;
  st.grad_scale = 1;
  float p = 1.f, mi = 0, vi = 0;
  model::adamw_step(p, 0.5f, mi, vi, st.lr, st.beta1, st.beta2, st.eps, st.weight_decay, st.bc1, st.bc2);
  model::cpu_adamw_bf16_sr(st, w.data(), m.data(), v.data(), grad.data(), n, 7, 0);
  double mean = 0;
  for (const bf16_t x : w) mean += to_f32(x);
  mean /= n;
  const double ulp = std::ldexp(1.0, -8);  // the step below 1, where the updated weight lies
  const double q = (1.0 - p) / ulp;          // the share of copies that must round down
  ASSERT_GT(q, 0.01);
  ASSERT_LT(q, 0.99);
  EXPECT_NEAR(mean, p, 5 * ulp * std::sqrt(q * (1 - q) / n)) << "fp32 update " << p;
  std::vector<bf16_t> w2(n, w_start), m2(n, bf16_t{0}), v2(n, bf16_t{0});
  model::cpu_adamw_bf16_sr(st, w2.data(), m2.data(), v2.data(), grad.data(), n, 8, 0);
  EXPECT_FALSE(same_bits(w, w2)) << "seeds 7 and 8 gave the same rounding";
}

}  // namespace
}  // namespace memtrade
