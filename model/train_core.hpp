// The training step's orchestration, shared by the CPU (train.cpp) and CUDA (train.cu) trainers: the
// model state and its tags, the forward and backward sequence layer by layer, which activations live
// when, the step over micro-batches with loss scaling, AdamW's bookkeeping (warm-up, bias corrections,
// skipped steps), evaluation and calibration capture. Backends supply the operations (CRTP): a backend
// class B derives from TrainerCore<B, S, M, C> and provides
//
//   embedding_fwd(ids, table, out)            out rows = table[ids] (R rows of dim)
//   embedding_bwd(ids, dres, dtable)          dtable[ids] += dres rows (repeats add up in row order)
//   rmsnorm_fwd(x, w, y, rms)                 rows of dim; rms: [R] of C
//   rmsnorm_bwd(x, w, rms, dy, dres, dw)      dres += dx; dw += the weight gradient
//   gemm(ta, tb, m, n, k, A, B, out, acc)     out[m x n] (= or +=) op(A) op(B), fp32 (C) accumulation
//   gemm_grad(m, n, k, dY, X, grad, stats)    grad[m x n] += dY^T X, counting fp16 underflow
//   to_heads / from_heads(src, dst, heads, rotate)   [R x heads*hd] <-> [B, heads, T, hd] (+ RoPE)
//   attention_saved_bytes()                   what attention keeps per layer for its backward (A.attn)
//   attention_fwd(A)                          A.o from A.q, A.k, A.v: causal GQA, [B, H, T, hd] layout
//   attention_bwd(A, dout, dq, dk, dv, free, free_bytes)   free: a workspace buffer the call may overwrite
//   swiglu(g, u, h, n), swiglu_bwd(g, u, dh, n)   the backward leaves dg in g and du in u
//   ce_loss_sum(logits, targets)              sum over rows of the cross-entropy (double)
//   ce_bwd(logits, targets, scale)            dlogits in place
//   scale(ptr, n, f)                          ptr[i] = ptr[i] * f, rounded to S (LoRA's alpha / r)
//   clear_counters(), read_counters(stats)    the fp16-underflow counters of a step (device backends)
//   any_non_finite(grads, inv_scale)          a gradient whose unscaled value is Inf or NaN
//   adamw(tensor, lr, wd, bc1, bc2, inv_scale, t)  the update of one parameter tensor under the policy
//   widen(ptr, n)                             n S values to host fp32
//   zero(ptr, bytes)                          all bits 0 (+0 in every storage type)
// and owns its workspace. The core allocates everything else with the tags train.hpp lists.
#pragma once

#include <type_traits>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "model/cpu_adam.hpp"
#include "model/train.hpp"

namespace memtrade::model {

// What the forward keeps for the backward (tag activations). `attn` is the attention backend's saved
// state (the CPU flash kernels' log-sum-exp, or the CUDA plain attention's probabilities).
struct LayerActs {
  Buffer x_in, rms1, xn1, q, k, v, o, attn, x_mid, rms2, xn2, g, u;
  std::array<Buffer, kProjCount> lora;  // s * (x A^T) of each adapted projection (LoRA)
};
struct Acts {
  std::vector<LayerActs> layer;
  Buffer x_final, rmsf, xnf, logits;
};

// S: weights / activations / gradients; M: AdamW moments; C: compute type (float, or double for the
// float64 reference).
template <class B, class S, class M, class C>
class TrainerCore : public Trainer {
 public:
  StepStats step(std::span<const datasets::Batch> micro) override {
    MT_CHECK(static_cast<int64_t>(micro.size()) == o_.accum_steps,
             "training: step got " + std::to_string(micro.size()) + " micro-batches, expected " +
                 std::to_string(o_.accum_steps));
    StepStats s;
    s.loss_scale = scaler_.scale();
    if (offload_ && o_.delayed_update_from >= 0 && steps_ >= o_.delayed_update_from) return delayed_step(micro, s);
    decode_stats_ = &s;
    accumulate(micro, s);
    decode_stats_ = nullptr;
    be().read_counters(s);
    s.applied = optimizer_step(s);
    dev_.synchronize();
    ++steps_;
    return s;
  }

  void flush_update() override {
    if constexpr (kCanOffload) {
      if (!pending_) return;
      StepStats s;
      apply_pending(pending_update(), s);
      pending_ = false;
      dev_.synchronize();
    }
  }

  double eval_loss(const datasets::Batch& b) override {
    const int64_t n = counted_targets(b);
    MT_CHECK(n > 0, "eval_loss: the batch counts no target (all ignored)");
    load_batch(b);
    Acts a;
    return forward(a, false) / static_cast<double>(n);
  }

  std::vector<float> logits(const datasets::Batch& b) override {
    load_batch(b);
    Acts a;
    forward(a, false);
    return be().widen(a.logits.template as<S>(), rows() * c_.vocab);
  }

  // Through the policy's real path: the loss multiplied by the loss scaler's current scale (1 when the
  // policy does not scale), the gradient stored in S, then unscaled as the optimizer step unscales it.
  std::vector<double> gradients(const datasets::Batch& b) override { return gradients(std::span(&b, 1)); }

  std::vector<double> gradients(std::span<const datasets::Batch> micro) override {
    StepStats s;
    s.loss_scale = scaler_.scale();
    accumulate(micro, s);
    const float scale = s.loss_scale, inv = scaler_.inv_scale();
    if constexpr (std::is_same_v<S, double>) {  // the float64 reference: every bit of its gradient
      const double* g = grads_.template as<double>();
      std::vector<double> out(g, g + trainable_total());
      if (scale != 1.f)
        for (auto& x : out) x *= static_cast<double>(inv);
      return out;
    } else {
      const int64_t n = trainable_total();
      const auto g = offload_ ? host_widen(grads_.template as<S>(), n) : be().widen(grads_.template as<S>(), n);
      std::vector<double> out(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) out[i] = precision::unscale(g[i], inv);
      return out;
    }
  }

  std::vector<float> params() const override {
    auto& self = *const_cast<TrainerCore*>(this);
    if (!qfmt_) return self.be().widen(weights_.template as<S>(), L_.total);
    std::vector<float> out(L_.total);
    for (const auto& [off, at, n] : rest_) {
      const auto v = self.be().widen(weights_.template as<S>() + at, n);
      std::copy(v.begin(), v.end(), out.begin() + off);
    }
    for (const QProj& q : qproj_) {
      std::vector<uint8_t> blob(q.blob.bytes());
      dev_.copy(blob.data(), q.blob.data(), blob.size(), CopyKind::device_to_host);
      qfmt_->decode(q.rows, q.cols, blob.data(), out.data() + q.offset);
    }
    return out;
  }

