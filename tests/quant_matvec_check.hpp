// The checks the CUDA quantized and dense matvec kernels are held to, on a device (test_cuda) and under
// the CPU emulation (test_quant_emulated): the same cases, the same bounds.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.hpp"
#include "impls/quant/calibration.hpp"
#include "impls/quant/formats.hpp"
#include "impls/quant/matvec.hpp"

namespace memtrade::test::quant_matvec {

// Formats (int4-g40: chunks of 16 codes that straddle groups) and shapes: 300 x 512 and 9 x 8192 fit the
// 8-rows kernel (a partial last block; two chunks per thread), the others do not (rows not in whole
// 16-code chunks) and take the generic one.
inline const char* const kFormats[] = {"int8",     "int4-g128",       "int4-asym-g32", "int4-g40",
                                       "fp8-e4m3", "fp8-e5m2-tensor", "nf4",           "nf4-dq"};
inline const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {37, 200}, {64, 4101}, {300, 512}, {9, 8192}};
inline const std::pair<int64_t, int64_t> kDenseShapes[] = {{1, 8}, {37, 200}, {64, 4101}, {300, 512}};

// One quantized case: the blob, its dequantized weights, x and the float64 reference.
struct Case {
  quant::QLayout L;
  std::vector<uint8_t> blob;
  std::vector<float> x, ref, deq;
};
inline Case make_case(const char* name, int64_t N, int64_t K) {
  Case c{quant::layout(quant::parse_spec(name), N, K), {}, quant::synthetic_activations(1, K, 4), std::vector<float>(N),
         std::vector<float>(N * K)};
  const auto w = quant::synthetic_weights(N, K, 3);
  c.blob.resize(c.L.total_bytes());
  quant::quantize(c.L, w.data(), c.blob.data());
  quant::matvec_reference(c.L, c.blob.data(), c.x.data(), c.ref.data());
  quant::dequantize(c.L, c.blob.data(), c.deq.data());
  return c;
}

// y within (K + 3) u / (1 - (K + 3) u) * sum |w x| of the reference: fp32 summation of K products in any
// order, the group-scale step and the reference's final rounding (the CPU kernels' bound too).
inline void expect_within_bound(const Case& c, const float* y, const std::string& what) {
  const int64_t N = c.L.rows, K = c.L.cols;
  const double u = 0x1p-24, g = (K + 3) * u / (1 - (K + 3) * u);
  for (int64_t r = 0; r < N; ++r) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += std::fabs(double(c.deq[r * K + k]) * c.x[k]);
    ASSERT_TRUE(std::isfinite(y[r])) << what << " row " << r;
    ASSERT_LE(std::fabs(double(y[r]) - c.ref[r]), g * s + 1e-30) << what << " row " << r;
  }
}

// A dense case: fp32 weights, their bf16 rounding and x.
struct DenseCase {
  int64_t N, K;
  std::vector<float> w, x;
  std::vector<bf16_t> wb;
};
inline DenseCase make_dense_case(int64_t N, int64_t K) {
  DenseCase c{N, K, quant::synthetic_weights(N, K, 5), quant::synthetic_activations(1, K, 6), std::vector<bf16_t>(N * K)};
  for (int64_t i = 0; i < N * K; ++i) c.wb[i] = to_bf16(c.w[i]);
  return c;
}

// y (of the fp32 or the bf16 weights) within (K + 1) u / (1 - (K + 1) u) * sum |w x| of the float64
// product: fp32 sums of K products in any order.
inline void expect_dense_within_bound(const DenseCase& c, bool bf16, const float* y) {
  const int64_t N = c.N, K = c.K;
  const double u = 0x1p-24, g = (K + 1) * u / (1 - (K + 1) * u);
  for (int64_t r = 0; r < N; ++r) {
    double ref = 0, s = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double wk = bf16 ? double(to_float(c.wb[r * K + k])) : double(c.w[r * K + k]);
      ref += wk * c.x[k];
      s += std::fabs(wk * c.x[k]);
    }
    ASSERT_LE(std::fabs(double(y[r]) - ref), g * s + 1e-30) << (bf16 ? "bf16 " : "fp32 ") << N << "x" << K << " row " << r;
  }
}

}  // namespace memtrade::test::quant_matvec
