// The shape of an attention call and the CPU flash kernels' buffers and workspace, apart from the
// harness: the portable SIMD kernels (simd/, compiled without -march=native) include this alone.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.hpp"

namespace memtrade::attention {

struct Dims {
  int64_t b, h, h_kv, n, n_kv, d;
  bool causal;
  DType dtype;
  bool backward;  // pass == fwd_bwd
  float scale() const;
  int64_t q_elems() const { return b * h * n * d; }
  int64_t kv_elems() const { return b * h_kv * n_kv * d; }
  int64_t rows() const { return b * h * n; }  // query rows
  int64_t group() const { return h / h_kv; }
};

// CPU flash tiling. Each worker thread uses one workspace slot; the slot count is min(16, work items),
// so tracked figures do not depend on the machine's core count (and at most 16 threads run).
inline constexpr int kCpuBlockQ = 64, kCpuBlockK = 64, kCpuSlots = 16;
inline std::size_t cpu_flash_slot_bytes(int64_t d) {  // q, dO, acc; K^T, V^T, K, V, dK, dV; S, dP; m, l, lse, delta
  return static_cast<std::size_t>(3 * kCpuBlockQ * d + 6 * kCpuBlockK * d + 2 * kCpuBlockQ * kCpuBlockK + 4 * kCpuBlockQ) *
         sizeof(float);
}

// Buffers of the CPU flash kernels, [B, H, N, D] row-major in dtype s.dtype. lse [B*H*N] fp32 is written
// by the forward when not null and read by the backward; delta [B*H*N] fp32 is backward scratch. Unused
// gradient pointers may be null in the forward pass.
struct FlashCpuBuffers {
  const void *q, *k, *v;
  void* o;
  const void* dout;
  void *dq, *dk, *dv;
};

}  // namespace memtrade::attention
