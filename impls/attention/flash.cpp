// FlashAttention-2 style attention on the CPU: query tiles of 64 rows stream over key tiles of 64 keys
// with the online softmax (tile_math.hpp); only O and, for training, the per-row log-sum-exp are kept.
// Backward recomputes P tile by tile in two passes without atomics: one owns key tiles (dK, dV), one
// owns query tiles (dQ). OpenMP over tiles; the tile products are register-blocked loops the compiler
// vectorizes (AVX2/AVX-512 with -march=native). Every buffer is a tracked per-thread slot.
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cmath>
#include <type_traits>

#include "impls/attention/attention.hpp"
#include "impls/attention/tile_math.hpp"

namespace memtrade::attention {

namespace {

constexpr int BR = kCpuBlockQ, BC = kCpuBlockK;

// out[r x BC] = a[r x d] * bT[d x BC]  (bT is a key tile transposed; rows of `a` in blocks of 4).
void tile_abT(const float* __restrict a, int r, const float* __restrict bT, int d, float* __restrict out) {
  int i = 0;
  for (; i + 4 <= r; i += 4) {
    float acc[4][BC] = {};
    for (int p = 0; p < d; ++p) {
      const float* brow = bT + p * BC;
      const float a0 = a[i * d + p], a1 = a[(i + 1) * d + p], a2 = a[(i + 2) * d + p], a3 = a[(i + 3) * d + p];
#pragma omp simd
      for (int j = 0; j < BC; ++j) {
        acc[0][j] += a0 * brow[j];
        acc[1][j] += a1 * brow[j];
        acc[2][j] += a2 * brow[j];
        acc[3][j] += a3 * brow[j];
      }
    }
    for (int u = 0; u < 4; ++u)
      for (int j = 0; j < BC; ++j) out[(i + u) * BC + j] = acc[u][j];
  }
  for (; i < r; ++i) {
    float acc[BC] = {};
    for (int p = 0; p < d; ++p) {
      const float av = a[i * d + p];
#pragma omp simd
      for (int j = 0; j < BC; ++j) acc[j] += av * bT[p * BC + j];
    }
    for (int j = 0; j < BC; ++j) out[i * BC + j] = acc[j];
  }
}

// out[r x d] += a[r x c] * b[c x d]  (a has row stride BC).
void tile_acc_ab(const float* __restrict a, int r, int c, const float* __restrict b, int d, float* __restrict out) {
  int i = 0;
  for (; i + 2 <= r; i += 2) {
    float* o0 = out + i * d;
    float* o1 = out + (i + 1) * d;
    for (int j = 0; j < c; ++j) {
      const float a0 = a[i * BC + j], a1 = a[(i + 1) * BC + j];
      const float* brow = b + j * d;
#pragma omp simd
      for (int x = 0; x < d; ++x) {
        o0[x] += a0 * brow[x];
        o1[x] += a1 * brow[x];
      }
    }
  }
  for (; i < r; ++i)
    for (int j = 0; j < c; ++j) {
      const float av = a[i * BC + j];
#pragma omp simd
      for (int x = 0; x < d; ++x) out[i * d + x] += av * b[j * d + x];
    }
}

// out[c x d] += a[r x c]^T * b[r x d]  (a has row stride BC).
void tile_acc_aTb(const float* __restrict a, int r, int c, const float* __restrict b, int d, float* __restrict out) {
  for (int j = 0; j < c; ++j) {
    float* orow = out + j * d;
    for (int i = 0; i < r; ++i) {
      const float av = a[i * BC + j];
      if (av == 0.f) continue;  // masked entries
      const float* brow = b + i * d;
#pragma omp simd
      for (int x = 0; x < d; ++x) orow[x] += av * brow[x];
    }
  }
}

// Forward kernels in the transposed layout: scores are kept as sT[key][query] so that the online
// softmax, the max and the sums vectorize across the 64 queries of a tile. D > 0 fixes the head dim
// at compile time (64, 128) so the accumulators live in registers; D = 0 takes it at run time.

// sT[cols x BR] = k[cols x d] * qT[d x BR]  (k rows with stride d; qT is the query tile transposed).
template <int D>
void tile_kqT(const float* __restrict k, int cols, const float* __restrict qT, int d_rt, float* __restrict sT) {
  const int d = D > 0 ? D : d_rt;
  int j = 0;
#if defined(__AVX512F__)
  // 4 keys x 64 queries of accumulators: 16 zmm registers (GCC keeps the plain version's on the stack).
  static_assert(BR == 64);
  for (; j + 4 <= cols; j += 4) {
    __m512 acc[4][4];
    for (auto& r : acc)
      for (auto& x : r) x = _mm512_setzero_ps();
    for (int p = 0; p < d; ++p) {
      const float* qrow = qT + p * BR;
      const __m512 q0 = _mm512_loadu_ps(qrow), q1 = _mm512_loadu_ps(qrow + 16), q2 = _mm512_loadu_ps(qrow + 32),
                   q3 = _mm512_loadu_ps(qrow + 48);
      for (int u = 0; u < 4; ++u) {
        const __m512 kb = _mm512_set1_ps(k[(j + u) * d + p]);
        acc[u][0] = _mm512_fmadd_ps(kb, q0, acc[u][0]);
        acc[u][1] = _mm512_fmadd_ps(kb, q1, acc[u][1]);
        acc[u][2] = _mm512_fmadd_ps(kb, q2, acc[u][2]);
        acc[u][3] = _mm512_fmadd_ps(kb, q3, acc[u][3]);
      }
    }
    for (int u = 0; u < 4; ++u)
      for (int v = 0; v < 4; ++v) _mm512_storeu_ps(sT + (j + u) * BR + 16 * v, acc[u][v]);
  }
#endif
  for (; j + 4 <= cols; j += 4) {
    float acc[4][BR] = {};
    for (int p = 0; p < d; ++p) {
      const float k0 = k[j * d + p], k1 = k[(j + 1) * d + p], k2 = k[(j + 2) * d + p], k3 = k[(j + 3) * d + p];
      const float* qrow = qT + p * BR;
#pragma omp simd
      for (int i = 0; i < BR; ++i) {
        acc[0][i] += k0 * qrow[i];
        acc[1][i] += k1 * qrow[i];
        acc[2][i] += k2 * qrow[i];
        acc[3][i] += k3 * qrow[i];
      }
    }
    for (int u = 0; u < 4; ++u)
      for (int i = 0; i < BR; ++i) sT[(j + u) * BR + i] = acc[u][i];
  }
  for (; j < cols; ++j) {
    float acc[BR] = {};
    for (int p = 0; p < d; ++p) {
      const float kv = k[j * d + p];
#pragma omp simd
      for (int i = 0; i < BR; ++i) acc[i] += kv * qT[p * BR + i];
    }
    for (int i = 0; i < BR; ++i) sT[j * BR + i] = acc[i];
  }
}

// acc[i] = c[i] * acc[i] + sum_j pT[j][i] v[j]  for rows i < rows (acc rows of length d).
template <int D>
void tile_rescale_add_pv(const float* __restrict pT, int rows, int cols, const float* __restrict v,
                         const float* __restrict c, int d_rt, float* __restrict acc) {
  constexpr int R = D == 64 ? 4 : 2;        // rows per register block
  constexpr int DD = D > 0 ? D : 256;       // register block width (run-time d <= 256)
  const int d = D > 0 ? D : d_rt;
  int i = 0;
#if defined(__AVX512F__)
  if constexpr (D > 0 && D % 16 == 0) {
    constexpr int V = D / 16;  // R x V accumulators: 16 zmm for d = 64 and d = 128
    for (; i + R <= rows; i += R) {
      __m512 a[R][V];
      for (int u = 0; u < R; ++u) {
        const __m512 cu = _mm512_set1_ps(c[i + u]);
        for (int x = 0; x < V; ++x) a[u][x] = _mm512_mul_ps(_mm512_loadu_ps(acc + (i + u) * D + 16 * x), cu);
      }
      for (int j = 0; j < cols; ++j) {
        const float* vrow = v + j * D;
        __m512 vv[V];
        for (int x = 0; x < V; ++x) vv[x] = _mm512_loadu_ps(vrow + 16 * x);
        for (int u = 0; u < R; ++u) {
          const __m512 pb = _mm512_set1_ps(pT[j * BR + i + u]);
          for (int x = 0; x < V; ++x) a[u][x] = _mm512_fmadd_ps(pb, vv[x], a[u][x]);
        }
      }
      for (int u = 0; u < R; ++u)
        for (int x = 0; x < V; ++x) _mm512_storeu_ps(acc + (i + u) * D + 16 * x, a[u][x]);
    }
  }
#endif
  for (; i + R <= rows; i += R) {
    float a[R][DD];
    for (int u = 0; u < R; ++u)
#pragma omp simd
      for (int x = 0; x < d; ++x) a[u][x] = acc[(i + u) * d + x] * c[i + u];
    for (int j = 0; j < cols; ++j) {
      const float* vrow = v + j * d;
      float pj[R];
      for (int u = 0; u < R; ++u) pj[u] = pT[j * BR + i + u];
      for (int u = 0; u < R; ++u)
#pragma omp simd
        for (int x = 0; x < d; ++x) a[u][x] += pj[u] * vrow[x];
    }
    for (int u = 0; u < R; ++u)
      for (int x = 0; x < d; ++x) acc[(i + u) * d + x] = a[u][x];
  }
  for (; i < rows; ++i) {
    for (int x = 0; x < d; ++x) acc[i * d + x] *= c[i];
    for (int j = 0; j < cols; ++j) {
      const float p = pT[j * BR + i];
#pragma omp simd
      for (int x = 0; x < d; ++x) acc[i * d + x] += p * v[j * d + x];
    }
  }
}

template <class T>
void load_rows(const T* src, int rows, int d, float mult, float* dst) {
  for (int i = 0; i < rows * d; ++i) dst[i] = to_f32(src[i]) * mult;
}
// Key tile [rows x d] -> transposed [d x BC], zero-padded past `rows`.
template <class T>
void load_transposed(const T* src, int rows, int d, float* dst) {
  for (int p = 0; p < d; ++p)
    for (int j = 0; j < BC; ++j) dst[p * BC + j] = j < rows ? to_f32(src[j * d + p]) : 0.f;
}

// A slot's buffers, carved from one tracked allocation (cpu_flash_slot_bytes(d) bytes).
struct Slot {
  float *q, *dout, *acc;               // BR x d each
  float *kT, *vT, *k, *v, *dk, *dv;    // BC x d each (kT, vT transposed: d x BC)
  float *s, *dp;                       // BR x BC each
  float *m, *l, *lse, *delta;          // BR each
  Slot(float* base, int64_t d) {
    float* x = base;
    for (float** f : {&q, &dout, &acc}) { *f = x; x += BR * d; }
    for (float** f : {&kT, &vT, &k, &v, &dk, &dv}) { *f = x; x += BC * d; }
    for (float** f : {&s, &dp}) { *f = x; x += BR * BC; }
    for (float** f : {&m, &l, &lse, &delta}) { *f = x; x += BR; }
  }
};

// An untyped device pointer with the Tensor-like accessor the kernels use.
struct Ptr {
  const void* p = nullptr;
  template <class T>
  T* as() const { return static_cast<T*>(const_cast<void*>(p)); }
};

// The forward and backward kernels over caller-owned [B, H, N, D] buffers.
class FlashKernel {
 public:
  FlashKernel(const Dims& s, const FlashCpuBuffers& b)
      : s_(s), q_{b.q}, k_{b.k}, v_{b.v}, o_{b.o}, dout_{b.dout}, dq_{b.dq}, dk_{b.dk}, dv_{b.dv} {}

