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

#include "impls/quant/calibration.hpp"
#include "impls/quant/matvec.hpp"
#include "impls/quant/matvec_kernels.cuh"

using namespace memtrade;
using namespace memtrade::quant;
namespace mk = memtrade::quant::matvec_kernels;

namespace {

// 16-byte aligned copies of the inputs, as cudaMalloc gives them.
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

// (K + 3) u / (1 - (K + 3) u) * sum |w x|: fp32 sums of K products in any order, the group-scale step and
// the reference's final rounding (the bound test_cuda's QuantCuda test applies on a device).
void expect_within_bound(const QLayout& L, const std::vector<float>& deq, const std::vector<float>& x,
                         const std::vector<float>& ref, const float* y, const std::string& what) {
  const int64_t N = L.rows, K = L.cols;
  const double u = 0x1p-24, g = (K + 3) * u / (1 - (K + 3) * u);
  for (int64_t r = 0; r < N; ++r) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += std::fabs(double(deq[r * K + k]) * x[k]);
    ASSERT_TRUE(std::isfinite(y[r])) << what << " row " << r;
    ASSERT_LE(std::fabs(double(y[r]) - ref[r]), g * s + 1e-30) << what << " row " << r;
  }
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
  for (const char* name : {"int8", "int4-g128", "int4-asym-g32", "int4-g40", "fp8-e4m3", "fp8-e5m2-tensor", "nf4", "nf4-dq"})
    // 300 x 512 and 9 x 8192 fit the 8-rows kernel (a partial last block; two chunks per thread), 37 x 200
    // and 64 x 4101 do not (rows not in whole 16-code chunks); every shape also runs the generic kernel.
    for (auto [N, K] : {std::pair<int64_t, int64_t>{1, 1}, {37, 200}, {64, 4101}, {300, 512}, {9, 8192}}) {
      const QLayout L = layout(parse_spec(name), N, K);
      const auto w = synthetic_weights(N, K, 3);
      const auto xs = synthetic_activations(1, K, 4);
      std::vector<uint8_t> blob_v(L.total_bytes());
      quantize(L, w.data(), blob_v.data());
      std::vector<float> ref(N), deq(N * K);
      matvec_reference(L, blob_v.data(), xs.data(), ref.data());
      dequantize(L, blob_v.data(), deq.data());
      const Aligned<uint8_t> blob(blob_v);
      const Aligned<float> x(xs);
      const std::string what = std::string(name) + " " + std::to_string(N) + "x" + std::to_string(K);
      with_format(L.spec.format, [&]<Format F>() {
        std::vector<float> y(N, NAN);
        test::cuda_emulation::launch(static_cast<unsigned>((N + mk::kWarpsPerBlock - 1) / mk::kWarpsPerBlock), 1,
                                     mk::kWarpsPerBlock * 32, [&] { mk::matvec_any_kernel<F>(L, blob.p, x.p, y.data()); });
        expect_within_bound(L, deq, xs, ref, y.data(), what + " generic kernel");
        ++any_cases;
        if (!mk::rows_kernel_fits<F>(L, blob.p, x.p)) return;
        std::fill(y.begin(), y.end(), NAN);
        test::cuda_emulation::launch(static_cast<unsigned>((N + mk::kBlockRows - 1) / mk::kBlockRows), 1, mk::kRowThreads,
                                     [&] { mk::matvec_rows_kernel<F>(L, blob.p, x.p, y.data()); });
        expect_within_bound(L, deq, xs, ref, y.data(), what + " 8-rows kernel");
        ++rows_cases;
      });
    }
  // Both kernels ran: the 8-rows one on the aligned shapes of every format (int4-g40's chunks straddle
  // groups there, its code-by-code branch), the generic one everywhere.
  EXPECT_EQ(any_cases, 40);
  EXPECT_EQ(rows_cases, 16);
}

TEST(QuantCudaEmulated, DenseKernelsWithinTheFp32BoundOfTheFloat64Product) {
  for (auto [N, K] : {std::pair<int64_t, int64_t>{1, 8}, {37, 200}, {64, 4101}, {300, 512}}) {
    const auto w = synthetic_weights(N, K, 5);
    const auto xs = synthetic_activations(1, K, 6);
    std::vector<bf16_t> wb(N * K);
    for (int64_t i = 0; i < N * K; ++i) wb[i] = to_bf16(w[i]);
    const Aligned<float> x(xs), wf(w);
    const Aligned<bf16_t> wh(wb);
    for (const bool bf16 : {false, true}) {
      std::vector<float> y(N, NAN);
      const int64_t E = bf16 ? 8 : 4;
      const bool chunks = K % E == 0;
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
      const double u = 0x1p-24, g = (K + 1) * u / (1 - (K + 1) * u);  // fp32 sums of K products in any order
      for (int64_t r = 0; r < N; ++r) {
        double ref = 0, s = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double wk = bf16 ? double(to_float(wb[r * K + k])) : double(w[r * K + k]);
          ref += wk * xs[k];
          s += std::fabs(wk * xs[k]);
        }
        ASSERT_LE(std::fabs(double(y[r]) - ref), g * s + 1e-30) << (bf16 ? "bf16 " : "fp32 ") << N << "x" << K << " row " << r;
      }
    }
  }
}
