// Host quantized matvec / matmul: reference, optimized (portable SIMD kernels from simd/, and a
// hand-written AVX-512 path for 4-bit formats in 128-column blocks), dense baselines.
#include "impls/quant/matvec.hpp"

#include "common/simd/targets.hpp"
#include "impls/quant/simd/matvec_simd.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 reports the intrinsics headers' deliberately undefined pass-through operands (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define MT_QUANT_AVX512 1
#endif

namespace memtrade::quant {

namespace {

template <Format F>
constexpr bool four_bit_v = four_bit(F);

uint8_t code_at(Format f, const uint8_t* row, int64_t k) { return four_bit(f) ? nibble(row, k) : row[k]; }

void check_blob(const QLayout& L, const void* blob, const char* who) {
  if (L.rows <= 0 || L.cols <= 0) throw Error(std::string(who) + ": empty layout");
  if (!blob) throw Error(std::string(who) + ": null blob");
}

}  // namespace

// ------------------------------------------------------------------------------------- reference

void matvec_reference(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  matmul_reference(L, blob, x, 1, y);
}

void matmul_reference(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y) {
  check_blob(L, blob, "matmul_reference");
  if (M <= 0) throw Error("matmul_reference: M must be > 0");
  const Format f = L.spec.format;
  const int64_t N = L.rows, K = L.cols, G = L.group;
  std::vector<float> w(static_cast<std::size_t>(K));  // one dequantized row (the reference may allocate)
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    for (int64_t g = 0; g < L.groups_per_row; ++g) {
      const GroupParams p = stored_params(L, blob, r, g);
      for (int64_t k = g * G; k < std::min(K, (g + 1) * G); ++k) w[k] = decode_value(f, code_at(f, row, k), p.scale, p.zero);
    }
    for (int64_t m = 0; m < M; ++m) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(w[k]) * static_cast<double>(X[m * K + k]);
      Y[m * N + r] = static_cast<float>(acc);
    }
  }
}

// ------------------------------------------------------------------------------------- optimized
//
// Each group's codes are decoded to their unscaled values u (int: q - z, exact; fp8: decode(q); nf4:
// code[q]) so that the dequantized weight is scale * u. matvec accumulates sum_k u_k x_k in fp32 (fma,
// u_k x_k exact inside it) and adds scale * sum to the row's result; the panel dequantization stores
// scale * u_k, which is bit for bit what dequantize() gives.

namespace {

#if defined(MT_QUANT_AVX512)

// 16 unscaled values of a 4-bit format from element k (k even): 8 bytes read once.
template <Format F>
inline __m512 dec16(const uint8_t* row, int64_t k, __m512 zero, __m512 nf4_table) {
  static_assert(four_bit(F), "dec16 decodes the 4-bit formats (the others run the portable kernels)");
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (k >> 1)));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, m);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  const __m512i q = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));  // elements k .. k+15 in order
  if constexpr (F == Format::nf4)
    return _mm512_permutexvar_ps(q, nf4_table);
  else
    return _mm512_sub_ps(_mm512_cvtepi32_ps(q), zero);
}

inline __m512 nf4_table_vec() {
  alignas(64) float t[16];
  for (int i = 0; i < 16; ++i) t[i] = nf4_code(i);
  return _mm512_load_ps(t);
}

template <Format F>
inline float unscaled(const uint8_t* row, int64_t k, float zero) {
  return decode_value(F, four_bit(F) ? nibble(row, k) : row[k], 1.f, zero);
}

using Table = __m512;
inline Table make_table() { return nf4_table_vec(); }

