// The CUDA quantized-matvec kernels (matvec.cu launches them; matvec.hpp describes the scheme). The same
// code also compiles as host C++ under the tests' CUDA emulation (tests/cuda_emulation.hpp: each CUDA
// thread a fiber, warps meeting at each shuffle), so that CPU-only CI runs the kernels' indexing and
// arithmetic (not their memory model or speed) against the float64 reference. Device code here keeps to
// what the emulation provides: threadIdx.x, blockIdx.x, __shared__ arrays, __syncthreads,
// __shfl_xor_sync, __ldg, __int_as_float, __byte_perm, uint2/uint4/float4, fmaf.
//
// Fast path (rows in 16-byte-aligned chunks): a block of 256 threads computes kBlockRows = 8 rows. Its
// threads split the row into chunks of 16 codes (16 bytes of int8 / fp8, 8 bytes of the 4-bit formats),
// thread i taking chunks i, i + 256, ...; for each chunk it loads its 16 x values once (four 128-bit
// loads) and the chunk of all 8 rows (8 independent loads in flight), decodes the codes in registers
// (unscaled_chunk) and accumulates in fp32; a chunk inside one group applies the group's scale once to its
// partial sum. Per row, the threads' sums are combined by warp shuffles and then across the 8 warps in
// shared memory. At 4096 x 4096 that is 512 blocks with one chunk per thread and row (each thread has 8
// loads in flight), and x is read 8 times less often than with one row per warp. With an integer-to-float
// conversion per code this reached 21% (int8) and 9% (int4) of an H200's copy bandwidth: the 4-bit decode,
// not memory, bounded it. Other layouts: one warp per row, group by group, one code at a time. The dense
// fp32 / bf16 baselines have a kernel of the same shape.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/dtype.hpp"
#include "impls/quant/formats.hpp"

namespace memtrade::quant::matvec_kernels {

constexpr int kWarpsPerBlock = 8;

template <Format F>
constexpr bool kFourBit = four_bit(F);

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// The unscaled value u of a code (weight = scale * u); nf4 through a shared-memory copy of the codes.
template <Format F>
__device__ __forceinline__ float unscaled(uint8_t q, float zero, const float* nf4_table) {
  if constexpr (F == Format::nf4)
    return nf4_table[q & 15];
  else
    return decode_value(F, q, 1.f, zero);
}

template <Format F>
__device__ __forceinline__ uint8_t code_in_chunk(const uint8_t* b, int j) {
  if constexpr (kFourBit<F>)
    return (j & 1) ? static_cast<uint8_t>(b[j >> 1] >> 4) : static_cast<uint8_t>(b[j >> 1] & 0x0F);
  else
    return b[j];
}

// One warp per row, any layout: group by group, the lanes striding over the group's codes one at a time.
template <Format F>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matvec_any_kernel(const QLayout L, const uint8_t* __restrict__ blob, const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float nf4_table[16];
  if constexpr (F == Format::nf4) {
    if (threadIdx.x < 16) nf4_table[threadIdx.x] = nf4_code(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= L.rows) return;
  const uint8_t* row = blob + L.codes.offset + r * L.row_bytes;
  const int64_t K = L.cols, G = L.group;
  float acc = 0.f;
  for (int64_t g = 0; g < L.groups_per_row; ++g) {
    const GroupParams p = stored_params(L, blob, r, g);
    const int64_t k1 = (g + 1) * G < K ? (g + 1) * G : K;
    float part = 0.f;
    for (int64_t k = g * G + lane; k < k1; k += 32) {
      const uint8_t q = kFourBit<F> ? nibble(row, k) : row[k];
      part = fmaf(unscaled<F>(q, p.zero, nf4_table), __ldg(x + k), part);
    }
    acc = fmaf(p.scale, part, acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) y[r] = acc;
}

constexpr int kBlockRows = 8, kRowThreads = 256;
constexpr int kChunkCodes = 16;
template <Format F>
constexpr int kChunkBytes = kFourBit<F> ? 8 : 16;
template <int B>
struct ChunkWord;  // the load type of a chunk
template <>
struct ChunkWord<8> {
  using type = uint2;
};
template <>
struct ChunkWord<16> {
  using type = uint4;
};

// The kChunkCodes unscaled values u (weight = scale x u) of one chunk of codes as loaded. int8 and the
// 4-bit integer formats put each byte (int8's with its sign bit flipped: b + 128) or nibble into the low
// mantissa bits of 2^23 (0x4B000000) and subtract 2^23 + 128 or 2^23 + zero: the exact small integers
// decode_value gives, so the same bits, without an integer-to-float conversion per code (those issue at a
// quarter of the multiply-add rate or less on NVIDIA GPUs, and with one per code the 4-bit kernels were
// bound by them, not by memory). nf4 and fp8 code by code through unscaled().
template <Format F, class Word>
__device__ __forceinline__ void unscaled_chunk(const Word& w, float zero, const float* nf4_table, float (&u)[kChunkCodes]) {
  constexpr int kWords = static_cast<int>(sizeof(Word) / 4);
  uint32_t v[kWords];
  memcpy(v, &w, sizeof(Word));
  if constexpr (F == Format::int8) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      const uint32_t b = v[i] ^ 0x80808080u;
#pragma unroll
      for (int k = 0; k < 4; ++k)  // bytes: k of b, then 0x00, 0x00, 0x4B (bytes 5, 6, 7 of {0x4B000000, b})
        u[4 * i + k] = __int_as_float(static_cast<int>(__byte_perm(b, 0x4B000000u, 0x7650u + k))) - 8388736.f;
    }
  } else if constexpr (F == Format::int4 || F == Format::int4_asym) {
    const float bias = 8388608.f + zero;
#pragma unroll
    for (int i = 0; i < kWords; ++i)
#pragma unroll
      for (int k = 0; k < 8; ++k)  // nibble k of word i: element 8 i + k (low nibble of a byte first)
        u[8 * i + k] = __int_as_float(static_cast<int>(((v[i] >> (4 * k)) & 0xFu) | 0x4B000000u)) - bias;
  } else {
    uint8_t b[sizeof(Word)];
    memcpy(b, &w, sizeof(Word));
#pragma unroll
    for (int j = 0; j < kChunkCodes; ++j) u[j] = unscaled<F>(code_in_chunk<F>(b, j), zero, nf4_table);
  }
}

// E consecutive x values (E a multiple of 4, x 16-byte aligned) into registers with 128-bit loads.
template <int E>
__device__ __forceinline__ void load_x(const float* __restrict__ x, float (&xv)[E]) {
#pragma unroll
  for (int j = 0; j < E; j += 4) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(x + j));
    xv[j] = f.x;
    xv[j + 1] = f.y;
    xv[j + 2] = f.z;
    xv[j + 3] = f.w;
  }
}

