// Round-to-nearest, the layer output MSE, and AWQ's activation-aware scale search on top of them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/blas.hpp"
#include "impls/quant/quantizers.hpp"

namespace memtrade::quant {

namespace {

// RTN of a finite [N x K] matrix (no input checks). nf4 with double quantization goes through formats'
// quantize/dequantize, since its absmax values depend on the whole matrix.
QuantResult rtn(const Spec& spec, const float* W, int64_t N, int64_t K) {
  QuantResult r;
  r.deq.resize(static_cast<std::size_t>(N * K));
  if (spec.format == Format::nf4 && spec.double_quant) {
    const QLayout L = layout(spec, N, K);
    std::vector<uint8_t> blob(L.total_bytes());
    quantize(L, W, blob.data(), nullptr);
    dequantize(L, blob.data(), r.deq.data());
    r.params.resize(static_cast<std::size_t>(N * L.groups_per_row));
    for (int64_t row = 0; row < N; ++row)
      for (int64_t g = 0; g < L.groups_per_row; ++g)
        r.params[row * L.groups_per_row + g] = stored_params(L, blob.data(), row, g);
    return r;
  }
  if (detail::per_tensor(spec)) {
    const GroupParams p = fit_group(spec, W, N * K);
    r.params.assign(1, p);
    for (int64_t i = 0; i < N * K; ++i) r.deq[i] = qdq(spec, W[i], p);
    return r;
  }
  const int64_t G = group_size(spec, K);
  MT_CHECK(G > 0, "quantize: group size must be positive");
  const int64_t groups = (K + G - 1) / G;
  r.params.resize(static_cast<std::size_t>(N * groups));
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < N; ++row)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * G, c1 = std::min(c0 + G, K);
      const float* w = W + row * K;
      const GroupParams p = fit_group(spec, w + c0, c1 - c0);
      r.params[row * groups + g] = p;
      for (int64_t c = c0; c < c1; ++c) r.deq[row * K + c] = qdq(spec, w[c], p);
    }
  return r;
}

// layer_output_mse with X already in float64.
double output_mse(const float* W, const float* Wq, int64_t N, int64_t K, const std::vector<double>& Xd, int64_t n) {
  std::vector<double> D(static_cast<std::size_t>(N * K));
  for (int64_t i = 0; i < N * K; ++i) D[i] = static_cast<double>(W[i]) - static_cast<double>(Wq[i]);
  std::vector<double> Y(static_cast<std::size_t>(n * N));
  blas::dgemm(false, true, n, N, K, 1.0, Xd.data(), K, D.data(), K, 0.0, Y.data(), N);
  double sum = 0;
  for (const double y : Y) sum += y * y;
  return sum / (static_cast<double>(n) * static_cast<double>(N));
}

std::vector<double> to_double(const float* a, int64_t count) { return std::vector<double>(a, a + count); }

// AWQ's weight-clipping search (quantize_awq with clip) on the scaled weights Ws = W s [N x K] and the
// scaled calibration inputs Xs = X / s [n x K]: r.params and r.deq (still scaled) replaced group by group.
void clip_search(const Spec& spec, const std::vector<float>& Ws, int64_t N, int64_t K, const std::vector<double>& Xs,
                 int64_t n, QuantResult& r) {
  constexpr int kSteps = 10;         // a = 1 - 0.05 i, i < 10: llm-awq's n_grid 20 with max_shrink 0.5
  constexpr double kStep = 0.05;
  const int64_t G = group_size(spec, K), groups = (K + G - 1) / G;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t c0 = g * G, gc = std::min(G, K - c0);
    std::vector<double> C(static_cast<std::size_t>(gc * gc));  // the group's columns of Xs^T Xs
    blas::dgemm(true, false, gc, gc, n, 1.0, Xs.data() + c0, K, Xs.data() + c0, K, 0.0, C.data(), gc);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < N; ++row) {
      const float* w = Ws.data() + row * K + c0;
      float amax = 0.f;
      for (int64_t c = 0; c < gc; ++c) amax = std::max(amax, std::abs(w[c]));
      std::vector<float> clipped(static_cast<std::size_t>(gc)), deq(static_cast<std::size_t>(gc)), best(deq);
      std::vector<double> d(static_cast<std::size_t>(gc));
      double best_err = std::numeric_limits<double>::infinity();
      GroupParams best_p{};
      for (int i = 0; i < kSteps; ++i) {
        const float mx = static_cast<float>(static_cast<double>(amax) * (1.0 - kStep * i));
        for (int64_t c = 0; c < gc; ++c) clipped[c] = std::clamp(w[c], -mx, mx);
        const GroupParams p = fit_group(spec, clipped.data(), gc);
        for (int64_t c = 0; c < gc; ++c) {
          deq[c] = qdq(spec, clipped[c], p);
          d[c] = static_cast<double>(deq[c]) - w[c];
        }
        double err = 0;
        for (int64_t a = 0; a < gc; ++a) {
          double row_sum = 0;
          for (int64_t b = 0; b < gc; ++b) row_sum += C[a * gc + b] * d[b];
          err += d[a] * row_sum;
        }
        if (err < best_err) {
          best_err = err;
          best_p = p;
          best.swap(deq);
        }
      }
      r.params[row * groups + g] = best_p;
      std::copy(best.begin(), best.end(), r.deq.begin() + row * K + c0);
    }
  }
}

}  // namespace

