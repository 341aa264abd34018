// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#include "common/simd/fixed_width.h"  // the register blocks below are arrays of vectors: no SVE / RVV
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "impls/quant/simd/matvec_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "impls/quant/simd/codes-inl.h"
#include "impls/quant/simd/matvec_simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::quant::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using namespace codes;  // DF, DI, DU, VF, VI: the vector types of the code decoders (codes-inl.h)

// nf4's 16 code values, for the lookups below.
struct Nf4Table {
  HWY_ALIGN float v[16];
  Nf4Table() {
    for (int i = 0; i < 16; ++i) v[i] = nf4_code(i);
  }
};

// nf4's 16 code values looked up by q (0..15), for any vector length: one table lookup per N entries.
HWY_INLINE VF nf4_lookup(VI q, const float* table) {
  const DF df;
  const DI di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  if (N >= 16) return hn::TableLookupLanes(hn::LoadU(df, table), hn::IndicesFromVec(df, q));
  if (N == 8) {  // both halves of the table, chosen by bit 3 of q (moved to the sign bit)
    const auto idx = hn::IndicesFromVec(df, hn::And(q, hn::Set(di, 7)));
    const VF lo = hn::TableLookupLanes(hn::LoadU(df, table), idx);
    const VF hi = hn::TableLookupLanes(hn::LoadU(df, table + 8), idx);
    return hn::IfNegativeThenElse(hn::BitCast(df, hn::ShiftLeft<28>(q)), hi, lo);
  }
  VF r = hn::Zero(df);
  for (int64_t c = 0; c < 16; c += N) {
    const VI local = hn::Sub(q, hn::Set(di, static_cast<int32_t>(c)));
    const auto in_chunk = hn::Lt(hn::BitCast(DU(), local), hn::Set(DU(), static_cast<uint32_t>(N)));
    const VI idx = hn::And(local, hn::Set(di, static_cast<int32_t>(N - 1)));
    const VF t = hn::TableLookupLanes(hn::LoadU(df, table + c), hn::IndicesFromVec(df, idx));
    r = hn::IfThenElse(hn::RebindMask(df, in_chunk), t, r);
  }
  return r;
}

// The offsets decode4 subtracts from a 4-bit integer group's codes: 2^23 + z (low nibbles) and 2^19 + z
// (high nibbles); exact, z being an integer 0..15.
HWY_INLINE VF zero_lo(float z) { return hn::Set(DF(), 0x1p23f + z); }
HWY_INLINE VF zero_hi(float z) { return hn::Set(DF(), 0x1p19f + z); }

// 4-bit codes: u of the even elements (low nibbles) and the odd ones (high nibbles) of 2 N elements.
// Integer codes without a shift or an int -> float conversion: a low nibble ORed into the mantissa of 2^23
// reads as 2^23 + q, a high nibble left in bits 4..7 under the exponent of 2^19 (where those bits weigh
// 1) as 2^19 + q, and one exact subtraction of zlo / zhi leaves q - z.
template <Format F>
HWY_INLINE void decode4(const uint8_t* p, VF zlo, VF zhi, const float* table, VF& even, VF& odd) {
  const DF df;
  const DI di;
  const VI b = load_bytes_i32(p);
  if constexpr (F == Format::nf4) {
    even = nf4_lookup(hn::And(b, hn::Set(di, 0x0F)), table);
    odd = nf4_lookup(hn::ShiftRight<4>(b), table);
  } else {
    even = hn::Sub(hn::BitCast(df, hn::OrAnd(hn::Set(di, 0x4B000000), b, hn::Set(di, 0x0F))), zlo);
    odd = hn::Sub(hn::BitCast(df, hn::OrAnd(hn::Set(di, 0x49000000), b, hn::Set(di, 0xF0))), zhi);
  }
}

