// FlashAttention-2 style attention on the GPU: fused kernels, no [n, n_kv] buffer.
//
// The bf16 / fp16 forward for d <= 128 runs on the tensor cores (flash_fwd_mma, described at the kernel).
// The other kernels are plain fp32 CUDA (no tensor cores): tiles are staged in shared memory as fp32, and a
// block of 256 threads is viewed as a 16 x 16 grid (tx = threadIdx.x % 16, ty = threadIdx.x / 16) that
// owns the elements (ty + 16 i, tx + 16 j) of every [rows, cols] tile it computes, so each thread keeps
// a small register micro-tile. Tiles are row-padded to kD + 1 (and cols + 1) floats so that the column
// walks of the dot products hit 16 distinct banks.
//
//   forward   (fp32, or d > 128) grid (query tile, b * h). Q tile [Br, D] loaded once; loop over key tiles [Bc, D] up to
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
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstring>
#include <type_traits>

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
// Tensor-core forward for bf16 / fp16 (sm_80+ mma.sync.m16n8k16, fp32 accumulation), head dimensions up
// to kD = 64 or 128 (zero-padded columns add nothing). grid (ceil(n / 64), b * h), 4 warps; each warp owns
// 16 query rows of the block's 64 and keeps everything of them in registers: its Q fragments, its
// 16 x 64 score tile S and its 16 x kD output accumulator. Per key tile of 64: S = Q K^T (K tile in
// shared memory, row-major [64][kD + 8]; the 8-element pad puts the 8 rows an ldmatrix phase reads in
// distinct banks), scale and mask, the online softmax of tile_math.hpp on the rows (a row's 64 scores
// are spread over the 4 lanes of a quad: the max is combined by two shuffles, the sum only at the end),
// then O = c O + P V with P converted to the dtype in registers: the accumulator layout of two adjacent
// 16 x 8 score tiles is the A-operand layout of one 16 x 16 P tile, so P never touches shared memory.
// V's B operand comes transposed out of the row-major V tile through ldmatrix.trans. On an H200 (bf16,
// d = 128, b * h = 16, n = 8192) it runs at 117 TFLOP/s, 15% of cuBLAS's bf16 rate; FlashAttention-3
// reaches about 75% on Hopper with wgmma, TMA and warp-specialised producers, which this does not use.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit inputs; g = lane / 4, t = lane % 4):
//   A (16 x 16): a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..)
//   B (16 x 8):  b0 = (k 2t..2t+1, n g), b1 = (k 2t + 8.., n g)
//   C (16 x 8):  c0, c1 = (g, 2t), (g, 2t + 1); c2, c3 = (g + 8, 2t), (g + 8, 2t + 1)
constexpr int kMmaRows = 64, kMmaKeys = 64, kMmaWarps = 4, kMmaThreads = kMmaWarps * 32;

template <int kD>
constexpr std::size_t mma_fwd_smem_bytes() {
  return 4u * kMmaKeys * (kD + 8) * sizeof(uint16_t);  // K and V tiles, two of each (Q is staged in the first)
}

template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16_t>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 16-bit matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row_addr) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row_addr));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// Two floats to two 16-bit values (round to nearest even) in one register, the first in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, bf16_t>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&u, &v, 4);
  }
  return u;
}

// Rows [row0, row0 + 64) of a row-major [total_rows, d] matrix into dst[64][kD + 8] as 16-bit values;
// rows past total_rows and columns past d are zero. kVec: d % 8 == 0 and 16-byte aligned rows.
template <class T, bool kVec, int kD>
__device__ __forceinline__ void load_tile16(uint16_t* __restrict__ dst, const T* __restrict__ src, int64_t row0,
                                            int64_t total_rows, int d) {
  constexpr int kChunks = kD / 8;  // 8 values (16 bytes) per chunk
  for (int e = threadIdx.x; e < kMmaKeys * kChunks; e += kMmaThreads) {
    const int r = e / kChunks, c = (e % kChunks) * 8;
    const int64_t row = row0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row < total_rows && c < d) {
      const T* s = src + row * d + c;
      if constexpr (kVec) {
        val = __ldg(reinterpret_cast<const uint4*>(s));
      } else {
        uint16_t h[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = c + i < d ? s[i].bits : uint16_t{0};
        memcpy(&val, h, 16);
      }
    }
    *reinterpret_cast<uint4*>(dst + r * (kD + 8) + c) = val;
  }
}

