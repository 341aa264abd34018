// CUDA quantized matvec y = deq(W) x: one warp per output row. Each lane reads 16-byte chunks of the
// row's packed codes with 128-bit loads (16 codes of int8 / fp8, 32 of the 4-bit formats), decodes them
// in registers through the formats.hpp functions, and accumulates in fp32; a chunk inside one group
// applies the group's scale once to its partial sum. The warp's lanes are combined by shuffles.
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

template <Format F, bool kVector>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    matvec_kernel(const QLayout L, const uint8_t* __restrict__ blob, const float* __restrict__ x, float* __restrict__ y) {
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

  if constexpr (kVector) {
    constexpr int E = kFourBit<F> ? 32 : 16;  // codes per 16-byte chunk
    const int64_t nchunks = L.row_bytes / 16;
    for (int64_t c = lane; c < nchunks; c += 32) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + c);
      uint8_t b[16];
      memcpy(b, &v, 16);
      const int64_t e0 = c * E;
      const int64_t e1 = e0 + E < K ? e0 + E : K;  // the last chunk may hold the pad nibble / bytes
      const int64_t g0 = e0 / G, g1 = (e1 - 1) / G;
      if (g0 == g1) {
        const GroupParams p = stored_params(L, blob, r, g0);
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < E; ++j)
          if (e0 + j < e1) part = fmaf(unscaled<F>(code_in_chunk<F>(b, j), p.zero, nf4_table), __ldg(x + e0 + j), part);
        acc = fmaf(p.scale, part, acc);
      } else {  // the chunk straddles groups: each code with its own group's parameters
#pragma unroll
        for (int j = 0; j < E; ++j) {
          const int64_t k = e0 + j;
          if (k < e1) {
            const GroupParams p = stored_params(L, blob, r, k / G);
            const float w = p.scale * unscaled<F>(code_in_chunk<F>(b, j), p.zero, nf4_table);
            acc = fmaf(w, __ldg(x + k), acc);
          }
        }
      }
    }
  } else {
    // Any layout: group by group, the lanes striding over the group's codes one at a time.
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
  }
  acc = warp_sum(acc);
  if (lane == 0) y[r] = acc;
}

template <Format F>
void launch(const QLayout& L, const uint8_t* d_blob, const float* d_x, float* d_y, cudaStream_t stream) {
  const bool vector = L.row_bytes % 16 == 0 && L.codes.offset % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(d_blob) % 16 == 0;
  const auto blocks = static_cast<unsigned>((L.rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (vector)
    matvec_kernel<F, true><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(L, d_blob, d_x, d_y);
  else
    matvec_kernel<F, false><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(L, d_blob, d_x, d_y);
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

}  // namespace memtrade::quant
