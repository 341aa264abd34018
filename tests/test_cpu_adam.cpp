// The host AdamW (model/cpu_adam.hpp): every SIMD target gives the scalar reference's bits for every
// gradient and weight type, and ten steps follow a float64 AdamW written from PyTorch's update formula.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace memtrade
