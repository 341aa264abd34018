// impls/quant/matvec: optimized host matvec / matmul against the float64 reference for every format,
// on shapes that exercise group and vector tails, odd K, N = 1, M = 1 and M = 37.
//
// Error bound. The reference computes sum_k w_k x_k in float64 from the same dequantized weights and
// rounds once (relative error u = 2^-24 = FLT_EPSILON / 2). The optimized paths differ by
//   - fp32 summation of K terms in any order (vector lanes, groups, sgemm blocking): at most
//     (K - 1) u S to first order, S = sum_k |w_k x_k|; a term's product is exact inside the fma or
//     rounded once (u |w_k x_k|);
//   - the group scale applied to the group's partial sum instead of to each weight: one more rounding
//     of the partial sum (u S), and for fp8 / nf4 the product decode(q) * scale, rounded in the
//     reference's weights, is not formed (u S);
//   - the reference's final rounding (u |y| <= u S).
// Together |y_opt - y_ref| <= (K + 3) u S, taken with the gamma factor (K + 3) u / (1 - (K + 3) u),
// plus 1e-30 for underflowing products.
#include "impls/quant/matvec.hpp"

#include "common/simd/targets.hpp"

#include <gtest/gtest.h>

#include <cfloat>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "datasets/random.hpp"
#include "impls/quant/formats.hpp"
#include "impls/quant/simd/matvec_a16.hpp"
#include "impls/quant/simd/matvec_a8.hpp"
#include "simd_targets.hpp"

using namespace memtrade;
using namespace memtrade::quant;
using memtrade::test::for_each_simd_target;

namespace {

std::vector<float> normal_vec(int64_t n, uint64_t seed, double sd = 1.0) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(sd * datasets::normal(seed, static_cast<uint64_t>(i)));
  return v;
}

double bound(int64_t K, double S) {
  const double g = static_cast<double>(K + 3) * (FLT_EPSILON / 2);
  return g / (1 - g) * S + 1e-30;
}

// S_m,r = sum_k |w_rk x_mk| from the dequantized weights.
std::vector<double> abs_sums(const std::vector<float>& Wd, const float* X, int64_t M, int64_t N, int64_t K) {
  std::vector<double> S(static_cast<std::size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < N; ++r) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += std::fabs(static_cast<double>(Wd[r * K + k]) * X[m * K + k]);
      S[m * N + r] = s;
    }
  return S;
}

const char* kernel_specs[] = {"int8",          "int4-g32",       "int4-g128",      "int4-g7",
                              "int4-asym-g64", "int4-asym-g33", "fp8-e4m3",       "fp8-e5m2",
                              "fp8-e4m3-tensor", "nf4",         "nf4-g31",        "nf4-dq"};

struct Shape {
  int64_t N, K;
};
// {24, 576}: SmolLM2's width, whose last group of 128 is a partial one of 64 (vectorized); {3, 4160}: a
// partial group that starts a new tile of columns (4096).
const Shape shapes[] = {{1, 1},     {1, 7},     {5, 33},    {17, 100}, {64, 257}, {3, 4101},
                        {128, 128}, {2, 31},    {40, 1000}, {24, 576}, {3, 4160}};

}  // namespace

TEST(QuantKernels, EveryTargetIsReachable) {
  const auto all = simd::available_targets();
  ASSERT_FALSE(all.empty());
  for_each_simd_target([&](int64_t t) {
    EXPECT_EQ(simd::target_name(), simd::name_of(t));
    EXPECT_EQ(simd::restricted_below_best(), t != all.front());
    // Below the best target the hand-written AVX-512 kernel stands aside: the portable path runs.
    const QLayout L = layout(parse_spec("int4-g128"), 4, 256);
    if (t != all.front()) {
      EXPECT_EQ(matvec_cpu_path(L), "hwy-" + simd::name_of(t));
    }
  });
  EXPECT_EQ(simd::target_name(), simd::name_of(all.front()));
  EXPECT_FALSE(simd::restricted_below_best());
}

