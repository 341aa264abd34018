// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "impls/quant/simd/matvec_a8.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "impls/quant/simd/codes-inl.h"

#include <algorithm>
#include <cstring>

#include "common/common.hpp"
#include "impls/quant/simd/matvec_a8.hpp"
#include "impls/quant/simd/matvec_simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::quant::a8 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kB = kActBlock;  // 32 elements per activation block; a pair is 64

// What a kernel reads of one call: the codes (xq) in the kernel's order, each block's scale four times
// (xs4[4b .. 4b + 3]) and each group's activation sum (cs, 4-bit formats).
struct Acts {
  const int8_t* xq;
  const float* xs4;
  const float* cs;
};

// The group parameters of row r as the kernels use them: the scale (nf4: the absmax) and what the zero
// points add. The layout's fields they need are copied in: read through the reference, they were loaded
// again at every step of the kernels' loops.
struct RowParams {
  const QLayout& L;
  const uint8_t* blob;
  float mean = 0.f;
  const uint8_t* scales = blob + L.scales.offset;
  const uint8_t* dq_scales = blob + L.dq_scales.offset;
  int64_t gpr = L.groups_per_row;
  bool double_quant = L.spec.double_quant;
  template <Format F>
  float scale(int64_t r, int64_t g) const {
    return scale_at<F>(r * gpr + g);
  }
  // The same by the flat index r x groups_per_row + g (what the kernels' loops step through).
  template <Format F>
  float scale_at(int64_t i) const {
    if constexpr (F != Format::nf4) return quant::simd::HWY_NAMESPACE::scale_f16(scales + 2 * i);
    else if (double_quant)
      return nf4_dq_absmax(static_cast<int8_t>(scales[i]), load_bytes<float>(dq_scales + 4 * (i / nf4_dq_block)), mean);
    else
      return load_bytes<float>(scales + 4 * i);
  }
  // The zero points of the 4-bit integer formats: -s_g z_g cs_g added into the lanes of acc for row r's
  // groups (int4: z = 8 for every group; int4-asym: the stored nibbles), the scales converted and the
  // products formed in vectors (s_g z_g is exact: an fp16 scale times a 4-bit integer), so a kernel's one
  // sum over its lanes takes the zero points off too; returns s_g z_g cs_g summed over the groups left
  // over (fewer than a vector), for the caller to subtract.
  template <Format F, class DF>
  float zero_lanes(DF df, int64_t r, const float* cs, hn::Vec<DF>& acc) const {
    static_assert(F == Format::int4 || F == Format::int4_asym);
    const uint8_t* sc = scales + 2 * r * gpr;
    const uint8_t* zr = blob + L.zeros.offset + r * L.zero_row_bytes;  // int4-asym
    auto zero = [&](int64_t g) { return F == Format::int4 ? 8.f : static_cast<float>(nibble(zr, g)); };
    static_assert(hn::MaxLanes(DF()) <= 8, "a vector's zero nibbles fit one 32-bit word");
    const int64_t n = static_cast<int64_t>(hn::Lanes(df));
    int64_t g = 0;
    for (; g + n <= gpr; g += n) {
      hn::Vec<DF> z = hn::Set(df, zero(g));
      if (F == Format::int4_asym && n > 1) {  // n nibbles from n / 2 bytes, the low nibble first
        const hn::RebindToUnsigned<DF> du;
        uint32_t bits = 0;
        std::memcpy(&bits, zr + g / 2, n / 2);
        const auto nib = hn::And(hn::Shr(hn::Set(du, bits), hn::ShiftLeft<2>(hn::Iota(du, 0))), hn::Set(du, 0xF));
        z = hn::ConvertTo(df, hn::BitCast(hn::RebindToSigned<DF>(), nib));
      }
      acc = hn::MulAdd(hn::Neg(hn::Mul(quant::simd::HWY_NAMESPACE::scales_f16(df, sc + 2 * g), z)), hn::LoadU(df, cs + g), acc);
    }
    float c = 0.f;
    for (; g < gpr; ++g) c += scale<F>(r, g) * zero(g) * cs[g];
    return c;
  }
  // sum_g s_g z_g cs_g over row r's groups (4-bit integer formats): what the unsigned codes add.
  template <Format F>
  float zero_correction(int64_t r, const float* cs) const {
    const hn::CappedTag<float, 8> df;
    auto v = hn::Zero(df);
    const float left = zero_lanes<F>(df, r, cs, v);
    return left - hn::GetLane(hn::SumOfLanes(df, v));
  }
};