// One group [k0, k1) of one row: adds scale * sum_k u_k x_k to the row's accumulators (the vector lanes
// in acc_v, scalar head / tail elements in acc_s). The blocked kernel's columns past its last block.
template <Format F>
inline void group_dot(const uint8_t* row, int64_t k0, int64_t k1, const float* x, const GroupParams& p, Table tab,
                      void* acc_v, float& acc_s) {
  float tail = 0.f;
  int64_t k = k0;
  if ((k & 1) && k < k1) {  // odd start (odd group size): one element to reach a byte
    tail += unscaled<F>(row, k, p.zero) * x[k];
    ++k;
  }
  const __m512 z = _mm512_set1_ps(p.zero);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  for (; k + 32 <= k1; k += 32) {
    a0 = _mm512_fmadd_ps(dec16<F>(row, k, z, tab), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(dec16<F>(row, k + 16, z, tab), _mm512_loadu_ps(x + k + 16), a1);
  }
  if (k + 16 <= k1) {
    a0 = _mm512_fmadd_ps(dec16<F>(row, k, z, tab), _mm512_loadu_ps(x + k), a0);
    k += 16;
  }
  __m512* av = static_cast<__m512*>(acc_v);
  *av = _mm512_fmadd_ps(_mm512_set1_ps(p.scale), _mm512_add_ps(a0, a1), *av);
  for (; k < k1; ++k) tail += unscaled<F>(row, k, p.zero) * x[k];
  acc_s += p.scale * tail;
}

// ---- 4-bit fast path: 128-element blocks, 64 code bytes per load.
//
// A block's 64 bytes as 16 dwords: nibble j (bits 4j .. 4j+3) of dword i is element 8i + j of the block.
// Step j decodes nibble j of every dword into 16 lanes and multiplies by the matching x values, which a
// per-thread copy of x holds in that order (xp[128 b + 16 j + i] = x[128 b + 8 i + j], permuted once
// per call per tile of kTile elements, on the stack). Decoding, exact in every case:
//   table: vpermps looks each lane's value up with the low 4 bits of its dword (one shift and one permute
//     per 16 codes): nf4 the codes, int4 q - 8, int4_asym with one group per block q - z;
//   int4_asym with several groups per block (zero points differing between lanes): the nibble at bits 4j'
//     (j' = j mod 4; the top four read from the dwords shifted right by 16) OR-ed under the exponent of
//     2^(23 - 4j') is the float 2^(23 - 4j') + q; minus the per-lane 2^(23 - 4j') + z it is q - z (one
//     ternary-logic op and one subtraction per 16 codes).
// Nothing is folded: the products (q - z) x are formed and summed as in the generic path.
// Each lane's partial sum of a group is scaled by the group's scale (per-lane scales when a block holds
// several groups), as the generic path does; then the lanes are summed. Blocks need the group size to be
// a multiple of 128 or one of 8, 16, 32, 64; the columns past the last full block use group_dot.
constexpr int64_t kTile = 4096;  // x elements per permuted tile (16 KiB of stack per thread)
using simd::kPrefetchBytes;

inline bool blocked_ok(Format f, int64_t G, int64_t K) {
  return four_bit(f) && K >= 128 && (G % 128 == 0 || (G % 8 == 0 && 128 % G == 0));
}

// Decoder of one block. UseTable: vpermps of the nibbles into `tab` (nf4: the codes; int4: q - 8;
// int4_asym with one group per block: q - z). !UseTable (int4_asym with several groups per block, whose
// zero points differ between lanes): the exponent trick with per-lane 2^(23 - 4j') + z.
template <Format F, bool UseTable>
struct BlockDecoder {
  __m512 tab;
  __m512 zc[4];
  __m512i mbits[4], mask[4];
  BlockDecoder() {
    if constexpr (UseTable) {
      if constexpr (F == Format::nf4)
        tab = nf4_table_vec();
      else
        set_zero(_mm512_set1_ps(8.f));
    } else {
      for (int j = 0; j < 4; ++j) {
        mbits[j] = _mm512_set1_epi32((127 + 23 - 4 * j) << 23);
        mask[j] = _mm512_set1_epi32(0xF << (4 * j));
      }
    }
  }
  // int formats: the zero point (one for all lanes with UseTable, else per lane)
  void set_zero(__m512 z) {
    if constexpr (UseTable) {
      const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      tab = _mm512_sub_ps(iota, z);  // small integers: exact
    } else {
      for (int j = 0; j < 4; ++j) zc[j] = _mm512_add_ps(_mm512_castsi512_ps(mbits[j]), z);
    }
  }
  // Adds the block's 128 products to ae / ao.
  inline void block(const uint8_t* codes, const float* xb, __m512& ae, __m512& ao) const {
    // a software prefetch 4 KiB down the code stream (the rows are contiguous): one core's hardware
    // prefetch alone keeps too few lines in flight to stream from DRAM (prefetches never fault)
    _mm_prefetch(reinterpret_cast<const char*>(codes + kPrefetchBytes), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(codes);
    if constexpr (UseTable) {
      ae = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, tab), _mm512_load_ps(xb), ae);
#define MT_TAB_STEP(J, A) \
  A = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * J), tab), _mm512_load_ps(xb + 16 * J), A)
      MT_TAB_STEP(1, ao);
      MT_TAB_STEP(2, ae);
      MT_TAB_STEP(3, ao);
      MT_TAB_STEP(4, ae);
      MT_TAB_STEP(5, ao);
      MT_TAB_STEP(6, ae);
      MT_TAB_STEP(7, ao);
