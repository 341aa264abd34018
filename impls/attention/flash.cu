// FlashAttention-2 style attention on the GPU: fused kernels, no [n, n_kv] buffer.
//
// Every kernel is plain fp32 CUDA (no tensor cores): tiles are staged in shared memory as fp32, and a
// block of 256 threads is viewed as a 16 x 16 grid (tx = threadIdx.x % 16, ty = threadIdx.x / 16) that
// owns the elements (ty + 16 i, tx + 16 j) of every [rows, cols] tile it computes, so each thread keeps
// a small register micro-tile. Tiles are row-padded to kD + 1 (and cols + 1) floats so that the column
// walks of the dot products hit 16 distinct banks.
//
//   forward   grid (query tile, b * h). Q tile [Br, D] loaded once; loop over key tiles [Bc, D] up to
//             the causal limit: S = scale Q K^T (masked -inf), one thread per row runs
//             attention::online_softmax_tile on its row of S (turning it into p, updating m and l, returning
//             the rescale factor c), then acc = c acc + P V. O = acc * inverse_row_sum(l); with the
//             backward pass lse = row_lse(m, l) goes to a [b * h * n] fp32 buffer.
//   delta     one warp per query row: delta_i = dO_i . O_i (O as stored, in the dtype).
//   dK, dV    grid (key tile, b * h_kv). K, V tile loaded once; loop over the group's query heads and
//             the query tiles that can see the key tile: p = prob_from_lse(s, lse), dp = dO . v,
//             ds = score_grad(p, dp, delta); dV += P^T dO, dK += dS^T Q; written once: deterministic.
//   dQ        grid (query tile, b * h). Q, dO tiles loaded once; loop over key tiles: dQ += dS K.
//
// Tile shapes per head-dimension bucket kD (d <= 64, <= 128, <= 256) are in FlashCfg; all of them need
// more than 48 KiB of shared memory, so it is dynamic (cudaFuncSetAttribute) and checked against the
// device's opt-in limit (A100: 163 KiB, H100/H200: 227 KiB).
//
// Memory: the forward pass allocates nothing. With the backward pass, run() allocates lse (b*h*n fp32,
// tag activations) and delta (b*h*n fp32, tag workspace) at its start; nothing else.
#include <climits>

#include "harness/cuda_device.hpp"
#include "impls/attention/attention.hpp"
#include "impls/attention/tile_math.hpp"

