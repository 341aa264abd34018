// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#include "common/simd/fixed_width.h"  // the register blocks below are arrays of vectors: no SVE / RVV
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "impls/kvcache/simd/decode_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include "common/simd/convert-inl.h"
#include "impls/attention/simd/exp-inl.h"
#include "impls/quant/simd/codes-inl.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/dtype.hpp"
#include "impls/attention/tile_math.hpp"
#include "impls/kvcache/record.hpp"
#include "impls/kvcache/simd/decode_simd.hpp"
#include "impls/quant/formats.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::kvcache::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int64_t T = kDecodeChunk;
// 16- and 32-bit records, whose decode needs no constant vectors: read in ByEntry's order (Decode below).
template <KvType K>
constexpr bool kWideRecord = K == KvType::f32 || K == KvType::bf16 || K == KvType::f16;

// Output columns held in registers by the value pass: up to 4 query heads x kDB vectors of accumulators,
// kDB loaded values and a broadcast weight: 16 + 4 + 1 of AVX-512's 32 registers; of the 16 of AVX2 and SSE4,
// 12 + 3 + 1 for 16- and 32-bit records (12 FMA chains, where 8 were bound by the FMA latency; with kTB's
// three tokens, fp32, bf16 and fp16 took 9-18% less time at 32K tokens on a 2-core AMD EPYC, Zen 2) and
// 8 + 2 + 1 for the 8- and 4-bit ones, whose decode keeps constant vectors in registers too (with three:
// int8 and int4 no faster, fp8 13-16% slower).
template <KvType K>
constexpr int kDB = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 ? 4 : kWideRecord<K> ? 3 : 2;
constexpr int kJB = 4;  // query heads per register block

// The constants of SubByte<B>'s decode, lane j of 16 (k = j % per, per = 8 / B codes a byte): the index of
// its byte (j / per) in the low byte of the 32-bit lane, zeros above (index bit 7 set); its code's bits
// (B k .. B k + B - 1); the exponent of 2^(23 - B k), under which those bits weigh 1, 2, ...; and 2^(23 - B k)
// + z, z = 2^(B - 1).
template <int B>
struct CodeTables {
  alignas(64) uint8_t idx[64];
  alignas(64) uint32_t mask[16];
  alignas(64) uint32_t exp[16];
  alignas(64) float zero[16];
};
template <int B>
constexpr CodeTables<B> MakeCodeTables() {
  constexpr int per = 8 / B;
  CodeTables<B> t{};
  for (int j = 0; j < 16; ++j) {
    const int k = j % per;
    t.idx[4 * j] = static_cast<uint8_t>(j / per);
    t.idx[4 * j + 1] = t.idx[4 * j + 2] = t.idx[4 * j + 3] = 128;
    t.mask[j] = ((1u << B) - 1u) << (B * k);
    t.exp[j] = static_cast<uint32_t>(127 + 23 - B * k) << 23;
    t.zero[j] = static_cast<float>(1 << (23 - B * k)) + static_cast<float>(1 << (B - 1));
  }
  return t;
}
template <int B>
inline constexpr CodeTables<B> kCodeTables = MakeCodeTables<B>();

// Elements i .. i + Lanes - 1 (i a multiple of Lanes) of a record of B-bit codes (4: int4, q4_0, int4-kivi,
// element 2j in the low nibble of byte j; 2: int2-kivi, element 4j + k in bits 2k, 2k + 1 of byte j), less
// z = 2^(B - 1), as exact floats. The Lanes / per bytes (per = 8 / B), copied into every 64-bit lane, go one
// to each run of per 32-bit lanes by a byte shuffle (within each 128-bit block, which holds all of them); lane
// k of a run keeps its code's bits ORed into the mantissa of 2^(23 - B k), where they weigh 1, 2, ..., and
// one subtraction of 2^(23 - B k) + z leaves q - z. Only the element's own bytes are read (the last vector
// of a record ends at its codes).
template <int B>
HWY_INLINE VF SubByte(const uint8_t* r, int64_t i) {
  const DF df;
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(df, record_value(B == 4 ? KvType::int4 : KvType::int2_kivi, r, i));
#else
  constexpr int64_t N = static_cast<int64_t>(hn::MaxLanes(df)), per = 8 / B;
  static_assert(N >= 4 && N <= 16, "one to four 128-bit blocks of floats");
  const hn::Repartition<uint64_t, DF> d64;
  const hn::Repartition<uint8_t, DF> d8;
  const hn::RebindToUnsigned<DF> du;
  const CodeTables<B>& c = kCodeTables<B>;
  uint64_t bytes = 0;
  std::memcpy(&bytes, r + i / per, N / per);
  const auto src = hn::BitCast(d8, hn::Set(d64, bytes));
  const auto lanes = hn::BitCast(du, hn::TableLookupBytesOr0(src, hn::Load(d8, c.idx)));
  const auto bits = hn::OrAnd(hn::Load(du, c.exp), lanes, hn::Load(du, c.mask));
  return hn::Sub(hn::BitCast(df, bits), hn::Load(df, c.zero));
#endif
}

