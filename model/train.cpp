// The CPU training step (train.hpp), one template over the storage type S of weights, activations and
// gradients: float (fp32 policy), bf16_t / f16_t (the 16-bit policies) and double (the float64
// reference). Element math comes from layers.hpp; compute type C is float, or double for S = double.
#include "model/train.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "impls/attention/attention.hpp"
#include "common/blas.hpp"
#include "common/simd/convert.hpp"
#include "common/simd/grad_add.hpp"
#include "model/cpu_adam.hpp"
#include "model/gemm16.hpp"
#include "model/layers.hpp"
#include "model/train_core.hpp"

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
  MT_CHECK(o.delayed_update_from < 0 || o.offload,
           "training: the delayed parameter update (delayed_update_from) needs offload (the update runs on the host)");
  MT_CHECK(!o.offload || (!o.float64 && !o.inference_only && o.policy != Policy::bf16_pure),
           "training: offload keeps fp32 master weights and moments on the host; it does not apply to bf16-pure, "
           "the float64 reference or an inference-only trainer");
  MT_CHECK(o.checkpoint_every >= 1, "training: checkpoint_every must be >= 1, got " + std::to_string(o.checkpoint_every));
  MT_CHECK(o.lora.rank >= 0, "training: lora rank must be >= 0, got " + std::to_string(o.lora.rank));
  if (o.lora.rank > 0) {
    MT_CHECK(!o.offload, "training: LoRA with offload is not supported (the adapters' state is small; offload the base instead)");
    adapter_layout(c, o.lora);  // rank and alpha against the shapes
  }
  MT_CHECK(!o.base_format || (o.lora.rank > 0 && o.base_format->bytes && o.base_format->encode && o.base_format->decode),
           "training: a quantized base format needs LoRA adapters (a frozen base) and its three functions");
}

const char* checkpoint_name(Checkpoint c) {
  switch (c) {
    case Checkpoint::none: return "none";
    case Checkpoint::full: return "full";
    case Checkpoint::every_k: return "every-k";
    case Checkpoint::selective: return "selective";
  }
  return "?";
}

Checkpoint parse_checkpoint(const std::string& name) {
  for (Checkpoint c : {Checkpoint::none, Checkpoint::full, Checkpoint::every_k, Checkpoint::selective})
    if (name == checkpoint_name(c)) return c;
  throw Error("unknown checkpointing policy \"" + name + "\" (none, full, every-k, selective)");
}

int64_t counted_targets(const datasets::Batch& b) {
  return static_cast<int64_t>(std::count_if(b.targets.begin(), b.targets.end(), [](int32_t t) { return t != kIgnoreTarget; }));
}

