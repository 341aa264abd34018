// The vector exp of the CPU softmax kernels: tile_math.hpp's exp_approx lane for lane, on every Highway
// target, so that vector and scalar code give the same bits. Per-target header (Highway's -inl.h
// pattern): include it after <hwy/highway.h> in a file compiled with foreach_target; ExpApprox lives in
// memtrade::simd::HWY_NAMESPACE.
#if defined(MEMTRADE_ATTENTION_SIMD_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MEMTRADE_ATTENTION_SIMD_EXP_INL_H_
#undef MEMTRADE_ATTENTION_SIMD_EXP_INL_H_
#else
#define MEMTRADE_ATTENTION_SIMD_EXP_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace memtrade::simd {
namespace HWY_NAMESPACE {

// 0 below -87.3 (and for -inf), NaN stays NaN.
template <class DF, class VF = hwy::HWY_NAMESPACE::Vec<DF>>
HWY_INLINE VF ExpApprox(DF df, VF x) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToSigned<DF> di;
  const VF lo = hn::Set(df, -87.3f);
  const auto under = hn::Lt(x, lo);
  const VF xc = hn::IfThenElse(under, lo, x);
  const VF k = hn::Floor(hn::MulAdd(xc, hn::Set(df, 1.44269504088896341f), hn::Set(df, 0.5f)));
  const VF r = hn::NegMulAdd(k, hn::Set(df, 1.42860682030941723e-6f), hn::NegMulAdd(k, hn::Set(df, 0.693145751953125f), xc));
  VF p = hn::Set(df, 1.f / 5040.f);
  for (const float coef : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) p = hn::MulAdd(p, r, hn::Set(df, coef));
  const VF scale = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, k), hn::Set(di, 127))));
  return hn::IfThenZeroElse(under, hn::Mul(p, scale));
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::simd
HWY_AFTER_NAMESPACE();

#endif  // MEMTRADE_ATTENTION_SIMD_EXP_INL_H_