TEST(QuantKernels, MatvecCpuMatchesReference) {
  for_each_simd_target([](int64_t) {
    uint64_t seed = 1;
    for (const char* name : kernel_specs) {
      for (const Shape sh : shapes) {
        const QLayout L = layout(parse_spec(name), sh.N, sh.K);
        const std::vector<float> W = normal_vec(sh.N * sh.K, ++seed, 0.05);
        const std::vector<float> x = normal_vec(sh.K, ++seed);
        std::vector<uint8_t> blob(L.total_bytes());
        quantize(L, W.data(), blob.data());
        std::vector<float> Wd(W.size());
        dequantize(L, blob.data(), Wd.data());
        std::vector<float> yr(sh.N), yo(sh.N, NAN);
        matvec_reference(L, blob.data(), x.data(), yr.data());
        matvec_cpu(L, blob.data(), x.data(), yo.data());
        const std::vector<double> S = abs_sums(Wd, x.data(), 1, sh.N, sh.K);
        for (int64_t r = 0; r < sh.N; ++r) {
          // The reference is the float64 dot product of dequantize()'s weights, rounded once.
          double d = 0;
          for (int64_t k = 0; k < sh.K; ++k) d += static_cast<double>(Wd[r * sh.K + k]) * x[k];
          ASSERT_EQ(yr[r], static_cast<float>(d)) << name << " " << sh.N << "x" << sh.K << " row " << r;
          ASSERT_LE(std::fabs(static_cast<double>(yo[r]) - yr[r]), bound(sh.K, S[r]))
              << name << " " << sh.N << "x" << sh.K << " row " << r << ": " << yo[r] << " vs " << yr[r];
        }
      }
    }
  });
}

TEST(QuantKernels, MatmulCpuMatchesReference) {
  for_each_simd_target([](int64_t) {
    uint64_t seed = 100;
    const Shape mm_shapes[] = {{1, 1}, {5, 33}, {17, 100}, {64, 257}, {2, 31}, {300, 4101}};  // 300 x 4101: two panels
    for (const char* name : kernel_specs) {
      for (const Shape sh : mm_shapes) {
        // M <= kMatmulSmallBatch: the small-batch path (tile-decoded rows); 70: dequantized panels + sgemm
        for (int64_t M : {int64_t{1}, int64_t{3}, int64_t{37}, int64_t{70}}) {
          static_assert(kMatmulSmallBatch >= 37 && kMatmulSmallBatch < 70);
          ASSERT_EQ(matmul_cpu_path(layout(parse_spec(name), sh.N, sh.K), M), M < 70 ? "small-batch" : "panels");
          if (sh.N * sh.K > 100000 && std::string(name) != "int4-asym-g33" && std::string(name) != "nf4-dq") continue;
          const QLayout L = layout(parse_spec(name), sh.N, sh.K);
          const std::vector<float> W = normal_vec(sh.N * sh.K, ++seed, 0.05);
          const std::vector<float> X = normal_vec(M * sh.K, ++seed);
          std::vector<uint8_t> blob(L.total_bytes());
          quantize(L, W.data(), blob.data());
          std::vector<float> Wd(W.size());
          dequantize(L, blob.data(), Wd.data());
          std::vector<float> Yr(M * sh.N), Yo(M * sh.N, NAN);
          std::vector<float> ws(matmul_workspace_bytes(L, M) / sizeof(float));
          if (sh.N == 300) {
            EXPECT_LT(static_cast<int64_t>(ws.size()), sh.N * sh.K) << "panels smaller than W";
          }
          matmul_reference(L, blob.data(), X.data(), M, Yr.data());
          matmul_cpu(L, blob.data(), X.data(), M, Yo.data(), ws.data());
          const std::vector<double> S = abs_sums(Wd, X.data(), M, sh.N, sh.K);
          for (int64_t i = 0; i < M * sh.N; ++i) {
            ASSERT_LE(std::fabs(static_cast<double>(Yo[i]) - Yr[i]), bound(sh.K, S[i]))
                << name << " " << sh.N << "x" << sh.K << " M=" << M << " i " << i << ": " << Yo[i] << " vs " << Yr[i];
          }
          if (M == 1) {  // M = 1 matmul equals the matvec reference exactly
            std::vector<float> yr(sh.N);
            matvec_reference(L, blob.data(), X.data(), yr.data());
            for (int64_t r = 0; r < sh.N; ++r) ASSERT_EQ(yr[r], Yr[r]);
          }
        }
      }
    }
  });
}