// A head record of storage type K (head_dim hd): Lanes(DF) elements from element i as fp32 (unscaled), the
// scale of element i's block (q8_0, q4_0; in every lane), one element (scaled by its block's scale), and
// the record's own scale (1 where the type has none, or a static one the caller folds in).
template <KvType K>
struct Rec {
  static HWY_INLINE VF load(const uint8_t* r, int64_t i) {
    if constexpr (K == KvType::f32) return hn::LoadU(DF(), reinterpret_cast<const float*>(r) + i);
    else if constexpr (K == KvType::bf16) {
      // The bits on top; a NaN stays a NaN, unquieted. convert-inl.h's LoadF32 also quiets NaNs, which cost
      // bf16 at 32K tokens, batch 8, 69-77 ms against 58-61 ms here.
      const hn::RebindToUnsigned<DF> du;
      const hn::Rebind<uint16_t, DF> d16;
      return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(r) + i))));
    }
    else if constexpr (K == KvType::f16) return memtrade::simd::HWY_NAMESPACE::LoadF32(reinterpret_cast<const f16_t*>(r) + i);
    else if constexpr (K == KvType::int8) return quant::simd::HWY_NAMESPACE::decode8<quant::Format::int8>(r + i);
    else if constexpr (K == KvType::int4 || K == KvType::q4_0 || K == KvType::int4_kivi) return SubByte<4>(r, i);
    else if constexpr (K == KvType::int2_kivi) return SubByte<2>(r, i);
    else if constexpr (K == KvType::q8_0) return quant::simd::HWY_NAMESPACE::decode8<quant::Format::int8>(r + i);
    else if constexpr (K == KvType::fp8_e5m2)  // a NaN input's NaN code stays NaN (an infinite one saturated)
      return quant::simd::HWY_NAMESPACE::decode8<quant::Format::fp8_e5m2, true>(r + i);
    // Per-record fp8 codes are never NaN (encode_head: a non-finite input makes the record's scale NaN and
    // its codes 0); static-scale records keep a NaN input's NaN code.
    else return quant::simd::HWY_NAMESPACE::decode8<quant::Format::fp8_e4m3, K == KvType::fp8_e4m3_static>(r + i);
  }
  static HWY_INLINE VF block(const uint8_t* r, int64_t i, int64_t hd) {
    // Widened by convert-inl.h: Highway's own fp16 promotion, without F16C, makes a NaN or Inf finite.
    const auto* s = reinterpret_cast<const f16_t*>(r + record_code_bytes(K, hd) + 2 * (i / kKvBlock));
    return hn::Set(DF(), hn::GetLane(memtrade::simd::HWY_NAMESPACE::LoadF32(hn::CappedTag<float, 1>(), s)));
  }
  // One element, scaled by its block's scale (q8_0, q4_0); int4-kivi's come as q - 8 (a key's step is in the
  // query; ValueTail applies a value block's (s, m)).
  static HWY_INLINE float elem(const uint8_t* r, int64_t i, int64_t hd) {
    return record_blocked(K) ? block_scale(K, r, hd, i) * record_value(K, r, i) : record_value(K, r, i);
  }
  static HWY_INLINE float scale(const uint8_t* r, int64_t hd) { return is_kivi(K) ? 1.f : record_scale(K, r, hd); }
};

