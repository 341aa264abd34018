// Vector decodes of 8-bit codes (int8, OCP fp8) and of nf4-dq absmax, shared by the Highway kernels that
// read them: the quant matvecs and the KV cache's decode attention. Per-target header (Highway's -inl.h
// pattern): include it after <hwy/highway.h> in a file compiled with foreach_target; the helpers live in
// memtrade::quant::simd::HWY_NAMESPACE.
#if defined(MEMTRADE_QUANT_SIMD_CODES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MEMTRADE_QUANT_SIMD_CODES_INL_H_
#undef MEMTRADE_QUANT_SIMD_CODES_INL_H_
#else
#define MEMTRADE_QUANT_SIMD_CODES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "common/simd/convert-inl.h"
#include "impls/quant/formats.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::quant::simd {
namespace HWY_NAMESPACE {
namespace codes {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
}  // namespace codes

// Lanes(DF) codes from p as int32 (8-bit formats: one byte each; 4-bit formats: the byte that holds
// elements 2j and 2j + 1).
HWY_INLINE codes::VI load_bytes_i32(const uint8_t* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::Rebind<uint8_t, codes::DF> du8;
  return hn::BitCast(codes::DI(), hn::PromoteTo(codes::DU(), hn::LoadU(du8, p)));
}

// Unscaled values u (dequantized value = scale * u) of Lanes(DF) 8-bit codes: int8 q, fp8 decode(q), bit
// for bit the scalar decodes of formats.hpp. kNan: the non-finite codes decode as the scalar decode gives
// them, E4M3's S.1111.111 to NaN, E5M2's S.11111.mm to Inf or NaN (a KV record of a NaN input); without it
// the codes are taken to be finite (quantized weights never hold NaN).
template <Format F, bool kNan = false>
HWY_INLINE codes::VF decode8(const uint8_t* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const codes::DF df;
  const codes::DI di;
  if constexpr (F == Format::int8) {
    const hn::Rebind<int8_t, codes::DF> di8;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p))));
  } else {
    // The scalar decode's bit placement: the code sign-extended, shifted so that its exponent and
    // mantissa bits lie under a float's exponent, the copies of the sign between them and the sign bit
    // cleared, then times 2^(127 - bias) (the product carries the sign).
    static_assert(F == Format::fp8_e4m3 || F == Format::fp8_e5m2);
    constexpr int shift = F == Format::fp8_e4m3 ? 20 : 21;
    const hn::Rebind<int8_t, codes::DF> di8;
    const codes::VI c = hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p)));
    const codes::VI bits = hn::And(hn::ShiftLeft<shift>(c), hn::Set(di, static_cast<int32_t>(0x80000000u | (0x7Fu << shift))));
    const codes::VF v = hn::Mul(hn::BitCast(df, bits), hn::Set(df, F == Format::fp8_e4m3 ? 0x1p120f : 0x1p112f));
    if constexpr (kNan && F == Format::fp8_e4m3) {  // S.1111.111, +-480 above, made a NaN of the same sign
      const auto is_nan = hn::RebindMask(df, hn::Eq(hn::And(c, hn::Set(di, 0x7F)), hn::Set(di, 0x7F)));
      return hn::Or(v, hn::IfThenElseZero(is_nan, hn::NaN(df)));
    } else if constexpr (kNan) {  // S.11111.mm, a finite 2^16 x 1.mm above: Inf (mm = 0) or NaN, as fp8_decode
      const auto special = hn::RebindMask(df, hn::Eq(hn::And(c, hn::Set(di, 0x7C)), hn::Set(di, 0x7C)));
      const auto quiet = hn::IfThenElseZero(hn::Ne(hn::And(c, hn::Set(di, 0x3)), hn::Zero(di)), hn::Set(di, 0x00400000));
      return hn::IfThenElse(special, hn::BitCast(df, hn::Or(hn::Or(bits, hn::Set(di, 0x7F800000)), quiet)), v);
    }
    return v;
  }
}

// Lanes(df) stored fp16 scales as float: convert-inl.h's widening (F16C where the target has it), exact
// half_bits_to_float on every target. Highway's own f16 promotion on targets without F16C (SSE4, SSSE3)
// turns a NaN or Inf finite.
template <class DF>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> scales_f16(DF df, const uint8_t* p) {
  return memtrade::simd::HWY_NAMESPACE::LoadF32(df, reinterpret_cast<const f16_t*>(p));
}
// One stored fp16 scale as float.
HWY_INLINE float scale_f16(const uint8_t* p) { return hwy::HWY_NAMESPACE::GetLane(scales_f16(hwy::HWY_NAMESPACE::CappedTag<float, 1>(), p)); }

// nf4 double quantization: the absmax of the eight groups i .. i + 7 (flat indices) decoded as nf4_dq_absmax
// does, bit for bit (the product rounded, then the mean added, then clamped at 0), in vectors where the
// eight share a block of nf4_dq_block, one by one otherwise.
HWY_INLINE void nf4_dq_absmax8(const QLayout& L, const uint8_t* blob, float mean, int64_t i, float* out) {
  const auto* q8 = reinterpret_cast<const int8_t*>(blob + L.scales.offset + i);
#if HWY_TARGET != HWY_SCALAR && HWY_ARCH_X86
  if (i / nf4_dq_block == (i + 7) / nf4_dq_block) {
    namespace hn = hwy::HWY_NAMESPACE;
    const float s8 = load_bytes<float>(blob + L.dq_scales.offset + 4 * (i / nf4_dq_block));
    const hn::CappedTag<float, 8> df;
    const hn::Rebind<int32_t, decltype(df)> di;
    const hn::Rebind<int8_t, decltype(df)> d8;
    for (int64_t j = 0; j < 8; j += static_cast<int64_t>(hn::Lanes(df))) {
      auto t = hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, q8 + j))), hn::Set(df, s8));
      asm volatile("" : "+x"(t.raw));  // the product stays rounded: no fma with the addition below
      hn::StoreU(hn::Max(hn::Add(t, hn::Set(df, mean)), hn::Zero(df)), df, out + j);
    }
    return;
  }
#endif
  for (int64_t j = 0; j < 8; ++j)
    out[j] = nf4_dq_absmax(q8[j], load_bytes<float>(blob + L.dq_scales.offset + 4 * ((i + j) / nf4_dq_block)), mean);
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::quant::simd
HWY_AFTER_NAMESPACE();

#endif  // MEMTRADE_QUANT_SIMD_CODES_INL_H_
