// The CUDA read-stream probe's kernel (harness/read_stream.cuh) on the CPU under the tests' CUDA
// emulation: every 32-bit word of the buffer is added once, for lengths below one grid stride, at exact
// multiples of four strides and between them.
#include "cuda_emulation.hpp"  // first: it defines the CUDA keywords for the kernel's header

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "harness/read_stream.cuh"

namespace {

unsigned long long emulated_sum(const std::vector<uint4>& words, unsigned blocks, unsigned threads) {
  unsigned long long out = 0;
  memtrade::test::cuda_emulation::launch(blocks, 1, threads, [&] {
    memtrade::probe_kernels::read_stream_sum(words.data(), words.size(), &out);
  });
  return out;
}

}  // namespace

TEST(ReadStreamProbeEmulated, EveryWordIsAddedOnce) {
  std::mt19937 rng(7);
  constexpr unsigned kBlocks = 3, kThreads = 64, kStride = kBlocks * kThreads;
  for (std::size_t n : {std::size_t{1}, std::size_t{50}, std::size_t{kStride}, std::size_t{4 * kStride},
                        std::size_t{4 * kStride + 1}, std::size_t{7 * kStride + 11}, std::size_t{2000}}) {
    std::vector<uint4> words(n);
    unsigned long long expected = 0;
    for (auto& w : words) {
      w = {static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
      expected += static_cast<unsigned long long>(w.x) + w.y + w.z + w.w;
    }
    EXPECT_EQ(emulated_sum(words, kBlocks, kThreads), expected) << n << " words";
  }
}