namespace memtrade::attention {

namespace {

constexpr int kThreads = 256;  // every flash kernel: a 16 x 16 thread grid
constexpr int kGrid = 16;
constexpr int kMinBlocks = 2;  // launch bounds: 2 blocks of 256 threads per SM, i.e. at most 128 registers
constexpr int kDeltaWarps = 8;  // rows per block of the delta kernel

// Tile sizes (rows of each tile; all multiples of 16).
//   fwd_q x fwd_k        forward: query rows per block x keys per tile
//   dkv_k x dkv_q        dK/dV:   keys per block x query rows per tile
//   dq_q x dq_k          dQ:      query rows per block x keys per tile
template <int kD>
struct FlashCfg;
template <>
struct FlashCfg<64> {
  static constexpr int fwd_q = 64, fwd_k = 64, dkv_k = 64, dkv_q = 64, dq_q = 64, dq_k = 64;
};
template <>
struct FlashCfg<128> {
  static constexpr int fwd_q = 64, fwd_k = 64, dkv_k = 64, dkv_q = 32, dq_q = 64, dq_k = 32;
};
template <>
struct FlashCfg<256> {
  static constexpr int fwd_q = 32, fwd_k = 32, dkv_k = 32, dkv_q = 32, dq_q = 32, dq_k = 32;
};

// Shared-memory footprints in floats (layouts in the kernels).
template <int kD, int kBr, int kBc>
constexpr int fwd_smem_floats() {
  return kBr * (kD + 1) + 2 * kBc * (kD + 1) + kBr * (kBc + 1) + 3 * kBr;
}
template <int kD, int kBc, int kBr>
constexpr int dkv_smem_floats() {
  return 2 * kBc * (kD + 1) + 2 * kBr * (kD + 1) + 2 * kBc * (kBr + 1) + 2 * kBr;
}
template <int kD, int kBr, int kBc>
constexpr int dq_smem_floats() {
  return 2 * kBr * (kD + 1) + 2 * kBc * (kD + 1) + kBr * (kBc + 1) + 2 * kBr;
}

// Sizes the kernels need; plain values so that they can be passed by value.
struct Params {
  int64_t h, h_kv;  // query heads, kv heads (h_kv divides h)
  int64_t n, n_kv;  // query rows, key rows per head
  int d;            // head dimension (<= kD of the instantiation)
  float scale;
  bool causal;
};

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Rows [row0, row0 + kRows) of a row-major [total_rows, d] matrix into dst[kRows][kD + 1] as fp32. Rows
// at or past total_rows and columns at or past d are zero, so every float of the tile is defined.
template <class T, int kRows, int kD>
__device__ __forceinline__ void load_tile(float* __restrict__ dst, const T* __restrict__ src, int64_t row0,
                                          int64_t total_rows, int d) {
  for (int e = threadIdx.x; e < kRows * kD; e += kThreads) {
    const int r = e / kD, k = e % kD;
    const int64_t row = row0 + r;
    dst[r * (kD + 1) + k] = (row < total_rows && k < d) ? to_f32(src[row * d + k]) : 0.f;
  }
}

// One past the last key a query tile [q0, q0 + rows) must visit: keys at or past it are masked for every
// row of the tile (causal), or n_kv. May be <= 0: the whole tile is masked.
__device__ __forceinline__ int64_t key_end(int64_t q0, int rows, const Params& p) {
  if (!p.causal) return p.n_kv;
  const int64_t last_row = min64(q0 + rows, p.n) - 1;  // key j is visible to row i iff j <= i + n_kv - n
  return max64(0, min64(p.n_kv, last_row + (p.n_kv - p.n) + 1));
}

// Whether query row qi sees key kj (both in range, then the causal mask).
__device__ __forceinline__ bool visible(int64_t qi, int64_t kj, const Params& p) {
  return qi < p.n && kj < p.n_kv && (!p.causal || causal_allows(qi, kj, p.n, p.n_kv));
}

// ---------------------------------------------------------------------------------------------------
// Forward. grid (ceil(n / kBr), b * h), kThreads threads, fwd_smem_floats * 4 bytes of dynamic smem.
template <class T, int kD, int kBr, int kBc>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flash_fwd(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
              float* __restrict__ lse, Params p) {
  static_assert(kBr % kGrid == 0 && kBc % kGrid == 0 && kD % kGrid == 0, "tiles must be multiples of 16");
  constexpr int kLd = kD + 1, kSld = kBc + 1;
  constexpr int kRi = kBr / kGrid, kCj = kBc / kGrid, kDj = kD / kGrid;
  extern __shared__ float smem[];
  float* qs = smem;              // [kBr][kLd]
  float* ks = qs + kBr * kLd;    // [kBc][kLd]
  float* vs = ks + kBc * kLd;    // [kBc][kLd]
  float* ss = vs + kBc * kLd;    // [kBr][kSld]: scores, then probabilities
  float* m_s = ss + kBr * kSld;  // [kBr] running max
  float* l_s = m_s + kBr;        // [kBr] running sum
  float* c_s = l_s + kBr;        // [kBr] rescale factor of the current tile

  const int tx = threadIdx.x % kGrid, ty = threadIdx.x / kGrid;
  const int64_t bh = blockIdx.y;  // b * h + hq
  const int64_t b = bh / p.h, hq = bh % p.h, hk = hq / (p.h / p.h_kv);
  const int64_t kvh = b * p.h_kv + hk;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBr;
  const T* qh = q + bh * p.n * p.d;
  const T* kh = k + kvh * p.n_kv * p.d;
  const T* vh = v + kvh * p.n_kv * p.d;

  load_tile<T, kBr, kD>(qs, qh, q0, p.n, p.d);
  if (threadIdx.x < kBr) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.f;
  }
  float acc[kRi][kDj];
#pragma unroll
  for (int i = 0; i < kRi; ++i)
#pragma unroll
    for (int j = 0; j < kDj; ++j) acc[i][j] = 0.f;

