// Layer math of a small Llama-style decoder, forward and hand-written backward, shared by the CPU
// implementations (fp32 and the float64 reference, T = float or double) and CUDA kernels.
//
// Conventions (all tensors row-major, contiguous):
//   * A [rows x width] tensor has element (r, j) at r * width + j.
//   * No function here allocates or checks its inputs: callers pass output / workspace pointers and
//     validate ids and shapes on the host first (the check_* functions at the end, in layers.cpp).
//   * Hyper-parameters (eps, theta, learning rate, ...) are float, as a training config holds them;
//     they are converted to T once, so the fp32 and float64 paths see the same values.
//   * Sums are accumulated in T (the float64 reference accumulates in double).
//   * "Accumulates" means +=: the caller zeroes a gradient buffer once per optimizer step, so
//     gradient accumulation over micro-batches works without extra copies.
//
// RMSNorm:   y = x * r * w with r = 1 / sqrt(mean(x^2) + eps), r saved per row ("inv_rms").
//            dw += dy * x * r;  dx = r * (w dy - x * r^2 * mean(w dy x)).
// RoPE:      half-split convention of Llama / Hugging Face (rotate_half): within one head vector of
//            head_dim d, element i pairs with i + d/2 (i < d/2) and the pair is rotated by the angle
//            pos * theta^(-2i/d) (pos = the token's index in the sequence):
//              y[i] = x[i] cos - x[i + d/2] sin,   y[i + d/2] = x[i + d/2] cos + x[i] sin.
//            Backward is the inverse (transposed) rotation of dy. Layout [seq x heads x head_dim].
// SwiGLU:    h = silu(g) * u, silu(g) = g * sigmoid(g);  dg = dh * u * s (1 + g (1 - s)), du = dh * silu(g).
// Embedding: out[r] = table[ids[r]];  dtable[ids[r]] += dout[r] (scatter-add, repeats add up).
// Cross-entropy over logits [rows x vocab], int32 targets: loss_r = log(sum_j exp(z_j - m)) - (z_t - m)
//            with m = max_j z_j (stable for logits around 1e4: no large m is added back);
//            mean over rows. dz = (softmax(z) - onehot(t)) * scale, scale given by the caller (e.g.
//            upstream_grad / total_tokens). The backward recomputes the row max and sum (no saved
//            state) and may run in place (dz == z).
// AdamW:     one element, PyTorch's formula with decoupled weight decay; the bias corrections are
//            computed once per step by the caller (as DeepSpeed's CPU Adam does), here in PyTorch's
//            form bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (see adam_bias_corrections):
//              p -= lr wd p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//              p -= lr (m / bc1) / (sqrt(v / bc2) + eps).
#pragma once

#include <math.h>

#include <cstdint>

#include "common/common.hpp"

namespace memtrade::model {

// ---- scalar math, overloaded so that float stays float on host and device ----

MT_HD float m_sqrt(float x) { return sqrtf(x); }
MT_HD double m_sqrt(double x) { return sqrt(x); }
MT_HD float m_exp(float x) { return expf(x); }
MT_HD double m_exp(double x) { return exp(x); }
MT_HD float m_log(float x) { return logf(x); }
MT_HD double m_log(double x) { return log(x); }
MT_HD float m_pow(float x, float y) { return powf(x, y); }
MT_HD double m_pow(double x, double y) { return pow(x, y); }
MT_HD float m_cos(float x) { return cosf(x); }
MT_HD double m_cos(double x) { return cos(x); }
MT_HD float m_sin(float x) { return sinf(x); }
MT_HD double m_sin(double x) { return sin(x); }

// ---- RMSNorm ----

// One row of width n; returns r = 1 / sqrt(mean(x^2) + eps), which the backward needs.
template <class T>
MT_HD T rmsnorm_forward_row(const T* x, const T* w, T* y, int64_t n, float eps) {
  T ss = T(0);
  for (int64_t j = 0; j < n; ++j) ss += x[j] * x[j];
  const T r = T(1) / m_sqrt(ss / T(n) + T(eps));
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * r * w[j];
  return r;
}

// One row: writes dx (may alias dy) and, when dw is not null, accumulates dw += dy * x * r. A CUDA
// kernel with one block per row passes dw = nullptr and reduces rmsnorm_dw_term over rows instead.
template <class T>
MT_HD void rmsnorm_backward_row(const T* x, const T* w, T r, const T* dy, T* dx, T* dw, int64_t n) {
  T dot = T(0);  // sum_j w_j dy_j x_j
  for (int64_t j = 0; j < n; ++j) dot += w[j] * dy[j] * x[j];
  const T c = r * r * dot / T(n);
  for (int64_t j = 0; j < n; ++j) {
    const T g = dy[j];
    if (dw != nullptr) dw[j] += g * x[j] * r;
    dx[j] = r * (w[j] * g - x[j] * c);
  }
}

// The contribution of one element to dw_j.
template <class T>
MT_HD T rmsnorm_dw_term(T dy, T x, T r) { return dy * x * r; }

// x, y: [rows x n]; w: [n]; inv_rms: [rows] (saved for the backward).
template <class T>
MT_HD void rmsnorm_forward(const T* x, const T* w, T* y, T* inv_rms, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) inv_rms[r] = rmsnorm_forward_row(x + r * n, w, y + r * n, n, eps);
}

