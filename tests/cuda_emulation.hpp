// Runs simple CUDA kernels on the CPU for tests on machines without a GPU (nvcc's old -deviceemu mode,
// for the subset of CUDA the kernels written for it use). Include it first, in a host translation unit,
// before the kernels' header: it defines the CUDA keywords away (__shared__ becomes static, which every
// thread of the function shares), threadIdx.x and blockIdx.x/y, __syncthreads (a barrier of the block),
// __shfl_xor_sync (the 32 lanes of a warp meet and exchange values: float, 64-bit integers), blockDim.x and
// gridDim.x/y, atomicAdd on 64-bit integers, __ldg, __int_as_float, __byte_perm, uint2 / uint4 / float4
// and min. Each CUDA thread of a block is a fiber (ucontext) of one OS thread, switched at the barriers,
// so a warp's lanes meet without the OS scheduler; blocks run one after another.
// What it checks: a kernel's indexing and arithmetic in float (not necessarily the device's bits: the
// host compiler contracts multiply-adds where nvcc may not, and the reverse). What it cannot: the memory
// model (a missing __syncthreads or a race may pass here), occupancy, registers, speed. A kernel whose
// lanes do not all reach a shuffle never finishes here (the test times out), where the device's
// behaviour would be undefined.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
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
inline EmulatedDim threadIdx, blockIdx;  // the running fiber's
inline EmulatedDim blockDim, gridDim;     // the running launch's
struct uint2 {
  uint32_t x, y;
};
struct uint4 {
  uint32_t x, y, z, w;
};
struct float4 {
  float x, y, z, w;
};
using std::min;

namespace memtrade::test::cuda_emulation {

// A barrier of `size` fibers: the last to arrive opens it (the generation moves on) for the others,
// which yield to the scheduler until then.
struct Barrier {
  unsigned size = 0, count = 0, generation = 0;
};

struct Block {
  std::vector<ucontext_t> fibers;
  std::vector<unsigned char> done;
  ucontext_t scheduler{};
  unsigned current = 0;
  Barrier all;
  std::vector<Barrier> warps;
  std::vector<float> lanes;  // one value per thread, exchanged at a shuffle
  const std::function<void()>* kernel = nullptr;
};
inline Block*& block() {
  static Block* b = nullptr;
  return b;
}
inline void yield() {
  Block* b = block();
  swapcontext(&b->fibers[b->current], &b->scheduler);
}
inline void wait(Barrier& g) {
  const unsigned gen = g.generation;
  if (++g.count == g.size) {
    g.count = 0;
    ++g.generation;
    return;
  }
  while (g.generation == gen) yield();
}
inline void fiber_main() {
  Block* b = block();
  (*b->kernel)();
  b->done[b->current] = 1;  // returns to the scheduler (uc_link)
}

// Fiber t of the block, to start at fiber_main on its own stack and return to the scheduler.
[[gnu::noinline]] inline void make_fiber(Block& b, unsigned t, char* stack, std::size_t bytes) {
  if (getcontext(&b.fibers[t]) != 0) throw std::runtime_error("cuda_emulation: getcontext failed");
  b.fibers[t].uc_stack.ss_sp = stack;
  b.fibers[t].uc_stack.ss_size = bytes;
  b.fibers[t].uc_link = &b.scheduler;
  makecontext(&b.fibers[t], fiber_main, 0);
}

// Runs fiber t until it yields or returns; whether it has returned. (Its own frame: nothing of the
// caller's is live across the switch.)
[[gnu::noinline]] inline bool resume(Block& b, unsigned t) {
  b.current = t;
  threadIdx.x = t;
  swapcontext(&b.scheduler, &b.fibers[t]);
  return b.done[t] != 0;
}

// Runs kernel() as a grid of grid_x x grid_y blocks of `threads` threads (a multiple of 32), each block's
// threads as fibers resumed in turn until all have returned.
inline void launch(unsigned grid_x, unsigned grid_y, unsigned threads, const std::function<void()>& kernel) {
  constexpr std::size_t kStack = 64 * 1024;  // per fiber, reused by every block (not zeroed)
  const std::unique_ptr<char[]> stacks(new char[threads * kStack]);
  for (unsigned by = 0; by < grid_y; ++by)
    for (unsigned bx = 0; bx < grid_x; ++bx) {
      Block b;
      b.kernel = &kernel;
      b.all.size = threads;
      b.warps.assign(threads / 32, Barrier{32, 0, 0});
      b.lanes.assign(threads, 0.f);
      b.fibers.resize(threads);
      b.done.assign(threads, 0);
      block() = &b;
      for (unsigned t = 0; t < threads; ++t) make_fiber(b, t, stacks.get() + t * kStack, kStack);
      blockIdx.x = bx;
      blockIdx.y = by;
      blockDim.x = threads;
      gridDim.x = grid_x;
      gridDim.y = grid_y;
      for (unsigned left = threads; left > 0;)
        for (unsigned t = 0; t < threads; ++t)
          if (!b.done[t] && resume(b, t)) --left;
      block() = nullptr;
    }
}
}  // namespace memtrade::test::cuda_emulation

inline void __syncthreads() { memtrade::test::cuda_emulation::wait(memtrade::test::cuda_emulation::block()->all); }
inline float __shfl_xor_sync(unsigned /*mask: every lane*/, float v, int lane_mask) {
  namespace ce = memtrade::test::cuda_emulation;
  ce::Block* b = ce::block();
  const unsigned t = threadIdx.x, w = t / 32;
  ce::wait(b->warps[w]);  // every lane has read the previous exchange
  b->lanes[t] = v;
  ce::wait(b->warps[w]);
  const float r = b->lanes[w * 32 + ((t % 32) ^ static_cast<unsigned>(lane_mask))];
  ce::wait(b->warps[w]);
  return r;
}
// 64-bit integers cross as two 32-bit halves, as the device's shuffle moves them.
inline unsigned long long __shfl_xor_sync(unsigned mask, unsigned long long v, int lane_mask) {
  uint32_t lo = static_cast<uint32_t>(v), hi = static_cast<uint32_t>(v >> 32);
  float flo, fhi;
  std::memcpy(&flo, &lo, 4);
  std::memcpy(&fhi, &hi, 4);
  flo = __shfl_xor_sync(mask, flo, lane_mask);
  fhi = __shfl_xor_sync(mask, fhi, lane_mask);
  std::memcpy(&lo, &flo, 4);
  std::memcpy(&hi, &fhi, 4);
  return static_cast<unsigned long long>(hi) << 32 | lo;
}
// The fibers of a launch share one OS thread, so an atomic add is a plain one.
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p += v;
  return old;
}
// Read-only loads are plain loads here.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
// Byte n of the result is byte (s >> 4n) & 7 of the eight bytes y:x (x's bytes 0-3, y's 4-7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t xy = static_cast<uint64_t>(y) << 32 | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>(xy >> (8 * ((s >> (4 * n)) & 7)) & 0xFF) << (8 * n);
  return r;
}