#undef MT_TAB_STEP
    } else {
      const __m512i h = _mm512_srli_epi32(v, 16);
#define MT_EXP_STEP(SRC, J, A)                                                                                 \
  A = _mm512_fmadd_ps(                                                                                         \
      _mm512_sub_ps(_mm512_castsi512_ps(_mm512_ternarylogic_epi32(SRC, mask[J & 3], mbits[J & 3], 0xEA)), \
                    zc[J & 3]),                                                                                \
      _mm512_load_ps(xb + 16 * J), A)
      MT_EXP_STEP(v, 0, ae);
      MT_EXP_STEP(v, 1, ao);
      MT_EXP_STEP(v, 2, ae);
      MT_EXP_STEP(v, 3, ao);
      MT_EXP_STEP(h, 4, ae);
      MT_EXP_STEP(h, 5, ao);
      MT_EXP_STEP(h, 6, ae);
      MT_EXP_STEP(h, 7, ao);
#undef MT_EXP_STEP
    }
  }
};

// Parameters of group g of row r (stored_params, with the fp16 scale converted by F16C: the same value).
template <Format F>
inline GroupParams group_params(const QLayout& L, const uint8_t* blob, int64_t r, int64_t g) {
  if constexpr (F == Format::nf4) {
    return stored_params(L, blob, r, g);
  } else {
    const int64_t i = r * L.groups_per_row + g;
    GroupParams p;
    p.scale = _cvtsh_ss(load_bytes<uint16_t>(blob + L.scales.offset + 2 * i));
    p.zero = F == Format::int4 ? 8.f : static_cast<float>(nibble(blob + L.zeros.offset + r * L.zero_row_bytes, g));
    return p;
  }
}

// Scales (and int4_asym zero points) of up to 16 consecutive groups g0 .. g0 + cnt - 1 of row r as
// floats, zeros in the lanes past cnt: vector versions of stored_params, the same values bit for bit.
template <Format F>
inline __m512 scales16(const QLayout& L, const uint8_t* blob, int64_t r, int64_t g0, int64_t cnt) {
  const int64_t i0 = r * L.groups_per_row + g0;
  const __mmask16 m = static_cast<__mmask16>((1u << cnt) - 1);
  if constexpr (F == Format::nf4) {
    if (L.spec.double_quant) {
      const __m128i q8 = _mm_maskz_loadu_epi8(m, blob + L.scales.offset + i0);
      const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q8));
      const int64_t ba = i0 / nf4_dq_block, bb = (i0 + cnt - 1) / nf4_dq_block;
      __m512 s8 = _mm512_set1_ps(load_bytes<float>(blob + L.dq_scales.offset + 4 * ba));
      if (bb != ba) {  // lanes from the next double-quantization block on
        const int64_t first = bb * nf4_dq_block - i0;
        s8 = _mm512_mask_mov_ps(s8, static_cast<__mmask16>(0xFFFFu << first),
                                _mm512_set1_ps(load_bytes<float>(blob + L.dq_scales.offset + 4 * bb)));
      }
      // max(q8 * s8 + mean, 0), two roundings (an explicitly rounded product: never contracted to an fma)
      const __m512 t = _mm512_mul_round_ps(q, s8, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 a = _mm512_add_ps(t, _mm512_set1_ps(load_bytes<float>(blob + L.dq_mean.offset)));
      return _mm512_maskz_max_ps(m, a, _mm512_setzero_ps());
    }
    return _mm512_maskz_loadu_ps(m, blob + L.scales.offset + 4 * i0);
  } else {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, blob + L.scales.offset + 2 * i0));
  }
}