  template <class T>
  void run_forward(float* ws, int64_t slots, float* lse) { forward<T>(ws, slots, lse); }
  template <class T>
  void run_backward(float* ws, int64_t slots, const float* lse, float* delta) { backward<T>(ws, slots, lse, delta); }

 private:
  // Keys [k0, k1) of a query tile [i0, i1) that are not all masked.
  int64_t key_end(int64_t i1) const { return s_.causal ? std::clamp<int64_t>(i1 + s_.n_kv - s_.n, 0, s_.n_kv) : s_.n_kv; }
  int64_t query_begin(int64_t j0) const { return s_.causal ? std::clamp<int64_t>(j0 - (s_.n_kv - s_.n), 0, s_.n) : 0; }

  // Scores of a tile, scaled already through q; -inf past the keys or under the causal mask.
  void mask(float* s, int64_t i0, int rows, int64_t j0, int cols) const {
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < BC; ++j)
        if (j >= cols || (s_.causal && !causal_allows(i0 + i, j0 + j, s_.n, s_.n_kv))) s[i * BC + j] = -INFINITY;
  }

  template <class T>
  void forward(float* ws, int64_t slots, float* lse) {
    if (s_.d == 64) return forward_d<T, 64>(ws, slots, lse);
    if (s_.d == 128) return forward_d<T, 128>(ws, slots, lse);
    return forward_d<T, 0>(ws, slots, lse);
  }

