// Shared basics for every memtrade translation unit: the host/device function
// qualifier, the project's error types and a checking macro.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD inline
#endif

namespace memtrade {

// Any failure the harness reports as a message (bad input, bad config, library errors).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An implementation cannot run this case here (no device, unsupported option). Recorded as "skipped".
class Skip : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation would exceed a pool's capacity. Recorded as the case's "oom" status.
class OutOfMemory : public std::runtime_error {
 public:
  OutOfMemory(const std::string& pool, const std::string& tag, std::size_t requested, std::size_t live,
              std::size_t capacity);
  std::string pool, tag;
  std::size_t requested, live, capacity;
};

std::string format_bytes(double bytes);  // "1.50 MiB"

}  // namespace memtrade

#define MT_CHECK(cond, msg)                                         \
  do {                                                              \
    if (!(cond)) throw ::memtrade::Error(std::string(msg));         \
  } while (0)