TEST(QuantKernels, PanelDequantizationIsBitExact) {
  for_each_simd_target([](int64_t) {
    // matmul_cpu with X = identity rows picks single weights: Y[m, r] = w[r, m] exactly (one nonzero term),
    // through the small-batch path (K = M = 45) and the panels (K = M = 70).
    for (const char* name : kernel_specs)
      for (const int64_t K : {int64_t{45}, int64_t{70}}) {
        const int64_t N = 20;
        const QLayout L = layout(parse_spec(name), N, K);
        const std::vector<float> W = normal_vec(N * K, 777, 0.1);
        std::vector<uint8_t> blob(L.total_bytes());
        quantize(L, W.data(), blob.data());
        std::vector<float> Wd(W.size());
        dequantize(L, blob.data(), Wd.data());
        std::vector<float> X(K * K, 0.f), Y(K * N);
        for (int64_t k = 0; k < K; ++k) X[k * K + k] = 1.f;
        std::vector<float> ws(matmul_workspace_bytes(L, K) / sizeof(float));
        ASSERT_EQ(matmul_cpu_path(L, K), K == 45 ? "small-batch" : "panels");
        matmul_cpu(L, blob.data(), X.data(), K, Y.data(), ws.data());
        for (int64_t k = 0; k < K; ++k)
          for (int64_t r = 0; r < N; ++r) {
            ASSERT_EQ(Y[k * N + r], Wd[r * K + k]) << name << " K " << K << " r" << r << " k" << k;
          }
      }
  });
}

// Every finite fp8 code through the vector decode equals the scalar decode bit for bit, on every target:
// matmul_cpu with X = identity rows through the panels, whose rows are dequantized by decode8 (the matvec
// and the KV decode use the same function). A row of 256 weights holds each code once; the codes that
// are not finite (E4M3's S.1111.111, E5M2's exponent 31) do not occur in quantized weights and are set
// to 0.
TEST(QuantKernels, EveryFp8CodeDecodesAsTheScalarDecode) {
  for (const char* name : {"fp8-e4m3", "fp8-e5m2"}) {
    const bool e4m3 = std::string(name) == "fp8-e4m3";
    const int64_t N = 3, K = 256;
    const QLayout L = layout(parse_spec(name), N, K);
    const std::vector<float> W = normal_vec(N * K, 91, 3.0);
    std::vector<uint8_t> blob(L.total_bytes());
    quantize(L, W.data(), blob.data());
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t code = static_cast<uint8_t>(k + 37 * r);
        const int mag = code & 0x7F;
        blob[L.codes.offset + r * L.row_bytes + k] = (e4m3 ? mag != 0x7F : mag < 0x7C) ? code : 0;
      }
    std::vector<float> want(N * K);
    dequantize(L, blob.data(), want.data());
    std::vector<float> X(K * K, 0.f), Y(K * N);
    for (int64_t k = 0; k < K; ++k) X[k * K + k] = 1.f;
    std::vector<float> ws(matmul_workspace_bytes(L, K) / sizeof(float));
    ASSERT_EQ(matmul_cpu_path(L, K), "panels");
    for_each_simd_target([&](int64_t) {
      std::fill(Y.begin(), Y.end(), -1.f);
      matmul_cpu(L, blob.data(), X.data(), K, Y.data(), ws.data());
      for (int64_t k = 0; k < K; ++k)
        for (int64_t r = 0; r < N; ++r) {
          const float got = Y[k * N + r], w = want[r * K + k];
          ASSERT_TRUE(std::isfinite(w));
          // -0 comes back +0: the one product is added to zeros
          ASSERT_TRUE(detail::float_as_bits(got) == detail::float_as_bits(w) || (got == 0.f && w == 0.f))
              << name << " code 0x" << std::hex << int{blob[L.codes.offset + r * L.row_bytes + k]} << ": " << got
              << " against " << w;
        }
    });
  }
}

TEST(QuantKernels, DenseBaselines) {
  for_each_simd_target([](int64_t) {
    for (const Shape sh : shapes) {
      const std::vector<float> W = normal_vec(sh.N * sh.K, 55);
      const std::vector<float> x = normal_vec(sh.K, 56);
      std::vector<bf16_t> Wb(W.size());
      for (std::size_t i = 0; i < W.size(); ++i) Wb[i] = to_bf16(W[i]);
      std::vector<float> y(sh.N), yb(sh.N);
      matvec_dense_f32(W.data(), x.data(), y.data(), sh.N, sh.K);
      matvec_dense_bf16(Wb.data(), x.data(), yb.data(), sh.N, sh.K);
      for (int64_t r = 0; r < sh.N; ++r) {
        double d = 0, db = 0, S = 0, Sb = 0;
        for (int64_t k = 0; k < sh.K; ++k) {
          d += static_cast<double>(W[r * sh.K + k]) * x[k];
          S += std::fabs(static_cast<double>(W[r * sh.K + k]) * x[k]);
          db += static_cast<double>(to_float(Wb[r * sh.K + k])) * x[k];
          Sb += std::fabs(static_cast<double>(to_float(Wb[r * sh.K + k])) * x[k]);
        }
        EXPECT_LE(std::fabs(y[r] - d), bound(sh.K, S)) << sh.N << "x" << sh.K;
        EXPECT_LE(std::fabs(yb[r] - db), bound(sh.K, Sb)) << sh.N << "x" << sh.K;
      }
    }
  });
}

