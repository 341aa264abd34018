// The CPU training step (train.hpp), one template over the storage type S of weights, activations and
// gradients: float (fp32 policy), bf16_t / f16_t (the 16-bit policies) and double (the float64
// reference). Element math comes from layers.hpp; compute type C is float, or double for S = double.
#include "impls/model/train.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "datasets/random.hpp"
#include "impls/attention/attention.hpp"
#include "impls/common/blas.hpp"
#include "impls/model/layers.hpp"

namespace memtrade::model {

using precision::Policy;

void validate(const Config& c, const TrainOptions& o) {
  validate(c);
  MT_CHECK(o.batch > 0 && o.seq > 0, "training: batch and seq must be positive");
  MT_CHECK(o.seq <= c.context, "training: seq " + std::to_string(o.seq) + " exceeds the model's context " +
                                   std::to_string(c.context));
  MT_CHECK(o.accum_steps > 0, "training: accum_steps must be positive");
  MT_CHECK(std::isfinite(o.lr) && o.lr >= 0, "training: lr must be finite and >= 0");
  MT_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, "training: betas must lie in [0, 1)");
  MT_CHECK(o.eps > 0 && o.weight_decay >= 0, "training: eps must be > 0 and weight_decay >= 0");
  MT_CHECK(o.warmup_steps >= 0 && o.growth_interval > 0, "training: bad warmup_steps or growth_interval");
  MT_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "training: init_scale must be positive");
}

void check_batch(const Config& c, const TrainOptions& o, const data::Batch& b) {
  MT_CHECK(b.batch == o.batch && b.context == o.seq,
           "training: batch of shape [" + std::to_string(b.batch) + " x " + std::to_string(b.context) +
               "], expected [" + std::to_string(o.batch) + " x " + std::to_string(o.seq) + "]");
  const int64_t n = o.batch * o.seq;
  MT_CHECK(static_cast<int64_t>(b.inputs.size()) == n && static_cast<int64_t>(b.targets.size()) == n,
           "training: batch token arrays do not match its shape");
  check_token_ids(b.inputs.data(), n, c.vocab);
  check_targets(b.targets.data(), n, c.vocab);
}

namespace {

constexpr int kSlots = 16;  // per-thread scratch slots: figures do not depend on the core count

template <class S>
using Comp = std::conditional_t<std::is_same_v<S, double>, double, float>;

template <class S>
Comp<S> ld(S v) {
  if constexpr (std::is_same_v<S, double>) return v;
  else return to_f32(v);
}
template <class S, class C>
S st(C v) {
  if constexpr (std::is_same_v<S, double>) return v;
  else return from_f32<S>(static_cast<float>(v));
}

template <class S>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<S, double>) return DType::f64;
  else if constexpr (std::is_same_v<S, float>) return DType::f32;
  else if constexpr (std::is_same_v<S, bf16_t>) return DType::bf16;
  else return DType::f16;
}

int threads() { return std::min(kSlots, omp_get_max_threads()); }

// What the forward keeps for the backward (tag activations).
struct LayerActs {
  Buffer x_in, rms1, xn1, q, k, v, o, lse, x_mid, rms2, xn2, g, u;
};
struct Acts {
  std::vector<LayerActs> layer;
  Buffer x_final, rmsf, xnf, logits;
};

// S: weights/activations/gradients; M: AdamW moments (and master weights when there is a master copy).
template <class S, class M>
class CpuTrainer final : public Trainer {
  using C = Comp<S>;