// Starts copying K and V rows [row0, row0 + 64) into their tiles. kVec: asynchronously (cp.async, 16
// bytes a copy, rows past total_rows zero-filled), completed by wait_tiles; otherwise synchronously.
template <class T, bool kVec, int kD>
__device__ __forceinline__ void issue_kv_tiles(uint16_t* ks, uint16_t* vs, const T* kh, const T* vh, int64_t row0,
                                               int64_t total_rows, int d) {
  if constexpr (kVec) {
    constexpr int kChunks = kD / 8;
    for (int e = threadIdx.x; e < kMmaKeys * kChunks; e += kMmaThreads) {
      const int r = e / kChunks, c = (e % kChunks) * 8;
      const int64_t row = row0 + r;
      const bool in = row < total_rows && c < d;
      const int64_t off = in ? row * d + c : 0;  // a valid address even when nothing is read
      const uint32_t bytes = in ? 16u : 0u;      // 0: the 16 bytes are zero-filled
      const auto kd = static_cast<uint32_t>(__cvta_generic_to_shared(ks + r * (kD + 8) + c));
      const auto vd = static_cast<uint32_t>(__cvta_generic_to_shared(vs + r * (kD + 8) + c));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(kd), "l"(kh + off), "r"(bytes));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(vd), "l"(vh + off), "r"(bytes));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  } else {
    load_tile16<T, false, kD>(ks, kh, row0, total_rows, d);
    load_tile16<T, false, kD>(vs, vh, row0, total_rows, d);
  }
}

// Waits until at most kPending of this thread's issued tile copies are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_tiles() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

template <class T, int kD, bool kVec>
__global__ void __launch_bounds__(kMmaThreads)
    flash_fwd_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ o,
                  float* __restrict__ lse, Params p) {
  static_assert(kD % 16 == 0, "head dimension bucket must be a multiple of 16");
  constexpr int kLd = kD + 8;            // row stride of the shared tiles, in 16-bit values
  constexpr int kSTiles = kMmaKeys / 8;  // 16 x 8 score tiles per warp per key tile
  constexpr int kOTiles = kD / 8;        // 16 x 8 output tiles per warp
  extern __shared__ uint4 smem_mma[];
  uint16_t* const tiles = reinterpret_cast<uint16_t*>(smem_mma);  // K0, V0, K1, V1: [64][kLd] each; K0 first holds Q

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, t = lane % 4;
  const int lr = lane % 8, lm = lane / 8;  // ldmatrix: row within, and index of, the lane's matrix
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / p.h, hq = bh % p.h, hk = hq / (p.h / p.h_kv);
  const int64_t kvh = b * p.h_kv + hk;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t qw = q0 + warp * 16;  // the warp's first query row
  const T* kh = k + kvh * p.n_kv * p.d;
  const T* vh = v + kvh * p.n_kv * p.d;

  // Q fragments: the warp's 16 rows x kD, kD / 16 A tiles.
  uint32_t qf[kD / 16][4];
  load_tile16<T, kVec, kD>(tiles, q + bh * p.n * p.d, q0, p.n, p.d);
  __syncthreads();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    ldmatrix_x4<false>(qf[kk], tiles + (warp * 16 + lr + 8 * (lm & 1)) * kLd + kk * 16 + 8 * (lm >> 1));
  __syncthreads();  // every warp has its Q fragments: the first K tile may overwrite them

  float acc[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g + 8; l is this lane's part

  // Key tiles double-buffered: tile i + 1 is copied while tile i is computed.
  const int64_t kv_end = key_end(q0, kMmaRows, p);
  const int64_t ntiles = (kv_end + kMmaKeys - 1) / kMmaKeys;
  if (ntiles > 0) issue_kv_tiles<T, kVec, kD>(tiles, tiles + kMmaKeys * kLd, kh, vh, 0, p.n_kv, p.d);
  for (int64_t it = 0; it < ntiles; ++it) {
    const int64_t kv0 = it * kMmaKeys;
    uint16_t* const ks = tiles + (it & 1) * 2 * kMmaKeys * kLd;
    uint16_t* const vs = ks + kMmaKeys * kLd;
    if (it + 1 < ntiles) {
      uint16_t* const kn = tiles + ((it + 1) & 1) * 2 * kMmaKeys * kLd;
      issue_kv_tiles<T, kVec, kD>(kn, kn + kMmaKeys * kLd, kh, vh, kv0 + kMmaKeys, p.n_kv, p.d);
      wait_tiles<1>();
    } else {
      wait_tiles<0>();
    }
    __syncthreads();  // tile it has landed for every thread's copies

    float s[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
      for (int j = 0; j < kSTiles; j += 2) {  // B tiles of keys 8j.. and 8(j + 1).. at once
        uint32_t bk[4];
        ldmatrix_x4<false>(bk, ks + (8 * j + lr + 8 * (lm >> 1)) * kLd + kk * 16 + 8 * (lm & 1));
        mma_16816<T>(s[j], qf[kk], bk[0], bk[1]);
        mma_16816<T>(s[j + 1], qf[kk], bk[2], bk[3]);
      }

    // Scale; mask where the tile reaches past n_kv or (causal) past the warp's first row's last key.
    const bool edge = kv0 + kMmaKeys > p.n_kv || (p.causal && !causal_allows(qw, kv0 + kMmaKeys - 1, p.n, p.n_kv));
#pragma unroll
    for (int j = 0; j < kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float sc = p.scale * s[j][e];
        s[j][e] = (!edge || visible(qw + g + 8 * (e / 2), kv0 + 8 * j + 2 * t + (e % 2), p)) ? sc : -INFINITY;
      }

    // Online softmax of rows g (elements 0, 1) and g + 8 (elements 2, 3).
    float c[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      c[h] = softmax_rescale(m[h], m_new);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
        s[j][2 * h] = softmax_prob(s[j][2 * h], m_new);
        s[j][2 * h + 1] = softmax_prob(s[j][2 * h + 1], m_new);
        sum += s[j][2 * h] + s[j][2 * h + 1];
      }
      l[h] = c[h] * l[h] + sum;
      m[h] = m_new;
    }
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      acc[j][0] *= c[0];
      acc[j][1] *= c[0];
      acc[j][2] *= c[1];
      acc[j][3] *= c[1];
    }

    // O += P V, 16 keys per step: P's A fragment from score tiles 2kk and 2kk + 1.
#pragma unroll
    for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
      const uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int j = 0; j < kOTiles; j += 2) {  // B tiles of output columns 8j.. and 8(j + 1)..
        uint32_t bv[4];
        ldmatrix_x4<true>(bv, vs + (kk * 16 + lr + 8 * (lm & 1)) * kLd + 8 * j + 8 * (lm >> 1));
        mma_16816<T>(acc[j], pa, bv[0], bv[1]);
        mma_16816<T>(acc[j + 1], pa, bv[2], bv[3]);
      }
    }
    __syncthreads();  // this buffer is consumed before tile it + 2 is copied into it
  }

  // The row sums over the quad, then O / l and lse.
  T* oh = o + bh * p.n * p.d;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const int64_t qi = qw + g + 8 * h;
    if (qi >= p.n) continue;
    const float inv = inverse_row_sum(l[h]);
