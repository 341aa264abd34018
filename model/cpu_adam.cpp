// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/cpu_adam.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/simd/convert-inl.h"

#include <algorithm>
#include <type_traits>

#include "datasets/random.hpp"
#include "model/cpu_adam.hpp"
#include "model/layers.hpp"
#include "precision/policies.hpp"

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

// bf16-pure: the stochastic rounding bits of element i, and one element's update (the reference, and the
// vector tile's remainder).
inline uint32_t sr_bits(uint64_t seed, uint64_t i) {
  return static_cast<uint32_t>(datasets::mix64(seed ^ datasets::mix64(i)));
}
inline void bf16_sr_element(const AdamStep& s, bf16_t& w, bf16_t& m, bf16_t& v, bf16_t g, uint32_t bits) {
  float p = to_f32(w), mi = to_f32(m), vi = to_f32(v);
  adamw_step(p, to_f32(g) * s.grad_scale, mi, vi, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.bc1, s.bc2);
  m = from_f32<bf16_t>(mi);
  v = from_f32<bf16_t>(vi);
  w = precision::round_bf16_stochastic(p, bits);
}
}  // namespace memtrade::model::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace memtrade::model::detail {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

using memtrade::simd::HWY_NAMESPACE::LoadF32;
using memtrade::simd::HWY_NAMESPACE::StoreBF16;
using memtrade::simd::HWY_NAMESPACE::StoreBF16Stochastic;
using memtrade::simd::HWY_NAMESPACE::StoreF16;
constexpr bool kF16Hardware = memtrade::simd::HWY_NAMESPACE::cvt::kF16Hardware;

// adamw_step on one vector, operation for operation: the gradient (unscaled) in, the weight and both
// moments updated in place. The broadcasts are loop invariants once inlined.
HWY_INLINE void adam_vec(const AdamStep& s, VF grad, VF& pi, VF& mi, VF& vi) {
  const DF df;
  grad = hn::Mul(grad, hn::Set(df, s.grad_scale));
  pi = hn::Sub(pi, hn::Mul(hn::Set(df, s.lr * s.weight_decay), pi));
  mi = hn::Add(hn::Mul(hn::Set(df, s.beta1), mi), hn::Mul(hn::Set(df, 1.f - s.beta1), grad));
  vi = hn::Add(hn::Mul(hn::Set(df, s.beta2), vi), hn::Mul(hn::Mul(hn::Set(df, 1.f - s.beta2), grad), grad));
  const VF m_hat = hn::Div(mi, hn::Set(df, s.bc1)), v_hat = hn::Div(vi, hn::Set(df, s.bc2));
  pi = hn::Sub(pi, hn::Div(hn::Mul(hn::Set(df, s.lr), m_hat), hn::Add(hn::Sqrt(v_hat), hn::Set(df, s.eps))));
}

// One tile: the SIMD body, adamw_step for the remainder, then (without F16C) fp16 working copies element
// by element (the tile is in cache) with the exact scalar rounding.
template <class G, class W>
void tile(const AdamStep& s, float* HWY_RESTRICT p, float* HWY_RESTRICT m, float* HWY_RESTRICT v,
          const G* HWY_RESTRICT g, W* HWY_RESTRICT w, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    VF pi = hn::LoadU(df, p + i), mi = hn::LoadU(df, m + i), vi = hn::LoadU(df, v + i);
    adam_vec(s, LoadF32(g + i), pi, mi, vi);
    hn::StoreU(mi, df, m + i);
    hn::StoreU(vi, df, v + i);
    hn::StoreU(pi, df, p + i);
    if (w) {
      if constexpr (std::is_same_v<W, float>) {
        hn::StoreU(pi, df, w + i);
      } else if constexpr (std::is_same_v<W, bf16_t>) {
        StoreBF16(pi, w + i);
      } else if constexpr (kF16Hardware) {
        StoreF16(pi, w + i);
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

// bf16-pure, one tile: the rounding bits of a block of elements first (a loop of independent 64-bit
// hashes), then the update in vectors.
void bf16_sr_tile(const AdamStep& s, bf16_t* HWY_RESTRICT w, bf16_t* HWY_RESTRICT m, bf16_t* HWY_RESTRICT v,
                  const bf16_t* HWY_RESTRICT g, int64_t n, uint64_t seed, uint64_t counter) {
  constexpr int64_t kBlock = 512;
  const DF df;
  const hn::RebindToUnsigned<DF> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN uint32_t bits[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t len = std::min(kBlock, n - b);
    for (int64_t j = 0; j < len; ++j) bits[j] = sr_bits(seed, counter + b + j);
    int64_t j = 0;
    for (; j + N <= len; j += N) {
      const int64_t i = b + j;
      VF pi = LoadF32(w + i), mi = LoadF32(m + i), vi = LoadF32(v + i);
      adam_vec(s, LoadF32(g + i), pi, mi, vi);
      StoreBF16(mi, m + i);
      StoreBF16(vi, v + i);
      StoreBF16Stochastic(pi, hn::Load(du, bits + j), w + i);
    }
    for (; j < len; ++j) bf16_sr_element(s, w[b + j], m[b + j], v[b + j], g[b + j], bits[j]);
  }
}

void AdamBf16Sr(const AdamStep& s, bf16_t* w, bf16_t* m, bf16_t* v, const bf16_t* g, int64_t n, uint64_t seed,
                uint64_t counter) {
  const int64_t tiles = (n + kAdamTile - 1) / kAdamTile;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o = t * kAdamTile, len = std::min(kAdamTile, n - o);
    bf16_sr_tile(s, w + o, m + o, v + o, g + o, len, seed, counter + static_cast<uint64_t>(o));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::model::detail
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::model {

namespace detail {
HWY_EXPORT(AdamTiles);
HWY_EXPORT(AdamBf16Sr);
// Dispatched from inside the namespace (a qualified name does not survive static dispatch's prefix).
void adam_tiles(const AdamStep& s, float* p, float* m, float* v, const void* g, Elem ge, void* w, Elem we, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AdamTiles)(s, p, m, v, g, ge, w, we, n);
}
void adam_bf16_sr(const AdamStep& s, bf16_t* w, bf16_t* m, bf16_t* v, const bf16_t* g, int64_t n, uint64_t seed,
                  uint64_t counter) {
  HWY_DYNAMIC_DISPATCH(AdamBf16Sr)(s, w, m, v, g, n, seed, counter);
}
}  // namespace detail

template <class G, class W>
void cpu_adamw(const AdamStep& s, float* master, float* m, float* v, const G* grad, W* weights, int64_t n) {
  detail::adam_tiles(s, master, m, v, grad, detail::elem_of<G>(), weights, detail::elem_of<W>(), n);
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

void cpu_adamw_bf16_sr(const AdamStep& s, bf16_t* weights, bf16_t* m, bf16_t* v, const bf16_t* grad, int64_t n,
                       uint64_t seed, uint64_t counter) {
  detail::adam_bf16_sr(s, weights, m, v, grad, n, seed, counter);
}

void cpu_adamw_bf16_sr_scalar(const AdamStep& s, bf16_t* weights, bf16_t* m, bf16_t* v, const bf16_t* grad,
                              int64_t n, uint64_t seed, uint64_t counter) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    detail::bf16_sr_element(s, weights[i], m[i], v[i], grad[i], detail::sr_bits(seed, counter + static_cast<uint64_t>(i)));
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
