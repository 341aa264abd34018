// Runs simple CUDA kernels on the CPU, one std::thread per CUDA thread, for tests on machines without a
// GPU (nvcc's old -deviceemu mode, for the subset of CUDA the kernels written for it use). Include it
// first, in a host translation unit, before the kernels' header: it defines the CUDA keywords away
// (__shared__ becomes static, which every thread of the function shares), threadIdx.x and blockIdx.x/y
// (per thread), __syncthreads (a barrier of the block), __shfl_xor_sync (the 32 lanes of a warp meet
// at a barrier and exchange values), uint2 / uint4 and min. Blocks run one after another.
// What it checks: a kernel's indexing and arithmetic in float (not necessarily the device's bits: the
// host compiler contracts multiply-adds where nvcc may not, and the reverse). What it cannot: the memory
// model (a missing __syncthreads or a race may pass here), occupancy, registers, speed. A kernel whose
// lanes do not all reach a shuffle deadlocks here, where the device's behaviour would be undefined.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#if defined(__CUDACC__)
#error "cuda_emulation.hpp is for host translation units"
#endif

#define __global__ inline
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct EmulatedDim {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim threadIdx, blockIdx;
struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
using std::min;

namespace memtrade::test::cuda_emulation {
struct Block {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> lanes;  // one value per thread, exchanged at a shuffle
};
inline Block*& block() {
  static Block* b = nullptr;
  return b;
}
// Runs kernel() as a grid of grid_x x grid_y blocks of `threads` threads (a multiple of 32): one
// std::thread per CUDA thread, each running the blocks in turn, all of them finishing a block before any
// starts the next (its __shared__ arrays are the next block's).
inline void launch(unsigned grid_x, unsigned grid_y, unsigned threads, const std::function<void()>& kernel) {
  Block b;
  b.all = std::make_unique<std::barrier<>>(threads);
  for (unsigned w = 0; w < threads / 32; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(32));
  b.lanes.assign(threads, 0.f);
  block() = &b;
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      threadIdx.x = t;
      for (unsigned by = 0; by < grid_y; ++by)
        for (unsigned bx = 0; bx < grid_x; ++bx) {
          blockIdx.x = bx;
          blockIdx.y = by;
          kernel();
          b.all->arrive_and_wait();
        }
    });
  for (auto& t : ts) t.join();
  block() = nullptr;
}
}  // namespace memtrade::test::cuda_emulation

inline void __syncthreads() { memtrade::test::cuda_emulation::block()->all->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned /*mask: every lane*/, float v, int lane_mask) {
  auto* b = memtrade::test::cuda_emulation::block();
  const unsigned t = threadIdx.x, w = t / 32;
  b->warps[w]->arrive_and_wait();  // every lane has read the previous exchange
  b->lanes[t] = v;
  b->warps[w]->arrive_and_wait();
  const float r = b->lanes[w * 32 + ((t % 32) ^ static_cast<unsigned>(lane_mask))];
  b->warps[w]->arrive_and_wait();
  return r;
}