// The dense small-batch products (fp32 and bf16 W) against float64 on every target: pairs of W rows with an
// odd last row, X rows in groups of four with every remainder, K with vector tails; accumulate adds the
// product to Y (one more rounding, taken as one more term). bf16 W is widened exactly, so the float64 sum
// is over the bf16 values.
TEST(QuantKernels, DenseSmallBatchMatchesFloat64) {
  for_each_simd_target([](int64_t) {
    for (const Shape sh : shapes) {
      const std::vector<float> W = normal_vec(sh.N * sh.K, 57);
      std::vector<bf16_t> Wb(W.size());
      std::vector<float> Wbf(W.size());  // the bf16 weights' values
      for (std::size_t i = 0; i < W.size(); ++i) Wbf[i] = to_float(Wb[i] = to_bf16(W[i]));
      for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{7}, kMatmulSmallBatch}) {
        const std::vector<float> X = normal_vec(M * sh.K, 58), Y0 = normal_vec(M * sh.N, 59);
        for (const bool bf16 : {false, true}) {
          const std::vector<float>& Wv = bf16 ? Wbf : W;
          const std::vector<double> S = abs_sums(Wv, X.data(), M, sh.N, sh.K);
          for (const bool accumulate : {false, true}) {
            std::vector<float> Y = Y0;
            if (bf16) matmul_dense_bf16(Wb.data(), X.data(), M, Y.data(), sh.N, sh.K, accumulate);
            else matmul_dense_f32(W.data(), X.data(), M, Y.data(), sh.N, sh.K, accumulate);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t r = 0; r < sh.N; ++r) {
                double d = accumulate ? Y0[m * sh.N + r] : 0.0;
                for (int64_t k = 0; k < sh.K; ++k) d += static_cast<double>(Wv[r * sh.K + k]) * X[m * sh.K + k];
                const double lim = accumulate ? bound(sh.K + 1, S[m * sh.N + r] + std::fabs(Y0[m * sh.N + r]))
                                              : bound(sh.K, S[m * sh.N + r]);
                ASSERT_LE(std::fabs(Y[m * sh.N + r] - d), lim) << sh.N << "x" << sh.K << " M=" << M << " bf16=" << bf16
                                                               << " accumulate=" << accumulate << " at " << m << "," << r;
              }
          }
        }
      }
    }
  });
  float w[2] = {1, 2}, y[2];
  const bf16_t wb[2] = {to_bf16(1.f), to_bf16(2.f)};
  EXPECT_THROW(matmul_dense_f32(w, w, 0, y, 1, 2), Error);
  EXPECT_THROW(matmul_dense_f32(w, w, kMatmulSmallBatch + 1, y, 1, 2), Error);
  EXPECT_THROW(matmul_dense_f32(w, nullptr, 1, y, 1, 2), Error);
  EXPECT_THROW(matmul_dense_bf16(wb, w, 1, y, 0, 2), Error);
  EXPECT_THROW(matmul_dense_bf16(nullptr, w, 1, y, 1, 2), Error);
}

TEST(QuantKernels, BadArguments) {
  const QLayout L = layout(parse_spec("int8"), 2, 2);
  std::vector<uint8_t> blob(L.total_bytes());
  float x[2] = {1, 2}, y[2];
  EXPECT_THROW(matvec_cpu(L, nullptr, x, y), Error);
  EXPECT_THROW(matmul_cpu(L, blob.data(), x, 1, y, nullptr), Error);
  std::vector<float> ws(matmul_workspace_bytes(L, 2) / sizeof(float));
  EXPECT_THROW(matmul_cpu(L, blob.data(), nullptr, 1, y, ws.data()), Error);
  EXPECT_THROW(matmul_cpu(L, blob.data(), x, 1, nullptr, ws.data()), Error);
  EXPECT_THROW(matmul_cpu(L, blob.data(), x, 0, y, ws.data()), Error);
  EXPECT_THROW(matmul_reference(L, blob.data(), x, 0, y), Error);
  EXPECT_THROW(matvec_dense_f32(x, x, y, 0, 2), Error);
}