 public:
  CpuTrainer(const Config& c, const TrainOptions& o, Device& dev, std::span<const float> init)
      : c_(c), o_(o), dev_(dev), L_(param_layout(c)),
        master_(!o.float64 && precision::traits(o.policy).master_fp32),
        scaler_(o.float64 ? precision::LossScaler(1, 2, 0.5, 1, false)
                          : precision::LossScaler(o.init_scale, 2.0, 0.5, o.growth_interval,
                                                  precision::traits(o.policy).loss_scaling)) {
    validate(c, o);
    MT_CHECK(static_cast<int64_t>(init.size()) == L_.total, "trainer: initial parameters do not match the config");
    const int64_t P = L_.total;
    auto& pool = dev.memory();
    weights_ = Buffer(pool, P * sizeof(S), Tag::weights);
    grads_ = Buffer(pool, P * sizeof(S), Tag::grads);
    m_ = Buffer(pool, P * sizeof(M), Tag::optimizer);
    v_ = Buffer(pool, P * sizeof(M), Tag::optimizer);
    if (master_) master_buf_ = Buffer(pool, P * sizeof(float), Tag::master);
    S* w = weights_.as<S>();
    for (int64_t i = 0; i < P; ++i) {
      w[i] = st<S>(static_cast<C>(init[i]));
      m_.as<M>()[i] = M{};
      v_.as<M>()[i] = M{};
      if (master_) master_buf_.as<float>()[i] = init[i];
    }
    const int64_t R = rows(), D = c.dim, F = c.ffn, V = c.vocab;
    const int64_t big = std::max(R * std::max({D, F, V}), std::max(F, V) * D);
    gemm_out_ = Buffer(pool, big * sizeof(C), Tag::workspace);
    if constexpr (!std::is_same_v<S, C>) {
      gemm_a_ = Buffer(pool, big * sizeof(C), Tag::workspace);
      gemm_b_ = Buffer(pool, big * sizeof(C), Tag::workspace);
    }
    width_ = std::max({D, F, V});
    scratch_ = Buffer(pool, kSlots * 4 * width_ * sizeof(C), Tag::workspace);
    // RoPE cos/sin per (position, pair), computed once with layers.hpp's formula.
    const int64_t half = c.head_dim() / 2;
    rope_ = Buffer(pool, o.seq * half * 2 * sizeof(C), Tag::workspace);
    for (int64_t t = 0; t < o.seq; ++t)
      for (int64_t i = 0; i < half; ++i)
        rope_cos_sin(t, i, c.head_dim(), c.rope_theta, rope_.as<C>()[(t * half + i) * 2],
                     rope_.as<C>()[(t * half + i) * 2 + 1]);
    ids_ = Buffer(pool, R * sizeof(int32_t), Tag::io);
    targets_ = Buffer(pool, R * sizeof(int32_t), Tag::io);
  }

  StepStats step(std::span<const data::Batch> micro) override {
    MT_CHECK(static_cast<int64_t>(micro.size()) == o_.accum_steps,
             "training: step got " + std::to_string(micro.size()) + " micro-batches, expected " +
                 std::to_string(o_.accum_steps));
    StepStats s;
    s.loss_scale = scaler_.scale();
    zero_grads();
    double loss = 0;
    for (const auto& b : micro) loss += forward_backward(b, static_cast<C>(s.loss_scale) / static_cast<C>(
                                                                  rows() * o_.accum_steps), &s);
    s.loss = loss / static_cast<double>(micro.size());
    s.applied = optimizer_step(s);
    ++steps_;
    return s;
  }

  double eval_loss(const data::Batch& b) override {
    load_batch(b);
    Acts a;
    return forward(a);
  }

  std::vector<double> gradients(const data::Batch& b) override {
    zero_grads();
    forward_backward(b, C(1) / static_cast<C>(rows()), nullptr);
    std::vector<double> g(L_.total);
    for (int64_t i = 0; i < L_.total; ++i) g[i] = static_cast<double>(ld(grads_.as<S>()[i]));
    return g;
  }

  std::vector<float> params() const override {
    std::vector<float> p(L_.total);
    for (int64_t i = 0; i < L_.total; ++i) p[i] = static_cast<float>(ld(weights_.as<S>()[i]));
    return p;
  }

  std::vector<LinearInputs> linear_inputs(const data::Batch& b) override {
    load_batch(b);
    Acts a;
    forward(a);
    const int64_t R = rows(), D = c_.dim, F = c_.ffn;
    auto widen = [](const S* p, int64_t n) {
      std::vector<float> v(n);
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(ld(p[i]));
      return v;
    };
    std::vector<LinearInputs> out;
    for (auto& A : a.layer) {
      Buffer rows_buf = ws(std::max(R * D, R * F));
      LinearInputs in;
      in[0] = widen(A.xn1.as<S>(), R * D);
      from_heads(A.o.as<S>(), rows_buf.as<S>(), c_.heads, false);
      in[1] = widen(rows_buf.as<S>(), R * D);
      in[2] = widen(A.xn2.as<S>(), R * D);
      swiglu(A.g.as<S>(), A.u.as<S>(), rows_buf.as<S>(), R * F);
      in[3] = widen(rows_buf.as<S>(), R * F);
      out.push_back(std::move(in));
    }
    return out;
  }

