// Compiled once per SIMD target by Highway's foreach_target (this file includes itself): a whole block's
// rounding runs in vectors; the rest of the file is compiled once (HWY_ONCE).
#include "common/simd/fixed_width.h"  // blocks of kActBlock elements are whole vectors: no SVE / RVV
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "impls/quant/simd/int_activations.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "impls/quant/simd/int_activations.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::quant::act {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// round_block (below) on nb whole blocks in a row (block b's codes at q + b x kActBlock, its scale in
// scale[b]), with the same arithmetic: amax from the magnitudes' bit patterns, the scale in double, each
// x / scale rounded to nearest even in double (a product and Round: nothing for the compiler to fuse) and
// clamped to +-qmax. So the codes and scales are round_block's on every target. The blocks' maxima, then
// their scales (two divisions each, independent from block to block), then their codes, each in a pass.
void RoundMany(const float* x, int64_t nb, double qmax, int16_t* q, float* scale) {
  const hn::ScalableTag<uint32_t> du;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const hn::Rebind<int32_t, decltype(dd)> di;
  const hn::Rebind<int16_t, decltype(dd)> dq;
  constexpr int64_t n = kActBlock, kChunk = 16;
  static_assert(n % hn::MaxLanes(du) == 0 && n % hn::MaxLanes(dd) == 0, "a block is whole vectors");
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int64_t nc = std::min(kChunk, nb - c0);
    uint32_t amax_bits[kChunk];
    double inv[kChunk];
    for (int64_t b = 0; b < nc; ++b) {
      const uint32_t* xb = reinterpret_cast<const uint32_t*>(x + (c0 + b) * n);
      auto m = hn::Zero(du);
      for (int64_t i = 0; i < n; i += static_cast<int64_t>(hn::Lanes(du)))
        m = hn::Max(m, hn::And(hn::LoadU(du, xb + i), hn::Set(du, 0x7fffffffu)));
      amax_bits[b] = hn::GetLane(hn::MaxOfLanes(du, m));
    }
    for (int64_t b = 0; b < nc; ++b) {
      float& s = scale[c0 + b];
      inv[b] = 0;  // no codes: an infinity or a NaN (scale NaN), or zero or a step below the normal range
      if (amax_bits[b] >= 0x7f800000u) {
        s = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      s = static_cast<float>(static_cast<double>(std::bit_cast<float>(amax_bits[b])) / qmax);
      if (!(s >= std::numeric_limits<float>::min())) s = 0.f;
      else inv[b] = 1.0 / s;
    }
    for (int64_t b = 0; b < nc; ++b) {
      const float* xb = x + (c0 + b) * n;
      int16_t* qb = q + (c0 + b) * n;
      if (inv[b] == 0) {
        std::fill(qb, qb + n, int16_t{0});
        continue;
      }
      const auto vi = hn::Set(dd, inv[b]), hi = hn::Set(dd, qmax), lo = hn::Set(dd, -qmax);
      for (int64_t i = 0; i < n; i += static_cast<int64_t>(hn::Lanes(dd))) {
        const auto v = hn::Round(hn::Mul(hn::PromoteTo(dd, hn::LoadU(df, xb + i)), vi));
        hn::StoreU(hn::DemoteTo(dq, hn::DemoteTo(di, hn::Min(hn::Max(v, lo), hi))), dq, qb + i);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::quant::act
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "common/common.hpp"

namespace memtrade::quant {
namespace act {
HWY_EXPORT(RoundMany);
// Dispatched from inside the namespace: with one target compiled (static dispatch) the macro prefixes the
// target's namespace to the name, which a qualified name would not survive.
void round_many(const float* x, int64_t nb, double qmax, int16_t* q, float* scale) {
  HWY_DYNAMIC_DISPATCH(RoundMany)(x, nb, qmax, q, scale);
}
}  // namespace act

namespace {
int qmax_of(int bits) {
  MT_CHECK(bits == 16 || bits == 8, "integer activations are 16- or 8-bit (got " + std::to_string(bits) + ")");
  return bits == 16 ? 32767 : 127;
}

// quantize_activation_block's work (RoundMany's, block by block, in scalar code).
inline double round_block(const float* x, int64_t n, double qmax, int16_t* q, float& scale) {
  // amax from the magnitudes' bit patterns (ordered as the values are, infinity above every finite value
  // and NaN above infinity): an integer max the compiler vectorizes, where a float max with an isfinite
  // test per element stays scalar.
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) amax_bits = std::max(amax_bits, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  if (amax_bits >= 0x7f800000u) {  // an infinity or a NaN
    std::fill(q, q + n, int16_t{0});
    scale = std::numeric_limits<float>::quiet_NaN();
    return 0;
  }
  const float amax = std::bit_cast<float>(amax_bits);
  scale = static_cast<float>(static_cast<double>(amax) / qmax);
  if (!(scale >= std::numeric_limits<float>::min())) {  // zero, or a step below the normal range: flushed
    std::fill(q, q + n, int16_t{0});
    scale = 0.f;
    return amax;
  }
  // Rounded to nearest (even) by adding and subtracting 1.5 x 2^52, exact for |v| < 2^51: nearbyint's
  // result without a library call per element. (Where the compiler fuses the product into the addition,
  // a value within an ulp of a half step may round the other way: still within 0.504 steps.) |x| <= amax,
  // so the clamp only catches a quotient rounded up past qmax.
  const double inv = 1.0 / scale, magic = 0x1.8p52;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]) * inv + magic;
    q[i] = static_cast<int16_t>(std::min(std::max(v - magic, -qmax), qmax));
  }
  return 0.504 * scale;
}
}  // namespace

double quantize_activation_block(const float* x, int64_t n, int bits, int16_t* q, float& scale) {
  const double qmax = qmax_of(bits);
  return round_block(x, n, qmax, q, scale);
}

void round_whole_blocks(const float* x, int64_t nb, int bits, int16_t* q, float* scale) {
  act::round_many(x, nb, qmax_of(bits), q, scale);
}

IntActivations quantize_activations(const float* x, int64_t K, int bits) {
  MT_CHECK(K > 0, "quantize_activations: K must be > 0");
  IntActivations a;
  a.bits = bits;
  a.q.resize(static_cast<std::size_t>(K));
  for (int64_t k0 = 0; k0 < K; k0 += kActBlock) {
    float s = 0.f;
    a.max_err.push_back(quantize_activation_block(x + k0, std::min(kActBlock, K - k0), bits, a.q.data() + k0, s));
    a.scale.push_back(s);
  }
  return a;
}

std::vector<double> activation_bound(const IntActivations& a, const float* Wd, int64_t N, int64_t K) {
  MT_CHECK(static_cast<int64_t>(a.q.size()) == K, "activation_bound: activations of another length");
  std::vector<double> bound(static_cast<std::size_t>(N), 0.0);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < K; ++k) bound[r] += a.max_err[k / kActBlock] * std::fabs(static_cast<double>(Wd[r * K + k]));
  return bound;
}

int nf4_level_unit(int bits) { return qmax_of(bits) == 127 ? 127 : 1 << 13; }

int16_t nf4_int_level(int code, int bits) {
  return static_cast<int16_t>(std::lrint(static_cast<double>(nf4_code(code)) * nf4_level_unit(bits)));
}

std::vector<double> nf4_level_bound(const QLayout& L, const uint8_t* blob, const IntActivations& a) {
  const int64_t N = L.rows, K = L.cols;
  MT_CHECK(static_cast<int64_t>(a.q.size()) == K, "nf4_level_bound: activations of another length");
  std::vector<double> bound(static_cast<std::size_t>(N), 0.0);
  if (L.spec.format != Format::nf4) return bound;
  const double unit = nf4_level_unit(a.bits);
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    for (int64_t k = 0; k < K; ++k) {
      const float s = stored_params(L, blob, r, k / L.group).scale;
      const int q = nibble(row, k);
      const double used = static_cast<double>(s) * nf4_int_level(q, a.bits) / unit;
      const double x = static_cast<double>(a.scale[k / kActBlock]) * a.q[k];
      bound[r] += std::fabs(static_cast<double>(decode_value(Format::nf4, q, s, 0.f)) - used) * std::fabs(x);
    }
  }
  return bound;
}

}  // namespace memtrade::quant
#endif  // HWY_ONCE