  const int64_t kv_end = key_end(q0, kBr, p);
  for (int64_t kv0 = 0; kv0 < kv_end; kv0 += kBc) {
    const int count = static_cast<int>(min64(kBc, kv_end - kv0));  // keys of this tile to visit
    __syncthreads();  // the previous tile's ks, vs, ss are consumed (first time: qs, m_s, l_s are written)
    load_tile<T, kBc, kD>(ks, kh, kv0, p.n_kv, p.d);
    load_tile<T, kBc, kD>(vs, vh, kv0, p.n_kv, p.d);
    __syncthreads();

    // S = scale Q K^T for rows ty + 16 i, keys tx + 16 j; masked -inf.
    float dot[kRi][kCj];
#pragma unroll
    for (int i = 0; i < kRi; ++i)
#pragma unroll
      for (int j = 0; j < kCj; ++j) dot[i][j] = 0.f;
    for (int kk = 0; kk < p.d; ++kk) {
      float a[kRi], bk[kCj];
#pragma unroll
      for (int i = 0; i < kRi; ++i) a[i] = qs[(ty + kGrid * i) * kLd + kk];
#pragma unroll
      for (int j = 0; j < kCj; ++j) bk[j] = ks[(tx + kGrid * j) * kLd + kk];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kCj; ++j) dot[i][j] = fmaf(a[i], bk[j], dot[i][j]);
    }
#pragma unroll
    for (int i = 0; i < kRi; ++i)
#pragma unroll
      for (int j = 0; j < kCj; ++j) {
        const int r = ty + kGrid * i, c = tx + kGrid * j;
        const bool ok = c < count && visible(q0 + r, kv0 + c, p);
        ss[r * kSld + c] = ok ? p.scale * dot[i][j] : -INFINITY;
      }
    __syncthreads();

    // Online softmax: one thread per row rewrites its scores into p.
    if (threadIdx.x < kBr) {
      const int r = threadIdx.x;
      c_s[r] = online_softmax_tile(ss + r * kSld, count, m_s[r], l_s[r]);
    }
    __syncthreads();

    // acc = c acc + P V for rows ty + 16 i, columns tx + 16 j.
#pragma unroll
    for (int i = 0; i < kRi; ++i) {
      const float c = c_s[ty + kGrid * i];
#pragma unroll
      for (int j = 0; j < kDj; ++j) acc[i][j] *= c;
    }
    for (int c = 0; c < count; ++c) {
      float pr[kRi], vr[kDj];
#pragma unroll
      for (int i = 0; i < kRi; ++i) pr[i] = ss[(ty + kGrid * i) * kSld + c];
#pragma unroll
      for (int j = 0; j < kDj; ++j) vr[j] = vs[c * kLd + tx + kGrid * j];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kDj; ++j) acc[i][j] = fmaf(pr[i], vr[j], acc[i][j]);
    }
  }
  __syncthreads();  // m_s, l_s final (also when no key tile was visited)

  T* oh = o + bh * p.n * p.d;
#pragma unroll
  for (int i = 0; i < kRi; ++i) {
    const int r = ty + kGrid * i;
    const int64_t qi = q0 + r;
    if (qi >= p.n) continue;
    const float inv = inverse_row_sum(l_s[r]);
#pragma unroll
    for (int j = 0; j < kDj; ++j) {
      const int col = tx + kGrid * j;
      if (col < p.d) oh[qi * p.d + col] = from_f32<T>(acc[i][j] * inv);
    }
  }
  if (lse != nullptr && threadIdx.x < kBr && q0 + threadIdx.x < p.n)
    lse[bh * p.n + q0 + threadIdx.x] = row_lse(m_s[threadIdx.x], l_s[threadIdx.x]);
}

