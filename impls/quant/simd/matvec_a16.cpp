// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#include "common/simd/fixed_width.h"  // no SVE / RVV: GCC 12 crashes compiling this file for SVE (aarch64, -O3)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "impls/quant/simd/matvec_a16.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/common.hpp"
#include "impls/quant/simd/codes-inl.h"
#include "impls/quant/simd/matvec_a16.hpp"
#include "impls/quant/simd/matvec_simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::quant::a16 {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 int16 lanes (256 bits): one vector holds the even or the odd half of a 32-element block,
// the unit the activation codes are laid out in; AVX-512 runs the 256-bit form.
using D16 = hn::CappedTag<int16_t, 16>;
using D32 = hn::RepartitionToWide<D16>;
using DF = hn::Rebind<float, D32>;
using VF = hn::Vec<DF>;
using V32 = hn::Vec<D32>;

// Lanes of D16 at compile time on every fixed-width target, so the loops over a block unroll.
constexpr int64_t kV = static_cast<int64_t>(hn::MaxLanes(D16()));
static_assert(kA16Block / 2 % kV == 0, "a vector must tile half a block");

// Pairwise int16 products of `w` and the activation codes at `xq`, added to s0 / s1.
HWY_INLINE void dot_pairs(hn::Vec<D16> w, const int16_t* xq, V32& s0, V32& s1) {
  s0 = hn::ReorderWidenMulAccumulate(D32(), w, hn::LoadU(D16(), xq), s0, s1);
}

// One block of 4-bit codes (16 bytes) against its activation codes: the exact int32 lanes of
// sum_k q_k x^_k as floats (the codes q unsigned; the zero point is subtracted per group, see MatvecA16T).
// Code byte i holds elements 2i (low nibble) and 2i + 1 (high nibble); the activation codes are laid out
// evens first, odds after (matvec_a16).
HWY_INLINE VF block4(const uint8_t* codes, const int16_t* xq) {
  const D16 d16;
  const hn::Rebind<uint8_t, D16> du8;
  V32 s0 = hn::Zero(D32()), s1 = hn::Zero(D32());
  for (int64_t h = 0; h < kA16Block / 2; h += kV) {
    const auto c = hn::PromoteTo(d16, hn::LoadU(du8, codes + h));
    dot_pairs(hn::And(c, hn::Set(d16, 0x0F)), xq + h, s0, s1);
    dot_pairs(hn::ShiftRight<4>(c), xq + kA16Block / 2 + h, s0, s1);
  }
  return hn::ConvertTo(DF(), hn::RearrangeToOddPlusEven(s0, s1));
}

// One block of int8 codes (32 bytes), the same way (natural order).
HWY_INLINE VF block8(const int8_t* codes, const int16_t* xq) {
  const hn::Rebind<int8_t, D16> d8;
  V32 s0 = hn::Zero(D32()), s1 = hn::Zero(D32());
  for (int64_t h = 0; h < kA16Block; h += kV) dot_pairs(hn::PromoteTo(D16(), hn::LoadU(d8, codes + h)), xq + h, s0, s1);
  return hn::ConvertTo(DF(), hn::RearrangeToOddPlusEven(s0, s1));
}

// nf4: the 16 levels as int16 (a16_nf4_level), split into their low and their high bytes for byte
// lookups (TableLookupBytes: pshufb on x86, tbl on Arm).
struct Nf4Bytes {
  HWY_ALIGN uint8_t lo[16], hi[16];
  Nf4Bytes() {
    for (int c = 0; c < 16; ++c) {
      const auto v = static_cast<uint16_t>(nf4_int_level(c, 16));
      lo[c] = static_cast<uint8_t>(v & 0xFF);
      hi[c] = static_cast<uint8_t>(v >> 8);
    }
  }
};

