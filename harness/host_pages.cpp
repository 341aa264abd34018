#include "harness/host_pages.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <unistd.h>

#include "common/common.hpp"

namespace memtrade {

namespace {

// The bracketed word of /sys/kernel/mm/transparent_hugepage/enabled ("always [madvise] never").
std::string thp_setting() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!f || !std::getline(f, line)) return "";
  const auto a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos || b < a ? "" : line.substr(a + 1, b - a - 1);
}

}  // namespace

std::string huge_pages_mode_for(const char* env_value, const std::string& thp) {
  if (env_value != nullptr) {
    const std::string s(env_value);
    if (s == "off" || s == "0" || s == "no") return "off";
    if (!(s.empty() || s == "on" || s == "1" || s == "yes"))
      throw Error("MEMTRADE_HUGE_PAGES=" + s + ": expected on or off");
  }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (thp == "madvise" || thp == "always") return "madvise";
#else
  (void)thp;
#endif
  return "unavailable";
}

const std::string& huge_pages_mode() {
  static const std::string mode = huge_pages_mode_for(std::getenv("MEMTRADE_HUGE_PAGES"), thp_setting());
  return mode;
}

void* host_pages_alloc(std::size_t bytes) {
  constexpr std::size_t kLine = 64;
  if (bytes < kHugePageBytes || huge_pages_mode() != "madvise")
    return std::aligned_alloc(kLine, (bytes + kLine - 1) / kLine * kLine);
  const std::size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where the kernel cannot give huge pages the buffer keeps 4 KiB ones.
  if (p != nullptr) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

void HostPagesFree::operator()(void* p) const { std::free(p); }

HostPages make_host_pages(std::size_t bytes) {
  void* p = host_pages_alloc(bytes);
  if (p == nullptr) throw Error("out of host memory: " + std::to_string(bytes) + " bytes for a harness buffer");
  return HostPages(static_cast<unsigned char*>(p));
}

double CacheFlush::operator()() {
  if (!buf_) {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    words_ = 2 * static_cast<std::size_t>(llc > (16L << 20) ? llc : (64L << 20)) / 8;
    buf_ = make_host_pages(words_ * 8);
    std::memset(buf_.get(), 1, words_ * 8);
  }
  const auto* w = reinterpret_cast<const std::uint64_t*>(buf_.get());
  const auto n = static_cast<int64_t>(words_);
  std::uint64_t sum = 0;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for reduction(+ : sum)
  for (int64_t i = 0; i < n; i += 8) sum += w[i];
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sink_ = sum;
  return s > 0 ? static_cast<double>(words_ * 8) / s : 0.0;
}

}  // namespace memtrade
