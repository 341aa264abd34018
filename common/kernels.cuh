// Small CUDA kernels and device helpers shared by the techniques: block-wide reductions (blockDim.x a
// multiple of 32, at most 1024) and grid-stride conversions between a storage type and fp32.
#pragma once

#include <math.h>

#include <cstdint>

#include "common/dtype.hpp"

namespace memtrade {

template <bool kMax>
__device__ __forceinline__ float combine(float a, float b) {
  return kMax ? fmaxf(a, b) : a + b;
}

// The block's max (kMax) or sum of v; every thread gets the result. `red` is a __shared__ float[32];
// the leading __syncthreads() lets consecutive calls reuse it.
template <bool kMax>
__device__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = combine<kMax>(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = kMax ? -INFINITY : 0.f;
  for (int w = 0; w < warps; ++w) r = combine<kMax>(r, red[w]);
  return r;
}

template <class T>
__global__ void convert_to_f32(const T* __restrict__ src, float* __restrict__ dst, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = to_f32(src[i]);
}

template <class T>
__global__ void convert_from_f32(const float* __restrict__ src, T* __restrict__ dst, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = from_f32<T>(src[i]);
}

}  // namespace memtrade