  std::vector<float> trainable_params() const override {
    return const_cast<TrainerCore*>(this)->be().widen(tw().template as<S>(), trainable_total());
  }

  void set_trainable(std::span<const float> v) override {
    const int64_t n = trainable_total();
    MT_CHECK(static_cast<int64_t>(v.size()) == n, "set_trainable: " + std::to_string(v.size()) +
                                                      " values, expected " + std::to_string(n));
    upload(tw(), v, n);
  }

  std::vector<LinearInputs> linear_inputs(const datasets::Batch& b) override {
    load_batch(b);
    Acts a;
    forward(a, false);
    std::vector<LinearInputs> out;
    for (auto& A : a.layer) out.push_back(inputs_of(A));
    return out;
  }

  LinearInputs layer_linear_inputs(const datasets::Batch& b, int64_t l, std::vector<float>& x) override {
    LayerActs A;
    enter_layer(b, l, x, A);
    layer_forward(l, A);
    return inputs_of(A);
  }

  void advance_layer(const datasets::Batch& b, int64_t l, std::vector<float>& x) override {
    LayerActs A;
    enter_layer(b, l, x, A);
    Buffer out = layer_forward(l, A);
    x = be().widen(out.template as<S>(), rows() * c_.dim);
  }

  const precision::LossScaler& scaler() const override { return scaler_; }
  int64_t steps_taken() const override { return steps_; }

 protected:
  // Allocates and uploads the model state (weights, grads, master, moments) and the batch buffers.
  TrainerCore(const Config& c, const TrainOptions& o, Device& dev, std::span<const float> init, bool master,
              precision::LossScaler scaler)
      : c_(c), o_(o), dev_(dev), L_(param_layout(c)), master_(master), scaler_(scaler) {
    validate(c, o);
    MT_CHECK(static_cast<int64_t>(init.size()) == L_.total, "trainer: initial parameters do not match the config");
    auto& pool = dev.memory();
    if (o.base_format) {
      qfmt_ = o.base_format;
      store_quantized_base(init);
    } else {
      weights_ = Buffer(pool, L_.total * sizeof(S), Tag::weights);
    }
    std::vector<float> adapter_init;
    if (o.lora.rank > 0) {  // the base is frozen: gradients, moments and master cover the adapters only
      lora_ = true;
      AL_ = adapter_layout(c, o.lora);
      adapters_ = Buffer(pool, AL_.total * sizeof(S), Tag::weights);
      adapter_init = lora_init(c, o.lora, o.seed);
    }
    const int64_t P = trainable_total();
    if (o.offload) {  // validate() has ruled out bf16 moments, float64 and inference_only
      if constexpr (kCanOffload) {
        offload_ = true;
        master_ = true;
        auto& host = dev.host();
        grads_ = Buffer(host, P * sizeof(S), Tag::grads);
        m_ = Buffer(host, P * sizeof(M), Tag::optimizer);
        v_ = Buffer(host, P * sizeof(M), Tag::optimizer);
        master_buf_ = Buffer(host, P * sizeof(float), Tag::master);
        if (o.delayed_update_from >= 0) pending_grads_ = Buffer(host, P * sizeof(S), Tag::grads);
        flushed_.assign(c.layers + 3, false);
      } else {
        throw Error("offload: needs fp32 AdamW moments (not bf16-pure or the float64 reference)");
      }
    } else if (o.inference_only) {
      master_ = false;
    } else {
      grads_ = Buffer(pool, P * sizeof(S), Tag::grads);
      m_ = Buffer(pool, P * sizeof(M), Tag::optimizer);
      v_ = Buffer(pool, P * sizeof(M), Tag::optimizer);
    }
    if (master_ && !offload_) master_buf_ = Buffer(pool, P * sizeof(float), Tag::master);
    if (!qfmt_) upload(weights_, init, L_.total, !lora_);
    if (lora_) upload(adapters_, adapter_init, P);
    ids_ = Buffer(pool, rows() * sizeof(int32_t), Tag::io);
    targets_ = Buffer(pool, rows() * sizeof(int32_t), Tag::io);
  }

  // Uploads n fp32 values to `dst` rounded to S, and (when `trainable` and there is one) to the master copy.
  void upload(Buffer& dst, std::span<const float> v, int64_t n, bool trainable = true) {
    std::vector<S> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = store<S>(static_cast<C>(v[i]));
    dev_.copy(dst.data(), w.data(), n * sizeof(S), CopyKind::host_to_device);
    if (!trainable || !master_) return;
    if (offload_) std::memcpy(master_buf_.data(), v.data(), n * sizeof(float));
    else dev_.copy(master_buf_.data(), v.data(), n * sizeof(float), CopyKind::host_to_device);
  }

  // What the optimizer updates: every parameter, or the adapters (LoRA).
  const std::vector<ParamTensor>& trainable_tensors() const { return lora_ ? AL_.tensors : L_.tensors; }
  int64_t trainable_total() const { return lora_ ? AL_.total : L_.total; }
  const Buffer& tw() const { return lora_ ? adapters_ : weights_; }
  Buffer& tw() { return lora_ ? adapters_ : weights_; }

  // Host-side rounding of a C value to a storage type.
  template <class T>
  static T store(C v) {
    if constexpr (std::is_same_v<T, double>) return static_cast<double>(v);
    else return from_f32<T>(static_cast<float>(v));
  }

  B& be() { return static_cast<B&>(*this); }
  int64_t rows() const { return o_.batch * o_.seq; }
  Buffer act(int64_t n, std::size_t elem = sizeof(S)) { return Buffer(dev_.memory(), n * elem, Tag::activations); }
  Buffer ws(int64_t n, std::size_t elem = sizeof(S)) { return Buffer(dev_.memory(), n * elem, Tag::workspace); }
  // QLoRA: a projection's blob, and a tensor packed in weights_ (layout offset, weights_ offset, size).
  struct QProj {
    int64_t offset, rows, cols;
    Buffer blob;
  };
  struct Packed {
    int64_t offset, at, size;
  };
  S* W(int64_t off) const {
    if (!qfmt_) return weights_.template as<S>() + off;
    for (const auto& [lo, at, n] : rest_)
      if (lo == off) return weights_.template as<S>() + at;
    for (const QProj& q : qproj_)
      if (q.offset == off) return decoded(q);
    throw Error("training: no base tensor at offset " + std::to_string(off));
  }