// A KIVI record's head_dim / 32 (s, m) pairs (at most 8) as s[k] and off[k] = m + z s (z = kivi_zero(type)), for
// x = (q - z) s + m + z s. Widened by convert-inl.h (exact; F16C where the target has it), four pairs per
// conversion where the target has eight lanes, then two, then one value at a time: nothing past the pairs is
// read.
HWY_INLINE void KiviPairs(KvType type, const uint8_t* r, int64_t hd, float* s, float* off) {
  const int64_t n = 2 * (hd / kKiviGroup);
  const auto* p = reinterpret_cast<const f16_t*>(kivi_pairs(type, r, hd));
  const hn::CappedTag<float, 8> d8;
  const hn::CappedTag<float, 4> d4;
  const hn::CappedTag<float, 1> d1;
  HWY_ALIGN float sm[16] = {};  // (the loops below write every element read after them)
  int64_t i = 0;
  if (hn::Lanes(d8) == 8)
    for (; i + 8 <= n; i += 8) hn::Store(memtrade::simd::HWY_NAMESPACE::LoadF32(d8, p + i), d8, sm + i);
  if (hn::Lanes(d4) == 4)
    for (; i + 4 <= n; i += 4) hn::Store(memtrade::simd::HWY_NAMESPACE::LoadF32(d4, p + i), d4, sm + i);
  for (; i < n; ++i) sm[i] = hn::GetLane(memtrade::simd::HWY_NAMESPACE::LoadF32(d1, p + i));
  const float z = kivi_zero(type);
  for (int64_t k = 0; k < n / 2; ++k) {
    s[k] = sm[2 * k];
    off[k] = sm[2 * k + 1] + z * sm[2 * k];
  }
}

// The lane sums of four vectors at once, out[k] = sum of v[k]'s lanes: two interleave-and-add steps
// leave each 128-bit block holding [a, b, c, d] partial sums, then the blocks are added (about a third of
// the shuffles of four separate reductions).
#if HWY_TARGET == HWY_SCALAR
HWY_INLINE void Sum4(const VF* v, float* out) {
  for (int k = 0; k < 4; ++k) out[k] = hn::GetLane(v[k]);
}
#else
template <class D>
HWY_INLINE void AddBlocks(D d, hn::Vec<D> v, float* out) {
  if constexpr (hn::MaxLanes(d) > 4) {
    const hn::Half<D> dh;
    AddBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}
HWY_INLINE void Sum4(const VF* v, float* out) {
  const DF df;
  const hn::Repartition<uint64_t, DF> d64;
  const VF ab = hn::Add(hn::InterleaveLower(df, v[0], v[1]), hn::InterleaveUpper(df, v[0], v[1]));
  const VF cd = hn::Add(hn::InterleaveLower(df, v[2], v[3]), hn::InterleaveUpper(df, v[2], v[3]));
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  AddBlocks(df, hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, ab64, cd64)), hn::BitCast(df, hn::InterleaveUpper(d64, ab64, cd64))),
            out);
}
#endif

// Tokens scored together: kTB tokens x up to 4 query heads of accumulators, kTB K vectors and a query
// vector. Three tokens (12 FMA chains) on 16 registers for 16- and 32-bit records, as kDB; two elsewhere
// (AVX-512 has not been measured with more).
template <KvType K>
constexpr int kTB = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 ? 2 : kWideRecord<K> ? 3 : 2;

// v kept in a register: GCC otherwise folds the load of a query vector into each of its kTB FMAs, and the
// loop becomes bound by loads (kTB K vectors + JB x kTB query loads per JB x kTB FMAs).
HWY_INLINE VF InRegister(VF v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// ScoreBlock's elements from i to head_dim, one by one (head_dim not a multiple of the vector). Not inlined:
// the scalar conversions' zeroed source register, kept live through the vector loop, made the allocator
// spill one of its 12 accumulators.
template <KvType K, int JB>
HWY_NOINLINE void ScoreTail(const uint8_t* const* k, int64_t i, int64_t hd, const float* q, float (*d)[4]) {
  for (int b = 0; b < kTB<K>; ++b)
    for (int j = 0; j < JB; ++j)
      for (int64_t e = i; e < hd; ++e) d[b][j] += q[j * hd + e] * Rec<K>::elem(k[b], e, hd);
}

// The scores of kTB<K> tokens (K records k[0 .. kTB<K>)) for JB query heads (q: JB x head_dim, consecutive):
// d[b][j], token b's dot product with head j before any scale. Register-blocked: each K vector decoded
// once for every head, each query vector loaded once for every token, the lane sums of four products at
// a time.
template <KvType K, int JB>
HWY_INLINE void ScoreBlock(const uint8_t* const* k, int64_t hd, const float* q, float (*d)[4]) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a[kTB<K>][JB];
  for (int b = 0; b < kTB<K>; ++b)
    for (int j = 0; j < JB; ++j) a[b][j] = hn::Zero(df);
  VF sc[kTB<K>];  // q8_0 / q4_0: each token's scale of the block at i (a vector lies in one block)
  for (int b = 0; b < kTB<K>; ++b) sc[b] = hn::Zero(df);
  int64_t i = 0;
  for (; i + N <= hd; i += N) {
    VF x[kTB<K>];
    if constexpr (record_blocked(K))
      if (i % kKvBlock == 0)
        for (int b = 0; b < kTB<K>; ++b) sc[b] = Rec<K>::block(k[b], i, hd);
    for (int b = 0; b < kTB<K>; ++b) {
      x[b] = Rec<K>::load(k[b], i);
      if constexpr (record_blocked(K)) x[b] = hn::Mul(x[b], sc[b]);
    }
    for (int j = 0; j < JB; ++j) {
      const VF qv = InRegister(hn::LoadU(df, q + j * hd + i));
      for (int b = 0; b < kTB<K>; ++b) a[b][j] = hn::MulAdd(qv, x[b], a[b][j]);
    }
  }
  for (int b = 0; b < kTB<K>; ++b) {
    VF acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = j < JB ? a[b][j] : hn::Zero(df);
    Sum4(acc, d[b]);
  }
  if (i < hd) ScoreTail<K, JB>(k, i, hd, q, d);
}

