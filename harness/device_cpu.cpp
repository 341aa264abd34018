#include <chrono>
#include <cstdlib>
#include <cstring>

#include "harness/device.hpp"
#include "harness/host_pages.hpp"

namespace memtrade {

std::string_view backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }

Backend parse_backend(std::string_view s) {
  if (s == "cpu") return Backend::cpu;
  if (s == "cuda") return Backend::cuda;
  throw Error("unknown backend '" + std::string(s) + "' (expected cpu or cuda)");
}

namespace {

class CpuDevice final : public Device {
 public:
  CpuDevice() {
    memory_ = std::make_unique<TrackedAllocator>("cpu", host_pages_alloc, [](void* p) { std::free(p); });
    host_ = std::make_unique<TrackedAllocator>("host", host_pages_alloc, [](void* p) { std::free(p); });
  }
  Backend backend() const override { return Backend::cpu; }
  std::string name() const override { return "cpu"; }
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  double flush_caches() override { return flush_(); }
  double time_call(const std::function<void()>& fn) override {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  CacheFlush flush_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

std::unique_ptr<Device> make_device(Backend b) {
  return b == Backend::cpu ? make_cpu_device() : make_cuda_device();
}

#ifndef MEMTRADE_WITH_CUDA
CudaStatus cuda_status() { return {false, "no CUDA device: memtrade was built without the CUDA backend", {}, {}, {}}; }
std::unique_ptr<Device> make_cuda_device() { throw Skip(cuda_status().reason); }
#endif

}  // namespace memtrade
