// CUDA quantized matvec y = deq(W) x.
//
// Fast path (rows in 16-byte-aligned chunks): a block of 256 threads computes kBlockRows = 8 rows. Its
// threads split the row into chunks of 16 codes (16 bytes of int8 / fp8, 8 bytes of the 4-bit formats),
// thread i taking chunks i, i + 256, ...; for each chunk it loads its 16 x values once (four 128-bit
// loads) and the chunk of all 8 rows (8 independent loads in flight), decodes the codes in registers
// through the formats.hpp functions and accumulates in fp32; a chunk inside one group applies the group's
// scale once to its partial sum. Per row, the threads' sums are combined by warp shuffles and then across
// the 8 warps in shared memory. At 4096 x 4096 that is 512 blocks with one chunk per thread and row (each
// thread has 8 loads in flight), and x is read 8 times less often than with one row per warp. On an H200
// this reaches 21% (int8) and 9% (int4) of the copy bandwidth: the 4-bit decode, not memory, bounds it.
// Other layouts: one warp per row, group by group, one code at a time. The dense fp32 / bf16 baselines
// have a kernel of the same shape.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "harness/cuda_device.hpp"
#include "impls/quant/formats.hpp"
#include "impls/quant/matvec.hpp"

namespace memtrade::quant {

namespace {

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

// Needs row_bytes and codes.offset multiples of the chunk bytes, a chunk-aligned blob and a 16-byte
// aligned x (checked by the launcher).
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
      uint8_t b[kChunkBytes<F>];
      memcpy(b, &w[i], sizeof(b));
      if (g0 == g1) {
        const GroupParams p = stored_params(L, blob, r0 + i, g0);
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < kChunkCodes; ++j)  // pad codes past n_e are not decoded (an fp8 pad may be NaN)
          part = fmaf(j < n_e ? unscaled<F>(code_in_chunk<F>(b, j), p.zero, nf4_table) : 0.f, xv[j], part);
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

template <Format F>
void launch(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, cudaStream_t stream) {
  constexpr int64_t cb = kChunkBytes<F>;
  const bool rows_path = L.row_bytes % cb == 0 && L.codes.offset % cb == 0 &&
                         reinterpret_cast<std::uintptr_t>(d_blob) % cb == 0 && reinterpret_cast<std::uintptr_t>(d_x) % 16 == 0;
  if (rows_path) {
    const auto blocks = static_cast<unsigned>((L.rows + kBlockRows - 1) / kBlockRows);
    matvec_rows_kernel<F><<<blocks, kRowThreads, 0, stream>>>(L, d_blob, d_x, d_y);
  } else {
    const auto blocks = static_cast<unsigned>((L.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    matvec_any_kernel<F><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(L, d_blob, d_x, d_y);
  }
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

template <class W>
void launch_dense(const W* w, const float* x, float* y, int64_t N, int64_t K, cudaStream_t stream) {
  if (N <= 0 || K <= 0) throw Error("matvec_dense_cuda: empty matrix");
  if (!w || !x || !y) throw Error("matvec_dense_cuda: null pointer");
  constexpr int64_t E = 16 / sizeof(W);
  const bool chunks = K % E == 0 && reinterpret_cast<std::uintptr_t>(w) % 16 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  if (chunks)
    matvec_dense_kernel<W><<<static_cast<unsigned>((N + kBlockRows - 1) / kBlockRows), kRowThreads, 0, stream>>>(w, x, y, N, K);
  else
    matvec_dense_any_kernel<W><<<static_cast<unsigned>((N + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0, stream>>>(w, x, y, N, K);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("matvec_dense_cuda: launch failed: ") + cudaGetErrorString(e));
}

}  // namespace

void matvec_cuda(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, CUstream_st* stream) {
  if (L.rows <= 0 || L.cols <= 0) throw Error("matvec_cuda: empty layout");
  if (!d_blob || !d_x || !d_y) throw Error("matvec_cuda: null pointer");
  if (L.rows > int64_t{2147483647} * kWarpsPerBlock) throw Error("matvec_cuda: too many rows for one grid");
  switch (L.spec.format) {
    case Format::int8: launch<Format::int8>(L, d_blob, d_x, d_y, stream); break;
    case Format::int4: launch<Format::int4>(L, d_blob, d_x, d_y, stream); break;
    case Format::int4_asym: launch<Format::int4_asym>(L, d_blob, d_x, d_y, stream); break;
    case Format::fp8_e4m3: launch<Format::fp8_e4m3>(L, d_blob, d_x, d_y, stream); break;
    case Format::fp8_e5m2: launch<Format::fp8_e5m2>(L, d_blob, d_x, d_y, stream); break;
    case Format::nf4: launch<Format::nf4>(L, d_blob, d_x, d_y, stream); break;
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw Error(std::string("matvec_cuda: launch failed: ") + cudaGetErrorString(e));
}

void matvec_cuda(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, Device& dev) {
  matvec_cuda(L, d_blob, d_x, d_y, as_cuda(dev).stream());
}

void matvec_dense_cuda(const float* d_w, const float* d_x, float* d_y, int64_t N, int64_t K, Device& dev) {
  launch_dense(d_w, d_x, d_y, N, K, as_cuda(dev).stream());
}

void matvec_dense_cuda(const bf16_t* d_w, const float* d_x, float* d_y, int64_t N, int64_t K, Device& dev) {
  launch_dense(d_w, d_x, d_y, N, K, as_cuda(dev).stream());
}

}  // namespace memtrade::quant
