#include "harness/heap_probe.hpp"

#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

namespace memtrade::heap_probe {
namespace {
constinit std::atomic<bool> g_active{false};
constinit std::atomic<std::int64_t> g_net{0};
constinit std::atomic<std::int64_t> g_peak{0};
constinit thread_local int t_exempt = 0;
}  // namespace

// Adds n bytes (negative for a free) to the net count of an open window, outside exempt threads.
[[maybe_unused]] static void add_net(std::int64_t n) {
  if (n == 0 || !g_active.load(std::memory_order_relaxed) || t_exempt) return;
  const std::int64_t now = g_net.fetch_add(n, std::memory_order_relaxed) + n;
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
[[maybe_unused]] static std::int64_t usable(void* p) { return p ? static_cast<std::int64_t>(malloc_usable_size(p)) : 0; }
[[maybe_unused]] static void on_alloc(void* p) { add_net(usable(p)); }
[[maybe_unused]] static void on_free(void* p) { add_net(-usable(p)); }

#ifdef MEMTRADE_NO_HEAP_PROBE
bool available() { return false; }
#else
bool available() { return true; }
#endif

void begin() {
  g_net.store(0);
  g_peak.store(0);
  g_active.store(true);
}

std::size_t end() {
  g_active.store(false);
  return static_cast<std::size_t>(g_peak.load());
}

Exempt::Exempt() { ++t_exempt; }
Exempt::~Exempt() { --t_exempt; }

}  // namespace memtrade::heap_probe

#ifndef MEMTRADE_NO_HEAP_PROBE
// The malloc family, defined in the executable so that every library's calls come here first.
extern "C" {
void* __libc_malloc(std::size_t);
void __libc_free(void*);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

using memtrade::heap_probe::on_alloc;
using memtrade::heap_probe::on_free;

void* malloc(std::size_t n) {
  void* p = __libc_malloc(n);
  on_alloc(p);
  return p;
}
void free(void* p) {
  on_free(p);
  __libc_free(p);
}
void* calloc(std::size_t n, std::size_t m) {
  void* p = __libc_calloc(n, m);
  on_alloc(p);
  return p;
}
void* realloc(void* p, std::size_t n) {
  if (!p) return malloc(n);
  if (n == 0) {  // glibc frees and returns NULL
    free(p);
    return nullptr;
  }
  const std::int64_t old = memtrade::heap_probe::usable(p);
  void* q = __libc_realloc(p, n);
  if (q) memtrade::heap_probe::add_net(memtrade::heap_probe::usable(q) - old);  // the old block freed, the new one made
  return q;
}
void* reallocarray(void* p, std::size_t n, std::size_t m) {
  std::size_t bytes;
  if (__builtin_mul_overflow(n, m, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(p, bytes);
}
void* memalign(std::size_t align, std::size_t n) {
  void* p = __libc_memalign(align, n);
  on_alloc(p);
  return p;
}
void* aligned_alloc(std::size_t align, std::size_t n) { return memalign(align, n); }
int posix_memalign(void** out, std::size_t align, std::size_t n) {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  void* p = memalign(align, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
void* valloc(std::size_t n) { return memalign(static_cast<std::size_t>(sysconf(_SC_PAGESIZE)), n); }
void* pvalloc(std::size_t n) {
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return memalign(page, (n + page - 1) / page * page);
}
}
#endif
