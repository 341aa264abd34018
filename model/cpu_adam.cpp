// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/cpu_adam.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <type_traits>

#include "model/cpu_adam.hpp"
#include "model/layers.hpp"

#ifndef MEMTRADE_CPU_ADAM_ONCE
#define MEMTRADE_CPU_ADAM_ONCE
namespace memtrade::model::detail {
// Element types as one code, so one exported function serves every (gradient, weight) pair.
enum class Elem : int { f32, bf16, f16 };
template <class T>
constexpr Elem elem_of() {
  if constexpr (std::is_same_v<T, float>) return Elem::f32;
  else if constexpr (std::is_same_v<T, bf16_t>) return Elem::bf16;
  else return Elem::f16;
}
constexpr int64_t kAdamTile = 16384;
}  // namespace memtrade::model::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memtrade::model::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;

template <class G>
HWY_INLINE VF load_grad(const G* g) {
  const DF df;
  if constexpr (std::is_same_v<G, float>) {
    return hn::LoadU(df, g);
  } else if constexpr (std::is_same_v<G, bf16_t>) {
    const hn::Rebind<uint16_t, DF> d16;
    const auto bits = hn::PromoteTo(DU(), hn::LoadU(d16, reinterpret_cast<const uint16_t*>(g)));
    return hn::BitCast(df, hn::ShiftLeft<16>(bits));  // exact (a NaN keeps its payload)
  } else {  // integer decode on every target, half_bits_to_float's values (Inf/NaN included)
    const DU du;
    const hn::Rebind<uint16_t, DF> d16;
    const auto h = hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(g)));
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const auto a = hn::And(h, hn::Set(du, 0x7FFFu));
    // Normal: rebias the exponent in the integer bits. Subnormal (exponent 0): mantissa x 2^-24, exact in
    // fp32 from an integer conversion (no denormal operand, which costs microcode assists on x86).
    const auto mant = hn::And(a, hn::Set(du, 0x3FFu));
    const auto normal = hn::Add(hn::ShiftLeft<13>(a), hn::Set(du, 112u << 23));
    const hn::RebindToSigned<DF> dis;
    const VF sub = hn::Mul(hn::ConvertTo(df, hn::BitCast(dis, mant)), hn::Set(df, 0x1p-24f));
    const auto is_sub = hn::RebindMask(du, hn::Lt(hn::BitCast(dis, a), hn::Set(dis, 0x0400)));
    const auto finite = hn::IfThenElse(is_sub, hn::BitCast(du, sub), normal);
    const auto quiet = hn::IfThenElseZero(hn::Ne(mant, hn::Zero(du)), hn::Set(du, 0x00400000u));
    const auto special = hn::Or(hn::Or(hn::Set(du, 0x7F800000u), hn::ShiftLeft<13>(mant)), quiet);
    const hn::RebindToSigned<DF> di;  // a < 2^15: the signed comparison is the unsigned one
    const auto is_special = hn::RebindMask(du, hn::Gt(hn::BitCast(di, a), hn::Set(di, 0x7BFF)));
    return hn::BitCast(df, hn::Or(sign, hn::IfThenElse(is_special, special, finite)));
  }
}

// fp32 -> bf16 bits, round to nearest even; NaN as float_to_bf16_bits makes it (quiet, top payload bits).
HWY_INLINE void store_bf16(VF p, bf16_t* out) {
  const DU du;
  const hn::RebindToSigned<DF> di;
  const auto x = hn::BitCast(du, p);
  const auto sign = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 0x8000u));
  const auto a = hn::And(x, hn::Set(du, 0x7FFFFFFFu));
  const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(a, hn::Set(du, 0x7FFFu)), hn::And(hn::ShiftRight<16>(a), hn::Set(du, 1u))));
  const auto nan = hn::Or(hn::Set(du, 0x7FC0u), hn::And(hn::ShiftRight<16>(a), hn::Set(du, 0x7Fu)));
  const auto is_nan = hn::Gt(hn::BitCast(di, a), hn::Set(di, 0x7F800000));
  const auto bits = hn::Or(sign, hn::IfThenElse(hn::RebindMask(du, is_nan), nan, rounded));
  const hn::Rebind<uint16_t, decltype(di)> d16;
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, reinterpret_cast<uint16_t*>(out));
}

// x86 targets from AVX2 up convert fp32 -> fp16 with F16C (vcvtps2ph, round to nearest even: the scalar
// rounding); elsewhere the fp16 working copies are rounded element by element after the SIMD body.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
constexpr bool kF16Hardware = true;
#else
constexpr bool kF16Hardware = false;
#endif