void check_batch(const Config& c, const TrainOptions& o, const datasets::Batch& b) {
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

// S: weights/activations/gradients; M: AdamW moments; compute in Comp<S>.
template <class S, class M>
class CpuTrainer final : public TrainerCore<CpuTrainer<S, M>, S, M, Comp<S>> {
  using C = Comp<S>;
  static constexpr bool kNarrow = !std::is_same_v<S, C>;  // 16-bit storage, float compute
  using Base = TrainerCore<CpuTrainer<S, M>, S, M, C>;
  friend Base;
  using Base::c_, Base::o_, Base::dev_, Base::L_, Base::master_, Base::weights_, Base::grads_, Base::m_, Base::v_,
      Base::master_buf_, Base::rows, Base::ws;

 public:
  CpuTrainer(const Config& c, const TrainOptions& o, Device& dev, std::span<const float> init)
      : Base(c, o, dev, init, !o.float64 && precision::traits(o.policy).master_fp32,
             o.float64 ? precision::LossScaler(1, 2, 0.5, 1, false)
                       : precision::LossScaler(o.init_scale, 2.0, 0.5, o.growth_interval,
                                               precision::traits(o.policy).loss_scaling)) {
    this->zero_moments();
    auto& pool = dev.memory();
    const int64_t R = rows(), D = c.dim, F = c.ffn, V = c.vocab;
    const int64_t big = std::max(R * std::max({D, F, V}), std::max(F, V) * D);
    gemm_out_ = Buffer(pool, big * sizeof(C), Tag::workspace);
    if constexpr (!std::is_same_v<S, C>) {
      // gemm16's widened A and packed blocks of B (columns padded to whole panels), for every product of
      // the step: k = dim with any n, n = dim with any k, and the weight gradients (k = rows)
      const int64_t wide = std::max({D, F, V});
      gemm_a_floats_ = big;
      gemm_b_floats_ = std::max({big, simd::gemm16_b_floats(wide, D), simd::gemm16_b_floats(D, wide),
                                 simd::gemm16_b_floats(std::max(D, F), R)});
      gemm_a_ = Buffer(pool, gemm_a_floats_ * sizeof(C), Tag::workspace);
      gemm_b_ = Buffer(pool, gemm_b_floats_ * sizeof(C), Tag::workspace);
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
  }

 private:
  C* slot(int k) const { return scratch_.as<C>() + (omp_get_thread_num() * 4 + k) * width_; }

  void zero(void* p, std::size_t bytes) { std::memset(p, 0, bytes); }
  void clear_counters() {}
  void read_counters(StepStats&) {}

  std::vector<float> widen(const S* p, int64_t n) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(ld(p[i]));
    return v;
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
    } else {  // 16-bit operands: widened while packed (model/gemm16.hpp)
      check_gemm16(m, n, k);
      simd::gemm16(ta, tb, m, n, k, A, lda, B, ldb, out, n, false, gemm_a_.as<float>(), gemm_b_.as<float>(),
                   gemm16_team(m, n, k));
    }
  }

  void check_gemm16(int64_t m, int64_t n, int64_t k) const {
    MT_CHECK(simd::gemm16_a_floats(m, k) <= gemm_a_floats_ && simd::gemm16_b_floats(n, k) <= gemm_b_floats_,
             "training: a GEMM's operands exceed the workspace sized for this configuration");
  }
  // A small product runs on one thread: starting the team costs more than it saves.
  int gemm16_team(int64_t m, int64_t n, int64_t k) const { return m * n * k < (int64_t{1} << 20) ? 1 : threads(); }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const S* A, const S* B, S* out, bool acc) {
    if constexpr (kNarrow) {
      if (k <= simd::kGemm16KBlock) {  // rounded into out by the kernel
        check_gemm16(m, n, k);
        simd::gemm16(ta, tb, m, n, k, A, ta ? m : k, B, tb ? k : n, out, n, acc, gemm_a_.as<float>(),
                     gemm_b_.as<float>(), gemm16_team(m, n, k));
        return;
      }
    }
    gemm_raw(ta, tb, m, n, k, A, B);
    C* r = gemm_out_.as<C>();
    if constexpr (kNarrow) {  // out (+)= r, narrowed in SIMD
      chunks(m * n, [&](int64_t lo, int64_t len) {
        if (acc) add_row(r + lo, out + lo, len, slot(0));
        else store_row(r + lo, out + lo, len);
      });
    } else {
#pragma omp parallel for num_threads(threads())
      for (int64_t i = 0; i < m * n; ++i) out[i] = st<S>(acc ? ld(out[i]) + r[i] : r[i]);
    }
  }

  // A weight gradient: grad[m x n] += dY^T X (dY [k x m], X [k x n]), counting fp16 underflow of the new
  // contribution.
  void gemm_grad(int64_t m, int64_t n, int64_t k, const S* A, const S* B, S* grad, StepStats* s) {
    gemm_raw(true, false, m, n, k, A, B);
    C* r = gemm_out_.as<C>();
    int64_t nonzero = 0, under = 0;
#pragma omp parallel for num_threads(threads()) reduction(+ : nonzero, under)
    for (int64_t c = 0; c < m * n; c += width_) {
      const int64_t len = std::min(width_, m * n - c);
      if constexpr (std::is_same_v<C, float>) {  // in vectors, in place (16-bit gradients widened in registers)
        const simd::GradAddCounts k = simd::grad_add(r + c, grad + c, len);
        nonzero += k.nonzero;
        under += k.f16_underflow;
      } else {
        C* g = slot(0);
        load_row(grad + c, g, len);
        for (int64_t i = c; i < c + len; ++i) {
          const float v = static_cast<float>(r[i]);
          nonzero += v != 0.f;
          under += v != 0.f && f16_rounds_to_zero(v);
          g[i - c] += r[i];
        }
        store_row(g, grad + c, len);
      }
    }
    if (s) {
      s->grad_nonzero += nonzero;
      s->grad_underflow_fp16 += under;
    }
  }

  // ---- row operations (16-bit rows are widened into per-thread scratch) ----

  void load_row(const S* src, C* dst, int64_t n) const {
    if constexpr (kNarrow) simd::to_f32(src, dst, n);
    else std::copy_n(src, n, dst);
  }
  void store_row(const C* src, S* dst, int64_t n) const {
    if constexpr (kNarrow) simd::from_f32(src, dst, n);
    else std::copy_n(src, n, dst);
  }

  // dst[0, n) += src, each element rounded once to S (16-bit rows widened into scratch, added and narrowed
  // in vectors).
  void add_row(const C* src, S* dst, int64_t n, C* scratch) const {
    if constexpr (kNarrow) {
      load_row(dst, scratch, n);
      for (int64_t j = 0; j < n; ++j) scratch[j] += src[j];
      store_row(scratch, dst, n);
    } else {
      for (int64_t j = 0; j < n; ++j) dst[j] += src[j];
    }
  }

  // f(lo, len) over [0, n) in chunks of at most width_ elements (a scratch slot), split over the threads.
  template <class F>
  void chunks(int64_t n, F&& f) const {
#pragma omp parallel for num_threads(threads()) if (n > width_)
    for (int64_t c = 0; c < n; c += width_) f(c, std::min(width_, n - c));
  }

  void embedding_fwd(const int32_t* ids, const S* table, S* out) {
    embedding_forward(ids, rows(), table, c_.dim, out);
  }

  // dtable rows += dres rows (serial: repeated ids add up in order).
  void embedding_bwd(const int32_t* ids, const S* d, S* table) {
    const int64_t width = c_.dim;
    for (int64_t r = 0; r < rows(); ++r) {
      const C* add;
      if constexpr (kNarrow) {
        load_row(d + r * width, slot(1), width);
        add = slot(1);
      } else {
        add = d + r * width;
      }
      add_row(add, table + static_cast<int64_t>(ids[r]) * width, width, slot(0));
    }
  }

  // The norm weight is widened once per thread; the rows split over the team as a parallel for would.
  void rmsnorm_fwd(const S* x, const S* w, S* y, C* rms) {
    const int64_t D = c_.dim;
#pragma omp parallel num_threads(threads())
    {
      C *a = slot(0), *wv = slot(1), *b = slot(2);
      load_row(w, wv, D);
#pragma omp for
      for (int64_t r = 0; r < rows(); ++r) {
        load_row(x + r * D, a, D);
        rms[r] = rmsnorm_forward_row(a, wv, b, D, c_.norm_eps);
        store_row(b, y + r * D, D);
      }
    }
  }

  // dres += rmsnorm backward of dy (the residual stream's gradient); dw += the norm weight gradient.
  void rmsnorm_bwd(const S* x, const S* w, const C* rms, const S* dy, S* dres, S* dw) {
    const int64_t D = c_.dim;
    Buffer part = ws(kSlots * D, sizeof(C));
    C* dwp = part.as<C>();
    std::fill_n(dwp, kSlots * D, C(0));
#pragma omp parallel num_threads(threads())
    {
      C *a = slot(0), *wv = slot(1), *g = slot(2), *dx = slot(3);
      load_row(w, wv, D);
#pragma omp for
      for (int64_t r = 0; r < rows(); ++r) {
        load_row(x + r * D, a, D);
        load_row(dy + r * D, g, D);
        rmsnorm_backward_row(a, wv, rms[r], g, dx, dwp + omp_get_thread_num() * D, D);
        add_row(dx, dres + r * D, D, a);
      }
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
    const int64_t T = o_.seq, hd = c_.head_dim(), half = hd / 2, width = heads * hd;
    const C* tab = rope_.as<C>();
    const C sign = forward ? C(1) : C(-1);
    // One head's pairs: y = x rotated for position t.
    auto rotate_head = [&](const C* x, C* y, int64_t t) {
      for (int64_t i = 0; i < half; ++i)
        rope_rotate_pair(x[i], x[i + half], tab[(t * half + i) * 2], tab[(t * half + i) * 2 + 1] * sign, y[i], y[i + half]);
    };
#pragma omp parallel for num_threads(threads())
    for (int64_t bt = 0; bt < rows(); ++bt) {
      const int64_t b = bt / T, t = bt % T;
      auto flat = [&](int64_t h) { return (bt * heads + h) * hd; };
      auto head = [&](int64_t h) { return ((b * heads + h) * T + t) * hd; };
      if (!rotate || !kNarrow) {
        for (int64_t h = 0; h < heads; ++h) {
          const S* in = src + (forward ? flat(h) : head(h));
          S* out = dst + (forward ? head(h) : flat(h));
          if (!rotate) std::copy_n(in, hd, out);
          else if constexpr (!kNarrow) rotate_head(in, out, t);
        }
        continue;
      }
      // 16-bit rows: the row's heads side by side, widened in one call (gathered from the head layout
      // first), rotated, and narrowed in one call (then scattered into the head layout).
      C *x = slot(0), *y = slot(1);
      S* row = reinterpret_cast<S*>(slot(2));
      if (forward) {
        load_row(src + flat(0), x, width);
      } else {
        for (int64_t h = 0; h < heads; ++h) std::copy_n(src + head(h), hd, row + h * hd);
        load_row(row, x, width);
      }
      for (int64_t h = 0; h < heads; ++h) rotate_head(x + h * hd, y + h * hd, t);
      if (forward) {
        store_row(y, row, width);
        for (int64_t h = 0; h < heads; ++h) std::copy_n(row + h * hd, hd, dst + head(h));
      } else {
        store_row(y, dst + flat(0), width);
      }
    }
  }

  // Element-wise operations work on chunks in C (16-bit storage widened and narrowed in SIMD).
  void scale(S* p, int64_t n, C f) {
    chunks(n, [&](int64_t lo, int64_t len) {
      C* a = slot(0);
      load_row(p + lo, a, len);
      for (int64_t i = 0; i < len; ++i) a[i] *= f;
      store_row(a, p + lo, len);
    });
  }

  void swiglu(const S* g, const S* u, S* h, int64_t n) {
    chunks(n, [&](int64_t lo, int64_t len) {
      C *a = slot(0), *b = slot(1);
      load_row(g + lo, a, len);
      load_row(u + lo, b, len);
      for (int64_t i = 0; i < len; ++i) a[i] = swiglu_forward_elem(a[i], b[i]);
      store_row(a, h + lo, len);
    });
  }

  // g and u receive their gradients.
  void swiglu_bwd(S* g, S* u, const S* dh, int64_t n) {
    chunks(n, [&](int64_t lo, int64_t len) {
      C *a = slot(0), *b = slot(1), *d = slot(2);
      load_row(g + lo, a, len);
      load_row(u + lo, b, len);
      load_row(dh + lo, d, len);
      for (int64_t i = 0; i < len; ++i) swiglu_backward_elem(a[i], b[i], d[i], a[i], b[i]);
      store_row(a, g + lo, len);
      store_row(b, u + lo, len);
    });
  }

  // Sum of the rows' losses, in row order (deterministic).
  double ce_loss_sum(const S* z, const int32_t* tg) {
    const int64_t V = c_.vocab;
    double sum = 0;
    for (int64_t r = 0; r < rows(); ++r) {
      C* zr = slot(0);
      load_row(z + r * V, zr, V);
      sum += static_cast<double>(cross_entropy_row_forward(zr, tg[r], V));
    }
    return sum;
  }

  void ce_bwd(S* z, const int32_t* tg, C scale) {
    const int64_t V = c_.vocab;
#pragma omp parallel for num_threads(threads())
    for (int64_t r = 0; r < rows(); ++r) {
      C* zr = slot(0);
      load_row(z + r * V, zr, V);
      cross_entropy_row_backward(zr, tg[r], V, scale, zr);
      store_row(zr, z + r * V, V);
    }
  }

  // ---- attention: the CPU flash kernels (the float64 reference: the attention oracle) ----

  static double* dbl(const Buffer& b) { return static_cast<double*>(b.data()); }

  attention::Dims attn_dims() const {
    return attention::Dims{o_.batch, c_.heads, c_.kv_heads, o_.seq, o_.seq, c_.head_dim(), true, dtype_of<S>(), true};
  }

  // The flash backward needs the per-row log-sum-exp ([B*H*T] fp32).
  int64_t attention_saved_bytes() const { return attn_dims().rows() * static_cast<int64_t>(sizeof(float)); }

  void attention_fwd(LayerActs& a) {
    const attention::Dims s = attn_dims();
    if constexpr (std::is_same_v<S, double>) {
      reference_attention(s, dbl(a.q), dbl(a.k), dbl(a.v), nullptr, dbl(a.o), nullptr, nullptr, nullptr);
    } else {
      Buffer w = ws(attention::cpu_flash_slots(s) * attention::cpu_flash_slot_bytes(s.d), 1);
      const attention::FlashCpuBuffers fb{a.q.data(), a.k.data(), a.v.data(), a.o.data(), nullptr, nullptr, nullptr, nullptr};
      attention::flash_forward_cpu(s, fb, w.as<float>(), attention::cpu_flash_slots(s), a.attn.as<float>());
    }
  }

  // free (free_bytes): scratch the call may overwrite; for 16-bit types it holds the per-thread fp32 dQ
  // accumulators that let the flash backward run in one pass (attention.hpp).
  void attention_bwd(LayerActs& a, const S* dout, S* dq, S* dk, S* dv, void* free, std::size_t free_bytes) {
    const attention::Dims s = attn_dims();
    if constexpr (std::is_same_v<S, double>) {
      reference_attention(s, dbl(a.q), dbl(a.k), dbl(a.v), dout, dbl(a.o), dq, dk, dv);
    } else {
      Buffer w = ws(attention::cpu_flash_slots(s) * attention::cpu_flash_slot_bytes(s.d), 1);
      Buffer delta = ws(s.rows(), sizeof(float));
      const attention::FlashCpuBuffers fb{a.q.data(), a.k.data(), a.v.data(), a.o.data(), dout, dq, dk, dv};
      attention::flash_backward_cpu(s, fb, w.as<float>(), attention::cpu_flash_slots(s), a.attn.as<float>(), delta.as<float>(),
                                    static_cast<float*>(free), static_cast<int64_t>(free_bytes / sizeof(float)));
    }
  }

  // float64 attention per (batch, query head) with the attention technique's oracle; dK and dV of a
  // key/value head accumulate over its query heads.
  static void reference_attention(const attention::Dims& s, const double* q, const double* k, const double* v,
                                  const double* dout, double* o, double* dq, double* dk, double* dv) {
    std::vector<int64_t> all(s.n);
    for (int64_t i = 0; i < s.n; ++i) all[i] = i;
    attention::Dims one = s;
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
        attention::reference_head_f64(one, q + qo, k + ko, v + ko, dout ? dout + qo : nullptr, all,
                                 dout ? tmp_o.data() : o + qo, dq ? dq + qo : nullptr, dk ? dk + ko : nullptr,
                                 dv ? dv + ko : nullptr);
      }
  }

  // ---- AdamW under the policy ----

  // A gradient whose unscaled value g * inv (in double) is Inf or NaN. A product of two finite floats cannot
  // overflow a double, so with a finite inv that is a non-finite g: in 16 bits an exponent field of all
  // ones, read from the bits without widening.
  bool any_non_finite(const S* g, float inv) {
    const int64_t P = this->trainable_total();
    int64_t bad = 0;
    if constexpr (std::is_same_v<S, double>) {
#pragma omp parallel for num_threads(threads()) reduction(+ : bad)
      for (int64_t i = 0; i < P; ++i) bad += !std::isfinite(g[i] * inv);
    } else {
      if (!std::isfinite(inv)) return P > 0;  // 0 x Inf is NaN too
      constexpr uint16_t exp16 = std::is_same_v<S, bf16_t> ? 0x7F80 : 0x7C00;
#pragma omp parallel for num_threads(threads()) reduction(+ : bad)
      for (int64_t i = 0; i < P; ++i) {
        if constexpr (std::is_same_v<S, float>) bad += !std::isfinite(g[i]);
        else bad += (g[i].bits & exp16) == exp16;
      }
    }
    return bad > 0;
  }

  void adamw(const ParamTensor& pt, float lr, float wd, float bc1, float bc2, float inv, int64_t t) {
    const AdamStep st{lr, o_.beta1, o_.beta2, o_.eps, wd, bc1, bc2, inv};
    S* w = this->tw().template as<S>() + pt.offset;
    const S* g = grads_.template as<S>() + pt.offset;
    M *m = m_.template as<M>() + pt.offset, *v = v_.template as<M>() + pt.offset;
    if constexpr (std::is_same_v<M, float>) {  // fp32 moments: the host AdamW kernel (the offload path's)
      if (master_) cpu_adamw<S, S>(st, master_buf_.template as<float>() + pt.offset, m, v, g, w, pt.size);
      else if constexpr (std::is_same_v<S, float>) cpu_adamw<float, float>(st, w, m, v, g, nullptr, pt.size);
      else throw Error("training: 16-bit weights with fp32 moments need a master copy");
    } else if constexpr (std::is_same_v<M, bf16_t>) {  // bf16-pure: bits a function of (seed, step, index)
      static_assert(std::is_same_v<S, bf16_t>);
      cpu_adamw_bf16_sr(st, w, m, v, g, pt.size, o_.seed, static_cast<uint64_t>(t) * this->trainable_total() + pt.offset);
    } else {  // the float64 reference
      static_assert(std::is_same_v<S, double> && std::is_same_v<M, double>);
#pragma omp parallel for num_threads(threads())
      for (int64_t i = 0; i < pt.size; ++i)
        adamw_step(w[i], g[i] * static_cast<double>(inv), m[i], v[i], lr, o_.beta1, o_.beta2, o_.eps, wd, bc1, bc2);
    }
  }

  Buffer gemm_out_, gemm_a_, gemm_b_, scratch_, rope_;
  int64_t gemm_a_floats_ = 0, gemm_b_floats_ = 0;
  int64_t width_ = 0;
};

}  // namespace

