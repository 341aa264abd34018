#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

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
  // Reads (not writes) the flush buffer: the cache is left holding clean lines, so the timed call's loads
  // evict without write-backs.
  void flush_caches() override {
    if (!flush_) {
      const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
      flush_words_ = 2 * static_cast<int64_t>(llc > (16L << 20) ? llc : (64L << 20)) / 8;
      flush_ = make_host_pages(static_cast<std::size_t>(flush_words_) * 8);
      std::memset(flush_.get(), 1, static_cast<std::size_t>(flush_words_) * 8);
    }
    // On every OpenMP thread (as the timed call will be), so the team is awake when the call starts.
    const uint64_t* w = reinterpret_cast<const uint64_t*>(flush_.get());
    uint64_t sum = 0;
    const int64_t n = flush_words_;
#pragma omp parallel for reduction(+ : sum)
    for (int64_t i = 0; i < n; i += 8) sum += w[i];  // one load per 64-byte line
    flush_sink_ = sum;
  }
  double time_call(const std::function<void()>& fn) override {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  HostPages flush_;
  int64_t flush_words_ = 0;
  volatile uint64_t flush_sink_ = 0;
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
