// GPTQ: column-by-column quantization with second-order error compensation (Frantar et al. 2022).
#include <cblas.h>  // blasint, the integer type of the OpenBLAS (and its bundled LAPACK) interface

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <numeric>
#include <string>
#include <vector>

#include "common/blas.hpp"
#include "impls/quant/quantizers.hpp"

// LAPACK (bundled in OpenBLAS): Cholesky factorisation and inverse from it, column-major. The trailing
// argument is the hidden Fortran length of the character argument.
extern "C" {
void dpotrf_(const char* uplo, const blasint* n, double* a, const blasint* lda, blasint* info, std::size_t uplo_len);
void dpotri_(const char* uplo, const blasint* n, double* a, const blasint* lda, blasint* info, std::size_t uplo_len);
}

namespace memtrade::quant {

namespace {

constexpr const char* kFn = "quantize_gptq";

// In-place Cholesky of a symmetric positive-definite row-major [K x K] matrix whose upper triangle is
// set: afterwards the upper triangle holds U with A = U^T U. (The row-major upper triangle is LAPACK's
// column-major lower one, so this is dpotrf with uplo = 'L'.) Returns LAPACK's info (> 0: the leading
// minor of that order is not positive definite).
blasint cholesky_upper(std::vector<double>& a, int64_t K) {
  const blasint n = static_cast<blasint>(K);
  blasint info = 0;
  dpotrf_("L", &n, a.data(), &n, &info, 1);
  return info;
}

// Upper Cholesky factor U of H^-1 (H^-1 = U^T U), row-major, lower triangle zeroed. H: row-major
// symmetric [K x K], overwritten.
std::vector<double> inverse_cholesky_upper(std::vector<double> H, int64_t K) {
  blasint info = cholesky_upper(H, K);
  if (info > 0)
    throw Error(std::string(kFn) + ": the damped Hessian 2/n X^T X is not positive definite (leading minor " +
                std::to_string(info) + " of " + std::to_string(K) + "); increase damp");
  MT_CHECK(info == 0, std::string(kFn) + ": dpotrf rejected its arguments (info " + std::to_string(info) + ")");
  const blasint n = static_cast<blasint>(K);
  dpotri_("L", &n, H.data(), &n, &info, 1);  // upper triangle (row-major) := H^-1
  if (info > 0)
    throw Error(std::string(kFn) + ": the damped Hessian is singular (diagonal element " + std::to_string(info) +
                " of its Cholesky factor is 0); increase damp");
  MT_CHECK(info == 0, std::string(kFn) + ": dpotri rejected its arguments (info " + std::to_string(info) + ")");
  info = cholesky_upper(H, K);
  if (info > 0)
    throw Error(std::string(kFn) +
                ": the inverse of the damped Hessian is not numerically positive definite "
                "(leading minor " +
                std::to_string(info) + "); increase damp");
  for (int64_t i = 1; i < K; ++i) std::fill(H.begin() + i * K, H.begin() + i * K + i, 0.0);
  return H;
}

}  // namespace

QuantResult quantize_gptq(const Spec& spec, const float* W, int64_t N, int64_t K, const float* X, int64_t n_samples,
                          const GptqOptions& opt) {
  detail::check_sizes(kFn, "W", N, K);
  detail::check_sizes(kFn, "X", n_samples, K);
  MT_CHECK(std::isfinite(opt.damp) && opt.damp >= 0,
           std::string(kFn) + ": damp must be finite and >= 0 (got " + std::to_string(opt.damp) + ")");
  MT_CHECK(opt.block >= 1, std::string(kFn) + ": block must be >= 1 (got " + std::to_string(opt.block) + ")");
  MT_CHECK(!(spec.format == Format::nf4 && spec.double_quant),
           std::string(kFn) +
               ": nf4 with double quantization is not supported (its absmax values are quantized "
               "across rows after all groups are fitted); use quantize_rtn or quantize_awq");
  detail::check_finite(kFn, "W", W, N, K);
  detail::check_finite(kFn, "X", X, n_samples, K);

  const bool tensor_scale = detail::per_tensor(spec);
  const int64_t G = tensor_scale ? K : group_size(spec, K);
  MT_CHECK(G > 0, std::string(kFn) + ": group size must be positive");
  const int64_t groups = (K + G - 1) / G;
  const bool static_groups = opt.act_order || tensor_scale;

  // H = 2/n X^T X in float64.
  std::vector<double> H(static_cast<std::size_t>(K * K));
  {
    const std::vector<double> Xd(X, X + n_samples * K);
    blas::dgemm(true, false, K, K, n_samples, 2.0 / static_cast<double>(n_samples), Xd.data(), K, Xd.data(), K, 0.0,
                H.data(), K);
  }

  // Working weights in float64 (with the float32 input, 16 bytes per weight in all plus 16 K^2 for H and
  // its factor). Dead input channels: H_ii = 1, weights 0.
  std::vector<double> Wd(W, W + N * K);
  for (int64_t i = 0; i < K; ++i) {
    if (H[i * K + i] != 0.0) continue;
    H[i * K + i] = 1.0;
    for (int64_t r = 0; r < N; ++r) Wd[r * K + i] = 0.0;
  }

  QuantResult res;
  res.params.resize(tensor_scale ? 1 : static_cast<std::size_t>(N * groups));
  if (static_groups) {
    const std::vector<float> Wf(Wd.begin(), Wd.end());  // W with the dead columns zeroed (exact in float)
    if (tensor_scale) {
      res.params[0] = fit_group(spec, Wf.data(), N * K);
    } else {
      for (int64_t r = 0; r < N; ++r)
        for (int64_t g = 0; g < groups; ++g)
          res.params[r * groups + g] = fit_group(spec, Wf.data() + r * K + g * G, std::min(G, K - g * G));
    }
  }

  // Column order: identity, or descending diag(H) (ties by index) with act_order.
  std::vector<int64_t> perm(static_cast<std::size_t>(K));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (opt.act_order) {
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) { return H[a * K + a] > H[b * K + b]; });
    std::vector<double> Hp(static_cast<std::size_t>(K * K)), Wp(static_cast<std::size_t>(N * K));
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) Hp[i * K + j] = H[perm[i] * K + perm[j]];
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < K; ++j) Wp[r * K + j] = Wd[r * K + perm[j]];
    H.swap(Hp);
    Wd.swap(Wp);
  }

  double mean_diag = 0;
  for (int64_t i = 0; i < K; ++i) mean_diag += H[i * K + i];
  mean_diag /= static_cast<double>(K);
  for (int64_t i = 0; i < K; ++i) H[i * K + i] += opt.damp * mean_diag;
  const std::vector<double> U = inverse_cholesky_upper(std::move(H), K);

  // Q: quantized weights in processing order. Err: scaled errors of the current block.
  std::vector<float> Q(static_cast<std::size_t>(N * K));
  std::vector<double> Err(static_cast<std::size_t>(N * std::min(opt.block, K)));

  for (int64_t i1 = 0; i1 < K;) {
    int64_t i2 = std::min(i1 + opt.block, K);
    if (!static_groups) {
      // A group fitted inside this block must see all earlier errors, but columns past i2 receive this
      // block's errors only after it ends: end the block where a group starts that would cross i2.
      const int64_t gs = ((i2 - 1) / G) * G;
      if (gs > i1 && std::min(gs + G, K) > i2) i2 = gs;
    }
    const int64_t B = i2 - i1;

    // Rows are independent: each has its own groups, and the error update mixes columns only.
    std::exception_ptr failure;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      try {
        double* w = Wd.data() + r * K;
        double* err = Err.data() + r * B;
        std::vector<float> buf;
        for (int64_t i = i1; i < i2; ++i) {
          GroupParams p;
          if (tensor_scale) {
            p = res.params[0];
          } else if (static_groups) {
            p = res.params[r * groups + perm[i] / G];
          } else {
            if (i % G == 0) {
              const int64_t n = std::min(G, K - i);
              buf.assign(w + i, w + i + n);
              res.params[r * groups + i / G] = fit_group(spec, buf.data(), n);
            }
            p = res.params[r * groups + i / G];
          }
          const float q = qdq(spec, static_cast<float>(w[i]), p);
          Q[r * K + i] = q;
          const double e = (w[i] - static_cast<double>(q)) / U[i * K + i];
          err[i - i1] = e;
          const double* u = U.data() + i * K;
          for (int64_t j = i + 1; j < i2; ++j) w[j] -= e * u[j];
        }
      } catch (...) {
#pragma omp critical(memtrade_gptq_failure)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);

    // Lazy batch update of the columns after the block: W[:, i2:] -= Err @ U[i1:i2, i2:].
    if (i2 < K)
      blas::dgemm(false, false, N, K - i2, B, -1.0, Err.data(), B, U.data() + i1 * K + i2, K, 1.0, Wd.data() + i2, K);
    i1 = i2;
  }

  res.deq.resize(static_cast<std::size_t>(N * K));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < K; ++j) res.deq[r * K + perm[j]] = Q[r * K + j];
  return res;
}

}  // namespace memtrade::quant