// ------------------------------------------------------------------ the integer-activation matvecs
//
// matvec_a16 / matvec_a8 compute sum_k Wd_k x^_k with x^ = quantize_activations(x, bits): int32 sums of
// the codes inside each block (exact), then fp32: one product and one addition per block, group and the
// zero-point correction (nf4 through a8: one more product by 1/127). With q the stored codes and z the
// zero point, every fp32 term is at most |s (|q_k| + |z|) x^_k| <= (|Wd_k| + 2 s |z|) |x^_k| summed, so
// |y - sum_k Wd_k x^_k| <= gamma(K + 16) S_int, S_int = sum_k (|Wd_k| + 2 s_g(k) |z_g(k)|) |x^_k| (fewer
// than K + 16 roundings reach any output). Against the unquantized x the activation rounding adds at most
// activation_bound's figure, and nf4's integer levels nf4_level_bound's.

namespace {

// One integer-activation path: its activation bits, entry points and the layouts it takes.
struct IntPath {
  int bits;
  std::string (*unsupported)(const QLayout&);
  std::size_t (*workspace)(int64_t);
  void (*matvec)(const QLayout&, const uint8_t*, const float*, float*, void*);
  std::vector<const char*> specs;
};
const IntPath int_paths[] = {
    {16, a16_unsupported, a16_workspace_bytes, matvec_a16,
     {"int8", "int4-g32", "int4-g128", "int4-asym-g64", "int4-asym-g96", "nf4", "nf4-g128", "nf4-dq"}},
    {8, a8_unsupported, a8_workspace_bytes, matvec_a8,
     {"int8", "int4-g64", "int4-g128", "int4-g192", "int4-asym-g64", "int4-asym-g128", "nf4", "nf4-g128", "nf4-dq"}},
};

// The weights the kernel multiplies: the dequantized ones, or for nf4 absmax x level(q) / unit.
std::vector<double> int_weights(const QLayout& L, const uint8_t* blob, const std::vector<float>& Wd, int bits) {
  std::vector<double> w(Wd.begin(), Wd.end());
  if (L.spec.format != Format::nf4) return w;
  for (int64_t r = 0; r < L.rows; ++r)
    for (int64_t k = 0; k < L.cols; ++k) {
      const int q = nibble(blob + L.codes.offset + r * L.row_bytes, k);
      w[r * L.cols + k] =
          static_cast<double>(stored_params(L, blob, r, k / L.group).scale) * nf4_int_level(q, bits) / nf4_level_unit(bits);
    }
  return w;
}

double int_bound(const QLayout& L, const uint8_t* blob, const std::vector<double>& Wd, const std::vector<double>& xh,
                 int64_t r) {
  const int64_t K = L.cols;
  double S = 0;
  for (int64_t k = 0; k < K; ++k) {
    const GroupParams p = stored_params(L, blob, r, L.spec.format == Format::int8 ? 0 : k / L.group);
    S += (std::fabs(static_cast<double>(Wd[r * K + k])) + 2.0 * std::fabs(p.scale * p.zero)) * std::fabs(xh[k]);
  }
  const double g = static_cast<double>(K + 16) * (FLT_EPSILON / 2);
  return g / (1 - g) * S + 1e-30;
}

}  // namespace