// g0 even (the zero points start on a byte)
inline __m512 zeros16(const QLayout& L, const uint8_t* blob, int64_t r, int64_t g0, int64_t cnt) {
  const __mmask16 m = static_cast<__mmask16>((1u << ((cnt + 1) / 2)) - 1);
  const __m128i b = _mm_maskz_loadu_epi8(m, blob + L.zeros.offset + r * L.zero_row_bytes + g0 / 2);
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m128i z = _mm_unpacklo_epi8(_mm_and_si128(b, nib), _mm_and_si128(_mm_srli_epi16(b, 4), nib));
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(z));
}

// Rows [r0, r1) over the columns [c0, c1) (multiples of 128) with xp the permuted x[c0 : c1); the last
// tile also adds the columns past Kb. y[r] gets the tile's sum (first tile) or accumulates it.
template <Format F, bool UseTable>
void rows_tile(const QLayout& L, const uint8_t* blob, const float* x, float* y, const float* xp, int64_t r0,
               int64_t r1, int64_t c0, int64_t c1, int64_t Kb, const BlockDecoder<F, UseTable>& dec0, Table tab) {
  const int64_t K = L.cols, G = L.group;
  BlockDecoder<F, UseTable> dec = dec0;
  const bool small_groups = G < 128;
  const int64_t n = small_groups ? 128 / G : 1;
  __m512i lane_group = _mm512_setzero_si512();
  if (small_groups) {
    alignas(64) int32_t lg[16];
    for (int i = 0; i < 16; ++i) lg[i] = static_cast<int32_t>(8 * i / G);
    lane_group = _mm512_load_si512(lg);
  }
  // small groups: per-tile group parameters (kTile / 8 at most, rounded up to vectors, + one vector of
  // slack for the block loads past the end)
  alignas(64) float sbuf[kTile / 8 + 16], zbuf[F == Format::int4_asym ? kTile / 8 + 16 : 1];
  if (small_groups) {
    const int64_t ng = (c1 - c0) / G, end = (ng + 15) / 16 * 16;
    for (int64_t i = end; i < end + 16 && i < kTile / 8 + 16; ++i) {
      sbuf[i] = 0.f;
      if constexpr (F == Format::int4_asym) zbuf[i] = 0.f;
    }
  }
  const bool last = c1 == Kb;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    __m512 acc = _mm512_setzero_ps();
    if (small_groups) {
      // the tile's groups ga .. ga + ng - 1 (G divides 128): their parameters as floats first, then each
      // block spreads its n groups' over the lanes (lane i: group i / (G / 8) of the block)
      const int64_t ga = c0 / G, ng = (c1 - c0) / G;
      for (int64_t i = 0; i < ng; i += 16) {
        const int64_t cnt = std::min<int64_t>(16, ng - i);
        _mm512_store_ps(sbuf + i, scales16<F>(L, blob, r, ga + i, cnt));
        if constexpr (F == Format::int4_asym) _mm512_store_ps(zbuf + i, zeros16(L, blob, r, ga + i, cnt));
      }
      for (int64_t k = c0, gi = 0; k < c1; k += 128, gi += n) {
        const __m512 s = _mm512_permutexvar_ps(lane_group, _mm512_loadu_ps(sbuf + gi));
        if constexpr (F == Format::int4_asym) dec.set_zero(_mm512_permutexvar_ps(lane_group, _mm512_loadu_ps(zbuf + gi)));
        __m512 ae = _mm512_setzero_ps(), ao = _mm512_setzero_ps();
        dec.block(row + k / 2, xp + (k - c0), ae, ao);
        acc = _mm512_fmadd_ps(s, _mm512_add_ps(ae, ao), acc);
      }
    } else {
      for (int64_t g = c0 / G, ka = c0; ka < c1; ++g) {
        const int64_t kb = std::min((g + 1) * G, c1);
        const GroupParams p = group_params<F>(L, blob, r, g);
        if constexpr (F == Format::int4_asym) dec.set_zero(_mm512_set1_ps(p.zero));
        __m512 ae = _mm512_setzero_ps(), ao = _mm512_setzero_ps();
        for (int64_t k = ka; k < kb; k += 128) dec.block(row + k / 2, xp + (k - c0), ae, ao);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(p.scale), _mm512_add_ps(ae, ao), acc);
        ka = kb;
      }
    }
    float acc_s = 0.f;
    if (last && Kb < K) {  // columns past the last full block, group by group
      for (int64_t g = Kb / G; g < L.groups_per_row; ++g) {
        const int64_t ka = std::max(g * G, Kb), kb = std::min(K, (g + 1) * G);
        if (ka < kb) group_dot<F>(row, ka, kb, x, stored_params(L, blob, r, g), tab, &acc, acc_s);
      }
    }
    const float s = _mm512_reduce_add_ps(acc) + acc_s;
    y[r] = c0 == 0 ? s : y[r] + s;
  }
}

