// Compiled once per SIMD target by Highway's foreach_target (this file includes itself); see the header.
#include "common/simd/fixed_width.h"  // the register blocks below are arrays of vectors: no SVE / RVV
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "impls/attention/simd/flash_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <omp.h>

#include "common/simd/convert-inl.h"
#include "impls/attention/simd/exp-inl.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "impls/attention/simd/flash_simd.hpp"
#include "impls/attention/tile_math.hpp"

HWY_BEFORE_NAMESPACE();
namespace memtrade::attention::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using VF = hn::Vec<DF>;

constexpr int BR = kCpuBlockQ, BC = kCpuBlockK;
static_assert(BR == BC, "the backward pass keeps transposed query tiles in the key tiles' buffers");

// Register blocking of the tile products: kR rows of C times kCV vectors of columns. The accumulators,
// the kCV loaded vectors of B and one broadcast must fit the register file: 24 + 4 + 1 of AVX-512's 32
// registers, 12 + 2 + 1 of the 16 of AVX2 and SSE4 (BLIS's 6 x 16 Haswell kernel); more accumulators
// than the FMA latency times the FMA ports keep both ports busy.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kCV = 4;
#else
constexpr int kCV = 2;
#endif
constexpr int kR = 6;

// What C holds before the product is added: nothing, itself, or itself times a factor per row.
enum class Init { zero, keep, scale };