// The multiplier of element k's activation code: the code (int8, int4) or nf4's byte level.
HWY_INLINE int weight_int(Format f, const uint8_t* row, int64_t k) {
  if (f == Format::int8) return static_cast<int8_t>(row[k]);
  const int q = nibble(row, k);
  return f == Format::nf4 ? nf4_int_level(q, 8) : q;
}

// Blocks [b0, b1) of one row in natural order (the elements after the last whole pair; int8 on targets
// without byte multiply-adds: every block), each block's exact int32 sum times its scale.
HWY_INLINE float natural_blocks(Format f, const uint8_t* row, const Acts& a, int64_t K, int64_t b0, int64_t b1) {
  float sum = 0.f;
  for (int64_t b = b0; b < b1; ++b) {
    int32_t t = 0;
    for (int64_t k = b * kB; k < std::min(K, (b + 1) * kB); ++k) t += weight_int(f, row, k) * a.xq[k];
    sum += a.xs4[4 * b] * static_cast<float>(t);
  }
  return sum;
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
// 256 bits on AVX2 and AVX-512 (two blocks of 4-bit codes per load), 128 on SSSE3 / SSE4 (one).
using D8 = hn::CappedTag<uint8_t, 32>;
using DI8 = hn::Repartition<int8_t, D8>;
using D16 = hn::Repartition<int16_t, D8>;
using D32 = hn::Repartition<int32_t, D8>;
using DF = hn::Repartition<float, D8>;
using VF = hn::Vec<DF>;
using V32 = hn::Vec<D32>;
constexpr bool kWide = hn::MaxLanes(D8()) == 32;
static_assert(kWide == (HWY_TARGET <= HWY_AVX2));

// vpmaddubsw: u x s byte products (u unsigned, s signed) summed in adjacent pairs to int16, saturating
// (the callers keep every pair below 2^15; see the header).
#if HWY_TARGET <= HWY_AVX2
#define MEMTRADE_A8_OP(op) _mm256_##op
#else
#define MEMTRADE_A8_OP(op) _mm_##op
#endif
HWY_INLINE hn::Vec<D16> mul_pairs(hn::Vec<D8> u, hn::Vec<DI8> s) { return hn::Vec<D16>{MEMTRADE_A8_OP(maddubs_epi16)(u.raw, s.raw)}; }
// psignb: s where t > 0, -s where t < 0, 0 where t == 0.
HWY_INLINE hn::Vec<DI8> sign_of(hn::Vec<DI8> s, hn::Vec<DI8> t) { return hn::Vec<DI8>{MEMTRADE_A8_OP(sign_epi8)(s.raw, t.raw)}; }
#undef MEMTRADE_A8_OP
// int16 lanes summed in adjacent pairs into int32 (vpmaddwd by ones).
HWY_INLINE V32 widen(hn::Vec<D16> v) {
  const D32 d32;
  V32 unused = hn::Zero(d32);
  return hn::ReorderWidenMulAccumulate(d32, v, hn::Set(D16(), 1), hn::Zero(d32), unused);
}

// nf4's byte levels as a shuffle table (in a register): |level|, the unsigned operand, indexed by a nibble.
// The level's sign needs no table: the levels rise with the code and level 7 is 0, so code - 7 has the
// sign of its level (checked where the table is built).
struct Nf4Tables {
  hn::Vec<D8> mag;
};
HWY_INLINE hn::Vec<DI8> nf4_sign(hn::Vec<D8> nibbles) { return hn::Sub(hn::BitCast(DI8(), nibbles), hn::Set(DI8(), 7)); }
// x with the sign of the nf4 levels of `nibbles` (0 where the level is 0), the signed operand.
HWY_INLINE hn::Vec<DI8> nf4_signed(hn::Vec<DI8> x, hn::Vec<D8> nibbles) { return sign_of(x, nf4_sign(nibbles)); }

#if HWY_TARGET <= HWY_AVX3
// AVX-512: two pairs of blocks (64 code bytes, 128 activation codes) per step, the same integer sums in
// 512-bit registers: one load, mask, shift, two vpmaddubsw and one vpmaddwd per 128 weights instead of per
// 64. Measured 1.2-1.6x faster in cache on Zen 5, whose 512-bit units are full width (Zen 4 splits 512-bit
// operations in two; Intel's cores not measured). Lanes: 128-bit lane i holds block 2q + i of pairs q, q + 1.
// The helpers above, for 512-bit vectors (no psignb there: the activation is negated under a mask where
// the code is below 7; level 7 is 0, so its sign does not matter).
using D8W = hn::FixedTag<uint8_t, 64>;
using DI8W = hn::Repartition<int8_t, D8W>;
using D16W = hn::Repartition<int16_t, D8W>;
using D32W = hn::Repartition<int32_t, D8W>;
using DFW = hn::Repartition<float, D8W>;
using VFW = hn::Vec<DFW>;
HWY_INLINE hn::Vec<D16W> mul_pairs(hn::Vec<D8W> u, hn::Vec<DI8W> s) { return hn::Vec<D16W>{_mm512_maddubs_epi16(u.raw, s.raw)}; }
HWY_INLINE hn::Vec<D32W> widen(hn::Vec<D16W> v) { return hn::Vec<D32W>{_mm512_madd_epi16(v.raw, _mm512_set1_epi16(1))}; }
// psignb's use here: s negated where t < 0 (s itself where t == 0, which the callers multiply by |t| = 0).
HWY_INLINE hn::Vec<DI8W> sign_of(hn::Vec<DI8W> s, hn::Vec<DI8W> t) {
  return hn::IfThenElse(hn::Lt(t, hn::Zero(DI8W())), hn::Neg(s), s);
}
HWY_INLINE hn::Vec<DI8W> nf4_signed(hn::Vec<DI8W> x, hn::Vec<D8W> nibbles) {
  const DI8W di8;
  return hn::IfThenElse(hn::Lt(hn::BitCast(di8, nibbles), hn::Set(di8, 7)), hn::Neg(x), x);
}
#endif

// The int32 sums of one block's (kWide: two blocks') nibbles `lo` (even elements) and `hi` (odd ones)
// against the activation codes xe (evens) and xo (odds): per 128-bit lane, one block.
// (Any width the helpers take: `mag` is the nf4 table in every 128-bit lane.)
template <Format F, class VU, class VS>
HWY_INLINE auto nibble_sums(VU lo, VU hi, VS xe, VS xo, VU mag) {
  if constexpr (F == Format::nf4) {
    const auto pe = mul_pairs(hn::TableLookupBytes(mag, lo), nf4_signed(xe, lo));
    const auto po = mul_pairs(hn::TableLookupBytes(mag, hi), nf4_signed(xo, hi));
    return hn::Add(widen(pe), widen(po));  // each pair up to 32512: widened separately
  } else {
    return widen(hn::Add(mul_pairs(lo, xe), mul_pairs(hi, xo)));
  }
}

// One pair of blocks (32 code bytes, 64 activation codes in a8_position order): each block's int32 sum
// times its scale, in float lanes (the lanes' total is the pair's contribution).
template <Format F>
HWY_INLINE VF pair(const uint8_t* codes, const int8_t* xq, const float* xs4, Nf4Tables t) {
  const D8 d8;
  const DI8 di8;
  const DF df;
  if constexpr (kWide) {
    const auto c = hn::LoadU(d8, codes);
    const V32 s = nibble_sums<F>(hn::And(c, hn::Set(d8, 0x0F)), hn::ShiftRight<4>(c), hn::LoadU(di8, xq), hn::LoadU(di8, xq + 32), t.mag);
    return hn::Mul(hn::ConvertTo(df, s), hn::LoadU(df, xs4));  // lanes 0-3 block 0, 4-7 block 1
  } else {
    const auto c0 = hn::LoadU(d8, codes), c1 = hn::LoadU(d8, codes + 16);
    const V32 s0 = nibble_sums<F>(hn::And(c0, hn::Set(d8, 0x0F)), hn::ShiftRight<4>(c0), hn::LoadU(di8, xq), hn::LoadU(di8, xq + 32), t.mag);
    const V32 s1 = nibble_sums<F>(hn::And(c1, hn::Set(d8, 0x0F)), hn::ShiftRight<4>(c1), hn::LoadU(di8, xq + 16), hn::LoadU(di8, xq + 48), t.mag);
    return hn::MulAdd(hn::ConvertTo(df, s1), hn::LoadU(df, xs4 + 4), hn::Mul(hn::ConvertTo(df, s0), hn::LoadU(df, xs4)));
  }
}

#if HWY_TARGET <= HWY_AVX3
template <Format F>
HWY_INLINE VFW quad(const uint8_t* codes, const int8_t* xq, const float* xs4, hn::Vec<D8W> mag) {
  const D8W d8;
  const DI8W di8;
  const auto c = hn::LoadU(d8, codes);
  const auto lo = hn::And(c, hn::Set(d8, 0x0F)), hi = hn::ShiftRight<4>(c);
  // Pair q's activation codes are evens (32) then odds (32), pair q + 1's after them.
  const auto x0 = hn::LoadU(di8, xq), x1 = hn::LoadU(di8, xq + 64);
  const auto xe = hn::ConcatLowerLower(di8, x1, x0), xo = hn::ConcatUpperUpper(di8, x1, x0);
  return hn::Mul(hn::ConvertTo(DFW(), nibble_sums<F>(lo, hi, xe, xo, mag)), hn::LoadU(DFW(), xs4));
}
#endif

// int8 codes (natural order) against activation codes, one vector of each: the int32 sums of |q| x (x with
// q's sign), per 128-bit lane (any width the helpers take; activation codes are within +-127).
template <class DI>
HWY_INLINE auto int8_sums(DI di, const int8_t* w, const int8_t* xq) {
  const auto q = hn::LoadU(di, w);
  return widen(mul_pairs(hn::BitCast(hn::RebindToUnsigned<DI>(), hn::Abs(q)), sign_of(hn::LoadU(di, xq), q)));
}

#if HWY_TARGET <= HWY_AVX3
// int8 on AVX-512: two blocks (64 bytes) per 512-bit step, 128-bit lanes 0-1 block b and 2-3 block b + 1
// (int8_sums at 512 bits). Zen 5, in cache: 1.15-1.21x the 256-bit loop's speed; cold, where memory bounds
// the call, level.
// Blocks b and b + 1's scales, each in the 8 lanes that hold its sums (xs4 holds each scale four times).
HWY_INLINE VFW block_scales2(const float* xs4) {
  const DFW dfw;
  alignas(64) static constexpr int32_t kIdx[16] = {0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 4, 5, 6, 7};
  return hn::TableLookupLanes(hn::ZeroExtendVector(dfw, hn::LoadU(DF(), xs4)), hn::SetTableIndices(dfw, kIdx));
}
#endif

// The scales of groups [g, g + 8) of row r, decoded in vectors where the format allows (nf4-dq's absmax,
// the int4 formats' fp16 scales): the values scale() gives, without a scalar conversion per group.
template <Format F>
HWY_INLINE void scales8(const RowParams& P, int64_t r, int64_t g, float* out) {
  if (F == Format::nf4 && P.L.spec.double_quant)
    return quant::simd::HWY_NAMESPACE::nf4_dq_absmax8(P.L, P.blob, P.mean, r * P.L.groups_per_row + g, out);
  if constexpr (F == Format::int4 || F == Format::int4_asym) {
    const hn::FixedTag<float, 4> d4;  // two halves: every x86 target has 128-bit vectors
    const uint8_t* sc = P.scales + 2 * (r * P.gpr + g);
    hn::StoreU(quant::simd::HWY_NAMESPACE::scales_f16(d4, sc), d4, out);
    hn::StoreU(quant::simd::HWY_NAMESPACE::scales_f16(d4, sc + 8), d4, out + 4);
    return;
  }
  for (int64_t j = 0; j < 8; ++j) out[j] = P.template scale<F>(r, g + j);
}

// One block of int8 codes: its int32 sums (kWide: one 256-bit vector; else two of 128).
HWY_INLINE V32 int8_block(const int8_t* w, const int8_t* xq) {
  if constexpr (kWide) return int8_sums(DI8(), w, xq);
  else return hn::Add(int8_sums(DI8(), w, xq), int8_sums(DI8(), w + 16, xq + 16));
}
#endif

template <Format F>
void Rows(const QLayout& L, const uint8_t* blob, const Acts& a, float* y) {
  const int64_t N = L.rows, K = L.cols, gpr = L.groups_per_row, pairs = K / 64;
  const RowParams P{L, blob, L.spec.double_quant ? load_bytes<float>(blob + L.dq_mean.offset) : 0.f};
  const int64_t nblocks = (K + kB - 1) / kB;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
  const DF df;
  HWY_ALIGN uint8_t mag[16];
  for (int c = 0; c < 16; ++c) {
    const int l = nf4_int_level(c, 8);
    mag[c] = static_cast<uint8_t>(l < 0 ? -l : l);
    MT_CHECK((l > 0) - (l < 0) == (c > 7) - (c < 7), "nf4: a byte level's sign is not its code's side of 7");
  }
#endif
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    float out = 0.f;
    if constexpr (F == Format::int8) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
      const auto* w = reinterpret_cast<const int8_t*>(row);
      VF a0 = hn::Zero(df), a1 = hn::Zero(df);
      int64_t b = 0;
#if HWY_TARGET <= HWY_AVX3
      // Four blocks per iteration, in two 512-bit steps.
      const DFW dfw;
      VFW w0 = hn::Zero(dfw), w1 = hn::Zero(dfw);
      for (; b + 4 <= K / kB; b += 4) {
        hwy::Prefetch(row + b * kB + simd::kPrefetchBytes);
        hwy::Prefetch(row + b * kB + 64 + simd::kPrefetchBytes);
        w0 = hn::MulAdd(hn::ConvertTo(dfw, int8_sums(DI8W(), w + b * kB, a.xq + b * kB)), block_scales2(a.xs4 + 4 * b), w0);
        w1 = hn::MulAdd(hn::ConvertTo(dfw, int8_sums(DI8W(), w + (b + 2) * kB, a.xq + (b + 2) * kB)),
                        block_scales2(a.xs4 + 4 * (b + 2)), w1);
      }
      const VFW wsum = hn::Add(w0, w1);
      a0 = hn::LowerHalf(df, wsum);
      a1 = hn::UpperHalf(df, wsum);
#endif
      for (; b + 2 <= K / kB; b += 2) {
        hwy::Prefetch(row + b * kB + simd::kPrefetchBytes);
        a0 = hn::MulAdd(hn::ConvertTo(df, int8_block(w + b * kB, a.xq + b * kB)), hn::Set(df, a.xs4[4 * b]), a0);
        a1 = hn::MulAdd(hn::ConvertTo(df, int8_block(w + (b + 1) * kB, a.xq + (b + 1) * kB)), hn::Set(df, a.xs4[4 * b + 4]), a1);
      }
      out = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1))) + natural_blocks(F, row, a, K, b, nblocks);