template <Format F, bool UseTable>
void matvec_rows_blocked(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  const int64_t N = L.rows, K = L.cols;
  const int64_t Kb = K / 128 * 128;  // columns in full blocks
  const Table tab = make_table();
  rows_per_thread(N, [&](int64_t r0, int64_t r1) {
    alignas(64) float xp[kTile];
    const BlockDecoder<F, UseTable> dec;
    for (int64_t c0 = 0; c0 < Kb && r0 < r1; c0 += kTile) {
      const int64_t c1 = std::min(Kb, c0 + kTile);
      for (int64_t b = 0; b < c1 - c0; b += 128)
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 16; ++i) xp[b + 16 * j + i] = x[c0 + b + 8 * i + j];
      rows_tile<F, UseTable>(L, blob, x, y, xp, r0, r1, c0, c1, Kb, dec, tab);
    }
  });
}
#endif

}  // namespace

std::string matvec_cpu_path(const QLayout& L) {
#if defined(MT_QUANT_AVX512)
  if (!memtrade::simd::restricted_below_best() && blocked_ok(L.spec.format, L.group, L.cols)) return "avx512-blocked";
#else
  (void)L;
#endif
  return "hwy-" + memtrade::simd::target_name();
}

void matvec_cpu(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  check_blob(L, blob, "matvec_cpu");
#if defined(MT_QUANT_AVX512)
  if (!memtrade::simd::restricted_below_best() && blocked_ok(L.spec.format, L.group, L.cols)) {
    with_format(L.spec.format, [&]<Format F>() {
      if constexpr (F == Format::int4_asym) {
        if (L.group < 128)
          matvec_rows_blocked<F, false>(L, blob, x, y);
        else
          matvec_rows_blocked<F, true>(L, blob, x, y);
      } else if constexpr (four_bit_v<F>) {
        matvec_rows_blocked<F, true>(L, blob, x, y);
      }
    });
    return;
  }
#endif
  quant::simd::matvec(L, blob, x, y);
}

int64_t matmul_panel_rows(const QLayout& L) {
  // About 4 MiB of fp32 rows per panel (several rows at least), never more than N.
  const int64_t rows = std::max<int64_t>(16, (int64_t{1} << 20) / std::max<int64_t>(1, L.cols));
  return std::min(L.rows, rows);
}

