// A cuBLAS handle whose workspace comes from the device's tracked pool (tag workspace), so cuBLAS's
// scratch memory is in the peak figures (built only with MEMTRADE_WITH_CUDA).
#pragma once

#include "common/cublas.hpp"
#include "harness/allocator.hpp"
#include "harness/cuda_device.hpp"

namespace memtrade {

namespace detail {
struct CublasWorkspace {
  Buffer workspace;
};
}  // namespace detail

// The workspace base is constructed before the handle and destroyed after it.
class TrackedCublas : private detail::CublasWorkspace, public Cublas {
 public:
  explicit TrackedCublas(CudaDevice& dev, std::size_t workspace_bytes = kDefaultWorkspace)
      : detail::CublasWorkspace{Buffer(dev.memory(), workspace_bytes, Tag::workspace)},
        Cublas(dev.stream(), workspace.data(), workspace_bytes) {}
};

}  // namespace memtrade