// The records of tokens t .. t + TB - 1 of a chunk of n (rec(u): token u's record): past the last token,
// the last again; the scores computed for them land at positions n and above, which Update sets to -inf.
template <int TB, class Rec>
HWY_INLINE void BlockRecords(int64_t t, int64_t n, const uint8_t** k, const Rec& rec) {
  for (int b = 0; b < TB; ++b) k[b] = rec(std::min<int64_t>(t + b, n - 1));
}

// Update's columns from i to head_dim, one by one (head_dim not a multiple of the vector). Not inlined, as
// ScoreTail.
template <KvType K, int JB>
HWY_NOINLINE void ValueTail(const uint8_t* const* vr, int64_t n, int64_t i, int64_t hd, const float* corr, const float (*w)[T],
                            float* o) {
  for (; i < hd; ++i)
    for (int j = 0; j < JB; ++j) {
      float acc = o[j * hd + i] * corr[j];
      for (int64_t t = 0; t < n; ++t) {
        float x = Rec<K>::elem(vr[t], i, hd);
        if constexpr (is_kivi(K)) {
          const KiviPair p = kivi_pair(K, vr[t], hd, i / kKiviGroup);
          x = p.m + p.s * (x + kivi_zero(K));
        }
        acc += w[j][t] * x;
      }
      o[j * hd + i] = acc;
    }
}

