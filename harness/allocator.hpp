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
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/common.hpp"

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
  static constexpr unsigned char kGuardByte = 0xFD;
  using RawAlloc = std::function<void*(std::size_t)>;
  using RawFree = std::function<void(void*)>;
  // Copies between host memory and the pool's memory (dst, src, bytes), for the guard bytes; plain
  // memcpy unless the pool's memory is not host-accessible (CUDA device memory).
  using RawCopy = std::function<void(void*, const void*, std::size_t)>;

  TrackedAllocator(std::string pool_name, RawAlloc alloc, RawFree release);
  TrackedAllocator(const TrackedAllocator&) = delete;
  TrackedAllocator& operator=(const TrackedAllocator&) = delete;
  ~TrackedAllocator();

  // Throws OutOfMemory when a capacity is set and would be exceeded, or when the
  // underlying allocator fails. Zero-byte requests return nullptr and count nothing.
  void* allocate(std::size_t bytes, Tag tag);
  void release(void* ptr, std::size_t bytes, Tag tag) noexcept;

  // Guard bytes: with n > 0, every later allocation gets n bytes of a known pattern after its end,
  // checked when it is freed; a changed guard (an out-of-bounds write) is recorded with the buffer's
  // tag and size (guard_violations()) and printed. Tracked sizes exclude the guards. Off by default;
  // the runner turns them on in the test profile, in debug builds and with $MEMTRADE_GUARD_BYTES.
  void set_guard_bytes(std::size_t n);
  std::size_t guard_bytes() const;
  void set_guard_copy(RawCopy to_pool, RawCopy from_pool);
  std::vector<std::string> guard_violations() const;
  void clear_guard_violations();

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
  std::size_t guard_ = 0;
  RawCopy to_pool_, from_pool_;
  std::vector<std::string> violations_;
  std::map<void*, std::size_t> guarded_;  // live guarded allocations -> their guard size
};

// 64 guard bytes when the build is a debug build or $MEMTRADE_GUARD_BYTES says so (its value), and
// `want` (the test profile) asks for them; 0 otherwise.
std::size_t default_guard_bytes(bool want);

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
