// Devices: where a technique's buffers live and its calls run.
//
// Each device owns a tracked memory pool for its own memory ("cpu" or "cuda:0")
// and a second tracked pool for host memory used by offload ("host": pinned on
// CUDA). The runner times calls through the device so that GPU work is timed
// with events and CPU work with a steady clock.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "harness/allocator.hpp"

namespace memtrade {

enum class Backend : uint8_t { cpu, cuda };
std::string_view backend_name(Backend b);
Backend parse_backend(std::string_view s);  // "cpu" | "cuda"

enum class CopyKind : uint8_t { host_to_device, device_to_host, device_to_device };

class Device {
 public:
  virtual ~Device() = default;
  virtual Backend backend() const = 0;
  virtual std::string name() const = 0;

  TrackedAllocator& memory() { return *memory_; }  // the device's own memory
  TrackedAllocator& host() { return *host_; }      // host memory (pinned on CUDA), for offload

  // Copies between host memory and this device's memory (plain memcpy on the CPU).
  virtual void copy(void* dst, const void* src, std::size_t bytes, CopyKind kind) = 0;
  // Copies overlapped with the device's work (CUDA: a second stream; the CPU: plain memcpys, in order):
  // fork_copies() makes the copies issued after it wait for the work already issued to the device;
  // copy_async() issues one (host memory from host() for real overlap); join_copies() makes the work
  // issued after it wait for the copies issued so far. Join before the end of a timed call, so that the
  // call's time covers its copies.
  virtual void fork_copies() {}
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind) { copy(dst, src, bytes, kind); }
  virtual void join_copies() {}
  // Whether copy_async overlaps the caller's work (CUDA) or is a plain copy (the CPU).
  virtual bool overlaps_copies() const { return false; }
  // A fence in the overlapped copies: wait_copies(f) returns once every copy issued before copy_fence()
  // returned f is done (the host waits; the source may then be reused). At most kCopyFences fences are
  // outstanding: waiting on an older one is an Error.
  static constexpr int64_t kCopyFences = 8;
  virtual int64_t copy_fence() { return 0; }
  virtual void wait_copies(int64_t fence) { (void)fence; }
  // The device's side of wait_copies: the work issued to the device after this call waits for the copies
  // issued before `fence` (the host goes on).
  virtual void join_copies_until(int64_t fence) { (void)fence; }
  virtual void synchronize() = 0;
  // Runs fn once and returns its duration in seconds (CUDA: events on the device's stream).
  virtual double time_call(const std::function<void()>& fn) = 0;
  // Evicts the caches between timed calls of memory-bound work (Work::cold_cache), as nvbench does: the
  // CPU reads a buffer of twice the last-level cache, CUDA one of twice the L2's size. The buffer is
  // the harness's own, allocated once outside the tracked pools (like OpenBLAS's packing buffers).
  // Returns the rate at which the flush read memory (bytes per second) where the device measures it
  // (the CPU), else 0.
  virtual double flush_caches() { return 0; }
  // Bytes in use as the backend itself sees them (cudaMemGetInfo); nullopt on the CPU.
  virtual std::optional<std::size_t> backend_used_bytes() { return std::nullopt; }

 protected:
  std::unique_ptr<TrackedAllocator> memory_, host_;
};

std::unique_ptr<Device> make_cpu_device();

// Whether a CUDA device can be used here; `reason` says why not ("no CUDA device: ...").
struct CudaStatus {
  bool available = false;
  std::string reason;
  std::string gpu_name, driver, runtime;  // filled when available
};
CudaStatus cuda_status();
// Throws Skip with cuda_status().reason when no device is usable.
std::unique_ptr<Device> make_cuda_device();

std::unique_ptr<Device> make_device(Backend b);

}  // namespace memtrade