// One chunk's online-softmax step and value pass for JB query heads (consecutive) of one KV head: n <= T
// tokens with scores s[j][t] (scaled; positions n .. T - 1 are set to -inf here), V records vr[t] with
// record scales vs[t] (0 past n); o, m, l as in DecodeUnit, from the chunk's first head.
template <KvType K, int JB>
HWY_INLINE void Update(const uint8_t* const* vr, const float* vs, int64_t n, int64_t hd, float (*s)[T], float* o, float* m,
                         float* l) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  // The online softmax: new max, the factor for what was accumulated, weights p_t x the V record scale.
  HWY_ALIGN float w[JB][T];
  float corr[JB];
  for (int j = 0; j < JB; ++j) {
    float mx = m[j];
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, s[j][t]);
    for (int64_t t = n; t < T; ++t) s[j][t] = -std::numeric_limits<float>::infinity();
    corr[j] = attention::exp_approx(m[j] - mx);  // 0 on the first chunk (m = -inf)
    VF sum = hn::Zero(df);
    for (int64_t t = 0; t < T; t += N) {
      const VF p = memtrade::simd::HWY_NAMESPACE::ExpApprox(df, hn::Sub(hn::Load(df, s[j] + t), hn::Set(df, mx)));
      sum = hn::Add(sum, p);
      hn::Store(hn::Mul(p, hn::LoadU(df, vs + t)), df, w[j] + t);
    }
    l[j] = l[j] * corr[j] + hn::GetLane(hn::SumOfLanes(df, sum));
    m[j] = mx;
  }
  // KIVI: each token's value blocks' s and m + z s, widened once per chunk (not per vector of columns).
  HWY_ALIGN float ks[is_kivi(K) ? T : 1][8], ko[is_kivi(K) ? T : 1][8];
  if constexpr (is_kivi(K))
    for (int64_t t = 0; t < n; ++t) KiviPairs(K, vr[t], hd, ks[t], ko[t]);
  // o = o x corr + sum_t w_t v_t, DB vectors of columns at a time.
  auto columns = [&](auto db, int64_t i) {
    constexpr int DB = decltype(db)::value;
    VF acc[JB][DB];
    for (int j = 0; j < JB; ++j)
      for (int v = 0; v < DB; ++v) acc[j][v] = hn::Mul(hn::LoadU(df, o + j * hd + i + v * N), hn::Set(df, corr[j]));
    for (int64_t t = 0; t < n; ++t) {
      VF x[DB];
      VF sc = hn::Zero(df), off = hn::Zero(df);  // q8_0 / q4_0: the scale of the vector's block; int4-kivi: s, m + 8 s
      for (int v = 0; v < DB; ++v) {
        if constexpr (record_blocked(K))
          if (v == 0 || (i + v * N) % kKvBlock == 0) sc = Rec<K>::block(vr[t], i + v * N, hd);
        if constexpr (is_kivi(K))
          if (v == 0 || (i + v * N) % kKiviGroup == 0) {
            sc = hn::Set(df, ks[t][(i + v * N) / kKiviGroup]);
            off = hn::Set(df, ko[t][(i + v * N) / kKiviGroup]);
          }
        x[v] = Rec<K>::load(vr[t], i + v * N);
        if constexpr (record_blocked(K)) x[v] = hn::Mul(x[v], sc);
        if constexpr (is_kivi(K)) x[v] = hn::MulAdd(x[v], sc, off);
      }
      for (int j = 0; j < JB; ++j) {
        const VF wt = hn::Set(df, w[j][t]);
        for (int v = 0; v < DB; ++v) acc[j][v] = hn::MulAdd(wt, x[v], acc[j][v]);
      }
    }
    for (int j = 0; j < JB; ++j)
      for (int v = 0; v < DB; ++v) hn::StoreU(acc[j][v], df, o + j * hd + i + v * N);
  };
  int64_t i = 0;
  for (; i + kDB<K> * N <= hd; i += kDB<K> * N) columns(std::integral_constant<int, kDB<K>>(), i);
  if constexpr (kDB<K> > 2)
    if (i + 2 * N <= hd) {
      columns(std::integral_constant<int, 2>(), i);
      i += 2 * N;
    }
  for (; i + N <= hd; i += N) columns(std::integral_constant<int, 1>(), i);
  if (i < hd) ValueTail<K, JB>(vr, n, i, hd, corr, w, o);
}

// The scores of the chunk's tokens t .. t + kTB<K> - 1 (K records k[b]; see BlockRecords) for the group query
// heads q of one KV head, into rows s[0 .. group) (positions at T and above are not kept).
template <KvType K>
HWY_INLINE void ScoreHeads(const uint8_t* const* k, int64_t t, int64_t hd, int64_t group, const float* q, float qk,
                           float (*s)[T]) {
  float kq[kTB<K>];
  for (int b = 0; b < kTB<K>; ++b) kq[b] = Rec<K>::scale(k[b], hd) * qk;
  for (int64_t j = 0; j < group; j += kJB) {
    float d[kTB<K>][4];
    const int jb = static_cast<int>(std::min<int64_t>(kJB, group - j));
    switch (jb) {
      case 1: ScoreBlock<K, 1>(k, hd, q + j * hd, d); break;
      case 2: ScoreBlock<K, 2>(k, hd, q + j * hd, d); break;
      case 3: ScoreBlock<K, 3>(k, hd, q + j * hd, d); break;
      default: ScoreBlock<K, 4>(k, hd, q + j * hd, d); break;
    }
    for (int b = 0; b < kTB<K> && t + b < T; ++b)
      for (int c = 0; c < jb; ++c) s[j + c][t + b] = d[b][c] * kq[b];
  }
}

// The softmax step and value pass of one chunk for every query head of KV head g (scores s[0 .. group)).
template <KvType K>
HWY_INLINE void UpdateHeads(const DecodeUnit& u, const uint8_t* const* vr, const float* vs, int64_t n, int64_t g,
                            float (*s)[T]) {
  for (int64_t j = 0; j < u.group; j += kJB) {
    const int64_t h = g * u.group + j;
    float* o = u.o + h * u.head_dim;
    switch (std::min<int64_t>(kJB, u.group - j)) {
      case 1: Update<K, 1>(vr, vs, n, u.head_dim, s + j, o, u.m + h, u.l + h); break;
      case 2: Update<K, 2>(vr, vs, n, u.head_dim, s + j, o, u.m + h, u.l + h); break;
      case 3: Update<K, 3>(vr, vs, n, u.head_dim, s + j, o, u.m + h, u.l + h); break;
      default: Update<K, 4>(vr, vs, n, u.head_dim, s + j, o, u.m + h, u.l + h); break;
    }
  }
}