  const precision::LossScaler& scaler() const override { return scaler_; }
  int64_t steps_taken() const override { return steps_; }

 private:
  int64_t rows() const { return o_.batch * o_.seq; }
  Buffer act(int64_t n, std::size_t elem = sizeof(S)) { return Buffer(dev_.memory(), n * elem, Tag::activations); }
  Buffer ws(int64_t n, std::size_t elem = sizeof(S)) { return Buffer(dev_.memory(), n * elem, Tag::workspace); }
  S* W(int64_t off) const { return weights_.as<S>() + off; }
  S* G(int64_t off) const { return grads_.as<S>() + off; }
  C* slot(int k) const { return scratch_.as<C>() + (omp_get_thread_num() * 4 + k) * width_; }

  void load_batch(const data::Batch& b) {
    check_batch(c_, o_, b);
    std::copy(b.inputs.begin(), b.inputs.end(), ids_.as<int32_t>());
    std::copy(b.targets.begin(), b.targets.end(), targets_.as<int32_t>());
  }

  void zero_grads() {
    S* g = grads_.as<S>();
#pragma omp parallel for num_threads(threads())
    for (int64_t i = 0; i < L_.total; ++i) g[i] = st<S>(C(0));
  }

  // ---- GEMM: out[m x n] (=, or += when acc) op(A) op(B), fp32 (fp64) accumulation ----

