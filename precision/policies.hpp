// Mixed-precision building blocks for the training step: the precision policies and what each one
// stores per parameter, PyTorch GradScaler's dynamic loss scaling, and element helpers (unscale,
// finiteness test, stochastic rounding to bf16) usable on the host and in CUDA kernels.
//
// Policies (AdamW; "weights" is the copy the forward/backward pass reads, gradients are produced in
// that same dtype):
//   fp32                everything fp32, no separate master copy.
//   bf16-mixed          bf16 weights and activations for compute; fp32 master weights and Adam moments.
//   fp16-mixed          fp16 compute; fp32 master weights and moments; dynamic loss scaling.
//   fp16-mixed-noscale  fp16-mixed without loss scaling: small gradients underflow to 0 and a step with
//                       non-finite gradients is applied (see LossScaler), the failure modes scaling prevents.
//   bf16-pure           bf16 weights and moments, no master copy; the update is rounded to bf16
//                       stochastically so that updates smaller than half a bf16 ulp are not always lost.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/common.hpp"
#include "common/dtype.hpp"

namespace memtrade::precision {

enum class Policy { fp32, bf16_mixed, fp16_mixed, fp16_mixed_noscale, bf16_pure };

inline constexpr Policy all_policies[] = {Policy::fp32, Policy::bf16_mixed, Policy::fp16_mixed,
                                          Policy::fp16_mixed_noscale, Policy::bf16_pure};

constexpr const char* policy_name(Policy p) {
  switch (p) {
    case Policy::fp32: return "fp32";
    case Policy::bf16_mixed: return "bf16-mixed";
    case Policy::fp16_mixed: return "fp16-mixed";
    case Policy::fp16_mixed_noscale: return "fp16-mixed-noscale";
    case Policy::bf16_pure: return "bf16-pure";
  }
  return "?";
}

// The inverse of policy_name; throws Error listing the valid names.
Policy parse_policy(std::string_view s);

struct PolicyTraits {
  DType compute;             // dtype of the GEMM / attention inputs (activations, working weights)
  DType weights;             // the stored working copy of the weights; gradients have this dtype too
  bool master_fp32;          // a separate fp32 master copy receives the optimizer update
  DType moments;             // AdamW's first and second moments
  bool loss_scaling;         // dynamic loss scaling (LossScaler enabled)
  bool stochastic_rounding;  // the weight update is rounded to `weights` stochastically
};

constexpr PolicyTraits traits(Policy p) {
  switch (p) {
    case Policy::fp32: return {DType::f32, DType::f32, false, DType::f32, false, false};
    case Policy::bf16_mixed: return {DType::bf16, DType::bf16, true, DType::f32, false, false};
    case Policy::fp16_mixed: return {DType::f16, DType::f16, true, DType::f32, true, false};
    case Policy::fp16_mixed_noscale: return {DType::f16, DType::f16, true, DType::f32, false, false};
    case Policy::bf16_pure: return {DType::bf16, DType::bf16, false, DType::bf16, false, true};
  }
  return {DType::f32, DType::f32, false, DType::f32, false, false};
}

// Bytes of model state per parameter under AdamW: weights + gradients + fp32 master + 2 moments
// (activations, workspace and fragmentation not included).
//   fp32:                                4 + 4 + 0 + 2*4 = 16
//   bf16-mixed, fp16-mixed(-noscale):    2 + 2 + 4 + 2*4 = 16  (ZeRO's "2 + 2 + 12": the mixed
//                                        policies save activation memory and bandwidth, not model state)
//   bf16-pure:                           2 + 2 + 0 + 2*2 = 8
constexpr double model_state_bytes_per_param(Policy p) {
  const PolicyTraits t = traits(p);
  const std::size_t weights = dtype_size(t.weights);
  const std::size_t grads = dtype_size(t.weights);
  const std::size_t master = t.master_fp32 ? dtype_size(DType::f32) : 0;
  const std::size_t moments = 2 * dtype_size(t.moments);
  return static_cast<double>(weights + grads + master + moments);
}

// Dynamic loss scaling with exactly the semantics of PyTorch's torch.amp.GradScaler
// (_amp_update_scale_): the loss is multiplied by scale() before backward, gradients are multiplied
// by inv_scale() (see unscale) and checked for Inf/NaN, then update(found_non_finite):
//   non-finite: scale *= backoff_factor, growth tracker = 0, the step is skipped (returns false);
//   otherwise:  tracker += 1; when it reaches growth_interval, scale *= growth_factor if the result
//               (computed in double, then rounded to float as PyTorch does) is finite, and the
//               tracker resets to 0 whether or not the scale grew; returns true.
// The scale is a float, like PyTorch's scale tensor. As in PyTorch nothing stops repeated backoff from
// reaching subnormals and eventually 0 (from 1.0, 150 consecutive overflows with backoff 0.5).
//
// Disabled (the fp32, bf16 and fp16-mixed-noscale policies): scale() is 1 and never changes, and
// update() always returns true: the optimizer applies the step even when a gradient is non-finite,
// as PyTorch does with a disabled scaler. That is deliberate for fp16-mixed-noscale, whose point is
// to show what loss scaling prevents. It is not silent: last_update_non_finite() and
// non_finite_steps_applied() report it.
class LossScaler {
 public:
  explicit LossScaler(double init_scale = 65536.0, double growth_factor = 2.0, double backoff_factor = 0.5,
                      int64_t growth_interval = 2000, bool enabled = true);

