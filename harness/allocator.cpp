#include "harness/allocator.hpp"

#include <cstdio>
#include <utility>

namespace memtrade {

std::string_view tag_name(Tag t) {
  static constexpr std::array<std::string_view, kTagCount> names = {
      "io", "weights", "master", "grads", "optimizer", "activations", "workspace", "kv", "other"};
  return names.at(static_cast<std::size_t>(t));
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

static std::string oom_message(const std::string& pool, const std::string& tag, std::size_t requested,
                               std::size_t live, std::size_t capacity) {
  std::string msg = "out of memory in pool '" + pool + "': request of " + std::to_string(requested) +
                    " B (tag " + tag + ") with " + std::to_string(live) + " B live";
  if (capacity != SIZE_MAX) msg += " exceeds capacity " + std::to_string(capacity) + " B (" + format_bytes(capacity) + ")";
  else msg += ": the underlying allocator failed";
  return msg;
}

OutOfMemory::OutOfMemory(const std::string& pool_, const std::string& tag_, std::size_t requested_,
                         std::size_t live_, std::size_t capacity_)
    : std::runtime_error(oom_message(pool_, tag_, requested_, live_, capacity_)),
      pool(pool_), tag(tag_), requested(requested_), live(live_), capacity(capacity_) {}

TrackedAllocator::TrackedAllocator(std::string pool_name, RawAlloc alloc, RawFree release)
    : name_(std::move(pool_name)), raw_alloc_(std::move(alloc)), raw_free_(std::move(release)) {}

TrackedAllocator::~TrackedAllocator() {
  if (total_.live != 0)
    std::fprintf(stderr, "memtrade: pool '%s' destroyed with %zu B in %zu allocations still live\n", name_.c_str(),
                 total_.live, total_.count);
}

void* TrackedAllocator::allocate(std::size_t bytes, Tag tag) {
  if (bytes == 0) return nullptr;
  std::size_t live;
  {
    std::lock_guard lock(mu_);
    live = total_.live;
    if (capacity_ && (bytes > *capacity_ || live > *capacity_ - bytes))
      throw OutOfMemory(name_, std::string(tag_name(tag)), bytes, live, *capacity_);
  }
  void* p = raw_alloc_(bytes);
  if (!p) throw OutOfMemory(name_, std::string(tag_name(tag)), bytes, live, SIZE_MAX);
  std::lock_guard lock(mu_);
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
  raw_free_(ptr);
  std::lock_guard lock(mu_);
  auto drop = [bytes](UsageStats& s) {
    s.live -= bytes;
    s.count -= 1;
  };
  drop(total_);
  drop(tags_[static_cast<std::size_t>(tag)]);
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