// ---------------------------------------------------------------------------------------------------
// delta_i = dO_i . O_i, one warp per row. grid ceil(rows / kDeltaWarps), kDeltaWarps * 32 threads.
template <class T>
__global__ void flash_delta(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ delta,
                            int64_t rows, int d) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kDeltaWarps + warp;
  if (row >= rows) return;  // uniform across the warp
  float sum = 0.f;
  for (int k = lane; k < d; k += 32) sum = fmaf(to_f32(dout[row * d + k]), to_f32(o[row * d + k]), sum);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) delta[row] = sum;
}

// ---------------------------------------------------------------------------------------------------
// The S and dP tiles both backward kernels recompute, from shared-memory tiles of row stride kLd: for
// a-rows ta + 16 i and b-rows tb + 16 j, s[i][j] = a1_row . b1_row and dp[i][j] = a2_row . b2_row over
// d columns ({a1, a2, b1, b2} = {K, V, Q, dO} in dK/dV, {Q, dO, K, V} in dQ; the products commute, so
// both orders give the same bits).
template <int kA, int kB, int kLd>
__device__ __forceinline__ void score_and_dp_dots(const float* a1, const float* a2, const float* b1, const float* b2,
                                                  int ta, int tb, int64_t d, float (&s)[kA][kB], float (&dp)[kA][kB]) {
#pragma unroll
  for (int i = 0; i < kA; ++i)
#pragma unroll
    for (int j = 0; j < kB; ++j) s[i][j] = dp[i][j] = 0.f;
  for (int kk = 0; kk < d; ++kk) {
    float x1[kA], x2[kA], y1[kB], y2[kB];
#pragma unroll
    for (int i = 0; i < kA; ++i) {
      x1[i] = a1[(ta + kGrid * i) * kLd + kk];
      x2[i] = a2[(ta + kGrid * i) * kLd + kk];
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      y1[j] = b1[(tb + kGrid * j) * kLd + kk];
      y2[j] = b2[(tb + kGrid * j) * kLd + kk];
    }
#pragma unroll
    for (int i = 0; i < kA; ++i)
#pragma unroll
      for (int j = 0; j < kB; ++j) {
        s[i][j] = fmaf(x1[i], y1[j], s[i][j]);
        dp[i][j] = fmaf(x2[i], y2[j], dp[i][j]);
      }
  }
}