#else
      out = natural_blocks(F, row, a, K, 0, nblocks);
#endif
      out *= P.template scale<F>(r, 0);
    } else {
      // Whole pairs, group by group; a group is a multiple of 64 elements, or the row (then its tail too).
      const int64_t per_group = gpr == 1 ? pairs : L.group / 64;
      float zero = 0.f;  // what the unsigned codes add (int4, int4-asym), subtracted at the end
      int64_t p = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_SSSE3
      const int64_t r0 = r * gpr;  // row r's first group, flat
      const Nf4Tables tables{hn::LoadDup128(D8(), mag)};
      VF a0 = hn::Zero(df), a1 = hn::Zero(df);  // sum over pairs of s_g x (the pair's block sums), by lane
      auto step = [&](int64_t q, VF s, VF& acc) {
        acc = hn::MulAdd(pair<F>(row + 32 * q, a.xq + 64 * q, a.xs4 + 8 * q, tables), s, acc);
      };
      // Two-pair steps: PG = 1 pair per group (nf4's default g64: two groups per step, two chains) or PG = 2
      // (the default g128: a group per step; a last group of fewer than two whole pairs is left to the loop
      // below). Eight groups' scales are decoded in vectors first, then the pairs left take theirs one by one.
      auto two_pair_steps = [&]<int64_t PG>() {
#if HWY_TARGET <= HWY_AVX3
        const DFW dfw;
        const hn::Vec<D8W> mag_w = hn::LoadDup128(D8W(), mag);
        VFW w0 = hn::Zero(dfw), w1 = hn::Zero(dfw);
        // A pair's scale in its 256-bit half: PG = 2, one group for both pairs; PG = 1, a group each.
        auto scale_w = [&](const float* sc, int64_t j) {
          return PG == 2 ? hn::Set(dfw, sc[j / 2]) : hn::Combine(dfw, hn::Set(df, sc[j + 1]), hn::Set(df, sc[j]));
        };
        for (; p + 8 * PG <= pairs; p += 8 * PG) {
          HWY_ALIGN float sc[8];
          scales8<F>(P, r, p / PG, sc);
          for (int64_t j = 0; j < 8 * PG; j += 4) {
            hwy::Prefetch(row + 32 * (p + j) + simd::kPrefetchBytes);
            hwy::Prefetch(row + 32 * (p + j) + 64 + simd::kPrefetchBytes);
            w0 = hn::MulAdd(quad<F>(row + 32 * (p + j), a.xq + 64 * (p + j), a.xs4 + 8 * (p + j), mag_w), scale_w(sc, j), w0);
            w1 = hn::MulAdd(quad<F>(row + 32 * (p + j + 2), a.xq + 64 * (p + j + 2), a.xs4 + 8 * (p + j + 2), mag_w),
                            scale_w(sc, j + 2), w1);
          }
        }
        const auto w = hn::Add(w0, w1);
        a0 = hn::Add(a0, hn::LowerHalf(df, w));
        a1 = hn::Add(a1, hn::UpperHalf(df, w));
#else
        for (; p + 8 * PG <= pairs; p += 8 * PG) {
          HWY_ALIGN float sc[8];
          scales8<F>(P, r, p / PG, sc);
          for (int64_t j = 0; j < 8 * PG; j += 2) {
            hwy::Prefetch(row + 32 * (p + j) + simd::kPrefetchBytes);
            step(p + j, hn::Set(df, sc[j / PG]), a0);
            step(p + j + 1, hn::Set(df, sc[(j + 1) / PG]), a1);
          }
        }
#endif
        for (; p + 2 <= pairs; p += 2) {
          hwy::Prefetch(row + 32 * p + simd::kPrefetchBytes);
          const float s0 = P.template scale_at<F>(r0 + p / PG);
          step(p, hn::Set(df, s0), a0);
          step(p + 1, hn::Set(df, PG == 1 ? P.template scale_at<F>(r0 + p + 1) : s0), a1);
        }
      };
      if (per_group == 1) two_pair_steps.template operator()<1>();
      else if (per_group == 2 && gpr > 1) two_pair_steps.template operator()<2>();
      for (int64_t g = p / std::max<int64_t>(per_group, 1); g < gpr; ++g) {  // the groups left (any size)
        const VF s = hn::Set(df, P.template scale_at<F>(r0 + g));
        const int64_t p1 = std::min(pairs, p + per_group);
        for (; p + 2 <= p1; p += 2) {
          hwy::Prefetch(row + 32 * p + simd::kPrefetchBytes);
          step(p, s, a0);
          step(p + 1, s, a1);
        }
        if (p < p1) {
          hwy::Prefetch(row + 32 * p + simd::kPrefetchBytes);
          step(p++, s, a0);
        }
      }
      VF acc = hn::Add(a0, a1);
      if constexpr (F != Format::nf4) zero = P.template zero_lanes<F>(df, r, a.cs, acc);  // the rest is in the lanes
      out = hn::GetLane(hn::SumOfLanes(df, acc));
#else
      if constexpr (F != Format::nf4) zero = P.template zero_correction<F>(r, a.cs);
      for (int64_t g = 0; g < gpr; ++g) {
        float sum = 0.f;
        for (const int64_t p1 = std::min(pairs, p + per_group); p < p1; ++p)  // blocks from the layout (a8_position)
          for (int64_t h = 0; h < 2; ++h) {
            int32_t t = 0;
            for (int64_t pos = 0; pos < 64; ++pos)
              if (a8_position(pos) / kB == h) t += weight_int(F, row, 64 * p + a8_position(pos)) * a.xq[64 * p + pos];
            sum += a.xs4[4 * (2 * p + h)] * static_cast<float>(t);
          }
        out += P.template scale<F>(r, g) * sum;
      }
#endif
      if (2 * pairs < nblocks)  // the row's tail (K % 64 elements, in the last group)
        out += P.template scale<F>(r, gpr - 1) * natural_blocks(F, row, a, K, 2 * pairs, nblocks);
      if constexpr (F == Format::nf4) out *= 1.f / 127.f;
      else out -= zero;
    }
    y[r] = out;
  }
}