  // ---- QLoRA: the projections as blobs of o_.base_format, the other tensors packed in weights_ ----

  void store_quantized_base(std::span<const float> init) {
    auto& pool = dev_.memory();
    int64_t packed = 0, largest = 0;
    for (int64_t l = 0; l < c_.layers; ++l)
      for (int p = 0; p < kProjCount; ++p) {
        const auto [rows, cols] = proj_shape(c_, static_cast<Proj>(p));
        QProj q{proj_offset(L_, l, static_cast<Proj>(p)), rows, cols, Buffer(pool, qfmt_->bytes(rows, cols), Tag::weights)};
        std::vector<uint8_t> blob(q.blob.bytes());
        qfmt_->encode(rows, cols, init.data() + q.offset, blob.data());
        dev_.copy(q.blob.data(), blob.data(), blob.size(), CopyKind::host_to_device);
        largest = std::max(largest, rows * cols);
        qproj_.push_back(std::move(q));
      }
    for (const ParamTensor& t : L_.tensors) {
      const bool proj = std::any_of(qproj_.begin(), qproj_.end(), [&](const QProj& q) { return q.offset == t.offset; });
      if (proj) continue;
      rest_.push_back({t.offset, packed, t.size});
      packed += t.size;
    }
    weights_ = Buffer(pool, packed * sizeof(S), Tag::weights);
    std::vector<float> rest(packed);
    for (const auto& [off, at, n] : rest_) std::copy(init.begin() + off, init.begin() + off + n, rest.begin() + at);
    upload(weights_, rest, packed, false);
    decoded_ = Buffer(pool, largest * sizeof(S), Tag::workspace);
  }

  // Decodes a projection into the workspace matrix (kept until another projection is decoded).
  S* decoded(const QProj& q) const {
    S* out = decoded_.template as<S>();
    if (decoded_off_ == q.offset) return out;
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n = q.rows * q.cols;
    Buffer blob(dev_.host(), q.blob.bytes(), Tag::workspace), wide(dev_.host(), n * sizeof(float), Tag::workspace),
        narrow(dev_.host(), n * sizeof(S), Tag::workspace);
    dev_.copy(blob.data(), q.blob.data(), q.blob.bytes(), CopyKind::device_to_host);
    qfmt_->decode(q.rows, q.cols, blob.template as<uint8_t>(), wide.template as<float>());
    const float* w = wide.template as<float>();
    S* s = narrow.template as<S>();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) s[i] = store<S>(static_cast<C>(w[i]));
    dev_.copy(out, s, n * sizeof(S), CopyKind::host_to_device);
    dev_.synchronize();
    decoded_off_ = q.offset;
    if (decode_stats_) {
      ++decode_stats_->base_decodes;
      decode_stats_->base_decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return out;
  }
  // A parameter's gradient: in the gradient buffer, or (offload) in the device's staged segment.
  S* G(int64_t off) const {
    if (!offload_) return grads_.template as<S>() + off;
    MT_CHECK(off >= stage_lo_ && off < stage_hi_, "offload: a gradient outside the staged segment");
    return stages_[cur_stage_].template as<S>() + (off - stage_lo_);
  }
  void copy_rows(const Buffer& src, Buffer& dst, int64_t n) {
    dev_.copy(dst.data(), src.data(), n * sizeof(S), CopyKind::device_to_device);
  }

  void load_batch(const datasets::Batch& b) {
    check_batch(c_, o_, b);
    dev_.copy(ids_.data(), b.inputs.data(), rows() * sizeof(int32_t), CopyKind::host_to_device);
    dev_.copy(targets_.data(), b.targets.data(), rows() * sizeof(int32_t), CopyKind::host_to_device);
  }

  // Called by the backend's constructor once its operations can run.
  void zero_moments() {
    if (o_.inference_only) return;
    if (offload_) {
      std::memset(m_.data(), 0, m_.bytes());
      std::memset(v_.data(), 0, v_.bytes());
      return;
    }
    be().zero(m_.data(), m_.bytes());
    be().zero(v_.data(), v_.bytes());
  }

  void zero_grads() {
    MT_CHECK(!o_.inference_only, "training: this trainer was made for inference only (no gradients)");
    if (offload_) {
      std::memset(grads_.data(), 0, grads_.bytes());
      std::fill(flushed_.begin(), flushed_.end(), false);
    } else {
      be().zero(grads_.data(), grads_.bytes());
    }
    be().clear_counters();
  }

  // Offload needs fp32 moments and a 32- or 16-bit storage type (not the float64 reference).
  static constexpr bool kCanOffload = std::is_same_v<M, float> && !std::is_same_v<S, double>;

  static std::vector<float> host_widen(const S* p, int64_t n) {
    std::vector<float> v(n);
    if constexpr (kCanOffload)
      for (int64_t i = 0; i < n; ++i) v[i] = to_f32(p[i]);
    return v;
  }

  // ---- offload: the device holds one segment's gradients at a time ----

  // Segment ids: 0 the embedding (and a tied head), 1 + l layer l, L + 1 the final norm, L + 2 the head.
  std::pair<int64_t, int64_t> segment_range(int64_t id) const {
    const auto& T = L_.tensors;
    auto end_of = [&](int64_t off) {
      for (const auto& t : T)
        if (t.offset == off) return off + t.size;
      return off;
    };
    if (id == 0) return {L_.embed, end_of(L_.embed)};
    if (id <= c_.layers) {
      const auto& P = L_.layer[id - 1];
      return {P.attn_norm, end_of(P.wd)};
    }
    if (id == c_.layers + 1) return {L_.final_norm, end_of(L_.final_norm)};
    return {L_.head, end_of(L_.head)};
  }
  int64_t head_segment() const { return c_.tie_embeddings ? 0 : c_.layers + 2; }