// One tile: the SIMD body, adamw_step for the remainder, then (without F16C) fp16 working copies element
// by element (the tile is in cache) with the exact scalar rounding.
template <class G, class W>
void tile(const AdamStep& s, float* HWY_RESTRICT p, float* HWY_RESTRICT m, float* HWY_RESTRICT v,
          const G* HWY_RESTRICT g, W* HWY_RESTRICT w, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const VF decay = hn::Set(df, s.lr * s.weight_decay), b1 = hn::Set(df, s.beta1), b2 = hn::Set(df, s.beta2);
  const VF c1 = hn::Set(df, 1.f - s.beta1), c2 = hn::Set(df, 1.f - s.beta2), lr = hn::Set(df, s.lr);
  const VF bc1 = hn::Set(df, s.bc1), bc2 = hn::Set(df, s.bc2), eps = hn::Set(df, s.eps), scale = hn::Set(df, s.grad_scale);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF grad = hn::Mul(load_grad(g + i), scale);
    VF pi = hn::LoadU(df, p + i);
    pi = hn::Sub(pi, hn::Mul(decay, pi));
    const VF mi = hn::Add(hn::Mul(b1, hn::LoadU(df, m + i)), hn::Mul(c1, grad));
    const VF vi = hn::Add(hn::Mul(b2, hn::LoadU(df, v + i)), hn::Mul(hn::Mul(c2, grad), grad));
    pi = hn::Sub(pi, hn::Div(hn::Mul(lr, hn::Div(mi, bc1)), hn::Add(hn::Sqrt(hn::Div(vi, bc2)), eps)));
    hn::StoreU(mi, df, m + i);
    hn::StoreU(vi, df, v + i);
    hn::StoreU(pi, df, p + i);
    if (w) {
      if constexpr (std::is_same_v<W, float>) {
        hn::StoreU(pi, df, w + i);
      } else if constexpr (std::is_same_v<W, bf16_t>) {
        store_bf16(pi, w + i);
      } else if constexpr (kF16Hardware) {
        const hn::Rebind<hwy::float16_t, DF> d16;
        hn::StoreU(hn::DemoteTo(d16, pi), d16, reinterpret_cast<hwy::float16_t*>(w + i));
      }
    }
  }
  for (; i < n; ++i) {
    float grad = to_f32(g[i]) * s.grad_scale;
    adamw_step(p[i], grad, m[i], v[i], s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.bc1, s.bc2);
    if (w) w[i] = from_f32<W>(p[i]);
  }
  if constexpr (std::is_same_v<W, f16_t> && !kF16Hardware)
    if (w)
      for (int64_t j = 0; j < n / N * N; ++j) w[j] = from_f32<W>(p[j]);
}

template <class G, class W>
void run(const AdamStep& s, float* p, float* m, float* v, const G* g, W* w, int64_t n) {
  const int64_t tiles = (n + kAdamTile - 1) / kAdamTile;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o = t * kAdamTile, len = std::min(kAdamTile, n - o);
    tile(s, p + o, m + o, v + o, g + o, w ? w + o : nullptr, len);
  }
}

template <class G>
void run_w(const AdamStep& s, float* p, float* m, float* v, const G* g, void* w, Elem we, int64_t n) {
  switch (we) {
    case Elem::f32: return run(s, p, m, v, g, static_cast<float*>(w), n);
    case Elem::bf16: return run(s, p, m, v, g, static_cast<bf16_t*>(w), n);
    case Elem::f16: return run(s, p, m, v, g, static_cast<f16_t*>(w), n);
  }
}

void AdamTiles(const AdamStep& s, float* p, float* m, float* v, const void* g, Elem ge, void* w, Elem we, int64_t n) {
  switch (ge) {
    case Elem::f32: return run_w(s, p, m, v, static_cast<const float*>(g), w, we, n);
    case Elem::bf16: return run_w(s, p, m, v, static_cast<const bf16_t*>(g), w, we, n);
    case Elem::f16: return run_w(s, p, m, v, static_cast<const f16_t*>(g), w, we, n);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::model::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::model {

namespace detail {
HWY_EXPORT(AdamTiles);
}

template <class G, class W>
void cpu_adamw(const AdamStep& s, float* master, float* m, float* v, const G* grad, W* weights, int64_t n) {
  HWY_DYNAMIC_DISPATCH(detail::AdamTiles)(s, master, m, v, grad, detail::elem_of<G>(), weights, detail::elem_of<W>(), n);
}

template <class G, class W>
void cpu_adamw_scalar(const AdamStep& s, float* master, float* m, float* v, const G* grad, W* weights, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(grad[i]) * s.grad_scale;
    adamw_step(master[i], g, m[i], v[i], s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.bc1, s.bc2);
    if (weights) weights[i] = from_f32<W>(master[i]);
  }
}

#define MEMTRADE_ADAM_INSTANTIATE(G, W)                                                                     \
  template void cpu_adamw<G, W>(const AdamStep&, float*, float*, float*, const G*, W*, int64_t);            \
  template void cpu_adamw_scalar<G, W>(const AdamStep&, float*, float*, float*, const G*, W*, int64_t);
MEMTRADE_ADAM_INSTANTIATE(float, float)
MEMTRADE_ADAM_INSTANTIATE(float, bf16_t)
MEMTRADE_ADAM_INSTANTIATE(float, f16_t)
MEMTRADE_ADAM_INSTANTIATE(bf16_t, float)
MEMTRADE_ADAM_INSTANTIATE(bf16_t, bf16_t)
MEMTRADE_ADAM_INSTANTIATE(bf16_t, f16_t)
MEMTRADE_ADAM_INSTANTIATE(f16_t, float)
MEMTRADE_ADAM_INSTANTIATE(f16_t, bf16_t)
MEMTRADE_ADAM_INSTANTIATE(f16_t, f16_t)
#undef MEMTRADE_ADAM_INSTANTIATE

}  // namespace memtrade::model
#endif