// C[R x CV vectors] = init + A B over k: A(r, p) = a[r * ars + p * aks] (broadcast), B row p = b + p * ldb.
template <int R, int CV>
HWY_INLINE void Block(int k, const float* HWY_RESTRICT a, int64_t ars, int64_t aks, const float* HWY_RESTRICT b,
                      int64_t ldb, float* HWY_RESTRICT c, int64_t ldc, Init init, const float* row_scale) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R][CV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < CV; ++v) {
      if (init == Init::zero) {
        acc[r][v] = hn::Zero(df);
      } else {
        const VF x = hn::LoadU(df, c + r * ldc + v * N);
        acc[r][v] = init == Init::scale ? hn::Mul(x, hn::Set(df, row_scale[r])) : x;
      }
    }
  for (int p = 0; p < k; ++p) {
    VF bv[CV];
    for (int v = 0; v < CV; ++v) bv[v] = hn::LoadU(df, b + p * ldb + v * N);
    for (int r = 0; r < R; ++r) {
      const VF av = hn::Set(df, a[r * ars + p * aks]);
      for (int v = 0; v < CV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < CV; ++v) hn::StoreU(acc[r][v], df, c + r * ldc + v * N);
}

// The last rows < R of a column block, in one block of their count.
template <int R, int CV>
HWY_INLINE void RemainderBlock(int rows, int k, const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb,
                               float* c, int64_t ldc, Init init, const float* row_scale) {
  if constexpr (R > 0) {
    if (rows == R) return Block<R, CV>(k, a, ars, aks, b, ldb, c, ldc, init, row_scale);
    RemainderBlock<R - 1, CV>(rows, k, a, ars, aks, b, ldb, c, ldc, init, row_scale);
  }
}

// Rows [0, m) of one column block: blocks of kR rows, then the remainder in one smaller block.
template <int CV>
HWY_INLINE void BlockColumn(int m, int k, const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb,
                            float* c, int64_t ldc, Init init, const float* row_scale) {
  int r = 0;
  const auto at = [&](int r0) { return row_scale ? row_scale + r0 : nullptr; };
  for (; r + kR <= m; r += kR) Block<kR, CV>(k, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc, init, at(r));
  RemainderBlock<kR - 1, CV>(m - r, k, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc, init, at(r));
}

// C[m x n] (row stride ldc) = init + A[m x k] B[k x n], A and B addressed as in Block. Columns in blocks
// of kCV vectors, then single vectors, then one by one.
void Gemm(int m, int n, int k, const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c,
          int64_t ldc, Init init, const float* row_scale = nullptr) {
  const int N = static_cast<int>(hn::Lanes(DF()));
  int col = 0;
  for (; col + kCV * N <= n; col += kCV * N) BlockColumn<kCV>(m, k, a, ars, aks, b + col, ldb, c + col, ldc, init, row_scale);
  for (; col + N <= n; col += N) BlockColumn<1>(m, k, a, ars, aks, b + col, ldb, c + col, ldc, init, row_scale);
  // The last columns one lane at a time, with the vector lanes' multiply-add (a plain `acc += a * b` is
  // contracted or not as the compiler sees fit at each inlined call site).
  const hn::CappedTag<float, 1> d1;
  for (; col < n; ++col)
    for (int r = 0; r < m; ++r) {
      auto acc = hn::Set(d1, init == Init::zero ? 0.f : c[r * ldc + col] * (init == Init::scale ? row_scale[r] : 1.f));
      for (int p = 0; p < k; ++p) acc = hn::MulAdd(hn::Set(d1, a[r * ars + p * aks]), hn::Set(d1, b[p * ldb + col]), acc);
      c[r * ldc + col] = hn::GetLane(acc);
    }
}

// tile_math.hpp's exp_approx, step for step (exp-inl.h).
HWY_INLINE VF Exp(DF df, VF x) { return memtrade::simd::HWY_NAMESPACE::ExpApprox(df, x); }

// One key tile of the online softmax in the transposed layout sT[key][query] (queries across the vector):
// scores -> probabilities under the new running max; m and l updated; c = the factor that rescales what
// each query row accumulated (tile_math.hpp's recurrence; a row whose keys so far are all masked adds
// nothing and rescales by 1).
HWY_INLINE void SoftmaxTileT(float* HWY_RESTRICT sT, int cols, float* m, float* l, float* c) {
  const DF df;
  const int N = static_cast<int>(hn::Lanes(df));
  const VF ninf = hn::Set(df, -INFINITY);
  for (int i = 0; i < BR; i += N) {
    const VF m_old = hn::LoadU(df, m + i);
    // Four independent max chains: one chain over the tile's keys would wait on Max's latency each key.
    VF mx4[4] = {m_old, m_old, m_old, m_old};
    int j = 0;
    for (; j + 4 <= cols; j += 4)
      for (int u = 0; u < 4; ++u) mx4[u] = hn::Max(mx4[u], hn::LoadU(df, sT + (j + u) * BR + i));
    for (; j < cols; ++j) mx4[0] = hn::Max(mx4[0], hn::LoadU(df, sT + j * BR + i));
    const VF mx = hn::Max(hn::Max(mx4[0], mx4[1]), hn::Max(mx4[2], mx4[3]));
    const auto dead = hn::Eq(mx, ninf);
    const VF cv = hn::IfThenElse(dead, hn::Set(df, 1.f), Exp(df, hn::Sub(m_old, mx)));
    VF sum = hn::Zero(df);
    for (int j = 0; j < cols; ++j) {
      const VF p = hn::IfThenZeroElse(dead, Exp(df, hn::Sub(hn::LoadU(df, sT + j * BR + i), mx)));
      hn::StoreU(p, df, sT + j * BR + i);
      sum = hn::Add(sum, p);
    }
    hn::StoreU(hn::MulAdd(cv, hn::LoadU(df, l + i), sum), df, l + i);
    hn::StoreU(mx, df, m + i);
    hn::StoreU(cv, df, c + i);
  }
}

// P = exp(S - lse) and dS = P (dP - delta) over `len` consecutive scores (a multiple of the lane count):
// of one query row (kPerQuery false: *lse, *delta for all), or of one key column of S^T (kPerQuery true:
// lse[j], delta[j] for score j).
template <bool kPerQuery>
HWY_INLINE void ProbsAndGrads(float* HWY_RESTRICT s, float* HWY_RESTRICT dp, int len, const float* lse,
                              const float* delta) {
  const DF df;
  const int N = static_cast<int>(hn::Lanes(df));
  const VF lse1 = hn::Set(df, *lse), delta1 = hn::Set(df, *delta);
  for (int j = 0; j < len; j += N) {
    const VF p = Exp(df, hn::Sub(hn::LoadU(df, s + j), kPerQuery ? hn::LoadU(df, lse + j) : lse1));
    hn::StoreU(p, df, s + j);
    hn::StoreU(hn::Mul(p, hn::Sub(hn::LoadU(df, dp + j), kPerQuery ? hn::LoadU(df, delta + j) : delta1)), df, dp + j);
  }
}

template <class T>
HWY_INLINE void LoadRows(const T* src, int rows, int64_t d, float mult, float* dst) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df)), n = rows * d;
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(memtrade::simd::HWY_NAMESPACE::LoadF32(src + i), hn::Set(df, mult)), df, dst + i);
  for (; i < n; ++i) dst[i] = to_f32(src[i]) * mult;
}
// fp32 rows are read in place; 16-bit ones widened into `buf` (rows x d floats).
template <class T>
HWY_INLINE const float* RowsF32(const T* src, int rows, int64_t d, float* buf) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    LoadRows(src, rows, d, 1.f, buf);
    return buf;
  }
}
// A tile of `rows` rows of length d into [d x 64] (transposed), times mult, zero past `rows`. Returns the
// rows as fp32 (RowsF32: 16-bit rows widened into `buf` first).
template <class T>
HWY_INLINE const float* LoadTransposed(const T* src, int rows, int64_t d, float mult, float* dst, float* buf) {
  const float* x = RowsF32(src, rows, d, buf);
  for (int64_t p = 0; p < d; ++p)
    for (int j = 0; j < BC; ++j) dst[p * BC + j] = j < rows ? x[j * d + p] * mult : 0.f;
  return x;
}
// dst[i] = src[i] * mult rounded to T, in vectors (the scalar conversion's bits on every target).
template <class T>
HWY_INLINE void StoreRow(const float* src, float mult, T* dst, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) memtrade::simd::HWY_NAMESPACE::StoreAs(hn::Mul(hn::LoadU(df, src + i), hn::Set(df, mult)), dst + i);
  for (; i < n; ++i) dst[i] = from_f32<T>(src[i] * mult);
}