  template <class T, int D>
  void forward_d(float* ws, int64_t slots, float* lse) {
    const int64_t n = s_.n, nk = s_.n_kv, d = s_.d, tiles = (n + BR - 1) / BR;
    const float scale = s_.scale();
    const T *qg = q_.as<T>(), *kg = k_.as<T>(), *vg = v_.as<T>();
    T* og = o_.as<T>();
    constexpr bool f32 = std::is_same_v<T, float>;
#pragma omp parallel for schedule(dynamic) num_threads(std::min<int64_t>(slots, omp_get_max_threads()))
    for (int64_t item = 0; item < s_.b * s_.h * tiles; ++item) {
      Slot w(ws + omp_get_thread_num() * (cpu_flash_slot_bytes(d) / sizeof(float)), d);
      const int64_t bh = item / tiles, i0 = (item % tiles) * BR, b = bh / s_.h;
      const int64_t bkv = b * s_.h_kv + (bh % s_.h) / s_.group();
      const int rows = static_cast<int>(std::min<int64_t>(BR, n - i0));
      // The query tile, scaled and transposed to [d x BR] (zero past `rows`), once per tile.
      const T* qsrc = qg + (bh * n + i0) * d;
      for (int64_t p = 0; p < d; ++p)
        for (int i = 0; i < BR; ++i) w.kT[p * BR + i] = i < rows ? to_f32(qsrc[i * d + p]) * scale : 0.f;
      std::fill_n(w.acc, rows * d, 0.f);
      std::fill_n(w.m, BR, -INFINITY);
      std::fill_n(w.l, BR, 0.f);
      const int64_t kend = key_end(i0 + rows);
      for (int64_t j0 = 0; j0 < kend; j0 += BC) {
        const int cols = static_cast<int>(std::min<int64_t>(BC, nk - j0));
        const float *kt, *vt;
        if constexpr (f32) {
          kt = kg + (bkv * nk + j0) * d;  // fp32 keys and values are read in place
          vt = vg + (bkv * nk + j0) * d;
        } else {
          load_rows(kg + (bkv * nk + j0) * d, cols, d, 1.f, w.k);
          load_rows(vg + (bkv * nk + j0) * d, cols, d, 1.f, w.v);
          kt = w.k;
          vt = w.v;
        }
        tile_kqT<D>(kt, cols, w.kT, d, w.s);
        if (s_.causal && j0 + cols - 1 > i0 + (nk - n))  // the tile crosses the causal diagonal
          for (int j = 0; j < cols; ++j)
            for (int i = 0; i < BR; ++i)
              if (!causal_allows(i0 + i, j0 + j, n, nk)) w.s[j * BR + i] = -INFINITY;
        // Online softmax across the tile's keys, vectorized over its queries (tile_math.hpp).
        float* c = w.lse;  // the slot's lse row doubles as the rescale factors in the forward pass
#pragma omp simd
        for (int i = 0; i < BR; ++i) {
          float mx = w.m[i];
          for (int j = 0; j < cols; ++j) mx = fmaxf(mx, w.s[j * BR + i]);
          c[i] = softmax_rescale(w.m[i], mx);
          w.dp[i] = mx;  // the new running max
        }
        for (int j = 0; j < cols; ++j)
#pragma omp simd
          for (int i = 0; i < BR; ++i) w.s[j * BR + i] = softmax_prob(w.s[j * BR + i], w.dp[i]);
#pragma omp simd
        for (int i = 0; i < BR; ++i) {
          float sum = 0.f;
          for (int j = 0; j < cols; ++j) sum += w.s[j * BR + i];
          w.l[i] = c[i] * w.l[i] + sum;
          w.m[i] = w.dp[i];
        }
        tile_rescale_add_pv<D>(w.s, rows, cols, vt, c, d, w.acc);
      }
      for (int i = 0; i < rows; ++i) {
        const float inv = inverse_row_sum(w.l[i]);
        for (int x = 0; x < d; ++x) og[(bh * n + i0 + i) * d + x] = from_f32<T>(w.acc[i * d + x] * inv);
        if (lse) lse[bh * n + i0 + i] = row_lse(w.m[i], w.l[i]);
      }
    }
  }