  // A is [m x k] ([k x m] if ta), B is [k x n] ([n x k] if tb). Result into gemm_out_ (C).
  void gemm_raw(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* A, const S* B) {
    C* out = gemm_out_.as<C>();
    const int64_t lda = ta ? m : k, ldb = tb ? k : n;
    if constexpr (std::is_same_v<S, double>) {
      blas::dgemm(ta, tb, m, n, k, 1.0, A, lda, B, ldb, 0.0, out, n);
    } else if constexpr (std::is_same_v<S, float>) {
      blas::sgemm(ta, tb, m, n, k, 1.f, A, lda, B, ldb, 0.f, out, n);
    } else {
      float *a = gemm_a_.as<float>(), *b = gemm_b_.as<float>();
#pragma omp parallel for num_threads(threads())
      for (int64_t i = 0; i < m * k; ++i) a[i] = to_f32(A[i]);
#pragma omp parallel for num_threads(threads())
      for (int64_t i = 0; i < k * n; ++i) b[i] = to_f32(B[i]);
      blas::sgemm(ta, tb, m, n, k, 1.f, a, lda, b, ldb, 0.f, out, n);
    }
  }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* A, const S* B, S* out, bool acc) {
    gemm_raw(ta, tb, m, n, k, A, B);
    const C* r = gemm_out_.as<C>();
#pragma omp parallel for num_threads(threads())
    for (int64_t i = 0; i < m * n; ++i) out[i] = st<S>(acc ? ld(out[i]) + r[i] : r[i]);
  }

  // A weight gradient: grad[m x n] += op(A) op(B), counting fp16 underflow of the new contribution.
  void gemm_grad(int64_t m, int64_t n, int64_t k, const S* A, const S* B, S* grad, StepStats* s) {
    gemm_raw(true, false, m, n, k, A, B);  // dW = dY^T X: A = dY [k x m], B = X [k x n]
    const C* r = gemm_out_.as<C>();
    int64_t nonzero = 0, under = 0;
#pragma omp parallel for num_threads(threads()) reduction(+ : nonzero, under)
    for (int64_t i = 0; i < m * n; ++i) {
      const float v = static_cast<float>(r[i]);
      if (v != 0.f) {
        ++nonzero;
        if ((to_f16(v).bits & 0x7FFFu) == 0) ++under;
      }
      grad[i] = st<S>(ld(grad[i]) + r[i]);
    }
    if (s) {
      s->grad_nonzero += nonzero;
      s->grad_underflow_fp16 += under;
    }
  }

  // ---- row operations (16-bit rows are widened into per-thread scratch) ----

  void load_row(const S* src, C* dst, int64_t n) const {
    for (int64_t j = 0; j < n; ++j) dst[j] = ld(src[j]);
  }
  void store_row(const C* src, S* dst, int64_t n) const {
    for (int64_t j = 0; j < n; ++j) dst[j] = st<S>(src[j]);
  }

  void rmsnorm_fwd(const S* x, const S* w, S* y, C* rms) {
    const int64_t D = c_.dim;
#pragma omp parallel for num_threads(threads())
    for (int64_t r = 0; r < rows(); ++r) {
      C *a = slot(0), *wv = slot(1), *b = slot(2);
      load_row(x + r * D, a, D);
      load_row(w, wv, D);
      rms[r] = rmsnorm_forward_row(a, wv, b, D, c_.norm_eps);
      store_row(b, y + r * D, D);
    }
  }

  // dres += rmsnorm backward of dy (the residual stream's gradient); dw += the norm weight gradient.
  void rmsnorm_bwd(const S* x, const S* w, const C* rms, const S* dy, S* dres, S* dw) {
    const int64_t D = c_.dim;
    Buffer part = ws(kSlots * D, sizeof(C));
    C* dwp = part.as<C>();
    std::fill_n(dwp, kSlots * D, C(0));
#pragma omp parallel for num_threads(threads())
    for (int64_t r = 0; r < rows(); ++r) {
      C *a = slot(0), *wv = slot(1), *g = slot(2), *dx = slot(3);
      load_row(x + r * D, a, D);
      load_row(w, wv, D);
      load_row(dy + r * D, g, D);
      rmsnorm_backward_row(a, wv, rms[r], g, dx, dwp + omp_get_thread_num() * D, D);
      for (int64_t j = 0; j < D; ++j) dres[r * D + j] = st<S>(ld(dres[r * D + j]) + dx[j]);
    }
    for (int64_t j = 0; j < D; ++j) {
      C sum = 0;
      for (int t = 0; t < kSlots; ++t) sum += dwp[t * D + j];
      dw[j] = st<S>(ld(dw[j]) + sum);
    }
  }

  // [B, T, heads, hd] rows -> [B, heads, T, hd], rotated by RoPE (sign 1), or the inverse: dst rows from
  // [B, heads, T, hd] rotated back (sign -1). rotate = false: transpose only.
  void to_heads(const S* src, S* dst, int64_t heads, bool rotate) { permute(src, dst, heads, rotate, true); }
  void from_heads(const S* src, S* dst, int64_t heads, bool rotate) { permute(src, dst, heads, rotate, false); }
  void permute(const S* src, S* dst, int64_t heads, bool rotate, bool forward) {
    const int64_t T = o_.seq, hd = c_.head_dim(), half = hd / 2;
    const C* tab = rope_.as<C>();
#pragma omp parallel for num_threads(threads())
    for (int64_t bt = 0; bt < rows(); ++bt) {
      const int64_t b = bt / T, t = bt % T;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t flat = (bt * heads + h) * hd, head = ((b * heads + h) * T + t) * hd;
        const S* in = src + (forward ? flat : head);
        S* out = dst + (forward ? head : flat);
        if (!rotate) {
          std::copy_n(in, hd, out);
          continue;
        }
        for (int64_t i = 0; i < half; ++i) {
          const C cs = tab[(t * half + i) * 2], sn = tab[(t * half + i) * 2 + 1] * (forward ? C(1) : C(-1));
          C y1, y2;
          rope_rotate_pair(ld(in[i]), ld(in[i + half]), cs, sn, y1, y2);
          out[i] = st<S>(y1);
          out[i + half] = st<S>(y2);
        }
      }
    }
  }

  static double* dbl(const Buffer& b) { return static_cast<double*>(b.data()); }

  attn::Dims attn_dims() const {
    return attn::Dims{o_.batch, c_.heads, c_.kv_heads, o_.seq, o_.seq, c_.head_dim(), true, dtype_of<S>(), true};
  }

  void attention_fwd(LayerActs& a) {
    const attn::Dims s = attn_dims();
    if constexpr (std::is_same_v<S, double>) {
      reference_attention(s, dbl(a.q), dbl(a.k), dbl(a.v), nullptr, dbl(a.o), nullptr, nullptr, nullptr);
    } else {
      Buffer w = ws(attn::cpu_flash_slots(s) * attn::cpu_flash_slot_bytes(s.d), 1);
      const attn::FlashCpuBuffers fb{a.q.data(), a.k.data(), a.v.data(), a.o.data(), nullptr, nullptr, nullptr, nullptr};
      attn::flash_forward_cpu(s, fb, w.as<float>(), attn::cpu_flash_slots(s), a.lse.as<float>());
    }
  }

  void attention_bwd(LayerActs& a, const S* dout, S* dq, S* dk, S* dv) {
    const attn::Dims s = attn_dims();
    if constexpr (std::is_same_v<S, double>) {
      reference_attention(s, dbl(a.q), dbl(a.k), dbl(a.v), dout, dbl(a.o), dq, dk, dv);
    } else {
      Buffer w = ws(attn::cpu_flash_slots(s) * attn::cpu_flash_slot_bytes(s.d), 1);
      Buffer delta = ws(s.rows(), sizeof(float));
      const attn::FlashCpuBuffers fb{a.q.data(), a.k.data(), a.v.data(), a.o.data(), dout, dq, dk, dv};
      attn::flash_backward_cpu(s, fb, w.as<float>(), attn::cpu_flash_slots(s), a.lse.as<float>(), delta.as<float>());
    }
  }

  // float64 attention per (batch, query head) with the attention technique's oracle; dK and dV of a
  // key/value head accumulate over its query heads.
  static void reference_attention(const attn::Dims& s, const double* q, const double* k, const double* v,
                                  const double* dout, double* o, double* dq, double* dk, double* dv) {
    std::vector<int64_t> all(s.n);
    for (int64_t i = 0; i < s.n; ++i) all[i] = i;
    attn::Dims one = s;
    one.b = one.h = one.h_kv = 1;
    const int64_t qs = s.n * s.d, ks = s.n_kv * s.d;
    if (dk) {
      std::fill_n(dk, s.kv_elems(), 0.0);
      std::fill_n(dv, s.kv_elems(), 0.0);
    }
    for (int64_t b = 0; b < s.b; ++b)
      for (int64_t h = 0; h < s.h; ++h) {
        const int64_t qo = (b * s.h + h) * qs, ko = (b * s.h_kv + h / s.group()) * ks;
        std::vector<double> tmp_o(qs);
        attn::reference_head_f64(one, q + qo, k + ko, v + ko, dout ? dout + qo : nullptr, all,
                                 dout ? tmp_o.data() : o + qo, dq ? dq + qo : nullptr, dk ? dk + ko : nullptr,
                                 dv ? dv + ko : nullptr);
      }
  }

  // ---- forward / backward ----

  // Runs the forward pass on the loaded batch, keeping activations in `a`; returns the mean loss.
  double forward(Acts& a) {
    const int64_t R = rows(), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn, V = c_.vocab;
    const int64_t BHT = o_.batch * c_.heads * o_.seq;
    Buffer x = act(R * D);
    embedding_forward(ids_.as<int32_t>(), R, W(L_.embed), D, x.as<S>());
    for (int64_t l = 0; l < c_.layers; ++l) {
      const auto& P = L_.layer[l];
      LayerActs& A = a.layer.emplace_back();
      A.x_in = std::move(x);
      A.rms1 = act(R, sizeof(C));
      A.xn1 = act(R * D);
      rmsnorm_fwd(A.x_in.as<S>(), W(P.attn_norm), A.xn1.as<S>(), A.rms1.as<C>());
      A.q = act(R * D);
      A.k = act(R * KV);
      A.v = act(R * KV);
      A.o = act(R * D);
      A.lse = act(BHT, sizeof(float));
      {
        Buffer lin = ws(R * D);
        gemm(false, true, R, D, D, A.xn1.as<S>(), W(P.wq), lin.as<S>(), false);
        to_heads(lin.as<S>(), A.q.as<S>(), c_.heads, true);
        gemm(false, true, R, KV, D, A.xn1.as<S>(), W(P.wk), lin.as<S>(), false);
        to_heads(lin.as<S>(), A.k.as<S>(), c_.kv_heads, true);
        gemm(false, true, R, KV, D, A.xn1.as<S>(), W(P.wv), lin.as<S>(), false);
        to_heads(lin.as<S>(), A.v.as<S>(), c_.kv_heads, false);
      }
      attention_fwd(A);
      A.x_mid = act(R * D);
      {
        Buffer ot = ws(R * D);
        from_heads(A.o.as<S>(), ot.as<S>(), c_.heads, false);
        std::copy_n(A.x_in.as<S>(), R * D, A.x_mid.as<S>());
        gemm(false, true, R, D, D, ot.as<S>(), W(P.wo), A.x_mid.as<S>(), true);
      }
      A.rms2 = act(R, sizeof(C));
      A.xn2 = act(R * D);
      rmsnorm_fwd(A.x_mid.as<S>(), W(P.mlp_norm), A.xn2.as<S>(), A.rms2.as<C>());
      A.g = act(R * F);
      A.u = act(R * F);
      gemm(false, true, R, F, D, A.xn2.as<S>(), W(P.wg), A.g.as<S>(), false);
      gemm(false, true, R, F, D, A.xn2.as<S>(), W(P.wu), A.u.as<S>(), false);
      x = act(R * D);
      {
        Buffer h = ws(R * F);
        swiglu(A.g.as<S>(), A.u.as<S>(), h.as<S>(), R * F);
        std::copy_n(A.x_mid.as<S>(), R * D, x.as<S>());
        gemm(false, true, R, D, F, h.as<S>(), W(P.wd), x.as<S>(), true);
      }
    }
    a.x_final = std::move(x);
    a.rmsf = act(R, sizeof(C));
    a.xnf = act(R * D);
    rmsnorm_fwd(a.x_final.as<S>(), W(L_.final_norm), a.xnf.as<S>(), a.rmsf.as<C>());
    a.logits = act(R * V);
    gemm(false, true, R, V, D, a.xnf.as<S>(), W(L_.head), a.logits.as<S>(), false);
    // Mean cross-entropy, rows summed in C per thread slot then in order (deterministic).
    const S* z = a.logits.as<S>();
    const int32_t* tg = targets_.as<int32_t>();
    double sum = 0;
    for (int64_t r = 0; r < R; ++r) {
      C* zr = slot(0);
      load_row(z + r * V, zr, V);
      sum += static_cast<double>(cross_entropy_row_forward(zr, tg[r], V));
    }
    return sum / static_cast<double>(R);
  }

  void swiglu(const S* g, const S* u, S* h, int64_t n) {
#pragma omp parallel for num_threads(threads())
    for (int64_t i = 0; i < n; ++i) h[i] = st<S>(swiglu_forward_elem(ld(g[i]), ld(u[i])));
  }

  // Forward and backward of one micro-batch; gradients accumulate. `scale`: d(loss)/d(token loss).
  double forward_backward(const data::Batch& batch, C scale, StepStats* s) {
    load_batch(batch);
    Acts a;
    const double loss = forward(a);
    const int64_t R = rows(), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn, V = c_.vocab;
    // dlogits in place over the logits.
    {
      S* z = a.logits.as<S>();
      const int32_t* tg = targets_.as<int32_t>();
#pragma omp parallel for num_threads(threads())
      for (int64_t r = 0; r < R; ++r) {
        C* zr = slot(0);
        load_row(z + r * V, zr, V);
        cross_entropy_row_backward(zr, tg[r], V, scale, zr);
        store_row(zr, z + r * V, V);
      }
    }
    const S* dz = a.logits.as<S>();
    gemm_grad(V, D, R, dz, a.xnf.as<S>(), G(L_.head), s);
    Buffer dres = ws(R * D);  // gradient of the residual stream
    std::fill_n(dres.as<S>(), R * D, st<S>(C(0)));
    {
      Buffer dxn = ws(R * D);
      gemm(false, false, R, D, V, dz, W(L_.head), dxn.as<S>(), false);
      a.logits.reset();
      rmsnorm_bwd(a.x_final.as<S>(), W(L_.final_norm), a.rmsf.as<C>(), dxn.as<S>(), dres.as<S>(), G(L_.final_norm));
    }
    for (int64_t l = c_.layers - 1; l >= 0; --l) {
      const auto& P = L_.layer[l];
      LayerActs& A = a.layer[l];
      S* dr = dres.as<S>();
      // MLP: x_out = x_mid + Wd h
      {
        Buffer h = ws(R * F), dh = ws(R * F);
        swiglu(A.g.as<S>(), A.u.as<S>(), h.as<S>(), R * F);
        gemm_grad(D, F, R, dr, h.as<S>(), G(P.wd), s);
        gemm(false, false, R, F, D, dr, W(P.wd), dh.as<S>(), false);
        S *g = A.g.as<S>(), *u = A.u.as<S>();
        const S* dhp = dh.as<S>();
#pragma omp parallel for num_threads(threads())
        for (int64_t i = 0; i < R * F; ++i) {
          C dg, du;
          swiglu_backward_elem(ld(g[i]), ld(u[i]), ld(dhp[i]), dg, du);
          g[i] = st<S>(dg);  // g and u now hold their gradients
          u[i] = st<S>(du);
        }
      }
      {
        Buffer dxn = ws(R * D);
        gemm_grad(F, D, R, A.g.as<S>(), A.xn2.as<S>(), G(P.wg), s);
        gemm_grad(F, D, R, A.u.as<S>(), A.xn2.as<S>(), G(P.wu), s);
        gemm(false, false, R, D, F, A.g.as<S>(), W(P.wg), dxn.as<S>(), false);
        gemm(false, false, R, D, F, A.u.as<S>(), W(P.wu), dxn.as<S>(), true);
        A.g.reset();
        A.u.reset();
        rmsnorm_bwd(A.x_mid.as<S>(), W(P.mlp_norm), A.rms2.as<C>(), dxn.as<S>(), dr, G(P.mlp_norm));
      }
      // Attention: x_mid = x_in + Wo attn(...)
      {
        Buffer ot = ws(R * D), dot = ws(R * D), dq = ws(R * D), dk = ws(R * KV), dv = ws(R * KV);
        from_heads(A.o.as<S>(), ot.as<S>(), c_.heads, false);
        gemm_grad(D, D, R, dr, ot.as<S>(), G(P.wo), s);
        gemm(false, false, R, D, D, dr, W(P.wo), ot.as<S>(), false);  // d(o) rows
        to_heads(ot.as<S>(), dot.as<S>(), c_.heads, false);
        attention_bwd(A, dot.as<S>(), dq.as<S>(), dk.as<S>(), dv.as<S>());
        A.o.reset();
        A.lse.reset();
        // Back to rows, undoing RoPE on dq and dk (reusing ot and dot as row buffers).
        Buffer dkr = ws(R * KV), dvr = ws(R * KV);
        from_heads(dq.as<S>(), ot.as<S>(), c_.heads, true);
        from_heads(dk.as<S>(), dkr.as<S>(), c_.kv_heads, true);
        from_heads(dv.as<S>(), dvr.as<S>(), c_.kv_heads, false);
        gemm_grad(D, D, R, ot.as<S>(), A.xn1.as<S>(), G(P.wq), s);
        gemm_grad(KV, D, R, dkr.as<S>(), A.xn1.as<S>(), G(P.wk), s);
        gemm_grad(KV, D, R, dvr.as<S>(), A.xn1.as<S>(), G(P.wv), s);
        gemm(false, false, R, D, D, ot.as<S>(), W(P.wq), dot.as<S>(), false);
        gemm(false, false, R, D, KV, dkr.as<S>(), W(P.wk), dot.as<S>(), true);
        gemm(false, false, R, D, KV, dvr.as<S>(), W(P.wv), dot.as<S>(), true);
        rmsnorm_bwd(A.x_in.as<S>(), W(P.attn_norm), A.rms1.as<C>(), dot.as<S>(), dr, G(P.attn_norm));
      }
      a.layer.pop_back();
    }
    embedding_backward(ids_.as<int32_t>(), R, dres.as<S>(), D, G(L_.embed));
    return loss;
  }

  // embedding_backward in S: dtable rows += dres rows (serial: repeated ids add up in order).
  void embedding_backward(const int32_t* ids, int64_t n, const S* d, int64_t width, S* table) {
    for (int64_t r = 0; r < n; ++r) {
      S* dst = table + static_cast<int64_t>(ids[r]) * width;
      for (int64_t j = 0; j < width; ++j) dst[j] = st<S>(ld(dst[j]) + ld(d[r * width + j]));
    }
  }

  // ---- AdamW under the policy ----

  bool optimizer_step(StepStats& s) {
    const int64_t P = L_.total;
    const float inv = scaler_.inv_scale();
    const S* g = grads_.as<S>();
    int64_t bad = 0;
#pragma omp parallel for num_threads(threads()) reduction(+ : bad)
    for (int64_t i = 0; i < P; ++i)
      if (!std::isfinite(static_cast<double>(ld(g[i])) * inv)) ++bad;
    s.non_finite = bad > 0;
    if (!scaler_.update(s.non_finite)) return false;
    const int64_t t = adam_t_ + 1;
    float bc1, bc2;
    adam_bias_corrections(o_.beta1, o_.beta2, t, bc1, bc2);
    const float lr = o_.warmup_steps > 0 && t <= o_.warmup_steps
                         ? o_.lr * static_cast<float>(t) / static_cast<float>(o_.warmup_steps)
                         : o_.lr;
    S* w = weights_.as<S>();
    M *m = m_.as<M>(), *v = v_.as<M>();
    float* mw = master_ ? master_buf_.as<float>() : nullptr;
    for (const ParamTensor& pt : L_.tensors) {
      const float wd = pt.decay ? o_.weight_decay : 0.f;
#pragma omp parallel for num_threads(threads())
      for (int64_t i = pt.offset; i < pt.offset + pt.size; ++i) {
        using U = std::conditional_t<std::is_same_v<M, double>, double, float>;  // update arithmetic
        const U grad = static_cast<U>(ld(g[i])) * static_cast<U>(inv);
        U mi = load_moment(m[i]), vi = load_moment(v[i]);
        U p = master_ ? static_cast<U>(mw[i]) : static_cast<U>(ld(w[i]));
        adamw_step(p, grad, mi, vi, lr, o_.beta1, o_.beta2, o_.eps, wd, bc1, bc2);
        m[i] = store_moment(mi);
        v[i] = store_moment(vi);
        if (master_) {
          mw[i] = static_cast<float>(p);
          w[i] = st<S>(static_cast<C>(p));
        } else if constexpr (std::is_same_v<S, bf16_t>) {
          // bf16-pure: stochastic rounding, bits a pure function of (seed, step, index).
          const auto bits = static_cast<uint32_t>(data::mix64(o_.seed ^ data::mix64(static_cast<uint64_t>(t) * P + i)));
          w[i] = precision::round_bf16_stochastic(static_cast<float>(p), bits);
        } else {
          w[i] = st<S>(static_cast<C>(p));
        }
      }
    }
    adam_t_ = t;
    return true;
  }

  static auto load_moment(M x) {
    if constexpr (std::is_same_v<M, double>) return x;
    else return to_f32(x);
  }
  template <class U>
  static M store_moment(U x) {
    if constexpr (std::is_same_v<M, double>) return x;
    else return from_f32<M>(static_cast<float>(x));
  }

  const Config c_;
  const TrainOptions o_;
  Device& dev_;
  const ParamLayout L_;
  const bool master_;
  precision::LossScaler scaler_;
  Buffer weights_, grads_, m_, v_, master_buf_;
  Buffer gemm_out_, gemm_a_, gemm_b_, scratch_, rope_, ids_, targets_;
  int64_t width_ = 0;
  int64_t steps_ = 0, adam_t_ = 0;
};

}  // namespace

