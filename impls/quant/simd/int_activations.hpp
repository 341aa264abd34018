// Activations rounded to integers per block of 32 elements, for the integer-activation matvecs
// (`packed-a16`: int16 codes, matvec_a16.hpp; `packed-a8`: int8 codes, matvec_a8.hpp), and the derived
// bounds on what the rounding can move an output. A block's scale is amax / qmax (qmax = 32767 for 16-bit
// codes, 127 for 8-bit), its codes round(x / scale) to nearest; |x_k - x^_k| <= 0.504 scale (half a step,
// plus the rounding of x / scale), so each output moves by at most sum_k 0.504 s_b(k) |w_k|.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "impls/quant/formats.hpp"

namespace memtrade::quant {

inline constexpr int64_t kActBlock = 32;  // activation elements per scale

// x quantized as the kernels do it: q[k] (natural order, |q| <= qmax) and one scale per block of
// kActBlock (the last block may be shorter); x^_k = scale[k / kActBlock] * q[k]. An all-zero block has
// scale 0; a NaN or an infinity makes its block's scale NaN, so the outputs it reaches are NaN, never a
// silent number.
struct IntActivations {
  int bits = 16;  // 16 (qmax 32767) or 8 (qmax 127)
  std::vector<int16_t> q;
  std::vector<float> scale;
  std::vector<double> max_err;  // per block, the most |x_k - x^_k| can be: 0.504 scale, or the block's amax
                                // where its step would fall below the normal floats (flushed to 0)
};
IntActivations quantize_activations(const float* x, int64_t K, int bits);

// One block of n <= kActBlock elements: codes q[0..n) and the block's scale; returns the block's max_err.
double quantize_activation_block(const float* x, int64_t n, int bits, int16_t* q, float& scale);

// nb whole blocks in a row, as quantize_activation_block rounds each (in vectors, a call for all):
// block b's codes at q + b x kActBlock, its scale in scale[b].
void round_whole_blocks(const float* x, int64_t nb, int bits, int16_t* q, float* scale);

// The kernels' preparation of x: every block rounded (quantize_activation_block) and handed to
// place(b, q, n, scale) (block b's n codes in q, padded with zeros to kActBlock), and the sum of x^ over
// each group of G elements (G a multiple of kActBlock, or K: one group) in cs[group], summed in float64
// (exact: at most K x 2^15 x scale) and rounded once.
template <class Place>
void round_blocks(const float* x, int64_t K, int bits, int64_t G, float* cs, Place&& place) {
  const int64_t blocks = (K + kActBlock - 1) / kActBlock, whole = K / kActBlock;
  constexpr int64_t kChunk = 16;  // whole blocks rounded per call
  double group_sum = 0;
  int16_t qs[kChunk * kActBlock];
  float ss[kChunk];
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t k0 = b * kActBlock, n = std::min(kActBlock, K - k0);
    if (b < whole && b % kChunk == 0) round_whole_blocks(x + k0, std::min(kChunk, whole - b), bits, qs, ss);
    int16_t* q = qs + (b % kChunk) * kActBlock;
    float s = ss[b % kChunk];
    if (b >= whole) {  // the last block, shorter than kActBlock
      q = qs;
      quantize_activation_block(x + k0, n, bits, q, s);
      std::fill(q + n, q + kActBlock, int16_t{0});
    }
    place(b, q, n, s);
    int64_t qsum = 0;
    for (int64_t i = 0; i < n; ++i) qsum += q[i];
    group_sum += static_cast<double>(s) * static_cast<double>(qsum);
    if ((k0 + n) % G == 0 || k0 + n == K) {  // the block ends a group
      cs[k0 / G] = static_cast<float>(group_sum);
      group_sum = 0;
    }
  }
}

// Per output row, the most the activation rounding can move y: sum_k max_err[k / kActBlock] |Wd[r, k]|,
// with Wd the dequantized weights [N x K] (row-major).
std::vector<double> activation_bound(const IntActivations& a, const float* Wd, int64_t N, int64_t K);

// nf4 code q's level as an integer kernel multiplies it: round(nf4_code(q) x nf4_level_unit(bits)), with
// unit 2^13 for 16-bit activations (|level| <= 2^13) and 127 for 8-bit ones (|level| <= 127, a byte).
int nf4_level_unit(int bits);
int16_t nf4_int_level(int code, int bits);

// Per output row, the most nf4's integer levels move y: sum_k |deq(q_k) - a_g level(q_k) / unit| |x^_k|
// with the levels of a.bits (0 for the integer formats, whose codes are used as they are).
std::vector<double> nf4_level_bound(const QLayout& L, const uint8_t* blob, const IntActivations& a);

}  // namespace memtrade::quant
