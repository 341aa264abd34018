// impls/precision: policies and their model-state bytes, the GradScaler state machine, and the
// host/device element helpers (is_finite, unscale, stochastic bf16 rounding, fp16 underflow).
#include "precision/policies.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "datasets/random.hpp"

using namespace memtrade;
using namespace memtrade::precision;

namespace {

uint32_t fbits(float f) { return detail::float_as_bits(f); }
float bitsf(uint32_t u) { return detail::bits_as_float(u); }
bool is_nan_bf16(bf16_t b) { return (b.bits & 0x7FFFu) > 0x7F80u; }
// Counter-based random bits: draw i of stream seed.
uint32_t rbits(uint64_t seed, uint64_t i) { return static_cast<uint32_t>(datasets::mix64(seed * 0x9E3779B97F4A7C15ull + i)); }

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no Error thrown>";
}

// ---------------------------------------------------------------- policies

TEST(PrecisionPolicy, NamesRoundTrip) {
  const char* names[] = {"fp32", "bf16-mixed", "fp16-mixed", "fp16-mixed-noscale", "bf16-pure"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_STREQ(policy_name(all_policies[i]), names[i]);
    EXPECT_EQ(parse_policy(names[i]), all_policies[i]);
  }
}

TEST(PrecisionPolicy, ParseRejectsUnknownAndListsValidNames) {
  for (const char* bad : {"", "fp16_mixed", "FP32", "bf16", "fp16-mixed-", "bf16-mixed "})
    EXPECT_THROW(parse_policy(bad), Error) << "'" << bad << "'";
  const std::string msg = message_of([] { parse_policy("fp8"); });
  EXPECT_NE(msg.find("'fp8'"), std::string::npos) << msg;
  for (const char* name : {"fp32", "bf16-mixed", "fp16-mixed", "fp16-mixed-noscale", "bf16-pure"})
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
}

TEST(PrecisionPolicy, Traits) {
  const auto f32 = traits(Policy::fp32);
  EXPECT_EQ(f32.compute, DType::f32);
  EXPECT_EQ(f32.weights, DType::f32);
  EXPECT_FALSE(f32.master_fp32);
  EXPECT_EQ(f32.moments, DType::f32);
  EXPECT_FALSE(f32.loss_scaling);
  EXPECT_FALSE(f32.stochastic_rounding);

  const auto bm = traits(Policy::bf16_mixed);
  EXPECT_EQ(bm.compute, DType::bf16);
  EXPECT_EQ(bm.weights, DType::bf16);
  EXPECT_TRUE(bm.master_fp32);
  EXPECT_EQ(bm.moments, DType::f32);
  EXPECT_FALSE(bm.loss_scaling);
  EXPECT_FALSE(bm.stochastic_rounding);

  const auto hm = traits(Policy::fp16_mixed);
  EXPECT_EQ(hm.compute, DType::f16);
  EXPECT_EQ(hm.weights, DType::f16);
  EXPECT_TRUE(hm.master_fp32);
  EXPECT_EQ(hm.moments, DType::f32);
  EXPECT_TRUE(hm.loss_scaling);
  EXPECT_FALSE(hm.stochastic_rounding);

  const auto hn = traits(Policy::fp16_mixed_noscale);
  EXPECT_EQ(hn.compute, DType::f16);
  EXPECT_EQ(hn.weights, DType::f16);
  EXPECT_TRUE(hn.master_fp32);
  EXPECT_EQ(hn.moments, DType::f32);
  EXPECT_FALSE(hn.loss_scaling);
  EXPECT_FALSE(hn.stochastic_rounding);

  const auto bp = traits(Policy::bf16_pure);
  EXPECT_EQ(bp.compute, DType::bf16);
  EXPECT_EQ(bp.weights, DType::bf16);
  EXPECT_FALSE(bp.master_fp32);
  EXPECT_EQ(bp.moments, DType::bf16);
  EXPECT_FALSE(bp.loss_scaling);
  EXPECT_TRUE(bp.stochastic_rounding);
}