HWY_INLINE void StartHeads(const DecodeUnit& u) {
  if (!u.start) return;
  for (int64_t h = u.g0 * u.group; h < u.g1 * u.group; ++h) {
    u.m[h] = -std::numeric_limits<float>::infinity();
    u.l[h] = 0;
    std::fill(u.o + h * u.head_dim, u.o + (h + 1) * u.head_dim, 0.f);
  }
}

// Query heads whose chunk scores are kept at once (16 KB): every query head of a KV head (decode_attention
// allows at most 256 per KV head), and ByEntry scores as many KV heads as fit per pass.
constexpr int64_t kScoreRows = 256;

// 16- and 32-bit records, whose decode is cheap next to the bytes they bring: each chunk's scores block of
// tokens by block of tokens across the unit's KV heads, so that every token's K records are read front to back
// (one stream per token, which the hardware prefetchers follow), then per KV head the softmax step and
// the value pass over its V records. At 32K tokens, batch 8 on a 2-core AMD EPYC (Zen 2) this order took
// fp32 from 149-160 to 89-90 ms and bf16 from 94-100 to 72-73 ms against ByHead below; there ByHead's
// prefetches (one KV head's records of the next chunk, into L2) made it slower (one thread, in DRAM).
// The next chunk's records are prefetched into L1 a KV head at a time, each just before the same work on the
// current chunk: as a block of tokens is scored for a KV head, the same tokens' K records of that head; before
// a KV head's value pass, its V records of every token of the next chunk. On a 2-core AMD EPYC (Zen 5) the
// whole unit's K and V lines of a block of tokens, prefetched at once before it was scored (bursts of 16-24
// KB), had made fp32 at 32K x 8 1.36x faster than no prefetch, yet one core still took about the sum of its
// time in cache and its time to read the bytes (one thread: 60-65 ns per token and KV head, against 22-25 in
// cache and 38 to read 1 KB at a plain stream's rate): the bursts stalled its arithmetic behind them. Spread a
// head at a time: 44-51 ns on one thread, level in cache; two threads at 8 x 16K-32K tokens (harness, `ab`
// in lockstep, 5 rounds) 0.72-0.87 of the time for fp32 and 0.72-0.76 for bf16.
HWY_INLINE void PrefetchRecord(const uint8_t* r, int64_t hb) {
  for (int64_t b = 0; b < hb; b += 64) hwy::Prefetch(r + b);
}

template <KvType K>
void ByEntry(const DecodeUnit& u) {
  const int64_t hd = u.head_dim, hb = u.head_bytes, G = u.group;
  HWY_ALIGN float s[kScoreRows][T];
  HWY_ALIGN float vs[T];
  const uint8_t* vr[T];
  StartHeads(u);
  const int64_t per_pass = std::max<int64_t>(1, kScoreRows / G);  // KV heads scored per pass
  for (int64_t c = 0; c < u.count; c += T) {
    const int64_t n = std::min(T, u.count - c);
    for (int64_t g0 = u.g0; g0 < u.g1; g0 += per_pass) {
      const int64_t g1 = std::min(u.g1, g0 + per_pass);
      for (int64_t t = 0; t < n; t += kTB<K>) {
        const uint8_t* e[kTB<K>];
        BlockRecords<kTB<K>>(t, n, e, [&](int64_t v) { return u.tokens[c + v]; });
        const int64_t next = std::min(c + T + t + kTB<K>, u.count + u.lookahead);  // [c + T + t, next)
        for (int64_t g = g0; g < g1; ++g) {
          for (int64_t v = c + T + t; v < next; ++v) PrefetchRecord(u.tokens[v] + g * hb, hb);
          const uint8_t* k[kTB<K>];
          for (int b = 0; b < kTB<K>; ++b) k[b] = e[b] + g * hb;
          ScoreHeads<K>(k, t, hd, G, u.q + g * G * hd, u.qk_scale[g], s + (g - g0) * G);
        }
      }
      for (int64_t g = g0; g < g1; ++g) {
        for (int64_t t = 0; t < T; ++t) {
          vr[t] = t < n ? u.tokens[c + t] + (u.kv_heads + g) * hb : nullptr;
          vs[t] = t < n ? Rec<K>::scale(vr[t], hd) : 0.f;
        }
        for (int64_t v = c + T; v < std::min(c + 2 * T, u.count + u.lookahead); ++v)
          PrefetchRecord(u.tokens[v] + (u.kv_heads + g) * hb, hb);
        UpdateHeads<K>(u, vr, vs, n, g, s + (g - g0) * G);
      }
    }
  }
}

