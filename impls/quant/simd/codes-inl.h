// Vector decodes of 8-bit codes (int8, OCP fp8) shared by the Highway kernels that read them: the quant
// matvecs and the KV cache's decode attention. Per-target header (Highway's -inl.h pattern): include it
// after <hwy/highway.h> in a file compiled with foreach_target; the helpers live in
// memtrade::quant::simd::HWY_NAMESPACE.
#if defined(MEMTRADE_QUANT_SIMD_CODES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MEMTRADE_QUANT_SIMD_CODES_INL_H_
#undef MEMTRADE_QUANT_SIMD_CODES_INL_H_
#else
#define MEMTRADE_QUANT_SIMD_CODES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

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
// for bit the scalar decodes of formats.hpp. kNan: E4M3's NaN codes (S.1111.111) decode to NaN (a KV
// record of a NaN input); without it the codes are taken to be finite (quantized weights never hold NaN).
template <Format F, bool kNan = false>
HWY_INLINE codes::VF decode8(const uint8_t* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const codes::DF df;
  const codes::DI di;
  if constexpr (F == Format::int8) {
    const hn::Rebind<int8_t, codes::DF> di8;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p))));
  } else {
    // The scalar decode's bit placement: magnitude bits under a float exponent, times 2^(127 - bias), then
    // the sign.
    static_assert(F == Format::fp8_e4m3 || F == Format::fp8_e5m2);
    constexpr int shift = F == Format::fp8_e4m3 ? 20 : 21;
    const codes::VI c = load_bytes_i32(p);
    const codes::VI low = hn::And(c, hn::Set(di, 0x7F));
    const codes::VI sign = hn::ShiftLeft<24>(hn::And(c, hn::Set(di, 0x80)));
    codes::VF v = hn::Mul(hn::BitCast(df, hn::ShiftLeft<shift>(low)), hn::Set(df, F == Format::fp8_e4m3 ? 0x1p120f : 0x1p112f));
    if constexpr (kNan) {
      static_assert(F == Format::fp8_e4m3, "NaN codes of E4M3 only");
      v = hn::IfThenElse(hn::RebindMask(df, hn::Eq(low, hn::Set(di, 0x7F))), hn::NaN(df), v);
    }
    return hn::Or(v, hn::BitCast(df, sign));
  }
}

// A stored fp16 scale as float (F16C's conversion where the target has it).
HWY_INLINE float scale_f16(const uint8_t* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::CappedTag<float, 1> d1;
  const hn::Rebind<hwy::float16_t, decltype(d1)> dh;
  return hn::GetLane(hn::PromoteTo(d1, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p))));
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::quant::simd
HWY_AFTER_NAMESPACE();

#endif  // MEMTRADE_QUANT_SIMD_CODES_INL_H_