// stored_params with the format known at compile time and fp16 scales converted by the target (F16C where
// present): the same values, without the format switch and the software conversion in the kernels' per-group
// loops (nf4-dq's absmax and fp8's scale through stored_params).
template <Format F>
HWY_INLINE GroupParams group_params(const QLayout& L, const uint8_t* blob, int64_t r, int64_t g) {
  if constexpr (F == Format::int8) return GroupParams{scale_f16(blob + L.scales.offset + 2 * r), 0.f};
  if constexpr (F == Format::int4 || F == Format::int4_asym) {
    const uint8_t* zeros = blob + L.zeros.offset + r * L.zero_row_bytes;
    return GroupParams{scale_f16(blob + L.scales.offset + 2 * (r * L.groups_per_row + g)),
                       F == Format::int4 ? 8.f : static_cast<float>(nibble(zeros, g))};
  }
  if constexpr (F == Format::nf4)
    if (!L.spec.double_quant) return GroupParams{load_bytes<float>(blob + L.scales.offset + 4 * (r * L.groups_per_row + g)), 0.f};
  return stored_params(L, blob, r, g);
}

template <Format F>
HWY_INLINE float unscaled(const uint8_t* row, int64_t k, float zero) {
  return decode_value(F, four_bit(F) ? nibble(row, k) : row[k], 1.f, zero);
}

// nf4 by byte planes, a decode without lane-crossing lookups (on AVX2 the 16-entry table takes two vpermps
// and a blend per vector): the 2 V code bytes at p give 4 V elements in f0 .. f3. The low nibbles fill the
// lower half of an index vector, the high nibbles the upper half; four in-block byte lookups, one per byte
// of the code values' float bits, and two rounds of in-block interleaves assemble the floats. Lane l of f[i]
// (f0 .. f3) is index byte 16 (l / 4) + 4 i + l % 4 (plane_element gives its element).
struct Nf4Planes {
  HWY_ALIGN uint8_t b[4][64];  // byte j of nf4_code(i) at [j][16 c + i], the 16 bytes repeated per 128-bit block
  Nf4Planes() {
    for (int i = 0; i < 16; ++i) {
      const uint32_t bits = detail::float_as_bits(nf4_code(i));
      for (int j = 0; j < 4; ++j)
        for (int c = 0; c < 4; ++c) b[j][16 * c + i] = static_cast<uint8_t>(bits >> (8 * j));
    }
  }
};
constexpr bool kNf4Planes = HWY_TARGET != HWY_SCALAR;

HWY_INLINE int64_t plane_element(int64_t V, int64_t i, int64_t l) {
  const int64_t p = 16 * (l / 4) + 4 * i + l % 4;
  return p < 2 * V ? 2 * p : 2 * (p - 2 * V) + 1;
}

#if HWY_TARGET != HWY_SCALAR
HWY_INLINE void nf4_planes(const uint8_t* p, const Nf4Planes& t, VF& f0, VF& f1, VF& f2, VF& f3) {
  const DF df;
  const hn::Repartition<uint8_t, DF> d8;
  const hn::Half<decltype(d8)> dh;
  const hn::Repartition<uint16_t, DF> d16;
  const auto c = hn::LoadU(dh, p);
  const auto idx = hn::Combine(d8, hn::ShiftRight<4>(c), hn::And(c, hn::Set(dh, uint8_t{0x0F})));
  const auto b0 = hn::TableLookupBytes(hn::Load(d8, t.b[0]), idx), b1 = hn::TableLookupBytes(hn::Load(d8, t.b[1]), idx);
  const auto b2 = hn::TableLookupBytes(hn::Load(d8, t.b[2]), idx), b3 = hn::TableLookupBytes(hn::Load(d8, t.b[3]), idx);
  const auto lo01 = hn::BitCast(d16, hn::InterleaveLower(d8, b0, b1)), hi01 = hn::BitCast(d16, hn::InterleaveUpper(d8, b0, b1));
  const auto lo23 = hn::BitCast(d16, hn::InterleaveLower(d8, b2, b3)), hi23 = hn::BitCast(d16, hn::InterleaveUpper(d8, b2, b3));
  f0 = hn::BitCast(df, hn::InterleaveLower(d16, lo01, lo23));
  f1 = hn::BitCast(df, hn::InterleaveUpper(d16, lo01, lo23));
  f2 = hn::BitCast(df, hn::InterleaveLower(d16, hi01, hi23));
  f3 = hn::BitCast(df, hn::InterleaveUpper(d16, hi01, hi23));
}
#endif

