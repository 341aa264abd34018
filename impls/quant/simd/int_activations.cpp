#include "impls/quant/simd/int_activations.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "common/common.hpp"

namespace memtrade::quant {

namespace {
int qmax_of(int bits) {
  MT_CHECK(bits == 16 || bits == 8, "integer activations are 16- or 8-bit (got " + std::to_string(bits) + ")");
  return bits == 16 ? 32767 : 127;
}

// quantize_activation_block's work; a whole block (n = kActBlock, a constant) compiles to straight-line
// vector code.
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
  return n == kActBlock ? round_block(x, kActBlock, qmax, q, scale) : round_block(x, n, qmax, q, scale);
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