// dx: [rows x n] (written); dw: [n] (accumulated).
template <class T>
MT_HD void rmsnorm_backward(const T* x, const T* w, const T* inv_rms, const T* dy, T* dx, T* dw, int64_t rows,
                            int64_t n) {
  for (int64_t r = 0; r < rows; ++r) rmsnorm_backward_row(x + r * n, w, inv_rms[r], dy + r * n, dx + r * n, dw, n);
}

// ---- RoPE (half-split pairs (i, i + head_dim/2)) ----

// cos and sin of the angle pos * theta^(-2i / head_dim) for pair i (0 <= i < head_dim / 2), in T
// (as Hugging Face computes inv_freq = 1 / theta^(2i/d) and then pos * inv_freq).
template <class T>
MT_HD void rope_cos_sin(int64_t pos, int64_t i, int64_t head_dim, float theta, T& c, T& s) {
  const T inv_freq = T(1) / m_pow(T(theta), T(2 * i) / T(head_dim));
  const T angle = T(pos) * inv_freq;
  c = m_cos(angle);
  s = m_sin(angle);
}

// Rotates one pair; the backward calls it with -s (the inverse rotation).
template <class T>
MT_HD void rope_rotate_pair(T x1, T x2, T c, T s, T& y1, T& y2) {
  y1 = x1 * c - x2 * s;
  y2 = x2 * c + x1 * s;
}

// Rotates every pair of x into y by +angle (sign = 1) or -angle (sign = -1, the inverse).
// x, y: [seq x heads x head_dim], head_dim even; y may alias x (in place). Position of token t is t.
template <class T>
MT_HD void rope_apply(const T* x, T* y, int64_t seq, int64_t heads, int64_t head_dim, float theta, T sign) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < seq; ++t)
    for (int64_t i = 0; i < half; ++i) {
      T c, s;
      rope_cos_sin(t, i, head_dim, theta, c, s);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = (t * heads + h) * head_dim;
        rope_rotate_pair(x[base + i], x[base + i + half], c, sign * s, y[base + i], y[base + i + half]);
      }
    }
}

template <class T>
MT_HD void rope_forward(const T* x, T* y, int64_t seq, int64_t heads, int64_t head_dim, float theta = 10000.f) {
  rope_apply(x, y, seq, heads, head_dim, theta, T(1));
}

// dx = R^T dy (the inverse rotation); dx may alias dy.
template <class T>
MT_HD void rope_backward(const T* dy, T* dx, int64_t seq, int64_t heads, int64_t head_dim, float theta = 10000.f) {
  rope_apply(dy, dx, seq, heads, head_dim, theta, T(-1));
}

// ---- SwiGLU activation ----

// 1 / (1 + exp(-g)): exp overflows to +inf for g < about -88 (float), giving exactly 0.
template <class T>
MT_HD T sigmoid(T g) { return T(1) / (T(1) + m_exp(-g)); }

template <class T>
MT_HD T silu(T g) { return g * sigmoid(g); }

template <class T>
MT_HD T swiglu_forward_elem(T g, T u) { return silu(g) * u; }

template <class T>
MT_HD void swiglu_backward_elem(T g, T u, T dh, T& dg, T& du) {
  const T s = sigmoid(g);
  du = dh * g * s;
  dg = dh * u * s * (T(1) + g * (T(1) - s));
}

// n elements; h may alias g or u.
template <class T>
MT_HD void swiglu_forward(const T* g, const T* u, T* h, int64_t n) {
  for (int64_t k = 0; k < n; ++k) h[k] = swiglu_forward_elem(g[k], u[k]);
}

// dg, du written; dg may alias g and du may alias u (each element is read before it is written).
template <class T>
MT_HD void swiglu_backward(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    T a, b;
    swiglu_backward_elem(g[k], u[k], dh[k], a, b);
    dg[k] = a;
    du[k] = b;
  }
}

// ---- token embedding (ids checked beforehand with check_token_ids) ----

// out: [n x width] = table[ids[r]] rows; table: [vocab x width].
template <class T>
MT_HD void embedding_forward(const int32_t* ids, int64_t n, const T* table, int64_t width, T* out) {
  for (int64_t r = 0; r < n; ++r) {
    const T* src = table + static_cast<int64_t>(ids[r]) * width;
    for (int64_t j = 0; j < width; ++j) out[r * width + j] = src[j];
  }
}