// A slot's buffers, carved from one tracked allocation (cpu_flash_slot_bytes(d) bytes).
struct Slot {
  float *q, *dout, *acc;             // BR x d each
  float *kT, *vT, *k, *v, *dk, *dv;  // BC x d each
  float *s, *dp;                     // BR x BC each
  float *m, *l, *lse, *delta;        // BR each
  Slot(float* base, int64_t d) {
    float* x = base;
    for (float** f : {&q, &dout, &acc}) { *f = x; x += BR * d; }
    for (float** f : {&kT, &vT, &k, &v, &dk, &dv}) { *f = x; x += BC * d; }
    for (float** f : {&s, &dp}) { *f = x; x += BR * BC; }
    for (float** f : {&m, &l, &lse, &delta}) { *f = x; x += BR; }
  }
};

template <class T>
class Kernel {
 public:
  Kernel(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots)
      : s_(s), scale_(scale), b_(b), ws_(ws), slot_floats_(static_cast<int64_t>(cpu_flash_slot_bytes(s.d) / sizeof(float))),
        threads_(static_cast<int>(std::min<int64_t>(slots, omp_get_max_threads()))) {}

  void forward(float* lse) {
    const int64_t n = s_.n, nk = s_.n_kv, d = s_.d, tiles = (n + BR - 1) / BR;
    T* og = out(b_.o);
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
    for (int64_t item = 0; item < s_.b * s_.h * tiles; ++item) {
      Slot w = slot();
      const int64_t bh = item / tiles, i0 = (item % tiles) * BR, bkv = kv_head(bh);
      const int rows = static_cast<int>(std::min<int64_t>(BR, n - i0));
      float* qT = w.kT;  // the scaled query tile, transposed: [d x BR]
      LoadTransposed(in(b_.q) + (bh * n + i0) * d, rows, d, scale_, qT, w.q);
      std::fill_n(w.acc, rows * d, 0.f);
      std::fill_n(w.m, BR, -INFINITY);
      std::fill_n(w.l, BR, 0.f);
      for (int64_t j0 = 0; j0 < key_end(i0 + rows); j0 += BC) {
        const int cols = static_cast<int>(std::min<int64_t>(BC, nk - j0));
        const float* kt = RowsF32(in(b_.k) + (bkv * nk + j0) * d, cols, d, w.k);
        const float* vt = RowsF32(in(b_.v) + (bkv * nk + j0) * d, cols, d, w.v);
        Gemm(cols, BR, static_cast<int>(d), kt, d, 1, qT, BR, w.s, BR, Init::zero);  // S^T = K (scale Q)^T
        MaskTransposed(w.s, i0, j0, cols);
        float* c = w.lse;  // the rescale factors of this tile
        SoftmaxTileT(w.s, cols, w.m, w.l, c);
        Gemm(rows, static_cast<int>(d), cols, w.s, 1, BR, vt, d, w.acc, d, Init::scale, c);  // O = c O + P V
      }
      for (int i = 0; i < rows; ++i) {
        StoreRow(w.acc + i * d, inverse_row_sum(w.l[i]), og + (bh * n + i0 + i) * d, d);
        if (lse) lse[bh * n + i0 + i] = row_lse(w.m[i], w.l[i]);
      }
    }
  }