std::size_t matmul_workspace_bytes(const QLayout& L, int64_t M) {
  // A panel, and for a small batch at least one scratch of the small-batch path (sized for the widest
  // vectors, so the bytes do not depend on the SIMD target). At the suites' sizes the panel is far larger.
  const auto panel = static_cast<std::size_t>(matmul_panel_rows(L)) * static_cast<std::size_t>(L.cols);
  const auto scratch = M <= kMatmulSmallBatch ? static_cast<std::size_t>(quant::simd::small_scratch_bound_floats(M)) : 0;
  return std::max(panel, scratch) * sizeof(float);
}

namespace {
// Whether matmul_cpu takes the small-batch path for M rows of X with a workspace of ws_floats floats (one
// scratch, plus what rounding it up to 64 bytes may skip).
bool small_batch(int64_t M, int64_t ws_floats) {
  return M <= kMatmulSmallBatch && ws_floats >= quant::simd::matmul_small_scratch_floats(M) + 16;
}
int64_t workspace_floats(const QLayout& L, int64_t M) {
  return static_cast<int64_t>(matmul_workspace_bytes(L, M) / sizeof(float));
}
}  // namespace

std::string matmul_cpu_path(const QLayout& L, int64_t M) {
  return small_batch(M, workspace_floats(L, M)) ? "small-batch" : "panels";
}

void matmul_cpu(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* workspace) {
  check_blob(L, blob, "matmul_cpu");
  if (M <= 0) throw Error("matmul_cpu: M must be > 0");
  if (!workspace) throw Error("matmul_cpu: null workspace (allocate matmul_workspace_bytes)");
  if (!X || !Y) throw Error("matmul_cpu: null X or Y");
  if (const int64_t ws_floats = workspace_floats(L, M); small_batch(M, ws_floats))
    return quant::simd::matmul_small(L, blob, X, M, Y, workspace, ws_floats);
  const int64_t N = L.rows, K = L.cols, P = matmul_panel_rows(L);
  for (int64_t r0 = 0; r0 < N; r0 += P) {
    const int64_t nr = std::min(P, N - r0);
    quant::simd::dequant_rows(L, blob, r0, nr, workspace);
    // Y[:, r0 : r0 + nr] = X [M x K] * panel^T [K x nr]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(nr),
                static_cast<blasint>(K), 1.f, X, static_cast<blasint>(K), workspace, static_cast<blasint>(K), 0.f,
                Y + r0, static_cast<blasint>(N));
  }
}

// ------------------------------------------------------------------------------------- dense

void matvec_dense_f32(const float* W, const float* x, float* y, int64_t N, int64_t K) {
  if (N <= 0 || K <= 0) throw Error("matvec_dense_f32: sizes must be > 0");
  quant::simd::matvec_dense_f32(W, x, y, N, K);
}

void matvec_dense_bf16(const bf16_t* W, const float* x, float* y, int64_t N, int64_t K) {
  if (N <= 0 || K <= 0) throw Error("matvec_dense_bf16: sizes must be > 0");
  quant::simd::matvec_dense_bf16(W, x, y, N, K);
}

namespace {
void check_dense_small(const char* what, const void* W, const float* X, int64_t M, const float* Y, int64_t N, int64_t K) {
  if (N <= 0 || K <= 0 || M <= 0 || M > kMatmulSmallBatch)
    throw Error(std::string(what) + ": sizes must be > 0, with at most " + std::to_string(kMatmulSmallBatch) +
                " rows of X (got M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K) + ")");
  if (!W || !X || !Y) throw Error(std::string(what) + ": null W, X or Y");
}
}  // namespace

void matmul_dense_f32(const float* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  check_dense_small("matmul_dense_f32", W, X, M, Y, N, K);
  quant::simd::matmul_dense_f32(W, X, M, Y, N, K, accumulate);
}

void matmul_dense_bf16(const bf16_t* W, const float* X, int64_t M, float* Y, int64_t N, int64_t K, bool accumulate) {
  check_dense_small("matmul_dense_bf16", W, X, M, Y, N, K);
  quant::simd::matmul_dense_bf16(W, X, M, Y, N, K, accumulate);
}

}  // namespace memtrade::quant
