// Test devices whose memory is host memory, for code written against Device:
//   DeferredCopyDevice  a CPU device whose overlapped copies (Device::copy_async) are deferred, for tests of
//                       the code that overlaps copies on CUDA: a queued copy reads its source only when it
//                       runs, which is at wait_copies or join_copies_until (the copies before that fence),
//                       join_copies, synchronize or a plain copy (all of them). Code that writes a copy's
//                       source again before waiting for its fence, or lets the device read the destination
//                       before joining, gets other bits than on the CPU device, where a copy is done when issued.
//   HostBehindCopies    reports itself as a CUDA device, so code that reaches device memory only through the
//                       device's copies takes that path, as on a GPU; the test reads what arrived.
#pragma once

#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <string>

#include "harness/device.hpp"

namespace memtrade::test {

// Both pools from aligned_alloc; the device pool's name is `memory_name`.
class HostMemoryDevice : public Device {
 protected:
  explicit HostMemoryDevice(const char* memory_name) {
    auto alloc = [](std::size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); };
    memory_ = std::make_unique<TrackedAllocator>(memory_name, alloc, [](void* p) { std::free(p); });
    host_ = std::make_unique<TrackedAllocator>("host", alloc, [](void* p) { std::free(p); });
  }
};

class HostBehindCopies final : public HostMemoryDevice {
 public:
  HostBehindCopies() : HostMemoryDevice("cuda") {}
  Backend backend() const override { return Backend::cuda; }
  std::string name() const override { return "host memory behind copies"; }
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind) override {
    std::memcpy(dst, src, bytes);
    ++copies_;
  }
  void synchronize() override {}
  double time_call(const std::function<void()>& fn) override {
    fn();
    return 0;
  }
  int64_t copies() const { return copies_; }

 private:
  int64_t copies_ = 0;
};

class DeferredCopyDevice final : public HostMemoryDevice {
 public:
  DeferredCopyDevice() : HostMemoryDevice("cpu") {}
  Backend backend() const override { return Backend::cpu; }
  std::string name() const override { return "cpu (deferred copies)"; }
  void copy(void* dst, const void* src, std::size_t bytes, CopyKind) override {
    run_until(issued_);
    std::memcpy(dst, src, bytes);
  }
  void copy_async(void* dst, const void* src, std::size_t bytes, CopyKind) override {
    queue_.push_back({dst, src, bytes});
    ++issued_;
  }
  void join_copies() override { run_until(issued_); }
  bool overlaps_copies() const override { return true; }
  int64_t copy_fence() override { return issued_; }
  void wait_copies(int64_t fence) override {
    MT_CHECK(fence >= 0 && fence <= issued_, "wait_copies: fence " + std::to_string(fence) + " was never taken");
    run_until(fence);
  }
  void join_copies_until(int64_t fence) override { wait_copies(fence); }
  void synchronize() override { run_until(issued_); }
  double time_call(const std::function<void()>& fn) override {
    fn();
    synchronize();
    return 0;
  }
  int64_t deferred_copies() const { return deferred_; }  // copies that ran after a later call than theirs

 private:
  struct Pending {
    void* dst;
    const void* src;
    std::size_t bytes;
  };
  // Runs the queued copies up to the n-th issued.
  void run_until(int64_t n) {
    for (; done_ < n; ++done_) {
      const Pending p = queue_.front();
      queue_.pop_front();
      std::memcpy(p.dst, p.src, p.bytes);
      deferred_ += done_ + 1 < issued_;
    }
  }
  std::deque<Pending> queue_;
  int64_t issued_ = 0, done_ = 0, deferred_ = 0;
};

}  // namespace memtrade::test