  // P and dS of one (query tile, key tile) pair into w.s and w.dp; needs w.q (scaled), w.kT, w.vT,
  // w.dout, w.lse, w.delta.
  void probs_and_score_grads(Slot& w, int64_t i0, int rows, int64_t j0, int cols) const {
    tile_abT(w.q, rows, w.kT, s_.d, w.s);
    mask(w.s, i0, rows, j0, cols);
    tile_abT(w.dout, rows, w.vT, s_.d, w.dp);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < BC; ++j) {
        const float p = prob_from_lse(w.s[i * BC + j], w.lse[i]);
        w.s[i * BC + j] = p;
        w.dp[i * BC + j] = score_grad(p, w.dp[i * BC + j], w.delta[i]);
      }
  }

  template <class T>
  void load_query_side(Slot& w, int64_t bh, int64_t i0, int rows, const float* lse, const float* delta) const {
    const int64_t d = s_.d;
    load_rows(q_.as<T>() + (bh * s_.n + i0) * d, rows, d, s_.scale(), w.q);
    load_rows(dout_.as<T>() + (bh * s_.n + i0) * d, rows, d, 1.f, w.dout);
    std::copy_n(lse + bh * s_.n + i0, rows, w.lse);
    std::copy_n(delta + bh * s_.n + i0, rows, w.delta);
  }