// 4-bit formats whose groups are whole chunks (2 V columns; nf4 by planes: 4 V): x is copied once per tile of
// columns (per thread, on the stack) in the order in which the decode gives each chunk's elements (each
// chunk's even elements first and its odd ones after; nf4: plane_element's order), so that they meet their
// x values with plain loads.
constexpr int64_t kTile = 4096;

template <Format F>
constexpr bool kByPlanes = F == Format::nf4 && kNf4Planes;
template <Format F>
HWY_INLINE int64_t permuted_chunk() {
  return (kByPlanes<F> ? 4 : 2) * static_cast<int64_t>(hn::Lanes(DF()));
}

template <Format F>
void MatvecRowsPermuted(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  const DF df;
  const int64_t N = L.rows, K = L.cols, G = L.group, V = static_cast<int64_t>(hn::Lanes(df));
  // Columns in whole groups, and the last partial group's whole chunks too (SmolLM2's 576 columns in groups
  // of 128 end in a group of 64, an eighth of every row); what is left of a partial group goes element by
  // element.
  const int64_t C = permuted_chunk<F>(), Kt = K / G * G + (K % G) / C * C;
  const Nf4Table nf4;
  const float* table = nf4.v;
  static const Nf4Planes planes;  // built once, not at every call
  rows_per_thread(N, [&](int64_t r0, int64_t r1) {
    HWY_ALIGN float xp[kTile];
    for (int64_t r = r0; r < r1; ++r) y[r] = 0.f;
    for (int64_t c0 = 0; c0 < Kt && r0 < r1; c0 += kTile) {
      const int64_t c1 = std::min(Kt, c0 + kTile);
      for (int64_t c = c0; c < c1; c += C)
        for (int64_t j = 0; j < V; ++j) {
          if constexpr (kByPlanes<F>) {
            for (int64_t i = 0; i < 4; ++i) xp[c - c0 + i * V + j] = x[c + plane_element(V, i, j)];
          } else {
            xp[c - c0 + j] = x[c + 2 * j];
            xp[c - c0 + V + j] = x[c + 2 * j + 1];
          }
        }
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
        VF acc = hn::Zero(df);
        for (int64_t g = c0 / G; g * G < c1; ++g) {
          const int64_t ge = std::min((g + 1) * G, c1);  // the group's end (a partial last group: c1)
          const GroupParams p = group_params<F>(L, blob, r, g);
          const VF zl = zero_lo(p.zero), zh = zero_hi(p.zero);
          // Four accumulators: the fma latency, not the decode, bounds two dependency chains.
          VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
          int64_t k = g * G;
          for (; k + 4 * V <= ge; k += 4 * V) {
            if ((k & 127) == 0) hwy::Prefetch(row + k / 2 + kPrefetchBytes);
            VF ue, uo, ue2, uo2;
#if HWY_TARGET != HWY_SCALAR
            if constexpr (kByPlanes<F>)
              nf4_planes(row + k / 2, planes, ue, uo, ue2, uo2);
            else
#endif
            {
              decode4<F>(row + k / 2, zl, zh, table, ue, uo);
              decode4<F>(row + k / 2 + V, zl, zh, table, ue2, uo2);
            }
            a0 = hn::MulAdd(ue, hn::Load(df, xp + (k - c0)), a0);
            a1 = hn::MulAdd(uo, hn::Load(df, xp + (k - c0) + V), a1);
            a2 = hn::MulAdd(ue2, hn::Load(df, xp + (k - c0) + 2 * V), a2);
            a3 = hn::MulAdd(uo2, hn::Load(df, xp + (k - c0) + 3 * V), a3);
          }
          for (; k < ge; k += 2 * V) {  // the chunk of 2 V columns left (not by planes: their chunks are 4 V)
            VF ue, uo;
            decode4<F>(row + k / 2, zl, zh, table, ue, uo);
            a0 = hn::MulAdd(ue, hn::Load(df, xp + (k - c0)), a0);
            a1 = hn::MulAdd(uo, hn::Load(df, xp + (k - c0) + V), a1);
          }
          acc = hn::MulAdd(hn::Set(df, p.scale), hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), acc);
        }
        y[r] += hn::GetLane(hn::SumOfLanes(df, acc));
      }
    }
    for (int64_t r = r0; r < r1 && Kt < K; ++r) {  // the rest of the last, partial group
      const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
      const GroupParams p = stored_params(L, blob, r, (K - 1) / G);
      float tail = 0.f;
      for (int64_t k = Kt; k < K; ++k) tail += unscaled<F>(row, k, p.zero) * x[k];
      y[r] += p.scale * tail;
    }
  });
}

