// Host buffers backed by transparent huge pages where the kernel offers them.
//
// With 4 KiB pages a buffer of tens of MiB needs thousands of TLB entries; under a hypervisor every
// miss is a two-level page walk, and where a process's pages land decides how many walks miss the
// caches. On a 2-core VM a 16 MiB read-only sweep, 20 processes each, measured a median of 20.8 GB/s per
// process with 4 KiB pages (14-29, and two processes at 3) and 26.6 GB/s with 2 MiB pages (22-31); the
// copy probe read 25-27 GB/s against 32-39. A memory-bound case on 4 KiB pages runs partly at a speed
// drawn per process, which the time gate's rounds do not average away, and bandwidth ceilings come out
// low. So the harness's host allocations of 2 MiB or more are aligned to 2 MiB, rounded up to
// whole 2 MiB pages and advised MADV_HUGEPAGE before their first touch (what PyTorch's CPU allocator
// does with THP_MEM_ALLOC_ENABLE). The tracked byte counts are the requested sizes, unchanged.
//
// $MEMTRADE_HUGE_PAGES=off turns this off (4 KiB pages unless the kernel's THP mode is `always`);
// results record the mode as `huge_pages`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace memtrade {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

// "madvise": buffers of kHugePageBytes or more are aligned, rounded and advised (THP `madvise` or
//            `always` in /sys/kernel/mm/transparent_hugepage/enabled);
// "off":     $MEMTRADE_HUGE_PAGES=off (or 0 / no);
// "unavailable": the kernel has no THP or has it set to `never`.
// Error for any other value of $MEMTRADE_HUGE_PAGES (on / 1 / yes ask for the default).
const std::string& huge_pages_mode();  // decided once per process
// The rule huge_pages_mode() applies, given $MEMTRADE_HUGE_PAGES (nullptr when unset) and the kernel's
// THP setting (the bracketed word of .../transparent_hugepage/enabled, "" when there is none).
std::string huge_pages_mode_for(const char* env_value, const std::string& thp_setting);

// Host memory aligned to 64 bytes (2 MiB for huge-page buffers; see above); release with std::free.
// nullptr when the system has no memory for it.
void* host_pages_alloc(std::size_t bytes);

// A plain byte buffer from host_pages_alloc (for the harness's own probes and cache flush).
struct HostPagesFree {
  void operator()(void* p) const;
};
using HostPages = std::unique_ptr<unsigned char[], HostPagesFree>;
// Error (naming the size) when the memory is not there; the bytes are not initialized.
HostPages make_host_pages(std::size_t bytes);

// Evicts the host caches before a cold-cache measurement: reads (not writes) a buffer of twice the
// last-level cache (64 MiB where the size is unknown or under 16 MiB), one load per 64-byte line, on
// every OpenMP thread, so the caches are left holding clean lines (the measured call's loads evict
// without write-backs) and the thread team is awake when the call starts. Used by the CPU device before
// every cold-cache call and by the bandwidth probe before every timed copy or read, so that both are
// measured from memory, not from a last-level cache that may hold most of a 256 MiB buffer (260 MiB on
// some cloud VMs). Returns the rate at which it read (every line of the buffer, bytes per second): a
// sample of the machine's read bandwidth taken right before the call it precedes, so a cold call can be
// compared with what memory delivered at that moment (a VM's rate moves with its neighbours: one 2-core
// VM's probe gave 54-60 GB/s of copy in some minutes and 92-105 in others).
class CacheFlush {
 public:
  double operator()();  // allocates the buffer on first use

 private:
  HostPages buf_;
  std::size_t words_ = 0;
  volatile std::uint64_t sink_ = 0;
};

}  // namespace memtrade