// A block's kBlockRows row sums (each thread's partial sums in acc): every warp's lanes combined by
// shuffles, then the warps through shared memory; y[i] for i < rows.
__device__ __forceinline__ void store_row_sums(const float (&acc)[kBlockRows], int rows, float* __restrict__ y) {
  __shared__ float partial[kRowThreads / 32][kBlockRows];
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
#pragma unroll
  for (int i = 0; i < kBlockRows; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0) partial[warp][i] = v;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < rows) {
    float v = 0.f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) v += partial[w][threadIdx.x];
    y[threadIdx.x] = v;
  }
}

// Whether matvec_rows_kernel takes this layout and these pointers: row_bytes and codes.offset multiples of
// the chunk bytes, a chunk-aligned blob and a 16-byte aligned x (otherwise matvec_any_kernel). Host.
template <Format F>
inline bool rows_kernel_fits(const QLayout& L, const void* blob, const void* x) {
  constexpr int64_t cb = kChunkBytes<F>;
  return L.row_bytes % cb == 0 && L.codes.offset % cb == 0 && reinterpret_cast<std::uintptr_t>(blob) % cb == 0 &&
         reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
}

// Needs rows_kernel_fits (checked by the launcher).
template <Format F>
__global__ void __launch_bounds__(kRowThreads, 2)
    matvec_rows_kernel(const QLayout L, const uint8_t* __restrict__ blob, const float* __restrict__ x, float* __restrict__ y) {
  using Word = typename ChunkWord<kChunkBytes<F>>::type;
  __shared__ float nf4_table[16];
  if constexpr (F == Format::nf4) {
    if (threadIdx.x < 16) nf4_table[threadIdx.x] = nf4_code(static_cast<int>(threadIdx.x));
    __syncthreads();
  }
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int rows = static_cast<int>(L.rows - r0 < kBlockRows ? L.rows - r0 : kBlockRows);
  const int64_t K = L.cols, G = L.group;
  const int64_t nchunks = L.row_bytes / kChunkBytes<F>;
  const uint8_t* base = blob + L.codes.offset + r0 * L.row_bytes;
  float acc[kBlockRows];
#pragma unroll
  for (int i = 0; i < kBlockRows; ++i) acc[i] = 0.f;

  for (int64_t c = threadIdx.x; c < nchunks; c += kRowThreads) {
    const int64_t e0 = c * kChunkCodes;
    if (e0 >= K) break;  // pad chunks past the last code
    const int n_e = static_cast<int>(K - e0 < kChunkCodes ? K - e0 : kChunkCodes);
    Word w[kBlockRows];
#pragma unroll
    for (int i = 0; i < kBlockRows; ++i)
      if (i < rows) w[i] = __ldg(reinterpret_cast<const Word*>(base + i * L.row_bytes) + c);
    float xv[kChunkCodes];
    if (n_e == kChunkCodes) {
      load_x(x + e0, xv);
    } else {
#pragma unroll
      for (int j = 0; j < kChunkCodes; ++j) xv[j] = j < n_e ? __ldg(x + e0 + j) : 0.f;
    }
    const int64_t g0 = e0 / G, g1 = (e0 + n_e - 1) / G;
#pragma unroll
    for (int i = 0; i < kBlockRows; ++i) {
      if (i >= rows) break;
      if (g0 == g1) {
        const GroupParams p = stored_params(L, blob, r0 + i, g0);
        float u[kChunkCodes];
        unscaled_chunk<F>(w[i], p.zero, nf4_table, u);
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < kChunkCodes; ++j)  // pad codes past n_e count as 0 (an fp8 pad may decode to NaN)
          part = fmaf(j < n_e ? u[j] : 0.f, xv[j], part);
        acc[i] = fmaf(p.scale, part, acc[i]);
      } else {  // the chunk straddles groups (a group size not a multiple of 16): code by code from memory
        const uint8_t* chunk = base + i * L.row_bytes + c * kChunkBytes<F>;
        for (int j = 0; j < n_e; ++j) {
          const GroupParams p = stored_params(L, blob, r0 + i, (e0 + j) / G);
          const uint8_t q = kFourBit<F> ? nibble(chunk, j) : chunk[j];
          acc[i] = fmaf(p.scale * unscaled<F>(q, p.zero, nf4_table), __ldg(x + e0 + j), acc[i]);
        }
      }
    }
  }
  store_row_sums(acc, rows, y + r0);
}