template <Format F>
void MatvecRowsT(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  if constexpr (four_bit(F)) {
    if (L.group % permuted_chunk<F>() == 0 && kTile % L.group == 0 && L.cols >= L.group) return MatvecRowsPermuted<F>(L, blob, x, y);
  }
  const DF df;
  const int64_t N = L.rows, K = L.cols, G = L.group, V = static_cast<int64_t>(hn::Lanes(df));
  const Nf4Table nf4;
  const float* table = nf4.v;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    VF acc = hn::Zero(df);
    float acc_s = 0.f;
    for (int64_t g = 0; g < L.groups_per_row; ++g) {
      const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
      const GroupParams p = group_params<F>(L, blob, r, g);
      float tail = 0.f;
      int64_t k = k0;
      VF a0 = hn::Zero(df), a1 = hn::Zero(df);
      if constexpr (four_bit(F)) {
        if ((k & 1) && k < k1) {  // odd start (odd group size): one element to reach a byte
          tail += unscaled<F>(row, k, p.zero) * x[k];
          ++k;
        }
        const VF zl = zero_lo(p.zero), zh = zero_hi(p.zero);
        for (; k + 2 * V <= k1; k += 2 * V) {
          VF ue, uo, xe, xo;
          decode4<F>(row + k / 2, zl, zh, table, ue, uo);
          hn::LoadInterleaved2(df, x + k, xe, xo);
          a0 = hn::MulAdd(ue, xe, a0);
          a1 = hn::MulAdd(uo, xo, a1);
        }
      } else {
        VF a2 = hn::Zero(df), a3 = hn::Zero(df);
        for (; k + 4 * V <= k1; k += 4 * V) {
          if ((k & 63) < 4 * V) hwy::Prefetch(row + k + kPrefetchBytes);
          a0 = hn::MulAdd(decode8<F>(row + k), hn::LoadU(df, x + k), a0);
          a1 = hn::MulAdd(decode8<F>(row + k + V), hn::LoadU(df, x + k + V), a1);
          a2 = hn::MulAdd(decode8<F>(row + k + 2 * V), hn::LoadU(df, x + k + 2 * V), a2);
          a3 = hn::MulAdd(decode8<F>(row + k + 3 * V), hn::LoadU(df, x + k + 3 * V), a3);
        }
        for (; k + V <= k1; k += V) a0 = hn::MulAdd(decode8<F>(row + k), hn::LoadU(df, x + k), a0);
        a0 = hn::Add(a0, a2);
        a1 = hn::Add(a1, a3);
      }
      acc = hn::MulAdd(hn::Set(df, p.scale), hn::Add(a0, a1), acc);
      for (; k < k1; ++k) tail += unscaled<F>(row, k, p.zero) * x[k];
      acc_s += p.scale * tail;
    }
    y[r] = hn::GetLane(hn::SumOfLanes(df, acc)) + acc_s;
  }
}