// One chunk of one KV head for JB query heads (consecutive, q: JB x head_dim) in ByHead's order: n <= T
// tokens whose K and V records are kr[t] and vr[t], with record scales ks[t] and vs[t]; the score loop
// prefetches the npf records pf (hb bytes each), two per token scored, into L2.
template <KvType K, int JB>
HWY_NOINLINE void Chunk(const uint8_t* const* kr, const uint8_t* const* vr, const float* ks, const float* vs, int64_t n,
                        int64_t hd, const float* q, float qk, float* o, float* m, float* l, const uint8_t* const* pf,
                        int64_t npf, int64_t hb, const float* bias) {
  HWY_ALIGN float s[JB][T];
  HWY_ALIGN float kq[T];  // a token's score factor: its record scale x 1 / sqrt(head_dim)
  for (int64_t t = 0; t < T; ++t) kq[t] = ks[t] * qk;
  for (int64_t t = 0; t < n; t += kTB<K>) {
    for (int64_t f = 2 * t; f < std::min(2 * (t + kTB<K>), npf); ++f)
      for (int64_t b = 0; b < hb; b += 64) __builtin_prefetch(pf[f] + b, 0, 2);  // to L2, not L1
    const uint8_t* k[kTB<K>];
    BlockRecords<kTB<K>>(t, n, k, [&](int64_t v) { return kr[v]; });
    float d[kTB<K>][4];
    ScoreBlock<K, JB>(k, hd, q, d);
    for (int b = 0; b < kTB<K> && t + b < T; ++b)
      for (int j = 0; j < JB; ++j) s[j][t + b] = (bias ? d[b][j] + bias[j] : d[b][j]) * kq[t + b];
  }
  Update<K, JB>(vr, vs, n, hd, s, o, m, l);
}

// 8- and 4-bit records, whose decode costs more arithmetic per byte: chunk by chunk, every KV head of the
// unit for each chunk, each head's scores, softmax step and value pass together, while the score loop
// prefetches the next chunk's records of the same KV head into L2, two tokens at a time (at 32K tokens,
// batch 8: int8 2x faster than the hardware prefetchers alone on an AVX-512 AMD EPYC; on the Zen 2 one,
// ByEntry's order took int8 from 67 to 79 ms and int4 from 70-73 to 86-88 ms). Prefetched into L1
// (hwy::Prefetch, T0), the next chunk evicted the one being worked on and the queries.
template <KvType K>
void ByHead(const DecodeUnit& u) {
  const int64_t hd = u.head_dim, hb = u.head_bytes, G = u.group;
  HWY_ALIGN float ks[T], vs[T];
  const uint8_t *kr[T], *vr[T];
  StartHeads(u);
  for (int64_t c = 0; c < u.count; c += T) {
    const int64_t n = std::min(T, u.count - c);
    for (int64_t g = u.g0; g < u.g1; ++g) {
      const int64_t koff = g * hb, voff = (u.kv_heads + g) * hb;
      for (int64_t t = 0; t < T; ++t) {
        kr[t] = vr[t] = nullptr;
        ks[t] = vs[t] = 0.f;
        if (t < n) {
          kr[t] = u.tokens[c + t] + koff;
          vr[t] = u.tokens[c + t] + voff;
          ks[t] = Rec<K>::scale(kr[t], hd);
          vs[t] = Rec<K>::scale(vr[t], hd);
        }
      }
      // The next chunk's records of this head, a token's K and V per token scored.
      const uint8_t* pf[2 * T];
      int64_t npf = 0;
      for (int64_t t = c + T; t < std::min(c + 2 * T, u.count + u.lookahead); ++t) {
        pf[npf++] = u.tokens[t] + koff;
        pf[npf++] = u.tokens[t] + voff;
      }
      for (int64_t j = 0; j < G; j += kJB) {
        const int64_t h = g * G + j;
        const float* q = u.q + h * hd;
        float* o = u.o + h * hd;
        const int64_t np = j == 0 ? npf : 0;  // the first block of query heads prefetches
        const float* bias = u.score_bias ? u.score_bias + h : nullptr;
        switch (std::min<int64_t>(kJB, G - j)) {
          case 1: Chunk<K, 1>(kr, vr, ks, vs, n, hd, q, u.qk_scale[g], o, u.m + h, u.l + h, pf, np, hb, bias); break;
          case 2: Chunk<K, 2>(kr, vr, ks, vs, n, hd, q, u.qk_scale[g], o, u.m + h, u.l + h, pf, np, hb, bias); break;
          case 3: Chunk<K, 3>(kr, vr, ks, vs, n, hd, q, u.qk_scale[g], o, u.m + h, u.l + h, pf, np, hb, bias); break;
          default: Chunk<K, 4>(kr, vr, ks, vs, n, hd, q, u.qk_scale[g], o, u.m + h, u.l + h, pf, np, hb, bias); break;
        }
      }
    }
  }
}

