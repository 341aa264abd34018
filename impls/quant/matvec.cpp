// Host quantized matvec / matmul: reference, optimized (AVX-512 + OpenMP), dense baselines.
#include "impls/quant/matvec.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

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

bool four_bit(Format f) { return f == Format::int4 || f == Format::int4_asym || f == Format::nf4; }

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

// 16 unscaled values from element k (k even for the 4-bit formats): 16 bytes (8 for 4-bit) read once.
template <Format F>
inline __m512 dec16(const uint8_t* row, int64_t k, __m512 zero, __m512 nf4_table) {
  if constexpr (F == Format::int8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  } else if constexpr (F == Format::fp8_e4m3 || F == Format::fp8_e5m2) {
    // The scalar decode's bit placement: magnitude bits under a float exponent, times 2^(127 - bias),
    // then the sign. The blob never holds NaN / Inf codes (quantize saturates and rejects non-finite
    // weights), so they are not special-cased here.
    constexpr int shift = F == Format::fp8_e4m3 ? 20 : 21;
    const __m512 pow2 = _mm512_set1_ps(F == Format::fp8_e4m3 ? 0x1p120f : 0x1p112f);
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    const __m512i mag = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x7F)), shift);
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
    const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(mag), pow2);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
  } else {
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
}

inline __m512 nf4_table_vec() {
  alignas(64) float t[16];
  for (int i = 0; i < 16; ++i) t[i] = nf4_code(i);
  return _mm512_load_ps(t);
}

#endif

template <Format F>
inline float unscaled(const uint8_t* row, int64_t k, float zero) {
  return decode_value(F, four_bit(F) ? nibble(row, k) : row[k], 1.f, zero);
}

#if defined(MT_QUANT_AVX512)
using Table = __m512;
inline Table make_table() { return nf4_table_vec(); }
#else
using Table = int;
inline Table make_table() { return 0; }
#endif

// One group [k0, k1) of one row: adds scale * sum_k u_k x_k to the row's accumulators (the vector lanes
// in acc_v, scalar head / tail elements in acc_s).
template <Format F>
inline void group_dot(const uint8_t* row, int64_t k0, int64_t k1, const float* x, const GroupParams& p,
                      [[maybe_unused]] Table tab, [[maybe_unused]] void* acc_v, float& acc_s) {
  float tail = 0.f;
  int64_t k = k0;
  if (four_bit(F) && (k & 1) && k < k1) {  // odd start (odd group size): one element to reach a byte
    tail += unscaled<F>(row, k, p.zero) * x[k];
    ++k;
  }
#if defined(MT_QUANT_AVX512)
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
#else
#if defined(_OPENMP)
#pragma omp simd reduction(+ : tail)
#endif
  for (int64_t j = k; j < k1; ++j) tail += unscaled<F>(row, j, p.zero) * x[j];
#endif
  acc_s += p.scale * tail;
}

// Row r of deq(W) into out[K] (scale * u, as dequantize()).
template <Format F>
inline void dequant_row(const QLayout& L, const uint8_t* blob, int64_t r, float* out, [[maybe_unused]] Table tab) {
  const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
  const int64_t K = L.cols, G = L.group;
  for (int64_t g = 0; g < L.groups_per_row; ++g) {
    const GroupParams p = stored_params(L, blob, r, g);
    const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
    int64_t k = k0;
    if (four_bit(F) && (k & 1) && k < k1) {
      out[k] = p.scale * unscaled<F>(row, k, p.zero);
      ++k;
    }
#if defined(MT_QUANT_AVX512)
    const __m512 z = _mm512_set1_ps(p.zero), s = _mm512_set1_ps(p.scale);
    for (; k + 16 <= k1; k += 16) {
      const __m512 u = dec16<F>(row, k, z, tab);
      // fp8 / nf4: decode(q) * scale, int: scale * (q - z); both products are commutative roundings
      _mm512_storeu_ps(out + k, _mm512_mul_ps(s, u));
    }
#endif
    for (; k < k1; ++k) out[k] = p.scale * unscaled<F>(row, k, p.zero);
  }
}

template <Format F>
void matvec_rows(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  const int64_t N = L.rows, K = L.cols, G = L.group;
  const Table tab = make_table();
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
    float acc_s = 0.f;
#if defined(MT_QUANT_AVX512)
    __m512 acc_v = _mm512_setzero_ps();
    void* av = &acc_v;
#else
    void* av = nullptr;
#endif
    for (int64_t g = 0; g < L.groups_per_row; ++g) {
      const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
      group_dot<F>(row, k0, k1, x, stored_params(L, blob, r, g), tab, av, acc_s);
    }
#if defined(MT_QUANT_AVX512)
    y[r] = _mm512_reduce_add_ps(acc_v) + acc_s;
#else
    y[r] = acc_s;
#endif
  }
}

