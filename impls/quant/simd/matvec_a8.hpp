// The 8-bit-activation matvec (`packed-a8`): y = deq(W) x^ with x^ the activations rounded to int8 per
// block of 32 elements (scale = amax / 127 of the block; int_activations.hpp), llama.cpp's Q4_0 x Q8_0
// and Q8_0 x Q8_0 dot products. The weight bytes meet the activation bytes in x86's byte multiply-add
// (vpmaddubsw: 32 unsigned x signed byte products per 256 bits, summed in adjacent pairs to int16), then
// vpmaddwd by ones sums the pairs into int32: 64 4-bit weights per two multiply-adds and a widening, where
// `packed-a16` (matvec_a16.hpp) spends four multiply-adds and widens every code to int16 first.
//   - int4 / int4-asym: the codes 0..15 are the unsigned operand as stored (low nibble = even element, high
//     nibble = odd element); the activation codes of each pair of blocks are laid out evens of both
//     blocks first, then odds (a8_position), so a 32-byte load of codes masked and shifted meets plain
//     loads of activations. The zero point comes off once per group (z times the group's activation sum).
//   - nf4: the levels as bytes, level(q) = round(code(q) x 127) (nf4_int_level(q, 8), off by at most
//     1/254 of the group's absmax; nf4_level_bound bounds what that moves): a byte shuffle of each nibble
//     gives |level| (the unsigned operand) and another its sign, which goes onto the activations (psignb).
//   - int8: |q| as the unsigned operand and the activation codes carrying q's sign (natural order).
// Groups of 4-bit formats must be a multiple of 64 elements or one per row (a8_unsupported); elements
// after the last whole pair of blocks are summed in natural order. fp8 codes are not integers.
//
// Exactness: a byte pair sums to at most 2 x 15 x 127 = 3810 (4-bit codes; even and odd sums are added
// in int16, 7620) or 2 x 128 x 127 = 32512 (|level|, |int8|: widened separately), below vpmaddubsw's
// int16 saturation; a block's int32 sum is at most 32 x 128 x 127 < 2^24, so it becomes a float exactly.
// Floats: one product by the block's scale per block, the group's sum times its scale, the zero-point
// correction, fp32 sums across blocks, lanes and groups (nf4: the row's sum times 1/127 at the end).
//
// Where it runs: x86 SIMD targets (SSSE3 and up: 128-bit steps on SSSE3/SSE4, 256-bit on AVX2; on AVX-512
// the 4-bit formats' runs of whole groups take two pairs per 512-bit step, the rest 256-bit ones); every
// other target (scalar, Arm) computes the same integer sums block by block in plain C++ (correct, not
// fast).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "impls/quant/formats.hpp"
#include "impls/quant/simd/int_activations.hpp"

namespace memtrade::quant {

// 4-bit formats: within each whole pair of blocks (64 elements from a multiple of 64), position pos of
// the activation codes holds element a8_position(pos): block 0's even elements, block 1's, block 0's odd
// ones, block 1's.
inline constexpr int64_t a8_position(int64_t pos) { return 32 * (pos / 16 % 2) + 2 * (pos % 16) + pos / 32; }

// Why the 8-bit-activation path cannot take this layout, or "" when it can.
std::string a8_unsupported(const QLayout& L);

inline IntActivations quantize_activations_a8(const float* x, int64_t K) { return quantize_activations(x, K, 8); }

// Bytes of workspace matvec_a8 needs for K columns (the int8 codes in the kernel's order, the block
// scales four times each, per-group activation sums); any alignment of a float.
std::size_t a8_workspace_bytes(int64_t K);

// y[N] = deq(W) x^ (see above), OpenMP over rows, SIMD target chosen at run time. memtrade::Error when
// a8_unsupported(L) is not empty.
void matvec_a8(const QLayout& L, const uint8_t* blob, const float* x, float* y, void* workspace);

}  // namespace memtrade::quant
