// The integer-activation matvec (`packed-a16`): y = deq(W) x^ with x^ the activations quantized to int16
// per block of 32 elements (scale = amax / 32767 of the block, codes rounded to nearest). The weight
// codes are widened to int16 in registers and multiplied pairwise into exact int32 sums (x86 vpmaddwd,
// Highway's ReorderWidenMulAccumulate), so a 4-bit weight costs a mask or a shift and half a multiply-add
// instead of a float decode and an fma; the sum of a block becomes a float once and takes the block's
// scale, the group's sum its scale, and the zero point comes off once per group (z times the group's
// activation sum, computed once per call). Formats whose codes are integers take it: int8 (per
// channel) and int4 / int4-asym with groups a multiple of 32 or one group per row. nf4 takes it through
// its levels as int16 fixed point, level(q) = round(code(q) 2^13) (|level| <= 2^13, off by at most 2^-14
// of the group's absmax): each code byte's two nibbles index a low-byte and a high-byte table (x86
// pshufb), the bytes interleaved give the int16 levels, and y is 2^-13 sum a_g sum_b xs_b sum level x^;
// groups of a multiple of 64 or one per row (nf4_level_bound bounds what the levels move). fp8 codes are
// not integers. This is the W4A16 variant of llama.cpp's W4A8 dot products: 16-bit
// activation codes keep the activation error 256 times below 8-bit ones, for twice the multiply-adds
// (vpmaddwd takes 16 int16 pairs per 256 bits where vpmaddubsw takes 32 byte pairs; Highway 1.0 has no
// portable form of the latter). The error is bounded per case: |x_k - x^_k| <= 0.504 s_b (half a step,
// plus the rounding of x / s_b), so each output moves by at most sum_k 0.504 s_b(k) |w_k|
// (activation_bound, int_activations.hpp).
//
// Accumulation: exact int32 inside a block (|code| <= 15 (4-bit) or 127 (int8), |x^| <= 32767; nf4: at
// most 8 products of |level| <= 2^13 per lane); the block's lanes become floats (exactly where a lane's sum
// stays below 2^24: every int4 block, int8 on 256-bit vectors; rounded once otherwise) and are summed in
// fp32 across blocks, lanes and groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "impls/quant/formats.hpp"
#include "impls/quant/simd/int_activations.hpp"

namespace memtrade::quant {

inline constexpr int64_t kA16Block = kActBlock;
inline constexpr int kA16Nf4Bits = 13;  // nf4 levels in units of 2^-13 (nf4_int_level(q, 16))

// nf4's activation layout within each whole pair of blocks (64 elements): position pos of the pair holds
// element a16_nf4_position(pos) (the kernel's vectors: even elements of both blocks, then odd ones).
int64_t a16_nf4_position(int64_t pos);

// Why the integer path cannot take this layout, or "" when it can.
std::string a16_unsupported(const QLayout& L);

// The activations as the kernel rounds them (int_activations.hpp, 16-bit codes); its error bounds are
// activation_bound and nf4_level_bound of these.
inline IntActivations quantize_activations_a16(const float* x, int64_t K) { return quantize_activations(x, K, 16); }

// Bytes of workspace matvec_a16 needs for K columns (the int16 codes in the kernel's order and the
// block scales); the caller allocates it (any alignment of a float).
std::size_t a16_workspace_bytes(int64_t K);

// y[N] = deq(W) x^ (see above), OpenMP over rows, SIMD target chosen at run time. memtrade::Error when
// a16_unsupported(L) is not empty.
void matvec_a16(const QLayout& L, const uint8_t* blob, const float* x, float* y, void* workspace);

}  // namespace memtrade::quant
