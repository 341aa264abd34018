#include "harness/probe.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "datasets/random.hpp"
#include "common/blas.hpp"
#include "harness/host_pages.hpp"

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace memtrade {

namespace {
// n bytes from src to dst with non-temporal stores (SSE2, in every x86-64 CPU): the destination's lines
// go to memory without first being read into the caches, as a streaming copy does; memcpy elsewhere, and
// for what is not 16-byte aligned.
void stream_copy(unsigned char* dst, const unsigned char* src, std::size_t n) {
#if defined(__x86_64__)
  std::size_t i = 0;
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0) {
    for (; i + 64 <= n; i += 64)
      for (std::size_t j = 0; j < 64; j += 16)
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + j), _mm_load_si128(reinterpret_cast<const __m128i*>(src + i + j)));
    _mm_sfence();
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

// The fastest of reps calls of f, each after before() (untimed).
template <class F, class B = void (*)()>
double best_seconds(int reps, F&& f, B&& before = [] {}) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    before();
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
}  // namespace

Ceilings probe_cpu() {
  Ceilings c;
  {
    const int64_t n = 2048;
    // The harness's own host pages (huge pages where offered), as the measured buffers have.
    HostPages pa = make_host_pages(n * n * 4), pb = make_host_pages(n * n * 4), po = make_host_pages(n * n * 4);
    float *a = reinterpret_cast<float*>(pa.get()), *b = reinterpret_cast<float*>(pb.get()),
          *out = reinterpret_cast<float*>(po.get());
    std::fill(out, out + n * n, 0.f);
    for (int64_t i = 0; i < n * n; ++i) {
      a[i] = static_cast<float>(datasets::uniform01(1, i) - 0.5);
      b[i] = static_cast<float>(datasets::uniform01(2, i) - 0.5);
    }
    auto gemm = [&] { blas::sgemm(false, false, n, n, n, 1.f, a, n, b, n, 0.f, out, n); };
    gemm();  // warm-up: thread pool start, page faults
    c["cpu_fp32_gemm_flops"] = 2.0 * n * n * n / best_seconds(5, gemm);
  }
  {
    const std::size_t bytes = 256u << 20;
    HostPages ps = make_host_pages(bytes), pd = make_host_pages(bytes);
    unsigned char *src = ps.get(), *dst = pd.get();
    std::memset(src, 1, bytes);
    std::memset(dst, 0, bytes);
    for (std::size_t i = 0; i < bytes; i += 4096) src[i] = static_cast<unsigned char>(i >> 12);
    // Every OpenMP thread copies its share: the kernels measured against this ceiling run on all of them
    // (one core alone reaches about half the machine's bandwidth on a 2-core VM). Two ways, the faster one
    // the ceiling: memcpy, and a copy with non-temporal stores. On a 2-core AMD EPYC (Zen 2) VM glibc's
    // memcpy moved 31.6-32.7 GB/s and the streaming copy 49-52 (bytes read + written, two threads, three
    // probes), and the CPU AdamW, a streaming kernel, had run at 1.6-2.0x the memcpy figure.
    auto copy_with = [&](auto copy_fn) {
      return [&, copy_fn] {
#pragma omp parallel
        {
          const std::size_t n = static_cast<std::size_t>(omp_get_num_threads()), t = static_cast<std::size_t>(omp_get_thread_num());
          const std::size_t chunk = (bytes + n - 1) / n, lo = std::min(bytes, t * chunk), hi = std::min(bytes, lo + chunk);
          copy_fn(dst + lo, src + lo, hi - lo);
        }
      };
    };
    const auto copy = copy_with([](unsigned char* d, const unsigned char* s, std::size_t n) { std::memcpy(d, s, n); });
    const auto stream = copy_with(stream_copy);
    // Each timed call starts with the caches flushed, as the cold-cache cases it is compared with do: a
    // last-level cache of 260 MiB (some cloud VMs) held most of the source between calls, and the read
    // ceiling came out anywhere from 28 to 48 GB/s on one 2-core VM.
    CacheFlush flush;
    copy();
    stream();
    c["cpu_memcpy_bytes_per_s"] = 2.0 * bytes / best_seconds(5, copy, flush);
    c["cpu_stream_copy_bytes_per_s"] = 2.0 * bytes / best_seconds(5, stream, flush);
    c["cpu_copy_bytes_per_s"] = std::max(c["cpu_memcpy_bytes_per_s"], c["cpu_stream_copy_bytes_per_s"]);
    // Every thread sums its share of the source as 64-bit words (vectorized by the compiler): a stream
    // that only reads, as a matvec over its weights or a decode step over its KV cache does. On a 2-core
    // VM it runs at about two thirds of the copy rate above (which counts the bytes written too, and is
    // served by the string-copy engine's larger requests).
    std::uint64_t sink = 0;
    auto read = [&] {
      std::uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
      {
        const std::size_t n = static_cast<std::size_t>(omp_get_num_threads()), t = static_cast<std::size_t>(omp_get_thread_num());
        const std::size_t words = bytes / 8, chunk = (words + n - 1) / n, lo = std::min(words, t * chunk),
                          hi = std::min(words, lo + chunk);
        const std::uint64_t* w = reinterpret_cast<const std::uint64_t*>(src);
        std::uint64_t s = 0;
        for (std::size_t i = lo; i < hi; ++i) s += w[i];
        total += s;
      }
      sink += total;
    };
    read();
    c["cpu_read_bytes_per_s"] = static_cast<double>(bytes) / best_seconds(5, read, flush);
    volatile std::uint64_t keep = sink;  // the sums are used
    (void)keep;
  }
  return c;
}

#ifndef MEMTRADE_WITH_CUDA
Ceilings probe_cuda() { return {}; }
#endif

}  // namespace memtrade