QuantResult quantize_rtn(const Spec& spec, const float* W, int64_t N, int64_t K) {
  detail::check_sizes("quantize_rtn", "W", N, K);
  detail::check_finite("quantize_rtn", "W", W, N, K);
  return rtn(spec, W, N, K);
}

double layer_output_mse(const float* W, const float* Wq, int64_t N, int64_t K, const float* X, int64_t n_samples) {
  detail::check_sizes("layer_output_mse", "W", N, K);
  detail::check_sizes("layer_output_mse", "X", n_samples, K);
  return output_mse(W, Wq, N, K, to_double(X, n_samples * K), n_samples);
}

QuantResult quantize_awq(const Spec& spec, const float* W, int64_t N, int64_t K, const float* X, int64_t n_samples,
                         const AwqOptions& opt) {
  constexpr const char* fn = "quantize_awq";
  detail::check_sizes(fn, "W", N, K);
  detail::check_sizes(fn, "X", n_samples, K);
  MT_CHECK(opt.grid >= 1, std::string(fn) + ": grid must be >= 1 (got " + std::to_string(opt.grid) + ")");
  detail::check_finite(fn, "W", W, N, K);
  detail::check_finite(fn, "X", X, n_samples, K);
  MT_CHECK(!opt.clip || awq_clip_applies(spec),
           std::string(fn) + ": weight clipping is defined for the group-wise 4-bit formats (int4, int4-asym, nf4 "
                             "without double quantization), not " + spec_name(spec));

  const std::vector<double> Xd = to_double(X, n_samples * K);
  std::vector<double> x_mean(static_cast<std::size_t>(K), 0.0);
  for (int64_t i = 0; i < n_samples; ++i)
    for (int64_t k = 0; k < K; ++k) x_mean[k] += std::abs(Xd[i * K + k]);
  for (double& m : x_mean) m /= static_cast<double>(n_samples);

  QuantResult best;
  double best_mse = std::numeric_limits<double>::infinity();
  std::vector<float> s(static_cast<std::size_t>(K)), scaled(static_cast<std::size_t>(N * K));
  for (int step = 0; step < opt.grid; ++step) {
    const double ratio = static_cast<double>(step) / opt.grid;
    std::vector<double> sd(static_cast<std::size_t>(K));
    for (int64_t k = 0; k < K; ++k) sd[k] = std::max(std::pow(x_mean[k], ratio), 1e-4);
    const auto [lo, hi] = std::minmax_element(sd.begin(), sd.end());
    const double norm = std::sqrt(*lo * *hi);
    for (int64_t k = 0; k < K; ++k) s[k] = static_cast<float>(sd[k] / norm);

    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) scaled[r * K + k] = W[r * K + k] * s[k];
    QuantResult cand = rtn(spec, scaled.data(), N, K);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) cand.deq[r * K + k] /= s[k];
    const double mse = output_mse(W, cand.deq.data(), N, K, Xd, n_samples);
    if (mse < best_mse) {
      best_mse = mse;
      best = std::move(cand);
      best.in_scale = s;
      best.awq_ratio = ratio;
    }
  }
  MT_CHECK(!best.deq.empty(), std::string(fn) + ": the output error is not finite for any scale ratio");
  if (opt.clip) {
    std::vector<float>& sc = best.in_scale;
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) scaled[r * K + k] = W[r * K + k] * sc[k];
    std::vector<double> Xs(Xd);
    for (int64_t i = 0; i < n_samples; ++i)
      for (int64_t k = 0; k < K; ++k) Xs[i * K + k] /= sc[k];
    clip_search(spec, scaled, N, K, Xs, n_samples, best);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k) best.deq[r * K + k] /= sc[k];
  }
  return best;
}

}  // namespace memtrade::quant