  // The device's segment buffers for one backward: two that take turns where the device overlaps copies
  // (a segment's gradients go to the host while the next segment's backward runs), else one.
  void open_stages() {
    const int n = dev_.overlaps_copies() ? 2 : 1;
    for (int k = 0; k < n; ++k) stages_[k] = Buffer(dev_.memory(), largest_segment() * sizeof(S), Tag::grads);
    cur_stage_ = 0;
    stage_fence_[0] = stage_fence_[1] = -1;
  }
  // After the backward's last flush: the host's gradients are complete once the copies are.
  void close_stages(StepStats* s) {
    flush_segment(s);
    for (int64_t f : stage_fence_)
      if (f >= 0) dev_.wait_copies(f);
    stages_[0].reset();
    stages_[1].reset();
  }
  // Sends the staged segment to the host and stages segment `id` (zeroed) on the device, in the next buffer
  // once the copy out of it is done.
  void stage_segment(int64_t id, StepStats* s) {
    if (!offload_) return;
    flush_segment(s);
    std::tie(stage_lo_, stage_hi_) = segment_range(id);
    stage_id_ = id;
    if (stage_fence_[cur_stage_] >= 0) dev_.join_copies_until(stage_fence_[cur_stage_]);
    be().zero(stages_[cur_stage_].data(), static_cast<std::size_t>(stage_hi_ - stage_lo_) * sizeof(S));
  }
  // The first flush of a segment in a step copies into the zeroed host gradients (overlapped: after the
  // kernels that wrote them, on the copy stream); later ones (the next micro-batches, a tied head) add
  // there in S, after every copy issued before.
  void flush_segment(StepStats* s) {
    if (!offload_ || stage_id_ < 0) return;
    const int64_t n = stage_hi_ - stage_lo_;
    S* host = grads_.template as<S>() + stage_lo_;
    const Buffer& stage = stages_[cur_stage_];
    if (!flushed_[stage_id_]) {
      dev_.fork_copies();
      dev_.copy_async(host, stage.data(), n * sizeof(S), CopyKind::device_to_host);
      stage_fence_[cur_stage_] = dev_.copy_fence();
      flushed_[stage_id_] = true;
    } else {
      Buffer tmp(dev_.host(), n * sizeof(S), Tag::workspace);
      dev_.copy(tmp.data(), stage.data(), n * sizeof(S), CopyKind::device_to_host);
      const S* add = tmp.template as<S>();
      if constexpr (kCanOffload)
        for (int64_t i = 0; i < n; ++i) host[i] = store<S>(to_f32(host[i]) + to_f32(add[i]));
    }
    if (s) s->bytes_to_host += n * static_cast<int64_t>(sizeof(S));
    stage_id_ = -1;
    stage_lo_ = stage_hi_ = 0;
    if (stages_[1].data()) cur_stage_ ^= 1;
  }
  int64_t largest_segment() const {
    int64_t n = 0;
    for (int64_t id = 0; id <= c_.layers + 2; ++id) n = std::max(n, segment_range(id).second - segment_range(id).first);
    return n;
  }

  // Zeroes the gradients and accumulates those of the micro-batches' loss (token-normalized, or the mean
  // of their means under o_.mean_of_means), scaled by s.loss_scale; s receives the loss, the counted
  // tokens and the recomputation count.
  void accumulate(std::span<const datasets::Batch> micro, StepStats& s) {
    zero_grads();
    for (const auto& b : micro) s.tokens += counted_targets(b);
    MT_CHECK(s.tokens > 0, "training: the micro-batches count no target (all ignored)");
    const auto k = static_cast<int64_t>(micro.size());
    double loss = 0;
    for (const auto& b : micro) {
      if (o_.mean_of_means) {  // each micro-batch's mean, averaged: wrong when their token counts differ
        const int64_t n = counted_targets(b);
        if (n == 0) continue;
        loss += forward_backward(b, static_cast<C>(s.loss_scale) / static_cast<C>(n * k), &s) /
                static_cast<double>(n * k);
      } else {
        loss += forward_backward(b, static_cast<C>(s.loss_scale) / static_cast<C>(s.tokens), &s);
      }
    }
    s.loss = o_.mean_of_means ? loss : loss / static_cast<double>(s.tokens);
  }

  // Layers whose forward the checkpointing policy runs again in the backward: a segment of k layers
  // keeps the input of its first layer only (0: no segments). The last segment is never dropped.
  int64_t segment_layers() const {
    switch (o_.checkpoint) {
      case Checkpoint::full: return 1;
      case Checkpoint::every_k: return std::min(o_.checkpoint_every, c_.layers);
      default: return 0;
    }
  }
  int64_t last_segment_start() const {
    const int64_t k = segment_layers();
    return (c_.layers - 1) / k * k;
  }

  // Layer l's forward from A.x_in: fills A's other activations and returns the layer's output.
  Buffer layer_forward(int64_t l, LayerActs& A) {
    const int64_t R = rows(), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn;
    const auto& P = L_.layer[l];
    A.rms1 = act(R, sizeof(C));
    A.xn1 = act(R * D);
    be().rmsnorm_fwd(A.x_in.template as<S>(), W(P.attn_norm), A.xn1.template as<S>(), A.rms1.template as<C>());
    A.q = act(R * D);
    A.k = act(R * KV);
    A.v = act(R * KV);
    A.o = act(R * D);
    A.attn = act(be().attention_saved_bytes(), 1);
    {
      Buffer lin = ws(R * D);
      S* xn = A.xn1.template as<S>();
      be().gemm(false, true, R, D, D, xn, W(P.wq), lin.template as<S>(), false);
      lora_fwd(l, Proj::q, xn, lin.template as<S>(), A);
      be().to_heads(lin.template as<S>(), A.q.template as<S>(), c_.heads, true);
      be().gemm(false, true, R, KV, D, xn, W(P.wk), lin.template as<S>(), false);
      lora_fwd(l, Proj::k, xn, lin.template as<S>(), A);
      be().to_heads(lin.template as<S>(), A.k.template as<S>(), c_.kv_heads, true);
      be().gemm(false, true, R, KV, D, xn, W(P.wv), lin.template as<S>(), false);
      lora_fwd(l, Proj::v, xn, lin.template as<S>(), A);
      be().to_heads(lin.template as<S>(), A.v.template as<S>(), c_.kv_heads, false);
    }
    be().attention_fwd(A);
    A.x_mid = act(R * D);
    {
      Buffer ot = ws(R * D);
      be().from_heads(A.o.template as<S>(), ot.template as<S>(), c_.heads, false);
      copy_rows(A.x_in, A.x_mid, R * D);
      be().gemm(false, true, R, D, D, ot.template as<S>(), W(P.wo), A.x_mid.template as<S>(), true);
      lora_fwd(l, Proj::o, ot.template as<S>(), A.x_mid.template as<S>(), A);
    }
    A.rms2 = act(R, sizeof(C));
    A.xn2 = act(R * D);
    be().rmsnorm_fwd(A.x_mid.template as<S>(), W(P.mlp_norm), A.xn2.template as<S>(), A.rms2.template as<C>());
    A.g = act(R * F);
    A.u = act(R * F);
    be().gemm(false, true, R, F, D, A.xn2.template as<S>(), W(P.wg), A.g.template as<S>(), false);
    lora_fwd(l, Proj::gate, A.xn2.template as<S>(), A.g.template as<S>(), A);
    be().gemm(false, true, R, F, D, A.xn2.template as<S>(), W(P.wu), A.u.template as<S>(), false);
    lora_fwd(l, Proj::up, A.xn2.template as<S>(), A.u.template as<S>(), A);
    Buffer x = act(R * D);
    {
      Buffer h = ws(R * F);
      be().swiglu(A.g.template as<S>(), A.u.template as<S>(), h.template as<S>(), R * F);
      copy_rows(A.x_mid, x, R * D);
      be().gemm(false, true, R, D, F, h.template as<S>(), W(P.wd), x.template as<S>(), true);
      lora_fwd(l, Proj::down, h.template as<S>(), x.template as<S>(), A);
    }
    return x;
  }

