// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#include "common/simd/fixed_width.h"  // the register blocks below are arrays of vectors: no SVE / RVV
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/gemm16.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "common/simd/convert-inl.h"

#include <omp.h>

#include <algorithm>

#include "common/common.hpp"
#include "model/gemm16.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Rows of C per register block: MR x 2 vectors of accumulators, two of B and a broadcast of A.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMR = 12;  // 24 + 3 of 32 registers
#elif HWY_TARGET == HWY_SCALAR
constexpr int kMR = 4;
#else
constexpr int kMR = 6;  // 12 + 3 of 16
#endif

#if HWY_TARGET != HWY_SCALAR
// Four rows of 4 elements (row r at src + r lds) as fp32, transposed: element (r, c) to d[c ldd + r].
template <class T>
HWY_INLINE void Transpose4(const T* src, int64_t lds, float* d, int64_t ldd) {
  const hn::FixedTag<float, 4> d4;
  const hn::Repartition<uint64_t, decltype(d4)> d64;
  const auto r0 = LoadF32(d4, src), r1 = LoadF32(d4, src + lds);
  const auto r2 = LoadF32(d4, src + 2 * lds), r3 = LoadF32(d4, src + 3 * lds);
  const auto t0 = hn::BitCast(d64, hn::InterleaveLower(d4, r0, r1));  // r0[0] r1[0] r0[1] r1[1]
  const auto t1 = hn::BitCast(d64, hn::InterleaveLower(d4, r2, r3));
  const auto t2 = hn::BitCast(d64, hn::InterleaveUpper(d4, r0, r1));  // r0[2] r1[2] r0[3] r1[3]
  const auto t3 = hn::BitCast(d64, hn::InterleaveUpper(d4, r2, r3));
  hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d64, t0, t1)), d4, d);
  hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d64, t0, t1)), d4, d + ldd);
  hn::StoreU(hn::BitCast(d4, hn::InterleaveLower(d64, t2, t3)), d4, d + 2 * ldd);
  hn::StoreU(hn::BitCast(d4, hn::InterleaveUpper(d64, t2, t3)), d4, d + 3 * ldd);
}
#endif

// len elements of one row of a 16-bit matrix, as fp32, to d[i ldd] (converted in vectors; stored one by
// one unless ldd is 1).
template <class T>
HWY_INLINE void ScatterRow(const T* src, int64_t len, float* d, int64_t ldd) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float t[hn::MaxLanes(df)];
  int64_t i = 0;
  for (; i + N <= len; i += N) {
    if (ldd == 1) {
      hn::StoreU(LoadF32(src + i), df, d + i);
      continue;
    }
    hn::Store(LoadF32(src + i), df, t);
    for (int64_t e = 0; e < N; ++e) d[(i + e) * ldd] = t[e];
  }
  for (; i < len; ++i) d[i * ldd] = memtrade::to_f32(src[i]);
}

// op(A) as fp32 in blocks of kMR rows (the last block h < kMR rows): block b at wa + b kMR k holds its h
// rows column by column, element (r, p) at [p h + r], so the kernel broadcasts from one moving pointer.
// Split among the team; no barrier (PackB's ends with one).
template <class T>
void PackA(bool ta, const T* A, int64_t lda, int64_t m, int64_t k, float* wa) {
  const int64_t blocks = (m + kMR - 1) / kMR;
  if (ta) {  // A is [k x m]: column p of block b is row p of A from column i0, h elements widened in vectors
    const DF df;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
#pragma omp for schedule(static) nowait
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t i0 = b * kMR, h = std::min<int64_t>(kMR, m - i0), span = (h + N - 1) / N * N;
      const T* src = A + i0;
      float* dst = wa + i0 * k;
      // Whole vectors: a store past the column's h floats lands in the next column's place, which is
      // written next; the last columns, whose vectors would leave the block or read past A, one by one.
      int64_t p = 0;
      for (; p * h + span <= k * h && p * lda + i0 + span <= (k - 1) * lda + m; ++p)
        for (int64_t e = 0; e < h; e += N) hn::StoreU(LoadF32(src + p * lda + e), df, dst + p * h + e);
      for (; p < k; ++p)
        for (int64_t r = 0; r < h; ++r) dst[p * h + r] = memtrade::to_f32(src[p * lda + r]);
    }
    return;
  }
