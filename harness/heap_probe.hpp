// Untracked host memory: the process's malloc family, counted while a measurement is open.
//
// The harness defines malloc, free, calloc, realloc and the aligned variants in the executable; they
// forward to glibc (__libc_malloc, ...) and, between begin() and end(), add up the usable size of
// every block allocated minus every block freed, on all threads. The tracked pools allocate under an
// Exempt guard, so what is counted is memory that escaped them: a std::vector inside a workload's run,
// a library's scratch buffer. Not seen: mmap and brk called directly (OpenBLAS's buffer pool, CUDA's
// pinned memory), and blocks freed during the window that were allocated before it (they lower the
// count). Off under sanitizers, which own malloc themselves: available() is false there.
#pragma once

#include <cstddef>

namespace memtrade::heap_probe {

bool available();
// Starts counting from zero on every thread. Windows do not nest.
void begin();
// Stops counting; the peak of the net bytes allocated since begin() (0 or more).
std::size_t end();

// While one is alive, this thread's allocations and frees are not counted (the tracked pools).
class Exempt {
 public:
  Exempt();
  ~Exempt();
  Exempt(const Exempt&) = delete;
  Exempt& operator=(const Exempt&) = delete;
};

}  // namespace memtrade::heap_probe