TEST(PrecisionPolicy, ModelStateBytesPerParam) {
  EXPECT_EQ(model_state_bytes_per_param(Policy::fp32), 16.0);                // 4 + 4 + 0 + 2*4
  EXPECT_EQ(model_state_bytes_per_param(Policy::bf16_mixed), 16.0);          // 2 + 2 + 4 + 2*4
  EXPECT_EQ(model_state_bytes_per_param(Policy::fp16_mixed), 16.0);          // 2 + 2 + 4 + 2*4
  EXPECT_EQ(model_state_bytes_per_param(Policy::fp16_mixed_noscale), 16.0);  // 2 + 2 + 4 + 2*4
  EXPECT_EQ(model_state_bytes_per_param(Policy::bf16_pure), 8.0);            // 2 + 2 + 0 + 2*2
  static_assert(model_state_bytes_per_param(Policy::bf16_pure) == 8.0);
}

// ---------------------------------------------------------------- loss scaler

TEST(LossScaler, DefaultsArePyTorchs) {
  LossScaler s;
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.scale(), 65536.f);
  EXPECT_EQ(s.inv_scale(), 1.f / 65536.f);
  EXPECT_EQ(s.growth_factor(), 2.0);
  EXPECT_EQ(s.backoff_factor(), 0.5);
  EXPECT_EQ(s.growth_interval(), 2000);
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.f);
  EXPECT_EQ(s.growth_tracker(), 1999);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 131072.f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.steps(), 2000);
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScaler, ScriptedSequence) {
  LossScaler s(1024.0, 2.0, 0.5, 3);
  // ok ok ok | overflow | ok ok overflow | ok ok ok
  const bool non_finite[] = {false, false, false, true, false, false, true, false, false, false};
  const bool applied[] = {true, true, true, false, true, true, false, true, true, true};
  const float scale[] = {1024.f, 1024.f, 2048.f, 1024.f, 1024.f, 1024.f, 512.f, 512.f, 512.f, 1024.f};
  const int64_t tracker[] = {1, 2, 0, 0, 1, 2, 0, 1, 2, 0};
  const int64_t skipped[] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 2};
  for (int i = 0; i < 10; ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    EXPECT_EQ(s.update(non_finite[i]), applied[i]);
    EXPECT_EQ(s.scale(), scale[i]);
    EXPECT_EQ(s.growth_tracker(), tracker[i]);
    EXPECT_EQ(s.skipped_steps(), skipped[i]);
    EXPECT_EQ(s.last_update_non_finite(), non_finite[i]);
  }
  EXPECT_EQ(s.history(), std::vector<float>(scale, scale + 10));
  EXPECT_EQ(s.non_finite_steps_applied(), 0);  // an enabled scaler never applies a non-finite step
  EXPECT_EQ(s.inv_scale(), 1.f / 1024.f);
}

TEST(LossScaler, NonPowerOfTwoFactorsRoundLikePyTorch) {
  // PyTorch computes scale * factor in double and stores a float.
  LossScaler s(1000.0, 3.0, 0.1, 1);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 3000.f);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), static_cast<float>(3000.0 * 0.1));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), static_cast<float>(static_cast<double>(static_cast<float>(3000.0 * 0.1)) * 0.1));
}