#pragma omp for schedule(static) nowait
  for (int64_t b = 0; b < blocks; ++b) {  // rows of A: transposed 4 x 4
    const int64_t i0 = b * kMR, h = std::min<int64_t>(kMR, m - i0);
    float* dst = wa + i0 * k;
    int64_t r = 0;
#if HWY_TARGET != HWY_SCALAR
    for (; r + 4 <= h; r += 4) {
      const T* src = A + (i0 + r) * lda;
      int64_t p = 0;
      for (; p + 4 <= k; p += 4) Transpose4(src + p, lda, dst + p * h + r, h);
      for (; p < k; ++p)
        for (int64_t rr = 0; rr < 4; ++rr) dst[p * h + r + rr] = memtrade::to_f32(src[rr * lda + p]);
    }
#endif
    for (; r < h; ++r) ScatterRow(A + (i0 + r) * lda, k, dst + r, h);
  }
}

// The block of B rows [p0, p0 + kc) as panels of NR columns: panel j holds kc rows of NR floats (columns
// j NR .. j NR + NR - 1, zeros past n). Panels are split among the team.
template <class T>
void PackB(bool tb, const T* B, int64_t ldb, int64_t n, int64_t p0, int64_t kc, int64_t NR, float* wb) {
  const int64_t panels = (n + NR - 1) / NR;
#pragma omp for schedule(static)
  for (int64_t jp = 0; jp < panels; ++jp) {
    float* dst = wb + jp * kc * NR;
    const int64_t j0 = jp * NR, w = std::min(NR, n - j0);
    if (!tb) {  // rows of B are contiguous in the columns
      for (int64_t p = 0; p < kc; ++p) {
        const T* src = B + (p0 + p) * ldb + j0;
        float* d = dst + p * NR;
        ScatterRow(src, w, d, 1);
        std::fill(d + w, d + NR, 0.f);
      }
    } else {  // B is [n x k]: column j of op(B) is row j of B, transposed 4 x 4 in 128-bit vectors
      int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
      for (; j + 4 <= w; j += 4) {
        const T* src = B + (j0 + j) * ldb + p0;
        int64_t p = 0;
        for (; p + 4 <= kc; p += 4) Transpose4(src + p, ldb, dst + p * NR + j, NR);
        for (; p < kc; ++p)
          for (int64_t jj = 0; jj < 4; ++jj) dst[p * NR + j + jj] = memtrade::to_f32(src[jj * ldb + p]);
      }
#endif
      for (; j < w; ++j) ScatterRow(B + (j0 + j) * ldb + p0, kc, dst + j, NR);
      for (j = w; j < NR; ++j)
        for (int64_t p = 0; p < kc; ++p) dst[p * NR + j] = 0.f;
    }
  }
}

// C[R rows x w columns] (+= when add) R rows of A (element (r, p) at a[p R + r], PackA's layout) x one
// panel (kc rows of 2 vectors). A 16-bit C is read and written in its type: round(C + sum) or round(sum).
template <int R, class O>
HWY_INLINE void Block(const float* HWY_RESTRICT a, const float* HWY_RESTRICT bp, int64_t kc, O* HWY_RESTRICT c,
                      int64_t ldc, int64_t w, bool add) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF c0[R], c1[R];  // in registers: every loop over r is unrolled
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) c0[r] = c1[r] = hn::Zero(df);
  for (int64_t p = 0; p < kc; ++p) {
    const VF b0 = hn::Load(df, bp + p * 2 * N), b1 = hn::Load(df, bp + p * 2 * N + N);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const VF x = hn::Set(df, a[p * R + r]);
      c0[r] = hn::MulAdd(x, b0, c0[r]);
      c1[r] = hn::MulAdd(x, b1, c1[r]);
    }
  }
  if (w == 2 * N) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      O* cr = c + r * ldc;
      if (add) {
        c0[r] = hn::Add(LoadF32(cr), c0[r]);
        c1[r] = hn::Add(LoadF32(cr + N), c1[r]);
      }
      StoreAs(c0[r], cr);
      StoreAs(c1[r], cr + N);
    }
  } else {
    HWY_ALIGN float t[2 * hn::MaxLanes(df)];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      hn::Store(c0[r], df, t);
      hn::Store(c1[r], df, t + N);
      O* cr = c + r * ldc;
      for (int64_t j = 0; j < w; ++j) cr[j] = memtrade::from_f32<O>(add ? memtrade::to_f32(cr[j]) + t[j] : t[j]);
    }
  }
}

