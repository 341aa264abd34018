// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/simd/grad_add.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/dtype.hpp"
#include "common/simd/convert-inl.h"
#include "common/simd/grad_add.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class G>
GradAddCounts GradAdd(const float* HWY_RESTRICT r, G* HWY_RESTRICT g, int64_t n) {
  const hn::ScalableTag<float> df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto zero = hn::Zero(df), tiny = hn::Set(df, 0x1p-25f);
  GradAddCounts c;
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(df, r + i);
    StoreAs(hn::Add(LoadF32(g + i), v), g + i);
    const auto nonzero = hn::Not(hn::Eq(v, zero));  // NaN != 0, as in the scalar loop
    c.nonzero += static_cast<int64_t>(hn::CountTrue(df, nonzero));
    c.f16_underflow += static_cast<int64_t>(hn::CountTrue(df, hn::And(nonzero, hn::Le(hn::Abs(v), tiny))));
  }
  for (; i < n; ++i) {
    const float v = r[i];
    c.nonzero += v != 0.f;
    c.f16_underflow += v != 0.f && f16_rounds_to_zero(v);
    g[i] = from_f32<G>(to_f32(g[i]) + v);
  }
  return c;
}

// Highway's export takes plain functions: one per gradient type.
GradAddCounts GradAddF32(const float* r, float* g, int64_t n) { return GradAdd(r, g, n); }
GradAddCounts GradAddBF16(const float* r, bf16_t* g, int64_t n) { return GradAdd(r, g, n); }
GradAddCounts GradAddF16(const float* r, f16_t* g, int64_t n) { return GradAdd(r, g, n); }

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::simd {

HWY_EXPORT(GradAddF32);
HWY_EXPORT(GradAddBF16);
HWY_EXPORT(GradAddF16);

GradAddCounts grad_add(const float* r, float* g, int64_t n) { return HWY_DYNAMIC_DISPATCH(GradAddF32)(r, g, n); }
GradAddCounts grad_add(const float* r, bf16_t* g, int64_t n) { return HWY_DYNAMIC_DISPATCH(GradAddBF16)(r, g, n); }
GradAddCounts grad_add(const float* r, f16_t* g, int64_t n) { return HWY_DYNAMIC_DISPATCH(GradAddF16)(r, g, n); }

}  // namespace memtrade::simd
#endif
