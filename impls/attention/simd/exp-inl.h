// The vector exp of the CPU softmax kernels: tile_math.hpp's exp_approx step for step on every Highway
// target, its multiply-adds fused where the target has FMA (AVX2, AVX-512, NEON) as on CUDA, so it may
// differ from the scalar host code in the last bit (tests/test_attention.cpp checks both models).
// Per-target header (Highway's -inl.h pattern): include it after <hwy/highway.h> in a file compiled with
// foreach_target; ExpApprox lives in memtrade::simd::HWY_NAMESPACE.
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

// k (a float holding an integer) to int32 by truncation. Lanes where k is beyond the int32 range are
// undefined here (x86 gives INT32_MIN; Highway's ConvertTo saturates, at four instructions more): the
// callers mask them or only reach them for x above exp's range.
template <class DI, class VF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DI> TruncateToInt(DI di, VF k) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  constexpr size_t kBytes = sizeof(k.raw);
  if constexpr (kBytes == 16) return hwy::HWY_NAMESPACE::Vec<DI>{_mm_cvttps_epi32(k.raw)};
#if HWY_TARGET <= HWY_AVX2
  if constexpr (kBytes == 32) return hwy::HWY_NAMESPACE::Vec<DI>{_mm256_cvttps_epi32(k.raw)};
#endif
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kBytes == 64) return hwy::HWY_NAMESPACE::Vec<DI>{_mm512_cvttps_epi32(k.raw)};
#endif
#endif
  return hwy::HWY_NAMESPACE::ConvertTo(di, k);
}

// 0 below -87.3 (and for -inf), NaN stays NaN. Lanes below -87.3 are computed unclamped and then
// zeroed, where the scalar clamps first; every other lane starts from the same x as the scalar's.
template <class DF, class VF = hwy::HWY_NAMESPACE::Vec<DF>>
HWY_INLINE VF ExpApprox(DF df, VF x) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::RebindToSigned<DF> di;
  const auto under = hn::Lt(x, hn::Set(df, -87.3f));
  const VF k = hn::Floor(hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), hn::Set(df, 0.5f)));
  const VF r = hn::NegMulAdd(k, hn::Set(df, 1.42860682030941723e-6f), hn::NegMulAdd(k, hn::Set(df, 0.693145751953125f), x));
  VF p = hn::Set(df, 1.f / 5040.f);
  for (const float coef : {1.f / 720.f, 1.f / 120.f, 1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) p = hn::MulAdd(p, r, hn::Set(df, coef));
  const VF scale = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(TruncateToInt(di, k), hn::Set(di, 127))));
  return hn::IfThenZeroElse(under, hn::Mul(p, scale));
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::simd
HWY_AFTER_NAMESPACE();

#endif  // MEMTRADE_ATTENTION_SIMD_EXP_INL_H_