TEST(LossScaler, GrowthStopsBeforeInfinity) {
  LossScaler a(0x1p127, 2.0, 0.5, 1);
  EXPECT_TRUE(a.update(false));
  EXPECT_EQ(a.scale(), 0x1p127f);  // 2^128 is Inf as a float: no growth
  EXPECT_EQ(a.growth_tracker(), 0);  // the tracker still resets, as in PyTorch
  EXPECT_TRUE(std::isfinite(a.scale()));

  LossScaler b(0x1p127, 1.5, 0.5, 2);
  b.update(false);
  EXPECT_EQ(b.scale(), 0x1p127f);
  b.update(false);
  EXPECT_EQ(b.scale(), 0x1.8p127f);  // 1.5 * 2^127 is finite
  b.update(false);
  b.update(false);
  EXPECT_EQ(b.scale(), 0x1.8p127f);  // 2.25 * 2^127 would be Inf
  EXPECT_EQ(b.growth_tracker(), 0);

  // The finiteness test is on the float result: a double product just above FLT_MAX that rounds
  // down to FLT_MAX is accepted; one past the halfway point to 2^128 is not.
  LossScaler c(0x1.fffffcp127, 1.0 + 0x1p-24, 0.5, 1);
  c.update(false);
  EXPECT_EQ(c.scale(), FLT_MAX);
  c.update(false);
  EXPECT_EQ(c.scale(), FLT_MAX);
}

TEST(LossScaler, RepeatedBackoffReachesZeroAsInPyTorch) {
  LossScaler s(1.0, 2.0, 0.5, 5);
  for (int i = 0; i < 149; ++i) EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), std::numeric_limits<float>::denorm_min());  // 2^-149
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 0.f);  // 2^-150 rounds to the even 0
  EXPECT_EQ(s.skipped_steps(), 150);
}

TEST(LossScaler, DisabledKeepsScaleOneAndReportsNonFiniteSteps) {
  LossScaler s(65536.0, 2.0, 0.5, 1, /*enabled=*/false);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1.f);
  EXPECT_EQ(s.inv_scale(), 1.f);
  EXPECT_TRUE(s.update(false));
  EXPECT_FALSE(s.last_update_non_finite());
  EXPECT_TRUE(s.update(true));  // applied, not skipped: the noscale policy's failure mode
  EXPECT_TRUE(s.last_update_non_finite());
  EXPECT_EQ(s.non_finite_steps_applied(), 1);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(s.update(false));  // interval 1 would grow if enabled
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1.f);
  EXPECT_EQ(s.skipped_steps(), 0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.non_finite_steps_applied(), 2);
  EXPECT_EQ(s.history(), std::vector<float>(8, 1.f));
}

TEST(LossScaler, ForPolicy) {
  for (Policy p : all_policies) {
    SCOPED_TRACE(policy_name(p));
    const LossScaler s = LossScaler::for_policy(p);
    EXPECT_EQ(s.enabled(), p == Policy::fp16_mixed);
    EXPECT_EQ(s.scale(), p == Policy::fp16_mixed ? 65536.f : 1.f);
    EXPECT_EQ(s.growth_interval(), 2000);
  }
}

TEST(LossScaler, RejectsBadArguments) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = INFINITY;
  for (double v : {0.0, -1.0, inf, nan, 1e39, 1e-50}) {
    const std::string msg = message_of([&] { LossScaler(v, 2.0, 0.5, 10); });
    EXPECT_NE(msg.find("init_scale"), std::string::npos) << v << ": " << msg;
  }
  for (double v : {1.0, 0.5, -2.0, inf, nan}) {
    const std::string msg = message_of([&] { LossScaler(1.0, v, 0.5, 10); });
    EXPECT_NE(msg.find("growth_factor"), std::string::npos) << v << ": " << msg;
  }
  for (double v : {0.0, 1.0, -0.5, 1.5, nan}) {
    const std::string msg = message_of([&] { LossScaler(1.0, 2.0, v, 10); });
    EXPECT_NE(msg.find("backoff_factor"), std::string::npos) << v << ": " << msg;
  }
  for (int64_t v : {int64_t{0}, int64_t{-1}}) {
    const std::string msg = message_of([&] { LossScaler(1.0, 2.0, 0.5, v); });
    EXPECT_NE(msg.find("growth_interval"), std::string::npos) << v << ": " << msg;
  }
  // Boundary values that are valid.
  EXPECT_NO_THROW(LossScaler(FLT_MAX, 1.0000001, 1e-9, 1));
  EXPECT_NO_THROW(LossScaler(0x1p-149, 2.0, 0.999, 1));
}

