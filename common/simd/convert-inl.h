// Vector fp32 <-> bf16 / fp16 conversions for Highway code, bit for bit dtype.hpp's scalar ones on every
// target (round to nearest even, subnormals, Inf, NaN quieted with its top payload bits). Per-target
// header (Highway's -inl.h pattern): include it after <hwy/highway.h> in a file compiled with
// foreach_target; the helpers live in memtrade::simd::HWY_NAMESPACE. The bulk forms are in convert.hpp.
#if defined(MEMTRADE_COMMON_SIMD_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef MEMTRADE_COMMON_SIMD_CONVERT_INL_H_
#undef MEMTRADE_COMMON_SIMD_CONVERT_INL_H_
#else
#define MEMTRADE_COMMON_SIMD_CONVERT_INL_H_
#endif

#include <hwy/highway.h>

#include <type_traits>

#include "common/dtype.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::simd {
namespace HWY_NAMESPACE {
namespace cvt {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using D16 = hn::Rebind<uint16_t, DF>;
using VF = hn::Vec<DF>;

// x86 targets from AVX2 up convert fp16 with F16C: vcvtph2ps widens exactly (subnormals included, NaN
// quieted, as half_bits_to_float), vcvtps2ph rounds to nearest even (NaN quieted with its top payload bits,
// as float_to_half_bits). Elsewhere fp16 loads widen in integer operations and stores go element by
// element (StoreF16 below).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr bool kF16Hardware = true;
#else
constexpr bool kF16Hardware = false;
#endif
}  // namespace cvt

// Lanes(df) elements of p as fp32 (df: any fp32 tag of the target, e.g. a 128-bit one).
template <class DF, class T>
HWY_INLINE hwy::HWY_NAMESPACE::Vec<DF> LoadF32(DF df, const T* p) {
  namespace hn = hwy::HWY_NAMESPACE;
  using DU = hn::RebindToUnsigned<DF>;
  using DI = hn::RebindToSigned<DF>;
  using D16 = hn::Rebind<uint16_t, DF>;
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, p);
  } else if constexpr (std::is_same_v<T, bf16_t>) {  // bf16_bits_to_float: the bits on top, NaN quieted
    const DU du;
    const auto x = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(D16(), reinterpret_cast<const uint16_t*>(p)))));
    // the quiet bit set where an unordered compare finds a NaN (no arithmetic on the value, which a
    // compiler may drop as an identity)
    return hn::Or(x, hn::IfThenElseZero(hn::IsNaN(x), hn::BitCast(df, hn::Set(du, 0x00400000u))));
  } else if constexpr (cvt::kF16Hardware) {  // F16C (vcvtph2ps): exact, NaN quieted as half_bits_to_float
    static_assert(std::is_same_v<T, f16_t>);
    return hn::PromoteTo(df, hn::LoadU(hn::Rebind<hwy::float16_t, DF>(), reinterpret_cast<const hwy::float16_t*>(p)));
  } else {  // half_bits_to_float, in integer operations
    static_assert(std::is_same_v<T, f16_t>);
    const DU du;
    const DI di;
    const auto h = hn::PromoteTo(du, hn::LoadU(D16(), reinterpret_cast<const uint16_t*>(p)));
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const auto a = hn::And(h, hn::Set(du, 0x7FFFu));
    // Normal: rebias the exponent in the integer bits. Subnormal (exponent 0): mantissa x 2^-24, exact in
    // fp32 from an integer conversion (no denormal operand, which costs microcode assists on x86).
    const auto mant = hn::And(a, hn::Set(du, 0x3FFu));
    const auto normal = hn::Add(hn::ShiftLeft<13>(a), hn::Set(du, 112u << 23));
    const auto sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mant)), hn::Set(df, 0x1p-24f));
    const auto is_sub = hn::RebindMask(du, hn::Lt(hn::BitCast(di, a), hn::Set(di, 0x0400)));
    const auto finite = hn::IfThenElse(is_sub, hn::BitCast(du, sub), normal);
    const auto quiet = hn::IfThenElseZero(hn::Ne(mant, hn::Zero(du)), hn::Set(du, 0x00400000u));
    const auto special = hn::Or(hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(mant)), quiet);
    // a < 2^15: the signed comparison is the unsigned one
    const auto is_special = hn::RebindMask(du, hn::Gt(hn::BitCast(di, a), hn::Set(di, 0x7BFF)));
    return hn::BitCast(df, hn::Or(sign, hn::IfThenElse(is_special, special, finite)));
  }
}