  template <class T>
  void backward(float* ws, int64_t slots, const float* lse, float* delta) {
    const int64_t n = s_.n, nk = s_.n_kv, d = s_.d, qtiles = (n + BR - 1) / BR, ktiles = (nk + BC - 1) / BC;
    const float scale = s_.scale();
    const std::size_t slot_floats = cpu_flash_slot_bytes(d) / sizeof(float);
    const int threads = static_cast<int>(std::min<int64_t>(slots, omp_get_max_threads()));
    const T *og = o_.as<T>(), *dog = dout_.as<T>(), *kg = k_.as<T>(), *vg = v_.as<T>();
    // delta_i = dO_i . O_i
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < s_.rows(); ++r) {
      float acc = 0.f;
      for (int64_t x = 0; x < d; ++x) acc += to_f32(dog[r * d + x]) * to_f32(og[r * d + x]);
      delta[r] = acc;
    }
    // Pass 1: each key tile accumulates dK and dV over its group's query heads and every query tile.
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int64_t item = 0; item < s_.b * s_.h_kv * ktiles; ++item) {
      Slot w(ws + omp_get_thread_num() * slot_floats, d);
      const int64_t bkv = item / ktiles, j0 = (item % ktiles) * BC, b = bkv / s_.h_kv;
      const int cols = static_cast<int>(std::min<int64_t>(BC, nk - j0));
      load_transposed(kg + (bkv * nk + j0) * d, cols, d, w.kT);
      load_transposed(vg + (bkv * nk + j0) * d, cols, d, w.vT);
      std::fill_n(w.dk, BC * d, 0.f);
      std::fill_n(w.dv, BC * d, 0.f);
      for (int64_t g = 0; g < s_.group(); ++g) {
        const int64_t bh = b * s_.h + (bkv % s_.h_kv) * s_.group() + g;
        for (int64_t i0 = query_begin(j0) / BR * BR; i0 < n; i0 += BR) {
          const int rows = static_cast<int>(std::min<int64_t>(BR, n - i0));
          load_query_side<T>(w, bh, i0, rows, lse, delta);
          probs_and_score_grads(w, i0, rows, j0, cols);
          tile_acc_aTb(w.s, rows, cols, w.dout, d, w.dv);   // dV += P^T dO
          tile_acc_aTb(w.dp, rows, cols, w.q, d, w.dk);     // dK += dS^T (scale Q)
        }
      }
      for (int j = 0; j < cols; ++j)
        for (int x = 0; x < d; ++x) {
          dk_.as<T>()[(bkv * nk + j0 + j) * d + x] = from_f32<T>(w.dk[j * d + x]);
          dv_.as<T>()[(bkv * nk + j0 + j) * d + x] = from_f32<T>(w.dv[j * d + x]);
        }
    }
    // Pass 2: each query tile accumulates dQ over the key tiles it sees.
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int64_t item = 0; item < s_.b * s_.h * qtiles; ++item) {
      Slot w(ws + omp_get_thread_num() * slot_floats, d);
      const int64_t bh = item / qtiles, i0 = (item % qtiles) * BR, b = bh / s_.h;
      const int64_t bkv = b * s_.h_kv + (bh % s_.h) / s_.group();
      const int rows = static_cast<int>(std::min<int64_t>(BR, n - i0));
      load_query_side<T>(w, bh, i0, rows, lse, delta);
      std::fill_n(w.acc, rows * d, 0.f);
      const int64_t kend = key_end(i0 + rows);
      for (int64_t j0 = 0; j0 < kend; j0 += BC) {
        const int cols = static_cast<int>(std::min<int64_t>(BC, nk - j0));
        load_transposed(kg + (bkv * nk + j0) * d, cols, d, w.kT);
        load_transposed(vg + (bkv * nk + j0) * d, cols, d, w.vT);
        load_rows(kg + (bkv * nk + j0) * d, cols, d, scale, w.k);
        probs_and_score_grads(w, i0, rows, j0, cols);
        tile_acc_ab(w.dp, rows, cols, w.k, d, w.acc);  // dQ += dS (scale K)
      }
      for (int i = 0; i < rows; ++i)
        for (int x = 0; x < d; ++x) dq_.as<T>()[(bh * n + i0 + i) * d + x] = from_f32<T>(w.acc[i * d + x]);
    }
  }

  const Dims s_;
  Ptr q_, k_, v_, o_, dout_, dq_, dk_, dv_;
};