// dtable[ids[r]] += dout[r] (scatter-add; a CUDA version needs atomics or sorted ids).
template <class T>
MT_HD void embedding_backward(const int32_t* ids, int64_t n, const T* dout, int64_t width, T* dtable) {
  for (int64_t r = 0; r < n; ++r) {
    T* dst = dtable + static_cast<int64_t>(ids[r]) * width;
    for (int64_t j = 0; j < width; ++j) dst[j] += dout[r * width + j];
  }
}

// ---- cross-entropy (targets checked beforehand with check_targets) ----

// A target that counts no loss (a padding position): its row's loss is 0 and its logits' gradient 0.
constexpr int32_t kIgnoreTarget = -1;

template <class T>
MT_HD T row_max(const T* z, int64_t n) {
  T m = z[0];
  for (int64_t j = 1; j < n; ++j) m = z[j] > m ? z[j] : m;
  return m;
}

// sum_j exp(z_j - m).
template <class T>
MT_HD T row_exp_sum(const T* z, int64_t n, T m) {
  T s = T(0);
  for (int64_t j = 0; j < n; ++j) s += m_exp(z[j] - m);
  return s;
}

// Loss of one row: logsumexp(z) - z[target], as log(sum exp(z - m)) - (z[target] - m).
template <class T>
MT_HD T cross_entropy_row_forward(const T* z, int32_t target, int64_t vocab) {
  if (target == kIgnoreTarget) return T(0);
  const T m = row_max(z, vocab);
  return m_log(row_exp_sum(z, vocab, m)) - (z[target] - m);
}

// dz = (softmax(z) - onehot(target)) * scale; dz may alias z (in place over the logits).
template <class T>
MT_HD void cross_entropy_row_backward(const T* z, int32_t target, int64_t vocab, T scale, T* dz) {
  if (target == kIgnoreTarget) {
    for (int64_t j = 0; j < vocab; ++j) dz[j] = T(0);
    return;
  }
  const T m = row_max(z, vocab);
  const T inv_sum = T(1) / row_exp_sum(z, vocab, m);
  for (int64_t j = 0; j < vocab; ++j) {
    const T p = m_exp(z[j] - m) * inv_sum;
    dz[j] = (p - (j == target ? T(1) : T(0))) * scale;
  }
}

// Mean loss over the counted rows (targets not kIgnoreTarget; NaN when none counts); row_loss ([rows])
// receives the per-row losses when not null.
template <class T>
MT_HD T cross_entropy_forward(const T* z, const int32_t* targets, int64_t rows, int64_t vocab, T* row_loss = nullptr) {
  T sum = T(0);
  int64_t counted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T l = cross_entropy_row_forward(z + r * vocab, targets[r], vocab);
    if (row_loss != nullptr) row_loss[r] = l;
    sum += l;
    counted += targets[r] != kIgnoreTarget;
  }
  return sum / T(counted);
}

// dz: [rows x vocab], written (may alias z). For the gradient of the mean loss pass scale = 1 / (counted
// rows); under gradient accumulation pass 1 / (counted tokens in all micro-batches).
template <class T>
MT_HD void cross_entropy_backward(const T* z, const int32_t* targets, int64_t rows, int64_t vocab, T scale, T* dz) {
  for (int64_t r = 0; r < rows; ++r)
    cross_entropy_row_backward(z + r * vocab, targets[r], vocab, scale, dz + r * vocab);
}

// ---- AdamW ----

// bc1 = 1 - beta1^step, bc2 = 1 - beta2^step for step = 1, 2, ... (computed in double, once per step).
MT_HD void adam_bias_corrections(float beta1, float beta2, int64_t step, float& bc1, float& bc2) {
  bc1 = static_cast<float>(1.0 - pow(static_cast<double>(beta1), static_cast<double>(step)));
  bc2 = static_cast<float>(1.0 - pow(static_cast<double>(beta2), static_cast<double>(step)));
}

template <class T>
MT_HD void adamw_step(T& param, T grad, T& m, T& v, float lr, float beta1, float beta2, float eps, float weight_decay,
                      float bias_correction1, float bias_correction2) {
  const T lr_t = T(lr), b1 = T(beta1), b2 = T(beta2);
  param -= lr_t * T(weight_decay) * param;
  m = b1 * m + (T(1) - b1) * grad;
  v = b2 * v + (T(1) - b2) * grad * grad;
  param -= lr_t * (m / T(bias_correction1)) / (m_sqrt(v / T(bias_correction2)) + T(eps));
}

// ---- host-side checks (layers.cpp); they throw memtrade::Error ----

// Every id in [0, vocab).
void check_token_ids(const int32_t* ids, int64_t n, int64_t vocab);
// Every target in [0, vocab) or kIgnoreTarget.
void check_targets(const int32_t* targets, int64_t n, int64_t vocab);
// head_dim positive and even, seq and heads non-negative.
void check_rope_shape(int64_t seq, int64_t heads, int64_t head_dim);

}  // namespace memtrade::model