  // What the checkpointing policy drops of layer l once its forward is done (training forward only).
  void drop_after_forward(int64_t l, LayerActs& A) {
    if (o_.checkpoint == Checkpoint::selective) {
      A.xn1.reset();
      A.xn2.reset();
      return;
    }
    const int64_t k = segment_layers();
    if (k == 0 || l >= last_segment_start()) return;
    Buffer input = std::move(A.x_in);
    LayerActs dropped;
    std::swap(A, dropped);
    if (l % k == 0) A.x_in = std::move(input);  // the segment's checkpoint
  }

  // Before layer l's backward: runs its segment's forward again when it was dropped.
  void recompute_segment(int64_t l, Acts& a, StepStats* s) {
    const int64_t k = segment_layers();
    if (k == 0 || a.layer[l].q.data() != nullptr) return;
    const int64_t first = l / k * k;
    for (int64_t j = first; j <= l; ++j) {
      Buffer out = layer_forward(j, a.layer[j]);
      if (j < l) a.layer[j + 1].x_in = std::move(out);
    }
    if (s) s->recomputed_layers += l - first + 1;
  }

  // A layer's forward's xn1, o (back in rows), xn2 and swiglu(g, u), widened to fp32: its projections' inputs.
  Trainer::LinearInputs inputs_of(LayerActs& A) {
    const int64_t R = rows(), D = c_.dim, F = c_.ffn;
    Buffer rows_buf = ws(std::max(R * D, R * F));
    LinearInputs in;
    in[0] = be().widen(A.xn1.template as<S>(), R * D);
    be().from_heads(A.o.template as<S>(), rows_buf.template as<S>(), c_.heads, false);
    in[1] = be().widen(rows_buf.template as<S>(), R * D);
    in[2] = be().widen(A.xn2.template as<S>(), R * D);
    be().swiglu(A.g.template as<S>(), A.u.template as<S>(), rows_buf.template as<S>(), R * F);
    in[3] = be().widen(rows_buf.template as<S>(), R * F);
    return in;
  }

  // Loads batch b and sets A.x_in to the stream x entering layer l (the embedding when x is empty and l = 0,
  // and x then holds it too).
  void enter_layer(const datasets::Batch& b, int64_t l, std::vector<float>& x, LayerActs& A) {
    MT_CHECK(l >= 0 && l < c_.layers, "calibration: layer " + std::to_string(l) + " of a model of " +
                                          std::to_string(c_.layers) + " layers");
    load_batch(b);
    const int64_t n = rows() * c_.dim;
    A.x_in = act(n);
    if (x.empty()) {
      MT_CHECK(l == 0, "calibration: an empty residual stream enters layer 0 only (got layer " + std::to_string(l) + ")");
      be().embedding_fwd(ids_.template as<int32_t>(), W(L_.embed), A.x_in.template as<S>());
      x = be().widen(A.x_in.template as<S>(), n);
      return;
    }
    MT_CHECK(static_cast<int64_t>(x.size()) == n, "calibration: a residual stream of " + std::to_string(x.size()) +
                                                      " values for a batch of " + std::to_string(n));
    upload(A.x_in, x, n, false);
  }

  // Runs the forward pass on the loaded batch, keeping activations in `a` (a training forward drops
  // what the checkpointing policy says); returns the sum of the counted rows' losses.
  double forward(Acts& a, bool training) {
    const int64_t R = rows(), D = c_.dim, V = c_.vocab;
    Buffer x = act(R * D);
    be().embedding_fwd(ids_.template as<int32_t>(), W(L_.embed), x.template as<S>());
    for (int64_t l = 0; l < c_.layers; ++l) {
      LayerActs& A = a.layer.emplace_back();
      A.x_in = std::move(x);
      x = layer_forward(l, A);
      if (training) drop_after_forward(l, A);
    }
    a.x_final = std::move(x);
    a.rmsf = act(R, sizeof(C));
    a.xnf = act(R * D);
    be().rmsnorm_fwd(a.x_final.template as<S>(), W(L_.final_norm), a.xnf.template as<S>(), a.rmsf.template as<C>());
    a.logits = act(R * V);
    be().gemm(false, true, R, V, D, a.xnf.template as<S>(), W(L_.head), a.logits.template as<S>(), false);
    return be().ce_loss_sum(a.logits.template as<S>(), targets_.template as<int32_t>());
  }