// The benchmark workload: tracked workspace around the kernels.
class FlashCpu final : public AttnWorkload {
 public:
  using AttnWorkload::AttnWorkload;

  void run() override {
    const int64_t slots = cpu_flash_slots(s_);
    Buffer ws(dev_.memory(), slots * cpu_flash_slot_bytes(s_.d), Tag::workspace);
    Buffer lse, delta;
    if (s_.backward) {
      lse = Buffer(dev_.memory(), s_.rows() * sizeof(float), Tag::activations);
      delta = Buffer(dev_.memory(), s_.rows() * sizeof(float), Tag::workspace);
    }
    const FlashCpuBuffers b{q_.data(), k_.data(), v_.data(), o_.data(), dout_.data(), dq_.data(), dk_.data(), dv_.data()};
    flash_forward_cpu(s_, b, ws.as<float>(), slots, lse.as<float>());
    if (s_.backward) flash_backward_cpu(s_, b, ws.as<float>(), slots, lse.as<float>(), delta.as<float>());
  }
};

template <class F>
void by_dtype(DType t, F&& f) {
  if (t == DType::f32) f(float{});
  else if (t == DType::bf16) f(bf16_t{});
  else if (t == DType::f16) f(f16_t{});
  else throw Error(std::string("flash attention: unsupported dtype ") + dtype_name(t));
}

}  // namespace

void flash_forward_cpu(const Dims& s, const FlashCpuBuffers& b, float* ws, int64_t slots, float* lse) {
  FlashKernel k(s, b);
  by_dtype(s.dtype, [&](auto tag) { k.run_forward<decltype(tag)>(ws, slots, lse); });
}

void flash_backward_cpu(const Dims& s, const FlashCpuBuffers& b, float* ws, int64_t slots, const float* lse,
                        float* delta) {
  FlashKernel k(s, b);
  by_dtype(s.dtype, [&](auto tag) { k.run_backward<decltype(tag)>(ws, slots, lse, delta); });
}

std::unique_ptr<Workload> make_flash_cpu(const AttnProblem& p, Device& dev) { return std::make_unique<FlashCpu>(p, dev); }

MEMTRADE_IMPLEMENTATION(typed_impl("attention", "flash", Role::optimized, Backend::cpu,
                                   "tiled online softmax, O(N) memory, OpenMP", make_flash_cpu))

}  // namespace memtrade::attention