// Block<h> for h <= R rows (the last rows of C).
template <int R, class O>
HWY_INLINE void BlockRows(int64_t h, const float* a, const float* bp, int64_t kc, O* c, int64_t ldc, int64_t w,
                          bool add) {
  if constexpr (R > 0) {
    if (h == R) Block<R>(a, bp, kc, c, ldc, w, add);
    else BlockRows<R - 1>(h, a, bp, kc, c, ldc, w, add);
  }
}

template <class T, class O>
void Gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* A, int64_t lda, const T* B, int64_t ldb,
            O* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  static_assert(2 * hn::MaxLanes(DF()) <= kGemm16Panel, "a panel is two vectors: the workspace bound assumes 32 floats at most");
  const int64_t NR = 2 * static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t panels = (n + NR - 1) / NR, blocks = (m + kMR - 1) / kMR;
  if (k == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    if (!acc)
      for (int64_t i = 0; i < m; ++i) std::fill_n(C + i * ldc, n, memtrade::from_f32<O>(0.f));
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    PackA(ta, A, lda, m, k, wa);
    for (int64_t p0 = 0; p0 < k; p0 += kGemm16KBlock) {
      const int64_t kc = std::min(kGemm16KBlock, k - p0);
      PackB(tb, B, ldb, n, p0, kc, NR, wb);
      const bool add = acc || p0 > 0;
      // Tiles of kMR rows x one panel. Panel by panel where a panel fits in L1 beside A's block (a thread's
      // run of tiles reads one panel with successive blocks of A), else block by block (one block of A with
      // successive panels): on 2 cores, 8-20% faster each way at the training step's shapes.
      const bool by_panel = kc * NR * static_cast<int64_t>(sizeof(float)) <= 32 * 1024;
#pragma omp for schedule(static) nowait
      for (int64_t t = 0; t < blocks * panels; ++t) {
        const int64_t jp = by_panel ? t / blocks : t % panels, ib = by_panel ? t % blocks : t / panels;
        const int64_t i0 = ib * kMR, h = std::min<int64_t>(kMR, m - i0);
        BlockRows<kMR>(h, wa + i0 * k + p0 * h, wb + jp * kc * NR, kc, C + i0 * ldc + jp * NR, ldc,
                       std::min(NR, n - jp * NR), add);
      }
      // The next block of k repacks B: every tile of this one must be done first (after the last, the
      // region's end waits for them).
      if (p0 + kc < k) {
#pragma omp barrier
      }
    }
  }
}

void GemmBF16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16_t* A, int64_t lda, const bf16_t* B,
              int64_t ldb, float* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  Gemm16(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}
void GemmF16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const f16_t* A, int64_t lda, const f16_t* B,
             int64_t ldb, float* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  Gemm16(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}
void GemmBF16Out(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16_t* A, int64_t lda, const bf16_t* B,
                 int64_t ldb, bf16_t* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  Gemm16(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}
void GemmF16Out(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const f16_t* A, int64_t lda, const f16_t* B,
                int64_t ldb, f16_t* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  Gemm16(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::simd {

namespace {
void check_narrow(int64_t k) {
  MT_CHECK(k <= kGemm16KBlock,
           "gemm16: a 16-bit C needs k <= " + std::to_string(kGemm16KBlock) + " (one block of k), got " + std::to_string(k));
}
}  // namespace

HWY_EXPORT(GemmBF16);
HWY_EXPORT(GemmF16);
HWY_EXPORT(GemmBF16Out);
HWY_EXPORT(GemmF16Out);

int64_t gemm16_a_floats(int64_t m, int64_t k) { return m * k; }
int64_t gemm16_b_floats(int64_t n, int64_t k) {
  return std::min(k, kGemm16KBlock) * ((n + kGemm16Panel - 1) / kGemm16Panel * kGemm16Panel);
}

void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16_t* A, int64_t lda, const bf16_t* B,
            int64_t ldb, float* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  HWY_DYNAMIC_DISPATCH(GemmBF16)(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const f16_t* A, int64_t lda, const f16_t* B,
            int64_t ldb, float* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  HWY_DYNAMIC_DISPATCH(GemmF16)(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const bf16_t* A, int64_t lda, const bf16_t* B,
            int64_t ldb, bf16_t* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  check_narrow(k);
  HWY_DYNAMIC_DISPATCH(GemmBF16Out)(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}
void gemm16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const f16_t* A, int64_t lda, const f16_t* B,
            int64_t ldb, f16_t* C, int64_t ldc, bool acc, float* wa, float* wb, int threads) {
  check_narrow(k);
  HWY_DYNAMIC_DISPATCH(GemmF16Out)(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, acc, wa, wb, threads);
}

}  // namespace memtrade::simd
#endif