template <class Fn>
void dispatch(Format f, Fn&& fn) {
  switch (f) {
    case Format::int8: fn.template operator()<Format::int8>(); return;
    case Format::int4: fn.template operator()<Format::int4>(); return;
    case Format::int4_asym: fn.template operator()<Format::int4_asym>(); return;
    case Format::fp8_e4m3: fn.template operator()<Format::fp8_e4m3>(); return;
    case Format::fp8_e5m2: fn.template operator()<Format::fp8_e5m2>(); return;
    case Format::nf4: fn.template operator()<Format::nf4>(); return;
  }
}

}  // namespace

void matvec_cpu(const QLayout& L, const uint8_t* blob, const float* x, float* y) {
  check_blob(L, blob, "matvec_cpu");
  dispatch(L.spec.format, [&]<Format F>() { matvec_rows<F>(L, blob, x, y); });
}

int64_t matmul_panel_rows(const QLayout& L) {
  // About 4 MiB of fp32 rows per panel (several rows at least), never more than N.
  const int64_t rows = std::max<int64_t>(16, (int64_t{1} << 20) / std::max<int64_t>(1, L.cols));
  return std::min(L.rows, rows);
}

std::size_t matmul_workspace_bytes(const QLayout& L, int64_t /*M*/) {
  return static_cast<std::size_t>(matmul_panel_rows(L)) * static_cast<std::size_t>(L.cols) * sizeof(float);
}

void matmul_cpu(const QLayout& L, const uint8_t* blob, const float* X, int64_t M, float* Y, float* workspace) {
  check_blob(L, blob, "matmul_cpu");
  if (M <= 0) throw Error("matmul_cpu: M must be > 0");
  if (!workspace) throw Error("matmul_cpu: null workspace (allocate matmul_workspace_bytes)");
  const int64_t N = L.rows, K = L.cols, P = matmul_panel_rows(L);
  for (int64_t r0 = 0; r0 < N; r0 += P) {
    const int64_t nr = std::min(P, N - r0);
    const Table tab = make_table();
    dispatch(L.spec.format, [&]<Format F>() {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
      for (int64_t i = 0; i < nr; ++i) dequant_row<F>(L, blob, r0 + i, workspace + i * K, tab);
    });
    // Y[:, r0 : r0 + nr] = X [M x K] * panel^T [K x nr]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(M), static_cast<blasint>(nr),
                static_cast<blasint>(K), 1.f, X, static_cast<blasint>(K), workspace, static_cast<blasint>(K), 0.f,
                Y + r0, static_cast<blasint>(N));
  }
}

// ------------------------------------------------------------------------------------- dense

void matvec_dense_f32(const float* W, const float* x, float* y, int64_t N, int64_t K) {
  if (N <= 0 || K <= 0) throw Error("matvec_dense_f32: sizes must be > 0");
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const float* w = W + r * K;
    int64_t k = 0;
#if defined(MT_QUANT_AVX512)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), a1);
    }
    float acc = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#else
    float acc = 0.f;
#endif
    for (; k < K; ++k) acc += w[k] * x[k];
    y[r] = acc;
  }
}

void matvec_dense_bf16(const bf16_t* W, const float* x, float* y, int64_t N, int64_t K) {
  if (N <= 0 || K <= 0) throw Error("matvec_dense_bf16: sizes must be > 0");
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
  for (int64_t r = 0; r < N; ++r) {
    const bf16_t* w = W + r * K;
    int64_t k = 0;
#if defined(MT_QUANT_AVX512)
    // bf16 -> fp32 is exact: the 16 bits moved to the top of the word
    auto load16 = [&](int64_t j) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    };
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; k + 32 <= K; k += 32) {
      a0 = _mm512_fmadd_ps(load16(k), _mm512_loadu_ps(x + k), a0);
      a1 = _mm512_fmadd_ps(load16(k + 16), _mm512_loadu_ps(x + k + 16), a1);
    }
    float acc = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#else
    float acc = 0.f;
#endif
    for (; k < K; ++k) acc += to_float(w[k]) * x[k];
    y[r] = acc;
  }
}

}  // namespace memtrade::quant