// Columns [k0, k1) of row r of deq(W) into o[0 .. k1 - k0).
template <Format F>
HWY_INLINE void DequantRow(const QLayout& L, const uint8_t* blob, int64_t r, int64_t k0, int64_t k1, const float* table,
                           float* o) {
  const DF df;
  const int64_t G = L.group, V = static_cast<int64_t>(hn::Lanes(df));
  const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
  o -= k0;
  for (int64_t g = k0 / G; g * G < k1; ++g) {
    const GroupParams p = group_params<F>(L, blob, r, g);
    const int64_t e1 = std::min(k1, (g + 1) * G);
    int64_t k = std::max(k0, g * G);
    const VF s = hn::Set(df, p.scale);
    if constexpr (four_bit(F)) {
      if ((k & 1) && k < e1) {
        o[k] = p.scale * unscaled<F>(row, k, p.zero);
        ++k;
      }
      for (; k + 2 * V <= e1; k += 2 * V) {
        VF ue, uo;
        decode4<F>(row + k / 2, zero_lo(p.zero), zero_hi(p.zero), table, ue, uo);
        // fp8 / nf4: decode(q) * scale, int: scale * (q - z); both products are commutative roundings
        hn::StoreInterleaved2(hn::Mul(s, ue), hn::Mul(s, uo), df, o + k);
      }
    } else {
      for (; k + V <= e1; k += V) hn::StoreU(hn::Mul(s, decode8<F>(row + k)), df, o + k);
    }
    for (; k < e1; ++k) o[k] = p.scale * unscaled<F>(row, k, p.zero);
  }
}

template <Format F>
void DequantRowsT(const QLayout& L, const uint8_t* blob, int64_t r0, int64_t nr, float* out) {
  const Nf4Table nf4;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t i = 0; i < nr; ++i) DequantRow<F>(L, blob, r0 + i, 0, L.cols, nf4.v, out + i * L.cols);
}

// The small-batch matmul's blocking: kSmallRows weight rows times kSmallMBlock activation rows of
// accumulators in registers (16 of AVX-512's 32, 8 of AVX2's 16), over tiles of kSmallTile columns
// (matvec_simd.hpp): a tile's decoded weight rows stay in L1, and each activation vector, loaded once per
// step, meets every weight row of the block.
constexpr int kSmallMBlock = HWY_TARGET <= HWY_AVX3 ? 4 : 2;

// A thread's scratch: the tile of decoded rows, then the partial sums by lanes (64-byte multiples on every
// vector target).
HWY_INLINE std::size_t SmallScratchFloats(int64_t M) {
  return static_cast<std::size_t>(kSmallRows * kSmallTile + kSmallRows * M * static_cast<int64_t>(hn::Lanes(DF())));
}

// part[(j M + i) V ..] += sum over the tile of w_j x_i by lanes, for the kSmallRows decoded rows w (rows of
// kSmallTile floats) and MB activation rows Xb + i K, kt columns; the elements after the last whole vector
// go into lane 0.
template <int MB>
HWY_INLINE void SmallTile(const float* w, const float* Xb, int64_t K, int64_t kt, int64_t M, float* part) {
  const DF df;
  const int64_t V = static_cast<int64_t>(hn::Lanes(df));
  VF acc[kSmallRows][MB];
  for (int j = 0; j < kSmallRows; ++j)
    for (int i = 0; i < MB; ++i) acc[j][i] = hn::LoadU(df, part + (j * M + i) * V);
  int64_t k = 0;
  for (; k + V <= kt; k += V) {
    VF u[kSmallRows];
    for (int j = 0; j < kSmallRows; ++j) u[j] = hn::LoadU(df, w + j * kSmallTile + k);
    for (int i = 0; i < MB; ++i) {
      const VF xv = hn::LoadU(df, Xb + i * K + k);
      for (int j = 0; j < kSmallRows; ++j) acc[j][i] = hn::MulAdd(u[j], xv, acc[j][i]);
    }
  }
  for (int j = 0; j < kSmallRows; ++j)
    for (int i = 0; i < MB; ++i) hn::StoreU(acc[j][i], df, part + (j * M + i) * V);
  for (; k < kt; ++k)
    for (int j = 0; j < kSmallRows; ++j)
      for (int i = 0; i < MB; ++i) part[(j * M + i) * V] += w[j * kSmallTile + k] * Xb[i * K + k];
}