// ---------------------------------------------------------------- element helpers

TEST(PrecisionHelpers, IsFinite) {
  EXPECT_FALSE(is_finite(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(is_finite(-std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(is_finite(bitsf(0x7F800001u)));  // signaling NaN
  EXPECT_FALSE(is_finite(INFINITY));
  EXPECT_FALSE(is_finite(-INFINITY));
  EXPECT_TRUE(is_finite(FLT_MAX));
  EXPECT_TRUE(is_finite(-FLT_MAX));
  EXPECT_TRUE(is_finite(0.f));
  EXPECT_TRUE(is_finite(-0.f));
  EXPECT_TRUE(is_finite(std::numeric_limits<float>::denorm_min()));
  EXPECT_TRUE(is_finite(1.f));
  for (uint64_t i = 0; i < 200000; ++i) {  // random bit patterns against std::isfinite
    const float x = bitsf(rbits(7, i));
    ASSERT_EQ(is_finite(x), std::isfinite(x)) << std::hex << fbits(x);
  }
}

TEST(PrecisionHelpers, Unscale) {
  EXPECT_EQ(unscale(3.f * 1024.f, 1.f / 1024.f), 3.f);
  EXPECT_EQ(unscale(-6.f, 0.5f), -3.f);
  LossScaler s(65536.0);
  EXPECT_EQ(unscale(0.375f * s.scale(), s.inv_scale()), 0.375f);
  EXPECT_FALSE(is_finite(unscale(INFINITY, s.inv_scale())));
  EXPECT_FALSE(is_finite(unscale(std::numeric_limits<float>::quiet_NaN(), s.inv_scale())));
}

TEST(StochasticRounding, UnbiasedAndAlwaysANeighbour) {
  // 1 + 0.3 ulp; -pi; a bf16 subnormal; just below 2 (the upper neighbour is in the next binade);
  // halfway between the two largest finite bf16 values.
  const uint32_t cases[] = {0x3F804CCDu, 0xC0490FDBu, 0x00012345u, 0x3FFFC000u, 0x7F7E8000u};
  constexpr int n = 100000;
  for (uint32_t xb : cases) {
    const float x = bitsf(xb);
    SCOPED_TRACE(::testing::Message() << "x = " << x << " (0x" << std::hex << xb << ")");
    const bf16_t lo{static_cast<uint16_t>(xb >> 16)};  // truncation: towards zero
    const bf16_t hi{static_cast<uint16_t>((xb >> 16) + 1)};
    const double p = (xb & 0xFFFFu) / 65536.0;  // probability of rounding away from zero
    int n_hi = 0;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) {
      const bf16_t r = round_bf16_stochastic(x, rbits(xb, i));
      ASSERT_TRUE(r.bits == lo.bits || r.bits == hi.bits) << std::hex << r.bits;
      n_hi += r.bits == hi.bits;
      sum += to_float(r);
    }
    const double gap = std::fabs(static_cast<double>(to_float(hi)) - to_float(lo));
    const double se = gap * std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(sum / n, static_cast<double>(x), 3 * se);
    EXPECT_NEAR(static_cast<double>(n_hi) / n, p, 3 * std::sqrt(p * (1 - p) / n));
  }
}

TEST(StochasticRounding, UsesTheLow16RandomBits) {
  const float x = bitsf(0x3F800001u);  // 1 + 1 fp32 ulp: rounds up only when the random bits are 0xFFFF
  EXPECT_EQ(round_bf16_stochastic(x, 0u).bits, 0x3F80u);
  EXPECT_EQ(round_bf16_stochastic(x, 0xFFFEu).bits, 0x3F80u);
  EXPECT_EQ(round_bf16_stochastic(x, 0xFFFFu).bits, 0x3F81u);
  EXPECT_EQ(round_bf16_stochastic(x, 0xFFFF0000u).bits, 0x3F80u);
  EXPECT_EQ(round_bf16_stochastic(-x, 0xFFFFu).bits, 0xBF81u);  // away from zero for negatives too
  // Above bf16_max the upper neighbour is Inf.
  EXPECT_EQ(round_bf16_stochastic(bitsf(0x7F7F8000u), 0u).bits, 0x7F7Fu);
  EXPECT_EQ(round_bf16_stochastic(bitsf(0x7F7F8000u), 0x8000u).bits, 0x7F80u);
}

TEST(StochasticRounding, ExactValuesUnchanged) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    if ((b & 0x7F80u) == 0x7F80u) continue;  // Inf / NaN: below
    const float x = bitsf(b << 16);
    for (uint32_t r : {0u, 0x8000u, 0xFFFFu, 0xFFFFFFFFu, rbits(3, b)})
      ASSERT_EQ(round_bf16_stochastic(x, r).bits, b) << std::hex << b << " r=" << r;
  }
}

TEST(StochasticRounding, NanAndInfPreserved) {
  for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7F80FFFFu, 0xFF800001u, 0x7FFFFFFFu})
    for (uint32_t r : {0u, 1u, 0xFFFFu, 0x12345678u})
      EXPECT_TRUE(is_nan_bf16(round_bf16_stochastic(bitsf(nan), r))) << std::hex << nan << " r=" << r;
  for (uint32_t r : {0u, 0xFFFFu}) {
    EXPECT_EQ(round_bf16_stochastic(INFINITY, r).bits, 0x7F80u);
    EXPECT_EQ(round_bf16_stochastic(-INFINITY, r).bits, 0xFF80u);
  }
}

