// The CUDA quantized-matvec kernels (impls/quant/matvec_kernels.cuh) run on the CPU under the tests' CUDA
// emulation: the chunk decode against decode_value bit for bit, and both matvec kernels and both dense
// kernels against the float64 reference within the fp32 summation bound, on the shapes test_cuda's
// QuantCuda tests run on a device.
#include "cuda_emulation.hpp"  // first: it defines the CUDA keywords for the kernels' header

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "impls/quant/matvec_kernels.cuh"
#include "quant_matvec_check.hpp"

using namespace memtrade;
using namespace memtrade::quant;
namespace mk = memtrade::quant::matvec_kernels;
namespace qm = memtrade::test::quant_matvec;

namespace {

// 64-byte aligned copies of the inputs (cudaMalloc gives 256).
template <class T>
struct Aligned {
  std::vector<T> v;
  T* p;
  explicit Aligned(const std::vector<T>& src) : v(src.size() + 64 / sizeof(T)) {
    auto a = reinterpret_cast<std::uintptr_t>(v.data());
    p = reinterpret_cast<T*>((a + 63) / 64 * 64);
    std::memcpy(p, src.data(), src.size() * sizeof(T));
  }
};

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST(QuantCudaEmulated, ChunkDecodeGivesDecodeValuesBits) {
  const float nf4_table[16] = {};  // (unused by the integer formats; nf4 and fp8 take the generic decode)
  // int8: every byte, 16 to a chunk.
  for (int c = 0; c < 16; ++c) {
    uint8_t codes[16];
    for (int j = 0; j < 16; ++j) codes[j] = static_cast<uint8_t>(16 * c + j);
    uint4 w;
    std::memcpy(&w, codes, 16);
    float u[mk::kChunkCodes];
    mk::unscaled_chunk<Format::int8>(w, 0.f, nf4_table, u);
    for (int j = 0; j < 16; ++j)
      ASSERT_EQ(bits(u[j]), bits(decode_value(Format::int8, codes[j], 1.f, 0.f))) << "int8 code " << int(codes[j]);
  }
  // The 4-bit integer formats: every nibble at every position of the chunk, every zero point.
  for (int shift = 0; shift < 16; ++shift) {
    uint8_t packed[8];
    for (int b = 0; b < 8; ++b)
      packed[b] = static_cast<uint8_t>(((2 * b + shift) & 15) | ((2 * b + 1 + shift) & 15) << 4);
    uint2 w;
    std::memcpy(&w, packed, 8);
    for (int zero = 0; zero < 16; ++zero) {
      float u[mk::kChunkCodes], v[mk::kChunkCodes];
      mk::unscaled_chunk<Format::int4_asym>(w, static_cast<float>(zero), nf4_table, u);
      mk::unscaled_chunk<Format::int4>(w, static_cast<float>(zero), nf4_table, v);
      for (int j = 0; j < 16; ++j) {
        const uint8_t q = nibble(packed, j);
        ASSERT_EQ(q, (j + shift) & 15);
        const float want = decode_value(Format::int4_asym, q, 1.f, static_cast<float>(zero));
        ASSERT_EQ(bits(u[j]), bits(want)) << "int4-asym nibble " << int(q) << " zero " << zero;
        ASSERT_EQ(bits(v[j]), bits(want)) << "int4 nibble " << int(q) << " zero " << zero;
      }
    }
  }
}

TEST(QuantCudaEmulated, MatvecKernelsWithinTheFp32BoundOfTheReference) {
  int rows_cases = 0, any_cases = 0;
  for (const char* name : qm::kFormats)
    for (const auto& [N, K] : qm::kShapes) {
      const qm::Case c = qm::make_case(name, N, K);
      const Aligned<uint8_t> blob(c.blob);
      const Aligned<float> x(c.x);
      const std::string what = std::string(name) + " " + std::to_string(N) + "x" + std::to_string(K);
      with_format(c.L.spec.format, [&]<Format F>() {
        std::vector<float> y(N, NAN);
        test::cuda_emulation::launch(static_cast<unsigned>((N + mk::kWarpsPerBlock - 1) / mk::kWarpsPerBlock), 1,
                                     mk::kWarpsPerBlock * 32, [&] { mk::matvec_any_kernel<F>(c.L, blob.p, x.p, y.data()); });
        qm::expect_within_bound(c, y.data(), what + " generic kernel");
        ++any_cases;
        if (!mk::rows_kernel_fits<F>(c.L, blob.p, x.p)) return;
        std::fill(y.begin(), y.end(), NAN);
        test::cuda_emulation::launch(static_cast<unsigned>((N + mk::kBlockRows - 1) / mk::kBlockRows), 1, mk::kRowThreads,
                                     [&] { mk::matvec_rows_kernel<F>(c.L, blob.p, x.p, y.data()); });
        qm::expect_within_bound(c, y.data(), what + " 8-rows kernel");
        ++rows_cases;
      });
    }
  // Both kernels ran: the 8-rows one on the aligned shapes of every format (int4-g40's chunks straddle
  // groups there, its code-by-code branch), the generic one everywhere.
  EXPECT_EQ(any_cases, 40);
  EXPECT_EQ(rows_cases, 16);
}

TEST(QuantCudaEmulated, DenseKernelsWithinTheFp32BoundOfTheFloat64Product) {
  for (const auto& [N, K] : qm::kDenseShapes) {
    const qm::DenseCase c = qm::make_dense_case(N, K);
    const Aligned<float> x(c.x), wf(c.w);
    const Aligned<bf16_t> wh(c.wb);
    for (const bool bf16 : {false, true}) {
      std::vector<float> y(N, NAN);
      const bool chunks = K % (bf16 ? 8 : 4) == 0;  // 16-byte chunks of weights: the 8-rows kernel
      auto run = [&](auto* wp) {
        if (chunks)
          test::cuda_emulation::launch(static_cast<unsigned>((N + mk::kBlockRows - 1) / mk::kBlockRows), 1, mk::kRowThreads,
                                       [&] { mk::matvec_dense_kernel(wp, x.p, y.data(), N, K); });
        else
          test::cuda_emulation::launch(static_cast<unsigned>((N + mk::kWarpsPerBlock - 1) / mk::kWarpsPerBlock), 1,
                                       mk::kWarpsPerBlock * 32, [&] { mk::matvec_dense_any_kernel(wp, x.p, y.data(), N, K); });
      };
      if (bf16) run(static_cast<const bf16_t*>(wh.p));
      else run(static_cast<const float*>(wf.p));
      qm::expect_dense_within_bound(c, bf16, y.data());
    }
  }
}