  // Forward and backward of one micro-batch; gradients accumulate. `scale`: d(loss)/d(token loss).
  // Returns the sum of its counted rows' losses.
  double forward_backward(const datasets::Batch& batch, C scale, StepStats* s) {
    load_batch(batch);
    Acts a;
    const double loss = forward(a, true);
    const int64_t R = rows(), D = c_.dim, KV = c_.kv_dim(), F = c_.ffn, V = c_.vocab;
    if (offload_) open_stages();
    be().ce_bwd(a.logits.template as<S>(), targets_.template as<int32_t>(), scale);  // dlogits in place
    const S* dz = a.logits.template as<S>();
    stage_segment(head_segment(), s);
    grad_w(V, D, R, dz, a.xnf.template as<S>(), L_.head, s);
    Buffer sink = lora_ ? ws(D) : Buffer();  // the frozen norms' weight gradients, discarded
    if (lora_) be().zero(sink.data(), sink.bytes());
    auto GN = [&](int64_t off) { return lora_ ? sink.template as<S>() : G(off); };
    Buffer dres = ws(R * D);  // gradient of the residual stream
    be().zero(dres.data(), dres.bytes());
    {
      Buffer dxn = ws(R * D);
      be().gemm(false, false, R, D, V, dz, W(L_.head), dxn.template as<S>(), false);
      a.logits.reset();
      stage_segment(c_.layers + 1, s);
      be().rmsnorm_bwd(a.x_final.template as<S>(), W(L_.final_norm), a.rmsf.template as<C>(), dxn.template as<S>(),
                       dres.template as<S>(), GN(L_.final_norm));
      a.x_final.reset();
      a.rmsf.reset();
      a.xnf.reset();
    }
    for (int64_t l = c_.layers - 1; l >= 0; --l) {
      const auto& P = L_.layer[l];
      recompute_segment(l, a, s);
      stage_segment(1 + l, s);
      LayerActs& A = a.layer[l];
      S* dr = dres.template as<S>();
      const bool selective = o_.checkpoint == Checkpoint::selective;
      if (selective) {  // the MLP's norm output, again from the kept input and RMS factor
        A.xn2 = act(R * D);
        be().rmsnorm_fwd(A.x_mid.template as<S>(), W(P.mlp_norm), A.xn2.template as<S>(), A.rms2.template as<C>());
      }
      // MLP: x_out = x_mid + Wd h
      {
        Buffer h = ws(R * F), dh = ws(R * F);
        be().swiglu(A.g.template as<S>(), A.u.template as<S>(), h.template as<S>(), R * F);
        grad_w(D, F, R, dr, h.template as<S>(), P.wd, s);
        be().gemm(false, false, R, F, D, dr, W(P.wd), dh.template as<S>(), false);
        lora_dx(l, Proj::down, lora_bwd(l, Proj::down, h.template as<S>(), dr, A, s), dh.template as<S>());
        be().swiglu_bwd(A.g.template as<S>(), A.u.template as<S>(), dh.template as<S>(), R * F);  // g, u: dg, du
      }
      {
        Buffer dxn = ws(R * D);
        S* xn = A.xn2.template as<S>();
        grad_w(F, D, R, A.g.template as<S>(), xn, P.wg, s);
        grad_w(F, D, R, A.u.template as<S>(), xn, P.wu, s);
        be().gemm(false, false, R, D, F, A.g.template as<S>(), W(P.wg), dxn.template as<S>(), false);
        be().gemm(false, false, R, D, F, A.u.template as<S>(), W(P.wu), dxn.template as<S>(), true);
        lora_dx(l, Proj::gate, lora_bwd(l, Proj::gate, xn, A.g.template as<S>(), A, s), dxn.template as<S>());
        lora_dx(l, Proj::up, lora_bwd(l, Proj::up, xn, A.u.template as<S>(), A, s), dxn.template as<S>());
        A.g.reset();
        A.u.reset();
        if (selective) {
          A.xn2.reset();
          A.xn1 = act(R * D);
          be().rmsnorm_fwd(A.x_in.template as<S>(), W(P.attn_norm), A.xn1.template as<S>(), A.rms1.template as<C>());
        }
        be().rmsnorm_bwd(A.x_mid.template as<S>(), W(P.mlp_norm), A.rms2.template as<C>(), dxn.template as<S>(), dr,
                         GN(P.mlp_norm));
      }
      // Attention: x_mid = x_in + Wo attn(...)
      {
        Buffer ot = ws(R * D), dot = ws(R * D), dq = ws(R * D), dk = ws(R * KV), dv = ws(R * KV);
        be().from_heads(A.o.template as<S>(), ot.template as<S>(), c_.heads, false);
        grad_w(D, D, R, dr, ot.template as<S>(), P.wo, s);
        Buffer dto = lora_bwd(l, Proj::o, ot.template as<S>(), dr, A, s);  // before ot becomes d(o)
        be().gemm(false, false, R, D, D, dr, W(P.wo), ot.template as<S>(), false);  // d(o) rows
        lora_dx(l, Proj::o, dto, ot.template as<S>());
        be().to_heads(ot.template as<S>(), dot.template as<S>(), c_.heads, false);  // ot is free until from_heads
        be().attention_bwd(A, dot.template as<S>(), dq.template as<S>(), dk.template as<S>(), dv.template as<S>(), ot.data(),
                           ot.bytes());
        A.o.reset();
        A.attn.reset();
        // Back to rows, undoing RoPE on dq and dk (reusing ot and dot as row buffers).
        Buffer dkr = ws(R * KV), dvr = ws(R * KV);
        be().from_heads(dq.template as<S>(), ot.template as<S>(), c_.heads, true);
        be().from_heads(dk.template as<S>(), dkr.template as<S>(), c_.kv_heads, true);
        be().from_heads(dv.template as<S>(), dvr.template as<S>(), c_.kv_heads, false);
        S* xn = A.xn1.template as<S>();
        grad_w(D, D, R, ot.template as<S>(), xn, P.wq, s);
        grad_w(KV, D, R, dkr.template as<S>(), xn, P.wk, s);
        grad_w(KV, D, R, dvr.template as<S>(), xn, P.wv, s);
        be().gemm(false, false, R, D, D, ot.template as<S>(), W(P.wq), dot.template as<S>(), false);
        be().gemm(false, false, R, D, KV, dkr.template as<S>(), W(P.wk), dot.template as<S>(), true);
        be().gemm(false, false, R, D, KV, dvr.template as<S>(), W(P.wv), dot.template as<S>(), true);
        lora_dx(l, Proj::q, lora_bwd(l, Proj::q, xn, ot.template as<S>(), A, s), dot.template as<S>());
        lora_dx(l, Proj::k, lora_bwd(l, Proj::k, xn, dkr.template as<S>(), A, s), dot.template as<S>());
        lora_dx(l, Proj::v, lora_bwd(l, Proj::v, xn, dvr.template as<S>(), A, s), dot.template as<S>());
        be().rmsnorm_bwd(A.x_in.template as<S>(), W(P.attn_norm), A.rms1.template as<C>(), dot.template as<S>(), dr,
                         GN(P.attn_norm));
      }
      a.layer.pop_back();
    }
    stage_segment(0, s);
    if (!lora_) be().embedding_bwd(ids_.template as<int32_t>(), dres.template as<S>(), G(L_.embed));
    if (offload_) close_stages(s);
    return loss;
  }