std::vector<Trainer::LinearInputs> Trainer::linear_inputs(const datasets::Batch&) {
  throw Error("linear_inputs: not available on this backend");
}

Trainer::LinearInputs Trainer::layer_linear_inputs(const datasets::Batch&, int64_t, std::vector<float>&) {
  throw Error("layer_linear_inputs: not available on this backend");
}

void Trainer::advance_layer(const datasets::Batch&, int64_t, std::vector<float>&) {
  throw Error("advance_layer: not available on this backend");
}

std::vector<float> train_fp32(const Config& c, TrainOptions o, std::span<const uint8_t> train, int64_t steps,
                              uint64_t seed) {
  o.policy = Policy::fp32;
  o.float64 = false;
  o.accum_steps = 1;
  auto dev = make_cpu_device();
  auto t = make_trainer_cpu(c, o, *dev, init_params(c, seed));
  for (int64_t s = 0; s < steps; ++s) {
    const datasets::Batch micro[] = {datasets::sample_batch(train, o.batch, o.seq, seed, static_cast<uint64_t>(s))};
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

#ifndef MEMTRADE_WITH_CUDA
// Without the CUDA backend the CUDA trainer is listed and its cases record "skipped" with the reason.
namespace memtrade::model {
std::unique_ptr<Trainer> make_trainer_cuda(const Config&, const TrainOptions&, Device&, std::span<const float>) {
  throw Skip(cuda_status().reason);
}
}  // namespace memtrade::model
#endif
