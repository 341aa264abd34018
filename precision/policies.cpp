#include "precision/policies.hpp"

#include <cfloat>
#include <cmath>
#include <string>

namespace memtrade::precision {

Policy parse_policy(std::string_view s) {
  std::string expected;
  for (Policy p : all_policies) {
    if (s == policy_name(p)) return p;
    expected += expected.empty() ? "" : ", ";
    expected += policy_name(p);
  }
  throw Error("unknown precision policy '" + std::string(s) + "' (expected one of " + expected + ")");
}

namespace {

// A double at or above this rounds to +Inf as a float: it is halfway between FLT_MAX = 0x1.fffffep127
// and 2^128, and the tie goes to the even 2^128, which is out of range.
constexpr double kFloatOverflow = 0x1.ffffffp127;

// static_cast<float>(v) for v >= 0, with the out-of-range case (undefined for the cast) made +Inf.
float to_float_or_inf(double v) { return v < kFloatOverflow ? static_cast<float>(v) : INFINITY; }

}  // namespace

LossScaler::LossScaler(double init_scale, double growth_factor, double backoff_factor, int64_t growth_interval,
                       bool enabled)
    : growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      enabled_(enabled) {
  // Negated comparisons so that NaN is rejected.
  if (!(init_scale > 0.0) || !(init_scale <= FLT_MAX) || static_cast<float>(init_scale) == 0.f)
    throw Error("LossScaler: init_scale must be positive and finite as a float (got " + std::to_string(init_scale) +
                ")");
  if (!(growth_factor > 1.0) || !std::isfinite(growth_factor))
    throw Error("LossScaler: growth_factor must be finite and > 1 (got " + std::to_string(growth_factor) + ")");
  if (!(backoff_factor > 0.0 && backoff_factor < 1.0))
    throw Error("LossScaler: backoff_factor must be in (0, 1) (got " + std::to_string(backoff_factor) + ")");
  if (growth_interval < 1)
    throw Error("LossScaler: growth_interval must be >= 1 (got " + std::to_string(growth_interval) + ")");
  scale_ = enabled ? static_cast<float>(init_scale) : 1.f;
}

LossScaler LossScaler::for_policy(Policy p) {
  LossScaler s;
  s.enabled_ = traits(p).loss_scaling;
  if (!s.enabled_) s.scale_ = 1.f;
  return s;
}

bool LossScaler::update(bool found_non_finite) {
  last_non_finite_ = found_non_finite;
  bool apply = true;
  if (!enabled_) {
    if (found_non_finite) ++non_finite_applied_;
  } else if (found_non_finite) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * backoff_factor_);  // shrinks: no overflow
    growth_tracker_ = 0;
    ++skipped_steps_;
    apply = false;
  } else if (++growth_tracker_ == growth_interval_) {
    const float grown = to_float_or_inf(static_cast<double>(scale_) * growth_factor_);
    if (is_finite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  history_.push_back(scale_);
  return apply;
}

double underflow_fraction_fp16(std::span<const float> grads) {
  std::size_t nonzero = 0, underflow = 0;
  for (float g : grads) {
    if (g == 0.f) continue;  // +-0; NaN compares unequal and counts as nonzero
    ++nonzero;
    if (f16_rounds_to_zero(g)) ++underflow;
  }
  return nonzero == 0 ? 0.0 : static_cast<double>(underflow) / static_cast<double>(nonzero);
}

}  // namespace memtrade::precision