// ---------------------------------------------------------------------------------------------------
// dK, dV. grid (ceil(n_kv / kBc), b * h_kv), kThreads threads, dkv_smem_floats * 4 bytes of dynamic smem.
template <class T, int kD, int kBc, int kBr>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flash_bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                   T* __restrict__ dk, T* __restrict__ dv, Params p) {
  static_assert(kBr % kGrid == 0 && kBc % kGrid == 0 && kD % kGrid == 0, "tiles must be multiples of 16");
  constexpr int kLd = kD + 1, kPld = kBr + 1;
  constexpr int kCi = kBc / kGrid, kRj = kBr / kGrid, kDj = kD / kGrid;
  extern __shared__ float smem[];
  float* ks = smem;                  // [kBc][kLd]
  float* vs = ks + kBc * kLd;        // [kBc][kLd]
  float* qs = vs + kBc * kLd;        // [kBr][kLd]
  float* dos = qs + kBr * kLd;       // [kBr][kLd]
  float* ps = dos + kBr * kLd;       // [kBc][kPld]: P^T
  float* dss = ps + kBc * kPld;      // [kBc][kPld]: dS^T
  float* lse_s = dss + kBc * kPld;   // [kBr]
  float* delta_s = lse_s + kBr;      // [kBr]

  const int tx = threadIdx.x % kGrid, ty = threadIdx.x / kGrid;
  const int64_t kvh = blockIdx.y;  // b * h_kv + hk
  const int64_t b = kvh / p.h_kv, hk = kvh % p.h_kv;
  const int64_t group = p.h / p.h_kv;
  const int64_t kv0 = static_cast<int64_t>(blockIdx.x) * kBc;
  load_tile<T, kBc, kD>(ks, k + kvh * p.n_kv * p.d, kv0, p.n_kv, p.d);
  load_tile<T, kBc, kD>(vs, v + kvh * p.n_kv * p.d, kv0, p.n_kv, p.d);

  float dk_acc[kCi][kDj], dv_acc[kCi][kDj];
#pragma unroll
  for (int i = 0; i < kCi; ++i)
#pragma unroll
    for (int j = 0; j < kDj; ++j) dk_acc[i][j] = dv_acc[i][j] = 0.f;

  // Query tiles entirely before the first query that sees key kv0 are masked (causal): start after them.
  int64_t q_begin = 0;
  if (p.causal) {
    const int64_t first = kv0 - (p.n_kv - p.n);  // smallest i with kv0 <= i + n_kv - n
    q_begin = first <= 0 ? 0 : (first / kBr) * kBr;
  }

  for (int64_t r_h = 0; r_h < group; ++r_h) {
    const int64_t qbh = b * p.h + hk * group + r_h;  // b * h + query head
    const T* qh = q + qbh * p.n * p.d;
    const T* doh = dout + qbh * p.n * p.d;
    for (int64_t q0 = q_begin; q0 < p.n; q0 += kBr) {
      __syncthreads();  // previous tile's qs, dos, ps, dss consumed (first time: ks, vs are written)
      load_tile<T, kBr, kD>(qs, qh, q0, p.n, p.d);
      load_tile<T, kBr, kD>(dos, doh, q0, p.n, p.d);
      if (threadIdx.x < kBr) {
        const int64_t qi = q0 + threadIdx.x;
        lse_s[threadIdx.x] = qi < p.n ? lse[qbh * p.n + qi] : INFINITY;
        delta_s[threadIdx.x] = qi < p.n ? delta[qbh * p.n + qi] : 0.f;
      }
      __syncthreads();

      // For keys ty + 16 i and query rows tx + 16 j: s = scale q.k, dp = dO.v.
      float sdot[kCi][kRj], pdot[kCi][kRj];
      score_and_dp_dots<kCi, kRj, kLd>(ks, vs, qs, dos, ty, tx, p.d, sdot, pdot);
#pragma unroll
      for (int i = 0; i < kCi; ++i)
#pragma unroll
        for (int j = 0; j < kRj; ++j) {
          const int c = ty + kGrid * i, r = tx + kGrid * j;
          const float s = visible(q0 + r, kv0 + c, p) ? p.scale * sdot[i][j] : -INFINITY;
          const float pr = prob_from_lse(s, lse_s[r]);
          ps[c * kPld + r] = pr;
          dss[c * kPld + r] = score_grad(pr, pdot[i][j], delta_s[r]);
        }
      __syncthreads();

      // dV += P^T dO, dK += dS^T Q for keys ty + 16 i, columns tx + 16 j (rows past n have p = ds = 0).
      const int rows = static_cast<int>(min64(kBr, p.n - q0));
      for (int r = 0; r < rows; ++r) {
        float pc[kCi], dc[kCi], dor[kDj], qrow[kDj];
#pragma unroll
        for (int i = 0; i < kCi; ++i) {
          pc[i] = ps[(ty + kGrid * i) * kPld + r];
          dc[i] = dss[(ty + kGrid * i) * kPld + r];
        }
#pragma unroll
        for (int j = 0; j < kDj; ++j) {
          dor[j] = dos[r * kLd + tx + kGrid * j];
          qrow[j] = qs[r * kLd + tx + kGrid * j];
        }
#pragma unroll
        for (int i = 0; i < kCi; ++i)
#pragma unroll
          for (int j = 0; j < kDj; ++j) {
            dv_acc[i][j] = fmaf(pc[i], dor[j], dv_acc[i][j]);
            dk_acc[i][j] = fmaf(dc[i], qrow[j], dk_acc[i][j]);
          }
      }
    }
  }

  T* dkh = dk + kvh * p.n_kv * p.d;
  T* dvh = dv + kvh * p.n_kv * p.d;
#pragma unroll
  for (int i = 0; i < kCi; ++i) {
    const int64_t kj = kv0 + ty + kGrid * i;
    if (kj >= p.n_kv) continue;
#pragma unroll
    for (int j = 0; j < kDj; ++j) {
      const int col = tx + kGrid * j;
      if (col < p.d) {
        dkh[kj * p.d + col] = from_f32<T>(p.scale * dk_acc[i][j]);
        dvh[kj * p.d + col] = from_f32<T>(dv_acc[i][j]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// dQ. grid (ceil(n / kBr), b * h), kThreads threads, dq_smem_floats * 4 bytes of dynamic smem.
template <class T, int kD, int kBr, int kBc>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    flash_bwd_dq(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                 T* __restrict__ dq, Params p) {
  static_assert(kBr % kGrid == 0 && kBc % kGrid == 0 && kD % kGrid == 0, "tiles must be multiples of 16");
  constexpr int kLd = kD + 1, kSld = kBc + 1;
  constexpr int kRi = kBr / kGrid, kCj = kBc / kGrid, kDj = kD / kGrid;
  extern __shared__ float smem[];
  float* qs = smem;                  // [kBr][kLd]
  float* dos = qs + kBr * kLd;       // [kBr][kLd]
  float* ks = dos + kBr * kLd;       // [kBc][kLd]
  float* vs = ks + kBc * kLd;        // [kBc][kLd]
  float* dss = vs + kBc * kLd;       // [kBr][kSld]
  float* lse_s = dss + kBr * kSld;   // [kBr]
  float* delta_s = lse_s + kBr;      // [kBr]

  const int tx = threadIdx.x % kGrid, ty = threadIdx.x / kGrid;
  const int64_t bh = blockIdx.y;  // b * h + hq
  const int64_t b = bh / p.h, hq = bh % p.h, hk = hq / (p.h / p.h_kv);
  const int64_t kvh = b * p.h_kv + hk;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBr;
  const T* kh = k + kvh * p.n_kv * p.d;
  const T* vh = v + kvh * p.n_kv * p.d;

  load_tile<T, kBr, kD>(qs, q + bh * p.n * p.d, q0, p.n, p.d);
  load_tile<T, kBr, kD>(dos, dout + bh * p.n * p.d, q0, p.n, p.d);
  if (threadIdx.x < kBr) {
    const int64_t qi = q0 + threadIdx.x;
    lse_s[threadIdx.x] = qi < p.n ? lse[bh * p.n + qi] : INFINITY;
    delta_s[threadIdx.x] = qi < p.n ? delta[bh * p.n + qi] : 0.f;
  }

  float acc[kRi][kDj];
#pragma unroll
  for (int i = 0; i < kRi; ++i)
#pragma unroll
    for (int j = 0; j < kDj; ++j) acc[i][j] = 0.f;

  const int64_t kv_end = key_end(q0, kBr, p);
  for (int64_t kv0 = 0; kv0 < kv_end; kv0 += kBc) {
    const int count = static_cast<int>(min64(kBc, kv_end - kv0));
    __syncthreads();  // previous tile's ks, vs, dss consumed (first time: qs, dos, lse_s, delta_s written)
    load_tile<T, kBc, kD>(ks, kh, kv0, p.n_kv, p.d);
    load_tile<T, kBc, kD>(vs, vh, kv0, p.n_kv, p.d);
    __syncthreads();

    // For rows ty + 16 i and keys tx + 16 j: s = scale q.k, dp = dO.v, ds.
    float sdot[kRi][kCj], pdot[kRi][kCj];
    score_and_dp_dots<kRi, kCj, kLd>(qs, dos, ks, vs, ty, tx, p.d, sdot, pdot);
#pragma unroll
    for (int i = 0; i < kRi; ++i)
#pragma unroll
      for (int j = 0; j < kCj; ++j) {
        const int r = ty + kGrid * i, c = tx + kGrid * j;
        const bool ok = c < count && visible(q0 + r, kv0 + c, p);
        const float s = ok ? p.scale * sdot[i][j] : -INFINITY;
        const float pr = prob_from_lse(s, lse_s[r]);
        dss[r * kSld + c] = score_grad(pr, pdot[i][j], delta_s[r]);
      }
    __syncthreads();

    // dQ += dS K for rows ty + 16 i, columns tx + 16 j (scaled at the end).
    for (int c = 0; c < count; ++c) {
      float dsr[kRi], kc[kDj];
#pragma unroll
      for (int i = 0; i < kRi; ++i) dsr[i] = dss[(ty + kGrid * i) * kSld + c];
#pragma unroll
      for (int j = 0; j < kDj; ++j) kc[j] = ks[c * kLd + tx + kGrid * j];
#pragma unroll
      for (int i = 0; i < kRi; ++i)
#pragma unroll
        for (int j = 0; j < kDj; ++j) acc[i][j] = fmaf(dsr[i], kc[j], acc[i][j]);
    }
  }

  T* dqh = dq + bh * p.n * p.d;
#pragma unroll
  for (int i = 0; i < kRi; ++i) {
    const int64_t qi = q0 + ty + kGrid * i;
    if (qi >= p.n) continue;
#pragma unroll
    for (int j = 0; j < kDj; ++j) {
      const int col = tx + kGrid * j;
      if (col < p.d) dqh[qi * p.d + col] = from_f32<T>(p.scale * acc[i][j]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------

unsigned grid_count(int64_t count, int64_t per_block, int64_t limit, const char* what) {
  const int64_t blocks = (count + per_block - 1) / per_block;
  MT_CHECK(blocks >= 1 && blocks <= limit, std::string("flash attention (cuda): too many blocks for ") + what);
  return static_cast<unsigned>(blocks);
}

// Allows `kernel` its dynamic shared memory (beyond the 48 KiB default) after checking the device has it.
template <class Kernel>
void allow_smem(Kernel* kernel, std::size_t bytes, const CudaDevice& dev) {
  const std::size_t optin = dev.props().sharedMemPerBlockOptin;
  MT_CHECK(bytes <= optin, "flash attention (cuda): needs " + std::to_string(bytes) +
                               " bytes of shared memory per block, the device allows " + std::to_string(optin));
  MT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

class FlashCuda final : public AttnWorkload {
 public:
  FlashCuda(const AttnProblem& p, Device& dev) : AttnWorkload(p, dev), cuda_(as_cuda(dev)) {
    MT_CHECK(s_.d >= 1 && s_.d <= 256, "flash attention (cuda): head dimension d must be in [1, 256]");
  }

  void run() override {
    // The only temporaries: lse (activations) and delta (workspace), with the backward pass.
    const std::size_t row_bytes = static_cast<std::size_t>(s_.rows()) * sizeof(float);
    Buffer lse = s_.backward ? Buffer(dev_.memory(), row_bytes, Tag::activations) : Buffer();
    Buffer delta = s_.backward ? Buffer(dev_.memory(), row_bytes, Tag::workspace) : Buffer();

    auto by_dim = [&](auto tag) {
      using T = decltype(tag);
      if (s_.d <= 64) run_typed<T, 64>(lse.as<float>(), delta.as<float>());
      else if (s_.d <= 128) run_typed<T, 128>(lse.as<float>(), delta.as<float>());
      else run_typed<T, 256>(lse.as<float>(), delta.as<float>());
    };
    if (s_.dtype == DType::f32) by_dim(float{});
    else if (s_.dtype == DType::bf16) by_dim(bf16_t{});
    else if (s_.dtype == DType::f16) by_dim(f16_t{});
    else throw Error("flash attention (cuda): unsupported dtype " + std::string(dtype_name(s_.dtype)));
  }

 private:
  template <class T, int kD>
  void run_typed(float* lse, float* delta) {
    using Cfg = FlashCfg<kD>;
    const Params p{s_.h, s_.h_kv, s_.n, s_.n_kv, static_cast<int>(s_.d), s_.scale(), s_.causal};
    const cudaStream_t st = cuda_.stream();
    const unsigned bh = grid_count(s_.b * s_.h, 1, 65535, "b * h");
    const unsigned bkv = grid_count(s_.b * s_.h_kv, 1, 65535, "b * h_kv");

    {  // forward
      constexpr int kBr = Cfg::fwd_q, kBc = Cfg::fwd_k;
      constexpr std::size_t smem = sizeof(float) * fwd_smem_floats<kD, kBr, kBc>();
      auto* kernel = &flash_fwd<T, kD, kBr, kBc>;
      allow_smem(kernel, smem, cuda_);
      const dim3 grid(grid_count(s_.n, kBr, INT_MAX, "query tiles"), bh);
      kernel<<<grid, kThreads, smem, st>>>(q_.as<T>(), k_.as<T>(), v_.as<T>(), o_.as<T>(),
                                           s_.backward ? lse : nullptr, p);
      MT_CUDA_LAUNCH();
    }
    if (!s_.backward) return;

    {  // delta = rowsum(dO * O)
      const unsigned blocks = grid_count(s_.rows(), kDeltaWarps, INT_MAX, "delta rows");
      flash_delta<T><<<blocks, kDeltaWarps * 32, 0, st>>>(o_.as<T>(), dout_.as<T>(), delta, s_.rows(), p.d);
      MT_CUDA_LAUNCH();
    }
    {  // dK, dV
      constexpr int kBc = Cfg::dkv_k, kBr = Cfg::dkv_q;
      constexpr std::size_t smem = sizeof(float) * dkv_smem_floats<kD, kBc, kBr>();
      auto* kernel = &flash_bwd_dkdv<T, kD, kBc, kBr>;
      allow_smem(kernel, smem, cuda_);
      const dim3 grid(grid_count(s_.n_kv, kBc, INT_MAX, "key tiles"), bkv);
      kernel<<<grid, kThreads, smem, st>>>(q_.as<T>(), k_.as<T>(), v_.as<T>(), dout_.as<T>(), lse, delta,
                                           dk_.as<T>(), dv_.as<T>(), p);
      MT_CUDA_LAUNCH();
    }
    {  // dQ
      constexpr int kBr = Cfg::dq_q, kBc = Cfg::dq_k;
      constexpr std::size_t smem = sizeof(float) * dq_smem_floats<kD, kBr, kBc>();
      auto* kernel = &flash_bwd_dq<T, kD, kBr, kBc>;
      allow_smem(kernel, smem, cuda_);
      const dim3 grid(grid_count(s_.n, kBr, INT_MAX, "query tiles"), bh);
      kernel<<<grid, kThreads, smem, st>>>(q_.as<T>(), k_.as<T>(), v_.as<T>(), dout_.as<T>(), lse, delta,
                                           dq_.as<T>(), p);
      MT_CUDA_LAUNCH();
    }
  }

  CudaDevice& cuda_;
};

}  // namespace

MEMTRADE_IMPLEMENTATION(typed_impl<AttnProblem>("attention", "flash", Role::optimized, Backend::cuda,
                                                "fused tiled forward and backward kernels",
                                                [](const AttnProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                  return std::make_unique<FlashCuda>(p, dev);
                                                }))

}  // namespace memtrade::attention