TEST(QuantIntActivations, MatchFloat64SemanticsOnEveryTarget) {
  for (const IntPath& path : int_paths)
    for_each_simd_target([&](int64_t) {
      SCOPED_TRACE("a" + std::to_string(path.bits));
      uint64_t seed = 900;
      for (const char* name : path.specs)
        for (const Shape sh : shapes) {
          const QLayout L = layout(parse_spec(name), sh.N, sh.K);
          ASSERT_EQ(path.unsupported(L), "") << name;
          const std::vector<float> W = normal_vec(sh.N * sh.K, ++seed, 0.05);
          std::vector<float> x = normal_vec(sh.K, ++seed);
          if (sh.K > 40) x[sh.K / 3] *= 60.f;  // an outlier channel, as in LLM activations
          std::vector<uint8_t> blob(L.total_bytes());
          quantize(L, W.data(), blob.data());
          std::vector<float> Wd(W.size());
          dequantize(L, blob.data(), Wd.data());
          const IntActivations a = quantize_activations(x.data(), sh.K, path.bits);
          std::vector<double> xh(sh.K);
          for (int64_t k = 0; k < sh.K; ++k) xh[k] = static_cast<double>(a.scale[k / kActBlock]) * a.q[k];
          const std::vector<double> act = activation_bound(a, Wd.data(), sh.N, sh.K);
          const std::vector<double> lev = nf4_level_bound(L, blob.data(), a);
          const std::vector<double> Wk = int_weights(L, blob.data(), Wd, path.bits);
          std::vector<char> ws(path.workspace(sh.K));
          std::vector<float> y(sh.N, NAN);
          path.matvec(L, blob.data(), x.data(), y.data(), ws.data());
          double lev_max = 0;
          for (int64_t r = 0; r < sh.N; ++r) {
            double d = 0, dx = 0, dlev = 0;
            for (int64_t k = 0; k < sh.K; ++k) {
              d += Wk[r * sh.K + k] * xh[k];
              dx += static_cast<double>(Wd[r * sh.K + k]) * x[k];
              dlev += std::fabs(Wk[r * sh.K + k] - Wd[r * sh.K + k]) * std::fabs(xh[k]);
            }
            const double arith = int_bound(L, blob.data(), Wk, xh, r);
            ASSERT_LE(std::fabs(y[r] - d), arith) << name << " " << sh.N << "x" << sh.K << " row " << r;
            ASSERT_LE(std::fabs(y[r] - dx), act[r] + lev[r] + arith) << name << " " << sh.N << "x" << sh.K << " row " << r;
            // The level bound is the levels' own displacement, exactly (0 for the integer formats).
            ASSERT_NEAR(lev[r], dlev, 1e-12 * (1 + dlev)) << name << " row " << r;
            lev_max = std::max(lev_max, lev[r]);
          }
          if (L.spec.format == Format::nf4 && sh.K >= 7) {
            EXPECT_GT(lev_max, 0.0) << name;  // the levels do move
          }
        }
    });
}

TEST(QuantIntActivations, A8ActivationLayoutIsAPermutationOfEachPair) {
  std::vector<int> seen(64, 0);
  for (int64_t pos = 0; pos < 64; ++pos) ++seen.at(static_cast<std::size_t>(a8_position(pos)));
  for (int c : seen) EXPECT_EQ(c, 1);
  EXPECT_EQ(a8_position(0), 0);    // block 0's evens
  EXPECT_EQ(a8_position(16), 32);  // block 1's evens
  EXPECT_EQ(a8_position(32), 1);   // block 0's odds
  EXPECT_EQ(a8_position(63), 63);  // block 1's last odd
}

TEST(QuantIntActivations, WholeBlocksRoundAsTheScalarBlockOnEveryTarget) {
  // round_whole_blocks (the kernels' preparation, in vectors) gives quantize_activation_block's codes and
  // scales bit for bit: random blocks of every magnitude, exact half steps, an all-zero block, one whose
  // step is below the normal floats, a NaN, +-infinity, -0; 40 blocks so the 16-block passes end mid-chunk.
  const int64_t nb = 40;
  std::vector<float> x = normal_vec(nb * kActBlock, 77, 1.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < kActBlock; ++i) x[b * kActBlock + i] *= std::ldexp(1.f, static_cast<int>(b % 13) * 9 - 60);
  for (int64_t i = 0; i < kActBlock; ++i) {
    x[3 * kActBlock + i] = static_cast<float>(i - 15) * 0.5f;
    x[4 * kActBlock + i] = 0.f;
    x[5 * kActBlock + i] = i == 7 ? 1e-36f : 0.f;
  }
  x[6 * kActBlock] = 127.f;  // amax 127: a step of 1 (8-bit), so x.5 are exact ties
  for (int64_t i = 1; i < kActBlock; ++i) x[6 * kActBlock + i] = static_cast<float>(i) - 0.5f - 16.f;
  x[7 * kActBlock + 9] = NAN;
  x[8 * kActBlock + 2] = INFINITY;
  x[9 * kActBlock + 30] = -INFINITY;
  x[10 * kActBlock + 1] = -0.f;
  for (int bits : {8, 16})
    for_each_simd_target([&](int64_t) {
      SCOPED_TRACE("a" + std::to_string(bits));
      std::vector<int16_t> q(x.size(), 99), qs(kActBlock);
      std::vector<float> s(nb, -1.f);
      round_whole_blocks(x.data(), nb, bits, q.data(), s.data());
      for (int64_t b = 0; b < nb; ++b) {
        float ss = -1.f;
        quantize_activation_block(x.data() + b * kActBlock, kActBlock, bits, qs.data(), ss);
        EXPECT_EQ(std::bit_cast<uint32_t>(s[b]), std::bit_cast<uint32_t>(ss)) << "block " << b;
        for (int64_t i = 0; i < kActBlock; ++i) ASSERT_EQ(q[b * kActBlock + i], qs[i]) << "block " << b << " element " << i;
      }
      EXPECT_TRUE(std::isnan(s[7]) && std::isnan(s[8]) && std::isnan(s[9]));
      EXPECT_EQ(s[4], 0.f);
      EXPECT_EQ(s[5], 0.f);
      if (bits == 8) {
        EXPECT_EQ(q[6 * kActBlock + 17], 0);   // 0.5 -> 0 (to even)
        EXPECT_EQ(q[6 * kActBlock + 18], 2);   // 1.5 -> 2
        EXPECT_EQ(q[6 * kActBlock + 20], 4);   // 3.5 -> 4
        EXPECT_EQ(q[6 * kActBlock + 1], -16);  // -15.5 -> -16
      }
    });
}

