// The CUDA device, for CUDA translation units and CUDA-aware C++ (built only with MEMTRADE_WITH_CUDA).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "harness/device.hpp"

namespace memtrade {

// Throws memtrade::Error naming the call and the CUDA error.
void cuda_check(cudaError_t err, const char* what);
#define MT_CUDA(call) ::memtrade::cuda_check((call), #call)
// After a kernel launch: reports launch-configuration errors immediately.
#define MT_CUDA_LAUNCH() ::memtrade::cuda_check(cudaGetLastError(), "kernel launch")

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;
  Backend backend() const override { return Backend::cuda; }
  std::string name() const override;
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) override;
  void fork_copies() override;
  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) override;
  void join_copies() override;
  bool overlaps_copies() const override { return true; }
  int64_t copy_fence() override;
  void wait_copies(int64_t fence) override;
  void join_copies_until(int64_t fence) override;
  void synchronize() override;
  double time_call(const std::function<void()>& fn) override;
  double flush_caches() override;  // returns 0: not timed
  std::optional<std::size_t> backend_used_bytes() override;

  cudaStream_t stream() const { return stream_; }
  const cudaDeviceProp& props() const { return props_; }

 private:
  int ordinal_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;  // copy_stream_: copy_async's
  cudaEvent_t start_ = nullptr, stop_ = nullptr, fork_ = nullptr, join_ = nullptr;
  cudaEvent_t fences_[kCopyFences] = {};  // copy_fence()'s, reused in turn
  int64_t next_fence_ = 0;
  void* flush_ = nullptr;  // twice the L2 size, allocated on first use, untracked (harness-internal)
  std::size_t flush_bytes_ = 0;
};

// The CUDA device behind a Device&, or memtrade::Error if it is another backend.
CudaDevice& as_cuda(Device& d);

}  // namespace memtrade