// One step of nf4 codes: kNfBlocks blocks (16 code bytes each) whose activation codes are laid out as
// a16_nf4_position says. The low and the high nibbles index the two byte tables, and interleaving the
// bytes gives each element's int16 level, in the order of the layout (128-bit block h of a vector holds
// block h's elements). Adds to acc the int32 sums of level x code as floats, each 128-bit block times its
// block's scale s[h] (the activation block's scale times the group's absmax).
#if HWY_TARGET != HWY_SCALAR
#if HWY_ARCH_X86
using D8 = hn::Repartition<uint8_t, D16>;  // 256 bits: two blocks per step
#else
using D8 = hn::CappedTag<uint8_t, 16>;     // one block per step
#endif
using DF8 = hn::Repartition<float, D8>;
constexpr int64_t kNfBlocks = static_cast<int64_t>(hn::MaxLanes(D8())) / 16;
static_assert(kNfBlocks == 1 || kNfBlocks == 2);

HWY_INLINE hn::Vec<DF8> nf4_step(const uint8_t* codes, const int16_t* xq, const float* s, hn::Vec<D8> tlo, hn::Vec<D8> thi,
                                 hn::Vec<DF8> acc) {
  const D8 d8;
  const hn::Repartition<int16_t, D8> d16;
  const hn::Repartition<int32_t, D8> d32;
  const DF8 df;
  const auto c = hn::LoadU(d8, codes);
  const auto lo = hn::And(c, hn::Set(d8, 0x0F)), hi = hn::ShiftRight<4>(c);
  const auto el = hn::TableLookupBytes(tlo, lo), eh = hn::TableLookupBytes(thi, lo);
  const auto ol = hn::TableLookupBytes(tlo, hi), oh = hn::TableLookupBytes(thi, hi);
  // Vector v's block j lies at xq + 16 v + 8 j (a16_nf4_position), so a one-block step reads 8 of 16.
  // (No arrays of vectors: sizeless vector types, SVE's, cannot be array elements.)
  hn::Vec<decltype(d32)> s0 = hn::Zero(d32), s1 = hn::Zero(d32);
  s0 = hn::ReorderWidenMulAccumulate(d32, hn::BitCast(d16, hn::InterleaveLower(d8, el, eh)), hn::LoadU(d16, xq), s0, s1);
  s0 = hn::ReorderWidenMulAccumulate(d32, hn::BitCast(d16, hn::InterleaveUpper(d8, el, eh)), hn::LoadU(d16, xq + 16), s0, s1);
  s0 = hn::ReorderWidenMulAccumulate(d32, hn::BitCast(d16, hn::InterleaveLower(d8, ol, oh)), hn::LoadU(d16, xq + 32), s0, s1);
  s0 = hn::ReorderWidenMulAccumulate(d32, hn::BitCast(d16, hn::InterleaveUpper(d8, ol, oh)), hn::LoadU(d16, xq + 48), s0, s1);
  const auto f = hn::ConvertTo(df, hn::RearrangeToOddPlusEven(s0, s1));
  if constexpr (kNfBlocks == 2) {
    const hn::Half<DF8> dh;
    return hn::MulAdd(f, hn::Combine(df, hn::Set(dh, s[1]), hn::Set(dh, s[0])), acc);
  } else {
    return hn::MulAdd(f, hn::Set(df, s[0]), acc);
  }
}
#endif