TEST(Fp16Underflow, CraftedVector) {
  const float t25 = 0x1p-25f, t24 = 0x1p-24f;
  const std::vector<float> g = {0.f,    -0.f, 0x1p-26f, -0x1p-26f, t25,  -t25, std::nextafter(t25, 1.f),
                                t24,    -t24, 1e-3f,    1.f,       -0x1p-30f, std::numeric_limits<float>::denorm_min()};
  // nonzero: 11; to 0: 2^-26, -2^-26, 2^-25, -2^-25 (ties to even), -2^-30, denorm_min = 6
  EXPECT_DOUBLE_EQ(underflow_fraction_fp16(g), 6.0 / 11.0);

  auto frac1 = [](float x) { return underflow_fraction_fp16(std::vector<float>{x}); };
  EXPECT_EQ(frac1(t25), 1.0);
  EXPECT_EQ(frac1(std::nextafter(t25, 0.f)), 1.0);
  EXPECT_EQ(frac1(std::nextafter(t25, 1.f)), 0.0);  // rounds up to 2^-24
  EXPECT_EQ(frac1(t24), 0.0);
  EXPECT_EQ(frac1(-t24), 0.0);
  EXPECT_EQ(underflow_fraction_fp16({}), 0.0);
  EXPECT_EQ(underflow_fraction_fp16(std::vector<float>{0.f, -0.f}), 0.0);
  EXPECT_DOUBLE_EQ(underflow_fraction_fp16(std::vector<float>{std::numeric_limits<float>::quiet_NaN(), INFINITY,
                                                              0x1p-30f}),
                   1.0 / 3.0);
}

TEST(Fp16Underflow, LossScalingRecoversSmallGradients) {
  constexpr int n = 20000;
  std::vector<float> g(n), scaled(n);
  LossScaler s;
  for (int i = 0; i < n; ++i) {
    g[i] = static_cast<float>(1e-8 * datasets::normal(11, i));  // |g| <= 2^-25 ~ 3e-8 for ~99.7%
    scaled[i] = g[i] * s.scale();
  }
  EXPECT_GT(underflow_fraction_fp16(g), 0.99);
  EXPECT_LT(underflow_fraction_fp16(scaled), 1e-3);
}

}  // namespace
