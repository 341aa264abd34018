#include "harness/allocator.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "harness/heap_probe.hpp"

namespace memtrade {

std::string_view tag_name(Tag t) {
  static constexpr std::array<std::string_view, kTagCount> names = {
      "io", "weights", "master", "grads", "optimizer", "activations", "workspace", "kv", "other"};
  return names.at(static_cast<std::size_t>(t));
}

TrackedAllocator::TrackedAllocator(std::string pool_name, RawAlloc alloc, RawFree release)
    : name_(std::move(pool_name)), raw_alloc_(std::move(alloc)), raw_free_(std::move(release)),
      to_pool_([](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); }),
      from_pool_([](void* d, const void* s, std::size_t n) { std::memcpy(d, s, n); }) {}

TrackedAllocator::~TrackedAllocator() {
  if (total_.live != 0)
    std::fprintf(stderr, "memtrade: pool '%s' destroyed with %zu B in %zu allocations still live\n", name_.c_str(),
                 total_.live, total_.count);
}

void* TrackedAllocator::allocate(std::size_t bytes, Tag tag) {
  if (bytes == 0) return nullptr;
  heap_probe::Exempt tracked;  // this pool counts its blocks itself (and its bookkeeping is not a workload's)
  std::size_t live;
  {
    std::lock_guard lock(mu_);
    live = total_.live;
    if (capacity_ && (bytes > *capacity_ || live > *capacity_ - bytes))
      throw OutOfMemory(name_, std::string(tag_name(tag)), bytes, live, *capacity_);
  }
  std::size_t guard;
  {
    std::lock_guard lock(mu_);
    guard = guard_;
  }
  void* p = raw_alloc_(bytes + guard);
  if (!p) throw OutOfMemory(name_, std::string(tag_name(tag)), bytes, live, SIZE_MAX);
  if (guard) {
    const std::vector<unsigned char> pattern(guard, kGuardByte);
    to_pool_(static_cast<unsigned char*>(p) + bytes, pattern.data(), guard);
  }
  std::lock_guard lock(mu_);
  if (guard) guarded_[p] = guard;
  auto bump = [bytes](UsageStats& s) {
    s.live += bytes;
    s.count += 1;
    if (s.live > s.peak) s.peak = s.live;
  };
  bump(total_);
  bump(tags_[static_cast<std::size_t>(tag)]);
  ++made_;
  return p;
}

void TrackedAllocator::release(void* ptr, std::size_t bytes, Tag tag) noexcept {
  if (!ptr) return;
  heap_probe::Exempt tracked;
  std::size_t guard = 0;
  {
    std::lock_guard lock(mu_);
    if (auto it = guarded_.find(ptr); it != guarded_.end()) {
      guard = it->second;
      guarded_.erase(it);
    }
  }
  if (guard) {
    std::vector<unsigned char> seen(guard);
    from_pool_(seen.data(), static_cast<const unsigned char*>(ptr) + bytes, guard);
    std::size_t first = guard;
    for (std::size_t i = 0; i < guard && first == guard; ++i)
      if (seen[i] != kGuardByte) first = i;
    if (first < guard) {
      const std::string msg = "pool '" + name_ + "': a write past the end of a buffer of " + std::to_string(bytes) +
                              " B (tag " + std::string(tag_name(tag)) + ") changed guard byte " +
                              std::to_string(first);
      std::fprintf(stderr, "memtrade: %s\n", msg.c_str());
      std::lock_guard lock(mu_);
      violations_.push_back(msg);
    }
  }
  raw_free_(ptr);
  std::lock_guard lock(mu_);
  auto drop = [bytes](UsageStats& s) {
    s.live -= bytes;
    s.count -= 1;
  };
  drop(total_);
  drop(tags_[static_cast<std::size_t>(tag)]);
}

void TrackedAllocator::set_guard_bytes(std::size_t n) {
  std::lock_guard lock(mu_);
  guard_ = n;
}
std::size_t TrackedAllocator::guard_bytes() const {
  std::lock_guard lock(mu_);
  return guard_;
}
void TrackedAllocator::set_guard_copy(RawCopy to_pool, RawCopy from_pool) {
  std::lock_guard lock(mu_);
  to_pool_ = std::move(to_pool);
  from_pool_ = std::move(from_pool);
}
std::vector<std::string> TrackedAllocator::guard_violations() const {
  std::lock_guard lock(mu_);
  return violations_;
}
void TrackedAllocator::clear_guard_violations() {
  std::lock_guard lock(mu_);
  violations_.clear();
}

std::size_t default_guard_bytes(bool want) {
  if (const char* env = std::getenv("MEMTRADE_GUARD_BYTES")) return std::strtoull(env, nullptr, 10);
#ifndef NDEBUG
  want = true;
#endif
  return want ? 64 : 0;
}

void TrackedAllocator::set_capacity(std::optional<std::size_t> bytes) {
  std::lock_guard lock(mu_);
  capacity_ = bytes;
}
std::optional<std::size_t> TrackedAllocator::capacity() const {
  std::lock_guard lock(mu_);
  return capacity_;
}
void TrackedAllocator::reset_peak() {
  std::lock_guard lock(mu_);
  total_.peak = total_.live;
  for (auto& t : tags_) t.peak = t.live;
}
UsageStats TrackedAllocator::total() const {
  std::lock_guard lock(mu_);
  return total_;
}
UsageStats TrackedAllocator::by_tag(Tag tag) const {
  std::lock_guard lock(mu_);
  return tags_[static_cast<std::size_t>(tag)];
}
std::size_t TrackedAllocator::allocations_made() const {
  std::lock_guard lock(mu_);
  return made_;
}

Buffer::Buffer(TrackedAllocator& pool, std::size_t bytes, Tag tag)
    : pool_(&pool), ptr_(pool.allocate(bytes, tag)), bytes_(bytes), tag_(tag) {}
Buffer::Buffer(Buffer&& o) noexcept
    : pool_(std::exchange(o.pool_, nullptr)), ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)), tag_(o.tag_) {}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    pool_ = std::exchange(o.pool_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    tag_ = o.tag_;
  }
  return *this;
}
Buffer::~Buffer() { reset(); }
void Buffer::reset() {
  if (pool_ && ptr_) pool_->release(ptr_, bytes_, tag_);
  pool_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace memtrade