// sum_b xs[b] * block(b) over the blocks [b0, b1) of one row, two blocks per step (two fma chains) with
// one software prefetch per step.
template <Format F>
HWY_INLINE VF blocks(const uint8_t* HWY_RESTRICT row, const int16_t* HWY_RESTRICT xq, const float* HWY_RESTRICT xs,
                     int64_t b0, int64_t b1) {
  constexpr int64_t kBytes = F == Format::int8 ? kA16Block : kA16Block / 2;  // code bytes per block
  const DF df;
  auto block = [&](int64_t b) {
    if constexpr (F == Format::int8) return block8(reinterpret_cast<const int8_t*>(row) + b * kBytes, xq + b * kA16Block);
    else return block4(row + b * kBytes, xq + b * kA16Block);
  };
  VF a0 = hn::Zero(df), a1 = hn::Zero(df);
  int64_t b = b0;
  for (; b + 2 <= b1; b += 2) {
    hwy::Prefetch(row + b * kBytes + simd::kPrefetchBytes);
    a0 = hn::MulAdd(block(b), hn::Set(df, xs[b]), a0);
    a1 = hn::MulAdd(block(b + 1), hn::Set(df, xs[b + 1]), a1);
  }
  if (b < b1) a0 = hn::MulAdd(block(b), hn::Set(df, xs[b]), a0);
  return hn::Add(a0, a1);
}

// y_r = sum_g s_g (sum_{b in g} xs_b sum_{k in b} q_k x^_k - z_g cs_g), cs_g = sum_{k in g} x^_k (the
// zero point applied once per group, in float); int8 has one group per row and z = 0.
template <Format F>
void MatvecA16T(const QLayout& L, const uint8_t* blob, const int16_t* xq, const float* xs, const float* cs, float* y) {
  const DF df;
  const int64_t N = L.rows, K = L.cols, G = L.group, full = K / kA16Block;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    float tail = 0.f;  // the short last block (natural order) in int32, then scaled
    float out = 0.f;
    if constexpr (F == Format::int8) {
      const float scale = quant::simd::HWY_NAMESPACE::scale_f16(blob + L.scales.offset + 2 * r);
      int32_t t = 0;
      for (int64_t k = full * kA16Block; k < K; ++k) t += static_cast<int8_t>(row[k]) * xq[k];
      if (full * kA16Block < K) tail = xs[full] * static_cast<float>(t);
      out = scale * (hn::GetLane(hn::SumOfLanes(df, blocks<F>(row, xq, xs, 0, full))) + tail);
    } else {
      VF acc = hn::Zero(df);
      float corr = 0.f;
      const uint8_t* scales = blob + L.scales.offset + 2 * r * L.groups_per_row;
      for (int64_t g = 0; g < L.groups_per_row; ++g) {
        const float s = quant::simd::HWY_NAMESPACE::scale_f16(scales + 2 * g);
        float z = 8.f;
        if constexpr (F == Format::int4_asym) z = static_cast<float>(nibble(blob + L.zeros.offset + r * L.zero_row_bytes, g));
        acc = hn::MulAdd(blocks<F>(row, xq, xs, g * G / kA16Block, std::min(full, (g + 1) * G / kA16Block)), hn::Set(df, s), acc);
        corr += s * z * cs[g];
        if ((g + 1) * G >= K && full * kA16Block < K) {
          int32_t t = 0;
          for (int64_t k = full * kA16Block; k < K; ++k) t += nibble(row, k) * xq[k];
          tail = s * xs[full] * static_cast<float>(t);
        }
      }
      out = hn::GetLane(hn::SumOfLanes(df, acc)) + tail - corr;
    }
    y[r] = out;
  }
}