  void backward(const float* lse, float* delta, BackwardPasses passes, float* dq32, int64_t dq32_floats) {
    const int64_t n = s_.n, nk = s_.n_kv, d = s_.d, qtiles = (n + BR - 1) / BR, ktiles = (nk + BC - 1) / BC;
    const int di = static_cast<int>(d);
    const T *og = in(b_.o), *dog = in(b_.dout);
#pragma omp parallel for schedule(static) num_threads(threads_)
    for (int64_t r = 0; r < s_.rows(); ++r) {  // delta_i = dO_i . O_i, summed in order (16-bit rows widened first)
      Slot w = slot();
      const float *a = RowsF32(dog + r * d, 1, d, w.dout), *o = RowsF32(og + r * d, 1, d, w.q);
      float acc = 0.f;
      for (int64_t x = 0; x < d; ++x) acc += a[x] * o[x];
      delta[r] = acc;
    }
    // One pass: each (batch, KV head) runs its key tiles in order and adds dS K into its group's fp32 dQ
    // rows (the fp32 output in place; for 16-bit outputs the thread's part of dq32), in the order the
    // second pass would: the same bits, without recomputing S and dP.
    const int64_t per_kv = s_.group() * n * d;  // the group's query heads' dQ rows, contiguous
    if (one_pass(passes, dq32 && per_kv > 0 ? dq32_floats / per_kv : 0)) {
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
      for (int64_t bkv = 0; bkv < s_.b * s_.h_kv; ++bkv) {
        Slot w = slot();
        float* dq = std::is_same_v<T, float> ? static_cast<float*>(b_.dq) + bkv * per_kv : dq32 + omp_get_thread_num() * per_kv;
        std::fill_n(dq, per_kv, 0.f);
        for (int64_t j0 = 0; j0 < nk; j0 += BC) key_tile(w, bkv, j0, lse, delta, dq);
        StoreRow(dq, scale_, out(b_.dq) + bkv * per_kv, per_kv);
      }
      return;
    }
    // Pass 1: each key tile accumulates dK and dV over its group's query heads and every query tile.
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
    for (int64_t item = 0; item < s_.b * s_.h_kv * ktiles; ++item) {
      Slot w = slot();
      key_tile(w, item / ktiles, (item % ktiles) * BC, lse, delta, nullptr);
    }
    // Pass 2: each query tile accumulates dQ over the key tiles it sees, in the transposed layout
    // S^T[key][query] (its Q^T and dO^T loaded once; K and V read as rows).
#pragma omp parallel for schedule(dynamic) num_threads(threads_)
    for (int64_t item = 0; item < s_.b * s_.h * qtiles; ++item) {
      Slot w = slot();
      const int64_t bh = item / qtiles, i0 = (item % qtiles) * BR, bkv = kv_head(bh);
      const int rows = static_cast<int>(std::min<int64_t>(BR, n - i0));
      float *qT = w.kT, *doT = w.vT;
      LoadTransposed(in(b_.q) + (bh * n + i0) * d, rows, d, scale_, qT, w.q);
      LoadTransposed(dog + (bh * n + i0) * d, rows, d, 1.f, doT, w.dout);
      for (int i = 0; i < BR; ++i) {  // rows past the tile: p = 0 and dS = 0
        w.lse[i] = i < rows ? lse[bh * n + i0 + i] : INFINITY;
        w.delta[i] = i < rows ? delta[bh * n + i0 + i] : 0.f;
      }
      std::fill_n(w.acc, rows * d, 0.f);
      for (int64_t j0 = 0; j0 < key_end(i0 + rows); j0 += BC) {
        const int cols = static_cast<int>(std::min<int64_t>(BC, nk - j0));
        const float* kt = RowsF32(in(b_.k) + (bkv * nk + j0) * d, cols, d, w.k);
        const float* vt = RowsF32(in(b_.v) + (bkv * nk + j0) * d, cols, d, w.v);
        Gemm(cols, BR, di, kt, d, 1, qT, BR, w.s, BR, Init::zero);    // S^T = K (scale Q)^T
        Gemm(cols, BR, di, vt, d, 1, doT, BR, w.dp, BR, Init::zero);  // dP^T = V dO^T
        MaskTransposed(w.s, i0, j0, cols);
        for (int j = 0; j < cols; ++j) ProbsAndGrads<true>(w.s + j * BR, w.dp + j * BR, BR, w.lse, w.delta);
        Gemm(rows, di, cols, w.dp, 1, BR, kt, d, w.acc, d, Init::keep);  // dQ += dS K (scaled at the end)
      }
      StoreRow(w.acc, scale_, out(b_.dq) + (bh * n + i0) * d, rows * d);
    }
  }