// Each storage type in its order: 16- and 32-bit records by entry, the others by head.
template <KvType K>
void Decode(const DecodeUnit& u) {
  if constexpr (kWideRecord<K>) ByEntry<K>(u);
  else ByHead<K>(u);
}

void DecodeUnitImpl(const DecodeUnit& u) {
  switch (u.type) {
    case KvType::f32: return Decode<KvType::f32>(u);
    case KvType::bf16: return Decode<KvType::bf16>(u);
    case KvType::f16: return Decode<KvType::f16>(u);
    case KvType::int8: return Decode<KvType::int8>(u);
    case KvType::fp8_e4m3: return Decode<KvType::fp8_e4m3>(u);
    case KvType::fp8_e4m3_static: return Decode<KvType::fp8_e4m3_static>(u);  // no record scale (see Rec)
    case KvType::int4: return Decode<KvType::int4>(u);
    case KvType::int4_smooth: return Decode<KvType::int4>(u);  // int4 records; the caller smooths the queries
    case KvType::q8_0: return Decode<KvType::q8_0>(u);
    case KvType::q4_0: return Decode<KvType::q4_0>(u);
    case KvType::fp8_e5m2: return Decode<KvType::fp8_e5m2>(u);
    case KvType::int4_kivi: return Decode<KvType::int4_kivi>(u);  // a group's keys: steps in q, score_bias
    case KvType::int2_kivi: return Decode<KvType::int2_kivi>(u);
  }
}

void KiviQueriesImpl(KvType type, const uint8_t* const* group, int64_t hb, int64_t hd, int64_t g0, int64_t g1, int64_t G,
                     const float* q, float* qg, float* bias) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), per = hd / kKiviGroup;
  HWY_ALIGN float st[256], off[256];  // head_dim is at most 256 (decode_attention checks it)
  for (int64_t g = g0; g < g1; ++g) {
    // Channel j per + k's (s, m) is pair k of the group's record j.
    for (int64_t j = 0; j < kKiviGroup; ++j) KiviPairs(type, group[j] + g * hb, hd, st + j * per, off + j * per);
    for (int64_t h = g * G; h < (g + 1) * G; ++h) {
      const float* qh = q + h * hd;
      float* out = qg + h * hd;
      VF b = hn::Zero(df);
      int64_t c = 0;
      for (; c + N <= hd; c += N) {
        const VF qv = hn::LoadU(df, qh + c);
        hn::StoreU(hn::Mul(qv, hn::Load(df, st + c)), df, out + c);
        b = hn::MulAdd(qv, hn::Load(df, off + c), b);
      }
      float bs = hn::GetLane(hn::SumOfLanes(df, b));
      for (; c < hd; ++c) {
        out[c] = qh[c] * st[c];
        bs += qh[c] * off[c];
      }
      bias[h] = bs;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::kvcache::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::kvcache::simd {

HWY_EXPORT(DecodeUnitImpl);
HWY_EXPORT(KiviQueriesImpl);

void decode_unit(const DecodeUnit& u) { HWY_DYNAMIC_DISPATCH(DecodeUnitImpl)(u); }

void kivi_queries(KvType type, const uint8_t* const* group, int64_t hb, int64_t head_dim, int64_t g0, int64_t g1,
                  int64_t group_heads, const float* q, float* qg, float* bias) {
  HWY_DYNAMIC_DISPATCH(KiviQueriesImpl)(type, group, hb, head_dim, g0, g1, group_heads, q, qg, bias);
}

}  // namespace memtrade::kvcache::simd
#endif
