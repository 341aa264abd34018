// Weight quantizers: round-to-nearest (the reference), GPTQ (Frantar et al., second-order error
// compensation from calibration activations) and AWQ (Lin et al., activation-aware per-input-channel
// scaling), for every format of formats.hpp.
//
// Conventions as in formats.hpp: W is [N out rows] x [K in cols] row-major (nn.Linear.weight), y = W x,
// groups run along K inside a row. Calibration activations X are [n_samples x K] row-major (one input
// vector per row). Every quantizer returns the dequantized weights and the group parameters it used,
// so that formats' quantize(layout, W', blob, params) stores exactly these values:
//   RTN, GPTQ: quantize(L, deq, blob, params.data()) decodes back to deq bit for bit.
//   AWQ:       the stored matrix is the SCALED one, W' = deq * in_scale (per column); see quantize_awq.
//
// Parameter count: N * ceil(K / G) with G = group_size(spec, K), except fp8 per tensor: 1 (the
// layout's num_params()). nf4 with double quantization is supported by RTN and AWQ (the parameters
// are the dequantized absmax values of formats' double quantization); GPTQ rejects it, because
// double quantization couples the absmax values of many rows while GPTQ fixes them one group at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/common.hpp"
#include "impls/quant/formats.hpp"

namespace memtrade::quant {

struct QuantResult {
  std::vector<float> deq;           // [N x K] dequantized weights, original column order
  std::vector<GroupParams> params;  // one per (row, group), row-major over groups (fp8 per tensor: one)
  std::vector<float> in_scale;      // AWQ per-input-channel scale s [K]; empty for RTN and GPTQ
  double awq_ratio = 0;             // AWQ: the chosen exponent (s = x_mean^ratio, normalised); else 0
};

// Round to nearest: fit_group on each group of the original weights, qdq of every value.
QuantResult quantize_rtn(const Spec& spec, const float* W, int64_t N, int64_t K);

struct GptqOptions {
  double damp = 0.01;      // H += damp * mean(diag H) * I
  int64_t block = 128;     // columns per lazy-batch block
  bool act_order = false;  // process columns by descending diag(H) (parameters then fitted up front)
};

// GPTQ. H = 2/n X^T X (float64); an input channel with H_ii == 0 (never active in X) gets H_ii = 1 and
// its weights set to 0 (they never affect the output). H is damped, Hinv = upper Cholesky factor of
// H^-1 (LAPACK dpotrf / dpotri). Columns are quantized left to right; the rounding error of column i,
// err = (w_i - q_i) / Hinv[i,i], is spread over the not yet quantized columns j > i as
// w_j -= err * Hinv[i,j] (inside a block at once, into the later blocks as one GEMM per block).
// Group parameters: without act_order, those of a group are fitted when its first column is reached,
// from the weights as updated by then (the standard GPTQ behaviour). With act_order the columns run in
// descending diag(H) order, and the parameters of every group (contiguous columns in the ORIGINAL
// order) are fitted up front from the original W (GPTQ's "static groups"), so the stored layout keeps
// contiguous groups and needs no column-to-group index. fp8 per tensor: one scale fitted up front.
// Throws Error for bad sizes, NaN/Inf in W or X, damp < 0, block < 1, nf4 double quantization, or a
// Hessian that is not positive definite after damping.
QuantResult quantize_gptq(const Spec& spec, const float* W, int64_t N, int64_t K, const float* X, int64_t n_samples,
                          const GptqOptions& opt = {});

struct AwqOptions {
  int grid = 20;      // ratios 0, 1/grid, ..., (grid-1)/grid
  bool clip = false;  // then AWQ's weight-clipping search on the scaled weights (below)
};

// AWQ scale search, optionally followed by its weight-clipping search. x_mean_k = mean_i |X_ik|; for each
// ratio: s_k = max(x_mean_k^ratio, 1e-4), divided by sqrt(max(s) * min(s)); candidate = RTN(W * s) / s
// (column k scaled by s_k); the ratio with the smallest layer_output_mse on X wins (first one on ties).
// Ratio 0 is s = 1, exactly RTN, so the chosen candidate's MSE on X never exceeds RTN's.
// Result: deq = RTN(W * s) / s, params = those of RTN(W * s) (the scaled weights are what gets stored),
// in_scale = s. A runtime that stores the scaled weights must feed them x / s (divide the input
// channel-wise, or fold 1/s into the preceding layer, e.g. an RMSNorm weight) — deq is the effective
// weight of that composition.
// clip (llm-awq's auto_clip): for each row and group of the scaled weights W s, the range the group is
// fitted to is clipped to +- a max|w| with a = 1, 0.95, ..., 0.55, and the a that minimizes the group's
// own output error on the calibration rows, d^T C d with d = qdq(clip(w)) - w and C = the group's columns
// of (X / s)^T (X / s), is kept (a = 1 first: ties keep the unclipped fit). Clipping trades the rare
// large weights' error for a finer step on all the others. Defined for the group-wise 4-bit formats
// (int4, int4-asym, nf4 without double quantization); llm-awq applies it to every projection but the
// attention's q and k. Throws Error for bad sizes, NaN/Inf in W or X, grid < 1, clip with another format.
QuantResult quantize_awq(const Spec& spec, const float* W, int64_t N, int64_t K, const float* X, int64_t n_samples,
                         const AwqOptions& opt = {});

// Whether AwqOptions::clip is defined for the format: int4, int4-asym, nf4 without double quantization.
inline bool awq_clip_applies(const Spec& s) {
  return (s.format == Format::int4 || s.format == Format::int4_asym || s.format == Format::nf4) && !s.double_quant;
}

// The quantizers by the names both quant techniques take: rtn, gptq, gptq-act-order (GPTQ with act_order),
// awq, awq-clip (AWQ with its clipping search).
inline constexpr std::array<const char*, 5> kQuantizers = {"rtn", "gptq", "gptq-act-order", "awq", "awq-clip"};
inline bool is_quantizer_name(const std::string& name) {
  return std::find(kQuantizers.begin(), kQuantizers.end(), name) != kQuantizers.end();
}
// "rtn, gptq, ... or awq-clip", for messages.
inline std::string quantizer_names() {
  std::string s;
  for (std::size_t i = 0; i < kQuantizers.size(); ++i)
    s += (i == 0 ? "" : i + 1 == kQuantizers.size() ? " or " : ", ") + std::string(kQuantizers[i]);
  return s;
}

// Runs the named quantizer: GPTQ with `gptq` (act_order set for gptq-act-order), awq-clip's clipping
// search only where `clip` (a model leaves its attention's q and k unclipped). Error for another name.
inline QuantResult quantize_named(const std::string& name, const Spec& spec, const float* W, int64_t N, int64_t K,
                                  const float* X, int64_t n_samples, GptqOptions gptq = {}, bool clip = true) {
  if (name == "rtn") return quantize_rtn(spec, W, N, K);
  if (name == "gptq" || name == "gptq-act-order") {
    gptq.act_order = name == "gptq-act-order";
    return quantize_gptq(spec, W, N, K, X, n_samples, gptq);
  }
  if (name == "awq" || name == "awq-clip") {
    AwqOptions awq;
    awq.clip = name == "awq-clip" && clip;
    return quantize_awq(spec, W, N, K, X, n_samples, awq);
  }
  throw Error("quantizer must be " + quantizer_names() + ", got '" + name + "'");
}

// Mean over samples and output rows of (X W^T - X Wq^T)^2, accumulated in float64.
double layer_output_mse(const float* W, const float* Wq, int64_t N, int64_t K, const float* X, int64_t n_samples);

namespace detail {

// Error unless rows, cols > 0.
inline void check_sizes(const char* fn, const char* tensor, int64_t rows, int64_t cols) {
  MT_CHECK(rows > 0 && cols > 0, std::string(fn) + ": " + tensor + " sizes must be positive (got " +
                                     std::to_string(rows) + " x " + std::to_string(cols) + ")");
}

// Error naming the tensor and the [row, col] of the first NaN/Inf of a [rows x cols] array.
inline void check_finite(const char* fn, const char* tensor, const float* a, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows * cols; ++i)
    if (!std::isfinite(a[i]))
      throw Error(std::string(fn) + ": " + tensor + "[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) +
                  "] is " + (std::isnan(a[i]) ? "NaN" : "Inf"));
}

// fp8 with one scale for the whole tensor.
inline bool per_tensor(const Spec& s) {
  return (s.format == Format::fp8_e4m3 || s.format == Format::fp8_e5m2) && !s.per_channel;
}

}  // namespace detail

}  // namespace memtrade::quant