  // Whether the backward runs as one pass (see backward): fp32, or 16-bit with room for each thread's fp32
  // dQ rows (dq32_heads: how many KV heads' worth dq32 holds); by default when every thread has a (batch,
  // KV head) of its own.
  bool one_pass(BackwardPasses passes, int64_t dq32_heads) const {
    const bool possible = std::is_same_v<T, float> || dq32_heads >= threads_;
    if (passes == BackwardPasses::one && !possible)
      throw Error("flash attention: the one-pass backward of a 16-bit dtype needs an fp32 dQ accumulator of " +
                  std::to_string(threads_) + " x group x n x d floats (one KV head's query rows per thread)");
    if (passes != BackwardPasses::automatic) return passes == BackwardPasses::one;
    return possible && s_.b * s_.h_kv >= threads_;
  }

  // Key tile j0 of KV head bkv: dK and dV over its group's query heads and every query tile, in the row
  // layout S[query][key] (K^T and V^T loaded once); with dq (the group's fp32 dQ rows), dQ += dS K too.
  void key_tile(Slot& w, int64_t bkv, int64_t j0, const float* lse, const float* delta, float* dq) {
    const int64_t n = s_.n, nk = s_.n_kv, d = s_.d, b = bkv / s_.h_kv;
    const int di = static_cast<int>(d);
    const int cols = static_cast<int>(std::min<int64_t>(BC, nk - j0));
    const float* k_rows = LoadTransposed(in(b_.k) + (bkv * nk + j0) * d, cols, d, 1.f, w.kT, w.k);
    LoadTransposed(in(b_.v) + (bkv * nk + j0) * d, cols, d, 1.f, w.vT, w.v);
    const float* kt = dq ? k_rows : nullptr;
    std::fill_n(w.dk, cols * d, 0.f);
    std::fill_n(w.dv, cols * d, 0.f);
    for (int64_t g = 0; g < s_.group(); ++g) {
      const int64_t bh = b * s_.h + (bkv % s_.h_kv) * s_.group() + g;
      for (int64_t i0 = query_begin(j0) / BR * BR; i0 < n; i0 += BR) {
        const int rows = static_cast<int>(std::min<int64_t>(BR, n - i0));
        LoadRows(in(b_.q) + (bh * n + i0) * d, rows, d, scale_, w.q);
        LoadRows(in(b_.dout) + (bh * n + i0) * d, rows, d, 1.f, w.dout);
        Gemm(rows, BC, di, w.q, d, 1, w.kT, BC, w.s, BC, Init::zero);      // S = (scale Q) K^T
        Gemm(rows, BC, di, w.dout, d, 1, w.vT, BC, w.dp, BC, Init::zero);  // dP = dO V^T
        if (cols < BC || crosses_diagonal(i0, j0, cols))
          for (int i = 0; i < rows; ++i)
            for (int j = 0; j < BC; ++j)
              if (j >= cols || (s_.causal && !causal_allows(i0 + i, j0 + j, n, nk))) w.s[i * BC + j] = -INFINITY;
        for (int i = 0; i < rows; ++i)
          ProbsAndGrads<false>(w.s + i * BC, w.dp + i * BC, BC, lse + bh * n + i0 + i, delta + bh * n + i0 + i);
        Gemm(cols, di, rows, w.s, 1, BC, w.dout, d, w.dv, d, Init::keep);  // dV += P^T dO
        Gemm(cols, di, rows, w.dp, 1, BC, w.q, d, w.dk, d, Init::keep);    // dK += dS^T (scale Q)
        if (dq)  // dQ += dS K (scaled at the end)
          Gemm(rows, di, cols, w.dp, BC, 1, kt, d, dq + (g * n + i0) * d, d, Init::keep);
      }
    }
    StoreRow(w.dk, 1.f, out(b_.dk) + (bkv * nk + j0) * d, cols * d);
    StoreRow(w.dv, 1.f, out(b_.dv) + (bkv * nk + j0) * d, cols * d);
  }