  // A base weight's gradient grad[m x n] += dY^T X (nothing when the base is frozen).
  void grad_w(int64_t m, int64_t n, int64_t k, const S* dY, const S* X, int64_t off, StepStats* s) {
    if (!lora_) be().gemm_grad(m, n, k, dY, X, G(off), s);
  }

  // ---- LoRA on projection p of layer l: y += s B (A x), s = alpha / r ----

  const AdapterLayout::Site* lora_site(int64_t l, Proj p) const {
    if (!lora_) return nullptr;
    const auto& site = AL_.layer[l][static_cast<int>(p)];
    return site.on() ? &site : nullptr;
  }
  S* AW(int64_t off) const { return adapters_.template as<S>() + off; }
  // Forward: keeps t = s * (x A^T) [R x r], then y[R x out] += t B^T.
  void lora_fwd(int64_t l, Proj p, const S* x, S* y, LayerActs& A) {
    const auto* site = lora_site(l, p);
    if (!site) return;
    const auto [n_out, n_in] = proj_shape(c_, p);
    const int64_t R = rows(), r = o_.lora.rank;
    Buffer& t = A.lora[static_cast<int>(p)];
    t = act(R * r);
    be().gemm(false, true, R, r, n_in, x, AW(site->a), t.template as<S>(), false);
    be().scale(t.template as<S>(), R * r, static_cast<C>(o_.lora.scaling()));
    be().gemm(false, true, R, n_out, r, t.template as<S>(), AW(site->b), y, true);
  }
  // Backward: dB += dy^T t; dt = s * (dy B); dA += dt^T x. Returns dt (empty when p is not adapted) for
  // lora_dx; frees t.
  Buffer lora_bwd(int64_t l, Proj p, const S* x, const S* dy, LayerActs& A, StepStats* s) {
    const auto* site = lora_site(l, p);
    if (!site) return {};
    const auto [n_out, n_in] = proj_shape(c_, p);
    const int64_t R = rows(), r = o_.lora.rank;
    Buffer& t = A.lora[static_cast<int>(p)];
    S* g = grads_.template as<S>();
    Buffer dt = ws(R * r);
    be().gemm(false, false, R, r, n_out, dy, AW(site->b), dt.template as<S>(), false);
    be().scale(dt.template as<S>(), R * r, static_cast<C>(o_.lora.scaling()));
    be().gemm_grad(n_out, r, R, dy, t.template as<S>(), g + site->b, s);
    be().gemm_grad(r, n_in, R, dt.template as<S>(), x, g + site->a, s);
    t.reset();
    return dt;
  }
  // dx[R x in] += dt A.
  void lora_dx(int64_t l, Proj p, const Buffer& dt, S* dx) {
    if (dt.data() == nullptr) return;
    const int64_t in = proj_shape(c_, p)[1];
    be().gemm(false, false, rows(), in, o_.lora.rank, dt.template as<S>(), AW(lora_site(l, p)->a), dx, true);
  }

  // AdamW under the policy, unless the loss scaler skips the step.
  bool optimizer_step(StepStats& s) {
    if (offload_) return host_optimizer_step(s);
    const float inv = scaler_.inv_scale();
    s.non_finite = be().any_non_finite(grads_.template as<S>(), inv);
    if (!scaler_.update(s.non_finite)) return false;
    const int64_t t = adam_t_ + 1;
    float bc1, bc2;
    adam_bias_corrections(o_.beta1, o_.beta2, t, bc1, bc2);
    const float lr = learning_rate(t);
    for (const ParamTensor& pt : trainable_tensors()) be().adamw(pt, lr, pt.decay ? o_.weight_decay : 0.f, bc1, bc2, inv, t);
    adam_t_ = t;
    return true;
  }

  float learning_rate(int64_t t) const {
    return o_.warmup_steps > 0 && t <= o_.warmup_steps ? o_.lr * static_cast<float>(t) / static_cast<float>(o_.warmup_steps)
                                                       : o_.lr;
  }

  // Offload: the non-finite check and AdamW on the host over the host's gradients, master and moments;
  // the updated weights, rounded to S, go to the device one tile at a time.
  bool host_optimizer_step(StepStats& s) {
    if constexpr (!kCanOffload) {
      throw Error("offload: needs fp32 AdamW moments");
    } else {
      return host_adamw(s);
    }
  }
  // Each tile's weights go to the device on the device's copy stream (CUDA) while the next tile updates,
  // as DeepSpeed's CPU Adam overlaps its parameter copies; host_update waits for the last ones before it
  // returns, so the device's next work finds every weight in place.
  bool host_adamw(StepStats& s) requires kCanOffload {
    dev_.fork_copies();  // the weights are overwritten after the work that reads them
    auto to_device = [&](int64_t o, const S* tile, int64_t n) {
      dev_.copy_async(W(o), tile, n * sizeof(S), CopyKind::host_to_device);
      s.bytes_to_device += n * static_cast<int64_t>(sizeof(S));
      return dev_.copy_fence();
    };
    const HostUpdate u = host_update(grads_.template as<S>(), scaler_.inv_scale(), dev_.overlaps_copies(), to_device);
    s.non_finite = u.non_finite;
    s.host_optimizer_s = u.seconds;
    return u.applied;
  }