void MatvecA8(const QLayout& L, const uint8_t* blob, const int8_t* xq, const float* xs4, const float* cs, float* y) {
  const Acts a{xq, xs4, cs};
  switch (L.spec.format) {
    case Format::int8: return Rows<Format::int8>(L, blob, a, y);
    case Format::int4: return Rows<Format::int4>(L, blob, a, y);
    case Format::int4_asym: return Rows<Format::int4_asym>(L, blob, a, y);
    case Format::nf4: return Rows<Format::nf4>(L, blob, a, y);
    default: return;  // a8_unsupported() rejected it before dispatch
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::quant::a8
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::quant {
namespace a8 {
HWY_EXPORT(MatvecA8);
// Dispatched from inside the namespace (a qualified name does not survive static dispatch's prefix).
void matvec(const QLayout& L, const uint8_t* blob, const int8_t* xq, const float* xs4, const float* cs, float* y) {
  HWY_DYNAMIC_DISPATCH(MatvecA8)(L, blob, xq, xs4, cs, y);
}
}  // namespace a8

std::string a8_unsupported(const QLayout& L) {
  switch (L.spec.format) {
    case Format::int8: return {};
    case Format::int4:
    case Format::int4_asym:
    case Format::nf4:
      if (L.group % 64 != 0 && L.groups_per_row > 1)  // one group per row: any length
        return "the 8-bit-activation path needs 4-bit groups of a multiple of 64 (got " + std::to_string(L.group) + ")";
      return {};
    default: return std::string(format_name(L.spec.format)) + " codes are not integers (the 8-bit-activation path takes int8, int4 and nf4's levels)";
  }
}

std::size_t a8_workspace_bytes(int64_t K) {
  const auto blocks = static_cast<std::size_t>((K + kActBlock - 1) / kActBlock);
  return blocks * 5 * sizeof(float) + blocks * static_cast<std::size_t>(kActBlock);  // xs4, cs, codes
}

void matvec_a8(const QLayout& L, const uint8_t* blob, const float* x, float* y, void* workspace) {
  if (const std::string why = a8_unsupported(L); !why.empty()) throw Error("matvec_a8: " + why);
  MT_CHECK(L.rows > 0 && L.cols > 0 && blob && x && y && workspace, "matvec_a8: empty layout or null pointer");
  const int64_t K = L.cols, blocks = (K + kActBlock - 1) / kActBlock;
  auto* xs4 = static_cast<float*>(workspace);
  float* cs = xs4 + 4 * blocks;
  auto* xq = reinterpret_cast<int8_t*>(cs + blocks);
  const bool pairs = L.spec.format != Format::int8;  // 4-bit formats: whole pairs in a8_position order
  const int64_t G = pairs ? L.group : K;             // every group's last block sets cs[group]
  round_blocks(x, K, 8, G, cs, [&](int64_t b, const int16_t* q, int64_t, float s) {
    std::fill(xs4 + 4 * b, xs4 + 4 * b + 4, s);
    if (pairs && b < K / 64 * 2) {  // a block of a whole pair: element i to position 32 (i odd) + 16 h + i / 2
      int8_t* out = xq + (b / 2) * 64 + 16 * (b % 2);
      for (int64_t j = 0; j < kActBlock / 2; ++j) {
        out[j] = static_cast<int8_t>(q[2 * j]);
        out[32 + j] = static_cast<int8_t>(q[2 * j + 1]);
      }
    } else {
      for (int64_t i = 0; i < kActBlock; ++i) xq[b * kActBlock + i] = static_cast<int8_t>(q[i]);
    }
  });
  a8::matvec(L, blob, xq, xs4, cs, y);
}

}  // namespace memtrade::quant
#endif