// Y [M x N] = X [M x K] deq(W)^T for a few activation rows: blocks of kSmallRows weight rows, tile by tile
// of columns, decoded once into a per-thread scratch (SmallScratchFloats) and multiplied with every row of X
// there, so the codes are read once and no panel goes through memory or a GEMM's packing.
template <Format F>
void MatmulSmallT(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* ws, int64_t ws_floats) {
  const DF df;
  const int64_t N = L.rows, K = L.cols, V = static_cast<int64_t>(hn::Lanes(df));
  const Nf4Table nf4;
  const auto scratch = static_cast<int64_t>(SmallScratchFloats(M));
  // The scratches start at a 64-byte boundary: a vector load that splits a cache line costs about two.
  const int64_t skip = static_cast<int64_t>((64 - reinterpret_cast<std::uintptr_t>(ws) % 64) % 64 / sizeof(float));
  ws += skip;
  const int64_t slots = std::max<int64_t>(1, (ws_floats - skip) / scratch);  // the caller gives at least one
#if defined(_OPENMP)
  const int threads = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), slots));
#pragma omp parallel num_threads(threads)
#endif
  {
#if defined(_OPENMP)
    float* w = ws + static_cast<int64_t>(omp_get_thread_num()) * scratch;
#else
    float* w = ws;
#endif
    float* part = w + kSmallRows * kSmallTile;
#if defined(_OPENMP)
#pragma omp for schedule(static)
#endif
    for (int64_t rb = 0; rb < N; rb += kSmallRows) {
      const int64_t nr = std::min<int64_t>(kSmallRows, N - rb);
      std::fill(part, part + kSmallRows * M * V, 0.f);
      for (int64_t k0 = 0; k0 < K; k0 += kSmallTile) {
        const int64_t kt = std::min(kSmallTile, K - k0);
        for (int64_t j = 0; j < kSmallRows; ++j)  // rows past the last: the last again (computed, not stored)
          DequantRow<F>(L, blob, rb + std::min(j, nr - 1), k0, k0 + kt, nf4.v, w + j * kSmallTile);
        for (int64_t m0 = 0; m0 < M; m0 += kSmallMBlock) {
          const float* Xb = X + m0 * K + k0;
          switch (std::min<int64_t>(kSmallMBlock, M - m0)) {
            case 1: SmallTile<1>(w, Xb, K, kt, M, part + m0 * V); break;
            case 2: SmallTile<2>(w, Xb, K, kt, M, part + m0 * V); break;
            case 3: SmallTile<3>(w, Xb, K, kt, M, part + m0 * V); break;
            default: SmallTile<kSmallMBlock>(w, Xb, K, kt, M, part + m0 * V); break;
          }
        }
      }
      for (int64_t j = 0; j < nr; ++j)
        for (int64_t i = 0; i < M; ++i) Y[i * N + rb + j] = hn::GetLane(hn::SumOfLanes(df, hn::LoadU(df, part + (j * M + i) * V)));
    }
  }
}

void MatvecRows(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  with_format(L.spec.format, [&]<Format F>() { MatvecRowsT<F>(L, blob, x, y); });
}

