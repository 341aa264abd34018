#include "common/common.hpp"

#include <cstdint>
#include <cstdio>

namespace memtrade {

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

}  // namespace memtrade
