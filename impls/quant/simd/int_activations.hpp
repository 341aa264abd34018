// Activations rounded to integers per block of 32 elements, for the integer-activation matvecs
// (`packed-a16`: int16 codes, matvec_a16.hpp; `packed-a8`: int8 codes, matvec_a8.hpp), and the derived
// bounds on what the rounding can move an output. A block's scale is amax / qmax (qmax = 32767 for 16-bit
// codes, 127 for 8-bit), its codes round(x / scale) to nearest; |x_k - x^_k| <= 0.504 scale (half a step,
// plus the rounding of x / scale), so each output moves by at most sum_k 0.504 s_b(k) |w_k|.
#pragma once

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