// nf4: y_r = 2^-13 sum_g sum_b (a_g xs_b) sum_{k in b} level(q_k) x^_k over whole pairs of blocks (64
// elements, within one group: a16_unsupported asks groups of a multiple of 64 or one group per row), then
// the elements after the last whole pair in natural order, each block's sum in int64.
template <bool kDq>
void MatvecA16Nf4(const QLayout& L, const uint8_t* blob, const int16_t* xq, const float* xs, float* y) {
  const int64_t N = L.rows, K = L.cols, gpr = L.groups_per_row, pairs = K / 64;
  const int64_t G = gpr == 1 ? K : L.group, per_group = gpr == 1 ? pairs : G / 64;  // whole pairs per group
#if HWY_TARGET != HWY_SCALAR
  const D8 d8;
  const DF8 df;
  const Nf4Bytes tb;
  const auto tlo = hn::LoadDup128(d8, tb.lo), thi = hn::LoadDup128(d8, tb.hi);
#else
  const DF df;
#endif
  const float mean = kDq ? load_bytes<float>(blob + L.dq_mean.offset) : 0.f;
  // Group i's absmax (stored_params' nf4 branches, without the format switch).
  auto absmax = [&](int64_t i) {
    if constexpr (kDq)
      return nf4_dq_absmax(static_cast<int8_t>(blob[L.scales.offset + i]),
                           load_bytes<float>(blob + L.dq_scales.offset + 4 * (i / nf4_dq_block)), mean);
    else
      return load_bytes<float>(blob + L.scales.offset + 4 * i);
  };
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    auto acc = hn::Zero(df);
    HWY_ALIGN float ab[8];  // nf4-dq: the absmax of groups [g8, g8 + 8), decoded in vectors
    int64_t g8 = -8;
    for (int64_t g = 0, p = 0; p < pairs; ++g) {
      if (kDq && g >= g8 + 8 && g + 8 <= gpr) {
        g8 = g;
        quant::simd::HWY_NAMESPACE::nf4_dq_absmax8(L, blob, mean, r * gpr + g, ab);
      }
      const float a = kDq && g < g8 + 8 ? ab[g - g8] : absmax(r * gpr + g);  // the row's last groups one by one
      for (const int64_t p1 = std::min(pairs, p + per_group); p < p1; ++p) {
        hwy::Prefetch(row + 32 * p + simd::kPrefetchBytes);
        const float s[2] = {a * xs[2 * p], a * xs[2 * p + 1]};
#if HWY_TARGET == HWY_SCALAR
        for (int64_t h = 0; h < 2; ++h) {
          int64_t t = 0;
          for (int64_t pos = 0; pos < 64; ++pos)
            if (pos % 16 / 8 == h) t += nf4_int_level(nibble(row, 64 * p + a16_nf4_position(pos)), 16) * xq[64 * p + pos];
          acc = hn::MulAdd(hn::Set(df, static_cast<float>(t)), hn::Set(df, s[h]), acc);
        }
#else
        if constexpr (kNfBlocks == 2) {
          acc = nf4_step(row + 32 * p, xq + 64 * p, s, tlo, thi, acc);
        } else {
          acc = nf4_step(row + 32 * p, xq + 64 * p, s, tlo, thi, acc);
          acc = nf4_step(row + 32 * p + 16, xq + 64 * p + 8, s + 1, tlo, thi, acc);
        }
#endif
      }
    }
    float tail = 0.f;
    for (int64_t b = 2 * pairs; b * kA16Block < K; ++b) {
      int64_t t = 0;
      for (int64_t k = b * kA16Block; k < std::min(K, (b + 1) * kA16Block); ++k) t += nf4_int_level(nibble(row, k), 16) * xq[k];
      tail += absmax(r * gpr + b * kA16Block / G) * xs[b] * static_cast<float>(t);
    }
    y[r] = (hn::GetLane(hn::SumOfLanes(df, acc)) + tail) * 0x1p-13f;
  }
}