// The dense baselines (fp32, bf16 weights) in the same shape: 8 rows per block of 256 threads, 16-byte
// chunks of each row (4 fp32 or 8 bf16 weights) with their x values loaded once for the 8 rows.
template <class W>
__global__ void __launch_bounds__(kRowThreads)
    matvec_dense_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int64_t N, int64_t K) {
  constexpr int E = 16 / static_cast<int>(sizeof(W));
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int rows = static_cast<int>(N - r0 < kBlockRows ? N - r0 : kBlockRows);
  float acc[kBlockRows];
#pragma unroll
  for (int i = 0; i < kBlockRows; ++i) acc[i] = 0.f;
  for (int64_t c = threadIdx.x; c * E < K; c += kRowThreads) {
    uint4 v[kBlockRows];
#pragma unroll
    for (int i = 0; i < kBlockRows; ++i)
      if (i < rows) v[i] = __ldg(reinterpret_cast<const uint4*>(w + (r0 + i) * K) + c);
    float xv[E];
    load_x(x + c * E, xv);
#pragma unroll
    for (int i = 0; i < kBlockRows; ++i) {
      if (i >= rows) break;
      W e[E];
      memcpy(e, &v[i], 16);
#pragma unroll
      for (int j = 0; j < E; ++j) acc[i] = fmaf(to_f32(e[j]), xv[j], acc[i]);
    }
  }
  store_row_sums(acc, rows, y + r0);
}

// The generic dense path (any K, any alignment): one warp per row.
template <class W>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matvec_dense_any_kernel(const W* __restrict__ w, const float* __restrict__ x, float* __restrict__ y, int64_t N, int64_t K) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (r >= N) return;
  float acc = 0.f;
  for (int64_t k = lane; k < K; k += 32) acc = fmaf(to_f32(w[r * K + k]), __ldg(x + k), acc);
  acc = warp_sum(acc);
  if (lane == 0) y[r] = acc;
}

}  // namespace memtrade::quant::matvec_kernels