std::vector<Trainer::LinearInputs> Trainer::linear_inputs(const data::Batch&) {
  throw Error("linear_inputs: not available on this backend");
}

std::vector<float> train_fp32(const Config& c, TrainOptions o, std::span<const uint8_t> train, int64_t steps,
                              uint64_t seed) {
  o.policy = Policy::fp32;
  o.float64 = false;
  o.accum_steps = 1;
  auto dev = make_cpu_device();
  auto t = make_trainer_cpu(c, o, *dev, init_params(c, seed));
  for (int64_t s = 0; s < steps; ++s) {
    const data::Batch micro[] = {data::sample_batch(train, o.batch, o.seq, seed, static_cast<uint64_t>(s))};
    t->step(micro);
  }
  return t->params();
}

std::unique_ptr<Trainer> make_trainer_cpu(const Config& c, const TrainOptions& o, Device& dev,
                                          std::span<const float> init) {
  validate(c, o);
  if (o.float64) return std::make_unique<CpuTrainer<double, double>>(c, o, dev, init);
  switch (o.policy) {
    case Policy::fp32: return std::make_unique<CpuTrainer<float, float>>(c, o, dev, init);
    case Policy::bf16_mixed: return std::make_unique<CpuTrainer<bf16_t, float>>(c, o, dev, init);
    case Policy::fp16_mixed:
    case Policy::fp16_mixed_noscale: return std::make_unique<CpuTrainer<f16_t, float>>(c, o, dev, init);
    case Policy::bf16_pure: return std::make_unique<CpuTrainer<bf16_t, bf16_t>>(c, o, dev, init);
  }
  throw Error("training: unknown precision policy");
}

}  // namespace memtrade::model