  // A scaler with the default hyperparameters, enabled iff the policy uses loss scaling.
  static LossScaler for_policy(Policy p);

  float scale() const { return scale_; }
  // 1 / scale computed in double and rounded to float, as GradScaler.unscale_ does.
  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale_)); }

  // Records one optimizer step's gradient check. Returns whether the step is to be applied.
  bool update(bool found_non_finite);

  bool enabled() const { return enabled_; }
  double growth_factor() const { return growth_factor_; }
  double backoff_factor() const { return backoff_factor_; }
  int64_t growth_interval() const { return growth_interval_; }

  int64_t steps() const { return static_cast<int64_t>(history_.size()); }  // update() calls
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t growth_tracker() const { return growth_tracker_; }  // consecutive finite steps since the last change
  bool last_update_non_finite() const { return last_non_finite_; }
  int64_t non_finite_steps_applied() const { return non_finite_applied_; }  // only when disabled
  const std::vector<float>& history() const { return history_; }            // scale() after each update

 private:
  float scale_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  bool enabled_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t non_finite_applied_ = 0;
  bool last_non_finite_ = false;
  std::vector<float> history_;
};

// ---- element helpers, host and device ----

// A gradient of the scaled loss brought back to the true scale: g * inv_scale (in float, as PyTorch).
MT_HD float unscale(float g, float inv_scale) { return g * inv_scale; }

// False for +-Inf and NaN (exponent bits all ones). A bit test: no libm call, unaffected by fast-math.
MT_HD bool is_finite(float x) { return (memtrade::detail::float_as_bits(x) & 0x7F800000u) != 0x7F800000u; }

// Stochastic rounding of x to bf16: the low 16 bits of random_bits (which must be uniform) are added
// to the 16 fp32 bits that bf16 drops, then those bits are truncated. fp32 bits are monotonic in the
// magnitude and a carry moves to the next bf16 value (also across a binade, where the spacing of the
// dropped bits is the lower binade's), so with L = x's dropped bits x rounds away from zero to the
// next bf16 neighbour with probability exactly L / 65536 and otherwise towards zero:
//   E[result] == x  for every finite |x| <= bf16_max (subnormals included).
// Above bf16_max the upper neighbour is Inf. Exact bf16 values (L = 0) are returned unchanged; signed
// zeros keep their sign; Inf stays Inf and NaN stays NaN (converted as to_bf16 does).
MT_HD bf16_t round_bf16_stochastic(float x, uint32_t random_bits) {
  const uint32_t u = memtrade::detail::float_as_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) return to_bf16(x);
  // No overflow of u: |x| < 2^128 gives u < 0xFF800000, and u + 0xFFFF stays below 2^32.
  return bf16_t{static_cast<uint16_t>((u + (random_bits & 0xFFFFu)) >> 16)};
}

// ---- host ----

// Of the nonzero values in grads (+-0 excluded; Inf and NaN count as nonzero), the fraction that
// round to +-0 in fp16 (round to nearest even: |g| <= 2^-25). 0 when no value is nonzero. Measures the
// gradient underflow that loss scaling avoids.
double underflow_fraction_fp16(std::span<const float> grads);


}  // namespace memtrade::precision
