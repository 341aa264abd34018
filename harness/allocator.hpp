// The tracked allocator: every byte a technique uses goes through one of these.
//
// A pool (device memory, pinned host memory, plain host memory) keeps live and
// peak bytes and allocation counts, overall and per tag (weights, grads,
// activations, ...). A capacity turns "would exceed" into memtrade::OutOfMemory,
// which the runner records as the case's "oom" status. Peak figures are sums of
// requested sizes, so they are exact and identical on every machine.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "harness/common.hpp"

namespace memtrade {

enum class Tag : uint8_t { io, weights, master, grads, optimizer, activations, workspace, kv, other, count_ };
inline constexpr std::size_t kTagCount = static_cast<std::size_t>(Tag::count_);
std::string_view tag_name(Tag t);

struct UsageStats {
  std::size_t live = 0;   // bytes currently allocated
  std::size_t peak = 0;   // largest `live` since the last reset_peak()
  std::size_t count = 0;  // allocations currently live
};

class TrackedAllocator {
 public:
  using RawAlloc = std::function<void*(std::size_t)>;
  using RawFree = std::function<void(void*)>;

  TrackedAllocator(std::string pool_name, RawAlloc alloc, RawFree release);
  TrackedAllocator(const TrackedAllocator&) = delete;
  TrackedAllocator& operator=(const TrackedAllocator&) = delete;
  ~TrackedAllocator();

  // Throws OutOfMemory when a capacity is set and would be exceeded, or when the
  // underlying allocator fails. Zero-byte requests return nullptr and count nothing.
  void* allocate(std::size_t bytes, Tag tag);
  void release(void* ptr, std::size_t bytes, Tag tag) noexcept;

  void set_capacity(std::optional<std::size_t> bytes);
  std::optional<std::size_t> capacity() const;
  void reset_peak();  // peak := live, overall and per tag

  UsageStats total() const;
  UsageStats by_tag(Tag tag) const;
  std::size_t allocations_made() const;  // since construction
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mu_;
  std::optional<std::size_t> capacity_;
  UsageStats total_;
  std::array<UsageStats, kTagCount> tags_{};
  std::size_t made_ = 0;
};

// Owning handle to one tracked allocation (move-only). Frees on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(TrackedAllocator& pool, std::size_t bytes, Tag tag);
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  Tag tag() const { return tag_; }
  void reset();

 private:
  TrackedAllocator* pool_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  Tag tag_ = Tag::other;
};

}  // namespace memtrade