void DequantRows(const QLayout& L, const uint8_t* blob, int64_t r0, int64_t nr, float* out) {
  with_format(L.spec.format, [&]<Format F>() { DequantRowsT<F>(L, blob, r0, nr, out); });
}

void MatmulSmall(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* ws, int64_t ws_floats) {
  with_format(L.spec.format, [&]<Format F>() { MatmulSmallT<F>(L, blob, X, M, Y, ws, ws_floats); });
}

int64_t MatmulSmallScratch(int64_t M) { return static_cast<int64_t>(SmallScratchFloats(M)); }

// A dense weight row's elements as fp32, a vector (bf16 widened exactly) or one at a time.
HWY_INLINE VF LoadRow(const float* w) { return hn::LoadU(DF(), w); }
HWY_INLINE VF LoadRow(const bf16_t* w) {  // exact: the 16 bits moved to the top of the word
  const auto h = hn::LoadU(hn::Rebind<uint16_t, DF>(), reinterpret_cast<const uint16_t*>(w));
  return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), h)));
}
HWY_INLINE float ElemF32(float w) { return w; }
HWY_INLINE float ElemF32(bf16_t w) { return to_float(w); }

// Dense rows: W row as fp32 (LoadRow) times x, four accumulators.
template <class TW>
void dense_rows(const TW* W, const float* x, float* y, int64_t N, int64_t K) {
  const DF df;
  const int64_t V = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kBytes = sizeof(TW);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    int64_t k = 0;
    const TW* row = W + r * K;
    for (; k + 4 * V <= K; k += 4 * V) {
      for (int64_t b = 0; b < 4 * V * kBytes; b += 64)
        hwy::Prefetch(reinterpret_cast<const uint8_t*>(row + k) + b + kDensePrefetchBytes);
      a0 = hn::MulAdd(LoadRow(row + k), hn::LoadU(df, x + k), a0);
      a1 = hn::MulAdd(LoadRow(row + k + V), hn::LoadU(df, x + k + V), a1);
      a2 = hn::MulAdd(LoadRow(row + k + 2 * V), hn::LoadU(df, x + k + 2 * V), a2);
      a3 = hn::MulAdd(LoadRow(row + k + 3 * V), hn::LoadU(df, x + k + 3 * V), a3);
    }
    for (; k + V <= K; k += V) a0 = hn::MulAdd(LoadRow(row + k), hn::LoadU(df, x + k), a0);
    float acc = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
    for (; k < K; ++k) acc += ElemF32(row[k]) * x[k];
    y[r] = acc;
  }
}

void DenseF32(const float* W, const float* x, float* y, int64_t N, int64_t K) { dense_rows(W, x, y, N, K); }
void DenseBF16(const bf16_t* W, const float* x, float* y, int64_t N, int64_t K) { dense_rows(W, x, y, N, K); }

// Dense small batch: R rows of W (fp32 or bf16, from r) against MB rows of X (from m), Y[m][r] =
// sum_k W[r][k] X[m][k] (+ Y where accumulate). Each W vector loaded (and widened) once feeds MB
// multiply-adds and each X vector R of them: R x MB accumulators and R + 1 more registers (kDenseRows below).
template <int R, int MB, class TW>
HWY_INLINE void dense_block(const TW* W, const float* X, float* Y, int64_t r, int64_t m, int64_t N, int64_t K,
                            bool accumulate, bool prefetch) {
  const DF df;
  const int64_t V = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kLine = 64 / sizeof(TW);  // elements per cache line
  VF acc[R][MB];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) acc[i][j] = hn::Zero(df);
  int64_t k = 0;
  for (; k + V <= K; k += V) {
    VF w[R];
    for (int i = 0; i < R; ++i) {
      if (prefetch && k % kLine < V) hwy::Prefetch(W + (r + i) * K + k + kDensePrefetchBytes / sizeof(TW));
      w[i] = LoadRow(W + (r + i) * K + k);
    }
    for (int j = 0; j < MB; ++j) {
      const VF x = hn::LoadU(df, X + (m + j) * K + k);
      for (int i = 0; i < R; ++i) acc[i][j] = hn::MulAdd(w[i], x, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < MB; ++j) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[i][j]));
      for (int64_t e = k; e < K; ++e) s += ElemF32(W[(r + i) * K + e]) * X[(m + j) * K + e];
      float& y = Y[(m + j) * N + r + i];
      y = accumulate ? y + s : s;
    }
}