 private:
  static const T* in(const void* p) { return static_cast<const T*>(p); }
  static T* out(void* p) { return static_cast<T*>(p); }
  Slot slot() const { return Slot(ws_ + omp_get_thread_num() * slot_floats_, s_.d); }
  int64_t kv_head(int64_t bh) const { return bh / s_.h * s_.h_kv + (bh % s_.h) / s_.group(); }
  // Key tiles [0, key_end) hold a key that query rows [.., i1) may see; query tiles from query_begin see key j0.
  int64_t key_end(int64_t i1) const { return s_.causal ? std::clamp<int64_t>(i1 + s_.n_kv - s_.n, 0, s_.n_kv) : s_.n_kv; }
  int64_t query_begin(int64_t j0) const { return s_.causal ? std::clamp<int64_t>(j0 - (s_.n_kv - s_.n), 0, s_.n) : 0; }
  // The key tile [j0, j0 + cols) has a key that query row i0 (the tile's first) may not see.
  bool crosses_diagonal(int64_t i0, int64_t j0, int cols) const { return s_.causal && j0 + cols - 1 > i0 + (s_.n_kv - s_.n); }
  // Scores S^T [cols x BR] of query tile i0 against key tile j0: -inf where the causal mask hides the key.
  void MaskTransposed(float* sT, int64_t i0, int64_t j0, int cols) const {
    if (!crosses_diagonal(i0, j0, cols)) return;
    for (int j = 0; j < cols; ++j)
      for (int i = 0; i < BR; ++i)
        if (!causal_allows(i0 + i, j0 + j, s_.n, s_.n_kv)) sT[j * BR + i] = -INFINITY;
  }
  const Dims s_;
  const float scale_;
  const FlashCpuBuffers b_;
  float* const ws_;
  const int64_t slot_floats_;
  const int threads_;
};

template <class F>
void ByDtype(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else if (t == DType::bf16) f(bf16_t{});
  else if (t == DType::f16) f(f16_t{});
  else throw Error(std::string("flash attention: unsupported dtype ") + dtype_name(t));
}

void Forward(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots, float* lse) {
  ByDtype(s.dtype, [&](auto tag) { Kernel<decltype(tag)>(s, scale, b, ws, slots).forward(lse); });
}

void Backward(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots, const float* lse,
              float* delta, BackwardPasses passes, float* dq32, int64_t dq32_floats) {
  ByDtype(s.dtype, [&](auto tag) {
    Kernel<decltype(tag)>(s, scale, b, ws, slots).backward(lse, delta, passes, dq32, dq32_floats);
  });
}

void ExpLanes(const float* x, float* y, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  HWY_ALIGN float buf[hn::MaxLanes(df)];
  for (int64_t i = 0; i < n; i += N) {
    const int64_t len = std::min(N, n - i);
    std::fill_n(buf, N, 0.f);
    std::copy_n(x + i, len, buf);
    hn::Store(Exp(df, hn::Load(df, buf)), df, buf);
    std::copy_n(buf, len, y + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace memtrade::attention::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace memtrade::attention::simd {

HWY_EXPORT(Forward);
HWY_EXPORT(Backward);
HWY_EXPORT(ExpLanes);

void flash_forward(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots, float* lse) {
  HWY_DYNAMIC_DISPATCH(Forward)(s, scale, b, ws, slots, lse);
}
void flash_backward(const Dims& s, float scale, const FlashCpuBuffers& b, float* ws, int64_t slots,
                    const float* lse, float* delta, BackwardPasses passes, float* dq32, int64_t dq32_floats) {
  HWY_DYNAMIC_DISPATCH(Backward)(s, scale, b, ws, slots, lse, delta, passes, dq32, dq32_floats);
}
void exp_approx_lanes(const float* x, float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(ExpLanes)(x, y, n); }

}  // namespace memtrade::attention::simd
#endif
