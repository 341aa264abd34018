// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/simd/convert.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/simd/convert-inl.h"
#include "common/simd/convert.hpp"

#include <algorithm>

HWY_BEFORE_NAMESPACE();
namespace memtrade::simd {
namespace HWY_NAMESPACE {

template <class S, class D>
void Convert(const S* HWY_RESTRICT src, D* HWY_RESTRICT dst, int64_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
  const int64_t N = static_cast<int64_t>(hn::Lanes(cvt::DF()));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    StoreAs(LoadF32(src + i), dst + i);
  }
  for (; i < n; ++i) dst[i] = memtrade::from_f32<D>(memtrade::to_f32(src[i]));
}

void BF16ToF32(const bf16_t* src, float* dst, int64_t n) { Convert(src, dst, n); }
void F16ToF32(const f16_t* src, float* dst, int64_t n) { Convert(src, dst, n); }
void F32ToBF16(const float* src, bf16_t* dst, int64_t n) { Convert(src, dst, n); }
void F32ToF16(const float* src, f16_t* dst, int64_t n) { Convert(src, dst, n); }

// The tail goes through the vector rounding too, from a zero-padded copy.
void F32ToBF16Stochastic(const float* HWY_RESTRICT src, const uint32_t* HWY_RESTRICT random, bf16_t* HWY_RESTRICT dst,
                         int64_t n) {
  namespace hn = hwy::HWY_NAMESPACE;
  const cvt::DF df;
  const cvt::DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) StoreBF16Stochastic(hn::LoadU(df, src + i), hn::LoadU(du, random + i), dst + i);
  if (i == n) return;
  HWY_ALIGN float x[hn::MaxLanes(df)] = {};
  HWY_ALIGN uint32_t r[hn::MaxLanes(df)] = {};
  bf16_t out[hn::MaxLanes(df)];
  std::copy(src + i, src + n, x);
  std::copy(random + i, random + n, r);
  StoreBF16Stochastic(hn::Load(df, x), hn::Load(du, r), out);
  std::copy(out, out + (n - i), dst + i);
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::simd {

HWY_EXPORT(BF16ToF32);
HWY_EXPORT(F16ToF32);
HWY_EXPORT(F32ToBF16);
HWY_EXPORT(F32ToF16);
HWY_EXPORT(F32ToBF16Stochastic);

void to_f32(const bf16_t* src, float* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(BF16ToF32)(src, dst, n); }
void to_f32(const f16_t* src, float* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F16ToF32)(src, dst, n); }
void from_f32(const float* src, bf16_t* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToBF16)(src, dst, n); }
void from_f32(const float* src, f16_t* dst, int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToF16)(src, dst, n); }
void from_f32_stochastic(const float* src, const uint32_t* random, bf16_t* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToBF16Stochastic)(src, random, dst, n);
}

}  // namespace memtrade::simd
#endif