template <int R, class TW>
HWY_INLINE void dense_rows_small(const TW* W, const float* X, float* Y, int64_t r, int64_t M, int64_t N, int64_t K,
                                 bool accumulate) {
  int64_t m = 0;
  // The first group streams the rows from memory (prefetched); later groups find them in L1 / L2.
  for (; m + 4 <= M; m += 4) dense_block<R, 4>(W, X, Y, r, m, N, K, accumulate, m == 0);
  switch (M - m) {
    case 3: dense_block<R, 3>(W, X, Y, r, m, N, K, accumulate, m == 0); break;
    case 2: dense_block<R, 2>(W, X, Y, r, m, N, K, accumulate, m == 0); break;
    case 1: dense_block<R, 1>(W, X, Y, r, m, N, K, accumulate, m == 0); break;
    default: break;
  }
}

// W rows per register block: 4 x 4 accumulators + 4 W + 1 X of AVX-512's 32 registers, 2 x 4 + 2 + 1 of the
// 16 of AVX2 and SSE4.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kDenseRows = 4;
#else
constexpr int kDenseRows = 2;
#endif

template <class TW>
void dense_small(const TW* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  constexpr int R = kDenseRows;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N / R * R; r += R) dense_rows_small<R>(W, X, Y, r, M, N, K, accumulate);
  for (int64_t r = N / R * R; r < N; ++r) dense_rows_small<1>(W, X, Y, r, M, N, K, accumulate);
}

void DenseSmallF32(const float* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  dense_small(W, X, M, Y, N, K, accumulate);
}
void DenseSmallBF16(const bf16_t* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  dense_small(W, X, M, Y, N, K, accumulate);
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::quant::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::quant::simd {

HWY_EXPORT(MatvecRows);
HWY_EXPORT(DequantRows);
HWY_EXPORT(MatmulSmall);
HWY_EXPORT(MatmulSmallScratch);
HWY_EXPORT(DenseF32);
HWY_EXPORT(DenseBF16);
HWY_EXPORT(DenseSmallF32);
HWY_EXPORT(DenseSmallBF16);

void matvec(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  HWY_DYNAMIC_DISPATCH(MatvecRows)(L, blob, x, y);
}
void dequant_rows(const QLayout& L, const uint8_t* blob, int64_t r0, int64_t nr, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantRows)(L, blob, r0, nr, out);
}
void matmul_small(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* ws, int64_t ws_floats) {
  HWY_DYNAMIC_DISPATCH(MatmulSmall)(L, blob, X, M, Y, ws, ws_floats);
}
int64_t matmul_small_scratch_floats(int64_t M) { return HWY_DYNAMIC_DISPATCH(MatmulSmallScratch)(M); }
void matvec_dense_f32(const float* W, const float* x, float* y, int64_t N, int64_t K) {
  HWY_DYNAMIC_DISPATCH(DenseF32)(W, x, y, N, K);
}
void matvec_dense_bf16(const bf16_t* W, const float* x, float* y, int64_t N, int64_t K) {
  HWY_DYNAMIC_DISPATCH(DenseBF16)(W, x, y, N, K);
}
void matmul_dense_f32(const float* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(DenseSmallF32)(W, X, M, Y, N, K, accumulate);
}
void matmul_dense_bf16(const bf16_t* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  HWY_DYNAMIC_DISPATCH(DenseSmallBF16)(W, X, M, Y, N, K, accumulate);
}

}  // namespace memtrade::quant::simd
#endif