void MatvecA16(const QLayout& L, const uint8_t* blob, const int16_t* xq, const float* xs, const float* cs, float* y) {
  switch (L.spec.format) {
    case Format::nf4: return L.spec.double_quant ? MatvecA16Nf4<true>(L, blob, xq, xs, y) : MatvecA16Nf4<false>(L, blob, xq, xs, y);
    case Format::int8: return MatvecA16T<Format::int8>(L, blob, xq, xs, cs, y);
    case Format::int4: return MatvecA16T<Format::int4>(L, blob, xq, xs, cs, y);
    case Format::int4_asym: return MatvecA16T<Format::int4_asym>(L, blob, xq, xs, cs, y);
    default: return;  // a16_unsupported() rejected it before dispatch
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::quant::a16
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::quant {
namespace a16 {
HWY_EXPORT(MatvecA16);
// Dispatched from inside the namespace (a qualified name does not survive static dispatch's prefix).
void matvec(const QLayout& L, const uint8_t* blob, const int16_t* xq, const float* xs, const float* cs, float* y) {
  HWY_DYNAMIC_DISPATCH(MatvecA16)(L, blob, xq, xs, cs, y);
}

bool four_bit_order(const QLayout& L) { return L.spec.format == Format::int4 || L.spec.format == Format::int4_asym; }

}  // namespace a16

int64_t a16_nf4_position(int64_t pos) {
  const int64_t v = pos / 16, h = pos % 16 / 8, j = pos % 8;  // vector (evens 0-1, odds 2-3), block, lane
  return 32 * h + 16 * (v % 2) + 2 * j + v / 2;
}

std::string a16_unsupported(const QLayout& L) {
  switch (L.spec.format) {
    case Format::int8: return {};
    case Format::int4:
    case Format::int4_asym:
      if (L.group % kA16Block != 0 && L.groups_per_row > 1)  // one group per row: any length
        return "the integer path needs groups of a multiple of " + std::to_string(kA16Block) + " (got " +
               std::to_string(L.group) + ")";
      return {};
    case Format::nf4:
      if (L.group % 64 != 0 && L.groups_per_row > 1)
        return "the integer path needs nf4 groups of a multiple of 64 (got " + std::to_string(L.group) + ")";
      return {};
    default: return std::string(format_name(L.spec.format)) + " codes are not integers (the integer path takes int8, int4 and nf4's levels)";
  }
}

std::size_t a16_workspace_bytes(int64_t K) {
  const int64_t blocks = (K + kA16Block - 1) / kA16Block;
  // codes, block scales, per-group sums (at most one group per block)
  return static_cast<std::size_t>(blocks * kA16Block) * sizeof(int16_t) + 2 * static_cast<std::size_t>(blocks) * sizeof(float);
}

void matvec_a16(const QLayout& L, const uint8_t* blob, const float* x, float* y, void* workspace) {
  if (const std::string why = a16_unsupported(L); !why.empty()) throw Error("matvec_a16: " + why);
  MT_CHECK(L.rows > 0 && L.cols > 0 && blob && x && y && workspace, "matvec_a16: empty layout or null pointer");
  const int64_t K = L.cols, blocks = (K + kA16Block - 1) / kA16Block;
  auto* xq = static_cast<int16_t*>(workspace);
  auto* xs = reinterpret_cast<float*>(xq + blocks * kA16Block);
  float* cs = xs + blocks;
  const int64_t G = L.spec.format == Format::int8 ? K : L.group;  // every group's last block sets cs[group]
  const bool evens_first = a16::four_bit_order(L);  // whole blocks: evens, then odds (the nibbles' order in code bytes)
  round_blocks(x, K, 16, G, cs, [&](int64_t b, const int16_t* q, int64_t n, float s) {
    xs[b] = s;
    int16_t* out = xq + b * kA16Block;
    if (n == kA16Block && evens_first)
      for (int64_t i = 0; i < kA16Block / 2; ++i) {
        out[i] = q[2 * i];
        out[kA16Block / 2 + i] = q[2 * i + 1];
      }
    else
      std::copy(q, q + kA16Block, out);
  });
  if (L.spec.format == Format::nf4)  // whole pairs of blocks in the kernel's order (a16_nf4_position)
    for (int64_t k0 = 0; k0 + 64 <= K; k0 += 64) {
      int16_t pair[64];
      std::copy(xq + k0, xq + k0 + 64, pair);
      for (int64_t pos = 0; pos < 64; ++pos) xq[k0 + pos] = pair[a16_nf4_position(pos)];
    }
  a16::matvec(L, blob, xq, xs, cs, y);
}

}  // namespace memtrade::quant
#endif