#pragma unroll
    for (int j = 0; j < kOTiles; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 8 * j + 2 * t + e;
        if (col < p.d) oh[qi * p.d + col] = from_f32<T>(acc[j][2 * h + e] * inv);
      }
    if (lse != nullptr && t == 0) lse[bh * p.n + qi] = row_lse(m[h], l[h]);
  }
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

    if constexpr (!std::is_same_v<T, float> && kD <= 128) {  // forward on the tensor cores
      const bool vec = p.d % 8 == 0 && aligned16(q_.data()) && aligned16(k_.data()) && aligned16(v_.data());
      if (vec) forward_mma<T, kD, true>(p, bh, lse);
      else forward_mma<T, kD, false>(p, bh, lse);
    } else {  // forward
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

  static bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

  template <class T, int kD, bool kVec>
  void forward_mma(const Params& p, unsigned bh, float* lse) {
    constexpr std::size_t smem = mma_fwd_smem_bytes<kD>();
    auto* kernel = &flash_fwd_mma<T, kD, kVec>;
    allow_smem(kernel, smem, cuda_);
    const dim3 grid(grid_count(s_.n, kMmaRows, INT_MAX, "query tiles"), bh);
    kernel<<<grid, kMmaThreads, smem, cuda_.stream()>>>(q_.as<T>(), k_.as<T>(), v_.as<T>(), o_.as<T>(),
                                                         s_.backward ? lse : nullptr, p);
    MT_CUDA_LAUNCH();
  }

  CudaDevice& cuda_;
};

}  // namespace

MEMTRADE_IMPLEMENTATION(typed_impl<AttnProblem>("attention", "flash", Role::optimized, Backend::cuda,
                                                "fused kernels: tensor-core (mma.sync) forward for bf16/fp16, d <= 128; fp32 tiles otherwise and for the backward",
                                                [](const AttnProblem& p, Device& dev) -> std::unique_ptr<Workload> {
                                                  return std::make_unique<FlashCuda>(p, dev);
                                                }))

}  // namespace memtrade::attention