TEST(QuantIntActivations, CodesAndTheirError) {
  // A block's largest magnitude is +-32767 codes (8-bit: +-127); an all-zero block has scale 0; a block with a NaN or an
  // infinity has a NaN scale (its outputs are NaN); a block whose step falls below the normal floats is
  // flushed to zero with its amax as the error bound; the rest err by at most 0.504 steps.
  std::vector<float> x(32 * 5, 0.f);
  for (int64_t i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 12) * 0.25f;  // block 0: amax 4.75 at i = 31
  x[64 + 3] = NAN;                                                               // block 2
  x[96 + 1] = 1e-36f;                                                            // block 3: step < FLT_MIN
  x[128] = -2.f;                                                                 // block 4 (amax 2)
  x[129] = 1.f;
  const IntActivations a = quantize_activations_a16(x.data(), static_cast<int64_t>(x.size()));
  ASSERT_EQ(a.scale.size(), 5u);
  EXPECT_EQ(a.scale[0], static_cast<float>(4.75 / 32767.0));
  EXPECT_EQ(a.q[31], 32767);
  EXPECT_EQ(a.q[12], 0);
  EXPECT_EQ(a.scale[1], 0.f);
  EXPECT_EQ(a.max_err[1], 0.0);
  EXPECT_TRUE(std::isnan(a.scale[2]));
  EXPECT_EQ(a.scale[3], 0.f);
  EXPECT_EQ(a.q[97], 0);
  EXPECT_EQ(a.max_err[3], static_cast<double>(1e-36f));
  EXPECT_EQ(a.q[128], -32767);
  EXPECT_EQ(a.q[129], 16384);  // 0.5 x 32767 = 16383.5, rounded to even
  const IntActivations a8 = quantize_activations_a8(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(a8.bits, 8);
  EXPECT_EQ(a8.scale[0], static_cast<float>(4.75 / 127.0));
  EXPECT_EQ(a8.q[31], 127);
  EXPECT_EQ(a8.q[30], 120);  // 4.5 / 4.75 x 127 = 120.3
  EXPECT_TRUE(std::isnan(a8.scale[2]));
  EXPECT_EQ(a8.q[128], -127);
  EXPECT_EQ(a8.q[129], 64);  // 63.5, rounded to even
  // An infinity in a short last block (fewer than 32 elements: the general loop, not the whole-block one)
  // and a negative one among finite values: NaN scales, zero codes; -0 counts as 0.
  std::vector<float> t(32 + 7, 0.5f);
  t[5] = -0.f;
  t[32 + 2] = -INFINITY;
  const IntActivations ta = quantize_activations_a8(t.data(), static_cast<int64_t>(t.size()));
  EXPECT_EQ(ta.scale[0], static_cast<float>(0.5 / 127.0));
  EXPECT_EQ(ta.q[4], 127);
  EXPECT_EQ(ta.q[5], 0);
  EXPECT_TRUE(std::isnan(ta.scale[1]));
  EXPECT_EQ(ta.q[33], 0);
  t[32 + 2] = 0.25f;
  t[7] = INFINITY;
  const IntActivations tb = quantize_activations_a8(t.data(), static_cast<int64_t>(t.size()));
  EXPECT_TRUE(std::isnan(tb.scale[0]));
  EXPECT_EQ(tb.scale[1], static_cast<float>(0.5 / 127.0));
  EXPECT_EQ(tb.q[34], 64);  // 63.5, rounded to even
  const std::vector<float> r = normal_vec(100003, 5, 3.0);
  for (int bits : {16, 8}) {
    const IntActivations b = quantize_activations(r.data(), static_cast<int64_t>(r.size()), bits);
    for (std::size_t k = 0; k < r.size(); ++k)
      ASSERT_LE(std::fabs(r[k] - static_cast<double>(b.scale[k / kActBlock]) * b.q[k]), b.max_err[k / kActBlock]) << bits << " " << k;
  }
  EXPECT_THROW(quantize_activations(r.data(), 8, 12), Error);

  // The NaN reaches the outputs, on every target.
  for (const IntPath& path : int_paths)
    for_each_simd_target([&](int64_t) {
      for (const char* name : {"int4-g64", "nf4", "int8"}) {
        const QLayout L = layout(parse_spec(name), 3, static_cast<int64_t>(x.size()));
        const std::vector<float> W = normal_vec(3 * static_cast<int64_t>(x.size()), 6);
        std::vector<uint8_t> blob(L.total_bytes());
        quantize(L, W.data(), blob.data());
        std::vector<char> ws(path.workspace(L.cols));
        std::vector<float> y(3);
        path.matvec(L, blob.data(), x.data(), y.data(), ws.data());
        for (float v : y) EXPECT_TRUE(std::isnan(v)) << name << " a" << path.bits;
      }
    });
}

TEST(QuantKernels, NonFiniteStoredScalesStayNonFiniteOnEveryTarget) {
  // Quantizers refuse non-finite weights, so a stored fp16 scale is finite unless the bytes were damaged.
  // A damaged one must still show: row 1's first scale set to NaN, row 2's to +Inf, row 0 untouched.
  // Highway's own fp16 promotion on targets without F16C turns both finite; the kernels widen through
  // convert-inl.h's exact conversion instead. Every path (float activations, a16, a8) on every target.
  const int64_t K = 256;
  const std::vector<float> x = normal_vec(K, 41);
  for (const char* name : {"int8", "int4-g64", "int4-g128", "int4-asym-g64"}) {
    const QLayout L = layout(parse_spec(name), 3, K);
    const std::vector<float> W = normal_vec(3 * K, 42, 0.05);
    std::vector<uint8_t> blob(L.total_bytes());
    quantize(L, W.data(), blob.data());
    const int64_t per_row = L.spec.format == Format::int8 ? 1 : L.groups_per_row;
    for (const auto& [row, bits] : {std::pair<int64_t, uint16_t>{1, 0x7E00}, {2, 0x7C00}})
      std::memcpy(blob.data() + L.scales.offset + 2 * row * per_row, &bits, 2);
    std::vector<float> yr(3);
    matvec_reference(L, blob.data(), x.data(), yr.data());
    ASSERT_TRUE(std::isfinite(yr[0]) && std::isnan(yr[1]) && !std::isfinite(yr[2])) << name;
    for_each_simd_target([&](int64_t) {
      auto expect = [&](const std::vector<float>& y, const std::string& path) {
        EXPECT_TRUE(std::isfinite(y[0])) << name << " " << path;
        EXPECT_TRUE(std::isnan(y[1])) << name << " " << path << ": " << y[1];
        EXPECT_FALSE(std::isfinite(y[2])) << name << " " << path << ": " << y[2];
      };
      std::vector<float> y(3);
      matvec_cpu(L, blob.data(), x.data(), y.data());
      expect(y, "float activations");
      for (const IntPath& path : int_paths) {
        if (!path.unsupported(L).empty()) continue;
        std::vector<char> ws(path.workspace(K));
        path.matvec(L, blob.data(), x.data(), y.data(), ws.data());
        expect(y, std::string("a").append(std::to_string(path.bits)));
      }
    });
  }
}

TEST(QuantIntActivations, FormatsWithoutIntegerCodesAreNamed) {
  const std::vector<const char*> refused[] = {{"nf4-g32", "fp8-e4m3", "int4-g16", "int4-asym-g33"},
                                              {"nf4-g32", "fp8-e5m2", "int4-g32", "int4-asym-g96"}};
  for (int i = 0; i < 2; ++i) {
    const IntPath& path = int_paths[i];
    for (const char* name : refused[i]) {
      const QLayout L = layout(parse_spec(name), 4, 192);
      EXPECT_NE(path.unsupported(L), "") << name;
      std::vector<uint8_t> blob(L.total_bytes());
      std::vector<float> x(192, 1.f), y(4);
      std::vector<char> ws(path.workspace(192));
      try {
        path.matvec(L, blob.data(), x.data(), y.data(), ws.data());
        ADD_FAILURE() << name << " was accepted by a" << path.bits;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(path.bits == 16 ? "matvec_a16" : "matvec_a8"), std::string::npos) << e.what();
      }
    }
  }
}