  // The host's optimizer step over the gradients g (times inv, the inverse loss scale): the non-finite
  // check, the loss scaler, then AdamW tile by tile on the master weights and the moments; each tile's
  // weights, rounded to S into a host tile buffer, go to sink(offset, tile, n), after which g's tile is no
  // longer read. The sink returns a copy fence (Device::copy_fence) that must pass before the buffer is
  // written again, or -1. With `overlapped` (the sink's copies overlap the host's work: CUDA) two buffers
  // take turns, so that one tile's copy runs while the next one updates; otherwise one is enough.
  struct HostUpdate {
    bool non_finite = false, applied = false;
    double seconds = 0;
  };
  template <class Sink>
  HostUpdate host_update(const S* g, float inv, bool overlapped, Sink&& sink) requires kCanOffload {
    HostUpdate u;
    const auto t0 = std::chrono::steady_clock::now();
    int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad)
    for (int64_t i = 0; i < L_.total; ++i) bad += !std::isfinite(static_cast<double>(to_f32(g[i])) * inv);
    u.non_finite = bad > 0;
    if (scaler_.update(u.non_finite)) {
      const int64_t t = adam_t_ + 1;
      AdamStep st;
      adam_bias_corrections(o_.beta1, o_.beta2, t, st.bc1, st.bc2);
      st.lr = learning_rate(t);
      st.beta1 = o_.beta1;
      st.beta2 = o_.beta2;
      st.eps = o_.eps;
      st.grad_scale = inv;
      constexpr int64_t kTile = int64_t{1} << 18;
      const int buffers = overlapped ? 2 : 1;
      Buffer tiles[2];
      int64_t fence[2] = {-1, -1};  // the last copy out of each buffer
      for (int k = 0; k < buffers; ++k) tiles[k] = Buffer(dev_.host(), std::min(kTile, L_.total) * sizeof(S), Tag::workspace);
      float *mw = master_buf_.template as<float>(), *m = m_.template as<float>(), *v = v_.template as<float>();
      int64_t k = 0;
      for (const ParamTensor& pt : L_.tensors) {
        st.weight_decay = pt.decay ? o_.weight_decay : 0.f;
        for (int64_t o = pt.offset; o < pt.offset + pt.size; o += kTile, ++k) {
          const int64_t n = std::min(kTile, pt.offset + pt.size - o);
          const int b = static_cast<int>(k % buffers);
          if (fence[b] >= 0) dev_.wait_copies(fence[b]);
          S* tile = tiles[b].template as<S>();
          cpu_adamw<S, S>(st, mw + o, m + o, v + o, g + o, tile, n);
          fence[b] = sink(o, static_cast<const S*>(tile), n);
        }
      }
      for (int64_t f : fence)
        if (f >= 0) dev_.wait_copies(f);  // before the buffers go
      adam_t_ = t;
      u.applied = true;
    }
    u.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return u;
  }

  // ---- offload with the delayed parameter update ----

  // The pending update (the previous step's gradients in pending_grads_, times pending_inv_): its weights
  // replace the spent gradients tile by tile, and after `update` they go to the device in one copy.
  HostUpdate pending_update() requires kCanOffload {
    S* g = pending_grads_.template as<S>();
    return host_update(g, pending_inv_, false, [g](int64_t o, const S* tile, int64_t n) {
      std::memcpy(g + o, tile, static_cast<std::size_t>(n) * sizeof(S));
      return int64_t{-1};
    });
  }
  void apply_pending(const HostUpdate& u, StepStats& s) {
    s.non_finite = u.non_finite;
    s.applied = u.applied;
    s.host_optimizer_s = u.seconds;
    if (!u.applied) return;
    dev_.copy(weights_.data(), pending_grads_.data(), static_cast<std::size_t>(L_.total) * sizeof(S), CopyKind::host_to_device);
    s.bytes_to_device += L_.total * static_cast<int64_t>(sizeof(S));
  }
  // One step: the pending update on a host thread (or after) while this step's forward and backward
  // accumulate into the other host gradient buffer; then this step's gradients pend.
  StepStats delayed_step(std::span<const datasets::Batch> micro, StepStats& s) {
    if constexpr (!kCanOffload) {
      throw Error("offload: needs fp32 AdamW moments");
    } else {
      s.delayed = true;
      s.applied = false;
      HostUpdate u;
      std::exception_ptr failed;
      std::thread worker;
      if (pending_ && o_.delayed_update_overlap)
        worker = std::thread([&] {
          try {
            u = pending_update();
          } catch (...) {
            failed = std::current_exception();
          }
        });
      try {
        decode_stats_ = &s;
        accumulate(micro, s);
        decode_stats_ = nullptr;
        be().read_counters(s);
      } catch (...) {
        if (worker.joinable()) worker.join();
        throw;
      }
      if (worker.joinable()) worker.join();
      else if (pending_) u = pending_update();
      if (failed) std::rethrow_exception(failed);
      if (pending_) apply_pending(u, s);
      std::swap(grads_, pending_grads_);
      pending_ = true;
      pending_inv_ = static_cast<float>(1.0 / static_cast<double>(s.loss_scale));  // LossScaler::inv_scale's rounding
      dev_.synchronize();
      ++steps_;
      return s;
    }
  }

  const Config c_;
  const TrainOptions o_;
  Device& dev_;
  const ParamLayout L_;
  bool master_;
  precision::LossScaler scaler_;
  Buffer weights_, grads_, m_, v_, master_buf_, ids_, targets_;
  int64_t steps_ = 0, adam_t_ = 0;
  // Offload state: the staged gradient segment [stage_lo_, stage_hi_) and which segments reached the
  // host this step.
  bool offload_ = false;
  Buffer stages_[2];             // the device's gradient segment buffers (the second where copies overlap)
  int cur_stage_ = 0;            // the one being written
  int64_t stage_fence_[2] = {};  // the copy out of each (-1: none)
  // Delayed update: the previous step's host gradients, their inverse loss scale, and whether they wait.
  Buffer pending_grads_;
  float pending_inv_ = 1;
  bool pending_ = false;
  // LoRA: the adapters' layout and working values (grads_, m_, v_ and master_buf_ then cover them only).
  bool lora_ = false;
  AdapterLayout AL_;
  Buffer adapters_;
  // QLoRA: the format, the projections' blobs, the other tensors' (layout offset, weights_ offset, size),
  // and the workspace matrix holding the last decoded projection.
  std::shared_ptr<const BaseFormat> qfmt_;
  std::vector<QProj> qproj_;
  std::vector<Packed> rest_;
  Buffer decoded_;
  mutable int64_t decoded_off_ = -1;
  StepStats* decode_stats_ = nullptr;  // the step being taken, for the decode counters
  int64_t stage_id_ = -1, stage_lo_ = 0, stage_hi_ = 0;
  std::vector<bool> flushed_;
};

}  // namespace memtrade::model
