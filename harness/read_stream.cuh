// The CUDA read-stream probe's kernel (probe_cuda.cu): the sum of a buffer's 32-bit words, each read once.
// Each thread takes four 16-byte words per step of a grid-stride loop (four loads in flight), a warp's
// sums meet by shuffles and each warp adds its own into *out (the probe never reads it: the atomic add
// keeps the loads live; a caller that wants the sum zeroes *out first). Written to the
// subset of CUDA that tests/cuda_emulation.hpp provides, so a CPU test checks that every word is read once.
#pragma once

#include <cstddef>

namespace memtrade::probe_kernels {

__global__ void read_stream_sum(const uint4* p, std::size_t words, unsigned long long* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long s = 0;
  auto add = [&s](const uint4& v) {
    s += static_cast<unsigned long long>(v.x) + v.y + v.z + v.w;
  };
  for (; i + 3 * stride < words; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    add(a);
    add(b);
    add(c);
    add(d);
  }
  for (; i < words; i += stride) add(p[i]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

}  // namespace memtrade::probe_kernels