// Lanes(DF) elements of p as fp32.
template <class T>
HWY_INLINE cvt::VF LoadF32(const T* p) {
  return LoadF32(cvt::DF(), p);
}

// fp32 -> bf16, float_to_bf16_bits's rounding (to nearest even; NaN quiet with its top payload bits). The
// rounding bias is added to the whole pattern: the carry can reach the exponent (up to Inf) but never the
// sign, except from a NaN, which takes the other branch. An arithmetic shift leaves the bf16 bits sign-
// extended, so the signed saturating narrow is exact.
HWY_INLINE void StoreBF16(cvt::VF v, bf16_t* out) {
  namespace hn = hwy::HWY_NAMESPACE;
  using namespace cvt;
  const DU du;
  const DI di;
  const auto x = hn::BitCast(du, v);
  const auto bias = hn::Add(hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u)), hn::Set(du, 0x7FFFu));
  const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(x, hn::Set(du, 0x00400000u)), hn::Add(x, bias));
  const hn::Rebind<int16_t, DI> d16;
  hn::StoreU(hn::DemoteTo(d16, hn::ShiftRight<16>(hn::BitCast(di, bits))), d16, reinterpret_cast<int16_t*>(out));
}

// fp32 -> bf16 rounded stochastically, precision::round_bf16_stochastic lane by lane: the low 16 bits of
// `random` are added to the pattern before truncation. No carry reaches the sign (|x| < 2^128), and Inf,
// whose low 16 bits are zero, stays Inf; NaN takes StoreBF16's quieting branch.
HWY_INLINE void StoreBF16Stochastic(cvt::VF v, hwy::HWY_NAMESPACE::Vec<cvt::DU> random, bf16_t* out) {
  namespace hn = hwy::HWY_NAMESPACE;
  using namespace cvt;
  const DU du;
  const DI di;
  const auto x = hn::BitCast(du, v);
  const auto add = hn::And(random, hn::Set(du, 0xFFFFu));
  const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(x, hn::Set(du, 0x00400000u)), hn::Add(x, add));
  const hn::Rebind<int16_t, DI> d16;
  hn::StoreU(hn::DemoteTo(d16, hn::ShiftRight<16>(hn::BitCast(di, bits))), d16, reinterpret_cast<int16_t*>(out));
}

// fp32 -> fp16 with F16C where the target has it; callers without it round element by element.
HWY_INLINE void StoreF16(cvt::VF v, f16_t* out) {
  namespace hn = hwy::HWY_NAMESPACE;
  if constexpr (cvt::kF16Hardware) {
    const hn::Rebind<hwy::float16_t, cvt::DF> d16;
    hn::StoreU(hn::DemoteTo(d16, v), d16, reinterpret_cast<hwy::float16_t*>(out));
  } else {
    HWY_ALIGN float tmp[hn::MaxLanes(cvt::DF())];
    hn::Store(v, cvt::DF(), tmp);
    for (size_t i = 0; i < hn::Lanes(cvt::DF()); ++i) out[i] = memtrade::to_f16(tmp[i]);
  }
}

// Lanes(DF) fp32 values stored as T (float, bf16_t or f16_t), rounded as the scalar conversions round.
template <class T>
HWY_INLINE void StoreAs(cvt::VF v, T* out) {
  if constexpr (std::is_same_v<T, float>) hwy::HWY_NAMESPACE::StoreU(v, cvt::DF(), out);
  else if constexpr (std::is_same_v<T, bf16_t>) StoreBF16(v, out);
  else StoreF16(v, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::simd
HWY_AFTER_NAMESPACE();

#endif  // MEMTRADE_COMMON_SIMD_CONVERT_INL_H_
